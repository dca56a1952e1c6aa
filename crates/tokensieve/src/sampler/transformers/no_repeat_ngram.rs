//! `no_repeat_ngram(n)` under the transformers convention: `NoRepeatNGramLogitsProcessor`.
//!
//! With `L` accepted tokens (prompt included): if `L < n` nothing happens. Otherwise the prefix
//! is the last `n - 1` tokens, and for every window `history[s .. s + n]` (`s = 0 ..= L - n`)
//! whose first `n - 1` tokens equal the prefix, its last token is set to `-inf` (a hard ban):
//! no n-gram can occur twice. `n = 1` bans every token seen so far. Ids `>= V` are ignored.
//!
//! No llama.cpp counterpart (DRY is the closest). Validation as transformers: `n` an integer
//! `> 0`. Cost: `O(L * n)` per step. Draws: none.
//!
//! Spec: `no_repeat_ngram(n)`; `ngram_size=` / `no_repeat_ngram_size=` are accepted for `n`.

use crate::candidates::Candidates;
use crate::convention::transformers::ensure_dense;
use crate::error::{Error, Result};
use crate::params::spec::Bound;
use crate::sampler::transformers::mask_id;
use crate::sampler::{BuildContext, FromSpec, Sampler};

/// No-repeat n-gram ban, transformers convention.
///
/// ```
/// use tokensieve::{Candidates, sampler::{transformers::no_repeat_ngram::NoRepeatNGram, Sampler}};
/// let mut ban = NoRepeatNGram::new(2).unwrap();
/// for t in [1, 2, 3, 1] {
///     ban.accept(t);
/// }
/// let mut c = Candidates::from_logits(&[0.0; 4]).unwrap();
/// ban.apply(&mut c).unwrap();
/// assert!(c.as_slice()[2].logit.is_infinite()); // "1 2" occurred: 2 cannot follow 1 again
/// assert_eq!(c.count_finite(), 3);
/// ```
#[derive(Clone, Debug)]
pub struct NoRepeatNGram {
    n: usize,
    history: Vec<u32>,
}

impl NoRepeatNGram {
    /// Bans repeating any n-gram of `ngram_size > 0` tokens.
    pub fn new(ngram_size: i64) -> Result<Self> {
        if ngram_size <= 0 {
            return Err(Error::parameter(
                "no_repeat_ngram",
                "n",
                format!("has to be a strictly positive integer, but is {ngram_size}"),
            ));
        }
        Ok(NoRepeatNGram { n: usize::try_from(ngram_size).unwrap_or(usize::MAX), history: Vec::new() })
    }
}

impl NoRepeatNGram {
    /// Calls `f` with each id this step's `apply` masks (`-inf`): the last token of every
    /// earlier n-gram that starts with the last `n - 1` tokens (an id may come more than once).
    pub(crate) fn for_each_masked(&mut self, mut f: impl FnMut(u32)) {
        let (h, n) = (&self.history, self.n);
        if h.len() < n {
            return;
        }
        let prefix = &h[h.len() + 1 - n..];
        for window in h.windows(n) {
            if &window[..n - 1] == prefix {
                f(window[n - 1]);
            }
        }
    }
}

impl Sampler for NoRepeatNGram {
    fn name(&self) -> &'static str {
        "no_repeat_ngram"
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        ensure_dense(c);
        let data = c.as_mut_slice();
        self.for_each_masked(|id| mask_id(data, id));
        Ok(())
    }

    fn accept(&mut self, token: u32) {
        self.history.push(token);
    }

    fn reset(&mut self) {
        self.history.clear();
    }
}

impl FromSpec for NoRepeatNGram {
    const PARAMS: &'static [&'static str] = &["n"];
    const ALIASES: &'static [(&'static str, &'static str)] = &[("ngram_size", "n"), ("no_repeat_ngram_size", "n")];
    fn from_spec(args: &Bound<'_>, _: &BuildContext<'_>) -> Result<Self> {
        NoRepeatNGram::new(args.i64("n", None)?)
    }
}

#[cfg(test)]
mod tests {
    use crate::sampler::transformers::test_util::*;

    #[test]
    fn transformers_no_repeat_ngram_test_vectors() {
        // test_logits_process.py::test_no_repeat_ngram_dist_processor: vocab 3, uniform scores,
        // input_ids [[1, 1, 2, 1], [0, 1, 0, 1]].
        let row = [0.0f32; 3];
        let banned = |out: Vec<f32>| out.iter().map(|v| v.is_infinite()).collect::<Vec<_>>();
        // 2-grams: "1 1" and "1 2" occurred after 1 -> 1 and 2 banned; "1 0" -> 0 banned.
        assert_eq!(banned(run("no_repeat_ngram(2)", &row, &[1, 1, 2, 1])), [false, true, true]);
        assert_eq!(banned(run("no_repeat_ngram(2)", &row, &[0, 1, 0, 1])), [true, false, false]);
        // 3-grams: the prefix "2 1" never started a window -> nothing; "0 1" was followed by 0.
        assert_eq!(banned(run("no_repeat_ngram(3)", &row, &[1, 1, 2, 1])), [false, false, false]);
        assert_eq!(banned(run("no_repeat_ngram(3)", &row, &[0, 1, 0, 1])), [true, false, false]);
    }

    #[test]
    fn short_histories_ban_nothing_and_unigrams_ban_everything_seen() {
        assert_eq!(run("no_repeat_ngram(3)", &[1.0f32; 4], &[0, 1]), [1.0; 4]);
        assert_eq!(run("no_repeat_ngram(1)", &[1.0f32; 4], &[3, 1, 9]), [1.0, NEG, 1.0, NEG]);
        assert!(build_error("no_repeat_ngram(0)").contains("strictly positive"));
    }
}
