//! AVX-512 versions of kernels, 16 lanes instead of [`super::avx2`]'s 8: the approximate
//! block sums ([`super::exp_block_sums_approx`] and [`super::exp_block_sums_approx_at`]), behind
//! `dist`'s and transformers `top_p`'s bounds, and the block scan and the additions of
//! [`super::exp_sum_sequential`] (llama.cpp's softmax sum; see [`exp_sum_sequential`] here).
//! Besides, the summaries that widen or patch the row as they go ([`widen_summarize_f16`] and
//! others): AVX2's 8-lane kernels with AVX-512VL's mask compares as their NaN watch
//! (`OrderedMasks`); and on 16 lanes, the floor's [`max`], [`summarize`], [`block_max_into`],
//! the summaries of f16 and bf16 rows that keep no widened row ([`summarize_f16`],
//! [`summarize_bf16`]), greedy's [`locate_max`], `gather_blocks_ge` and the small sorts
//! (`sort_keys_by_rank`).
//!
//! Every lane computes what an AVX2 lane computes, operation for operation (the same fused
//! multiply-add for the argument, the same clamp, rounding trick and quintic, the same exponent
//! addition), so each weight has the same bits and the same error, and the error bound of
//! `approx_sums_error` carries over. Only the f32 lane sums are shorter (4 terms per
//! lane and block instead of 8), which the bound's 7 roundings per lane already cover. The
//! tests check the weights bit for bit against the AVX2 kernel and the sums against the bound.
//! The same holds for the exact `expf` replica here (`expf16`): glibc's algorithm with
//! AVX2's operations lane for lane, the table read by two permutes and a blend from registers
//! instead of a gather from memory; the tests check it against the platform's `expf`.
//!
//! Every function is `unsafe` for one reason only: it is compiled with
//! `#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]` (and `avx512vl` for the
//! widening and patching summaries). SAFETY (callers): [`super`] calls
//! these only after `is_x86_feature_detected!` returned true for `avx512f`, `popcnt`, `avx2`
//! and `fma` (and `avx512vl` for those).
//! Inside, the only other unsafe operations are unaligned loads and stores (`loadu`, `storeu`,
//! their masked forms, no alignment requirement) whose bounds come from the slices they
//! access, and aligned loads (`load`) at addresses `Realign16` rounds down to a 64-byte
//! boundary within the row.
//!
//! PERF: on the development machine (a Sapphire Rapids Xeon) the approximate kernel sums 1.7
//! times as many weights per second as the AVX2 one.

use super::avx2::{
    self, APPROX_CERTAIN, APPROX_RHO, APPROX_RHO_Y, APPROX_SCALE_MAX, EXP2F_TAB, EXPF_INV_LN2_N, EXPF_POLY, EXPF_SHIFT,
    EXPF_UFLOW, GROUP, INCREMENTS_MAX,
};
use super::{Summary, APPROX_Y_MIN, BLOCK, EXP2_POLY};
use crate::TokenData;
use std::arch::x86_64::*;

/// See [`super::max`]: [`super::avx2::max`] on 16 lanes. Eight accumulators of 16 floats
/// (128 floats a step); the entries before the row's first 64-byte boundary are taken one by
/// one, so that every vector load is aligned and none straddles two cache lines.
///
/// PERF: this is the bench's floor on CPUs with AVX-512F. On an Intel Xeon with AVX-512
/// (alternating call by call, aligned rows) the 8-lane pass took 1.56–1.94 µs where this one
/// took 1.23–1.51 at V = 32,000, and 6.1–7.6 against 4.8–6.0 at 128,256: the 8-lane pass was
/// no floor there, and every ratio to it flattered the sampling by a fifth or more.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA, BMI1 and POPCNT.
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
pub unsafe fn max(row: &[f32]) -> f32 {
    let mut a = [_mm512_set1_ps(f32::NEG_INFINITY); 8];
    let head = row.as_ptr().align_offset(64).min(row.len());
    let (first, row) = row.split_at(head);
    let (steps, rest) = row.as_chunks::<128>();
    for c in steps {
        let p = c.as_ptr();
        for (k, acc) in a.iter_mut().enumerate() {
            // SAFETY: `c` holds 128 floats from a 64-byte boundary, so the eight aligned
            // 16-float loads at p, p+16, ..., p+112 are in bounds.
            *acc = _mm512_max_ps(*acc, _mm512_load_ps(p.add(16 * k)));
        }
    }
    let (vectors, tail) = rest.as_chunks::<16>();
    for v in vectors {
        // SAFETY: `v` holds 16 floats.
        a[0] = _mm512_max_ps(a[0], _mm512_loadu_ps(v.as_ptr()));
    }
    let quads =
        [_mm512_max_ps(a[0], a[1]), _mm512_max_ps(a[2], a[3]), _mm512_max_ps(a[4], a[5]), _mm512_max_ps(a[6], a[7])];
    let m = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(quads[0], quads[1]), _mm512_max_ps(quads[2], quads[3])));
    first.iter().chain(tail).fold(m, |m, &x| if x > m { x } else { m })
}

/// See [`super::summarize`]: [`super::avx2::summarize`] on 16 lanes. Per block of 64
/// entries: four loads, a max tree of three `vmaxps`, and two masked compares `ordered(x, y)`
/// ANDed into running masks (every entry compared: the NaN watch is exact). The horizontal
/// maxima sixteen blocks at a time (`hmax16`: the roots merged into one vector of sixteen
/// maxima, stored at once), the best block found afterwards among the stored
/// maxima. A row that is not 64-byte aligned is read by aligned loads (`Realign16`).
///
/// PERF: on an Intel Xeon with AVX-512 (one process, alternating call by call with the
/// floor, the 16-lane [`max`], and with AVX2's kernel; medians, V = 32,000 and 128,256, rows
/// aligned and 16 bytes past a 64-byte boundary, over several spells of the noisy host): 1.0–1.25×
/// the floor, against 1.3–1.8× for AVX2's kernel. The 8-lane kernel with `OrderedMasks` had
/// taken 1.08–1.17× the 8-lane max, itself 1.2–1.25× this floor. Merging the roots by
/// unpacks and shuffles alone (30 shuffles per 16 blocks) cost about 11% of the pass
/// (measured by leaving the merge out); `hmax16` needs half as many shuffles.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA, BMI1 and POPCNT.
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
pub unsafe fn summarize(row: &[f32], block_max: &mut Vec<f32>) -> Summary {
    let n_blocks = row.len().div_ceil(BLOCK);
    block_max.resize(n_blocks, f32::NEG_INFINITY);
    let out = &mut block_max[..n_blocks];
    let (best, nan) = block_maxima::<true>(row, out);
    // The first block holding the maximum (`==`, so either zero matches the other).
    let best_block = avx2::first_eq(out, best).unwrap_or(0);
    let best = out.get(best_block).copied().unwrap_or(f32::NEG_INFINITY);
    Summary { max: best, max_block: best_block, suspect: nan || best == f32::INFINITY }
}

/// See [`super::block_max_into`]: [`summarize`]'s pass without the NaN watch.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA, BMI1 and POPCNT; `out` must hold
/// `row.len().div_ceil(BLOCK)` entries.
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
pub unsafe fn block_max_into(row: &[f32], out: &mut [f32]) -> f32 {
    block_maxima::<false>(row, out).0
}

