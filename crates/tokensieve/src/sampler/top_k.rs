//! `top_k(k)`: keeps the `k` candidates with the largest logits, sorted descending.
//!
//! llama.cpp convention: `k <= 0` builds an inert stage; `k > len` keeps everything (clamped).
//! An unsorted array is partially sorted in place: libstdc++'s heap select for `k <= 128`,
//! llama.cpp's 128-bucket sort over [-10, 10] above that; equal logits keep the order those
//! algorithms leave. An already sorted array is truncated. `p` is not recomputed (stale).

use super::{BuildContext, FromSpec, Sampler};
use crate::candidates::Candidates;
use crate::convention::llama_cpp;
use crate::error::Result;
use crate::params::spec::Bound;

/// Top-k truncation.
///
/// ```
/// use tokensieve::{Candidates, sampler::{top_k::TopK, Sampler}};
/// let mut c = Candidates::from_logits(&[0.1, 0.4, 0.3, 0.2]).unwrap();
/// TopK::new(2).apply(&mut c).unwrap();
/// let ids: Vec<u32> = c.as_slice().iter().map(|t| t.id).collect();
/// assert_eq!(ids, [1, 2]);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct TopK {
    k: i32,
}

impl TopK {
    /// Top-k with `k` (`<= 0` = off).
    pub fn new(k: i32) -> Self {
        TopK { k }
    }

    /// The `k` parameter (`<= 0` = off).
    pub(crate) fn k(&self) -> i32 {
        self.k
    }
}

impl Sampler for TopK {
    fn name(&self) -> &'static str {
        if self.is_inert() {
            "?top-k"
        } else {
            "top-k"
        }
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        llama_cpp::top_k(c, self.k);
        Ok(())
    }

    fn is_inert(&self) -> bool {
        self.k <= 0
    }
}

impl FromSpec for TopK {
    const PARAMS: &'static [&'static str] = &["k"];
    fn from_spec(args: &Bound<'_>, _: &BuildContext<'_>) -> Result<Self> {
        Ok(TopK::new(args.i32("k", None)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k_larger_than_vocab_keeps_all_sorted() {
        let mut c = Candidates::from_logits(&[1.0, 3.0, 2.0]).unwrap();
        TopK::new(10).apply(&mut c).unwrap();
        assert_eq!(c.len(), 3);
        assert!(c.is_sorted());
    }

    #[test]
    fn non_positive_k_is_a_no_op() {
        for k in [0, -1] {
            let mut c = Candidates::from_logits(&[1.0, 3.0, 2.0]).unwrap();
            TopK::new(k).apply(&mut c).unwrap();
            assert_eq!(c.len(), 3);
            assert!(!c.is_sorted());
        }
    }
}
