//! SIMD kernels over a dense logits row, behind one-time runtime CPU detection.
//!
//! Layout follows memchr's: every kernel has a portable implementation (always compiled, the
//! reference the others are tested against) and, on x86-64, an AVX2+FMA one in [`avx2`] with
//! the same name and signature. [`isa`] detects the CPU once and caches the answer; the public
//! functions here dispatch on it. Nothing outside this module contains `unsafe`. Where AVX-512F
//! and POPCNT are present too ([`avx512()`] reports it), two kernels run on 16 lanes from
//! [`mod@avx512`]: the approximate block sums behind `dist` and transformers `top_p`
//! ([`exp_block_sums_approx`], the same weights lane for lane) and [`exp_sum_sequential`]
//! (its block scan, and its additions with a 16-lane copy of the exact `expf` below that reads
//! glibc's table from registers: the same sum, bit for bit). Where AVX-512VL is present
//! beside AVX-512F, [`summarize`] and [`locate_max`] keep AVX2's 8 lanes but watch for NaN
//! with mask compares of every pair of vectors (one instruction per two, the AND folded in),
//! which brought [`summarize`] from about 1.15 to about 1.05 times a max pass on Zen 4,
//! measured when AVX2 still summed the max tree's first operands (it now compares them).
//! The f64 `exp` of [`exp_in_place`] and [`exp64_block_sums`] runs on 8 lanes there too (see
//! below). Every other kernel stays AVX2 (wider ones have not been written).
//!
//! On aarch64, the `neon` module has the whole-row passes ([`max`], [`summarize`],
//! [`locate_max`], [`block_max_into`], [`argmax`], [`count_ge`]) and the gathers
//! ([`gather_ge`], [`gather_blocks_ge`], [`for_each_ge`]); [`isa`] reports [`Isa::Neon`]. Of
//! the exponentials, the approximate block sums ([`exp_block_sums_approx`],
//! [`exp_block_sums_approx_at`]) are AVX2's arithmetic lane for lane (the same sums and bound,
//! bit for bit), and llama.cpp's softmax sum ([`exp_sum_sequential_patched`]) finds the entries
//! it adds by NEON masks and adds them with the platform's `expf`; the others run the portable
//! code. The NEON kernels are checked under emulation (`scripts/test-aarch64.sh`), not timed on
//! ARM hardware. `TOKENSIEVE_ISA=portable` in the
//! environment (read once) makes every dispatcher take the portable kernels, and
//! `TOKENSIEVE_ISA=avx2` the x86 kernels of a CPU without AVX-512.
//!
//! The kernels (all for NaN-free input unless a kernel says otherwise):
//!
//! * [`max`]: the largest value; one pass, the *floor* every benchmark is measured against.
//! * [`summarize`]: one pass that validates the row (may it hold NaN or `+inf`?), and records
//!   the maximum, the first [`BLOCK`] holding it, and the maximum of every block. The block
//!   maxima are what lets the fast paths in
//!   [`convention::llama_cpp::dense`](crate::convention::llama_cpp::dense) skip most of the row.
//!   [`widen_summarize_f16`] and [`widen_summarize_bf16`] widen a half-precision row and
//!   summarize it in the same pass.
//! * [`locate_max`]: [`summarize`] without the block maxima (validation, the maximum and its
//!   first block), in fewer operations per entry: all that `greedy` needs.
//! * [`argmax`]: the first index of the maximum.
//! * [`gather_ge`]: the entries of a block at or above a threshold, in index order;
//!   [`gather_blocks_ge`]: the same over a whole row, visiting only the blocks whose maximum
//!   reaches the threshold.
//! * [`exp_shifted`] / [`exp_shifted_sum`]: `expf(x / div - sub)`, **bit for bit** the
//!   platform's `expf` (see below), stored or summed in f64.
//! * [`exp_block_sums_approx`] (and `_at`, over listed blocks): per-block sums of an accurate
//!   approximation of those weights with an error bound (about `2^-22` relative), a dozen
//!   operations per 8 weights.
//! * [`cheap_block_sums_at`]: per-block sums of an *upper bound* of the weights within
//!   [`CHEAP_SPREAD`] (6%) of them, a multiply-add and a conversion per 8 weights: enough to
//!   tell which blocks need the accurate sums.
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
//! every f32 in `[-104.5, 0]`, both the 8-lane and the 16-lane copy (the
//! `exp_replica_is_exhaustively_exact` test, a few seconds in release builds).
//! Its domain is `x <= 0` (and `-inf`), which is all the samplers need: `x` is a logit minus
//! the maximum.
//!
//! The f32 softmax sums ([`exp_sum_sequential`], [`exp_sum_unordered`]) need each weight only
//! through its rounded increment to the running sum, a whole number of the sum's ulps. They
//! take it from the quintic of [`exp_block_sums_approx`] wherever a certificate (the weight's
//! error bound against the distance to a rounding tie) shows it is the exact weight's, and
//! from the replica for the other lanes: the same sums, bit for bit. The increments then cost
//! about 0.6 of the replica's (0.43 against 0.73 ns per weight with AVX-512, weights of a
//! language-model row's tail, in a throwaway harness).
//!
//! # The f64 `exp`
//!
//! The transformers convention's weights are f64 `exp`s. [`exp_in_place`] computes many at
//! once with the same kind of replica (of glibc's `exp`: a 128-entry table, a quintic, see
//! [`mod@exp64`]), on 8 lanes with AVX-512F or 4 with AVX2, likewise only once it has agreed
//! with the platform's `f64::exp` on a probe set; otherwise it calls `f64::exp` per element.

use crate::candidates::TokenData;
use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
pub mod avx2;

#[cfg(target_arch = "x86_64")]
pub mod avx512;
pub mod exp64;
#[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
pub mod neon;

/// Entries per block of [`summarize`]'s block maxima (8 AVX2 vectors).
pub const BLOCK: usize = 64;

/// The instruction set the kernels run with (more may come: match with a wildcard arm).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Isa {
    /// Plain Rust, any CPU.
    Portable,
    /// x86-64 AVX2 and FMA, with BMI1 and POPCNT (which every AVX2 CPU has: `tzcnt` and
    /// `popcnt` for the block scans' masks).
    Avx2,
    /// aarch64 NEON: the whole-row passes ([`max`], [`summarize`], [`locate_max`],
    /// [`block_max_into`], [`argmax`], [`count_ge`]), the gathers ([`gather_ge`],
    /// [`gather_blocks_ge`], [`for_each_ge`]), the approximate block sums
    /// ([`exp_block_sums_approx`]) and the scan of the sequential softmax sum
    /// ([`exp_sum_sequential_patched`]); the other exponentials are the portable ones.
    Neon,
}

#[derive(Clone, Copy, Debug)]
struct Caps {
    isa: Isa,
    exact_exp: bool,
    /// F16C (`vcvtph2ps`) beside AVX2: f16 rows widen 8 values per instruction.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    f16c: bool,
    /// AVX-512F beside AVX2: the approximate block sums and the sequential sum
    /// run on 16 lanes.
    avx512: bool,
    /// AVX-512F and AVX-512VL beside AVX2: the widening and patching summaries watch for NaN
    /// with mask compares on 8 lanes.
    avx512vl: bool,
    /// The f64 `exp` replica ([`mod@exp64`]) agrees with the platform's `f64::exp`.
    exact_exp64: bool,
}

/// Whether this CPU runs [`avx2`]'s kernels: AVX2 and FMA, and BMI1 and POPCNT, which come
/// with them on every x86-64 CPU that has them (x86-64-v3 requires all four).
#[cfg(target_arch = "x86_64")]
fn avx2_detected() -> bool {
    std::is_x86_feature_detected!("avx2")
        && std::is_x86_feature_detected!("fma")
        && std::is_x86_feature_detected!("bmi1")
        && std::is_x86_feature_detected!("popcnt")
}

fn caps() -> Caps {
    static CAPS: OnceLock<Caps> = OnceLock::new();
    *CAPS.get_or_init(|| {
        let portable = Caps {
            isa: Isa::Portable,
            exact_exp: false,
            f16c: false,
            avx512: false,
            avx512vl: false,
            exact_exp64: false,
        };
        // For measuring and testing the portable kernels (or AVX2's without AVX-512's) on a
        // CPU that has more.
        let wanted = std::env::var_os("TOKENSIEVE_ISA");
        if wanted.as_ref().is_some_and(|v| v == "portable") {
            return portable;
        }
        #[cfg(target_arch = "x86_64")]
        if avx2_detected() {
            let no_avx512 = wanted.is_some_and(|v| v == "avx2");
            // SAFETY: AVX2, FMA, BMI1 and POPCNT were detected just above.
            let exact_exp = unsafe { avx2::exp_replica_agrees() };
            let avx512 = !no_avx512 && std::is_x86_feature_detected!("avx512f");
            // SAFETY: AVX2, FMA, BMI1 and POPCNT were detected above, AVX-512F where `avx512`
            // says so.
            let exact_exp64 = unsafe { exp64::replica_agrees(avx512) };
            let avx512vl = avx512 && std::is_x86_feature_detected!("avx512vl");
            return Caps {
                isa: Isa::Avx2,
                exact_exp,
                f16c: std::is_x86_feature_detected!("f16c"),
                avx512,
                avx512vl,
                exact_exp64,
            };
        }
        // NEON is part of the aarch64 base ISA (the module is compiled only where the target
        // enables it), so there is nothing to detect.
        if cfg!(all(target_arch = "aarch64", target_feature = "neon")) {
            Caps { isa: Isa::Neon, ..portable }
        } else {
            portable
        }
    })
}

/// `src` widened to f32 into `out` (resized to fit): exact, as `f16::to_f32` (NaN payloads
/// aside, which validation rejects anyway). With F16C, 8 values per instruction.
pub fn widen_f16(src: &[half::f16], out: &mut Vec<f32>) {
    out.resize(src.len(), 0.0);
    widen_f16_into(src, out);
}

/// [`widen_f16`] into `out` (`src.len()` entries).
fn widen_f16_into(src: &[half::f16], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if caps().f16c {
        // SAFETY: `f16c` is only set after AVX2, FMA and F16C were detected at runtime.
        unsafe { avx2::widen_f16(src, out) };
        return;
    }
    use half::slice::HalfFloatSliceExt;
    src.convert_to_f32_slice(out);
}

/// `src` widened to f32 into `out` (resized to fit): a bf16 is the top half of an f32, so a
/// shift per value, which LLVM vectorises.
pub fn widen_bf16(src: &[half::bf16], out: &mut Vec<f32>) {
    out.resize(src.len(), 0.0);
    widen_bf16_into(src, out);
}

/// [`widen_bf16`] into `out` (`src.len()` entries).
fn widen_bf16_into(src: &[half::bf16], out: &mut [f32]) {
    for (w, x) in out.iter_mut().zip(src) {
        *w = f32::from_bits((x.to_bits() as u32) << 16);
    }
}

/// The part of `buf` (grown to fit) that holds `n` floats from a 64-byte boundary on, for rows
/// the kernels write: a 64-byte store that straddles two cache lines costs about two.
///
/// PERF: widening an f16 row of 32,000 into a buffer 16 bytes past a boundary took 6.1–6.5 µs
/// against 4.9–5.4 aligned (Intel Xeon, AVX-512, alternating; the floor 1.1–1.3).
pub(crate) fn aligned_part(buf: &mut Vec<f32>, n: usize) -> std::ops::Range<usize> {
    const LANES: usize = 16;
    buf.resize(n + LANES - 1, 0.0);
    // At most 15 floats on: the buffer of floats is 4-byte aligned.
    let at = buf.as_ptr().align_offset(4 * LANES).min(LANES - 1);
    at..at + n
}

/// [`widen_f16`] into `out`, then [`summarize`] of `out` into `block_max`: the same results,
/// in one pass on CPUs with the SIMD kernels. Each group of blocks is widened and summarized
/// while it is still in L1, instead of the whole widened row being written out and read back.
///
/// ```
/// use half::f16;
/// use tokensieve::arch::{summarize, widen_summarize_f16};
/// let src: Vec<f16> = (0..1000).map(|i| f16::from_f32((i % 37) as f32 - 20.0)).collect();
/// let (mut out, mut block_max) = (Vec::new(), Vec::new());
/// let s = widen_summarize_f16(&src, &mut out, &mut block_max);
/// assert_eq!(s.max, 16.0);
/// let mut again = Vec::new();
/// assert_eq!(summarize(&out, &mut again), s);
/// assert_eq!(again, block_max);
/// ```
pub fn widen_summarize_f16(src: &[half::f16], out: &mut Vec<f32>, block_max: &mut Vec<f32>) -> Summary {
    out.resize(src.len(), 0.0);
    widen_summarize_by(src, out, block_max, f16_kernel(), widen_f16_into)
}

/// [`widen_bf16`] into `out`, then [`summarize`] of `out` into `block_max`, in one pass on CPUs
/// with the SIMD kernels (see [`widen_summarize_f16`]).
pub fn widen_summarize_bf16(src: &[half::bf16], out: &mut Vec<f32>, block_max: &mut Vec<f32>) -> Summary {
    out.resize(src.len(), 0.0);
    widen_summarize_by(src, out, block_max, bf16_kernel(), widen_bf16_into)
}

/// [`widen_summarize_f16`] or [`widen_summarize_bf16`] (as `row` is) into the part of `buf` that
/// [`aligned_part`] gives, which is returned beside the summary: the widened row is
/// `buf[range]`. `None` for an f32 row.
pub(crate) fn widen_summarize_aligned(
    row: crate::Logits<'_>,
    buf: &mut Vec<f32>,
    block_max: &mut Vec<f32>,
) -> Option<(Summary, std::ops::Range<usize>)> {
    let at = aligned_part(buf, row.len());
    let out = &mut buf[at.clone()];
    let summary = match row {
        crate::Logits::F32(_) => return None,
        crate::Logits::F16(h) => widen_summarize_by(h, out, block_max, f16_kernel(), widen_f16_into),
        crate::Logits::Bf16(b) => widen_summarize_by(b, out, block_max, bf16_kernel(), widen_bf16_into),
    };
    Some((summary, at))
}

/// A fused widen-and-summarize kernel: its CPU features must have been detected, and the
/// output, if given, must hold as many entries as the source.
type FusedWiden<T> = unsafe fn(&[T], Option<&mut [f32]>, &mut Vec<f32>) -> Summary;

/// [`widen_summarize_f16`]'s summary and block maxima without the widened row (each part is
/// widened into a small buffer, summarized, and dropped): `None` where this CPU runs no fused
/// kernel (then widen the row). For a path that needs only the summary and a block or two.
///
/// With AVX-512F, sixteen entries per conversion and nothing written but the block maxima.
pub fn summarize_f16(src: &[half::f16], block_max: &mut Vec<f32>) -> Option<Summary> {
    #[cfg(target_arch = "x86_64")]
    if caps().avx512 {
        // SAFETY: `avx512` is only set beside `Isa::Avx2` (AVX2, FMA, BMI1, POPCNT) when
        // AVX-512F was detected too.
        return Some(unsafe { avx512::summarize_f16(src, block_max) });
    }
    summarize_half_by(src, block_max, f16_kernel())
}

/// [`summarize_f16`] for bf16 rows.
pub fn summarize_bf16(src: &[half::bf16], block_max: &mut Vec<f32>) -> Option<Summary> {
    #[cfg(target_arch = "x86_64")]
    if caps().avx512 {
        // SAFETY: as in `summarize_f16`.
        return Some(unsafe { avx512::summarize_bf16(src, block_max) });
    }
    summarize_half_by(src, block_max, bf16_kernel())
}

fn summarize_half_by<T>(src: &[T], block_max: &mut Vec<f32>, kernel: Option<FusedWiden<T>>) -> Option<Summary> {
    let kernel = kernel?;
    block_max.clear();
    // SAFETY: the kernel was chosen only after its features were detected; no output.
    Some(unsafe { kernel(src, None, block_max) })
}

/// The fused kernel for f16 rows this CPU runs, if any.
fn f16_kernel() -> Option<FusedWiden<half::f16>> {
    #[cfg(target_arch = "x86_64")]
    {
        let c = caps();
        // `f16c` is only set after AVX2, FMA and F16C were detected at runtime, `avx512vl` only
        // beside them when AVX-512F and AVX-512VL were too.
        c.f16c.then_some(if c.avx512vl { avx512::widen_summarize_f16 } else { avx2::widen_summarize_f16 })
    }
    // `Isa::Neon` is only reported where the target enables NEON (the module's condition).
    #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
    return (caps().isa == Isa::Neon).then_some(neon::widen_summarize_f16 as FusedWiden<_>);
    #[cfg(not(any(target_arch = "x86_64", all(target_arch = "aarch64", target_feature = "neon"))))]
    None
}

/// The fused kernel for bf16 rows this CPU runs, if any.
fn bf16_kernel() -> Option<FusedWiden<half::bf16>> {
    #[cfg(target_arch = "x86_64")]
    {
        let c = caps();
        // `Isa::Avx2` is only reported when AVX2, FMA, BMI1 and POPCNT were detected at runtime, `avx512vl`
        // only beside them when AVX-512F and AVX-512VL were too.
        (c.isa == Isa::Avx2).then_some(if c.avx512vl {
            avx512::widen_summarize_bf16
        } else {
            avx2::widen_summarize_bf16
        })
    }
    // As in `f16_kernel`.
    #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
    return (caps().isa == Isa::Neon).then_some(neon::widen_summarize_bf16 as FusedWiden<_>);
    #[cfg(not(any(target_arch = "x86_64", all(target_arch = "aarch64", target_feature = "neon"))))]
    None
}

/// The body of the `widen_summarize_*` functions: `kernel` where this CPU runs one (chosen by
/// the caller after detection), else `widen` then [`summarize`].
fn widen_summarize_by<T>(
    src: &[T],
    out: &mut [f32],
    block_max: &mut Vec<f32>,
    kernel: Option<FusedWiden<T>>,
    widen: fn(&[T], &mut [f32]),
) -> Summary {
    assert_eq!(out.len(), src.len(), "widen_summarize: wrong output length");
    match kernel {
        Some(kernel) => {
            block_max.clear();
            // SAFETY: the caller chose `kernel` only after its features were detected; `out`
            // holds `src.len()` entries.
            unsafe { kernel(src, Some(out), block_max) }
        }
        None => {
            widen(src, out);
            summarize(out, block_max)
        }
    }
}

/// The instruction set detected on this CPU (once; cached).
pub fn isa() -> Isa {
    caps().isa
}

/// True when the AVX-512 kernels of [`max`], [`summarize`], [`locate_max`],
/// [`block_max_into`], [`exp_block_sums_approx`], [`exp_sum_sequential`] and
/// [`gather_blocks_ge`] are in use (AVX-512F detected beside AVX2, FMA, BMI1 and POPCNT). The
/// other kernels are AVX2's either way (but see [`avx512vl`]).
pub fn avx512() -> bool {
    caps().avx512
}

/// True when the summaries that widen or patch a row as they go ([`widen_summarize_f16`],
/// [`widen_summarize_bf16`]) watch for NaN with AVX-512VL mask compares on 8 lanes (AVX-512F
/// and AVX-512VL detected beside AVX2, FMA, BMI1 and POPCNT).
pub fn avx512vl() -> bool {
    caps().avx512vl && caps().isa == Isa::Avx2
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
    let c = caps();
    match c.isa {
        // SAFETY: `Isa::Avx2` is only reported when AVX2, FMA, BMI1 and POPCNT were detected at runtime,
        // `avx512` only beside them when AVX-512F was too.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 if c.avx512 => unsafe { avx512::max(row) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::max(row) },
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        // SAFETY: the module exists only where the target enables NEON.
        Isa::Neon => unsafe { neon::max(row) },
        _ => portable::max(row),
    }
}

/// The smallest value of `row` (`+inf` for an empty row). For NaN-free input. One pass, with
/// the portable kernel's lanes, compiled for AVX2 where it was detected.
///
/// PERF: in the base ISA (SSE2 on x86-64) the pass took longer than the block maxima's
/// (`temperature(0.8);mirostat_v2` at V = 128,256 on Zen 4: 18% of the time against 15%,
/// `mirostat_v2` reading the row's least weight).
///
/// ```
/// assert_eq!(tokensieve::arch::min(&[1.0, -2.0, 7.5, 3.0]), -2.0);
/// ```
pub fn min(row: &[f32]) -> f32 {
    match caps().isa {
        // SAFETY: `Isa::Avx2` is only reported when AVX2, FMA, BMI1 and POPCNT were detected at runtime.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::min(row) },
        _ => portable::min(row),
    }
}

/// What [`summarize`] or [`locate_max`] found.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// The largest value (for a NaN-free row).
    pub max: f32,
    /// The first block whose maximum equals `max` (`==`, so `-0.0 == 0.0`).
    pub max_block: usize,
    /// True when the row may hold NaN or `+inf` (false guarantees it holds neither; the
    /// kernels here raise no false alarm, but a caller confirms with
    /// [`Logits::validate`](crate::Logits::validate), which names the token).
    pub suspect: bool,
}