/// The maximum of every block of `row` into `out` (`row.len().div_ceil(BLOCK)` entries); returns
/// the row's maximum and, with `WATCH`, whether it holds a NaN (exactly).
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn block_maxima<const WATCH: bool>(row: &[f32], out: &mut [f32]) -> (f32, bool) {
    let len = row.len();
    assert_eq!(out.len(), len.div_ceil(BLOCK), "block_maxima: wrong output length");
    let mut ordered: [__mmask16; 2] = [0xffff; 2];
    let mut root = |x: [__m512; 4]| {
        let [x0, x1, x2, x3] = x;
        if WATCH {
            ordered[0] = _mm512_mask_cmp_ps_mask::<_CMP_ORD_Q>(ordered[0], x0, x1);
            ordered[1] = _mm512_mask_cmp_ps_mask::<_CMP_ORD_Q>(ordered[1], x2, x3);
        }
        _mm512_max_ps(_mm512_max_ps(x0, x1), _mm512_max_ps(x2, x3))
    };
    let realign = Realign16::of(row.as_ptr());
    let p = row.as_ptr();
    let mut best_v = _mm512_set1_ps(f32::NEG_INFINITY);
    let groups = len / (16 * BLOCK);
    for b in (0..groups).map(|g| 16 * g) {
        let mut roots = [_mm512_setzero_ps(); 16];
        match realign {
            Some(ra) if ra.fits(b, len) && ra.fits(b + 15, len) => {
                for (k, r) in roots.iter_mut().enumerate() {
                    // SAFETY: blocks `b..b + 16` fit: the floats around each are in the row.
                    *r = root(ra.block(p.add((b + k) * BLOCK)));
                }
            }
            _ => {
                for (k, r) in roots.iter_mut().enumerate() {
                    // SAFETY: blocks `b..b + 16` are whole blocks of the row.
                    *r = root(load_block16(p.add((b + k) * BLOCK)));
                }
            }
        }
        let v = hmax16(&roots);
        // SAFETY: `b + 16 <= out.len()`: this group's blocks are whole.
        _mm512_storeu_ps(out.as_mut_ptr().add(b), v);
        best_v = _mm512_max_ps(best_v, v);
    }
    let mut best = _mm512_reduce_max_ps(best_v);
    let done = groups * 16 * BLOCK;
    for (c, b) in row[done..].chunks(BLOCK).zip(groups * 16..) {
        // A short block is padded with its own first entry, which changes neither its
        // maximum nor its NaN status.
        let mut pad = [c[0]; BLOCK];
        pad[..c.len()].copy_from_slice(c);
        // SAFETY: `pad` holds BLOCK = 64 floats.
        out[b] = _mm512_reduce_max_ps(root(load_block16(pad.as_ptr())));
        best = best.max(out[b]);
    }
    (best, ordered[0] & ordered[1] != 0xffff)
}

/// The horizontal maxima of sixteen vectors as one vector (lane `k` from `m[k]`), by four
/// rounds of merges: each merge of two vectors is one blend (the lanes that stay in place),
/// one shuffle (the lanes that move) and one `max`, and halves the lanes each block's partial
/// maximum spans (16, 8, 4, 2, 1). The inputs are taken in bit-reversed order, which the
/// merges undo. 15 shuffles, 15 blends and 15 `max` for sixteen blocks, where a transpose by
/// unpacks and shuffles alone takes 30 shuffles (Intel cores run shuffles on one port only).
/// NaN lanes may be dropped (the caller's watch sees them).
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn hmax16(m: &[__m512; 16]) -> __m512 {
    // Block `j`'s partial maxima sit where the blend keeps `p` (mask clear) or `q` (set); the
    // shuffle brings each block's other half there.
    let merge = |p: __m512, q: __m512, keep_q: __mmask16, other: __m512| {
        _mm512_max_ps(_mm512_mask_blend_ps(keep_q, p, q), other)
    };
    // Round 1: lanes 0-7 of `p`'s block, 8-15 of `q`'s.
    let r1 = |p: __m512, q: __m512| merge(p, q, 0xff00, _mm512_shuffle_f32x4::<0x4e>(p, q));
    // Round 2: 128-bit chunks `[p0, q0, p1, q1]` (`p0`: `p`'s first block).
    let idx2 = _mm512_setr_epi32(4, 5, 6, 7, 16, 17, 18, 19, 12, 13, 14, 15, 24, 25, 26, 27);
    let r2 = |p: __m512, q: __m512| merge(p, q, 0xf0f0, _mm512_permutex2var_ps(p, idx2, q));
    // Round 3: per chunk, two lanes of `p`'s block there, then two of `q`'s.
    let r3 = |p: __m512, q: __m512| merge(p, q, 0xcccc, _mm512_shuffle_ps::<0x4e>(p, q));
    // Round 4: per chunk, lanes `[p, q, p, q]`.
    let idx4 = _mm512_setr_epi32(1, 16, 3, 18, 5, 20, 7, 22, 9, 24, 11, 26, 13, 28, 15, 30);
    let r4 = |p: __m512, q: __m512| merge(p, q, 0xaaaa, _mm512_permutex2var_ps(p, idx4, q));
    // Slot `j` takes block `rev(j)`, the 4-bit reversal of `j`: then lane `k` of the result
    // holds block `k`.
    let s = |j: usize| m[[0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15][j]];
    let a: [__m512; 8] = std::array::from_fn(|i| r1(s(2 * i), s(2 * i + 1)));
    let b: [__m512; 4] = std::array::from_fn(|i| r2(a[2 * i], a[2 * i + 1]));
    let c: [__m512; 2] = std::array::from_fn(|i| r3(b[2 * i], b[2 * i + 1]));
    r4(c[0], c[1])
}

/// See [`super::widen_summarize_f16`]: [`super::avx2`]'s kernel, with the NaN watch of
/// `OrderedMasks`.
///
/// PERF: [`summarize_f16`]'s 16-lane pass storing each block's four vectors into `out` as it
/// goes was no faster at V = 32,000 and slower at 128,256 (about 35 against 27 µs, Intel Xeon,
/// alternating): writing the widened row, not converting it, bounds this pass, and the eight
/// blocks at a time that this kernel widens into `out` and reads back from L1 write it faster.
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512VL, AVX2, FMA and F16C; `out`, if given, must hold
/// `src.len()` entries.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,bmi1,popcnt,f16c")]
pub unsafe fn widen_summarize_f16(src: &[half::f16], out: Option<&mut [f32]>, block_max: &mut Vec<f32>) -> Summary {
    // SAFETY (closure): this function's features include `widen_f16`'s.
    avx2::widen_summarize_with::<OrderedMasks, _>(src, out, block_max, |s, o| unsafe { avx2::widen_f16(s, o) })
}

/// See [`super::widen_summarize_bf16`]: [`super::avx2`]'s kernel, with the NaN watch of
/// `OrderedMasks`.
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512VL, AVX2, FMA, BMI1 and POPCNT; `out`, if given, must hold
/// `src.len()` entries.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,bmi1,popcnt")]
pub unsafe fn widen_summarize_bf16(src: &[half::bf16], out: Option<&mut [f32]>, block_max: &mut Vec<f32>) -> Summary {
    // SAFETY (closure): this function's features include `widen_bf16`'s.
    avx2::widen_summarize_with::<OrderedMasks, _>(src, out, block_max, |s, o| unsafe { avx2::widen_bf16(s, o) })
}

/// See [`super::summarize_f16`]: [`summarize`]'s pass over the row as it is widened, sixteen
/// entries per conversion (`vcvtph2ps`), each block summarized in registers and nothing
/// written but the block maxima.
///
/// PERF: AVX2's kernel (eight entries per conversion, each group of eight blocks widened into
/// a buffer, then summarized from L1), with AVX-512VL's NaN watch, had `greedy` on f16 rows
/// at 3.4–4.1 times the f32 floor at V = 32,000 and 128,256 (Intel Xeon); this pass, at
/// 1.8–2.3 times.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA, BMI1 and POPCNT (the 16-lane conversion is
/// AVX-512F's).
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
pub unsafe fn summarize_f16(src: &[half::f16], block_max: &mut Vec<f32>) -> Summary {
    summarize_half::<F16>(src, block_max)
}

/// See [`super::summarize_bf16`]: as [`summarize_f16`], a bf16 widened by a zero extension
/// and a shift (it is the top half of an f32).
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA, BMI1 and POPCNT.
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
pub unsafe fn summarize_bf16(src: &[half::bf16], block_max: &mut Vec<f32>) -> Summary {
    summarize_half::<Bf16>(src, block_max)
}

/// A half-precision type the 16-lane summaries read, sixteen entries at a time.
trait Widen16 {
    type Half: Copy;
    /// The 16 entries at `p` as f32.
    ///
    /// # Safety
    /// The CPU must support AVX-512F; `p` must point to 16 readable entries.
    unsafe fn widen(p: *const Self::Half) -> __m512;
}

struct F16;
struct Bf16;

