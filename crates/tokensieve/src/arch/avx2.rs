//! AVX2 + FMA (+ BMI1, POPCNT) versions of the kernels in [`super`], same names and contracts.
//!
//! Every function is `unsafe` for one reason only: it is compiled with
//! `#[target_feature(enable = "avx2,fma,bmi1,popcnt")]`, so calling it on a CPU without those
//! features is undefined behaviour. SAFETY (callers): the detection in [`super`] reports
//! `Isa::Avx2` only after `is_x86_feature_detected!` returned true for all four, and the dispatchers in
//! [`super`] call these functions only then (`widen_f16` also needs F16C, detected beside
//! them). Inside, the only other unsafe operations are
//! unaligned loads and stores (`loadu`/`storeu`, no alignment requirement) whose bounds each
//! come from `chunks_exact`, aligned loads (`load`) at addresses `Realign` rounds down to a
//! 32-byte boundary within the row, and one `i64gather` whose indices are masked to `0..32`,
//! the length of the table it reads.
//!
//! PERF: safe Rust does not vectorise these loops: the float max/min reductions and the
//! order-dependent exp sums are not reassociated by LLVM, the per-block maxima need a
//! horizontal reduction per block, and `expf` is an opaque libm call per element. With AVX2
//! `max` reads 32 floats per iteration on 4 independent accumulators; `exp_shifted` computes 8
//! `expf` per iteration in double precision (glibc's algorithm) instead of 8 libm calls.

use super::{Summary, APPROX_Y_MIN, BLOCK, EXP2_POLY};
use crate::candidates::TokenData;
use std::arch::x86_64::*;

#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn hmax(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_shuffle_ps::<1>(m, m));
    _mm_cvtss_f32(m)
}

/// See [`super::max`]. Eight accumulators: `vmaxps` has a latency of 4 cycles on Intel's
/// cores and two ports there, so eight independent chains keep both busy.
///
/// PERF: four accumulators (one 32-float step) cost 1.09 µs against 0.85 µs for eight at
/// V = 32,000 on a Sapphire Rapids-class Xeon, and 8.0 against 6.7 µs at 262,144; six and
/// twelve were no better than eight. This is the bench's floor without AVX-512F (with it,
/// [`super::avx512::max`]'s 16 lanes are): with four it ran slower than
/// [`summarize`] (which has eight independent trees per group), so it was no floor there.
/// Zen 4's `vmaxps` has a latency of 2 cycles; eight accumulators were not timed there.
///
/// The entries before the row's first 32-byte boundary are taken one by one, so that every
/// vector load is aligned. PERF: a row 16 bytes past a 32-byte boundary (as glibc places
/// a `Vec` of 128 KiB or more) made half the loads straddle two cache lines, and the pass took
/// 9.3 µs at V = 128,256 against 6.3 for the same row aligned (Intel Xeon with AVX-512), which
/// made the bench's floor, and not the sampling, depend on where the row was allocated.
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT (see the module docs).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub unsafe fn max(row: &[f32]) -> f32 {
    let mut a = [_mm256_set1_ps(f32::NEG_INFINITY); 8];
    let head = row.as_ptr().align_offset(32).min(row.len());
    let (first, row) = row.split_at(head);
    let (steps, rest) = row.as_chunks::<64>();
    for c in steps {
        let p = c.as_ptr();
        for (k, acc) in a.iter_mut().enumerate() {
            // SAFETY: `c` holds 64 floats, so the eight 8-float loads at p, p+8, ..., p+56
            // are in bounds; `loadu` has no alignment requirement.
            *acc = _mm256_max_ps(*acc, _mm256_loadu_ps(p.add(8 * k)));
        }
    }
    let (vectors, tail) = rest.as_chunks::<8>();
    for v in vectors {
        // SAFETY: `v` holds 8 floats.
        a[0] = _mm256_max_ps(a[0], _mm256_loadu_ps(v.as_ptr()));
    }
    let quads =
        [_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]), _mm256_max_ps(a[4], a[5]), _mm256_max_ps(a[6], a[7])];
    let m = hmax(_mm256_max_ps(_mm256_max_ps(quads[0], quads[1]), _mm256_max_ps(quads[2], quads[3])));
    first.iter().chain(tail).fold(m, |m, &x| if x > m { x } else { m })
}

/// The max tree of one block's eight vectors.
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn block_max_tree(x: [__m256; 8]) -> __m256 {
    _mm256_max_ps(
        _mm256_max_ps(_mm256_max_ps(x[0], x[1]), _mm256_max_ps(x[2], x[3])),
        _mm256_max_ps(_mm256_max_ps(x[4], x[5]), _mm256_max_ps(x[6], x[7])),
    )
}

/// The 64 floats at `p` as eight vectors, in order.
///
/// # Safety
/// `p` must point to 64 readable floats.
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
#[inline]
pub(super) unsafe fn load_block(p: *const f32) -> [__m256; 8] {
    std::array::from_fn(|k| _mm256_loadu_ps(p.add(8 * k)))
}

/// Reads the blocks of a row that is not 32-byte aligned with aligned loads only: a block's
/// 64 entries, `shift` floats past a boundary, lie in nine aligned vectors, seven of them
/// whole; one blend of the first and the last makes the eighth (the block's first
/// `8 - shift` entries and its last `shift`, out of order). The max trees, NaN watches and
/// compares that take these vectors do not depend on the order of the entries.
///
/// PERF: with unaligned loads, half of them straddle two cache lines on a row 16 bytes past a
/// boundary (glibc's placement of a `Vec` of 128 KiB or more). On an Intel Xeon with AVX-512
/// (one process, alternating with the unaligned loads, rows 16 and 48 bytes past a 64-byte
/// boundary): [`summarize`] 1.37–1.39 µs against 1.72 at V = 32,000 and 5.1–6.3 against
/// 6.5–7.9 at 128,256; `locate_max` (greedy's pass) 1.47–1.51 against 2.07, and 5.8–7.1
/// against 8.0–9.6, before it moved its blocks instead ([`locate_max`]). AVX-512VL's
/// one-uop mask blend in place of `vblendvps` measured the same.
#[derive(Clone, Copy)]
pub(super) struct Realign {
    shift: usize,
    /// Lanes `0..shift` set: the blend's lanes from the last vector.
    from_last: __m256,
}

impl Realign {
    /// For a row starting at `row`: `None` when it is 32-byte aligned.
    #[target_feature(enable = "avx2,fma,bmi1,popcnt")]
    #[inline]
    pub(super) unsafe fn of(row: *const f32) -> Option<Self> {
        let shift = (row as usize % 32) / 4;
        (shift != 0 && (row as usize).is_multiple_of(4)).then(|| Self {
            shift,
            from_last: _mm256_castsi256_ps(_mm256_cmpgt_epi32(
                _mm256_set1_epi32(shift as i32),
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            )),
        })
    }

    /// Whether block `b` of a row of `len` entries can be read this way: the `shift` floats
    /// before it and `8 - shift` after it are in the row.
    #[inline]
    pub(super) fn fits(&self, b: usize, len: usize) -> bool {
        b > 0 && (b + 1) * BLOCK + 8 - self.shift <= len
    }

    /// The 64 entries at `p` (a block start of the row this was made for, where [`Realign::fits`]
    /// holds) as eight vectors, in some order.
    ///
    /// # Safety
    /// The `shift` floats before `p` and the `72 - shift` from it must be readable.
    #[target_feature(enable = "avx2,fma,bmi1,popcnt")]
    #[inline]
    pub(super) unsafe fn block(&self, p: *const f32) -> [__m256; 8] {
        let a = p.sub(self.shift);
        // SAFETY (caller): `a` is 32-byte aligned and the nine vectors from it are readable.
        let v = |k: usize| _mm256_load_ps(a.add(8 * k));
        [_mm256_blendv_ps(v(0), v(8), self.from_last), v(1), v(2), v(3), v(4), v(5), v(6), v(7)]
    }
}

/// The horizontal maxima of eight vectors, as one vector (lane `k` from `m[k]`): a transpose
/// by unpacks, shuffles and a lane swap, with a `max` at each step. 12 shuffles and 7 `max`
/// for eight blocks, against 24 and 24 for eight [`hmax`]. NaN lanes may be dropped.
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn hmax8(m: &[__m256; 8]) -> __m256 {
    // Per 128-bit half, `[a02, b02, a13, b13]`: pairs of lanes of `a` and `b` reduced.
    let pair = |a: __m256, b: __m256| _mm256_max_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
    // Per half, `[a, b, c, d]` each over the half's four lanes.
    let quad =
        |ab: __m256, cd: __m256| _mm256_max_ps(_mm256_shuffle_ps::<0x44>(ab, cd), _mm256_shuffle_ps::<0xEE>(ab, cd));
    let lo = quad(pair(m[0], m[1]), pair(m[2], m[3]));
    let hi = quad(pair(m[4], m[5]), pair(m[6], m[7]));
    // The low halves of both, then the high halves: lane k holds both halves of `m[k]`.
    _mm256_max_ps(_mm256_permute2f128_ps::<0x20>(lo, hi), _mm256_permute2f128_ps::<0x31>(lo, hi))
}

/// See [`super::summarize`]. Per block the max tree and the NaN watch of [`locate_max`] (the
/// root compared too, since every block's maximum is kept); the horizontal maxima eight
/// blocks at a time (`hmax8`) with one store, and the best block found afterwards among the
/// stored maxima, so no scalar work per block.
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT (see the module docs).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub unsafe fn summarize(row: &[f32], block_max: &mut Vec<f32>) -> Summary {
    summarize_with::<FirstOperands>(row, block_max)
}

/// How [`summarize_with`] (and, with [`FirstOperands`], [`locate_max`]) take a block's max tree and watch the row
/// for NaN, which `vmaxps` can drop: by unordered compares of the tree's first operands here
/// ([`FirstOperands`]), by mask compares of the entries in [`super::avx512`].
pub(super) trait NanWatch {
    /// A watch that has seen nothing.
    unsafe fn new() -> Self;
    /// The max tree's root of a block's eight vectors `x`, having noted any NaN among them
    /// that the root does not carry. A NaN the root carries is noted only by
    /// [`keep`](Self::keep).
    unsafe fn block(&mut self, x: [__m256; 8]) -> __m256;
    /// [`block`](Self::block), then [`keep`](Self::keep) of its root.
    unsafe fn block_kept(&mut self, x: [__m256; 8]) -> __m256;
    /// Notes a NaN in `root`.
    unsafe fn keep(&mut self, root: __m256);
    /// True when a NaN was noted (both watches here are exact).
    unsafe fn seen(&self) -> bool;
}

/// The AVX2 watch: the max tree's first operands compared `unordered` in pairs
/// (`block_max_firsts`), ORed into a running mask. Exact: no false alarm.
///
/// PERF: this replaced a running sum of the same operands (NaN survives every addition), whose
/// eight additions per block shared Zen 3's two FP adder pipes with the tree's seven `max`es:
/// [`summarize`] took 1.71-1.73 µs against [`max`]'s 1.40 at V = 32,000 that way, 1.52-1.54
/// µs this way (a throwaway harness, p10 of 5,000 runs); in `tokensieve bench` (10 rounds,
/// interleaved, min) llama.cpp's default chain at 32k 2.48 -> 2.34x the floor, greedy 1.16 ->
/// 1.10x, on a noisy host. Comparing all eight vectors in pairs instead (no load folded into
/// a `max`, four more instructions per block) made greedy slower (1.16 -> 1.32x).
struct FirstOperands(__m256);

impl NanWatch for FirstOperands {
    #[inline(always)]
    unsafe fn new() -> Self {
        Self(_mm256_setzero_ps())
    }

    #[inline(always)]
    unsafe fn block(&mut self, x: [__m256; 8]) -> __m256 {
        let (root, lo, f) = block_max_firsts(x);
        self.0 = _mm256_or_ps(self.0, _mm256_or_ps(f, _mm256_cmp_ps::<_CMP_UNORD_Q>(lo, lo)));
        root
    }

    #[inline(always)]
    unsafe fn block_kept(&mut self, x: [__m256; 8]) -> __m256 {
        let (root, lo, f) = block_max_firsts(x);
        self.0 = _mm256_or_ps(self.0, _mm256_or_ps(f, _mm256_cmp_ps::<_CMP_UNORD_Q>(lo, root)));
        root
    }

    #[inline(always)]
    unsafe fn keep(&mut self, root: __m256) {
        self.0 = _mm256_or_ps(self.0, _mm256_cmp_ps::<_CMP_UNORD_Q>(root, root));
    }

    #[inline(always)]
    unsafe fn seen(&self) -> bool {
        _mm256_movemask_ps(self.0) != 0
    }
}

/// [`summarize`] with the NaN watch `W`; inlined into each caller, which is compiled with the
/// target features `W` needs.
#[inline(always)]
pub(super) unsafe fn summarize_with<W: NanWatch>(row: &[f32], block_max: &mut Vec<f32>) -> Summary {
    summarize_from::<W>(row.len(), |start, _| row.as_ptr().add(start), Realign::of(row.as_ptr()), block_max)
}

