//! `top_n_sigma(n)`: masks every candidate whose logit is more than `n` standard deviations
//! below the maximum.
//!
//! llama.cpp convention (`llama_sampler_top_n_sigma`, commit 0c1e570):
//!
//! * `n <= 0` builds an inert stage (`?top-n-sigma`); fewer than two candidates: no-op.
//! * Statistics over the candidates whose logit is not `-inf`: the maximum (starting from the
//!   first entry's logit), the mean (f32 sum divided by the count), and the **population**
//!   standard deviation: each squared deviation computed in f64 (C++'s `pow(float, 2)`) and
//!   added into an f32 accumulator, then `sqrt(acc / count)` in f32.
//! * Every candidate with `logit < max - n·σ` gets `-inf`; nothing is removed (the size is
//!   unchanged), nothing is sorted, `p` is not touched (the newest llama.cpp stops here; older
//!   versions then sorted and ran a softmax). The sorted flag is kept: masking a suffix of a
//!   sorted array leaves it sorted.
//! * All logits `-inf`: the threshold is `-inf` and nothing changes. All finite logits equal:
//!   `σ = 0`, only those equal to the maximum survive (all of them).
//!
//! Where tokensieve differs: NaN or infinite `n` is a parameter error (llama.cpp would compute
//! `inf · 0 = NaN` for a flat row, or mask nothing).

use super::{require_finite, BuildContext, FromSpec, Sampler};
use crate::candidates::Candidates;
use crate::convention::llama_cpp;
use crate::error::Result;
use crate::params::spec::Bound;

/// Top-n-sigma masking.
///
/// ```
/// use tokensieve::{Candidates, sampler::{top_n_sigma::TopNSigma, Sampler}};
/// // mean 1.5, σ ≈ 1.118: n = 1 keeps logits >= 3 - 1.118.
/// let mut c = Candidates::from_logits(&[0.0, 1.0, 2.0, 3.0]).unwrap();
/// TopNSigma::new(1.0).unwrap().apply(&mut c).unwrap();
/// assert_eq!(c.len(), 4); // masked, not removed
/// assert_eq!(c.count_finite(), 2);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct TopNSigma {
    n: f32,
}

impl TopNSigma {
    /// Top-n-sigma with `n` standard deviations (finite; `<= 0` = off).
    pub fn new(n: f32) -> Result<Self> {
        Ok(TopNSigma { n: require_finite("top_n_sigma", "n", n)? })
    }
}

impl Sampler for TopNSigma {
    fn name(&self) -> &'static str {
        if self.is_inert() {
            "?top-n-sigma"
        } else {
            "top-n-sigma"
        }
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        if self.is_inert() || c.len() <= 1 {
            return Ok(());
        }
        let data = c.as_mut_slice();
        let mut max = data[0].logit;
        let mut sum = 0.0f32;
        let mut count = 0usize;
        for t in data.iter().filter(|t| t.logit != f32::NEG_INFINITY) {
            max = llama_cpp::std_max(max, t.logit);
            sum += t.logit;
            count += 1;
        }
        let mean = if count > 0 { sum / count as f32 } else { 0.0 };
        let mut acc = 0.0f32;
        for t in data.iter().filter(|t| t.logit != f32::NEG_INFINITY) {
            let d = (t.logit - mean) as f64;
            acc = (acc as f64 + d * d) as f32;
        }
        let std = if count > 0 { (acc / count as f32).sqrt() } else { 0.0 };
        let threshold = max - self.n * std;
        for t in data.iter_mut() {
            if t.logit < threshold {
                t.logit = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    fn is_inert(&self) -> bool {
        self.n <= 0.0
    }
}

impl FromSpec for TopNSigma {
    const PARAMS: &'static [&'static str] = &["n"];
    fn from_spec(args: &Bound<'_>, _: &BuildContext<'_>) -> Result<Self> {
        TopNSigma::new(args.f32("n", None)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_cpp_test_vector() {
        // tests/test-sampling.cpp: probs {.1,.2,.3,.4}, n = 1 leaves the two largest.
        let logits: Vec<f32> = [0.1f32, 0.2, 0.3, 0.4].iter().map(|p| p.ln()).collect();
        let mut c = Candidates::from_logits(&logits).unwrap();
        TopNSigma::new(1.0).unwrap().apply(&mut c).unwrap();
        let finite: Vec<u32> = c.as_slice().iter().filter(|t| t.logit.is_finite()).map(|t| t.id).collect();
        assert_eq!(finite, [2, 3]);
        assert_eq!(c.len(), 4);
    }

    #[test]
    fn masked_candidates_are_left_out_of_the_statistics() {
        let mut c = Candidates::from_logits(&[f32::NEG_INFINITY, 0.0, 1.0, 2.0, 3.0]).unwrap();
        TopNSigma::new(1.0).unwrap().apply(&mut c).unwrap();
        assert_eq!(c.count_finite(), 2);
    }

    #[test]
    fn flat_and_fully_masked_rows_are_unchanged() {
        let mut c = Candidates::from_logits(&[1.5; 4]).unwrap();
        TopNSigma::new(2.0).unwrap().apply(&mut c).unwrap();
        assert_eq!(c.count_finite(), 4);
        let mut c = Candidates::from_logits(&[f32::NEG_INFINITY; 3]).unwrap();
        TopNSigma::new(2.0).unwrap().apply(&mut c).unwrap();
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn inert_and_invalid_parameters() {
        assert!(TopNSigma::new(-1.0).unwrap().is_inert());
        assert!(TopNSigma::new(0.0).unwrap().is_inert());
        assert_eq!(TopNSigma::new(-1.0).unwrap().name(), "?top-n-sigma");
        assert!(TopNSigma::new(f32::INFINITY).is_err());
        assert!(TopNSigma::new(f32::NAN).is_err());
    }
}