impl Widen16 for F16 {
    type Half = half::f16;
    #[inline(always)]
    unsafe fn widen(p: *const half::f16) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }
}

impl Widen16 for Bf16 {
    type Half = half::bf16;
    #[inline(always)]
    unsafe fn widen(p: *const half::bf16) -> __m512 {
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i))))
    }
}

/// [`block_maxima`] with its watch over the row as [`Widen16::widen`] gives it: the same tree
/// and merge per block, so the same maxima bit for bit, and the same exact NaN watch. The
/// blocks after the last whole group of sixteen are widened from a copy padded with the
/// block's own first entry, which changes neither its maximum nor its NaN status.
///
/// PERF: compiled with the callers' features (not merely inlined into them), so that the
/// closure defined here gets them too and its intrinsics inline (without, each was a call,
/// and the pass 8 times slower).
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn summarize_half<W: Widen16>(src: &[W::Half], block_max: &mut Vec<f32>) -> Summary {
    let len = src.len();
    let n_blocks = len.div_ceil(BLOCK);
    block_max.resize(n_blocks, f32::NEG_INFINITY);
    let bm = &mut block_max[..n_blocks];
    let mut ordered: [__mmask16; 2] = [0xffff; 2];
    // SAFETY (callers): `at` points to a block of 64 readable entries.
    let mut root = |at: *const W::Half| {
        let x: [__m512; 4] = std::array::from_fn(|j| W::widen(at.add(16 * j)));
        ordered[0] = _mm512_mask_cmp_ps_mask::<_CMP_ORD_Q>(ordered[0], x[0], x[1]);
        ordered[1] = _mm512_mask_cmp_ps_mask::<_CMP_ORD_Q>(ordered[1], x[2], x[3]);
        _mm512_max_ps(_mm512_max_ps(x[0], x[1]), _mm512_max_ps(x[2], x[3]))
    };
    let p = src.as_ptr();
    let mut best_v = _mm512_set1_ps(f32::NEG_INFINITY);
    let groups = len / (16 * BLOCK);
    for b in (0..groups).map(|g| 16 * g) {
        let mut roots = [_mm512_setzero_ps(); 16];
        for (k, r) in roots.iter_mut().enumerate() {
            // Blocks `b..b + 16` are whole blocks of `src`.
            *r = root(p.add((b + k) * BLOCK));
        }
        let v = hmax16(&roots);
        // SAFETY: `b + 16 <= bm.len()`: this group's blocks are whole.
        _mm512_storeu_ps(bm.as_mut_ptr().add(b), v);
        best_v = _mm512_max_ps(best_v, v);
    }
    let mut best = _mm512_reduce_max_ps(best_v);
    let done = groups * 16 * BLOCK;
    for (c, b) in src[done..].chunks(BLOCK).zip(groups * 16..) {
        let mut pad = [c[0]; BLOCK];
        pad[..c.len()].copy_from_slice(c);
        bm[b] = _mm512_reduce_max_ps(root(pad.as_ptr()));
        best = best.max(bm[b]);
    }
    let nan = ordered[0] & ordered[1] != 0xffff;
    // The first block holding the maximum (`==`, so either zero matches the other).
    let best_block = avx2::first_eq(bm, best).unwrap_or(0);
    let best = bm.get(best_block).copied().unwrap_or(f32::NEG_INFINITY);
    Summary { max: best, max_block: best_block, suspect: nan || best == f32::INFINITY }
}

/// See [`super::patch_summarize`]: [`super::avx2`]'s kernel, with the NaN watch of
/// `OrderedMasks`.
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512VL, AVX2, FMA, BMI1 and POPCNT; as [`super::avx2::patch_summarize`]
/// for the arguments.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,bmi1,popcnt")]
pub(crate) unsafe fn patch_summarize(
    src: &[f32],
    edits: &[(u32, f32)],
    div: f32,
    out: &mut [f32],
    block_max: &mut Vec<f32>,
) -> Summary {
    avx2::patch_summarize_with::<OrderedMasks>(src, edits, div, out, block_max)
}

/// See [`super::locate_max`]: [`super::avx2::locate_max`]'s scan on 16 lanes. Per block of 64
/// entries: four aligned loads (the row is scanned from its first 64-byte boundary, in blocks
/// of its own, as [`avx2::locate_max`] does from a 32-byte one), a max tree of three
/// `vmaxps`, two masked compares `ordered(x, y)` ANDed into running masks (the NaN watch:
/// every entry is compared, so it is exact), and one compare of the root with the best so far;
/// the horizontal maximum only where that fires.
///
/// PERF: on an Intel Xeon with AVX-512 (one process, alternating call by call with the
/// 16-lane [`max`], the floor, and the 8-lane scan, rows aligned and 16 bytes past a 64-byte
/// boundary): 1.01–1.04× the floor at V = 32,000 and 1.005–1.03× at 128,256, where the 8-lane
/// scan took 1.48–1.55× it.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA, BMI1 and POPCNT.
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
pub unsafe fn locate_max(row: &[f32]) -> Summary {
    // SAFETY (closure): this function's features are `locate_blocks16`'s.
    avx2::locate_from_boundary(row, 64, |body| unsafe { locate_blocks16(body) })
}

/// [`locate_max`] in the blocks of `row` itself.
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn locate_blocks16(row: &[f32]) -> Summary {
    let mut ordered: [__mmask16; 2] = [0xffff; 2];
    let mut best = f32::NEG_INFINITY;
    let mut best_v = _mm512_set1_ps(best);
    // The start of the best block so far (a pointer: see `avx2::locate_blocks`).
    let mut best_at = row.as_ptr();
    let mut scan = |x: [__m512; 4], at: *const f32| {
        let [x0, x1, x2, x3] = x;
        ordered[0] = _mm512_mask_cmp_ps_mask::<_CMP_ORD_Q>(ordered[0], x0, x1);
        ordered[1] = _mm512_mask_cmp_ps_mask::<_CMP_ORD_Q>(ordered[1], x2, x3);
        let root = _mm512_max_ps(_mm512_max_ps(x0, x1), _mm512_max_ps(x2, x3));
        // `!(root <= best)`: a lane above the best so far, or a NaN lane (which the watch
        // has seen).
        if _mm512_cmp_ps_mask::<_CMP_NLE_UQ>(root, best_v) != 0 {
            let bm = _mm512_reduce_max_ps(root);
            if bm > best {
                best = bm;
                best_v = _mm512_set1_ps(best);
                best_at = at;
            }
        }
    };
    let (blocks, tail) = row.as_chunks::<BLOCK>();
    for c in blocks {
        // SAFETY: `c` holds BLOCK = 64 floats.
        scan(load_block16(c.as_ptr()), c.as_ptr());
    }
    if let Some(&first) = tail.first() {
        // Padded with its own first entry, which changes neither its maximum nor its NaN
        // status.
        let mut buf = [first; BLOCK];
        buf[..tail.len()].copy_from_slice(tail);
        // SAFETY: `buf` holds BLOCK = 64 floats; `at` is only compared, never read.
        scan(load_block16(buf.as_ptr()), tail.as_ptr());
    }
    let best_block = (best_at as usize - row.as_ptr() as usize) / (BLOCK * std::mem::size_of::<f32>());
    let suspect = ordered[0] & ordered[1] != 0xffff || best == f32::INFINITY;
    Summary { max: best, max_block: best_block, suspect }
}

/// The NaN watch of AVX-512VL: per block, four masked compares `ordered(x, y)` of pairs of its
/// eight vectors, each ANDed into one of four running masks (the mask operand of `vcmpps`, so
/// one instruction per two vectors and no extra step). A lane stays set while both of its
/// entries are ordered, so a mask bit cleared means a NaN, exactly (no false alarm). Against
/// AVX2's sum of the tree's first operands (before AVX2 compared them instead): four
/// instructions instead of eight per block, which brought the 8-lane summary to within a few
/// percent of an 8-lane max pass (Zen 4). Now only the widening and patching summaries use it;
/// [`summarize`] and [`locate_max`] run on 16 lanes with two such compares per block.
struct OrderedMasks([__mmask8; 4]);

