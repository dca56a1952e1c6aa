//! `mirostat(tau, eta, m)`: Mirostat v1 (Basu et al. 2020), a selecting stage that keeps the
//! observed surprise near `tau` by adapting a top-k cut.
//!
//! llama.cpp convention (`llama_sampler_init_mirostat`, commit 0c1e570), bit for bit:
//!
//! * Defaults: `tau = 5`, `eta = 0.1`, `m = 100` (what common passes). `n_vocab` is the
//!   vocabulary size of the chain's rows ([`BuildContext::n_vocab`]). State: `mu = 2 * tau`.
//! * Apply: full sort + f32 softmax ([`llama_cpp::softmax`]); over
//!   `i < min(m - 1, len - 1)` (with `m - 1` taken as unsigned, so `m <= 0` means "all"):
//!   `t_i = ln((i + 2) / (i + 1))`, `b_i = ln(p_i / p_{i+1})`, `s = Σ t_i b_i / Σ t_i²`,
//!   `ε = s - 1`, `k = ((ε · 2^mu) / (1 - n_vocab^(-ε)))^(1/s)`, everything in f32 with
//!   `logf`/`powf`. Keep the top `max(int(k), 1)` (a truncation: the array is sorted),
//!   softmax again, draw with [`llama_cpp::discrete_distribution`], then
//!   `mu ← mu - eta · (-log2(p_selected) - tau)`. `mu` is updated **in apply** (as in
//!   llama.cpp), not on accept; accept only advances the RNG step.
//! * `int(k)` is undefined behaviour in C++ when `k` is NaN, infinite or outside `i32` (one
//!   candidate left, all-equal logits, two zero probabilities among the top `m`). tokensieve
//!   reproduces what x86-64 does (`cvttss2si` gives `i32::MIN`, clamped to 1 ⇒ top-1) on
//!   every platform, which is what the llama.cpp goldens (`ub` cases) record. On ARM llama.cpp
//!   would saturate instead and keep everything; tokensieve does not follow that.
//! * A sorted flag left stale by an earlier stage is trusted, as in llama.cpp (no re-sort;
//!   the softmax then uses the first candidate as the maximum).
//! * `p` holds the softmax over the kept candidates; the selected index is set.
//!
//! Draws: one f64 (two MT19937 words) per application from the stage's own stream, none when
//! a single candidate is left (libstdc++'s `discrete_distribution`).
//!
//! Where llama.cpp samples from NaN probabilities because every candidate is `-inf`,
//! tokensieve returns an error ([`Error::is_no_candidates`](crate::Error::is_no_candidates)).

use super::{require_finite, require_finite_candidate, BuildContext, FromSpec, Sampler};
use crate::candidates::Candidates;
use crate::convention::llama_cpp;
use crate::error::Result;
use crate::params::spec::Bound;
use crate::rng::{RngConfig, StageRng, Stream};

/// x86-64's float-to-int conversion (`cvttss2si`): truncation, and `i32::MIN` for NaN,
/// infinities and values outside `i32` (what C++'s undefined `int(k)` does there).
pub(crate) fn x86_f32_to_i32(v: f32) -> i32 {
    if v.is_nan() || !(-2147483648.0..2147483648.0).contains(&v) {
        i32::MIN
    } else {
        v as i32
    }
}

/// Mirostat v1.
///
/// ```
/// use tokensieve::{Candidates, RngConfig, sampler::{mirostat::Mirostat, Sampler}};
/// let mut m = Mirostat::new(4, RngConfig::mt19937(42), 5.0, 0.1, 100).unwrap();
/// let mut c = Candidates::from_logits(&[1.0, 2.0, 3.0, 0.5]).unwrap();
/// m.apply(&mut c).unwrap();
/// assert!(c.selected_token().is_some());
/// ```
#[derive(Clone, Debug)]
pub struct Mirostat {
    n_vocab: i32,
    tau: f32,
    eta: f32,
    m: i32,
    mu: f32,
    rng: StageRng,
    cum: Vec<f64>,
}

impl Mirostat {
    /// Mirostat v1 for a vocabulary of `n_vocab` tokens, target surprise `tau`, learning
    /// rate `eta` (both finite) and `m` candidates for the slope estimate.
    pub fn new(n_vocab: usize, rng: RngConfig, tau: f32, eta: f32, m: i32) -> Result<Self> {
        let tau = require_finite("mirostat", "tau", tau)?;
        let eta = require_finite("mirostat", "eta", eta)?;
        Ok(Mirostat {
            n_vocab: i32::try_from(n_vocab).unwrap_or(i32::MAX),
            tau,
            eta,
            m,
            mu: 2.0 * tau,
            rng: StageRng::new(rng, Stream::Mirostat)?,
            cum: Vec::new(),
        })
    }