/// One pass over `row`: validation, the maximum and the maximum of every [`BLOCK`] of
/// entries (the last block may be shorter), written to `block_max` (replacing its contents).
/// Where a block's largest entries are `+0.0` and `-0.0`, its maximum is either (which one may
/// depend on where the row lies in memory: the SIMD kernels read a misaligned row's blocks
/// in another order).
pub fn summarize(row: &[f32], block_max: &mut Vec<f32>) -> Summary {
    let c = caps();
    // The x86 kernels size `block_max` and write every entry: a row of the last row's length
    // (the usual case) costs no fill. The others push onto it.
    match c.isa {
        // SAFETY: `Isa::Avx2` is only reported when AVX2, FMA, BMI1 and POPCNT were detected at runtime,
        // `avx512` only beside them when AVX-512F was too.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 if c.avx512 => unsafe { avx512::summarize(row, block_max) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::summarize(row, block_max) },
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        Isa::Neon => {
            block_max.clear();
            // SAFETY: the module exists only where the target enables NEON.
            unsafe { neon::summarize(row, block_max) }
        }
        _ => {
            block_max.clear();
            portable::summarize(row, block_max)
        }
    }
}

/// `src` copied into `out` (resized to fit) with `edits` (`(id, value)`, sorted by id, each id
/// below `src.len()`) written over it, every entry then divided by `div` in f32 (`1` divides
/// nothing), then [`summarize`] of `out` into `block_max`: the same results, in one pass on
/// x86 (each group of blocks is copied, edited, divided and summarized while it is in L1).
/// For a row with a few edits (and a temperature) that a kernel reading the row in place
/// needs applied.
///
/// PERF: a copy of the whole row (`memcpy`) took 2.2 µs at V = 32,000 (2.6 times the floor)
/// and 9.8 µs at 128,256, and the summary of the copy after it 1.4 and 5.1 µs; this pass 2.9
/// and 12.5 µs (Intel Xeon). Writing the row is most of it.
pub(crate) fn patch_summarize(
    src: &[f32],
    edits: &[(u32, f32)],
    div: f32,
    out: &mut Vec<f32>,
    block_max: &mut Vec<f32>,
) -> Summary {
    assert!(
        edits.windows(2).all(|w| w[0].0 < w[1].0) && edits.last().is_none_or(|e| (e.0 as usize) < src.len()),
        "patch_summarize: edits out of order or out of range"
    );
    out.resize(src.len(), 0.0);
    let c = caps();
    match c.isa {
        // SAFETY: `Isa::Avx2` is only reported when AVX2, FMA, BMI1 and POPCNT were detected at runtime,
        // `avx512vl` only beside them when AVX-512F and AVX-512VL were too; `out` holds
        // `src.len()` entries and the edits were checked above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 if c.avx512vl => unsafe { avx512::patch_summarize(src, edits, div, out, block_max) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::patch_summarize(src, edits, div, out, block_max) },
        _ => {
            out.copy_from_slice(src);
            for &(id, value) in edits {
                out[id as usize] = value;
            }
            if div != 1.0 {
                out.iter_mut().for_each(|x| *x /= div);
            }
            summarize(out, block_max)
        }
    }
}

/// [`summarize`] without the block maxima: one pass that validates the row and finds the
/// maximum and the first [`BLOCK`] holding it, with [`Summary`]'s guarantees (`suspect`
/// false: no NaN and no `+inf`).
///
/// It costs close to [`max`]: the AVX2 version takes a block's horizontal maximum only when
/// one of its lanes passes the best so far, and detects NaN with four compares of part of the
/// max tree instead of a second tree per block.
///
/// ```
/// let mut row = vec![0.5f32; 200];
/// row[150] = 9.0;
/// let s = tokensieve::arch::locate_max(&row);
/// assert_eq!((s.max, s.max_block, s.suspect), (9.0, 150 / tokensieve::arch::BLOCK, false));
/// row[7] = f32::NAN;
/// assert!(tokensieve::arch::locate_max(&row).suspect);
/// ```
pub fn locate_max(row: &[f32]) -> Summary {
    let c = caps();
    match c.isa {
        // SAFETY: `Isa::Avx2` is only reported when AVX2, FMA, BMI1 and POPCNT were detected at runtime,
        // `avx512` only beside them when AVX-512F was too.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 if c.avx512 => unsafe { avx512::locate_max(row) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::locate_max(row) },
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        // SAFETY: the module exists only where the target enables NEON.
        Isa::Neon => unsafe { neon::locate_max(row) },
        _ => portable::locate_max(row),
    }
}

/// The maximum of every [`BLOCK`] of `row` (the last may be shorter) into `out`, which must
/// hold `row.len().div_ceil(BLOCK)` entries; returns the maximum of the row. For NaN-free input.
pub fn block_max_into(row: &[f32], out: &mut [f32]) -> f32 {
    assert_eq!(out.len(), row.len().div_ceil(BLOCK), "block_max_into: wrong output length");
    let c = caps();
    match c.isa {
        // SAFETY: `Isa::Avx2` is only reported when AVX2, FMA, BMI1 and POPCNT were detected at runtime,
        // `avx512` only beside them when AVX-512F was too; `out`'s length was checked.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 if c.avx512 => unsafe { avx512::block_max_into(row, out) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::block_max_into(row, out) },
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        // SAFETY: the module exists only where the target enables NEON.
        Isa::Neon => unsafe { neon::block_max_into(row, out) },
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
        // SAFETY: `Isa::Avx2` is only reported when AVX2, FMA, BMI1 and POPCNT were detected at runtime.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::argmax(row) },
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        // SAFETY: the module exists only where the target enables NEON.
        Isa::Neon => unsafe { neon::argmax(row) },
        _ => portable::argmax(row),
    }
}

/// How many values are `>= threshold`.
pub fn count_ge(values: &[f32], threshold: f32) -> usize {
    match caps().isa {
        // SAFETY: `Isa::Avx2` is only reported when AVX2, FMA, BMI1 and POPCNT were detected at runtime.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::count_ge(values, threshold) },
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        // SAFETY: the module exists only where the target enables NEON.
        Isa::Neon => unsafe { neon::count_ge(values, threshold) },
        _ => portable::count_ge(values, threshold),
    }
}

/// How many values each f32 lane of [`moments`] adds before its partial sums move to f64.
pub(crate) const MOMENT_RUN: usize = 64;

/// The values of `values` other than `-inf`: their count, their maximum (`-inf` if none),
/// `Σ x` and `Σ x²`, as f64 totals of f32 partial sums. Each of 16 f32 lanes adds at most
/// [`MOMENT_RUN`] values (or squares, by fused multiply-adds or rounded to f32 first) before
/// its sums are added into f64, so each total lies within `γ_(MOMENT_RUN + 1)` (f32's unit)
/// of the exact one relative to `Σ |x|` (`Σ x²`), plus the f64 additions' rounding and
/// `2^-149` per value below f32's normal range. A NaN or `+inf` value makes the sums NaN or
/// infinite.
///
/// For llama.cpp's `top_n_sigma` statistics ([`crate::sampler::top_n_sigma`]). PERF: f32
/// lanes cost about two max passes at V = 128k (Zen 4); f64 lanes cost several times that,
/// and runs of 16 half as much again (their f64 additions spill).
pub(crate) fn moments(values: &[f32]) -> (usize, f32, f64, f64) {
    match caps().isa {
        // SAFETY: `Isa::Avx2` is only reported when AVX2, FMA, BMI1 and POPCNT were detected at runtime.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::moments(values) },
        _ => portable::moments::<_, false>(values, |&x| x),
    }
}

/// Calls `f(i, block[i])` for every `i` with `block[i] >= threshold`, in index order, for a
/// `block` of at most [`BLOCK`] entries. For sparse hits: a vector compare per 8 entries,
/// then one call per hit.
#[inline]
pub fn for_each_ge(block: &[f32], threshold: f32, f: impl FnMut(usize, f32)) {
    assert!(block.len() <= BLOCK, "for_each_ge: more than one block");
    match caps().isa {
        // SAFETY: `Isa::Avx2` is only reported when AVX2, FMA, BMI1 and POPCNT were detected at runtime.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::for_each_ge(block, threshold, f) },
        // SAFETY: the module exists only where the target enables NEON.
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        Isa::Neon => unsafe { neon::for_each_ge(block, threshold, f) },
        _ => portable::for_each_ge(block, threshold, f),
    }
}

/// A gap `g` with at least `need` of `values` at or above `max - g`, and if possible not many
/// more (at most `need + need / 4 + 8`): `start` first (the gap that worked before), counted by
/// [`count_ge`], then doubled until enough and bisected, 16 counts at most. `None` when no gap
/// tried reaches `need` (the caller decides what then). Callers keep the gap for the next row,
/// whose shape is usually close.
pub(crate) fn settle_gap(values: &[f32], need: usize, max: f32, start: f32) -> Option<f32> {
    let mut gap = start;
    // Gaps known to give too few (`lo`) and enough (`hi`) values.
    let (mut lo, mut hi) = (0.0f32, f32::INFINITY);
    for _ in 0..16 {
        let n = count_ge(values, max - gap);
        if n >= need {
            hi = gap;
            if n <= need + need / 4 + 8 {
                break;
            }
        } else {
            lo = gap;
        }
        gap = if hi.is_finite() { 0.5 * (lo + hi) } else { gap * 2.0 };
        if !gap.is_finite() {
            break;
        }
    }
    hi.is_finite().then_some(hi)
}

/// Appends `(base + i, block[i], p = 0)` for every `i` with `block[i] >= threshold`, in index
/// order.
pub fn gather_ge(block: &[f32], base: u32, threshold: f32, out: &mut Vec<TokenData>) {
    match caps().isa {
        // SAFETY: `Isa::Avx2` is only reported when AVX2, FMA, BMI1 and POPCNT were detected at runtime.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::gather_ge(block, base, threshold, out) },
        // SAFETY: the module exists only where the target enables NEON.
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        Isa::Neon => unsafe { neon::gather_ge(block, base, threshold, out) },
        _ => portable::gather_ge(block, base, threshold, out),
    }
}

/// Appends `(i, row[i], p = 0)` for every `i` with `row[i] >= threshold`, in index order,
/// reading only the [`BLOCK`]s whose maximum reaches the threshold. `block_max` must hold the
/// maxima of the blocks of `row` (as [`summarize`] writes them).
pub fn gather_blocks_ge(row: &[f32], block_max: &[f32], threshold: f32, out: &mut Vec<TokenData>) {
    assert_eq!(block_max.len(), row.len().div_ceil(BLOCK), "gather_blocks_ge: wrong block count");
    let c = caps();
    match c.isa {
        // SAFETY: `Isa::Avx2` is only reported when AVX2, FMA, BMI1 and POPCNT were detected at runtime,
        // `avx512` only beside them when AVX-512F was too.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 if c.avx512 => unsafe { avx512::gather_blocks_ge(row, block_max, threshold, out) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::gather_blocks_ge(row, block_max, threshold, out) },
        // SAFETY: the module exists only where the target enables NEON.
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        Isa::Neon => unsafe { neon::gather_blocks_ge(row, block_max, threshold, out) },
        _ => portable::gather_blocks_ge(row, block_max, threshold, out),
    }
}

/// `keys` in ascending order, as `sort_unstable` leaves them. With AVX-512F, 16 to 64
/// distinct keys are placed by counting the keys below each (no branch on the data, where a
/// comparison sort's branches mispredict on keys in no order); otherwise `sort_unstable`.
/// The small lists of candidates sorted per token (a top-k's superset, the logprobs' top, the
/// transformers paths' survivors) are such keys.
pub(crate) fn sort_keys(keys: &mut [u64]) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `avx512` is only set beside `Isa::Avx2`, when AVX-512F, AVX2, FMA, BMI1 and
    // POPCNT were detected at runtime.
    if caps().avx512 && unsafe { avx512::sort_keys_by_rank(keys) } {
        return;
    }
    keys.sort_unstable();
}

/// `out[i] = floor(clamp(v, 0, last))` or one less, as a byte, for a lower bound `v` on
/// `m2 - block_max[i] · s2` (the rungs of [`NearSums`](crate::convention::llama_cpp::dense)):
/// `p = fl32(block_max[i] · s2)` clamped at -1e30, `v = fl32(m2 - p)` less
/// `2^-19 (|p| + |m2|)`. The same bytes on every ISA (f32 operations as written, no fused
/// multiply-add).
pub(crate) fn rungs(block_max: &[f32], s2: f32, m2: f32, last: f32, out: &mut [u8]) {
    assert_eq!(block_max.len(), out.len(), "rungs: length mismatch");
    #[cfg(target_arch = "x86_64")]
    if caps().isa == Isa::Avx2 {
        // SAFETY: `Isa::Avx2` is only reported when AVX2, FMA, BMI1 and POPCNT were detected at runtime.
        return unsafe { avx2::rungs(block_max, s2, m2, last, out) };
    }
    rungs_with(block_max, s2, m2, last, out);
}

/// [`rungs`]' loop, inlined into each caller (compiled with its features).
#[inline(always)]
pub(crate) fn rungs_with(block_max: &[f32], s2: f32, m2: f32, last: f32, out: &mut [u8]) {
    for (k, &bm) in out.iter_mut().zip(block_max) {
        let p = (bm * s2).max(-1e30);
        let v = (m2 - p) - (p.abs() + m2.abs()) * (1.0 / 524_288.0);
        // The integer part without a (scalarised, saturating) conversion: added to 1.5·2^23,
        // a value in [-0.5, 127] rounds to an integer in the low mantissa bits. Rounding
        // `v - 0.5` gives `floor(v)` or one less, never more.
        *k = ((v.max(0.0).min(last) - 0.5) + 12_582_912.0).to_bits() as u8;
    }
}

/// Appends to `out` the positions `i` (ascending) of the `bytes` with `lo <= bytes[i] < hi`.
pub(crate) fn positions_in_range(bytes: &[u8], lo: u8, hi: u8, out: &mut Vec<u32>) {
    #[cfg(target_arch = "x86_64")]
    if caps().isa == Isa::Avx2 {
        // SAFETY: `Isa::Avx2` is only reported when AVX2, FMA, BMI1 and POPCNT were detected at runtime.
        return unsafe { avx2::positions_in_range(bytes, lo, hi, out) };
    }
    out.extend((0..bytes.len() as u32).filter(|&i| (lo..hi).contains(&bytes[i as usize])));
}

/// The largest value of `block` (at most 64 entries, NaN-free) leaving out the entries whose
/// bits are set in `skip` (bit `i` for `block[i]`); `-inf` if none is left.
///
/// PERF: for the few blocks whose maximum a penalty lowered ([`crate::convention`]'s
/// `lower_block_maxima`): the safe loop with the bit test per entry compiled to scalar
/// `maxss`, about as slow as [`max`]'s dispatch and tails on 64 entries (35 ns a block).
pub(crate) fn max_except(block: &[f32], skip: u64) -> f32 {
    debug_assert!(block.len() <= 64);
    match caps().isa {
        // SAFETY: `Isa::Avx2` is only reported when AVX2, FMA, BMI1 and POPCNT were detected at runtime.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::max_except(block, skip) },
        _ => block
            .iter()
            .enumerate()
            .filter(|&(i, _)| skip.checked_shr(i as u32).unwrap_or(0) & 1 == 0)
            .fold(f32::NEG_INFINITY, |m, (_, &v)| if v > m { v } else { m }),
    }
}

/// The first index `i` with `values[i] == x` (`==`: `-0.0` matches `0.0`, NaN nothing).
pub(crate) fn position_eq(values: &[f32], x: f32) -> Option<usize> {
    match caps().isa {
        // SAFETY: `Isa::Avx2` is only reported when AVX2, FMA, BMI1 and POPCNT were detected at runtime.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::first_eq(values, x) },
        _ => values.iter().position(|&v| v == x),
    }
}

/// The integer increments of adding each weight `w` of `ws` to two running sums whose ulps
/// are `1 / scale_cum` and `1 / scale_run` (powers of two): `t = fl32(w / sum) · scale_cum`
/// and `w · scale_run` (both exact), each rounded to the nearest integer, totalled. `None`
/// where one of them is a tie (a half integer: the sum's last bit would decide), not below
/// 2^52, or NaN. The weights must be non-negative.
///
/// PERF: compiled for AVX2 where it was detected (four f64 lanes, the rounding by adding and
/// subtracting 2^52, whose bits minus 2^52's are the integer): the base ISA's loop, two lanes
/// and a scalar division per weight, was a third of [`super::convention`]'s bucketed
/// `top_p;dist` draw on a nearly flat row.
pub(crate) fn rounded_increments(ws: &[f32], sum: f32, scale_cum: f64, scale_run: f64) -> Option<(u64, u64)> {
    #[cfg(target_arch = "x86_64")]
    if caps().isa == Isa::Avx2 {
        // SAFETY: `Isa::Avx2` is only reported when AVX2, FMA, BMI1 and POPCNT were detected at runtime.
        return unsafe { avx2::rounded_increments(ws, sum, scale_cum, scale_run) };
    }
    rounded_increments_with(ws, sum, scale_cum, scale_run)
}

/// [`rounded_increments`]' loop, inlined into each caller (compiled with its features).
#[inline(always)]
pub(crate) fn rounded_increments_with(ws: &[f32], sum: f32, scale_cum: f64, scale_run: f64) -> Option<(u64, u64)> {
    // 2^52: `x + SHIFT` rounds `0 <= x < 2^52` to an integer, held in the low bits.
    const SHIFT: f64 = 4_503_599_627_370_496.0;
    let (mut k_cum, mut k_run) = (0u64, 0u64);
    // Each increment is below 2^52, so 4096 of them total below 2^64.
    for part in ws.chunks(4096) {
        let (mut part_cum, mut part_run, mut bad) = (0u64, 0u64, 0u64);
        for &w in part {
            let t = (w / sum) as f64 * scale_cum;
            let tw = w as f64 * scale_run;
            let (st, sw) = (t + SHIFT, tw + SHIFT);
            // Non-short-circuit `&` and `|`: no branch in the loop. (NaN is out of range.)
            let in_range = (t < SHIFT) & (tw < SHIFT);
            let tie = ((t - (st - SHIFT)).abs() == 0.5) | ((tw - (sw - SHIFT)).abs() == 0.5);
            bad += u64::from(!in_range | tie);
            part_cum = part_cum.wrapping_add(st.to_bits().wrapping_sub(SHIFT.to_bits()));
            part_run = part_run.wrapping_add(sw.to_bits().wrapping_sub(SHIFT.to_bits()));
        }
        if bad != 0 {
            return None;
        }
        k_cum = k_cum.checked_add(part_cum)?;
        k_run = k_run.checked_add(part_run)?;
    }
    Some((k_cum, k_run))
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
        // SAFETY: `exact_exp` is only set after AVX2, FMA, BMI1 and POPCNT were detected at runtime,
        // `avx512` only beside them when AVX-512F was too.
        unsafe {
            if c.avx512 {
                return avx512::exp_shifted(src, div, sub, out);
            }
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
        // SAFETY: `exact_exp` is only set after AVX2, FMA, BMI1 and POPCNT were detected at runtime.
        unsafe {
            return avx2::exp_shifted_sum(src, div, sub);
        }
    }
    portable::exp_shifted_sum(src, div, sub)
}

/// `*x = x.exp()` for every entry, bit for bit the platform's `f64::exp`: many at a time where
/// the replica of [`mod@exp64`] agrees with it, one call each otherwise.
///
/// ```
/// let mut xs = [0.0f64, -1.5, f64::NEG_INFINITY, -800.0];
/// tokensieve::arch::exp_in_place(&mut xs);
/// assert_eq!(xs, [1.0, (-1.5f64).exp(), 0.0, 0.0]);
/// ```
pub fn exp_in_place(xs: &mut [f64]) {
    let c = caps();
    if c.exact_exp64 {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `exact_exp64` is only set after AVX2, FMA, BMI1 and POPCNT were detected, and the kernel
        // runs on 8 lanes only where `avx512` reports AVX-512F.
        unsafe {
            return exp64::exp_in_place(xs, c.avx512);
        }
    }
    xs.iter_mut().for_each(|x| *x = x.exp());
}

/// Per [`BLOCK`] of `src`, the sum of the weights `exp(f64(fl32(fl32(src[i] / div) - sub)))`
/// (the transformers convention's, each bit for bit the platform's `f64::exp`; `-inf` entries
/// weigh `+0`), into `out` (cleared). The order of the additions is fixed: eight running sums,
/// entry `i` of a block into sum `i % 8`, added as a tree at the block's end (the same on every
/// CPU). `sub` must be finite.
///
/// ```
/// let row = [0.0f32, -1.0, f32::NEG_INFINITY, -2.5];
/// let mut sums = Vec::new();
/// tokensieve::arch::exp64_block_sums(&row, 1.0, 0.0, &mut sums);
/// let want = (1.0 + (-1.0f64).exp()) + (0.0 + (-2.5f64).exp());
/// assert_eq!(sums, [want]);
/// ```
pub fn exp64_block_sums(src: &[f32], div: f32, sub: f32, out: &mut Vec<f64>) {
    assert!(sub.is_finite(), "exp64_block_sums: sub must be finite");
    let c = caps();
    if c.exact_exp64 {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `exp_in_place`.
        unsafe {
            return exp64::block_sums(src, div, sub, out, c.avx512);
        }
    }
    exp64::block_sums_portable(src, div, sub, out);
}

