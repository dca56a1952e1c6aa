//! NEON versions of the whole-row passes in [`super`] (aarch64), same names and contracts:
//! the floor's [`max`], the summary pass ([`summarize`], [`locate_max`], [`block_max_into`]),
//! [`argmax`] and [`count_ge`], and the gathers of the entries at or above a threshold
//! ([`gather_ge`], [`gather_blocks_ge`], [`for_each_ge`]). Of the exponentials:
//!
//! * the approximate block sums ([`exp_block_sums_approx`], [`exp_block_sums_approx_at`]):
//!   AVX2's kernel on two vectors of 4 lanes per 8-lane AVX2 vector, operation for operation
//!   and sum for sum, so the sums and the bound (and its proof) are AVX2's, bit for bit (the
//!   tests hold both to one scalar model);
//! * llama.cpp's softmax sum ([`exp_sum_sequential`]): the portable loop with each block's
//!   entries found by a mask, added with the platform's `expf`.
//!
//! And the half-precision rows' summary in one pass ([`widen_summarize_f16`],
//! [`widen_summarize_bf16`]): each group of blocks widened, then summarized while in L1.
//!
//! The rest (the exact `expf` and `exp` replicas, the sums that need them) run the portable
//! code on aarch64.
//!
//! NEON is part of the aarch64 base ISA, so the module is compiled only where the target
//! enables it. The functions carry `#[target_feature(enable = "neon")]` all the same (Rust
//! asks for it to call the intrinsics safely), so calls from outside are `unsafe`; SAFETY
//! (callers): the `cfg` that compiles this module is the proof. Inside, the only unsafe
//! operations are loads: `load`'s, whose bounds come from a `&[f32; 4]`, and that of a
//! 16-byte constant.
//!
//! PERF: as with AVX2, safe Rust does not vectorise these loops well: a float `fold` is one
//! dependency chain, and lane arrays are vectorised unevenly (two-lane halves, reloads). Here
//! each pass keeps 16 or 32 floats of independent maxima in flight. They have been checked
//! for agreement with the obvious loops under emulation (qemu-aarch64, `scripts/test-aarch64.sh`);
//! their speed has not been measured on an ARM machine.
//!
//! NaN: `vmaxq_f32` (FMAX) returns NaN where either operand is NaN, so a NaN reaches the
//! block's maximum and the running maximum; the summaries test those for NaN and `+inf`
//! once per block (or once per row).

use super::{Summary, BLOCK};
use crate::candidates::TokenData;
use std::arch::aarch64::*;

/// Four floats into a vector.
#[target_feature(enable = "neon")]
#[inline]
fn load(x: &[f32; 4]) -> float32x4_t {
    // SAFETY: `x` holds 4 readable floats; `vld1q_f32` has no alignment requirement beyond
    // the element's.
    unsafe { vld1q_f32(x.as_ptr()) }
}

/// The lane-wise maximum of one block of 64 floats: a tree over its 16 vectors.
#[target_feature(enable = "neon")]
#[inline]
fn block_lanes(block: &[f32; BLOCK]) -> float32x4_t {
    let (v, _) = block.as_chunks::<4>();
    let mut pairs = [vdupq_n_f32(0.0); 8];
    for (k, p) in pairs.iter_mut().enumerate() {
        *p = vmaxq_f32(load(&v[2 * k]), load(&v[2 * k + 1]));
    }
    let [p0, p1, p2, p3, p4, p5, p6, p7] = pairs;
    vmaxq_f32(vmaxq_f32(vmaxq_f32(p0, p1), vmaxq_f32(p2, p3)), vmaxq_f32(vmaxq_f32(p4, p5), vmaxq_f32(p6, p7)))
}

/// The whole blocks of `row` and its last, partial block padded with `-inf` (or `None`).
fn blocks(row: &[f32]) -> (&[[f32; BLOCK]], Option<[f32; BLOCK]>) {
    let (whole, tail) = row.as_chunks::<BLOCK>();
    (whole, (!tail.is_empty()).then(|| whole_block(tail).into_owned()))
}

