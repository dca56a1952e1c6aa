//! `top_p(p, min_tokens_to_keep)` under the transformers convention: `TopPLogitsWarper`.
//!
//! 1. Sort the logits **ascending** with torch's unstable CPU sort (libstdc++ `std::sort` on
//!    `(value, index)`: index order among equals for `V <= 16`, introsort order above).
//! 2. Softmax of the sorted row, then `cumsum` (f64 running sum, each partial rounded to f32).
//! 3. Sorted position `i` is removed iff `cum_i <= fl32(1 - p)`, the subtraction done in
//!    **double** (1 − 0.95 = 0.050000000000000044 → f32 0.0500000007): the longest run of least
//!    likely tokens whose mass is `<= 1 - p` goes; the token whose cum first exceeds it stays.
//! 4. The last `min_tokens_to_keep` sorted positions (the largest logits) are never removed.
//!
//! Edge cases: `p = 1` still removes the tokens whose probability is exactly 0 (`-inf`
//! logits, finite ones more than ≈104 below the max), so it is not a no-op on rows with huge
//! spreads; `generate()` never adds it for `p >= 1`. `p = 0` keeps only the last
//! `min_tokens_to_keep` sorted positions (up to the rounding of the final cum). A row whose
//! logits are all `-inf` is left unchanged (NaN cum).
//!
//! Differs from llama.cpp's `top_p` (descending, keep `cum >= p`, truncate): here the cut is
//! made from below, `<=` against `1 - p`, and ties at the cut are split by torch's sort order.
//!
//! Validation as transformers: `p` in `[0, 1]`, `min_tokens_to_keep` an integer `>= 1`.
//! Draws: none.
//!
//! Spec: `top_p(p, min_tokens_to_keep)` (default 1); `top_p=` is accepted for `p`.

use crate::candidates::{Candidates, TokenData};
use crate::convention::transformers::{
    ensure_dense, fill_pairs, fl32, from_sort_key, remove, softmax, sort_ascending, sorted_finite_logits, weights_into,
    Cumsum,
};
use crate::error::{Error, Result};
use crate::params::spec::Bound;
use crate::sampler::transformers::require_min_tokens_to_keep;
use crate::sampler::{BuildContext, FromSpec, Sampler};

/// Top-p (nucleus), transformers convention.
///
/// ```
/// use tokensieve::{Candidates, sampler::{transformers::top_p::TopP, Sampler}};
/// // Eight equal logits, p = 0.5: the ascending sort keeps index order (V <= 16), so the
/// // first four (cum 0.125 ... 0.5 <= 0.5) are removed.
/// let mut c = Candidates::from_logits(&[0.0f32; 8]).unwrap();
/// TopP::new(0.5, 1).unwrap().apply(&mut c).unwrap();
/// let kept: Vec<u32> = c.as_slice().iter().filter(|t| t.logit.is_finite()).map(|t| t.id).collect();
/// assert_eq!(kept, [4, 5, 6, 7]);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct TopP {
    /// `fl32(1 - p)`, the subtraction in double.
    threshold: f32,
    min_tokens_to_keep: usize,
}

impl TopP {
    /// Top-p with mass `top_p` in `[0, 1]`, never removing the `min_tokens_to_keep >= 1`
    /// most likely tokens.
    pub fn new(top_p: f64, min_tokens_to_keep: i64) -> Result<Self> {
        if !(0.0..=1.0).contains(&top_p) {
            return Err(Error::parameter("top_p", "p", format!("has to be a float >= 0 and <= 1, but is {top_p}")));
        }
        let min_tokens_to_keep = require_min_tokens_to_keep("top_p", min_tokens_to_keep)?;
        Ok(TopP { threshold: fl32(1.0 - top_p), min_tokens_to_keep })
    }
}

impl Sampler for TopP {
    fn name(&self) -> &'static str {
        "top_p"
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        // The cut by value needs only the finite logits and how many tokens there are
        // (`vocab_size`), so a sparse view (which leaves out -inf tokens only) gets the dense
        // row's cut; only the torch-order fallback needs the dense row.
        if !c.sparse {
            ensure_dense(c);
        }
        match self.cut_by_value(c) {
            Some(None) => {}
            Some(Some(last)) => {
                // The removed sorted positions are exactly the finite logits `<= last` (the
                // next sorted value is strictly larger); `-inf` ones are removed already.
                for t in c.as_mut_slice() {
                    if t.logit <= last {
                        t.logit = f32::NEG_INFINITY;
                    }
                }
            }
            None => self.apply_sorted(c),
        }
        Ok(())
    }
}

