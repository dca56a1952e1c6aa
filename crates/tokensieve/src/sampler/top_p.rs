//! `top_p(p, min_keep)`: nucleus sampling, keeps the shortest most-likely prefix whose
//! probability mass reaches `p`.
//!
//! llama.cpp convention (`llama_sampler_top_p`, commit 0c1e570):
//!
//! * `p >= 1` builds an inert stage (`?top-p`).
//! * Probabilities are a softmax of the **current** logits without sorting (f32 `expf`, f32
//!   sum, max from a scan or the first entry when the array is flagged sorted).
//! * The cut is the first index `i` (in descending-logit order) where the f32 running sum of
//!   `p` is `>= p` **and** `i + 1 >= min_keep`; everything after it is dropped. If rounding
//!   keeps the sum below `p`, or `min_keep` exceeds the size, everything is kept. `p = 0`
//!   (or `min_keep = 0`) keeps exactly one candidate.
//! * Ordering: an unsorted array of at most 1024 candidates is fully sorted in place. Above
//!   1024, only the top 256 are bucket-sorted into a side buffer (the candidates' scratch
//!   buffer here, llama.cpp's `buf_sort`); if the running sum has not reached `p` after 256
//!   entries, the whole array is bucket-sorted into the side buffer and the scan continues.
//!   The survivors are copied back. Both sorts are libstdc++'s unstable algorithms (see
//!   [`crate::convention::llama_cpp`]), so tied logits end in llama.cpp's order.
//! * Output: sorted, truncated, `p` **not** renormalised (the survivors' `p` sum to `< 1`).
//!
//! Where tokensieve differs: `p < 0` (which llama.cpp treats like `p = 0`), NaN or infinite `p`
//! and negative `min_keep` (a huge `size_t` in llama.cpp, i.e. "keep everything") are
//! parameter errors. llama.cpp's redundant second full sort when the scan reaches the last
//! candidate is skipped (it re-sorts the same input into the same order).

use super::{require_finite, require_min_keep, BuildContext, FromSpec, Sampler};
use crate::candidates::{Candidates, TokenData};
use crate::convention::llama_cpp;
use crate::error::{Error, Result};
use crate::params::spec::Bound;

/// Above this many unsorted candidates, only the top [`ADAPTIVE_TOP`] are sorted first.
const SMALL_SORT_LIMIT: usize = 1024;
/// How many candidates the first, partial sort of a large unsorted array orders.
const ADAPTIVE_TOP: usize = 256;

/// Nucleus (top-p) truncation.
///
/// ```
/// use tokensieve::{Candidates, sampler::{top_p::TopP, Sampler}};
/// // Probabilities 0.1, 0.2, 0.3, 0.4: p = 0.7 keeps the two most likely.
/// let logits: Vec<f32> = [0.1f32, 0.2, 0.3, 0.4].iter().map(|p| p.ln()).collect();
/// let mut c = Candidates::from_logits(&logits).unwrap();
/// TopP::new(0.7, 1).unwrap().apply(&mut c).unwrap();
/// let ids: Vec<u32> = c.as_slice().iter().map(|t| t.id).collect();
/// assert_eq!(ids, [3, 2]);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct TopP {
    p: f32,
    min_keep: usize,
}

impl TopP {
    /// Top-p with mass `p` (finite, `>= 0`; `>= 1` = off) keeping at least `min_keep`.
    pub fn new(p: f32, min_keep: usize) -> Result<Self> {
        let p = require_finite("top_p", "p", p)?;
        if p < 0.0 {
            return Err(Error::parameter("top_p", "p", format!("must be >= 0 (0 keeps one candidate), got {p}")));
        }
        Ok(TopP { p, min_keep })
    }

    /// The parameters `(p, min_keep)`.
    pub(crate) fn params(&self) -> (f32, usize) {
        (self.p, self.min_keep)
    }
}

/// Index one past the last kept candidate: the first prefix of `data` whose f32 running sum
/// of `p` is `>= p` and whose length is `>= min_keep`, or `data.len()` if there is none.
fn cutoff(data: &[TokenData], p: f32, min_keep: usize) -> Option<usize> {
    let mut cum = 0.0f32;
    for (i, t) in data.iter().enumerate() {
        cum += t.p;
        if cum >= p && i + 1 >= min_keep {
            return Some(i + 1);
        }
    }
    None
}

impl Sampler for TopP {
    fn name(&self) -> &'static str {
        if self.is_inert() {
            "?top-p"
        } else {
            "top-p"
        }
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        if self.is_inert() || c.is_empty() {
            return Ok(());
        }
        llama_cpp::softmax(c, false);
        let n = c.len();
        if c.is_sorted() || n <= SMALL_SORT_LIMIT {
            if !c.is_sorted() {
                llama_cpp::sort_all(c);
            }
            let last = cutoff(c.as_slice(), self.p, self.min_keep).unwrap_or(n);
            c.truncate(last);
            return Ok(());
        }

