//! `top_n_sigma(n)`: masks every candidate whose logit is more than `n` standard deviations
//! below the maximum.
//!
//! llama.cpp convention (`llama_sampler_top_n_sigma`, commit 0c1e570):
//!
//! * `n <= 0` builds an inert stage (`?top-n-sigma`); fewer than two candidates: no-op.
//! * Statistics over the candidates whose logit is not `-inf`: the maximum (starting from the
//!   first entry's logit), the mean (f32 sum divided by the count), and the **population**
//!   standard deviation: each squared deviation computed in f64 (C++'s `pow(float, 2)`) and
//!   added into an f32 accumulator, then `sqrt(acc / count)` in f32.
//! * Every candidate with `logit < max - n·σ` gets `-inf`; nothing is removed (the size is
//!   unchanged), nothing is sorted, `p` is not touched (the newest llama.cpp stops here; older
//!   versions then sorted and ran a softmax). The sorted flag is kept: masking a suffix of a
//!   sorted array leaves it sorted.
//! * All logits `-inf`: the threshold is `-inf` and nothing changes. All finite logits equal:
//!   `σ = 0`, only those equal to the maximum survive (all of them).
//!
//! Where tokensieve differs: NaN or infinite `n` is a parameter error (llama.cpp would compute
//! `inf · 0 = NaN` for a flat row, or mask nothing).
//!
//! # Speed
//!
//! llama.cpp's two sums run one f32 addition after another: two chains of 128k dependent
//! additions at V = 128k, half a millisecond. But the statistics matter only through which
//! logits fall below the threshold, and the rounding of a sequential sum is bounded (Higham's
//! `γ_{n-1} Σ|x_i|`), so the row's count, `Σ x` and `Σ x²` are summed in SIMD lanes
//! (`arch::moments`) and bound an interval that must hold llama.cpp's f32 threshold, about
//! `0.4%` of `n·σ` wide at V = 128k. Where a logit lies in it, a second pass bounds the
//! accumulation from the partial sums' growth and binades instead (about 0.4 as wide). Where
//! no logit lies in the interval, every mask is decided without the sequential sums; otherwise
//! they run as written. That is most language-model rows; on a Gaussian row the threshold lies
//! where logits are dense, and on a row whose mean is far from zero beside a small spread
//! (`Σ x²` then cancels) the interval says nothing. Sampling from a whole row also skips the candidate array
//! (`convention::llama_cpp::dense`).

use super::{require_finite, BuildContext, FromSpec, Sampler};
use crate::arch;
use crate::candidates::{Candidates, TokenData};
use crate::convention::llama_cpp;
use crate::convention::llama_cpp::dense::{f32_at_least, f32_at_most};
use crate::error::Result;
use crate::params::spec::Bound;

/// Top-n-sigma masking.
///
/// ```
/// use tokensieve::{Candidates, sampler::{top_n_sigma::TopNSigma, Sampler}};
/// // mean 1.5, σ ≈ 1.118: n = 1 keeps logits >= 3 - 1.118.
/// let mut c = Candidates::from_logits(&[0.0, 1.0, 2.0, 3.0]).unwrap();
/// TopNSigma::new(1.0).unwrap().apply(&mut c).unwrap();
/// assert_eq!(c.len(), 4); // masked, not removed
/// assert_eq!(c.count_finite(), 2);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct TopNSigma {
    n: f32,
}

impl TopNSigma {
    /// Top-n-sigma with `n` standard deviations (finite; `<= 0` = off).
    pub fn new(n: f32) -> Result<Self> {
        Ok(TopNSigma { n: require_finite("top_n_sigma", "n", n)? })
    }

    /// The number of standard deviations.
    pub(crate) fn n(&self) -> f32 {
        self.n
    }

