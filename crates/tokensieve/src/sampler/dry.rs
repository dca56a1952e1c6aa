//! `dry(multiplier, base, allowed_length, last_n, breakers=[...])`: DRY ("Don't Repeat
//! Yourself", by pi6am, as ported to llama.cpp from koboldcpp), a penalty on tokens that
//! would extend a sequence already repeated in the recent context.
//!
//! Spec: `dry(multiplier, base, allowed_length, last_n)`, defaults (common's) `0`, `1.75`, `2`,
//! `64`, plus an optional `breakers=` key holding a JSON array of strings (default
//! `["\n", ":", "\"", "*"]`), e.g. `dry(0.8,1.75,2,64,breakers=["\n","###"])`.
//!
//! llama.cpp convention (`llama_sampler_init_dry`, commit 0c1e570):
//!
//! * `multiplier == 0`, `base < 1` or `last_n == 0` builds an inert stage (`?dry`) that also
//!   ignores accepted tokens; `last_n < 0` is clamped to 0 (inert).
//! * Construction: every breaker (cut to 40 bytes, empty ones skipped) is matched against
//!   every token's text to build *restart sequences*, `head token -> tails`: a token whose text
//!   contains the breaker is a head with an empty tail; a token whose text ends with a proper
//!   prefix of the breaker is a head whose tail is the tokenization of the rest of the
//!   breaker, cut to 20 tokens (no duplicate tails per head).
//! * accept: the token enters a window of the last `last_n` tokens.
//! * Apply (no-op unless the window holds more than `allowed_length` tokens):
//!   1. scanning back from the newest token, the first head whose tail matches the tokens
//!      before it (longest tail wins) caps the repetition length at its distance from the end
//!      minus the tail length; if that cap is below `allowed_length`, stop;
//!   2. a reverse Z-algorithm over the window gives, for each earlier position, the length of
//!      the match between the text ending there and the text ending now, capped (llama.cpp
//!      reuses the capped values inside the Z-box, and so does tokensieve);
//!   3. for every match of length `>= allowed_length`, the token that followed it would
//!      extend the repetition: keep the longest length per such token;
//!   4. each such candidate, unless it is the head of a single-token breaker, gets
//!      `multiplier * base^(len - allowed_length)` subtracted, the exponent clamped to
//!      `trunc(88.7228391 / ln(base))` when `base > 1.000001` (so the power stays finite);
//!      the power is computed as C++'s `std::pow(float, int)` does, in f64, then rounded to
//!      f32. The `sorted` flag is cleared (only when step 4 is reached).
//!
//! Cost: steps 1–3 are O(last_n); step 4 touches only the penalised ids when the candidates
//! are still in vocabulary order, else one hash lookup per candidate.
//!
//! Where tokensieve differs from llama.cpp:
//!
//! * **Token texts.** llama.cpp detokenises each token and tokenises breaker tails with the
//!   model's tokenizer. tokensieve takes the token byte strings from
//!   [`BuildContext::vocab`] and tokenises a tail greedily (longest vocabulary entry first,
//!   stopping at a byte no entry starts with). For single-character breakers (the defaults)
//!   no tail is ever needed, so the result is the same; multi-token tails may differ from the
//!   model's own tokenization.
//! * **Without a vocabulary** ([`BuildContext::vocab`] is `None`) no restart sequence can be
//!   found: the breakers are ignored and every repetition is penalised.
//!   [`Dry::with_token_breakers`] takes restart sequences as token ids instead (what
//!   llama.cpp's test hook does).
//! * `multiplier`, `base` must be finite and `allowed_length >= 0` (a negative one would
//!   overflow llama.cpp's exponent arithmetic).
//! * The window grows as tokens arrive instead of being allocated at `last_n` up front.
//!
//! Draws: none.

use std::collections::VecDeque;
use std::sync::Arc;

use super::penalties::{keys_at_own_index, IdMap};
use super::{require_finite, BuildContext, FromSpec, Sampler};
use crate::candidates::{Candidates, TokenData};
use crate::error::{Error, Result};
use crate::params::spec::Bound;

