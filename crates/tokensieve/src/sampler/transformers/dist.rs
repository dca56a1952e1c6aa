//! `dist` under the transformers convention: `generate()`'s sampling step,
//! `torch.multinomial(softmax(processed scores), 1)`.
//!
//! The probabilities are the softmax of the processed row ([`crate::convention::transformers`]:
//! f64 sum, f32 probabilities, written to the `p` fields). Masked tokens (`p = 0`) can never be
//! drawn.
//!
//! **The draw is not torch's.** torch draws an exponential variate for every vocabulary entry
//! from its own generator (a Philox or MT19937 stream inside ATen) and returns
//! `argmax(p / q)`; reproducing that stream outside torch is not reasonable, so sampling under
//! this convention can only be compared with transformers statistically. tokensieve makes one
//! uniform f64 draw `u` from the chain's [`RngConfig`] (Philox by default,
//! or MT19937) and returns the first token in vocabulary order whose f64 running sum of
//! `exp(z - max)` exceeds `u * sum` among tokens with non-zero mass: the same distribution,
//! deterministic for a seed, one draw per step.
//!
//! A row that is all `-inf` is an error ([`Error::is_no_candidates`](crate::Error::is_no_candidates));
//! torch raises too.

use crate::candidates::Candidates;
use crate::convention::transformers::{ensure_dense, softmax_exps};
use crate::error::Result;
use crate::params::spec::Bound;
use crate::rng::{RngConfig, StageRng, Stream};
use crate::sampler::{require_finite_candidate, BuildContext, FromSpec, Sampler};

/// Softmax and one draw, transformers convention.
///
/// ```
/// use tokensieve::{Candidates, RngConfig, sampler::{transformers::dist::Dist, Sampler}};
/// let mut d = Dist::new(RngConfig::philox(7)).unwrap();
/// let mut c = Candidates::from_logits(&[f32::NEG_INFINITY, 1.0, 2.0]).unwrap();
/// d.apply(&mut c).unwrap();
/// assert!(matches!(c.selected_token(), Some(1) | Some(2)));
/// ```
#[derive(Clone, Debug)]
pub struct Dist {
    rng: StageRng,
}

impl Dist {
    /// A sampling stage drawing from `rng`.
    pub fn new(rng: RngConfig) -> Result<Self> {
        Ok(Dist { rng: StageRng::new(rng, Stream::TransformersDist)? })
    }
}

impl Sampler for Dist {
    fn name(&self) -> &'static str {
        "dist"
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        let u = self.draw();
        Self::apply_drawn(c, u)
    }

    fn accept(&mut self, _token: u32) {
        self.rng.accept();
    }

    fn reset(&mut self) {
        self.rng.reset();
    }

    fn selects(&self) -> bool {
        true
    }
}

impl Dist {
    /// The uniform draw of this step, in `[0, 1)`.
    pub(crate) fn draw(&mut self) -> f64 {
        self.rng.uniform_f64()
    }

    /// `apply` with the draw `u` already made.
    pub(crate) fn apply_drawn(c: &mut Candidates, u: f64) -> Result<()> {
        // A sparse view leaves out only -inf tokens, whose weight is exactly 0: the same
        // nonzero weights are added in the same (vocabulary) order, so the sum and the draw
        // are the dense row's. Not with a `+inf` logit (a temperature can overflow one): no
        // weight is positive then and the dense row's fallback is token 0.
        if !c.sparse || c.data.iter().any(|t| t.logit == f32::INFINITY) {
            ensure_dense(c);
        }
        require_finite_candidate("dist", c)?;
        Self::select(c, u);
        Ok(())
    }