/// [`summarize_with`] over a row of `len` entries that `part(start, n)` makes readable, `n`
/// entries from `start`, returning a pointer to them: the row itself, or a half-precision row
/// widened part by part (a group of eight blocks, then the rest), so that each part is read
/// back while it is still in L1. With `realign` (the row itself, not aligned), the groups
/// whose blocks it [fits](Realign::fits) are read by aligned loads.
#[inline(always)]
pub(super) unsafe fn summarize_from<W: NanWatch>(
    len: usize,
    mut part: impl FnMut(usize, usize) -> *const f32,
    realign: Option<Realign>,
    block_max: &mut Vec<f32>,
) -> Summary {
    let n_blocks = len.div_ceil(BLOCK);
    block_max.resize(n_blocks, f32::NEG_INFINITY);
    let out = &mut block_max[..n_blocks];
    let mut watch = W::new();
    let mut best_v = _mm256_set1_ps(f32::NEG_INFINITY);
    let groups = len / (8 * BLOCK);
    for b in (0..groups).map(|g| 8 * g) {
        let g = part(b * BLOCK, 8 * BLOCK);
        let mut roots = [_mm256_setzero_ps(); 8];
        match realign {
            Some(ra) if ra.fits(b, len) && ra.fits(b + 7, len) => {
                for (k, root) in roots.iter_mut().enumerate() {
                    // SAFETY: blocks `b..b + 8` fit: the floats around each are in the row.
                    *root = watch.block_kept(ra.block(g.add(k * BLOCK)));
                }
            }
            _ => {
                for (k, root) in roots.iter_mut().enumerate() {
                    // SAFETY: `g` points to 8 blocks of BLOCK = 64 floats.
                    *root = watch.block_kept(load_block(g.add(k * BLOCK)));
                }
            }
        }
        let v = hmax8(&roots);
        // SAFETY: `b + 8 <= n_blocks`: this group's blocks are whole.
        _mm256_storeu_ps(out.as_mut_ptr().add(b), v);
        best_v = _mm256_max_ps(best_v, v);
    }
    let mut best = hmax(best_v);
    let done = groups * 8 * BLOCK;
    if done < len {
        // SAFETY: `part` makes the `len - done` entries from `done` readable.
        let rest = std::slice::from_raw_parts(part(done, len - done), len - done);
        for (c, b) in rest.chunks(BLOCK).zip(groups * 8..) {
            // A short tail is padded with its own first entry, which changes neither its
            // maximum nor its NaN status.
            let mut buf = [c[0]; BLOCK];
            buf[..c.len()].copy_from_slice(c);
            // SAFETY: `buf` holds BLOCK = 64 floats.
            let r = watch.block_kept(load_block(buf.as_ptr()));
            out[b] = hmax(r);
            best = best.max(out[b]);
        }
    }
    // The first block holding the maximum (`==`, so either zero matches the other).
    let best_block = first_eq(out, best).unwrap_or(0);
    let best = out.get(best_block).copied().unwrap_or(f32::NEG_INFINITY);
    let suspect = watch.seen() || best == f32::INFINITY;
    Summary { max: best, max_block: best_block, suspect }
}

/// See [`super::widen_summarize_f16`]: [`widen_f16`] part by part inside [`summarize`].
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `out`, if given, must hold `src.len()` entries.
#[target_feature(enable = "avx2,fma,bmi1,popcnt,f16c")]
pub unsafe fn widen_summarize_f16(src: &[half::f16], out: Option<&mut [f32]>, block_max: &mut Vec<f32>) -> Summary {
    // SAFETY (closure): this function's features are `widen_f16`'s.
    widen_summarize_with::<FirstOperands, _>(src, out, block_max, |s, o| unsafe { widen_f16(s, o) })
}

/// See [`super::widen_summarize_bf16`]: [`widen_bf16`] part by part inside [`summarize`].
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT; `out`, if given, must hold `src.len()` entries.
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub unsafe fn widen_summarize_bf16(src: &[half::bf16], out: Option<&mut [f32]>, block_max: &mut Vec<f32>) -> Summary {
    // SAFETY (closure): this function's features are `widen_bf16`'s.
    widen_summarize_with::<FirstOperands, _>(src, out, block_max, |s, o| unsafe { widen_bf16(s, o) })
}

/// [`widen_summarize_f16`] or [`widen_summarize_bf16`] with the NaN watch `W` and the widening
/// kernel `widen` (inlined into callers compiled with the features both need). Without `out`,
/// each part is widened into a buffer of one group of blocks instead, summarized while it is
/// in L1, and not kept.
#[inline(always)]
pub(super) unsafe fn widen_summarize_with<W: NanWatch, T>(
    src: &[T],
    out: Option<&mut [f32]>,
    block_max: &mut Vec<f32>,
    widen: impl Fn(&[T], &mut [f32]),
) -> Summary {
    let mut part = [0.0f32; 8 * BLOCK];
    let (o, keep) = match out {
        Some(out) => {
            assert_eq!(out.len(), src.len(), "widen_summarize: wrong output length");
            (out.as_mut_ptr(), true)
        }
        None => (part.as_mut_ptr(), false),
    };
    summarize_from::<W>(
        src.len(),
        |start, n| {
            // SAFETY: `start + n <= src.len()`: with `keep`, `out` holds `src.len()` entries;
            // without, `n <= 8 * BLOCK` (`summarize_from` asks for a group of eight blocks or
            // the rest after the last), all `part` holds. Nothing else holds either.
            let at = if keep { o.add(start) } else { o };
            widen(&src[start..start + n], std::slice::from_raw_parts_mut(at, n));
            at
        },
        None,
        block_max,
    )
}

/// See [`super::patch_summarize`] (the AVX2 NaN watch).
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT; `out` must hold `src.len()` entries, and `edits` be
/// sorted by id, each id below `src.len()`.
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub(crate) unsafe fn patch_summarize(
    src: &[f32],
    edits: &[(u32, f32)],
    div: f32,
    out: &mut [f32],
    block_max: &mut Vec<f32>,
) -> Summary {
    patch_summarize_with::<FirstOperands>(src, edits, div, out, block_max)
}

/// [`patch_summarize`] with the NaN watch `W`: each group of blocks copied into `out`, its
/// edits written over it, and the group summarized while it is in L1.
#[inline(always)]
pub(super) unsafe fn patch_summarize_with<W: NanWatch>(
    src: &[f32],
    edits: &[(u32, f32)],
    div: f32,
    out: &mut [f32],
    block_max: &mut Vec<f32>,
) -> Summary {
    assert_eq!(out.len(), src.len(), "patch_summarize: wrong output length");
    let o = out.as_mut_ptr();
    let mut next = 0;
    summarize_from::<W>(
        src.len(),
        |start, n| {
            // SAFETY: `start + n <= src.len() == out.len()` (`summarize_from` asks for the
            // parts of a row of `src.len()` entries); the edits' ids are below it.
            // PERF: the pass costs about the copy's writes (2.9 µs at V = 32,000 against a
            // floor of 0.8 on an Intel Xeon); explicit vector moves instead of the `memcpy`
            // call per part measured the same.
            std::ptr::copy_nonoverlapping(src.as_ptr().add(start), o.add(start), n);
            while let Some(&(id, logit)) = edits.get(next).filter(|e| (e.0 as usize) < start + n) {
                *o.add(id as usize) = logit;
                next += 1;
            }
            if div != 1.0 {
                divide(std::slice::from_raw_parts_mut(o.add(start), n), div);
            }
            o.add(start)
        },
        // Only the parts written so far may be read.
        None,
        block_max,
    )
}

/// `x / div` for every `x` of `xs`, each rounded to f32 (8 divisions per instruction).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn divide(xs: &mut [f32], div: f32) {
    for x in xs {
        *x /= div;
    }
}

/// [`super::widen_bf16`] on 8 values per step: a bf16 is the top half of an f32.
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT; `out` must hold `src.len()` entries.
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
#[inline]
pub unsafe fn widen_bf16(src: &[half::bf16], out: &mut [f32]) {
    let chunks = src.chunks_exact(8);
    let tail = chunks.remainder();
    let mut outs = out.chunks_exact_mut(8);
    for (c, o) in chunks.zip(&mut outs) {
        // SAFETY: `c` holds 8 bf16 (16 bytes) and `o` 8 f32; unaligned load and store.
        let h = _mm_loadu_si128(c.as_ptr() as *const __m128i);
        _mm256_storeu_si256(o.as_mut_ptr() as *mut __m256i, _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)));
    }
    for (o, h) in outs.into_remainder().iter_mut().zip(tail) {
        *o = f32::from_bits((h.to_bits() as u32) << 16);
    }
}

/// The first index `i` with `values[i] == x`.
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub(super) unsafe fn first_eq(values: &[f32], x: f32) -> Option<usize> {
    let t = _mm256_set1_ps(x);
    let chunks = values.chunks_exact(8);
    let tail = chunks.remainder();
    for (k, c) in chunks.enumerate() {
        // SAFETY: `c` holds 8 floats.
        let m = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(_mm256_loadu_ps(c.as_ptr()), t));
        if m != 0 {
            return Some(8 * k + m.trailing_zeros() as usize);
        }
    }
    let whole = values.len() - tail.len();
    tail.iter().position(|&v| v == x).map(|i| whole + i)
}

/// See [`super::max_except`]: 8 entries per compare, the skipped ones replaced by `-inf` (a
/// lane's bit of `skip`, broadcast and tested against the lane's own bit).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub(super) unsafe fn max_except(block: &[f32], skip: u64) -> f32 {
    let lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    let absent = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut acc = absent;
    let chunks = block.chunks_exact(8);
    let tail = chunks.remainder();
    for (k, c) in chunks.enumerate() {
        let bits = _mm256_set1_epi32(skip.checked_shr(8 * k as u32).unwrap_or(0) as i32 & 0xff);
        let skipped = _mm256_cmpeq_epi32(_mm256_and_si256(bits, lane_bit), lane_bit);
        // SAFETY: `c` holds 8 floats.
        let x = _mm256_blendv_ps(_mm256_loadu_ps(c.as_ptr()), absent, _mm256_castsi256_ps(skipped));
        acc = _mm256_max_ps(acc, x);
    }
    // The lanes' maximum: halves, then pairs, then the last two.
    let m4 = _mm_max_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let mut m = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2)));
    let whole = block.len() - tail.len();
    for (i, &v) in tail.iter().enumerate() {
        if skip.checked_shr((whole + i) as u32).unwrap_or(0) & 1 == 0 && v > m {
            m = v;
        }
    }
    m
}

/// See [`super::positions_in_range`]: 32 bytes per compare, their positions left-packed 8 at
/// a time by table (four stores of 8 per 32 bytes, whatever their count: no branch).
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT (see the module docs).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub(super) unsafe fn positions_in_range(bytes: &[u8], lo: u8, hi: u8, out: &mut Vec<u32>) {
    // Room for every position, and for the 8 lanes each store writes.
    out.reserve(bytes.len() + 8);
    let len = out.len();
    let dst = out.spare_capacity_mut().as_mut_ptr() as *mut u32;
    // Unsigned bytes compared as signed ones, all shifted by 128.
    let flip = _mm256_set1_epi8(i8::MIN);
    let (vlo, vhi) = (_mm256_set1_epi8((lo ^ 0x80) as i8), _mm256_set1_epi8((hi ^ 0x80) as i8));
    let chunks = bytes.chunks_exact(32);
    let tail = chunks.remainder();
    let mut n = 0;
    for (c, chunk) in chunks.enumerate() {
        // SAFETY: `chunk` holds 32 bytes.
        let v = _mm256_xor_si256(_mm256_loadu_si256(chunk.as_ptr() as *const __m256i), flip);
        // `lo <= v < hi`: not `lo > v`, and `hi > v`.
        let inside = _mm256_andnot_si256(_mm256_cmpgt_epi8(vlo, v), _mm256_cmpgt_epi8(vhi, v));
        let mask = _mm256_movemask_epi8(inside) as u32;
        for q in 0..4 {
            let byte = (mask >> (8 * q)) as usize & 0xff;
            // SAFETY: the table row holds 8 lane indices < 8; `n` counts the positions stored
            // so far, fewer than the bytes before this chunk, so the 8 lanes fit the room
            // reserved.
            let lanes = _mm256_loadu_si256(COMPRESS_LUT[byte].as_ptr() as *const __m256i);
            let at = _mm256_add_epi32(lanes, _mm256_set1_epi32((32 * c + 8 * q) as i32));
            _mm256_storeu_si256(dst.add(n) as *mut __m256i, at);
            n += byte.count_ones() as usize;
        }
    }
    let first = bytes.len() - tail.len();
    for (i, &b) in tail.iter().enumerate() {
        // SAFETY: as above, one lane.
        dst.add(n).write((first + i) as u32);
        n += usize::from(lo <= b && b < hi);
    }
    // SAFETY: the first `n` lanes past `len` were written.
    out.set_len(len + n);
}

/// See [`super::rungs`]: its loop compiled for AVX2 (8 blocks a step, where the base ISA's
/// took 4).
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT (see the module docs).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub(super) unsafe fn rungs(block_max: &[f32], s2: f32, m2: f32, last: f32, out: &mut [u8]) {
    super::rungs_with(block_max, s2, m2, last, out);
}

/// See [`super::rounded_increments`]: its loop compiled for AVX2.
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT (see the module docs).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub(super) unsafe fn rounded_increments(ws: &[f32], sum: f32, scale_cum: f64, scale_run: f64) -> Option<(u64, u64)> {
    super::rounded_increments_with(ws, sum, scale_cum, scale_run)
}

