//! `sequence_bias([[[ids…], bias], …])` under the transformers convention:
//! `SequenceBiasLogitsProcessor`, and `NoBadWordsLogitsProcessor` (the same with `-inf`
//! biases, built by [`SequenceBias::bad_words`]).
//!
//! * The list becomes a dict keyed by the id sequence: a repeated key keeps its **first**
//!   position and its **last** bias.
//! * Every step starts from a zero bias per token. Single-token entries set their token's bias;
//!   then, in dict order, every longer entry whose first `len - 1` ids equal the end of the
//!   sequence adds its bias to its last id (an entry whose prefix is longer than the sequence
//!   is skipped; a prefix as long as the sequence must equal all of it). Biases are f32 and add up in that order; the result is `z + bias` for **every**
//!   token, so an untouched `-0.0` logit becomes `+0.0` (`-0.0 + 0.0`), as in torch.
//! * Ids `>= V` are an error when the row arrives (transformers raises at its first call).
//!
//! Differs from llama.cpp's `logit_bias` (single tokens only, added to the touched tokens only,
//! duplicates resolved by array position).
//!
//! Validation as transformers: a non-empty list of `[ids, bias]` pairs with non-empty id lists
//! of non-negative integers. tokensieve accepts an integer bias (transformers wants a Python
//! float) and rejects NaN and `+inf` (which would turn the row into NaN). Draws: none.
//!
//! Spec: `sequence_bias([[[10,45],-2.0],[[64],-7.5]])`; `-inf` is written as such.

use crate::candidates::Candidates;
use crate::convention::transformers::{ensure_dense, fl32};
use crate::error::{Error, Result};
use crate::params::spec::Bound;
use crate::sampler::{BuildContext, FromSpec, Sampler};
use std::fmt::Write as _;

/// Additive biases on token sequences, transformers convention.
///
/// ```
/// use tokensieve::{Candidates, sampler::{transformers::sequence_bias::SequenceBias, Sampler}};
/// // Token 3 always gets -1; token 2 gets +4 when the sequence ends with 1.
/// let mut bias = SequenceBias::new(&[(vec![3], -1.0), (vec![1, 2], 4.0)]).unwrap();
/// bias.accept(0);
/// bias.accept(1);
/// let mut c = Candidates::from_logits(&[0.5, 0.5, 0.5, 0.5]).unwrap();
/// bias.apply(&mut c).unwrap();
/// let l: Vec<f32> = c.as_slice().iter().map(|t| t.logit).collect();
/// assert_eq!(l, [0.5, 0.5, 4.5, -0.5]);
/// ```
#[derive(Clone, Debug)]
pub struct SequenceBias {
    /// The dict, in insertion order: `(ids, fl32(bias))`.
    entries: Vec<(Vec<u32>, f32)>,
    /// The largest id of any entry (checked against the vocabulary).
    max_id: u32,
    history: Vec<u32>,
    /// Per-step bias of the touched tokens (reused buffer).
    touched: Vec<(u32, f32)>,
}

const STAGE: &str = "sequence_bias";

impl SequenceBias {
    /// Biases as `(token ids, bias)` pairs in order.
    pub fn new(entries: &[(Vec<i64>, f64)]) -> Result<Self> {
        if entries.is_empty() {
            return Err(Error::parameter(STAGE, STAGE, "has to be a non-empty list of [[ids...], bias] pairs"));
        }
        let mut dict: Vec<(Vec<u32>, f32)> = Vec::with_capacity(entries.len());
        for (ids, bias) in entries {
            if ids.is_empty() {
                return Err(Error::parameter(STAGE, STAGE, "each entry needs a non-empty list of token ids"));
            }
            let ids = ids
                .iter()
                .map(|&id| {
                    u32::try_from(id).map_err(|_| {
                        Error::parameter(STAGE, STAGE, format!("token ids have to be non-negative integers, got {id}"))
                    })
                })
                .collect::<Result<Vec<u32>>>()?;
            if bias.is_nan() || *bias == f64::INFINITY {
                return Err(Error::parameter(
                    STAGE,
                    STAGE,
                    format!("the bias of {ids:?} must be a finite number or -inf, got {bias}"),
                ));
            }
            match dict.iter_mut().find(|(k, _)| *k == ids) {
                Some(slot) => slot.1 = fl32(*bias),
                None => dict.push((ids, fl32(*bias))),
            }
        }
        let max_id = dict.iter().flat_map(|(ids, _)| ids.iter().copied()).max().unwrap_or(0);
        Ok(SequenceBias { entries: dict, max_id, history: Vec::new(), touched: Vec::new() })
    }

