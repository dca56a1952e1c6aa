//! llama.cpp's shared sampler helpers, with its arithmetic and its sort order.
//!
//! Sorting is by descending logit with libstdc++'s unstable algorithms (see [`crate::stdsort`]),
//! because candidate order decides which token a draw picks. "Sort the whole array" is, as in
//! llama.cpp, a partial sort of all of it: a heap sort for up to 128 candidates and the
//! 128-bucket sort over [-10, 10] above that.

use crate::candidates::{Candidates, TokenData};
use crate::stdsort;

mod bucket_draw;
pub mod dense;

/// llama.cpp's comparator: `a.logit > b.logit`.
#[inline]
pub fn desc(a: &TokenData, b: &TokenData) -> bool {
    a.logit > b.logit
}

/// C++'s `std::max(a, b)`: `a < b ? b : a`. Unlike [`f32::max`] it returns `a` for `-0.0`
/// against `0.0` (and for NaN in `b`), which is what llama.cpp's max scans compute.
#[inline]
pub fn std_max(a: f32, b: f32) -> f32 {
    if a < b {
        b
    } else {
        a
    }
}

const N_BUCKETS: usize = 128;
const BUCKET_SCALE: f32 = N_BUCKETS as f32 / 20.0; // 128 buckets over [-10, 10]
const BUCKET_INTER: f32 = 10.0 * BUCKET_SCALE;

#[inline]
fn bucket_of(logit: f32) -> usize {
    // `int(scale * v + inter)` then clamped; Rust's saturating cast gives the same bucket as
    // x86's conversion for -inf and NaN (both end in bucket 0).
    let ib = (BUCKET_SCALE * logit + BUCKET_INTER) as i32;
    ib.clamp(0, N_BUCKETS as i32 - 1) as usize
}

/// The least value in bucket `b` or above: every `x` with `bucket_of(x) >= b` is at least
/// this (the bucket is a monotone function of the value), `-inf` for bucket 0.
fn bucket_floor(b: usize) -> f32 {
    if b == 0 {
        return f32::NEG_INFINITY;
    }
    // The edge as real arithmetic puts it, then moved by the ulps that rounding shifts it.
    let mut x = (b as f32 - BUCKET_INTER) / BUCKET_SCALE;
    while bucket_of(x) < b {
        x = x.next_up();
    }
    while bucket_of(x.next_down()) >= b {
        x = x.next_down();
    }
    x
}

/// llama.cpp's bucket partial sort: writes into `res` the contents of the smallest run of top
/// buckets holding at least `npartial` candidates, with the first `npartial` of them sorted
/// (full buckets with `std::sort`, the boundary bucket with `std::partial_sort`). `cur` is
/// not changed. `bucket_idx` is scratch.
pub fn bucket_partial_sort(cur: &[TokenData], npartial: usize, res: &mut Vec<TokenData>, bucket_idx: &mut Vec<u8>) {
    let mut histo = [0usize; N_BUCKETS];
    bucket_idx.clear();
    bucket_idx.extend(cur.iter().map(|t| {
        let b = bucket_of(t.logit);
        histo[b] += 1;
        b as u8
    }));
    let mut nhave = 0;
    let mut ib = N_BUCKETS as isize - 1;
    while ib >= 0 {
        nhave += histo[ib as usize];
        if nhave >= npartial {
            break;
        }
        ib -= 1;
    }
    let ib = ib.max(0) as usize;
    // Bucket j (from the top) starts at offset starts[j]; scatter in array order.
    let mut starts = [0usize; N_BUCKETS];
    let mut off = 0;
    for j in (ib..N_BUCKETS).rev() {
        starts[j] = off;
        off += histo[j];
    }
    res.clear();
    res.resize(nhave, TokenData::default());
    for (t, &b) in cur.iter().zip(bucket_idx.iter()) {
        let b = b as usize;
        if b >= ib {
            res[starts[b]] = *t;
            starts[b] += 1;
        }
    }
    let mut ptr = 0;
    let mut ndone = 0;
    for j in (ib + 1..N_BUCKETS).rev() {
        stdsort::sort(&mut res[ptr..ptr + histo[j]], desc);
        ptr += histo[j];
        ndone += histo[j];
    }
    let boundary = &mut res[ptr..ptr + histo[ib]];
    stdsort::partial_sort(boundary, npartial.saturating_sub(ndone), desc);
}

/// Keeps the top `npartial` candidates, sorted descending (llama.cpp's
/// `llama_token_data_array_partial_sort_inplace`). `npartial` must be `<= len`.
pub fn partial_sort_inplace(cands: &mut Candidates, npartial: usize) {
    let npartial = npartial.min(cands.data.len());
    if npartial <= 128 {
        stdsort::partial_sort(&mut cands.data, npartial, desc);
    } else {
        let mut tmp = std::mem::take(&mut cands.scratch);
        bucket_partial_sort(&cands.data, npartial, &mut tmp, &mut cands.buckets);
        cands.data[..npartial].copy_from_slice(&tmp[..npartial]);
        cands.scratch = tmp;
    }
    cands.data.truncate(npartial);
    cands.sorted = true;
}