/// See [`super::max`].
///
/// # Safety
/// NEON must be enabled (it is wherever this module is compiled: see the module docs).
#[target_feature(enable = "neon")]
pub fn max(row: &[f32]) -> f32 {
    let ninf = vdupq_n_f32(f32::NEG_INFINITY);
    let mut acc = [ninf; 8];
    let (chunks, tail) = row.as_chunks::<32>();
    for c in chunks {
        let (v, _) = c.as_chunks::<4>();
        for (a, x) in acc.iter_mut().zip(v) {
            *a = vmaxq_f32(*a, load(x));
        }
    }
    let [a0, a1, a2, a3, a4, a5, a6, a7] = acc;
    let m = vmaxq_f32(vmaxq_f32(vmaxq_f32(a0, a1), vmaxq_f32(a2, a3)), vmaxq_f32(vmaxq_f32(a4, a5), vmaxq_f32(a6, a7)));
    tail.iter().fold(vmaxvq_f32(m), |m, &x| if x > m { x } else { m })
}

/// A summary pass in progress: the row's blocks are scanned in order, part by part.
struct Scan {
    best: f32,
    best_block: usize,
    /// The index of the next block.
    next: usize,
    suspect: bool,
}

impl Scan {
    fn new() -> Self {
        Self { best: f32::NEG_INFINITY, best_block: 0, next: 0, suspect: false }
    }

    /// Scans the blocks of `part`, the row's next entries (whole blocks, unless it ends the
    /// row), handing each block's maximum to `each_block` in order.
    #[target_feature(enable = "neon")]
    #[inline]
    fn blocks(&mut self, part: &[f32], mut each_block: impl FnMut(f32)) {
        let (whole, padded) = blocks(part);
        for block in whole.iter().chain(padded.as_ref()) {
            let m = vmaxvq_f32(block_lanes(block));
            each_block(m);
            self.suspect |= m.is_nan() || m == f32::INFINITY;
            if m > self.best || self.next == 0 {
                self.best = m;
                self.best_block = self.next;
            }
            self.next += 1;
        }
    }

    fn summary(&self) -> Summary {
        Summary { max: self.best, max_block: self.best_block, suspect: self.suspect }
    }
}

/// See [`super::summarize`].
///
/// # Safety
/// NEON must be enabled (it is wherever this module is compiled: see the module docs).
#[target_feature(enable = "neon")]
pub fn summarize(row: &[f32], block_max: &mut Vec<f32>) -> Summary {
    block_max.reserve(row.len().div_ceil(BLOCK));
    let mut scan = Scan::new();
    scan.blocks(row, |m| block_max.push(m));
    scan.summary()
}

/// See [`super::widen_summarize_f16`]: `half`'s conversion (FP16 instructions where the CPU
/// has them) into `out` a group of eight blocks at a time, each group summarized while it is
/// in L1. Without `out`, each group is widened into a buffer of one group and not kept.
///
/// # Safety
/// NEON must be enabled (it is wherever this module is compiled: see the module docs); `out`,
/// if given, must hold `src.len()` entries.
#[target_feature(enable = "neon")]
pub fn widen_summarize_f16(src: &[half::f16], out: Option<&mut [f32]>, block_max: &mut Vec<f32>) -> Summary {
    use half::slice::HalfFloatSliceExt;
    widen_summarize_with(src, out, block_max, |s, o| s.convert_to_f32_slice(o))
}

/// See [`super::widen_summarize_bf16`] and [`widen_summarize_f16`]: a bf16 is the top half of
/// an f32 (a shift per value, which LLVM vectorises).
///
/// # Safety
/// As [`widen_summarize_f16`].
#[target_feature(enable = "neon")]
pub fn widen_summarize_bf16(src: &[half::bf16], out: Option<&mut [f32]>, block_max: &mut Vec<f32>) -> Summary {
    widen_summarize_with(src, out, block_max, |s, o| {
        for (w, x) in o.iter_mut().zip(s) {
            *w = f32::from_bits(u32::from(x.to_bits()) << 16);
        }
    })
}