impl avx2::NanWatch for OrderedMasks {
    #[inline(always)]
    unsafe fn new() -> Self {
        Self([0xff; 4])
    }

    #[inline(always)]
    unsafe fn block(&mut self, x: [__m256; 8]) -> __m256 {
        let [x0, x1, x2, x3, x4, x5, x6, x7] = x;
        self.0[0] = _mm256_mask_cmp_ps_mask::<_CMP_ORD_Q>(self.0[0], x0, x1);
        self.0[1] = _mm256_mask_cmp_ps_mask::<_CMP_ORD_Q>(self.0[1], x2, x3);
        self.0[2] = _mm256_mask_cmp_ps_mask::<_CMP_ORD_Q>(self.0[2], x4, x5);
        self.0[3] = _mm256_mask_cmp_ps_mask::<_CMP_ORD_Q>(self.0[3], x6, x7);
        _mm256_max_ps(
            _mm256_max_ps(_mm256_max_ps(x0, x1), _mm256_max_ps(x2, x3)),
            _mm256_max_ps(_mm256_max_ps(x4, x5), _mm256_max_ps(x6, x7)),
        )
    }

    #[inline(always)]
    unsafe fn block_kept(&mut self, x: [__m256; 8]) -> __m256 {
        // Every entry was compared: the root carries nothing new.
        self.block(x)
    }

    #[inline(always)]
    unsafe fn keep(&mut self, _root: __m256) {}

    #[inline(always)]
    unsafe fn seen(&self) -> bool {
        self.0.iter().fold(0xff, |m, &k| m & k) != 0xff
    }
}

/// The constants of [`exp2_approx_with`], set once per kernel call.
struct Exp2Consts {
    poly: [__m512; 6],
    y_min: __m512,
    magic: __m512,
}

impl Exp2Consts {
    #[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
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
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn exp2_approx_with(y: __m512, c: &Exp2Consts) -> (__m512, __m512) {
    let y = _mm512_max_ps(y, c.y_min);
    let k = _mm512_add_ps(y, c.magic);
    // `y - n` is exact: `n` is the integer nearest `y`, and `y`'s ulp divides it.
    let f = _mm512_sub_ps(y, _mm512_sub_ps(k, c.magic));
    // Estrin's scheme, as AVX2's.
    let f2 = _mm512_mul_ps(f, f);
    let pair = |hi: usize| _mm512_fmadd_ps(c.poly[hi], f, c.poly[hi - 1]);
    let p = _mm512_fmadd_ps(_mm512_fmadd_ps(pair(5), f2, pair(3)), f2, pair(1));
    // `k`'s low mantissa bits hold `n`; shifted into the exponent field they add `n` to `p`'s.
    let n = _mm512_slli_epi32::<23>(_mm512_castps_si512(k));
    (_mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p), n)), y)
}

/// [`exp2_approx_with`] with its constants, for the tests.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA, BMI1 and POPCNT.
#[cfg(test)]
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
pub(super) unsafe fn exp2_approx(y: __m512) -> (__m512, __m512) {
    exp2_approx_with(y, &Exp2Consts::new())
}

/// See [`super::exp_block_sums_approx`].
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA, BMI1 and POPCNT.
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
pub unsafe fn exp_block_sums_approx(src: &[f32], div: f32, sub: f32, out: &mut [f64]) -> f64 {
    approx_sums(src, div, sub, 0..out.len(), out)
}

/// See [`super::exp_block_sums_approx_at`].
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA, BMI1 and POPCNT.
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
pub unsafe fn exp_block_sums_approx_at(src: &[f32], div: f32, sub: f32, blocks: &[u32], out: &mut [f64]) -> f64 {
    approx_sums(src, div, sub, blocks.iter().map(|&b| b as usize), out)
}

/// The kernel: per listed block, `Σ 2^y` with `y = fl(x·(log2 e / div) + (-sub·log2 e))`
/// summed per lane in f32 (two chains of two vectors, then the chains), the lanes in f64;
/// beside it `Σ -2^y·y` for the bound. The last, partial block uses the exact weights.
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
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

/// See [`super::cheap_block_sums_at`]: [`super::avx2`]'s kernel on 16 lanes (four vectors
/// per block, summed pairwise, then across the lanes).
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA, BMI1 and POPCNT.
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
pub unsafe fn cheap_block_sums_at(src: &[f32], a: f32, b: f32, blocks: &[u32], out: &mut [f32]) {
    let (va, vb, zero) = (_mm512_set1_ps(a), _mm512_set1_ps(b), _mm512_setzero_ps());
    // `max(t, 0)` with `t` first: a NaN `t` gives 0, as the portable kernel's `max` does.
    let l = |p: *const f32| {
        _mm512_castsi512_ps(_mm512_cvtps_epi32(_mm512_max_ps(_mm512_fmadd_ps(_mm512_loadu_ps(p), va, vb), zero)))
    };
    super::avx2::cheap_blocks(src, a, b, blocks, out, |p| {
        // SAFETY: `p` points to BLOCK = 64 floats: four vectors of 16.
        _mm512_reduce_add_ps(_mm512_add_ps(
            _mm512_add_ps(l(p), l(p.add(32))),
            _mm512_add_ps(l(p.add(16)), l(p.add(48))),
        ))
    });
}

/// See [`super::exp_sum_sequential`]: [`super::avx2`]'s algorithm, the same sum bit for bit,
/// with each block scanned 16 lanes at a time (a compare into a mask register and a compress
/// per vector, where AVX2 needs a movemask, a table lookup and a permute per 8 entries) and
/// the weights computed and added 16 at a time (`add_group`).
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA and POPCNT.
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
pub unsafe fn exp_sum_sequential(start: f32, row: &[f32], sub: f32, block_max: &[f32], patches: &[(u32, f32)]) -> f32 {
    super::avx2::exp_sum_sequential_with::<Avx512Scan>(start, row, sub, block_max, patches)
}

/// See [`super::exp_sum_unordered`]: [`super::avx2`]'s scan for it, with this module's
/// 16-lane block scan and increments.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA and POPCNT.
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
pub unsafe fn exp_sum_unordered(
    start: f32,
    row: &[f32],
    sub: f32,
    block_max: &[f32],
    patches: &[(u32, f32)],
) -> Option<f32> {
    super::avx2::exp_sum_unordered_with::<Avx512Scan>(start, row, sub, block_max, patches)
}

/// See [`super::exp_sum_unordered_values`]: [`super::avx2`]'s total with this module's
/// 16-lane increments.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA and POPCNT.
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
pub(crate) unsafe fn exp_sum_unordered_values(start: f32, xs: &[f32], sub: f32) -> Option<f32> {
    super::avx2::exp_sum_unordered_values_with::<Avx512Scan>(start, xs, sub)
}

/// See [`super::Collector::start`]: the indices of the blocks whose maximum reaches
/// `threshold` into `blocks` (one compare and one compress per 16 maxima); returns how many.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA and POPCNT.
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
pub(crate) unsafe fn list_blocks_ge(block_max: &[f32], threshold: f32, blocks: &mut [u32]) -> usize {
    assert!(blocks.len() >= block_max.len() + 16, "list_blocks_ge: no room for the block list");
    // SAFETY: `blocks` has room for 16 indices past each of `block_max`'s.
    list_ge_into(block_max, threshold, 0, blocks.as_mut_ptr())
}

/// The indices, from `first`, of the `maxima` that reach `threshold`, written from `dst`;
/// returns how many. One compare and one compress per 16 maxima, no branch on the data.
///
/// # Safety
/// `dst` must have room for `maxima.len() + 16` indices.
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn list_ge_into(maxima: &[f32], threshold: f32, first: u32, dst: *mut u32) -> usize {
    let t = _mm512_set1_ps(threshold);
    let mut listed = 0;
    let groups = maxima.chunks_exact(16);
    let rest = groups.remainder();
    let step = _mm512_set1_epi32(16);
    let mut index = _mm512_add_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(first as i32),
    );
    for group in groups {
        // SAFETY: `group` holds 16 floats; `dst` has room for 16 indices past each maximum.
        let passing = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_loadu_ps(group.as_ptr()), t);
        _mm512_storeu_si512(dst.add(listed) as *mut _, _mm512_maskz_compress_epi32(passing, index));
        listed += passing.count_ones() as usize;
        index = _mm512_add_epi32(index, step);
    }
    let done = maxima.len() - rest.len();
    for (j, &m) in rest.iter().enumerate() {
        // SAFETY: `listed <= done + j`, within the room.
        *dst.add(listed) = first + (done + j) as u32;
        listed += usize::from(m >= threshold);
    }
    listed
}

