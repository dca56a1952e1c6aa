//! Deterministic logit rows for property tests and benchmarks: realistic shapes and the
//! adversarial ones that break fast paths (exact ties, `-inf`, flat rows, huge magnitudes,
//! values outside llama.cpp's [-10, 10] bucket range, V = 1), plus proptest [`Strategy`]s
//! mixing them.
//!
//! Rows are produced by [`row`] from `(kind, V, seed)` with a small self-contained PRNG
//! ([`SplitMix64`]), so the same triple always gives the same bits on every platform. The
//! strategies draw that triple (or build rows element by element, which shrinks well) and
//! never produce NaN or `+inf` unless asked to ([`invalid_row`]).

use proptest::prelude::*;

/// SplitMix64 (Steele, Lea, Flood 2014): a tiny, fast, statistically solid 64-bit generator,
/// used here only to make test data reproducible without a `rand` dependency.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator started at `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / 9007199254740992.0)
    }

    /// Uniform integer in `0..n` (`n > 0`; the modulo bias is irrelevant for test data).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Standard normal deviate (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64(); // (0, 1]
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Fisher–Yates shuffle.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

/// The shapes of logit rows the generators produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowKind {
    /// N(0, 3²): a generic spread-out row.
    Gaussian,
    /// LM-like: `2·(−1.1·ln rank + 0.5·N(0,1))`, shuffled (a Zipf(1.1)-ish distribution).
    Peaked,
    /// One constant for every token (every candidate tied).
    Flat,
    /// N(0, 2²) rounded to multiples of 0.5, maximum duplicated: many exact ties.
    Ties,
    /// N(0, 3²) with `max(1, V/20)` entries `-inf` (at least one entry stays finite).
    NegInf,
    /// N(0, 1)·5000 clamped to ±1e4, with V/16 entries exactly `+1e4` and V/16 exactly `-1e4`:
    /// magnitudes far outside [-10, 10], exact ties at both ends, `expf` underflow.
    Huge,
    /// `−1.1·ln rank + 0.5·N(0,1) + 20`, shuffled: nearly every logit above +10 (llama.cpp's
    /// top bucket).
    ShiftedUp,
    /// N(0, 3²) − 15: nearly every logit below −10 (llama.cpp's bottom bucket).
    ShiftedDown,
    /// N(0, 3²) rounded to bfloat16 precision (ties appear at large V).
    Bf16,
}

impl RowKind {
    /// Every kind, for exhaustive loops.
    pub const ALL: [RowKind; 9] = [
        RowKind::Gaussian,
        RowKind::Peaked,
        RowKind::Flat,
        RowKind::Ties,
        RowKind::NegInf,
        RowKind::Huge,
        RowKind::ShiftedUp,
        RowKind::ShiftedDown,
        RowKind::Bf16,
    ];
}

fn round_bf16(x: f32) -> f32 {
    // Round to nearest even on the upper 16 bits (finite inputs only).
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7FFF + ((b >> 16) & 1)) & 0xFFFF_0000;
    f32::from_bits(rounded)
}