/// llama.cpp's cap on a breaker's length in bytes.
const MAX_BREAKER_BYTES: usize = 40;
/// llama.cpp's cap on a restart sequence's tail, in tokens.
const MAX_TAIL_TOKENS: usize = 20;
/// The default sequence breakers (common's).
pub const DEFAULT_BREAKERS: [&str; 4] = ["\n", ":", "\"", "*"];

/// DRY's numeric parameters, with common's defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DryParams {
    /// Penalty scale (`0` = off).
    pub multiplier: f32,
    /// Growth of the penalty per extra repeated token (`< 1` = off).
    pub base: f32,
    /// Repetitions up to this length are not penalised.
    pub allowed_length: i32,
    /// How many recent tokens are searched (`0` = off, `< 0` treated as 0).
    pub last_n: i32,
}

impl Default for DryParams {
    fn default() -> Self {
        DryParams { multiplier: 0.0, base: 1.75, allowed_length: 2, last_n: 64 }
    }
}

/// Restart sequences: head token -> tails (the tokens that must follow the head, in text
/// order; an empty tail makes the head a single-token breaker).
type RestartMap = IdMap<Vec<Vec<u32>>>;

/// The DRY repetition penalty.
///
/// ```
/// use tokensieve::{Candidates, sampler::{dry::{Dry, DryParams}, Sampler}};
/// let params = DryParams { multiplier: 1.0, base: 1.1, allowed_length: 2, last_n: 5 };
/// let mut dry = Dry::with_token_breakers(params, &[]).unwrap();
/// for t in [0, 1, 2, 0, 1] {
///     dry.accept(t);
/// }
/// let mut c = Candidates::from_logits(&[0.0; 4]).unwrap();
/// dry.apply(&mut c).unwrap();
/// // "0 1" was followed by 2 before: emitting 2 again would extend the repetition.
/// assert_eq!(c.as_slice()[2].logit, -1.0);
/// assert_eq!(c.as_slice()[3].logit, 0.0);
/// ```
#[derive(Clone, Debug)]
pub struct Dry {
    params: DryParams,
    last_n: usize,
    /// Shared between clones: built once, never changed.
    restart: Arc<RestartMap>,
    /// The last `last_n` accepted tokens, oldest first.
    window: VecDeque<u32>,
    // Scratch, reused across steps.
    rev: Vec<u32>,
    repeat_count: Vec<i32>,
    max_repeat: IdMap<i32>,
}

impl Dry {
    /// DRY with breaker strings matched against the token texts `vocab` (byte strings by id).
    /// Without a vocabulary the breakers are ignored (see the module docs).
    pub fn new(params: DryParams, vocab: Option<&[Vec<u8>]>, breakers: &[String]) -> Result<Self> {
        let mut dry = Self::validated(params)?;
        if let (false, Some(vocab)) = (dry.is_inert(), vocab) {
            let mut map = RestartMap::default();
            let mut tokenizer = None;
            for b in breakers {
                let b = b.as_bytes();
                let b = &b[..b.len().min(MAX_BREAKER_BYTES)];
                if !b.is_empty() {
                    add_restart_sequences(vocab, b, &mut map, &mut tokenizer);
                }
            }
            dry.restart = Arc::new(map);
        }
        Ok(dry)
    }

    /// DRY with restart sequences given directly as token ids, each in text order (`[head,
    /// then the tokens that must follow it]`), as llama.cpp's `llama_sampler_init_dry_testing`
    /// takes them. Empty sequences are skipped.
    pub fn with_token_breakers(params: DryParams, sequences: &[Vec<u32>]) -> Result<Self> {
        let mut dry = Self::validated(params)?;
        let mut map = RestartMap::default();
        for s in sequences {
            if let Some((&head, tail)) = s.split_first() {
                map.entry(head).or_default().push(tail.to_vec());
            }
        }
        dry.restart = Arc::new(map);
        Ok(dry)
    }

