//! Logprobs of the sampled token and its top-N alternatives.
//!
//! * [`LogprobsMode::Raw`]: log-softmax of the **input row** over the full vocabulary (no
//!   penalty, bias, temperature or truncation), as llama.cpp's server reports by default and
//!   vLLM's `raw_logprobs`. The top N are found by partial selection, never by sorting the
//!   vocabulary: one SIMD pass gives the maximum of every block of 64 entries; the N-th
//!   largest block maximum is a lower bound of the N-th best logit, so only the blocks that
//!   reach it (about N) are read, and their entries at or above it are ranked by integer keys.
//! * [`LogprobsMode::Processed`]: log-softmax over the candidates the chain left (finite
//!   logits only), i.e. the distribution the final stage drew from (llama.cpp's
//!   `post_sampling_probs`, vLLM's `processed_logprobs`).
//!
//! Raw mode's normaliser is llama-server's softmax sum, bit for bit: its
//! `get_token_probabilities(ctx, idx, n)` (called with the request's `n_probs`) partially
//! sorts the top `n` of an `(id, logit)` array to the front with `std::partial_sort`, then adds
//! `expf(logit - max)` in f32 over the whole array in that order: the top `n` in descending
//! order, then the row in id order but where libstdc++'s heap select swapped an entry into the
//! heap (there the value it pushed out). With `n = 0` there is no sort and the row is summed in
//! id order. The sum is formed without building the array: when it cannot depend on the order
//! of its terms, over the row less its top `n` (the entries that can change it gathered from
//! the blocks that hold them, by the AVX2 or AVX-512 kernels), else over the row patched
//! where the heap select swapped ([`arch::exp_sum_sequential_patched`]); either
//! way only the entries that can change it are exponentiated. `logprob = logit - max - ln(sum)`
//! in f64.
//! Processed mode sums f64 exponentials.
//!
//! That f32 sum is short of the exact one by the row's tail: once the running sum holds the
//! maximum's weight 1 (with `n >= 1`, from the start), each weight below half an ulp of it
//! (`logit - max` below about -16.6) leaves it unchanged, however many there are. On
//! language-model-like rows (`bench_rows` peaked, entropy 1.5 nats, `n = 20`) the shortfall
//! is `1.5e-5` of the sum at V = 32,000 and 128,256 and `1.3e-6` at 262,144, so raw logprobs
//! sit that many nats above the exact log-softmax, exactly as llama-server's do. An exact sum
//! costs one accurate exponential per entry (about six max passes with AVX-512); this one
//! exponentiates only the entries that change it. Ties in the top N are broken by the lower
//! token id. A token outside the processed set has logprob `-inf`.

use crate::arch::{self, BLOCK};
use crate::candidates::Candidates;
use crate::logits::Logits;

/// Which distribution logprobs are reported from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogprobsMode {
    /// Log-softmax of the input row.
    #[default]
    Raw,
    /// Log-softmax over the candidates left after the chain.
    Processed,
}

/// A token and its natural-log probability.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct TokenLogprob {
    /// Token id.
    pub token: u32,
    /// ln p.
    pub logprob: f32,
}

/// The result of [`Chain::sample_with_logprobs`](crate::Chain::sample_with_logprobs).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Sampled {
    /// The sampled token.
    pub token: u32,
    /// Its logprob in the requested mode.
    pub logprob: f32,
    /// The most likely tokens, most likely first.
    pub top_logprobs: Vec<TokenLogprob>,
}

/// Keeps the `n` best entries of `top` (ranked by the `logprob` field, which holds the raw
/// logit until [`finish`] turns it into a logprob), best first, ties to the lower id. Never
/// allocates once `top` has capacity `n + 1`.
fn push_top(top: &mut Vec<TokenLogprob>, n: usize, logit: f32, id: u32) {
    if n == 0 {
        return;
    }
    let better = |a: (f32, u32), b: (f32, u32)| a.0 > b.0 || (a.0 == b.0 && a.1 < b.1);
    if top.len() == n && !better((logit, id), (top[n - 1].logprob, top[n - 1].token)) {
        return;
    }
    let pos = top.partition_point(|e| better((e.logprob, e.token), (logit, id)));
    if top.len() == n {
        top.pop();
    }
    top.insert(pos, TokenLogprob { token: id, logprob: logit });
}

