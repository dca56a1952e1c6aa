//! `exp` on f64, many at a time, with the platform's bits: a replica of glibc's `exp` (since
//! 2.28; its FMA build, which glibc selects on every CPU with FMA) on 8 lanes (AVX-512) or 4
//! (AVX2), used only after `replica_agrees` has compared it with the platform's `exp`.
//!
//! The transformers convention's weights are `exp(f64(z - max))` (see
//! [`crate::convention::transformers::weight`]): libm's `exp` one call at a time cost about
//! 5 ns each, which made the dense array path (every token of a flat row) and the few dozen
//! weights of a `top_k` tail their largest single cost.
//!
//! The method (glibc's, restated): with `N = 128`, `k = round(x N / ln 2)` by adding and
//! subtracting `1.5·2^52` after a fused multiply-add, `r = x - k ln2/N` in two fused steps (ln 2
//! split in a high and a low part), `2^(k/N) = 2^(k div N) · 2^((k mod N)/N)` from a table of
//! `2^(i/N)` (rounded to the nearest f64, stored less `i << 45` so that adding `k << 45` puts
//! `k div N` in the exponent) beside the relative rounding error of each entry, and
//! `exp(r) - 1` by a quintic: `scale + scale · (err + r + r²(C2 + r C3) + r⁴(C4 + r C5))`, every
//! step the same fused or plain operation as glibc's, so every lane has glibc's bits. Outside
//! `2^-54 <= |x| < 512` glibc takes other branches: `1 + x` below (done here too), the
//! platform's `exp` lane by lane above (overflow, underflow to subnormals, NaN), and `-inf`
//! gives `+0`.

// The table and constants serve the x86-64 kernels; elsewhere `exp_in_place` calls `f64::exp`.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

