//! `logit_bias(ID:BIAS ID:BIAS ...)`: adds a fixed bias to the logits of chosen tokens
//! (`-inf` bans a token).
//!
//! Spec syntax: space-separated `ID:BIAS` pairs, e.g. `logit_bias(15:1.5 0:-inf)`. `ID` is an
//! integer (`i64`); `BIAS` a float, `-inf` allowed, `+inf` and NaN rejected. An empty list
//! builds an inert stage (`?logit-bias`).
//!
//! llama.cpp convention (`llama_sampler_init_logit_bias`, commit 0c1e570), reproduced
//! exactly, including its two paths:
//!
//! * **Vocabulary-order path**, per entry in list order: if `0 <= ID < len` and the candidate at
//!   index `ID` has id `ID` (the array is still in vocabulary order there), the bias is added
//!   to it. Duplicated ids therefore **all** add up on this path.
//! * **Searched path**: the entries that failed that test are looked up over the array; each
//!   candidate gets the bias of the **first** such entry naming its id only (later duplicates
//!   are ignored). So the same list can give different logits depending on where the stage
//!   sits in the chain (e.g. after `top_k`).
//! * Ids that are negative or not among the candidates are ignored (never an error), as in
//!   llama.cpp.
//! * Biases are added in f32. The `sorted` flag is **not** touched, exactly as in llama.cpp:
//!   after a sorting stage the flag may go stale and later stages trust it (llama.cpp's
//!   `dist` then takes the first candidate as the maximum; see the golden README §8).
//!   `p` is left stale.
//!
//! Cost: O(entries) on the vocabulary-order path; the searched path (only run when some
//! entry missed the first one) is one binary search per candidate instead of llama.cpp's
//! O(candidates × entries) scan, with identical results (a candidate whose id differs from
//! its index is exactly one whose entries all failed the first test, because ids are unique).
//!
//! Where tokensieve differs from llama.cpp: a finite logit plus a finite bias can still
//! overflow to `+inf` (both near `f32::MAX`); that is kept, as in llama.cpp. Ids beyond
//! `u32::MAX` never match (llama.cpp stores ids as `i32`, so such ids cannot be expressed
//! there). Draws: none.

use super::{BuildContext, FromSpec, Sampler};
use crate::candidates::Candidates;
use crate::error::{Error, Result};
use crate::params::spec::Bound;

/// Additive logit biases.
///
/// ```
/// use tokensieve::{Candidates, sampler::{logit_bias::LogitBias, Sampler}};
/// let mut bias = LogitBias::new(&[(1, 2.5), (0, f32::NEG_INFINITY), (1, -0.5)]).unwrap();
/// let mut c = Candidates::from_logits(&[1.0, 2.0, 3.0]).unwrap();
/// bias.apply(&mut c).unwrap();
/// let l: Vec<f32> = c.as_slice().iter().map(|t| t.logit).collect();
/// assert_eq!(l, [f32::NEG_INFINITY, 4.0, 3.0]); // vocabulary order: duplicates add up
/// ```
#[derive(Clone, Debug)]
pub struct LogitBias {
    /// The entries as given, in order.
    entries: Vec<(i64, f32)>,
    /// For each distinct id in `0..=u32::MAX`, the bias of its first entry; sorted by id.
    first_by_id: Vec<(u32, f32)>,
}

impl LogitBias {
    /// Biases as `(token id, bias)` pairs, in order. A bias of `+inf` or NaN is an error;
    /// `-inf` bans the token.
    pub fn new(entries: &[(i64, f32)]) -> Result<Self> {
        for &(id, bias) in entries {
            if bias.is_nan() || bias == f32::INFINITY {
                return Err(Error::parameter(
                    "logit_bias",
                    "bias",
                    format!("of token {id} must be a finite number or -inf, got {bias}"),
                ));
            }
        }
        let mut first: Vec<(u32, usize, f32)> = entries
            .iter()
            .enumerate()
            .filter_map(|(i, &(id, bias))| u32::try_from(id).ok().map(|id| (id, i, bias)))
            .collect();
        first.sort_by_key(|&(id, i, _)| (id, i));
        first.dedup_by_key(|e| e.0);
        Ok(LogitBias { entries: entries.to_vec(), first_by_id: first.into_iter().map(|(id, _, b)| (id, b)).collect() })
    }