    /// llama.cpp's loops as written: the f32 statistics, then the mask.
    fn apply_exact(&self, data: &mut [TokenData]) {
        let mut max = data[0].logit;
        let mut sum = 0.0f32;
        let mut count = 0usize;
        for t in data.iter().filter(|t| t.logit != f32::NEG_INFINITY) {
            max = llama_cpp::std_max(max, t.logit);
            sum += t.logit;
            count += 1;
        }
        let mean = if count > 0 { sum / count as f32 } else { 0.0 };
        let mut acc = 0.0f32;
        for t in data.iter().filter(|t| t.logit != f32::NEG_INFINITY) {
            let d = (t.logit - mean) as f64;
            acc = (acc as f64 + d * d) as f32;
        }
        let std = if count > 0 { (acc / count as f32).sqrt() } else { 0.0 };
        let threshold = max - self.n * std;
        for t in data.iter_mut() {
            if t.logit < threshold {
                t.logit = f32::NEG_INFINITY;
            }
        }
    }
}

/// Sums over the logits other than `-inf` that bound llama.cpp's statistics of them
/// ([`Moments::threshold_bounds`]): [`arch::moments`]' count, maximum, `Σ x` and `Σ x²`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Moments {
    count: usize,
    max: f32,
    sum: f64,
    sq: f64,
}

impl Moments {
    /// The moments of a row.
    pub(crate) fn of_row(r: &[f32]) -> Moments {
        let (count, max, sum, sq) = arch::moments(r);
        Moments { count, max, sum, sq }
    }

    /// The moments of the candidates' logits (the same lanes, without SIMD intrinsics).
    pub(crate) fn of_candidates(data: &[TokenData]) -> Moments {
        let (count, max, sum, sq) = arch::portable::moments::<_, false>(data, |t| t.logit);
        Moments { count, max, sum, sq }
    }

    /// f32 bounds on llama.cpp's mean `fl32(sum / c)`, its sum `sum` being within `γ_c·abs`
    /// of `Σ x`, and `self.sum` within `e_true` of that (see [`Moments::threshold_bounds`]).
    fn mean_bounds(&self, abs: f64, e_true: f64) -> (f32, f32) {
        let c = self.count as f64;
        let u = 2f64.powi(-24);
        let slack = 8.0 * c * 2f64.powi(-53);
        let e_sum = e_true + c * u / (1.0 - c * u) * abs;
        let (s_lo, s_hi) = ((self.sum - e_sum) / c, (self.sum + e_sum) / c);
        (f32_at_most(s_lo - s_lo.abs() * slack), f32_at_least(s_hi + s_hi.abs() * slack))
    }

    /// `(lo, hi)`: llama.cpp's threshold `max - n·σ` for these logits lies in `[lo, hi]`, so a
    /// logit below `lo` is masked and one at or above `hi` is kept, whatever order its sums
    /// ran in. `None` where the bounds do not hold or say nothing: fewer than two logits, a
    /// count that f32 does not hold exactly, a NaN or infinite sum, a threshold that may be
    /// infinite.
    ///
    /// With `u = 2^-24` and `c` logits:
    /// * the sums here are within [`arch::moments`]' bound of `Σ x` and `Σ x²`, and
    ///   `Σ |x| <= sqrt(c·Σ x²)` (Cauchy-Schwarz) stands in for the absolute sum;
    /// * llama.cpp's f32 sum lies within `γ_c·Σ|x|` of `Σ x` (`γ_c = c·u / (1 - c·u)`, Higham's
    ///   bound for recursive summation in any order), and its mean `fl32(sum / c)` between the
    ///   f32 roundings (down, up) of the ends divided by `c`;
    /// * each deviation `fl32(x - mean)` is within `u` of `x - mean`, relatively; its square
    ///   is exact in f64; so the squares sum to within `(1 ± u)²` of
    ///   `Q(m) = Σ x² - 2m·Σ x + c·m²`, bounded over the mean's interval (convex in `m`);
    /// * each step of the accumulation `fl32(fl64(acc + d²))` errs by at most
    ///   `(2^-24 + 2^-52)·|acc + d²|` (or `2^-150` below f32's normal range), so it lies within
    ///   `γ_c` (with that unit) of the exact sum of the squares;
    /// * `σ = sqrt(fl32(acc / c))` and `max - n·σ` are f32 operations, monotone in `acc`,
    ///   computed here at both ends of its interval.
    ///
    /// The f64 sums and the evaluation of `Q` err by far less than the slack added for them
    /// (`8·c·2^-53` of every magnitude involved).
    pub(crate) fn threshold_bounds(&self, n: f32) -> Option<(f32, f32)> {
        self.bounds(n, None)
    }