/// A row of `v` logits of the given kind, fully determined by `(kind, v, seed)`. Every row
/// has at least one finite logit and contains no NaN or `+inf`.
pub fn row(kind: RowKind, v: usize, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed ^ (kind as u64).wrapping_mul(0xA076_1D64_78BD_642F) ^ ((v as u64) << 40));
    let gauss = |rng: &mut SplitMix64, sd: f64| (rng.normal() * sd) as f32;
    let peaked = |rng: &mut SplitMix64, scale: f64| {
        let mut r: Vec<f32> =
            (0..v).map(|rank| (scale * (-1.1 * ((rank + 1) as f64).ln() + 0.5 * rng.normal())) as f32).collect();
        rng.shuffle(&mut r);
        r
    };
    match kind {
        RowKind::Gaussian => (0..v).map(|_| gauss(&mut rng, 3.0)).collect(),
        RowKind::Peaked => peaked(&mut rng, 2.0),
        RowKind::Flat => {
            let c = gauss(&mut rng, 3.0);
            vec![c; v]
        }
        RowKind::Ties => {
            let mut r: Vec<f32> = (0..v).map(|_| ((rng.normal() * 4.0).round() / 2.0) as f32).collect();
            if v >= 2 {
                let (imax, &max) = r.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).expect("v >= 2");
                let j = (imax + 1 + rng.below(v - 1)) % v;
                r[j] = max;
            }
            r
        }
        RowKind::NegInf => {
            let mut r: Vec<f32> = (0..v).map(|_| gauss(&mut rng, 3.0)).collect();
            let n_masked = (v / 20).max(1).min(v.saturating_sub(1));
            let mut idx: Vec<usize> = (0..v).collect();
            rng.shuffle(&mut idx);
            for &i in &idx[..n_masked] {
                r[i] = f32::NEG_INFINITY;
            }
            r
        }
        RowKind::Huge => {
            let mut r: Vec<f32> = (0..v).map(|_| (rng.normal() * 5000.0).clamp(-1e4, 1e4) as f32).collect();
            let n_end = v / 16;
            let mut idx: Vec<usize> = (0..v).collect();
            rng.shuffle(&mut idx);
            for &i in &idx[..n_end] {
                r[i] = 1e4;
            }
            for &i in &idx[n_end..2 * n_end] {
                r[i] = -1e4;
            }
            r
        }
        RowKind::ShiftedUp => peaked(&mut rng, 1.0).into_iter().map(|x| x + 20.0).collect(),
        RowKind::ShiftedDown => (0..v).map(|_| gauss(&mut rng, 3.0) - 15.0).collect(),
        RowKind::Bf16 => (0..v).map(|_| round_bf16(gauss(&mut rng, 3.0))).collect(),
    }
}

/// A row whose every logit is `-inf` (valid input; a selecting stage must return an error).
pub fn all_masked(v: usize) -> Vec<f32> {
    vec![f32::NEG_INFINITY; v]
}

/// Any [`RowKind`], uniformly.
pub fn row_kind() -> impl Strategy<Value = RowKind> {
    proptest::sample::select(RowKind::ALL.to_vec())
}

/// A vocabulary size in `1..=max_v`, weighted towards the sizes where algorithms switch:
/// V = 1 (5%), 2..=8 (25%), 9..=128 (40%, llama.cpp's heap-select range), 129..=max_v
/// (30%, bucket sort; and top-p's 256/1024 thresholds when `max_v` allows).
pub fn vocab_size(max_v: usize) -> BoxedStrategy<usize> {
    let max_v = max_v.max(1);
    let small = 8.min(max_v);
    let mid = 128.min(max_v);
    let mut choices: Vec<(u32, BoxedStrategy<usize>)> = vec![(5, Just(1usize).boxed())];
    if max_v >= 2 {
        choices.push((25, (2..=small).boxed()));
    }
    if max_v >= 9 {
        choices.push((40, (9..=mid).boxed()));
    }
    if max_v >= 129 {
        choices.push((30, (129..=max_v).boxed()));
    }
    proptest::strategy::Union::new_weighted(choices).boxed()
}

/// A generated row: `(kind, V, seed)` mapped through [`row`]. Shrinks towards smaller V.
pub fn generated_row(max_v: usize) -> impl Strategy<Value = Vec<f32>> {
    (row_kind(), vocab_size(max_v), any::<u64>()).prop_map(|(kind, v, seed)| row(kind, v, seed))
}

/// One adversarial logit value: ordinary values, a few exact tie values, `-inf`, ±1e4, and
/// values beyond ±10 (never NaN or `+inf`).
pub fn logit_value() -> impl Strategy<Value = f32> {
    prop_oneof![
        8 => -8.0f32..8.0,
        3 => proptest::sample::select(vec![0.0f32, -0.0, 0.5, 1.0, -1.0, 2.5, 7.0]),
        2 => Just(f32::NEG_INFINITY),
        1 => proptest::sample::select(vec![1e4f32, -1e4, 9999.5]),
        1 => 10.0f32..40.0,
        1 => -40.0f32..-10.0,
    ]
}

