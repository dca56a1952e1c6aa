//! `top_k(k, min_tokens_to_keep)` under the transformers convention: `TopKLogitsWarper`.
//!
//! * Effective `k = max(k, min_tokens_to_keep)`, clamped to the vocabulary size when applied.
//! * Threshold `t` = the k-th largest logit (`torch.topk(z, k).values[-1]`, duplicates
//!   counted); every token with `z < t` (strict) is set to `-inf`. So every token tied with the
//!   k-th value is kept (more than `k` may survive), and if fewer than `k` logits are finite
//!   `t = -inf` and nothing changes. Only values are compared: the result never depends on
//!   torch's tie order and has no floating-point fragility.
//!
//! Differs from llama.cpp's `top_k`: nothing is truncated or sorted, ties at the k-th value all
//! survive, `k <= 0` is an error instead of "off".
//!
//! Validation as transformers: `k` must be an integer `> 0`; `min_tokens_to_keep` is not
//! checked (any integer, only `max(k, min_tokens_to_keep)` matters). Draws: none.
//!
//! Spec: `top_k(k, min_tokens_to_keep)` (default 1); `top_k=` is accepted for `k`.

use crate::candidates::Candidates;
use crate::convention::transformers::{ensure_dense, kth_largest_logit, remove};
use crate::error::{Error, Result};
use crate::params::spec::Bound;
use crate::sampler::{BuildContext, FromSpec, Sampler};

/// Top-k, transformers convention.
///
/// ```
/// use tokensieve::{Candidates, sampler::{transformers::top_k::TopK, Sampler}};
/// let mut c = Candidates::from_logits(&[1.0, 3.0, 2.0, 3.0, 2.0]).unwrap();
/// TopK::new(2, 1).unwrap().apply(&mut c).unwrap();
/// let l: Vec<f32> = c.as_slice().iter().map(|t| t.logit).collect();
/// let ninf = f32::NEG_INFINITY;
/// assert_eq!(l, [ninf, 3.0, ninf, 3.0, ninf]);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct TopK {
    k: usize,
}

impl TopK {
    /// Keeps the `max(top_k, min_tokens_to_keep)` largest logits (and everything tied with the
    /// last of them). `top_k` must be `> 0`.
    pub fn new(top_k: i64, min_tokens_to_keep: i64) -> Result<Self> {
        if top_k <= 0 {
            return Err(Error::parameter(
                "top_k",
                "k",
                format!("has to be a strictly positive integer, but is {top_k}"),
            ));
        }
        let k = top_k.max(min_tokens_to_keep);
        Ok(TopK { k: usize::try_from(k).unwrap_or(usize::MAX) })
    }
}

impl TopK {
    /// `max(top_k, min_tokens_to_keep)`.
    pub(crate) fn k(&self) -> usize {
        self.k
    }
}

impl Sampler for TopK {
    fn name(&self) -> &'static str {
        "top_k"
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        if c.sparse {
            // The tokens a sparse view leaves out are -inf, the smallest values: with `k` at
            // least the view's length the k-th largest is -inf or the view's minimum, and
            // nothing finite is below it; otherwise it is the view's own k-th largest.
            if self.k >= c.len() {
                return Ok(());
            }
        } else {
            ensure_dense(c);
        }
        let k = self.k.min(c.len());
        if k == 0 || k == c.len() {
            return Ok(()); // t = the minimum: nothing is below it
        }
        let t = kth_largest_logit(c, k);
        let data = c.as_mut_slice();
        for i in 0..data.len() {
            if data[i].logit < t {
                remove(data, i);
            }
        }
        Ok(())
    }
}

impl FromSpec for TopK {
    const PARAMS: &'static [&'static str] = &["k", "min_tokens_to_keep"];
    const ALIASES: &'static [(&'static str, &'static str)] = &[("top_k", "k")];
    fn from_spec(args: &Bound<'_>, _: &BuildContext<'_>) -> Result<Self> {
        TopK::new(args.i64("k", None)?, args.i64("min_tokens_to_keep", Some(1))?)
    }
}

#[cfg(test)]
mod tests {
    use crate::sampler::transformers::test_util::*;

    #[test]
    fn transformers_top_k_test_vectors() {
        // test_logits_process.py::test_top_k_dist_warper: two ramps over 10 tokens, k = 3.
        let ramp: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let masked = |z: &[f32]| z.iter().map(|v| v.is_infinite()).collect::<Vec<_>>();
        let out = run("top_k(3)", &ramp, &[]);
        assert_eq!(masked(&out), [[true; 7].as_slice(), &[false; 3]].concat());
        let shifted: Vec<f32> = (0..10).map(|i| if i < 5 { i as f32 + 10.0 } else { i as f32 }).collect();
        let out = run("top_k(3)", &shifted, &[]);
        assert_eq!(masked(&out), [[true; 2].as_slice(), &[false; 3], &[true; 5]].concat());
        // Special cases: min_tokens_to_keep overrides k; a uniform row is not changed.
        let uniform = [0.2f32; 5];
        assert_eq!(run("top_k(1,3)", &uniform, &[]), uniform);
        let ramp5: Vec<f32> = (0..5).map(|i| i as f32).collect();
        assert_eq!(run("top_k(1,min_tokens_to_keep=3)", &ramp5, &[]).iter().filter(|v| v.is_infinite()).count(), 2);
    }

    #[test]
    fn fewer_finite_than_k_changes_nothing() {
        let row = [NEG, 1.0, NEG, 2.0];
        assert_eq!(run("top_k(3)", &row, &[]), row);
        assert_eq!(run("top_k(40)", &[NEG; 3], &[]), [NEG; 3]);
    }

    #[test]
    fn zero_and_negative_k_are_errors() {
        assert!(build_error("top_k(0)").contains("strictly positive integer"));
        assert!(build_error("top_k(-3)").contains("parameter `k`"));
        assert!(build_error("top_k(2.5)").contains("integer"));
    }
}