    /// [`Moments::threshold_bounds`], narrower (about 0.4 as wide at V = 128k): llama.cpp's
    /// accumulation of the squares bounded from these logits (`value` of `items`, the ones
    /// the moments were taken of) in a second pass ([`accumulation_error`]) instead of by
    /// `γ_c`. For where the first interval holds a logit.
    pub(crate) fn refined_threshold_bounds<T>(
        &self,
        n: f32,
        items: &[T],
        value: impl Fn(&T) -> f32,
    ) -> Option<(f32, f32)> {
        self.bounds(n, Some(&|m_lo, m_hi| accumulation_error(items, &value, m_lo, m_hi)))
    }

    /// The threshold's bounds, llama.cpp's accumulation of the squares bounded by `γ_c` or by
    /// `refine(m_lo, m_hi)` (a bound for every mean in `[m_lo, m_hi]`) where that is smaller.
    fn bounds(&self, n: f32, refine: Option<&dyn Fn(f64, f64) -> f64>) -> Option<(f32, f32)> {
        let Moments { count, max, sum, sq } = *self;
        if !((2..1 << 24).contains(&count) && sum.is_finite() && sq.is_finite() && max.is_finite()) {
            return None;
        }
        let c = count as f64;
        let u = 2f64.powi(-24);
        let gamma = |k: f64, unit: f64| k * unit / (1.0 - k * unit);
        let slack = 8.0 * c * 2f64.powi(-53);
        let tiny = c * 2f64.powi(-149);
        // The sums' distance from the exact ones, and a bound on the absolute sum.
        let run = gamma((arch::MOMENT_RUN + 1) as f64, u) + slack;
        let abs = (c * (sq * (1.0 + run) + tiny)).sqrt() * (1.0 + slack);
        let e_true = run * abs + tiny;
        let e_sq = run * sq + tiny;
        let (m_lo, m_hi) = self.mean_bounds(abs, e_true);
        let (m_lo, m_hi) = (m_lo as f64, m_hi as f64);
        // The sum of the squared deviations for a mean in [m_lo, m_hi].
        let q = |m: f64| sq - 2.0 * m * sum + c * m * m;
        let q_err = |m: f64| e_sq + 2.0 * m.abs() * e_true + slack * (sq + 2.0 * m.abs() * abs + c * m * m);
        let vertex = (sum / c).clamp(m_lo, m_hi);
        let q_min = q(vertex) - q_err(vertex);
        let q_max = q(m_lo).max(q(m_hi)) + q_err(m_lo).max(q_err(m_hi));
        // The squares' exact sum, then llama.cpp's f32 accumulation of them.
        let (sq_lo, sq_hi) = (q_min * (1.0 - u) * (1.0 - u), q_max * (1.0 + u) * (1.0 + u));
        let mut e_acc = gamma(c, u + 2f64.powi(-52)) * sq_hi;
        if let Some(refine) = refine {
            e_acc = e_acc.min(refine(m_lo, m_hi));
        }
        let acc_lo = ((sq_lo - e_acc) * (1.0 - slack) - tiny).max(0.0);
        let acc_hi = (sq_hi + e_acc) * (1.0 + slack) + tiny;
        let cf = count as f32;
        let sigma_lo = (f32_at_least(acc_lo) / cf).sqrt();
        let sigma_hi = (f32_at_most(acc_hi) / cf).sqrt();
        let (lo, hi) = (max - n * sigma_hi, max - n * sigma_lo);
        (lo.is_finite() && hi.is_finite()).then_some((lo, hi))
    }
}

