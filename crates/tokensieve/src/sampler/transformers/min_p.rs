//! `min_p(p, min_tokens_to_keep)` under the transformers convention: `MinPLogitsWarper`.
//!
//! * `probs = softmax(z)`; threshold `fl32(p) * max(probs)` (an f32 product); a token is
//!   removed iff its **probability** is `<` the threshold (strict).
//! * Then the indices `torch.topk(probs, min(min_tokens_to_keep, V))` returns are forced back
//!   to kept. Which of several tokens tied at the k-th probability come back is decided by
//!   torch's CPU topk (libstdc++ `partial_sort` when `k * 64 <= V`, else `nth_element`), which
//!   [`crate::convention::transformers::topk`] reproduces.
//! * `p = 0` keeps everything. A row whose logits are all `-inf` is unchanged.
//!
//! Differs from llama.cpp's `min_p`, which compares logits against `max + ln p` without a
//! softmax and truncates the array.
//!
//! Validation as transformers: `p` in `[0, 1]`, `min_tokens_to_keep` an integer `>= 1`.
//! `generate()` adds it whenever `min_p` is set, after temperature, top-k and top-p. Draws:
//! none. The `p` fields hold the softmax afterwards.
//!
//! Spec: `min_p(p, min_tokens_to_keep)` (default 1); `min_p=` is accepted for `p`.

use crate::candidates::Candidates;
use crate::convention::transformers::{ensure_dense, fill_pairs, fl32, remove, softmax_exps, topk};
use crate::error::{Error, Result};
use crate::params::spec::Bound;
use crate::sampler::transformers::require_min_tokens_to_keep;
use crate::sampler::{BuildContext, FromSpec, Sampler};

/// Min-p, transformers convention.
///
/// ```
/// use tokensieve::{Candidates, sampler::{transformers::min_p::MinP, Sampler}};
/// // probabilities 0.5, 0.3, 0.15, 0.05; min_p 0.2 -> threshold 0.1
/// let logits: Vec<f32> = [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect();
/// let mut c = Candidates::from_logits(&logits).unwrap();
/// MinP::new(0.2, 1).unwrap().apply(&mut c).unwrap();
/// assert_eq!(c.count_finite(), 3);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct MinP {
    min_p: f32,
    min_tokens_to_keep: usize,
}

impl MinP {
    /// Min-p with `min_p` in `[0, 1]`, never removing the `min_tokens_to_keep >= 1` most
    /// likely tokens.
    pub fn new(min_p: f64, min_tokens_to_keep: i64) -> Result<Self> {
        if !(0.0..=1.0).contains(&min_p) {
            return Err(Error::parameter(
                "min_p",
                "p",
                format!("has to be a float in the [0, 1] interval, but is {min_p}"),
            ));
        }
        let min_tokens_to_keep = require_min_tokens_to_keep("min_p", min_tokens_to_keep)?;
        Ok(MinP { min_p: fl32(min_p), min_tokens_to_keep })
    }
}

impl Sampler for MinP {
    fn name(&self) -> &'static str {
        "min_p"
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        if c.sparse && self.apply_to_view(c) {
            return Ok(());
        }
        ensure_dense(c);
        let done = self.apply_to_view(c);
        debug_assert!(done, "a dense row always decides");
        Ok(())
    }
}

impl MinP {
    /// `(min_p, min_tokens_to_keep)` as applied: `min_p` rounded to f32.
    pub(crate) fn params(&self) -> (f32, usize) {
        (self.min_p, self.min_tokens_to_keep)
    }

    /// The removal, on the dense row or on a sparse view; `false` (a view untouched but for
    /// its `p` fields) when only the dense row can decide.
    ///
    /// A sparse view leaves out -inf tokens only, whose weight is exactly 0: the maximum, the
    /// f64 sum (the same nonzero weights in the same order) and every probability are the
    /// dense row's. With `threshold > 0` a left-out token (`p = 0`) is below it, as in the
    /// dense count; with `threshold = 0` nothing is removed in either. Only the tie-dependent
    /// `topk` restoration needs the dense row.
    fn apply_to_view(&self, c: &mut Candidates) -> bool {
        let mut exps = std::mem::take(&mut c.wide);
        let (max, sum) = softmax_exps(&mut c.data, &mut exps); // the bits of `softmax`, one exp per entry
        c.wide = exps;
        if !max.is_finite() {
            return true; // NaN probabilities: every comparison is false, nothing is removed
        }
        // amax(probs) without a pass: the maximum logit has weight exp(0) = 1 exactly, so its
        // probability is fl32(1 / sum); every other weight is <= 1 and rounding is monotone.
        let top = (1.0 / sum) as f32;
        let threshold = self.min_p * top;
        if threshold == 0.0 {
            return true; // no probability is below 0
        }
        // `vocab_size` is the dense row's length.
        let k = self.min_tokens_to_keep.min(c.vocab_size);
        // torch.topk only matters when it brings back a token below the threshold. If at
        // least k probabilities are >= the threshold, the k-th largest is too, so every token
        // topk returns survives anyway and its tie order is irrelevant: skip it. (k = 1 always
        // qualifies: the top probability is >= min_p * itself.)
        if k > 1 && c.data.iter().filter(|t| t.p >= threshold).count() < k {
            if c.sparse {
                return false;
            }
            self.restore_topk_and_remove(c, threshold, k);
        } else {
            for t in c.as_mut_slice() {
                if t.p < threshold {
                    t.logit = f32::NEG_INFINITY;
                }
            }
        }
        true
    }

