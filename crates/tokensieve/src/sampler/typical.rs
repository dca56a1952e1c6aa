//! `typical(p, min_keep)`: locally typical sampling, keeps the candidates whose surprise
//! `-ln p` is closest to the distribution's entropy until their mass exceeds `p`.
//!
//! llama.cpp convention (`llama_sampler_typical`, commit 0c1e570):
//!
//! * `p >= 1` builds an inert stage (`?typical`).
//! * Full sort (libstdc++ order on ties) and f32 softmax; entropy `H = Σ -p·ln p` summed in
//!   f32 in sorted order; score `|-ln p_i - H|`.
//! * Candidate **indices** are `std::sort`ed ascending by score (libstdc++ introsort, unstable:
//!   equal scores keep the order that algorithm leaves), then the prefix is kept up to the
//!   first position `i` where the f32 running sum of `p` is **strictly** `> p` and
//!   `i + 1 >= min_keep` (`min_keep = 0` behaves like 1); if the sum never exceeds `p`,
//!   everything is kept.
//! * Output in **score order**, flagged unsorted; `p` not renormalised.
//!
//! NaN: a candidate with `p = 0` (a `-inf` logit from a mask, or an underflow) makes llama.cpp's
//! entropy NaN (`0 · ln 0`), hence every score NaN. tokensieve reproduces what llama.cpp then
//! does: with every comparison false, libstdc++'s sort treats all scores as equal, which is a
//! valid (if meaningless) order: for up to 16 candidates the logit order, above that whatever
//! the introsort leaves. The cut then follows the running sum of `p` in that order. The result
//! is deterministic and equal to llama.cpp's, but it is not "typical sampling"; put `typical`
//! before stages that mask candidates with `-inf` (`top_n_sigma`, `temperature(0)`, a
//! `logit_bias` ban) if that matters. (Scores are all NaN or none is, so the comparator is
//! always a strict weak order and the sort cannot run out of bounds.)
//!
//! Where tokensieve differs: `p < 0` (which llama.cpp treats like `p = 0`), NaN or infinite `p`
//! and negative `min_keep` are parameter errors. The score and index vectors are reused across
//! calls instead of being allocated per call.

use super::{require_finite, require_min_keep, BuildContext, FromSpec, Sampler};
use crate::candidates::Candidates;
use crate::convention::llama_cpp;
use crate::error::{Error, Result};
use crate::params::spec::Bound;
use crate::stdsort;

/// Locally typical sampling.
///
/// ```
/// use tokensieve::{Candidates, sampler::{typical::Typical, Sampler}};
/// // Probabilities .97, .01, .01, .01 with p = 0.5: only the likely token is typical.
/// let logits: Vec<f32> = [0.97f32, 0.01, 0.01, 0.01].iter().map(|p| p.ln()).collect();
/// let mut c = Candidates::from_logits(&logits).unwrap();
/// Typical::new(0.5, 1).unwrap().apply(&mut c).unwrap();
/// assert_eq!(c.len(), 1);
/// assert_eq!(c.as_slice()[0].id, 0);
/// ```
#[derive(Debug)]
pub struct Typical {
    p: f32,
    min_keep: usize,
    /// Reused per call: `|-ln p_i - H|` per candidate.
    scores: Vec<f32>,
    /// Reused per call: candidate indices sorted by score.
    order: Vec<u32>,
}

impl Clone for Typical {
    /// Clones the parameters, not the scratch buffers.
    fn clone(&self) -> Self {
        Typical { p: self.p, min_keep: self.min_keep, scores: Vec::new(), order: Vec::new() }
    }
}

impl Typical {
    /// Typical sampling with mass `p` (finite, `>= 0`; `>= 1` = off) keeping at least
    /// `min_keep`.
    pub fn new(p: f32, min_keep: usize) -> Result<Self> {
        let p = require_finite("typical", "p", p)?;
        if p < 0.0 {
            return Err(Error::parameter("typical", "p", format!("must be >= 0, got {p}")));
        }
        Ok(Typical { p, min_keep, scores: Vec::new(), order: Vec::new() })
    }
}