/// The max tree of one block's eight vectors, the first operand `lo` of its root's `max`,
/// and a mask of the lanes where a first operand below it is NaN (`unordered` of pairs of
/// them). `vmaxps a, b` returns `b` when either operand is NaN: a NaN in a second operand
/// moves up the tree, one in a first operand stops there. Every NaN of the block therefore
/// reaches the root, `lo` or the mask. LLVM keeps the operands in this order: its x86 `max` node is not
/// commutative unless NaN is ruled out (the tests put NaN at every position).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn block_max_firsts(x: [__m256; 8]) -> (__m256, __m256, __m256) {
    let [x0, x1, x2, x3, x4, x5, x6, x7] = x;
    let m01 = _mm256_max_ps(x0, x1);
    let m23 = _mm256_max_ps(x2, x3);
    let m45 = _mm256_max_ps(x4, x5);
    let m67 = _mm256_max_ps(x6, x7);
    let lo = _mm256_max_ps(m01, m23);
    let root = _mm256_max_ps(lo, _mm256_max_ps(m45, m67));
    let nan = _mm256_or_ps(
        _mm256_or_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(x0, x2), _mm256_cmp_ps::<_CMP_UNORD_Q>(x4, x6)),
        _mm256_cmp_ps::<_CMP_UNORD_Q>(m01, m45),
    );
    (root, lo, nan)
}

/// See [`super::locate_max`]. Per block: the max tree (7 `max`, four of them with a load
/// folded in), one compare of its root with the best so far, which is also true for a NaN
/// lane, and four `unordered` compares of the tree's first operands ORed into a running mask
/// whose test is made once at the end (see `block_max_firsts`). The horizontal maximum is
/// taken only in the rare blocks where the compare fires (a new maximum, or a NaN, whose root
/// then goes into the mask too). Against [`summarize`]: no horizontal maximum, no store and no
/// scalar compare per block. The tail is padded with its own first entry, which changes
/// neither its maximum nor its NaN status.
///
/// A row that does not start on a 32-byte boundary is scanned from its first boundary on, in
/// blocks of 64 that are aligned but are not the row's (`locate_from_boundary`). Unlike the
/// block maxima of [`summarize`], the maximum and the NaN watch do not care where blocks
/// start. PERF: on a row 16 or 48 bytes past a 64-byte boundary this took 3–5% longer than on
/// an aligned row (the entries before the boundary and the lookup), where unaligned loads took
/// a third to a half longer and nine aligned loads with a blend per block (`Realign`) 11–13%
/// (Intel Xeon with AVX-512, V = 32,000 and 128,256, one process).
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT (see the module docs).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub unsafe fn locate_max(row: &[f32]) -> Summary {
    // SAFETY (closure): this function's features are `locate_blocks`'s. The scan is a function
    // of its own (not an inlined closure) so that it is compiled with them.
    locate_from_boundary(row, 32, |body| unsafe { locate_blocks(body) })
}

/// `blocks` (a [`super::locate_max`] in blocks of its own) over `row` from its first
/// `align`-byte boundary, and the entries before it one by one; the summary of the whole row,
/// with the block of the maximum's first occurrence in the row's own blocks (looked up in the
/// scan's block that holds it).
#[inline(always)]
pub(super) fn locate_from_boundary(row: &[f32], align: usize, blocks: impl Fn(&[f32]) -> Summary) -> Summary {
    let head = row.as_ptr().align_offset(align);
    if head == 0 || head >= row.len() {
        return blocks(row);
    }
    let (first, body) = row.split_at(head);
    let s = blocks(body);
    let first_max = first.iter().fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
    let max = if first_max >= s.max { first_max } else { s.max };
    let at = if first_max == max {
        first.iter().position(|&x| x == max).unwrap_or(0)
    } else {
        let from = s.max_block * BLOCK;
        head + from + body[from..].iter().position(|&x| x == max).unwrap_or(0)
    };
    let suspect = s.suspect || first.iter().any(|x| x.is_nan()) || max == f32::INFINITY;
    Summary { max, max_block: at / BLOCK, suspect }
}

/// [`locate_max`] in the blocks of `row` itself.
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn locate_blocks(row: &[f32]) -> Summary {
    let mut watch = FirstOperands::new();
    let mut best = f32::NEG_INFINITY;
    let mut best_v = _mm256_set1_ps(best);
    // The start of the best block so far. PERF: a pointer rather than a block index keeps the
    // loop free of indexed addressing: Intel cores can split a three-operand `max` whose
    // folded load uses an index register into two uops.
    let mut best_at = row.as_ptr();
    let chunks = row.chunks_exact(BLOCK);
    let tail = chunks.remainder();
    let full = chunks.len();
    for c in chunks {
        // SAFETY: `c` holds BLOCK = 64 floats.
        let root = watch.block(load_block(c.as_ptr()));
        // `!(root <= best)`: a lane above the best so far, or a NaN lane.
        if _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_NLE_UQ>(root, best_v)) != 0 {
            watch.keep(root);
            let bm = hmax(root);
            if bm > best {
                best = bm;
                best_v = _mm256_set1_ps(best);
                best_at = c.as_ptr();
            }
        }
    }
    let mut best_block = (best_at as usize - row.as_ptr() as usize) / (BLOCK * std::mem::size_of::<f32>());
    if let Some(&first) = tail.first() {
        let mut buf = [first; BLOCK];
        buf[..tail.len()].copy_from_slice(tail);
        // SAFETY: `buf` holds BLOCK = 64 floats.
        let root = watch.block_kept(load_block(buf.as_ptr()));
        let bm = hmax(root);
        if bm > best {
            best = bm;
            best_block = full;
        }
    }
    let suspect = watch.seen() || best == f32::INFINITY;
    Summary { max: best, max_block: best_block, suspect }
}

/// See [`super::widen_f16`]: `vcvtph2ps` on 8 values at a time, the tail through `half`.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (see the module docs).
#[target_feature(enable = "avx2,fma,bmi1,popcnt,f16c")]
#[inline]
pub unsafe fn widen_f16(src: &[half::f16], out: &mut [f32]) {
    let chunks = src.chunks_exact(8);
    let tail = chunks.remainder();
    let mut outs = out.chunks_exact_mut(8);
    for (c, o) in chunks.zip(&mut outs) {
        // SAFETY: `c` holds 8 f16 (16 bytes) and `o` 8 f32; unaligned load and store.
        let h = _mm_loadu_si128(c.as_ptr() as *const __m128i);
        _mm256_storeu_ps(o.as_mut_ptr(), _mm256_cvtph_ps(h));
    }
    for (o, h) in outs.into_remainder().iter_mut().zip(tail) {
        *o = h.to_f32();
    }
}

/// See [`super::block_max_into`]: [`summarize`]'s eight blocks at a time, without the sum.
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT (see the module docs).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub unsafe fn block_max_into(row: &[f32], out: &mut [f32]) -> f32 {
    let mut best_v = _mm256_set1_ps(f32::NEG_INFINITY);
    let groups = row.chunks_exact(8 * BLOCK);
    let rest = groups.remainder();
    let mut b = 0;
    let realign = Realign::of(row.as_ptr());
    for g in groups {
        let mut roots = [_mm256_setzero_ps(); 8];
        match realign {
            Some(ra) if ra.fits(b, row.len()) && ra.fits(b + 7, row.len()) => {
                for (k, root) in roots.iter_mut().enumerate() {
                    // SAFETY: blocks `b..b + 8` fit: the floats around each are in the row.
                    *root = block_max_tree(ra.block(g.as_ptr().add(k * BLOCK)));
                }
            }
            _ => {
                for (k, root) in roots.iter_mut().enumerate() {
                    // SAFETY: `g` holds 8 blocks of BLOCK = 64 floats.
                    *root = block_max_tree(load_block(g.as_ptr().add(k * BLOCK)));
                }
            }
        }
        let v = hmax8(&roots);
        out[b..b + 8].copy_from_slice(&std::mem::transmute::<__m256, [f32; 8]>(v));
        best_v = _mm256_max_ps(best_v, v);
        b += 8;
    }
    let mut best = hmax(best_v);
    for c in rest.chunks(BLOCK) {
        let mut pad = [f32::NEG_INFINITY; BLOCK];
        pad[..c.len()].copy_from_slice(c);
        // SAFETY: `pad` holds BLOCK = 64 floats.
        out[b] = hmax(block_max_tree(load_block(pad.as_ptr())));
        if out[b] > best {
            best = out[b];
        }
        b += 1;
    }
    best
}

/// See [`super::argmax`].
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT (see the module docs).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub unsafe fn argmax(row: &[f32]) -> Option<usize> {
    if row.is_empty() {
        return None;
    }
    let mut best = f32::NEG_INFINITY;
    let mut best_v = _mm256_set1_ps(best);
    let mut best_block = 0;
    let chunks = row.chunks_exact(BLOCK);
    let tail = chunks.remainder();
    let mut pad = [f32::NEG_INFINITY; BLOCK];
    pad[..tail.len()].copy_from_slice(tail);
    let blocks = chunks.map(|c| c.as_ptr()).chain((!tail.is_empty()).then_some(pad.as_ptr()));
    for (b, p) in blocks.enumerate() {
        // SAFETY: `p` points to BLOCK = 64 floats (a full chunk, or the -inf padded tail).
        let m = block_max_tree(load_block(p));
        // Only a block with a lane above the best so far needs its horizontal maximum.
        if _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(m, best_v)) != 0 {
            best = hmax(m);
            best_v = _mm256_set1_ps(best);
            best_block = b;
        }
    }
    let at = best_block * BLOCK;
    let end = (at + BLOCK).min(row.len());
    row[at..end].iter().position(|&x| x == best).map(|i| at + i)
}

/// See [`super::count_ge`].
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT (see the module docs).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub unsafe fn count_ge(values: &[f32], threshold: f32) -> usize {
    let t = _mm256_set1_ps(threshold);
    let chunks = values.chunks_exact(8);
    let tail = chunks.remainder();
    let mut n = 0;
    for c in chunks {
        // SAFETY: `c` holds 8 floats.
        let x = _mm256_loadu_ps(c.as_ptr());
        n += (_mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(x, t)) as u32).count_ones() as usize;
    }
    n + tail.iter().filter(|&&x| x >= threshold).count()
}

/// See [`super::min`]: the portable lanes, compiled for AVX2 (32 f32 lanes, four vectors).
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT.
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub(crate) unsafe fn min(row: &[f32]) -> f32 {
    super::portable::min(row)
}

/// See `arch::moments`: the portable lanes, compiled for AVX2 (16 f32 lanes, two vectors).
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT.
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub(crate) unsafe fn moments(values: &[f32]) -> (usize, f32, f64, f64) {
    super::portable::moments::<_, true>(values, |&x| x)
}

/// Bit `i` set for every `i` with `piece[i] >= threshold` (`t` holds it in every lane), for a
/// `piece` of at most 64 entries.
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn mask_ge(piece: &[f32], t: __m256, threshold: f32) -> u64 {
    mask_cmp::<_CMP_GE_OQ>(piece, t, |x| x >= threshold)
}

/// Bit `i` set for every `i` where `piece[i]` compares true with `t` by the predicate `IMM`
/// (`keep` is the same test on one value), for a `piece` of at most 64 entries.
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn mask_cmp<const IMM: i32>(piece: &[f32], t: __m256, keep: impl Fn(f32) -> bool) -> u64 {
    if let Ok(whole) = <&[f32; 64]>::try_from(piece) {
        return mask64::<IMM>(whole, t);
    }
    let chunks = piece.chunks_exact(8);
    let tail = chunks.remainder();
    let mut bits = 0u64;
    for (k, c) in chunks.enumerate() {
        // SAFETY: `c` holds 8 floats.
        let x = _mm256_loadu_ps(c.as_ptr());
        bits |= (_mm256_movemask_ps(_mm256_cmp_ps::<IMM>(x, t)) as u8 as u64) << (8 * k);
    }
    let whole = piece.len() - tail.len();
    for (j, &x) in tail.iter().enumerate() {
        if keep(x) {
            bits |= 1 << (whole + j);
        }
    }
    bits
}

/// Bit `i` set for every `i` where `x[i]` compares true with `t` by the predicate `IMM`.
///
/// PERF: the 8 compares' masks packed to bytes (two signed packs and a lane permute per 4
/// vectors) and taken by two byte movemasks, where a float movemask per vector took 8, and
/// shifts and ors to join them: on Zen 3 the movemasks bound the loop (a throwaway harness:
/// 64-entry masks of 4,000 vectors, 3.0 -> 1.7-2.0 µs).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn mask64<const IMM: i32>(x: &[f32; 64], t: __m256) -> u64 {
    // SAFETY: `x` holds 64 floats, so 8 from `8k` are in bounds for k < 8.
    let c = |k: usize| _mm256_castps_si256(_mm256_cmp_ps::<IMM>(_mm256_loadu_ps(x.as_ptr().add(8 * k)), t));
    let half = |k: usize| {
        // Per 128-bit lane, bytes: the low halves of vectors k..k+4, then the high halves,
        // as dwords `[k.lo, k+1.lo, k+2.lo, k+3.lo | k.hi, k+1.hi, k+2.hi, k+3.hi]`.
        let bytes = _mm256_packs_epi16(_mm256_packs_epi32(c(k), c(k + 1)), _mm256_packs_epi32(c(k + 2), c(k + 3)));
        let ordered = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_movemask_epi8(ordered) as u32 as u64
    };
    half(0) | half(4) << 32
}

/// See [`super::for_each_ge`].
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT (see the module docs).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub unsafe fn for_each_ge(block: &[f32], threshold: f32, mut f: impl FnMut(usize, f32)) {
    // One mask for the whole block (at most 64 entries): one loop over its set bits.
    let mut bits = mask_ge(block, _mm256_set1_ps(threshold), threshold);
    while bits != 0 {
        let i = bits.trailing_zeros() as usize;
        f(i, block[i]);
        bits &= bits - 1;
    }
}

