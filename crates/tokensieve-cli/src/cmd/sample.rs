//! `tokensieve sample`: `--n` tokens per row, one JSON object per token on stdout.

use crate::args::{LogprobsModeArg, SampleArgs};
use crate::error::lib;
use crate::input::{load_history, load_logits, ChainPlan};
use anyhow::Result;
use serde::Serialize;
use std::io::Write;
use tokensieve::{batch, LogprobsMode, TokenLogprob};

/// One output line.
#[derive(Serialize)]
struct Line<'a> {
    row: usize,
    step: u32,
    token: u32,
    logprob: f32,
    top_logprobs: &'a [Alternative],
}

#[derive(Serialize)]
struct Alternative {
    token: u32,
    logprob: f32,
}

/// JSON has no -inf: llama.cpp's server prints the lowest finite float instead.
fn finite(logprob: f32) -> f32 {
    if logprob == f32::NEG_INFINITY {
        f32::MIN
    } else {
        logprob
    }
}

/// Runs `sample`.
pub fn run(args: &SampleArgs) -> Result<()> {
    let input = load_logits(&args.input)?;
    let history = load_history(args.chain.history.as_deref(), input.vocab)?;
    let plan = ChainPlan::new(&args.chain, history.len() + args.n as usize)?;
    let batch = input.batch()?;
    let mut chains = plan.build_rows(input.rows, input.vocab, true, &history)?;

    let top_n = args.logprobs.or(plan.params().map(|p| p.top_n_logprobs())).unwrap_or(0);
    let mode = match args.logprobs_mode {
        Some(LogprobsModeArg::Raw) => LogprobsMode::Raw,
        Some(LogprobsModeArg::Processed) => LogprobsMode::Processed,
        None => plan.params().map_or(LogprobsMode::Raw, |p| p.logprobs_mode()),
    };

    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut alternatives = Vec::with_capacity(top_n);
    let mut text = Vec::new();
    for step in 0..args.n {
        let results = batch::sample_with_logprobs(&mut chains, &batch, mode, top_n).map_err(|e| lib("--logits", e))?;
        for (row, result) in results.into_iter().enumerate() {
            let sampled = result.map_err(|e| lib(format!("row {row}, step {step}"), e))?;
            alternatives.clear();
            alternatives.extend(
                sampled
                    .top_logprobs
                    .iter()
                    .map(|&TokenLogprob { token, logprob }| Alternative { token, logprob: finite(logprob) }),
            );
            let line =
                Line { row, step, token: sampled.token, logprob: finite(sampled.logprob), top_logprobs: &alternatives };
            // Serialised apart so that a closed stdout surfaces as an io::Error (broken pipe).
            text.clear();
            serde_json::to_writer(&mut text, &line)?;
            text.push(b'\n');
            out.write_all(&text)?;
        }
    }
    out.flush()?;
    Ok(())
}
