//! `typical(mass, min_tokens_to_keep)` under the transformers convention:
//! `TypicalLogitsWarper` (locally typical sampling).
//!
//! 1. `ls = log_softmax(z)`, `pe = exp(ls)`, entropy `ent = -nansum(ls * pe)` (the `-inf * 0 =
//!    NaN` terms of masked tokens are dropped).
//! 2. `shifted = |-ls - ent|`, sorted **ascending** with torch's unstable sort (tie order of
//!    libstdc++ `std::sort`); the logits are gathered in that order, softmaxed and
//!    `cumsum`med (f64 running sum, f32 partials).
//! 3. `last = count(cum < fl32(mass))` (strict), clamped to `V - 1`; every sorted position whose
//!    `shifted` is `>` `shifted[last]` (strict: everything tied with the boundary stays) is
//!    removed, except the first `min_tokens_to_keep` (the most typical).
//!
//! It can remove the most likely token. Rows of equal logits are left whole; a row whose
//! logits are all `-inf` is unchanged.
//!
//! Differs from llama.cpp's `typical` (which keeps the shortest prefix with cum `> p` over
//! its own sort and truncates).
//!
//! Validation as transformers: `mass` strictly inside `(0, 1)`, `min_tokens_to_keep` an
//! integer `>= 1`. `generate()` adds it when `typical_p < 1`. Draws: none.
//!
//! Spec: `typical(mass, min_tokens_to_keep)` (default 1); `typical_p=` is accepted for `mass`.

use crate::candidates::{Candidates, TokenData};
use crate::convention::transformers::{ensure_dense, fl32, max_logit, remove, sort_ascending, Cumsum};
use crate::error::{Error, Result};
use crate::params::spec::Bound;
use crate::sampler::transformers::require_min_tokens_to_keep;
use crate::sampler::{BuildContext, FromSpec, Sampler};

/// Locally typical sampling, transformers convention.
///
/// ```
/// use tokensieve::{Candidates, sampler::{transformers::typical::Typical, Sampler}};
/// let mut c = Candidates::from_logits(&[3.0, 1.0, 0.5, 0.0, -4.0]).unwrap();
/// Typical::new(0.5, 1).unwrap().apply(&mut c).unwrap();
/// assert!(c.count_finite() < 5);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Typical {
    mass: f32,
    min_tokens_to_keep: usize,
}

impl Typical {
    /// Typical sampling with `mass` strictly inside `(0, 1)`, never removing the
    /// `min_tokens_to_keep >= 1` most typical tokens.
    pub fn new(mass: f64, min_tokens_to_keep: i64) -> Result<Self> {
        if !(mass > 0.0 && mass < 1.0) {
            return Err(Error::parameter("typical", "mass", format!("has to be a float > 0 and < 1, but is {mass}")));
        }
        let min_tokens_to_keep = require_min_tokens_to_keep("typical", min_tokens_to_keep)?;
        Ok(Typical { mass: fl32(mass), min_tokens_to_keep })
    }
}

impl Sampler for Typical {
    fn name(&self) -> &'static str {
        "typical"
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        if !(c.sparse && self.remove_atypical(c)) {
            ensure_dense(c);
            let done = self.remove_atypical(c);
            debug_assert!(done, "a dense row always decides");
        }
        Ok(())
    }
}

