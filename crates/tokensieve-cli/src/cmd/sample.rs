//! `tokensieve sample`: `--n` tokens per row, one JSON object per token on stdout.

use crate::args::{LogprobsModeArg, SampleArgs};
use crate::error::{bad, lib};
use crate::grammar::{self, Constrained};
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
    let grammar = match (grammar::source(&args.constraint, plan.grammar())?, &args.vocab) {
        (Some(source), Some(path)) => {
            let vocab = grammar::load_vocab(path, "--vocab")?;
            let name = format!("--vocab {}", path.display());
            Some(Constrained::new(&source, &vocab, &name, input.vocab, &args.constraint)?)
        }
        (Some(source), None) => {
            return Err(bad(format!(
                "{}: a grammar needs the vocabulary the logits index: give it with --vocab (a GGUF file or a \
                 tokenizer.json)",
                source.origin()
            )))
        }
        (None, Some(_)) => {
            return Err(bad("--vocab is only used with a grammar (--grammar, --json-schema, or the body's grammar, \
                 json_schema or response_format)"))
        }
        (None, None) => None,
    };
    if let Some(grammar) = &grammar {
        chains = chains.into_iter().map(|chain| grammar.attach(chain)).collect();
    }

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
            let sampled = result.map_err(|e| {
                let hint = if grammar.is_some() && e.is_no_candidates() {
                    " (the grammar and the chain left no token: a complete grammar allows only \
                     end-of-generation tokens, which the vocabulary may lack)"
                } else {
                    ""
                };
                lib(format!("row {row}, step {step}{hint}"), e)
            })?;
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
