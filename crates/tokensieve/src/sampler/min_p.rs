//! `min_p(p, min_keep)`: keeps the candidates whose probability is at least `p` times the
//! largest one.
//!
//! llama.cpp convention (`llama_sampler_min_p`, commit 0c1e570):
//!
//! * `p <= 0` builds an inert stage (`?min-p`).
//! * Works in **logit space**, with no softmax and `p` fields left untouched: a candidate
//!   survives when `logit >= max_logit + ln(p)`, the threshold computed in f32 (`logf`).
//! * Unsorted array (fast path): one max scan, then a filter that keeps the survivors in their
//!   **original order**; the array stays unsorted. It succeeds when at least one candidate
//!   and at least `min_keep` survive.
//! * Otherwise (the array is flagged sorted, or the fast path kept too few): full sort (libstdc++
//!   order on ties), threshold from the **first** entry (trusting the sorted flag, as llama.cpp
//!   does even when it is stale), then keep the prefix while `logit >= threshold` or the index
//!   is `< min_keep`; the first candidate is always kept.
//! * Consequences: `p = 1` keeps every tie of the maximum (fast path); `p > 1` (e.g. 1.05)
//!   leaves no survivor on the fast path, so the sorted path keeps exactly the first of the
//!   sorted array (or `min_keep` candidates).
//!
//! Where tokensieve differs: negative, NaN or infinite `p` and negative `min_keep` are parameter
//! errors (llama.cpp treats a negative `p` as off and a negative `min_keep` as a huge `size_t`).
//! The fast path filters in place after counting the survivors, instead of copying them through
//! a temporary vector allocated per call; the result is identical.

use super::{require_finite, require_min_keep, BuildContext, FromSpec, Sampler};
use crate::candidates::Candidates;
use crate::convention::llama_cpp;
use crate::error::{Error, Result};
use crate::params::spec::Bound;

/// Min-p truncation.
///
/// ```
/// use tokensieve::{Candidates, sampler::{min_p::MinP, Sampler}};
/// // Probabilities proportional to 1, 0.5, 0.04, 0.2: p = 0.1 drops the 0.04 one.
/// let logits: Vec<f32> = [1.0f32, 0.5, 0.04, 0.2].iter().map(|p| p.ln()).collect();
/// let mut c = Candidates::from_logits(&logits).unwrap();
/// MinP::new(0.1, 1).unwrap().apply(&mut c).unwrap();
/// let ids: Vec<u32> = c.as_slice().iter().map(|t| t.id).collect();
/// assert_eq!(ids, [0, 1, 3]); // original order kept
/// ```
#[derive(Clone, Copy, Debug)]
pub struct MinP {
    p: f32,
    min_keep: usize,
}

impl MinP {
    /// Min-p with ratio `p` (finite, `>= 0`; `0` = off; `> 1` keeps only the first maximum)
    /// keeping at least `min_keep`.
    pub fn new(p: f32, min_keep: usize) -> Result<Self> {
        let p = require_finite("min_p", "p", p)?;
        if p < 0.0 {
            return Err(Error::parameter("min_p", "p", format!("must be >= 0 (0 turns min-p off), got {p}")));
        }
        Ok(MinP { p, min_keep })
    }

    /// The parameters `(p, min_keep)`.
    pub(crate) fn params(&self) -> (f32, usize) {
        (self.p, self.min_keep)
    }
}

impl Sampler for MinP {
    fn name(&self) -> &'static str {
        if self.is_inert() {
            "?min-p"
        } else {
            "min-p"
        }
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        if self.is_inert() || c.is_empty() {
            return Ok(());
        }
        if !c.is_sorted() {
            let mut max_logit = -f32::MAX;
            for t in c.as_slice() {
                max_logit = llama_cpp::std_max(max_logit, t.logit);
            }
            let min_logit = max_logit + self.p.ln();
            let survivors = c.as_slice().iter().filter(|t| t.logit >= min_logit).count();
            if survivors > 0 && survivors >= self.min_keep {
                c.data.retain(|t| t.logit >= min_logit);
                return Ok(());
            }
        }
        if !c.is_sorted() {
            llama_cpp::sort_all(c);
        }
        let data = c.as_slice();
        let min_logit = data[0].logit + self.p.ln();
        let mut i = 1;
        while i < data.len() {
            if data[i].logit < min_logit && i >= self.min_keep {
                break;
            }
            i += 1;
        }
        c.truncate(i);
        Ok(())
    }

    fn is_inert(&self) -> bool {
        self.p <= 0.0
    }
}

impl FromSpec for MinP {
    const PARAMS: &'static [&'static str] = &["p", "min_keep"];
    fn from_spec(args: &Bound<'_>, _: &BuildContext<'_>) -> Result<Self> {
        let min_keep = require_min_keep("min_p", args.i32("min_keep", Some(1))?)?;
        MinP::new(args.f32("p", None)?, min_keep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::test_util::ids;

    #[test]
    fn fast_path_keeps_original_order_and_p_fields() {
        let mut c = Candidates::from_logits(&[0.0, 3.0, -5.0, 2.5]).unwrap();
        MinP::new(0.5, 1).unwrap().apply(&mut c).unwrap();
        assert_eq!(ids(&c), [1, 3]);
        assert!(!c.is_sorted());
        assert!(c.as_slice().iter().all(|t| t.p == 0.0));
    }

    #[test]
    fn p_one_keeps_ties_and_p_above_one_keeps_the_first() {
        let mut c = Candidates::from_logits(&[2.0, 1.0, 2.0]).unwrap();
        MinP::new(1.0, 1).unwrap().apply(&mut c).unwrap();
        assert_eq!(ids(&c), [0, 2]);
        let mut c = Candidates::from_logits(&[1.0, 2.0, 0.5]).unwrap();
        MinP::new(1.05, 1).unwrap().apply(&mut c).unwrap();
        assert_eq!(ids(&c), [1]);
        assert!(c.is_sorted());
    }

    #[test]
    fn too_few_survivors_fall_back_to_the_sorted_path() {
        let mut c = Candidates::from_logits(&[0.0, 3.0, -5.0, 2.5]).unwrap();
        MinP::new(0.5, 3).unwrap().apply(&mut c).unwrap();
        assert_eq!(ids(&c), [1, 3, 0]);
        assert!(c.is_sorted());
    }

    #[test]
    fn sorted_input_uses_the_prefix_rule() {
        let mut c = Candidates::from_logits(&[0.0, 3.0, -5.0, 2.5]).unwrap();
        llama_cpp::sort_all(&mut c);
        MinP::new(0.5, 1).unwrap().apply(&mut c).unwrap();
        assert_eq!(ids(&c), [1, 3]);
    }

    #[test]
    fn inert_and_invalid_parameters() {
        assert!(MinP::new(0.0, 1).unwrap().is_inert());
        assert_eq!(MinP::new(0.0, 1).unwrap().name(), "?min-p");
        assert!(MinP::new(-0.5, 1).is_err());
        assert!(MinP::new(f32::NAN, 1).is_err());
        assert!(MinP::new(f32::INFINITY, 1).is_err());
    }
}
