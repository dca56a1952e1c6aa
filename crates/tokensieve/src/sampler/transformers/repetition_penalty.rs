//! `repetition_penalty(penalty)` under the transformers convention:
//! `RepetitionPenaltyLogitsProcessor`.
//!
//! For each **distinct** token id in the sequence (every accepted token: prompt and generated;
//! ids `>= V` are ignored): `s = z[id]`, then `s < 0 ? s * fl32(penalty) : s / fl32(penalty)`.
//! It is applied once per distinct token however often it occurs (no counts), to the whole
//! history (no window). `0` and `-0.0` stay as they are, `-inf` stays `-inf`. A penalty `< 1`
//! rewards repeats.
//!
//! Differs from llama.cpp's `penalties` (a window of `last_n` tokens, `<= 0` multiplied instead
//! of `< 0`, plus frequency and presence terms). transformers has no frequency or presence
//! penalty.
//!
//! `generate()` passes the number of left-padding positions as `prompt_ignore_length`; a
//! sequence here has no padding, so nothing is skipped. Validation as transformers: `penalty`
//! `> 0` (tokensieve also accepts an integer and rejects `inf`). Draws: none.
//!
//! Spec: `repetition_penalty(penalty)`.

use crate::candidates::Candidates;
use crate::convention::transformers::{ensure_dense, fl32};
use crate::error::{Error, Result};
use crate::params::spec::Bound;
use crate::sampler::{BuildContext, FromSpec, Sampler};

/// Repetition penalty over the whole sequence, transformers convention.
///
/// ```
/// use tokensieve::{Candidates, sampler::{transformers::repetition_penalty::RepetitionPenalty, Sampler}};
/// let mut pen = RepetitionPenalty::new(2.0).unwrap();
/// for t in [0, 2, 2] {
///     pen.accept(t);
/// }
/// let mut c = Candidates::from_logits(&[4.0, 1.0, -3.0]).unwrap();
/// pen.apply(&mut c).unwrap();
/// let l: Vec<f32> = c.as_slice().iter().map(|t| t.logit).collect();
/// assert_eq!(l, [2.0, 1.0, -6.0]); // token 2 penalised once although it occurred twice
/// ```
#[derive(Clone, Debug)]
pub struct RepetitionPenalty {
    penalty: f32,
    /// Distinct ids accepted so far, sorted.
    seen: Vec<u32>,
    /// The same ids as bits (id `i` is bit `i % 64` of word `i / 64`), for membership tests
    /// that do not depend on how long the history is.
    seen_bits: Vec<u64>,
}

impl RepetitionPenalty {
    /// A penalty `> 0` (finite) over every token accepted from now on.
    pub fn new(penalty: f64) -> Result<Self> {
        if penalty.is_nan() || penalty <= 0.0 || penalty.is_infinite() {
            return Err(Error::parameter(
                "repetition_penalty",
                "penalty",
                format!("has to be a strictly positive (finite) float, but is {penalty}"),
            ));
        }
        Ok(RepetitionPenalty { penalty: fl32(penalty), seen: Vec::new(), seen_bits: Vec::new() })
    }
}

impl Sampler for RepetitionPenalty {
    fn name(&self) -> &'static str {
        "repetition_penalty"
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        ensure_dense(c);
        let data = c.as_mut_slice();
        for &id in &self.seen {
            let Some(t) = data.get_mut(id as usize) else { break }; // sorted: the rest are >= V too
            t.logit = self.penalise(t.logit);
        }
        Ok(())
    }

    fn accept(&mut self, token: u32) {
        if let Err(pos) = self.seen.binary_search(&token) {
            self.seen.insert(pos, token);
            let word = token as usize / 64;
            if word >= self.seen_bits.len() {
                self.seen_bits.resize(word + 1, 0);
            }
            self.seen_bits[word] |= 1 << (token % 64);
        }
    }

    fn reset(&mut self) {
        self.seen.clear();
        self.seen_bits.clear();
    }
}

impl RepetitionPenalty {
    /// A seen token's logit after this stage.
    #[inline]
    pub(crate) fn penalise(&self, s: f32) -> f32 {
        if s < 0.0 {
            s * self.penalty
        } else {
            s / self.penalty
        }
    }

    /// The distinct ids accepted so far, sorted (the tokens this stage edits).
    pub(crate) fn seen(&self) -> &[u32] {
        &self.seen
    }

