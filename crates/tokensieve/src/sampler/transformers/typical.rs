//! `typical(mass, min_tokens_to_keep)` under the transformers convention:
//! `TypicalLogitsWarper` (locally typical sampling).
//!
//! 1. `ls = log_softmax(z)`, `pe = exp(ls)`, entropy `ent = -nansum(ls * pe)` (the `-inf * 0 =
//!    NaN` terms of masked tokens are dropped).
//! 2. `shifted = |-ls - ent|`, sorted **ascending** with torch's unstable sort (tie order of
//!    libstdc++ `std::sort`); the logits are gathered in that order, softmaxed and
//!    `cumsum`med (f64 running sum, f32 partials).
//! 3. `last = count(cum < fl32(mass))` (strict), clamped to `V - 1`; every sorted position whose
//!    `shifted` is `>` `shifted[last]` (strict: everything tied with the boundary stays) is
//!    removed, except the first `min_tokens_to_keep` (the most typical).
//!
//! It can remove the most likely token. Rows of equal logits are left whole; a row whose
//! logits are all `-inf` is unchanged.
//!
//! Differs from llama.cpp's `typical` (which keeps the shortest prefix with cum `> p` over
//! its own sort and truncates).
//!
//! Validation as transformers: `mass` strictly inside `(0, 1)`, `min_tokens_to_keep` an
//! integer `>= 1`. `generate()` adds it when `typical_p < 1`. Draws: none.
//!
//! Spec: `typical(mass, min_tokens_to_keep)` (default 1); `typical_p=` is accepted for `mass`.

use crate::arch;
use crate::candidates::{rank_scores_below, Candidates, ScoreBuckets, TokenData};
use crate::convention::transformers::{ensure_dense, fl32, max_logit, remove, sort_ascending, weights_into, Cumsum};
use crate::error::{Error, Result};
use crate::params::spec::Bound;
use crate::sampler::transformers::require_min_tokens_to_keep;
use crate::sampler::{BuildContext, FromSpec, Sampler};

/// Locally typical sampling, transformers convention.
///
/// ```
/// use tokensieve::{Candidates, sampler::{transformers::typical::Typical, Sampler}};
/// let mut c = Candidates::from_logits(&[3.0, 1.0, 0.5, 0.0, -4.0]).unwrap();
/// Typical::new(0.5, 1).unwrap().apply(&mut c).unwrap();
/// assert!(c.count_finite() < 5);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Typical {
    mass: f32,
    min_tokens_to_keep: usize,
}

impl Typical {
    /// Typical sampling with `mass` strictly inside `(0, 1)`, never removing the
    /// `min_tokens_to_keep >= 1` most typical tokens.
    pub fn new(mass: f64, min_tokens_to_keep: i64) -> Result<Self> {
        if !(mass > 0.0 && mass < 1.0) {
            return Err(Error::parameter("typical", "mass", format!("has to be a float > 0 and < 1, but is {mass}")));
        }
        let min_tokens_to_keep = require_min_tokens_to_keep("typical", min_tokens_to_keep)?;
        Ok(Typical { mass: fl32(mass), min_tokens_to_keep })
    }
}

impl Sampler for Typical {
    fn name(&self) -> &'static str {
        "typical"
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        if !(c.sparse && self.remove_atypical(c)) {
            ensure_dense(c);
            if c.data.len() < RANKED_MIN || !self.remove_atypical_ranked(c) {
                let done = self.remove_atypical(c);
                debug_assert!(done, "a dense row always decides");
            }
        }
        Ok(())
    }
}

