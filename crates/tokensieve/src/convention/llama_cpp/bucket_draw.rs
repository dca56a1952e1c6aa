//! `top_p;dist`'s draw when the cut lies beyond llama.cpp's first 256 entries (nearly flat
//! rows), without sorting the row.
//!
//! llama.cpp then sorts the whole row and walks it in descending order: the f32 running sum
//! `cum` of `p_j = fl32(w_j / S)` finds the cut (the first position where it reaches `p`, and
//! at least `min_keep` entries), the f64 running sum `P` of the weights `w_j` up to the cut is
//! `dist`'s total, and the draw is the first position whose `P` reaches `u · P(k)`. Both sums
//! depend on the order of the values only through their roundings, and while a running sum
//! stays within one binade `[2^e, 2^(e+1))` those do not depend on the order at all: its ulp
//! `q` is fixed, every value there is a multiple of it, so adding `x` gives `s + rn_q(x)`, `x`
//! rounded to the nearest multiple of `q`, provided `x / q` is no tie (`j + 1/2`, where the
//! last bit of `s` decides) and the result stays below `2^(e+1)`. (This is
//! [`arch::exp_sum_sequential`]'s argument, for llama.cpp's other sums.)
//!
//! So the row is split into buckets by value (of equal width below the maximum: equal values
//! share a bucket, and every value of a bucket is above every value of the next), and
//! the buckets are visited in descending order. A bucket whose entries keep both running sums
//! in their binades, hold no tie, and cannot hold the cut is added whole, in any order: the
//! integer totals of its rounded terms go into the sums' bits. Any other bucket (the first,
//! those where a sum changes binade, the one holding the cut, the one holding the draw) is
//! sorted and walked one entry at a time, exactly as llama.cpp walks it. On a flat row of
//! 128,256 entries that sorts a few dozen buckets of about 32 entries instead of the row.
//!
//! Only the buckets up to one that surely holds the cut are filled ([`cut_bound`], from each
//! bucket's count and least weight). Where the top `p` of the mass lies in a few thousand
//! entries (a hot temperature, a high-entropy position), those buckets' entries are found by
//! vector passes over the row against a value they all reach, and the rest of the row is
//! neither placed nor exponentiated. PERF: `temperature(2);top_p(0.95,1);dist` on the bench's
//! peaked row (the top 95% in about 2,000 entries at V = 32,000 and 3,000 at 128,256) took
//! 87–143 µs at 32k and 231–389 µs at 128k, against 151–247 and 623–1,095 when the whole row
//! was placed (Intel Xeon with AVX-512, a noisy spell, alternating runs of the two builds).

use crate::arch;
use crate::candidates::{total_order_key, Candidates, TokenData};

/// [`draw`]'s buffers, kept in the convention's scratch.
#[derive(Debug, Default)]
pub(crate) struct BucketScratch {
    /// Where each bucket starts in `vals` (one more entry: the end).
    starts: Vec<u32>,
    /// The next free slot of each bucket while `vals` is filled.
    next: Vec<u32>,
    /// Each entry's bucket, in row order.
    ids: Vec<u32>,
    /// The positions of the entries that may lie in the buckets the walk visits.
    positions: Vec<u32>,
    /// How many buckets the last row's walk could visit: where [`fill_top`] starts.
    hint: usize,
    /// How many draws [`fill_top`] filled the buckets for (for the tests).
    #[cfg(test)]
    top_fills: usize,
    /// The row's values grouped by bucket, in row order within each, and their weights.
    vals: Vec<f32>,
    weights: Vec<f32>,
    /// `dist`'s running sum before each visited bucket.
    run_before: Vec<f64>,
    /// One bucket's entries in descending order: `(!key << 32) | index in the bucket`.
    order: Vec<u64>,
}

/// About this many entries a bucket on a row of distinct values.
const PER_BUCKET: usize = 32;

/// The most buckets (a power of two).
const MAX_BUCKETS: usize = 1 << 11;

/// Below `max - FLOOR` every weight is 0 (`expf` underflows below about -103.97): such entries
/// share the last bucket, so that a `-inf` entry does not stretch the buckets' range.
const FLOOR: f32 = 128.0;

