//! Hugging Face transformers' arithmetic (5.23.0 on torch 2.15, x86-64 CPU), in one place.
//!
//! The processors in [`crate::sampler::transformers`] are thin: what makes them bit-exact is
//! here. Everything follows `../shared/reference/transformers.md` §1:
//!
//! * **The dense row.** HF processors see the whole `(batch, vocab)` score tensor and remove a
//!   token by writing `-inf`; nothing is ever dropped or reordered. [`ensure_dense`] keeps the
//!   candidate array in vocabulary order (`data[i].id == i`), scattering it back if a stage of
//!   another convention reordered or truncated it.
//! * **Scalars are f32.** A Python float meets an f32 tensor as `fl32(x)`; parameters are kept
//!   as the f64 the user wrote and rounded at the point of use ([`fl32`]), so that
//!   `1 - top_p` can be formed in double first, as Python does.
//! * **Softmax.** torch's CPU softmax is SIMD f32 whose bits depend on the ISA (up to ~81 ulp
//!   from the exactly rounded value). tokensieve computes `exp(z - max)` and the sum in f64 and
//!   rounds each probability once to f32, i.e. (nearly) the exactly rounded softmax. The
//!   *masks* then match torch's everywhere except within ~1e-6 relative of a threshold, the
//!   cases the goldens flag `fragile`. The difference `z - max` is taken in f32, as torch does.
//! * **cumsum** on CPU adds f32 values in f64 and rounds every partial sum to f32
//!   ([`Cumsum`]).
//! * **Sort and topk tie order.** `torch.sort(stable=False)` is libstdc++'s `std::sort` on
//!   `(value, index)` pairs compared by value only; `torch.topk` is `std::partial_sort` when
//!   `k * 64 <= n`, else `std::nth_element` then `std::sort` of the first `k - 1`. Both are
//!   reproduced with [`crate::stdsort`] ([`sort_ascending`], [`topk`]), so where equal values
//!   straddle a cut the same tokens survive as in torch. Comparators put NaN where torch does
//!   (last ascending, first descending), which also keeps them strict weak orders.
//!
//! Buffers: every routine works in the candidates' own scratch buffer (`TokenData` used as
//! `(index, key, p)`), so no vocabulary-sized allocation happens per token after warm-up.

use crate::candidates::{total_order_key, Candidates, TokenData};
use crate::stdsort;

pub(crate) mod bottom;
pub(crate) mod row;
mod tail;

/// A Python float meeting an f32 tensor: rounded to the nearest f32.
#[inline]
pub fn fl32(x: f64) -> f32 {
    x as f32
}

/// Puts the candidates back in vocabulary order with one entry per token (`data[i].id == i`),
/// every token missing from the array as `-inf`. A no-op (one scan) when they already are,
/// which is the case in a chain built under the transformers convention unless the row fast
/// path (`row`) left a sparse view, which this expands. Clears the `sorted` flag: HF
/// processors never sort the row itself.
pub fn ensure_dense(c: &mut Candidates) {
    let v = c.vocab_size;
    if !is_dense(&c.data, v) {
        let mut buf = std::mem::take(&mut c.scratch);
        buf.clear();
        buf.extend((0..v).map(|i| TokenData { id: i as u32, logit: f32::NEG_INFINITY, p: 0.0 }));
        for t in &c.data {
            if let Some(slot) = buf.get_mut(t.id as usize) {
                *slot = *t;
            }
        }
        if let Some(sel) = c.selected {
            c.selected = c.data.get(sel).map(|t| t.id as usize).filter(|&i| i < v);
        }
        std::mem::swap(&mut c.data, &mut buf);
        c.scratch = buf;
        c.dropped_front = 0;
    }
    c.sorted = false;
    c.sparse = false;
}

