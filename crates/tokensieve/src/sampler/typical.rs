//! `typical(p, min_keep)`: locally typical sampling, keeps the candidates whose surprise
//! `-ln p` is closest to the distribution's entropy until their mass exceeds `p`.
//!
//! llama.cpp convention (`llama_sampler_typical`, commit 0c1e570):
//!
//! * `p >= 1` builds an inert stage (`?typical`).
//! * Full sort (libstdc++ order on ties) and f32 softmax; entropy `H = Σ -p·ln p` summed in
//!   f32 in sorted order; score `|-ln p_i - H|`.
//! * Candidate **indices** are `std::sort`ed ascending by score (libstdc++ introsort, unstable:
//!   equal scores keep the order that algorithm leaves), then the prefix is kept up to the
//!   first position `i` where the f32 running sum of `p` is **strictly** `> p` and
//!   `i + 1 >= min_keep` (`min_keep = 0` behaves like 1); if the sum never exceeds `p`,
//!   everything is kept.
//! * Output in **score order**, flagged unsorted; `p` not renormalised.
//!
//! NaN: a candidate with `p = 0` (a `-inf` logit from a mask, or an underflow) makes llama.cpp's
//! entropy NaN (`0 · ln 0`), hence every score NaN. tokensieve reproduces what llama.cpp then
//! does: with every comparison false, libstdc++'s sort treats all scores as equal, which is a
//! valid (if meaningless) order: for up to 16 candidates the logit order, above that whatever
//! the introsort leaves. The cut then follows the running sum of `p` in that order. The result
//! is deterministic and equal to llama.cpp's, but it is not "typical sampling"; put `typical`
//! before stages that mask candidates with `-inf` (`top_n_sigma`, `temperature(0)`, a
//! `logit_bias` ban) if that matters. (Scores are all NaN or none is, so the comparator is
//! always a strict weak order and the sort cannot run out of bounds.)
//!
//! Where tokensieve differs: `p < 0` (which llama.cpp treats like `p = 0`), NaN or infinite `p`
//! and negative `min_keep` are parameter errors. The score and index vectors are reused across
//! calls instead of being allocated per call.

use super::{require_finite, require_min_keep, BuildContext, FromSpec, Sampler};
use crate::arch;
use crate::candidates::{lsd_radix_sort, rank_scores_below, total_order_key, Candidates, ScoreBuckets};
use crate::convention::llama_cpp;
use crate::error::{Error, Result};
use crate::params::spec::Bound;
use crate::stdsort;

/// Locally typical sampling.
///
/// ```
/// use tokensieve::{Candidates, sampler::{typical::Typical, Sampler}};
/// // Probabilities .97, .01, .01, .01 with p = 0.5: only the likely token is typical.
/// let logits: Vec<f32> = [0.97f32, 0.01, 0.01, 0.01].iter().map(|p| p.ln()).collect();
/// let mut c = Candidates::from_logits(&logits).unwrap();
/// Typical::new(0.5, 1).unwrap().apply(&mut c).unwrap();
/// assert_eq!(c.len(), 1);
/// assert_eq!(c.as_slice()[0].id, 0);
/// ```
#[derive(Debug)]
pub struct Typical {
    p: f32,
    min_keep: usize,
    /// Reused per call: `|-ln p_i - H|` per candidate.
    scores: Vec<f32>,
    /// Reused per call: candidate indices sorted by score.
    order: Vec<u32>,
}

impl Clone for Typical {
    /// Clones the parameters, not the scratch buffers.
    fn clone(&self) -> Self {
        Typical { p: self.p, min_keep: self.min_keep, scores: Vec::new(), order: Vec::new() }
    }
}

impl Typical {
    /// Typical sampling with mass `p` (finite, `>= 0`; `>= 1` = off) keeping at least
    /// `min_keep`.
    pub fn new(p: f32, min_keep: usize) -> Result<Self> {
        let p = require_finite("typical", "p", p)?;
        if p < 0.0 {
            return Err(Error::parameter("typical", "p", format!("must be >= 0, got {p}")));
        }
        Ok(Typical { p, min_keep, scores: Vec::new(), order: Vec::new() })
    }
}

