//! transformers' `[temperature(t);] top_p(p);dist` when the cut lies among the least likely
//! tokens (nearly flat rows, a hot temperature), without sorting the row.
//!
//! `TopPLogitsWarper` sorts the whole row ascending and removes the longest run of least
//! likely tokens whose cumsum of `fl32(w / S)` stays `<= fl32(1 - p)`. The row path's
//! [`super::row`] gathers the most likely tokens and bounds the mass below them; where the cut
//! lies far below those (the nucleus is most of the vocabulary), the array path used to sort
//! every value. Here only the tokens below the cut are ranked:
//!
//! 1. A sample of the row (every 32nd token) in buckets of value estimates where the mass
//!    `1 - p` (with a margin) ends, from below: a processed-logit bound `v*`. The bottom set
//!    `B` is every finite token with processed logit `<= v*` ([`arch::positions_le`] on the
//!    raw row): every token outside it lies strictly above every token in it, so `B`'s values
//!    sorted are the first `|B|` finite positions of torch's ascending order, whatever the
//!    sample missed. Where the cut lies past `B` after all, `B` is gathered once more with
//!    four times the margin.
//! 2. `S`, the softmax sum, from per-block sums of the weights: first the approximate ones
//!    ([`arch::exp_block_sums_approx`], with their error bound), then, where those leave the cut
//!    or the draw open, the exact ones ([`arch::exp64_block_sums`]): any order of the same f64
//!    additions is within `2 (n - 1) 2^-53 S` of torch's.
//! 3. `B` is walked upwards as torch walks it, with each probability between
//!    `fl32(w / S_hi)` and `fl32(w / S_lo)`: f64 addition and the rounding to f32 are
//!    monotone, so the true cumsum at each position lies between the two running sums. A
//!    position is removed when even the high one is `<= fl32(1 - p)`, and the cut is the
//!    first position where even the low one exceeds it (or where `min_tokens_to_keep` stops
//!    the walk). Anything in between, or equal values straddling the cut (torch's sort order
//!    picks which go), is left to the array path.
//! 4. `dist` draws over the survivors in id order: the block sums less the removed tokens'
//!    weights locate the draw, as the row path's `dist` does, certified against their bound
//!    (see [`draw`] for how the target's and the running sum's errors offset).
//!
//! The row path takes this when most blocks reach within half a nat of the maximum, or when
//! its top set shows the cut lies below any it would gather. On the bench's flat row of
//! 128,256 tokens (`top_p(0.95)`), `B` holds about 7% of them, and the approximate sums
//! decide most draws.

use crate::arch::{self, BLOCK};
use crate::candidates::{lsd_radix_sort, total_order_key};
use crate::convention::llama_cpp::dense::{crossing_block, total, Scratch};
use crate::convention::transformers::{from_sort_key, weight, weights_into};

/// [`top_p_dist`]'s buffers, kept in the convention's scratch.
#[derive(Debug, Default)]
pub(crate) struct BottomScratch {
    /// The sample's tokens per bucket.
    counts: Vec<u32>,
    /// The positions of the bottom set (and of the `-inf` tokens) in the row.
    positions: Vec<u32>,
    /// The bottom set: `(order key of the processed logit << 32) | id`, then sorted (the radix
    /// sort uses twice the length as scratch).
    keys: Vec<u64>,
    /// The bottom set's values, ascending, their ids and their weights.
    values: Vec<f32>,
    ids: Vec<u32>,
    weights: Vec<f64>,
}

/// The sample takes every this many tokens.
pub(super) const STRIDE: usize = 32;

/// About this many sampled tokens a bucket, and the most buckets.
const PER_BUCKET: usize = 8;
const MAX_BUCKETS: usize = 1 << 10;

/// Buckets reach this far below the maximum; everything lower shares the last one (their
/// weights are below `e^-64` of the maximum's: nothing for the sizing).
const FLOOR: f32 = 64.0;

/// The mass the bottom set is sized for, relative to the threshold: the sample's estimate
/// is off by a few percent on rows of thousands of tokens.
const MARGIN: f64 = 1.25;