/// `data[i].id == i` for every `i` and `data.len() == v`. Runs once per processor, so it is
/// written to vectorise: an OR of `id ^ i` over blocks (no early exit inside a block) instead
/// of a short-circuiting compare per entry.
fn is_dense(data: &[TokenData], v: usize) -> bool {
    const BLOCK: usize = 4096;
    data.len() == v
        && data.chunks(BLOCK).enumerate().all(|(b, block)| {
            let base = (b * BLOCK) as u32;
            block.iter().zip(base..).fold(0u32, |acc, (t, i)| acc | (t.id ^ i)) == 0
        })
}

/// `max` over the `logit` fields, as torch's `amax` for rows without NaN (`-inf` for an empty
/// or all-`-inf` row).
pub fn max_logit(data: &[TokenData]) -> f32 {
    data.iter().fold(f32::NEG_INFINITY, |m, t| if t.logit > m { t.logit } else { m })
}

/// `exp(z - max)` as the transformers softmax forms it: the difference in f32, the `exp` in
/// f64. A `-inf` logit (with a finite `max`) gives exactly `+0.0` without calling `exp`:
/// `-inf - max = -inf` and `exp(-inf) = +0` in IEEE arithmetic, so masked entries cost a
/// compare instead of a libm call.
#[inline]
pub fn weight(z: f32, max: f32) -> f64 {
    if z == f32::NEG_INFINITY {
        0.0
    } else {
        ((z - max) as f64).exp()
    }
}

/// [`weight`] of each of `logits` against `max`, into `out` (cleared): the same bits, computed
/// many at a time ([`arch::exp_in_place`](crate::arch::exp_in_place)).
pub fn weights_into(logits: impl Iterator<Item = f32>, max: f32, out: &mut Vec<f64>) {
    out.clear();
    out.extend(logits.map(|z| if z == f32::NEG_INFINITY { f64::NEG_INFINITY } else { (z - max) as f64 }));
    crate::arch::exp_in_place(out);
}