impl Sampler for Typical {
    fn name(&self) -> &'static str {
        if self.is_inert() {
            "?typical"
        } else {
            "typical"
        }
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        if self.is_inert() || c.is_empty() {
            return Ok(());
        }
        if !c.sorted && c.len() >= RANKED_MIN && self.apply_ranked(c) {
            return Ok(());
        }
        self.apply_sorted(c);
        Ok(())
    }

    fn is_inert(&self) -> bool {
        self.p >= 1.0
    }
}

impl Typical {
    /// `apply` as llama.cpp runs it: the softmax's full sort, the scores' sort.
    fn apply_sorted(&mut self, c: &mut Candidates) {
        llama_cpp::softmax(c, true);
        let data = &c.data;
        let mut entropy = 0.0f32;
        for t in data {
            entropy += -t.p * t.p.ln();
        }
        let scores = &mut self.scores;
        scores.clear();
        scores.extend(data.iter().map(|t| (-t.p.ln() - entropy).abs()));
        let order = &mut self.order;
        order.clear();
        order.extend(0..data.len() as u32);
        stdsort::sort(order, |&a, &b| scores[a as usize] < scores[b as usize]);

        let mut cum = 0.0f32;
        let mut last = order.len();
        for (i, &idx) in order.iter().enumerate() {
            cum += data[idx as usize].p;
            // llama.cpp: `min_keep == 0 || i >= min_keep - 1`, i.e. `i + 1 >= min_keep`.
            if cum > self.p && i + 1 >= self.min_keep {
                last = i + 1;
                break;
            }
        }

        let mut kept = std::mem::take(&mut c.scratch);
        kept.clear();
        kept.extend(order[..last].iter().map(|&idx| data[idx as usize]));
        c.data[..last].copy_from_slice(&kept);
        c.truncate(last);
        c.set_sorted(false);
        c.scratch = kept;
    }
}

/// Unsorted candidate arrays at least this long take [`Typical::apply_ranked`] first.
const RANKED_MIN: usize = 4096;

/// [`Typical::apply_ranked`]'s buffers, kept per thread (no allocation after the first arrays
/// of a size).
#[derive(Default)]
struct Ranked {
    /// Sort keys (and the radix sort's other half).
    keys: Vec<u64>,
    /// The weights, then the probabilities, in descending logit order.
    p: Vec<f32>,
    /// The logits (the weights' arguments), then `ln p`, in that order.
    ln_p: Vec<f32>,
    /// The candidates in that order.
    sorted: Vec<crate::candidates::TokenData>,
    /// The scores' bits in that order.
    scores: Vec<u32>,
    /// The probabilities by score bucket.
    hist: ScoreBuckets,
}