/// The body of the `widen_summarize_*` kernels, `widen` converting a part into a slice of the
/// same length.
#[target_feature(enable = "neon")]
#[inline]
fn widen_summarize_with<T>(
    src: &[T],
    out: Option<&mut [f32]>,
    block_max: &mut Vec<f32>,
    widen: impl Fn(&[T], &mut [f32]),
) -> Summary {
    const GROUP: usize = 8 * BLOCK;
    block_max.reserve(src.len().div_ceil(BLOCK));
    let mut scan = Scan::new();
    match out {
        Some(out) => {
            assert_eq!(out.len(), src.len(), "widen_summarize: wrong output length");
            for (s, o) in src.chunks(GROUP).zip(out.chunks_mut(GROUP)) {
                widen(s, o);
                scan.blocks(o, |m| block_max.push(m));
            }
        }
        None => {
            let mut part = [0.0f32; GROUP];
            for s in src.chunks(GROUP) {
                let o = &mut part[..s.len()];
                widen(s, o);
                scan.blocks(o, |m| block_max.push(m));
            }
        }
    }
    scan.summary()
}

/// See [`super::locate_max`]: the horizontal maximum of a block only where one of its lanes
/// passes the best so far; NaN and `+inf` by a running lane-wise maximum (FMAX keeps NaN).
///
/// # Safety
/// NEON must be enabled (it is wherever this module is compiled: see the module docs).
#[target_feature(enable = "neon")]
pub fn locate_max(row: &[f32]) -> Summary {
    let (whole, padded) = blocks(row);
    let mut best = f32::NEG_INFINITY;
    let mut best_v = vdupq_n_f32(best);
    let mut best_block = 0;
    let mut all = best_v;
    for (b, block) in whole.iter().chain(padded.as_ref()).enumerate() {
        let m = block_lanes(block);
        all = vmaxq_f32(all, m);
        if vmaxvq_u32(vcgtq_f32(m, best_v)) != 0 {
            best = vmaxvq_f32(m);
            best_v = vdupq_n_f32(best);
            best_block = b;
        }
    }
    let all = vmaxvq_f32(all);
    Summary { max: best, max_block: best_block, suspect: all.is_nan() || all == f32::INFINITY }
}

/// See [`super::block_max_into`].
///
/// # Safety
/// NEON must be enabled (it is wherever this module is compiled: see the module docs).
#[target_feature(enable = "neon")]
pub fn block_max_into(row: &[f32], out: &mut [f32]) -> f32 {
    let (whole, padded) = blocks(row);
    let mut best = vdupq_n_f32(f32::NEG_INFINITY);
    for (o, block) in out.iter_mut().zip(whole.iter().chain(padded.as_ref())) {
        let m = block_lanes(block);
        best = vmaxq_f32(best, m);
        *o = vmaxvq_f32(m);
    }
    vmaxvq_f32(best)
}

/// See [`super::argmax`]: the first block holding the maximum (as [`locate_max`] finds it),
/// then the first entry of that block equal to it.
///
/// # Safety
/// NEON must be enabled (it is wherever this module is compiled: see the module docs).
#[target_feature(enable = "neon")]
pub fn argmax(row: &[f32]) -> Option<usize> {
    if row.is_empty() {
        return None;
    }
    let s = locate_max(row);
    let at = s.max_block * BLOCK;
    let end = (at + BLOCK).min(row.len());
    // A row of `-inf` (and NaN) only: the first entry, as a scan with `>` gives.
    Some(row[at..end].iter().position(|&x| x == s.max).map_or(0, |i| at + i))
}

/// See [`super::count_ge`]: a compare per 4 values, its all-ones lanes subtracted (+1 each)
/// from 4 counters.
///
/// # Safety
/// NEON must be enabled (it is wherever this module is compiled: see the module docs).
#[target_feature(enable = "neon")]
pub fn count_ge(values: &[f32], threshold: f32) -> usize {
    let t = vdupq_n_f32(threshold);
    let mut n = [vdupq_n_u32(0); 4];
    let (chunks, tail) = values.as_chunks::<16>();
    for c in chunks {
        let (v, _) = c.as_chunks::<4>();
        for (n, x) in n.iter_mut().zip(v) {
            *n = vsubq_u32(*n, vcgeq_f32(load(x), t));
        }
    }
    let [n0, n1, n2, n3] = n;
    // Each counter lane counts at most `values.len() / 16` (no overflow below 2^35 values).
    let lanes = vaddq_u64(vpaddlq_u32(vaddq_u32(n0, n1)), vpaddlq_u32(vaddq_u32(n2, n3)));
    vaddvq_u64(lanes) as usize + tail.iter().filter(|&&x| x >= threshold).count()
}