    /// Parses the spec form `ID:BIAS ID:BIAS ...` (`position` is used in error messages).
    pub fn parse(text: &str, position: usize) -> Result<Self> {
        let mut entries = Vec::new();
        for pair in text.split_whitespace() {
            let bad = |what: &str| Error::spec(position, format!("logit_bias: `{pair}`: {what}"));
            let (id, bias) = pair.split_once(':').ok_or_else(|| bad("expected ID:BIAS"))?;
            let id: i64 = id.parse().map_err(|_| bad("the token id must be an integer"))?;
            let bias: f32 = bias.parse().map_err(|_| bad("the bias must be a number"))?;
            if bias.is_nan() || bias == f32::INFINITY {
                return Err(bad("the bias must be finite or -inf"));
            }
            entries.push((id, bias));
        }
        LogitBias::new(&entries)
    }

    /// The entries, in the order given.
    pub fn entries(&self) -> &[(i64, f32)] {
        &self.entries
    }
}

impl Sampler for LogitBias {
    fn name(&self) -> &'static str {
        if self.is_inert() {
            "?logit-bias"
        } else {
            "logit-bias"
        }
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        let data = c.as_mut_slice();
        let len = data.len() as u64;
        let mut search = false;
        for &(id, bias) in &self.entries {
            match u32::try_from(id) {
                Ok(t) if (t as u64) < len && data[t as usize].id == t => data[t as usize].logit += bias,
                Ok(_) => search = true,
                // Negative or beyond any candidate id: llama.cpp searches and never finds it.
                Err(_) => {}
            }
        }
        if search {
            for (i, t) in data.iter_mut().enumerate() {
                // A candidate at its own index took the first path (ids are unique).
                if t.id as usize == i {
                    continue;
                }
                if let Ok(k) = self.first_by_id.binary_search_by_key(&t.id, |e| e.0) {
                    t.logit += self.first_by_id[k].1;
                }
            }
        }
        Ok(())
    }

    fn is_inert(&self) -> bool {
        self.entries.is_empty()
    }
}

impl FromSpec for LogitBias {
    const PARAMS: &'static [&'static str] = &["biases"];
    fn from_spec(args: &Bound<'_>, _: &BuildContext<'_>) -> Result<Self> {
        match args.arg("biases") {
            Some(arg) => LogitBias::parse(&arg.text, arg.position),
            None => LogitBias::new(&[]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convention::llama_cpp;

    fn logits(c: &Candidates) -> Vec<f32> {
        c.as_slice().iter().map(|t| t.logit).collect()
    }

    #[test]
    fn searched_path_applies_only_the_first_duplicate() {
        let mut c = Candidates::from_logits(&[1.0, 4.0, 3.0, 2.0]).unwrap();
        llama_cpp::top_k(&mut c, 3); // no token is left at the index equal to its id
        let ids: Vec<u32> = c.as_slice().iter().map(|t| t.id).collect();
        assert_eq!(ids, [1, 2, 3]);
        let mut b = LogitBias::parse("2:1 2:10 3:-1 3:-5", 0).unwrap();
        b.apply(&mut c).unwrap();
        assert_eq!(logits(&c), [4.0, 4.0, 1.0]);
        assert!(c.is_sorted(), "logit_bias leaves the sorted flag alone");
    }

    #[test]
    fn vocabulary_order_adds_every_duplicate() {
        let mut c = Candidates::from_logits(&[1.0, 4.0, 3.0]).unwrap();
        LogitBias::parse("2:1 2:10", 0).unwrap().apply(&mut c).unwrap();
        assert_eq!(logits(&c), [1.0, 4.0, 14.0]);
    }

    #[test]
    fn out_of_range_and_negative_ids_are_ignored() {
        let mut c = Candidates::from_logits(&[1.0, 4.0, 3.0]).unwrap();
        LogitBias::parse("-1:2 3:5 99999999999:1 0:-inf", 0).unwrap().apply(&mut c).unwrap();
        assert_eq!(logits(&c), [f32::NEG_INFINITY, 4.0, 3.0]);
    }

    #[test]
    fn a_token_at_its_index_after_a_sort_takes_the_first_path() {
        // After top_k, token 0 happens to sit at index 0: both of its entries apply, while
        // token 2 (at index 1) gets only its first entry.
        let mut c = Candidates::from_logits(&[5.0, 1.0, 3.0]).unwrap();
        llama_cpp::top_k(&mut c, 2);
        LogitBias::parse("0:1 0:1 2:1 2:1", 0).unwrap().apply(&mut c).unwrap();
        assert_eq!(logits(&c), [7.0, 4.0]);
    }

    #[test]
    fn parse_errors_and_inert_list() {
        for bad in ["1", "a:1", "1:x", "1:inf", "1:nan", "1:+inf"] {
            assert!(LogitBias::parse(bad, 0).is_err(), "{bad}");
        }
        let empty = LogitBias::parse("", 0).unwrap();
        assert!(empty.is_inert());
        assert_eq!(empty.name(), "?logit-bias");
        assert_eq!(LogitBias::parse("1:-inf", 0).unwrap().name(), "logit-bias");
    }
}