/// See [`super::gather_ge`].
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT (see the module docs).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
#[inline]
pub unsafe fn gather_ge(block: &[f32], base: u32, threshold: f32, out: &mut Vec<TokenData>) {
    let t = _mm256_set1_ps(threshold);
    if let Ok(whole) = <&[f32; BLOCK]>::try_from(block) {
        // A whole block: its 64 compares into one mask first, whose set bits give the entries.
        // PERF: one loop exit per block to mispredict, where a branch per vector of 8 (below)
        // mispredicts on every vector that holds an entry.
        let mut hits = mask64::<_CMP_GE_OQ>(whole, t);
        while hits != 0 {
            let j = hits.trailing_zeros() as usize;
            hits &= hits - 1;
            out.push(TokenData { id: base + j as u32, logit: whole[j], p: 0.0 });
        }
        return;
    }
    let chunks = block.chunks_exact(8);
    let tail = chunks.remainder();
    let mut i0 = base;
    for c in chunks {
        // SAFETY: `c` holds 8 floats.
        let x = _mm256_loadu_ps(c.as_ptr());
        let mut mask = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(x, t)) as u32;
        while mask != 0 {
            let j = mask.trailing_zeros() as usize;
            out.push(TokenData { id: i0 + j as u32, logit: c[j], p: 0.0 });
            mask &= mask - 1;
        }
        i0 += 8;
    }
    for (j, &x) in tail.iter().enumerate() {
        if x >= threshold {
            out.push(TokenData { id: i0 + j as u32, logit: x, p: 0.0 });
        }
    }
}

/// See [`super::gather_blocks_ge`]: the block maxima tested 64 at a time into one mask, the
/// passing blocks listed (from up to `LISTED` = 512 maxima at a time), then each listed
/// block's entries by the set bits of its mask (`mask64`), written in place.
///
/// PERF: listing first leaves the gathering loop a known trip count, so the loads of the next
/// blocks issue while this one's bits are visited. Visiting each group's passing bits as they
/// were found took 0.33 µs against 0.27–0.28 µs listed, for the 40 blocks that reach the top 40
/// of the bench's row at V = 32,000 (0.48 against 0.37–0.38 µs at 128,256), on an Intel Xeon
/// (Sapphire Rapids class). In the bench (interleaved, 5 to 7 pairs): raw `logprobs(20)` at
/// 32k 2.70× → 2.62× the floor, the default chain at 128k 1.112× → 1.100×, at 32k unchanged.
///
/// On CPUs with AVX-512F, `avx512::gather_blocks_ge` runs instead: a compress per 16
/// maxima for the listing and four compares per block. On Zen 4 it measured 0.21–0.30 µs
/// alone against 0.33 but within noise in the chains (`tokensieve bench`, interleaved, 2.04×
/// against 2.04× at 32k, with the 57 blocks that reach the top 60 of the bench's row); on an
/// Intel Xeon, alternating call by call, it took a third less (see there). Compressing each
/// block's entries instead of visiting its mask's bits took 0.41 µs on Zen 4 (the register
/// compresses are slow there).
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT (see the module docs).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub unsafe fn gather_blocks_ge(row: &[f32], block_max: &[f32], threshold: f32, out: &mut Vec<TokenData>) {
    let t = _mm256_set1_ps(threshold);
    // Uninitialised: zeroing 2 KiB on every call cost more than the gathering's own listing.
    let mut listed = [const { std::mem::MaybeUninit::<u32>::uninit() }; LISTED];
    for (l, part) in block_max.chunks(LISTED).enumerate() {
        let mut n = 0;
        for (g, maxima) in part.chunks(64).enumerate() {
            let mut passing = mask_ge(maxima, t, threshold);
            while passing != 0 {
                // At most one entry per maximum of `part`: `n < LISTED`.
                listed[n].write((l * LISTED + g * 64) as u32 + passing.trailing_zeros());
                n += 1;
                passing &= passing - 1;
            }
        }
        // Room for every entry of the listed blocks: each is written in place and counted,
        // where a push reloaded the vector's length and capacity for every entry.
        out.reserve(n * BLOCK);
        let len = out.len();
        let dst = out.spare_capacity_mut();
        let mut k = 0;
        for b in &listed[..n] {
            // SAFETY: the first `n` were written above.
            let b = b.assume_init() as usize;
            let start = b * BLOCK;
            let block = &row[start..row.len().min(start + BLOCK)];
            let mut hits = mask_ge(block, t, threshold);
            while hits != 0 {
                let j = hits.trailing_zeros() as usize;
                hits &= hits - 1;
                // At most `BLOCK` entries per listed block: `k < n · BLOCK`.
                dst[k].write(TokenData { id: (start + j) as u32, logit: block[j], p: 0.0 });
                k += 1;
            }
        }
        // SAFETY: the `k` entries past `len` were written above.
        out.set_len(len + k);
    }
}

/// The block maxima [`gather_blocks_ge`] tests before gathering from the blocks that pass.
const LISTED: usize = 512;

/// See [`super::Collector::start`] (the AVX-512 kernel's contract): lists the blocks whose
/// maximum reaches `threshold`, 8 maxima per compare, their indices left-packed by table.
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT (see the module docs).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub(crate) unsafe fn list_blocks_ge(block_max: &[f32], threshold: f32, blocks: &mut [u32]) -> usize {
    assert!(blocks.len() >= block_max.len() + 16, "list_blocks_ge: no room for the block list");
    let t = _mm256_set1_ps(threshold);
    let mut listed = 0;
    let groups = block_max.chunks_exact(8);
    let rest = groups.remainder();
    let step = _mm256_set1_epi32(8);
    let mut index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for maxima in groups {
        // SAFETY: `maxima` holds 8 floats; the table row holds 8 lane indices < 8.
        let passing = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(_mm256_loadu_ps(maxima.as_ptr()), t)) as usize;
        let lanes = _mm256_loadu_si256(COMPRESS_LUT[passing].as_ptr() as *const __m256i);
        // At most one index per maximum before this group: `listed + 8 <= blocks.len()`.
        let out = &mut blocks[listed..listed + 8];
        // SAFETY: `out` holds 8 u32.
        _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, _mm256_permutevar8x32_epi32(index, lanes));
        listed += passing.count_ones() as usize;
        index = _mm256_add_epi32(index, step);
    }
    super::list_rest(block_max, rest.len(), threshold, blocks, listed)
}

/// See [`super::Collector::next`]: the contract of AVX-512's `collect_listed`, 8 lanes wide.
///
/// PERF: on the bench's row at V = 32,000, 411 of the 500 blocks pass with 2.2 entries each,
/// so the work per block is what counts ([`collect_block`]). A left-pack per vector of 8 (a
/// table load and a permute for each of the 8, as [`exp_sum_unordered`]'s scan does) spent
/// most of its work on vectors with nothing to queue.
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT (see the module docs).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub(crate) unsafe fn collect_listed(
    row: &[f32],
    blocks: &[u32],
    threshold: f32,
    queue: &mut [f32],
    limit: usize,
) -> (usize, usize) {
    assert!(queue.len() >= limit + BLOCK, "collect_listed: no room in the queue");
    let t = _mm256_set1_ps(threshold);
    let mut n = 0;
    for (read, &b) in blocks.iter().enumerate() {
        if n >= limit {
            return (read, n);
        }
        let first = b as usize * BLOCK;
        // The block six places down the list, fetched ahead: at V >= 128k the listed blocks
        // are a third of the row, spread out, so the hardware's stream prefetch misses them.
        // PERF (interleaved, 8 runs each, Zen 3): raw logprobs at 128k 2.53-2.62 -> 2.32-2.55x
        // the floor, at 151,936 1.78-1.99 -> 1.67-1.93x; at 32k (most blocks listed) no change.
        if let Some(&ahead) = blocks.get(read + 6) {
            let p = row.as_ptr().wrapping_add(ahead as usize * BLOCK) as *const i8;
            for line in 0..4 {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64 * line));
            }
        }
        // `n < limit`: the queue has room for a block of values from `n`.
        let room = &mut queue[n..n + BLOCK];
        n += match row.get(first..first + BLOCK) {
            Some(whole) => collect_block(whole.try_into().expect("a whole block"), t, room),
            None => {
                // The row's last, short block (padding it would queue the pad where the
                // threshold is -inf).
                let mut k = 0;
                for &x in &row[first..] {
                    room[k] = x;
                    k += usize::from(x >= threshold);
                }
                k
            }
        };
    }
    (blocks.len(), n)
}

/// Copies the entries `>= t` of `block` to the start of `room`; returns their count.
///
/// PERF: in the usual case no lane of the block's 8 vectors holds two of them (2.2 entries a
/// block on the bench's row at V = 32,000); then they are the lane maxima at or above `t`, one
/// left-pack in all. Counting each lane's entries takes a subtract per vector, where a mask
/// per vector took a movemask, a shift and an or, and the copies by its set bits a chain of
/// dependent bit operations, loads and stores (raw logprobs at 32k: 5.4 -> 4.3x the floor).
/// Otherwise each vector is left-packed.
/// Inlined into [`collect_listed`] (whose target features it needs).
#[inline(always)]
unsafe fn collect_block(block: &[f32; BLOCK], t: __m256, room: &mut [f32]) -> usize {
    let room: &mut [f32; BLOCK] = room.try_into().expect("room for a block");
    // SAFETY: `block` holds 8 vectors of 8 floats.
    let x: [__m256; 8] = std::array::from_fn(|k| _mm256_loadu_ps(block.as_ptr().add(8 * k)));
    let mut count = _mm256_setzero_si256();
    for &v in &x {
        // A lane that passes compares to -1.
        count = _mm256_sub_epi32(count, _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(v, t)));
    }
    let crowded = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(count, _mm256_set1_epi32(1))));
    if crowded == 0 {
        let lanes = _mm256_max_ps(
            _mm256_max_ps(_mm256_max_ps(x[0], x[1]), _mm256_max_ps(x[2], x[3])),
            _mm256_max_ps(_mm256_max_ps(x[4], x[5]), _mm256_max_ps(x[6], x[7])),
        );
        let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(lanes, t)) as usize;
        // SAFETY: the table row holds 8 lane indices < 8; `room` holds at least 8 floats.
        let idx = _mm256_loadu_si256(COMPRESS_LUT[hit].as_ptr() as *const __m256i);
        _mm256_storeu_ps(room.as_mut_ptr(), _mm256_permutevar8x32_ps(lanes, idx));
        return hit.count_ones() as usize;
    }
    // A left-pack per vector. PERF: on rows where most entries reach the threshold a copy
    // per entry cost a loop iteration each: raw logprobs on the real row at 32k (8,700
    // entries) 14.7 -> 13.1x the floor, a flat row 40 -> 37x (min of 5 interleaved runs). The
    // scan of `exp_sum_unordered`, which adds blocks of 40 or more such entries whole, did
    // 11.8x and 33x there before the collector ran on AVX2.
    let mut n = 0;
    for &v in &x {
        let m = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(v, t)) as usize;
        n = pack_vector(v, m, room, n);
    }
    n
}

/// See [`super::positions_ge`]: 64 values per mask, a loop over its set bits.
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT (see the module docs).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub(crate) unsafe fn positions_ge(values: &[f32], threshold: f32, out: &mut Vec<u32>) {
    let t = _mm256_set1_ps(threshold);
    for (g, piece) in values.chunks(64).enumerate() {
        push_positions(64 * g, mask_ge(piece, t, threshold), out);
    }
}

/// See [`super::positions_le`]: [`positions_ge`] with the other comparison.
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT (see the module docs).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub(crate) unsafe fn positions_le(values: &[f32], threshold: f32, out: &mut Vec<u32>) {
    let t = _mm256_set1_ps(threshold);
    for (g, piece) in values.chunks(64).enumerate() {
        push_positions(64 * g, mask_cmp::<_CMP_LE_OQ>(piece, t, |x| x <= threshold), out);
    }
}

/// Appends `first + i` for every set bit `i` of `hits`, ascending.
#[inline(always)]
pub(super) fn push_positions(first: usize, mut hits: u64, out: &mut Vec<u32>) {
    while hits != 0 {
        out.push(first as u32 + hits.trailing_zeros());
        hits &= hits - 1;
    }
}

// ------------------------------------------------------------------------------- expf

/// glibc's `__exp2f_data.tab`: `asuint64(2^(i/32)) - (i << 47)`.
pub(super) static EXP2F_TAB: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];

/// `expf` underflows to +0 below this (glibc: `x < -0x1.9fe368p6f`, i.e. below log(2^-150)).
pub(super) const EXPF_UFLOW: f32 = -103.972_08;

/// glibc's `expf` constants: `32/ln 2` (`InvLn2N`), the rounding shift `0x1.8p52` and the cubic's
/// coefficients `C[0..3]` scaled to the table's `N = 32`, as in its `__exp2f_data`.
pub(super) const EXPF_INV_LN2_N: f64 = f64::from_bits(0x3ff7_1547_652b_82fe) * 32.0;
/// See [`EXPF_INV_LN2_N`].
pub(super) const EXPF_SHIFT: f64 = f64::from_bits(0x4338_0000_0000_0000);
/// See [`EXPF_INV_LN2_N`].
pub(super) const EXPF_POLY: [f64; 3] = [
    f64::from_bits(0x3fac_6af8_4b91_2394) / 32768.0,
    f64::from_bits(0x3fce_bfce_50fa_c4f3) / 1024.0,
    f64::from_bits(0x3fe6_2e42_ff0c_52d6) / 32.0,
];

