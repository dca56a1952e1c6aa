//! `min_length(min_length, eos=ID …)` and `min_new_tokens(min_new_tokens, eos=ID …)` under the
//! transformers convention: `MinLengthLogitsProcessor` and
//! `MinNewTokensLengthLogitsProcessor`.
//!
//! * `min_length`: while the sequence (every accepted token, prompt included) is shorter than
//!   `min_length`, every end-of-sequence id is set to `-inf`; afterwards nothing changes.
//! * `min_new_tokens`: the same, counting only the tokens accepted after the first step (the
//!   prompt is what was accepted before it). `generate()` turns `min_new_tokens` into both
//!   processors with identical effect; [`GenerationConfig`](crate::params::GenerationConfig)
//!   builds this one.
//!
//! Ids `>= V` or negative never match (torch's `isin` over `arange(V)`), as in transformers.
//! Validation as transformers: the length is a non-negative integer. Draws: none.
//!
//! Spec: `min_length(min_length, eos=ID …)`, `min_new_tokens(min_new_tokens, eos=ID …)`: ids
//! separated by spaces (or a JSON array); `eos_token_id=` is accepted for `eos`.

use crate::candidates::Candidates;
use crate::convention::transformers::ensure_dense;
use crate::error::{Error, Result};
use crate::params::spec::Bound;
use crate::sampler::transformers::{mask_id, matchable_ids};
use crate::sampler::{BuildContext, FromSpec, Sampler};

fn non_negative(stage: &str, name: &str, v: i64) -> Result<usize> {
    usize::try_from(v)
        .map_err(|_| Error::parameter(stage, name, format!("has to be a non-negative integer, but is {v}")))
}

fn eos_ids(stage: &str, args: &Bound<'_>) -> Result<Vec<i64>> {
    args.ids("eos")?.ok_or_else(|| Error::parameter(stage, "eos", "is required: the end-of-sequence id(s), e.g. eos=2"))
}

/// `MinLengthLogitsProcessor`: bans the end-of-sequence ids until the sequence holds
/// `min_length` tokens.
///
/// ```
/// use tokensieve::{Candidates, sampler::{transformers::min_length::MinLength, Sampler}};
/// let mut m = MinLength::new(3, &[2]).unwrap();
/// m.accept(0);
/// m.accept(1);
/// let mut c = Candidates::from_logits(&[1.0, 1.0, 1.0]).unwrap();
/// m.apply(&mut c).unwrap();
/// assert_eq!(c.count_finite(), 2);
/// ```
#[derive(Clone, Debug)]
pub struct MinLength {
    min_length: usize,
    eos: Vec<u32>,
    len: usize,
}

impl MinLength {
    /// `min_length >= 0` tokens before any of `eos_token_id` may be chosen.
    pub fn new(min_length: i64, eos_token_id: &[i64]) -> Result<Self> {
        let min_length = non_negative("min_length", "min_length", min_length)?;
        Ok(MinLength { min_length, eos: matchable_ids(eos_token_id), len: 0 })
    }
}

impl MinLength {
    /// Calls `f` with each id this step's `apply` masks (`-inf`): the EOS ids while the
    /// sequence is shorter than `min_length`.
    pub(crate) fn for_each_masked(&mut self, f: impl FnMut(u32)) {
        if self.len < self.min_length {
            self.eos.iter().copied().for_each(f);
        }
    }
}

impl Sampler for MinLength {
    fn name(&self) -> &'static str {
        "min_length"
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
    }
}

impl FromSpec for MinLength {
    const PARAMS: &'static [&'static str] = &["min_length", "eos"];
    const ALIASES: &'static [(&'static str, &'static str)] = &[("eos_token_id", "eos")];
    fn from_spec(args: &Bound<'_>, _: &BuildContext<'_>) -> Result<Self> {
        MinLength::new(args.i64("min_length", None)?, &eos_ids("min_length", args)?)
    }
}