/// `2^(i/128)` rounded to the nearest f64, less `i << 45` (odd entries), each beside its
/// relative rounding error `(2^(i/128) - rounded) / rounded`, rounded (even entries): glibc's
/// `__exp_data.tab`, which these values equal (each recomputed at 60 digits for this table).
static TAB: [u64; 256] = [
    0x0000000000000000,
    0x3ff0000000000000,
    0x3c9b3b4f1a88bf6e,
    0x3feff63da9fb3335,
    0xbc7160139cd8dc5d,
    0x3fefec9a3e778061,
    0xbc905e7a108766d1,
    0x3fefe315e86e7f85,
    0x3c8cd2523567f613,
    0x3fefd9b0d3158574,
    0xbc8bce8023f98efa,
    0x3fefd06b29ddf6de,
    0x3c60f74e61e6c861,
    0x3fefc74518759bc8,
    0x3c90a3e45b33d399,
    0x3fefbe3ecac6f383,
    0x3c979aa65d837b6d,
    0x3fefb5586cf9890f,
    0x3c8eb51a92fdeffc,
    0x3fefac922b7247f7,
    0x3c3ebe3d702f9cd1,
    0x3fefa3ec32d3d1a2,
    0xbc6a033489906e0b,
    0x3fef9b66affed31b,
    0xbc9556522a2fbd0e,
    0x3fef9301d0125b51,
    0xbc5080ef8c4eea55,
    0x3fef8abdc06c31cc,
    0xbc91c923b9d5f416,
    0x3fef829aaea92de0,
    0x3c80d3e3e95c55af,
    0x3fef7a98c8a58e51,
    0xbc801b15eaa59348,
    0x3fef72b83c7d517b,
    0xbc8f1ff055de323d,
    0x3fef6af9388c8dea,
    0x3c8b898c3f1353bf,
    0x3fef635beb6fcb75,
    0xbc96d99c7611eb26,
    0x3fef5be084045cd4,
    0x3c9aecf73e3a2f60,
    0x3fef54873168b9aa,
    0xbc8fe782cb86389d,
    0x3fef4d5022fcd91d,
    0x3c8a6f4144a6c38d,
    0x3fef463b88628cd6,
    0x3c807a05b0e4047d,
    0x3fef3f49917ddc96,
    0x3c968efde3a8a894,
    0x3fef387a6e756238,
    0x3c875e18f274487d,
    0x3fef31ce4fb2a63f,
    0x3c80472b981fe7f2,
    0x3fef2b4565e27cdd,
    0xbc96b87b3f71085e,
    0x3fef24dfe1f56381,
    0x3c82f7e16d09ab31,
    0x3fef1e9df51fdee1,
    0xbc3d219b1a6fbffa,
    0x3fef187fd0dad990,
    0x3c8b3782720c0ab4,
    0x3fef1285a6e4030b,
    0x3c6e149289cecb8f,
    0x3fef0cafa93e2f56,
    0x3c834d754db0abb6,
    0x3fef06fe0a31b715,
    0x3c864201e2ac744c,
    0x3fef0170fc4cd831,
    0x3c8fdd395dd3f84a,
    0x3feefc08b26416ff,
    0xbc86a3803b8e5b04,
    0x3feef6c55f929ff1,
    0xbc924aedcc4b5068,
    0x3feef1a7373aa9cb,
    0xbc9907f81b512d8e,
    0x3feeecae6d05d866,
    0xbc71d1e83e9436d2,
    0x3feee7db34e59ff7,
    0xbc991919b3ce1b15,
    0x3feee32dc313a8e5,
    0x3c859f48a72a4c6d,
    0x3feedea64c123422,
    0xbc9312607a28698a,
    0x3feeda4504ac801c,
    0xbc58a78f4817895b,
    0x3feed60a21f72e2a,
    0xbc7c2c9b67499a1b,
    0x3feed1f5d950a897,
    0x3c4363ed60c2ac11,
    0x3feece086061892d,
    0x3c9666093b0664ef,
    0x3feeca41ed1d0057,
    0x3c6ecce1daa10379,
    0x3feec6a2b5c13cd0,
    0x3c93ff8e3f0f1230,
    0x3feec32af0d7d3de,
    0x3c7690cebb7aafb0,
    0x3feebfdad5362a27,
    0x3c931dbdeb54e077,
    0x3feebcb299fddd0d,
    0xbc8f94340071a38e,
    0x3feeb9b2769d2ca7,
    0xbc87deccdc93a349,
    0x3feeb6daa2cf6642,
    0xbc78dec6bd0f385f,
    0x3feeb42b569d4f82,
    0xbc861246ec7b5cf6,
    0x3feeb1a4ca5d920f,
    0x3c93350518fdd78e,
    0x3feeaf4736b527da,
    0x3c7b98b72f8a9b05,
    0x3feead12d497c7fd,
    0x3c9063e1e21c5409,
    0x3feeab07dd485429,
    0x3c34c7855019c6ea,
    0x3feea9268a5946b7,
    0x3c9432e62b64c035,
    0x3feea76f15ad2148,
    0xbc8ce44a6199769f,
    0x3feea5e1b976dc09,
    0xbc8c33c53bef4da8,
    0x3feea47eb03a5585,
    0xbc845378892be9ae,
    0x3feea34634ccc320,
    0xbc93cedd78565858,
    0x3feea23882552225,
    0x3c5710aa807e1964,
    0x3feea155d44ca973,
    0xbc93b3efbf5e2228,
    0x3feea09e667f3bcd,
    0xbc6a12ad8734b982,
    0x3feea012750bdabf,
    0xbc6367efb86da9ee,
    0x3fee9fb23c651a2f,
    0xbc80dc3d54e08851,
    0x3fee9f7df9519484,
    0xbc781f647e5a3ecf,
    0x3fee9f75e8ec5f74,
    0xbc86ee4ac08b7db0,
    0x3fee9f9a48a58174,
    0xbc8619321e55e68a,
    0x3fee9feb564267c9,
    0x3c909ccb5e09d4d3,
    0x3feea0694fde5d3f,
    0xbc7b32dcb94da51d,
    0x3feea11473eb0187,
    0x3c94ecfd5467c06b,
    0x3feea1ed0130c132,
    0x3c65ebe1abd66c55,
    0x3feea2f336cf4e62,
    0xbc88a1c52fb3cf42,
    0x3feea427543e1a12,
    0xbc9369b6f13b3734,
    0x3feea589994cce13,
    0xbc805e843a19ff1e,
    0x3feea71a4623c7ad,
    0xbc94d450d872576e,
    0x3feea8d99b4492ed,
    0x3c90ad675b0e8a00,
    0x3feeaac7d98a6699,
    0x3c8db72fc1f0eab4,
    0x3feeace5422aa0db,
    0xbc65b6609cc5e7ff,
    0x3feeaf3216b5448c,
    0x3c7bf68359f35f44,
    0x3feeb1ae99157736,
    0xbc93091fa71e3d83,
    0x3feeb45b0b91ffc6,
    0xbc5da9b88b6c1e29,
    0x3feeb737b0cdc5e5,
    0xbc6c23f97c90b959,
    0x3feeba44cbc8520f,
    0xbc92434322f4f9aa,
    0x3feebd829fde4e50,
    0xbc85ca6cd7668e4b,
    0x3feec0f170ca07ba,
    0x3c71affc2b91ce27,
    0x3feec49182a3f090,
    0x3c6dd235e10a73bb,
    0x3feec86319e32323,
    0xbc87c50422622263,
    0x3feecc667b5de565,
    0x3c8b1c86e3e231d5,
    0x3feed09bec4a2d33,
    0xbc91bbd1d3bcbb15,
    0x3feed503b23e255d,
    0x3c90cc319cee31d2,
    0x3feed99e1330b358,
    0x3c8469846e735ab3,
    0x3feede6b5579fdbf,
    0xbc82dfcd978e9db4,
    0x3feee36bbfd3f37a,
    0x3c8c1a7792cb3387,
    0x3feee89f995ad3ad,
    0xbc907b8f4ad1d9fa,
    0x3feeee07298db666,
    0xbc55c3d956dcaeba,
    0x3feef3a2b84f15fb,
    0xbc90a40e3da6f640,
    0x3feef9728de5593a,
    0xbc68d6f438ad9334,
    0x3feeff76f2fb5e47,
    0xbc91eee26b588a35,
    0x3fef05b030a1064a,
    0x3c74ffd70a5fddcd,
    0x3fef0c1e904bc1d2,
    0xbc91bdfbfa9298ac,
    0x3fef12c25bd71e09,
    0x3c736eae30af0cb3,
    0x3fef199bdd85529c,
    0x3c8ee3325c9ffd94,
    0x3fef20ab5fffd07a,
    0x3c84e08fd10959ac,
    0x3fef27f12e57d14b,
    0x3c63cdaf384e1a67,
    0x3fef2f6d9406e7b5,
    0x3c676b2c6c921968,
    0x3fef3720dcef9069,
    0xbc808a1883ccb5d2,
    0x3fef3f0b555dc3fa,
    0xbc8fad5d3ffffa6f,
    0x3fef472d4a07897c,
    0xbc900dae3875a949,
    0x3fef4f87080d89f2,
    0x3c74a385a63d07a7,
    0x3fef5818dcfba487,
    0xbc82919e2040220f,
    0x3fef60e316c98398,
    0x3c8e5a50d5c192ac,
    0x3fef69e603db3285,
    0x3c843a59ac016b4b,
    0x3fef7321f301b460,
    0xbc82d52107b43e1f,
    0x3fef7c97337b9b5f,
    0xbc892ab93b470dc9,
    0x3fef864614f5a129,
    0x3c74b604603a88d3,
    0x3fef902ee78b3ff6,
    0x3c83c5ec519d7271,
    0x3fef9a51fbc74c83,
    0xbc8ff7128fd391f0,
    0x3fefa4afa2a490da,
    0xbc8dae98e223747d,
    0x3fefaf482d8e67f1,
    0x3c8ec3bc41aa2008,
    0x3fefba1bee615a27,
    0x3c842b94c3a9eb32,
    0x3fefc52b376bba97,
    0x3c8a64a931d185ee,
    0x3fefd0765b6e4540,
    0xbc8e37bae43be3ed,
    0x3fefdbfdad9cbe14,
    0x3c77893b4d91cd9d,
    0x3fefe7c1819e90d8,
    0x3c5305c14160cc89,
    0x3feff3c22b8f71f1,
];