    fn validated(params: DryParams) -> Result<Self> {
        require_finite("dry", "multiplier", params.multiplier)?;
        require_finite("dry", "base", params.base)?;
        if params.allowed_length < 0 {
            return Err(Error::parameter(
                "dry",
                "allowed_length",
                format!("must be >= 0, got {}", params.allowed_length),
            ));
        }
        Ok(Dry {
            params,
            last_n: params.last_n.max(0) as usize,
            restart: Arc::new(RestartMap::default()),
            window: VecDeque::new(),
            rev: Vec::new(),
            repeat_count: Vec::new(),
            max_repeat: IdMap::default(),
        })
    }

    /// The parameters this stage was built with.
    pub fn params(&self) -> DryParams {
        self.params
    }

    fn penalise(&self, t: &mut TokenData, repeat_len: i32, max_exponent: i32) {
        let single_token_breaker = self.restart.get(&t.id).is_some_and(|tails| tails.iter().any(Vec::is_empty));
        if single_token_breaker {
            return;
        }
        let mut exponent = repeat_len - self.params.allowed_length;
        if max_exponent > 0 && exponent > max_exponent {
            exponent = max_exponent;
        }
        // C++ `multiplier * std::pow(float base, int exponent)`: promoted to double.
        let penalty = (self.params.multiplier as f64 * (self.params.base as f64).powf(exponent as f64)) as f32;
        t.logit -= penalty;
    }
}