/// glibc's `__expf` main path on 4 lanes (`x` widened to double), before the final rounding
/// to f32: `z = x·32/ln2 = k + r`, `2^(k/32)` from the table and the exponent bits, a cubic in
/// `r`. The multiply-adds are fused exactly where glibc's FMA variant (`__expf_fma`, picked by
/// its ifunc on CPUs with FMA) fuses them.
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn expf_core(xd: __m256d) -> __m256d {
    let inv_ln2_n = _mm256_set1_pd(EXPF_INV_LN2_N);
    let shift = _mm256_set1_pd(EXPF_SHIFT);
    let [c0, c1, c2] = EXPF_POLY.map(|c| _mm256_set1_pd(c));
    let kd_shifted = _mm256_fmadd_pd(inv_ln2_n, xd, shift);
    let ki = _mm256_castpd_si256(kd_shifted);
    let kd = _mm256_sub_pd(kd_shifted, shift);
    let r = _mm256_fmsub_pd(inv_ln2_n, xd, kd);
    let idx = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
    // SAFETY: every index is masked to 0..32 and EXP2F_TAB has 32 entries of 8 bytes.
    let t = _mm256_i64gather_epi64::<8>(EXP2F_TAB.as_ptr() as *const i64, idx);
    let s = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64::<47>(ki)));
    let z = _mm256_fmadd_pd(c0, r, c1);
    let r2 = _mm256_mul_pd(r, r);
    let y = _mm256_fmadd_pd(c2, r, _mm256_set1_pd(1.0));
    let y = _mm256_fmadd_pd(z, r2, y);
    _mm256_mul_pd(y, s)
}

/// `expf(x)` on 8 lanes, for `x <= 0` or `-inf`.
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn expf8(x: __m256) -> __m256 {
    let lo = _mm256_cvtpd_ps(expf_core(_mm256_cvtps_pd(_mm256_castps256_ps128(x))));
    let hi = _mm256_cvtpd_ps(expf_core(_mm256_cvtps_pd(_mm256_extractf128_ps::<1>(x))));
    let y = _mm256_set_m128(hi, lo);
    let under = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(EXPF_UFLOW));
    _mm256_andnot_ps(under, y)
}

/// See [`super::exp_shifted`].
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT (see the module docs).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub unsafe fn exp_shifted(src: &[f32], div: f32, sub: f32, out: &mut [f32]) {
    let (d, s) = (_mm256_set1_ps(div), _mm256_set1_ps(sub));
    let n = src.len().min(out.len());
    let (src, out) = (&src[..n], &mut out[..n]);
    let full = n - n % 8;
    for (c, o) in src[..full].chunks_exact(8).zip(out[..full].chunks_exact_mut(8)) {
        // SAFETY: `c` and `o` each hold 8 floats.
        let x = _mm256_sub_ps(_mm256_div_ps(_mm256_loadu_ps(c.as_ptr()), d), s);
        _mm256_storeu_ps(o.as_mut_ptr(), expf8(x));
    }
    for (o, &x) in out[full..].iter_mut().zip(&src[full..]) {
        *o = (x / div - sub).exp();
    }
}

/// See [`super::exp_shifted_sum`].
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT (see the module docs).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub unsafe fn exp_shifted_sum(src: &[f32], div: f32, sub: f32) -> f64 {
    let (d, s) = (_mm256_set1_ps(div), _mm256_set1_ps(sub));
    let mut lo = _mm256_setzero_pd();
    let mut hi = _mm256_setzero_pd();
    let chunks = src.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        // SAFETY: `c` holds 8 floats.
        let x = _mm256_sub_ps(_mm256_div_ps(_mm256_loadu_ps(c.as_ptr()), d), s);
        let w = expf8(x);
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(w)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(w)));
    }
    let mut v = [0.0f64; 4];
    // SAFETY: `v` holds 4 doubles.
    _mm256_storeu_pd(v.as_mut_ptr(), _mm256_add_pd(lo, hi));
    let mut sum = (v[0] + v[1]) + (v[2] + v[3]);
    for &x in tail {
        sum += (x / div - sub).exp() as f64;
    }
    sum
}

/// See [`super::exp_sum_sequential`]. A block where many entries pass the threshold is
/// added whole, straight from the row (the weights of the others are below half an ulp:
/// adding them changes nothing, and exponentiating them costs less than packing); from the
/// other blocks the passing entries are left-packed into a queue, in order. Everything is
/// added by `add_group`, which sums most weights as integers instead of a chain of
/// dependent f32 additions.
///
/// The bound (natural log of half an ulp of a lower bound of the running sum, see
/// `log_half_ulp`) is the larger of two: from the sum as last computed (it only
/// grows), and from the weight `w = expf(m - sub)` of the largest logit `m` of the blocks
/// before the current one: in the plain loop, the sum right after adding any weight `w` is
/// `fl(s + w) >= fl(0 + w) = w` (`s >= 0`, rounding is monotone), so every later sum is at
/// least `w` too. (Not the current block's maximum: it may come after the entries it would
/// let skip.) This lets the part of the row after a large logit skip blocks before the
/// queued weights are added.
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT (see the module docs).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub unsafe fn exp_sum_sequential(start: f32, row: &[f32], sub: f32, block_max: &[f32], patches: &[(u32, f32)]) -> f32 {
    exp_sum_sequential_with::<Avx2Scan>(start, row, sub, block_max, patches)
}

/// See [`super::exp_sum_unordered`].
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT (see the module docs).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub unsafe fn exp_sum_unordered(
    start: f32,
    row: &[f32],
    sub: f32,
    block_max: &[f32],
    patches: &[(u32, f32)],
) -> Option<f32> {
    exp_sum_unordered_with::<Avx2Scan>(start, row, sub, block_max, patches)
}

/// [`exp_sum_unordered`] with the block scan `S` (inlined into each caller, as
/// [`exp_sum_sequential_with`]).
///
/// The sum stays in `start`'s binade or the answer is `None`, so its ulp `u` is `start`'s
/// throughout: every weight below `u/2` adds nothing (one fixed threshold, no running bound),
/// and every other moves the sum by its integer increment ([`add_group`]'s method and proof),
/// whatever the order. So the increments are totalled as the entries come, and the answer is
/// `start` plus the total in ulps, when no increment was a tie or out of range and the total
/// leaves room in the significand (`start + total·u < 2^(e+1)`: the binade kept). Any order
/// of the same additions from `start` gives these bits, the plain loop's included. Where the
/// ulp scale allows, each vector's increments come from approximate weights when a
/// certificate shows them to be the exact ones ([`approx_increments`]).
///
/// PERF: this used to be the sequential kernel with a verdict at the end. This loop keeps no
/// running sum, bound or prefix maximum, and need not add the queued weights before a dense
/// block. On the bench's language-model row at V = 32,000, 410 of the 500 blocks pass, with
/// 2.2 entries at or above the threshold each: the per-block work is what counts (4.2 → 3.5 µs
/// for that row's sum, in a throwaway harness).
#[inline(always)]
pub(super) unsafe fn exp_sum_unordered_with<S: BlockScan>(
    start: f32,
    row: &[f32],
    sub: f32,
    block_max: &[f32],
    patches: &[(u32, f32)],
) -> Option<f32> {
    const QUEUE: usize = 256;
    const { assert!(QUEUE + BLOCK + 8 <= INCREMENTS_MAX, "a queue is added by one `increments` call") };
    // Blocks with at least this many entries at or above the threshold are added whole.
    const DENSE: usize = 40;
    let mut total = UlpTotal::new(start, sub)?;
    let threshold = super::skip_threshold(sub, super::log_half_ulp(start));
    let mut add = |xs: &[f32]| total.add::<S>(xs);
    // As in `exp_sum_sequential_with`: a full queue is added only once the other is full too,
    // so its entries are not loaded right after their overlapping stores.
    let mut queues = [[f32::NEG_INFINITY; QUEUE + BLOCK + 8]; 2];
    let (mut cur, mut n, mut waiting) = (0, 0, 0);
    let mut patch = super::PatchCursor::new(patches);
    let mut patched = [0.0f32; BLOCK];
    for (g, maxima) in block_max.chunks(GROUP).enumerate() {
        let mut passing = match <&[f32; GROUP]>::try_from(maxima) {
            Ok(whole) => S::passing(whole, threshold),
            Err(_) => maxima.iter().enumerate().fold(0, |m, (j, &bm)| m | ((bm >= threshold) as u32) << j),
        };
        while passing != 0 {
            let j = passing.trailing_zeros() as usize;
            passing &= passing - 1;
            let first = (g * GROUP + j) * BLOCK;
            let end = row.len().min(first + BLOCK);
            let block = if patch.in_block(first, end) {
                patch.apply(row, first, end, &mut patched)
            } else if end - first == BLOCK {
                // SAFETY: `first + BLOCK <= row.len()`.
                std::slice::from_raw_parts(row.as_ptr().add(first), BLOCK)
            } else {
                &row[first..end]
            };
            if let Ok(whole) = <&[f32; BLOCK]>::try_from(block) {
                let count = S::select_pack(whole, threshold, &mut queues[cur][n..]);
                if count >= DENSE {
                    if !add(block) {
                        return None;
                    }
                    continue;
                }
                n += count;
            } else {
                for &x in block {
                    if x >= threshold {
                        queues[cur][n] = x;
                        n += 1;
                    }
                }
            }
            if n >= QUEUE {
                if waiting > 0 && !add(&queues[1 - cur][..waiting]) {
                    return None;
                }
                let padded = n.div_ceil(8) * 8;
                queues[cur][n..padded].fill(f32::NEG_INFINITY);
                (waiting, n, cur) = (padded, 0, 1 - cur);
            }
        }
    }
    for (q, len) in [(1 - cur, waiting), (cur, n)] {
        let padded = len.div_ceil(8) * 8;
        queues[q][len..padded].fill(f32::NEG_INFINITY);
        if !add(&queues[q][..padded]) {
            return None;
        }
    }
    Some(total.sum())
}

/// See [`super::exp_sum_unordered_values`].
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT (see the module docs).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub(crate) unsafe fn exp_sum_unordered_values(start: f32, xs: &[f32], sub: f32) -> Option<f32> {
    exp_sum_unordered_values_with::<Avx2Scan>(start, xs, sub)
}

/// [`exp_sum_unordered_with`] over the values `xs` instead of a row (a multiple of 8 of
/// them; `-inf` pads): `start` plus the weights of `xs` in any order, when that cannot depend
/// on the order. Every value at or above the threshold for `start` must be there, each as
/// often as it is summed; values below it add nothing either way.
#[inline(always)]
pub(super) unsafe fn exp_sum_unordered_values_with<S: BlockScan>(start: f32, xs: &[f32], sub: f32) -> Option<f32> {
    assert!(xs.len().is_multiple_of(8), "exp_sum_unordered_values: not a multiple of 8 values");
    let mut total = UlpTotal::new(start, sub)?;
    for chunk in xs.chunks(INCREMENTS_MAX) {
        if !total.add::<S>(chunk) {
            return None;
        }
    }
    Some(total.sum())
}

/// The total of [`exp_sum_unordered_with`]: whole ulps of `start`'s binade, added group by
/// group, with the room left in the binade.
struct UlpTotal {
    start: f32,
    sub: f32,
    scale: f32,
    /// Whether the scale allows [`increments_approx`].
    approx: bool,
    room: u64,
    total: u64,
}

impl UlpTotal {
    /// `None` where `start`'s ulp has no scale ([`ulp_scale`]).
    #[inline(always)]
    fn new(start: f32, sub: f32) -> Option<Self> {
        let scale = ulp_scale(start)?;
        let room = u64::from((1u32 << 23) - (start.to_bits() & 0x7f_ffff));
        Some(Self { start, sub, scale, approx: scale <= APPROX_SCALE_MAX, room, total: 0 })
    }

    /// Adds the increments of `xs` (a multiple of 8 entries, at most [`INCREMENTS_MAX`]);
    /// false once one is a tie or out of range, or the total has no room left.
    #[inline(always)]
    unsafe fn add<S: BlockScan>(&mut self, xs: &[f32]) -> bool {
        let (k, exact) = if self.approx {
            S::increments_approx(xs, self.sub, self.scale)
        } else {
            S::increments(xs, self.sub, self.scale)
        };
        self.total += u64::from(k);
        exact && self.total < self.room
    }

    /// `start` plus the total (the binade kept: `add` said so).
    fn sum(&self) -> f32 {
        f32::from_bits(self.start.to_bits() + self.total as u32)
    }
}

/// How [`exp_sum_sequential_with`] finds, queues and adds the entries of whole blocks: 8 lanes
/// at a time here, 16 in [`super::avx512`]. The queued values, and so the sum, are the same
/// either way.
pub(super) trait BlockScan {
    /// Bit `j` set when `maxima[j] >= threshold`: which blocks of a [`GROUP`] can hold an
    /// entry at or above the threshold.
    unsafe fn passing(maxima: &[f32; GROUP], threshold: f32) -> u32;
    /// Writes the entries `>= threshold`, in order, to the start of `dst` (which has room for
    /// [`BLOCK`] + 8 values; what lies past the count is garbage); returns their count. A
    /// caller that adds the block whole (a dense one) ignores what was written.
    unsafe fn select_pack(block: &[f32; BLOCK], threshold: f32, dst: &mut [f32]) -> usize;
    /// [`add_group`]'s result, bit for bit (`xs` as there).
    unsafe fn add_group(sum: f32, xs: &[f32], sub: f32) -> f32;
    /// [`increments`] (`xs` and `scale` as there, no weights stored).
    unsafe fn increments(xs: &[f32], sub: f32, scale: f32) -> (u32, bool);
    /// [`increments_approx`]: the same.
    unsafe fn increments_approx(xs: &[f32], sub: f32, scale: f32) -> (u32, bool);
}