/// Turns the logits kept by [`push_top`] into logprobs given the log-sum-exp.
fn finish(top: &mut [TokenLogprob], lse: f64) {
    for t in top {
        t.logprob = (t.logprob as f64 - lse) as f32;
    }
}

fn prepare(out: &mut Vec<TokenLogprob>, n: usize) {
    out.clear();
    out.reserve(n + 1);
}

/// Raw mode: returns the logprob of `token` and fills `out` with the top `n`.
pub fn raw(row: Logits<'_>, token: u32, n: usize, out: &mut Vec<TokenLogprob>) -> f32 {
    thread_local! {
        /// Reused: no allocation after the first rows of a size.
        static SCRATCH: std::cell::RefCell<RawScratch> = std::cell::RefCell::default();
    }
    prepare(out, n);
    SCRATCH.with_borrow_mut(|s| {
        // f16/bf16 rows are widened into a reused buffer in the pass that takes their block
        // maxima (one pass over memory instead of two).
        let mut widened = std::mem::take(&mut s.widened);
        let (r, max): (&[f32], f32) = match row {
            Logits::F32(r) => {
                s.block_max.resize(r.len().div_ceil(BLOCK), f32::NEG_INFINITY);
                (r, arch::block_max_into(r, &mut s.block_max))
            }
            _ => {
                let (summary, at) = arch::widen_summarize_aligned(row, &mut widened, &mut s.block_max)
                    .expect("a half-precision row widens");
                (&widened[at], summary.max)
            }
        };
        let logprob = raw_f32(r, max, token, n, s, out);
        s.widened = widened;
        logprob
    })
}

/// [`raw`] written the obvious way, for any element type: the oracle the fast paths are
/// tested against. The normaliser is llama-server's `get_token_probabilities(ctx, idx, n)`
/// step by step: libstdc++'s `partial_sort` of the top `n` (an array of `(id, logit)` in id
/// order), then the f32 sum of `expf(logit - max)` in the array's order.
#[cfg(test)]
fn raw_generic(row: Logits<'_>, token: u32, n: usize, out: &mut Vec<TokenLogprob>) -> f32 {
    use crate::candidates::TokenData;
    let mut cur = Vec::new();
    row.for_each(|i, v| cur.push(TokenData { id: i as u32, logit: v, p: 0.0 }));
    let n_top = n.min(cur.len());
    let max = if n_top > 0 {
        crate::stdsort::partial_sort(&mut cur, n_top, crate::convention::llama_cpp::desc);
        cur[0].logit
    } else {
        cur.iter().fold(f32::NEG_INFINITY, |m, t| m.max(t.logit))
    };
    let mut sum = 0.0f32;
    for t in &cur {
        sum += (t.logit - max).exp();
    }
    prepare(out, n);
    row.for_each(|i, v| push_top(out, n, v, i as u32));
    let lse = max as f64 + (sum as f64).ln();
    finish(out, lse);
    (row.get(token as usize) as f64 - lse) as f32
}

/// [`raw`] on an f32 row whose maximum `max` and block maxima (`s.block_max`) were taken: the
/// top `n` from the few blocks that can hold one, then the sum ([`ServerOrder::sum`]), which
/// skips the blocks and entries that cannot change it. The same values as the obvious
/// implementation.
fn raw_f32(r: &[f32], max: f32, token: u32, n: usize, s: &mut RawScratch, out: &mut Vec<TokenLogprob>) -> f32 {
    top_from_blocks(r, max, n, s, out);
    let sum = s.order.sum(r, max, &s.block_max, out);
    let lse = max as f64 + (sum as f64).ln();
    finish(out, lse);
    (r[token as usize] as f64 - lse) as f32
}

/// A raw bound for a threshold on divided values: every `x` with `fl32(x / div) >= threshold`
/// (`div > 0`, `threshold` finite or `-inf`) is at least the returned value
/// ([`undivided_floor`](crate::convention::llama_cpp::dense::undivided_floor), rounded down).
pub(crate) fn raw_bound(threshold: f32, div: f32) -> f32 {
    use crate::convention::llama_cpp::dense::{f32_at_most, undivided_floor};
    f32_at_most(undivided_floor(threshold as f64, div))
}

