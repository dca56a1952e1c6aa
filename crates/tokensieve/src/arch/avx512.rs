//! AVX-512 versions of two kernels, 16 lanes instead of [`super::avx2`]'s 8: the approximate
//! block sums ([`super::exp_block_sums_approx`] and [`super::exp_block_sums_approx_at`]), behind
//! `dist`'s and transformers `top_p`'s bounds, and the block scan of
//! [`super::exp_sum_sequential`] (llama.cpp's softmax sum; see [`exp_sum_sequential`] here).
//!
//! Every lane computes what an AVX2 lane computes, operation for operation (the same fused
//! multiply-add for the argument, the same clamp, rounding trick and quintic, the same exponent
//! addition), so each weight has the same bits and the same error, and the error bound of
//! `approx_sums_error` carries over. Only the f32 lane sums are shorter (4 terms per
//! lane and block instead of 8), which the bound's 7 roundings per lane already cover. The
//! tests check the weights bit for bit against the AVX2 kernel and the sums against the bound.
//!
//! Every function is `unsafe` for one reason only: it is compiled with
//! `#[target_feature(enable = "avx512f,avx2,fma")]` (and `popcnt` for the scan). SAFETY
//! (callers): [`super`] calls these only after `is_x86_feature_detected!` returned true for
//! `avx512f`, `popcnt`, `avx2` and `fma`.
//! Inside, the only other unsafe operations are unaligned loads (`loadu`, no alignment
//! requirement) whose bounds come from the block they read.
//!
//! PERF: on the development machine (a Sapphire Rapids Xeon) this kernel sums 1.7 times as
//! many weights per second as the AVX2 one.

use super::avx2::{APPROX_Y_MIN, EXP2_POLY};
use super::BLOCK;
use std::arch::x86_64::*;

/// The constants of [`exp2_approx_with`], set once per kernel call.
struct Exp2Consts {
    poly: [__m512; 6],
    y_min: __m512,
    magic: __m512,
}

impl Exp2Consts {
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[inline]
    unsafe fn new() -> Self {
        Self {
            poly: EXP2_POLY.map(|c| _mm512_set1_ps(c)),
            y_min: _mm512_set1_ps(APPROX_Y_MIN),
            magic: _mm512_set1_ps(12_582_912.0), // 1.5·2^23
        }
    }
}

/// `2^y` on 16 lanes: [`super::avx2`]'s `exp2_approx` lane for lane (see there for the
/// method and its error). Returns the result and the clamped `y`.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn exp2_approx_with(y: __m512, c: &Exp2Consts) -> (__m512, __m512) {
    let y = _mm512_max_ps(y, c.y_min);
    let k = _mm512_add_ps(y, c.magic);
    // `y - n` is exact: `n` is the integer nearest `y`, and `y`'s ulp divides it.
    let f = _mm512_sub_ps(y, _mm512_sub_ps(k, c.magic));
    let mut p = c.poly[5];
    for &coef in c.poly[..5].iter().rev() {
        p = _mm512_fmadd_ps(p, f, coef);
    }
    // `k`'s low mantissa bits hold `n`; shifted into the exponent field they add `n` to `p`'s.
    let n = _mm512_slli_epi32::<23>(_mm512_castps_si512(k));
    (_mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p), n)), y)
}

/// [`exp2_approx_with`] with its constants, for the tests.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2 and FMA.
#[cfg(test)]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn exp2_approx(y: __m512) -> (__m512, __m512) {
    exp2_approx_with(y, &Exp2Consts::new())
}

/// See [`super::exp_block_sums_approx`].
///
/// # Safety
/// The CPU must support AVX-512F, AVX2 and FMA.
#[target_feature(enable = "avx512f,avx2,fma")]
pub unsafe fn exp_block_sums_approx(src: &[f32], div: f32, sub: f32, out: &mut [f64]) -> f64 {
    approx_sums(src, div, sub, 0..out.len(), out)
}

/// See [`super::exp_block_sums_approx_at`].
///
/// # Safety
/// The CPU must support AVX-512F, AVX2 and FMA.
#[target_feature(enable = "avx512f,avx2,fma")]
pub unsafe fn exp_block_sums_approx_at(src: &[f32], div: f32, sub: f32, blocks: &[u32], out: &mut [f64]) -> f64 {
    approx_sums(src, div, sub, blocks.iter().map(|&b| b as usize), out)
}