impl Typical {
    /// The removal, on the dense row or on a sparse view; `false` (a view untouched) where
    /// only the dense row can decide.
    ///
    /// A view leaves out `-inf` tokens only. Their weights are exactly 0 and their entropy
    /// terms NaN (dropped), so the sums are the dense row's; their scores are `+inf`, sorted
    /// after every finite one, with no mass. So the cut is the dense row's: within the view's
    /// finite scores, or (where their mass stays below `mass`) at a `+inf` score, which
    /// removes nothing, as the view's own last score does. What the view cannot give is
    /// torch's order among equal finite scores, which comes from sorting the dense row: a
    /// view with any declines. So does a view with a finite logit whose score is `+inf` (it
    /// lies more than `f32::MAX` below the maximum, so `z - max` is `-inf`): it ties with the
    /// left-out tokens, and `min_tokens_to_keep` may keep either, by the dense row's order.
    fn remove_atypical(&self, c: &mut Candidates) -> bool {
        let max = max_logit(&c.data);
        if !max.is_finite() {
            return true; // all -inf: NaN everywhere, torch removes nothing
        }
        // log_softmax: (z - max) - ln(sum exp(z - max)), in f32 as torch writes it.
        let sum: f64 = c.data.iter().map(|t| ((t.logit - max) as f64).exp()).sum();
        let lse = sum.ln() as f32;
        let log_softmax = |z: f32| (z - max) - lse;
        let mut ent_sum = 0.0f64;
        for t in &c.data {
            let ls = log_softmax(t.logit);
            let term = ls * ((ls as f64).exp() as f32);
            if !term.is_nan() {
                ent_sum += term as f64;
            }
        }
        let ent = -(ent_sum as f32);

        let mut buf = std::mem::take(&mut c.scratch);
        buf.clear();
        buf.extend(c.data.iter().enumerate().map(|(i, t)| TokenData {
            id: i as u32,
            logit: ((-log_softmax(t.logit)) - ent).abs(),
            p: 0.0,
        }));
        sort_ascending(&mut buf);
        let tied = |w: &[TokenData]| w[0].logit == w[1].logit && w[0].logit.is_finite();
        if c.sparse && (buf.windows(2).any(tied) || buf.iter().any(|t| t.logit == f32::INFINITY)) {
            c.scratch = buf;
            return false;
        }
        // softmax of the logits gathered in sorted order (same max), then the cumsum.
        let mut sorted_sum = 0.0f64;
        for t in &buf {
            sorted_sum += ((c.data[t.id as usize].logit - max) as f64).exp();
        }
        let mut cum = Cumsum::default();
        let mut below = 0usize;
        for t in &buf {
            let p = (((c.data[t.id as usize].logit - max) as f64).exp() / sorted_sum) as f32;
            if cum.push(p) < self.mass {
                below += 1;
            }
        }
        let last = below.min(buf.len() - 1);
        let boundary = buf[last].logit;
        for t in buf.iter().skip(self.min_tokens_to_keep) {
            if t.logit > boundary {
                remove(&mut c.data, t.id as usize);
            }
        }
        c.scratch = buf;
        true
    }
}

/// `-(f32 of the sum of terms)` when every order of adding the entropy's f64 `terms` (all of
/// one sign: `ls <= 0`, `p >= 0`) rounds to the same f32: summed in four interleaved parts
/// (not one addition after another: the sequential chain was latency-bound), with the bound on
/// any two orders of adding `n` f64s (`2 (n - 1) 2^-53` of the sum of their magnitudes), with a
/// margin. `None` when the two ends of that interval round apart.
fn entropy_unordered(terms: &[f64]) -> Option<f32> {
    let mut parts = [0.0f64; 4];
    let quads = terms.chunks_exact(4);
    let rest: f64 = quads.remainder().iter().sum();
    for q in quads {
        parts.iter_mut().zip(q).for_each(|(p, x)| *p += x);
    }
    let sum = (parts[0] + parts[1]) + (parts[2] + parts[3]) + rest;
    let slack = sum.abs() * (terms.len() as f64 + 8.0) * f64::EPSILON * 2.0;
    let (lo, hi) = ((sum - slack) as f32, (sum + slack) as f32);
    (lo == hi && lo.is_finite()).then_some(-lo)
}

/// Dense rows at least this long take [`Typical::remove_atypical_ranked`] first.
const RANKED_MIN: usize = 4096;

