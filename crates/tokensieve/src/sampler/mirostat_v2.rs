//! `mirostat_v2(tau, eta)`: Mirostat v2, a selecting stage that truncates by surprise.
//!
//! llama.cpp convention (`llama_sampler_init_mirostat_v2`, commit 0c1e570), bit for bit:
//!
//! * Defaults: `tau = 5`, `eta = 0.1`. State: `mu = 2 * tau`.
//! * Apply: full sort + f32 softmax ([`llama_cpp::softmax`]); keep the candidates before the
//!   first one whose surprise `-log2(p)` (f32 `log2f`) exceeds `mu`, at least one; softmax
//!   again; draw with [`llama_cpp::discrete_distribution`]; then
//!   `mu ← mu - eta · (-log2(p_selected) - tau)`. `mu` is updated **in apply**, as in
//!   llama.cpp; accept only advances the RNG step.
//! * A NaN probability (stale sorted flag from an earlier stage) never exceeds `mu`, so it is
//!   kept, as in llama.cpp; the sorted flag is trusted, never re-checked.
//! * `p` holds the softmax over the kept candidates; the selected index is set.
//!
//! Draws: one f64 (two MT19937 words) per application from the stage's own stream, **none**
//! when a single candidate is left (unlike `dist`).
//!
//! Where llama.cpp samples from NaN probabilities because every candidate is `-inf`,
//! tokensieve returns an error ([`Error::is_no_candidates`](crate::Error::is_no_candidates)).
//!
//! [`llama_cpp::softmax`]: crate::convention::llama_cpp::softmax
//! [`llama_cpp::discrete_distribution`]: crate::convention::llama_cpp::discrete_distribution

use super::mirostat::MuFeedback;
use super::{require_finite, require_finite_candidate, BuildContext, FromSpec, Sampler};
use crate::candidates::Candidates;
use crate::error::Result;
use crate::params::spec::Bound;
use crate::rng::{RngConfig, StageRng, Stream};

/// Mirostat v2.
///
/// ```
/// use tokensieve::{Candidates, RngConfig, sampler::{mirostat_v2::MirostatV2, Sampler}};
/// let mut m = MirostatV2::new(RngConfig::mt19937(42), 5.0, 0.1).unwrap();
/// let mut c = Candidates::from_logits(&[1.0, 2.0, 3.0, 0.5]).unwrap();
/// m.apply(&mut c).unwrap();
/// assert!(c.selected_token().is_some());
/// ```
#[derive(Clone, Debug)]
pub struct MirostatV2 {
    tau: f32,
    eta: f32,
    mu: f32,
    rng: StageRng,
    cum: Vec<f64>,
}

impl MirostatV2 {
    /// Mirostat v2 with target surprise `tau` and learning rate `eta` (both finite).
    pub fn new(rng: RngConfig, tau: f32, eta: f32) -> Result<Self> {
        let tau = require_finite("mirostat_v2", "tau", tau)?;
        let eta = require_finite("mirostat_v2", "eta", eta)?;
        Ok(MirostatV2 { tau, eta, mu: 2.0 * tau, rng: StageRng::new(rng, Stream::MirostatV2)?, cum: Vec::new() })
    }

    /// The current surprise cut `mu` (starts at `2 * tau`).
    pub fn mu(&self) -> f32 {
        self.mu
    }
}

/// `-log2f(p) > mu`, with `log2f` called only where `p`'s binade decides nothing.
///
/// For `p` in `[2^e, 2^(e+1))`, `log2f(p)` lies in `[e, e + 1]`: both ends are exact f32
/// integers, and a `log2f` within an ulp of the true value (glibc's is within 0.8) cannot
/// round past one. So `-log2f(p)` lies in `[-(e + 1), -e]`, and only a binade whose range
/// holds `mu` needs the call. Over a whole row this is one call or none instead of one per
/// token (the cut scans every kept token: all of them once `mu` has grown).
#[inline]
pub(crate) fn surprise_exceeds(p: f32, mu: f32) -> bool {
    if p >= f32::MIN_POSITIVE && p.is_finite() && mu.is_finite() {
        let e = ((p.to_bits() >> 23) & 0xff) as i32 - 127;
        if -(e as f32) <= mu {
            return false;
        }
        if -((e + 1) as f32) > mu {
            return true;
        }
    }
    -p.log2() > mu
}

impl MirostatV2 {
    /// On sorted candidates with their softmax: the position of the first whose surprise
    /// `-log2(p)` exceeds `mu` (`None`: none does).
    pub(crate) fn cut(&self, c: &Candidates) -> Option<usize> {
        c.as_slice().iter().position(|t| surprise_exceeds(t.p, self.mu))
    }
}

