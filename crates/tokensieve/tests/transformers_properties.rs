//! Properties of the transformers convention on random and adversarial rows (ties, `-inf`,
//! flat, huge magnitudes, V = 1): the row stays dense, masking stages only ever mask, the
//! truncation warpers keep a top set of at least `min_tokens_to_keep` tokens, top-k keeps
//! exactly the tokens at or above the k-th largest value (a naive sort is the oracle), greedy
//! picks the lowest id among the maxima, and nothing panics or yields NaN.

use proptest::prelude::*;
use tokensieve::{sampler::BuildContext, Chain, Convention, RngConfig};
use tokensieve_testkit::generate::any_row_maybe_all_masked;
use tokensieve_testkit::proptest_support::check;

fn apply(spec: &str, row: &[f32], history: &[u32]) -> Vec<f32> {
    let ctx = BuildContext::new(row.len(), RngConfig::philox(1)).with_convention(Convention::Transformers);
    let mut chain = Chain::from_spec_for_apply(spec, &ctx).unwrap();
    for &t in history {
        chain.accept(t);
    }
    let mut out = vec![0.0; row.len()];
    chain.apply(row).unwrap().write_dense(&mut out);
    out
}

/// Every output is the input or `-inf`.
fn only_masks(row: &[f32], out: &[f32]) -> Result<(), TestCaseError> {
    for (i, (&a, &b)) in row.iter().zip(out).enumerate() {
        prop_assert!(b.to_bits() == a.to_bits() || b == f32::NEG_INFINITY, "token {i}: {a} -> {b}");
    }
    Ok(())
}

/// The kept tokens are the largest ones: no removed finite logit exceeds a kept one. min-p's
/// `min_tokens_to_keep` picks by *probability* (torch's topk over `softmax`), so among tokens
/// whose probability underflowed to 0 (more than ~104 below the max) it may keep any of them.
fn keeps_a_top_set(row: &[f32], out: &[f32], by_probability: bool) -> Result<(), TestCaseError> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let min_kept = out.iter().filter(|v| v.is_finite()).fold(f32::INFINITY, |m, &v| m.min(v));
    for (&a, &b) in row.iter().zip(out) {
        if a.is_finite() && b == f32::NEG_INFINITY && a > min_kept {
            prop_assert!(by_probability && a - max < -100.0, "removed {a} while keeping {min_kept}");
        }
    }
    Ok(())
}

fn truncation_spec() -> impl Strategy<Value = (String, usize)> {
    let mtk = 1usize..5;
    prop_oneof![
        (1i64..60, mtk.clone()).prop_map(|(k, m)| (format!("top_k({k},{m})"), m.max(k as usize))),
        (0.0f64..=1.0, mtk.clone()).prop_map(|(p, m)| (format!("top_p({p},{m})"), m)),
        (0.0f64..=1.0, mtk.clone()).prop_map(|(p, m)| (format!("min_p({p},{m})"), m)),
        (0.0001f64..0.9999, mtk.clone()).prop_map(|(e, m)| (format!("epsilon({e},{m})"), m)),
        (0.0001f64..0.9999, mtk).prop_map(|(e, m)| (format!("eta({e},{m})"), m)),
    ]
}

#[test]
fn truncation_warpers_keep_a_top_set_of_at_least_min_tokens_to_keep() {
    check("hf_truncation", 512, (any_row_maybe_all_masked(300), truncation_spec()), |(row, (spec, keep))| {
        let out = apply(&spec, &row, &[]);
        prop_assert_eq!(out.len(), row.len());
        only_masks(&row, &out)?;
        keeps_a_top_set(&row, &out, spec.starts_with("min_p"))?;
        let finite_in = row.iter().filter(|v| v.is_finite()).count();
        let finite_out = out.iter().filter(|v| v.is_finite()).count();
        // min-p's `topk` over probabilities may bring back a `-inf` token among those whose
        // probability is 0 like its own (underflowed): only the tokens with a positive
        // probability (well within e^-80 of the max here) are sure to rank above it.
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sure = if spec.starts_with("min_p") {
            row.iter().filter(|&&v| v.is_finite() && v - max > -80.0).count()
        } else {
            finite_in
        };
        prop_assert!(finite_out >= keep.min(sure), "{spec}: kept {finite_out} of {finite_in}");
        Ok(())
    });
}

#[test]
fn top_k_keeps_exactly_the_values_at_or_above_the_kth_largest() {
    check("hf_top_k_oracle", 512, (any_row_maybe_all_masked(300), 1usize..80), |(row, k)| {
        let out = apply(&format!("top_k({k})"), &row, &[]);
        let mut sorted = row.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let t = sorted[k.min(row.len()) - 1];
        for (i, (&a, &b)) in row.iter().zip(&out).enumerate() {
            let expect = if a < t { f32::NEG_INFINITY } else { a };
            prop_assert_eq!(b.to_bits(), expect.to_bits(), "token {}", i);
        }
        Ok(())
    });
}

#[test]
fn typical_and_processors_only_mask_or_edit_listed_tokens() {
    let history = prop::collection::vec(0u32..400, 0..40);
    check("hf_processors", 256, (any_row_maybe_all_masked(300), history, 0.01f64..0.99), |(row, h, mass)| {
        let out = apply(&format!("typical({mass})"), &row, &[]);
        only_masks(&row, &out)?;
        if row.iter().any(|v| v.is_finite()) {
            prop_assert!(out.iter().any(|v| v.is_finite()), "typical removed everything");
        }
        let out = apply("no_repeat_ngram(2);suppress_tokens(0 3);min_length(1000,eos=1)", &row, &h);
        only_masks(&row, &out)?;
        let out = apply("repetition_penalty(1.3)", &row, &h);
        for (i, (&a, &b)) in row.iter().zip(&out).enumerate() {
            let seen = h.contains(&(i as u32));
            prop_assert!(seen || a.to_bits() == b.to_bits(), "token {} changed without being in the history", i);
            prop_assert!(!b.is_nan());
        }
        Ok(())
    });
}

#[test]
fn greedy_picks_the_lowest_id_among_the_maxima_and_chains_are_deterministic() {
    let spec = "repetition_penalty(1.2);temperature(0.7);top_k(20);top_p(0.9);min_p(0.05);typical(0.95);epsilon(0.0003);eta(0.001)";
    check("hf_greedy", 256, any_row_maybe_all_masked(300), |row| {
        let ctx = BuildContext::new(row.len(), RngConfig::philox(1)).with_convention(Convention::Transformers);
        let mut chain = Chain::from_spec("greedy", &ctx).unwrap();
        match chain.sample(&row) {
            Ok(t) => {
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let first = row.iter().position(|&v| v == max).unwrap();
                prop_assert_eq!(t as usize, first);
            }
            Err(e) => prop_assert!(e.is_no_candidates()),
        }
        let a = apply(spec, &row, &[1, 2, 3]);
        let b = apply(spec, &row, &[1, 2, 3]);
        prop_assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
        prop_assert!(a.iter().all(|v| !v.is_nan()));
        Ok(())
    });
}