/// The kernel: per listed block, `Σ 2^y` with `y = fl(x·(log2 e / div) + (-sub·log2 e))`
/// summed per lane in f32 (two chains of two vectors, then the chains), the lanes in f64;
/// beside it `Σ -2^y·y` for the bound. The last, partial block uses the exact weights.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn approx_sums(src: &[f32], div: f32, sub: f32, ids: impl Iterator<Item = usize>, out: &mut [f64]) -> f64 {
    let a = _mm512_set1_ps((std::f64::consts::LOG2_E / div as f64) as f32);
    let b = _mm512_set1_ps((-(sub as f64) * std::f64::consts::LOG2_E) as f32);
    let consts = Exp2Consts::new();
    let mut total = _mm512_setzero_pd();
    let mut weighted = _mm512_setzero_pd();
    let mut entries = 0;
    // The f32 lanes of `v` widened and added pairwise: 8 f64 lanes.
    let widen = |v: __m512| {
        let lo = _mm512_castps512_ps256(v);
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
        _mm512_add_pd(_mm512_cvtps_pd(lo), _mm512_cvtps_pd(hi))
    };
    for id in ids {
        let start = id * BLOCK;
        let Some(block) = src.get(start..(start + BLOCK).min(src.len())) else { continue };
        entries += block.len();
        if block.len() < BLOCK {
            // The last, partial block: exact weights (exact sums need no bound).
            out[id] = block.iter().map(|&x| (x / div - sub).exp() as f64).sum();
            continue;
        }
        let p = block.as_ptr();
        // SAFETY: `block` holds BLOCK = 64 floats: four vectors of 16.
        let e = |k: usize| exp2_approx_with(_mm512_fmadd_ps(_mm512_loadu_ps(p.add(16 * k)), a, b), &consts);
        let ((w0, y0), (w1, y1), (w2, y2), (w3, y3)) = (e(0), e(1), e(2), e(3));
        let acc = _mm512_add_ps(_mm512_add_ps(w0, w2), _mm512_add_ps(w1, w3));
        // `y <= 0` but for rounding (see `super::approx_sums_error`): adds `-w·y`.
        let acc_y = _mm512_add_ps(
            _mm512_fnmadd_ps(w2, y2, _mm512_fnmadd_ps(w0, y0, _mm512_setzero_ps())),
            _mm512_fnmadd_ps(w3, y3, _mm512_fnmadd_ps(w1, y1, _mm512_setzero_ps())),
        );
        let sums = widen(acc);
        total = _mm512_add_pd(total, sums);
        weighted = _mm512_add_pd(weighted, widen(acc_y));
        out[id] = _mm512_reduce_add_pd(sums);
    }
    super::approx_sums_error(_mm512_reduce_add_pd(total), _mm512_reduce_add_pd(weighted), sub, entries)
}

/// See [`super::exp_sum_sequential`]: [`super::avx2`]'s algorithm, the same entries queued in
/// the same order (so the same sum, bit for bit), with each block scanned 16 lanes at a time:
/// a compare into a mask register and a compress per vector, where AVX2 needs a movemask, a
/// table lookup and a permute per 8 entries.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA and POPCNT.
#[target_feature(enable = "avx512f,avx2,fma,popcnt")]
pub unsafe fn exp_sum_sequential(start: f32, row: &[f32], sub: f32, block_max: &[f32]) -> f32 {
    super::avx2::exp_sum_sequential_with::<Avx512Scan>(start, row, sub, block_max)
}

struct Avx512Scan;

impl super::avx2::BlockScan for Avx512Scan {
    type Masks = [u16; BLOCK / 16];

    #[inline(always)]
    unsafe fn select(block: &[f32; BLOCK], threshold: f32) -> (Self::Masks, usize) {
        let t = _mm512_set1_ps(threshold);
        let mut masks = [0u16; BLOCK / 16];
        let mut count = 0;
        for (k, m) in masks.iter_mut().enumerate() {
            // SAFETY: `block` holds 64 floats, so 16 from `16k` are in bounds.
            *m = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_loadu_ps(block.as_ptr().add(16 * k)), t);
            count += m.count_ones() as usize;
        }
        (masks, count)
    }

    #[inline(always)]
    unsafe fn pack(block: &[f32; BLOCK], masks: Self::Masks, dst: &mut [f32]) -> usize {
        let mut n = 0;
        for (k, &m) in masks.iter().enumerate() {
            // SAFETY: `block` holds 64 floats, so 16 from `16k` are in bounds.
            let x = _mm512_loadu_ps(block.as_ptr().add(16 * k));
            // At most 48 written before, plus 16: within the BLOCK + 8 the caller guarantees.
            let out = &mut dst[n..n + 16];
            // SAFETY: `out` holds 16 floats.
            _mm512_storeu_ps(out.as_mut_ptr(), _mm512_maskz_compress_ps(m, x));
            n += m.count_ones() as usize;
        }
        n
    }
}
