//! `tokensieve explain`: one step of a chain, stage by stage (a table; `--svg`: a funnel).
//!
//! For each stage, from the candidates it received and the ones it left:
//! * candidates before and after: finite logits only (a `-inf` candidate is masked);
//! * mass kept: the softmax of the stage's input, summed over the candidates it left;
//! * entropy (bits) of the softmax of its output;
//! * the most likely tokens after it, with their probability before -> after.
//!
//! Probabilities always come from the logits (softmax over the finite candidates): under the
//! llama.cpp convention the candidates' `p` fields are stale unless a stage recomputed them.

use crate::args::{ExplainArgs, InputArgs};
use crate::error::{bad, lib};
use crate::input::{load_history, load_logits, ChainPlan};
use anyhow::Result;
use std::io::Write;
use tokensieve::{Candidates, Sampler};

/// A token with its probability before and after a stage.
#[derive(Clone, Debug)]
pub struct TokenRow {
    /// Token id.
    pub id: u32,
    /// The token's text (quoted) with a vocabulary, else `#id`.
    pub text: String,
    /// p in the stage's input.
    pub before: f64,
    /// p in the stage's output.
    pub after: f64,
}

/// What one stage did.
#[derive(Clone, Debug)]
pub struct StageRow {
    /// The stage as written in the spec (`top_k(40)`), or its llama.cpp name.
    pub label: String,
    /// The stage's parameters make it a no-op (llama.cpp's "empty" sampler).
    pub inert: bool,
    /// Finite candidates the stage received.
    pub before: usize,
    /// Finite candidates it left.
    pub after: usize,
    /// Softmax of its input, summed over the candidates it left.
    pub mass_kept: f64,
    /// Entropy of the softmax of its output, in bits.
    pub entropy: f64,
    /// The most likely tokens after the stage.
    pub top: Vec<TokenRow>,
    /// The token the stage selected, when it is a selecting stage.
    pub selected: Option<TokenRow>,
}

/// One explained step.
#[derive(Clone, Debug)]
pub struct Report {
    /// Where the logits came from.
    pub source: String,
    /// The chain, as a spec string.
    pub chain: String,
    /// Vocabulary size (length of the row).
    pub vocab: usize,
    /// Finite logits in the input row.
    pub input_candidates: usize,
    /// Entropy of the input's softmax, in bits.
    pub input_entropy: f64,
    /// The most likely tokens of the input.
    pub input_top: Vec<TokenRow>,
    /// One row per stage, in order.
    pub stages: Vec<StageRow>,
}

