//! `gumbel(temperature)`: Gumbel-max selection, a selecting stage (not part of llama.cpp).
//!
//! Selects the candidate maximising `logit / temperature + g`, where
//! `g = -ln(-ln(u))` and `u` is a uniform in (0, 1) drawn **per token id** from a
//! counter-based generator keyed by (seed, sequence, step, token id)
//! ([`StageRng::token_uniform_open`]). This draws exactly from `softmax(logits / temperature)`
//! over the candidates, like `dist`, but a token's noise does not depend on which other
//! candidates are present or in which order they sit: adding a filter in front of it, or
//! reordering the array, never changes the winner among the survivors, and the result is the
//! same on any thread or batch composition.
//!
//! * Default `temperature = 1`. `temperature <= 0` is plain greedy: the **first** maximum in
//!   array order, no noise (as llama.cpp's temperature 0 does).
//! * The score is computed in f64. Ties (equal scores, astronomically unlikely with noise)
//!   go to the lowest array position. `-inf` candidates never win; if every candidate is
//!   `-inf`, an error ([`Error::is_no_candidates`](crate::Error::is_no_candidates)).
//! * It does not sort, does not change logits and does **not** write `p` (stale, whatever the
//!   previous stage left).
//! * Draws: no sequential draws. The noise of a step is a pure function of (seed, sequence,
//!   step, token id); accept advances the step, reset restarts it. In `mt19937` mode the
//!   noise is still counter-based (keyed by the 32-bit seed): there is no llama.cpp stream to
//!   reproduce.

use super::{require_finite, require_finite_candidate, BuildContext, FromSpec, Sampler};
use crate::candidates::Candidates;
use crate::error::Result;
use crate::params::spec::Bound;
use crate::rng::{RngConfig, StageRng, Stream};

/// Gumbel-max selection.
///
/// ```
/// use tokensieve::{Candidates, RngConfig, sampler::{gumbel::Gumbel, Sampler}};
/// let mut g = Gumbel::new(RngConfig::philox(7), 1.0).unwrap();
/// let mut c = Candidates::from_logits(&[0.0, f32::NEG_INFINITY, 1.0]).unwrap();
/// g.apply(&mut c).unwrap();
/// assert!(matches!(c.selected_token(), Some(0) | Some(2)));
/// ```
#[derive(Clone, Debug)]
pub struct Gumbel {
    temperature: f32,
    rng: StageRng,
}

impl Gumbel {
    /// Gumbel-max at `temperature` (finite; `<= 0` = greedy).
    pub fn new(rng: RngConfig, temperature: f32) -> Result<Self> {
        Ok(Gumbel {
            temperature: require_finite("gumbel", "temperature", temperature)?,
            rng: StageRng::new(rng, Stream::Gumbel)?,
        })
    }

    /// The Gumbel noise of `token` at the current step.
    fn noise(&self, token: u32) -> f64 {
        let u = self.rng.token_uniform_open(token);
        -(-u.ln()).ln()
    }
}

impl Sampler for Gumbel {
    fn name(&self) -> &'static str {
        "gumbel"
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        require_finite_candidate("gumbel", c)?;
        let data = c.as_slice();
        let mut best = 0;
        if self.temperature <= 0.0 {
            for i in 1..data.len() {
                if data[i].logit > data[best].logit {
                    best = i;
                }
            }
        } else {
            let t = self.temperature as f64;
            let mut best_score = f64::NEG_INFINITY;
            let mut found = false;
            for (i, cand) in data.iter().enumerate() {
                if cand.logit == f32::NEG_INFINITY {
                    continue;
                }
                let score = cand.logit as f64 / t + self.noise(cand.id);
                if !found || score > best_score {
                    best = i;
                    best_score = score;
                    found = true;
                }
            }
        }
        c.set_selected(Some(best));
        Ok(())
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

impl FromSpec for Gumbel {
    const PARAMS: &'static [&'static str] = &["temperature"];
    fn from_spec(args: &Bound<'_>, ctx: &BuildContext<'_>) -> Result<Self> {
        Gumbel::new(ctx.rng, args.f32("temperature", Some(1.0))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn softmax(logits: &[f32], t: f64) -> Vec<f64> {
        let m = logits.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64 / t));
        let e: Vec<f64> = logits.iter().map(|&l| (l as f64 / t - m).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|x| x / s).collect()
    }