/// Sorts every candidate (llama.cpp's "full sort" = partial sort of the whole array).
pub fn sort_all(cands: &mut Candidates) {
    let n = cands.data.len();
    partial_sort_inplace(cands, n);
}

/// llama.cpp's `llama_sampler_softmax_impl`: optional sort, max (first entry if sorted),
/// `p = expf(l - max)` summed in f32, then each `p` divided by the sum. An empty array is left
/// alone (llama.cpp asserts).
pub fn softmax(cands: &mut Candidates, do_sort: bool) {
    if cands.data.is_empty() {
        return;
    }
    if do_sort && !cands.sorted {
        sort_all(cands);
    }
    let data = &mut cands.data;
    let mut max_l = data[0].logit;
    if !cands.sorted {
        for t in &data[1..] {
            max_l = max_l.max(t.logit);
        }
    }
    let mut sum = 0.0f32;
    for t in data.iter_mut() {
        let p = (t.logit - max_l).exp();
        t.p = p;
        sum += p;
    }
    for t in data.iter_mut() {
        t.p /= sum;
    }
}

/// llama.cpp's `llama_sampler_temp_impl`: `t <= 0` keeps the first maximum (strict `>`) and
/// sets every other logit to `-inf` without removing it; otherwise every logit is divided by `t`.
pub fn temperature(cands: &mut Candidates, temp: f32) {
    let data = &mut cands.data;
    if data.is_empty() {
        return;
    }
    if temp <= 0.0 {
        let mut max_i = 0;
        let mut max_l = data[0].logit;
        for i in 1..data.len() {
            if data[i].logit > max_l {
                data[max_i].logit = f32::NEG_INFINITY;
                max_i = i;
                max_l = data[i].logit;
            } else {
                data[i].logit = f32::NEG_INFINITY;
            }
        }
        return;
    }
    for t in data.iter_mut() {
        t.logit /= temp;
    }
}

/// llama.cpp's `llama_sampler_top_k_impl`: `k <= 0` is a no-op; otherwise keep the top
/// `min(k, len)` candidates, sorted (a plain truncation when already sorted).
pub fn top_k(cands: &mut Candidates, k: i32) {
    if k <= 0 {
        return;
    }
    let k = (k as usize).min(cands.data.len());
    if !cands.sorted {
        partial_sort_inplace(cands, k);
    }
    cands.data.truncate(k);
}

/// libstdc++'s `std::discrete_distribution<int>` over the `p` fields, drawn with one
/// `uniform_f64`: weights widened to f64, normalised by their sequential f64 sum, cumulative
/// sums with the last forced to 1, `lower_bound`. Fewer than two weights draw nothing and
/// return 0. `cum` is scratch.
pub fn discrete_distribution(data: &[TokenData], cum: &mut Vec<f64>, mut uniform: impl FnMut() -> f64) -> usize {
    if data.len() < 2 {
        return 0;
    }
    let sum: f64 = data.iter().fold(0.0, |acc, t| acc + t.p as f64);
    cum.clear();
    let mut run = 0.0f64;
    for t in data {
        run += t.p as f64 / sum;
        cum.push(run);
    }
    *cum.last_mut().expect("len >= 2") = 1.0;
    let u = uniform();
    cum.partition_point(|&c| c < u)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands(logits: &[f32]) -> Candidates {
        Candidates::from_logits(logits).unwrap()
    }

    #[test]
    fn softmax_sorts_and_normalises() {
        let mut c = cands(&[1.0, 3.0, 2.0]);
        softmax(&mut c, true);
        let ids: Vec<u32> = c.as_slice().iter().map(|t| t.id).collect();
        assert_eq!(ids, [1, 2, 0]);
        let s: f32 = c.as_slice().iter().map(|t| t.p).sum();
        assert!((s - 1.0).abs() < 1e-6);
    }

    #[test]
    fn bucket_sort_path_matches_a_plain_sort_on_distinct_values() {
        let logits: Vec<f32> = (0..1000).map(|i| ((i * 7919) % 1000) as f32 / 37.0 - 13.0).collect();
        let mut c = cands(&logits);
        partial_sort_inplace(&mut c, 300);
        let mut expect = logits.clone();
        expect.sort_by(|a, b| b.total_cmp(a));
        let got: Vec<f32> = c.as_slice().iter().map(|t| t.logit).collect();
        assert_eq!(got, expect[..300]);
        assert!(c.is_sorted());
    }

    #[test]
    fn temperature_zero_keeps_first_maximum_in_place() {
        let mut c = cands(&[1.0, 5.0, 5.0, 2.0]);
        temperature(&mut c, 0.0);
        let l: Vec<f32> = c.as_slice().iter().map(|t| t.logit).collect();
        assert_eq!(l, [f32::NEG_INFINITY, 5.0, f32::NEG_INFINITY, f32::NEG_INFINITY]);
    }

    #[test]
    fn discrete_distribution_draws_nothing_for_one_weight() {
        let c = cands(&[0.0]);
        let mut cum = Vec::new();
        assert_eq!(discrete_distribution(c.as_slice(), &mut cum, || panic!("no draw expected")), 0);
    }
}