/// Left-packs the lanes of `x` that `mask` selects (bit `i`: lane `i`) to `dst[n..]`, no
/// branch per entry: the 8 lanes are stored and the lanes past the count are overwritten by
/// the next store or padded with -inf before use. Returns `n` plus the count.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn pack_vector(x: __m256, mask: usize, dst: &mut [f32], n: usize) -> usize {
    // SAFETY: the table row holds 8 u32 lane indices < 8.
    let idx = _mm256_loadu_si256(COMPRESS_LUT[mask].as_ptr() as *const __m256i);
    let out = &mut dst[n..n + 8];
    // SAFETY: `out` holds 8 floats.
    _mm256_storeu_ps(out.as_mut_ptr(), _mm256_permutevar8x32_ps(x, idx));
    n + POPCOUNT[mask] as usize
}

/// Blocks whose maxima [`exp_sum_sequential_with`] compares with the threshold at once.
pub(super) const GROUP: usize = 16;

struct Avx2Scan;

impl BlockScan for Avx2Scan {
    #[inline(always)]
    unsafe fn passing(maxima: &[f32; GROUP], threshold: f32) -> u32 {
        let t = _mm256_set1_ps(threshold);
        // SAFETY: `maxima` holds 16 floats: two vectors of 8.
        let lo = _mm256_cmp_ps::<_CMP_GE_OQ>(_mm256_loadu_ps(maxima.as_ptr()), t);
        let hi = _mm256_cmp_ps::<_CMP_GE_OQ>(_mm256_loadu_ps(maxima.as_ptr().add(8)), t);
        _mm256_movemask_ps(lo) as u32 | (_mm256_movemask_ps(hi) as u32) << 8
    }

    /// PERF: one load, compare and left-pack per vector. A pass for the masks and count, then
    /// one to pack, read every vector twice; on language-model rows almost every
    /// block that passes holds a few entries at or above the threshold, so nearly all the
    /// blocks the sums visit were read twice.
    #[inline(always)]
    unsafe fn select_pack(block: &[f32; BLOCK], threshold: f32, dst: &mut [f32]) -> usize {
        let t = _mm256_set1_ps(threshold);
        let mut n = 0;
        for c in block.chunks_exact(8) {
            // SAFETY: `c` holds 8 floats.
            let x = _mm256_loadu_ps(c.as_ptr());
            let m = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(x, t)) as usize;
            n = pack_vector(x, m, dst, n);
        }
        n
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
}

/// [`exp_sum_sequential`] with the block scan `S`; inlined into each caller, which is compiled
/// with the target features `S` needs.
///
/// PERF: the blocks are tested against the threshold a [`GROUP`] of maxima at a time (one or
/// two vector compares), and only the passing ones are visited, by their set bits. On
/// language-model rows the share of blocks that pass is far from 0 and 1 (about 60% at
/// V = 128k), so a test-and-branch per block was mispredicted about every other block.
#[inline(always)]
pub(super) unsafe fn exp_sum_sequential_with<S: BlockScan>(
    start: f32,
    row: &[f32],
    sub: f32,
    block_max: &[f32],
    patches: &[(u32, f32)],
) -> f32 {
    const QUEUE: usize = 256;
    // Blocks with at least this many entries at or above the threshold are added whole.
    const DENSE: usize = 40;
    let mut sum = start;
    let mut bound = super::log_half_ulp(sum);
    let mut threshold = super::skip_threshold(sub, bound);
    // The largest maximum of the passing blocks visited so far. A skipped block's maximum
    // `bm` is left out: `bm < threshold` puts `expf(bm - sub)` below half an ulp of the sum's
    // lower bound, so below that bound: it could not have raised it.
    let mut prefix_max = f32::NEG_INFINITY;
    // Two queues: one fills while the other, full, waits until the first is full too. Adding
    // entries right after packing them would load them while their overlapping stores are
    // still in flight (store forwarding fails and stalls); a queue later they are not. Both
    // are padded with -inf (weight 0) to whole vectors before use.
    let mut queues = [[f32::NEG_INFINITY; QUEUE + BLOCK + 8]; 2];
    let mut cur = 0;
    let mut n = 0;
    let mut waiting = 0;
    // The patches not yet applied, and the buffer a patched block is read from.
    let mut patch = super::PatchCursor::new(patches);
    let mut patched = [0.0f32; BLOCK];
    // Raises `bound` (and `threshold`) to `log_half_ulp(lower)` for a new lower bound `lower`
    // of the running sum.
    let raise = |lower: f32, bound: &mut f32, threshold: &mut f32| {
        let b = super::log_half_ulp(lower);
        if b > *bound {
            *bound = b;
            *threshold = super::skip_threshold(sub, b);
        }
    };
    for (g, maxima) in block_max.chunks(GROUP).enumerate() {
        // Blocks below the threshold hold no entry at or above it. The threshold only rises,
        // so a block that fails now would fail later in the group too.
        let mut passing = match <&[f32; GROUP]>::try_from(maxima) {
            Ok(whole) => S::passing(whole, threshold),
            Err(_) => maxima.iter().enumerate().fold(0, |m, (j, &bm)| m | ((bm >= threshold) as u32) << j),
        };
        while passing != 0 {
            let j = passing.trailing_zeros() as usize;
            passing &= passing - 1;
            let bm = maxima[j];
            let first = (g * GROUP + j) * BLOCK;
            let end = row.len().min(first + BLOCK);
            let is_patched = patch.in_block(first, end);
            // A patched block's maximum may be gone from the sum: it bounds the block (for the
            // skip) but is no weight the sum has seen.
            if bm > prefix_max && !is_patched {
                raise((prefix_max - sub).exp(), &mut bound, &mut threshold);
                prefix_max = bm;
            }
            // The threshold may have risen since the group's test.
            if bm < threshold {
                continue;
            }
            let block = if is_patched { patch.apply(row, first, end, &mut patched) } else { &row[first..end] };
            if let Ok(whole) = <&[f32; BLOCK]>::try_from(block) {
                // The block's passing entries are packed past the queue's end: kept below
                // unless the block is added whole (then the queue is added first, and
                // overwritten).
                let count = S::select_pack(whole, threshold, &mut queues[cur][n..]);
                if count >= DENSE {
                    // In order: what is queued comes first.
                    if waiting > 0 {
                        sum = add_queued::<S>(sum, &mut queues[1 - cur], waiting, sub);
                        waiting = 0;
                    }
                    if n > 0 {
                        sum = add_queued::<S>(sum, &mut queues[cur], n, sub);
                        n = 0;
                    }
                    sum = S::add_group(sum, block, sub);
                    raise(sum, &mut bound, &mut threshold);
                    continue;
                }
                n += count;
            } else {
                let vals = &mut queues[cur];
                for &x in block {
                    if x >= threshold {
                        vals[n] = x;
                        n += 1;
                    }
                }
            }
            if n >= QUEUE {
                if waiting > 0 {
                    sum = add_queued::<S>(sum, &mut queues[1 - cur], waiting, sub);
                    raise(sum, &mut bound, &mut threshold);
                }
                waiting = n;
                n = 0;
                cur = 1 - cur;
            }
        }
    }
    if waiting > 0 {
        sum = add_queued::<S>(sum, &mut queues[1 - cur], waiting, sub);
    }
    add_queued::<S>(sum, &mut queues[cur], n, sub)
}

/// How many bits of each byte are set (`count_ones` without the `popcnt` feature compiles to
/// a longer bit trick).
static POPCOUNT: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut m = 0;
    while m < 256 {
        t[m] = (m as u32).count_ones() as u8;
        m += 1;
    }
    t
};

/// Adds the first `n` entries of `vals` (`S::add_group` per [`BLOCK`]), after padding them
/// with -inf to a whole vector of 8 (`vals` must have room for it).
#[inline(always)]
unsafe fn add_queued<S: BlockScan>(mut sum: f32, vals: &mut [f32], n: usize, sub: f32) -> f32 {
    let padded = n.div_ceil(8) * 8;
    vals[n..padded].fill(f32::NEG_INFINITY);
    for group in vals[..padded].chunks(BLOCK) {
        sum = S::add_group(sum, group, sub);
    }
    sum
}

/// `((sum + w_0) + w_1) + …` over `w_i = expf(xs[i] - sub)` in f32, bit for bit, mostly
/// without a chain of dependent additions. `xs` holds a multiple of 8 and at most [`BLOCK`]
/// entries; `sum` is `+0.0` or positive.
///
/// Exactness. While the running sum `s` stays in one binade `[2^e, 2^(e+1))` its ulp
/// `u = 2^(e-23)` is fixed and the representable values there are the multiples of `u`, so
/// rounding to nearest gives `fl(s + w) = s + k·u` with `k` the integer nearest to `w / u`,
/// provided `w / u` is not a tie (`j + 1/2`: then the even neighbour, i.e. the last bit of
/// `s`, decides) and `s + k·u <= 2^(e+1)`. Landing on `2^(e+1)` exactly is right too: `s + w`
/// is then within `u/2` of it, and its neighbours are `2^(e+1) - u` and `2^(e+1) + 2u` (for
/// the top binade, rounding gives `+inf`, whose bits follow those of `f32::MAX`). The `k` do
/// not depend on `s`, so all of a group's are computed at once, in vectors, and their total
/// is added to the bits of `s` (to its significand field `m`; an exact landing carries into
/// the exponent) when no `w / u` is a tie or beyond the integer range below and
/// `m + total <= 2^23`. The `k` are non-negative, so each step's partial total is then within
/// bounds too, and after a landing on `2^(e+1)` every later `k` is 0, i.e. `w < u/2`, below
/// half the new ulp `2u`: the plain loop leaves the sum there, as the commit does. Otherwise
/// the weights of the group are added one by one.
///
/// Per lane, with `x = w / u = w·2^(150-E)` for the biased exponent `E` of `s`:
/// `y = fl(x + 2^23)` (one fused rounding of the exact product), clamped to `2^24 + 2`, so
/// `r = y - 2^23` is an exact integer and `bits(y) - bits(2^23)` equals `r` for
/// `y <= 2^24` and exceeds 2^23 (failing the room check) beyond; `d = fl(x - r)` (fused, so
/// from the exact `x`), and `|d| < 1/2` implies `|x - r| < 1/2` (rounding is monotone and 1/2
/// representable), i.e. `r` is the nearest integer and no tie; `|d| >= 1/2` sends the group
/// to the plain loop. Lanes stay under `2^23 + 2`, totals of 64 under 2^31. Subnormal weights
/// are zeroed first (an integer compare on the bits of `w >= 0`): with `E >= 25`,
/// `u >= 2^-125` and they are below `u/2` (k = 0, no tie) either way, and the FMA is spared
/// slow microcode assists for subnormal inputs. Sums below 2^-102 (`E < 25`) and `+inf` take
/// the plain loop.
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
unsafe fn add_group(sum: f32, xs: &[f32], sub: f32) -> f32 {
    debug_assert!(xs.len().is_multiple_of(8) && xs.len() <= BLOCK);
    add_group_by(
        sum,
        xs.len(),
        |scale| increments_approx(xs, sub, scale),
        |scale, w| increments::<true>(xs, sub, scale, w),
    )
}

/// [`add_group`]'s integer increments over `xs` (a multiple of 8 entries, at most
/// [`INCREMENTS_MAX`]) for the ulp scale `scale` (`1/u`): their total, and whether every lane
/// was exact (no tie, no lane out of range). Each increment is at most `2^23 + 2`, so the
/// total of that many fits a u32 (the callers' room checks fail long before). With `STORE`
/// (`xs` at most [`BLOCK`] entries) the weights are written to `w` as well, for the plain
/// loop's fallback.
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
#[inline]
pub(super) unsafe fn increments<const STORE: bool>(
    xs: &[f32],
    sub: f32,
    scale: f32,
    w: &mut [f32; BLOCK],
) -> (u32, bool) {
    debug_assert!(xs.len() <= INCREMENTS_MAX && (!STORE || xs.len() <= BLOCK));
    let c = IncrementConsts::new(sub, scale);
    let mut k = _mm256_setzero_si256();
    let mut off = _mm256_setzero_ps();
    for (i, c8) in xs.chunks_exact(8).enumerate() {
        // SAFETY: `c8` holds 8 floats.
        let (wv, kv, not_exact) = exact_increments(_mm256_loadu_ps(c8.as_ptr()), &c);
        if STORE {
            let o = &mut w[8 * i..8 * i + 8];
            // SAFETY: `o` holds 8 floats.
            _mm256_storeu_ps(o.as_mut_ptr(), wv);
        }
        k = _mm256_add_epi32(k, kv);
        off = _mm256_or_ps(off, not_exact);
    }
    (hsum_epi32(k) as u32, _mm256_movemask_ps(off) == 0)
}