/// [`Typical::remove_atypical_ranked`]'s buffers, kept per thread (no allocation after the
/// first rows of a size).
#[derive(Default)]
struct Ranked {
    /// The weights `exp(f64(fl32(z - max)))`, by id.
    w: Vec<f64>,
    /// The log-softmax's exponentials `exp(f64(ls))`, by id.
    e: Vec<f64>,
    /// The scores `|-ls - ent|`' bits, by id.
    scores: Vec<u32>,
    /// The weights by score bucket.
    hist: ScoreBuckets,
    /// `(bits of score) << 32 | id` of the ranked tokens, sorted by their high half (and
    /// twice as long: the radix sort's other buffer).
    keys: Vec<u64>,
    /// The first `min_tokens_to_keep` ranked tokens' ids and logits.
    kept: Vec<(usize, f32)>,
}

impl Typical {
    /// [`Typical::remove_atypical`] on a dense row, with the same result, without the sort of
    /// every score that dominated it (11 of 17 ms at V = 128k). `false`, the row untouched,
    /// where it cannot be sure of that result.
    ///
    /// * **Which tokens are ranked.** The cumsum runs over the scores in ascending order until
    ///   it reaches `mass`; only those positions (and the first `min_tokens_to_keep`) are read
    ///   by position, the removal compares values. The weights are summed by score bucket
    ///   (half a binade), and only the tokens up to the bucket where that sum first reaches
    ///   `mass` (with `10^-4` of room for the roundings) are ranked: a radix sort of their
    ///   scores' bits. If the cumsum does not reach `mass` among them, every token is.
    /// * **Equal scores.** The radix sort orders them by id, torch's `std::sort` otherwise.
    ///   Among tokens of equal weight that changes nothing (every sum and partial is the
    ///   same). Equal scores of tokens with different weights up to the cut's tie group, or
    ///   straddling the first `min_tokens_to_keep` positions above the cut's boundary (kept by
    ///   position): `false`.
    /// * **The sorted sum.** The obvious implementation sums the weights again in sorted
    ///   order; that sum is within `2 (n + 8) 2^-53` of the one in id order (two orders of
    ///   adding the same `n` f64s), so every probability the cumsum reads must round the same
    ///   at both ends of that interval, else `false`.
    ///
    /// The exponentials are computed many at a time ([`weights_into`],
    /// [`arch::exp_in_place`]: the platform's bits).
    fn remove_atypical_ranked(&self, c: &mut Candidates) -> bool {
        thread_local! {
            static RANKED: std::cell::RefCell<Ranked> = std::cell::RefCell::default();
        }
        RANKED.with_borrow_mut(|b| {
            let data = &c.data;
            let n = data.len();
            let max = max_logit(data);
            if !max.is_finite() {
                return false;
            }
            weights_into(data.iter().map(|t| t.logit), max, &mut b.w);
            // The sums in id order, one addition at a time, as the obvious implementation's.
            let sum: f64 = b.w.iter().sum();
            let lse = sum.ln() as f32;
            let log_softmax = |z: f32| (z - max) - lse;
            b.e.clear();
            b.e.extend(data.iter().map(|t| log_softmax(t.logit) as f64));
            arch::exp_in_place(&mut b.e);
            // The entropy's terms, `+0` for the NaN ones the obvious implementation skips: its
            // sum starts at `+0`, so adding `+0` changes nothing.
            b.e.iter_mut().zip(data).for_each(|(e, t)| {
                let term = log_softmax(t.logit) * (*e as f32);
                *e = if term.is_nan() { 0.0 } else { term as f64 };
            });
            let ent = match entropy_unordered(&b.e) {
                Some(ent) => ent,
                // One addition after another, as the obvious implementation.
                None => -(b.e.iter().fold(0.0f64, |acc, &x| acc + x) as f32),
            };
            // Non-negative: their bits order them.
            b.scores.clear();
            b.scores.extend(data.iter().map(|t| ((-log_softmax(t.logit)) - ent).abs().to_bits()));
            if b.scores.iter().any(|&x| f32::from_bits(x).is_nan()) {
                return false;
            }
            b.hist.fill(b.scores.iter().copied().zip(b.w.iter().copied()));
            let keep = self.min_tokens_to_keep;
            let slack = sum * (n as f64 + 8.0) * f64::EPSILON * 2.0;
            let (lo, hi) = (sum - slack, sum + slack);
            for limit in b.hist.limits((self.mass as f64 + 1e-4) * sum) {
                let sorted = rank_scores_below(&b.scores, limit, &mut b.keys);
                let m = sorted.len();
                if m < keep.min(n) {
                    continue;
                }
                let id = |k: u64| k as u32 as usize;
                let score = |k: u64| f32::from_bits((k >> 32) as u32);
                let mut cum = Cumsum::default();
                let mut below = 0;
                for &k in sorted.iter() {
                    let w = b.w[id(k)];
                    let p = (w / lo) as f32;
                    if (w / hi) as f32 != p {
                        return false;
                    }
                    if cum.push(p) >= self.mass {
                        break;
                    }
                    below += 1;
                }
                if below == m && m < n {
                    continue; // the cumsum did not reach `mass` among the ranked tokens
                }
                let crossing = below.min(n - 1);
                // Up to the crossing's tie group (which lies among the ranked: equal scores
                // share a bucket) and one past it, without mixed ties.
                let mut end = crossing;
                while end + 1 < m && score(sorted[end + 1]) == score(sorted[crossing]) {
                    end += 1;
                }
                let mixed =
                    |j: usize| score(sorted[j]) == score(sorted[j + 1]) && b.w[id(sorted[j])] != b.w[id(sorted[j + 1])];
                if (0..(end + 1).min(m - 1)).any(mixed) {
                    return false;
                }
                let boundary = score(sorted[crossing]);
                if keep < m && score(sorted[keep - 1]) > boundary && score(sorted[keep - 1]) == score(sorted[keep]) {
                    return false;
                }
                b.kept.clear();
                b.kept.extend(sorted[..keep.min(m)].iter().map(|&k| (id(k), c.data[id(k)].logit)));
                // `remove`, without a branch; the bits order the scores.
                let boundary = boundary.to_bits();
                for (t, &x) in c.data.iter_mut().zip(&b.scores) {
                    if x > boundary {
                        t.logit = f32::NEG_INFINITY;
                    }
                }
                for &(i, z) in &b.kept {
                    c.data[i].logit = z;
                }
                return true;
            }
            false
        })
    }
}