/// See [`super::gather_blocks_ge`]: the passing blocks listed by [`list_ge_into`] (up to 512
/// maxima at a time), then each listed block's mask from four 16-lane compares, its set bits
/// written in place. A row that is not 64-byte aligned is read by aligned loads
/// ([`Realign16`]): its lanes are the block's entries rotated by the shift, so the mask is
/// rotated back, and the entries come out in index order all the same.
///
/// PERF: on an Intel Xeon with AVX-512 (one process, alternating call by call with the AVX2
/// kernel; the 45 blocks that reach the top 45 block maxima of the bench's row): 0.46 µs
/// against 0.67 at V = 32,000 in a slow spell, 0.38 against 0.51 at 128,256. llama.cpp's
/// default chain at 32k went from 2.27–2.36× to 2.05× the floor there. The AVX2 kernel's
/// listing alone (a mask per 64 maxima, a branch per passing bit) took about a third of it.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA and POPCNT.
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
pub(crate) unsafe fn gather_blocks_ge(row: &[f32], block_max: &[f32], threshold: f32, out: &mut Vec<TokenData>) {
    const LISTED: usize = 512;
    let t = _mm512_set1_ps(threshold);
    // Uninitialised: only the first `n` are read, after the listing wrote them.
    let mut listed = [const { std::mem::MaybeUninit::<u32>::uninit() }; LISTED + 16];
    let dst = listed.as_mut_ptr() as *mut u32;
    let whole = row.len() / BLOCK;
    let realign = Realign16::of(row.as_ptr());
    for (l, part) in block_max.chunks(LISTED).enumerate() {
        // SAFETY: `listed` has room for `part.len() + 16` indices.
        let n = list_ge_into(part, threshold, (l * LISTED) as u32, dst);
        // Room for every entry of the listed blocks: each is written in place and counted.
        out.reserve(n * BLOCK);
        let len = out.len();
        let spare = out.spare_capacity_mut();
        let mut k = 0;
        // SAFETY: the first `n` were written by the listing.
        for &b in std::slice::from_raw_parts(dst, n) {
            let b = b as usize;
            let start = b * BLOCK;
            let mask = |x: [__m512; 4]| {
                let m = |j: usize| _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x[j], t) as u64;
                m(0) | m(1) << 16 | m(2) << 32 | m(3) << 48
            };
            let mut hits = match realign {
                // SAFETY: the floats around block `b` are in the row. Lane `i` holds the
                // block's entry `(i - shift) mod 64`.
                Some(ra) if ra.fits(b, row.len()) => {
                    mask(ra.block(row.as_ptr().add(start))).rotate_right(ra.shift as u32)
                }
                // SAFETY: block `b` is a whole block of `row`.
                _ if b < whole => mask(load_block16(row.as_ptr().add(start))),
                _ => row[start..].iter().enumerate().fold(0, |m, (j, &x)| m | u64::from(x >= threshold) << j),
            };
            while hits != 0 {
                let j = hits.trailing_zeros() as usize;
                hits &= hits - 1;
                // At most `BLOCK` entries per listed block: `k < n · BLOCK`; `start + j` is
                // in the row (a set bit is an entry of the block).
                spare[k].write(TokenData { id: (start + j) as u32, logit: *row.get_unchecked(start + j), p: 0.0 });
                k += 1;
            }
        }
        // SAFETY: the `k` entries past `len` were written above.
        out.set_len(len + k);
    }
}

/// See [`super::Collector::next`]: queues the entries of `row` at or above `threshold` from the
/// listed `blocks` (whose maxima reach it), from the start of `queue` until it holds at least
/// `limit` values or the blocks run out; returns how many blocks were read and how many
/// values queued. Each block's entries go by one compress of its lane-wise maximum where no
/// lane holds two of them (the usual case on a language-model row), else one per vector.
///
/// PERF: on the bench's row at V = 32,000, 410 of the 500 blocks pass with two or three entries
/// each. [`super::exp_sum_unordered`]'s scan (a branch per passing block, four compresses and
/// stores each, and the patches checked block by block) took 2.3 µs there; listing the blocks
/// first leaves this loop one branch, seldom taken, and its loads known ahead (1.3 µs). On the
/// real row (tiled) 489 of the 500 blocks at 32,000 hold two entries in some lane (17.5 each on
/// average): taking a block after a dense one (8 entries or more) straight to the four
/// compresses, without the lane test, saved only 3.5% of raw logprobs there (9.2 against
/// 9.5 µs) and 1.5% at 128,256, nothing on the bench's rows or on `top_p;dist`'s exact sums
/// (Intel Xeon, alternating); not taken. The compresses bound this loop. Also measured there and
/// not taken: holding back the blocks where a lane has two entries (32 of the 411 passing at
/// 32,000, its branch mispredicted about as often) and queueing them in full later, the others'
/// lane maxima compressed without a branch: raw `logprobs(20)` 4.6 against 4.2 µs (the
/// branch-free selection and bookkeeping cost more instructions than the mispredictions); and
/// running the blocks that read as whole vectors through a loop without the realignment tests:
/// no difference (5.1–5.6 against 5.3–5.8 µs at 32,000, ±1% at 128,256 and on the real row).
///
/// A row that does not start on a 64-byte boundary is read by aligned loads (`Realign16`):
/// with unaligned ones every load straddles two cache lines. On an Intel Xeon with AVX-512
/// (one process, alternating), raw `logprobs(20)` on rows 16, 32 or 48 bytes past a boundary
/// went from 6.15–6.55 to 5.83–6.21 µs at V = 32,000 (5.7 aligned) and on the real row from
/// 13.1–18.3 to 11.5–17.0 µs.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA and POPCNT.
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
pub(crate) unsafe fn collect_listed(
    row: &[f32],
    blocks: &[u32],
    threshold: f32,
    queue: &mut [f32],
    limit: usize,
) -> (usize, usize) {
    assert!(queue.len() >= limit + BLOCK, "collect_listed: no room in the queue");
    let t = _mm512_set1_ps(threshold);
    let whole = row.len() / BLOCK;
    let q = queue.as_mut_ptr();
    let mut n = 0;
    let realign = Realign16::of(row.as_ptr());
    for (read, &b) in blocks.iter().enumerate() {
        if n >= limit {
            return (read, n);
        }
        let b = b as usize;
        // SAFETY (each arm): `n < limit`, so the queue has room for a block of values from `n`.
        match realign {
            // The floats around block `b` are in the row.
            Some(ra) if ra.fits(b, row.len()) => collect_block(ra.block(row.as_ptr().add(b * BLOCK)), t, q, &mut n),
            // Block `b` is a whole block of `row`.
            _ if b < whole => collect_block(load_block16(row.as_ptr().add(b * BLOCK)), t, q, &mut n),
            _ => {
                let mut pad = [f32::NEG_INFINITY; BLOCK];
                pad[..row.len() - b * BLOCK].copy_from_slice(&row[b * BLOCK..]);
                // `pad` holds BLOCK floats.
                collect_block(load_block16(pad.as_ptr()), t, q, &mut n);
            }
        }
    }
    (blocks.len(), n)
}

/// The 64 floats at `p` as four vectors, in order.
///
/// # Safety
/// `p` must point to 64 readable floats.
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn load_block16(p: *const f32) -> [__m512; 4] {
    std::array::from_fn(|k| _mm512_loadu_ps(p.add(16 * k)))
}

/// [`avx2::Realign`] for 64-byte vectors: a block of a row that is not 64-byte aligned, from
/// five aligned loads, the first and the last blended into one vector (the block's first
/// `16 - shift` entries and its last `shift`, out of order), for kernels that do not depend
/// on the order of a block's entries.
#[derive(Clone, Copy)]
struct Realign16 {
    shift: usize,
    /// Lanes `0..shift`: the blend's lanes from the last vector.
    from_last: __mmask16,
}