/// Runs `explain`.
pub fn run(args: &ExplainArgs) -> Result<()> {
    let step = load_step(args)?;
    let mut plan = ChainPlan::new(&args.chain, step.history.len() + 1)?;
    plan.refuse_grammar("explain")?;
    if let Some(text) = &step.vocab_bytes {
        plan = plan.with_vocab_text(text.clone());
    }
    let mut chain = plan.build(args.row, step.logits.len(), false)?;
    for &t in &step.history {
        chain.accept(t);
    }
    let spec = match (&args.chain.chain, plan.params()) {
        (Some(spec), _) => spec.clone(),
        (None, Some(params)) => params.chain_spec().map_err(|e| lib("--params", e))?,
        (None, None) => String::new(),
    };
    let labels = stage_labels(&spec, chain.stages().len());
    let label_of = |id: u32| step.label(id);
    let mut builder = ReportBuilder::new(&step.logits, args.top, &label_of);
    let mut rows = Vec::with_capacity(chain.stages().len());
    chain
        .apply_observed(&step.logits[..], |index, stage, candidates| {
            let label = labels.as_ref().map_or_else(|| stage.name().to_string(), |l| l[index].clone());
            rows.push(builder.stage(label, stage.is_inert(), candidates));
        })
        .map_err(|e| lib("explain", e))?;
    let report = Report {
        source: step.source.clone(),
        chain: spec,
        vocab: step.logits.len(),
        input_candidates: builder.input_candidates,
        input_entropy: builder.input_entropy,
        input_top: builder.input_top.clone(),
        stages: rows,
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    out.write_all(table(&report).as_bytes())?;
    out.flush()?;
    if let Some(path) = &args.svg {
        std::fs::write(path, super::svg::funnel(&report))
            .map_err(|e| bad(format!("--svg: cannot write {}: {e}", path.display())))?;
    }
    Ok(())
}

/// The step to explain: a logits row, the tokens before it, and the vocabulary when a model
/// produced it.
struct Step {
    logits: Vec<f32>,
    history: Vec<u32>,
    source: String,
    /// Printable token texts, by id.
    texts: Option<Vec<String>>,
    vocab_bytes: Option<Vec<Vec<u8>>>,
}

impl Step {
    fn label(&self, id: u32) -> String {
        match self.texts.as_ref().and_then(|t| t.get(id as usize)) {
            Some(text) => format!("\"{text}\""),
            None => format!("#{id}"),
        }
    }
}

fn load_step(args: &ExplainArgs) -> Result<Step> {
    if let Some(prompt) = &args.prompt {
        if args.chain.history.is_some() {
            return Err(bad("--history: with --prompt the history is the prompt's tokens"));
        }
        return prompt_step(args, prompt);
    }
    if args.logits.is_none() && !args.example {
        return Err(bad("give the step to explain: --logits IN.npy, --example, or --prompt TEXT (with a model)"));
    }
    let input = load_logits(&InputArgs { logits: args.logits.clone(), example: args.example, dtype: args.dtype })?;
    if args.row >= input.rows {
        return Err(bad(format!("--row {}: the logits have {} row(s)", args.row, input.rows)));
    }
    let batch = input.batch()?;
    let row = batch.row(args.row);
    let mut logits = Vec::with_capacity(input.vocab);
    row.for_each(|_, v| logits.push(v));
    let history = load_history(args.chain.history.as_deref(), input.vocab)?;
    let name = match &args.logits {
        Some(p) => p.display().to_string(),
        None => "the example row (SmolLM2-135M-Instruct after \"The capital of France is\")".to_string(),
    };
    let source = if input.rows > 1 { format!("row {} of {name}", args.row) } else { name };
    let (texts, vocab_bytes) = match &args.vocab {
        Some(path) => {
            let (texts, bytes) = vocabulary(path)?;
            (Some(texts), Some(bytes))
        }
        None => (None, None),
    };
    Ok(Step { logits, history, source, texts, vocab_bytes })
}

/// `--vocab`: printable token texts and token bytes from a GGUF file's tokenizer.
#[cfg(feature = "model")]
fn vocabulary(path: &std::path::Path) -> Result<(Vec<String>, Vec<Vec<u8>>)> {
    use crate::model::{read_gguf_metadata, Tokenizer};
    let tokenizer = read_gguf_metadata(path)
        .and_then(|meta| Tokenizer::from_gguf(&meta))
        .map_err(|e| bad(format!("--vocab {}: {}", path.display(), crate::error::one_line(&e))))?;
    let texts = (0..tokenizer.len() as u32).map(|id| tokenizer.display(id)).collect();
    Ok((texts, tokenizer.vocabulary_bytes()))
}

#[cfg(not(feature = "model"))]
fn vocabulary(_path: &std::path::Path) -> Result<(Vec<String>, Vec<Vec<u8>>)> {
    Err(bad("--vocab needs the GGUF reader, and this binary was built without the `model` feature"))
}

#[cfg(not(feature = "model"))]
fn prompt_step(_args: &ExplainArgs, _prompt: &str) -> Result<Step> {
    Err(bad("--prompt needs a model runtime, and this binary was built without the `model` feature \
         (rebuild with `cargo build -p tokensieve-cli --features model`)"))
}

#[cfg(feature = "model")]
fn prompt_step(args: &ExplainArgs, prompt: &str) -> Result<Step> {
    use super::generate::{load, prompt_text};
    let mut model = load(args.model.as_deref(), args.weights)?;
    let text = prompt_text(&model, prompt, args.chat, None)?;
    let history = model.tokenizer.encode(&text, true).map_err(|e| bad(crate::error::one_line(&e)))?;
    if history.is_empty() {
        return Err(bad("--prompt is empty"));
    }
    if history.len() >= model.n_ctx {
        return Err(bad(format!("--prompt has {} tokens; the model's context holds {}", history.len(), model.n_ctx)));
    }
    let logits = model.forward(&history)?;
    let texts = (0..logits.len() as u32).map(|id| model.tokenizer.display(id)).collect();
    let source = format!("{}, the step after {:?} ({} tokens)", model.name, text, history.len());
    Ok(Step { logits, history, source, texts: Some(texts), vocab_bytes: Some(model.tokenizer.vocabulary_bytes()) })
}

/// Each stage's text in the spec string, when the spec has one stage per chain stage.
fn stage_labels(spec: &str, n: usize) -> Option<Vec<String>> {
    let stages = tokensieve::params::spec::parse(spec).ok()?;
    if stages.len() != n {
        return None;
    }
    let mut labels = Vec::with_capacity(n);
    for (i, s) in stages.iter().enumerate() {
        let end = stages.get(i + 1).map_or(spec.len(), |next| next.position);
        let text = spec.get(s.position..end)?.trim().trim_end_matches(';').trim();
        labels.push(text.to_string());
    }
    Some(labels)
}

/// A distribution over the vocabulary: softmax of the finite candidates (dense, 0 elsewhere).
struct Dist {
    p: Vec<f64>,
    count: usize,
    entropy: f64,
}

impl Dist {
    fn new(vocab: usize) -> Self {
        Dist { p: vec![0.0; vocab], count: 0, entropy: 0.0 }
    }

    fn fill(&mut self, candidates: impl Iterator<Item = (u32, f32)> + Clone) {
        self.p.fill(0.0);
        let finite = candidates.filter(|&(_, l)| l > f32::NEG_INFINITY);
        let max = finite.clone().map(|(_, l)| l).fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f64;
        self.count = 0;
        for (id, l) in finite.clone() {
            if let Some(slot) = self.p.get_mut(id as usize) {
                let e = f64::from(l - max).exp();
                *slot = e;
                sum += e;
                self.count += 1;
            }
        }
        let mut entropy = 0.0;
        for (id, _) in finite {
            if let Some(slot) = self.p.get_mut(id as usize) {
                *slot /= sum;
                if *slot > 0.0 {
                    entropy -= *slot * slot.log2();
                }
            }
        }
        self.entropy = entropy.max(0.0);
    }

    /// The `n` most likely ids, most likely first, ties to the lower id.
    fn top(&self, n: usize) -> Vec<u32> {
        let mut ids: Vec<u32> = (0..self.p.len() as u32).filter(|&i| self.p[i as usize] > 0.0).collect();
        let key = |&a: &u32, &b: &u32| self.p[b as usize].total_cmp(&self.p[a as usize]).then(a.cmp(&b));
        if ids.len() > n {
            ids.select_nth_unstable_by(n, key);
            ids.truncate(n);
        }
        ids.sort_by(key);
        ids
    }
}

struct ReportBuilder<'l> {
    before: Dist,
    after: Dist,
    top: usize,
    label: &'l dyn Fn(u32) -> String,
    input_candidates: usize,
    input_entropy: f64,
    input_top: Vec<TokenRow>,
}

