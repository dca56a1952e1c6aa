//! `penalties(last_n, repeat, freq, present)`: repetition, frequency and presence penalties
//! over the last `last_n` accepted tokens.
//!
//! llama.cpp convention (`llama_sampler_init_penalties`, commit 0c1e570):
//!
//! * Defaults (common's): `last_n = 64`, `repeat = 1`, `freq = 0`, `present = 0`.
//! * `last_n < 0` is clamped to 0. `last_n == 0`, or `repeat == 1 && freq == 0 && present == 0`,
//!   builds an inert stage (`?penalties`) that also ignores accepted tokens.
//! * State: a window of the last `last_n` accepted tokens and a count per token in it.
//!   Every accepted token enters the window (history/prompt tokens included).
//! * Apply: every candidate whose token has count `c > 0` in the window gets, once regardless
//!   of `c`, its logit multiplied by `repeat` if it is `<= 0` and divided by `repeat` otherwise,
//!   then `c * freq + present` subtracted (all f32, in that order). The `sorted` flag is
//!   cleared (even when no candidate was touched), `p` is left stale.
//!
//! Cost: when the candidates are still in vocabulary order for every token of the window
//! (`data[t].id == t`, the case when penalties run first, as in common's chain) only the
//! window's tokens are touched: O(window), not O(vocab). Otherwise one hash lookup per
//! candidate. Both paths give identical bits.
//!
//! Where tokensieve differs from llama.cpp:
//!
//! * `repeat` must be finite and `> 0`, `freq` and `present` finite: llama.cpp would turn a
//!   positive logit into `+inf` with `repeat == 0` and into NaN with infinite penalties.
//! * The window grows as tokens arrive instead of being allocated at `last_n` up front, so a
//!   huge `last_n` costs nothing until it fills.
//! * `clone` copies the counts with the window (llama.cpp's clone copies only the window, so a
//!   cloned sampler starts with empty counts).
//!
//! Draws: none.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use super::{require_finite, BuildContext, FromSpec, Sampler};
use crate::candidates::{Candidates, TokenData};
use crate::error::{Error, Result};
use crate::params::spec::Bound;

/// A multiplicative hasher for token ids: keys are small dense integers chosen by the model,
/// not by an adversary, so SipHash's DoS resistance buys nothing here and costs a lot per
/// candidate.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// Hash map keyed by token id.
pub(crate) type IdMap<V> = HashMap<u32, V, BuildHasherDefault<IdHasher>>;

/// True when every key's candidate sits at the index equal to its id, so a sparse edit by id
/// reaches exactly the candidates a full scan would (ids in a candidate array are unique).
pub(crate) fn keys_at_own_index<V>(map: &IdMap<V>, data: &[TokenData]) -> bool {
    map.keys().all(|&t| data.get(t as usize).is_some_and(|c| c.id == t))
}

/// Repetition / frequency / presence penalties.
///
/// ```
/// use tokensieve::{Candidates, sampler::{penalties::Penalties, Sampler}};
/// let mut pen = Penalties::new(64, 2.0, 0.5, 0.25).unwrap();
/// pen.accept(1);
/// pen.accept(1);
/// let mut c = Candidates::from_logits(&[1.0, 4.0, -1.0]).unwrap();
/// pen.apply(&mut c).unwrap();
/// // token 1: 4 / 2 - (2 * 0.5 + 0.25)
/// assert_eq!(c.as_slice()[1].logit, 0.75);
/// assert_eq!(c.as_slice()[0].logit, 1.0);
/// ```
#[derive(Clone, Debug)]
pub struct Penalties {
    last_n: usize,
    repeat: f32,
    freq: f32,
    present: f32,
    /// The last `last_n` accepted tokens, oldest first.
    window: VecDeque<u32>,
    /// Token -> occurrences in `window` (only tokens with a count > 0).
    counts: IdMap<u32>,
    /// The occurrences in `window` of the tokens in each slot `token % SLOTS` (empty until
    /// the first token is accepted): a zero answers [`count`](Self::count) without the map.
    slots: Slots,
}

/// [`Penalties`]'s slot counters, with a `Debug` that does not list all 2,048 of them.
#[derive(Clone, Default)]
struct Slots(Vec<u32>);