impl Realign16 {
    /// For a row starting at `row`: `None` when it is 64-byte aligned.
    fn of(row: *const f32) -> Option<Self> {
        let shift = (row as usize % 64) / 4;
        (shift != 0 && (row as usize).is_multiple_of(4)).then(|| Self { shift, from_last: (1u16 << shift) - 1 })
    }

    /// Whether block `b` of a row of `len` entries can be read this way: the `shift` floats
    /// before it and `16 - shift` after it are in the row.
    #[inline]
    fn fits(&self, b: usize, len: usize) -> bool {
        b > 0 && (b + 1) * BLOCK + 16 - self.shift <= len
    }

    /// The 64 entries at `p` (a block start where [`Realign16::fits`] holds) as four
    /// vectors, in some order.
    ///
    /// # Safety
    /// The `shift` floats before `p` and the `80 - shift` from it must be readable.
    #[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
    #[inline]
    unsafe fn block(&self, p: *const f32) -> [__m512; 4] {
        let a = p.sub(self.shift);
        // SAFETY (caller): `a` is 64-byte aligned and the five vectors from it are readable.
        let v = |k: usize| _mm512_load_ps(a.add(16 * k));
        [_mm512_mask_blend_ps(self.from_last, v(0), v(4)), v(1), v(2), v(3)]
    }
}

/// See [`super::positions_ge`]: 64 values per step, four 16-lane compares into one mask, a
/// branch only where it has a bit set; the last partial group with masked loads.
///
/// PERF: whole groups apart, so that their four compares unroll with constant shifts. One
/// loop over `chunks(64)` with masked loads of each part compiled to a loop per 16 values
/// (variable shift, mask arithmetic, a spilled group counter): 0.7 µs for the 8,700 values that
/// raw logprobs gathers from the real row at V = 32,000 (Zen 4), against 0.2 µs this way.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA and POPCNT.
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
pub(crate) unsafe fn positions_ge(values: &[f32], threshold: f32, out: &mut Vec<u32>) {
    positions_cmp::<_CMP_GE_OQ>(values, threshold, out);
}

/// See [`super::positions_le`].
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA, BMI1 and POPCNT (see the module docs).
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
pub(crate) unsafe fn positions_le(values: &[f32], threshold: f32, out: &mut Vec<u32>) {
    positions_cmp::<_CMP_LE_OQ>(values, threshold, out);
}

/// The positions of the `values` that compare true with `threshold` by the predicate `IMM`.
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn positions_cmp<const IMM: i32>(values: &[f32], threshold: f32, out: &mut Vec<u32>) {
    let t = _mm512_set1_ps(threshold);
    let groups = values.chunks_exact(64);
    let rest = groups.remainder();
    for (g, group) in groups.enumerate() {
        // SAFETY: `group` holds 64 floats: four vectors of 16.
        let hit = |k: usize| u64::from(_mm512_cmp_ps_mask::<IMM>(_mm512_loadu_ps(group.as_ptr().add(16 * k)), t));
        super::avx2::push_positions(64 * g, hit(0) | hit(1) << 16 | hit(2) << 32 | hit(3) << 48, out);
    }
    let first = values.len() - rest.len();
    for (k, part) in rest.chunks(16).enumerate() {
        let lanes = ((1u32 << part.len()) - 1) as u16;
        // SAFETY: `lanes` covers only the values of `part` (the others are not read).
        let x = _mm512_maskz_loadu_ps(lanes, part.as_ptr());
        super::avx2::push_positions(first + 16 * k, u64::from(_mm512_mask_cmp_ps_mask::<IMM>(lanes, x, t)), out);
    }
}

/// Queues the entries `>= t` of a block (its four vectors `x`) at `q + n`, advancing `n` by
/// their count.
///
/// # Safety
/// `q + n` must point to room for BLOCK floats.
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn collect_block(x: [__m512; 4], t: __m512, q: *mut f32, n: &mut usize) {
    let (hi01, hi23) = (_mm512_max_ps(x[0], x[1]), _mm512_max_ps(x[2], x[3]));
    let lanes = _mm512_max_ps(hi01, hi23);
    // Each lane's second largest of the four: below `t`, the lane holds at most one entry at
    // or above it, its maximum.
    let second =
        _mm512_max_ps(_mm512_min_ps(hi01, hi23), _mm512_max_ps(_mm512_min_ps(x[0], x[1]), _mm512_min_ps(x[2], x[3])));
    let m = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(lanes, t);
    if _mm512_cmp_ps_mask::<_CMP_GE_OQ>(second, t) == 0 {
        _mm512_storeu_ps(q.add(*n), _mm512_maskz_compress_ps(m, lanes));
        *n += m.count_ones() as usize;
    } else {
        for &v in &x {
            let k = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(v, t);
            _mm512_storeu_ps(q.add(*n), _mm512_maskz_compress_ps(k, v));
            *n += k.count_ones() as usize;
        }
    }
}

struct Avx512Scan;

impl super::avx2::BlockScan for Avx512Scan {
    #[inline(always)]
    unsafe fn passing(maxima: &[f32; GROUP], threshold: f32) -> u32 {
        // SAFETY: `maxima` holds 16 floats.
        _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_loadu_ps(maxima.as_ptr()), _mm512_set1_ps(threshold)) as u32
    }

    #[inline(always)]
    unsafe fn add_group(sum: f32, xs: &[f32], sub: f32) -> f32 {
        add_group(sum, xs, sub)
    }

    #[inline(always)]
    unsafe fn increments(xs: &[f32], sub: f32, scale: f32) -> (u32, bool) {
        increments::<false>(xs, sub, scale, &mut [0.0; BLOCK])
    }

    #[inline(always)]
    unsafe fn increments_approx(xs: &[f32], sub: f32, scale: f32) -> (u32, bool) {
        increments_approx(xs, sub, scale)
    }

    /// The masks first, then the compresses (as measured on Zen 4; a fused loop is unmeasured).
    #[inline(always)]
    unsafe fn select_pack(block: &[f32; BLOCK], threshold: f32, dst: &mut [f32]) -> usize {
        let (masks, _) = Self::select(block, threshold);
        Self::pack(block, masks, dst)
    }
}

impl Avx512Scan {
    /// The masks of the entries `>= threshold`, and how many there are.
    #[inline(always)]
    unsafe fn select(block: &[f32; BLOCK], threshold: f32) -> ([u16; BLOCK / 16], usize) {
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

    /// Writes the entries `masks` selects, in order, to the start of `dst` (room for
    /// [`BLOCK`] values); returns the count.
    #[inline(always)]
    unsafe fn pack(block: &[f32; BLOCK], masks: [u16; BLOCK / 16], dst: &mut [f32]) -> usize {
        assert!(dst.len() >= BLOCK, "pack: no room for a block");
        let mut n = 0;
        for (k, &m) in masks.iter().enumerate() {
            // SAFETY: `block` holds 64 floats, so 16 from `16k` are in bounds; at most 48 were
            // written before (`n <= 48`), so the 16 stored from `n` are within `dst`.
            let x = _mm512_loadu_ps(block.as_ptr().add(16 * k));
            _mm512_storeu_ps(dst.as_mut_ptr().add(n), _mm512_maskz_compress_ps(m, x));
            n += m.count_ones() as usize;
        }
        n
    }
}

// ------------------------------------------------------------------------------- expf

/// The constants of [`expf16`], set once per kernel call: glibc's table as four vectors of 8
/// (`EXP2F_TAB[8i..8i + 8]`) and the scalars of [`super::avx2`]'s `expf_core`.
struct ExpfConsts {
    table: [__m512i; 4],
    inv_ln2_n: __m512d,
    shift: __m512d,
    poly: [__m512d; 3],
    one: __m512d,
    underflow: __m512,
}

impl ExpfConsts {
    #[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
    #[inline]
    unsafe fn new() -> Self {
        // SAFETY: EXP2F_TAB holds 32 u64: four vectors of 8.
        let row = |i: usize| _mm512_loadu_si512(EXP2F_TAB.as_ptr().add(8 * i) as *const _);
        Self {
            table: [row(0), row(1), row(2), row(3)],
            inv_ln2_n: _mm512_set1_pd(EXPF_INV_LN2_N),
            shift: _mm512_set1_pd(EXPF_SHIFT),
            poly: EXPF_POLY.map(|c| _mm512_set1_pd(c)),
            one: _mm512_set1_pd(1.0),
            underflow: _mm512_set1_ps(EXPF_UFLOW),
        }
    }
}

/// [`super::avx2`]'s `expf_core` on 8 lanes: the same operations lane for lane. The table entry
/// `i = k mod 32` comes from registers: the low 4 bits of `k` pick one of 16 entries in each
/// half of the table (`vpermi2q` reads bits 0 to 3 of each index), bit 4 picks the half.
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn expf_core(xd: __m512d, c: &ExpfConsts) -> __m512d {
    let kd_shifted = _mm512_fmadd_pd(c.inv_ln2_n, xd, c.shift);
    let ki = _mm512_castpd_si512(kd_shifted);
    let kd = _mm512_sub_pd(kd_shifted, c.shift);
    let r = _mm512_fmsub_pd(c.inv_ln2_n, xd, kd);
    let low = _mm512_permutex2var_epi64(c.table[0], ki, c.table[1]);
    let high = _mm512_permutex2var_epi64(c.table[2], ki, c.table[3]);
    let t = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(ki, _mm512_set1_epi64(16)), low, high);
    let s = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64::<47>(ki)));
    let z = _mm512_fmadd_pd(c.poly[0], r, c.poly[1]);
    let r2 = _mm512_mul_pd(r, r);
    let y = _mm512_fmadd_pd(c.poly[2], r, c.one);
    let y = _mm512_fmadd_pd(z, r2, y);
    _mm512_mul_pd(y, s)
}

