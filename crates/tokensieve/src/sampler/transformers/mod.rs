//! Hugging Face transformers' logits processors (5.23.0, torch 2.15 on CPU), one per file.
//!
//! Built from a spec string under [`Convention::Transformers`](crate::Convention::Transformers)
//! (`--convention transformers`), or from a `generation_config.json` with
//! [`GenerationConfig`](crate::params::GenerationConfig). Semantics:
//! `../shared/reference/transformers.md`; the shared arithmetic (f32 scalars, f64 cumsum,
//! softmax, torch's sort and topk tie order) is in [`crate::convention::transformers`].
//!
//! What every processor here has in common, because HF processors work on the dense
//! `(batch, vocab)` score tensor:
//!
//! * The candidate array stays in vocabulary order, one entry per token (`id == index`);
//!   nothing is dropped or reordered, a removed token is set to `-inf`. (An array reordered by
//!   a stage of another convention is scattered back first.)
//! * Parameters are kept as the f64 the user wrote (a Python float) and rounded to f32 where
//!   torch does.
//! * The stateful processors (`repetition_penalty`, `no_repeat_ngram`, `sequence_bias`,
//!   `min_length`, `min_new_tokens`, `begin_suppress_tokens`) see HF's `input_ids` as the tokens
//!   passed to `accept` since the chain was built or reset: history (the prompt) first, then each
//!   sampled token. "Current length" is the number of accepted tokens; the prompt length, where
//!   one is needed, is the number accepted before the first step.
//! * `p` fields are written where a processor computes a softmax (they hold that softmax) and
//!   are otherwise stale; [`dist::Dist`] writes the final distribution.
//! * Parameter errors are the ones transformers raises, as [`Error::parameter`] naming the
//!   parameter. Where tokensieve is stricter or more lenient, each file says so.

pub mod begin_suppress_tokens;
pub mod dist;
pub mod epsilon;
pub mod eta;
pub mod greedy;
pub mod min_length;
pub mod min_p;
pub mod no_repeat_ngram;
pub mod repetition_penalty;
pub mod sequence_bias;
pub mod suppress_tokens;
pub mod temperature;
pub mod top_k;
pub mod top_p;
pub mod typical;

use crate::error::{Error, Result};

/// `min_tokens_to_keep` as top-p, min-p and typical check it: an integer `>= 1`.
pub(crate) fn require_min_tokens_to_keep(stage: &str, v: i64) -> Result<usize> {
    if v < 1 {
        return Err(Error::parameter(
            stage,
            "min_tokens_to_keep",
            format!("has to be a strictly positive integer, but is {v}"),
        ));
    }
    Ok(usize::try_from(v).unwrap_or(usize::MAX))
}

/// The token ids of a list that can name a token of some vocabulary: HF builds masks with
/// `isin(arange(V), ids)`, so negative ids (and ids `>= V`, checked at apply time) never match.
pub(crate) fn matchable_ids(ids: &[i64]) -> Vec<u32> {
    ids.iter().filter_map(|&id| u32::try_from(id).ok()).collect()
}

/// Masks (`-inf`) the candidate of `id` in a dense array (`data[id].id == id`), if any: an id
/// at or above the vocabulary size masks nothing.
pub(crate) fn mask_id(data: &mut [crate::candidates::TokenData], id: u32) {
    if let Some(t) = data.get_mut(id as usize) {
        t.logit = f32::NEG_INFINITY;
    }
}

/// Fixtures shared by the processors' unit tests.
#[cfg(test)]
pub(crate) mod test_util {
    use crate::candidates::Candidates;
    use crate::convention::Convention;
    use crate::rng::RngConfig;
    use crate::sampler::BuildContext;
    use crate::Chain;

    /// The dense output of `spec` (transformers convention) on `row` after `history`.
    pub(crate) fn run(spec: &str, row: &[f32], history: &[u32]) -> Vec<f32> {
        let ctx = BuildContext::new(row.len(), RngConfig::philox(0)).with_convention(Convention::Transformers);
        let mut chain = Chain::from_spec_for_apply(spec, &ctx).unwrap();
        for &t in history {
            chain.accept(t);
        }
        let mut out = vec![0.0; row.len()];
        chain.apply(row).unwrap().write_dense(&mut out);
        out
    }

    /// The error message of building `spec` under the transformers convention.
    pub(crate) fn build_error(spec: &str) -> String {
        let ctx = BuildContext::new(8, RngConfig::philox(0)).with_convention(Convention::Transformers);
        Chain::from_spec_for_apply(spec, &ctx).unwrap_err().to_string()
    }

    /// Candidates from a row (vocabulary order).
    pub(crate) fn cands(row: &[f32]) -> Candidates {
        Candidates::from_logits(row).unwrap()
    }

    /// The logits of the candidates, in array order.
    pub(crate) fn logits(c: &Candidates) -> Vec<f32> {
        c.as_slice().iter().map(|t| t.logit).collect()
    }

    /// `-inf`.
    pub(crate) const NEG: f32 = f32::NEG_INFINITY;