impl Sampler for Typical {
    fn name(&self) -> &'static str {
        if self.is_inert() {
            "?typical"
        } else {
            "typical"
        }
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        if self.is_inert() || c.is_empty() {
            return Ok(());
        }
        llama_cpp::softmax(c, true);
        let data = &c.data;
        let mut entropy = 0.0f32;
        for t in data {
            entropy += -t.p * t.p.ln();
        }
        let scores = &mut self.scores;
        scores.clear();
        scores.extend(data.iter().map(|t| (-t.p.ln() - entropy).abs()));
        let order = &mut self.order;
        order.clear();
        order.extend(0..data.len() as u32);
        stdsort::sort(order, |&a, &b| scores[a as usize] < scores[b as usize]);

        let mut cum = 0.0f32;
        let mut last = order.len();
        for (i, &idx) in order.iter().enumerate() {
            cum += data[idx as usize].p;
            // llama.cpp: `min_keep == 0 || i >= min_keep - 1`, i.e. `i + 1 >= min_keep`.
            if cum > self.p && i + 1 >= self.min_keep {
                last = i + 1;
                break;
            }
        }

        let mut kept = std::mem::take(&mut c.scratch);
        kept.clear();
        kept.extend(order[..last].iter().map(|&idx| data[idx as usize]));
        c.data[..last].copy_from_slice(&kept);
        c.truncate(last);
        c.set_sorted(false);
        c.scratch = kept;
        Ok(())
    }

    fn is_inert(&self) -> bool {
        self.p >= 1.0
    }
}

impl FromSpec for Typical {
    const PARAMS: &'static [&'static str] = &["p", "min_keep"];
    fn from_spec(args: &Bound<'_>, _: &BuildContext<'_>) -> Result<Self> {
        let min_keep = require_min_keep("typical", args.i32("min_keep", Some(1))?)?;
        Typical::new(args.f32("p", None)?, min_keep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::test_util::from_probs;

    #[test]
    fn llama_cpp_test_vectors() {
        let mut c = from_probs(&[0.97, 0.01, 0.01, 0.01]);
        Typical::new(0.5, 1).unwrap().apply(&mut c).unwrap();
        assert_eq!(c.len(), 1);
        let mut c = from_probs(&[0.4, 0.2, 0.2, 0.2]);
        Typical::new(0.5, 1).unwrap().apply(&mut c).unwrap();
        let mut ids: Vec<u32> = c.as_slice().iter().map(|t| t.id).collect();
        ids.sort();
        assert_eq!(ids, [1, 2, 3]);
        assert!(!c.is_sorted());
    }

    #[test]
    fn min_keep_zero_behaves_like_one() {
        for min_keep in [0, 1] {
            let mut c = from_probs(&[0.97, 0.01, 0.01, 0.01]);
            Typical::new(0.0, min_keep).unwrap().apply(&mut c).unwrap();
            assert_eq!(c.len(), 1);
        }
        let mut c = from_probs(&[0.97, 0.01, 0.01, 0.01]);
        Typical::new(0.0, 3).unwrap().apply(&mut c).unwrap();
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn masked_candidate_gives_llama_cpps_nan_order() {
        // p = 0 for the masked one: entropy NaN, all scores NaN, the index sort keeps the
        // logit order (insertion sort with every comparison false), cut by running mass.
        let mut c = Candidates::from_logits(&[1.0, 3.0, f32::NEG_INFINITY, 2.0]).unwrap();
        Typical::new(0.5, 1).unwrap().apply(&mut c).unwrap();
        assert_eq!(c.as_slice()[0].id, 1);
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn inert_and_invalid_parameters() {
        assert!(Typical::new(1.0, 1).unwrap().is_inert());
        assert_eq!(Typical::new(1.0, 1).unwrap().name(), "?typical");
        assert!(Typical::new(-0.2, 1).is_err());
        assert!(Typical::new(f32::NAN, 1).is_err());
    }
}
