//! SIMD kernels over a dense logits row, behind one-time runtime CPU detection.
//!
//! Layout follows memchr's: every kernel has a portable implementation (always compiled, the
//! reference the others are tested against) and, on x86-64, an AVX2+FMA one in [`avx2`] with
//! the same name and signature. [`isa`] detects the CPU once and caches the answer; the public
//! functions here dispatch on it. Nothing outside this module contains `unsafe`.
//!
//! The kernels (all for NaN-free input unless a kernel says otherwise):
//!
//! * [`max`]: the largest value; one pass, the *floor* every benchmark is measured against.
//! * [`summarize`]: one pass that validates the row (may it hold NaN or `+inf`?), and records
//!   the maximum, the first [`BLOCK`] holding it, and the maximum of every block. The block
//!   maxima are what lets the fast paths in
//!   [`convention::llama_cpp::dense`](crate::convention::llama_cpp::dense) skip most of the row.
//! * [`argmax`]: the first index of the maximum.
//! * [`gather_ge`]: the entries of a block at or above a threshold, in index order.
//! * [`exp_shifted`] / [`exp_shifted_sum`]: `expf(x / div - sub)`, **bit for bit** the
//!   platform's `expf` (see below), stored or summed in f64.
//!
//! # The exact `expf`
//!
//! llama.cpp computes probabilities with glibc's `expf`, and its candidate order, `p` fields
//! and token choices depend on those exact bits. [`avx2`] carries a vectorised restatement of
//! glibc's algorithm (ARM's optimized-routines `expf`: a 32-entry table of `2^(i/32)`, a cubic
//! in double precision, one rounding to f32), with the fused multiply-adds of the variant
//! glibc selects on FMA-capable x86-64. It is used only when it agrees with the platform's
//! `f32::exp` on a probe set checked once at detection (which includes inputs where the
//! non-FMA variant rounds differently); otherwise every exact kernel calls `f32::exp` per
//! element. On this project's machines (glibc 2.36) it was checked equal to `f32::exp` on
//! every f32 in `[-104.5, 0]` (the `exp_replica_is_exhaustively_exact` test, `--ignored`).
//! Its domain is `x <= 0` (and `-inf`), which is all the samplers need: `x` is a logit minus
//! the maximum.

use crate::candidates::TokenData;
use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
pub mod avx2;

/// Entries per block of [`summarize`]'s block maxima (8 AVX2 vectors).
pub const BLOCK: usize = 64;

/// The instruction set the kernels run with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Plain Rust, any CPU.
    Portable,
    /// x86-64 AVX2 and FMA.
    Avx2,
}

#[derive(Clone, Copy, Debug)]
struct Caps {
    isa: Isa,
    exact_exp: bool,
}

fn caps() -> Caps {
    static CAPS: OnceLock<Caps> = OnceLock::new();
    *CAPS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: AVX2 and FMA were detected just above.
            let exact_exp = unsafe { avx2::exp_replica_agrees() };
            return Caps { isa: Isa::Avx2, exact_exp };
        }
        Caps { isa: Isa::Portable, exact_exp: false }
    })
}

/// The instruction set detected on this CPU (once; cached).
pub fn isa() -> Isa {
    caps().isa
}

/// True when the vectorised `expf` is in use (it matched the platform's `expf` on the probe
/// set); false means the exact kernels call `f32::exp` per element.
pub fn vectorised_exp() -> bool {
    caps().exact_exp
}

/// The largest value of `row` (`-inf` for an empty row). For NaN-free input; with NaN the
/// result is unspecified (but some value of the row or `-inf`).
///
/// ```
/// assert_eq!(tokensieve::arch::max(&[1.0, -2.0, 7.5, 3.0]), 7.5);
/// ```
pub fn max(row: &[f32]) -> f32 {
    match caps().isa {
        // SAFETY: `Isa::Avx2` is only reported when AVX2 and FMA were detected at runtime.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::max(row) },
        _ => portable::max(row),
    }
}

