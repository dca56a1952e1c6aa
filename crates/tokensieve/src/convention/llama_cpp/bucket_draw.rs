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
    let last = (nb - 1) as f32;
    // PERF: one vector-friendly pass for the bucket numbers, then the counts and the scatter
    // from them (a saturating float-to-integer conversion in the counting loop cost more than
    // the rest of it). `y = fl32(max - x) · scale` is at least 0, clamped to `last` (`-inf`
    // gives `inf`, or `NaN` times a zero scale, which `min` turns into `last`); adding 2^23
    // rounds it to an integer in the low bits, and rounding too only grows with `y`.
    b.ids.clear();
    b.ids.extend(r.iter().map(|&x| {
        let y = ((max - x) * scale).min(last);
        (y + 8_388_608.0).to_bits() - 0x4b00_0000
    }));
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
    b.next.clear();
    b.next.extend_from_slice(&b.starts[..nb]);
    b.vals.resize(n, 0.0);
    let (next, vals) = (&mut b.next[..], &mut b.vals[..]);
    for (&x, &i) in r.iter().zip(&b.ids) {
        let slot = &mut next[i as usize];
        vals[*slot as usize] = x;
        *slot += 1;
    }
    b.weights.resize(n, 0.0);
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
    for bi in 0..nb {
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
    // Never reached: every entry is kept.
    let (kb, kj) = cut.unwrap_or((nb - 1, b.starts[nb] as usize - b.starts[nb - 1] as usize));
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
    /// bfloat16 values), rows with `-inf` entries or values far apart, and rows small enough
    /// that the buckets hold a few entries or one.
    #[test]
    fn bucketed_draws_are_the_sorted_draws() {
        let mut rng = SplitMix64::new(5);
        let (mut drawn, mut declined, mut cases) = (0, 0, 0);
        for (v, seed) in [(40usize, 1u64), (1_500, 2), (5_000, 3), (32_000, 4)] {
            let gaussian = generate::row(RowKind::Gaussian, v, seed);
            let rows: Vec<Vec<f32>> = vec![
                gaussian.iter().map(|x| x * 0.02).collect(),
                gaussian.iter().map(|x| x * 0.3).collect(),
                gaussian.iter().map(|x| (x * 0.02 * 300.0).round() / 300.0).collect(),
                gaussian.iter().map(|x| half::bf16::from_f32(x * 0.05).to_f32()).collect(),
                generate::row(RowKind::NegInf, v, seed).iter().map(|x| x * 0.05).collect(),
                generate::row(RowKind::Peaked, v, seed),
                generate::row(RowKind::Huge, v, seed),
                generate::row(RowKind::Flat, v, seed),
            ];
            for row in rows {
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let sum = row_sum(&row, max);
                let (mut s, mut c_want, mut c_got) = (Scratch::default(), Candidates::default(), Candidates::default());
                let mut b = BucketScratch::default();
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
            }
        }
        assert!(cases == 192 && drawn > 5_000 && declined > 300, "{drawn} drawn, {declined} declined");
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