/// [`increments`] (the same total and flag) from [`approx_increments`] where the certificate
/// holds, and from [`exact_increments`] for the other lanes, in a second pass over the vectors
/// that have any (`scale` at most [`APPROX_SCALE_MAX`]). The first pass has no branch and
/// only the approximation's constants; the second is rare on language-model rows (a vector
/// holding one of the few large weights).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
#[inline]
pub(super) unsafe fn increments_approx(xs: &[f32], sub: f32, scale: f32) -> (u32, bool) {
    debug_assert!(scale <= APPROX_SCALE_MAX && xs.len() <= INCREMENTS_MAX);
    let c = IncrementConsts::new(sub, scale);
    let mut k = _mm256_setzero_si256();
    let mut sure = [0u8; INCREMENTS_MAX / 8];
    let mut all = 0xff;
    // PERF: `LANES` vectors a step, their operations interleaved ([`approx_increments_n`]).
    // One vector's chain (the exponential, the increment, the certificate) is some 60 cycles
    // long, and compiled one vector after the other only about two overlapped in the
    // scheduler. On Zen 3 (throwaway harness, least of 60 rounds, three runs each),
    // `exp_sum_sequential` over a flat row of 128,256 went from 156–162 to 133–139 µs; two
    // vectors a step gained about 6%. (The compiler still evaluates each vector's polynomial
    // in one run; the steps after it interleave.)
    const LANES: usize = 4;
    let steps = xs.chunks_exact(8 * LANES);
    let rest = steps.remainder();
    for (j, step) in steps.enumerate() {
        // SAFETY: `step` holds `8 * LANES` floats.
        let x: [__m256; LANES] = std::array::from_fn(|i| _mm256_loadu_ps(step.as_ptr().add(8 * i)));
        let (kv, s) = approx_increments_n(x, &c);
        for i in 0..LANES {
            k = _mm256_add_epi32(k, _mm256_and_si256(kv[i], _mm256_castps_si256(s[i])));
            let m = _mm256_movemask_ps(s[i]) as u8;
            sure[LANES * j + i] = m;
            all &= m;
        }
    }
    let first = (xs.len() - rest.len()) / 8;
    for (v, c8) in rest.chunks_exact(8).enumerate() {
        // SAFETY: `c8` holds 8 floats.
        let (kv, s) = approx_increments(_mm256_loadu_ps(c8.as_ptr()), &c);
        k = _mm256_add_epi32(k, _mm256_and_si256(kv, _mm256_castps_si256(s)));
        sure[first + v] = _mm256_movemask_ps(s) as u8;
        all &= sure[first + v];
    }
    let mut off = _mm256_setzero_ps();
    if all != 0xff {
        for (v, c8) in xs.chunks_exact(8).enumerate().filter(|&(v, _)| sure[v] != 0xff) {
            // SAFETY: `c8` holds 8 floats.
            let (_, kv, not_exact) = exact_increments(_mm256_loadu_ps(c8.as_ptr()), &c);
            // The lanes the certificate left.
            let left = _mm256_cmpeq_epi32(
                _mm256_and_si256(_mm256_set1_epi32(sure[v] as i32), _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128)),
                _mm256_setzero_si256(),
            );
            k = _mm256_add_epi32(k, _mm256_and_si256(kv, left));
            off = _mm256_or_ps(off, not_exact); // a certain lane is never a tie or out of range
        }
    }
    (hsum_epi32(k) as u32, _mm256_movemask_ps(off) == 0)
}

/// The most entries [`increments`] takes at once: `480·(2^23 + 2) < 2^32`.
pub(super) const INCREMENTS_MAX: usize = 480;

/// The constants of [`increments`], set once per call.
struct IncrementConsts {
    sub: __m256,
    scale: __m256,
    magic: __m256,
    ymax: __m256,
    half: __m256,
    abs: __m256,
    min_normal: __m256i,
    exp2: Exp2Consts,
    log2e: __m256,
    rho: __m256,
    rho_y: __m256,
    certain: __m256,
}

impl IncrementConsts {
    #[target_feature(enable = "avx2,fma,bmi1,popcnt")]
    #[inline]
    unsafe fn new(sub: f32, scale: f32) -> Self {
        Self {
            sub: _mm256_set1_ps(sub),
            scale: _mm256_set1_ps(scale),
            magic: _mm256_set1_ps((1u32 << 23) as f32),
            ymax: _mm256_set1_ps(((1u32 << 24) + 2) as f32),
            half: _mm256_set1_ps(0.5),
            abs: _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff)),
            min_normal: _mm256_set1_epi32(0x007f_ffff),
            exp2: Exp2Consts::new(),
            log2e: _mm256_set1_ps(std::f32::consts::LOG2_E),
            rho: _mm256_set1_ps(APPROX_RHO),
            rho_y: _mm256_set1_ps(APPROX_RHO_Y),
            certain: _mm256_set1_ps(APPROX_CERTAIN),
        }
    }
}

/// [`add_group`]'s exact increments of 8 lanes `x`: the weights `expf(x - sub)`, the
/// increments, and a mask of the lanes that are a tie or out of range (see the proof there).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn exact_increments(x: __m256, c: &IncrementConsts) -> (__m256, __m256i, __m256) {
    let wv = expf8(_mm256_sub_ps(x, c.sub));
    let normal = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_castps_si256(wv), c.min_normal));
    let wn = _mm256_and_ps(wv, normal);
    let y = _mm256_min_ps(_mm256_fmadd_ps(wn, c.scale, c.magic), c.ymax);
    let r = _mm256_sub_ps(y, c.magic);
    let d = _mm256_and_ps(_mm256_fmsub_ps(wn, c.scale, r), c.abs);
    let not_exact = _mm256_cmp_ps::<_CMP_GE_OQ>(d, c.half);
    (wv, _mm256_sub_epi32(_mm256_castps_si256(y), _mm256_castps_si256(c.magic)), not_exact)
}

/// [`exact_increments`]'s increments from approximate weights, and a mask of the lanes where
/// they are certain: there, they are the exact increments and the exact lane is no tie and in
/// range. `c.scale` must be at most [`APPROX_SCALE_MAX`].
///
/// Per lane, `w' = 2^y` ([`exp2_approx_with`]) with `y = fl(fl(x - sub)·fl(log2 e))`, against
/// the exact `w = expf(d)` for the same `d = fl(x - sub)`. Relative to `e^d`: `w` is within
/// 0.502 ulp (glibc's bound for its `expf`, which the replica reproduces bit for bit), under
/// `2^-23.99`; `y` differs from `d·log2 e` by the roundings of the product and of `log2 e`, at
/// most `1.27·2^-24·|y|`, so `2^y` from `e^d` by `ln 2` times that; and `w'` from `2^y` by
/// [`APPROX_POLY_REL_ERROR`](super::APPROX_POLY_REL_ERROR) (`2^-21`). So
/// `|w' - w| <= w'·rho(y)` with `rho(y) = `[`APPROX_RHO`]` + `[`APPROX_RHO_Y`]`·|y|`, both
/// constants twice the sum of those terms (for second-order terms, `e^d` against `w'`, and the
/// f32 evaluation of the tolerance). With `x' = w'·scale` and `x = w·scale` (exact products:
/// `scale` is a power of two), `|x - x'| <= tol = x'·rho(y)`. A lane is certain when
/// `|x' - r| + tol < 1/2 - 2^-10` for the integer `r` nearest `x'`: then `r` is the integer
/// nearest `x` too and `x` is no tie, so `r` is the exact increment. That needs `x' < 2^19`
/// (above, `tol > 1/2`), so `x` is in the exact lane's range, and `r = fl(x' + 2^23) - 2^23`
/// is the nearest integer. Lanes whose `y` was clamped to [`APPROX_Y_MIN`] have
/// `w, w' < 2^-99.9`, so with `scale <= 2^50` both increments are 0 and `x` no tie, whatever
/// the bound. (Subnormal `w`, which the exact
/// lanes zero, are such lanes.)
///
/// PERF: the exact `expf` replica works in f64 (two halves per vector, a table lookup); the
/// increments from this f32 quintic, certificate included, cost about 0.6 of the exact ones
/// (0.43 against 0.73 ns per weight with AVX-512 on a language-model row's tail, throwaway
/// harness). The lanes it cannot certify are the few large weights, whose increments need
/// every bit (`x'` above about `2^15`).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn approx_increments(x: __m256, c: &IncrementConsts) -> (__m256i, __m256) {
    let ([k], [sure]) = approx_increments_n([x], c);
    (k, sure)
}

/// [`approx_increments`] on `N` vectors, step by step across them (see
/// [`increments_approx`]).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn approx_increments_n<const N: usize>(x: [__m256; N], c: &IncrementConsts) -> ([__m256i; N], [__m256; N]) {
    let (w, y) = exp2_approx_n(x.map(|x| _mm256_mul_ps(_mm256_sub_ps(x, c.sub), c.log2e)), &c.exp2);
    let x = w.map(|w| _mm256_mul_ps(w, c.scale));
    // The integer nearest `x` (ties to even), by one rounding (see `exp2_approx_n`); exact as
    // an i32 wherever the certificate can hold (`x < 2^19`), and the other lanes are masked.
    let r: [__m256; N] =
        std::array::from_fn(|i| _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x[i]));
    let dist: [__m256; N] = std::array::from_fn(|i| _mm256_and_ps(_mm256_sub_ps(x[i], r[i]), c.abs));
    // `y <= 0`: `rho + rho_y·|y|` is `rho - rho_y·y`.
    let tol: [__m256; N] = std::array::from_fn(|i| _mm256_mul_ps(x[i], _mm256_fnmadd_ps(c.rho_y, y[i], c.rho)));
    let sure = std::array::from_fn(|i| _mm256_cmp_ps::<_CMP_LT_OQ>(_mm256_add_ps(dist[i], tol[i]), c.certain));
    (r.map(|r| _mm256_cvtps_epi32(r)), sure)
}

/// For the tests: per lane of `xs`, the approximate increment, whether it is certain, and
/// the exact increment.
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT.
#[cfg(test)]
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub(super) unsafe fn increments_by_lane(xs: &[f32; 8], sub: f32, scale: f32) -> [(u32, bool, u32); 8] {
    let c = IncrementConsts::new(sub, scale);
    let x = _mm256_loadu_ps(xs.as_ptr());
    let (approx, sure) = approx_increments(x, &c);
    let (_, exact, _) = exact_increments(x, &c);
    let lanes = |v: __m256i| std::mem::transmute::<__m256i, [u32; 8]>(v);
    let (a, e) = (lanes(approx), lanes(exact));
    let sure = _mm256_movemask_ps(sure);
    std::array::from_fn(|i| (a[i], sure >> i & 1 == 1, e[i]))
}

/// [`approx_increments`]'s relative tolerance, `y`-independent part: twice
/// [`APPROX_POLY_REL_ERROR`](super::APPROX_POLY_REL_ERROR) plus 0.502 ulp.
pub(super) const APPROX_RHO: f32 = 2.0 * (1.0 / (1u32 << 21) as f32 + 0.502 / (1u32 << 23) as f32);
/// [`approx_increments`]'s relative tolerance per unit of `|y|`: twice `ln 2 · 1.27 · 2^-24`.
pub(super) const APPROX_RHO_Y: f32 = 2.0 * std::f32::consts::LN_2 * 1.27 / (1u32 << 24) as f32;
/// [`approx_increments`] certifies a lane when `|x' - r| + tol` is below this.
pub(super) const APPROX_CERTAIN: f32 = 0.5 - 1.0 / 1024.0;
/// The largest ulp scale for [`approx_increments`] (`2^50`, sums from `2^-27` up): clamped
/// arguments then have increment 0 on both paths.
pub(super) const APPROX_SCALE_MAX: f32 = (1u64 << 50) as f32;

/// `1/u = 2^(150 - E)` for the ulp `u` of a running sum with biased exponent `E` (the scale of
/// [`add_group`]'s integer increments; a normal f32, `E` being within `25..=254`), or `None`
/// for sums below 2^-102 and `+inf`, which the plain loop adds.
#[inline]
pub(super) fn ulp_scale(sum: f32) -> Option<f32> {
    let e = sum.to_bits() >> 23; // the biased exponent (the sign bit is 0)
    (25..=254).contains(&e).then(|| f32::from_bits((277 - e) << 23))
}

/// [`add_group`]'s body (and its 16-lane copy's), given the ISA's increments: `approx` (the
/// scale; [`increments_approx`]) and `exact` (the scale and room for the weights;
/// [`increments`] with `STORE`) over the same `len` entries. The approximate increments are
/// tried first where the scale allows: where they commit, the exact ones give the same total
/// and flag and would commit the same bits. Otherwise the exact increments, and the plain loop
/// over their weights where those do not commit either.
#[inline(always)]
pub(super) fn add_group_by(
    mut sum: f32,
    len: usize,
    approx: impl FnOnce(f32) -> (u32, bool),
    exact: impl FnOnce(f32, &mut [f32; BLOCK]) -> (u32, bool),
) -> f32 {
    let scale = ulp_scale(sum);
    if let Some(s) = scale.filter(|&s| s <= APPROX_SCALE_MAX) {
        if let (total, true) = approx(s) {
            if let Some(committed) = commit(sum, total) {
                return committed;
            }
        }
    }
    let mut w = [0.0f32; BLOCK];
    let (total, exact) = exact(scale.unwrap_or(1.0), &mut w);
    if let Some(committed) = scale.and(exact.then_some(total)).and_then(|t| commit(sum, t)) {
        return committed;
    }
    for &x in &w[..len] {
        sum += x;
    }
    sum
}

/// `sum` plus `total` ulps, when the significand has room (see the proof at [`add_group`]).
#[inline]
fn commit(sum: f32, total: u32) -> Option<f32> {
    let bits = sum.to_bits();
    (total <= (1 << 23) - (bits & 0x7f_ffff)).then(|| f32::from_bits(bits + total))
}

