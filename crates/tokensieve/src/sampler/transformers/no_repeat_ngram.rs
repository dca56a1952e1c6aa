//! `no_repeat_ngram(n)` under the transformers convention: `NoRepeatNGramLogitsProcessor`.
//!
//! With `L` accepted tokens (prompt included): if `L < n` nothing happens. Otherwise the prefix
//! is the last `n - 1` tokens, and for every window `history[s .. s + n]` (`s = 0 ..= L - n`)
//! whose first `n - 1` tokens equal the prefix, its last token is set to `-inf` (a hard ban):
//! no n-gram can occur twice. `n = 1` bans every token seen so far. Ids `>= V` are ignored.
//!
//! No llama.cpp counterpart (DRY is the closest). Validation as transformers: `n` an integer
//! `> 0`. Draws: none.
//!
//! transformers scans every window of the history each step (`O(L · n)`). Here `accept` files
//! each new window under a fingerprint of its first `n - 1` tokens, so a step visits only the
//! windows whose fingerprint is the prefix's (each compared token by token: a fingerprint may
//! be shared): `O(n)` per accepted token, and per step `O(n)` per earlier occurrence of the
//! prefix. PERF: with `n = 3` and a history of 4,096 tokens the scan took about 8 µs a step.
//!
//! Spec: `no_repeat_ngram(n)`; `ngram_size=` / `no_repeat_ngram_size=` are accepted for `n`.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::candidates::Candidates;
use crate::convention::transformers::ensure_dense;
use crate::error::{Error, Result};
use crate::params::spec::Bound;
use crate::sampler::penalties::IdHasher;
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
    /// Per fingerprint of a window's first `n - 1` tokens ([`fingerprint`]), the start of the
    /// latest window that has it.
    latest: HashMap<u64, usize, BuildHasherDefault<IdHasher>>,
    /// Per window start (`0 ..= L - n`), the start of the window before it with the same
    /// fingerprint ([`NONE`]: none).
    earlier: Vec<usize>,
}

/// No earlier window.
const NONE: usize = usize::MAX;

/// A fingerprint of a window's first `n - 1` tokens (the same tokens, the same fingerprint):
/// the penalties' id hasher run over them.
fn fingerprint(tokens: &[u32]) -> u64 {
    let mut h = IdHasher::default();
    tokens.iter().for_each(|&t| h.write_u32(t));
    h.finish()
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
        Ok(NoRepeatNGram {
            n: usize::try_from(ngram_size).unwrap_or(usize::MAX),
            history: Vec::new(),
            latest: HashMap::default(),
            earlier: Vec::new(),
        })
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
        let mut start = self.latest.get(&fingerprint(prefix)).copied().unwrap_or(NONE);
        while start != NONE {
            let window = &h[start..start + n];
            if &window[..n - 1] == prefix {
                f(window[n - 1]);
            }
            start = self.earlier[start];
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
        let (h, n) = (&self.history, self.n);
        if h.len() >= n {
            // The window that ends here.
            let start = h.len() - n;
            debug_assert_eq!(self.earlier.len(), start);
            let before = self.latest.insert(fingerprint(&h[start..h.len() - 1]), start);
            self.earlier.push(before.unwrap_or(NONE));
        }
    }

    fn reset(&mut self) {
        self.history.clear();
        self.latest.clear();
        self.earlier.clear();
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

    /// The indexed windows give the plain scan's bans (as a multiset) after every accepted
    /// token, for every `n`, on histories from small alphabets (many repeated prefixes),
    /// and again after a reset.
    #[test]
    fn the_index_bans_what_the_scan_bans() {
        use super::NoRepeatNGram;
        use crate::sampler::Sampler;
        let scan = |h: &[u32], n: usize| -> Vec<u32> {
            if h.len() < n {
                return Vec::new();
            }
            let prefix = &h[h.len() + 1 - n..];
            let mut out: Vec<u32> = h.windows(n).filter(|w| &w[..n - 1] == prefix).map(|w| w[n - 1]).collect();
            out.sort_unstable();
            out
        };
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for n in 1..=5usize {
            for alphabet in [2u64, 3, 7, 1000] {
                let mut ban = NoRepeatNGram::new(n as i64).unwrap();
                for round in 0..2 {
                    let mut h = Vec::new();
                    for _ in 0..300 {
                        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        let t = ((state >> 33) % alphabet) as u32;
                        h.push(t);
                        ban.accept(t);
                        let mut got = Vec::new();
                        ban.for_each_masked(|id| got.push(id));
                        got.sort_unstable();
                        assert_eq!(got, scan(&h, n), "n {n}, alphabet {alphabet}, round {round}, history {h:?}");
                    }
                    ban.reset();
                }
            }
        }
    }

    /// Two prefixes sharing a fingerprint (made here by filing a window under another's): the
    /// windows are compared token by token, so only the prefix's own bans come out.
    #[test]
    fn a_shared_fingerprint_bans_nothing_more() {
        use super::{fingerprint, NoRepeatNGram};
        use crate::sampler::Sampler;
        let mut ban = NoRepeatNGram::new(3).unwrap();
        for t in [5, 6, 7, 8, 9, 1, 5, 6] {
            ban.accept(t);
        }
        // Windows: 0 "5 6 7", 1 "6 7 8", 2 "7 8 9", 3 "8 9 1", 4 "9 1 5", 5 "1 5 6". The
        // prefix is "5 6"; chain window 2 ("7 8" -> 9) onto it as a colliding fingerprint.
        let key = fingerprint(&[5, 6]);
        assert_eq!(ban.latest[&key], 0);
        ban.earlier[2] = 0;
        ban.latest.insert(key, 2);
        let mut got = Vec::new();
        ban.for_each_masked(|id| got.push(id));
        assert_eq!(got, [7]);
    }

    #[test]
    fn short_histories_ban_nothing_and_unigrams_ban_everything_seen() {
        assert_eq!(run("no_repeat_ngram(3)", &[1.0f32; 4], &[0, 1]), [1.0; 4]);
        assert_eq!(run("no_repeat_ngram(1)", &[1.0f32; 4], &[3, 1, 9]), [1.0, NEG, 1.0, NEG]);
        assert!(build_error("no_repeat_ngram(0)").contains("strictly positive"));
    }
}