/// [`raw`]'s buffers, kept per thread.
#[derive(Default)]
struct RawScratch {
    /// The row's block maxima.
    block_max: Vec<f32>,
    /// An f16/bf16 row widened.
    widened: Vec<f32>,
    /// The summation order's buffers.
    order: ServerOrder,
    /// The top-`n` bound's gap below the maximum that worked for the previous row.
    gap: f32,
    /// The entries that can be in the top `n`, and their sort keys.
    candidates: Vec<crate::candidates::TokenData>,
    keys: Vec<u64>,
}

/// llama-server's summation order for raw probabilities, without building its array.
///
/// `get_token_probabilities(ctx, idx, n)` fills an array with `(id, logit)` in id order, runs
/// `std::partial_sort` of its first `n` by descending logit, and sums `expf(logit - max)` over
/// the array in order. libstdc++'s `partial_sort` is a heap select: a min-heap of the first `n`
/// entries, then for each later position `i`, if `logit[i]` is greater than the heap's least
/// `m`, the entry at `i` and the heap's least trade places; finally the heap is sorted into
/// the first `n` slots. So the summed sequence is the top `n` logits in descending order, then,
/// for `i >= n`, `min(logit[i], m_i)` with `m_i` the least of the heap when `i` is reached:
/// the row itself but at the positions where an entry entered the heap. Only values matter
/// (equal logits have equal weights), so the order of ties is irrelevant.
///
/// The sum starts with the top `n`, which hold the maximum's weight 1, so from then on only
/// weights above about `e^-16.6` of the maximum's can change it (in row order, everything
/// before the maximum counts down to the running sum's smaller ulp). And the rest of the
/// sequence is a permutation of the row without its top `n`: when that sum cannot depend on
/// the order ([`arch::exp_sum_unordered`]: no weight a tie, no change of binade), it is taken
/// over the row in row order, with the top `n` taken out. Otherwise [`ServerOrder::scan`] runs
/// the heap select on values and records where the sequence differs from the row, as patches
/// for [`arch::exp_sum_sequential_patched`].
#[derive(Debug, Default)]
pub(crate) struct ServerOrder {
    /// The heap select's min-heap of values.
    heap: Vec<f32>,
    /// `(position, value)` where the summed sequence differs from the row.
    patches: Vec<(u32, f32)>,
    /// Gathers the terms that can change the sum, when the order cannot
    /// ([`ServerOrder::sum_collected`]).
    collector: arch::Collector,
    /// Where the gathered values at or above the top's least are.
    hits: Vec<u32>,
}

impl ServerOrder {
    /// llama-server's f32 softmax sum of `r` (its maximum `max`, block maxima `block_max`),
    /// given `top`, its top `n` by logit, best first (the logits in the `logprob` fields, as
    /// [`push_top`] keeps them; `n` at most `r.len()`). `n = 0` sums the row as it is.
    pub(crate) fn sum(&mut self, r: &[f32], max: f32, block_max: &[f32], top: &[TokenLogprob]) -> f32 {
        let n = top.len();
        if n == 0 {
            return arch::exp_sum_sequential(0.0, r, max, block_max);
        }
        if max == f32::NEG_INFINITY {
            return f32::NAN; // expf(-inf - -inf), as llama.cpp computes it
        }
        let mut sum = 0.0f32;
        for t in top {
            sum += (t.logprob - max).exp();
        }
        if n == r.len() {
            return sum;
        }
        if let Some(total) = self.rest_unordered(r, 1.0, max, block_max, top, sum) {
            return total;
        }
        self.scan(r, block_max, n);
        arch::exp_sum_sequential_patched(sum, r, max, block_max, &self.patches)
    }