/// One `[temperature(t);] top_p(p);dist` step on a row `r` of `n` tokens.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TopPDraw {
    /// The temperature's divisor (1 without one).
    pub(crate) t: f32,
    /// The processed maximum `fl32(max r / t)`, finite.
    pub(crate) max: f32,
    /// `top_p`'s threshold `fl32(1 - p)`, in `(0, 1)`.
    pub(crate) threshold: f32,
    /// `min_tokens_to_keep`, below `n`.
    pub(crate) keep: usize,
    /// `dist`'s draw, in `[0, 1)`.
    pub(crate) u: f64,
}

/// The step `d` on the row `r` (NaN-free): the chosen token and its probability among the
/// survivors (against the sums that located it, as the row path's `dist` reports it). `None`
/// where the bounds, ties at the cut or the shape of the row leave it to the array path.
pub(crate) fn top_p_dist(d: TopPDraw, r: &[f32], s: &mut Scratch, b: &mut BottomScratch) -> Option<(u32, f32)> {
    let TopPDraw { t, max, threshold, keep, .. } = d;
    let n = r.len();
    debug_assert!(threshold > 0.0 && threshold < 1.0 && keep < n && max.is_finite());
    // The `-inf` tokens come first in torch's order, each with probability 0: removed, adding
    // nothing; only their count matters, for `min_tokens_to_keep`.
    let removable = n - keep;
    let mut margin = MARGIN;
    let mut below = bottom_set(t, max, sample_bound(t, max, threshold, margin, r, b)?, r, b)?;
    let mut cut = None;
    'tiers: for exact in [false, true] {
        // The sums, and the bound on any run of their blocks against the exact weights' sum
        // (in any order): `rel` times the run's sum plus `fixed`, sums of non-negative bounds
        // per weight, and `rounding`, the f64 sums' in different orders.
        let rounding_rel = (n as f64 + 8.0) * f64::EPSILON * 2.0;
        let (sum, rel, fixed) = if exact {
            arch::exp64_block_sums(r, t, max, &mut s.block_sums);
            (total(&s.block_sums), 0.0, 0.0)
        } else {
            s.block_sums.resize(n.div_ceil(BLOCK), 0.0);
            let approx_err = arch::exp_block_sums_approx(r, t, max, &mut s.block_sums);
            let sum = total(&s.block_sums);
            let (rel, fixed) = arch::approx_error_split(approx_err, max, &s.block_sums, n);
            // As the row path's tries bound them: `expf`'s rounding against `exp` on top.
            (sum, rel + 2f64.powi(-23), fixed)
        };
        let rounding = sum * rounding_rel + n as f64 * 1.2e-38;
        let err = rel * sum + fixed + rounding;
        // (NaN fails too.)
        if (sum - err).partial_cmp(&1.0).is_none_or(|o| o.is_lt()) {
            continue; // the maximum's weight is 1: these bounds say nothing
        }
        let (at, last) = match cut {
            Some(decided) => decided,
            None => loop {
                // (`min_tokens_to_keep` may leave no finite token to go.)
                match walk(sum - err, sum + err, threshold, removable.saturating_sub(below), b) {
                    Walk::Cut(at, last) => break *cut.insert((at, last)),
                    Walk::Open => continue 'tiers,
                    // The sample put too little mass below its bound: once more, wider.
                    Walk::Short if margin == MARGIN => {
                        margin *= 4.0;
                        below = bottom_set(t, max, sample_bound(t, max, threshold, margin, r, b)?, r, b)?;
                    }
                    Walk::Short | Walk::Ties => return None,
                }
            },
        };
        if let Some(drawn) = draw(d, (at, last), (rel, fixed, rounding), r, s, b) {
            return Some(drawn);
        }
    }
    None
}