impl TopP {
    /// `(fl32(1 - p), min_tokens_to_keep)`: the cumulative-mass threshold and the floor.
    pub(crate) fn params(&self) -> (f32, usize) {
        (self.threshold, self.min_tokens_to_keep)
    }

    /// The obvious implementation, step by step as torch: sort the whole row with libstdc++'s
    /// introsort (tie order included), softmax of the sorted row, cumsum, cut.
    fn apply_sorted(&self, c: &mut Candidates) {
        ensure_dense(c);
        let n = c.len();
        let mut buf = std::mem::take(&mut c.scratch);
        fill_pairs(&mut buf, &c.data, |t| t.logit);
        sort_ascending(&mut buf);
        softmax(&mut buf);
        let removable = n.saturating_sub(self.min_tokens_to_keep);
        let mut cum = Cumsum::default();
        for t in &buf[..removable] {
            // NaN (an all -inf row) compares false: nothing is removed.
            if cum.push(t.p) <= self.threshold {
                remove(&mut c.data, t.id as usize);
            } else {
                break; // the cum never decreases
            }
        }
        c.scratch = buf;
    }

    /// The cut of [`TopP::apply_sorted`] decided from the sorted **values** alone: `Some(None)`
    /// when nothing is removed, `Some(Some(last))` when exactly the logits `<= last` are,
    /// `None` when only torch's tie order can decide (a run of equal finite values straddles
    /// the cut) or the row holds NaN or `+inf`.
    ///
    /// Why it is exact: the softmax sum, every probability and every partial cumsum depend
    /// only on the sequence of sorted values, not on which index holds a value, so the cut
    /// position `r` is the same for any correct ascending sort. The `-inf` entries sort first
    /// with weight exactly 0: they add nothing to the f64 sum, keep the cumsum at 0
    /// (`<= fl32(1 - p)`, which is `>= 0`, so the loop always runs through them), and
    /// "removing" them changes nothing; only their count matters, for the
    /// `min_tokens_to_keep` bound. So only the finite values are sorted (a radix sort of
    /// values, no comparator on pairs). Where the values at sorted positions `r - 1` and `r`
    /// differ, the removed set is "every value `<= sorted[r - 1]`" whatever the tie order.
    fn cut_by_value(&self, c: &mut Candidates) -> Option<Option<f32>> {
        let n = c.vocab_size;
        let mut keys = std::mem::take(&mut c.keys);
        let mut weights = std::mem::take(&mut c.wide);
        let cut = self.cut_from_sorted(&c.data, n, &mut keys, &mut weights);
        c.keys = keys;
        c.wide = weights;
        cut
    }

    fn cut_from_sorted(
        &self,
        data: &[TokenData],
        n: usize,
        keys: &mut Vec<u32>,
        weights: &mut Vec<f64>,
    ) -> Option<Option<f32>> {
        let sorted = sorted_finite_logits(data, keys)?;
        let m = sorted.len();
        if m == 0 {
            return Some(None); // all -inf: NaN cum, the row is unchanged
        }
        let max = from_sort_key(sorted[m - 1]);
        if !max.is_finite() {
            return None; // +inf: NaN probabilities, leave it to the obvious path
        }
        let below = n - m; // the -inf entries, sorted first
        let removable = n.saturating_sub(self.min_tokens_to_keep);
        if removable <= below {
            return Some(None);
        }
        // Finite sorted positions that may go; < m because min_tokens_to_keep >= 1.
        let limit = removable - below;
        weights_into(sorted.iter().map(|&k| from_sort_key(k)), max, weights);
        let mut sum = 0.0f64;
        for &w in weights.iter() {
            sum += w;
        }
        let mut cum = Cumsum::default();
        let mut r = 0;
        while r < limit && cum.push((weights[r] / sum) as f32) <= self.threshold {
            r += 1;
        }
        if r == 0 {
            return Some(None);
        }
        let last = from_sort_key(sorted[r - 1]);
        if last == from_sort_key(sorted[r]) {
            return None; // equal values straddle the cut: torch's sort order picks which go
        }
        Some(Some(last))
    }
}

