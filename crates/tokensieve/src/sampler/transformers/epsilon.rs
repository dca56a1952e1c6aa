//! `epsilon(epsilon, min_tokens_to_keep)` under the transformers convention:
//! `EpsilonLogitsWarper` (truncation sampling).
//!
//! A token is removed iff its probability (softmax of the row) is `< fl32(epsilon)` **and** its
//! logit is `<` the `min(min_tokens_to_keep, V)`-th largest logit. The keep rule compares
//! values, so every token tied with that logit stays and torch's tie order never matters. A
//! row whose logits are all `-inf` is unchanged.
//!
//! No llama.cpp counterpart. Validation as transformers: `epsilon` strictly inside `(0, 1)`,
//! `min_tokens_to_keep` an integer `>= 1`. `generate()` adds it when `0 < epsilon_cutoff < 1`.
//! Draws: none. The `p` fields hold the softmax afterwards.
//!
//! Spec: `epsilon(epsilon, min_tokens_to_keep)` (default 1); `epsilon_cutoff=` is accepted.

use crate::candidates::Candidates;
use crate::convention::transformers::{ensure_dense, fl32, kth_largest_logit, remove, softmax};
use crate::error::{Error, Result};
use crate::params::spec::Bound;
use crate::sampler::{BuildContext, FromSpec, Sampler};

/// Epsilon sampling, transformers convention.
///
/// ```
/// use tokensieve::{Candidates, sampler::{transformers::epsilon::Epsilon, Sampler}};
/// let logits: Vec<f32> = [0.9f32, 0.09, 0.009, 0.001].iter().map(|p| p.ln()).collect();
/// let mut c = Candidates::from_logits(&logits).unwrap();
/// Epsilon::new(0.005, 1).unwrap().apply(&mut c).unwrap();
/// assert_eq!(c.count_finite(), 3);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Epsilon {
    epsilon: f32,
    min_tokens_to_keep: usize,
}

/// `epsilon` strictly inside (0, 1) and `min_tokens_to_keep >= 1`, as epsilon and eta check them.
pub(crate) fn check(stage: &str, field: &str, epsilon: f64, min_tokens_to_keep: i64) -> Result<usize> {
    if !(epsilon > 0.0 && epsilon < 1.0) {
        return Err(Error::parameter(
            stage,
            "epsilon",
            format!("(`{field}`) has to be a float > 0 and < 1, but is {epsilon}"),
        ));
    }
    super::require_min_tokens_to_keep(stage, min_tokens_to_keep)
}

/// Makes the row dense unless it is a sparse view, on which [`cut`] decides as on the dense
/// row. A view leaves out `-inf` tokens only, whose weight is exactly 0: the softmax (the same
/// nonzero weights summed in the same order) gives every token in the view the dense row's
/// probability, and a left-out token (`p = 0`, logit `-inf`) goes in the dense row anyway.
/// The `keep`-th largest logit is the view's where the view holds `keep` tokens; where it
/// holds fewer, the dense row's is `-inf` and the view's its least, and below either no
/// token of the view lies: nothing goes in both.
pub(crate) fn view_or_dense(c: &mut Candidates) {
    if !c.sparse {
        ensure_dense(c);
    }
}

/// Removes every token whose `p < cutoff` and whose logit is below the `keep`-th largest.
pub(crate) fn cut(c: &mut Candidates, cutoff: f32, keep: usize) {
    let floor = kth_largest_logit(c, keep);
    for i in 0..c.data.len() {
        if c.data[i].p < cutoff && c.data[i].logit < floor {
            remove(&mut c.data, i);
        }
    }
}

impl Epsilon {
    /// Epsilon sampling with cutoff `epsilon` in `(0, 1)`, never removing the
    /// `min_tokens_to_keep >= 1` largest logits.
    pub fn new(epsilon: f64, min_tokens_to_keep: i64) -> Result<Self> {
        let min_tokens_to_keep = check("epsilon", "epsilon_cutoff", epsilon, min_tokens_to_keep)?;
        Ok(Epsilon { epsilon: fl32(epsilon), min_tokens_to_keep })
    }
}

impl Epsilon {
    /// `(fl32(epsilon), min_tokens_to_keep)`, for the row path.
    pub(crate) fn params(&self) -> (f32, usize) {
        (self.epsilon, self.min_tokens_to_keep)
    }
}

impl Sampler for Epsilon {
    fn name(&self) -> &'static str {
        "epsilon"
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        view_or_dense(c);
        softmax(&mut c.data);
        cut(c, self.epsilon, self.min_tokens_to_keep);
        Ok(())
    }
}

impl FromSpec for Epsilon {
    const PARAMS: &'static [&'static str] = &["epsilon", "min_tokens_to_keep"];
    const ALIASES: &'static [(&'static str, &'static str)] = &[("epsilon_cutoff", "epsilon")];
    fn from_spec(args: &Bound<'_>, _: &BuildContext<'_>) -> Result<Self> {
        Epsilon::new(args.f64("epsilon", None)?, args.i64("min_tokens_to_keep", Some(1))?)
    }
}

#[cfg(test)]
mod tests {
    use crate::sampler::transformers::test_util::*;

    fn ln(probs: &[f32]) -> Vec<f32> {
        probs.iter().map(|p| p.ln()).collect()
    }

    #[test]
    fn transformers_epsilon_test_vectors() {
        // test_logits_process.py::test_epsilon_dist_warper: epsilon 0.1 on
        // [0.87, 0.099, 0.001, 0.03] keeps only the first; [0.4, 0.299, 0.101, 0.2] keeps all.
        let finite = |z: Vec<f32>| z.iter().map(|v| v.is_finite()).collect::<Vec<_>>();
        assert_eq!(finite(run("epsilon(0.1)", &ln(&[0.87, 0.099, 0.001, 0.03]), &[])), [true, false, false, false]);
        assert_eq!(finite(run("epsilon(0.1)", &ln(&[0.4, 0.299, 0.101, 0.2]), &[])), [true; 4]);
        // min_tokens_to_keep keeps the largest logits whatever their probability.
        let ramp: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let out = run("epsilon(0.99,min_tokens_to_keep=2)", &ramp, &[]);
        assert_eq!(out.iter().filter(|v| v.is_finite()).count(), 2);
    }

    #[test]
    fn ties_at_the_keep_floor_are_all_kept() {
        let out = run("epsilon(0.9,2)", &[1.0, 1.0, 1.0, 0.0], &[]);
        assert_eq!(out, [1.0, 1.0, 1.0, NEG]);
    }

    #[test]
    fn epsilon_must_be_strictly_inside_zero_one() {
        assert!(build_error("epsilon(0)").contains("> 0 and < 1"));
        assert!(build_error("epsilon(1)").contains("parameter `epsilon`"));
        assert!(build_error("epsilon(0.1,0)").contains("min_tokens_to_keep"));
    }
}
