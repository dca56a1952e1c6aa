//! Logprobs of the sampled token and its top-N alternatives.
//!
//! * [`LogprobsMode::Raw`]: log-softmax of the **input row** over the full vocabulary (no
//!   penalty, bias, temperature or truncation), as llama.cpp's server reports by default and
//!   vLLM's `raw_logprobs`. The top N are found by partial selection, never by sorting the
//!   vocabulary: one SIMD pass gives the maximum of every block of 64 entries; the N-th
//!   largest block maximum is a lower bound of the N-th best logit, so only the blocks that
//!   reach it (about N) are read, and a bounded insertion buffer keeps their best entries.
//! * [`LogprobsMode::Processed`]: log-softmax over the candidates the chain left (finite
//!   logits only), i.e. the distribution the final stage drew from (llama.cpp's
//!   `post_sampling_probs`, vLLM's `processed_logprobs`).
//!
//! Raw mode's normaliser is llama.cpp's own softmax sum, `Σ expf(logit - max)` in f32 in
//! vocabulary order (bit for bit, computed without exponentiating the entries that cannot
//! change it, see [`crate::arch::exp_sum_sequential`]): the probabilities llama.cpp's server
//! derives from the raw logits. `logprob = logit - max - ln(sum)` in f64. Processed mode sums
//! f64 exponentials.
//!
//! That f32 sum is short of the exact one by the row's tail: once the running sum holds the
//! maximum's weight 1, each weight below half an ulp of it (`logit - max` below about -16.6)
//! leaves it unchanged, however many there are. On language-model-like rows
//! (`bench_rows` peaked, entropy 1.5 nats) the shortfall is `9.7e-5` of the sum at V = 32,000,
//! `3.2e-5` at 128,256 and `1.6e-5` at 262,144, so raw logprobs sit that many nats above the
//! exact log-softmax, exactly as llama.cpp's do. An exact sum costs one accurate exponential
//! per entry (about six max passes with AVX-512); this one exponentiates only the entries
//! that change it. Ties in the top N are broken by the lower token id. A token outside the
//! processed set has logprob `-inf`.

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
        /// f16/bf16 rows widened for [`raw_f32`] (reused: no allocation after the first row).
        static WIDENED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    match row {
        Logits::F32(r) => raw_f32(r, token, n, out),
        Logits::F16(h) => WIDENED.with_borrow_mut(|w| {
            crate::arch::widen_f16(h, w);
            raw_f32(w, token, n, out)
        }),
        Logits::Bf16(b) => WIDENED.with_borrow_mut(|w| {
            crate::arch::widen_bf16(b, w);
            raw_f32(w, token, n, out)
        }),
    }
}

/// [`raw`] as first written, for any element type: the oracle the fast paths are tested
/// against.
#[cfg(test)]
fn raw_generic(row: Logits<'_>, token: u32, n: usize, out: &mut Vec<TokenLogprob>) -> f32 {
    let mut max = f32::NEG_INFINITY;
    row.for_each(|_, v| max = max.max(v));
    let mut sum = 0.0f32;
    prepare(out, n);
    row.for_each(|i, v| {
        sum += (v - max).exp();
        push_top(out, n, v, i as u32);
    });
    let lse = max as f64 + (sum as f64).ln();
    finish(out, lse);
    (row.get(token as usize) as f64 - lse) as f32
}

/// [`raw`] on an f32 row: one pass for the block maxima, the top `n` from the few blocks that
/// can hold one, then the sum, which skips the blocks and entries that cannot change it (the
/// maxima of a chunk are recomputed for that when the row has more than one chunk). The same
/// values as the generic loop.
fn raw_f32(r: &[f32], token: u32, n: usize, out: &mut Vec<TokenLogprob>) -> f32 {
    const CHUNK_BLOCKS: usize = 4096;
    prepare(out, n);
    let mut max = f32::NEG_INFINITY;
    let mut maxima = [0.0f32; CHUNK_BLOCKS];
    for (c, chunk) in r.chunks(CHUNK_BLOCKS * BLOCK).enumerate() {
        let maxima = &mut maxima[..chunk.len().div_ceil(BLOCK)];
        max = max.max(arch::block_max_into(chunk, maxima));
        top_from_blocks(chunk, maxima, (c * CHUNK_BLOCKS * BLOCK) as u32, n, out);
    }
    let mut sum = 0.0f32;
    let single = r.len() <= CHUNK_BLOCKS * BLOCK;
    for chunk in r.chunks(CHUNK_BLOCKS * BLOCK) {
        let maxima = &mut maxima[..chunk.len().div_ceil(BLOCK)];
        if !single {
            arch::block_max_into(chunk, maxima);
        }
        sum = arch::exp_sum_sequential(sum, chunk, max, maxima);
    }
    let lse = max as f64 + (sum as f64).ln();
    finish(out, lse);
    (r[token as usize] as f64 - lse) as f32
}

