//! Realistic logit rows for benchmarks (feature `bench`), shared by `tokensieve bench` and the
//! `tokensieve-bench` crate so that every timing is taken on the same data.
//!
//! * [`Shape::Peaked`]: shaped like a language model's output: a Zipf-like rank profile
//!   (`-1.1·ln rank` plus Gaussian noise), shuffled over the vocabulary, scaled so that the
//!   softmax entropy is [`PEAKED_ENTROPY`] nats (real models sit between about 0.5 and 3), and
//!   shifted so the maximum is near +15 as in real logits.
//! * [`Shape::Flat`]: nearly uniform (Gaussian with σ = 0.05): entropy close to `ln V`, no
//!   exact ties to speak of. The adversarial case for truncation (top-p keeps most of it).
//! * [`Shape::Wide`]: N(0, 30²): most values outside [-10, 10], where llama.cpp's fixed-range
//!   bucket sort degenerates.
//!
//! Rows are fully determined by `(shape, V, seed)` (SplitMix64), identical on every platform.

/// Target softmax entropy of [`Shape::Peaked`] rows, in nats.
pub const PEAKED_ENTROPY: f64 = 1.5;

/// The row shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Language-model-like, entropy [`PEAKED_ENTROPY`].
    Peaked,
    /// Nearly uniform.
    Flat,
    /// Values far outside [-10, 10].
    Wide,
}

struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / 9007199254740992.0)
    }
    fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.unit();
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// Softmax entropy of `row` in nats (f64).
pub fn entropy(row: &[f32]) -> f64 {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    row.iter()
        .map(|&x| {
            let p = (x as f64 - max).exp() / sum;
            if p > 0.0 {
                -p * p.ln()
            } else {
                0.0
            }
        })
        .sum()
}

/// A row of `v` logits of the given shape (`v >= 1`).
///
/// ```
/// use tokensieve::bench_rows::{entropy, row, Shape, PEAKED_ENTROPY};
/// let r = row(Shape::Peaked, 32_000, 1);
/// assert!((entropy(&r) - PEAKED_ENTROPY).abs() < 0.05);
/// ```
pub fn row(shape: Shape, v: usize, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix64(seed ^ 0x7e57_0000 ^ ((v as u64) << 32));
    match shape {
        Shape::Flat => (0..v).map(|_| (rng.normal() * 0.05) as f32).collect(),
        Shape::Wide => (0..v).map(|_| (rng.normal() * 30.0) as f32).collect(),
        Shape::Peaked => {
            let mut base: Vec<f64> = (0..v).map(|rank| -1.1 * ((rank + 1) as f64).ln() + 0.5 * rng.normal()).collect();
            // Fisher-Yates shuffle: the ranks land on random token ids.
            for i in (1..v).rev() {
                let j = (rng.next_u64() % (i as u64 + 1)) as usize;
                base.swap(i, j);
            }
            let scaled = |a: f64| -> Vec<f32> { base.iter().map(|&b| (a * b) as f32).collect() };
            // Entropy falls as the scale grows: bisect for the target.
            let (mut lo, mut hi) = (0.05f64, 50.0f64);
            for _ in 0..40 {
                let mid = (lo * hi).sqrt();
                if entropy(&scaled(mid)) > PEAKED_ENTROPY {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            let mut r = scaled((lo * hi).sqrt());
            let max = r.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            r.iter_mut().for_each(|x| *x += 15.0 - max);
            r
        }
    }
}