/// Softmax of the `logit` fields into the `p` fields (see the module docs): `max` in f32,
/// `exp(z - max)` and the sum in f64, each `p` rounded once. A row whose maximum is `-inf`
/// (or `+inf`) gives NaN, as torch does. Returns the maximum.
pub fn softmax(data: &mut [TokenData]) -> f32 {
    thread_local! {
        /// [`softmax_exps`]'s weights, reused (no allocation after the first rows of a size).
        static EXPS: std::cell::RefCell<Vec<f64>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    // PERF: the same bits as one `weight` call per entry for the sum and another for the
    // probability, with the exponentials computed once and many at a time (a dense row of
    // 128k tokens: about 1.3 ms of libm calls).
    EXPS.with_borrow_mut(|exps| softmax_exps(data, exps).0)
}

/// [`softmax`] computing each `exp` once: the weights are kept in `exps` (one per entry, in
/// array order) and reused for the sum and the probabilities, so every bit is the same as
/// [`softmax`]'s (the same values added in the same order). Returns `(max, sum)`; for a row
/// whose maximum is not finite the `p` fields are NaN, `exps` is empty and the sum is NaN.
pub fn softmax_exps(data: &mut [TokenData], exps: &mut Vec<f64>) -> (f32, f64) {
    let max = max_logit(data);
    exps.clear();
    if !max.is_finite() {
        for t in data.iter_mut() {
            t.p = f32::NAN;
        }
        return (max, f64::NAN);
    }
    weights_into(data.iter().map(|t| t.logit), max, exps);
    let mut sum = 0.0f64;
    for &e in exps.iter() {
        sum += e;
    }
    for (t, &e) in data.iter_mut().zip(exps.iter()) {
        t.p = (e / sum) as f32;
    }
    (max, sum)
}

/// CPU `cumsum` of f32 values: the running sum is kept in f64 and each partial sum is rounded
/// to f32 (bit-identical to `np.cumsum(x.astype(f64)).astype(f32)`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Cumsum(f64);

impl Cumsum {
    /// Adds `p` and returns the partial sum as torch writes it.
    #[inline]
    pub fn push(&mut self, p: f32) -> f32 {
        self.0 += p as f64;
        self.0 as f32
    }
}

/// torch's ascending comparator on `(value, index)`: by value only, NaN last.
#[inline]
pub fn asc(a: &TokenData, b: &TokenData) -> bool {
    (!a.logit.is_nan() && b.logit.is_nan()) || a.logit < b.logit
}

/// torch's descending comparator on `(value, index)`: by value only, NaN first.
#[inline]
pub fn desc(a: &TokenData, b: &TokenData) -> bool {
    (a.logit.is_nan() && !b.logit.is_nan()) || a.logit > b.logit
}

/// `torch.sort(x, descending=False)` on CPU: `buf` holds `(id = index, logit = value)` pairs
/// in index order and is left in torch's order, ties included.
pub fn sort_ascending(buf: &mut [TokenData]) {
    stdsort::sort(buf, asc);
}

/// `torch.topk(x, k)` (largest, sorted) on CPU: `buf` holds `(id = index, logit = value)` pairs
/// in index order; afterwards `buf[..k]` holds the entries torch returns, in its order.
/// `k` must be `<= buf.len()`.
pub fn topk(buf: &mut [TokenData], k: usize) {
    if k == 0 {
        return;
    }
    if k * 64 <= buf.len() {
        stdsort::partial_sort(buf, k, desc);
    } else {
        stdsort::nth_element(buf, k - 1, desc);
        stdsort::sort(&mut buf[..k - 1], desc);
    }
}

/// Fills `buf` with `(index, key(t), 0)` for every candidate, in index order.
pub fn fill_pairs(buf: &mut Vec<TokenData>, data: &[TokenData], key: impl Fn(&TokenData) -> f32) {
    buf.clear();
    buf.extend(data.iter().enumerate().map(|(i, t)| TokenData { id: i as u32, logit: key(t), p: 0.0 }));
}

/// `torch.topk(z, k).values[-1]`: the `k`-th largest logit of the dense row (duplicates
/// counted; `k` clamped to `1..=V`). Only the value is used, so the tie order does not matter.
pub fn kth_largest_logit(c: &mut Candidates, k: usize) -> f32 {
    let n = c.data.len();
    if n == 0 {
        return f32::NEG_INFINITY;
    }
    let k = k.clamp(1, n);
    let mut buf = std::mem::take(&mut c.scratch);
    let value = match kth_largest_filtered(&c.data, k, &mut buf) {
        Some(value) => value,
        None => kth_largest_by_nth_element(&c.data, k, &mut buf),
    };
    c.scratch = buf;
    value
}

/// The obvious k-th largest logit: libstdc++'s `nth_element` on the whole row, as torch's
/// `topk` would run it. `1 <= k <= data.len()`.
pub fn kth_largest_by_nth_element(data: &[TokenData], k: usize, buf: &mut Vec<TokenData>) -> f32 {
    fill_pairs(buf, data, |t| t.logit);
    stdsort::nth_element(buf, k - 1, desc);
    buf[k - 1].logit
}

/// The k-th largest logit by one filtering scan, for `k` small against the row: only values
/// above the k-th largest seen so far (`floor`) are collected; whenever the buffer fills up,
/// it is cut back to its `k` largest and `floor` rises. A value equal to `floor` can be
/// skipped: `k` values `>= floor` are already held, so it cannot change the k-th value. The
/// result equals the nth_element one as a value (`==`; for a tie of `-0.0` and `+0.0` it may
/// be the other zero, which no `<` comparison can tell apart). `None` when a NaN is seen or
/// `k` is too large for the filter to pay (then use [`kth_largest_by_nth_element`]).
/// `1 <= k <= data.len()`.
pub fn kth_largest_filtered(data: &[TokenData], k: usize, buf: &mut Vec<TokenData>) -> Option<f32> {
    if k.saturating_mul(8) > data.len() {
        return None;
    }
    let cap = (4 * k).max(256);
    let by_value_desc = |a: &TokenData, b: &TokenData| b.logit.total_cmp(&a.logit);
    buf.clear();
    let mut floor = f32::NEG_INFINITY;
    for t in data {
        if t.logit > floor {
            buf.push(*t);
            if buf.len() == cap {
                buf.select_nth_unstable_by(k - 1, by_value_desc);
                buf.truncate(k);
                floor = buf[k - 1].logit;
            }
        } else if t.logit.is_nan() {
            return None;
        }
    }
    if buf.len() < k {
        // Fewer than k values above -inf: the k-th largest is -inf.
        return Some(f32::NEG_INFINITY);
    }
    buf.select_nth_unstable_by(k - 1, by_value_desc);
    Some(buf[k - 1].logit)
}

/// The inverse of the crate's order key of an f32 (an order-preserving map to a u32: `a < b`
/// implies `key(a) < key(b)`; `-0.0` maps just below `+0.0`).
#[inline]
pub fn from_sort_key(key: u32) -> f32 {
    if key >> 31 == 1 {
        f32::from_bits(key & 0x7FFF_FFFF)
    } else {
        f32::from_bits(!key)
    }
}

/// The finite logits of `data` in ascending order, as order keys (decode with
/// [`from_sort_key`]): an LSD radix sort of the values alone, so it gives the same value
/// sequence as any correct ascending sort, torch's included, but no index order. `keys` is
/// scratch space; returns the sorted slice, or `None` when the row holds a NaN.
pub fn sorted_finite_logits<'k>(data: &[TokenData], keys: &'k mut Vec<u32>) -> Option<&'k [u32]> {
    keys.clear();
    for t in data {
        if t.logit.is_nan() {
            return None;
        }
        if t.logit != f32::NEG_INFINITY {
            keys.push(total_order_key(t.logit));
        }
    }
    Some(sort_keys(keys))
}

