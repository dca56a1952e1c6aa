//! `temp_ext(t, delta, exponent)`: dynamic temperature ("entropy-based temperature"), the
//! stage llama.cpp's `common` builds for its "temperature" step.
//!
//! llama.cpp convention (`llama_sampler_temp_ext`, commit 0c1e570):
//!
//! * `t == 1` and `delta <= 0` builds an inert stage (`?temp-ext`).
//! * `delta <= 0`: exactly `temperature(t)`: logits divided by `t`, or for `t <= 0` every logit
//!   but the first maximum set to `-inf` (size unchanged).
//! * `delta > 0`: nothing happens for fewer than two candidates. Otherwise
//!   `min_t = max(0, t - delta)`, `max_t = t + delta`, the maximum entropy is
//!   `-logf(1 / size)` (f32); full sort (libstdc++ order on ties) and f32 softmax; entropy
//!   `H = -Σ p·ln p` over the candidates with `p > 0` (f32, sorted order);
//!   `dyn_t = min_t + (max_t - min_t) · powf(H / H_max, exponent)`; `temperature(dyn_t)` (so a
//!   `dyn_t <= 0` masks all but the first candidate); then `p` is recomputed in **f64**:
//!   `exp(logit - first_logit)` (the array is sorted) stored as f32 while the f64 values are
//!   summed, then each stored f32 `p` divided by the f64 sum and rounded back to f32.
//!   The array stays flagged sorted.
//!
//! Where tokensieve differs: NaN or infinite `t`, `delta` or `exponent` are parameter errors
//! (`t = inf` would turn `-inf` logits into NaN), and so is a negative `exponent`: with it
//! `powf(0, exponent)` is `+inf` when one candidate holds all the mass, which makes `dyn_t`
//! infinite and the logits NaN in llama.cpp. Omitted `delta` and `exponent` default to
//! llama.cpp's `common` defaults, 0 and 1.
//!
//! And where `dyn_t` is positive but so small that the maximum logit divided by it overflows
//! to `+inf` (`min_t = 0`, a nearly certain row, an `exponent` above 1: `powf` of a tiny
//! entropy can fall below `1e-38`), tokensieve takes `dyn_t = 0`, the limit it is near: every
//! logit but the first maximum becomes `-inf` and the maximum keeps its value and `p = 1`.
//! llama.cpp divides: the maximum becomes `+inf`, every recomputed `p` NaN, and its `dist` then
//! selects the *last* candidate of the sorted array, the least likely token (its debug builds
//! assert there).

use super::{require_finite, BuildContext, FromSpec, Sampler};
use crate::candidates::Candidates;
use crate::convention::llama_cpp;
use crate::error::{Error, Result};
use crate::params::spec::Bound;

/// Dynamic (entropy-based) temperature.
///
/// ```
/// use tokensieve::{Candidates, sampler::{temp_ext::TempExt, Sampler}};
/// // A flat distribution has maximal entropy: the temperature becomes t + delta = 1.5.
/// let mut c = Candidates::from_logits(&[3.0, 3.0, 3.0]).unwrap();
/// TempExt::new(1.0, 0.5, 1.0).unwrap().apply(&mut c).unwrap();
/// assert!((c.as_slice()[0].logit - 2.0).abs() < 1e-5);
/// assert!(c.is_sorted());
/// ```
#[derive(Clone, Copy, Debug)]
pub struct TempExt {
    t: f32,
    delta: f32,
    exponent: f32,
}

impl TempExt {
    /// Temperature `t` varied by up to `delta` according to the normalised entropy raised to
    /// `exponent` (all finite, `exponent >= 0`; `delta <= 0` = plain temperature).
    pub fn new(t: f32, delta: f32, exponent: f32) -> Result<Self> {
        let t = require_finite("temp_ext", "t", t)?;
        let delta = require_finite("temp_ext", "delta", delta)?;
        let exponent = require_finite("temp_ext", "exponent", exponent)?;
        if exponent < 0.0 {
            return Err(Error::parameter(
                "temp_ext",
                "exponent",
                format!(
                    "must be >= 0 (a negative exponent makes the temperature infinite at zero entropy), got {exponent}"
                ),
            ));
        }
        Ok(TempExt { t, delta, exponent })
    }

    /// `Some(t)` when the stage is plain `temperature(t)` (`delta <= 0`).
    pub(crate) fn plain_temperature(&self) -> Option<f32> {
        (self.delta <= 0.0).then_some(self.t)
    }
}

impl Sampler for TempExt {
    fn name(&self) -> &'static str {
        if self.is_inert() {
            "?temp-ext"
        } else {
            "temp-ext"
        }
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        if self.is_inert() || c.is_empty() {
            return Ok(());
        }
        if self.delta <= 0.0 {
            llama_cpp::temperature(c, self.t);
            return Ok(());
        }
        let min_t = llama_cpp::std_max(0.0, self.t - self.delta);
        let max_t = self.t + self.delta;
        let n = c.len();
        if n <= 1 {
            return Ok(());
        }
        let max_entropy = -(1.0f32 / n as f32).ln();
        llama_cpp::softmax(c, true);
        let mut entropy = 0.0f32;
        for t in c.as_slice() {
            if t.p > 0.0 {
                entropy -= t.p * t.p.ln();
            }
        }
        let normalized = entropy / max_entropy;
        let mut dyn_t = min_t + (max_t - min_t) * normalized.powf(self.exponent);
        // The array is sorted: its first logit is the maximum. A temperature so near 0 that the
        // maximum divided by it overflows is taken as 0 (see the module docs).
        if dyn_t > 0.0 && c.as_slice()[0].logit / dyn_t == f32::INFINITY {
            dyn_t = 0.0;
        }
        llama_cpp::temperature(c, dyn_t);