/// A bound on how far llama.cpp's accumulation `acc = fl32(fl64(acc + d²))` of the squared
/// deviations `d = fl32(x - m)` of the logits (`value` of `items`, `-inf` skipped) lies from
/// their exact sum, for every mean `m` in `[m_lo, m_hi]`.
///
/// Each step errs by at most half an f32 ulp of its result (plus the f64 rounding, `2^-28` of
/// that), and the results grow with the partial sums: in runs of [`REFINE_RUN`] logits, every
/// partial sum up to a run's end is at most `(1 + γ_c)` times the exact prefix up to it, which
/// `(|x - m_c| + h)²·(1 + u)²` bounds term by term (`m_c`, `h`: the interval's middle and
/// half-width). So each of a run's steps errs by at most `u` times the power of two at or
/// below that bound (and `2^-150` below f32's normal range). Where the deviations are spread
/// along the row, this is about a third of Higham's `γ_c·Σ d²`: half from the partial sums'
/// growth, and about 0.7 from the binades.
fn accumulation_error<T>(items: &[T], value: &impl Fn(&T) -> f32, m_lo: f64, m_hi: f64) -> f64 {
    const LANES: usize = 8;
    let u = 2f64.powi(-24);
    let (mc, h) = (0.5 * (m_lo + m_hi), 0.5 * (m_hi - m_lo));
    let kept_total = items.iter().filter(|t| value(t) != f32::NEG_INFINITY).count() as f64;
    let unit = u + 2f64.powi(-52);
    let gamma = kept_total * unit / (1.0 - kept_total * unit);
    // The squares' rounding (d against x - m), and the f64 arithmetic here.
    let grow = (1.0 + u) * (1.0 + u) * (1.0 + 2f64.powi(-40));
    let pow2_below = |x: f64| if x > 0.0 { f64::from_bits(x.to_bits() & 0xfff0_0000_0000_0000) } else { 0.0 };
    let (mut prefix, mut err) = (0.0f64, 0.0f64);
    for run in items.chunks(REFINE_RUN) {
        let (mut lanes, mut kept) = ([0.0f64; LANES], [0u32; LANES]);
        let (chunks, tail) = run.as_chunks::<LANES>();
        let mut add = |j: usize, x: f32| {
            let keep = x != f32::NEG_INFINITY;
            let a = if keep { (x as f64 - mc).abs() + h } else { 0.0 };
            lanes[j] += a * a;
            kept[j] += u32::from(keep);
        };
        for c in chunks {
            for (j, t) in c.iter().enumerate() {
                add(j, value(t));
            }
        }
        for (j, t) in tail.iter().enumerate() {
            add(j, value(t));
        }
        prefix += lanes.iter().sum::<f64>() * grow;
        let steps = kept.iter().sum::<u32>() as f64;
        // `1 + 2^-20`: a step's exact result may round up into the next binade.
        err += steps * u * pow2_below(prefix * (1.0 + gamma) * (1.0 + 2f64.powi(-20))) * (1.0 + 2f64.powi(-27));
    }
    err + kept_total * 2f64.powi(-150)
}

/// The run length of [`accumulation_error`]: the partial sums inside a run are bounded by the
/// prefix at its end.
const REFINE_RUN: usize = 1024;