/// Bit `i` set where `block[i] >= t`, for the first `len` entries of `block` (entries past
/// them are ignored: the caller's `-inf` padding would pass a threshold of `-inf`).
///
/// NEON has no move-mask: each 16 entries' compares are narrowed to 16 bytes of all-ones or
/// zero, ANDed with the bit weights `1, 2, ..., 128` twice, and each half summed across lanes
/// (distinct powers of two, so the sum is their OR).
#[target_feature(enable = "neon")]
#[inline]
fn mask_ge(block: &[f32; BLOCK], len: usize, t: float32x4_t) -> u64 {
    const WEIGHTS: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    // SAFETY: `WEIGHTS` holds 16 readable bytes.
    let weights = unsafe { vld1q_u8(WEIGHTS.as_ptr()) };
    let (v, _) = block.as_chunks::<4>();
    let mut mask = 0u64;
    for (g, quad) in v.chunks_exact(4).enumerate() {
        let c = |k: usize| vmovn_u32(vcgeq_f32(load(&quad[k]), t));
        let bytes = vcombine_u8(vmovn_u16(vcombine_u16(c(0), c(1))), vmovn_u16(vcombine_u16(c(2), c(3))));
        let bits = vandq_u8(bytes, weights);
        let lo = u64::from(vaddv_u8(vget_low_u8(bits)));
        let hi = u64::from(vaddv_u8(vget_high_u8(bits)));
        mask |= (lo | hi << 8) << (16 * g);
    }
    if len < BLOCK {
        mask &= (1u64 << len) - 1;
    }
    mask
}

/// `block` (at most one [`BLOCK`]) as a whole block: itself, or a copy padded with `-inf`.
#[inline]
fn whole_block(block: &[f32]) -> std::borrow::Cow<'_, [f32; BLOCK]> {
    match <&[f32; BLOCK]>::try_from(block) {
        Ok(whole) => std::borrow::Cow::Borrowed(whole),
        Err(_) => {
            let mut pad = [f32::NEG_INFINITY; BLOCK];
            pad[..block.len()].copy_from_slice(block);
            std::borrow::Cow::Owned(pad)
        }
    }
}

/// See [`super::for_each_ge`]: the block's 64 compares into one mask, then a call per set bit.
///
/// # Safety
/// NEON must be enabled (it is wherever this module is compiled: see the module docs).
#[target_feature(enable = "neon")]
pub fn for_each_ge(block: &[f32], threshold: f32, mut f: impl FnMut(usize, f32)) {
    let whole = whole_block(block);
    let mut hits = mask_ge(&whole, block.len(), vdupq_n_f32(threshold));
    while hits != 0 {
        let j = hits.trailing_zeros() as usize;
        hits &= hits - 1;
        f(j, whole[j]);
    }
}

/// See [`super::exp_sum_sequential_patched`]: the portable loop, with each visited block's
/// entries at or above the threshold found by one mask ([`mask_ge`]) instead of a branch per
/// entry. The same entries are added in the same order with the platform's `expf`, so the sum
/// is the portable one, bit for bit.
///
/// # Safety
/// NEON must be enabled (it is wherever this module is compiled: see the module docs).
#[target_feature(enable = "neon")]
pub fn exp_sum_sequential(start: f32, row: &[f32], sub: f32, block_max: &[f32], patches: &[(u32, f32)]) -> f32 {
    super::sequential_blocks(start, row, sub, block_max, patches, |mut sum, block, threshold| {
        let whole = whole_block(block);
        let mut hits = mask_ge(&whole, block.len(), vdupq_n_f32(threshold));
        while hits != 0 {
            sum += (whole[hits.trailing_zeros() as usize] - sub).exp();
            hits &= hits - 1;
        }
        sum
    })
}