impl FromSpec for TopP {
    const PARAMS: &'static [&'static str] = &["p", "min_tokens_to_keep"];
    const ALIASES: &'static [(&'static str, &'static str)] = &[("top_p", "p")];
    fn from_spec(args: &Bound<'_>, _: &BuildContext<'_>) -> Result<Self> {
        TopP::new(args.f64("p", None)?, args.i64("min_tokens_to_keep", Some(1))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::transformers::test_util::*;

    fn ln(probs: &[f32]) -> Vec<f32> {
        probs.iter().map(|p| p.ln()).collect()
    }

    #[test]
    fn transformers_top_p_test_vectors() {
        // test_logits_process.py::test_top_p_dist_warper: probs [0.3, 0.1, 0.1, 0.5] with
        // p = 0.8 keep 0.3 and 0.5; [0.15, 0.3, 0.3, 0.25] keep 0.3, 0.3 and 0.25.
        let finite = |z: Vec<f32>| z.iter().map(|v| v.is_finite()).collect::<Vec<_>>();
        assert_eq!(finite(run("top_p(0.8)", &ln(&[0.3, 0.1, 0.1, 0.5]), &[])), [true, false, false, true]);
        assert_eq!(finite(run("top_p(0.8)", &ln(&[0.15, 0.3, 0.3, 0.25]), &[])), [false, true, true, true]);
        // Special case: min_tokens_to_keep wins over a tiny p (ramp over 10 tokens keeps 2).
        let ramp: Vec<f32> = (0..10).map(|i| i as f32 - 5.0).collect();
        let out = run("top_p(0,min_tokens_to_keep=2)", &ramp, &[]);
        assert_eq!(out.iter().filter(|v| v.is_finite()).count(), 2);
    }

    #[test]
    fn the_cut_is_inclusive() {
        // Twenty equal tokens (introsort order above 16), p = 0.95: 1 - p is 0.0500000007 in
        // f32, and one token has mass 0.05 (f32 0.0500000007 as well): cum <= thr removes it.
        let out = run("top_p(0.95)", &[1.0f32; 20], &[]);
        assert_eq!(out.iter().filter(|v| v.is_infinite()).count(), 1);
    }

    #[test]
    fn p_one_still_removes_zero_probability_tokens() {
        let row = [0.0f32, -200.0, NEG, 1.0];
        assert_eq!(run("top_p(1.0)", &row, &[]), [0.0, NEG, NEG, 1.0]);
        assert_eq!(run("top_p(0.9)", &[NEG; 4], &[]), [NEG; 4]);
    }

    #[test]
    fn ties_above_sixteen_follow_introsort_order_not_index_order() {
        // 20 equal logits, p = 0.5: ten are removed, but which ten is std::sort's artefact.
        let out = run("top_p(0.5)", &[0.25f32; 20], &[]);
        let removed: Vec<usize> = (0..20).filter(|&i| out[i].is_infinite()).collect();
        let mut buf: Vec<crate::TokenData> = (0..20).map(|i| crate::TokenData { id: i, logit: 0.25, p: 0.0 }).collect();
        sort_ascending(&mut buf);
        let mut expect: Vec<usize> = buf[..10].iter().map(|t| t.id as usize).collect();
        expect.sort();
        assert_eq!(removed, expect);
        assert_ne!(removed, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn out_of_range_parameters_are_errors() {
        assert!(build_error("top_p(1.5)").contains("parameter `p`"));
        assert!(build_error("top_p(-0.1)").contains("<= 1"));
        assert!(build_error("top_p(0.9,0)").contains("min_tokens_to_keep"));
    }

    #[test]
    fn the_value_cut_matches_the_full_introsort_bit_for_bit() {
        use proptest::prelude::*;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (by_value, total) = (AtomicUsize::new(0), AtomicUsize::new(0));
        tokensieve_testkit::proptest_support::check(
            "hf_top_p_value_cut",
            256,
            (adversarial_row(), prop_oneof![Just(0.95f64), Just(1.0), Just(0.0), 0.0f64..=1.0], 1usize..5),
            |(row, p, mtk)| {
                let top_p = TopP::new(p, mtk as i64).unwrap();
                let mut fast = cands(&row);
                if top_p.cut_by_value(&mut fast).is_some() {
                    by_value.fetch_add(1, Ordering::Relaxed);
                }
                total.fetch_add(1, Ordering::Relaxed);
                let mut fast = cands(&row);
                top_p.clone().apply(&mut fast).unwrap();
                let mut obvious = cands(&row);
                top_p.apply_sorted(&mut obvious);
                prop_assert_eq!(bits(&fast), bits(&obvious));
                Ok(())
            },
        );
        // The shortcut must actually be exercised, not just the fallback.
        let (by_value, total) = (by_value.into_inner(), total.into_inner());
        assert!(by_value * 2 > total, "value cut taken in {by_value} of {total} cases");
    }
}