/// `((start + w_0) + w_1) + …` in f32, in row order, bit for bit, with
/// `w_i = expf(row[i] - sub)` (llama.cpp's softmax sum for `start = 0`; a later `start`
/// continues a sum over an earlier part of the row). `start` must be `+0.0` or positive (from
/// `-0.0`, skipped zero weights would leave `-0.0` where the plain loop gives `+0.0`). `block_max` must hold
/// the maxima of the [`BLOCK`]s of `row` (as [`summarize`] writes them) and every
/// `row[i] - sub` must be `<= 0` or `-inf`.
///
/// A weight below half an ulp of the running sum leaves it unchanged when added (round to
/// nearest), so only the entries that can change it are exponentiated: a block is skipped when
/// its maximum is too small, and inside a block only the entries at or above a conservative
/// logit threshold are gathered (in order) and added. The result is the plain loop's. The AVX2
/// version also bounds the running sum from below by the weight of the largest logit seen so
/// far, and adds the weights without the chain of dependent f32 additions: while the sum stays
/// in one binade its ulp is fixed, so each weight's rounded increment is an integer number of
/// ulps that does not depend on the sum; these are summed as integers, with the plain loop
/// where a weight is an exact tie or the sum leaves the binade (the proof is at
/// `avx2::add_group`).
pub fn exp_sum_sequential(start: f32, row: &[f32], sub: f32, block_max: &[f32]) -> f32 {
    exp_sum_sequential_patched(start, row, sub, block_max, &[])
}

/// [`exp_sum_sequential`] from `+0.0` given an upper bound `hi` of its result and the first
/// block holding the row's largest entry (`max_block`, as [`summarize`] reports it): the same
/// bits, sooner where `hi` shows the sum's last binade early. The sum only grows; once it has
/// added that block it is at least that entry's weight, and if it
/// then sits in `hi`'s binade it stays there to the end, so the rest of the row is the
/// order-free sum of [`exp_sum_unordered_gathered`] (which also checks that no weight is a tie
/// and that the binade is kept: `hi` only chooses the path); else, or where that declines, the
/// sequential kernel goes on from there. `collector` is that sum's.
///
/// PERF: on the real row (SmolLM2's, tiled to V = 128,256; its maximum is entry 7,042) the
/// part after the maximum's block took 41 µs sequentially, 31 in any order by the block scan
/// and 26 gathered; the `top_p;dist` draws that need the exact sum went from 95 to 84 µs
/// (medians, one process, alternating).
pub(crate) fn exp_sum_sequential_below(
    row: &[f32],
    sub: f32,
    block_max: &[f32],
    max_block: usize,
    hi: f32,
    collector: &mut Collector,
) -> f32 {
    check_sum_args("exp_sum_sequential_below", row, block_max, &[]);
    let binade = |x: f32| x.to_bits() >> 23;
    let split = ((max_block + 1) * BLOCK).min(row.len());
    if !(hi.is_finite() && hi > 0.0 && caps().exact_exp) || split == row.len() {
        return exp_sum_sequential(0.0, row, sub, block_max);
    }
    let (head, rest) = row.split_at(split);
    let (head_max, rest_max) = block_max.split_at(max_block + 1);
    let start = exp_sum_sequential(0.0, head, sub, head_max);
    if binade(start) == binade(hi) {
        if let Some(sum) = exp_sum_unordered_gathered(collector, start, rest, sub, rest_max) {
            return sum;
        }
    }
    exp_sum_sequential(start, rest, sub, rest_max)
}

/// [`exp_sum_unordered`] (without patches) through `collector`: the entries that can change
/// the sum gathered from the blocks that hold one, a chunk at a time, each chunk totalled by
/// [`exp_sum_unordered_values`] (the sum stays in `start`'s binade, so `start`'s threshold
/// holds throughout). Where the collector is not available, [`exp_sum_unordered`] itself.
pub(crate) fn exp_sum_unordered_gathered(
    collector: &mut Collector,
    start: f32,
    row: &[f32],
    sub: f32,
    block_max: &[f32],
) -> Option<f32> {
    check_sum_args("exp_sum_unordered_gathered", row, block_max, &[]);
    let threshold = skip_threshold(sub, log_half_ulp(start));
    if !collector.start(block_max, threshold) {
        return exp_sum_unordered(start, row, sub, block_max, &[]);
    }
    let mut sum = start;
    loop {
        let chunk = collector.next(row, threshold);
        if chunk.is_empty() {
            return Some(sum);
        }
        sum = exp_sum_unordered_values(sum, chunk, sub)?;
    }
}

/// [`exp_sum_sequential`] over `row` with some entries replaced: `patches` lists
/// `(index, value)` pairs in increasing index order, each `index < row.len()` and each `value`
/// at most the entry it replaces (so `block_max` still bounds every block; `-inf` takes an
/// entry out of the sum). The sum is the plain loop's over the patched row, bit for bit.
///
/// Raw logprobs use it for llama.cpp server's summation order, which is the row's after a
/// partial sort has moved some entries (see [`crate::logprobs`]).
///
/// ```
/// use tokensieve::arch::{exp_sum_sequential_patched, summarize};
/// let row = [0.0f32, -1.0, -2.0, -0.5];
/// let mut block_max = Vec::new();
/// summarize(&row, &mut block_max);
/// // Entry 3 taken out and entry 1 lowered to -2.0:
/// let sum = exp_sum_sequential_patched(0.0, &row, 0.0, &block_max, &[(1, -2.0), (3, f32::NEG_INFINITY)]);
/// assert_eq!(sum, ((0.0f32.exp() + (-2.0f32).exp()) + (-2.0f32).exp()) + 0.0);
/// ```
pub fn exp_sum_sequential_patched(start: f32, row: &[f32], sub: f32, block_max: &[f32], patches: &[(u32, f32)]) -> f32 {
    check_sum_args("exp_sum_sequential_patched", row, block_max, patches);
    let c = caps();
    if c.exact_exp {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `exact_exp` is only set after AVX2, FMA, BMI1 and POPCNT were detected at runtime,
        // `avx512` only beside them when AVX-512F and POPCNT were too.
        unsafe {
            if c.avx512 {
                return avx512::exp_sum_sequential(start, row, sub, block_max, patches);
            }
            return avx2::exp_sum_sequential(start, row, sub, block_max, patches);
        }
    }
    #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
    if c.isa == Isa::Neon {
        // SAFETY: the module exists only where the target enables NEON.
        return unsafe { neon::exp_sum_sequential(start, row, sub, block_max, patches) };
    }
    portable::exp_sum_sequential(start, row, sub, block_max, patches)
}

/// The sum of [`exp_sum_sequential_patched`] when it does not depend on the order in which the
/// weights are added, `None` when it may (or on CPUs without the kernels below).
///
/// While a running sum stays in one binade, adding a weight moves it by a whole number of that
/// binade's ulps (the weight divided by the ulp, rounded to nearest), independent of the sum,
/// unless the quotient is a tie (`j + 1/2`, where the sum's last bit decides). So when no
/// weight's quotient is a tie (the AVX2/AVX-512 kernels certify it while computing the whole
/// numbers) and their total keeps the sum in `start`'s binade, any order of the same weights
/// from `start` gives `start` plus that total in ulps. Raw logprobs use it (with the
/// crate's collector, the same total over the entries gathered from the blocks that can hold one)
/// to sum the row in llama-server's order (a permutation of the row) without computing that
/// order.
///
/// ```
/// use tokensieve::arch::{exp_sum_sequential_patched, exp_sum_unordered, summarize};
/// let row: Vec<f32> = (0..5000).map(|i| -10.0 - (i % 97) as f32 * 0.1).collect();
/// let mut block_max = Vec::new();
/// summarize(&row, &mut block_max);
/// if let Some(sum) = exp_sum_unordered(1.0, &row, 0.0, &block_max, &[]) {
///     assert_eq!(sum, exp_sum_sequential_patched(1.0, &row, 0.0, &block_max, &[]));
/// }
/// ```
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
pub fn exp_sum_unordered(start: f32, row: &[f32], sub: f32, block_max: &[f32], patches: &[(u32, f32)]) -> Option<f32> {
    check_sum_args("exp_sum_unordered", row, block_max, patches);
    let c = caps();
    if c.exact_exp {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `exp_sum_sequential_patched`.
        unsafe {
            if c.avx512 {
                return avx512::exp_sum_unordered(start, row, sub, block_max, patches);
            }
            return avx2::exp_sum_unordered(start, row, sub, block_max, patches);
        }
    }
    None
}

/// [`exp_sum_unordered`] over values instead of a row: `start` plus `expf(x - sub)` for every
/// `x` of `xs` (a multiple of 8 of them; `-inf` pads), when no order of those additions can
/// change the f32 sum; `None` otherwise, or without the AVX2 or AVX-512 kernels (as
/// [`Collector`], which gathers such values). Values below
/// `skip_threshold(sub, log_half_ulp(start))` add nothing and may be there or not.
pub(crate) fn exp_sum_unordered_values(start: f32, xs: &[f32], sub: f32) -> Option<f32> {
    let c = caps();
    if c.exact_exp {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `exp_sum_sequential_patched`.
        unsafe {
            if c.avx512 {
                return avx512::exp_sum_unordered_values(start, xs, sub);
            }
            return avx2::exp_sum_unordered_values(start, xs, sub);
        }
    }
    let _ = (start, xs, sub);
    None
}

/// Appends to `out` the positions `i` (ascending) of the `values` at or above `threshold`;
/// for few of them among many.
pub(crate) fn positions_ge(values: &[f32], threshold: f32, out: &mut Vec<u32>) {
    positions(values, threshold, false, out);
}

/// Appends to `out` the positions `i` (ascending) of the `values` at or below `threshold`;
/// for few of them among many.
pub(crate) fn positions_le(values: &[f32], threshold: f32, out: &mut Vec<u32>) {
    positions(values, threshold, true, out);
}

/// [`positions_le`] (`at_most`) or [`positions_ge`].
fn positions(values: &[f32], threshold: f32, at_most: bool, out: &mut Vec<u32>) {
    let c = caps();
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `avx512` is only set beside `Isa::Avx2`, when AVX-512F was detected; `Isa::Avx2`
    // only when AVX2, FMA, BMI1 and POPCNT were.
    unsafe {
        match (c.avx512, c.isa == Isa::Avx2, at_most) {
            (true, _, true) => return avx512::positions_le(values, threshold, out),
            (true, _, false) => return avx512::positions_ge(values, threshold, out),
            (false, true, true) => return avx2::positions_le(values, threshold, out),
            (false, true, false) => return avx2::positions_ge(values, threshold, out),
            _ => {}
        }
    }
    let _ = c;
    let keep = |x: f32| if at_most { x <= threshold } else { x >= threshold };
    out.extend(values.iter().enumerate().filter(|(_, &x)| keep(x)).map(|(i, _)| i as u32));
}

/// Gathers the entries of a row at or above a threshold, a chunk at a time and in no
/// particular order, reading only the blocks whose maximum reaches it: what a sum that cannot
/// depend on the order of its terms ([`exp_sum_unordered_values`]) needs, each chunk summed
/// before the next is read, so that a sum that cannot be had that way stops early (on a nearly
/// flat row, gathering the whole row first cost 27 → 32 µs of raw logprobs at V = 32,000). Its buffers
/// are kept for the next row (no allocation once they have grown). Needs the AVX2 or AVX-512
/// kernels (without them [`exp_sum_unordered`] scans the row itself).
///
/// PERF: queueing these entries during the block-maxima pass instead (one read of the row, the
/// threshold from the maximum so far) cost more than this second read on the bench's row at
/// V = 32,000 (Zen 4): 3.0 µs for the fused pass against 1.1 + 1.3 µs, and 2.4 µs with nothing
/// to queue when every block was compressed without a branch. The compares and compresses per
/// block bound both, not the memory; and the running threshold queues 1.6 to 4 times as many
/// entries (1,521 against 924 at 32,000, 3,701 against 935 at 128,256). Measured again on an
/// Intel Xeon with AVX-512 (one process, alternating call by call, results equal), with the
/// entries of each group of sixteen blocks queued right after the group's maxima, read again
/// from L1, against the maximum so far: raw `logprobs(20)` took 4.1–4.2 µs against 3.9–4.0
/// at V = 32,000 and 12.9 against 8.4 at 128,256 (3,048 values queued against 913 needed, and
/// the compares and compresses paid on every block rather than on the listed ones).
#[derive(Debug, Default)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) struct Collector {
    /// The values of the current chunk, with room for a block more and padding.
    values: Vec<f32>,
    /// The blocks that reach the threshold, and how many of them were read.
    blocks: Vec<u32>,
    listed: usize,
    read: usize,
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
impl Collector {
    /// Whether [`Collector::start`] can list blocks here (the AVX2 and AVX-512 kernels, with
    /// the `expf` replica that [`exp_sum_unordered_values`] needs).
    pub(crate) fn available() -> bool {
        let c = caps();
        cfg!(target_arch = "x86_64") && c.exact_exp && c.isa == Isa::Avx2
    }

    /// Values queued before a chunk is handed out (the last may hold fewer).
    pub(crate) const CHUNK: usize = 1024;

    /// Grows the buffers for rows of `blocks` blocks, so that [`Collector::start`] does not
    /// allocate on them (for callers that may use the collector only now and then).
    pub(crate) fn reserve(&mut self, blocks: usize) {
        if self.blocks.len() < blocks + 16 {
            self.blocks.resize(blocks + 16, 0);
        }
        if self.values.len() < Self::CHUNK + 2 * BLOCK {
            self.values.resize(Self::CHUNK + 2 * BLOCK, f32::NEG_INFINITY);
        }
    }

    /// Lists the blocks whose maximum (`block_max`, [`BLOCK`] entries each) reaches
    /// `threshold`; `false` where it is not [`available`](Self::available). For NaN-free
    /// input.
    pub(crate) fn start(&mut self, block_max: &[f32], threshold: f32) -> bool {
        #[cfg(target_arch = "x86_64")]
        if Self::available() {
            self.reserve(block_max.len());
            // SAFETY: `Isa::Avx2` is only reported when AVX2, FMA, BMI1 and POPCNT were
            // detected, `avx512` only beside it when AVX-512F was.
            self.listed = unsafe {
                if caps().avx512 {
                    avx512::list_blocks_ge(block_max, threshold, &mut self.blocks)
                } else {
                    avx2::list_blocks_ge(block_max, threshold, &mut self.blocks)
                }
            };
            self.read = 0;
            return true;
        }
        let _ = (block_max, threshold);
        false
    }

    /// The next chunk: the entries at or above `threshold` (the one given to
    /// [`Collector::start`], with the same row's block maxima) of the next listed blocks of
    /// `row`, at least [`Collector::CHUNK`] of them unless the blocks run out, padded with
    /// `-inf` to a multiple of 16 (the values may be changed in place). Empty once every
    /// listed block was read.
    pub(crate) fn next(&mut self, row: &[f32], threshold: f32) -> &mut [f32] {
        #[cfg(target_arch = "x86_64")]
        if self.read < self.listed {
            let blocks = &self.blocks[self.read..self.listed];
            // The list ascends: its last block is the one that must lie in `row`.
            assert!(blocks.last().is_some_and(|&b| (b as usize) * BLOCK < row.len()), "Collector::next: another row");
            // SAFETY: `start` listed blocks only where the kernels are available (as there).
            let (read, n) = unsafe {
                if caps().avx512 {
                    avx512::collect_listed(row, blocks, threshold, &mut self.values, Self::CHUNK)
                } else {
                    avx2::collect_listed(row, blocks, threshold, &mut self.values, Self::CHUNK)
                }
            };
            self.read += read;
            let padded = n.div_ceil(16) * 16;
            self.values[n..padded].fill(f32::NEG_INFINITY);
            return &mut self.values[..padded];
        }
        let _ = (row, threshold);
        &mut []
    }
}

/// The list kernels' scalar end: appends to `blocks[listed..]` the last `rest` blocks of
/// `block_max` whose maximum reaches `threshold`; returns the new count.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn list_rest(block_max: &[f32], rest: usize, threshold: f32, blocks: &mut [u32], mut listed: usize) -> usize {
    let first = block_max.len() - rest;
    for (j, &bm) in block_max[first..].iter().enumerate() {
        blocks[listed] = (first + j) as u32;
        listed += usize::from(bm >= threshold);
    }
    listed
}

/// The preconditions of the sequential sums' arguments (`name`'s panics say which).
fn check_sum_args(name: &str, row: &[f32], block_max: &[f32], patches: &[(u32, f32)]) {
    assert_eq!(block_max.len(), row.len().div_ceil(BLOCK), "{name}: wrong block count");
    assert!(
        patches.windows(2).all(|w| w[0].0 < w[1].0) && patches.last().is_none_or(|p| (p.0 as usize) < row.len()),
        "{name}: patches out of order or out of range"
    );
    debug_assert!(patches.iter().all(|&(i, v)| v <= row[i as usize]), "{name}: a patch may only lower an entry");
}

/// The patches of a sequential sum, passed block by block as the sums visit blocks in
/// increasing order. The index of the next patch not yet passed is kept, so an unpatched block
/// costs one comparison; patches in skipped blocks (which only lowered entries already below
/// the threshold) are passed when a later block is asked about.
pub(crate) struct PatchCursor<'a> {
    patches: &'a [(u32, f32)],
    /// The first patch not yet passed, and its index in the row (`usize::MAX` past the end).
    at: usize,
    next: usize,
}

impl<'a> PatchCursor<'a> {
    pub(crate) fn new(patches: &'a [(u32, f32)]) -> Self {
        Self { patches, at: 0, next: patches.first().map_or(usize::MAX, |p| p.0 as usize) }
    }

    fn advance(&mut self) {
        self.at += 1;
        self.next = self.patches.get(self.at).map_or(usize::MAX, |p| p.0 as usize);
    }

    /// Whether a patch falls in `row[first..end]` (blocks asked in increasing order).
    #[inline]
    pub(crate) fn in_block(&mut self, first: usize, end: usize) -> bool {
        if self.next >= end {
            return false;
        }
        while self.next < first {
            self.advance();
        }
        self.next < end
    }

    /// `row[first..end]` with its patches applied, in `buf`, once [`in_block`](Self::in_block)
    /// said it has some; they are passed.
    #[inline]
    pub(crate) fn apply<'b>(&mut self, row: &[f32], first: usize, end: usize, buf: &'b mut [f32; BLOCK]) -> &'b [f32] {
        debug_assert!(self.next >= first, "apply before in_block");
        let block = &mut buf[..end - first];
        block.copy_from_slice(&row[first..end]);
        while self.next < end {
            block[self.next - first] = self.patches[self.at].1;
            self.advance();
        }
        block
    }
}

/// The block loop of the sequential sums without the `expf` replica (the portable kernel and
/// NEON's): each block whose maximum can still change the running sum (its weight at least
/// half an ulp of it), with its patches applied, goes to `add(sum, block, threshold)`, which
/// adds the block's entries at or above `threshold` in order and returns the new sum. Inlined
/// into each kernel, so that `add` is compiled with that kernel's target features.
#[inline(always)]
fn sequential_blocks(
    start: f32,
    row: &[f32],
    sub: f32,
    block_max: &[f32],
    patches: &[(u32, f32)],
    mut add: impl FnMut(f32, &[f32], f32) -> f32,
) -> f32 {
    let mut sum = start;
    let mut bound = log_half_ulp(sum);
    let (mut patch, mut buf) = (PatchCursor::new(patches), [0.0f32; BLOCK]);
    for (b, &bm) in block_max.iter().enumerate() {
        if bm - sub < bound {
            continue;
        }
        let (first, end) = (b * BLOCK, row.len().min(b * BLOCK + BLOCK));
        let block = if patch.in_block(first, end) { patch.apply(row, first, end, &mut buf) } else { &row[first..end] };
        sum = add(sum, block, skip_threshold(sub, bound));
        bound = log_half_ulp(sum);
    }
    sum
}

/// Natural log of half an ulp of a non-negative f32 `sum`, minus a margin of 0.01 that covers
/// `expf`'s error and this function's rounding: `expf(x) < half_ulp(sum)` for `x` below it.
#[inline]
pub(crate) fn log_half_ulp(sum: f32) -> f32 {
    // The sign bit cleared: `-0.0` (a sum of nothing) is `+0.0`'s binade, not a huge one.
    let exponent = (((sum.to_bits() & 0x7fff_ffff) >> 23) as i32 - 127).max(-126);
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

/// Per [`BLOCK`] of `src`, `Σ expf(src[i] / div - sub)` in f64, into `out` (which must hold
/// `src.len().div_ceil(BLOCK)` entries): the weights of [`exp_shifted`], bit for bit, summed in
/// [`exp_shifted_sum`]'s order. Every `src[i] / div - sub` must be `<= 0` or `-inf`.
pub fn exp_block_sums(src: &[f32], div: f32, sub: f32, out: &mut [f64]) {
    assert_eq!(out.len(), src.len().div_ceil(BLOCK), "exp_block_sums: wrong output length");
    let c = caps();
    if c.exact_exp {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `exact_exp` is only set after AVX2, FMA, BMI1 and POPCNT were detected at runtime,
        // `avx512` only beside them when AVX-512F was too.
        unsafe {
            if c.avx512 {
                return avx512::exp_block_sums(src, div, sub, out);
            }
            return avx2::exp_block_sums(src, div, sub, out);
        }
    }
    for (o, block) in out.iter_mut().zip(src.chunks(BLOCK)) {
        *o = portable::exp_shifted_sum(block, div, sub);
    }
}

/// Per [`BLOCK`] of `src`, an approximation of [`exp_block_sums`] (the sums of llama.cpp's
/// weights `expf(fl(fl(src[i] / div) - sub))`), for callers that only need to *locate* a value
/// among the running sums and can certify the answer: returns `E` such that the approximate
/// and exact sums of any run of whole blocks differ by at most `E` (ignoring the f64 rounding
/// of the exact sums themselves, which callers bound separately).
///
/// On AVX2 and NEON (the same arithmetic lane for lane, so the same sums and bound) and on
/// AVX-512 it costs a fraction of the exact kernel: the argument is one fused multiply-add in
/// base 2 (no division), `2^y` a quintic after splitting off the integer part, the lane sums
/// f32. `E` covers the polynomial, the f32 sums, `expf`'s own rounding, and the argument's
/// different rounding, which grows with `|sub|` and `|y|`: hence the kernel also sums
/// `2^y·|y|` (at most the sum times the softmax entropy in bits). Elsewhere
/// the sums are exact (`E = 0`). Every `src[i] / div - sub` must be `<= 0` or `-inf`.
pub fn exp_block_sums_approx(src: &[f32], div: f32, sub: f32, out: &mut [f64]) -> f64 {
    assert_eq!(out.len(), src.len().div_ceil(BLOCK), "exp_block_sums_approx: wrong output length");
    if approx_kernel_applies(div, sub) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only reported when AVX2, FMA, BMI1 and POPCNT were detected at runtime,
        // `avx512` only beside it when AVX-512F was too.
        unsafe {
            if caps().avx512 {
                return avx512::exp_block_sums_approx(src, div, sub, out);
            }
            return avx2::exp_block_sums_approx(src, div, sub, out);
        }
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        // SAFETY: the module exists only where the target enables NEON.
        return unsafe { neon::exp_block_sums_approx(src, div, sub, out) };
    }
    exp_block_sums(src, div, sub, out);
    0.0
}