/// See [`super::gather_ge`].
///
/// # Safety
/// NEON must be enabled (it is wherever this module is compiled: see the module docs).
#[target_feature(enable = "neon")]
pub fn gather_ge(block: &[f32], base: u32, threshold: f32, out: &mut Vec<TokenData>) {
    for (c, chunk) in block.chunks(BLOCK).enumerate() {
        let whole = whole_block(chunk);
        let mut hits = mask_ge(&whole, chunk.len(), vdupq_n_f32(threshold));
        let first = base + (c * BLOCK) as u32;
        while hits != 0 {
            let j = hits.trailing_zeros() as usize;
            hits &= hits - 1;
            out.push(TokenData { id: first + j as u32, logit: whole[j], p: 0.0 });
        }
    }
}

/// See [`super::gather_blocks_ge`]: the block maxima compared 64 at a time into one mask,
/// then [`gather_ge`]'s mask on each block that reaches the threshold.
///
/// # Safety
/// NEON must be enabled (it is wherever this module is compiled: see the module docs).
#[target_feature(enable = "neon")]
pub fn gather_blocks_ge(row: &[f32], block_max: &[f32], threshold: f32, out: &mut Vec<TokenData>) {
    let t = vdupq_n_f32(threshold);
    for (g, maxima) in block_max.chunks(BLOCK).enumerate() {
        let mut passing = mask_ge(&whole_block(maxima), maxima.len(), t);
        while passing != 0 {
            let start = (g * BLOCK + passing.trailing_zeros() as usize) * BLOCK;
            passing &= passing - 1;
            let block = &row[start..row.len().min(start + BLOCK)];
            let whole = whole_block(block);
            let mut hits = mask_ge(&whole, block.len(), t);
            while hits != 0 {
                let j = hits.trailing_zeros() as usize;
                hits &= hits - 1;
                out.push(TokenData { id: (start + j) as u32, logit: whole[j], p: 0.0 });
            }
        }
    }
}

/// Eight f32 lanes as two vectors: AVX2's `__m256` lane for lane (lanes 0-3, then 4-7), so
/// that the approximate kernels below compute what AVX2's compute, bit for bit.
#[derive(Clone, Copy)]
struct F32x8(float32x4_t, float32x4_t);

impl F32x8 {
    #[target_feature(enable = "neon")]
    #[inline]
    fn splat(x: f32) -> Self {
        Self(vdupq_n_f32(x), vdupq_n_f32(x))
    }

    #[target_feature(enable = "neon")]
    #[inline]
    fn load(x: &[f32; 8]) -> Self {
        let (v, _) = x.as_chunks::<4>();
        Self(load(&v[0]), load(&v[1]))
    }

    /// Lane by lane, `f(self, other)`.
    #[target_feature(enable = "neon")]
    #[inline]
    fn zip(self, o: Self, f: impl Fn(float32x4_t, float32x4_t) -> float32x4_t) -> Self {
        Self(f(self.0, o.0), f(self.1, o.1))
    }
}

/// The constants of [`exp2_approx`], set once per kernel call.
struct Exp2Consts {
    poly: [F32x8; 6],
    y_min: F32x8,
    magic: F32x8,
}

impl Exp2Consts {
    #[target_feature(enable = "neon")]
    #[inline]
    fn new() -> Self {
        Self {
            poly: super::EXP2_POLY.map(|c| F32x8::splat(c)),
            y_min: F32x8::splat(super::APPROX_Y_MIN),
            magic: F32x8::splat(12_582_912.0), // 1.5·2^23
        }
    }
}