/// llama.cpp's `top_p(p, min_keep)` then `dist` with draw `u` over the row `r` (NaN-free, its
/// maximum `max` finite, its f32 softmax sum `sum` in row order): the token, left alone and
/// selected in `c` with `dist`'s probability, as [`super::dense`]'s sorting draw leaves it.
/// `None` when several entries hold the chosen value (libstdc++'s sort order would pick which
/// token): the array path decides. (A NaN, which the row's validation turns away before this,
/// would land in the last bucket: a wrong draw, never a panic.)
#[allow(clippy::too_many_arguments)]
pub(crate) fn draw(
    p: f32,
    min_keep: usize,
    r: &[f32],
    max: f32,
    sum: f32,
    u: f64,
    b: &mut BucketScratch,
    c: &mut Candidates,
) -> Option<u32> {
    let n = r.len();
    if n == 0 || !max.is_finite() {
        return None;
    }
    // Buckets of equal width below the maximum: `fl32(fl32(max - x) · scale)`, rounded to an
    // integer, only grows as `x` falls (each rounding is monotone), and equal values land
    // together. They reach down to `max - FLOOR` (or the row's least value, if higher);
    // everything below (`-inf` too) shares the last bucket.
    let want = (n / PER_BUCKET).next_power_of_two().min(MAX_BUCKETS);
    let depth = (max - arch::min(r)).min(FLOOR);
    let scale = if depth > 0.0 { want as f32 / depth } else { 0.0 };
    let nb = want + 1;
    let (grid, cut) = (Grid { max, scale, nb }, Cut { p, min_keep, sum });
    // Only the buckets up to one that surely holds the cut are filled ([`cut_bound`]): where
    // the top `p` of the mass lies in a few thousand entries, most of the row lies below them,
    // and the top buckets' entries are found by vector passes. Else the whole row is counted.
    let visited = match fill_top(cut, r, grid, b) {
        Some(visited) => visited,
        None => fill_all(cut, r, grid, b),
    };
    let kept = b.starts[visited] as usize;
    b.weights.resize(kept, 0.0);
    // Every weight in one call, the few past the cut too: a call per bucket left each one's
    // last few entries (not a whole vector) to `expf` one at a time.
    arch::exp_shifted(&b.vals, 1.0, max, &mut b.weights);
    // Room for the largest bucket up front: a later row's may be larger (no allocation per
    // token after the first row of a size).
    b.order.reserve(n);

    // The walk: `cum` (f32) and `run` (f64) as llama.cpp's loop leaves them after `pos`
    // entries, and where the cut falls: in bucket `kb`, whose first `kj` entries (sorted) are
    // kept.
    let (mut cum, mut run) = (0.0f32, 0.0f64);
    let mut pos = 0usize;
    b.run_before.clear();
    let mut cut = None;
    for bi in 0..visited {
        b.run_before.push(run);
        let (a, e) = (b.starts[bi] as usize, b.starts[bi + 1] as usize);
        if a == e {
            continue;
        }
        let may_cut = pos + (e - a) >= min_keep;
        if let Some((cum2, run2)) = add_whole(cum, run, &b.weights[a..e], sum) {
            if !(may_cut && cum2 >= p) {
                (cum, run, pos) = (cum2, run2, pos + (e - a));
                continue;
            }
        }
        sort_bucket(&b.vals[a..e], &mut b.order);
        for (j, &o) in b.order.iter().enumerate() {
            let w = b.weights[a + o as u32 as usize];
            run += w as f64;
            cum += w / sum;
            if cum >= p && pos + j + 1 >= min_keep {
                cut = Some((bi, j + 1));
                break;
            }
        }
        if cut.is_some() {
            break;
        }
        pos += e - a;
    }
    let (kb, kj) = match cut {
        Some(cut) => cut,
        // Every entry is kept.
        None if visited == nb => (nb - 1, b.starts[nb] as usize - b.starts[nb - 1] as usize),
        // Never reached: `cut_bound`'s bucket holds the cut. Declined all the same.
        None => return None,
    };
    let total = run;
    let target = total * u;

    // The draw: the first bucket whose running sum after it reaches the target (the cut's
    // bucket ends at the cut), then its entries in order.
    let after = |bi: usize, run_before: &[f64]| if bi == kb { total } else { run_before[bi + 1] };
    let db = (0..=kb).find(|&bi| after(bi, &b.run_before) >= target).unwrap_or(kb);
    let (a, e) = (b.starts[db] as usize, b.starts[db + 1] as usize);
    sort_bucket(&b.vals[a..e], &mut b.order);
    let limit = if db == kb { kj } else { e - a };
    let mut run = b.run_before[db];
    let mut i = limit.saturating_sub(1);
    for (j, &o) in b.order[..limit].iter().enumerate() {
        run += b.weights[a + o as u32 as usize] as f64;
        if run >= target {
            i = j;
            break;
        }
    }
    // Another entry of the chosen value (equal values share the bucket): libstdc++'s order
    // would pick which token.
    let value_at = |j: usize| b.vals[a + b.order[j] as u32 as usize];
    let v = value_at(i);
    if (i > 0 && value_at(i - 1) == v) || (i + 1 < e - a && value_at(i + 1) == v) {
        return None;
    }
    let w = b.weights[a + b.order[i] as u32 as usize];
    let id = arch::position_eq(r, v)? as u32;
    c.begin(n);
    c.data.push(TokenData { id, logit: r[id as usize], p: (w as f64 / total) as f32 });
    c.selected = Some(0);
    Some(id)
}