/// What [`summarize`] found.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// The largest value (for a NaN-free row).
    pub max: f32,
    /// The first block whose maximum equals `max` (`==`, so `-0.0 == 0.0`).
    pub max_block: usize,
    /// True when the row may hold NaN or `+inf` (false guarantees it holds neither; true may
    /// be a false alarm, e.g. for finite values whose sum overflows, so confirm with
    /// [`Logits::validate`](crate::Logits::validate)).
    pub suspect: bool,
}

/// One pass over `row`: validation, the maximum and the maximum of every [`BLOCK`] of
/// entries (the last block may be shorter), written to `block_max` (cleared first).
pub fn summarize(row: &[f32], block_max: &mut Vec<f32>) -> Summary {
    block_max.clear();
    match caps().isa {
        // SAFETY: `Isa::Avx2` is only reported when AVX2 and FMA were detected at runtime.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::summarize(row, block_max) },
        _ => portable::summarize(row, block_max),
    }
}

/// The maximum of every [`BLOCK`] of `row` (the last may be shorter) into `out`, which must
/// hold `row.len().div_ceil(BLOCK)` entries; returns the maximum of the row. For NaN-free input.
pub fn block_max_into(row: &[f32], out: &mut [f32]) -> f32 {
    assert_eq!(out.len(), row.len().div_ceil(BLOCK), "block_max_into: wrong output length");
    match caps().isa {
        // SAFETY: `Isa::Avx2` is only reported when AVX2 and FMA were detected at runtime.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::block_max_into(row, out) },
        _ => portable::block_max_into(row, out),
    }
}

/// The first index holding the maximum of `row` (`None` for an empty row): what llama.cpp's
/// greedy scan (strict `>`) returns on an array in row order. For NaN-free input.
///
/// ```
/// assert_eq!(tokensieve::arch::argmax(&[1.0, 7.5, -2.0, 7.5]), Some(1));
/// ```
pub fn argmax(row: &[f32]) -> Option<usize> {
    match caps().isa {
        // SAFETY: `Isa::Avx2` is only reported when AVX2 and FMA were detected at runtime.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::argmax(row) },
        _ => portable::argmax(row),
    }
}

/// How many values are `>= threshold`.
pub fn count_ge(values: &[f32], threshold: f32) -> usize {
    match caps().isa {
        // SAFETY: `Isa::Avx2` is only reported when AVX2 and FMA were detected at runtime.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::count_ge(values, threshold) },
        _ => portable::count_ge(values, threshold),
    }
}

/// Appends `(base + i, block[i], p = 0)` for every `i` with `block[i] >= threshold`, in index
/// order.
pub fn gather_ge(block: &[f32], base: u32, threshold: f32, out: &mut Vec<TokenData>) {
    match caps().isa {
        // SAFETY: `Isa::Avx2` is only reported when AVX2 and FMA were detected at runtime.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::gather_ge(block, base, threshold, out) },
        _ => portable::gather_ge(block, base, threshold, out),
    }
}

/// `out[i] = expf(src[i] / div - sub)` with f32 division and subtraction, each rounded as
/// written, and the platform's `expf` bits. Every `src[i] / div - sub` must be `<= 0` or
/// `-inf` (a logit minus the maximum). `div = 1` is exact, so it also serves without a
/// temperature. `out.len()` must equal `src.len()`.
pub fn exp_shifted(src: &[f32], div: f32, sub: f32, out: &mut [f32]) {
    assert_eq!(src.len(), out.len(), "exp_shifted: length mismatch");
    let c = caps();
    if c.exact_exp {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `exact_exp` is only set after AVX2 and FMA were detected at runtime.
        unsafe {
            return avx2::exp_shifted(src, div, sub, out);
        }
    }
    portable::exp_shifted(src, div, sub, out)
}