    /// Selects the token for draw `u` from dense candidates (or a sparse view without `+inf`)
    /// holding at least one finite logit: the first whose running f64 sum of weights exceeds
    /// `u` times their sum.
    pub(crate) fn select(c: &mut Candidates, u: f64) {
        // One exp per entry, kept in `c.wide`: the sum below is softmax's own sum (the same
        // weights added in the same order), and the draw walks the same weights.
        let mut weights = std::mem::take(&mut c.wide);
        let (_, sum) = softmax_exps(&mut c.data, &mut weights);
        let target = u * sum;
        let mut running = 0.0f64;
        let mut selected = None;
        let mut last_positive = 0;
        for (i, &w) in weights.iter().enumerate() {
            if w > 0.0 {
                running += w;
                last_positive = i;
                if running > target {
                    selected = Some(i);
                    break;
                }
            }
        }
        c.wide = weights;
        // Rounding can leave the running sum a hair below `u * sum` at the end.
        c.set_selected(Some(selected.unwrap_or(last_positive)));
    }
}

impl FromSpec for Dist {
    const PARAMS: &'static [&'static str] = &[];
    fn from_spec(_: &Bound<'_>, ctx: &BuildContext<'_>) -> Result<Self> {
        Dist::new(ctx.rng)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn draws_follow_the_softmax_and_never_pick_a_masked_token() {
        let row = [0.0f32, f32::NEG_INFINITY, (3.0f32).ln(), -200.0];
        let mut d = Dist::new(RngConfig::philox(11)).unwrap();
        let mut counts = [0usize; 4];
        for _ in 0..4000 {
            let mut c = Candidates::from_logits(&row).unwrap();
            d.apply(&mut c).unwrap();
            counts[c.selected_token().unwrap() as usize] += 1;
            d.accept(0);
        }
        assert_eq!(counts[1], 0);
        assert_eq!(counts[3], 0);
        let share = counts[2] as f64 / 4000.0;
        assert!((share - 0.75).abs() < 0.03, "{counts:?}");
    }

    #[test]
    fn same_seed_same_tokens_and_masked_rows_are_errors() {
        let row: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let draw = |seed| {
            let mut d = Dist::new(RngConfig::mt19937(seed)).unwrap();
            (0..8)
                .map(|_| {
                    let mut c = Candidates::from_logits(&row).unwrap();
                    d.apply(&mut c).unwrap();
                    d.accept(0);
                    c.selected_token().unwrap()
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(3), draw(3));
        let mut d = Dist::new(RngConfig::philox(0)).unwrap();
        let mut c = Candidates::from_logits(&[f32::NEG_INFINITY; 3]).unwrap();
        assert!(d.apply(&mut c).unwrap_err().is_no_candidates());
    }

    /// The draw as first written: softmax, then the weights recomputed for the sum and again
    /// for the running sum.
    fn obvious_draw(c: &mut Candidates, u: f64) -> usize {
        let max = crate::convention::transformers::softmax(&mut c.data);
        let weight = |z: f32| ((z - max) as f64).exp();
        let sum: f64 = c.data.iter().map(|t| weight(t.logit)).sum();
        let target = u * sum;
        let (mut running, mut last_positive) = (0.0f64, 0);
        for (i, t) in c.data.iter().enumerate() {
            let w = weight(t.logit);
            if w > 0.0 {
                running += w;
                last_positive = i;
                if running > target {
                    return i;
                }
            }
        }
        last_positive
    }

    #[test]
    fn one_exp_per_entry_draws_and_writes_the_same_bits() {
        use crate::sampler::transformers::test_util::{adversarial_row, bits, cands};
        tokensieve_testkit::proptest_support::check(
            "hf_dist_one_exp",
            256,
            (adversarial_row(), 0u64..1000),
            |(row, seed)| {
                if row.iter().all(|&v| v == f32::NEG_INFINITY) {
                    return Ok(());
                }
                let cfg = RngConfig::philox(seed);
                let mut fast = cands(&row);
                Dist::new(cfg).unwrap().apply(&mut fast).unwrap();
                let mut obvious = cands(&row);
                let u = StageRng::new(cfg, Stream::TransformersDist).unwrap().uniform_f64();
                let token = obvious_draw(&mut obvious, u);
                prop_assert_eq!(fast.selected_token(), Some(token as u32));
                prop_assert_eq!(bits(&fast), bits(&obvious));
                Ok(())
            },
        );
    }
}
