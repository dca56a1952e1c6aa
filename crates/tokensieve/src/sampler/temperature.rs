//! `temperature(t)`: divides every logit by `t`.
//!
//! llama.cpp convention: `t == 1` builds an inert stage; `t > 0` divides (not multiplies by
//! `1/t`, which rounds differently); `t <= 0` keeps the **first** maximum in array order
//! (strict `>`) and sets every other logit to `-inf` **without removing it** (the array size is
//! unchanged). A negative temperature therefore means greedy, as in llama.cpp. `t = +inf` is
//! rejected (llama.cpp would produce NaN for `-inf / inf`).
//!
//! A positive `t` so small that a logit divided by it overflows gives `+inf`, as in llama.cpp,
//! whose later softmaxes are then NaN (and its `dist` falls back to the last candidate). That
//! takes `|logit| > t · 3.4e38`, which no chosen temperature comes near; the dynamic one of
//! [`temp_ext`](super::temp_ext), which `powf` can drive to `1e-38`, is taken as 0 there
//! instead.

use super::{require_finite, BuildContext, FromSpec, Sampler};
use crate::candidates::Candidates;
use crate::convention::llama_cpp;
use crate::error::Result;
use crate::params::spec::Bound;

/// Temperature scaling.
///
/// ```
/// use tokensieve::{Candidates, sampler::{temperature::Temperature, Sampler}};
/// let mut c = Candidates::from_logits(&[1.0, 2.0]).unwrap();
/// Temperature::new(0.5).unwrap().apply(&mut c).unwrap();
/// assert_eq!(c.as_slice()[1].logit, 4.0);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Temperature {
    t: f32,
}

impl Temperature {
    /// Temperature `t` (finite; `t <= 0` means "keep only the first maximum").
    pub fn new(t: f32) -> Result<Self> {
        Ok(Temperature { t: require_finite("temperature", "t", t)? })
    }

    /// The temperature.
    pub(crate) fn t(&self) -> f32 {
        self.t
    }
}

impl Sampler for Temperature {
    fn name(&self) -> &'static str {
        if self.is_inert() {
            "?temp"
        } else {
            "temp"
        }
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        if !self.is_inert() {
            llama_cpp::temperature(c, self.t);
        }
        Ok(())
    }

    fn is_inert(&self) -> bool {
        self.t == 1.0
    }
}

impl FromSpec for Temperature {
    const PARAMS: &'static [&'static str] = &["t"];
    fn from_spec(args: &Bound<'_>, _: &BuildContext<'_>) -> Result<Self> {
        Temperature::new(args.f32("t", None)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_temperature_masks_all_but_the_first_maximum() {
        let mut c = Candidates::from_logits(&[3.0, 1.0, 3.0]).unwrap();
        Temperature::new(-1.0).unwrap().apply(&mut c).unwrap();
        assert_eq!(c.len(), 3);
        assert_eq!(c.count_finite(), 1);
        assert_eq!(c.as_slice()[0].logit, 3.0);
    }

    #[test]
    fn infinite_temperature_is_rejected() {
        assert!(Temperature::new(f32::INFINITY).is_err());
    }

    #[test]
    fn one_is_inert() {
        assert!(Temperature::new(1.0).unwrap().is_inert());
    }
}