/// Counts every [`STRIDE`]-th token of `r` whose processed logit `z = fl32(r / t)` is at or
/// below `below` into `counts` (added to), by its bucket `fl32(fl32(max - z) · scale)`
/// rounded, the last bucket taking everything past it (`-inf` too). Each bucket `k` holds
/// values about `k / scale` below `max`: its tokens weigh about `e^(-k / scale)`. The sample
/// of [`sample_bound`] (from below) and of [`row`](super::row)'s top set sizing (from above).
pub(super) fn sample_counts(r: &[f32], t: f32, max: f32, scale: f32, below: f32, counts: &mut [u32]) {
    let last = counts.len() - 1;
    for &x in r.iter().step_by(STRIDE) {
        let z = x / t;
        if z <= below {
            let y = ((max - z) * scale).min(last as f32);
            // Adding 2^23 rounds `y >= 0` to an integer in the low mantissa bits.
            let k = ((y + 8_388_608.0).to_bits() - 0x4b00_0000) as usize;
            counts[k.min(last)] += 1;
        }
    }
}

/// From every [`STRIDE`]-th token, a processed-logit bound below which the tokens hold about
/// `margin` times the `threshold` share of the mass (as the sample estimates it); `None`
/// where the sample holds one value.
fn sample_bound(t: f32, max: f32, threshold: f32, margin: f64, r: &[f32], b: &mut BottomScratch) -> Option<f32> {
    let picks = r.len().div_ceil(STRIDE);
    let want = (picks / PER_BUCKET).next_power_of_two().clamp(16, MAX_BUCKETS);
    // Buckets of equal width below the maximum: `fl32(fl32(max - v) · scale)`, rounded,
    // grows as `v` falls. Everything below `max - FLOOR` (`-inf` too) shares the last.
    // The sample's least finite value (a `-inf` would stretch the buckets over the floor).
    let lowest = r.iter().step_by(STRIDE).fold(f32::INFINITY, |m, &z| if z > f32::NEG_INFINITY { m.min(z) } else { m });
    let depth = (max - lowest / t).min(FLOOR);
    if depth.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
        return None; // every value equal
    }
    let scale = want as f32 / depth;
    let last = want; // the floor's bucket
    b.counts.clear();
    b.counts.resize(want + 1, 0);
    sample_counts(r, t, max, scale, f32::INFINITY, &mut b.counts);
    // Each bucket's tokens at its middle weight `e^(-k / scale)`, by one ratio from bucket to
    // bucket (an estimate: one `exp` per bucket would cost more than the sample); the floor's
    // at 0.
    let ratio = (-1.0 / scale as f64).exp();
    let (mut total, mut w) = (0.0f64, 1.0f64);
    for &c in &b.counts[..last] {
        total += f64::from(c) * w;
        w *= ratio;
    }
    let target = total * f64::from(threshold) * margin;
    // From the floor up; `w` is now the weight of bucket `last`.
    let (mut mass, mut first) = (0.0f64, last);
    while first > 0 && mass <= target {
        first -= 1;
        w /= ratio;
        mass += f64::from(b.counts[first]) * w;
    }
    if mass <= target {
        return None;
    }
    // One bucket more (up to its upper edge): the walk needs the first position kept for
    // sure inside the set.
    Some(max - (first as f32 - 1.5).max(0.0) / scale)
}

/// The bottom set: every finite token whose processed logit `fl32(z / t)` is at most `v_star`,
/// sorted ascending (ties by id) into `b.values` and `b.ids`, with their weights; returns the
/// count of `-inf` tokens.
fn bottom_set(t: f32, max: f32, v_star: f32, r: &[f32], b: &mut BottomScratch) -> Option<usize> {
    // The raw bound: `fl32(z / t) <= v_star` exactly when `z <= z_star` (division by `t > 0`
    // is monotone), found from `v_star · t` by stepping over the few floats around it.
    let fits = |z: f32| z / t <= v_star;
    let mut z_star = v_star * t;
    for _ in 0..64 {
        if fits(z_star) {
            break;
        }
        z_star = z_star.next_down();
    }
    for _ in 0..64 {
        if !fits(z_star.next_up()) {
            break;
        }
        z_star = z_star.next_up();
    }
    if !fits(z_star) || fits(z_star.next_up()) {
        return None; // (a bound this far off would be a huge `t`; leave it to the array path)
    }
    b.positions.clear();
    arch::positions_le(r, z_star, &mut b.positions);
    b.keys.clear();
    let mut below = 0;
    for &i in &b.positions {
        let z = r[i as usize];
        if z == f32::NEG_INFINITY {
            below += 1;
        } else {
            b.keys.push((u64::from(total_order_key(z / t)) << 32) | u64::from(i));
        }
    }
    // By value; ids ascending among equal values (the radix sort is stable).
    let sorted: &[u64] = if b.keys.len() <= 512 {
        b.keys.sort_unstable();
        &b.keys
    } else {
        lsd_radix_sort(&mut b.keys, |k, pass| ((k >> (32 + 8 * pass)) & 0xff) as usize)
    };
    b.values.clear();
    b.values.extend(sorted.iter().map(|&k| from_sort_key((k >> 32) as u32)));
    b.ids.clear();
    b.ids.extend(sorted.iter().map(|&k| k as u32));
    weights_into(b.values.iter().copied(), max, &mut b.weights);
    Some(below)
}

