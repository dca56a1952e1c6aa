//! `temperature(t)` under the transformers convention: `TemperatureLogitsWarper`.
//!
//! * Output `z / fl32(t)`: IEEE f32 **division** by the f32-rounded temperature (not a
//!   multiplication by its reciprocal); `-inf` stays `-inf`, `-0.0` stays `-0.0`.
//! * `t` must be `> 0` (transformers raises otherwise, with a hint to use greedy decoding for
//!   0). `t = 1` is applied (bit-for-bit a no-op); `generate()` only adds the warper when
//!   `t != 1`, which [`GenerationConfig`](crate::params::GenerationConfig) reproduces.
//!
//! Where tokensieve differs: transformers requires a Python `float` (an `int` such as `2`
//! raises); tokensieve takes any number. `t = +inf` is rejected (torch would turn `-inf`
//! logits into NaN). Draws: none.
//!
//! Spec: `temperature(t)`; `temperature=` is accepted as a key too.

use crate::candidates::Candidates;
use crate::convention::transformers::{ensure_dense, fl32};
use crate::error::{Error, Result};
use crate::params::spec::Bound;
use crate::sampler::{BuildContext, FromSpec, Sampler};

/// Temperature scaling, transformers convention.
///
/// ```
/// use tokensieve::{Candidates, sampler::{transformers::temperature::Temperature, Sampler}};
/// let mut c = Candidates::from_logits(&[1.0, -3.0, f32::NEG_INFINITY]).unwrap();
/// Temperature::new(0.5).unwrap().apply(&mut c).unwrap();
/// let l: Vec<f32> = c.as_slice().iter().map(|t| t.logit).collect();
/// assert_eq!(l, [2.0, -6.0, f32::NEG_INFINITY]);
/// assert!(Temperature::new(0.0).is_err());
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Temperature {
    t: f32,
}

impl Temperature {
    /// A temperature `t > 0` (finite), as the Python float the user wrote.
    pub fn new(t: f64) -> Result<Self> {
        if t.is_nan() || t <= 0.0 {
            let hint = if t == 0.0 { " (for greedy decoding use `greedy`, i.e. do_sample=false)" } else { "" };
            return Err(Error::parameter(
                "temperature",
                "t",
                format!("has to be a strictly positive float, got {t}{hint}"),
            ));
        }
        if t.is_infinite() {
            return Err(Error::parameter("temperature", "t", "must be finite (inf would turn -inf logits into NaN)"));
        }
        Ok(Temperature { t: fl32(t) })
    }
}

impl Sampler for Temperature {
    fn name(&self) -> &'static str {
        "temperature"
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        // A sparse view stays one: the tokens it leaves out are -inf, and -inf / t = -inf.
        if !c.sparse {
            ensure_dense(c);
        }
        for tok in c.as_mut_slice() {
            tok.logit = self.scale(tok.logit);
        }
        Ok(())
    }
}

impl Temperature {
    /// One logit after this stage: `z / fl32(t)`.
    #[inline]
    pub(crate) fn scale(&self, z: f32) -> f32 {
        z / self.t
    }

    /// The f32-rounded temperature the logits are divided by.
    pub(crate) fn divisor(&self) -> f32 {
        self.t
    }
}

impl FromSpec for Temperature {
    const PARAMS: &'static [&'static str] = &["t"];
    const ALIASES: &'static [(&'static str, &'static str)] = &[("temperature", "t")];
    fn from_spec(args: &Bound<'_>, _: &BuildContext<'_>) -> Result<Self> {
        Temperature::new(args.f64("t", None)?)
    }
}

#[cfg(test)]
mod tests {
    use crate::sampler::transformers::test_util::*;

    #[test]
    fn divides_by_the_f32_rounded_temperature() {
        // 0.7 is not exact in f32; the division uses fl32(0.7), not 1/0.7.
        let row = [1.0f32, 3.0, -0.0, NEG];
        let out = run("temperature(0.7)", &row, &[]);
        let t = 0.7f64 as f32;
        assert_eq!(out[0].to_bits(), (1.0f32 / t).to_bits());
        assert_eq!(out[1].to_bits(), (3.0f32 / t).to_bits());
        assert_eq!(out[2].to_bits(), (-0.0f32).to_bits());
        assert_eq!(out[3], NEG);
        assert_eq!(run("temperature(temperature=1.0)", &row, &[])[1], 3.0);
    }

    #[test]
    fn sharper_temperatures_concentrate_mass() {
        // As test_logits_process.py's test_temperature_dist_warper checks on its first row:
        // a sharper temperature makes the peak more likely, a smoother one less.
        let row =
            [0.0f32, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5];
        let sharp = run("temperature(0.5)", &row, &[]);
        let smooth = run("temperature(1.3)", &row, &[]);
        let peak = |z: &[f32]| {
            let s: f64 = z.iter().map(|&v| (v as f64).exp()).sum();
            (z[3] as f64).exp() / s
        };
        assert!(peak(&sharp) > peak(&row) && peak(&smooth) < peak(&row));
    }

    #[test]
    fn invalid_temperatures_are_errors_naming_the_parameter() {
        for (spec, needle) in [
            ("temperature(0)", "greedy"),
            ("temperature(-1)", "strictly positive"),
            ("temperature(inf)", "finite"),
            ("temperature()", "missing parameter `t`"),
        ] {
            let e = build_error(spec);
            assert!(e.contains(needle), "{spec}: {e}");
        }
        assert!(build_error("temperature(0)").contains("parameter `t`"));
    }
}