impl MuFeedback for MirostatV2 {
    fn keep(&self, c: &Candidates) -> usize {
        self.cut(c).unwrap_or(c.len()).max(1)
    }

    fn feedback(&mut self) -> (&mut StageRng, &mut Vec<f64>, &mut f32, (f32, f32)) {
        (&mut self.rng, &mut self.cum, &mut self.mu, (self.eta, self.tau))
    }
}

impl Sampler for MirostatV2 {
    fn name(&self) -> &'static str {
        "mirostat-v2"
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        require_finite_candidate("mirostat_v2", c)?;
        self.apply_drawn(c, None);
        Ok(())
    }

    fn accept(&mut self, _token: u32) {
        self.rng.accept();
    }

    fn reset(&mut self) {
        self.mu = 2.0 * self.tau;
        self.rng.reset();
    }

    fn selects(&self) -> bool {
        true
    }
}

impl FromSpec for MirostatV2 {
    const PARAMS: &'static [&'static str] = &["tau", "eta"];
    fn from_spec(args: &Bound<'_>, ctx: &BuildContext<'_>) -> Result<Self> {
        MirostatV2::new(ctx.rng, args.f32("tau", Some(5.0))?, args.f32("eta", Some(0.1))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`surprise_exceeds`] is `-log2f(p) > mu` on probabilities across every binade (powers
    /// of two and their neighbours, subnormals, 0, 1, NaN) against cuts at, between and near
    /// integers and powers of two.
    #[test]
    fn surprise_exceeds_is_the_plain_comparison() {
        let mut ps = vec![0.0f32, f32::MIN_POSITIVE, 1e-40, 1.0, 0.5, f32::NAN, f32::INFINITY];
        for e in -130..=1 {
            let x = 2f32.powi(e);
            ps.extend([x, x.next_up(), x.next_down(), x * 1.5, x * 1.999_999, x * 1.000_001]);
        }
        let mut state = 0x9e37_79b9u32;
        for _ in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            ps.push(f32::from_bits(state % 0x3f80_0001)); // (0, 1]
        }
        let mut mus = vec![f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, -3.0, 1e-30];
        for k in 0..=130 {
            let m = k as f32;
            mus.extend([m, m.next_up(), m.next_down(), m + 0.5, m + 0.25, m + 1e-3]);
        }
        for &mu in &mus {
            for &p in &ps {
                assert_eq!(surprise_exceeds(p, mu), -p.log2() > mu, "p {p:e} ({:#x}) mu {mu}", p.to_bits());
            }
        }
    }

    #[test]
    fn truncates_by_surprise_keeping_at_least_one() {
        // p ≈ {0.844, 0.114, 0.042}: surprises ≈ {0.24, 3.1, 4.6}.
        let row = [3.0f32, 1.0, 0.0];
        let mut m = MirostatV2::new(RngConfig::mt19937(3), 1.0, 0.1).unwrap(); // mu = 2
        let mut c = Candidates::from_logits(&row).unwrap();
        m.apply(&mut c).unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(c.selected_token(), Some(0));
        let mut m = MirostatV2::new(RngConfig::mt19937(3), -5.0, 0.1).unwrap(); // mu = -10
        let mut c = Candidates::from_logits(&row).unwrap();
        m.apply(&mut c).unwrap();
        assert_eq!(c.len(), 1);
        let mut m = MirostatV2::new(RngConfig::mt19937(3), 2.0, 0.1).unwrap(); // mu = 4
        let mut c = Candidates::from_logits(&row).unwrap();
        m.apply(&mut c).unwrap();
        assert_eq!(c.len(), 2);
        let s: f32 = c.as_slice().iter().map(|t| t.p).sum();
        assert!((s - 1.0).abs() < 1e-6);
    }

    #[test]
    fn a_single_candidate_draws_nothing_and_mu_moves() {
        let mut a = MirostatV2::new(RngConfig::mt19937(5), 5.0, 0.1).unwrap();
        let b = MirostatV2::new(RngConfig::mt19937(5), 5.0, 0.1).unwrap();
        let mut c = Candidates::from_logits(&[0.0]).unwrap();
        a.apply(&mut c).unwrap();
        let (mut ra, mut rb) = (a.rng.clone(), b.rng.clone());
        assert_eq!(ra.uniform_f64(), rb.uniform_f64());
        assert_eq!(a.mu(), 10.5);
        a.reset();
        assert_eq!(a.mu(), 10.0);
    }

    #[test]
    fn all_masked_is_an_error() {
        let mut m = MirostatV2::new(RngConfig::philox(1), 5.0, 0.1).unwrap();
        let mut c = Candidates::from_logits(&[f32::NEG_INFINITY; 2]).unwrap();
        assert!(m.apply(&mut c).unwrap_err().is_no_candidates());
    }
}