/// [`exp_block_sums_approx`] over the blocks listed in `blocks` only (block indices, each
/// below `out.len()`); the other entries of `out` are left as they are. Returns the bound
/// on any run of the listed blocks. For callers that bound the other blocks by their maxima
/// instead of exponentiating them.
pub fn exp_block_sums_approx_at(src: &[f32], div: f32, sub: f32, blocks: &[u32], out: &mut [f64]) -> f64 {
    assert_eq!(out.len(), src.len().div_ceil(BLOCK), "exp_block_sums_approx_at: wrong output length");
    assert!(blocks.iter().all(|&b| (b as usize) < out.len()), "exp_block_sums_approx_at: block out of range");
    if approx_kernel_applies(div, sub) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only reported when AVX2, FMA, BMI1 and POPCNT were detected at runtime,
        // `avx512` only beside it when AVX-512F was too.
        unsafe {
            if caps().avx512 {
                return avx512::exp_block_sums_approx_at(src, div, sub, blocks, out);
            }
            return avx2::exp_block_sums_approx_at(src, div, sub, blocks, out);
        }
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        // SAFETY: the module exists only where the target enables NEON.
        return unsafe { neon::exp_block_sums_approx_at(src, div, sub, blocks, out) };
    }
    let mut ones = [0.0f64; 1];
    for &b in blocks {
        let start = b as usize * BLOCK;
        exp_block_sums(&src[start..(start + BLOCK).min(src.len())], div, sub, &mut ones);
        out[b as usize] = ones[0];
    }
    0.0
}

/// The most by which a [`cheap_block_sums_at`] weight exceeds the one it bounds, apart from
/// rounding: `max (1 + f) / 2^f` over `f` in `[0, 1)` (at `f = 1 / ln 2 - 1`),
/// 1.0614756908…, rounded up.
pub const CHEAP_SPREAD: f64 = 1.061_476;

/// Per listed block, the f32 sum of a **cheap upper bound** of every weight
/// `w_i = exp(src[i] / div - sub)`: with `y` the weight's base-2 exponent, `L(y) =
/// 2^floor(y)·(1 + frac(y))`, the chord of `2^y` between neighbouring integers (Schraudolph's
/// approximation). Its f32 bits are simply `(y + 127)·2^23` as an integer, one multiply-add
/// and one conversion per weight, so it costs a few operations per 8 weights where an
/// accurate `exp` costs a dozen. `2^y <= L(y) <= CHEAP_SPREAD·2^y`.
///
/// Returns `rho`, `None` where the kernel does not apply (`|sub| > 8192` or a scale that is
/// not a normal f32): for each listed block `b` (entries of the other blocks are left as they
/// are), the sum of llama.cpp's weights `expf(fl(fl(src[i] / div) - sub))` over it (or of
/// the f64 `exp` of the same arguments) lies within
/// `[out[b] / (CHEAP_SPREAD·(1 + rho)) - a, out[b]·(1 + rho) + a]`, `a` = `2^-125` per entry
/// (weights near and below the smallest normal f32). `rho` covers the roundings of the
/// multiply-add in the bits domain (`2^-24` of its inputs' magnitudes), of llama.cpp's
/// argument, of `expf`, and of the f32 sums; `cheap_rho` in the source itemises them. Every `src[i] / div - sub`
/// must be `<= 0` or `-inf`.
pub fn cheap_block_sums_at(src: &[f32], div: f32, sub: f32, blocks: &[u32], out: &mut [f32]) -> Option<f64> {
    assert_eq!(out.len(), src.len().div_ceil(BLOCK), "cheap_block_sums_at: wrong output length");
    let (a, b) = cheap_coefficients(div, sub)?;
    #[cfg(target_arch = "x86_64")]
    if caps().isa == Isa::Avx2 {
        // SAFETY: `Isa::Avx2` is only reported when AVX2, FMA, BMI1 and POPCNT were detected at runtime,
        // `avx512` only beside it when AVX-512F was too.
        unsafe {
            if caps().avx512 {
                avx512::cheap_block_sums_at(src, a, b, blocks, out);
            } else {
                avx2::cheap_block_sums_at(src, a, b, blocks, out);
            }
        }
        return Some(cheap_rho(sub));
    }
    portable::cheap_block_sums_at(src, a, b, blocks, out);
    Some(cheap_rho(sub))
}

/// The bits-domain coefficients of [`cheap_block_sums_at`]: `T = x·a + b` is `(y + 127)·2^23`
/// for `y = (x / div - sub)·log2 e`, each rounded once to f32 from f64. `None` outside the
/// kernel's range.
fn cheap_coefficients(div: f32, sub: f32) -> Option<(f32, f32)> {
    let scale = std::f64::consts::LOG2_E / div as f64;
    let a = (scale * 8_388_608.0) as f32;
    let b = ((127.0 - sub as f64 * std::f64::consts::LOG2_E) * 8_388_608.0) as f32;
    ((scale as f32).is_normal() && a.is_finite() && sub.abs() <= 8192.0).then_some((a, b))
}

/// [`cheap_block_sums_at`]'s relative rounding bound for `sub`. In units of `2^-23` of a
/// weight (the slope of `L` in the bits domain is at most `L·2^-23` per unit):
/// * `T = x·a + b` where `L > 0`, i.e. `0 < T <~ 2^30`: `a`'s, the product's (without a
///   fused multiply-add), `b`'s and the sum's roundings are each `2^-24` of a magnitude at
///   most `|T| + |b|`, so `<= 2^-24·(3·2^30 + 3|b|)` with `|b| <= (127 + log2 e·|sub|)·2^23`:
///   at most `383 + 2.2|sub|`, plus 1 for the conversion to an integer;
/// * llama.cpp's argument `fl(fl(x / div) - sub)` against the exact `x / div - sub`: two
///   roundings of magnitudes `|sub| + 88.1` and `88.1` (the argument is above `-88.1` where
///   `L > 0`), `0.5|sub| + 88.1`; `expf`'s own error, 1 (the f64 `exp` of that argument
///   needs none);
/// * the f32 sums of at most 64 positive terms in 8 lanes, 10 roundings: 5.
///
/// Under `480 + 2.7|sub|` in all; doubled for second-order terms and margin.
fn cheap_rho(sub: f32) -> f64 {
    (500.0 + 4.0 * sub.abs() as f64) * 2f64.powi(-22)
}

/// Whether the AVX2 (or NEON) kernel of [`exp_block_sums_approx`] runs (and its bound holds):
/// the bound is first order in the argument's rounding error, about `2^-24·|sub|` per weight,
/// so past |sub| = 2^13 (a tiny temperature) it would not hold, and the kernel's scale
/// `log2 e / div` must be a normal f32. Exact sums otherwise.
fn approx_kernel_applies(div: f32, sub: f32) -> bool {
    let scale = (std::f64::consts::LOG2_E / div as f64) as f32;
    matches!(caps().isa, Isa::Avx2 | Isa::Neon) && sub.abs() <= 8192.0 && scale.is_normal()
}

/// Coefficients of `2^f` on `[-0.5, 0.5]` for the approximate kernels' `2^y` (AVX2's
/// `exp2_approx`, and the same operations on AVX-512 and NEON): degree 5, fitted at the
/// Chebyshev nodes; relative error 1.0e-7 in exact arithmetic, under [`APPROX_POLY_REL_ERROR`]
/// evaluated in f32 by Estrin's scheme. The linear one rounds to ln 2's f32.
#[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
const EXP2_POLY: [f32; 6] =
    [1.000_000_1, std::f32::consts::LN_2, 0.240_221_08, 0.055_503_57, 0.009_676_032, 0.001_339_086_3];

/// Relative error of the approximate `2^y` against `2^y` for `y >= APPROX_Y_MIN` (the `2^f`
/// polynomial evaluated in f32 with fused multiply-adds, by Estrin's scheme; the scaling by
/// `2^n` is exact).
/// Checked by a dense sweep in the tests.
#[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
const APPROX_POLY_REL_ERROR: f64 = 1.0 / (1u64 << 21) as f64;

/// The approximate `2^y` clamps its argument to this; below it the result and `2^y` are both
/// under `2^-99`.
#[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
const APPROX_Y_MIN: f32 = -100.0;

/// The error bound of [`exp_block_sums_approx`] from its totals: `total` = Σ of the
/// approximate weights (whole blocks), `weighted` = Σ `-w·y`, over `n` entries.
#[cfg(any(target_arch = "x86_64", all(target_arch = "aarch64", target_feature = "neon")))]
fn approx_sums_error(total: f64, weighted: f64, sub: f32, n: usize) -> f64 {
    let u = 1.0 / (1u64 << 24) as f64; // f32 unit roundoff
    let ln2 = std::f64::consts::LN_2;
    // Relative, per weight: the polynomial; `expf`'s rounding of the exact weight (under one
    // ulp); 7 roundings of the 8-term f32 lane sums; and the argument. With `M = sub` and `y`
    // the base-2 argument, llama.cpp's `x` and our `y / log2 e` each carry at most the
    // roundings of `l / t`, `M` and the result: `|y - x·log2 e| <= u·(3·log2 e·|M| + 4·|y|)`,
    // a relative weight error of ln 2 times that. `weighted` has `-w·y` for the rare `y > 0`
    // (a rounding above the maximum: `y <= u·5·|M|`), which the `|M|` term covers by using 6
    // instead of 3·log2 e = 4.33.
    let arg_y = ln2 * u * 4.0 * weighted;
    // 1.001: second-order terms, and the sums being of approximate rather than exact weights.
    // Clamped arguments (below 2^-99 on both sides): an absolute 2^-99 each.
    total * approx_rel_error(sub) + 1.001 * arg_y + n as f64 * (-99.0f64).exp2()
}

/// The part of [`approx_sums_error`] proportional to the sum, per unit of it: the polynomial,
/// `expf`'s rounding, the lane sums and the argument's `|sub|` term (see there), with the
/// 1.001 for second-order terms.
fn approx_rel_error(sub: f32) -> f64 {
    let u = 1.0 / (1u64 << 24) as f64;
    let per_weight = APPROX_POLY_REL_ERROR + 2.0 * u + 7.0 * u + std::f64::consts::LN_2 * u * 6.0 * sub.abs() as f64;
    1.001 * per_weight
}

/// The bound `err` that [`exp_block_sums_approx`] returned for the sums `sums` of a row of
/// `len` entries at `sub`, split as `(rel, fixed)`: for every run of whole blocks whose sums add up
/// to `m`, the approximate and exact sums of the run differ by at most `rel·m + fixed`. (The
/// kernels' bound is a sum over the weights of a part proportional to each weight and a part
/// that is not; any run holds at most all of the latter.) `(0, 0)` where the sums were exact
/// (`err = 0`).
pub(crate) fn approx_error_split(err: f64, sub: f32, sums: &[f64], len: usize) -> (f64, f64) {
    if err == 0.0 {
        return (0.0, 0.0);
    }
    // The kernels sum a last, partial block exactly, outside the total their bound is of.
    let whole = if len.is_multiple_of(BLOCK) { sums } else { &sums[..sums.len().saturating_sub(1)] };
    let total: f64 = whole.iter().sum();
    let rel = approx_rel_error(sub);
    // `total` may differ from the kernel's own by the f64 roundings of the additions (far
    // below 2^-30 of it): the rest of `err` is the fixed part, or at most it. The kernels'
    // `weighted` also holds the rare negative `-w·y` of `y > 0` (at most `u·5·|sub|·w` each,
    // `u = 2^-24`), which a run without them does not subtract: `ln 2·u·4·1.001` times that
    // is under `total·u²·16·|sub|`.
    let u = 1.0 / (1u64 << 24) as f64;
    let fixed = err - rel * total * (1.0 - 2f64.powi(-30)) + total * u * u * 16.0 * (sub.abs() as f64 + 1.0);
    (rel, fixed.max(0.0))
}

/// The portable kernels: plain Rust, the reference the SIMD ones are held to.
pub mod portable {
    use super::BLOCK;
    use crate::candidates::TokenData;

    /// See [`super::moments`], over `value` of each item: 16 independent f32 lanes (which the
    /// compiler turns into vector operations), runs of [`super::MOMENT_RUN`] values each.
    /// `FUSED`: each square added by a fused multiply-add (for targets that have one).
    #[inline(always)]
    pub(crate) fn moments<T, const FUSED: bool>(items: &[T], value: impl Fn(&T) -> f32) -> (usize, f32, f64, f64) {
        const LANES: usize = 16;
        let (mut sum, mut sq) = ([0.0f64; LANES], [0.0f64; LANES]);
        let mut count = [0u32; LANES];
        let mut max = [f32::NEG_INFINITY; LANES];
        for run in items.chunks(LANES * super::MOMENT_RUN) {
            let (mut s, mut q) = ([0.0f32; LANES], [0.0f32; LANES]);
            let (chunks, tail) = run.as_chunks::<LANES>();
            let mut add = |j: usize, x: f32| {
                let kept = x != f32::NEG_INFINITY;
                let y = if kept { x } else { 0.0 };
                s[j] += y;
                q[j] = if FUSED { y.mul_add(y, q[j]) } else { q[j] + y * y };
                count[j] += u32::from(kept);
                max[j] = if x > max[j] { x } else { max[j] };
            };
            for c in chunks {
                for (j, t) in c.iter().enumerate() {
                    add(j, value(t));
                }
            }
            for (j, t) in tail.iter().enumerate() {
                add(j, value(t));
            }
            for j in 0..LANES {
                sum[j] += s[j] as f64;
                sq[j] += q[j] as f64;
            }
        }
        let count = count.iter().map(|&n| n as usize).sum();
        let max = max.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        (count, max, sum.iter().sum(), sq.iter().sum())
    }

    /// See [`super::max`]. Written as 32 independent lanes (fixed-size arrays), which the
    /// compiler turns into vector compares and selects on any target with SIMD in its base
    /// ISA (SSE2, NEON, ...): a plain `fold` is one dependency chain, about 14 times slower
    /// (70 against 5 µs at V = 128,256 on an x86-64 with SSE2 code).
    pub fn max(row: &[f32]) -> f32 {
        extreme::<true>(row)
    }

    /// See [`super::min`]: [`max`]'s lanes with the comparison turned.
    #[inline(always)]
    pub fn min(row: &[f32]) -> f32 {
        extreme::<false>(row)
    }

    /// The largest (`MAX`) or the smallest value of `row`, from 32 lanes (see [`max`]).
    #[inline(always)]
    fn extreme<const MAX: bool>(row: &[f32]) -> f32 {
        const LANES: usize = 32;
        let beats = |x: f32, m: f32| if MAX { x > m } else { x < m };
        let start = if MAX { f32::NEG_INFINITY } else { f32::INFINITY };
        let mut m = [start; LANES];
        let (chunks, tail) = row.as_chunks::<LANES>();
        for c in chunks {
            for j in 0..LANES {
                m[j] = if beats(c[j], m[j]) { c[j] } else { m[j] };
            }
        }
        m.iter().chain(tail).fold(start, |m, &x| if beats(x, m) { x } else { m })
    }

