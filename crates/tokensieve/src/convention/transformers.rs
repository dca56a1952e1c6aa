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

use crate::candidates::{Candidates, TokenData};
use crate::stdsort;

/// A Python float meeting an f32 tensor: rounded to the nearest f32.
#[inline]
pub fn fl32(x: f64) -> f32 {
    x as f32
}

/// Puts the candidates back in vocabulary order with one entry per token (`data[i].id == i`),
/// every token missing from the array as `-inf`. A no-op (one scan) when they already are,
/// which is always the case in a chain built under the transformers convention. Clears the
/// `sorted` flag: HF processors never sort the row itself.
pub fn ensure_dense(c: &mut Candidates) {
    let v = c.vocab_size;
    let dense = c.data.len() == v && c.data.iter().enumerate().all(|(i, t)| t.id as usize == i);
    if !dense {
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
}

/// `max` over the `logit` fields, as torch's `amax` for rows without NaN (`-inf` for an empty
/// or all-`-inf` row).
pub fn max_logit(data: &[TokenData]) -> f32 {
    data.iter().fold(f32::NEG_INFINITY, |m, t| if t.logit > m { t.logit } else { m })
}

/// Softmax of the `logit` fields into the `p` fields (see the module docs): `max` in f32,
/// `exp(z - max)` and the sum in f64, each `p` rounded once. A row whose maximum is `-inf`
/// (or `+inf`) gives NaN, as torch does. Returns the maximum.
pub fn softmax(data: &mut [TokenData]) -> f32 {
    let max = max_logit(data);
    if !max.is_finite() {
        // torch: exp(-inf - -inf) = exp(NaN); a +inf logit makes inf - inf = NaN as well.
        for t in data.iter_mut() {
            t.p = f32::NAN;
        }
        return max;
    }
    let mut sum = 0.0f64;
    for t in data.iter() {
        sum += ((t.logit - max) as f64).exp();
    }
    for t in data.iter_mut() {
        t.p = (((t.logit - max) as f64).exp() / sum) as f32;
    }
    max
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
    fill_pairs(&mut buf, &c.data, |t| t.logit);
    stdsort::nth_element(&mut buf, k - 1, desc);
    let value = buf[k - 1].logit;
    c.scratch = buf;
    value
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
}