/// Feeds [`push_top`] the entries of `chunk` (ids from `base`) that can be among the top `n`
/// of the row, given the chunk's block `maxima`.
///
/// Every block holds an entry equal to its maximum, so when the chunk has `n` blocks, its
/// `n`-th largest block maximum `tau` has `n` entries of the chunk at or above it: an entry
/// below `tau` is beaten by all of them and cannot be in the top `n`. Only the blocks whose
/// maximum reaches `tau` (about `n` of them) are read, and in them only the entries at or
/// above both `tau` and the `n`-th best so far (later ids lose ties) are pushed.
fn top_from_blocks(chunk: &[f32], maxima: &[f32], base: u32, n: usize, out: &mut Vec<TokenLogprob>) {
    /// Up to this `n` the block maxima's top `n` is kept on the stack; larger `n` (no API
    /// asks for more than 20) reads every block that reaches the `n`-th best so far.
    const MAX_RANKED: usize = 64;
    if n == 0 {
        return;
    }
    let mut tau = f32::NEG_INFINITY;
    if n <= MAX_RANKED && maxima.len() >= n {
        // The `n` largest block maxima, descending.
        let mut best = [f32::NEG_INFINITY; MAX_RANKED];
        for group in maxima.chunks(SKIP_GROUP) {
            // `bm > best[n - 1]` is `!(bm < next_up)` but for NaN.
            if !any_not_below(group, best[n - 1].next_up()) {
                continue;
            }
            for &bm in group {
                if bm > best[n - 1] {
                    // Insertion into the sorted prefix, after the maxima equal to `bm`.
                    let mut i = n - 1;
                    while i > 0 && best[i - 1] < bm {
                        best[i] = best[i - 1];
                        i -= 1;
                    }
                    best[i] = bm;
                }
            }
        }
        tau = best[n - 1];
    }
    let floor = |out: &[TokenLogprob]| if top_len_below(out, n) { tau } else { tau.max(out[n - 1].logprob) };
    for (g, group) in maxima.chunks(SKIP_GROUP).enumerate() {
        if !any_not_below(group, floor(out)) {
            continue;
        }
        for (j, &bm) in group.iter().enumerate() {
            let floor = floor(out);
            if bm < floor {
                continue;
            }
            let start = (g * SKIP_GROUP + j) * BLOCK;
            let block = &chunk[start..(start + BLOCK).min(chunk.len())];
            arch::for_each_ge(block, floor, |i, v| {
                // `floor` only rises as the top fills: re-checked by `push_top`.
                push_top(out, n, v, base + (start + i) as u32);
            });
        }
    }
}

/// Block maxima that [`top_from_blocks`] tests at once before visiting any of them one by one.
const SKIP_GROUP: usize = 16;

/// Whether some `x` of `xs` is not below `t` (`!(x < t)`: NaN counts). PERF: no early exit, so
/// the loop compiles to vector compares, and on a language-model row nearly every group of
/// block maxima is below the top-n bound: one predictable branch per group instead of one per
/// block.
#[inline]
fn any_not_below(xs: &[f32], t: f32) -> bool {
    xs.iter().fold(false, |any, &x| any | (x >= t) | x.is_nan())
}

fn top_len_below(top: &[TokenLogprob], n: usize) -> bool {
    top.len() < n
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

    /// Rows of more than one chunk of block maxima, with many ties, and `n` on both sides of
    /// the stack-ranked limit.
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

    /// llama.cpp's f32 sum drops a tail of weights below half an ulp of the running sum, and
    /// raw logprobs follow it (the module docs): here 100,000 weights of `e^-18` add nothing to
    /// the maximum's 1 in f32, while they add 0.15% to the exact sum.
    #[test]
    fn raw_logprobs_keep_llama_cpp_s_f32_sum_with_its_dropped_tail() {
        let mut row = vec![-18.0f32; 100_001];
        // The maximum first: a weight added before it, while the sum is small, would count.
        row[0] = 0.0;
        let mut top = Vec::new();
        let lp = raw(Logits::from(&row[..]), 0, 1, &mut top);
        assert_eq!(lp, 0.0, "the f32 sum is exactly 1");
        let exact = -(1.0 + 100_000.0 * (-18.0f64).exp()).ln();
        assert!((exact + 0.0015).abs() < 1e-4, "{exact}");
        assert_eq!(top, [TokenLogprob { token: 0, logprob: 0.0 }]);
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