/// `keys` in ascending order: an LSD radix sort (a comparison sort for a few hundred keys),
/// using `keys` itself as scratch (it is left twice as long); returns the sorted slice.
pub(crate) fn sort_keys(keys: &mut Vec<u32>) -> &[u32] {
    let m = keys.len();
    if m <= 512 {
        // A handful of values (after top_k, or on a sparse view): the radix sort's fixed cost
        // (four 256-entry histograms) would dominate.
        keys.sort_unstable();
        return keys;
    }
    // Four passes of 8 bits: 256 scatter streams per pass stay cache-friendly.
    crate::candidates::lsd_radix_sort(keys, |k, pass| ((k >> (8 * pass)) & 0xff) as usize)
}

/// Masks token `i` (HF's `masked_fill(mask, -inf)`).
#[inline]
pub fn remove(data: &mut [TokenData], i: usize) {
    data[i].logit = f32::NEG_INFINITY;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(values: &[f32]) -> Vec<TokenData> {
        values.iter().enumerate().map(|(i, &v)| TokenData { id: i as u32, logit: v, p: 0.0 }).collect()
    }

    #[test]
    fn fl32_rounds_the_double_difference() {
        // transformers.md §1: 1 - 0.95 = 0.050000000000000044 in double -> f32 0.0500000007
        // (bits 0x3D4CCCCD), not the f32 difference 0.0500000119.
        assert_eq!(fl32(1.0 - 0.95).to_bits(), 0x3D4C_CCCD);
        assert_ne!(fl32(1.0 - 0.95), 1.0f32 - 0.95f32);
    }

    #[test]
    fn cumsum_rounds_each_partial_sum_from_f64() {
        let mut c = Cumsum::default();
        let xs = [0.1f32, 0.2, 0.3, 1e-8, 0.4];
        let mut run = 0.0f64;
        for x in xs {
            run += x as f64;
            assert_eq!(c.push(x).to_bits(), (run as f32).to_bits());
        }
    }

    #[test]
    fn softmax_is_nan_for_an_all_masked_row_and_keeps_subnormals() {
        let mut d = pairs(&[f32::NEG_INFINITY; 3]);
        softmax(&mut d);
        assert!(d.iter().all(|t| t.p.is_nan()));
        // exp(-103) is a subnormal f32: not flushed to zero (transformers.md §1).
        let mut d = pairs(&[0.0, -103.0, -110.0]);
        softmax(&mut d);
        assert!(d[1].p > 0.0 && d[1].p < f32::MIN_POSITIVE);
        assert_eq!(d[2].p, 0.0);
    }

    #[test]
    fn small_sorts_are_stable_and_topk_picks_by_libstdcxx_order() {
        // n <= 16: insertion sort keeps index order among equals.
        let mut d = pairs(&[1.0; 8]);
        sort_ascending(&mut d);
        assert_eq!(d.iter().map(|t| t.id).collect::<Vec<_>>(), (0..8).collect::<Vec<_>>());
        // topk with k * 64 > n goes through nth_element: for equal values that is not index order.
        let mut d = pairs(&[0.0; 8]);
        topk(&mut d, 3);
        let mut expect = pairs(&[0.0; 8]);
        stdsort::nth_element(&mut expect, 2, desc);
        stdsort::sort(&mut expect[..2], desc);
        assert_eq!(&d[..3], &expect[..3]);
    }

    #[test]
    fn ensure_dense_scatters_a_reordered_array_back() {
        let mut c = Candidates::from_logits(&[1.0f32, 3.0, 2.0]).unwrap();
        crate::convention::llama_cpp::top_k(&mut c, 2);
        assert_eq!(c.len(), 2);
        ensure_dense(&mut c);
        let l: Vec<f32> = c.as_slice().iter().map(|t| t.logit).collect();
        assert_eq!(l, [f32::NEG_INFINITY, 3.0, 2.0]);
        assert!(!c.is_sorted());
    }

    #[test]
    fn the_kth_largest_filter_and_the_radix_sort_match_the_obvious_ones() {
        use crate::sampler::transformers::test_util::adversarial_row;
        use proptest::prelude::*;
        let ks = prop_oneof![1usize..4, 1usize..80, 1usize..700];
        tokensieve_testkit::proptest_support::check("hf_kth_and_radix", 384, (adversarial_row(), ks), |(row, k)| {
            let data = pairs(&row);
            let k = k.min(row.len());
            let mut buf = Vec::new();
            let obvious = kth_largest_by_nth_element(&data, k, &mut buf);
            if let Some(v) = kth_largest_filtered(&data, k, &mut buf) {
                // Equal as values; `<` against it can tell no difference (±0 included).
                prop_assert!(v == obvious || (v.is_nan() && obvious.is_nan()), "{v} vs {obvious}");
                prop_assert!(data.iter().all(|t| (t.logit < v) == (t.logit < obvious)));
            }
            let mut keys = Vec::new();
            let sorted: Vec<f32> =
                sorted_finite_logits(&data, &mut keys).unwrap().iter().map(|&k| from_sort_key(k)).collect();
            let mut expect: Vec<f32> = row.iter().copied().filter(|&v| v != f32::NEG_INFINITY).collect();
            expect.sort_by(|a, b| a.total_cmp(b));
            prop_assert_eq!(
                sorted.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                expect.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
            Ok(())
        });
    }

    #[test]
    fn softmax_exps_writes_the_bits_of_softmax() {
        use crate::sampler::transformers::test_util::adversarial_row;
        tokensieve_testkit::proptest_support::check("hf_softmax_exps", 256, adversarial_row(), |row| {
            let mut a = pairs(&row);
            let mut b = pairs(&row);
            let max = softmax(&mut a);
            let mut exps = Vec::new();
            let (max_b, sum) = softmax_exps(&mut b, &mut exps);
            proptest::prop_assert_eq!(max.to_bits(), max_b.to_bits());
            proptest::prop_assert!(a.iter().zip(&b).all(|(x, y)| x.p.to_bits() == y.p.to_bits()));
            if max.is_finite() {
                // The sum is the one the original per-entry loop forms.
                let mut s = 0.0f64;
                for t in &row {
                    s += ((t - max) as f64).exp();
                }
                proptest::prop_assert_eq!(sum.to_bits(), s.to_bits());
            }
            Ok(())
        });
    }
}