/// AVX2's `exp2_approx` (see [`super::avx2`]) on the same 8 lanes, operation for operation:
/// `2^y` for `y <= 0.5`, within [`super::APPROX_POLY_REL_ERROR`] for `y >=`
/// [`super::APPROX_Y_MIN`]. The clamp is FMAXNM, which like `vmaxps` with the constant second
/// gives the constant for a NaN `y`; the fused multiply-adds are FMLA (`p·f + c`, one
/// rounding); the rest is exact or rounds as AVX2's does. Returns the result and the clamped
/// `y`.
#[target_feature(enable = "neon")]
#[inline]
fn exp2_approx(y: F32x8, c: &Exp2Consts) -> (F32x8, F32x8) {
    let y = y.zip(c.y_min, |a, b| vmaxnmq_f32(a, b));
    let k = y.zip(c.magic, |a, b| vaddq_f32(a, b));
    // `y - n` is exact: `n` is the integer nearest `y`, and `y`'s ulp divides it.
    let f = y.zip(k.zip(c.magic, |a, b| vsubq_f32(a, b)), |a, b| vsubq_f32(a, b));
    // Estrin's scheme, as AVX2's: `a·b + c` is `vfmaq_f32(c, a, b)`.
    let fma = |a: F32x8, b: F32x8, c: F32x8| F32x8(vfmaq_f32(c.0, a.0, b.0), vfmaq_f32(c.1, a.1, b.1));
    let f2 = f.zip(f, |a, b| vmulq_f32(a, b));
    let pair = |hi: usize| fma(c.poly[hi], f, c.poly[hi - 1]);
    let p = fma(fma(pair(5), f2, pair(3)), f2, pair(1));
    // `k`'s low mantissa bits hold `n` (two's complement); shifted into the exponent field
    // they add `n` to `p`'s exponent (the high bits of the magic constant shift out).
    let scale = |p: float32x4_t, k: float32x4_t| {
        let n = vshlq_n_u32::<23>(vreinterpretq_u32_f32(k));
        vreinterpretq_f32_u32(vaddq_u32(vreinterpretq_u32_f32(p), n))
    };
    (p.zip(k, scale), y)
}

/// See [`super::exp_block_sums_approx`]: AVX2's kernel (see [`super::avx2`]) on NEON, lane for
/// lane and sum for sum, so the sums, the returned bound and the bound's proof are AVX2's.
///
/// # Safety
/// NEON must be enabled (it is wherever this module is compiled: see the module docs).
#[target_feature(enable = "neon")]
pub fn exp_block_sums_approx(src: &[f32], div: f32, sub: f32, out: &mut [f64]) -> f64 {
    approx_sums(src, div, sub, 0..out.len(), out)
}

/// See [`super::exp_block_sums_approx_at`]: [`exp_block_sums_approx`] over the listed blocks.
///
/// # Safety
/// NEON must be enabled (it is wherever this module is compiled: see the module docs).
#[target_feature(enable = "neon")]
pub fn exp_block_sums_approx_at(src: &[f32], div: f32, sub: f32, blocks: &[u32], out: &mut [f64]) -> f64 {
    approx_sums(src, div, sub, blocks.iter().map(|&b| b as usize), out)
}