    /// Whether `id` was accepted (this stage edits its logit).
    #[inline]
    pub(crate) fn has_seen(&self, id: u32) -> bool {
        self.seen_bits.get(id as usize / 64).is_some_and(|w| w >> (id % 64) & 1 != 0)
    }

    /// Whether every logit it edits goes down or stays: a penalty of at least 1 divides the
    /// positive ones by it and multiplies the negative ones.
    pub(crate) fn lowers(&self) -> bool {
        self.penalty >= 1.0
    }
}

impl FromSpec for RepetitionPenalty {
    const PARAMS: &'static [&'static str] = &["penalty"];
    const ALIASES: &'static [(&'static str, &'static str)] = &[("repetition_penalty", "penalty")];
    fn from_spec(args: &Bound<'_>, _: &BuildContext<'_>) -> Result<Self> {
        RepetitionPenalty::new(args.f64("penalty", None)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::transformers::test_util::*;

    /// `has_seen` answers for the accepted ids only, across the bitset's words and past its
    /// end, and forgets them on `reset`.
    #[test]
    fn has_seen_is_membership_in_the_history() {
        let mut pen = RepetitionPenalty::new(1.3).unwrap();
        let history = [5u32, 63, 64, 5, 1000, 130_000];
        history.iter().for_each(|&t| pen.accept(t));
        for id in (0..1100).chain([129_999, 130_000, 130_001, u32::MAX]) {
            assert_eq!(pen.has_seen(id), history.contains(&id), "id {id}");
        }
        assert_eq!(pen.seen(), [5, 63, 64, 1000, 130_000]);
        pen.reset();
        assert!(history.iter().all(|&t| !pen.has_seen(t)));
        assert!(pen.lowers() && !RepetitionPenalty::new(0.9).unwrap().lowers());
    }

    #[test]
    fn transformers_repetition_penalty_test_vectors() {
        // test_logits_process.py::test_repetition_penalty_dist_process: uniform scores 1/10,
        // row 0 has score -1/10 at token 0 and history [0, 1]; row 1 has 4/10 at token 5 and
        // history [5, 0]. Penalty 2: negative scores are multiplied, positive ones divided.
        let v = 10;
        let mut row0 = vec![1.0f32 / v as f32; v];
        row0[0] = -(1.0 / v as f32);
        let out = run("repetition_penalty(2.0)", &row0, &[0, 1]);
        assert_eq!(out[0], -(1.0 / v as f32) * 2.0);
        assert_eq!(out[1], (1.0 / v as f32) / 2.0);
        assert_eq!(&out[2..], &row0[2..]);
        let mut row1 = vec![1.0f32 / v as f32; v];
        row1[5] = 4.0 / v as f32;
        let out = run("repetition_penalty(2.0)", &row1, &[5, 0]);
        assert_eq!(out[0], (1.0 / v as f32) / 2.0);
        assert_eq!(out[5], (4.0 / v as f32) / 2.0);
        // Once per distinct token, however often it occurs.
        let out = run("repetition_penalty(2.0)", &row0, &[0, 0, 0]);
        assert_eq!(out[0], -(1.0 / v as f32) * 2.0);
    }

    #[test]
    fn zero_negative_zero_and_masked_are_fixed_points() {
        let row = [0.0f32, -0.0, NEG, 3.0];
        let out = run("repetition_penalty(1.3)", &row, &[0, 1, 2, 9]);
        assert_eq!(out[0].to_bits(), 0.0f32.to_bits());
        assert_eq!(out[1].to_bits(), (-0.0f32).to_bits());
        assert_eq!(out[2], NEG);
        assert_eq!(out[3], 3.0, "id 9 is out of the vocabulary and ignored");
        // penalty < 1 rewards repeats, with the f32-rounded penalty.
        let out = run("repetition_penalty(0.8)", &[3.0f32, -3.0], &[0, 1]);
        assert_eq!(out, [3.0 / 0.8f64 as f32, -3.0 * 0.8f64 as f32]);
    }

    #[test]
    fn reset_forgets_the_history_and_penalty_must_be_positive() {
        let mut p = RepetitionPenalty::new(2.0).unwrap();
        p.accept(0);
        p.reset();
        let mut c = cands(&[4.0]);
        p.apply(&mut c).unwrap();
        assert_eq!(logits(&c), [4.0]);
        assert!(build_error("repetition_penalty(0)").contains("strictly positive"));
        assert!(build_error("repetition_penalty(-1)").contains("parameter `penalty`"));
    }
}