impl FromSpec for Typical {
    const PARAMS: &'static [&'static str] = &["mass", "min_tokens_to_keep"];
    const ALIASES: &'static [(&'static str, &'static str)] = &[("typical_p", "mass"), ("p", "mass")];
    fn from_spec(args: &Bound<'_>, _: &BuildContext<'_>) -> Result<Self> {
        Typical::new(args.f64("mass", None)?, args.i64("min_tokens_to_keep", Some(1))?)
    }
}

#[cfg(test)]
mod tests {
    use crate::sampler::transformers::test_util::*;

    fn ln(probs: &[f32]) -> Vec<f32> {
        probs.iter().map(|p| p.ln()).collect()
    }

    #[test]
    fn transformers_typical_test_vectors() {
        // test_logits_process.py::test_typical_dist_warper: probs [0.97, 0.01, 0.01, 0.01] with
        // mass 0.5 keep only the first; [0.4, 0.2, 0.2, 0.2] lose the most likely token.
        let finite = |z: Vec<f32>| z.iter().map(|v| v.is_finite()).collect::<Vec<_>>();
        assert_eq!(finite(run("typical(0.5)", &ln(&[0.97, 0.01, 0.01, 0.01]), &[])), [true, false, false, false]);
        assert_eq!(finite(run("typical(0.5)", &ln(&[0.4, 0.2, 0.2, 0.2]), &[])), [false, true, true, true]);
        // min_tokens_to_keep keeps the most typical ones.
        let ramp: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let out = run("typical(1e-9,min_tokens_to_keep=2)", &ramp, &[]);
        assert_eq!(out.iter().filter(|v| v.is_finite()).count(), 2);
    }