        let data = c.as_mut_slice();
        let max_l = data[0].logit as f64;
        let mut sum = 0.0f64;
        for t in data.iter_mut() {
            let p = (t.logit as f64 - max_l).exp();
            t.p = p as f32;
            sum += p;
        }
        for t in data.iter_mut() {
            t.p = (t.p as f64 / sum) as f32;
        }
        Ok(())
    }

    fn is_inert(&self) -> bool {
        self.t == 1.0 && self.delta <= 0.0
    }
}

impl FromSpec for TempExt {
    const PARAMS: &'static [&'static str] = &["t", "delta", "exponent"];
    fn from_spec(args: &Bound<'_>, _: &BuildContext<'_>) -> Result<Self> {
        TempExt::new(args.f32("t", None)?, args.f32("delta", Some(0.0))?, args.f32("exponent", Some(1.0))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::temperature::Temperature;

    #[test]
    fn non_positive_delta_is_plain_temperature() {
        for (t, delta) in [(0.7f32, -0.3f32), (0.0, 0.0), (-1.0, 0.0), (1.7, 0.0)] {
            let row = [1.0f32, -2.0, 3.0, 3.0, 0.5];
            let mut a = Candidates::from_logits(&row).unwrap();
            let mut b = Candidates::from_logits(&row).unwrap();
            TempExt::new(t, delta, 1.0).unwrap().apply(&mut a).unwrap();
            Temperature::new(t).unwrap().apply(&mut b).unwrap();
            assert_eq!(a.as_slice(), b.as_slice(), "t = {t}");
        }
    }

    #[test]
    fn zero_entropy_uses_min_temperature() {
        // One candidate holds all the mass (the other p underflows to 0): H = 0, so
        // dyn_t = max(0, t - delta) = 0, which masks all but the first.
        let mut c = Candidates::from_logits(&[0.0, 200.0]).unwrap();
        TempExt::new(0.5, 0.5, 1.0).unwrap().apply(&mut c).unwrap();
        assert_eq!(c.as_slice()[0].id, 1);
        assert_eq!(c.as_slice()[0].logit, 200.0);
        assert_eq!(c.as_slice()[1].logit, f32::NEG_INFINITY);
        assert_eq!(c.as_slice()[0].p, 1.0);
        assert_eq!(c.as_slice()[1].p, 0.0);
    }

    #[test]
    fn a_temperature_that_overflows_the_maximum_is_zero() {
        // H ≈ 43·e^-43 ≈ 1e-17 nats, so dyn_t = 0.39 · (H / ln 2)^2.23 ≈ 1.3e-38: 4.97 / dyn_t
        // overflows. The maximum stays, finite, with all the mass (llama.cpp: +inf, p NaN).
        let mut c = Candidates::from_logits(&[-37.95398, 4.9707556]).unwrap();
        TempExt::new(0.0, 0.3943745, 2.2268214).unwrap().apply(&mut c).unwrap();
        let s = c.as_slice();
        assert_eq!((s[0].id, s[0].logit, s[0].p), (1, 4.9707556, 1.0));
        assert_eq!((s[1].id, s[1].logit, s[1].p), (0, f32::NEG_INFINITY, 0.0));
        // A dist after it draws the maximum.
        let mut chain = crate::Chain::from_spec(
            "temp_ext(0,0.3943745,2.2268214);dist",
            &crate::sampler::BuildContext::new(2, crate::RngConfig::philox(7)),
        )
        .unwrap();
        for _ in 0..4 {
            assert_eq!(chain.sample(&[-37.95398f32, 4.9707556][..]).unwrap(), 1);
        }
        // A temperature that does not overflow still divides.
        let mut c = Candidates::from_logits(&[-37.95398, 4.9707556]).unwrap();
        TempExt::new(0.0, 0.3943745, 0.5).unwrap().apply(&mut c).unwrap();
        assert!(c.as_slice()[0].logit.is_finite() && c.as_slice()[0].logit > 4.9707556);
    }

    #[test]
    fn single_candidate_is_left_alone() {
        let mut c = Candidates::from_logits(&[2.0]).unwrap();
        TempExt::new(0.8, 0.5, 1.0).unwrap().apply(&mut c).unwrap();
        assert_eq!(c.as_slice()[0].logit, 2.0);
        assert_eq!(c.as_slice()[0].p, 0.0);
    }

    #[test]
    fn inert_and_invalid_parameters() {
        assert!(TempExt::new(1.0, 0.0, 1.0).unwrap().is_inert());
        assert!(TempExt::new(1.0, -0.5, 1.0).unwrap().is_inert());
        assert!(!TempExt::new(1.0, 0.5, 1.0).unwrap().is_inert());
        assert_eq!(TempExt::new(1.0, 0.0, 1.0).unwrap().name(), "?temp-ext");
        assert!(TempExt::new(f32::INFINITY, 0.0, 1.0).is_err());
        assert!(TempExt::new(1.0, f32::NAN, 1.0).is_err());
        assert!(TempExt::new(1.0, 0.5, -1.0).is_err());
    }
}
