//! `xtc(probability, threshold, min_keep)`: "exclude top choices": with chance `probability`,
//! removes every candidate at least as likely as `threshold` except the least likely of them.
//!
//! llama.cpp convention (`llama_sampler_xtc`, commit 0c1e570):
//!
//! * `probability <= 0` or `threshold > 0.5` builds an inert stage (`?xtc`), which draws
//!   nothing.
//! * Checks in this order: inert parameters or fewer than two candidates: return without a
//!   draw. Otherwise draw **one f32 uniform** from the stage's own generator (one MT19937 word
//!   in `mt19937` mode, libstdc++'s `uniform_real_distribution<float>`); if it is
//!   `> probability`, return (so `probability >= 1` always applies).
//! * Full sort (libstdc++ order on ties) and f32 softmax. `last` is the last index of the
//!   leading run with `p >= threshold`. If `last > 0` and `size - last >= min_keep`, the first
//!   `last` candidates are dropped (llama.cpp advances its `data` pointer; here
//!   [`Candidates::drop_front`]). The array stays sorted; `p` is not renormalised.
//! * Every drawing stage of a chain gets the same seed (llama.cpp's `common_sampler_init`
//!   passes one seed to XTC and dist), but XTC draws from its own stream.
//!
//! Where tokensieve differs: NaN or infinite `probability` or `threshold`, a negative
//! `threshold` (which llama.cpp treats like 0: everything is "above" it) and a negative
//! `min_keep` are parameter errors. A negative `probability` is accepted as "off", like 0.

use super::{require_finite, require_min_keep, BuildContext, FromSpec, Sampler};
use crate::candidates::Candidates;
use crate::convention::llama_cpp;
use crate::error::{Error, Result};
use crate::params::spec::Bound;
use crate::rng::{RngConfig, StageRng, Stream};

/// Exclude-top-choices sampling.
///
/// ```
/// use tokensieve::{Candidates, RngConfig, sampler::{xtc::Xtc, Sampler}};
/// // Probabilities .4, .3, .2, .1 with threshold .19 and probability 1: drop .4 and .3.
/// let logits: Vec<f32> = [0.4f32, 0.3, 0.2, 0.1].iter().map(|p| p.ln()).collect();
/// let mut c = Candidates::from_logits(&logits).unwrap();
/// Xtc::new(1.0, 0.19, 1, RngConfig::mt19937(42)).unwrap().apply(&mut c).unwrap();
/// let ids: Vec<u32> = c.as_slice().iter().map(|t| t.id).collect();
/// assert_eq!(ids, [2, 3]);
/// ```
#[derive(Clone, Debug)]
pub struct Xtc {
    probability: f32,
    threshold: f32,
    min_keep: usize,
    rng: StageRng,
}

impl Xtc {
    /// XTC applied with chance `probability` (finite; `<= 0` = off), removing the candidates
    /// with `p >= threshold` (finite, `>= 0`; `> 0.5` = off) but the last of them, keeping at
    /// least `min_keep`; draws from `rng`.
    pub fn new(probability: f32, threshold: f32, min_keep: usize, rng: RngConfig) -> Result<Self> {
        let probability = require_finite("xtc", "probability", probability)?;
        let threshold = require_finite("xtc", "threshold", threshold)?;
        if threshold < 0.0 {
            return Err(Error::parameter(
                "xtc",
                "threshold",
                format!("must be >= 0 (> 0.5 turns xtc off), got {threshold}"),
            ));
        }
        Ok(Xtc { probability, threshold, min_keep, rng: StageRng::new(rng, Stream::Xtc)? })
    }

    /// The draw `apply` makes when it draws (two candidates or more, not inert): the chance
    /// that [`Xtc::fires`] compares with `probability`.
    pub(crate) fn draw(&mut self) -> f32 {
        self.rng.uniform_f32()
    }

    /// Whether the draw `chance` applies the stage.
    pub(crate) fn fires(&self, chance: f32) -> bool {
        chance <= self.probability
    }

    /// `apply` once it has drawn `chance`.
    pub(crate) fn apply_drawn(&self, c: &mut Candidates, chance: f32) {
        if !self.fires(chance) {
            return;
        }
        llama_cpp::softmax(c, true);
        let mut last = 0;
        for (i, t) in c.as_slice().iter().enumerate() {
            if t.p >= self.threshold {
                last = i;
            } else {
                break;
            }
        }
        if c.len() - last >= self.min_keep && last > 0 {
            c.drop_front(last);
        }
    }
}