    #[test]
    fn equal_and_masked_rows_are_left_whole() {
        assert_eq!(run("typical(0.2)", &[0.7f32; 12], &[]), [0.7f32; 12]);
        assert_eq!(run("typical(0.2)", &[NEG; 3], &[]), [NEG; 3]);
        // Masked tokens have shifted = +inf: they sort last and stay masked.
        let out = run("typical(0.9)", &[1.0, NEG, 0.5, 0.0], &[]);
        assert_eq!(out[1], NEG);
    }

    /// The ranked path on dense rows (ties, `-inf`, huge and bf16-rounded values among them)
    /// against the sort of the obvious implementation: the same row, bit for bit, wherever it
    /// decides; it declines where equal scores could be ordered otherwise, and decides most
    /// language-model-like rows.
    #[test]
    fn the_ranked_path_is_the_sorted_one() {
        use super::*;
        use tokensieve_testkit::generate::{self, RowKind};
        let (mut decided, mut rows) = (0, 0);
        for kind in [
            RowKind::Peaked,
            RowKind::Gaussian,
            RowKind::Ties,
            RowKind::NegInf,
            RowKind::Huge,
            RowKind::Bf16,
            RowKind::Flat,
            RowKind::ShiftedDown,
        ] {
            for (seed, v) in [(1u64, 4096usize), (2, 9_000), (3, 40_000)] {
                let row = generate::row(kind, v, seed);
                for (mass, keep) in [(0.9f64, 1i64), (0.2, 1), (0.999, 3), (0.5, 50), (1e-9, 3), (1e-9, 40)] {
                    let stage = Typical::new(mass, keep).unwrap();
                    let mut want = Candidates::from_logits(&row).unwrap();
                    ensure_dense(&mut want);
                    assert!(stage.remove_atypical(&mut want));
                    let mut got = Candidates::from_logits(&row).unwrap();
                    ensure_dense(&mut got);
                    let realistic =
                        matches!(kind, RowKind::Peaked | RowKind::Gaussian | RowKind::NegInf | RowKind::ShiftedDown);
                    rows += usize::from(realistic);
                    if stage.remove_atypical_ranked(&mut got) {
                        decided += usize::from(realistic);
                        let bits =
                            |c: &Candidates| c.data.iter().map(|t| (t.id, t.logit.to_bits())).collect::<Vec<_>>();
                        assert!(bits(&got) == bits(&want), "{kind:?} V={v} typical({mass},{keep})");
                    } else {
                        let untouched = Candidates::from_logits(&row).unwrap();
                        assert_eq!(got.data, untouched.data, "{kind:?} V={v}: declined but touched the row");
                    }
                }
            }
        }
        // Flat, tied and clamped rows have equal scores at the cut: those decline.
        assert!(decided * 4 >= rows * 3, "only {decided} of {rows} realistic rows decided");
    }

    /// Near-duplicates of the likely tokens (one ulp apart: different weights, often the same
    /// log-softmax after its f32 rounding, so equal scores) put tokens of different weights on
    /// equal scores before the cut: the ranked path declines, and `apply` is the sorted path's.
    #[test]
    fn the_ranked_path_declines_equal_scores_of_different_weights() {
        use super::*;
        use tokensieve_testkit::generate::{self, RowKind};
        let mut row = generate::row(RowKind::Peaked, 6000, 9);
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
        for pair in order[..400].chunks(2) {
            row[pair[1]] = row[pair[0]].next_up();
        }
        let stage = Typical::new(0.9, 1).unwrap();
        let mut got = Candidates::from_logits(&row).unwrap();
        ensure_dense(&mut got);
        assert!(!stage.remove_atypical_ranked(&mut got));
        let mut want = got.clone();
        assert!(stage.remove_atypical(&mut want));
        let mut stage = stage;
        stage.apply(&mut got).unwrap();
        assert_eq!(got.data, want.data);
    }

    #[test]
    fn mass_must_be_strictly_inside_zero_one() {
        for spec in ["typical(0)", "typical(1)", "typical(1.5)"] {
            assert!(build_error(spec).contains("> 0 and < 1"), "{spec}");
        }
        assert!(build_error("typical(0.5,0)").contains("min_tokens_to_keep"));
    }
}