    /// `NoBadWordsLogitsProcessor(bad_words_ids, eos_token_id)`: every listed sequence gets
    /// a `-inf` bias, except single-token sequences equal to an end-of-sequence id, which are
    /// dropped first (so that generation can still end). Nothing left is an error, as in
    /// transformers.
    pub fn bad_words(bad_words_ids: &[Vec<i64>], eos_token_id: &[i64]) -> Result<Self> {
        let entries: Vec<(Vec<i64>, f64)> = bad_words_ids
            .iter()
            .filter(|w| !(w.len() == 1 && eos_token_id.contains(&w[0])))
            .map(|w| (w.clone(), f64::NEG_INFINITY))
            .collect();
        SequenceBias::new(&entries).map_err(|e| Error::field("bad_words_ids", e.to_string()))
    }

    /// Parses the spec form `[[[ids…], bias], …]` (JSON, plus `inf`/`-inf` for biases).
    pub fn parse(text: &str) -> std::result::Result<Vec<(Vec<i64>, f64)>, String> {
        let mut p = ListParser { s: text.as_bytes(), i: 0 };
        let node = p.node()?;
        p.ws();
        if p.i != p.s.len() {
            return Err(format!("unexpected text at offset {}", p.i));
        }
        let Node::List(items) = node else { return Err("expected a list of [[ids...], bias] pairs".into()) };
        items
            .into_iter()
            .map(|item| match item {
                Node::List(pair) if pair.len() == 2 => {
                    let mut it = pair.into_iter();
                    let (ids, bias) = (it.next().unwrap_or(Node::List(vec![])), it.next());
                    let Node::List(ids) = ids else {
                        return Err("each entry must start with a list of token ids".into());
                    };
                    let ids = ids
                        .into_iter()
                        .map(|n| match n {
                            Node::Num(t) => t.parse::<i64>().map_err(|_| format!("`{t}` is not an integer token id")),
                            Node::List(_) => Err("token ids must be integers".into()),
                        })
                        .collect::<std::result::Result<Vec<i64>, String>>()?;
                    let bias = match bias {
                        Some(Node::Num(t)) => t.parse::<f64>().map_err(|_| format!("`{t}` is not a number"))?,
                        _ => return Err("each entry must end with a bias".into()),
                    };
                    Ok((ids, bias))
                }
                _ => Err("each entry must be a pair [[ids...], bias]".into()),
            })
            .collect()
    }

    /// Writes entries in the spec form [`SequenceBias::parse`] reads.
    pub fn format(entries: &[(Vec<i64>, f64)]) -> String {
        let mut s = String::from("[");
        for (i, (ids, bias)) in entries.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push_str("[[");
            for (j, id) in ids.iter().enumerate() {
                if j > 0 {
                    s.push(',');
                }
                let _ = write!(s, "{id}");
            }
            let _ = write!(s, "],{bias}]");
        }
        s.push(']');
        s
    }

    fn add(&mut self, token: u32, bias: f32) {
        match self.touched.iter_mut().find(|(t, _)| *t == token) {
            Some(slot) => slot.1 += bias,
            None => self.touched.push((token, 0.0 + bias)),
        }
    }
}

enum Node {
    List(Vec<Node>),
    Num(String),
}