impl Sampler for Xtc {
    fn name(&self) -> &'static str {
        if self.is_inert() {
            "?xtc"
        } else {
            "xtc"
        }
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        if self.is_inert() || c.len() < 2 {
            return Ok(());
        }
        let chance = self.draw();
        self.apply_drawn(c, chance);
        Ok(())
    }

    fn accept(&mut self, _token: u32) {
        self.rng.accept();
    }

    fn reset(&mut self) {
        self.rng.reset();
    }

    fn is_inert(&self) -> bool {
        self.probability <= 0.0 || self.threshold > 0.5
    }
}

impl FromSpec for Xtc {
    const PARAMS: &'static [&'static str] = &["probability", "threshold", "min_keep"];
    fn from_spec(args: &Bound<'_>, ctx: &BuildContext<'_>) -> Result<Self> {
        let min_keep = require_min_keep("xtc", args.i32("min_keep", Some(1))?)?;
        Xtc::new(args.f32("probability", None)?, args.f32("threshold", None)?, min_keep, ctx.rng)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Mt19937;
    use crate::sampler::test_util::from_probs;

    #[test]
    fn llama_cpp_test_vectors() {
        // tests/test-sampling.cpp: {.4,.3,.2,.1}: t=.09 → {.1}; .19 → {.2,.1}; .29 → {.3,.2,.1};
        // .39 → unchanged.
        for (threshold, expect) in
            [(0.09, vec![3]), (0.19, vec![2, 3]), (0.29, vec![1, 2, 3]), (0.39, vec![0, 1, 2, 3])]
        {
            let mut c = from_probs(&[0.4, 0.3, 0.2, 0.1]);
            Xtc::new(1.0, threshold, 1, RngConfig::mt19937(1)).unwrap().apply(&mut c).unwrap();
            let ids: Vec<u32> = c.as_slice().iter().map(|t| t.id).collect();
            assert_eq!(ids, expect, "threshold {threshold}");
        }
    }

    #[test]
    fn min_keep_blocks_the_removal() {
        let mut c = from_probs(&[0.4, 0.3, 0.2, 0.1]);
        Xtc::new(1.0, 0.09, 2, RngConfig::mt19937(1)).unwrap().apply(&mut c).unwrap();
        assert_eq!(c.len(), 4);
        assert_eq!(c.dropped_front(), 0);
    }

    #[test]
    fn draws_one_word_per_application_and_none_when_skipped() {
        let seed = 1234;
        let mut xtc = Xtc::new(0.5, 0.1, 1, RngConfig::mt19937(seed)).unwrap();
        let mut mt = Mt19937::new(seed);
        for _ in 0..20 {
            let mut c = from_probs(&[0.4, 0.3, 0.2, 0.1]);
            xtc.apply(&mut c).unwrap();
            let applied = mt.canonical_f32() <= 0.5;
            assert_eq!(c.len() < 4, applied);
            // A single candidate consumes nothing.
            let mut one = from_probs(&[1.0]);
            xtc.apply(&mut one).unwrap();
        }
        xtc.reset();
        let mut fresh = Mt19937::new(seed);
        let mut c = from_probs(&[0.4, 0.3, 0.2, 0.1]);
        xtc.apply(&mut c).unwrap();
        assert_eq!(c.len() < 4, fresh.canonical_f32() <= 0.5);
    }

    #[test]
    fn inert_and_invalid_parameters() {
        let rng = RngConfig::mt19937(0);
        assert!(Xtc::new(0.0, 0.1, 1, rng).unwrap().is_inert());
        assert!(Xtc::new(-1.0, 0.1, 1, rng).unwrap().is_inert());
        assert!(Xtc::new(1.0, 0.6, 1, rng).unwrap().is_inert());
        assert_eq!(Xtc::new(1.0, 0.6, 1, rng).unwrap().name(), "?xtc");
        assert!(Xtc::new(1.0, -0.1, 1, rng).is_err());
        assert!(Xtc::new(f32::INFINITY, 0.1, 1, rng).is_err());
        let mut c = from_probs(&[0.4, 0.3, 0.2, 0.1]);
        Xtc::new(1.0, 0.6, 1, rng).unwrap().apply(&mut c).unwrap();
        assert!(!c.is_sorted());
    }
}