impl Typical {
    /// `apply` on an unsorted array, with the same result, without llama.cpp's sorts of every
    /// candidate (its full sort puts every logit below -10 in one bucket, which
    /// `std::partial_sort` then heap-sorts: 15 ms of 16 at V = 128k). `false`, the candidates
    /// untouched, where it cannot be sure of that result.
    ///
    /// * The softmax's sort only orders the additions of its sum and of the entropy, in which
    ///   equal logits are equal terms: any descending order of the logits gives llama.cpp's
    ///   sums, so the logits are ranked by a radix sort of their bits.
    /// * The candidates are kept in score order up to the cut, so only that prefix of the
    ///   scores' order is read. With no two equal scores among it and the first score after
    ///   it, it is the same in every sort (equal logits have equal scores, so no kept token
    ///   shares its logit either): the scores are ranked by a radix sort too, only those up to
    ///   the score bucket (half a binade) where the probabilities reach `p` (all of them if
    ///   the cut turns out to lie beyond). Equal scores
    ///   there (the order libstdc++'s introsort leaves decides which go), or a probability of
    ///   0 (a NaN entropy, every score NaN), or a non-finite logit above `-inf`: `false`.
    /// * The exponentials are the platform's `expf` bits many at a time
    ///   ([`arch::exp_shifted`]); `ln` stays libm's, one call per candidate.
    fn apply_ranked(&self, c: &mut Candidates) -> bool {
        thread_local! {
            static RANKED: std::cell::RefCell<Ranked> = std::cell::RefCell::default();
        }
        if c.data.iter().any(|t| t.logit.is_nan() || t.logit == f32::INFINITY) {
            return false;
        }
        RANKED.with_borrow_mut(|b| {
            let n = c.data.len();
            // Descending logits: `-0.0` as `0.0`, the same weight.
            b.keys.clear();
            b.keys.extend(
                c.data.iter().enumerate().map(|(i, t)| u64::from(!total_order_key(t.logit + 0.0)) << 32 | i as u64),
            );
            let order = lsd_radix_sort(&mut b.keys, |k, pass| ((k >> (32 + 8 * pass)) & 0xff) as usize);
            b.sorted.clear();
            b.sorted.extend(order.iter().map(|&k| c.data[k as u32 as usize]));
            // llama.cpp's softmax over that order: `expf(l - max)`, their f32 sum in order, each
            // divided by it.
            let max = b.sorted[0].logit;
            b.ln_p.clear();
            b.ln_p.extend(b.sorted.iter().map(|t| t.logit));
            b.p.resize(n, 0.0);
            arch::exp_shifted(&b.ln_p, 1.0, max, &mut b.p);
            let mut sum = 0.0f32;
            for &p in &b.p {
                sum += p;
            }
            let mut entropy = 0.0f32;
            for (p, ln_p) in b.p.iter_mut().zip(b.ln_p.iter_mut()) {
                *p /= sum;
                if *p == 0.0 {
                    return false; // `0 · ln 0`: a NaN entropy
                }
                *ln_p = p.ln();
                entropy += -*p * *ln_p;
            }
            // The scores (non-negative: their bits order them), and the probabilities by score
            // bucket (half a binade): only the scores up to the bucket where those reach `p`
            // (with room for the f32 sum's roundings) are ranked, all of them if the cut is not
            // among those.
            b.scores.clear();
            for &ln_p in &b.ln_p {
                let score = (-ln_p - entropy).abs();
                if score.is_nan() {
                    return false;
                }
                b.scores.push(score.to_bits());
            }
            b.hist.fill(b.scores.iter().copied().zip(b.p.iter().map(|&p| f64::from(p))));
            for limit in b.hist.limits(f64::from(self.p) + 1e-4) {
                let order = rank_scores_below(&b.scores, limit, &mut b.keys);
                let m = order.len();
                let at = |k: u64| k as u32 as usize;
                let mut cum = 0.0f32;
                let mut last = None;
                for (i, &k) in order.iter().enumerate() {
                    cum += b.p[at(k)];
                    if cum > self.p && i + 1 >= self.min_keep {
                        last = Some(i + 1);
                        break;
                    }
                }
                let last = match last {
                    Some(last) => last,
                    None if m < n => continue, // the cut lies beyond the ranked scores
                    None => n,
                };
                // The kept prefix and the first score after it, all different (a score past the
                // ranked ones lies in a later bucket).
                if order[..(last + 1).min(m)].windows(2).any(|w| w[0] >> 32 == w[1] >> 32) {
                    return false;
                }
                for (dst, &k) in c.data.iter_mut().zip(&order[..last]) {
                    *dst = crate::candidates::TokenData { p: b.p[at(k)], ..b.sorted[at(k)] };
                }
                c.truncate(last);
                c.set_sorted(false);
                return true;
            }
            false
        })
    }
}