        // Large unsorted array: sort the top 256 into the side buffer; if the running sum has
        // not reached `p` by then, sort everything into it and go on from the same index.
        let mut buf = std::mem::take(&mut c.scratch);
        let first = ADAPTIVE_TOP.min(n);
        llama_cpp::bucket_partial_sort(&c.data, first, &mut buf, &mut c.buckets);
        let mut widened = false;
        let mut cum = 0.0f32;
        let mut last = n;
        let mut i = 0;
        while i < n {
            cum += buf[i].p;
            if cum >= self.p && i + 1 >= self.min_keep {
                last = i + 1;
                break;
            }
            if !widened && i == first - 1 {
                llama_cpp::bucket_partial_sort(&c.data, n, &mut buf, &mut c.buckets);
                widened = true;
            }
            i += 1;
        }
        c.data[..last].copy_from_slice(&buf[..last]);
        c.truncate(last);
        c.set_sorted(true);
        c.scratch = buf;
        Ok(())
    }

    fn is_inert(&self) -> bool {
        self.p >= 1.0
    }
}

impl FromSpec for TopP {
    const PARAMS: &'static [&'static str] = &["p", "min_keep"];
    fn from_spec(args: &Bound<'_>, _: &BuildContext<'_>) -> Result<Self> {
        let min_keep = require_min_keep("top_p", args.i32("min_keep", Some(1))?)?;
        TopP::new(args.f32("p", None)?, min_keep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::test_util::{from_probs, ids};

    #[test]
    fn llama_cpp_test_vectors() {
        // tests/test-sampling.cpp: {.1,.2,.3,.4} with p = 0.7 / 0.8 / 0.
        for (p, expect) in [(0.7, vec![3, 2]), (0.8, vec![3, 2, 1]), (0.0, vec![3])] {
            let mut c = from_probs(&[0.1, 0.2, 0.3, 0.4]);
            TopP::new(p, 1).unwrap().apply(&mut c).unwrap();
            assert_eq!(ids(&c), expect, "p = {p}");
            assert!(c.is_sorted());
        }
    }

    #[test]
    fn probabilities_are_not_renormalised() {
        let mut c = from_probs(&[0.1, 0.2, 0.3, 0.4]);
        TopP::new(0.7, 1).unwrap().apply(&mut c).unwrap();
        let sum: f32 = c.as_slice().iter().map(|t| t.p).sum();
        assert!((sum - 0.7).abs() < 1e-5);
    }

    #[test]
    fn min_keep_extends_the_prefix() {
        let mut c = from_probs(&[0.1, 0.2, 0.3, 0.4]);
        TopP::new(0.0, 3).unwrap().apply(&mut c).unwrap();
        assert_eq!(ids(&c), [3, 2, 1]);
        let mut c = from_probs(&[0.1, 0.2, 0.3, 0.4]);
        TopP::new(0.5, 10).unwrap().apply(&mut c).unwrap();
        assert_eq!(c.len(), 4);
    }

    #[test]
    fn large_unsorted_arrays_match_a_full_sort() {
        // 3000 distinct logits: the 256-entry first pass suffices for small p, not for large.
        let logits: Vec<f32> = (0..3000).map(|i| ((i * 7919) % 3000) as f32 / 200.0 - 7.0).collect();
        for p in [0.05f32, 0.5, 0.99, 0.999_999] {
            let mut fast = Candidates::from_logits(&logits).unwrap();
            TopP::new(p, 1).unwrap().apply(&mut fast).unwrap();
            let mut slow = Candidates::from_logits(&logits).unwrap();
            llama_cpp::softmax(&mut slow, false);
            llama_cpp::sort_all(&mut slow);
            let last = cutoff(slow.as_slice(), p, 1).unwrap_or(slow.len());
            slow.truncate(last);
            assert_eq!(fast.as_slice(), slow.as_slice(), "p = {p}");
            assert!(fast.is_sorted());
        }
    }

    #[test]
    fn inert_and_invalid_parameters() {
        assert!(TopP::new(1.0, 1).unwrap().is_inert());
        assert_eq!(TopP::new(1.0, 1).unwrap().name(), "?top-p");
        assert_eq!(TopP::new(0.9, 1).unwrap().name(), "top-p");
        assert!(TopP::new(-0.1, 1).is_err());
        assert!(TopP::new(f32::NAN, 1).is_err());
        assert!(TopP::new(f32::INFINITY, 1).is_err());
        let mut c = from_probs(&[0.5, 0.5]);
        TopP::new(1.0, 1).unwrap().apply(&mut c).unwrap();
        assert!(!c.is_sorted());
        assert_eq!(c.as_slice()[0].p, 0.0);
    }
}