    #[test]
    fn empirical_distribution_matches_softmax() {
        let logits = [1.0f32, 2.0, 0.5, -1.0, 1.5];
        for (t, cfg) in [(1.0f32, RngConfig::philox(11)), (0.7, RngConfig::mt19937(3))] {
            let mut g = Gumbel::new(cfg, t).unwrap();
            let n = 40_000;
            let mut counts = [0usize; 5];
            let mut c = Candidates::new();
            for _ in 0..n {
                c.fill((&logits).into()).unwrap();
                g.apply(&mut c).unwrap();
                let tok = c.selected_token().unwrap();
                counts[tok as usize] += 1;
                g.accept(tok);
            }
            let expect = softmax(&logits, t as f64);
            for (k, e) in counts.iter().zip(&expect) {
                let f = *k as f64 / n as f64;
                assert!((f - e).abs() < 0.01, "t={t}: {counts:?} vs {expect:?}");
            }
        }
    }

    #[test]
    fn winner_does_not_depend_on_order_or_on_removed_losers() {
        let logits: Vec<f32> = (0..64).map(|i| ((i * 13) % 17) as f32 * 0.3).collect();
        let g = Gumbel::new(RngConfig::philox(5), 1.0).unwrap();
        for _ in 0..20 {
            let mut a = Candidates::from_logits(&logits).unwrap();
            g.clone().apply(&mut a).unwrap();
            let winner = a.selected_token().unwrap();
            let mut b = Candidates::from_logits(&logits).unwrap();
            b.as_mut_slice().reverse();
            g.clone().apply(&mut b).unwrap();
            assert_eq!(b.selected_token(), Some(winner));
            let mut sub = Candidates::from_logits(&logits).unwrap();
            let keep: Vec<_> = sub.as_slice().iter().copied().filter(|t| t.id == winner || t.id % 3 == 0).collect();
            sub.truncate(0);
            sub.data.extend(keep);
            g.clone().apply(&mut sub).unwrap();
            assert_eq!(sub.selected_token(), Some(winner));
        }
    }

    #[test]
    fn zero_temperature_is_greedy_and_masked_rows_are_errors() {
        let mut g = Gumbel::new(RngConfig::philox(1), 0.0).unwrap();
        let mut c = Candidates::from_logits(&[1.0, 3.0, 3.0, f32::NEG_INFINITY]).unwrap();
        g.apply(&mut c).unwrap();
        assert_eq!(c.selected_index(), Some(1));
        let mut c = Candidates::from_logits(&[f32::NEG_INFINITY; 3]).unwrap();
        assert!(g.apply(&mut c).unwrap_err().is_no_candidates());
        let mut g = Gumbel::new(RngConfig::philox(1), 1.0).unwrap();
        let mut c = Candidates::from_logits(&[f32::NEG_INFINITY, f32::NEG_INFINITY, -3.0]).unwrap();
        g.apply(&mut c).unwrap();
        assert_eq!(c.selected_index(), Some(2));
        assert!(Gumbel::new(RngConfig::philox(1), f32::INFINITY).is_err());
    }

    #[test]
    fn steps_change_the_noise_and_reset_restarts_it() {
        let logits = [0.0f32; 16];
        let mut g = Gumbel::new(RngConfig::philox(9), 1.0).unwrap();
        let mut picks = Vec::new();
        for _ in 0..8 {
            let mut c = Candidates::from_logits(&logits).unwrap();
            g.apply(&mut c).unwrap();
            picks.push(c.selected_token().unwrap());
            g.accept(picks[picks.len() - 1]);
        }
        assert!(picks.iter().any(|&p| p != picks[0]));
        g.reset();
        let mut c = Candidates::from_logits(&logits).unwrap();
        g.apply(&mut c).unwrap();
        assert_eq!(c.selected_token(), Some(picks[0]));
    }
}