impl FromSpec for Typical {
    const PARAMS: &'static [&'static str] = &["p", "min_keep"];
    fn from_spec(args: &Bound<'_>, _: &BuildContext<'_>) -> Result<Self> {
        let min_keep = require_min_keep("typical", args.i32("min_keep", Some(1))?)?;
        Typical::new(args.f32("p", None)?, min_keep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ranked path against llama.cpp's sorts on unsorted arrays of every generator kind
    /// (ties, `-inf`, huge and bf16-rounded values among them): the same candidates (ids,
    /// order, logit and `p` bits) wherever it decides; it declines where equal scores reach the
    /// cut, and decides most language-model-like rows.
    #[test]
    fn the_ranked_path_is_the_sorted_one() {
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
            RowKind::ShiftedUp,
        ] {
            for (seed, v) in [(1u64, 4096usize), (2, 9_000), (3, 40_000)] {
                let row = generate::row(kind, v, seed);
                for (p, min_keep) in [(0.9f32, 1usize), (0.2, 1), (0.999, 3), (0.5, 50), (1e-9, 3), (0.0, 0)] {
                    let mut stage = Typical::new(p, min_keep).unwrap();
                    let mut want = Candidates::from_logits(&row).unwrap();
                    stage.apply_sorted(&mut want);
                    let mut got = Candidates::from_logits(&row).unwrap();
                    let realistic =
                        matches!(kind, RowKind::Peaked | RowKind::Gaussian | RowKind::ShiftedDown | RowKind::ShiftedUp);
                    rows += usize::from(realistic);
                    if stage.apply_ranked(&mut got) {
                        decided += usize::from(realistic);
                        let bits = |c: &Candidates| {
                            c.as_slice().iter().map(|t| (t.id, t.logit.to_bits(), t.p.to_bits())).collect::<Vec<_>>()
                        };
                        assert!(bits(&got) == bits(&want), "{kind:?} V={v} typical({p},{min_keep})");
                        assert_eq!(got.is_sorted(), want.is_sorted());
                    } else {
                        assert_eq!(
                            got.as_slice(),
                            Candidates::from_logits(&row).unwrap().as_slice(),
                            "{kind:?}: touched"
                        );
                    }
                }
            }
        }
        assert!(decided * 4 >= rows * 3, "only {decided} of {rows} realistic rows decided");
    }
    use crate::sampler::test_util::from_probs;

    #[test]
    fn llama_cpp_test_vectors() {
        let mut c = from_probs(&[0.97, 0.01, 0.01, 0.01]);
        Typical::new(0.5, 1).unwrap().apply(&mut c).unwrap();
        assert_eq!(c.len(), 1);
        let mut c = from_probs(&[0.4, 0.2, 0.2, 0.2]);
        Typical::new(0.5, 1).unwrap().apply(&mut c).unwrap();
        let mut ids: Vec<u32> = c.as_slice().iter().map(|t| t.id).collect();
        ids.sort();
        assert_eq!(ids, [1, 2, 3]);
        assert!(!c.is_sorted());
    }

    #[test]
    fn min_keep_zero_behaves_like_one() {
        for min_keep in [0, 1] {
            let mut c = from_probs(&[0.97, 0.01, 0.01, 0.01]);
            Typical::new(0.0, min_keep).unwrap().apply(&mut c).unwrap();
            assert_eq!(c.len(), 1);
        }
        let mut c = from_probs(&[0.97, 0.01, 0.01, 0.01]);
        Typical::new(0.0, 3).unwrap().apply(&mut c).unwrap();
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn masked_candidate_gives_llama_cpps_nan_order() {
        // p = 0 for the masked one: entropy NaN, all scores NaN, the index sort keeps the
        // logit order (insertion sort with every comparison false), cut by running mass.
        let mut c = Candidates::from_logits(&[1.0, 3.0, f32::NEG_INFINITY, 2.0]).unwrap();
        Typical::new(0.5, 1).unwrap().apply(&mut c).unwrap();
        assert_eq!(c.as_slice()[0].id, 1);
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn inert_and_invalid_parameters() {
        assert!(Typical::new(1.0, 1).unwrap().is_inert());
        assert_eq!(Typical::new(1.0, 1).unwrap().name(), "?typical");
        assert!(Typical::new(-0.2, 1).is_err());
        assert!(Typical::new(f32::NAN, 1).is_err());
    }
}