impl std::fmt::Debug for Slots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Slots({} of {} in use)", self.0.iter().filter(|&&n| n > 0).count(), self.0.len())
    }
}

/// The slots of [`Penalties`]'s filter: 8 KiB of counters, stays in L1.
///
/// PERF: the fast top-k paths look up every gathered entry (about 50 at V = 32,000), and most
/// are not in the window: a map lookup each took 3.7% of llama.cpp's default chain with
/// penalties in a profile at 32k. With the slots first, that chain took 4.17–4.53 µs against
/// 4.24–4.62 (four runs alternating call by call, Intel Xeon). With 64 tokens in the window,
/// about 3% of the other tokens share a slot with one of them and still go to the map.
const SLOTS: usize = 2048;

impl Penalties {
    /// Penalties over the last `last_n` tokens (`< 0` is treated as 0 = off): `repeat` (finite,
    /// `> 0`; 1 = off), `freq` and `present` (finite; 0 = off).
    pub fn new(last_n: i32, repeat: f32, freq: f32, present: f32) -> Result<Self> {
        let repeat = require_finite("penalties", "repeat", repeat)?;
        if repeat <= 0.0 {
            return Err(Error::parameter("penalties", "repeat", format!("must be > 0, got {repeat}")));
        }
        Ok(Penalties {
            last_n: last_n.max(0) as usize,
            repeat,
            freq: require_finite("penalties", "freq", freq)?,
            present: require_finite("penalties", "present", present)?,
            window: VecDeque::new(),
            counts: IdMap::default(),
            slots: Slots::default(),
        })
    }

    #[inline]
    fn penalise(&self, t: &mut TokenData, count: u32) {
        t.logit = self.penalised(t.logit, count);
    }

    /// The logit of a token seen `count > 0` times in the window, after the penalties.
    #[inline]
    pub(crate) fn penalised(&self, mut logit: f32, count: u32) -> f32 {
        if logit <= 0.0 {
            logit *= self.repeat;
        } else {
            logit /= self.repeat;
        }
        // llama.cpp: `float(count) * freq + float(count > 0) * present`, count > 0 here.
        logit - (count as f32 * self.freq + self.present)
    }

    /// `token`'s count in the window, `None` when it is not there.
    #[inline]
    pub(crate) fn count(&self, token: u32) -> Option<u32> {
        // No slots yet: nothing was accepted.
        match self.slots.0.get(token as usize % SLOTS) {
            Some(0) | None => None,
            _ => self.counts.get(&token).copied(),
        }
    }

    /// Whether every logit it edits goes down or stays, whatever the count: `repeat >= 1`
    /// divides the positive ones by it and multiplies the others (f32 rounding cannot take a
    /// quotient or product above the logit), and `freq, present >= 0` subtract a count's
    /// `count * freq + present >= 0`.
    pub(crate) fn lowers(&self) -> bool {
        !self.is_inert() && self.repeat >= 1.0 && self.freq >= 0.0 && self.present >= 0.0
    }

    /// The tokens in the window with their counts, in no particular order (each token once).
    pub(crate) fn counts(&self) -> impl ExactSizeIterator<Item = (u32, u32)> + '_ {
        self.counts.iter().map(|(&t, &c)| (t, c))
    }
}