impl<'l> ReportBuilder<'l> {
    fn new(row: &[f32], top: usize, label: &'l dyn Fn(u32) -> String) -> Self {
        let mut before = Dist::new(row.len());
        before.fill(row.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        let input_top = before
            .top(top)
            .into_iter()
            .map(|id| TokenRow { id, text: label(id), before: before.p[id as usize], after: before.p[id as usize] })
            .collect();
        ReportBuilder {
            input_candidates: before.count,
            input_entropy: before.entropy,
            input_top,
            after: Dist::new(row.len()),
            before,
            top,
            label,
        }
    }

    fn stage(&mut self, label: String, inert: bool, candidates: &Candidates) -> StageRow {
        self.after.fill(candidates.as_slice().iter().map(|t| (t.id, t.logit)));
        let mass_kept: f64 = candidates
            .as_slice()
            .iter()
            .filter(|t| t.logit > f32::NEG_INFINITY)
            .map(|t| self.before.p.get(t.id as usize).copied().unwrap_or(0.0))
            .sum();
        let row = |id: u32| TokenRow {
            id,
            text: (self.label)(id),
            before: self.before.p.get(id as usize).copied().unwrap_or(0.0),
            after: self.after.p.get(id as usize).copied().unwrap_or(0.0),
        };
        let top = self.after.top(self.top).into_iter().map(row).collect();
        let selected = candidates.selected_token().map(row);
        let out = StageRow {
            label,
            inert,
            before: self.before.count,
            after: self.after.count,
            mass_kept: mass_kept.min(1.0),
            entropy: self.after.entropy,
            top,
            selected,
        };
        std::mem::swap(&mut self.before, &mut self.after);
        out
    }
}

/// Top tokens as `text p` (or `text before→after` with `arrows`), joined by `sep`: the table's
/// and the SVG's labels.
pub fn tokens_text(top: &[TokenRow], arrows: bool, sep: &str) -> String {
    top.iter()
        .map(|t| {
            if arrows {
                format!("{} {}→{}", t.text, fmt_p(t.before), fmt_p(t.after))
            } else {
                format!("{} {}", t.text, fmt_p(t.after))
            }
        })
        .collect::<Vec<_>>()
        .join(sep)
}

/// A probability for a table: three decimals, or scientific notation when tiny.
pub fn fmt_p(p: f64) -> String {
    if p == 0.0 {
        "0".to_string()
    } else if p >= 0.0005 {
        format!("{p:.3}")
    } else {
        format!("{p:.0e}")
    }
}

/// The terminal table.
pub fn table(r: &Report) -> String {
    let mut s = String::new();
    s.push_str(&format!("explain: {}\n", r.source));
    if !r.chain.is_empty() {
        s.push_str(&format!("chain:   {}\n", r.chain));
    }
    s.push('\n');
    let labels: Vec<String> =
        r.stages.iter().map(|st| if st.inert { format!("{} (no-op)", st.label) } else { st.label.clone() }).collect();
    let w = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0).max(5);
    let cw = r.vocab.to_string().len().max(6);
    s.push_str(&format!(
        "{:>2}  {:<w$}  {:>cw$} → {:<cw$}  {:>9}  {:>8}  top tokens: p before → after\n",
        "#", "stage", "before", "after", "mass kept", "entropy"
    ));
    let tops = |top: &[TokenRow], arrows: bool| tokens_text(top, arrows, "  ");
    s.push_str(&format!(
        "{:>2}  {:<w$}  {:>cw$}   {:<cw$}  {:>9}  {:>6.2} b  {}\n",
        "",
        "input",
        "",
        r.input_candidates,
        "",
        r.input_entropy,
        tops(&r.input_top, false)
    ));
    for (i, (st, label)) in r.stages.iter().zip(&labels).enumerate() {
        s.push_str(&format!(
            "{:>2}  {:<w$}  {:>cw$} → {:<cw$}  {:>8.2}%  {:>6.2} b  {}\n",
            i + 1,
            label,
            st.before,
            st.after,
            st.mass_kept * 100.0,
            st.entropy,
            tops(&st.top, true)
        ));
    }
    if let Some(sel) = r.stages.last().and_then(|st| st.selected.as_ref()) {
        s.push_str(&format!("\nselected: {} (id {}), p = {} after the chain\n", sel.text, sel.id, fmt_p(sel.after)));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_follow_the_spec_text() {
        assert_eq!(
            stage_labels("top_k(40); top_p(0.95, 1) ;dist", 3).unwrap(),
            ["top_k(40)", "top_p(0.95, 1)", "dist"]
        );
        assert!(stage_labels("top_k(40);dist", 3).is_none());
    }

    #[test]
    fn dist_is_a_softmax_over_finite_candidates() {
        let mut d = Dist::new(4);
        d.fill([(0u32, 0.0f32), (1, f32::NEG_INFINITY), (3, 0.0)].into_iter());
        assert_eq!(d.count, 2);
        assert_eq!(d.p, [0.5, 0.0, 0.0, 0.5]);
        assert!((d.entropy - 1.0).abs() < 1e-12);
        assert_eq!(d.top(5), [0, 3]);
        assert_eq!(d.top(1), [0]);
    }

    #[test]
    fn small_probabilities_stay_visible() {
        assert_eq!(fmt_p(0.7731), "0.773");
        assert_eq!(fmt_p(0.00012), "1e-4");
        assert_eq!(fmt_p(0.0), "0");
    }
}