    /// Rows that break shortcuts: ties (±0 too, values from a small pool), `-inf` (also rows
    /// masked but for a few entries, as after a top-k), huge magnitudes, flat rows, lengths
    /// on both sides of libstdc++'s 16-element insertion-sort cut-off and of the filters'
    /// buffer sizes.
    pub(crate) fn adversarial_row() -> impl proptest::strategy::Strategy<Value = Vec<f32>> {
        use proptest::prelude::*;
        let value = prop_oneof![
            4 => -30.0f32..30.0,
            3 => proptest::sample::select(vec![0.0f32, -0.0, 1.0, -1.0, 3.5, 2.0, -7.25]),
            1 => Just(f32::NEG_INFINITY),
            1 => proptest::sample::select(vec![f32::MAX, -f32::MAX, 1e30, -1e30, f32::MIN_POSITIVE, -120.0]),
        ];
        let sparse = prop_oneof![
            20 => Just(f32::NEG_INFINITY),
            1 => proptest::sample::select(vec![0.0f32, 1.0, 2.0, 3.5]),
            1 => -5.0f32..5.0,
        ];
        let ties = proptest::sample::select(vec![0.0f32, -0.0, 0.5, 1.0, -3.0]);
        let len = prop_oneof![1..=20usize, 1..=600usize, 2000..=5000usize];
        prop_oneof![
            3 => len.clone().prop_flat_map(move |n| proptest::collection::vec(value.clone(), n)),
            1 => len.clone().prop_flat_map(move |n| proptest::collection::vec(sparse.clone(), n)),
            1 => len.prop_flat_map(move |n| proptest::collection::vec(ties.clone(), n)),
        ]
    }

    /// Bits of logits and probabilities, in array order (for bit-for-bit comparisons).
    pub(crate) fn bits(c: &Candidates) -> Vec<(u32, u32, u32)> {
        c.as_slice().iter().map(|t| (t.id, t.logit.to_bits(), t.p.to_bits())).collect()
    }
}

/// The processors that work on the row path's sparse view (`typical`, `epsilon`, `eta`) against
/// the same processor on the dense row.
#[cfg(test)]
mod view_tests {
    use super::test_util::{adversarial_row, cands};
    use crate::candidates::Candidates;
    use crate::sampler::{Sampler, Stage};
    use proptest::prelude::*;

    /// The row's finite entries as the row path leaves them: a sparse view, in id order.
    fn view(row: &[f32]) -> Candidates {
        let mut c = cands(row);
        c.data.retain(|t| t.logit != f32::NEG_INFINITY);
        c.sparse = true;
        c
    }

    /// On a sparse view (a row masked but for some entries, as after `top_k`, or with every
    /// entry finite), `typical`, `epsilon` and `eta` remove exactly the tokens they remove on
    /// the dense row, whether the view decides itself or falls back to the dense row; and on
    /// views without ties, `typical` decides on the view.
    #[test]
    fn view_processors_remove_what_the_dense_row_loses() {
        let masked = (adversarial_row(), any::<u64>()).prop_map(|(mut row, seed)| {
            // Keep about one entry in eight, at least one.
            let mut state = seed | 1;
            for x in row.iter_mut().skip(1) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                if state % 8 != 0 {
                    *x = f32::NEG_INFINITY;
                }
            }
            row
        });
        let rows = prop_oneof![1 => adversarial_row(), 2 => masked];
        let spec = prop::sample::select(vec![
            "typical(0.9)",
            "typical(0.5,3)",
            "typical(0.999)",
            "typical(0.2,40)",
            "epsilon(0.0003)",
            "epsilon(0.2,3)",
            "epsilon(0.01,60)",
            "eta(0.0003)",
            "eta(0.3,2)",
            "eta(0.05,60)",
        ]);
        tokensieve_testkit::proptest_support::check("hf_view_processors", 512, (rows, spec), |(row, spec)| {
            let (on_view, on_row, viewed) = view_and_dense(&row, spec);
            prop_assert_eq!(on_view, on_row, "{} (decided on the view: {})", spec, viewed);
            Ok(())
        });
    }

    /// `spec`'s stage on the view of `row` and on the dense row: the logits' bits each leaves,
    /// and whether the view decided itself.
    fn view_and_dense(row: &[f32], spec: &str) -> (Vec<u32>, Vec<u32>, bool) {
        let ctx = crate::sampler::BuildContext::new(row.len(), crate::rng::RngConfig::philox(0))
            .with_convention(crate::convention::Convention::Transformers);
        let mut stage: Stage = crate::Chain::from_spec_for_apply(spec, &ctx).unwrap().stages()[0].clone();
        let mut dense = cands(row);
        stage.apply(&mut dense).unwrap();
        let mut sparse = view(row);
        stage.apply(&mut sparse).unwrap();
        let viewed = sparse.sparse;
        crate::convention::transformers::ensure_dense(&mut sparse);
        let bits = |c: &Candidates| c.as_slice().iter().map(|t| t.logit.to_bits()).collect::<Vec<_>>();
        (bits(&sparse), bits(&dense), viewed)
    }

    /// A finite logit more than `f32::MAX` below the maximum scores `+inf` in `typical`, as the
    /// `-inf` tokens the view leaves out do; `min_tokens_to_keep` reaches into those ties, whose
    /// order only the dense row has: the view declines. (Found by the property above at
    /// `TOKENSIEVE_PROPTEST_SCALE=300`: the view kept `f32::MIN`, the dense row a `-inf` token.)
    #[test]
    fn a_view_entry_scored_as_a_masked_one_defers_to_the_dense_row() {
        let neg = f32::NEG_INFINITY;
        let row = [0.0, neg, f32::MIN, neg, neg, f32::MAX, neg, neg, neg];
        let (on_view, on_row, viewed) = view_and_dense(&row, "typical(0.5,3)");
        assert_eq!(on_view, on_row);
        assert!(!viewed, "the view decided");
        assert_eq!(on_row[2], neg.to_bits(), "the dense row removes f32::MIN");
    }
}