/// `128 / ln 2`.
const INV_LN2_N: f64 = f64::from_bits(0x4067_1547_652b_82fe);
/// `-ln 2 / 128`, its high part (the low bits zero, so that `k` times it is exact).
const NEG_LN2_HI_N: f64 = f64::from_bits(0xbf76_2e42_fefa_0000);
/// The rest of `-ln 2 / 128`.
const NEG_LN2_LO_N: f64 = f64::from_bits(0xbd0c_f79a_bc9e_3b3a);
/// `1.5·2^52`: adding it rounds to an integer, which lands in the low mantissa bits.
const SHIFT: f64 = f64::from_bits(0x4338_0000_0000_0000);
/// The quintic's coefficients `C2..C5` (of `r²` to `r⁵`).
const C: [f64; 4] = [
    f64::from_bits(0x3fdf_ffff_ffff_fdbd),
    f64::from_bits(0x3fc5_5555_5555_543c),
    f64::from_bits(0x3fa5_5555_cf17_2b91),
    f64::from_bits(0x3f81_1111_67a4_d017),
];
/// `|x|`'s biased exponent from which the main branch applies (`2^-54`) and up to which it
/// does not (`512`).
const TOP_TINY: u64 = 0x3c9;
const TOP_HUGE: u64 = 0x408;