impl Sampler for TopNSigma {
    fn name(&self) -> &'static str {
        if self.is_inert() {
            "?top-n-sigma"
        } else {
            "top-n-sigma"
        }
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        if self.is_inert() || c.len() <= 1 {
            return Ok(());
        }
        let data = c.as_mut_slice();
        // PERF: the statistics bounded from SIMD lane sums decide every mask unless a logit lies
        // in the bounds' interval (see the module docs): 0.5 ms -> a pass or two at V = 128k.
        let moments = Moments::of_candidates(data);
        let decides = |(lo, hi): (f32, f32)| !data.iter().any(|t| t.logit >= lo && t.logit < hi);
        let bounds = moments.threshold_bounds(self.n).and_then(|b| {
            if decides(b) {
                Some(b)
            } else {
                moments.refined_threshold_bounds(self.n, data, |t| t.logit).filter(|&b| decides(b))
            }
        });
        if let Some((lo, _)) = bounds {
            for t in data.iter_mut().filter(|t| t.logit < lo) {
                t.logit = f32::NEG_INFINITY;
            }
            return Ok(());
        }
        self.apply_exact(data);
        Ok(())
    }

    fn is_inert(&self) -> bool {
        self.n <= 0.0
    }
}

impl FromSpec for TopNSigma {
    const PARAMS: &'static [&'static str] = &["n"];
    fn from_spec(args: &Bound<'_>, _: &BuildContext<'_>) -> Result<Self> {
        TopNSigma::new(args.f32("n", None)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_cpp_test_vector() {
        // tests/test-sampling.cpp: probs {.1,.2,.3,.4}, n = 1 leaves the two largest.
        let logits: Vec<f32> = [0.1f32, 0.2, 0.3, 0.4].iter().map(|p| p.ln()).collect();
        let mut c = Candidates::from_logits(&logits).unwrap();
        TopNSigma::new(1.0).unwrap().apply(&mut c).unwrap();
        let finite: Vec<u32> = c.as_slice().iter().filter(|t| t.logit.is_finite()).map(|t| t.id).collect();
        assert_eq!(finite, [2, 3]);
        assert_eq!(c.len(), 4);
    }

    #[test]
    fn masked_candidates_are_left_out_of_the_statistics() {
        let mut c = Candidates::from_logits(&[f32::NEG_INFINITY, 0.0, 1.0, 2.0, 3.0]).unwrap();
        TopNSigma::new(1.0).unwrap().apply(&mut c).unwrap();
        assert_eq!(c.count_finite(), 2);
    }

    #[test]
    fn flat_and_fully_masked_rows_are_unchanged() {
        let mut c = Candidates::from_logits(&[1.5; 4]).unwrap();
        TopNSigma::new(2.0).unwrap().apply(&mut c).unwrap();
        assert_eq!(c.count_finite(), 4);
        let mut c = Candidates::from_logits(&[f32::NEG_INFINITY; 3]).unwrap();
        TopNSigma::new(2.0).unwrap().apply(&mut c).unwrap();
        assert_eq!(c.len(), 3);
    }

    /// llama.cpp's threshold, by its loops as written (`apply_exact`'s statistics).
    fn exact_threshold(xs: &[f32], n: f32) -> f32 {
        let kept = || xs.iter().copied().filter(|&x| x != f32::NEG_INFINITY);
        let max = kept().fold(xs[0], llama_cpp::std_max);
        let count = kept().count();
        let mean = kept().fold(0.0f32, |s, x| s + x) / count as f32;
        let acc = kept().fold(0.0f32, |acc, x| {
            let d = (x - mean) as f64;
            (acc as f64 + d * d) as f32
        });
        max - n * (acc / count as f32).sqrt()
    }

    /// Rows whose statistics stress the bounds: the generator's kinds at several sizes and
    /// offsets (a mean far from 0 beside a small spread: cancellation in `Q`), subnormal and
    /// huge magnitudes, `-inf` entries, rows of two or three entries, rows of two values.
    fn rows() -> Vec<(String, Vec<f32>)> {
        use tokensieve_testkit::generate::{self, RowKind};
        let mut rows = vec![];
        for (i, v) in [2usize, 3, 17, 1000, 4099, 32_000, 128_256].into_iter().enumerate() {
            for kind in RowKind::ALL {
                for (scale, shift) in [(1.0f32, 0.0f32), (0.01, 40.0), (30.0, -5.0), (1e-40, 0.0), (1e18, 0.0)] {
                    let row =
                        generate::row(kind, v, i as u64 * 31 + 5).into_iter().map(|x| x * scale + shift).collect();
                    rows.push((format!("{kind:?} x{scale}+{shift} V={v}"), row));
                }
            }
            // Two values, `b ± a`: every squared deviation the same, so the accumulation rounds
            // the same way at every step of a binade (the worst case the bounds allow for).
            for (a, b) in [(1.7f32, 0.0f32), (1.1, 0.0), (0.3, 2.0), (3.1, -7.0)] {
                let row = (0..v).map(|i| if i % 2 == 0 { b + a } else { b - a }).collect();
                rows.push((format!("two-valued {b}±{a} V={v}"), row));
            }
        }
        rows
    }

    /// The bounds, first and refined, hold llama.cpp's threshold wherever they are given, and
    /// are given (and narrow enough to decide every mask) on most language-model-like rows;
    /// the refined ones lie inside the first, and narrower on peaked rows (median below 3/4;
    /// about 0.4 at V = 128k, where the accumulation's bound dominates).
    #[test]
    fn the_bounds_hold_the_threshold() {
        let (mut given, mut decided, mut refined, mut peaked) = (0, 0, 0, 0);
        let mut narrowing = vec![];
        for (name, row) in rows() {
            for n in [0.5f32, 1.0, 2.0, 3.7] {
                let exact = exact_threshold(&row, n);
                // The row's (SIMD, fused squares where the CPU has them) and the candidates'
                // (portable, rounded squares) moments differ in their last bits; both bound it.
                let cands = Candidates::from_logits(&row).unwrap();
                if let Some((lo, hi)) = Moments::of_candidates(cands.as_slice()).threshold_bounds(n) {
                    assert!(lo <= exact && exact <= hi, "{name} n {n}: {exact} outside [{lo}, {hi}] (candidates)");
                }
                let moments = Moments::of_row(&row);
                let Some((lo, hi)) = moments.threshold_bounds(n) else { continue };
                given += 1;
                assert!(lo <= exact && exact <= hi, "{name} n {n}: {exact} outside [{lo}, {hi}]");
                let (rlo, rhi) = moments.refined_threshold_bounds(n, &row, |&x| x).expect("given when the first are");
                assert!(rlo <= exact && exact <= rhi, "{name} n {n}: {exact} outside refined [{rlo}, {rhi}]");
                assert!(lo <= rlo && rhi <= hi, "{name} n {n}: refined [{rlo}, {rhi}] not inside [{lo}, {hi}]");
                let sure = !row.iter().any(|&x| x >= lo && x < hi);
                let refined_sure = !row.iter().any(|&x| x >= rlo && x < rhi);
                decided += sure as usize;
                refined += refined_sure as usize;
                if hi - lo > 0.0
                    && row.len() >= 4099
                    && (name.starts_with("Peaked x1+") || name.starts_with("Peaked x30"))
                {
                    narrowing.push(((rhi - rlo) / (hi - lo)) as f64);
                }
                if name.starts_with("Peaked x1+0") && row.len() >= 4099 && n <= 1.0 {
                    peaked += 1;
                    assert!(sure, "{name} n {n}: a logit in [{lo}, {hi}]");
                }
            }
        }
        narrowing.sort_by(f64::total_cmp);
        let median = narrowing[narrowing.len() / 2];
        eprintln!("bounds given {given}, deciding every mask {decided}, refined {refined}; refined width {median:.2} of the first (median)");
        assert!(given > 600 && decided > 500 && peaked == 6, "{given} given, {decided} decided, {peaked} peaked");
        assert!(refined > decided && median < 0.75, "refined {refined} against {decided}, width {median}");
    }

    /// The mean's bounds hold llama.cpp's f32 mean, on rows whose f32 sum errs far more than
    /// its `f64` sums do: a large offset beside a small spread (rounding that loses the same
    /// part of every value). The threshold barely depends on the mean (`Σ (x - m)²` is flat at
    /// the true mean), so this is checked on its own.
    #[test]
    fn the_mean_bounds_hold_the_f32_mean() {
        let mut off = 0;
        for (name, row) in rows() {
            let m = Moments::of_row(&row);
            if m.count < 2 || !m.sum.is_finite() || !m.sq.is_finite() {
                continue;
            }
            let c = m.count as f64;
            let u = 2f64.powi(-24);
            // `threshold_bounds`' own inputs.
            let run = (arch::MOMENT_RUN + 1) as f64 * u / (1.0 - (arch::MOMENT_RUN + 1) as f64 * u)
                + 8.0 * c * 2f64.powi(-53);
            let tiny = c * 2f64.powi(-149);
            let abs = (c * (m.sq * (1.0 + run) + tiny)).sqrt() * (1.0 + 8.0 * c * 2f64.powi(-53));
            let (lo, hi) = m.mean_bounds(abs, run * abs + tiny);
            let kept: Vec<f32> = row.iter().copied().filter(|&x| x != f32::NEG_INFINITY).collect();
            let mean = kept.iter().fold(0.0f32, |s, &x| s + x) / kept.len() as f32;
            assert!(lo <= mean && mean <= hi, "{name}: {mean} outside [{lo}, {hi}]");
            off += (((m.sum / c) - mean as f64).abs() > 1e-4 * (mean as f64).abs()) as usize;
        }
        assert!(off >= 5, "only {off} rows whose f32 mean is off");
    }

    /// `apply` through the bounds leaves the array `apply_exact` leaves, bit for bit, on every
    /// row (deciding by the sums where no logit lies between the bounds).
    #[test]
    fn apply_is_the_exact_loops() {
        for (name, row) in rows() {
            for n in [0.5f32, 1.0, 2.0] {
                let stage = TopNSigma::new(n).unwrap();
                let mut want = Candidates::from_logits(&row).unwrap();
                stage.apply_exact(want.as_mut_slice());
                let mut got = Candidates::from_logits(&row).unwrap();
                let mut s = stage;
                s.apply(&mut got).unwrap();
                let bits = |c: &Candidates| c.as_slice().iter().map(|t| t.logit.to_bits()).collect::<Vec<_>>();
                assert!(bits(&got) == bits(&want), "{name} n {n}");
            }
        }
    }

    /// NaN and `+inf` among the candidates (a stage before can make them): no bounds, and the
    /// loops as written.
    #[test]
    fn nan_and_infinite_logits_take_the_loops() {
        for bad in [f32::NAN, f32::INFINITY] {
            let data: Vec<TokenData> = [1.0, bad, 3.0, 0.5]
                .iter()
                .enumerate()
                .map(|(i, &logit)| TokenData { id: i as u32, logit, p: 0.0 })
                .collect();
            assert_eq!(Moments::of_candidates(&data).threshold_bounds(1.0), None);
            let mut c = Candidates::from_logits(&[1.0, 2.0, 3.0, 0.5]).unwrap();
            c.as_mut_slice()[1].logit = bad;
            let mut want = c.clone();
            TopNSigma::new(1.0).unwrap().apply_exact(want.as_mut_slice());
            TopNSigma::new(1.0).unwrap().apply(&mut c).unwrap();
            let bits = |c: &Candidates| c.as_slice().iter().map(|t| t.logit.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&c), bits(&want));
        }
    }

    #[test]
    fn inert_and_invalid_parameters() {
        assert!(TopNSigma::new(-1.0).unwrap().is_inert());
        assert!(TopNSigma::new(0.0).unwrap().is_inert());
        assert_eq!(TopNSigma::new(-1.0).unwrap().name(), "?top-n-sigma");
        assert!(TopNSigma::new(f32::INFINITY).is_err());
        assert!(TopNSigma::new(f32::NAN).is_err());
    }
}