/// `Σ expf(src[i] / div - sub)` (as [`exp_shifted`]) accumulated in f64 in a fixed order that
/// does not depend on the instruction set (elements `8j..8j+4` and `8j+4..8j+8` into two
/// 4-lane accumulators, combined pairwise, then the tail in order), so the sum has the same
/// bits on every CPU.
pub fn exp_shifted_sum(src: &[f32], div: f32, sub: f32) -> f64 {
    let c = caps();
    if c.exact_exp {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `exact_exp` is only set after AVX2 and FMA were detected at runtime.
        unsafe {
            return avx2::exp_shifted_sum(src, div, sub);
        }
    }
    portable::exp_shifted_sum(src, div, sub)
}

/// `((start + w_0) + w_1) + …` in f32, in row order, bit for bit, with
/// `w_i = expf(row[i] - sub)` (llama.cpp's softmax sum for `start = 0`; a later `start`
/// continues a sum over an earlier part of the row). `start` must be `>= 0`. `block_max` must hold the maxima of the [`BLOCK`]s of `row`
/// (as [`summarize`] writes them) and every `row[i] - sub` must be `<= 0` or `-inf`.
///
/// A weight below half an ulp of the running sum leaves it unchanged when added (round to
/// nearest), so only the entries that can change it are exponentiated: a block is skipped when
/// its maximum is too small, and inside a block only the entries at or above a conservative
/// logit threshold are gathered (in order) and added. The result is the plain loop's.
pub fn exp_sum_sequential(start: f32, row: &[f32], sub: f32, block_max: &[f32]) -> f32 {
    assert_eq!(block_max.len(), row.len().div_ceil(BLOCK), "exp_sum_sequential: wrong block count");
    let c = caps();
    if c.exact_exp {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `exact_exp` is only set after AVX2 and FMA were detected at runtime.
        unsafe {
            return avx2::exp_sum_sequential(start, row, sub, block_max);
        }
    }
    portable::exp_sum_sequential(start, row, sub, block_max)
}

/// Natural log of half an ulp of a non-negative f32 `sum`, minus a margin of 0.01 that covers
/// `expf`'s error and this function's rounding: `expf(x) < half_ulp(sum)` for `x` below it.
#[inline]
pub(crate) fn log_half_ulp(sum: f32) -> f32 {
    let exponent = ((sum.to_bits() >> 23) as i32 - 127).max(-126);
    (exponent - 24) as f32 * std::f32::consts::LN_2 - 0.01
}

/// A logit threshold for [`exp_sum_sequential`]: `l < threshold(sub, bound)` implies
/// `l - sub < bound·(1 + 2^-22)`, so the f32 difference (within 2^-24 relative of the exact
/// one) is below `bound` (which is negative).
#[inline]
pub(crate) fn skip_threshold(sub: f32, bound: f32) -> f32 {
    let x = sub as f64 + bound as f64 * (1.0 + 1.0 / (1u64 << 22) as f64);
    let y = x as f32;
    if (y as f64) <= x {
        y
    } else if y > 0.0 {
        f32::from_bits(y.to_bits() - 1)
    } else if y == 0.0 {
        -f32::from_bits(1)
    } else {
        f32::from_bits(y.to_bits() + 1)
    }
}

/// Relative error bound of the weights [`exp_block_sums`] uses with `approx = true`, against
/// the exact `expf` (the approximation's own error plus `expf`'s), for results above 2^-126;
/// below, the absolute error is under 2^-126.
pub const APPROX_EXP_REL_ERROR: f64 = 1.0 / (1u64 << 20) as f64;

/// Per [`BLOCK`] of `src`, `Σ e^(src[i] / div - sub)` in f64, into `out` (which must hold
/// `src.len().div_ceil(BLOCK)` entries). `approx = false`: the weights of [`exp_shifted`],
/// bit for bit, summed in [`exp_shifted_sum`]'s order. `approx = true`: a cheaper f32
/// polynomial within [`APPROX_EXP_REL_ERROR`] (for callers that only need a certified
/// bound, never for values that must match llama.cpp's); the portable version then uses
/// `f32::exp`. Every `src[i] / div - sub` must be `<= 0` or `-inf`.
pub fn exp_block_sums(src: &[f32], div: f32, sub: f32, approx: bool, out: &mut [f64]) {
    assert_eq!(out.len(), src.len().div_ceil(BLOCK), "exp_block_sums: wrong output length");
    let c = caps();
    if c.isa == Isa::Avx2 && (approx || c.exact_exp) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only reported when AVX2 and FMA were detected at runtime.
        unsafe {
            return avx2::exp_block_sums(src, div, sub, approx, out);
        }
    }
    for (o, block) in out.iter_mut().zip(src.chunks(BLOCK)) {
        *o = portable::exp_shifted_sum(block, div, sub);
    }
}