/// `expf(x)` on 16 lanes, for `x <= 0` or `-inf`: [`super::avx2`]'s `expf8`, lane for lane.
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn expf16(x: __m512, c: &ExpfConsts) -> __m512 {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)));
    let lo = _mm512_cvtpd_ps(expf_core(_mm512_cvtps_pd(_mm512_castps512_ps256(x)), c));
    let hi = _mm512_cvtpd_ps(expf_core(_mm512_cvtps_pd(hi), c));
    let y = _mm512_insertf64x4::<1>(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi));
    let under = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, c.underflow);
    _mm512_maskz_mov_ps(!under, _mm512_castpd_ps(y))
}

/// See [`super::exp_shifted`]: [`super::avx2`]'s kernel with the weights computed 16 at a
/// time (the same value lane for lane); the tail is one masked vector.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA, BMI1 and POPCNT.
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
pub unsafe fn exp_shifted(src: &[f32], div: f32, sub: f32, out: &mut [f32]) {
    let c = ExpfConsts::new();
    let (d, s) = (_mm512_set1_ps(div), _mm512_set1_ps(sub));
    let n = src.len().min(out.len());
    for first in (0..n).step_by(16) {
        let lanes = if n - first >= 16 { 0xffff } else { (1u16 << (n - first)) - 1 };
        // SAFETY: `lanes` covers only the `min(16, n - first)` entries from `first`, which both
        // slices hold.
        let x = _mm512_maskz_loadu_ps(lanes, src.as_ptr().add(first));
        let w = expf16(_mm512_sub_ps(_mm512_div_ps(x, d), s), &c);
        _mm512_mask_storeu_ps(out.as_mut_ptr().add(first), lanes, w);
    }
}

/// See [`super::exp_block_sums`]: [`super::avx2`]'s kernel with the weights computed 16 at a
/// time. The f64 accumulation is the same lane for lane: one 8-lane accumulator whose low half
/// is AVX2's `lo` (entries `8j..8j + 4`) and high half its `hi` (`8j + 4..8j + 8`), each group
/// of 8 added in order, then the same pairwise combination and scalar tail.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA, BMI1 and POPCNT.
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
pub unsafe fn exp_block_sums(src: &[f32], div: f32, sub: f32, out: &mut [f64]) {
    let c = ExpfConsts::new();
    let (d, s) = (_mm512_set1_ps(div), _mm512_set1_ps(sub));
    let absent = _mm512_set1_ps(f32::NEG_INFINITY);
    for (o, block) in out.iter_mut().zip(src.chunks(BLOCK)) {
        let mut acc = _mm512_setzero_pd();
        let whole = block.len() / 8 * 8;
        for first in (0..whole).step_by(16) {
            let lanes: u16 = if whole - first >= 16 { 0xffff } else { 0x00ff };
            // SAFETY: `lanes` covers only entries of `block` (`first + 8 <= whole` at least).
            let x = _mm512_mask_loadu_ps(absent, lanes, block.as_ptr().add(first));
            let w = expf16(_mm512_sub_ps(_mm512_div_ps(x, d), s), &c);
            acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm512_castps512_ps256(w)));
            if lanes == 0xffff {
                let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(w)));
                acc = _mm512_add_pd(acc, _mm512_cvtps_pd(high));
            }
        }
        let v = _mm256_add_pd(_mm512_castpd512_pd256(acc), _mm512_extractf64x4_pd::<1>(acc));
        let mut lanes = [0.0f64; 4];
        // SAFETY: `lanes` holds 4 doubles.
        _mm256_storeu_pd(lanes.as_mut_ptr(), v);
        let mut sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
        for &x in &block[whole..] {
            sum += (x / div - sub).exp() as f64;
        }
        *o = sum;
    }
}

/// [`super::avx2`]'s `add_group` (see there for the method and its proof) on 16 lanes: the
/// same weights, the same integer increments `k` per lane and the same tie and range tests, so
/// the same result bit for bit (integer totals and the OR of the tie flags do not depend on
/// how the lanes are grouped). `xs` holds a multiple of 8 and at most [`BLOCK`] entries; a
/// last half vector is loaded masked, its other lanes as `-inf` (weight 0, increment 0).
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
unsafe fn add_group(sum: f32, xs: &[f32], sub: f32) -> f32 {
    debug_assert!(xs.len().is_multiple_of(8) && xs.len() <= BLOCK);
    avx2::add_group_by(
        sum,
        xs.len(),
        |scale| increments_approx(xs, sub, scale),
        |scale, w| increments::<true>(xs, sub, scale, w),
    )
}

/// The constants of the increments below, set once per call.
struct IncrementConsts {
    exp2: Exp2Consts,
    sub: __m512,
    scale: __m512,
    magic: __m512,
    ymax: __m512,
    half: __m512,
    min_normal: __m512i,
    log2e: __m512,
    rho: __m512,
    rho_y: __m512,
    certain: __m512,
}

impl IncrementConsts {
    #[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
    #[inline]
    unsafe fn new(sub: f32, scale: f32) -> Self {
        Self {
            exp2: Exp2Consts::new(),
            sub: _mm512_set1_ps(sub),
            scale: _mm512_set1_ps(scale),
            magic: _mm512_set1_ps((1u32 << 23) as f32),
            ymax: _mm512_set1_ps(((1u32 << 24) + 2) as f32),
            half: _mm512_set1_ps(0.5),
            min_normal: _mm512_set1_epi32(0x007f_ffff),
            log2e: _mm512_set1_ps(std::f32::consts::LOG2_E),
            rho: _mm512_set1_ps(APPROX_RHO),
            rho_y: _mm512_set1_ps(APPROX_RHO_Y),
            certain: _mm512_set1_ps(APPROX_CERTAIN),
        }
    }
}

/// `add_group`'s exact increments of 16 lanes `x`: the weights, the increments, and the lanes
/// that are a tie or out of range ([`super::avx2`]'s `exact_increments`, lane for lane).
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn exact_increments(x: __m512, c: &IncrementConsts, e: &ExpfConsts) -> (__m512, __m512i, u16) {
    let wv = expf16(_mm512_sub_ps(x, c.sub), e);
    let wn = _mm512_maskz_mov_ps(_mm512_cmpgt_epi32_mask(_mm512_castps_si512(wv), c.min_normal), wv);
    let y = _mm512_min_ps(_mm512_fmadd_ps(wn, c.scale, c.magic), c.ymax);
    let r = _mm512_sub_ps(y, c.magic);
    let d = _mm512_abs_ps(_mm512_fmsub_ps(wn, c.scale, r));
    let off = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(d, c.half);
    (wv, _mm512_sub_epi32(_mm512_castps_si512(y), _mm512_castps_si512(c.magic)), off)
}