/// Fills the buckets the walk may visit from the entries of the top buckets alone: for a
/// growing number `cap` of them (from the last row's count, at least 64, four times more each
/// time), the entries at or above a value every entry of those buckets reaches are counted by
/// one vector pass and, if few, gathered by another; their buckets' counts are enough where
/// [`cut_bound`] finds the cut among them. Returns how many buckets were filled (`b.starts` up
/// to there, `b.vals` with their entries, in row order within each), or `None` where the top
/// buckets hold more than an eighth of the row first (a nearly flat row).
fn fill_top(cut: Cut, r: &[f32], grid: Grid, b: &mut BucketScratch) -> Option<usize> {
    let nb = grid.nb;
    if grid.scale <= 0.0 {
        return None;
    }
    let mut cap = b.hint.max(64).min(nb - 1);
    loop {
        let at_least = grid.at_least(cap);
        if arch::count_ge(r, at_least) > r.len() / 8 {
            return None;
        }
        b.positions.clear();
        arch::positions_ge(r, at_least, &mut b.positions);
        b.ids.clear();
        b.ids.extend(b.positions.iter().map(|&j| grid.bucket(r[j as usize])));
        b.starts.clear();
        b.starts.resize(nb + 1, 0);
        for &i in &b.ids {
            if (i as usize) < cap {
                b.starts[i as usize + 1] += 1;
            }
        }
        for i in 1..=cap {
            b.starts[i] += b.starts[i - 1];
        }
        if let Some(visited) = cut_bound(cut, grid.scale, &b.starts, cap) {
            b.hint = visited;
            #[cfg(test)]
            {
                b.top_fills += 1;
            }
            scatter(
                b.positions.iter().map(|&j| r[j as usize]).zip(&b.ids),
                visited,
                &b.starts,
                &mut b.next,
                &mut b.vals,
            );
            return Some(visited);
        }
        if cap == nb - 1 {
            return None;
        }
        cap = (cap * 4).min(nb - 1);
    }
}