/// The sum of the 8 lanes (the callers' totals stay below 2^31).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let x = _mm_add_epi32(x, _mm_shuffle_epi32::<0b01_00_11_10>(x));
    let x = _mm_add_epi32(x, _mm_shuffle_epi32::<0b10_11_00_01>(x));
    _mm_cvtsi128_si32(x)
}

/// For each 8-bit mask, the lane indices of its set bits in order (then zeros).
static COMPRESS_LUT: [[u32; 8]; 256] = compress_lut();

const fn compress_lut() -> [[u32; 8]; 256] {
    let mut t = [[0u32; 8]; 256];
    let mut m = 0;
    while m < 256 {
        let (mut j, mut k) = (0, 0);
        while j < 8 {
            if m & (1 << j) != 0 {
                t[m][k] = j as u32;
                k += 1;
            }
            j += 1;
        }
        m += 1;
    }
    t
}

/// See [`super::exp_block_sums`].
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT (see the module docs).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub unsafe fn exp_block_sums(src: &[f32], div: f32, sub: f32, out: &mut [f64]) {
    let (d, s) = (_mm256_set1_ps(div), _mm256_set1_ps(sub));
    for (o, block) in out.iter_mut().zip(src.chunks(BLOCK)) {
        let mut lo = _mm256_setzero_pd();
        let mut hi = _mm256_setzero_pd();
        let chunks = block.chunks_exact(8);
        let tail = chunks.remainder();
        for c in chunks {
            // SAFETY: `c` holds 8 floats.
            let w = expf8(_mm256_sub_ps(_mm256_div_ps(_mm256_loadu_ps(c.as_ptr()), d), s));
            lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(w)));
            hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(w)));
        }
        let mut v = [0.0f64; 4];
        // SAFETY: `v` holds 4 doubles.
        _mm256_storeu_pd(v.as_mut_ptr(), _mm256_add_pd(lo, hi));
        let mut sum = (v[0] + v[1]) + (v[2] + v[3]);
        for &x in tail {
            sum += (x / div - sub).exp() as f64;
        }
        *o = sum;
    }
}

/// `2^y` on 8 lanes, for `y <= 0.5`, within
/// [`APPROX_POLY_REL_ERROR`](super::APPROX_POLY_REL_ERROR) for `y >=` [`APPROX_Y_MIN`] (and
/// under `2^-99.5` below): `y = n + f` with `n` an integer (by the 1.5·2^23 rounding trick,
/// which also leaves `n` in the low bits) and `|f| <= 0.5`, then a quintic for `2^f` whose
/// exponent field gets `n` added. Returns the result and the clamped `y`.
#[cfg(test)]
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
#[inline]
pub(super) unsafe fn exp2_approx(y: __m256) -> (__m256, __m256) {
    exp2_approx_with(y, &Exp2Consts::new())
}

/// The constants of [`exp2_approx`] in registers, set once per kernel call rather than per
/// vector (the compiler otherwise reloads them inside the loop).
struct Exp2Consts {
    poly: [__m256; 6],
    y_min: __m256,
}

impl Exp2Consts {
    #[target_feature(enable = "avx2,fma,bmi1,popcnt")]
    #[inline]
    unsafe fn new() -> Self {
        Self { poly: EXP2_POLY.map(|c| _mm256_set1_ps(c)), y_min: _mm256_set1_ps(APPROX_Y_MIN) }
    }
}

/// [`exp2_approx`] with its constants given.
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn exp2_approx_with(y: __m256, c: &Exp2Consts) -> (__m256, __m256) {
    let ([w], [y]) = exp2_approx_n([y], c);
    (w, y)
}

/// [`exp2_approx_with`] on `N` vectors, step by step across them: each step's `N` operations
/// are independent and sit side by side in program order (see [`increments_approx`]).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn exp2_approx_n<const N: usize>(y: [__m256; N], c: &Exp2Consts) -> ([__m256; N], [__m256; N]) {
    let y = y.map(|y| _mm256_max_ps(y, c.y_min));
    // `n`, the integer nearest `y` (ties to even, as adding 1.5·2^23 rounds: the model's and
    // the AVX-512 and NEON kernels' way, with the same bits): one rounding instead of that
    // addition and its subtraction, shortening the critical path (32k approximate block sums
    // 16.5 -> 15.5 µs).
    let n: [__m256; N] =
        std::array::from_fn(|i| _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(y[i]));
    // `y - n` is exact: `y`'s ulp divides `n`.
    let f: [__m256; N] = std::array::from_fn(|i| _mm256_sub_ps(y[i], n[i]));
    // Estrin's scheme: `(c0 + c1·f) + f²·((c2 + c3·f) + f²·(c4 + c5·f))`, three multiply-adds
    // deep where Horner's rule is five. PERF: the kernels that use this are bound by its
    // latency, not their throughput (the schedulers fill with waiting operations):
    // `exp_block_sums_approx` at V = 32,000 took 20 µs with Horner's rule, 16.5 with this.
    let f2: [__m256; N] = std::array::from_fn(|i| _mm256_mul_ps(f[i], f[i]));
    let pair = |hi: usize, i: usize| _mm256_fmadd_ps(c.poly[hi], f[i], c.poly[hi - 1]);
    let p: [__m256; N] = std::array::from_fn(|i| {
        let (c01, c23, c45) = (pair(1, i), pair(3, i), pair(5, i));
        _mm256_fmadd_ps(_mm256_fmadd_ps(c45, f2[i], c23), f2[i], c01)
    });
    // `n` shifted into the exponent field adds it to `p`'s exponent (two's complement: the
    // high bits shift out).
    let w = std::array::from_fn(|i| {
        let n = _mm256_slli_epi32::<23>(_mm256_cvtps_epi32(n[i]));
        _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p[i]), n))
    });
    (w, y)
}

/// See [`super::exp_block_sums_approx`]: per block, `Σ 2^y` with `y = fl(x·(log2 e / div) +
/// (-sub·log2 e))` (one fused multiply-add instead of llama.cpp's division and subtraction),
/// accumulated per lane in f32, and beside it `Σ -2^y·y`, which bounds the error the
/// different rounding of `y` causes. The last, partial block uses the exact weights. Returns
/// the error bound.
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT (see the module docs).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub unsafe fn exp_block_sums_approx(src: &[f32], div: f32, sub: f32, out: &mut [f64]) -> f64 {
    approx_sums(src, div, sub, 0..out.len(), out)
}

/// See [`super::exp_block_sums_approx_at`]: [`exp_block_sums_approx`] over the listed blocks.
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT (see the module docs).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub unsafe fn exp_block_sums_approx_at(src: &[f32], div: f32, sub: f32, blocks: &[u32], out: &mut [f64]) -> f64 {
    approx_sums(src, div, sub, blocks.iter().map(|&b| b as usize), out)
}

/// See [`super::cheap_block_sums_at`]: per listed block, 8 lanes of `L(y)` (a multiply-add,
/// a clamp at 0, a conversion whose integer is the f32 bits) summed pairwise, then across the
/// lanes (a tree, no chain); `a`, `b` the bits-domain coefficients.
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT (see the module docs).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub unsafe fn cheap_block_sums_at(src: &[f32], a: f32, b: f32, blocks: &[u32], out: &mut [f32]) {
    let (va, vb, zero) = (_mm256_set1_ps(a), _mm256_set1_ps(b), _mm256_setzero_ps());
    // `max(t, 0)` with `t` first: a NaN `t` gives 0, as the portable kernel's `max` does.
    let l = |p: *const f32| {
        _mm256_castsi256_ps(_mm256_cvtps_epi32(_mm256_max_ps(_mm256_fmadd_ps(_mm256_loadu_ps(p), va, vb), zero)))
    };
    cheap_blocks(src, a, b, blocks, out, |p| {
        // SAFETY: `p` points to BLOCK = 64 floats: eight vectors of 8.
        let pair = |k: usize| _mm256_add_ps(l(p.add(k)), l(p.add(k + 32)));
        let acc = _mm256_add_ps(_mm256_add_ps(pair(0), pair(16)), _mm256_add_ps(pair(8), pair(24)));
        let quad = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
        let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
        _mm_cvtss_f32(_mm_add_ss(pair, _mm_movehdup_ps(pair)))
    });
}

/// The block loop of the cheap kernels: `sum_block(p)` for each listed whole block starting
/// at `p` (64 readable floats), the portable kernel for a last, partial one. Inlined into
/// each kernel, so that `sum_block` is compiled with that kernel's target features.
#[inline(always)]
pub(super) fn cheap_blocks(
    src: &[f32],
    a: f32,
    b: f32,
    blocks: &[u32],
    out: &mut [f32],
    sum_block: impl Fn(*const f32) -> f32,
) {
    for &id in blocks {
        let start = id as usize * BLOCK;
        match src.get(start..start + BLOCK) {
            Some(block) => out[id as usize] = sum_block(block.as_ptr()),
            None => super::portable::cheap_block_sums_at(src, a, b, &[id], out),
        }
    }
}

/// The kernel of [`exp_block_sums_approx`], over the blocks `ids` names (each `< out.len()`).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
#[inline]
unsafe fn approx_sums(src: &[f32], div: f32, sub: f32, ids: impl Iterator<Item = usize>, out: &mut [f64]) -> f64 {
    let a = _mm256_set1_ps((std::f64::consts::LOG2_E / div as f64) as f32);
    let b = _mm256_set1_ps((-(sub as f64) * std::f64::consts::LOG2_E) as f32);
    let consts = Exp2Consts::new();
    let mut total = _mm256_setzero_pd();
    let mut weighted = _mm256_setzero_pd();
    let mut entries = 0;
    for id in ids {
        let start = id * BLOCK;
        let Some(block) = src.get(start..(start + BLOCK).min(src.len())) else { continue };
        entries += block.len();
        if block.len() < BLOCK {
            // The last, partial block: exact weights (exact sums need no bound).
            out[id] = block.iter().map(|&x| (x / div - sub).exp() as f64).sum();
            continue;
        }
        // Two chains of sums, so that their latency overlaps.
        let (mut acc, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let (mut acc_y, mut acc_y1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for c in block.chunks_exact(16) {
            // SAFETY: `c` holds 16 floats.
            let (w, y) = exp2_approx_with(_mm256_fmadd_ps(_mm256_loadu_ps(c.as_ptr()), a, b), &consts);
            let (w1, y1) = exp2_approx_with(_mm256_fmadd_ps(_mm256_loadu_ps(c.as_ptr().add(8)), a, b), &consts);
            acc = _mm256_add_ps(acc, w);
            acc1 = _mm256_add_ps(acc1, w1);
            // `y <= 0` but for rounding (see `super::approx_sums_error`): adds `-w·y`.
            acc_y = _mm256_fnmadd_ps(w, y, acc_y);
            acc_y1 = _mm256_fnmadd_ps(w1, y1, acc_y1);
        }
        let (acc, acc_y) = (_mm256_add_ps(acc, acc1), _mm256_add_ps(acc_y, acc_y1));
        let sums = _mm256_add_pd(
            _mm256_cvtps_pd(_mm256_castps256_ps128(acc)),
            _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(acc)),
        );
        total = _mm256_add_pd(total, sums);
        weighted = _mm256_add_pd(weighted, _mm256_cvtps_pd(_mm256_castps256_ps128(acc_y)));
        weighted = _mm256_add_pd(weighted, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(acc_y)));
        let pair = _mm_add_pd(_mm256_castpd256_pd128(sums), _mm256_extractf128_pd::<1>(sums));
        out[id] = _mm_cvtsd_f64(_mm_add_sd(pair, _mm_unpackhi_pd(pair, pair)));
    }
    let mut v = [0.0f64; 4];
    // SAFETY: `v` holds 4 doubles.
    _mm256_storeu_pd(v.as_mut_ptr(), total);
    let total = v.iter().sum::<f64>();
    _mm256_storeu_pd(v.as_mut_ptr(), weighted);
    super::approx_sums_error(total, v.iter().sum(), sub, entries)
}

/// True when the vectorised `expf` gives `f32::exp`'s bits on a probe set: a sweep of the
/// domain, its ends, and inputs where glibc's non-FMA variant (or one fusing fewer operations)
/// rounds differently, so that a platform `expf` other than glibc's FMA variant is detected.
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT (see the module docs).
#[target_feature(enable = "avx2,fma,bmi1,popcnt")]
pub unsafe fn exp_replica_agrees() -> bool {
    let mut xs = [0.0f32; 1024];
    let end = (-104.5f32).to_bits();
    let step = (end - 0x8000_0000) / (xs.len() as u32 - 16);
    for (i, x) in xs.iter_mut().enumerate() {
        *x = f32::from_bits(0x8000_0000 + step * i as u32);
    }
    let special = [
        f32::NEG_INFINITY,
        -0.0,
        0.0,
        EXPF_UFLOW,
        -103.97209,
        -103.5,
        -88.0,
        -87.33655,
        -1e-30,
        -f32::MIN_POSITIVE,
        // Rounded differently by glibc's non-FMA `expf` and by variants fusing only the cubic.
        f32::from_bits(0xc27c_65d9),
    ];
    let at = xs.len() - special.len();
    xs[at..].copy_from_slice(&special);
    let mut got = [0.0f32; 1024];
    exp_shifted(&xs, 1.0, 0.0, &mut got);
    xs.iter().zip(&got).all(|(&x, &g)| g.to_bits() == x.exp().to_bits())
}