struct ListParser<'a> {
    s: &'a [u8],
    i: usize,
}

impl ListParser<'_> {
    fn ws(&mut self) {
        while self.s.get(self.i).is_some_and(|c| c.is_ascii_whitespace()) {
            self.i += 1;
        }
    }

    fn node(&mut self) -> std::result::Result<Node, String> {
        self.ws();
        if self.s.get(self.i) == Some(&b'[') {
            self.i += 1;
            let mut items = Vec::new();
            self.ws();
            if self.s.get(self.i) == Some(&b']') {
                self.i += 1;
                return Ok(Node::List(items));
            }
            loop {
                items.push(self.node()?);
                self.ws();
                match self.s.get(self.i) {
                    Some(b',') => self.i += 1,
                    Some(b']') => {
                        self.i += 1;
                        return Ok(Node::List(items));
                    }
                    _ => return Err(format!("expected `,` or `]` at offset {}", self.i)),
                }
            }
        }
        let start = self.i;
        while self.s.get(self.i).is_some_and(|c| !matches!(c, b',' | b']' | b'[') && !c.is_ascii_whitespace()) {
            self.i += 1;
        }
        if start == self.i {
            return Err(format!("expected a number or a list at offset {start}"));
        }
        Ok(Node::Num(String::from_utf8_lossy(&self.s[start..self.i]).into_owned()))
    }
}

impl Sampler for SequenceBias {
    fn name(&self) -> &'static str {
        STAGE
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        ensure_dense(c);
        let v = c.len();
        if self.max_id as usize >= v {
            return Err(Error::token_out_of_range("sequence_bias", self.max_id as i64, v));
        }
        self.touched.clear();
        let entries = std::mem::take(&mut self.entries);
        for (ids, bias) in entries.iter().filter(|(ids, _)| ids.len() == 1) {
            self.add(ids[0], *bias);
        }
        let len = self.history.len();
        for (ids, bias) in entries.iter().filter(|(ids, _)| ids.len() > 1) {
            let prefix = &ids[..ids.len() - 1];
            if prefix.len() <= len && self.history[len - prefix.len()..] == *prefix {
                self.add(ids[ids.len() - 1], *bias);
            }
        }
        self.entries = entries;
        let data = c.as_mut_slice();
        for t in data.iter_mut() {
            t.logit += 0.0;
        }
        for &(token, bias) in &self.touched {
            data[token as usize].logit += bias;
        }
        Ok(())
    }

    fn accept(&mut self, token: u32) {
        self.history.push(token);
    }

    fn reset(&mut self) {
        self.history.clear();
    }
}