/// `x.exp()` for every entry of `xs`, in place, by the kernel of this CPU. Only call it after
/// [`replica_agrees`] returned true.
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT, and AVX-512F when `avx512` is set.
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn exp_in_place(xs: &mut [f64], avx512: bool) {
    if avx512 {
        x86::exp_in_place_avx512(xs)
    } else {
        x86::exp_in_place_avx2(xs)
    }
}

/// See [`super::exp64_block_sums`]; only call it after [`replica_agrees`] returned true.
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT, and AVX-512F when `avx512` is set.
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn block_sums(src: &[f32], div: f32, sub: f32, out: &mut Vec<f64>, avx512: bool) {
    if avx512 {
        x86::block_sums_avx512(src, div, sub, out)
    } else {
        x86::block_sums_avx2(src, div, sub, out)
    }
}

/// [`super::exp64_block_sums`] with the platform's `exp` one call at a time, summed in the
/// kernels' order: eight running sums (entry `i` of a block into sum `i % 8`), then
/// [`reduce8`].
pub(super) fn block_sums_portable(src: &[f32], div: f32, sub: f32, out: &mut Vec<f64>) {
    out.clear();
    for block in src.chunks(super::BLOCK) {
        let mut lanes = [0.0f64; 8];
        for (i, &z) in block.iter().enumerate() {
            lanes[i % 8] += (f64::from(z / div - sub)).exp();
        }
        out.push(reduce8(&lanes));
    }
}

/// The eight running sums of a block, added as a tree.
#[inline]
pub(super) fn reduce8(l: &[f64; 8]) -> f64 {
    ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
}

