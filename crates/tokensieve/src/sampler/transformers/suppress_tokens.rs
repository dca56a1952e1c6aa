//! `suppress_tokens(ID …)` under the transformers convention: `SuppressTokensLogitsProcessor`.
//!
//! Every listed id is set to `-inf` at every step. Ids `>= V` or negative never match (torch's
//! `isin` over `arange(V)`), as in transformers. No llama.cpp counterpart (`logit_bias` with
//! `-inf` is the closest). Draws: none.
//!
//! Spec: `suppress_tokens(ID …)`: ids separated by spaces, or a JSON array.

use crate::candidates::Candidates;
use crate::convention::transformers::ensure_dense;
use crate::error::{Error, Result};
use crate::params::spec::Bound;
use crate::sampler::transformers::{mask_id, matchable_ids};
use crate::sampler::{BuildContext, FromSpec, Sampler};

/// Token suppression, transformers convention.
///
/// ```
/// use tokensieve::{Candidates, sampler::{transformers::suppress_tokens::SuppressTokens, Sampler}};
/// let mut s = SuppressTokens::new(&[0, 2, 50]);
/// let mut c = Candidates::from_logits(&[1.0, 1.0, 1.0]).unwrap();
/// s.apply(&mut c).unwrap();
/// assert_eq!(c.count_finite(), 1);
/// ```
#[derive(Clone, Debug)]
pub struct SuppressTokens {
    ids: Vec<u32>,
}

impl SuppressTokens {
    /// Suppresses `ids` (negative ones never match).
    pub fn new(ids: &[i64]) -> Self {
        SuppressTokens { ids: matchable_ids(ids) }
    }
}

impl SuppressTokens {
    /// Calls `f` with each id a step's `apply` masks (`-inf`).
    pub(crate) fn for_each_masked(&mut self, f: impl FnMut(u32)) {
        self.ids.iter().copied().for_each(f);
    }
}

impl Sampler for SuppressTokens {
    fn name(&self) -> &'static str {
        "suppress_tokens"
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        ensure_dense(c);
        let data = c.as_mut_slice();
        self.for_each_masked(|id| mask_id(data, id));
        Ok(())
    }
}

impl FromSpec for SuppressTokens {
    const PARAMS: &'static [&'static str] = &["ids"];
    const ALIASES: &'static [(&'static str, &'static str)] = &[("suppress_tokens", "ids")];
    fn from_spec(args: &Bound<'_>, _: &BuildContext<'_>) -> Result<Self> {
        let ids = args
            .ids("ids")?
            .ok_or_else(|| Error::parameter("suppress_tokens", "ids", "is required: the token ids to suppress"))?;
        Ok(SuppressTokens::new(&ids))
    }
}

#[cfg(test)]
mod tests {
    use crate::sampler::transformers::test_util::*;

    #[test]
    fn suppresses_listed_ids_at_every_step() {
        assert_eq!(run("suppress_tokens(1 3)", &[0.5f32; 4], &[]), [0.5, NEG, 0.5, NEG]);
        assert_eq!(run("suppress_tokens([0,7])", &[0.5f32; 4], &[0, 1, 2]), [NEG, 0.5, 0.5, 0.5]);
        assert!(build_error("suppress_tokens()").contains("required"));
        assert!(build_error("suppress_tokens(a b)").contains("token ids"));
    }
}
