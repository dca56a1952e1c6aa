//! `dist`: draws a token from the softmax of the current candidates.
//!
//! llama.cpp convention (newest, 0c1e570): no sort. Max = first logit if the array is flagged
//! sorted (the flag is trusted even when stale), else a scan; `p_i = expf(l_i - max)` stored as
//! f32 and summed in f64; one uniform f64 `u`; the first index in **array order** whose f64
//! running sum reaches `sum * u` is selected; in the same pass every `p` becomes `p / sum`.
//! A single candidate gets `p = 1` and still consumes one draw (keeps the stream aligned, as
//! llama.cpp does since backend sampling). If no index is found (NaN sums from a stale
//! sorted flag) the last candidate is selected, as in llama.cpp's release build.
//!
//! Draws: one f64 per application (two MT19937 words in `mt19937` mode).
//!
//! Where llama.cpp returns the last candidate for an array whose logits are all `-inf`,
//! tokensieve returns an error ([`Error::is_no_candidates`](crate::Error::is_no_candidates)).

use super::{require_finite_candidate, BuildContext, FromSpec, Sampler};
use crate::candidates::Candidates;
use crate::error::Result;
use crate::params::spec::Bound;
use crate::rng::{RngConfig, StageRng, Stream};

/// Sampling from the candidates' softmax.
///
/// ```
/// use tokensieve::{Candidates, RngConfig, sampler::{dist::Dist, Sampler}};
/// let mut dist = Dist::new(RngConfig::mt19937(42)).unwrap();
/// let mut c = Candidates::from_logits(&[1.0, 2.0, 3.0]).unwrap();
/// dist.apply(&mut c).unwrap();
/// assert!(c.selected_token().is_some());
/// ```
#[derive(Clone, Debug)]
pub struct Dist {
    rng: StageRng,
}

impl Dist {
    /// A `dist` stage drawing from `rng`.
    pub fn new(rng: RngConfig) -> Result<Self> {
        Ok(Dist { rng: StageRng::new(rng, Stream::Dist)? })
    }

    /// The uniform draw `apply` makes (the dense fast path in
    /// [`convention::llama_cpp::dense`](crate::convention::llama_cpp::dense) draws before it
    /// knows whether it can finish without the candidate array).
    pub(crate) fn draw(&mut self) -> f64 {
        self.rng.uniform_f64()
    }

    /// `apply` with the draw `u` already made: normalises `p` and selects. The candidates must
    /// hold a finite logit.
    pub(crate) fn select(c: &mut Candidates, u: f64) {
        let sorted = c.is_sorted();
        let data = c.as_mut_slice();
        if data.len() == 1 {
            data[0].p = 1.0;
            c.set_selected(Some(0));
            return;
        }
        let mut max_l = data[0].logit;
        if !sorted {
            for t in &data[1..] {
                max_l = max_l.max(t.logit);
            }
        }
        let mut sum = 0.0f64;
        for t in data.iter_mut() {
            let p = (t.logit - max_l).exp();
            t.p = p;
            sum += p as f64;
        }
        let target = sum * u;
        let mut running = 0.0f64;
        let mut selected = None;
        for (i, t) in data.iter_mut().enumerate() {
            if selected.is_none() {
                running += t.p as f64;
                if running >= target {
                    selected = Some(i);
                }
            }
            t.p = (t.p as f64 / sum) as f32;
        }
        let last = data.len() - 1;
        c.set_selected(Some(selected.unwrap_or(last)));
    }
}

impl Sampler for Dist {
    fn name(&self) -> &'static str {
        "dist"
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        require_finite_candidate("dist", c)?;
        let u = self.draw();
        Dist::select(c, u);
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

impl FromSpec for Dist {
    const PARAMS: &'static [&'static str] = &[];
    fn from_spec(_: &Bound<'_>, ctx: &BuildContext<'_>) -> Result<Self> {
        Dist::new(ctx.rng)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_candidate_consumes_a_draw() {
        let mut a = Dist::new(RngConfig::mt19937(1)).unwrap();
        let mut b = Dist::new(RngConfig::mt19937(1)).unwrap();
        let mut one = Candidates::from_logits(&[0.0]).unwrap();
        a.apply(&mut one).unwrap();
        assert_eq!(one.as_slice()[0].p, 1.0);
        let _ = b.rng.uniform_f64();
        let row = [0.1f32, 0.2, 0.3, 0.4];
        let mut ca = Candidates::from_logits(&row).unwrap();
        let mut cb = Candidates::from_logits(&row).unwrap();
        a.apply(&mut ca).unwrap();
        b.apply(&mut cb).unwrap();
        assert_eq!(ca.selected_index(), cb.selected_index());
    }

    #[test]
    fn never_selects_a_masked_candidate_and_errors_when_all_are() {
        let mut d = Dist::new(RngConfig::philox(3)).unwrap();
        for _ in 0..200 {
            let mut c = Candidates::from_logits(&[f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY, 0.0]).unwrap();
            d.apply(&mut c).unwrap();
            assert!(matches!(c.selected_token(), Some(1) | Some(3)));
            d.accept(0);
        }
        let mut c = Candidates::from_logits(&[f32::NEG_INFINITY; 2]).unwrap();
        assert!(d.apply(&mut c).unwrap_err().is_no_candidates());
    }
}