impl Typical {
    /// The removal, on the dense row or on a sparse view; `false` (a view untouched) where
    /// only the dense row can decide.
    ///
    /// A view leaves out `-inf` tokens only. Their weights are exactly 0 and their entropy
    /// terms NaN (dropped), so the sums are the dense row's; their scores are `+inf`, sorted
    /// after every finite one, with no mass. So the cut is the dense row's: within the view's
    /// finite scores, or (where their mass stays below `mass`) at a `+inf` score, which
    /// removes nothing, as the view's own last score does. What the view cannot give is
    /// torch's order among equal finite scores, which comes from sorting the dense row: a
    /// view with any declines.
    fn remove_atypical(&self, c: &mut Candidates) -> bool {
        let max = max_logit(&c.data);
        if !max.is_finite() {
            return true; // all -inf: NaN everywhere, torch removes nothing
        }
        // log_softmax: (z - max) - ln(sum exp(z - max)), in f32 as torch writes it.
        let sum: f64 = c.data.iter().map(|t| ((t.logit - max) as f64).exp()).sum();
        let lse = sum.ln() as f32;
        let log_softmax = |z: f32| (z - max) - lse;
        let mut ent_sum = 0.0f64;
        for t in &c.data {
            let ls = log_softmax(t.logit);
            let term = ls * ((ls as f64).exp() as f32);
            if !term.is_nan() {
                ent_sum += term as f64;
            }
        }
        let ent = -(ent_sum as f32);

        let mut buf = std::mem::take(&mut c.scratch);
        buf.clear();
        buf.extend(c.data.iter().enumerate().map(|(i, t)| TokenData {
            id: i as u32,
            logit: ((-log_softmax(t.logit)) - ent).abs(),
            p: 0.0,
        }));
        sort_ascending(&mut buf);
        if c.sparse && buf.windows(2).any(|w| w[0].logit == w[1].logit && w[0].logit.is_finite()) {
            c.scratch = buf;
            return false;
        }
        // softmax of the logits gathered in sorted order (same max), then the cumsum.
        let mut sorted_sum = 0.0f64;
        for t in &buf {
            sorted_sum += ((c.data[t.id as usize].logit - max) as f64).exp();
        }
        let mut cum = Cumsum::default();
        let mut below = 0usize;
        for t in &buf {
            let p = (((c.data[t.id as usize].logit - max) as f64).exp() / sorted_sum) as f32;
            if cum.push(p) < self.mass {
                below += 1;
            }
        }
        let last = below.min(buf.len() - 1);
        let boundary = buf[last].logit;
        for t in buf.iter().skip(self.min_tokens_to_keep) {
            if t.logit > boundary {
                remove(&mut c.data, t.id as usize);
            }
        }
        c.scratch = buf;
        true
    }
}

impl FromSpec for Typical {
    const PARAMS: &'static [&'static str] = &["mass", "min_tokens_to_keep"];
    const ALIASES: &'static [(&'static str, &'static str)] = &[("typical_p", "mass"), ("p", "mass")];
    fn from_spec(args: &Bound<'_>, _: &BuildContext<'_>) -> Result<Self> {
        Typical::new(args.f64("mass", None)?, args.i64("min_tokens_to_keep", Some(1))?)
    }
}

#[cfg(test)]
mod tests {
    use crate::sampler::transformers::test_util::*;

    fn ln(probs: &[f32]) -> Vec<f32> {
        probs.iter().map(|p| p.ln()).collect()
    }

    #[test]
    fn transformers_typical_test_vectors() {
        // test_logits_process.py::test_typical_dist_warper: probs [0.97, 0.01, 0.01, 0.01] with
        // mass 0.5 keep only the first; [0.4, 0.2, 0.2, 0.2] lose the most likely token.
        let finite = |z: Vec<f32>| z.iter().map(|v| v.is_finite()).collect::<Vec<_>>();
        assert_eq!(finite(run("typical(0.5)", &ln(&[0.97, 0.01, 0.01, 0.01]), &[])), [true, false, false, false]);
        assert_eq!(finite(run("typical(0.5)", &ln(&[0.4, 0.2, 0.2, 0.2]), &[])), [false, true, true, true]);
        // min_tokens_to_keep keeps the most typical ones.
        let ramp: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let out = run("typical(1e-9,min_tokens_to_keep=2)", &ramp, &[]);
        assert_eq!(out.iter().filter(|v| v.is_finite()).count(), 2);
    }

    #[test]
    fn equal_and_masked_rows_are_left_whole() {
        assert_eq!(run("typical(0.2)", &[0.7f32; 12], &[]), [0.7f32; 12]);
        assert_eq!(run("typical(0.2)", &[NEG; 3], &[]), [NEG; 3]);
        // Masked tokens have shifted = +inf: they sort last and stay masked.
        let out = run("typical(0.9)", &[1.0, NEG, 0.5, 0.0], &[]);
        assert_eq!(out[1], NEG);
    }

    #[test]
    fn mass_must_be_strictly_inside_zero_one() {
        for spec in ["typical(0)", "typical(1)", "typical(1.5)"] {
            assert!(build_error(spec).contains("> 0 and < 1"), "{spec}");
        }
        assert!(build_error("typical(0.5,0)").contains("min_tokens_to_keep"));
    }
}