    /// `start` plus `expf(x - max)` for every entry `x` of `r` outside `top` (by token; the
    /// logits in the `logprob` fields, best first, and every entry of `r` above the least of
    /// them among them, as many equal to it as `top` holds), when no order of those additions
    /// can change the f32 sum ([`arch::exp_sum_unordered`]); `None` when one may. Every
    /// sequence that starts from `start` and adds those weights in some order then ends on it:
    /// llama-server's order, or the descending order of a full sort.
    ///
    /// With `div != 1` (a temperature before the stage that sums), the row's entries are
    /// `fl32(x / div)` for the entries `x` of `r` (`block_max` being `r`'s), as llama.cpp's
    /// temperature leaves them, and `max` and `top` are in those terms; the entries that can
    /// change the sum are gathered from `r` above a raw bound ([`raw_bound`]) and divided.
    /// `None` then without the collector's kernels.
    pub(crate) fn rest_unordered(
        &mut self,
        r: &[f32],
        div: f32,
        max: f32,
        block_max: &[f32],
        top: &[TokenLogprob],
        start: f32,
    ) -> Option<f32> {
        if top.len() == r.len() {
            return Some(start);
        }
        let threshold = arch::skip_threshold(max, arch::log_half_ulp(start));
        let raw = if div == 1.0 { threshold } else { raw_bound(threshold, div) };
        if !top.is_empty() && self.collector.start(block_max, raw) {
            self.sum_collected(r, div, max, top, start, raw)
        } else if div != 1.0 {
            None
        } else {
            self.patches.clear();
            self.patches.extend(top.iter().map(|t| (t.token, f32::NEG_INFINITY)));
            self.patches.sort_unstable_by_key(|p| p.0);
            arch::exp_sum_unordered(start, r, max, block_max, &self.patches)
        }
    }

    /// The sum from `start` (the top's) over the row less its top `n`, when no order of its
    /// terms can change it: chunk by chunk over the entries at or above `threshold` (the
    /// sum's own, which [`arch::Collector::start`] was given), each chunk added in any order
    /// ([`arch::exp_sum_unordered_values`], from the sum so far, whose binade is `start`'s).
    /// `None` as soon as a chunk shows that the order matters.
    ///
    /// The top `n` are taken out by value: every gathered value above the n-th largest (all of
    /// them are in the top), and as many equal to it as the top holds. An entry the sum can
    /// see is gathered wherever it occurs, so the counts match; one below the threshold adds
    /// nothing and is not there.
    fn sum_collected(
        &mut self,
        r: &[f32],
        div: f32,
        max: f32,
        top: &[TokenLogprob],
        start: f32,
        threshold: f32,
    ) -> Option<f32> {
        let last = top[top.len() - 1].logprob;
        let mut ties = top.iter().rev().take_while(|t| t.logprob == last).count();
        let mut sum = start;
        loop {
            let chunk = self.collector.next(r, threshold);
            if chunk.is_empty() {
                return Some(sum);
            }
            if div != 1.0 {
                // The temperature's values, as llama.cpp divides them (the padding stays -inf).
                chunk.iter_mut().for_each(|x| *x /= div);
            }
            self.hits.clear();
            arch::positions_ge(chunk, last, &mut self.hits);
            for &i in &self.hits {
                let x = &mut chunk[i as usize];
                if *x > last || ties > 0 {
                    ties -= usize::from(*x == last);
                    *x = f32::NEG_INFINITY;
                }
            }
            sum = arch::exp_sum_unordered_values(sum, chunk, max)?;
        }
    }

    /// Runs the heap select over `r` and leaves in `patches` where the summed sequence differs
    /// from the row: the first `n` positions (`-inf`, adding nothing: the top `n` come first),
    /// then each position where an entry entered the heap (the least it pushed out).
    fn scan(&mut self, r: &[f32], block_max: &[f32], n: usize) {
        self.heap.clear();
        self.heap.extend_from_slice(&r[..n]);
        for i in (0..n / 2).rev() {
            sift_down(&mut self.heap, i);
        }
        self.patches.clear();
        self.patches.extend((0..n as u32).map(|i| (i, f32::NEG_INFINITY)));
        for (g, group) in block_max.chunks(SKIP_GROUP).enumerate() {
            // `x > least` is `!(x < least.next_up())`: rows are NaN-free here.
            if !any_not_below(group, self.heap[0].next_up()) {
                continue;
            }
            for (j, &bm) in group.iter().enumerate() {
                if bm <= self.heap[0] {
                    continue;
                }
                let start = ((g * SKIP_GROUP + j) * BLOCK).max(n); // the first `n` are the heap's
                let end = r.len().min((g * SKIP_GROUP + j + 1) * BLOCK);
                if start >= end {
                    continue;
                }
                // The least only rises while the block is read: each hit is tested again.
                arch::for_each_ge(&r[start..end], self.heap[0].next_up(), |i, x| {
                    if x > self.heap[0] {
                        self.patches.push(((start + i) as u32, self.heap[0]));
                        self.heap[0] = x;
                        sift_down(&mut self.heap, 0);
                    }
                });
            }
        }
    }
}

