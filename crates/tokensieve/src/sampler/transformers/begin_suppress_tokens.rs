//! `begin_suppress_tokens(ID …, begin_index=N)` under the transformers convention:
//! `SuppressTokensAtBeginLogitsProcessor`.
//!
//! The listed ids are set to `-inf` only at the step where the sequence holds exactly
//! `begin_index` tokens. `generate()` sets `begin_index` to the prompt length (so the ids are
//! suppressed at the first generated position); that is the default here: the number of
//! tokens accepted before the first step. Ids `>= V` or negative never match. Draws: none.
//!
//! Spec: `begin_suppress_tokens(ID …, begin_index=N)`: ids separated by spaces (or a JSON
//! array); `begin_index` optional (default: the prompt length).

use crate::candidates::Candidates;
use crate::convention::transformers::ensure_dense;
use crate::error::{Error, Result};
use crate::params::spec::Bound;
use crate::sampler::transformers::{mask_id, matchable_ids};
use crate::sampler::{BuildContext, FromSpec, Sampler};

/// Suppression at the first generated position, transformers convention.
///
/// ```
/// use tokensieve::{Candidates, sampler::{transformers::begin_suppress_tokens::BeginSuppressTokens, Sampler}};
/// let mut s = BeginSuppressTokens::new(&[1], None).unwrap();
/// s.accept(0); // the prompt
/// let mut c = Candidates::from_logits(&[1.0, 2.0]).unwrap();
/// s.apply(&mut c).unwrap(); // first step: token 1 suppressed
/// assert_eq!(c.count_finite(), 1);
/// s.accept(0);
/// let mut c = Candidates::from_logits(&[1.0, 2.0]).unwrap();
/// s.apply(&mut c).unwrap(); // later steps: untouched
/// assert_eq!(c.count_finite(), 2);
/// ```
#[derive(Clone, Debug)]
pub struct BeginSuppressTokens {
    ids: Vec<u32>,
    /// `None`: the prompt length, fixed at the first step.
    begin_index: Option<usize>,
    explicit: bool,
    len: usize,
}

impl BeginSuppressTokens {
    /// Suppresses `ids` when the sequence holds `begin_index` tokens (`None`: at the first step).
    pub fn new(ids: &[i64], begin_index: Option<i64>) -> Result<Self> {
        let begin_index = begin_index
            .map(|b| {
                usize::try_from(b).map_err(|_| {
                    Error::parameter(
                        "begin_suppress_tokens",
                        "begin_index",
                        format!("has to be a non-negative integer, but is {b}"),
                    )
                })
            })
            .transpose()?;
        Ok(BeginSuppressTokens { ids: matchable_ids(ids), begin_index, explicit: begin_index.is_some(), len: 0 })
    }
}

impl BeginSuppressTokens {
    /// Calls `f` with each id this step's `apply` masks (`-inf`), with `apply`'s effect on the
    /// state (the first step fixes the begin index when none was given).
    pub(crate) fn for_each_masked(&mut self, f: impl FnMut(u32)) {
        if *self.begin_index.get_or_insert(self.len) == self.len {
            self.ids.iter().copied().for_each(f);
        }
    }
}

impl Sampler for BeginSuppressTokens {
    fn name(&self) -> &'static str {
        "begin_suppress_tokens"
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        ensure_dense(c);
        let data = c.as_mut_slice();
        self.for_each_masked(|id| mask_id(data, id));
        Ok(())
    }

    fn accept(&mut self, _token: u32) {
        self.len += 1;
    }

    fn reset(&mut self) {
        self.len = 0;
        if !self.explicit {
            self.begin_index = None;
        }
    }
}

impl FromSpec for BeginSuppressTokens {
    const PARAMS: &'static [&'static str] = &["ids", "begin_index"];
    const ALIASES: &'static [(&'static str, &'static str)] = &[("begin_suppress_tokens", "ids")];
    fn from_spec(args: &Bound<'_>, _: &BuildContext<'_>) -> Result<Self> {
        let ids = args.ids("ids")?.ok_or_else(|| {
            Error::parameter("begin_suppress_tokens", "ids", "is required: the token ids to suppress at the start")
        })?;
        let begin_index = match args.arg("begin_index") {
            Some(_) => Some(args.i64("begin_index", None)?),
            None => None,
        };
        BeginSuppressTokens::new(&ids, begin_index)
    }
}

#[cfg(test)]
mod tests {
    use crate::sampler::transformers::test_util::*;

    #[test]
    fn suppresses_only_at_the_begin_index() {
        // Default: the prompt length, i.e. the first step after the history.
        assert_eq!(run("begin_suppress_tokens(1 2)", &[0.5f32; 3], &[0, 0]), [0.5, NEG, NEG]);
        // Explicit index: only when the sequence holds exactly that many tokens.
        assert_eq!(run("begin_suppress_tokens(1,begin_index=2)", &[0.5f32; 3], &[0, 0]), [0.5, NEG, 0.5]);
        assert_eq!(run("begin_suppress_tokens(1,begin_index=3)", &[0.5f32; 3], &[0, 0]), [0.5; 3]);
        assert!(build_error("begin_suppress_tokens(1,begin_index=-1)").contains("non-negative"));
    }
}