/// The portable kernels: plain Rust, the reference the SIMD ones are held to.
pub mod portable {
    use super::BLOCK;
    use crate::candidates::TokenData;

    /// See [`super::max`].
    pub fn max(row: &[f32]) -> f32 {
        row.iter().fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m })
    }

    /// See [`super::summarize`].
    pub fn summarize(row: &[f32], block_max: &mut Vec<f32>) -> super::Summary {
        let mut best = f32::NEG_INFINITY;
        let mut best_block = 0;
        let mut suspect = false;
        for (b, block) in row.chunks(BLOCK).enumerate() {
            let mut m = f32::NEG_INFINITY;
            for &x in block {
                suspect |= x.is_nan() || x == f32::INFINITY;
                if x > m {
                    m = x;
                }
            }
            block_max.push(m);
            if m > best || b == 0 {
                best = m;
                best_block = b;
            }
        }
        super::Summary { max: best, max_block: best_block, suspect }
    }

    /// See [`super::block_max_into`].
    pub fn block_max_into(row: &[f32], out: &mut [f32]) -> f32 {
        let mut best = f32::NEG_INFINITY;
        for (o, block) in out.iter_mut().zip(row.chunks(BLOCK)) {
            *o = max(block);
            if *o > best {
                best = *o;
            }
        }
        best
    }

    /// See [`super::argmax`].
    pub fn argmax(row: &[f32]) -> Option<usize> {
        let mut best: Option<(usize, f32)> = None;
        for (i, &x) in row.iter().enumerate() {
            if best.is_none_or(|(_, m)| x > m) {
                best = Some((i, x));
            }
        }
        best.map(|(i, _)| i)
    }

    /// See [`super::count_ge`].
    pub fn count_ge(values: &[f32], threshold: f32) -> usize {
        values.iter().filter(|&&x| x >= threshold).count()
    }

    /// See [`super::gather_ge`].
    pub fn gather_ge(block: &[f32], base: u32, threshold: f32, out: &mut Vec<TokenData>) {
        for (i, &x) in block.iter().enumerate() {
            if x >= threshold {
                out.push(TokenData { id: base + i as u32, logit: x, p: 0.0 });
            }
        }
    }

    /// See [`super::exp_shifted`].
    pub fn exp_shifted(src: &[f32], div: f32, sub: f32, out: &mut [f32]) {
        for (o, &x) in out.iter_mut().zip(src) {
            *o = (x / div - sub).exp();
        }
    }

    /// See [`super::exp_sum_sequential`].
    pub fn exp_sum_sequential(start: f32, row: &[f32], sub: f32, block_max: &[f32]) -> f32 {
        let mut sum = start;
        let mut bound = super::log_half_ulp(sum);
        for (&bm, block) in block_max.iter().zip(row.chunks(BLOCK)) {
            if bm - sub < bound {
                continue;
            }
            let threshold = super::skip_threshold(sub, bound);
            for &x in block {
                if x >= threshold {
                    sum += (x - sub).exp();
                }
            }
            bound = super::log_half_ulp(sum);
        }
        sum
    }

    /// See [`super::exp_shifted_sum`].
    pub fn exp_shifted_sum(src: &[f32], div: f32, sub: f32) -> f64 {
        let mut lo = [0.0f64; 4];
        let mut hi = [0.0f64; 4];
        let chunks = src.chunks_exact(8);
        let tail = chunks.remainder();
        for c in chunks {
            for j in 0..4 {
                lo[j] += (c[j] / div - sub).exp() as f64;
                hi[j] += (c[j + 4] / div - sub).exp() as f64;
            }
        }
        let mut sum = ((lo[0] + hi[0]) + (lo[1] + hi[1])) + ((lo[2] + hi[2]) + (lo[3] + hi[3]));
        for &x in tail {
            sum += (x / div - sub).exp() as f64;
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Rows with the values that break SIMD code: -inf, ties (±0 too), huge magnitudes,
    /// lengths around the lane width and block size.
    fn row() -> impl Strategy<Value = Vec<f32>> {
        let value = prop_oneof![
            6 => -30.0f32..30.0,
            2 => proptest::sample::select(vec![0.0f32, -0.0, 1.0, -1.0, 3.5]),
            1 => Just(f32::NEG_INFINITY),
            1 => proptest::sample::select(vec![f32::MAX, -f32::MAX, 1e30, -1e30, f32::MIN_POSITIVE]),
        ];
        prop_oneof![1..=20usize, 60..=140usize, 1..=700usize]
            .prop_flat_map(move |n| proptest::collection::vec(value.clone(), n))
    }

    fn naive_argmax(r: &[f32]) -> usize {
        let mut best = 0;
        for i in 1..r.len() {
            if r[i] > r[best] {
                best = i;
            }
        }
        best
    }

    fn config() -> ProptestConfig {
        ProptestConfig { cases: 400, rng_seed: proptest::test_runner::RngSeed::Fixed(17), ..ProptestConfig::default() }
    }

    fn avx2_available() -> bool {
        #[cfg(target_arch = "x86_64")]
        return std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma");
        #[allow(unreachable_code)]
        false
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn kernels_agree_with_the_naive_scans(r in row(), thr in -40.0f32..40.0) {
            let m = r.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            let first = naive_argmax(&r);
            prop_assert!(portable::max(&r) == m);
            prop_assert_eq!(portable::argmax(&r), Some(first));
            let mut bm = Vec::new();
            let s = portable::summarize(&r, &mut bm);
            prop_assert!(!s.suspect);
            prop_assert!(s.max == m);
            prop_assert_eq!(s.max_block, first / BLOCK);
            let want: Vec<f32> = r.chunks(BLOCK).map(|b| b.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x))).collect();
            prop_assert_eq!(&bm, &want);
            let mut bm3 = vec![0.0; want.len()];
            prop_assert!(portable::block_max_into(&r, &mut bm3) == m);
            prop_assert_eq!(&bm3, &want);
            prop_assert_eq!(portable::count_ge(&r, thr), r.iter().filter(|&&x| x >= thr).count());
            let mut g = Vec::new();
            portable::gather_ge(&r, 5, thr, &mut g);
            let want: Vec<(u32, f32)> = r.iter().enumerate().filter(|(_, &x)| x >= thr).map(|(i, &x)| (5 + i as u32, x)).collect();
            prop_assert_eq!(g.iter().map(|t| (t.id, t.logit)).collect::<Vec<_>>(), want);

            if avx2_available() {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: AVX2 and FMA were detected just above.
                unsafe {
                    prop_assert!(avx2::max(&r) == m);
                    prop_assert_eq!(avx2::argmax(&r), Some(first));
                    let mut bm2 = Vec::new();
                    let s2 = avx2::summarize(&r, &mut bm2);
                    // Finite values whose sum overflows may raise a (documented) false alarm.
                    let huge = r.iter().any(|x| x.is_finite() && x.abs() > 1e37);
                    prop_assert!(!s2.suspect || huge);
                    prop_assert!(s2.max == m);
                    prop_assert_eq!(s2.max_block, first / BLOCK);
                    prop_assert_eq!(&bm2, &bm);
                    prop_assert!(avx2::block_max_into(&r, &mut bm3) == m);
                    prop_assert_eq!(&bm3, &bm);
                    prop_assert_eq!(avx2::count_ge(&r, thr), g.len());
                    let mut g2 = Vec::new();
                    avx2::gather_ge(&r, 5, thr, &mut g2);
                    prop_assert_eq!(&g2, &g);
                }
            }
        }

        #[test]
        fn summarize_flags_nan_and_positive_infinity(mut r in row(), at in any::<prop::sample::Index>(), nan in any::<bool>()) {
            let i = at.index(r.len());
            r[i] = if nan { f32::NAN } else { f32::INFINITY };
            let mut bm = Vec::new();
            prop_assert!(portable::summarize(&r, &mut bm).suspect);
            if avx2_available() {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: AVX2 and FMA were detected just above.
                unsafe { prop_assert!(avx2::summarize(&r, &mut bm).suspect); }
            }
        }

        #[test]
        fn the_sequential_sum_is_the_plain_loop(r in row(), shift in -5.0f32..0.0) {
            let r: Vec<f32> = r.into_iter().map(|x| x.clamp(-1e30, 1e30)).collect();
            let sub = portable::max(&r);
            prop_assume!(sub.is_finite());
            let sub = sub - shift; // also a `sub` above the maximum
            let mut plain = 0.0f32;
            for &x in &r {
                plain += (x - sub).exp();
            }
            let mut bm = Vec::new();
            portable::summarize(&r, &mut bm);
            prop_assert_eq!(portable::exp_sum_sequential(0.0, &r, sub, &bm).to_bits(), plain.to_bits());
            prop_assert_eq!(exp_sum_sequential(0.0, &r, sub, &bm).to_bits(), plain.to_bits());
            // Continued over a split at a block boundary.
            let cut = (r.len() / 2) / BLOCK * BLOCK;
            let first = exp_sum_sequential(0.0, &r[..cut], sub, &bm[..cut / BLOCK]);
            prop_assert_eq!(exp_sum_sequential(first, &r[cut..], sub, &bm[cut / BLOCK..]).to_bits(), plain.to_bits());
        }

        #[test]
        fn exp_kernels_are_the_platform_expf(r in row(), div in prop_oneof![Just(1.0f32), 0.05f32..3.0]) {
            let r: Vec<f32> = r.into_iter().map(|x| x.clamp(-1e30, 1e30)).collect();
            let sub = portable::max(&r) / div;
            prop_assume!(sub.is_finite());
            let mut want = vec![0.0; r.len()];
            portable::exp_shifted(&r, div, sub, &mut want);
            for (&x, &w) in r.iter().zip(&want) {
                prop_assert_eq!(w.to_bits(), (x / div - sub).exp().to_bits());
            }
            let sum = portable::exp_shifted_sum(&r, div, sub);
            let mut got = vec![0.0; r.len()];
            exp_shifted(&r, div, sub, &mut got);
            prop_assert_eq!(got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
            prop_assert_eq!(exp_shifted_sum(&r, div, sub).to_bits(), sum.to_bits());
        }
    }

    #[test]
    fn edge_lengths_and_values() {
        for v in [1usize, 2, 7, 8, 9, 31, 32, 33, 63, 64, 65, 127, 128, 129] {
            let all_masked = vec![f32::NEG_INFINITY; v];
            assert_eq!(argmax(&all_masked), Some(0));
            assert_eq!(max(&all_masked), f32::NEG_INFINITY);
            let mut bm = Vec::new();
            let s = summarize(&all_masked, &mut bm);
            assert_eq!((s.max, s.max_block, s.suspect), (f32::NEG_INFINITY, 0, false));
            assert_eq!(bm.len(), v.div_ceil(BLOCK));
            let mut r = vec![0.0f32; v];
            r[v - 1] = -0.0;
            assert_eq!(argmax(&r), Some(0), "ties keep the first");
            r[v - 1] = 1.0;
            assert_eq!(argmax(&r), Some(v - 1));
            assert_eq!(summarize(&r, &mut bm).max_block, (v - 1) / BLOCK);
        }
        assert_eq!(argmax(&[]), None);
        assert_eq!(max(&[]), f32::NEG_INFINITY);
    }

    /// Inputs near the ends of the domain and where glibc's non-FMA variant rounds
    /// differently: the vectorised `expf`, when in use, must match `f32::exp` on them.
    #[test]
    fn exp_replica_matches_on_the_probe_set_and_a_sweep() {
        if !vectorised_exp() {
            eprintln!("vectorised expf not in use on this machine (isa {:?})", isa());
            return;
        }
        let mut xs: Vec<f32> = Vec::new();
        let mut b = 0x8000_0000u32; // -0.0 upwards in magnitude
        while b <= (-104.5f32).to_bits() {
            xs.push(f32::from_bits(b));
            b += 4099;
        }
        xs.extend([
            f32::from_bits(0xc27c_65d9),
            f32::NEG_INFINITY,
            -0.0,
            0.0,
            -87.33655,
            -88.0,
            -88.72284,
            -103.27893,
            -103.97208,
            -104.0,
        ]);
        let mut got = vec![0.0; xs.len()];
        exp_shifted(&xs, 1.0, 0.0, &mut got);
        for (&x, &g) in xs.iter().zip(&got) {
            assert_eq!(g.to_bits(), x.exp().to_bits(), "expf({x:e})");
        }
    }

    #[test]
    fn block_sums_are_exact_or_within_the_approximation_bound() {
        let mut x: Vec<f32> = (0..5000).map(|i| -((i as f32) * 0.0213).powf(1.3)).collect();
        x.extend([f32::NEG_INFINITY, -87.0, -87.4, -88.0, -104.0, -0.0]);
        for div in [1.0f32, 0.8, 2.5] {
            let nb = x.len().div_ceil(BLOCK);
            let (mut exact, mut approx) = (vec![0.0; nb], vec![0.0; nb]);
            exp_block_sums(&x, div, 0.0, false, &mut exact);
            exp_block_sums(&x, div, 0.0, true, &mut approx);
            for (b, block) in x.chunks(BLOCK).enumerate() {
                assert_eq!(exact[b].to_bits(), portable::exp_shifted_sum(block, div, 0.0).to_bits());
                let err = (approx[b] - exact[b]).abs();
                // Flushed weights: under 2^-126 each.
                assert!(
                    err <= APPROX_EXP_REL_ERROR * exact[b] + 64.0 * 1.2e-38,
                    "block {b}: {} vs {}",
                    approx[b],
                    exact[b]
                );
            }
            #[cfg(target_arch = "x86_64")]
            if avx2_available() {
                // The approximation's worst case over a dense sweep of its domain, per element.
                // (A block of 64 copies sums exactly in f64: the sum / 64 is the weight.)
                for i in 0..50_000 {
                    let v = -(i as f32) * (87.3 / 50_000.0);
                    let mut o = [0.0f64];
                    // SAFETY: AVX2 and FMA were detected just above.
                    unsafe { avx2::exp_block_sums(&[v; BLOCK], 1.0, 0.0, true, &mut o) };
                    let (w, e) = (o[0] / BLOCK as f64, (v as f64).exp());
                    assert!((w - e).abs() <= APPROX_EXP_REL_ERROR * e + 1e-37, "x = {v}: {w} vs {e}");
                }
            }
        }
    }

    /// Every f32 in [-104.5, 0]: about 1.1e9 values, a few seconds at the test profile's opt-level.
    #[test]
    fn exp_replica_is_exhaustively_exact() {
        if !vectorised_exp() {
            return;
        }
        let end = (-104.5f32).to_bits();
        let mut src = Vec::with_capacity(1 << 16);
        let mut out = vec![0.0; 1 << 16];
        let mut b = 0x8000_0000u32;
        while b <= end {
            src.clear();
            while src.len() < 1 << 16 && b <= end {
                src.push(f32::from_bits(b));
                b += 1;
            }
            exp_shifted(&src, 1.0, 0.0, &mut out[..src.len()]);
            for (&x, &g) in src.iter().zip(&out) {
                assert_eq!(g.to_bits(), x.exp().to_bits(), "expf({x:e}) bits {:#x}", x.to_bits());
            }
        }
    }
}