/// Restores the min-heap property of `heap` below position `i` (values are NaN-free).
fn sift_down(heap: &mut [f32], mut i: usize) {
    loop {
        let (l, r) = (2 * i + 1, 2 * i + 2);
        let mut least = i;
        if l < heap.len() && heap[l] < heap[least] {
            least = l;
        }
        if r < heap.len() && heap[r] < heap[least] {
            least = r;
        }
        if least == i {
            return;
        }
        heap.swap(i, least);
        i = least;
    }
}

/// Fills `out` (empty) with the top `n` of the row `r` (its maximum `max`, its block maxima in
/// `s`), best first, ties to the lower id, as [`push_top`] keeps them.
///
/// Every block holds an entry equal to its maximum, so when `n` block maxima reach `tau`, the
/// row has `n` entries at or above it: an entry below `tau` is beaten by all of them and cannot
/// be in the top `n`. Only the blocks whose maximum reaches `tau` (not many more than `n`, see
/// [`block_threshold`]) are read; their entries at or above `tau` are ranked by one integer
/// key each (value descending, then id) and the `n` smallest keys are the top `n`.
///
/// PERF: inserting each candidate into a sorted top (a binary search and a shift each) cost
/// about as much as the block maxima pass at V = 32,000.
fn top_from_blocks(r: &[f32], max: f32, n: usize, s: &mut RawScratch, out: &mut Vec<TokenLogprob>) {
    if n == 0 {
        return;
    }
    let tau = block_threshold(&s.block_max, n, max, &mut s.gap);
    if tau == f32::NEG_INFINITY {
        // Fewer blocks than `n`, or no finite maximum: every entry is a candidate.
        for (i, &v) in r.iter().enumerate() {
            push_top(out, n, v, i as u32);
        }
        return;
    }
    s.candidates.clear();
    arch::gather_blocks_ge(r, &s.block_max, tau, &mut s.candidates);
    // `total_order_key` ranks -0.0 below +0.0, which `push_top` holds equal: `+ 0.0` makes
    // both +0.0.
    let key = |v: f32, id: u32| (u64::from(!crate::candidates::total_order_key(v + 0.0)) << 32) | u64::from(id);
    s.keys.clear();
    s.keys.extend(s.candidates.iter().map(|t| key(t.logit, t.id)));
    debug_assert!(s.keys.len() >= n);
    if s.keys.len() > n {
        s.keys.select_nth_unstable(n - 1);
        s.keys.truncate(n);
    }
    crate::arch::sort_keys(&mut s.keys);
    out.extend(s.keys.iter().map(|&k| TokenLogprob { token: k as u32, logprob: r[k as u32 as usize] }));
}

/// A `tau` that at least `n` of the block `maxima` reach, and not many more than `n` do:
/// `max - gap` for the `gap` that worked for the previous row (kept by the caller), checked by
/// counting the maxima (one SIMD pass over them), else bisected ([`arch::settle_gap`]). `-inf`
/// (every block is read) when no gap gives `n` or there are fewer than `n` blocks.
///
/// PERF: keeping the `n` largest block maxima sorted instead cost more than the rest of the
/// top-`n` search (an insertion per new candidate; 2 µs of 15 at V = 128k).
fn block_threshold(maxima: &[f32], n: usize, max: f32, gap: &mut f32) -> f32 {
    if maxima.len() < n || !max.is_finite() {
        return f32::NEG_INFINITY;
    }
    let start = if gap.is_finite() && *gap > 0.0 { *gap } else { 4.0 };
    match arch::settle_gap(maxima, n, max, start) {
        Some(hi) => {
            *gap = hi;
            max - hi
        }
        None => {
            *gap = 4.0;
            f32::NEG_INFINITY
        }
    }
}

/// Block maxima that [`ServerOrder::scan`] tests at once before visiting any of them one by
/// one.
const SKIP_GROUP: usize = 16;

/// Whether some `x` of `xs` is not below `t` (`!(x < t)`: NaN counts). PERF: no early exit, so
/// the loop compiles to vector compares, and on a language-model row nearly every group of
/// block maxima is below the top-n bound: one predictable branch per group instead of one per
/// block.
#[inline]
fn any_not_below(xs: &[f32], t: f32) -> bool {
    xs.iter().fold(false, |any, &x| any | (x >= t) | x.is_nan())
}

