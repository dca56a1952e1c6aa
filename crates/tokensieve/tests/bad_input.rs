//! "Bad input never crashes": one test per item of the list in the foundation issue. Each
//! gets a defined result, either an error value or a documented outcome, never a panic.

use tokensieve::{sampler::BuildContext, Chain, RngConfig};

fn ctx(v: usize) -> BuildContext<'static> {
    BuildContext::new(v, RngConfig::philox(1))
}

fn sample(spec: &str, row: &[f32]) -> tokensieve::Result<u32> {
    Chain::from_spec(spec, &ctx(row.len().max(1)))?.sample(row)
}

fn applied(spec: &str, row: &[f32], history: &[u32]) -> Vec<f32> {
    let mut chain = Chain::from_spec_for_apply(spec, &ctx(row.len())).unwrap();
    for &t in history {
        chain.accept(t);
    }
    let mut out = vec![0.0; row.len()];
    chain.apply(row).unwrap().write_dense(&mut out);
    out
}

#[test]
fn nan_logits_are_an_error_naming_the_token() {
    let e = sample("dist", &[0.0, f32::NAN, 1.0]).unwrap_err();
    assert!(e.to_string().contains("token 1"), "{e}");
}

#[test]
fn positive_infinity_is_an_error_naming_the_token() {
    let e = sample("top_k(2);dist", &[0.0, 1.0, f32::INFINITY]).unwrap_err();
    assert!(e.to_string().contains("token 2"), "{e}");
}

#[test]
fn a_row_of_only_negative_infinity_cannot_be_sampled_but_can_be_applied() {
    let row = [f32::NEG_INFINITY; 4];
    for spec in ["greedy", "dist", "top_k(2);dist", "mirostat(5,0.1,100)", "mirostat_v2(5,0.1)", "gumbel"] {
        let e = sample(spec, &row).unwrap_err();
        assert!(e.is_no_candidates(), "{spec}: {e}");
    }
    assert!(applied("top_k(2);temperature(0.5)", &row, &[]).iter().all(|v| *v == f32::NEG_INFINITY));
}

#[test]
fn an_empty_row_is_an_error() {
    let e = sample("greedy", &[]).unwrap_err();
    assert!(e.to_string().contains("empty"), "{e}");
}

#[test]
fn history_ids_outside_the_vocabulary_are_ignored_by_penalties() {
    // Documented outcome (as llama.cpp): a token that is not a candidate is never penalised.
    let row = [1.0f32, 2.0, 3.0];
    let out = applied("penalties(8,2.0,0.5,0.5)", &row, &[7, 1_000_000, u32::MAX]);
    assert_eq!(out, row);
}

#[test]
fn bias_ids_outside_the_vocabulary_are_ignored() {
    // Documented outcome (as llama.cpp): entries for ids < 0 or >= V do nothing.
    let row = [1.0f32, 2.0, 3.0];
    let out = applied("logit_bias(-1:5 3:5 99:-inf 1:0.5)", &row, &[]);
    assert_eq!(out, [1.0, 2.5, 3.0]);
}

#[test]
fn k_larger_than_the_vocabulary_keeps_everything() {
    let row = [1.0f32, 3.0, 2.0];
    assert_eq!(applied("top_k(1000)", &row, &[]), row);
}

#[test]
fn k_zero_or_negative_is_a_no_op() {
    let row = [1.0f32, 3.0, 2.0];
    assert_eq!(applied("top_k(0)", &row, &[]), row);
    assert_eq!(applied("top_k(-5)", &row, &[]), row);
}

#[test]
fn p_outside_zero_one_is_an_error_or_llama_cpp_no_op() {
    let row = [1.0f32, 3.0, 2.0];
    for spec in ["top_p(-0.1)", "typical(-0.5)", "min_p(-0.2)", "top_p(nan)"] {
        assert!(Chain::from_spec_for_apply(spec, &ctx(3)).is_err(), "{spec} should be rejected");
    }
    // p >= 1 builds llama.cpp's inert stage: nothing is removed.
    assert_eq!(applied("top_p(1.5)", &row, &[]), row);
    // p = 0 keeps exactly one token (the most likely), as llama.cpp.
    let out = applied("top_p(0)", &row, &[]);
    assert_eq!(out.iter().filter(|v| v.is_finite()).count(), 1);
    assert_eq!(out[1], 3.0);
}

#[test]
fn negative_temperature_means_greedy() {
    for seed in 0..20 {
        let mut chain =
            Chain::from_spec("temperature(-0.7);dist", &BuildContext::new(4, RngConfig::philox(seed))).unwrap();
        assert_eq!(chain.sample(&[0.5f32, 2.0, 1.9, -1.0]).unwrap(), 1);
    }
}

#[test]
fn min_keep_larger_than_the_vocabulary_keeps_everything() {
    let row = [1.0f32, 3.0, 2.0, -4.0];
    for spec in ["top_p(0.1,100)", "min_p(0.9,100)", "typical(0.1,100)"] {
        let out = applied(spec, &row, &[]);
        assert_eq!(out.iter().filter(|v| v.is_finite()).count(), 4, "{spec}");
    }
}

#[test]
fn a_chain_whose_filters_leave_nothing_is_an_error_at_selection() {
    let e = sample("logit_bias(0:-inf 1:-inf 2:-inf);top_k(2);dist", &[1.0, 2.0, 3.0]).unwrap_err();
    assert!(e.is_no_candidates(), "{e}");
}

#[test]
fn a_chain_without_a_selecting_stage_is_a_build_error() {
    let e = Chain::from_spec("top_k(40);top_p(0.9)", &ctx(10)).unwrap_err();
    assert!(e.to_string().contains("does not select"), "{e}");
}

#[test]
fn malformed_specs_are_errors_with_positions() {
    for spec in ["top_k(", "top_k(40);;dist", "nope(1);dist", "top_k(x);dist", "top_k(1,2,3);dist", "dist;top_k(3)"] {
        assert!(Chain::from_spec(spec, &ctx(10)).is_err(), "{spec}");
    }
}

#[test]
fn mt19937_rejects_seeds_wider_than_32_bits() {
    let cfg = RngConfig { kind: tokensieve::RngKind::Mt19937, seed: 1 << 33, sequence: 0 };
    assert!(Chain::from_spec("dist", &BuildContext::new(3, cfg)).is_err());
}