/// A row built element by element from [`logit_value`] (shrinks well), with at least one
/// finite logit.
pub fn elementwise_row(max_v: usize) -> impl Strategy<Value = Vec<f32>> {
    vocab_size(max_v).prop_flat_map(|v| proptest::collection::vec(logit_value(), v)).prop_map(|mut r| {
        if r.iter().all(|x| *x == f32::NEG_INFINITY) {
            r[0] = 0.0;
        }
        r
    })
}

/// The default row strategy: generated shapes and element-wise adversarial rows, half and
/// half. Every row has `1..=max_v` entries, at least one of them finite, no NaN or `+inf`.
pub fn any_row(max_v: usize) -> impl Strategy<Value = Vec<f32>> {
    prop_oneof![generated_row(max_v), elementwise_row(max_v)]
}

/// Like [`any_row`], but one row in eight has every logit `-inf`.
pub fn any_row_maybe_all_masked(max_v: usize) -> impl Strategy<Value = Vec<f32>> {
    prop_oneof![7 => any_row(max_v), 1 => vocab_size(max_v).prop_map(all_masked)]
}

/// A row with at least one NaN or `+inf`, which every sampling call must reject as an error.
pub fn invalid_row(max_v: usize) -> impl Strategy<Value = Vec<f32>> {
    (any_row(max_v), any::<prop::sample::Index>(), prop::bool::ANY, 0usize..3).prop_map(|(mut r, at, nan, extra)| {
        let bad = if nan { f32::NAN } else { f32::INFINITY };
        let i = at.index(r.len());
        r[i] = bad;
        for k in 0..extra {
            let j = (i + 7 * (k + 1)) % r.len();
            r[j] = if k % 2 == 0 { f32::NAN } else { f32::INFINITY };
        }
        r
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_deterministic_and_valid() {
        for kind in RowKind::ALL {
            for v in [1, 2, 7, 50, 300] {
                let a = row(kind, v, 99);
                assert_eq!(a, row(kind, v, 99), "{kind:?}");
                assert_eq!(a.len(), v);
                assert!(a.iter().all(|x| !x.is_nan() && *x != f32::INFINITY), "{kind:?}");
                assert!(a.iter().any(|x| x.is_finite()), "{kind:?} V={v}");
            }
        }
    }

    #[test]
    fn adversarial_kinds_have_their_property() {
        let t = row(RowKind::Ties, 100, 1);
        let max = t.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        assert!(t.iter().filter(|&&x| x == max).count() >= 2);
        assert!(t.iter().all(|x| (x * 2.0).fract() == 0.0));
        assert!(row(RowKind::NegInf, 100, 1).iter().filter(|x| x.is_infinite()).count() == 5);
        assert!(row(RowKind::ShiftedUp, 100, 1).iter().filter(|&&x| x > 10.0).count() > 90);
        assert!(row(RowKind::ShiftedDown, 100, 1).iter().filter(|&&x| x < -10.0).count() > 90);
        let h = row(RowKind::Huge, 160, 1);
        assert!(h.iter().filter(|&&x| x == 1e4).count() >= 10);
        let f = row(RowKind::Flat, 10, 1);
        assert!(f.iter().all(|&x| x == f[0]));
        assert_eq!(round_bf16(1.0 + 1e-4), 1.0);
    }

    #[test]
    fn splitmix_matches_the_reference_sequence() {
        // First outputs of the reference implementation seeded with 1234567.
        let mut r = SplitMix64::new(1234567);
        assert_eq!(r.next_u64(), 6457827717110365317);
        assert_eq!(r.next_u64(), 3203168211198807973);
    }

    #[test]
    fn normal_deviates_have_unit_variance() {
        let mut r = SplitMix64::new(5);
        let xs: Vec<f64> = (0..20000).map(|_| r.normal()).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!(mean.abs() < 0.03 && (var - 1.0).abs() < 0.05, "{mean} {var}");
    }
}