/// Adds the restart sequences of one breaker (llama.cpp's `get_overlapping_token_sequences`).
fn add_restart_sequences<'v>(
    vocab: &'v [Vec<u8>],
    breaker: &[u8],
    map: &mut RestartMap,
    tokenizer: &mut Option<GreedyTokenizer<'v>>,
) {
    for (id, word) in vocab.iter().enumerate() {
        let id = id as u32;
        if contains(word, breaker) {
            map.entry(id).or_default().push(Vec::new());
            continue;
        }
        // Positions where the word ends with a proper prefix of the breaker.
        for pos in (0..word.len()).filter(|&p| word[p] == breaker[0]) {
            let rest = &word[pos..];
            if rest.len() >= breaker.len() || rest != &breaker[..rest.len()] {
                continue;
            }
            let tk = tokenizer.get_or_insert_with(|| GreedyTokenizer::new(vocab));
            let mut tail = tk.tokenize(&breaker[rest.len()..]);
            tail.truncate(MAX_TAIL_TOKENS);
            let tails = map.entry(id).or_default();
            if !tails.contains(&tail) {
                tails.push(tail);
            }
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.len() <= haystack.len() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// Longest-match tokenization over the vocabulary's byte strings (a stand-in for the model's
/// tokenizer, used only for multi-token breaker tails).
struct GreedyTokenizer<'v> {
    by_text: std::collections::HashMap<&'v [u8], u32>,
    longest: usize,
}

impl<'v> GreedyTokenizer<'v> {
    fn new(vocab: &'v [Vec<u8>]) -> Self {
        let mut by_text = std::collections::HashMap::new();
        let mut longest = 0;
        for (id, t) in vocab.iter().enumerate() {
            if !t.is_empty() {
                by_text.entry(t.as_slice()).or_insert(id as u32);
                longest = longest.max(t.len());
            }
        }
        GreedyTokenizer { by_text, longest }
    }

    fn tokenize(&self, mut text: &[u8]) -> Vec<u32> {
        let mut out = Vec::new();
        'outer: while !text.is_empty() {
            for len in (1..=text.len().min(self.longest)).rev() {
                if let Some(&id) = self.by_text.get(&text[..len]) {
                    out.push(id);
                    text = &text[len..];
                    continue 'outer;
                }
            }
            break;
        }
        out
    }
}

impl Sampler for Dry {
    fn name(&self) -> &'static str {
        if self.is_inert() {
            "?dry"
        } else {
            "dry"
        }
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        if self.is_inert() {
            return Ok(());
        }
        let allowed = self.params.allowed_length;
        let n = self.window.len().min(self.last_n);
        if n as i64 <= allowed as i64 {
            return Ok(());
        }
        // rev[i] = the i-th most recent token (llama.cpp's `last_tokens.rat(i)`).
        self.rev.clear();
        self.rev.extend(self.window.iter().rev().take(n));
        let rev = &self.rev;
        let n = n as i32;

        // Step 1: the most recent restart sequence caps the repetition length.
        let mut rep_limit = n;
        for i in 0..n {
            let Some(tails) = self.restart.get(&rev[i as usize]) else { continue };
            let mut longest = -1i32;
            for tail in tails {
                let len = tail.len() as i32;
                if len > longest
                    && len <= i
                    && tail.iter().enumerate().all(|(o, &t)| t == rev[(i - o as i32 - 1) as usize])
                {
                    longest = len;
                }
            }
            if longest >= 0 {
                rep_limit = i - longest;
                break;
            }
        }
        if rep_limit < allowed {
            return Ok(());
        }

        // Step 2: reverse Z-algorithm; repeat_count[last - k] = match length ending k back.
        let rc = &mut self.repeat_count;
        rc.clear();
        rc.resize(n as usize, 0);
        let at = |i: i32| rev[i as usize];
        let last = n - 1;
        let (mut lt, mut rt) = (0i32, 0i32);
        for k in 1..n {
            if k > rt {
                let mut m = 0;
                while m + k < n && at(m) == at(m + k) {
                    m += 1;
                }
                rc[(last - k) as usize] = m.min(rep_limit);
                if m > 0 {
                    lt = k;
                    rt = k + m - 1;
                }
            } else {
                let p = k - lt;
                let right_part_len = rt - k + 1;
                if rc[(last - p) as usize] < right_part_len {
                    rc[(last - k) as usize] = rc[(last - p) as usize].min(rep_limit);
                } else {
                    let mut i = rt + 1;
                    while i < n && at(i) == at(i - k) {
                        i += 1;
                    }
                    rc[(last - k) as usize] = (i - k).min(rep_limit);
                    lt = k;
                    rt = i - 1;
                }
            }
        }

        // Step 3: the token that followed each long enough match, with its longest length.
        self.max_repeat.clear();
        for i in 0..n - 1 {
            let len = rc[i as usize];
            if len >= allowed {
                let token = at(n - 2 - i);
                let e = self.max_repeat.entry(token).or_insert(len);
                *e = (*e).max(len);
            }
        }

        // Step 4: penalties.
        // llama.cpp's `88.7228391f` (≈ ln(f32::MAX)), the same binary32 value.
        const FLOAT_MAX_LOG: f32 = 88.722_84;
        let max_exponent = if self.params.base > 1.000001 { (FLOAT_MAX_LOG / self.params.base.ln()) as i32 } else { 0 };
        let data = c.as_mut_slice();
        if keys_at_own_index(&self.max_repeat, data) {
            for (&token, &len) in &self.max_repeat {
                self.penalise(&mut data[token as usize], len, max_exponent);
            }
        } else {
            for t in data.iter_mut() {
                if let Some(&len) = self.max_repeat.get(&t.id) {
                    self.penalise(t, len, max_exponent);
                }
            }
        }
        c.set_sorted(false);
        Ok(())
    }

    fn accept(&mut self, token: u32) {
        if self.is_inert() {
            return;
        }
        if self.window.len() >= self.last_n {
            self.window.pop_front();
        }
        self.window.push_back(token);
    }

    fn reset(&mut self) {
        self.window.clear();
    }

    fn is_inert(&self) -> bool {
        self.params.multiplier == 0.0 || self.params.base < 1.0 || self.last_n == 0
    }
}