/// The same increments from approximate weights, and the lanes where they are not certain
/// ([`super::avx2`]'s `approx_increments`, lane for lane).
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn approx_increments(x: __m512, c: &IncrementConsts) -> (__m512i, u16) {
    let (w, y) = exp2_approx_with(_mm512_mul_ps(_mm512_sub_ps(x, c.sub), c.log2e), &c.exp2);
    let x = _mm512_mul_ps(w, c.scale);
    let yr = _mm512_add_ps(x, c.magic);
    let dist = _mm512_abs_ps(_mm512_sub_ps(x, _mm512_sub_ps(yr, c.magic)));
    let tol = _mm512_mul_ps(x, _mm512_fnmadd_ps(c.rho_y, y, c.rho));
    let sure = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(_mm512_add_ps(dist, tol), c.certain);
    (_mm512_sub_epi32(_mm512_castps_si512(yr), _mm512_castps_si512(c.magic)), !sure)
}

/// [`super::avx2`]'s `increments` on 16 lanes (the same per-lane operations, so the same
/// total and flag): `add_group`'s integer increments over `xs` (a multiple of 8 entries, at
/// most `INCREMENTS_MAX`; at most [`BLOCK`] with `STORE`) for the ulp scale `scale`, and
/// whether every lane was exact; with `STORE` the weights go to `w` too.
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
#[inline]
pub(super) unsafe fn increments<const STORE: bool>(
    xs: &[f32],
    sub: f32,
    scale: f32,
    w: &mut [f32; BLOCK],
) -> (u32, bool) {
    debug_assert!(xs.len() <= INCREMENTS_MAX && (!STORE || xs.len() <= BLOCK));
    let c = IncrementConsts::new(sub, scale);
    let e = ExpfConsts::new();
    let mut k = _mm512_setzero_si512();
    let mut off: u16 = 0;
    for first in (0..xs.len()).step_by(16) {
        let (x, lanes) = load_lanes(xs, first);
        let (wv, kv, o) = exact_increments(x, &c, &e);
        if STORE {
            // SAFETY: `lanes` covers only entries of `xs`, and `w` has room for as many.
            _mm512_mask_storeu_ps(w.as_mut_ptr().add(first), lanes, wv);
        }
        k = _mm512_add_epi32(k, kv);
        off |= o;
    }
    (_mm512_reduce_add_epi32(k) as u32, off == 0)
}

/// [`super::avx2`]'s `increments_approx` on 16 lanes (the same per-lane operations, so the
/// same total and flag).
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
#[inline]
pub(super) unsafe fn increments_approx(xs: &[f32], sub: f32, scale: f32) -> (u32, bool) {
    debug_assert!(scale <= APPROX_SCALE_MAX && xs.len() <= INCREMENTS_MAX);
    let c = IncrementConsts::new(sub, scale);
    let mut k = _mm512_setzero_si512();
    let mut unsure = [0u16; INCREMENTS_MAX.div_ceil(16)];
    let mut any = 0;
    for (v, first) in (0..xs.len()).step_by(16).enumerate() {
        let (kv, u) = approx_increments(load_lanes(xs, first).0, &c);
        k = _mm512_mask_add_epi32(k, !u, k, kv);
        unsure[v] = u;
        any |= u;
    }
    let mut off: u16 = 0;
    if any != 0 {
        let e = ExpfConsts::new();
        for (v, first) in (0..xs.len()).step_by(16).enumerate().filter(|&(v, _)| unsure[v] != 0) {
            let (_, kv, o) = exact_increments(load_lanes(xs, first).0, &c, &e);
            k = _mm512_mask_add_epi32(k, unsure[v], k, kv);
            off |= o; // a certain lane is never a tie or out of range
        }
    }
    (_mm512_reduce_add_epi32(k) as u32, off == 0)
}

/// The 16 entries of `xs` from `first`, or its last 8 with `-inf` (weight 0, increment 0) in
/// the other lanes; and the mask of the lanes that are entries.
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn load_lanes(xs: &[f32], first: usize) -> (__m512, u16) {
    let lanes: u16 = if xs.len() - first >= 16 { 0xffff } else { 0x00ff };
    // SAFETY: `lanes` covers only entries of `xs` (whose length is a multiple of 8).
    (_mm512_mask_loadu_ps(_mm512_set1_ps(f32::NEG_INFINITY), lanes, xs.as_ptr().add(first)), lanes)
}

/// See [`super::sort_keys`]: `keys` (16 to 64 of them) sorted by counting, for each key, the
/// keys below it: with `8 · NV` keys in `NV` registers, one broadcast, `NV` compares and `NV`
/// masked increments per key, no branch on the data. Each key's count is its place when the
/// keys are distinct, which is checked (the places must be `0..n`, each once); returns false,
/// with `keys` untouched, when they are not.
///
/// PERF: on an Intel Xeon with AVX-512 (alternating call by call with `sort_unstable`, random
/// distinct keys, timer included): 161–165 ns against 253–254 for 40 keys, 217–361 against
/// 432–617 for 46, 287–313 against 428–456 for 64; 64–80 against 79–105 for 16. The
/// comparison sort's branches mispredict on keys in no order. In llama.cpp's default chain
/// at V = 32,000 (46 keys; six runs of 30,000 calls, alternating call by call with
/// `sort_unstable`): 3.55–3.72 µs against 3.77–3.92, 2.12–2.16× the floor against
/// 2.24–2.28×. Not measured on Zen 4, where
/// 512-bit operations run at half rate (an earlier counting sort took 220 ns for 40 keys
/// there, against 135 for `sort_unstable`; see `convention::transformers::tail`).
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA and POPCNT.
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
pub(crate) unsafe fn sort_keys_by_rank(keys: &mut [u64]) -> bool {
    match keys.len() {
        16 => rank_sort::<2>(keys),
        17..=32 => rank_sort::<4>(keys),
        33..=48 => rank_sort::<6>(keys),
        49..=64 => rank_sort::<8>(keys),
        _ => false,
    }
}

/// [`sort_keys_by_rank`] for `keys.len() <= 8 * NV` (and at most 64).
#[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn rank_sort<const NV: usize>(keys: &mut [u64]) -> bool {
    let n = keys.len();
    debug_assert!(n <= 8 * NV && n <= 64);
    // Past the keys, `u64::MAX`: such a lane counts keys too, but nothing reads its count.
    let mut buf = [u64::MAX; 64];
    buf[..n].copy_from_slice(keys);
    // SAFETY: `buf` holds 64 >= 8 · NV keys.
    let lanes: [__m512i; NV] = std::array::from_fn(|v| _mm512_loadu_si512(buf.as_ptr().add(8 * v) as *const _));
    let mut below = [_mm512_setzero_si512(); NV];
    let one = _mm512_set1_epi64(1);
    for &k in keys.iter() {
        let b = _mm512_set1_epi64(k as i64);
        for (count, &lane) in below.iter_mut().zip(&lanes) {
            // Lanes whose key is above `k` count it.
            *count = _mm512_mask_add_epi64(*count, _mm512_cmplt_epu64_mask(b, lane), *count, one);
        }
    }
    let mut place = [0u64; 64];
    for (v, count) in below.iter().enumerate() {
        // SAFETY: `place` holds 64 >= 8 · NV counts.
        _mm512_storeu_si512(place.as_mut_ptr().add(8 * v) as *mut _, *count);
    }
    // Each count is below `n` (a key is not below itself). Distinct keys have distinct
    // counts; equal keys share one, leaving another place empty.
    let filled = place[..n].iter().fold(0u64, |m, &p| m | 1 << p);
    if filled != u64::MAX >> (64 - n) {
        return false;
    }
    let mut sorted = [0u64; 64];
    for (&p, &k) in place[..n].iter().zip(&buf[..n]) {
        sorted[p as usize] = k;
    }
    keys.copy_from_slice(&sorted[..n]);
    true
}