/// Fills the buckets the walk may visit from the whole row: every entry's bucket (one
/// vector-friendly pass), the counts, then the entries of the visited buckets only (all of
/// them on a nearly flat row). Returns how many buckets were filled, as [`fill_top`].
fn fill_all(cut: Cut, r: &[f32], grid: Grid, b: &mut BucketScratch) -> usize {
    let nb = grid.nb;
    // PERF: one vector-friendly pass for the bucket numbers, then the counts and the scatter
    // from them (a saturating float-to-integer conversion in the counting loop cost more than
    // the rest of it).
    b.ids.clear();
    b.ids.extend(r.iter().map(|&x| grid.bucket(x)));
    b.starts.clear();
    b.starts.resize(nb + 1, 0);
    // PERF: the buffers as local slices, so that the loops keep their addresses in registers
    // (through `b`, every store reloaded them: about twice the time of the counts and the
    // scatter).
    let (counts, ids) = (&mut b.starts[..], &b.ids[..]);
    for &i in ids {
        // `i <= last` (`nb - 1`): in bounds.
        counts[i as usize + 1] += 1;
    }
    for i in 1..=nb {
        counts[i] += counts[i - 1];
    }
    let visited = cut_bound(cut, grid.scale, &b.starts, nb - 1).unwrap_or(nb);
    b.hint = visited;
    // PERF: where the visited buckets hold most of the row (a nearly flat one), listing their
    // entries first cost more than it saved: 0.9–1.0 against 0.75–0.85 ms at V = 128k.
    if b.starts[visited] as usize * 4 > r.len() {
        scatter(r.iter().copied().zip(&b.ids), visited, &b.starts, &mut b.next, &mut b.vals);
    } else {
        // Their entries, found by one vector pass, then checked one by one.
        b.positions.clear();
        arch::positions_ge(r, grid.at_least(visited), &mut b.positions);
        let ids = &b.ids;
        scatter(
            b.positions.iter().map(|&j| (r[j as usize], &ids[j as usize])),
            visited,
            &b.starts,
            &mut b.next,
            &mut b.vals,
        );
    }
    visited
}

/// The buckets of a row whose maximum is `max`: `nb` of them, `1 / scale` wide below it, the
/// last also holding everything below the range.
#[derive(Clone, Copy)]
struct Grid {
    max: f32,
    scale: f32,
    nb: usize,
}

impl Grid {
    /// The bucket of `x`: `y = fl32(fl32(max - x) · scale)`, at least 0, clamped to the last
    /// (`-inf` gives `inf`, or `NaN` times a zero scale, which `min` turns into the last);
    /// adding 2^23 rounds it to an integer in the low bits, and rounding too only grows with
    /// `y`.
    #[inline]
    fn bucket(&self, x: f32) -> u32 {
        let y = ((self.max - x) * self.scale).min((self.nb - 1) as f32);
        (y + 8_388_608.0).to_bits() - 0x4b00_0000
    }

    /// A value that every entry of the first `buckets` buckets reaches: `max - (buckets + 1) /
    /// scale` rounded down, from [`cut_bound`]'s bound `max - x < (i + 1) / scale` on bucket
    /// `i`, with a bucket to spare.
    fn at_least(&self, buckets: usize) -> f32 {
        super::dense::f32_at_most(f64::from(self.max) - (buckets as f64 + 1.0) / f64::from(self.scale))
    }
}

/// `top_p(p, min_keep)` over a row whose softmax sum is `sum`.
#[derive(Clone, Copy)]
struct Cut {
    p: f32,
    min_keep: usize,
    sum: f32,
}

/// Places the `entries` (value, bucket) of the first `visited` buckets in `vals`, by bucket
/// (`starts`: where each begins), in their order within each; the others are skipped.
fn scatter<'a>(
    entries: impl Iterator<Item = (f32, &'a u32)>,
    visited: usize,
    starts: &[u32],
    next: &mut Vec<u32>,
    vals: &mut Vec<f32>,
) {
    next.clear();
    next.extend_from_slice(&starts[..visited]);
    vals.resize(starts[visited] as usize, 0.0);
    // PERF: local slices (see `fill_all`).
    let (next, vals) = (&mut next[..], &mut vals[..]);
    for (x, &i) in entries {
        if let Some(slot) = next.get_mut(i as usize) {
            vals[*slot as usize] = x;
            *slot += 1;
        }
    }
}

