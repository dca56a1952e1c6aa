//! `greedy` under the transformers convention: `generate()`'s greedy search
//! (`do_sample=False`), `argmax(processed scores)`.
//!
//! The first maximum in vocabulary order wins, i.e. the **lowest token id** among tied maxima
//! (llama.cpp's greedy takes the first in its current array order, which after a sort is
//! libstdc++'s tie order). Draws nothing, changes no logit.
//!
//! Where transformers returns token 0 for a row that is all `-inf`, tokensieve returns an
//! error ([`Error::is_no_candidates`](crate::Error::is_no_candidates)).

use crate::candidates::Candidates;
use crate::convention::transformers::ensure_dense;
use crate::error::Result;
use crate::params::spec::Bound;
use crate::sampler::{BuildContext, FromSpec, Sampler};

/// Argmax selection, lowest id on ties.
///
/// ```
/// use tokensieve::{Candidates, sampler::{transformers::greedy::Greedy, Sampler}};
/// let mut c = Candidates::from_logits(&[0.5, 2.0, 2.0, 1.0]).unwrap();
/// Greedy.apply(&mut c).unwrap();
/// assert_eq!(c.selected_token(), Some(1));
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Greedy;

impl Sampler for Greedy {
    fn name(&self) -> &'static str {
        "greedy"
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        // In vocabulary order, the first maximum in array order is the lowest id among the
        // maxima: exactly llama.cpp's greedy scan. A sparse view is in vocabulary order too,
        // and the tokens it leaves out are -inf.
        if !c.sparse {
            ensure_dense(c);
        }
        crate::sampler::greedy::Greedy.apply(c)
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
    fn lowest_id_wins_even_after_a_reordering_stage() {
        // A llama.cpp top_k sorts (tie order: libstdc++'s); the transformers greedy scatters
        // the array back to vocabulary order first.
        let mut c = Candidates::from_logits(&[1.0f32, 3.0, 0.0, 3.0, 3.0]).unwrap();
        crate::convention::llama_cpp::top_k(&mut c, 3);
        Greedy.apply(&mut c).unwrap();
        assert_eq!(c.selected_token(), Some(1));
        let mut c = Candidates::from_logits(&[f32::NEG_INFINITY; 2]).unwrap();
        assert!(Greedy.apply(&mut c).unwrap_err().is_no_candidates());
    }
}