/// Whether the kernels give the platform's `exp` bits on inputs across the whole range (the
/// main branch's edges, `1 + x` below it, the lanes left to the platform above it, zeros,
/// infinities): false on a libm other than glibc's FMA build.
///
/// # Safety
/// The CPU must support AVX2, FMA, BMI1 and POPCNT, and AVX-512F when `avx512` is set.
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn replica_agrees(avx512: bool) -> bool {
    let mut xs = vec![0.0f64; 4099];
    // f64s spread evenly by their bits from -0 down to -750, then the same from +0 to 520.
    let (neg, pos) = ((-750.0f64).to_bits() - (1 << 63), 520.0f64.to_bits());
    let half = 2000u64;
    for (i, x) in xs.iter_mut().enumerate().take(2 * half as usize) {
        let i = i as u64;
        *x =
            if i < half { f64::from_bits((1 << 63) + neg / half * i) } else { f64::from_bits(pos / half * (i - half)) };
    }
    let special = [
        f64::NEG_INFINITY,
        f64::INFINITY,
        f64::NAN,
        -0.0,
        0.0,
        f64::from_bits(TOP_TINY << 52),
        -f64::from_bits(TOP_TINY << 52),
        f64::from_bits((TOP_TINY << 52) - 1),
        512.0,
        -512.0,
        f64::from_bits(512.0f64.to_bits() - 1),
        -f64::from_bits(512.0f64.to_bits() - 1),
        -708.5,
        -745.2,
        709.9,
        -1e-300,
    ];
    let at = xs.len() - special.len() - 83; // and an odd tail for the last, partial vector
    xs[at..at + special.len()].copy_from_slice(&special);
    let mut got = xs.clone();
    exp_in_place(&mut got, avx512);
    xs.iter().zip(&got).all(|(&x, &g)| g.to_bits() == x.exp().to_bits() || (g.is_nan() && x.is_nan()))
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{reduce8, C, INV_LN2_N, NEG_LN2_HI_N, NEG_LN2_LO_N, SHIFT, TAB, TOP_HUGE, TOP_TINY};
    use crate::arch::BLOCK;
    use std::arch::x86_64::*;

    /// `[TAB[2 i], TAB[2 i + 1]]` (a lane's error term and scale bits) in one 16-byte load.
    /// PERF: the kernels read the table this way, a load per lane, rather than by two gathers,
    /// which on the development machine (Zen 4) cost more than the rest of the kernel.
    ///
    /// # Safety
    /// `i < 128`.
    #[inline(always)]
    unsafe fn pair(i: u64) -> __m128i {
        debug_assert!(i < 128);
        // SAFETY (caller): entries 2i and 2i + 1 lie within the table.
        _mm_loadu_si128(TAB.as_ptr().add(2 * i as usize).cast())
    }

    /// `exp` on 8 lanes: the results, and the mask of the lanes left to the platform's `exp`
    /// (`|x| >= 512`, NaN, `+inf`; `-inf` gives `+0` here).
    #[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
    #[inline]
    unsafe fn exp8(x: __m512d) -> (__m512d, u32) {
        let top = _mm512_and_si512(_mm512_srli_epi64::<52>(_mm512_castpd_si512(x)), _mm512_set1_epi64(0x7ff));
        let tiny = _mm512_set1_epi64(TOP_TINY as i64);
        // glibc's branch test: `top - TOP_TINY` below the span, as unsigned.
        let main =
            _mm512_cmplt_epu64_mask(_mm512_sub_epi64(top, tiny), _mm512_set1_epi64((TOP_HUGE - TOP_TINY) as i64));
        let below = _mm512_cmplt_epu64_mask(top, tiny);
        let zero = _mm512_cmp_pd_mask::<_CMP_EQ_OQ>(x, _mm512_set1_pd(f64::NEG_INFINITY));
        let shift = _mm512_set1_pd(SHIFT);
        let z = _mm512_fmadd_pd(x, _mm512_set1_pd(INV_LN2_N), shift);
        let ki = _mm512_castpd_si512(z);
        let kd = _mm512_sub_pd(z, shift);
        let r = _mm512_fmadd_pd(kd, _mm512_set1_pd(NEG_LN2_LO_N), _mm512_fmadd_pd(kd, _mm512_set1_pd(NEG_LN2_HI_N), x));
        let mut i = [0u64; 8];
        // SAFETY: a store of 8 u64s into an array of 8.
        _mm512_storeu_si512(i.as_mut_ptr().cast(), _mm512_and_si512(ki, _mm512_set1_epi64(127)));
        let four = |k: usize| {
            // SAFETY: the indices were masked to 0..128.
            let v = _mm512_castsi128_si512(pair(i[k]));
            let v = _mm512_inserti32x4::<1>(v, pair(i[k + 1]));
            let v = _mm512_inserti32x4::<2>(v, pair(i[k + 2]));
            _mm512_inserti32x4::<3>(v, pair(i[k + 3]))
        };
        let (p0, p1) = (four(0), four(4));
        let tail = _mm512_permutex2var_epi64(p0, _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14), p1);
        let sbits = _mm512_permutex2var_epi64(p0, _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15), p1);
        let sbits = _mm512_add_epi64(sbits, _mm512_slli_epi64::<45>(ki));
        let c = |k: usize| _mm512_set1_pd(C[k]);
        let a = _mm512_fmadd_pd(r, c(1), c(0));
        let b = _mm512_add_pd(r, _mm512_castsi512_pd(tail));
        let r2 = _mm512_mul_pd(r, r);
        let cc = _mm512_fmadd_pd(r, c(3), c(2));
        let d = _mm512_fmadd_pd(a, r2, b);
        let tmp = _mm512_fmadd_pd(_mm512_mul_pd(r2, r2), cc, d);
        let scale = _mm512_castsi512_pd(sbits);
        let y = _mm512_fmadd_pd(scale, tmp, scale);
        let y = _mm512_mask_mov_pd(y, below, _mm512_add_pd(_mm512_set1_pd(1.0), x));
        let y = _mm512_mask_mov_pd(y, zero, _mm512_setzero_pd());
        (y, u32::from(!(main | below | zero)))
    }

    /// `exp` on 4 lanes, as [`exp8`].
    #[target_feature(enable = "avx2,fma,bmi1,popcnt")]
    #[inline]
    unsafe fn exp4(x: __m256d) -> (__m256d, u32) {
        let top = _mm256_and_si256(_mm256_srli_epi64::<52>(_mm256_castpd_si256(x)), _mm256_set1_epi64x(0x7ff));
        // `top` is at most 0x7ff, so signed 64-bit compares serve.
        let below = _mm256_cmpgt_epi64(_mm256_set1_epi64x(TOP_TINY as i64), top);
        // `top >= TOP_HUGE`: glibc's other branches (NaN and `+inf` have the largest).
        let above = _mm256_cmpgt_epi64(top, _mm256_set1_epi64x(TOP_HUGE as i64 - 1));
        let zero = _mm256_castpd_si256(_mm256_cmp_pd::<_CMP_EQ_OQ>(x, _mm256_set1_pd(f64::NEG_INFINITY)));
        let shift = _mm256_set1_pd(SHIFT);
        let z = _mm256_fmadd_pd(x, _mm256_set1_pd(INV_LN2_N), shift);
        let ki = _mm256_castpd_si256(z);
        let kd = _mm256_sub_pd(z, shift);
        let r = _mm256_fmadd_pd(kd, _mm256_set1_pd(NEG_LN2_LO_N), _mm256_fmadd_pd(kd, _mm256_set1_pd(NEG_LN2_HI_N), x));
        let mut i = [0u64; 4];
        // SAFETY: a store of 4 u64s into an array of 4.
        _mm256_storeu_si256(i.as_mut_ptr().cast(), _mm256_and_si256(ki, _mm256_set1_epi64x(127)));
        // Lanes 0 and 2 in one vector, 1 and 3 in the other: the unpacks interleave them back
        // in order. SAFETY: the indices were masked to 0..128.
        let p02 = _mm256_set_m128i(pair(i[2]), pair(i[0]));
        let p13 = _mm256_set_m128i(pair(i[3]), pair(i[1]));
        let tail = _mm256_unpacklo_epi64(p02, p13);
        let sbits = _mm256_add_epi64(_mm256_unpackhi_epi64(p02, p13), _mm256_slli_epi64::<45>(ki));
        let c = |k: usize| _mm256_set1_pd(C[k]);
        let a = _mm256_fmadd_pd(r, c(1), c(0));
        let b = _mm256_add_pd(r, _mm256_castsi256_pd(tail));
        let r2 = _mm256_mul_pd(r, r);
        let cc = _mm256_fmadd_pd(r, c(3), c(2));
        let d = _mm256_fmadd_pd(a, r2, b);
        let tmp = _mm256_fmadd_pd(_mm256_mul_pd(r2, r2), cc, d);
        let scale = _mm256_castsi256_pd(sbits);
        let y = _mm256_fmadd_pd(scale, tmp, scale);
        let y = _mm256_blendv_pd(y, _mm256_add_pd(_mm256_set1_pd(1.0), x), _mm256_castsi256_pd(below));
        let y = _mm256_andnot_pd(_mm256_castsi256_pd(zero), y);
        let others = _mm256_andnot_si256(zero, above);
        (y, _mm256_movemask_pd(_mm256_castsi256_pd(others)) as u32)
    }

    /// The lanes of `out` that the mask `others` flags, recomputed from the arguments `arg`
    /// with the platform's `exp`.
    #[inline(always)]
    fn platform_lanes<const L: usize>(out: &mut [f64; L], arg: &[f64; L], others: u32) {
        for (j, (c, &x)) in out.iter_mut().zip(arg).enumerate() {
            if others >> j & 1 != 0 {
                *c = x.exp();
            }
        }
    }

    /// Runs `kernel` over `xs` in vectors of `L` lanes (the last one padded with zeros): it
    /// overwrites a vector with its results and returns the mask of the lanes it leaves to the
    /// platform's `exp` (rare in a row of logits), which are then recomputed from the original
    /// values.
    #[inline(always)]
    fn each_vector<const L: usize>(xs: &mut [f64], mut kernel: impl FnMut(&mut [f64; L]) -> u32) {
        let fix = platform_lanes::<L>;
        let mut chunks = xs.chunks_exact_mut(L);
        for chunk in &mut chunks {
            let x: &mut [f64; L] = chunk.try_into().expect("chunks_exact_mut gives whole vectors");
            let original = *x;
            let others = kernel(x);
            if others != 0 {
                fix(x, &original, others);
            }
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let mut x = [0.0f64; L];
            x[..rest.len()].copy_from_slice(rest);
            let original = x;
            let others = kernel(&mut x);
            fix(&mut x, &original, others);
            rest.copy_from_slice(&x[..rest.len()]);
        }
    }

    /// See [`super::exp_in_place`]: 8 lanes.
    ///
    /// # Safety
    /// The CPU must support AVX-512F, AVX2, FMA, BMI1 and POPCNT.
    #[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
    pub(super) unsafe fn exp_in_place_avx512(xs: &mut [f64]) {
        each_vector::<8>(xs, |xs| {
            // SAFETY: a load and a store of 8 f64s from and to an array of 8.
            unsafe {
                let (y, others) = exp8(_mm512_loadu_pd(xs.as_ptr()));
                _mm512_storeu_pd(xs.as_mut_ptr(), y);
                others
            }
        });
    }

    /// See [`super::exp_in_place`]: 4 lanes.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA, BMI1 and POPCNT.
    #[target_feature(enable = "avx2,fma,bmi1,popcnt")]
    pub(super) unsafe fn exp_in_place_avx2(xs: &mut [f64]) {
        each_vector::<4>(xs, |xs| {
            // SAFETY: a load and a store of 4 f64s from and to an array of 4.
            unsafe {
                let (y, others) = exp4(_mm256_loadu_pd(xs.as_ptr()));
                _mm256_storeu_pd(xs.as_mut_ptr(), y);
                others
            }
        });
    }

    /// The weights of 8 entries, `exp(f64(fl32(fl32(z / div) - sub)))`, with the lanes the
    /// kernel leaves to the platform's `exp` filled in.
    #[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
    #[inline]
    unsafe fn weights8(z: &[f32; 8], div: __m256, sub: __m256) -> __m512d {
        // SAFETY: a load of 8 f32s from an array of 8.
        let y = _mm256_sub_ps(_mm256_div_ps(_mm256_loadu_ps(z.as_ptr()), div), sub);
        let x = _mm512_cvtps_pd(y);
        let (w, others) = exp8(x);
        if others == 0 {
            return w;
        }
        let (mut out, mut arg) = ([0.0f64; 8], [0.0f64; 8]);
        // SAFETY: stores and a load of 8 f64s to and from arrays of 8.
        _mm512_storeu_pd(out.as_mut_ptr(), w);
        _mm512_storeu_pd(arg.as_mut_ptr(), x);
        platform_lanes(&mut out, &arg, others);
        _mm512_loadu_pd(out.as_ptr())
    }

    /// The 8 running sums of `block` (entry `i` into sum `i % 8`), a partial last vector padded
    /// with `-inf` (weight `+0`, which leaves a sum unchanged).
    #[inline(always)]
    fn block_lanes(block: &[f32], mut add8: impl FnMut(&[f32; 8])) {
        let mut vectors = block.chunks_exact(8);
        for v in &mut vectors {
            add8(v.try_into().expect("chunks_exact gives whole vectors"));
        }
        let rest = vectors.remainder();
        if !rest.is_empty() {
            let mut pad = [f32::NEG_INFINITY; 8];
            pad[..rest.len()].copy_from_slice(rest);
            add8(&pad);
        }
    }

    /// See [`super::exp64_block_sums`]: 8 lanes.
    ///
    /// # Safety
    /// The CPU must support AVX-512F, AVX2, FMA, BMI1 and POPCNT.
    #[target_feature(enable = "avx512f,avx2,fma,bmi1,popcnt")]
    pub(super) unsafe fn block_sums_avx512(src: &[f32], div: f32, sub: f32, out: &mut Vec<f64>) {
        let (div, sub) = (_mm256_set1_ps(div), _mm256_set1_ps(sub));
        out.clear();
        for block in src.chunks(BLOCK) {
            let mut acc = _mm512_setzero_pd();
            // SAFETY: `weights8` needs the features this function has.
            block_lanes(block, |z| acc = _mm512_add_pd(acc, unsafe { weights8(z, div, sub) }));
            let mut lanes = [0.0f64; 8];
            // SAFETY: a store of 8 f64s into an array of 8.
            _mm512_storeu_pd(lanes.as_mut_ptr(), acc);
            out.push(reduce8(&lanes));
        }
    }

    /// See [`super::exp64_block_sums`]: two vectors of 4 lanes (the same 8 running sums).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA, BMI1 and POPCNT.
    #[target_feature(enable = "avx2,fma,bmi1,popcnt")]
    pub(super) unsafe fn block_sums_avx2(src: &[f32], div: f32, sub: f32, out: &mut Vec<f64>) {
        let (div, sub) = (_mm256_set1_ps(div), _mm256_set1_ps(sub));
        let half = |x: __m128| {
            // SAFETY: the features this function has.
            unsafe {
                let (w, others) = exp4(_mm256_cvtps_pd(x));
                if others == 0 {
                    return w;
                }
                let (mut out, mut arg) = ([0.0f64; 4], [0.0f64; 4]);
                _mm256_storeu_pd(out.as_mut_ptr(), w);
                _mm256_storeu_pd(arg.as_mut_ptr(), _mm256_cvtps_pd(x));
                platform_lanes(&mut out, &arg, others);
                _mm256_loadu_pd(out.as_ptr())
            }
        };
        out.clear();
        for block in src.chunks(BLOCK) {
            let (mut lo, mut hi) = (_mm256_setzero_pd(), _mm256_setzero_pd());
            block_lanes(block, |z| {
                // SAFETY: a load of 8 f32s from an array of 8.
                let y = unsafe { _mm256_sub_ps(_mm256_div_ps(_mm256_loadu_ps(z.as_ptr()), div), sub) };
                lo = _mm256_add_pd(lo, half(_mm256_castps256_ps128(y)));
                hi = _mm256_add_pd(hi, half(_mm256_extractf128_ps::<1>(y)));
            });
            let mut lanes = [0.0f64; 8];
            // SAFETY: stores of 4 f64s into the halves of an array of 8.
            _mm256_storeu_pd(lanes.as_mut_ptr(), lo);
            _mm256_storeu_pd(lanes.as_mut_ptr().add(4), hi);
            out.push(reduce8(&lanes));
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use tokensieve_testkit::generate::SplitMix64;

    /// The fused block sums of both kernels against the platform's `exp` summed in the same
    /// order ([`block_sums_portable`]), bit for bit: rows with `-inf`, partial blocks and
    /// vectors, and spreads wide enough for lanes left to the platform (`|x| >= 512`).
    #[test]
    fn the_block_sums_are_the_portable_ones() {
        if !(std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")) {
            return;
        }
        let avx512 = std::is_x86_feature_detected!("avx512f");
        let mut rng = SplitMix64::new(17);
        for case in 0..200 {
            let n = 1 + rng.below(700);
            let spread = [3.0, 30.0, 400.0, 2000.0][case % 4];
            let row: Vec<f32> = (0..n)
                .map(|_| if rng.below(9) == 0 { f32::NEG_INFINITY } else { ((rng.next_f64() - 0.5) * spread) as f32 })
                .collect();
            let (div, sub) = ([1.0f32, 0.8, 1.7][case % 3], [0.0f32, 2.5, 300.0][case % 3]);
            let mut want = Vec::new();
            block_sums_portable(&row, div, sub, &mut want);
            for wide in [false, true].into_iter().filter(|&w| !w || avx512) {
                // SAFETY: the features were detected above.
                if !unsafe { replica_agrees(wide) } {
                    return;
                }
                let mut got = Vec::new();
                // SAFETY: as above.
                unsafe { block_sums(&row, div, sub, &mut got, wide) };
                let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "case {case}, n {n}, 8 lanes: {wide}");
            }
        }
    }

    /// Both kernels against the platform's `exp`, bit for bit, on random f64s across the range
    /// (and on f32 differences `z - max`, the transformers weights' arguments), wherever the
    /// CPU runs them and the replica agrees (glibc's FMA build).
    #[test]
    fn the_kernels_give_the_platform_exp_bits() {
        if !(std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")) {
            return;
        }
        let avx512 = std::is_x86_feature_detected!("avx512f");
        for wide in [false, true] {
            if wide && !avx512 {
                continue;
            }
            // SAFETY: the features were detected above.
            let agrees = unsafe { replica_agrees(wide) };
            // glibc's `exp` has been this algorithm since 2.28 (2018): on glibc the replica must
            // agree, or a kernel is broken (elsewhere it is simply left unused).
            assert!(agrees || !cfg!(all(target_os = "linux", target_env = "gnu")), "the replica disagrees with glibc");
            if !agrees {
                return;
            }
            let mut rng = SplitMix64::new(5 + wide as u64);
            for round in 0..64 {
                let xs: Vec<f64> = (0..4093)
                    .map(|_| match round % 4 {
                        0 => (rng.next_f64() - 0.9) * 1600.0,
                        1 => -rng.next_f64() * 40.0,
                        2 => f64::from(((rng.next_f64() * -30.0) as f32) - 0.0f32),
                        _ => f64::from_bits(rng.next_u64()),
                    })
                    .collect();
                let mut got = xs.clone();
                // SAFETY: as above.
                unsafe { exp_in_place(&mut got, wide) };
                for (&x, &g) in xs.iter().zip(&got) {
                    assert!(g.to_bits() == x.exp().to_bits() || (g.is_nan() && x.is_nan()), "exp({x:e}) = {g:e}");
                }
            }
        }
    }
}