    /// The removal with torch's `topk(probs, k)` indices forced back, as transformers
    /// writes it.
    fn restore_topk_and_remove(&self, c: &mut Candidates, threshold: f32, k: usize) {
        // The kept-by-topk entries: (index, probability) pairs, torch's selection in buf[..k].
        let mut buf = std::mem::take(&mut c.scratch);
        fill_pairs(&mut buf, &c.data, |t| t.p);
        topk(&mut buf, k);
        for t in &buf[..k] {
            c.data[t.id as usize].p = f32::INFINITY; // sentinel: never below the threshold
        }
        for i in 0..c.data.len() {
            if c.data[i].p < threshold {
                remove(&mut c.data, i);
            }
        }
        for t in &buf[..k] {
            c.data[t.id as usize].p = t.logit; // the probability, restored
        }
        c.scratch = buf;
    }

    /// The obvious implementation (softmax, topk, sentinel, scan), kept for the property
    /// tests that hold [`Sampler::apply`]'s shortcuts to it.
    #[cfg(test)]
    fn apply_obvious(&self, c: &mut Candidates) {
        ensure_dense(c);
        crate::convention::transformers::softmax(&mut c.data);
        let top = c.data.iter().fold(f32::NEG_INFINITY, |m, t| if t.p > m || t.p.is_nan() { t.p } else { m });
        let threshold = self.min_p * top;
        let k = self.min_tokens_to_keep.min(c.len());
        self.restore_topk_and_remove(c, threshold, k);
    }
}

impl FromSpec for MinP {
    const PARAMS: &'static [&'static str] = &["p", "min_tokens_to_keep"];
    const ALIASES: &'static [(&'static str, &'static str)] = &[("min_p", "p")];
    fn from_spec(args: &Bound<'_>, _: &BuildContext<'_>) -> Result<Self> {
        MinP::new(args.f64("p", None)?, args.i64("min_tokens_to_keep", Some(1))?)
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
    fn the_threshold_scales_with_the_top_probability() {
        // min_p = 0.05 scaled by a top probability of 0.6 -> 0.03, of 0.9 -> 0.045.
        let finite = |z: Vec<f32>| z.iter().map(|v| v.is_finite()).collect::<Vec<_>>();
        let a = ln(&[0.6, 0.3, 0.08, 0.02]);
        assert_eq!(finite(run("min_p(0.05)", &a, &[])), [true, true, true, false]);
        let b = ln(&[0.9, 0.05, 0.04, 0.01]);
        assert_eq!(finite(run("min_p(0.05)", &b, &[])), [true, true, false, false]);
        // min_p = 0 keeps everything; min_p = 1 keeps only the top (and its ties).
        assert_eq!(finite(run("min_p(0)", &a, &[])), [true; 4]);
        assert_eq!(finite(run("min_p(1)", &[1.0, 2.0, 2.0, 0.0], &[])), [false, true, true, false]);
    }

    #[test]
    fn min_tokens_to_keep_restores_torch_s_topk_choice_among_ties() {
        // All equal but one: min_p 1 keeps the max; min_tokens_to_keep 3 brings back two of the
        // tied tokens, chosen by nth_element (k * 64 > V), not necessarily the lowest ids.
        let row = [0.0f32, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0];
        let out = run("min_p(1,3)", &row, &[]);
        assert_eq!(out.iter().filter(|v| v.is_finite()).count(), 3);
        let mut buf: Vec<crate::TokenData> =
            (0..8).map(|i| crate::TokenData { id: i, logit: if i == 7 { 2.0 } else { 1.0 }, p: 0.0 }).collect();
        topk(&mut buf, 3);
        for t in &buf[..3] {
            assert!(out[t.id as usize].is_finite());
        }
    }

    #[test]
    fn invalid_parameters_are_errors() {
        assert!(build_error("min_p(1.5)").contains("[0, 1]"));
        assert!(build_error("min_p(0.1,0)").contains("min_tokens_to_keep"));
    }

    #[test]
    fn the_shortcuts_match_softmax_topk_and_scan_bit_for_bit() {
        use proptest::prelude::*;
        tokensieve_testkit::proptest_support::check(
            "hf_min_p_shortcuts",
            256,
            (adversarial_row(), prop_oneof![Just(0.05f64), Just(1.0), Just(0.0), 0.0f64..=1.0], 1usize..6),
            |(row, p, mtk)| {
                let min_p = MinP::new(p, mtk as i64).unwrap();
                let mut fast = cands(&row);
                min_p.clone().apply(&mut fast).unwrap();
                let mut obvious = cands(&row);
                min_p.apply_obvious(&mut obvious);
                prop_assert_eq!(bits(&fast), bits(&obvious));
                Ok(())
            },
        );
    }
}