impl FromSpec for SequenceBias {
    const PARAMS: &'static [&'static str] = &["sequence_bias"];
    fn from_spec(args: &Bound<'_>, ctx: &BuildContext<'_>) -> Result<Self> {
        let arg = args
            .arg("sequence_bias")
            .ok_or_else(|| Error::parameter(STAGE, STAGE, "is required: [[[ids...], bias], ...]"))?;
        let entries = SequenceBias::parse(&arg.text)
            .map_err(|e| args.bad(arg, STAGE, &format!("a list of [[ids...], bias] pairs ({e})")))?;
        let s = SequenceBias::new(&entries)?;
        if ctx.n_vocab > 0 && s.max_id as usize >= ctx.n_vocab {
            return Err(Error::token_out_of_range("sequence_bias", s.max_id as i64, ctx.n_vocab));
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::transformers::test_util::*;

    #[test]
    fn multi_token_entries_apply_when_the_sequence_ends_with_their_prefix() {
        // Sequence [0, 1, 3, 1]: (1,) always applies, (1, 0) and (3, 1, 3) complete here,
        // (1, 0, 1) does not (the sequence ends with 3, 1, not 1, 0).
        let row = [0.0f32; 4];
        let spec = "sequence_bias([[[1],100.0],[[1,0],20.0],[[1,0,1],-1.0],[[3,1,3],4.0]])";
        assert_eq!(run(spec, &row, &[0, 1, 3, 1]), [20.0, 100.0, 0.0, 4.0]);
    }

    #[test]
    fn repeated_keys_keep_the_first_position_and_the_last_bias() {
        let e = SequenceBias::parse("[[[1],1.5],[[2],-1],[[1],3]]").unwrap();
        let s = SequenceBias::new(&e).unwrap();
        assert_eq!(s.entries, vec![(vec![1], 3.0), (vec![2], -1.0)]);
    }

    #[test]
    fn biases_add_up_in_f32_and_negative_zero_becomes_zero() {
        // Token 2 gets its single bias plus the matching two-token entry's.
        let row = [-0.0f32, NEG, 1.0, 0.5];
        let out = run("sequence_bias([[[2],0.1],[[3,2],0.2],[[1],-inf]])", &row, &[3]);
        assert_eq!(out[0].to_bits(), 0.0f32.to_bits(), "-0.0 + 0.0 = +0.0");
        assert_eq!(out[1], NEG);
        assert_eq!(out[2], 1.0 + (0.1f64 as f32 + 0.2f64 as f32));
        assert_eq!(out[3], 0.5);
    }

    #[test]
    fn entries_whose_prefix_is_longer_than_the_sequence_are_skipped() {
        // The prefix must fit in the sequence; a prefix as long as the sequence must equal it
        // (the goldens check this: every row has an entry = its whole history + one token).
        assert_eq!(run("sequence_bias([[[0,1],5.0]])", &[0.0f32; 2], &[]), [0.0, 0.0]);
        assert_eq!(run("sequence_bias([[[0,1],5.0]])", &[0.0f32; 2], &[0]), [0.0, 5.0]);
        assert_eq!(run("sequence_bias([[[0,1],5.0]])", &[0.0f32; 2], &[7, 0]), [0.0, 5.0]);
        assert_eq!(run("sequence_bias([[[1,0,1],5.0]])", &[0.0f32; 2], &[0]), [0.0, 0.0]);
    }

    #[test]
    fn bad_words_drop_eos_singletons_and_ban_the_rest() {
        let b = SequenceBias::bad_words(&[vec![2], vec![0, 1], vec![3]], &[3]).unwrap();
        assert_eq!(b.entries, vec![(vec![2], f32::NEG_INFINITY), (vec![0, 1], f32::NEG_INFINITY)]);
        let e = SequenceBias::bad_words(&[vec![3]], &[3]).unwrap_err().to_string();
        assert!(e.contains("bad_words_ids") && e.contains("non-empty"), "{e}");
    }

    #[test]
    fn invalid_lists_and_out_of_vocabulary_ids_are_errors() {
        for (spec, needle) in [
            ("sequence_bias([])", "non-empty"),
            ("sequence_bias([[[],1.0]])", "non-empty list of token ids"),
            ("sequence_bias([[[-1],1.0]])", "non-negative"),
            ("sequence_bias([[[1],inf]])", "-inf"),
            ("sequence_bias([[1,1.0]])", "list of token ids"),
            ("sequence_bias([[[1],1.0]]x)", "unexpected text"),
            ("sequence_bias([[[8],1.0]])", "token id 8 is out of range"),
        ] {
            let e = build_error(spec);
            assert!(e.contains(needle), "{spec}: {e}");
        }
        let e = SequenceBias::new(&[(vec![9], 1.0)]).unwrap().apply(&mut cands(&[0.0; 4])).unwrap_err();
        assert!(e.to_string().contains("token id 9"));
    }

    #[test]
    fn format_round_trips() {
        let e = vec![(vec![1, 2], f64::NEG_INFINITY), (vec![3], 0.1)];
        assert_eq!(SequenceBias::format(&e), "[[[1,2],-inf],[[3],0.1]]");
        assert_eq!(SequenceBias::parse(&SequenceBias::format(&e)).unwrap(), e);
    }
}
