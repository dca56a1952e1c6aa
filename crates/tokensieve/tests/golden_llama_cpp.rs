//! Conformance with llama.cpp's own sampler library (commit 0c1e570): every case of
//! `../shared/golden/llama.cpp` (format in its README) run through [`Chain`] must reproduce
//! the processed logits, the candidate order, the `p` fields, `size`, `selected`, and over 8
//! steps the token stream, bit for bit.
//!
//! Because tokensieve ports libstdc++'s sort algorithms, tie-sensitive cases are held to the
//! same standard. The only cases allowed to differ are `degenerate` ones (a stage received an
//! array whose logits were all `-inf`): there llama.cpp samples a masked token from NaN
//! probabilities and tokensieve returns an error instead, by design.

use std::collections::BTreeMap;
use tokensieve::{sampler::BuildContext, Chain, RngConfig};
use tokensieve_testkit::golden::{
    self,
    llama_cpp::{same_bits, Case, Set},
};

enum Outcome {
    Match,
    Mismatch(String),
    Error(String),
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Match => f.write_str("match"),
            Outcome::Mismatch(m) => write!(f, "mismatch: {m}"),
            Outcome::Error(e) => write!(f, "error: {e}"),
        }
    }
}

fn run_case(set: &Set, c: &Case) -> Outcome {
    let row = set.row(c);
    let rng = RngConfig::mt19937(c.seed.unwrap_or(0));
    let ctx = BuildContext::new(row.len(), rng);
    let mut chain = match Chain::from_spec_for_apply(&c.chain, &ctx) {
        Ok(ch) => ch,
        Err(e) => return Outcome::Error(format!("build: {e}")),
    };
    for &t in set.history(c) {
        chain.accept(t);
    }
    let cands = match chain.apply(row) {
        Ok(cands) => cands,
        Err(e) => return Outcome::Error(format!("step 1: {e}")),
    };
    let mut dense = vec![0.0f32; row.len()];
    cands.write_dense(&mut dense);
    if !same_bits(&dense, set.output(c)) {
        let i = dense.iter().zip(set.output(c)).position(|(a, b)| a.to_bits() != b.to_bits()).unwrap_or(0);
        return Outcome::Mismatch(format!(
            "(a) logits differ first at token {i}: ours {} golden {}",
            dense[i],
            set.output(c)[i]
        ));
    }
    let ids: Vec<u32> = cands.as_slice().iter().map(|t| t.id).collect();
    if ids != set.order(c) {
        return Outcome::Mismatch(format!(
            "(b) order: ours {:?} golden {:?}",
            &ids[..ids.len().min(12)],
            &set.order(c)[..c.size.min(12)]
        ));
    }
    let probs: Vec<f32> = cands.as_slice().iter().map(|t| t.p).collect();
    if !same_bits(&probs, set.probs(c)) {
        let i = probs
            .iter()
            .zip(set.probs(c))
            .position(|(a, b)| a.to_bits() != b.to_bits() && !(a.is_nan() && b.is_nan()))
            .unwrap_or(0);
        return Outcome::Mismatch(format!(
            "(c) p differs at position {i}: ours {:e} golden {:e}",
            probs[i],
            set.probs(c)[i]
        ));
    }
    let selected = cands.selected_index().map_or(-1, |i| i as i64);
    if selected != c.selected {
        return Outcome::Mismatch(format!("selected: ours {selected} golden {}", c.selected));
    }
    if c.n_steps > 0 {
        let mut tokens = Vec::new();
        let mut sizes = Vec::new();
        let mut first = cands.selected_token();
        for step in 0..c.n_steps {
            let token = match first.take() {
                Some(t) => t,
                None => match chain.apply(row) {
                    Ok(cands) => match cands.selected_token() {
                        Some(t) => t,
                        None => return Outcome::Error(format!("step {}: nothing selected", step + 1)),
                    },
                    Err(e) => return Outcome::Error(format!("step {}: {e}", step + 1)),
                },
            };
            sizes.push(chain.candidates().len());
            tokens.push(token);
            chain.accept(token);
        }
        if tokens != c.tokens || sizes != c.sizes {
            return Outcome::Mismatch(format!(
                "tokens: ours {tokens:?} / {sizes:?} golden {:?} / {:?}",
                c.tokens, c.sizes
            ));
        }
    }
    Outcome::Match
}

#[test]
fn every_llama_cpp_golden_case_matches() {
    let Some(set) = Set::load() else {
        assert!(!golden::goldens_required(), "TOKENSIEVE_REQUIRE_GOLDENS=1 but shared/golden/llama.cpp was not found");
        eprintln!("skipped: shared/golden/llama.cpp not found (set TOKENSIEVE_SHARED to its parent's parent)");
        return;
    };
    let filter = std::env::var("GOLDEN_FILTER").ok();
    let mut per_group: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut failures = Vec::new();
    let mut degenerate_errors = 0;
    let mut tie_matches = 0;
    let mut ran = 0;
    for c in &set.cases {
        if filter.as_deref().is_some_and(|f| !c.group.contains(f) && !c.chain.contains(f)) {
            continue;
        }
        ran += 1;
        let outcome = run_case(&set, c);
        let entry = per_group.entry(c.group.clone()).or_default();
        entry.0 += 1;
        match outcome {
            Outcome::Match => {
                entry.1 += 1;
                tie_matches += c.tie_sensitive as usize;
            }
            Outcome::Error(e) if c.degenerate && e.contains("no candidate") => degenerate_errors += 1,
            other => failures.push(format!(
                "case {} [{}] {} (V={}, kind={}, tie={}, degenerate={}): {}",
                c.id,
                c.group,
                c.chain,
                set.rows[c.row].vocab,
                set.rows[c.row].kind,
                c.tie_sensitive,
                c.degenerate,
                other
            )),
        }
    }
    for (g, (n, ok)) in &per_group {
        eprintln!("{g:24} {ok:5} / {n:5}");
    }
    eprintln!(
        "{ran} cases: {} matched bit for bit ({tie_matches} of them tie-sensitive), {degenerate_errors} degenerate cases returned an error by design, {} failed",
        ran - failures.len() - degenerate_errors,
        failures.len()
    );
    for f in failures.iter().take(40) {
        eprintln!("{f}");
    }
    assert!(failures.is_empty(), "{} golden cases failed", failures.len());
}