/// What [`walk`] found.
enum Walk {
    /// The first `at` positions of the bottom set go: exactly the finite values `<= last`.
    Cut(usize, f32),
    /// Tighter bounds on `S` may decide.
    Open,
    /// The cut lies past the bottom set.
    Short,
    /// Equal values straddle the cut: torch's sort order picks which go (the array path).
    Ties,
}

/// Walks the bottom set upwards as torch's cumsum does, with `S` in `[s_lo, s_hi]`; at most
/// `limit` positions may go (`min_tokens_to_keep`).
fn walk(s_lo: f64, s_hi: f64, threshold: f32, limit: usize, b: &BottomScratch) -> Walk {
    if limit == 0 {
        return Walk::Cut(0, f32::NEG_INFINITY);
    }
    let (mut lo, mut hi) = (0.0f64, 0.0f64);
    for (j, &w) in b.weights.iter().enumerate() {
        if j >= limit {
            return cut_at(j, b);
        }
        lo += f64::from((w / s_hi) as f32);
        hi += f64::from((w / s_lo) as f32);
        if hi as f32 <= threshold {
            continue; // removed whatever S is
        }
        if lo as f32 > threshold {
            return cut_at(j, b);
        }
        return Walk::Open; // removed or kept, depending on where S lies
    }
    Walk::Short
}

/// [`Walk::Cut`] at position `j` of the bottom set, unless equal values straddle it.
fn cut_at(j: usize, b: &BottomScratch) -> Walk {
    match j {
        0 => Walk::Cut(0, f32::NEG_INFINITY),
        _ if b.values[j - 1] == b.values[j] => Walk::Ties,
        _ => Walk::Cut(j, b.values[j - 1]),
    }
}

