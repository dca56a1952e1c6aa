//! `eta(epsilon, min_tokens_to_keep)` under the transformers convention: `EtaLogitsWarper`.
//!
//! * `epsilon` is stored as an f32 tensor.
//! * Entropy from `Categorical(logits=z)`: `ln = z - logsumexp(z)` (logsumexp as torch:
//!   `ln(sum exp(z - max)) + max`, in f32), clamped below at `-f32::MAX` so that masked tokens
//!   contribute `-MAX * 0 = 0`, `H = -sum(ln * softmax(ln))`.
//! * `eta = min(epsilon, sqrt(epsilon) * exp(-H))`, all in f32.
//! * Remove iff `softmax(z) < eta` **and** `z <` the `min_tokens_to_keep`-th largest logit (the
//!   keep rule of [`epsilon`](super::epsilon): by value, ties all kept).
//!
//! No llama.cpp counterpart. Validation as transformers: `epsilon` strictly inside `(0, 1)`,
//! `min_tokens_to_keep` an integer `>= 1`. `generate()` adds it when `0 < eta_cutoff < 1`.
//! Draws: none. The `p` fields hold the softmax afterwards.
//!
//! Spec: `eta(epsilon, min_tokens_to_keep)` (default 1); `eta_cutoff=` is accepted.

use crate::candidates::Candidates;
use crate::convention::transformers::{fl32, max_logit, softmax, weights_into};
use crate::error::Result;
use crate::params::spec::Bound;
use crate::sampler::transformers::epsilon::{check, cut};
use crate::sampler::{BuildContext, FromSpec, Sampler};

/// Eta sampling, transformers convention.
///
/// ```
/// use tokensieve::{Candidates, sampler::{transformers::eta::Eta, Sampler}};
/// let logits: Vec<f32> = [0.9f32, 0.09, 0.009, 0.001].iter().map(|p| p.ln()).collect();
/// let mut c = Candidates::from_logits(&logits).unwrap();
/// Eta::new(0.05, 1).unwrap().apply(&mut c).unwrap();
/// assert_eq!(c.count_finite(), 2);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Eta {
    epsilon: f32,
    min_tokens_to_keep: usize,
}

impl Eta {
    /// Eta sampling with `epsilon` in `(0, 1)`, never removing the `min_tokens_to_keep >= 1`
    /// largest logits.
    pub fn new(epsilon: f64, min_tokens_to_keep: i64) -> Result<Self> {
        let min_tokens_to_keep = check("eta", "eta_cutoff", epsilon, min_tokens_to_keep)?;
        Ok(Eta { epsilon: fl32(epsilon), min_tokens_to_keep })
    }

    /// The entropy `Categorical(logits=z).entropy()` computes, as f32.
    ///
    /// PERF: the exponentials of each softmax computed once and many at a time
    /// ([`weights_into`]: the same bits as one `exp` call each), kept in a buffer reused per
    /// thread; the sums still add them one after another in id order.
    fn entropy(c: &Candidates) -> f32 {
        thread_local! {
            static WEIGHTS: std::cell::RefCell<Vec<f64>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let max = max_logit(&c.data);
        // logsumexp: a +-inf max is replaced by 0 before the subtraction, as torch does.
        let shift = if max.is_infinite() { 0.0 } else { max };
        WEIGHTS.with_borrow_mut(|w| {
            weights_into(c.data.iter().map(|t| t.logit), shift, w);
            let sum: f64 = w.iter().sum();
            let lse = (sum as f32 as f64).ln() as f32 + shift;
            let ln = |z: f32| z - lse;
            // probs = softmax(ln): its max is ln(max); f64 sum, f32 probabilities.
            let ln_max = ln(max);
            weights_into(c.data.iter().map(|t| ln(t.logit)), ln_max, w);
            let psum: f64 = w.iter().sum();
            let mut h = 0.0f64;
            for (t, &e) in c.data.iter().zip(w.iter()) {
                let p = (e / psum) as f32;
                h += (ln(t.logit).max(f32::MIN) * p) as f64;
            }
            -(h as f32)
        })
    }
}

impl Sampler for Eta {
    fn name(&self) -> &'static str {
        "eta"
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        // The entropy is a view's too: a left-out token adds `f32::MIN * 0 = -0.0` to it.
        super::epsilon::view_or_dense(c);
        if !max_logit(&c.data).is_finite() {
            return Ok(()); // all -inf: NaN probabilities, nothing is removed
        }
        let h = Eta::entropy(c);
        let scaled = self.epsilon.sqrt() * ((-h as f64).exp() as f32);
        let eta = if scaled < self.epsilon { scaled } else { self.epsilon };
        softmax(&mut c.data);
        cut(c, eta, self.min_tokens_to_keep);
        Ok(())
    }
}

impl FromSpec for Eta {
    const PARAMS: &'static [&'static str] = &["epsilon", "min_tokens_to_keep"];
    const ALIASES: &'static [(&'static str, &'static str)] = &[("eta_cutoff", "epsilon")];
    fn from_spec(args: &Bound<'_>, _: &BuildContext<'_>) -> Result<Self> {
        Eta::new(args.f64("epsilon", None)?, args.i64("min_tokens_to_keep", Some(1))?)
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
    fn transformers_eta_test_vectors() {
        // test_logits_process.py::test_eta_dist_warper: epsilon 0.0625, so
        // eta = min(0.0625, 0.25 * exp(-H)) = 0.0625 on both rows.
        let finite = |z: Vec<f32>| z.iter().map(|v| v.is_finite()).collect::<Vec<_>>();
        let out = run("eta(0.0625)", &ln(&[0.0, 0.1, 0.8, 0.1]), &[]);
        assert_eq!(finite(out), [false, true, true, true]);
        let out = run("eta(0.0625)", &ln(&[0.01, 0.04, 0.9, 0.05]), &[]);
        assert_eq!(finite(out), [false, false, true, false]);
        // A flat row has maximal entropy: eta is tiny and nothing goes.
        assert_eq!(finite(run("eta(0.02)", &[0.0f32; 16], &[])), [true; 16]);
        // min_tokens_to_keep keeps the largest logits.
        let ramp: Vec<f32> = (0..10).map(|i| 3.0 * i as f32).collect();
        assert_eq!(run("eta(0.9,min_tokens_to_keep=3)", &ramp, &[]).iter().filter(|v| v.is_finite()).count(), 3);
    }

    #[test]
    fn entropy_ignores_masked_tokens() {
        let a = Candidates::from_logits(&[1.0f32, 2.0, NEG, NEG]).unwrap();
        let b = Candidates::from_logits(&[1.0f32, 2.0]).unwrap();
        assert_eq!(Eta::entropy(&a), Eta::entropy(&b));
        let p = 1.0 / (1.0 + (-1.0f64).exp());
        let h = -(p * p.ln() + (1.0 - p) * (1.0 - p).ln());
        assert!((Eta::entropy(&b) as f64 - h).abs() < 1e-6);
    }

    #[test]
    fn epsilon_must_be_strictly_inside_zero_one() {
        assert!(build_error("eta(0)").contains("eta_cutoff"));
        assert!(build_error("eta(2,1)").contains("parameter `epsilon`"));
    }
}