    /// See [`super::cheap_block_sums_at`]; `a`, `b` its bits-domain coefficients. The lane
    /// structure (8 lanes of 8 terms, then pairwise) is the AVX2 kernel's.
    pub fn cheap_block_sums_at(src: &[f32], a: f32, b: f32, blocks: &[u32], out: &mut [f32]) {
        for &id in blocks {
            let start = id as usize * BLOCK;
            let block = &src[start..(start + BLOCK).min(src.len())];
            let mut lanes = [0.0f32; 8];
            for c in block.chunks(8) {
                for (l, &x) in lanes.iter_mut().zip(c) {
                    *l += cheap_weight(x, a, b);
                }
            }
            let [l0, l1, l2, l3, l4, l5, l6, l7] = lanes;
            out[id as usize] = ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7));
        }
    }

    /// `L(y)` of [`super::cheap_block_sums_at`]: the bits `T = x·a + b`, clamped at 0 (weights
    /// below `2^-127`, `-inf` and NaN give `+0`), truncated to an integer.
    #[inline]
    pub fn cheap_weight(x: f32, a: f32, b: f32) -> f32 {
        f32::from_bits((x * a + b).max(0.0) as u32)
    }

    /// See [`super::summarize`].
    pub fn summarize(row: &[f32], block_max: &mut Vec<f32>) -> super::Summary {
        scan(row, |m| block_max.push(m))
    }

    /// See [`super::locate_max`].
    pub fn locate_max(row: &[f32]) -> super::Summary {
        scan(row, |_| {})
    }

    /// The summary, handing each block's maximum to `each_block` in order.
    fn scan(row: &[f32], mut each_block: impl FnMut(f32)) -> super::Summary {
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
            each_block(m);
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

    /// See [`super::for_each_ge`].
    pub fn for_each_ge(block: &[f32], threshold: f32, mut f: impl FnMut(usize, f32)) {
        for (i, &x) in block.iter().enumerate() {
            if x >= threshold {
                f(i, x);
            }
        }
    }

    /// See [`super::gather_ge`].
    pub fn gather_ge(block: &[f32], base: u32, threshold: f32, out: &mut Vec<TokenData>) {
        for (i, &x) in block.iter().enumerate() {
            if x >= threshold {
                out.push(TokenData { id: base + i as u32, logit: x, p: 0.0 });
            }
        }
    }

    /// See [`super::gather_blocks_ge`].
    pub fn gather_blocks_ge(row: &[f32], block_max: &[f32], threshold: f32, out: &mut Vec<TokenData>) {
        for (b, (&bm, block)) in block_max.iter().zip(row.chunks(BLOCK)).enumerate() {
            if bm >= threshold {
                gather_ge(block, (b * BLOCK) as u32, threshold, out);
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
    pub fn exp_sum_sequential(start: f32, row: &[f32], sub: f32, block_max: &[f32], patches: &[(u32, f32)]) -> f32 {
        super::sequential_blocks(start, row, sub, block_max, patches, |mut sum, block, threshold| {
            for &x in block {
                if x >= threshold {
                    sum += (x - sub).exp();
                }
            }
            sum
        })
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
// Off x86-64 the lists of kernels under test do not grow and the AVX probes go unused.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut, dead_code))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn widening_is_exact_for_every_half_precision_bit_pattern() {
        // All 65,536 patterns (infinities, subnormals, signed zeros) at once, then every
        // length around the 8-lane width; NaN compared by NaN-ness (payloads are not kept).
        let all: Vec<u16> = (0..=u16::MAX).collect();
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        let h: Vec<half::f16> = all.iter().map(|&b| half::f16::from_bits(b)).collect();
        let bf: Vec<half::bf16> = all.iter().map(|&b| half::bf16::from_bits(b)).collect();
        let mut out = Vec::new();
        for n in (0..=33).chain([65_536]) {
            widen_f16(&h[..n], &mut out);
            assert_eq!(out.len(), n);
            assert!(h[..n].iter().zip(&out).all(|(x, &y)| same(x.to_f32(), y)), "f16, n = {n}");
            widen_bf16(&bf[..n], &mut out);
            assert!(bf[..n].iter().zip(&out).all(|(x, &y)| same(x.to_f32(), y)), "bf16, n = {n}");
        }
    }

    /// Rows with the values that break SIMD code: -inf, ties (±0 too), huge magnitudes,
    /// lengths around the lane width, the block size and a group of eight blocks.
    fn row() -> impl Strategy<Value = Vec<f32>> {
        let value = prop_oneof![
            6 => -30.0f32..30.0,
            2 => proptest::sample::select(vec![0.0f32, -0.0, 1.0, -1.0, 3.5]),
            1 => Just(f32::NEG_INFINITY),
            1 => proptest::sample::select(vec![f32::MAX, -f32::MAX, 1e30, -1e30, f32::MIN_POSITIVE]),
        ];
        prop_oneof![1..=20usize, 60..=140usize, 1..=700usize, 500..=1600usize]
            .prop_flat_map(move |n| proptest::collection::vec(value.clone(), n))
    }

    /// Rows where most weights are within a factor e^3 of the largest (everything matters to
    /// the sum), drawn from a handful of values so that equal weights and ties recur.
    fn dense_row() -> impl Strategy<Value = Vec<f32>> {
        let value = prop_oneof![
            4 => proptest::sample::select(vec![0.0f32, -0.5, -std::f32::consts::LN_2, -1.0, -1e-6, -2.0]),
            4 => -3.0f32..0.0,
            1 => -40.0f32..0.0,
        ];
        prop_oneof![1..=130usize, 1..=3000usize].prop_flat_map(move |n| proptest::collection::vec(value.clone(), n))
    }

    /// [`long_row`]s scaled down to 10–26 below one entry 0 (anywhere): a sum that is in its
    /// last binade from the maximum on, as on language-model rows.
    fn peaked_long_row() -> impl Strategy<Value = Vec<f32>> {
        (long_row(), any::<prop::sample::Index>()).prop_map(|(r, at)| {
            let mut r: Vec<f32> = r.iter().map(|x| x * 2.0 - 10.0).collect();
            let i = at.index(r.len());
            r[i] = 0.0;
            r
        })
    }

    /// Rows of several chunks of a `Collector` (most entries within reach of the maximum),
    /// with values that recur (ties, and lanes holding two entries of a block).
    fn long_row() -> impl Strategy<Value = Vec<f32>> {
        let value = prop_oneof![
            4 => -8.0f32..0.0,
            2 => proptest::sample::select(vec![0.0f32, -0.5, -1.0, -3.0]),
            1 => -40.0f32..-20.0,
        ];
        (2000..=12_000usize).prop_flat_map(move |n| proptest::collection::vec(value.clone(), n))
    }

    /// Rows for [`locate_max`]: every length up to 200 and around 5000, values from a few
    /// (ties, `-0.0` against `0.0`, `-inf`) or a range.
    fn locate_row() -> impl Strategy<Value = Vec<f32>> {
        let value = prop_oneof![
            3 => proptest::sample::select(vec![0.0f32, -0.0, -1.0, 2.5, f32::NEG_INFINITY]),
            2 => -30.0f32..30.0,
        ];
        let few = proptest::sample::select(vec![0.0f32, -0.0, f32::NEG_INFINITY]);
        prop_oneof![1..=200usize, 4900..=5100usize].prop_flat_map(move |n| {
            prop_oneof![proptest::collection::vec(value.clone(), n), proptest::collection::vec(few.clone(), n)]
        })
    }

    /// A NaN with the payload and sign of `bits` (never `±inf`).
    fn nan_from(bits: u32) -> f32 {
        let payload = (bits & 0x007f_ffff).max(1);
        let x = f32::from_bits((bits & 0x8000_0000) | 0x7f80_0000 | payload);
        assert!(x.is_nan());
        x
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

    fn avx512vl_available() -> bool {
        #[cfg(target_arch = "x86_64")]
        return avx2_available()
            && std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512vl");
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    type SummarizeKernel = fn(&[f32], &mut Vec<f32>) -> Summary;

    /// Every [`summarize`] kernel this CPU runs, by name.
    fn summarize_kernels() -> Vec<(&'static str, SummarizeKernel)> {
        let mut kernels: Vec<(&'static str, SummarizeKernel)> =
            vec![("portable", portable::summarize), ("dispatched", summarize)];
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        // SAFETY: the module exists only where the target enables NEON.
        kernels.push(("neon", |r, bm| unsafe { neon::summarize(r, bm) }));
        #[cfg(target_arch = "x86_64")]
        if avx2_available() {
            // SAFETY: AVX2, FMA, BMI1 and POPCNT were detected just above.
            kernels.push(("avx2", |r, bm| unsafe { avx2::summarize(r, bm) }));
            if avx512_available() {
                // SAFETY: AVX-512F was detected too.
                kernels.push(("avx512", |r, bm| unsafe { avx512::summarize(r, bm) }));
            }
        }
        kernels
    }

    type LocateKernel = fn(&[f32]) -> Summary;

    /// Every [`locate_max`] kernel this CPU runs, by name.
    fn locate_max_kernels() -> Vec<(&'static str, LocateKernel)> {
        let mut kernels: Vec<(&'static str, LocateKernel)> =
            vec![("portable", portable::locate_max), ("dispatched", locate_max)];
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        // SAFETY: as above.
        kernels.push(("neon", |r| unsafe { neon::locate_max(r) }));
        #[cfg(target_arch = "x86_64")]
        if avx2_available() {
            // SAFETY: AVX2, FMA, BMI1 and POPCNT were detected just above.
            kernels.push(("avx2", |r| unsafe { avx2::locate_max(r) }));
            if avx512_available() {
                // SAFETY: AVX-512F was detected too.
                kernels.push(("avx512", |r| unsafe { avx512::locate_max(r) }));
            }
        }
        kernels
    }

    /// The maxima of the [`BLOCK`]s of `r`, computed plainly.
    fn want_bm(r: &[f32]) -> Vec<f32> {
        r.chunks(BLOCK).map(|b| b.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x))).collect()
    }

    /// One instruction set's whole-row kernels (each with [`row`]'s contract), for
    /// `kernels_agree_with_the_naive_scans`.
    struct RowKernels {
        name: &'static str,
        max: fn(&[f32]) -> f32,
        min: fn(&[f32]) -> f32,
        argmax: fn(&[f32]) -> Option<usize>,
        summarize: SummarizeKernel,
        block_max_into: fn(&[f32], &mut [f32]) -> f32,
        count_ge: fn(&[f32], f32) -> usize,
        gather_ge: fn(&[f32], u32, f32, &mut Vec<TokenData>),
        gather_blocks_ge: fn(&[f32], &[f32], f32, &mut Vec<TokenData>),
        for_each_ge: ForEachKernel,
    }

    type ForEachKernel = fn(&[f32], f32, &mut dyn FnMut(usize, f32));

    /// The portable kernels, the dispatched ones, and every SIMD set this CPU runs.
    fn row_kernels() -> Vec<RowKernels> {
        let mut kernels = vec![
            RowKernels {
                name: "portable",
                max: portable::max,
                min: portable::min,
                argmax: portable::argmax,
                summarize: portable::summarize,
                block_max_into: portable::block_max_into,
                count_ge: portable::count_ge,
                gather_ge: portable::gather_ge,
                gather_blocks_ge: portable::gather_blocks_ge,
                for_each_ge: |b, t, f| portable::for_each_ge(b, t, f),
            },
            RowKernels {
                name: "dispatched",
                max,
                min,
                argmax,
                summarize,
                block_max_into,
                count_ge,
                gather_ge,
                gather_blocks_ge,
                for_each_ge: |b, t, f| for_each_ge(b, t, f),
            },
        ];
        #[cfg(target_arch = "x86_64")]
        if avx2_available() {
            // SAFETY (every closure): AVX2, FMA, BMI1 and POPCNT were detected just above.
            kernels.push(RowKernels {
                name: "avx2",
                max: |r| unsafe { avx2::max(r) },
                min: |r| unsafe { avx2::min(r) },
                argmax: |r| unsafe { avx2::argmax(r) },
                summarize: |r, bm| unsafe { avx2::summarize(r, bm) },
                block_max_into: |r, o| unsafe { avx2::block_max_into(r, o) },
                count_ge: |r, t| unsafe { avx2::count_ge(r, t) },
                gather_ge: |b, base, t, o| unsafe { avx2::gather_ge(b, base, t, o) },
                gather_blocks_ge: |r, bm, t, o| unsafe { avx2::gather_blocks_ge(r, bm, t, o) },
                for_each_ge: |b, t, f| unsafe { avx2::for_each_ge(b, t, f) },
            });
        }
        #[cfg(target_arch = "x86_64")]
        if avx512_available() {
            // What the dispatch runs on an AVX-512 CPU: AVX-512's kernels where it has its
            // own, AVX2's for the rest.
            // SAFETY (every closure): AVX-512F, AVX2, FMA, BMI1 and POPCNT were detected just
            // above.
            kernels.push(RowKernels {
                name: "avx512",
                max: |r| unsafe { avx512::max(r) },
                min: |r| unsafe { avx2::min(r) },
                argmax: |r| unsafe { avx2::argmax(r) },
                summarize: |r, bm| unsafe { avx512::summarize(r, bm) },
                block_max_into: |r, o| unsafe { avx512::block_max_into(r, o) },
                count_ge: |r, t| unsafe { avx2::count_ge(r, t) },
                gather_ge: |b, base, t, o| unsafe { avx2::gather_ge(b, base, t, o) },
                gather_blocks_ge: |r, bm, t, o| unsafe { avx512::gather_blocks_ge(r, bm, t, o) },
                for_each_ge: |b, t, f| unsafe { avx2::for_each_ge(b, t, f) },
            });
        }
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        // SAFETY (every closure): the module exists only where the target enables NEON.
        kernels.push(RowKernels {
            name: "neon",
            max: |r| unsafe { neon::max(r) },
            min: portable::min,
            argmax: |r| unsafe { neon::argmax(r) },
            summarize: |r, bm| unsafe { neon::summarize(r, bm) },
            block_max_into: |r, o| unsafe { neon::block_max_into(r, o) },
            count_ge: |r, t| unsafe { neon::count_ge(r, t) },
            gather_ge: |b, base, t, o| unsafe { neon::gather_ge(b, base, t, o) },
            gather_blocks_ge: |r, bm, t, o| unsafe { neon::gather_blocks_ge(r, bm, t, o) },
            for_each_ge: |b, t, f| unsafe { neon::for_each_ge(b, t, f) },
        });
        kernels
    }

    fn config() -> ProptestConfig {
        ProptestConfig { cases: 400, rng_seed: proptest::test_runner::RngSeed::Fixed(17), ..ProptestConfig::default() }
    }

    fn avx2_available() -> bool {
        #[cfg(target_arch = "x86_64")]
        return super::avx2_detected();
        #[allow(unreachable_code)]
        false
    }

    fn avx512_available() -> bool {
        #[cfg(target_arch = "x86_64")]
        return avx2_available() && std::is_x86_feature_detected!("avx512f");
        #[allow(unreachable_code)]
        false
    }

    /// [`rounded_increments`] (the AVX2 kernel where detected) and its portable loop against
    /// the obvious rounding in f64 and totals in u128: random weights and weights on a grid
    /// (ties for the coarser scales), sums in several binades, lengths around the lane width
    /// and past a part of 4,096, a weight of NaN and increments of 2^52 and more.
    #[test]
    fn rounded_increments_are_the_obvious_roundings() {
        use tokensieve_testkit::generate::SplitMix64;
        fn obvious(ws: &[f32], sum: f32, scale_cum: f64, scale_run: f64) -> Option<(u64, u64)> {
            let (mut a, mut b) = (0u128, 0u128);
            for &w in ws {
                let (t, tw) = ((w / sum) as f64 * scale_cum, w as f64 * scale_run);
                if !(t < 2f64.powi(52) && tw < 2f64.powi(52)) || t.fract() == 0.5 || tw.fract() == 0.5 {
                    return None;
                }
                a += t.round_ties_even() as u128;
                b += tw.round_ties_even() as u128;
            }
            Some((u64::try_from(a).ok()?, u64::try_from(b).ok()?))
        }
        let mut rng = SplitMix64::new(11);
        let (mut given, mut refused) = (0, 0);
        for case in 0..3_000 {
            let n = if case % 100 == 0 { 5_000 } else { rng.below(70) };
            let grid = case % 3 == 0;
            let mut ws: Vec<f32> = (0..n)
                .map(|_| {
                    let w = (rng.next_f64() * rng.next_f64()) as f32;
                    if grid {
                        (w * 64.0).round() / 64.0
                    } else {
                        w
                    }
                })
                .collect();
            if case % 97 == 1 && n > 0 {
                ws[n / 2] = f32::NAN;
            }
            let sum = [1.0f32, 3.0, 1e3 + rng.next_f64() as f32, 37.5][rng.below(4)];
            let scale_cum = 2f64.powi(rng.below(60) as i32);
            let scale_run = 2f64.powi(rng.below(60) as i32);
            let want = obvious(&ws, sum, scale_cum, scale_run);
            assert_eq!(rounded_increments(&ws, sum, scale_cum, scale_run), want, "case {case}");
            assert_eq!(rounded_increments_with(&ws, sum, scale_cum, scale_run), want, "case {case}");
            if want.is_some() {
                given += 1;
            } else {
                refused += 1;
            }
        }
        assert!(given > 1_000 && refused > 300, "{given} given, {refused} refused");
    }

    /// [`max_except`] as the obvious filtered maximum, at every block length up to 64, with no
    /// entry, every entry, one and random entries left out.
    #[test]
    fn max_except_leaves_out_the_skipped_entries() {
        use tokensieve_testkit::generate::SplitMix64;
        let mut rng = SplitMix64::new(5);
        for n in 0..=64usize {
            for _ in 0..20 {
                // Few distinct values, so that the maximum often has equals.
                let block: Vec<f32> = (0..n).map(|_| (rng.next_u64() % 7) as f32 - 3.0).collect();
                let skip = match rng.next_u64() % 4 {
                    0 => 0,
                    1 => u64::MAX,
                    2 => 1 << (rng.next_u64() % 64),
                    _ => rng.next_u64(),
                };
                let want = (0..n).filter(|&i| skip >> i & 1 == 0).map(|i| block[i]).fold(f32::NEG_INFINITY, f32::max);
                assert_eq!(max_except(&block, skip), want, "n = {n}, skip = {skip:#x}");
            }
        }
    }

    /// [`position_eq`] as the obvious search, `-0.0` matching `0.0` and NaN nothing, at every
    /// position of rows around the lane width.
    #[test]
    fn position_eq_finds_the_first_equal_value() {
        for n in 0..40usize {
            let row: Vec<f32> = (0..n).map(|i| [1.5f32, -0.0, f32::NAN, 2.0][i % 4] + (i / 4) as f32).collect();
            for x in [1.5f32, 0.0, -0.0, f32::NAN, 2.0, 3.0, 11.5, 99.0] {
                assert_eq!(position_eq(&row, x), row.iter().position(|&v| v == x), "n = {n}, x = {x}");
            }
        }
    }

    /// [`positions_in_range`] as the obvious filter, appended after what `out` held: lengths
    /// around the 32 bytes a compare takes, every range (empty ones too) over values that
    /// reach both ends of a byte.
    #[test]
    fn positions_in_range_are_the_obvious_filter() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for len in (0..70).chain([127, 128, 129, 500, 1000]) {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    [0u8, 1, 21, 22, 23, 127, 128, 200, 254, 255][(state >> 60) as usize % 10]
                })
                .collect();
            for (lo, hi) in
                [(0u8, 0u8), (0, 1), (0, 22), (21, 23), (22, 22), (23, 21), (0, 255), (127, 129), (200, 255), (1, 254)]
            {
                let want: Vec<u32> =
                    [7].into_iter().chain((0..len as u32).filter(|&i| (lo..hi).contains(&bytes[i as usize]))).collect();
                let mut got = vec![7u32];
                positions_in_range(&bytes, lo, hi, &mut got);
                assert_eq!(got, want, "len {len}, range {lo}..{hi}");
            }
        }
    }

    /// [`rungs`] (the AVX2 kernel where detected) gives its portable loop's bytes: block maxima
    /// of every magnitude and sign, `-inf` and the row's maximum itself, at lengths around the
    /// lane width.
    #[test]
    fn rungs_are_the_portable_loop_s() {
        let mut state = 0x6a09_e667_f3bc_c908u64;
        for len in (0..40).chain([500, 2004]) {
            let maxima: Vec<f32> = (0..len)
                .map(|i| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let x = ((state >> 40) as f32 / (1u64 << 24) as f32) * 80.0 - 70.0;
                    match i % 7 {
                        0 => f32::NEG_INFINITY,
                        1 => 10.0,
                        2 => x * 1e6,
                        _ => x,
                    }
                })
                .collect();
            for (t, max) in [(0.8f32, 10.0f32), (1.0, 10.0), (0.05, 1e6), (3.0, -5.0)] {
                let (s2, m2) = (2.0 / t, 2.0 * max);
                let (mut got, mut want) = (vec![0u8; len], vec![0u8; len]);
                rungs(&maxima, s2, m2, 127.0, &mut got);
                rungs_with(&maxima, s2, m2, 127.0, &mut want);
                assert_eq!(got, want, "len {len}, t {t}, max {max}");
                assert!(got.iter().all(|&k| k <= 127));
            }
        }
    }

    /// [`sort_keys`] is `sort_unstable`, for every length around the counting sort's range
    /// (16 to 64 keys), distinct keys and keys with repeats (which the counting sort must
    /// refuse, leaving them to `sort_unstable`), in random, ascending and descending order.
    #[test]
    fn sort_keys_is_sort_unstable() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            state >> 11
        };
        for len in 0..=80usize {
            for trial in 0..40 {
                let keys: Vec<u64> = match trial % 4 {
                    // Distinct: the low half is the position, as the callers' keys.
                    0 => (0..len as u64).map(|i| (next() << 32) | i).collect(),
                    // Whole-range values (distinct but for a rare collision).
                    1 => (0..len).map(|_| next() ^ (next() << 53)).collect(),
                    // Few values: repeats.
                    2 => (0..len).map(|_| next() % 5).collect(),
                    // Extremes and one repeat.
                    _ => (0..len as u64).map(|i| if i == 1 { 0 } else { u64::MAX - i }).collect(),
                };
                for keys in [
                    keys.clone(),
                    {
                        let mut k = keys.clone();
                        k.sort_unstable();
                        k
                    },
                    {
                        let mut k = keys;
                        k.sort_unstable_by(|a, b| b.cmp(a));
                        k
                    },
                ] {
                    let mut want = keys.clone();
                    want.sort_unstable();
                    let mut got = keys.clone();
                    sort_keys(&mut got);
                    assert_eq!(got, want, "len {len}, trial {trial}");
                    #[cfg(target_arch = "x86_64")]
                    if avx512_available() {
                        let mut direct = keys.clone();
                        // SAFETY: AVX-512F, AVX2, FMA, BMI1 and POPCNT were detected.
                        let sorted = unsafe { avx512::sort_keys_by_rank(&mut direct) };
                        let distinct = want.windows(2).all(|w| w[0] < w[1]);
                        assert_eq!(sorted, distinct && (16..=64).contains(&len), "len {len}, trial {trial}");
                        assert_eq!(&direct, if sorted { &want } else { &keys }, "len {len}, trial {trial}");
                    }
                }
            }
        }
    }

    /// [`gather_blocks_ge`] on rows of more blocks than a kernel lists at a time (AVX2 lists
    /// 512 block maxima, then gathers), ending on a part's edge, just past it and in a short
    /// block: the entries at or above each threshold, in id order, as the obvious filter.
    #[test]
    fn gather_blocks_ge_across_listed_parts() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for len in [512 * BLOCK - 1, 512 * BLOCK, 512 * BLOCK + 1, 1024 * BLOCK + 64, 3 * 512 * BLOCK + 100] {
            let row: Vec<f32> = (0..len)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((state >> 40) as f32 / (1u64 << 24) as f32) * 40.0 - 20.0
                })
                .collect();
            let bm = want_bm(&row);
            for thr in [19.99f32, 19.0, 10.0, -20.0, f32::NEG_INFINITY] {
                let want: Vec<TokenData> = row
                    .iter()
                    .enumerate()
                    .filter(|(_, &x)| x >= thr)
                    .map(|(i, &x)| TokenData { id: i as u32, logit: x, p: 0.0 })
                    .collect();
                for k in row_kernels() {
                    let mut got = Vec::new();
                    (k.gather_blocks_ge)(&row, &bm, thr, &mut got);
                    assert_eq!(got, want, "{} V={len} threshold {thr}", k.name);
                }
            }
        }
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn kernels_agree_with_the_naive_scans(r in row(), thr in -40.0f32..40.0) {
            let m = r.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            let least = r.iter().fold(f32::INFINITY, |m, &x| m.min(x));
            let first = naive_argmax(&r);
            let bm = want_bm(&r);
            // A threshold that some entries equal (`>=`, not `>`).
            let tie = r[r.len() / 2];
            let at_tie = r.iter().filter(|&&x| x >= tie).count();
            let want: Vec<(u32, f32)> = r.iter().enumerate().filter(|(_, &x)| x >= thr).map(|(i, &x)| (5 + i as u32, x)).collect();
            let gathered: Vec<TokenData> = want.iter().map(|&(id, logit)| TokenData { id, logit, p: 0.0 }).collect();
            // The same entries from the blocks that reach `thr` (ids from 0).
            let from_zero: Vec<TokenData> = gathered.iter().map(|t| TokenData { id: t.id - 5, ..*t }).collect();
            // `for_each_ge` takes one block at a time (the last one may be short).
            type Hits = Vec<(u32, f32)>;
            let hits = |f: &dyn Fn(&[f32], &mut Hits)| {
                let mut v = Vec::new();
                for (b, block) in r.chunks(BLOCK).enumerate() {
                    let from = v.len();
                    f(block, &mut v);
                    v[from..].iter_mut().for_each(|h: &mut (u32, f32)| h.0 += (5 + b * BLOCK) as u32);
                }
                v
            };
            for k in row_kernels() {
                let name = k.name;
                prop_assert!((k.max)(&r) == m, "{}", name);
                prop_assert!((k.min)(&r) == least, "{}", name);
                prop_assert_eq!((k.argmax)(&r), Some(first), "{}", name);
                let mut bm2 = Vec::new();
                let s = (k.summarize)(&r, &mut bm2);
                prop_assert!(!s.suspect, "{}", name);
                prop_assert!(s.max == m, "{}", name);
                prop_assert_eq!(s.max_block, first / BLOCK, "{}", name);
                prop_assert_eq!(&bm2, &bm, "{}", name);
                let mut bm3 = vec![0.0; bm.len()];
                prop_assert!((k.block_max_into)(&r, &mut bm3) == m, "{}", name);
                prop_assert_eq!(&bm3, &bm, "{}", name);
                prop_assert_eq!((k.count_ge)(&r, thr), want.len(), "{}", name);
                prop_assert_eq!((k.count_ge)(&r, tie), at_tie, "{}", name);
                let mut g = Vec::new();
                (k.gather_ge)(&r, 5, thr, &mut g);
                prop_assert_eq!(&g, &gathered, "{}", name);
                g.clear();
                (k.gather_ge)(&r, 5, tie, &mut g);
                prop_assert_eq!(g.len(), at_tie, "{}", name);
                g.clear();
                (k.gather_blocks_ge)(&r, &bm, thr, &mut g);
                prop_assert_eq!(&g, &from_zero, "{}", name);
                g.clear();
                // Every entry (`-inf` ones too), and none of a padded block's padding.
                (k.gather_blocks_ge)(&r, &bm, f32::NEG_INFINITY, &mut g);
                prop_assert_eq!(g.len(), r.len(), "{}", name);
                prop_assert_eq!(&hits(&|b, v| (k.for_each_ge)(b, thr, &mut |i, x| v.push((i as u32, x)))), &want, "{}", name);
            }
            if avx512vl_available() {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: AVX-512F, AVX-512VL, AVX2, FMA, BMI1 and POPCNT were detected just above.
                unsafe {
                    let mut bm4 = Vec::new();
                    let s4 = avx512::summarize(&r, &mut bm4);
                    // The mask compares see NaN exactly: no false alarm, however large the values.
                    prop_assert!(!s4.suspect);
                    prop_assert!(s4.max == m);
                    prop_assert_eq!(s4.max_block, first / BLOCK);
                    prop_assert_eq!(&bm4, &bm);
                }
            }
        }

        /// Widening and summarizing at once gives the two calls' row, block maxima and summary,
        /// for f16 and bf16 rows of every length class (tails off the 8-block groups), NaN and
        /// infinities included; on CPUs with AVX2 each SIMD kernel is checked too.
        #[test]
        fn widen_summarize_is_widen_then_summarize(r in prop_oneof![row(), locate_row()], special in any::<prop::sample::Index>(), which in 0..4u8) {
            let mut r = r;
            let i = special.index(r.len());
            r[i] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, r[i]][which as usize];
            let h: Vec<half::f16> = r.iter().map(|&x| half::f16::from_f32(x)).collect();
            let b: Vec<half::bf16> = r.iter().map(|&x| half::bf16::from_f32(x)).collect();
            let (mut want_row, mut want_bm) = (Vec::new(), Vec::new());
            let (mut got_row, mut got_bm) = (vec![1.0f32; 3], vec![2.0f32; 5]);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            // A block maximum of +0.0 and -0.0 is either: the max tree's order of a block's
            // entries depends on the row's alignment (`avx2::Realign`), and so does which zero
            // `max` keeps. Otherwise the bits.
            let key = |x: f32| if x == 0.0 { 0 } else { x.to_bits() };
            // With a NaN in the row the summary only flags it (`suspect`): which block maxima
            // and maximum a kernel's trees leave beside it is unspecified, and the 8-lane and
            // 16-lane kernels' trees differ. So a NaN row compares no maxima.
            let nan = which == 0;
            let maxima = |v: &[f32]| if nan { Vec::new() } else { v.iter().map(|&x| key(x)).collect::<Vec<_>>() };
            let summary = |s: Summary| if nan { (0, 0, s.suspect) } else { (key(s.max), s.max_block, s.suspect) };
            widen_f16(&h, &mut want_row);
            let want = summarize(&want_row, &mut want_bm);
            let got = widen_summarize_f16(&h, &mut got_row, &mut got_bm);
            prop_assert_eq!(bits(&got_row), bits(&want_row));
            prop_assert_eq!(maxima(&got_bm), maxima(&want_bm));
            prop_assert_eq!(summary(got), summary(want));
            widen_bf16(&b, &mut want_row);
            let want = summarize(&want_row, &mut want_bm);
            let got = widen_summarize_bf16(&b, &mut got_row, &mut got_bm);
            prop_assert_eq!(bits(&got_row), bits(&want_row));
            prop_assert_eq!(maxima(&got_bm), maxima(&want_bm));
            prop_assert_eq!(summary(got), summary(want));
            // Without the widened row: the same summary and block maxima where a kernel runs.
            for bf in [false, true] {
                let (got, want_row): (_, Vec<f32>) = if bf {
                    (summarize_bf16(&b, &mut got_bm), b.iter().map(|x| x.to_f32()).collect())
                } else {
                    (summarize_f16(&h, &mut got_bm), h.iter().map(|x| x.to_f32()).collect())
                };
                let want = summarize(&want_row, &mut want_bm);
                #[cfg(target_arch = "x86_64")]
                prop_assert_eq!(got.is_some(), if bf { isa() == Isa::Avx2 } else { caps().f16c });
                #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
                prop_assert_eq!(got.is_some(), isa() == Isa::Neon);
                if let Some(got) = got {
                    prop_assert_eq!(maxima(&got_bm), maxima(&want_bm));
                    prop_assert_eq!(summary(got), summary(want));
                }
            }
            #[cfg(target_arch = "x86_64")]
            if caps().f16c {
                let n = r.len();
                let (mut row2, mut bm2) = (vec![0.0f32; n], Vec::new());
                // SAFETY: `f16c` implies AVX2, FMA and F16C were detected; `row2` holds `n`.
                let s2 = unsafe { avx2::widen_summarize_f16(&h, Some(&mut row2), &mut bm2) };
                widen_f16(&h, &mut want_row);
                let want = summarize(&want_row, &mut want_bm);
                prop_assert_eq!(bits(&row2), bits(&want_row));
                prop_assert_eq!(maxima(&bm2), maxima(&want_bm));
                prop_assert_eq!(summary(s2), summary(want));
                // SAFETY: as above (AVX2, FMA, BMI1 and POPCNT).
                let s3 = unsafe { avx2::widen_summarize_bf16(&b, Some(&mut row2), &mut bm2) };
                widen_bf16(&b, &mut want_row);
                let want = summarize(&want_row, &mut want_bm);
                prop_assert_eq!(bits(&row2), bits(&want_row));
                prop_assert_eq!(maxima(&bm2), maxima(&want_bm));
                prop_assert_eq!(summary(s3), summary(want));
            }
            // The 16-lane summaries without the widened row (what the dispatch runs on
            // AVX-512 CPUs).
            #[cfg(target_arch = "x86_64")]
            if caps().avx512 {
                let mut bm2 = vec![7.0f32; 2];
                let want = summarize(&h.iter().map(|x| x.to_f32()).collect::<Vec<_>>(), &mut want_bm);
                // SAFETY: `avx512` implies AVX-512F, AVX2, FMA, BMI1 and POPCNT were detected.
                let s2 = unsafe { avx512::summarize_f16(&h, &mut bm2) };
                prop_assert_eq!(maxima(&bm2), maxima(&want_bm));
                prop_assert_eq!(summary(s2), summary(want));
                let want = summarize(&b.iter().map(|x| x.to_f32()).collect::<Vec<_>>(), &mut want_bm);
                // SAFETY: as above.
                let s3 = unsafe { avx512::summarize_bf16(&b, &mut bm2) };
                prop_assert_eq!(maxima(&bm2), maxima(&want_bm));
                prop_assert_eq!(summary(s3), summary(want));
            }
        }

        /// The whole-row kernels read a row that does not start on a 32-byte boundary by
        /// aligned loads (the first entries apart), and the collector one that does not start
        /// on a 64-byte boundary: at every offset from a 64-byte boundary, on rows long enough
        /// for those loads, the maximum, its first block, the block maxima and the argmax are
        /// the naive ones, a NaN or `+inf` anywhere is flagged, and the collected entries are
        /// those at or above the threshold.
        #[test]
        fn kernels_read_rows_at_every_alignment(
            r in proptest::collection::vec(-30.0f32..30.0, 1000..2700),
            bad in any::<prop::sample::Index>(),
            nan in any::<bool>(),
            pick in any::<prop::sample::Index>(),
        ) {
            let n = r.len();
            // A buffer with a 64-byte aligned start and room for 16 floats more.
            let mut buf = vec![0.0f32; n + 32];
            let skip = buf.as_ptr().align_offset(64);
            let bm = want_bm(&r);
            let (m, first) = (r.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)), naive_argmax(&r));
            let t = r[pick.index(n)];
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let mut want: Vec<f32> = r.iter().copied().filter(|&x| x >= t).collect();
            want.sort_by(f32::total_cmp);
            let want_gathered: Vec<TokenData> = r
                .iter()
                .enumerate()
                .filter(|(_, &x)| x >= t)
                .map(|(i, &x)| TokenData { id: i as u32, logit: x, p: 0.0 })
                .collect();
            let mut collector = Collector::default();
            for offset in 0..16 {
                let at = skip + offset;
                buf[at..at + n].copy_from_slice(&r);
                let row = &buf[at..at + n];
                if collector.start(&bm, t) {
                    let mut got = Vec::new();
                    loop {
                        let chunk = collector.next(row, t);
                        if chunk.is_empty() {
                            break;
                        }
                        got.extend(chunk.iter().copied().filter(|x| x.is_finite()));
                    }
                    got.sort_by(f32::total_cmp);
                    prop_assert_eq!(bits(&got), bits(&want), "collector at offset {}", offset);
                }
                for k in row_kernels() {
                    let name = k.name;
                    prop_assert!((k.max)(row) == m, "{} at offset {}", name, offset);
                    prop_assert_eq!((k.argmax)(row), Some(first), "{} at offset {}", name, offset);
                    let mut bm2 = Vec::new();
                    let s = (k.summarize)(row, &mut bm2);
                    prop_assert!(!s.suspect && s.max == m, "{} at offset {}", name, offset);
                    prop_assert_eq!(s.max_block, first / BLOCK, "{} at offset {}", name, offset);
                    prop_assert_eq!(&bm2, &bm, "{} at offset {}", name, offset);
                    let mut bm3 = vec![0.0; bm.len()];
                    prop_assert!((k.block_max_into)(row, &mut bm3) == m, "{} at offset {}", name, offset);
                    prop_assert_eq!(&bm3, &bm, "{} at offset {}", name, offset);
                    let mut g = Vec::new();
                    (k.gather_blocks_ge)(row, &bm, t, &mut g);
                    prop_assert_eq!(&g, &want_gathered, "{} at offset {}", name, offset);
                }
                for (name, kernel) in locate_max_kernels() {
                    let s = kernel(row);
                    prop_assert!(!s.suspect && s.max == m, "{} at offset {}", name, offset);
                    prop_assert_eq!(s.max_block, first / BLOCK, "{} at offset {}", name, offset);
                }
                // A bad value anywhere, and among the entries before the first boundary.
                for i in [at + bad.index(n), at + 1] {
                    let keep = buf[i];
                    buf[i] = if nan { f32::NAN } else { f32::INFINITY };
                    let row = &buf[at..at + n];
                    for (name, kernel) in summarize_kernels() {
                        prop_assert!(kernel(row, &mut Vec::new()).suspect, "{} at offset {}", name, offset);
                    }
                    for (name, kernel) in locate_max_kernels() {
                        prop_assert!(kernel(row).suspect, "{} at offset {}", name, offset);
                    }
                    buf[i] = keep;
                }
                // The maximum among those entries, and twice: in them and in a later block.
                for later in [None, Some(at + n - 1)] {
                    let keep = (buf[at + 1], buf[at + n - 1]);
                    buf[at + 1] = 31.0;
                    if let Some(j) = later {
                        buf[j] = 31.0;
                    }
                    let row = &buf[at..at + n];
                    for (name, kernel) in locate_max_kernels() {
                        let s = kernel(row);
                        prop_assert!(!s.suspect && s.max == 31.0 && s.max_block == 0, "{} at offset {}", name, offset);
                    }
                    (buf[at + 1], buf[at + n - 1]) = keep;
                }
            }
        }

        #[test]
        fn summarize_flags_nan_and_positive_infinity(mut r in row(), at in any::<prop::sample::Index>(), nan in any::<bool>()) {
            let i = at.index(r.len());
            r[i] = if nan { f32::NAN } else { f32::INFINITY };
            let mut bm = Vec::new();
            for (name, kernel) in summarize_kernels() {
                prop_assert!(kernel(&r, &mut bm).suspect, "{}", name);
            }
        }

        #[test]
        fn locate_max_is_summarize_without_the_block_maxima(r in prop_oneof![row(), locate_row()]) {
            let m = r.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            let first = naive_argmax(&r);
            let p = portable::locate_max(&r);
            prop_assert_eq!(p, portable::summarize(&r, &mut Vec::new()));
            prop_assert!(p.max == m);
            prop_assert_eq!(p.max_block, first / BLOCK);
            prop_assert!(!p.suspect);
            for (name, kernel) in locate_max_kernels() {
                let s = kernel(&r);
                // Only a `-0.0`/`0.0` tie leaves a choice of bits (either zero is the maximum).
                if m != 0.0 {
                    prop_assert_eq!(s.max.to_bits(), p.max.to_bits(), "{}", name);
                }
                prop_assert!(s.max == m, "{}", name);
                prop_assert_eq!(s.max_block, first / BLOCK, "{}", name);
                prop_assert!(!s.suspect, "{}", name);
            }
        }

        /// NaN of any payload and either sign, or `+inf`, anywhere, among `-inf` and ties.
        #[test]
        fn locate_max_flags_nan_and_positive_infinity(
            mut r in prop_oneof![row(), locate_row()],
            bad in proptest::collection::vec((any::<prop::sample::Index>(), any::<u32>(), any::<bool>()), 1..4),
        ) {
            for (at, bits, nan) in bad {
                let i = at.index(r.len());
                r[i] = if nan { nan_from(bits) } else { f32::INFINITY };
            }
            for (name, kernel) in locate_max_kernels() {
                prop_assert!(kernel(&r).suspect, "{}", name);
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
            prop_assert_eq!(portable::exp_sum_sequential(0.0, &r, sub, &bm, &[]).to_bits(), plain.to_bits());
            for (kernel, sequential) in sequential_kernels() {
                prop_assert_eq!(sequential(0.0, &r, sub, &bm, &[]).to_bits(), plain.to_bits(), "{}", kernel);
                // Continued over a split at a block boundary.
                let cut = (r.len() / 2) / BLOCK * BLOCK;
                let first = sequential(0.0, &r[..cut], sub, &bm[..cut / BLOCK], &[]);
                let rest = sequential(first, &r[cut..], sub, &bm[cut / BLOCK..], &[]);
                prop_assert_eq!(rest.to_bits(), plain.to_bits(), "{} split", kernel);
            }
        }

        /// The sum from 0 given a bound of it: the plain loop's bits whatever the bound (the
        /// sum itself, just above it, far above it, below it or none), on this CPU's kernels.
        #[test]
        fn the_sequential_sum_below_a_bound_is_the_plain_loop(
            r in prop_oneof![row(), dense_row(), long_row(), peaked_long_row()],
            shift in prop_oneof![Just(0.0f32), -3.0f32..0.0],
            bound in 0usize..6,
        ) {
            let r: Vec<f32> = r.into_iter().map(|x| x.clamp(-1e30, 1e30)).collect();
            let sub = portable::max(&r);
            prop_assume!(sub.is_finite());
            let sub = sub - shift;
            let plain = r.iter().fold(0.0f32, |sum, &x| sum + (x - sub).exp());
            let hi = [plain, plain.next_up(), plain * 1.01, plain * 4.0, plain * 0.75, f32::INFINITY][bound];
            let mut bm = Vec::new();
            let summary = portable::summarize(&r, &mut bm);
            let mut collector = Collector::default();
            let below = exp_sum_sequential_below(&r, sub, &bm, summary.max_block, hi, &mut collector);
            prop_assert_eq!(below.to_bits(), plain.to_bits(), "hi = {}", hi);
        }

        /// Patches (lowered entries, entries taken out as `-inf`) read as the patched row,
        /// with the block maxima of the original row, on every kernel.
        #[test]
        fn the_patched_sequential_sum_is_the_plain_loop_over_the_patched_row(
            r in prop_oneof![row(), dense_row()],
            picks in proptest::collection::vec((any::<prop::sample::Index>(), 0.0f32..30.0, any::<bool>()), 0..40),
            start in prop_oneof![Just(0.0f32), 0.0f32..4.0],
        ) {
            let r: Vec<f32> = r.into_iter().map(|x| x.clamp(-1e30, 1e30)).collect();
            let sub = portable::max(&r);
            prop_assume!(sub.is_finite());
            let mut patches: Vec<(u32, f32)> = picks
                .iter()
                .map(|(at, lower, gone)| {
                    let i = at.index(r.len());
                    (i as u32, if *gone { f32::NEG_INFINITY } else { r[i] - lower })
                })
                .collect();
            patches.sort_by_key(|p| p.0);
            patches.dedup_by_key(|p| p.0);
            let mut patched = r.clone();
            for &(i, v) in &patches {
                patched[i as usize] = v;
            }
            let mut plain = start;
            for &x in &patched {
                plain += (x - sub).exp();
            }
            let mut bm = Vec::new();
            portable::summarize(&r, &mut bm);
            prop_assert_eq!(portable::exp_sum_sequential(start, &r, sub, &bm, &patches).to_bits(), plain.to_bits());
            for (kernel, sequential) in sequential_kernels() {
                prop_assert_eq!(sequential(start, &r, sub, &bm, &patches).to_bits(), plain.to_bits(), "{}", kernel);
            }
        }

        /// Every kernel of the exact block sums adds the same weights in the same order as the
        /// portable sum (lengths off the vector widths included).
        #[test]
        fn exact_block_sums_are_the_portable_ones_on_every_kernel(
            r in row(),
            div in prop_oneof![Just(1.0f32), 0.05f32..3.0],
        ) {
            let r: Vec<f32> = r.into_iter().map(|x| x.clamp(-1e30, 1e30)).collect();
            let sub = portable::max(&r) / div;
            prop_assume!(sub.is_finite());
            let mut out = vec![0.0f64; r.len().div_ceil(BLOCK)];
            for (kernel, sums) in block_sum_kernels() {
                sums(&r, div, sub, &mut out);
                for (b, block) in r.chunks(BLOCK).enumerate() {
                    let want = portable::exp_shifted_sum(block, div, sub);
                    prop_assert_eq!(out[b].to_bits(), want.to_bits(), "{} block {}", kernel, b);
                }
            }
        }

        /// A sum `exp_sum_unordered` returns is the plain loop's in row order, in reverse and
        /// from the middle on; rows of a few values make ties with the ulp recur.
        #[test]
        fn unordered_sums_are_the_same_in_any_order(
            r in prop_oneof![row(), dense_row()],
            start in prop_oneof![Just(1.0f32), 0.5f32..4.0, 1.0f32..70_000.0, Just(16_777_216.0f32)],
        ) {
            let r: Vec<f32> = r.into_iter().map(|x| x.clamp(-1e30, 1e30)).collect();
            let sub = portable::max(&r);
            prop_assume!(sub.is_finite());
            let mut bm = Vec::new();
            portable::summarize(&r, &mut bm);
            let got = exp_sum_unordered(start, &r, sub, &bm, &[]);
            if let Some(sum) = got {
                let add = |order: &mut dyn Iterator<Item = &f32>| order.fold(start, |s, &x| s + (x - sub).exp());
                let mid = r.len() / 2;
                prop_assert_eq!(add(&mut r.iter()).to_bits(), sum.to_bits());
                prop_assert_eq!(add(&mut r.iter().rev()).to_bits(), sum.to_bits());
                prop_assert_eq!(add(&mut r[mid..].iter().chain(&r[..mid])).to_bits(), sum.to_bits());
            }
            #[cfg(target_arch = "x86_64")]
            if vectorised_exp() {
                // Both SIMD kernels give the same verdict (the dispatch runs one of them).
                // SAFETY: `vectorised_exp` implies AVX2, FMA, BMI1 and POPCNT were detected.
                prop_assert_eq!(unsafe { avx2::exp_sum_unordered(start, &r, sub, &bm, &[]) }.map(f32::to_bits), got.map(f32::to_bits));
                if avx512_available() {
                    // SAFETY: AVX-512F, POPCNT, AVX2, FMA, BMI1 and POPCNT were detected just above.
                    let wide = unsafe { avx512::exp_sum_unordered(start, &r, sub, &bm, &[]) };
                    prop_assert_eq!(wide.map(f32::to_bits), got.map(f32::to_bits));
                }
            }
        }

        /// `positions_ge` lists where the values at or above the threshold are, in order, on
        /// any length (groups of 64 and their remainder).
        #[test]
        fn positions_ge_lists_every_value_at_or_above_the_threshold(
            r in prop_oneof![row(), dense_row()],
            t in prop_oneof![-40.0f32..40.0, Just(0.0f32), Just(f32::NEG_INFINITY)],
        ) {
            let mut got = vec![7u32]; // appended to
            positions_ge(&r, t, &mut got);
            let want: Vec<u32> =
                std::iter::once(7).chain(r.iter().enumerate().filter(|(_, &x)| x >= t).map(|(i, _)| i as u32)).collect();
            prop_assert_eq!(got, want);
        }

        /// `positions_le` likewise, for the values at or below the threshold, through the
        /// dispatch and through each x86 kernel this CPU has.
        #[test]
        fn positions_le_lists_every_value_at_or_below_the_threshold(
            r in prop_oneof![row(), dense_row()],
            t in prop_oneof![-40.0f32..40.0, Just(0.0f32), Just(f32::NEG_INFINITY), Just(f32::INFINITY)],
        ) {
            let want: Vec<u32> =
                std::iter::once(7).chain(r.iter().enumerate().filter(|(_, &x)| x <= t).map(|(i, _)| i as u32)).collect();
            let mut got = vec![7u32]; // appended to
            positions_le(&r, t, &mut got);
            prop_assert_eq!(&got, &want);
            #[cfg(target_arch = "x86_64")]
            {
                if avx2_available() {
                    let mut got = vec![7u32];
                    // SAFETY: `avx2_available` said AVX2, FMA, BMI1 and POPCNT were detected.
                    unsafe { avx2::positions_le(&r, t, &mut got) };
                    prop_assert_eq!(&got, &want);
                }
                if avx512_available() {
                    let mut got = vec![7u32];
                    // SAFETY: `avx512_available` said AVX-512F, AVX2, FMA, BMI1 and POPCNT were.
                    unsafe { avx512::positions_le(&r, t, &mut got) };
                    prop_assert_eq!(&got, &want);
                }
            }
        }

        /// AVX2's collector kernels, called directly (an AVX-512 CPU's dispatch takes its own):
        /// the listed blocks are those whose maximum reaches the threshold, in order; the
        /// queued values are exactly the entries at or above it (as a multiset), whether no
        /// lane of a block holds two of them (one left-pack of the lane maxima) or some does,
        /// in one call or in chunks of at least the limit; `positions_ge` as the filter.
        #[test]
        #[cfg(target_arch = "x86_64")]
        fn avx2_collector_kernels_agree_with_the_naive_filter(
            r in prop_oneof![row(), dense_row()],
            pick in 0.0f64..1.0,
            limit in prop_oneof![Just(1usize), 1..200usize, Just(100_000usize)],
        ) {
            if !avx2_available() {
                return Ok(());
            }
            let bm = want_bm(&r);
            // A threshold that some entries equal, from anywhere in the row.
            let t = r[((r.len() - 1) as f64 * pick) as usize];
            prop_assume!(!t.is_nan());
            let mut blocks = vec![0u32; bm.len() + 16];
            // SAFETY: `avx2_available` said AVX2, FMA, BMI1 and POPCNT were detected.
            let listed = unsafe { avx2::list_blocks_ge(&bm, t, &mut blocks) };
            let want_blocks: Vec<u32> = (0..bm.len() as u32).filter(|&b| bm[b as usize] >= t).collect();
            prop_assert_eq!(&blocks[..listed], &want_blocks[..]);
            let mut queue = vec![f32::NAN; limit.min(r.len()) + 2 * BLOCK];
            let mut got = Vec::new();
            let mut rest = &want_blocks[..];
            while !rest.is_empty() {
                let lim = limit.min(r.len());
                // SAFETY: as above; the queue has room for `lim` values and a block.
                let (read, n) = unsafe { avx2::collect_listed(&r, rest, t, &mut queue, lim) };
                prop_assert!(read > 0 && (n >= lim || read == rest.len()));
                got.extend_from_slice(&queue[..n]);
                rest = &rest[read..];
            }
            let mut want: Vec<f32> = r.iter().copied().filter(|&x| x >= t).collect();
            got.sort_by(f32::total_cmp);
            want.sort_by(f32::total_cmp);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&got), bits(&want));
            let mut positions = Vec::new();
            // SAFETY: as above.
            unsafe { avx2::positions_ge(&r, t, &mut positions) };
            let want: Vec<u32> = (0..r.len() as u32).filter(|&i| r[i as usize] >= t).collect();
            prop_assert_eq!(positions, want);
        }

        /// A `Collector` gathers exactly the entries at or above the threshold (as a multiset),
        /// whichever lanes and blocks they share, in chunks of at least `CHUNK` but the last;
        /// the unordered sum over its chunks, one after the other, is `exp_sum_unordered`'s
        /// over the row, with the entries below the threshold gathered too or not.
        #[test]
        fn collected_entries_are_those_at_or_above_the_threshold(
            r in prop_oneof![row(), dense_row(), long_row()],
            below in prop_oneof![Just(0.0f32), 0.0f32..20.0, Just(16.7f32)],
            start in prop_oneof![Just(1.0f32), 1.0f32..4.0, 1.0f32..70_000.0],
        ) {
            let r: Vec<f32> = r.into_iter().map(|x| x.clamp(-1e30, 1e30)).collect();
            let max = portable::max(&r);
            prop_assume!(max.is_finite());
            let mut bm = Vec::new();
            portable::summarize(&r, &mut bm);
            let mut collector = Collector::default();
            let gather = |collector: &mut Collector, t: f32| {
                let mut chunks = Vec::new();
                if collector.start(&bm, t) {
                    loop {
                        let chunk = collector.next(&r, t);
                        if chunk.is_empty() {
                            break;
                        }
                        chunks.push(chunk.to_vec());
                    }
                }
                chunks
            };
            if !collector.start(&bm, max) {
                return Ok(()); // no SIMD kernels here: the row is scanned by `exp_sum_unordered`
            }
            let chunks = gather(&mut collector, max - below);
            for (i, chunk) in chunks.iter().enumerate() {
                prop_assert!(chunk.len() % 16 == 0);
                if i + 1 < chunks.len() {
                    prop_assert!(chunk.iter().filter(|x| x.is_finite()).count() >= Collector::CHUNK);
                }
            }
            let mut got: Vec<f32> = chunks.concat().into_iter().filter(|x| x.is_finite()).collect();
            let mut want: Vec<f32> = r.iter().copied().filter(|&x| x >= max - below).collect();
            got.sort_by(f32::total_cmp);
            want.sort_by(f32::total_cmp);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&got), bits(&want));
            // The sum's own threshold, and one below every entry (all of them gathered).
            let whole = exp_sum_unordered(start, &r, max, &bm, &[]);
            for t in [skip_threshold(max, log_half_ulp(start)), -1e31] {
                let sum = gather(&mut collector, t)
                    .iter()
                    .try_fold(start, |sum, chunk| exp_sum_unordered_values(sum, chunk, max));
                prop_assert_eq!(sum.map(f32::to_bits), whole.map(f32::to_bits));
            }
        }

        /// The AVX2 kernel adds the weights of a binade as integers (see its docs): rows where
        /// every entry matters, weights from a few values (ties with the sum's ulp), starts
        /// above 0 and long enough rows that the sum crosses many binades.
        #[test]
        fn the_sequential_sum_is_the_plain_loop_from_any_start_on_dense_rows(
            r in dense_row(),
            start in prop_oneof![
                Just(0.0f32),
                proptest::sample::select(vec![
                    f32::from_bits(1), 1e-38, 1e-30, 0.5, 1.0, 16_777_152.0, 16_777_216.0, 16_777_218.0,
                    3e7, 1e30, f32::MAX, f32::INFINITY,
                ]),
                0.0f32..4.0,
                0.0f32..70_000.0,
            ],
            shift in prop_oneof![Just(0.0f32), -3.0f32..0.0],
        ) {
            let sub = portable::max(&r) - shift;
            let mut plain = start;
            for &x in &r {
                plain += (x - sub).exp();
            }
            let mut bm = Vec::new();
            portable::summarize(&r, &mut bm);
            prop_assert_eq!(portable::exp_sum_sequential(start, &r, sub, &bm, &[]).to_bits(), plain.to_bits());
            for (kernel, sequential) in sequential_kernels() {
                prop_assert_eq!(sequential(start, &r, sub, &bm, &[]).to_bits(), plain.to_bits(), "{}", kernel);
            }
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
            #[cfg(target_arch = "x86_64")]
            if vectorised_exp() {
                // Both SIMD kernels, whichever the dispatch picked, with this `div` and `sub`.
                // SAFETY: `vectorised_exp` implies AVX2, FMA, BMI1 and POPCNT were detected.
                unsafe { avx2::exp_shifted(&r, div, sub, &mut got) };
                prop_assert_eq!(got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
                if avx512_available() {
                    // SAFETY: AVX-512F, AVX2, FMA, BMI1 and POPCNT were detected just above.
                    unsafe { avx512::exp_shifted(&r, div, sub, &mut got) };
                    prop_assert_eq!(got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
                }
            }
            prop_assert_eq!(exp_shifted_sum(&r, div, sub).to_bits(), sum.to_bits());
        }
    }

    /// A NaN (both signs, quiet and signalling payloads) or `+inf` at every position of rows
    /// of -inf, of ties and of ordinary values, at lengths around the lane width and the block,
    /// through every `locate_max` and `summarize` kernel.
    #[test]
    fn locate_max_flags_a_bad_value_at_every_position() {
        let bad = [f32::NAN, -f32::NAN, nan_from(1), nan_from(0x8000_0001), nan_from(0x003f_ffff), f32::INFINITY];
        for v in [1usize, 7, 8, 9, 63, 64, 65, 128, 200, 5000] {
            let ordinary: Vec<f32> = (0..v).map(|i| ((i * 37) % 101) as f32 - 50.0).collect();
            for base in [vec![f32::NEG_INFINITY; v], vec![0.0f32; v], ordinary] {
                let stride = if v > 200 { 7 } else { 1 };
                for i in (0..v).step_by(stride) {
                    for &x in &bad {
                        let mut r = base.clone();
                        r[i] = x;
                        for (name, kernel) in locate_max_kernels() {
                            assert!(kernel(&r).suspect, "{name}: {x:?} at {i} of {v}");
                        }
                        for (name, kernel) in summarize_kernels() {
                            assert!(kernel(&r, &mut Vec::new()).suspect, "{name}: {x:?} at {i} of {v}");
                        }
                    }
                }
                let want = (portable::max(&base).to_bits(), naive_argmax(&base) / BLOCK);
                for (name, kernel) in locate_max_kernels() {
                    let s = kernel(&base);
                    assert!(!s.suspect, "{name}");
                    assert_eq!((s.max.to_bits(), s.max_block), want, "{name}");
                }
                for (name, kernel) in summarize_kernels() {
                    let s = kernel(&base, &mut Vec::new());
                    assert!(!s.suspect, "{name}");
                    assert_eq!((s.max.to_bits(), s.max_block), want, "{name}");
                }
            }
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
            assert_eq!(locate_max(&all_masked), s);
            assert_eq!(bm.len(), v.div_ceil(BLOCK));
            let mut r = vec![0.0f32; v];
            r[v - 1] = -0.0;
            assert_eq!(argmax(&r), Some(0), "ties keep the first");
            r[v - 1] = 1.0;
            assert_eq!(argmax(&r), Some(v - 1));
            assert_eq!(summarize(&r, &mut bm).max_block, (v - 1) / BLOCK);
            assert_eq!(locate_max(&r).max_block, (v - 1) / BLOCK);
        }
        assert_eq!(locate_max(&[]), Summary { max: f32::NEG_INFINITY, max_block: 0, suspect: false });
        assert_eq!(argmax(&[]), None);
        assert_eq!(max(&[]), f32::NEG_INFINITY);
    }

    /// Weights of exactly 1 (`expf(0)`): sums that land exactly on a power of two, and steps
    /// that are exact ties (1 is half the ulp from 2^24 on), which round to even.
    #[test]
    fn the_sequential_sum_lands_on_powers_of_two_and_rounds_ties_to_even() {
        let mut cases = vec![(16_777_216.0f32, 100), (16_777_218.0, 100), (1.0, 64), (0.0, 5000)];
        // Starts just below 2^24 and 2^23: groups of 64 that land exactly on the power of two,
        // stop short of it or would pass it by one step.
        for below in 0..140 {
            for n in [1, 2, 63, 64, 65, 127, 128, 129, 200] {
                cases.push((16_777_216.0 - below as f32, n));
                cases.push((8_388_608.0 - below as f32 / 2.0, n));
            }
        }
        for (start, n) in cases {
            let r = vec![0.0f32; n];
            let mut plain = start;
            for &x in &r {
                plain += x.exp();
            }
            let mut bm = Vec::new();
            summarize(&r, &mut bm);
            for (kernel, sequential) in sequential_kernels() {
                assert_eq!(
                    sequential(start, &r, 0.0, &bm, &[]).to_bits(),
                    plain.to_bits(),
                    "{kernel}: start {start}, {n} ones"
                );
            }
            assert_eq!(portable::exp_sum_sequential(start, &r, 0.0, &bm, &[]).to_bits(), plain.to_bits());
        }
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
        for (kernel, expf) in exact_expf_kernels() {
            expf(&xs, &mut got);
            for (&x, &g) in xs.iter().zip(&got) {
                assert_eq!(g.to_bits(), x.exp().to_bits(), "{kernel}: expf({x:e})");
            }
        }
    }

    type ExpfKernel = fn(&[f32], &mut [f32]);

    /// The exact `expf` replicas this CPU runs: the dispatched `exp_shifted` (the platform's
    /// `expf`, AVX2's 8 lanes or AVX-512's 16) and each SIMD kernel directly (the dispatch picks
    /// only one).
    fn exact_expf_kernels() -> Vec<(&'static str, ExpfKernel)> {
        let mut kernels: Vec<(&'static str, ExpfKernel)> = vec![("dispatched", |x, o| exp_shifted(x, 1.0, 0.0, o))];
        #[cfg(target_arch = "x86_64")]
        if vectorised_exp() {
            // SAFETY: `vectorised_exp` implies AVX2, FMA, BMI1 and POPCNT were detected.
            kernels.push(("avx2", |x, o| unsafe { avx2::exp_shifted(x, 1.0, 0.0, o) }));
            if avx512_available() {
                // SAFETY: AVX-512F, AVX2, FMA, BMI1 and POPCNT were detected just above.
                kernels.push(("avx512", |x, o| unsafe { avx512::exp_shifted(x, 1.0, 0.0, o) }));
            }
        }
        kernels
    }

    type SequentialKernel = fn(f32, &[f32], f32, &[f32], &[(u32, f32)]) -> f32;

    /// The dispatched sequential sum and, where this CPU runs them (AVX2 and AVX-512 with the
    /// exact `expf` replica, NEON with the platform's), each SIMD kernel directly (the dispatch
    /// picks only one).
    fn sequential_kernels() -> Vec<(&'static str, SequentialKernel)> {
        let mut kernels: Vec<(&'static str, SequentialKernel)> = vec![("dispatched", exp_sum_sequential_patched)];
        #[cfg(target_arch = "x86_64")]
        if vectorised_exp() {
            // SAFETY: `vectorised_exp` implies AVX2, FMA, BMI1 and POPCNT were detected.
            kernels.push(("avx2", |st, r, sub, bm, p| unsafe { avx2::exp_sum_sequential(st, r, sub, bm, p) }));
            if avx512_available() {
                // SAFETY: AVX-512F, POPCNT, AVX2, FMA, BMI1 and POPCNT were detected just above.
                kernels.push(("avx512", |st, r, sub, bm, p| unsafe { avx512::exp_sum_sequential(st, r, sub, bm, p) }));
            }
        }
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        // SAFETY: the module exists only where the target enables NEON.
        kernels.push(("neon", |st, r, sub, bm, p| unsafe { neon::exp_sum_sequential(st, r, sub, bm, p) }));
        kernels
    }

    /// A patch that lowers a block's maximum must not raise the kernels' lower bound of the
    /// running sum: here the row's largest entry (block 0) is taken out, so the entries at -19
    /// before the last block's maximum still count (with the unpatched maximum as a bound they
    /// would be skipped, and the sum would lose ~2 ulps).
    #[test]
    fn a_lowered_block_maximum_does_not_raise_the_sum_s_bound() {
        let mut r = vec![-19.0f32; 9 * BLOCK];
        r[5] = 0.0;
        *r.last_mut().unwrap() = 0.5;
        let patches = [(5u32, f32::NEG_INFINITY)];
        let mut plain = 0.0f32;
        for (i, &x) in r.iter().enumerate() {
            plain += if i == 5 { 0.0 } else { (x - 0.5).exp() };
        }
        let mut bm = Vec::new();
        portable::summarize(&r, &mut bm);
        assert_eq!(portable::exp_sum_sequential(0.0, &r, 0.5, &bm, &patches).to_bits(), plain.to_bits());
        for (kernel, sequential) in sequential_kernels() {
            assert_eq!(sequential(0.0, &r, 0.5, &bm, &patches).to_bits(), plain.to_bits(), "{kernel}");
        }
        // The test has teeth: the entries at -19 change the sum.
        assert_ne!(plain, 1.0);
    }

    /// On rows shaped like a language model's (a few entries near the maximum, most far below,
    /// exact tie weights among them) with entries taken out as raw logprobs do, every sum
    /// `exp_sum_unordered` returns is the plain loop's over the patched row, and on CPUs with
    /// the SIMD kernels it returns most of them (the others cross into the next binade or
    /// hit a tie).
    #[test]
    fn unordered_sums_of_peaked_rows_with_entries_taken_out() {
        use tokensieve_testkit::generate::SplitMix64;
        let mut rng = SplitMix64::new(7);
        let mut taken = 0;
        let cases = 300;
        for case in 0..cases {
            let len = [40, 64, 1000, 4097, 20_000][case % 5];
            // Every other row sparse: most blocks below the threshold, skipped whole (with
            // patches in some of them).
            let sparse = case % 2 == 1;
            let r: Vec<f32> = (0..len)
                .map(|_| match rng.below(if sparse { 400 } else { 40 }) {
                    0 => -(rng.next_f64() * 8.0) as f32, // taken out below
                    1 => [-16.0f32, -15.5, -16.635532, -17.0][rng.below(4)],
                    2 => -12.0 - (rng.next_f64() * 5.0) as f32,
                    _ if sparse => -17.5 - (rng.next_f64() * 40.0) as f32,
                    _ => -12.0 - (rng.next_f64() * 28.0) as f32,
                })
                .collect();
            let sub = portable::max(&r);
            // The top entries go (their weights start the sum), and a few others.
            let top = r.iter().enumerate().filter(|(_, &x)| x > -10.0).map(|(i, _)| i);
            let mut patches: Vec<(u32, f32)> =
                (0..rng.below(30)).map(|_| rng.below(len)).chain(top).map(|i| (i as u32, f32::NEG_INFINITY)).collect();
            patches.sort_by_key(|p| p.0);
            patches.dedup_by_key(|p| p.0);
            let mut patched = r.clone();
            for &(i, v) in &patches {
                patched[i as usize] = v;
            }
            let start = [1.0f32, 1.25, 1.999, 3.0][case % 4];
            let mut bm = Vec::new();
            portable::summarize(&r, &mut bm);
            let plain = patched.iter().fold(start, |s, &x| s + (x - sub).exp());
            if let Some(sum) = exp_sum_unordered(start, &r, sub, &bm, &patches) {
                assert_eq!(sum.to_bits(), plain.to_bits(), "case {case}");
                taken += 1;
            }
        }
        if vectorised_exp() {
            assert!(taken > cases / 2, "{taken} of {cases} sums taken");
        }
    }

    /// The approximate increments of the unordered sums are the exact ones wherever their
    /// certificate holds, on random lanes and on lanes within a few ulps of a tie (where an
    /// approximation could round the other way), for ulp scales up to the largest allowed; the
    /// certificate holds for nearly every small weight, and both SIMD kernels' totals with
    /// and without the approximation agree.
    #[test]
    fn approximate_increments_are_exact_where_certain() {
        #[cfg(target_arch = "x86_64")]
        if vectorised_exp() {
            use tokensieve_testkit::generate::SplitMix64;
            let mut rng = SplitMix64::new(5);
            let (mut small, mut small_sure) = (0, 0);
            for case in 0..20_000 {
                let e = [23, 22, 24, 30, 10, 40, 50][case % 7];
                let scale = (e as f32).exp2();
                let sub = [0.0f32, 15.25, -3.0, 100.0][case % 4];
                // The lanes from 0 to 3 are random, the others near a tie.
                let xs: [f32; 8] = std::array::from_fn(|lane| {
                    let d = match if lane < 4 { rng.below(4) } else { 4 } {
                        0 => -(rng.next_f64() * 20.0),
                        1 => -(rng.next_f64() * 4.0),
                        2 => -(rng.next_f64() * 110.0),
                        3 => f64::NEG_INFINITY,
                        // Near a tie: `e^d·scale` within a few ulps of `j + 1/2`.
                        _ => {
                            let bits = rng.below(20);
                            let j = rng.below(1 << bits) as f64;
                            let d = ((j + 0.5) / scale as f64).ln().min(0.0) as f32;
                            let ulps = rng.below(9) as i32 - 4;
                            return f32::from_bits((d.to_bits() as i32 + ulps) as u32).min(0.0) + sub;
                        }
                    };
                    (d as f32 + sub).min(sub)
                });
                // SAFETY: `vectorised_exp` implies AVX2, FMA, BMI1 and POPCNT were detected.
                let lanes = unsafe { avx2::increments_by_lane(&xs, sub, scale) };
                for (i, &(approx, sure, exact)) in lanes.iter().enumerate() {
                    if sure {
                        assert_eq!(approx, exact, "x {} sub {sub} scale 2^{e}", xs[i]);
                    }
                    if i < 4 && (1..1000).contains(&exact) {
                        small += 1;
                        small_sure += sure as usize;
                    }
                }
                let row: Vec<f32> = xs.iter().chain(&xs).chain(&xs).copied().collect();
                let mut w = [0.0f32; BLOCK];
                // SAFETY: as above; AVX-512F, POPCNT, AVX2, FMA, BMI1 and POPCNT where `avx512_available`.
                unsafe {
                    let exact = avx2::increments::<false>(&row, sub, scale, &mut w);
                    assert_eq!(avx2::increments_approx(&row, sub, scale), exact);
                    if avx512_available() {
                        assert_eq!(avx512::increments::<false>(&row, sub, scale, &mut w), exact);
                        assert_eq!(avx512::increments_approx(&row, sub, scale), exact);
                    }
                }
            }
            assert!(small_sure * 100 > small * 97, "{small_sure} of {small} small increments certain");
        }
    }

    /// `exp_sum_unordered` declines a sum with a tie (weight 1 against the ulp 2 of 2^24: the
    /// last bit of the running sum decides each rounding) or a change of binade, and takes one
    /// without (on CPUs with the SIMD kernels).
    #[test]
    fn unordered_sums_decline_ties_and_new_binades() {
        let zeros = [0.0f32; BLOCK];
        let mut bm = Vec::new();
        portable::summarize(&zeros, &mut bm);
        assert_eq!(exp_sum_unordered(16_777_216.0, &zeros, 0.0, &bm, &[]), None);
        assert_eq!(exp_sum_unordered(1.5, &zeros, 0.0, &bm, &[]), None); // 1.5 + 64 leaves [1, 2)
        let sum = exp_sum_unordered(1024.0, &zeros, 0.0, &bm, &[]);
        assert!(sum.is_none() || sum == Some(1088.0));
        assert_eq!(sum.is_some(), vectorised_exp());
    }

    type BlockSumKernel = fn(&[f32], f32, f32, &mut [f64]);

    /// The dispatched exact block sums and, where this CPU runs them, each SIMD kernel.
    fn block_sum_kernels() -> Vec<(&'static str, BlockSumKernel)> {
        let mut kernels: Vec<(&'static str, BlockSumKernel)> = vec![("dispatched", exp_block_sums)];
        #[cfg(target_arch = "x86_64")]
        if vectorised_exp() {
            // SAFETY: `vectorised_exp` implies AVX2, FMA, BMI1 and POPCNT were detected.
            kernels.push(("avx2", |x, d, s, o| unsafe { avx2::exp_block_sums(x, d, s, o) }));
            if avx512_available() {
                // SAFETY: AVX-512F, AVX2, FMA, BMI1 and POPCNT were detected just above.
                kernels.push(("avx512", |x, d, s, o| unsafe { avx512::exp_block_sums(x, d, s, o) }));
            }
        }
        kernels
    }

    type ApproxKernel = fn(&[f32], f32, f32, &mut [f64]) -> f64;

    /// The dispatched approximate block sums and, where this CPU runs them, each SIMD kernel
    /// directly (the dispatch picks only one).
    fn approx_kernels() -> Vec<(&'static str, ApproxKernel)> {
        let mut kernels: Vec<(&'static str, ApproxKernel)> = vec![("dispatched", exp_block_sums_approx)];
        #[cfg(target_arch = "x86_64")]
        {
            if avx2_available() {
                // SAFETY: AVX2, FMA, BMI1 and POPCNT were detected just above.
                kernels.push(("avx2", |x, d, s, o| unsafe { avx2::exp_block_sums_approx(x, d, s, o) }));
            }
            if avx512_available() {
                // SAFETY: AVX-512F, AVX2, FMA, BMI1 and POPCNT were detected just above.
                kernels.push(("avx512", |x, d, s, o| unsafe { avx512::exp_block_sums_approx(x, d, s, o) }));
            }
        }
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        // SAFETY: the module exists only where the target enables NEON.
        kernels.push(("neon", |x, d, s, o| unsafe { neon::exp_block_sums_approx(x, d, s, o) }));
        kernels
    }

    /// AVX2's approximate `2^y` on one lane, written out with scalar operations (`mul_add` for
    /// the fused multiply-adds): the model the SIMD versions are held to bit for bit. Returns
    /// the result and the clamped `y`.
    fn exp2_approx_model(y: f32) -> (f32, f32) {
        let y = y.max(APPROX_Y_MIN); // a NaN `y` gives the constant, as `vmaxps` and FMAXNM do
        let magic = 12_582_912.0f32;
        let k = y + magic;
        let f = y - (k - magic);
        // Estrin's scheme, as the kernels evaluate it.
        let f2 = f * f;
        let pair = |hi: usize| EXP2_POLY[hi].mul_add(f, EXP2_POLY[hi - 1]);
        let p = pair(5).mul_add(f2, pair(3)).mul_add(f2, pair(1));
        (f32::from_bits(p.to_bits().wrapping_add(k.to_bits() << 23)), y)
    }

    /// AVX2's approximate block sums ([`exp_block_sums_approx_at`]) written out lane by lane,
    /// every addition in the kernel's order: two chains of 8 f32 lanes over each block's
    /// 16-float chunks, joined; f64 lane `i` gets lanes `i` and `i + 4`; halves, then pairs.
    fn approx_sums_model(src: &[f32], div: f32, sub: f32, ids: &[u32], out: &mut [f64]) -> f64 {
        let a = (std::f64::consts::LOG2_E / div as f64) as f32;
        let b = (-(sub as f64) * std::f64::consts::LOG2_E) as f32;
        let (mut total, mut weighted, mut entries) = ([0.0f64; 4], [0.0f64; 4], 0);
        for &id in ids {
            let id = id as usize;
            let block = &src[id * BLOCK..(id * BLOCK + BLOCK).min(src.len())];
            entries += block.len();
            if block.len() < BLOCK {
                out[id] = block.iter().map(|&x| (x / div - sub).exp() as f64).sum();
                continue;
            }
            let (mut acc, mut acc_y) = ([[0.0f32; 8]; 2], [[0.0f32; 8]; 2]);
            for c in block.chunks_exact(16) {
                for (h, half) in c.chunks_exact(8).enumerate() {
                    for (l, &x) in half.iter().enumerate() {
                        let (w, y) = exp2_approx_model(x.mul_add(a, b));
                        acc[h][l] += w;
                        acc_y[h][l] = (-w).mul_add(y, acc_y[h][l]);
                    }
                }
            }
            let acc: [f32; 8] = std::array::from_fn(|l| acc[0][l] + acc[1][l]);
            let acc_y: [f32; 8] = std::array::from_fn(|l| acc_y[0][l] + acc_y[1][l]);
            let sums: [f64; 4] = std::array::from_fn(|i| acc[i] as f64 + acc[i + 4] as f64);
            for i in 0..4 {
                total[i] += sums[i];
                weighted[i] = (weighted[i] + acc_y[i] as f64) + acc_y[i + 4] as f64;
            }
            out[id] = (sums[0] + sums[2]) + (sums[1] + sums[3]);
        }
        approx_sums_error(total.iter().sum(), weighted.iter().sum(), sub, entries)
    }

    type ApproxAtKernel = fn(&[f32], f32, f32, &[u32], &mut [f64]) -> f64;

    /// The kernels that compute AVX2's approximate sums bit for bit, where this CPU runs them:
    /// AVX2 itself and NEON (AVX-512's lane sums are shorter; its weights are checked in
    /// `the_base_2_approximation_is_within_its_bound`).
    fn approx_at_kernels() -> Vec<(&'static str, ApproxAtKernel)> {
        #[allow(unused_mut)]
        let mut kernels: Vec<(&'static str, ApproxAtKernel)> = Vec::new();
        #[cfg(target_arch = "x86_64")]
        if avx2_available() {
            // SAFETY: AVX2, FMA, BMI1 and POPCNT were detected just above.
            kernels.push(("avx2", |x, d, s, ids, o| unsafe { avx2::exp_block_sums_approx_at(x, d, s, ids, o) }));
        }
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        // SAFETY: the module exists only where the target enables NEON.
        kernels.push(("neon", |x, d, s, ids, o| unsafe { neon::exp_block_sums_approx_at(x, d, s, ids, o) }));
        kernels
    }

    /// The approximate sums of every kernel that claims AVX2's arithmetic equal the model's,
    /// bit for bit, sums and bound, over every block and over a list that skips some (the
    /// others left alone).
    fn check_approx_against_the_model(x: &[f32], div: f32) {
        let sub = portable::max(x) / div;
        let nb = x.len().div_ceil(BLOCK);
        let all: Vec<u32> = (0..nb as u32).collect();
        let some: Vec<u32> = all.iter().copied().filter(|i| i % 3 != 1).collect();
        for ids in [&all, &some] {
            let mut want = vec![-1.0f64; nb];
            let want_bound = approx_sums_model(x, div, sub, ids, &mut want);
            for (kernel, approx) in approx_at_kernels() {
                let mut got = vec![-1.0f64; nb];
                let bound = approx(x, div, sub, ids, &mut got);
                let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{kernel}: div {div}, {} of {nb} blocks", ids.len());
                assert_eq!(bound.to_bits(), want_bound.to_bits(), "{kernel}: div {div}: the bound");
            }
        }
    }

    #[test]
    fn approximate_sums_are_the_model_bit_for_bit() {
        for x in model_like_rows(&[f32::NEG_INFINITY, -87.0, -104.0, -300.0, 0.0]) {
            for div in [1.0f32, 0.8, 2.5, 0.1] {
                check_approx_against_the_model(&x, div);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn approximate_sums_of_random_rows_are_the_model_bit_for_bit(
            kind in tokensieve_testkit::generate::row_kind(),
            v in 1usize..3000,
            seed in any::<u64>(),
            div in prop::sample::select(vec![0.1f32, 0.8, 1.0, 3.0]),
        ) {
            let x = tokensieve_testkit::generate::row(kind, v, seed);
            prop_assume!(x.iter().all(|z| !z.is_nan()));
            check_approx_against_the_model(&x, div);
        }
    }

    /// Model-like logits (5000 values falling away from the maximum) shifted by 15, 0, -40
    /// and 300; the rows shifted by 15 and -40 also get `shift + e` for each `e` of `extra`
    /// (weights that are subnormal, underflow, or `-inf`).
    fn model_like_rows(extra: &[f32]) -> Vec<Vec<f32>> {
        let base: Vec<f32> = (0..5000).map(|i| -((i as f32) * 0.0213).powf(1.3)).collect();
        [(15.0f32, true), (0.0, false), (-40.0, true), (300.0, false)]
            .into_iter()
            .map(|(shift, with_extra)| {
                let mut x: Vec<f32> = base.iter().map(|&v| v + shift).collect();
                if with_extra {
                    x.extend(extra.iter().map(|&e| shift + e));
                }
                x
            })
            .collect()
    }

    #[test]
    fn block_sums_are_exact_and_the_approximation_within_its_bound() {
        // Logits as a model's (maximum near +15 or far from 0), temperatures, and rows holding
        // -inf and values whose weights underflow.
        for (row, x) in model_like_rows(&[f32::NEG_INFINITY, -87.0, -104.0, -300.0, 0.0]).into_iter().enumerate() {
            for div in [1.0f32, 0.8, 2.5, 0.1] {
                let sub = portable::max(&x) / div;
                let nb = x.len().div_ceil(BLOCK);
                let (mut exact, mut approx) = (vec![0.0; nb], vec![0.0; nb]);
                exp_block_sums(&x, div, sub, &mut exact);
                for (kernel, approximate) in approx_kernels() {
                    let bound = approximate(&x, div, sub, &mut approx);
                    let (rel, fixed) = approx_error_split(bound, sub, &approx, x.len());
                    let (total_e, total_a): (f64, f64) = (exact.iter().sum(), approx.iter().sum());
                    let (mut pe, mut pa) = (0.0f64, 0.0f64);
                    for (b, block) in x.chunks(BLOCK).enumerate() {
                        assert_eq!(exact[b].to_bits(), portable::exp_shifted_sum(block, div, sub).to_bits());
                        // Every prefix of blocks: the bound is on runs of blocks.
                        pe += exact[b];
                        pa += approx[b];
                        assert!(
                            (pa - pe).abs() <= bound,
                            "{kernel}: row {row} div {div} block {b}: {pa} vs {pe} (bound {bound})"
                        );
                        // Split, on the prefix and on the rest (with or without the last,
                        // partial block, which the kernels sum exactly): `rel` times the
                        // run's sum, plus `fixed`.
                        let (re, ra) = (total_e - pe, total_a - pa);
                        let split_ok = |e: f64, a: f64| (a - e).abs() <= rel * a + fixed + 1e-12 * total_e;
                        assert!(split_ok(pe, pa) && split_ok(re, ra), "{kernel}: row {row} div {div} block {b}: split");
                    }
                    // The bound is useful: tight enough to locate draws among realistic weights.
                    // (It grows with |sub|: llama.cpp rounds `l / t` at that magnitude.)
                    if sub.abs() <= 100.0 {
                        assert!(bound <= 1e-4 * pe, "{kernel}: row {row} div {div}: bound {bound} for sum {pe}");
                    }
                }
            }
        }
    }

    type CheapKernel = fn(&[f32], f32, f32, &[u32], &mut [f32]);

    /// The cheap kernels, given the bits-domain coefficients: the portable one and, where this
    /// CPU runs them, the AVX2 and AVX-512 ones (the dispatch picks only one).
    fn cheap_kernels() -> Vec<(&'static str, CheapKernel)> {
        let mut kernels: Vec<(&'static str, CheapKernel)> = vec![("portable", portable::cheap_block_sums_at)];
        #[cfg(target_arch = "x86_64")]
        if avx2_available() {
            // SAFETY: AVX2, FMA, BMI1 and POPCNT were detected just above.
            kernels.push(("avx2", |x, a, b, ids, o| unsafe { avx2::cheap_block_sums_at(x, a, b, ids, o) }));
        }
        #[cfg(target_arch = "x86_64")]
        if avx512_available() {
            // SAFETY: AVX-512F, AVX2, FMA, BMI1 and POPCNT were detected just above.
            kernels.push(("avx512", |x, a, b, ids, o| unsafe { avx512::cheap_block_sums_at(x, a, b, ids, o) }));
        }
        kernels
    }

    /// Every block's sum of llama.cpp's weights, and of the f64 `exp` of the same arguments,
    /// lies in the interval its cheap sum gives ([`cheap_block_sums_at`]), for every kernel;
    /// the blocks not listed are left alone. Returns how many blocks were checked.
    fn check_cheap_sums(x: &[f32], div: f32) -> usize {
        let sub = portable::max(x) / div;
        let Some((a, b)) = cheap_coefficients(div, sub) else { return 0 };
        let rho = cheap_rho(sub);
        let nb = x.len().div_ceil(BLOCK);
        // Every block but the second.
        let ids: Vec<u32> = (0..nb as u32).filter(|&i| i != 1).collect();
        let mut out = vec![0.0f32; nb];
        for (kernel, cheap) in cheap_kernels() {
            out.fill(-1.0);
            cheap(x, a, b, &ids, &mut out);
            for (i, block) in x.chunks(BLOCK).enumerate() {
                if i == 1 {
                    assert_eq!(out[i], -1.0, "{kernel}: a block not listed was written");
                    continue;
                }
                let llama: f64 = block.iter().map(|&z| (z / div - sub).exp() as f64).sum();
                let wide: f64 = block.iter().map(|&z| ((z / div - sub) as f64).exp()).sum();
                let slack = block.len() as f64 * 2f64.powi(-125);
                let hi = out[i] as f64 * (1.0 + rho) + slack;
                let lo = out[i] as f64 / (CHEAP_SPREAD * (1.0 + rho)) - slack;
                for exact in [llama, wide] {
                    assert!(
                        lo <= exact && exact <= hi,
                        "{kernel}: div {div} sub {sub} block {i}: {exact:e} not in [{lo:e}, {hi:e}]"
                    );
                }
            }
        }
        ids.len()
    }

    #[test]
    fn cheap_sums_bound_every_block() {
        // Model-like logits at several offsets (|sub| up to 3000), -inf, weights that are
        // subnormal or underflow, a partial last block; `rho` stays small where it matters.
        for x in model_like_rows(&[f32::NEG_INFINITY, -87.0, -87.5, -88.5, -104.0, -300.0, 0.0]) {
            for div in [1.0f32, 0.8, 2.5, 0.1] {
                assert!(check_cheap_sums(&x, div) > 0);
            }
        }
        assert!(cheap_rho(100.0) < 5e-4);
        // Outside the kernel's range: no sums.
        assert!(cheap_coefficients(1e-3, 1e4).is_none());
        assert!(cheap_coefficients(f32::MIN_POSITIVE, 1.0).is_none());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn cheap_sums_bound_every_block_of_random_rows(
            kind in tokensieve_testkit::generate::row_kind(),
            v in 1usize..3000,
            seed in any::<u64>(),
            div in prop::sample::select(vec![1e-3f32, 0.1, 0.8, 1.0, 3.0, 1e3]),
        ) {
            let x = tokensieve_testkit::generate::row(kind, v, seed);
            prop_assume!(x.iter().all(|z| !z.is_nan()));
            check_cheap_sums(&x, div);
        }
    }

    /// The approximate `2^y` of every SIMD kernel where this CPU runs it, 8 lanes at a time.
    #[allow(unused_variables, unused_mut)]
    fn simd_exp2_approx(v: &[f32; 8]) -> Vec<(&'static str, [f32; 8])> {
        let mut got = Vec::new();
        #[cfg(target_arch = "x86_64")]
        if avx2_available() {
            use std::arch::x86_64::*;
            let mut out = [0.0f32; 8];
            // SAFETY: AVX2, FMA, BMI1 and POPCNT were detected just above; `v` and `out` hold 8 floats.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), avx2::exp2_approx(_mm256_loadu_ps(v.as_ptr())).0) };
            got.push(("avx2", out));
        }
        #[cfg(target_arch = "x86_64")]
        if avx512_available() {
            use std::arch::x86_64::*;
            let mut v16 = [0.0f32; 16];
            v16[..8].copy_from_slice(v);
            v16[8..].copy_from_slice(v);
            let mut out16 = [0.0f32; 16];
            // SAFETY: AVX-512F, AVX2, FMA, BMI1 and POPCNT were detected just above; the arrays hold 16
            // floats.
            unsafe { _mm512_storeu_ps(out16.as_mut_ptr(), avx512::exp2_approx(_mm512_loadu_ps(v16.as_ptr())).0) };
            got.push(("avx512 low", out16[..8].try_into().unwrap()));
            got.push(("avx512 high", out16[8..].try_into().unwrap()));
        }
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        // SAFETY: the module exists only where the target enables NEON.
        got.push(("neon", unsafe { neon::exp2_approx_lanes(v) }));
        got
    }

    /// The model of the approximate `2^y` is within [`APPROX_POLY_REL_ERROR`] on a dense sweep
    /// (and tiny below the clamp), and every SIMD version gives the model's bits lane for
    /// lane, so the bound holds for all of them.
    #[test]
    fn the_base_2_approximation_is_within_its_bound() {
        // A dense sweep of [APPROX_Y_MIN, 0.5], every f32 near the split points ±0.5 + n, and
        // below the clamp.
        let mut ys: Vec<f32> = (0..=2_000_000).map(|i| APPROX_Y_MIN + i as f32 * (100.5 / 2_000_000.0)).collect();
        for n in -100..=0 {
            for edge in [-0.5f32, 0.5] {
                let c = n as f32 + edge;
                let mut lo = c;
                let mut hi = c;
                for _ in 0..64 {
                    lo = lo.next_down();
                    hi = hi.next_up();
                    ys.extend([lo, hi]);
                }
            }
        }
        ys.extend([0.0, -0.0, 1e-30, -1e-30, -100.5, -1000.0, f32::NEG_INFINITY, f32::NAN]);
        ys.retain(|&y| y <= 0.5 || y.is_nan());
        let mut worst = 0.0f64;
        let bits = |a: &[f32]| a.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for chunk in ys.chunks(8) {
            let mut v = [0.0f32; 8];
            v[..chunk.len()].copy_from_slice(chunk);
            let model = v.map(|y| exp2_approx_model(y).0);
            for (kernel, got) in simd_exp2_approx(&v) {
                assert_eq!(bits(&got), bits(&model), "{kernel}: {chunk:?}");
            }
            for (&y, &w) in chunk.iter().zip(&model) {
                let e = (y as f64).exp2();
                if y >= APPROX_Y_MIN {
                    worst = worst.max(((w as f64 - e) / e).abs());
                } else {
                    assert!(w as f64 <= (-99.0f64).exp2() && (e <= (-99.0f64).exp2() || y.is_nan()), "y = {y}: {w}");
                }
            }
        }
        assert!(worst <= APPROX_POLY_REL_ERROR, "worst relative error {worst:e}");
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
            for (kernel, expf) in exact_expf_kernels() {
                expf(&src, &mut out[..src.len()]);
                for (&x, &g) in src.iter().zip(&out) {
                    assert_eq!(g.to_bits(), x.exp().to_bits(), "{kernel}: expf({x:e}) bits {:#x}", x.to_bits());
                }
            }
        }
    }
}
