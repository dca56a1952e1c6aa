//! Conformance with Hugging Face transformers' own logits processors (5.23.0, torch 2.15 on
//! CPU): every case of `../shared/golden/transformers` (format in its README) run through a
//! [`Chain`] built under the transformers convention, the row's history accepted first. The
//! processed logits must be bit-identical for every case not flagged `fragile`, including the
//! `tie_split` ones (torch's sort and topk tie order is ported); `fragile` cases (a mask
//! decision within rounding noise of a threshold) are counted and reported, not required.
//!
//! `GOLDEN_FILTER=text` runs only the cases whose spec contains `text`.

use tokensieve::{params::GenerationConfig, sampler::BuildContext, Chain, Convention, RngConfig};
use tokensieve_testkit::golden::{
    self,
    transformers::{compare, Case, Class, Set, Tally},
};

fn run_case(set: &Set, c: &Case) -> Result<(), String> {
    let row = set.row(c);
    let ctx = BuildContext::new(row.len(), RngConfig::philox(0)).with_convention(Convention::Transformers);
    let mut chain = Chain::from_spec_for_apply(&c.spec(), &ctx).map_err(|e| format!("build: {e}"))?;
    for &t in set.history(c) {
        chain.accept(t);
    }
    let cands = chain.apply(row).map_err(|e| format!("apply: {e}"))?;
    let mut dense = vec![0.0f32; row.len()];
    cands.write_dense(&mut dense);
    compare(&dense, set.output(c))
}

#[test]
fn every_transformers_golden_case_matches() {
    let Some(set) = Set::load() else {
        assert!(
            !golden::goldens_required(),
            "TOKENSIEVE_REQUIRE_GOLDENS=1 but shared/golden/transformers was not found"
        );
        eprintln!("skipped: shared/golden/transformers not found (set TOKENSIEVE_SHARED to its parent's parent)");
        return;
    };
    let filter = std::env::var("GOLDEN_FILTER").ok();
    let mut tally = Tally::default();
    for c in &set.cases {
        if filter.as_deref().is_some_and(|f| !c.spec().contains(f)) {
            continue;
        }
        tally.record(&set, c, run_case(&set, c));
    }
    tally.report("library");
    let (ok, n) = tally.class_counts(Class::Robust);
    let (t_ok, t_n) = tally.class_counts(Class::TieSplit);
    assert!(
        tally.failures.is_empty(),
        "{} non-fragile golden cases failed ({ok}/{n} robust, {t_ok}/{t_n} tie_split matched)",
        tally.failures.len()
    );
    if filter.is_none() {
        assert_eq!(n + t_n, set.cases.iter().filter(|c| !c.fragile).count());
    }
}

/// The same goldens through [`GenerationConfig`]: every case whose ops are a processor list
/// `generate()` would build is turned into a `generation_config.json`, and the chain built
/// from it must give the same bits (its final `dist` stage does not touch the logits).
#[test]
fn generation_configs_build_the_golden_processor_lists() {
    let Some(set) = Set::load() else {
        assert!(
            !golden::goldens_required(),
            "TOKENSIEVE_REQUIRE_GOLDENS=1 but shared/golden/transformers was not found"
        );
        eprintln!("skipped: shared/golden/transformers not found");
        return;
    };
    let mut tally = Tally::default();
    for c in &set.cases {
        let Some(json) = c.generation_config() else { continue };
        let outcome = (|| {
            let config = GenerationConfig::from_json_value(&json).map_err(|e| format!("{json}: {e}"))?;
            let row = set.row(c);
            let mut chain = config.to_chain(row.len(), RngConfig::philox(0)).map_err(|e| format!("build: {e}"))?;
            for &t in set.history(c) {
                chain.accept(t);
            }
            let cands = chain.apply(row).map_err(|e| format!("apply: {e}"))?;
            let mut dense = vec![0.0f32; row.len()];
            cands.write_dense(&mut dense);
            compare(&dense, set.output(c))
        })();
        tally.record(&set, c, outcome);
    }
    tally.report("generation_config");
    let (ok, n) = tally.class_counts(Class::Robust);
    assert!(n > 2000, "only {n} robust cases are generate()-shaped");
    assert!(tally.failures.is_empty(), "{} generation-config cases failed ({ok}/{n} robust)", tally.failures.len());
}