    /// The current target surprise `mu` (starts at `2 * tau`).
    pub fn mu(&self) -> f32 {
        self.mu
    }

    /// How many leading candidates [`top_k_estimate`](Self::top_k_estimate) reads: `m`, or
    /// every one for `m <= 0` (`usize::MAX`).
    pub(crate) fn estimate_reads(&self) -> usize {
        // `size_t(m - 1)`: m <= 0 wraps to "no limit".
        usize::try_from(self.m as i64 - 1).map_or(usize::MAX, |limit| limit + 1)
    }

    /// llama.cpp's `k` estimate on sorted candidates with fresh probabilities, reading the
    /// first [`estimate_reads`](Self::estimate_reads) of them (all, if fewer).
    pub(crate) fn top_k_estimate(&self, c: &Candidates) -> i32 {
        let data = c.as_slice();
        // `size_t(m - 1)`: m <= 0 wraps to "no limit".
        let limit = usize::try_from(self.m as i64 - 1).unwrap_or(usize::MAX);
        let n = limit.min(data.len() - 1);
        let mut sum_ti_bi = 0.0f32;
        let mut sum_ti_sq = 0.0f32;
        for i in 0..n {
            let t_i = ((i + 2) as f32 / (i + 1) as f32).ln();
            let b_i = (data[i].p / data[i + 1].p).ln();
            sum_ti_bi += t_i * b_i;
            sum_ti_sq += t_i * t_i;
        }
        let s_hat = sum_ti_bi / sum_ti_sq;
        let epsilon_hat = s_hat - 1.0;
        let k =
            ((epsilon_hat * 2.0f32.powf(self.mu)) / (1.0 - (self.n_vocab as f32).powf(-epsilon_hat))).powf(1.0 / s_hat);
        x86_f32_to_i32(k).max(1)
    }
}

/// What both mirostats do after their full sort and softmax: choose how many of the sorted
/// candidates to keep (v1 from its `k` estimate, v2 at the first surprise above `mu`), keep
/// them, renormalise them, draw with `std::discrete_distribution` (no draw for a single
/// candidate), select, and move `mu` toward the target surprise,
/// `mu -= eta * (-log2 p_selected - tau)` in f32. Split so that a fast path can make the draw
/// first and finish on the array with it where it cannot vouch for the token.
pub(crate) trait MuFeedback {
    /// How many of the sorted candidates (with their softmax) to keep: at least one, at most
    /// all.
    fn keep(&self, c: &Candidates) -> usize;

    /// The stage's draw stream, its scratch, `mu`, and `(eta, tau)`.
    fn feedback(&mut self) -> (&mut StageRng, &mut Vec<f64>, &mut f32, (f32, f32));

    /// The draw for keeping `keep` candidates: one uniform, none for fewer than two.
    fn draw(&mut self, keep: usize) -> Option<f64> {
        (keep >= 2).then(|| self.feedback().0.uniform_f64())
    }

    /// Keeps the first `keep` of the sorted candidates (with their softmax), renormalises them
    /// and picks one with the draw `u` ([`draw`](Self::draw)). If `certain(c, picked)`, selects
    /// it, moves `mu` and returns `true`; otherwise leaves `mu` (the candidates are changed).
    fn finish(
        &mut self,
        c: &mut Candidates,
        keep: usize,
        u: Option<f64>,
        certain: &dyn Fn(&Candidates, usize) -> bool,
    ) -> bool {
        let keep = keep.max(1);
        if keep < c.len() {
            c.truncate(keep);
            llama_cpp::softmax(c, true);
        }
        // Otherwise the softmax again would compute the same probabilities from the same logits.
        let (_, cum, _, _) = self.feedback();
        let idx = llama_cpp::discrete_distribution(c.as_slice(), cum, || u.expect("a draw for two or more candidates"));
        if !certain(c, idx) {
            return false;
        }
        self.select(c, idx);
        true
    }

    /// Selects candidate `idx` (with its probability from the softmax the draw was made
    /// over) and moves `mu`.
    fn select(&mut self, c: &mut Candidates, idx: usize) {
        c.set_selected(Some(idx));
        let (_, _, mu, (eta, tau)) = self.feedback();
        let observed_surprise = -c.as_slice()[idx].p.log2();
        *mu -= eta * (observed_surprise - tau);
    }