/// How many of the buckets (`starts`: where each starts; bucket `i` holding the values `x`
/// with `fl32(fl32(max - x) · scale)` rounded to `i`) the walk of `top_p(p, min_keep)` may
/// visit, with `sum` the softmax sum: the first `j + 1`, for the first `j` whose buckets hold
/// at least `min_keep` entries with a mass that brings `cum` to `p` in any order and whatever
/// its roundings. Only the first `counted` buckets are looked at (`starts` up to
/// `starts[counted]` must be right), never the row's last, which also holds the entries below
/// `max - FLOOR`: `None` where they do not suffice.
///
/// The bounds: bucket `i` holds values with `fl32(fl32(max - x) · scale) <= i + 1/2`, so
/// `max - x < (i + 1) / scale` (the two roundings are relative `2^-24` each, and `i` is far
/// below `2^22`), and `fl32(x - max)` is above `-(i + 1) / scale` too: each weight
/// `expf(x - max)` is at least `exp(-(i + 1) / scale)` less `expf`'s error (taken as
/// `2^-19`, relative). `cum` adds `m` terms `fl32(w / sum)` in f32, each term and each
/// partial sum rounded once (relative `2^-24`, and every term is positive), so it ends at or
/// above `(1 - 2^-24)^(2m) > 1 - m · 2^-23` times their exact total `Σ w / sum` while every
/// weight and term is a normal f32.
fn cut_bound(Cut { p, min_keep, sum }: Cut, scale: f32, starts: &[u32], counted: usize) -> Option<usize> {
    if !(scale > 0.0 && sum > 0.0 && sum.is_finite() && p <= 1.0) {
        return None;
    }
    // `p · sum`, and a margin for the f64 arithmetic below.
    let need = f64::from(p) * f64::from(sum) * (1.0 + 1e-9);
    let mut mass = 0.0f64;
    // `exp(-(i + 1) / scale)` by products of `exp(-1 / scale)`, each rounded up or down by
    // half an f64 ulp: a relative error below `2^-40` over 2^11 buckets, within the margin.
    let step = (-1.0 / f64::from(scale)).exp();
    let mut least = step * (1.0 - 2f64.powi(-19));
    for i in 0..counted {
        let m = starts[i + 1] as usize;
        // Past `2^-100` of the sum, a weight or a term could be subnormal (`sum >= 1`: it
        // holds the maximum's weight), where the roundings are no longer relative.
        if m >= 1 << 22 || least < f64::from(sum) * 2f64.powi(-100) {
            return None;
        }
        mass += f64::from(starts[i + 1] - starts[i]) * least;
        least *= step;
        if m >= min_keep && mass * (1.0 - m as f64 * 2f64.powi(-23)) >= need {
            return Some(i + 1);
        }
    }
    None
}

/// One bucket's values in descending order, as indices into it (the low 32 bits of `order`).
fn sort_bucket(vals: &[f32], order: &mut Vec<u64>) {
    order.clear();
    order.extend(vals.iter().enumerate().map(|(i, &x)| (u64::from(!total_order_key(x + 0.0)) << 32) | i as u64));
    order.sort_unstable();
}