/// Processed mode: over the finite candidates left in `c`.
pub fn processed(c: &Candidates, token: u32, n: usize, out: &mut Vec<TokenLogprob>) -> f32 {
    let finite = || c.as_slice().iter().filter(|t| t.logit > f32::NEG_INFINITY);
    let max = finite().map(|t| t.logit).fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    prepare(out, n);
    let mut token_logit = f32::NEG_INFINITY;
    for t in finite() {
        sum += ((t.logit - max) as f64).exp();
        push_top(out, n, t.logit, t.id);
        if t.id == token {
            token_logit = t.logit;
        }
    }
    let lse = max as f64 + sum.ln();
    finish(out, lse);
    (token_logit as f64 - lse) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`raw_bound`] is a bound: the float just below it divides to below the threshold (so
    /// does every smaller one, division and rounding being monotone), over thresholds of
    /// every sign and magnitude down to subnormals and zero, and temperatures far from 1. And
    /// it is close: within a few ulps of `threshold · div` where that is in range.
    #[test]
    fn the_raw_bound_lies_below_every_entry_that_reaches_the_threshold() {
        let mut rng = tokensieve_testkit::generate::SplitMix64::new(5);
        for i in 0..200_000 {
            let threshold = match i % 4 {
                0 => f32::from_bits(rng.next_u64() as u32 & 0x7fff_ffff) * if i % 8 == 0 { 1.0 } else { -1.0 },
                1 => (rng.next_f64() * 200.0 - 100.0) as f32,
                2 => f32::from_bits(rng.below(1 << 24) as u32) * if i % 8 == 2 { 1.0 } else { -1.0 },
                _ => [0.0, -0.0, f32::MIN_POSITIVE, -f32::MIN_POSITIVE][rng.below(4)],
            };
            let div = [0.8f32, 0.3, 3.0, 7.0, 0.999, 1.5, 1e-3, 1e3][rng.below(8)];
            if !threshold.is_finite() {
                continue;
            }
            let b = raw_bound(threshold, div);
            assert!(b.next_down() / div < threshold, "threshold {threshold:e} div {div}: {b:e}");
            let exact = threshold as f64 * div as f64;
            // (Past f32's range the bound is the largest float.)
            assert!(
                exact.abs() > f32::MAX as f64
                    || (b as f64 - exact).abs()
                        <= exact.abs() * 2f64.powi(-20) + 2f64.powi(-146) * div as f64 + 2f64.powi(-148),
                "threshold {threshold:e} div {div}: {b:e} is loose"
            );
        }
        assert_eq!(raw_bound(f32::NEG_INFINITY, 0.8), f32::NEG_INFINITY);
    }

    #[test]
    fn raw_matches_a_direct_log_softmax() {
        let row = [1.0f32, 3.0, 2.0, 3.0, f32::NEG_INFINITY];
        let mut top = Vec::new();
        let lp = raw(Logits::from(&row[..]), 2, 3, &mut top);
        let z: f64 = row.iter().map(|&v| (v as f64).exp()).sum::<f64>().ln();
        assert!((lp as f64 - (2.0 - z)).abs() < 1e-6);
        assert_eq!(top.iter().map(|t| t.token).collect::<Vec<_>>(), [1, 3, 2]);
        let total: f64 = row.iter().map(|&v| ((v as f64) - z).exp()).sum();
        assert!((total - 1.0).abs() < 1e-12);
    }

    #[test]
    fn raw_fast_path_and_half_rows_match_the_generic_loop() {
        use proptest::prelude::*;
        let value = prop_oneof![
            6 => -30.0f32..30.0,
            2 => proptest::sample::select(vec![0.0f32, -0.0, 1.0, 3.5, 7.25]),
            1 => Just(f32::NEG_INFINITY),
        ];
        let row = prop_oneof![1..=70usize, 60..=3000usize, 9000..=20_000usize]
            .prop_flat_map(move |len| proptest::collection::vec(value.clone(), len));
        let bits = |v: &[TokenLogprob]| v.iter().map(|t| (t.token, t.logprob.to_bits())).collect::<Vec<_>>();
        tokensieve_testkit::proptest_support::check(
            "raw_logprobs_generic",
            128,
            (row, any::<prop::sample::Index>(), 0usize..30),
            |(row, token, n)| {
                if row.iter().all(|&x| x == f32::NEG_INFINITY) {
                    return Ok(());
                }
                let token = token.index(row.len()) as u32;
                let h: Vec<half::f16> = row.iter().map(|&x| half::f16::from_f32(x)).collect();
                let b: Vec<half::bf16> = row.iter().map(|&x| half::bf16::from_f32(x)).collect();
                for l in [Logits::F32(&row), Logits::F16(&h), Logits::Bf16(&b)] {
                    let (mut fast, mut slow) = (Vec::new(), Vec::new());
                    let a = raw(l, token, n, &mut fast);
                    let e = raw_generic(l, token, n, &mut slow);
                    prop_assert_eq!(a.to_bits(), e.to_bits());
                    prop_assert_eq!(bits(&fast), bits(&slow));
                }
                Ok(())
            },
        );
    }

    /// Rows of more than one chunk of block maxima, with many ties, and `n` up to 100 (the
    /// block threshold's remembered gap carried from one row and `n` to the next).
    #[test]
    fn raw_fast_path_matches_the_generic_loop_on_long_rows() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) as u32
        };
        for len in [262_144usize, 262_145, 600_000] {
            // Quarter steps over [-40, 24): thousands of exact ties, the best ones included.
            let row: Vec<f32> = (0..len).map(|_| (next() % 256) as f32 * 0.25 - 40.0).collect();
            for n in [1usize, 20, 64, 65, 100] {
                let token = next() % len as u32;
                let (mut fast, mut slow) = (Vec::new(), Vec::new());
                let a = raw(Logits::F32(&row), token, n, &mut fast);
                let e = raw_generic(Logits::F32(&row), token, n, &mut slow);
                assert_eq!(a.to_bits(), e.to_bits(), "len {len}, n {n}");
                assert_eq!(fast, slow, "len {len}, n {n}");
            }
        }
    }

    /// llama-server's f32 sum drops a tail of weights below half an ulp of the running sum, and
    /// raw logprobs follow it (the module docs): its partial sort puts the maximum's weight 1
    /// first, after which 100,000 weights of `e^-18` add nothing in f32, while they add 0.15%
    /// to the exact sum. With `n = 0` there is no partial sort and the row is summed in id
    /// order: the weights before the maximum (here all of them) count while the sum is small.
    #[test]
    fn raw_logprobs_keep_llama_server_s_f32_sum_and_its_order() {
        let mut row = vec![-18.0f32; 100_001];
        row[100_000] = 0.0;
        let mut top = Vec::new();
        let lp = raw(Logits::from(&row[..]), 100_000, 1, &mut top);
        assert_eq!(lp, 0.0, "the f32 sum is exactly 1");
        assert_eq!(top, [TokenLogprob { token: 100_000, logprob: 0.0 }]);
        let exact = -(1.0 + 100_000.0 * (-18.0f64).exp()).ln();
        assert!((exact + 0.0015).abs() < 1e-4, "{exact}");
        let in_id_order = raw(Logits::from(&row[..]), 100_000, 0, &mut top);
        assert!((in_id_order as f64 - exact).abs() < 2e-5, "{in_id_order} against {exact}");
        assert_eq!(in_id_order, raw_generic(Logits::from(&row[..]), 100_000, 0, &mut top));
    }

    /// `-0.0` and `+0.0` are equal logits, so their order in the top is by id, as in the
    /// obvious loop (the fast path ranks by integer keys, where they differ unless made equal).
    #[test]
    fn signed_zeros_tie_in_the_top_and_the_lower_id_goes_first() {
        let mut row = vec![-5.0f32; 300];
        row[200] = 0.0;
        row[3] = -0.0;
        for n in [1, 2, 5] {
            let (mut fast, mut slow) = (Vec::new(), Vec::new());
            raw(Logits::from(&row[..]), 0, n, &mut fast);
            raw_generic(Logits::from(&row[..]), 0, n, &mut slow);
            assert_eq!(fast[0].token, 3, "n = {n}");
            assert_eq!(fast, slow, "n = {n}");
        }
    }

    #[test]
    fn processed_ignores_masked_candidates() {
        let c = Candidates::from_logits(&[0.0f32, f32::NEG_INFINITY, 0.0]).unwrap();
        let mut top = Vec::new();
        let lp = processed(&c, 0, 5, &mut top);
        assert!((lp - 0.5f32.ln()).abs() < 1e-6);
        assert_eq!(top.len(), 2);
        assert_eq!(processed(&c, 1, 0, &mut top), f32::NEG_INFINITY);
    }
}