/// The kernel of [`exp_block_sums_approx`], over the blocks `ids` names (each `< out.len()`):
/// per block, `Σ 2^y` with `y = fl(x·(log2 e / div) + (-sub·log2 e))` accumulated per lane in
/// f32, and `Σ -2^y·y` beside it; AVX2's order of every addition (two chains of 8 lanes over
/// the block's 16-float chunks, joined, widened to f64 as lanes `i` and `i + 4`, then halves
/// and pairs). The last, partial block uses the exact weights.
#[target_feature(enable = "neon")]
#[inline]
fn approx_sums(src: &[f32], div: f32, sub: f32, ids: impl Iterator<Item = usize>, out: &mut [f64]) -> f64 {
    let a = F32x8::splat((std::f64::consts::LOG2_E / div as f64) as f32);
    let b = F32x8::splat((-(sub as f64) * std::f64::consts::LOG2_E) as f32);
    let consts = Exp2Consts::new();
    let zero = F32x8::splat(0.0);
    // f64 lanes 0-1 and 2-3 of AVX2's `__m256d` accumulators.
    let mut total = [vdupq_n_f64(0.0); 2];
    let mut weighted = [vdupq_n_f64(0.0); 2];
    let mut entries = 0;
    for id in ids {
        let start = id * BLOCK;
        let Some(block) = src.get(start..(start + BLOCK).min(src.len())) else { continue };
        entries += block.len();
        let Ok(block) = <&[f32; BLOCK]>::try_from(block) else {
            // The last, partial block: exact weights (exact sums need no bound).
            out[id] = block.iter().map(|&x| (x / div - sub).exp() as f64).sum();
            continue;
        };
        let (mut acc, mut acc1, mut acc_y, mut acc_y1) = (zero, zero, zero, zero);
        let (chunks, _) = block.as_chunks::<16>();
        for c in chunks {
            let (c0, c1) = c.split_at(8);
            let arg = |x: &[f32]| {
                let x = F32x8::load(x.try_into().expect("8 floats"));
                // x·a + b, one rounding.
                F32x8(vfmaq_f32(b.0, x.0, a.0), vfmaq_f32(b.1, x.1, a.1))
            };
            let (w, y) = exp2_approx(arg(c0), &consts);
            let (w1, y1) = exp2_approx(arg(c1), &consts);
            acc = acc.zip(w, |s, w| vaddq_f32(s, w));
            acc1 = acc1.zip(w1, |s, w| vaddq_f32(s, w));
            // `y <= 0` but for rounding (see `super::approx_sums_error`): adds `-w·y`, one
            // rounding (AVX2's `fnmadd`).
            acc_y = F32x8(vfmsq_f32(acc_y.0, w.0, y.0), vfmsq_f32(acc_y.1, w.1, y.1));
            acc_y1 = F32x8(vfmsq_f32(acc_y1.0, w1.0, y1.0), vfmsq_f32(acc_y1.1, w1.1, y1.1));
        }
        let acc = acc.zip(acc1, |s, t| vaddq_f32(s, t));
        let acc_y = acc_y.zip(acc_y1, |s, t| vaddq_f32(s, t));
        // f64 lane `i` is lane `i` plus lane `i + 4`.
        let sums = [
            vaddq_f64(vcvt_f64_f32(vget_low_f32(acc.0)), vcvt_f64_f32(vget_low_f32(acc.1))),
            vaddq_f64(vcvt_high_f64_f32(acc.0), vcvt_high_f64_f32(acc.1)),
        ];
        for k in 0..2 {
            total[k] = vaddq_f64(total[k], sums[k]);
        }
        weighted[0] = vaddq_f64(weighted[0], vcvt_f64_f32(vget_low_f32(acc_y.0)));
        weighted[1] = vaddq_f64(weighted[1], vcvt_high_f64_f32(acc_y.0));
        weighted[0] = vaddq_f64(weighted[0], vcvt_f64_f32(vget_low_f32(acc_y.1)));
        weighted[1] = vaddq_f64(weighted[1], vcvt_high_f64_f32(acc_y.1));
        let pair = vaddq_f64(sums[0], sums[1]);
        out[id] = vgetq_lane_f64::<0>(pair) + vgetq_lane_f64::<1>(pair);
    }
    let lanes = |v: [float64x2_t; 2]| {
        [vgetq_lane_f64::<0>(v[0]), vgetq_lane_f64::<1>(v[0]), vgetq_lane_f64::<0>(v[1]), vgetq_lane_f64::<1>(v[1])]
    };
    super::approx_sums_error(lanes(total).iter().sum(), lanes(weighted).iter().sum(), sub, entries)
}

/// For the tests: [`exp2_approx`] on 8 values.
#[cfg(test)]
#[target_feature(enable = "neon")]
pub(super) fn exp2_approx_lanes(y: &[f32; 8]) -> [f32; 8] {
    let (w, _) = exp2_approx(F32x8::load(y), &Exp2Consts::new());
    let mut out = [0.0f32; 8];
    let (halves, _) = out.as_chunks_mut::<4>();
    // SAFETY: each half holds 4 writable floats.
    unsafe {
        vst1q_f32(halves[0].as_mut_ptr(), w.0);
        vst1q_f32(halves[1].as_mut_ptr(), w.1);
    }
    out
}
