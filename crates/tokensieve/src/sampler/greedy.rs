//! `greedy`: selects the candidate with the largest logit.
//!
//! llama.cpp convention: a strict `>` scan in array order, so the **first** maximum in the
//! current array order wins (after a sort that is libstdc++'s tie order, not the lowest id).
//! Draws nothing, does not touch `p`, does not sort.
//!
//! Where llama.cpp selects a `-inf` candidate (every candidate masked), tokensieve returns an
//! error ([`Error::is_no_candidates`](crate::Error::is_no_candidates)).

use super::{require_finite_candidate, BuildContext, FromSpec, Sampler};
use crate::candidates::Candidates;
use crate::error::Result;
use crate::params::spec::Bound;

/// Greedy (argmax) selection.
///
/// ```
/// use tokensieve::{Candidates, sampler::{greedy::Greedy, Sampler}};
/// let mut c = Candidates::from_logits(&[0.5, 2.0, 2.0, 1.0]).unwrap();
/// Greedy.apply(&mut c).unwrap();
/// assert_eq!(c.selected_token(), Some(1)); // first of the tied maxima
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Greedy;

impl Sampler for Greedy {
    fn name(&self) -> &'static str {
        "greedy"
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        require_finite_candidate("greedy", c)?;
        let data = c.as_slice();
        let mut best = 0;
        for i in 1..data.len() {
            if data[i].logit > data[best].logit {
                best = i;
            }
        }
        c.set_selected(Some(best));
        Ok(())
    }

    fn selects(&self) -> bool {
        true
    }
}

impl FromSpec for Greedy {
    const PARAMS: &'static [&'static str] = &[];
    fn from_spec(_: &Bound<'_>, _: &BuildContext<'_>) -> Result<Self> {
        Ok(Greedy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_masked_is_an_error_not_a_token() {
        let mut c = Candidates::from_logits(&[f32::NEG_INFINITY; 3]).unwrap();
        assert!(Greedy.apply(&mut c).unwrap_err().is_no_candidates());
    }

    #[test]
    fn ignores_masked_leading_entries() {
        let mut c = Candidates::from_logits(&[f32::NEG_INFINITY, -3.0, -1.0]).unwrap();
        Greedy.apply(&mut c).unwrap();
        assert_eq!(c.selected_token(), Some(2));
    }
}