/// `MinNewTokensLengthLogitsProcessor`: bans the end-of-sequence ids until `min_new_tokens`
/// tokens have been accepted after the prompt (the tokens accepted before the first step).
///
/// ```
/// use tokensieve::{Candidates, sampler::{transformers::min_length::MinNewTokens, Sampler}};
/// let mut m = MinNewTokens::new(1, &[0]).unwrap();
/// m.accept(5); // prompt
/// let mut c = Candidates::from_logits(&[1.0, 1.0]).unwrap();
/// m.apply(&mut c).unwrap(); // first step: nothing generated yet
/// assert_eq!(c.count_finite(), 1);
/// m.accept(1);
/// let mut c = Candidates::from_logits(&[1.0, 1.0]).unwrap();
/// m.apply(&mut c).unwrap();
/// assert_eq!(c.count_finite(), 2);
/// ```
#[derive(Clone, Debug)]
pub struct MinNewTokens {
    min_new_tokens: usize,
    eos: Vec<u32>,
    len: usize,
    prompt_len: Option<usize>,
}

impl MinNewTokens {
    /// `min_new_tokens >= 0` generated tokens before any of `eos_token_id` may be chosen.
    pub fn new(min_new_tokens: i64, eos_token_id: &[i64]) -> Result<Self> {
        let min_new_tokens = non_negative("min_new_tokens", "min_new_tokens", min_new_tokens)?;
        Ok(MinNewTokens { min_new_tokens, eos: matchable_ids(eos_token_id), len: 0, prompt_len: None })
    }
}

impl MinNewTokens {
    /// Calls `f` with each id this step's `apply` masks (`-inf`), with `apply`'s effect on the
    /// state (the first step fixes the prompt's length).
    pub(crate) fn for_each_masked(&mut self, f: impl FnMut(u32)) {
        let prompt = *self.prompt_len.get_or_insert(self.len);
        if self.len - prompt < self.min_new_tokens {
            self.eos.iter().copied().for_each(f);
        }
    }
}

impl Sampler for MinNewTokens {
    fn name(&self) -> &'static str {
        "min_new_tokens"
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
        self.prompt_len = None;
    }
}

impl FromSpec for MinNewTokens {
    const PARAMS: &'static [&'static str] = &["min_new_tokens", "eos"];
    const ALIASES: &'static [(&'static str, &'static str)] = &[("eos_token_id", "eos")];
    fn from_spec(args: &Bound<'_>, _: &BuildContext<'_>) -> Result<Self> {
        MinNewTokens::new(args.i64("min_new_tokens", None)?, &eos_ids("min_new_tokens", args)?)
    }
}

#[cfg(test)]
mod tests {
    use crate::sampler::transformers::test_util::*;

    #[test]
    fn transformers_min_length_test_vectors() {
        // test_logits_process.py::test_min_length_dist_processor: vocab 20, min_length 10,
        // eos 0: banned with 5 tokens, allowed with 15.
        let row = [0.05f32; 20];
        let out = run("min_length(10,eos=0)", &row, &[1; 5]);
        assert_eq!(out[0], NEG);
        assert_eq!(&out[1..], &row[1..]);
        assert_eq!(run("min_length(10,eos=0)", &row, &[1; 15]), row);
        // Several eos ids; ids outside the vocabulary or negative never match.
        let out = run("min_length(2,eos_token_id=[1,3,99,-1])", &[0.0f32; 4], &[]);
        assert_eq!(out, [0.0, NEG, 0.0, NEG]);
    }

    #[test]
    fn min_new_tokens_counts_from_the_first_step() {
        let ctx = crate::sampler::BuildContext::new(3, crate::RngConfig::philox(0))
            .with_convention(crate::Convention::Transformers);
        let mut chain = crate::Chain::from_spec("min_new_tokens(2,eos=2);greedy", &ctx).unwrap();
        for t in [0, 0, 0, 0] {
            chain.accept(t); // a long prompt does not count
        }
        let row = [0.0f32, 1.0, 5.0];
        assert_eq!(chain.sample(&row).unwrap(), 1);
        assert_eq!(chain.sample(&row).unwrap(), 1);
        assert_eq!(chain.sample(&row).unwrap(), 2);
        chain.reset();
        chain.accept(0);
        assert_eq!(chain.sample(&row).unwrap(), 1);
    }

    #[test]
    fn lengths_must_be_non_negative_and_eos_is_required() {
        assert!(build_error("min_length(-1,eos=0)").contains("non-negative"));
        assert!(build_error("min_length(3)").contains("end-of-sequence"));
        assert!(build_error("min_new_tokens(-2,eos=1)").contains("parameter `min_new_tokens`"));
        assert!(build_error("min_length(3,eos=x)").contains("token ids"));
    }
}