/// `cum` and `run` after llama.cpp's loop adds the weights `ws` (in any order: the same
/// result, see the module docs), or `None` where the order may matter: a sum not yet in a
/// binade with room (`cum` below the least normal f32, `run` below 1), a term that is a tie
/// for its sum's ulp, or a total that reaches the sum's next binade.
///
/// Each term's increment is `t = x / q` rounded to the nearest integer, where `x / q` is exact
/// (`q` a power of two), totalled in integers by [`arch::rounded_increments`], which refuses
/// a `t` of 2^52 or more (it could never fit the room).
fn add_whole(cum: f32, run: f64, ws: &[f32], sum: f32) -> Option<(f32, f64)> {
    if !(cum >= f32::MIN_POSITIVE && cum.is_finite() && (1.0..f64::MAX).contains(&run)) {
        return None;
    }
    // 1/q for `cum`'s ulp `q = 2^(E - 150)` and `run`'s `2^(E - 1075)` (biased exponents `E`):
    // `cum`'s `E` is in 1..=254, so `1173 - E` is a normal f64's biased exponent; `run >= 1`,
    // so `2098 - E` is in 1..=1075.
    let scale_cum = f64::from_bits(u64::from(1173 - (cum.to_bits() >> 23)) << 52);
    let scale_run = f64::from_bits((2098 - (run.to_bits() >> 52)) << 52);
    let (k_cum, k_run) = arch::rounded_increments(ws, sum, scale_cum, scale_run)?;
    let room_cum = u64::from((1u32 << 23) - (cum.to_bits() & 0x7f_ffff));
    let room_run = (1u64 << 52) - (run.to_bits() & ((1u64 << 52) - 1));
    if !(k_cum < room_cum && k_run < room_run) {
        return None;
    }
    Some((f32::from_bits(cum.to_bits() + k_cum as u32), f64::from_bits(run.to_bits() + k_run)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convention::llama_cpp::dense::{draw_by_sorting, Scratch};
    use tokensieve_testkit::generate::{self, RowKind, SplitMix64};

    /// The softmax sum llama.cpp's `top_p` divides by: f32, in row order.
    fn row_sum(row: &[f32], max: f32) -> f32 {
        row.iter().fold(0.0f32, |s, &x| s + (x - max).exp())
    }

    /// The bucketed draw against the whole-row sort (itself held to the array path by
    /// `draws_by_sorting_are_the_array_paths`): the same token, probability and declines, for
    /// draws spread over `[0, 1)` and a range of `p` and `min_keep`, on rows that keep most of
    /// their entries (nearly flat: the case it exists for), rows with ties (a coarse grid,
    /// bfloat16 values), rows with `-inf` entries or values far apart, language-model-like
    /// rows at higher temperatures (the top `p` of the mass in tens to thousands of entries,
    /// where only the top buckets are filled), and rows small enough that the buckets hold a
    /// few entries or one. The scratch is kept from row to row, as a chain keeps it: each row
    /// starts from the last one's count of buckets.
    #[test]
    fn bucketed_draws_are_the_sorted_draws() {
        let mut rng = SplitMix64::new(5);
        let (mut drawn, mut declined, mut cases) = (0, 0, 0);
        let mut b = BucketScratch::default();
        let mut rows_filled = 0;
        for (v, seed) in [(40usize, 1u64), (1_500, 2), (5_000, 3), (32_000, 4)] {
            let gaussian = generate::row(RowKind::Gaussian, v, seed);
            let peaked = generate::row(RowKind::Peaked, v, seed);
            let rows: Vec<Vec<f32>> = vec![
                gaussian.iter().map(|x| x * 0.02).collect(),
                gaussian.iter().map(|x| x * 0.3).collect(),
                gaussian.iter().map(|x| (x * 0.02 * 300.0).round() / 300.0).collect(),
                gaussian.iter().map(|x| half::bf16::from_f32(x * 0.05).to_f32()).collect(),
                generate::row(RowKind::NegInf, v, seed).iter().map(|x| x * 0.05).collect(),
                peaked.clone(),
                peaked.iter().map(|x| x * 0.7).collect(),
                peaked.iter().map(|x| x * 0.5).collect(),
                peaked.iter().map(|x| half::bf16::from_f32(x * 0.4).to_f32()).collect(),
                generate::row(RowKind::Huge, v, seed),
                generate::row(RowKind::Flat, v, seed),
            ];
            for row in rows {
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let sum = row_sum(&row, max);
                let (mut s, mut c_want, mut c_got) = (Scratch::default(), Candidates::default(), Candidates::default());
                let before = b.top_fills;
                for _ in 0..6 {
                    let p = [0.95f32, 0.5, 0.999, 0.2, 1.0][rng.below(5)];
                    let min_keep = [1, 1, 3, v / 2, v + 5][rng.below(5)];
                    cases += 1;
                    for j in 0..60 {
                        let u = if j == 0 { 0.0 } else { rng.next_f64() };
                        let want = draw_by_sorting(p, min_keep, &row, max, sum, u, &mut s, &mut c_want);
                        let got = draw(p, min_keep, &row, max, sum, u, &mut b, &mut c_got);
                        assert_eq!(got, want, "V={v} top_p({p},{min_keep}) u = {u}");
                        match got {
                            Some(_) => {
                                assert_eq!(c_got.as_slice(), c_want.as_slice(), "V={v} top_p({p},{min_keep}) u = {u}");
                                assert_eq!(c_got.selected_index(), Some(0));
                                drawn += 1;
                            }
                            None => declined += 1,
                        }
                    }
                }
                rows_filled += usize::from(b.top_fills > before);
            }
        }
        assert!(cases == 264 && drawn > 5_000 && declined > 300, "{drawn} drawn, {declined} declined");
        assert!(
            b.top_fills > 900 && rows_filled >= 8,
            "{} draws, {rows_filled} rows from the top buckets",
            b.top_fills
        );
    }

    /// The bounds the top buckets are found and counted by ([`cut_bound`]'s): every value of
    /// bucket `i` lies at or above [`Grid::at_least`] of `i + 1` buckets (so of any more) and
    /// `max - x < (i + 1) / scale`, and its weight is at least `exp(-(i + 1) / scale)` less
    /// `2^-19`; on values at and around the buckets' edges, with maxima and widths from tiny
    /// to large.
    #[test]
    fn bucket_bounds_hold_at_the_edges() {
        let mut rng = SplitMix64::new(17);
        let mut checked = 0;
        for case in 0..4_000 {
            let max = [0.0f32, 1.0, -3.5, 17.25, 1e4, -1e4, 3e-5][case % 7] + (rng.next_f64() as f32 - 0.5);
            let buckets = [64usize, 256, 1024, 2048][rng.below(4)];
            let depth = [1e-3f32, 0.1, 1.0, 7.0, 40.0, 128.0][rng.below(6)] * (0.5 + rng.next_f64() as f32);
            let scale = buckets as f32 / depth;
            let grid = Grid { max, scale, nb: buckets + 1 };
            for _ in 0..40 {
                // Near an edge `(k + 1/2) / scale` below the maximum, a few ulps either way.
                let k = rng.below(buckets);
                let edge = max - ((k as f32 + 0.5) / scale);
                let x = f32::from_bits((edge.to_bits() as i64 + rng.below(9) as i64 - 4) as u32);
                if !(x <= max && x.is_finite()) {
                    continue;
                }
                let i = grid.bucket(x) as usize;
                if i + 1 >= buckets {
                    continue;
                }
                checked += 1;
                assert!(x >= grid.at_least(i + 1), "case {case}: x {x} in bucket {i}");
                let d = f64::from(max) - f64::from(x);
                assert!(d < (i + 1) as f64 / f64::from(scale), "case {case}: x {x} in bucket {i}");
                let w = f64::from((x - max).exp());
                let least = (-((i + 1) as f64) / f64::from(scale)).exp();
                assert!(
                    least < 2f64.powi(-100) || w >= least * (1.0 - 2f64.powi(-19)),
                    "case {case}: x {x}, bucket {i}"
                );
            }
        }
        assert!(checked > 100_000, "{checked}");
    }

    /// The whole-bucket sums are the one-by-one sums, bit for bit, wherever they are given:
    /// over random weights and sums in several binades (ties included, from weights on a coarse
    /// grid), and they are given on most of those that stay in a binade.
    #[test]
    fn whole_buckets_add_as_one_by_one() {
        let mut rng = SplitMix64::new(9);
        let (mut given, mut tries) = (0, 0);
        for case in 0..20_000 {
            let m = 1 + rng.below(40);
            let sum = (1.0 + rng.next_f64() * 1e5) as f32;
            let ws: Vec<f32> = (0..m)
                .map(|_| {
                    let w = (rng.next_f64() * rng.next_f64()) as f32;
                    if case % 3 == 0 {
                        (w * 64.0).round() / 64.0
                    } else {
                        w
                    }
                })
                .collect();
            let cum = (rng.next_f64() * 0.9) as f32;
            let run = 1.0 + rng.next_f64() * 2f64.powi(rng.below(20) as i32);
            tries += 1;
            if let Some((c2, r2)) = add_whole(cum, run, &ws, sum) {
                given += 1;
                let (mut c1, mut r1) = (cum, run);
                for &w in &ws {
                    c1 += w / sum;
                    r1 += w as f64;
                }
                assert_eq!((c2.to_bits(), r2.to_bits()), (c1.to_bits(), r1.to_bits()), "case {case}");
            }
        }
        assert!(given * 2 > tries, "{given} of {tries}");
        // Not in a binade yet: never.
        assert_eq!(add_whole(0.0, 1.0, &[0.5], 1.0), None);
        assert_eq!(add_whole(0.5, 0.0, &[0.5], 1.0), None);
    }
}