impl Sampler for Penalties {
    fn name(&self) -> &'static str {
        if self.is_inert() {
            "?penalties"
        } else {
            "penalties"
        }
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        if self.is_inert() {
            return Ok(());
        }
        let data = c.as_mut_slice();
        if keys_at_own_index(&self.counts, data) {
            for (&token, &count) in &self.counts {
                self.penalise(&mut data[token as usize], count);
            }
        } else {
            for t in data.iter_mut() {
                if let Some(&count) = self.counts.get(&t.id) {
                    self.penalise(t, count);
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
        if self.slots.0.is_empty() {
            self.slots.0 = vec![0; SLOTS];
        }
        *self.counts.entry(token).or_insert(0) += 1;
        self.slots.0[token as usize % SLOTS] += 1;
        if self.window.len() >= self.last_n {
            if let Some(old) = self.window.pop_front() {
                if let Some(n) = self.counts.get_mut(&old) {
                    *n -= 1;
                    self.slots.0[old as usize % SLOTS] -= 1;
                    if *n == 0 {
                        self.counts.remove(&old);
                    }
                }
            }
        }
        self.window.push_back(token);
    }

    fn reset(&mut self) {
        self.window.clear();
        self.counts.clear();
        self.slots.0.fill(0);
    }

    fn is_inert(&self) -> bool {
        self.last_n == 0 || (self.repeat == 1.0 && self.freq == 0.0 && self.present == 0.0)
    }
}

impl FromSpec for Penalties {
    const PARAMS: &'static [&'static str] = &["last_n", "repeat", "freq", "present"];
    fn from_spec(args: &Bound<'_>, _: &BuildContext<'_>) -> Result<Self> {
        Penalties::new(
            args.i32("last_n", Some(64))?,
            args.f32("repeat", Some(1.0))?,
            args.f32("freq", Some(0.0))?,
            args.f32("present", Some(0.0))?,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convention::llama_cpp;

    fn probs_after(pen: &mut Penalties, probs: &[f32]) -> Vec<f32> {
        let logits: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
        let mut c = Candidates::from_logits(&logits).unwrap();
        pen.apply(&mut c).unwrap();
        llama_cpp::softmax(&mut c, false);
        c.as_slice().iter().map(|t| t.p).collect()
    }

    fn close(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-5)
    }

    /// (history, expected probabilities, repeat, freq, present)
    type PenaltyVector<'a> = (&'a [u32], [f32; 5], f32, f32, f32);

    /// llama.cpp's tests/test-sampling.cpp penalty vectors (window = the history length).
    #[test]
    fn llama_cpp_test_vectors() {
        let flat = [0.2f32; 5];
        let cases: &[PenaltyVector<'_>] = &[
            (&[0], [0.0, 0.25, 0.25, 0.25, 0.25], 50.0, 0.0, 0.0),
            (&[0, 1, 2], [0.0, 0.0, 0.0, 0.5, 0.5], 50.0, 0.0, 0.0),
            (&[0, 1, 2, 0, 0], [0.0, 0.0, 0.0, 0.5, 0.5], 50.0, 0.0, 0.0),
            (&[0], [0.000011, 0.249997, 0.249997, 0.249997, 0.249997], 1.0, 5.0, 5.0),
            (&[0, 1, 2], [0.000023, 0.000023, 0.000023, 0.499966, 0.499966], 1.0, 5.0, 5.0),
            (&[0, 1, 2, 0, 0], [0.0, 0.000023, 0.000023, 0.499977, 0.499977], 1.0, 5.0, 5.0),
        ];
        for (history, expected, repeat, freq, present) in cases {
            let mut pen = Penalties::new(history.len() as i32, *repeat, *freq, *present).unwrap();
            for &t in *history {
                pen.accept(t);
            }
            let got = probs_after(&mut pen, &flat);
            assert!(close(&got, expected), "{history:?}: {got:?} vs {expected:?}");
        }
    }

    /// `count` is the window's count of the token, through windows that slide, tokens that
    /// share a slot (ids `SLOTS` apart) and a reset, against a plain count of the window.
    #[test]
    fn count_is_the_windows_count_with_shared_slots() {
        let mut state = 0x853c_49e6_748f_ea9bu64;
        for last_n in [1, 3, 64, 200] {
            let mut pen = Penalties::new(last_n, 1.1, 0.1, 0.1).unwrap();
            assert_eq!(pen.count(5), None, "nothing accepted");
            let mut window: VecDeque<u32> = VecDeque::new();
            for step in 0..1500 {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                // A few slots, each shared by four ids.
                let token = ((state >> 40) % 6) as u32 + SLOTS as u32 * ((state >> 50) % 4) as u32;
                if step == 700 {
                    pen.reset();
                    window.clear();
                }
                pen.accept(token);
                window.push_back(token);
                if window.len() > last_n as usize {
                    window.pop_front();
                }
                // The counters print as a summary, not 2,048 numbers.
                assert!(format!("{:?}", pen.slots).starts_with("Slots("));
                for probe in (0..8).flat_map(|t| (0..4).map(move |k| t + SLOTS as u32 * k)) {
                    let n = window.iter().filter(|&&t| t == probe).count() as u32;
                    assert_eq!(pen.count(probe), (n > 0).then_some(n), "last_n {last_n}, step {step}, token {probe}");
                }
            }
        }
    }

    #[test]
    fn window_forgets_old_tokens() {
        let mut pen = Penalties::new(2, 2.0, 0.0, 0.0).unwrap();
        for t in [0, 1, 2] {
            pen.accept(t);
        }
        let mut c = Candidates::from_logits(&[4.0, 4.0, 4.0]).unwrap();
        pen.apply(&mut c).unwrap();
        let l: Vec<f32> = c.as_slice().iter().map(|t| t.logit).collect();
        assert_eq!(l, [4.0, 2.0, 2.0]);
        assert_eq!(pen.counts.len(), 2);
    }

    #[test]
    fn negative_logits_are_multiplied_and_sorted_is_cleared() {
        let mut pen = Penalties::new(8, 1.5, 0.0, 0.0).unwrap();
        pen.accept(0);
        pen.accept(1);
        let mut c = Candidates::from_logits(&[-2.0, 3.0, 0.0]).unwrap();
        c.set_sorted(true);
        pen.apply(&mut c).unwrap();
        let l: Vec<f32> = c.as_slice().iter().map(|t| t.logit).collect();
        assert_eq!(l, [-3.0, 2.0, 0.0]);
        assert!(!c.is_sorted());
    }

    #[test]
    fn sparse_and_scanning_paths_agree() {
        let logits: Vec<f32> = (0..200).map(|i| ((i * 37) % 23) as f32 - 11.0).collect();
        let mut pen = Penalties::new(16, 1.3, 0.2, 0.1).unwrap();
        for t in [5u32, 7, 5, 199, 0, 42, 5, 300] {
            pen.accept(t);
        }
        // Dense, vocab order: sparse path (token 300 is not a candidate, so it must fall back).
        let mut dense = Candidates::from_logits(&logits).unwrap();
        pen.apply(&mut dense).unwrap();
        // Reversed order: scanning path.
        let mut shuffled = Candidates::from_logits(&logits).unwrap();
        shuffled.as_mut_slice().reverse();
        pen.apply(&mut shuffled).unwrap();
        let mut a = vec![0.0; 200];
        let mut b = vec![0.0; 200];
        dense.write_dense(&mut a);
        shuffled.write_dense(&mut b);
        assert_eq!(
            a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            b.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        // Without the out-of-range token the sparse path is taken.
        let mut pen2 = Penalties::new(16, 1.3, 0.2, 0.1).unwrap();
        for t in [5u32, 7, 5, 199, 0, 42, 5] {
            pen2.accept(t);
        }
        let mut d2 = Candidates::from_logits(&logits).unwrap();
        assert!(keys_at_own_index(&pen2.counts, d2.as_slice()));
        pen2.apply(&mut d2).unwrap();
        let mut c2 = vec![0.0; 200];
        d2.write_dense(&mut c2);
        assert_eq!(
            a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            c2.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn inert_parameters_and_validation() {
        assert!(Penalties::new(0, 1.5, 0.0, 0.0).unwrap().is_inert());
        assert!(Penalties::new(-3, 1.5, 0.0, 0.0).unwrap().is_inert());
        assert!(Penalties::new(64, 1.0, 0.0, 0.0).unwrap().is_inert());
        assert_eq!(Penalties::new(64, 1.0, 0.0, 0.0).unwrap().name(), "?penalties");
        assert_eq!(Penalties::new(64, 1.1, 0.0, 0.0).unwrap().name(), "penalties");
        assert!(Penalties::new(64, 0.0, 0.0, 0.0).is_err());
        assert!(Penalties::new(64, -1.0, 0.0, 0.0).is_err());
        assert!(Penalties::new(64, 1.0, f32::INFINITY, 0.0).is_err());
    }

    #[test]
    fn reset_clears_the_window() {
        let mut pen = Penalties::new(4, 2.0, 0.0, 0.0).unwrap();
        pen.accept(0);
        pen.reset();
        let mut c = Candidates::from_logits(&[2.0, 1.0]).unwrap();
        pen.apply(&mut c).unwrap();
        assert_eq!(c.as_slice()[0].logit, 2.0);
    }
}