    /// `apply` after its checks, with the draw `u` made already: `None` draws now.
    fn apply_drawn(&mut self, c: &mut Candidates, u: Option<Option<f64>>) {
        llama_cpp::softmax(c, true);
        let keep = self.keep(c);
        let u = u.unwrap_or_else(|| self.draw(keep));
        self.finish(c, keep, u, &|_, _| true);
    }
}

impl MuFeedback for Mirostat {
    fn keep(&self, c: &Candidates) -> usize {
        // `top_k(k)` on sorted candidates: the first `min(k, len)` (k >= 1).
        (self.top_k_estimate(c) as usize).min(c.len())
    }

    fn feedback(&mut self) -> (&mut StageRng, &mut Vec<f64>, &mut f32, (f32, f32)) {
        (&mut self.rng, &mut self.cum, &mut self.mu, (self.eta, self.tau))
    }
}

impl Sampler for Mirostat {
    fn name(&self) -> &'static str {
        "mirostat"
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        require_finite_candidate("mirostat", c)?;
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

impl FromSpec for Mirostat {
    const PARAMS: &'static [&'static str] = &["tau", "eta", "m"];
    fn from_spec(args: &Bound<'_>, ctx: &BuildContext<'_>) -> Result<Self> {
        Mirostat::new(
            ctx.n_vocab,
            ctx.rng,
            args.f32("tau", Some(5.0))?,
            args.f32("eta", Some(0.1))?,
            args.i32("m", Some(100))?,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int_conversion_follows_x86() {
        assert_eq!(x86_f32_to_i32(f32::NAN), i32::MIN);
        assert_eq!(x86_f32_to_i32(f32::INFINITY), i32::MIN);
        assert_eq!(x86_f32_to_i32(f32::NEG_INFINITY), i32::MIN);
        assert_eq!(x86_f32_to_i32(3e9), i32::MIN);
        assert_eq!(x86_f32_to_i32(-2147483648.0), i32::MIN);
        assert_eq!(x86_f32_to_i32(2147483520.0), 2147483520);
        assert_eq!(x86_f32_to_i32(-3.7), -3);
        assert_eq!(x86_f32_to_i32(41.9), 41);
    }

    #[test]
    fn equal_logits_make_k_nan_and_keep_one_candidate() {
        let mut m = Mirostat::new(8, RngConfig::mt19937(1), 5.0, 0.1, 100).unwrap();
        let mut c = Candidates::from_logits(&[0.5; 8]).unwrap();
        m.apply(&mut c).unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(c.as_slice()[0].p, 1.0);
        // p = 1: surprise 0, mu moves towards tau from above.
        assert_eq!(m.mu(), 10.0 - 0.1 * (0.0 - 5.0));
    }

    #[test]
    fn a_single_candidate_draws_nothing() {
        let mut a = Mirostat::new(1, RngConfig::mt19937(5), 5.0, 0.1, 100).unwrap();
        let b = Mirostat::new(1, RngConfig::mt19937(5), 5.0, 0.1, 100).unwrap();
        let mut c = Candidates::from_logits(&[0.0]).unwrap();
        a.apply(&mut c).unwrap();
        assert_eq!(c.selected_index(), Some(0));
        let (mut ra, mut rb) = (a.rng.clone(), b.rng.clone());
        assert_eq!(ra.uniform_f64(), rb.uniform_f64());
    }

    #[test]
    fn reset_restores_mu_and_the_stream() {
        let row: Vec<f32> = (0..50).map(|i| (i as f32 * 0.61).sin() * 4.0).collect();
        let mut m = Mirostat::new(row.len(), RngConfig::mt19937(9), 3.0, 0.2, 100).unwrap();
        let run = |m: &mut Mirostat| -> Vec<u32> {
            (0..6)
                .map(|_| {
                    let mut c = Candidates::from_logits(&row).unwrap();
                    m.apply(&mut c).unwrap();
                    let t = c.selected_token().unwrap();
                    m.accept(t);
                    t
                })
                .collect()
        };
        let first = run(&mut m);
        assert_ne!(m.mu(), 6.0);
        m.reset();
        assert_eq!(m.mu(), 6.0);
        assert_eq!(run(&mut m), first);
    }

    #[test]
    fn all_masked_is_an_error() {
        let mut m = Mirostat::new(3, RngConfig::philox(1), 5.0, 0.1, 100).unwrap();
        let mut c = Candidates::from_logits(&[f32::NEG_INFINITY; 3]).unwrap();
        assert!(m.apply(&mut c).unwrap_err().is_no_candidates());
        assert!(Mirostat::new(3, RngConfig::philox(1), f32::INFINITY, 0.1, 100).is_err());
    }
}
