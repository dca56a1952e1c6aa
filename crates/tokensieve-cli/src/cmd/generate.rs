//! `tokensieve generate`: a real model writes text, every token chosen by a tokensieve chain.

use crate::args::GenerateArgs;
use anyhow::Result;

/// Runs `generate`.
#[cfg(not(feature = "model"))]
pub fn run(_args: &GenerateArgs) -> Result<()> {
    Err(crate::error::bad(
        "`generate` needs a model runtime, and this binary was built without the `model` feature \
         (rebuild with `cargo build -p tokensieve-cli --features model`)",
    ))
}

/// Runs `generate`.
#[cfg(feature = "model")]
pub fn run(args: &GenerateArgs) -> Result<()> {
    with_model::run(args)
}

#[cfg(feature = "model")]
mod with_model {
    use super::GenerateArgs;
    use crate::args::WeightsArg;
    use crate::error::{bad, lib, one_line};
    use crate::grammar::{self, Constrained};
    use crate::input::ChainPlan;
    use crate::model::stream::Utf8Stream;
    use crate::model::{chat, locate, Model, Weights};
    use anyhow::Result;
    use std::io::Write;
    use std::time::{Duration, Instant};
    use tokensieve::{Candidates, LogprobsMode};

    pub fn run(args: &GenerateArgs) -> Result<()> {
        if args.chain.history.is_some() {
            return Err(bad(
                "--history: generate's history is the prompt (its tokens are accepted before the first step)",
            ));
        }
        let started = Instant::now();
        let model_path = model_path(args.model.as_deref())?;
        let source = grammar::source(&args.constraint, None)?;
        let mut model = load(Some(&model_path), args.weights)?;
        let text = prompt_text(&model, &args.prompt, args.chat, args.system.as_deref())?;
        let prompt = model.tokenizer.encode(&text, true).map_err(|e| bad(one_line(&e)))?;
        if prompt.is_empty() {
            return Err(bad("the prompt is empty (and the model has no BOS token to start from)"));
        }
        if prompt.len() >= model.n_ctx {
            return Err(bad(format!(
                "the prompt has {} tokens; the model's context holds {}",
                prompt.len(),
                model.n_ctx
            )));
        }
        let max_tokens = args.max_tokens.min(model.n_ctx - prompt.len());
        let plan =
            ChainPlan::new(&args.chain, prompt.len() + max_tokens)?.with_vocab_text(model.tokenizer.vocabulary_bytes());
        let source = match (source, plan.grammar()) {
            (Some(_), Some(body)) => {
                let flag = if args.constraint.grammar.is_some() { "--grammar" } else { "--json-schema" };
                return Err(bad(format!("{flag} and {} both give a grammar: give one", body.origin())));
            }
            (source, body) => source.or_else(|| body.cloned()),
        };
        // The grammar's vocabulary is the model's own (pieces as llama.cpp writes them),
        // compiled before the model runs so that a bad grammar fails fast.
        let constrained = match &source {
            Some(source) => {
                let gv = grammar::load_vocab(&model_path, "--model")?;
                let name = format!("the vocabulary of --model {}", model_path.display());
                Some((Constrained::new(source, &gv, &name, gv.len(), &args.constraint)?, name, gv.len()))
            }
            None => None,
        };

        let t = Instant::now();
        let mut logits = model.forward(&prompt)?;
        let prompt_time = t.elapsed();
        let vocab = logits.len();
        let mut chain = plan.build(0, vocab, true)?;
        for &token in &prompt {
            chain.accept(token);
        }
        // The prompt is not fed to the grammar (llama.cpp's grammar starts at the first
        // generated token).
        let constrained = match constrained {
            Some((_, name, n)) if n != vocab => {
                return Err(bad(format!(
                    "{name} has {n} tokens but the model's logits have {vocab}: the grammar cannot index them"
                )))
            }
            Some((c, _, _)) => {
                chain = c.attach(chain);
                Some(c)
            }
            None => None,
        };

        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        let mut text_out = Utf8Stream::default();
        let mut completion = Vec::new();
        let (mut model_time, mut sampling_time) = (Duration::ZERO, Duration::ZERO);
        let (mut sampled, mut forwards) = (0usize, 0usize);
        let mut stop = if max_tokens < args.max_tokens { "context full" } else { "max tokens" };
        if args.show_alternatives.is_some() {
            writeln!(
                out,
                "{:>5}  {:<18} {:>7} {:>9}   alternatives: raw / processed p",
                "step", "token", "raw p", "processed"
            )?;
        }
        for step in 0..max_tokens {
            let token = match args.show_alternatives {
                None => {
                    let t = Instant::now();
                    let token = chain.sample(&logits[..]).map_err(|e| lib(format!("step {step}"), e))?;
                    sampling_time += t.elapsed();
                    token
                }
                Some(k) => {
                    let t = Instant::now();
                    let s = chain
                        .sample_with_logprobs(&logits[..], LogprobsMode::Raw, k)
                        .map_err(|e| lib(format!("step {step}"), e))?;
                    sampling_time += t.elapsed();
                    let processed = Processed::new(chain.candidates());
                    let mut line = format!(
                        "{step:>5}  {:<18} {:>7.4} {:>9.4}  ",
                        quoted(&model, s.token),
                        s.logprob.exp(),
                        processed.p(s.token)
                    );
                    for alt in &s.top_logprobs {
                        line.push_str(&format!(
                            " {} {:.4}/{:.4}",
                            quoted(&model, alt.token),
                            alt.logprob.exp(),
                            processed.p(alt.token)
                        ));
                    }
                    writeln!(out, "{}", line.trim_end())?;
                    s.token
                }
            };
            sampled += 1;
            if model.tokenizer.is_end_of_generation(token) || constrained.as_ref().is_some_and(|c| c.is_eog(token)) {
                stop = "end of generation";
                break;
            }
            let bytes = model.tokenizer.token_bytes(token);
            completion.extend_from_slice(bytes);
            if args.show_alternatives.is_none() {
                out.write_all(text_out.push(bytes).as_bytes())?;
                out.flush()?;
            }
            if step + 1 < max_tokens {
                let t = Instant::now();
                logits = model.forward(&[token])?;
                model_time += t.elapsed();
                forwards += 1;
            }
        }
        if args.show_alternatives.is_none() {
            out.write_all(text_out.finish().as_bytes())?;
            out.write_all(b"\n")?;
        } else {
            writeln!(out, "text: {}", String::from_utf8_lossy(&completion))?;
        }
        out.flush()?;
        drop(out);

        let per_token_ms = if forwards > 0 { model_time.as_secs_f64() * 1e3 / forwards as f64 } else { 0.0 };
        let sampling_us = if sampled > 0 { sampling_time.as_secs_f64() * 1e6 / sampled as f64 } else { 0.0 };
        let busy = model_time + sampling_time;
        let share = if busy > Duration::ZERO { sampling_time.as_secs_f64() / busy.as_secs_f64() * 100.0 } else { 0.0 };
        eprintln!(
            "generate: {sampled} token{} ({stop}), model {per_token_ms:.1} ms/token, sampling {sampling_us:.0} µs/token, \
             {share:.2}% of the time sampling (prompt: {} tokens in {:.0} ms; total {:.2} s)",
            if sampled == 1 { "" } else { "s" },
            prompt.len(),
            prompt_time.as_secs_f64() * 1e3,
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// `--model`, or the default model's path.
    pub fn model_path(path: Option<&std::path::Path>) -> Result<std::path::PathBuf> {
        match path {
            Some(p) => Ok(p.to_path_buf()),
            None => locate::default_model().map_err(bad),
        }
    }

    /// Loads `--model`, or the default model.
    pub fn load(path: Option<&std::path::Path>, weights: WeightsArg) -> Result<Model> {
        let path = model_path(path)?;
        let weights = match weights {
            WeightsArg::Auto => Weights::Auto,
            WeightsArg::F32 => Weights::F32,
            WeightsArg::Quantized => Weights::Quantized,
        };
        Model::load(&path, weights).map_err(|e| bad(one_line(&e)))
    }

    /// The text to tokenize: the prompt itself, or the chat template applied to it.
    pub fn prompt_text(model: &Model, prompt: &str, chat: bool, system: Option<&str>) -> Result<String> {
        if !chat {
            return Ok(prompt.to_string());
        }
        let Some(template) = &model.chat_template else {
            return Err(bad(format!(
                "--chat: the model `{}` has no chat template (tokenizer.chat_template)",
                model.name
            )));
        };
        let mut messages = Vec::new();
        if let Some(system) = system {
            messages.push(chat::Message { role: "system", content: system });
        }
        messages.push(chat::Message { role: "user", content: prompt });
        let bos = model.tokenizer.bos_text().unwrap_or("");
        let eos = model.tokenizer.eos_text().unwrap_or("");
        chat::render(template, &messages, bos, eos).map_err(|e| bad(format!("--chat: {}", one_line(&e))))
    }

    /// A token as a quoted string for tables.
    fn quoted(model: &Model, token: u32) -> String {
        format!("\"{}\"", model.tokenizer.display(token))
    }

    /// The distribution the chain's last stage drew from: softmax over the finite candidates.
    struct Processed<'c> {
        candidates: &'c Candidates,
        max: f32,
        sum: f64,
    }

    impl<'c> Processed<'c> {
        fn new(candidates: &'c Candidates) -> Self {
            let finite = || candidates.as_slice().iter().filter(|t| t.logit > f32::NEG_INFINITY);
            let max = finite().map(|t| t.logit).fold(f32::NEG_INFINITY, f32::max);
            let sum = finite().map(|t| f64::from(t.logit - max).exp()).sum();
            Processed { candidates, max, sum }
        }

        /// p of `token` (0 when the chain removed it).
        fn p(&self, token: u32) -> f64 {
            self.candidates
                .as_slice()
                .iter()
                .find(|t| t.id == token && t.logit > f32::NEG_INFINITY)
                .map_or(0.0, |t| f64::from(t.logit - self.max).exp() / self.sum)
        }
    }
}

#[cfg(feature = "model")]
pub use with_model::{load, prompt_text};