/// `dist`'s draw over the tokens above `last` (the cut's first `cut` positions of the bottom
/// set removed), the block sums in `s.block_sums` within `rel` times a run's sum plus `fixed`
/// of the exact weights' for any run of blocks, and the f64 sums' orders within `rounding`:
/// the token and its probability, when certain.
///
/// The target `u·K` (`K` the survivors' total) and the running sum before the crossing block
/// `P` err together: with `e` the errors of the blocks before it and `e'` of the rest,
/// `u·K - P` is off by `u·e' - (1 - u)·e`, at most `rel·(u·K' + (1 - u)·P) + fixed` (`K'` the
/// rest's sum, the bounds being sums of non-negative ones per weight); so where the draw is
/// near either end of the row, the bound on the other part barely counts. The roundings
/// count twice.
fn draw(
    d: TopPDraw,
    (cut, last): (usize, f32),
    (rel, fixed, rounding): (f64, f64, f64),
    r: &[f32],
    s: &mut Scratch,
    b: &BottomScratch,
) -> Option<(u32, f32)> {
    let TopPDraw { t, max, u, .. } = d;
    // Less the removed weights, each subtraction within half an ulp of its block's sum. The
    // bounds are in the sums with them (`removed` more, at most, in any run).
    let mut removed = 0.0f64;
    for (&id, &w) in b.ids.iter().zip(&b.weights).take(cut) {
        s.block_sums[id as usize / BLOCK] -= w;
        removed += w;
    }
    let kept = total(&s.block_sums);
    let rounding = rounding + (kept + removed) * (cut as f64 + 8.0) * f64::EPSILON * 2.0;
    let target = kept * u;
    let (block, before) = crossing_block(&s.block_sums, target)?;
    let margin = rel * (u * (kept - before) + (1.0 - u) * before + removed) + fixed + 2.0 * rounding;
    let start = block * BLOCK;
    let mut running = before;
    for (j, &z) in r[start..(start + BLOCK).min(r.len())].iter().enumerate() {
        let v = z / t;
        if v <= last {
            continue; // removed (or `-inf`): weight 0
        }
        let w = weight(v, max);
        if w > 0.0 {
            let prev = running;
            running += w;
            if running > target {
                let certain = prev + margin < target && target + margin < running;
                return certain.then(|| ((start + j) as u32, (w / kept) as f32));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::candidates::Candidates;
    use crate::convention::transformers::fl32;
    use crate::sampler::transformers::{dist::Dist, top_p::TopP};
    use crate::sampler::Sampler;

    /// The array path: `TopPLogitsWarper`, then `dist` with draw `u`.
    fn reference(row: &[f32], t: f32, p: f64, keep: usize, u: f64) -> u32 {
        let scaled: Vec<f32> = row.iter().map(|&z| z / t).collect();
        let mut c = Candidates::from_logits(&scaled).unwrap();
        TopP::new(p, keep as i64).unwrap().apply(&mut c).unwrap();
        Dist::apply_drawn(&mut c, u).unwrap();
        c.selected_token().unwrap()
    }

    /// A dense sweep of draws (every `u` on a fine grid, so that many land within the sums'
    /// bounds of an interval's end) on nearly flat rows, with `-inf` entries, a hot
    /// temperature and a `min_tokens_to_keep` that stops the cut: every certain draw is the
    /// array path's, and most draws are certain.
    #[test]
    fn certain_draws_are_the_array_paths() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut uniform = move || {
            rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (rng >> 11) as f64 / (1u64 << 53) as f64
        };
        let (mut draws, mut certain) = (0, 0);
        for v in [700usize, 5_000, 40_000] {
            let flat: Vec<f32> = (0..v).map(|_| (uniform() as f32 - 0.5) * 0.1).collect();
            let masked: Vec<f32> =
                flat.iter().enumerate().map(|(i, &x)| if i % 7 == 3 { f32::NEG_INFINITY } else { x }).collect();
            let spread: Vec<f32> = (0..v).map(|_| -4.0 * uniform() as f32).collect();
            for (row, t, p, keep) in [
                (&flat, 1.0f32, 0.95, 1usize),
                (&masked, 1.0, 0.9, 1),
                (&spread, 1.0, 0.95, 1),
                (&spread, 3.0, 0.7, 1),
                (&flat, 1.0, 0.95, v - v / 100),
            ] {
                let max = row.iter().fold(f32::NEG_INFINITY, |m, &z| m.max(z)) / t;
                let (mut s, mut b) = (Scratch::default(), BottomScratch::default());
                for k in 0..300 {
                    // Some at the ends of [0, 1), where one of the two parts of the error is
                    // nearly all of it.
                    let u = match k {
                        0 => 0.0,
                        1 => 1.0 - f64::EPSILON / 2.0,
                        2..=20 => uniform() * 1e-3,
                        21..=40 => 1.0 - uniform() * 1e-3,
                        _ => uniform(),
                    };
                    draws += 1;
                    let d = TopPDraw { t, max, threshold: fl32(1.0 - p), keep, u };
                    if let Some((id, prob)) = top_p_dist(d, row, &mut s, &mut b) {
                        certain += 1;
                        assert_eq!(id, reference(row, t, p, keep, u), "V={v} t={t} p={p} keep={keep} u={u}");
                        assert!(prob > 0.0 && prob < 1.0);
                    }
                }
            }
        }
        assert!(certain * 10 >= draws * 7, "only {certain} of {draws} draws certain");
    }
}