impl FromSpec for Dry {
    const PARAMS: &'static [&'static str] = &["multiplier", "base", "allowed_length", "last_n", "breakers"];
    fn from_spec(args: &Bound<'_>, ctx: &BuildContext<'_>) -> Result<Self> {
        let d = DryParams::default();
        let params = DryParams {
            multiplier: args.f32("multiplier", Some(d.multiplier))?,
            base: args.f32("base", Some(d.base))?,
            allowed_length: args.i32("allowed_length", Some(d.allowed_length))?,
            last_n: args.i32("last_n", Some(d.last_n))?,
        };
        let breakers: Vec<String> = match args.arg("breakers") {
            Some(arg) => serde_json::from_str(&arg.text).map_err(|e| {
                Error::spec(arg.position, format!("dry: `breakers` must be a JSON array of strings ({e})"))
            })?,
            None => DEFAULT_BREAKERS.iter().map(|s| s.to_string()).collect(),
        };
        Dry::new(params, ctx.vocab, &breakers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convention::llama_cpp;
    use crate::rng::RngConfig;

    fn params(multiplier: f32, base: f32, allowed_length: i32, last_n: i32) -> DryParams {
        DryParams { multiplier, base, allowed_length, last_n }
    }

    fn probs_after(dry: &mut Dry, history: &[u32], probs: &[f32]) -> Vec<f32> {
        for &t in history {
            dry.accept(t);
        }
        let logits: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
        let mut c = Candidates::from_logits(&logits).unwrap();
        dry.apply(&mut c).unwrap();
        llama_cpp::softmax(&mut c, false);
        c.as_slice().iter().map(|t| t.p).collect()
    }

    fn assert_close(got: &[f32], expected: &[f32]) {
        assert_eq!(got.len(), expected.len());
        for (g, e) in got.iter().zip(expected) {
            assert!((g - e).abs() < 1e-5, "{got:?} vs {expected:?}");
        }
    }

    /// (probabilities, history, expected probabilities, parameters, restart sequences)
    type DryVector<'a> = (&'a [f32], &'a [u32], &'a [f32], DryParams, &'a [Vec<u32>]);

    /// llama.cpp's tests/test-sampling.cpp DRY vectors (breakers as token ids).
    #[test]
    fn llama_cpp_test_vectors() {
        let q = [0.25f32; 4];
        let f = [0.2f32; 5];
        let cases: &[DryVector<'_>] = &[
            (&q, &[0, 1], &[0.25, 0.25, 0.25, 0.25], params(1.0, 1.1, 2, 4), &[]),
            (&q, &[0, 1, 2, 0, 1], &[0.296923, 0.296923, 0.109232, 0.296923], params(1.0, 1.1, 2, 5), &[]),
            (&f, &[0, 1, 3, 4, 0, 1], &[0.2, 0.2, 0.2, 0.2, 0.2], params(1.0, 1.1, 2, 6), &[vec![3]]),
            (&f, &[0, 1, 2, 0, 1], &[0.241818, 0.241818, 0.032727, 0.241818, 0.241818], params(2.0, 1.1, 2, 5), &[]),
            (&f, &[0, 1, 2, 3, 4, 0, 1], &[0.2, 0.2, 0.2, 0.2, 0.2], params(1.0, 1.1, 4, 7), &[]),
        ];
        for (probs, history, expected, p, breakers) in cases {
            let mut dry = Dry::with_token_breakers(*p, breakers).unwrap();
            assert_close(&probs_after(&mut dry, history, probs), expected);
        }
    }

    /// The example in llama.cpp's comments: "a b c c b c y a b c" gives repeat counts
    /// 0 0 3 1 0 2 0 0 0 0, so c (3), b (1) and y (2) would extend a repetition.
    #[test]
    fn z_algorithm_example_and_exponent_growth() {
        let (a, b, cc, y) = (0u32, 1, 2, 3);
        let history = [a, b, cc, cc, b, cc, y, a, b, cc];
        let mut dry = Dry::with_token_breakers(params(1.0, 2.0, 1, 64), &[]).unwrap();
        for &t in &history {
            dry.accept(t);
        }
        let mut c = Candidates::from_logits(&[0.0; 5]).unwrap();
        dry.apply(&mut c).unwrap();
        let l: Vec<f32> = c.as_slice().iter().map(|t| t.logit).collect();
        // c: 3 -> 2^(3-1) = 4; y: 2 -> 2^(2-1) = 2; b: 1 -> 2^0 = 1; a never follows a match.
        assert_eq!(l, [0.0, -1.0, -4.0, -2.0, 0.0]);
        assert!(!c.is_sorted());
    }

    #[test]
    fn multi_token_restart_sequence_caps_the_repetition() {
        // "0 1 7 8" twice then "0 1": the 6-token repetition is followed by 7. With the
        // restart sequence "7 8" the usable length is only the 2 tokens since its last
        // occurrence, below allowed_length = 3, so nothing is penalised.
        let history = [0u32, 1, 7, 8, 0, 1, 7, 8, 0, 1];
        let mut with = Dry::with_token_breakers(params(1.0, 1.5, 3, 64), &[vec![7, 8]]).unwrap();
        let mut without = Dry::with_token_breakers(params(1.0, 1.5, 3, 64), &[]).unwrap();
        let p_with = probs_after(&mut with, &history, &[0.1; 10]);
        let p_without = probs_after(&mut without, &history, &[0.1; 10]);
        assert!(p_without[7] < 0.09);
        assert_close(&p_with, &[0.1; 10]);
        // A sequence whose tail does not match (8 is not followed by 7) restarts nothing.
        let mut other = Dry::with_token_breakers(params(1.0, 1.5, 3, 64), &[vec![8, 7]]).unwrap();
        assert_close(&probs_after(&mut other, &history, &[0.1; 10]), &p_without);
    }

    #[test]
    fn breakers_from_vocabulary_text() {
        let vocab: Vec<Vec<u8>> =
            ["a", "b", "c", "\n", "x:", "##", "#"].iter().map(|s| s.as_bytes().to_vec()).collect();
        let breakers = vec!["\n".to_string(), ":".to_string(), "###".to_string()];
        let dry = Dry::new(params(1.0, 1.75, 2, 64), Some(&vocab), &breakers).unwrap();
        let r = &dry.restart;
        // "\n" is a breaker; "x:" contains ":".
        assert_eq!(r.get(&3), Some(&vec![vec![]]));
        assert_eq!(r.get(&4), Some(&vec![vec![]]));
        // "##" ends with the prefix "##" of "###" (tail tokenize("#") = [6]) and with the
        // prefix "#" (tail tokenize("##") = [5]); "#" ends with "#": tail [5].
        assert_eq!(r.get(&5), Some(&vec![vec![6], vec![5]]));
        assert_eq!(r.get(&6), Some(&vec![vec![5]]));
        assert_eq!(r.get(&0), None);
    }

    #[test]
    fn single_token_breakers_are_never_penalised_and_stop_the_scan() {
        let vocab: Vec<Vec<u8>> = ["a", "b", "\n", "c"].iter().map(|s| s.as_bytes().to_vec()).collect();
        let breakers: Vec<String> = DEFAULT_BREAKERS.iter().map(|s| s.to_string()).collect();
        // a b \n a b: the newline caps the repetition at 2, which still allows a penalty on
        // "\n" following "a b" — but "\n" is a single-token breaker, so it is exempt.
        let mut dry = Dry::new(params(1.0, 1.75, 2, 64), Some(&vocab), &breakers).unwrap();
        let p = probs_after(&mut dry, &[0, 1, 2, 0, 1], &[0.25; 4]);
        assert_close(&p, &[0.25; 4]);
        // Without the vocabulary the breaker is unknown and "\n" is penalised.
        let mut dry = Dry::new(params(1.0, 1.75, 2, 64), None, &breakers).unwrap();
        let p = probs_after(&mut dry, &[0, 1, 2, 0, 1], &[0.25; 4]);
        assert!(p[2] < 0.2);
    }

    #[test]
    fn huge_exponents_are_clamped_to_a_finite_penalty() {
        let mut dry = Dry::with_token_breakers(params(1.0, 1000.0, 0, 200), &[]).unwrap();
        for _ in 0..150 {
            dry.accept(0);
        }
        let mut c = Candidates::from_logits(&[0.0, 0.0]).unwrap();
        dry.apply(&mut c).unwrap();
        assert!(c.as_slice()[0].logit.is_finite());
        assert!(c.as_slice()[0].logit < -1e30);
        assert_eq!(c.as_slice()[1].logit, 0.0);
    }

    #[test]
    fn inert_parameters_validation_and_spec() {
        assert!(Dry::with_token_breakers(params(0.0, 1.75, 2, 64), &[]).unwrap().is_inert());
        assert!(Dry::with_token_breakers(params(0.8, 0.9, 2, 64), &[]).unwrap().is_inert());
        assert!(Dry::with_token_breakers(params(0.8, 1.75, 2, 0), &[]).unwrap().is_inert());
        assert!(Dry::with_token_breakers(params(0.8, 1.75, 2, -1), &[]).unwrap().is_inert());
        assert_eq!(Dry::with_token_breakers(params(0.8, 1.75, 2, 64), &[]).unwrap().name(), "dry");
        assert!(Dry::with_token_breakers(params(0.8, f32::INFINITY, 2, 64), &[]).is_err());
        assert!(Dry::with_token_breakers(params(0.8, 1.75, -1, 64), &[]).is_err());

        let ctx = BuildContext::new(4, RngConfig::philox(0));
        let spec = crate::params::spec::parse(r#"dry(0.8,1.75,2,64,breakers=["\n","--"])"#).unwrap();
        let bound = spec[0].bind(Dry::PARAMS).unwrap();
        let dry = Dry::from_spec(&bound, &ctx).unwrap();
        assert_eq!(dry.params(), params(0.8, 1.75, 2, 64));
        let spec = crate::params::spec::parse("dry(0.8,breakers=[1])").unwrap();
        let bound = spec[0].bind(Dry::PARAMS).unwrap();
        assert!(Dry::from_spec(&bound, &ctx).unwrap_err().to_string().contains("JSON array"));
    }

    /// Without restart sequences the Z-algorithm must find, for every earlier position, the
    /// longest common suffix with the whole window: checked against a quadratic oracle.
    #[test]
    fn z_algorithm_matches_a_naive_oracle() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |m: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % m) as u32
        };
        for round in 0..300 {
            let n = 2 + next(40) as usize;
            let alphabet = 1 + next(if round % 2 == 0 { 3 } else { 8 }) as u64;
            let history: Vec<u32> = (0..n).map(|_| next(alphabet)).collect();
            let allowed = next(3) as i32;
            let p = params(0.5, 1.3, allowed, 64);
            let mut dry = Dry::with_token_breakers(p, &[]).unwrap();
            for &t in &history {
                dry.accept(t);
            }
            let mut c = Candidates::from_logits(&[0.0f32; 8]).unwrap();
            dry.apply(&mut c).unwrap();
            // Oracle: longest common suffix of history[..=j] and history, for j < n - 1.
            let mut best: IdMap<i32> = IdMap::default();
            if n as i32 > allowed {
                for j in 0..n - 1 {
                    let mut l = 0;
                    while l <= j && history[j - l] == history[n - 1 - l] {
                        l += 1;
                    }
                    if l as i32 >= allowed {
                        let e = best.entry(history[j + 1]).or_insert(l as i32);
                        *e = (*e).max(l as i32);
                    }
                }
            }
            for t in c.as_slice() {
                let expect = best.get(&t.id).map_or(0.0, |&len| {
                    let penalty = (0.5f64 * (1.3f32 as f64).powf((len - allowed) as f64)) as f32;
                    0.0 - penalty
                });
                assert_eq!(t.logit, expect, "{history:?} allowed {allowed}: token {}", t.id);
            }
        }
    }

    #[test]
    fn sparse_and_scanning_paths_agree() {
        let history = [3u32, 9, 4, 3, 9, 4, 3, 9];
        let logits: Vec<f32> = (0..12).map(|i| i as f32 * 0.5 - 2.0).collect();
        let mut dry = Dry::with_token_breakers(params(0.8, 1.75, 2, 64), &[]).unwrap();
        for &t in &history {
            dry.accept(t);
        }
        let mut dense = Candidates::from_logits(&logits).unwrap();
        dry.apply(&mut dense).unwrap();
        let mut shuffled = Candidates::from_logits(&logits).unwrap();
        shuffled.as_mut_slice().reverse();
        dry.apply(&mut shuffled).unwrap();
        let (mut a, mut b) = (vec![0.0; 12], vec![0.0; 12]);
        dense.write_dense(&mut a);
        shuffled.write_dense(&mut b);
        assert_eq!(a, b);
        assert!(a[4] < logits[4]);
    }
}
