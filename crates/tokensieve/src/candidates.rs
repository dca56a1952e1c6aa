//! The working set the samplers read and narrow.
//!
//! It mirrors llama.cpp's `llama_token_data_array` because the llama.cpp convention is defined
//! by it: a candidate's position in the array decides which token a random draw selects, a
//! `sorted` flag that later stages trust, and `p` fields that are stale unless the previous
//! stage recomputed them. The buffers are owned by the [`Chain`](crate::Chain) and reused, so
//! after the first token no vocabulary-sized allocation happens.

use crate::error::Result;
use crate::logits::Logits;

/// One candidate: token id, its current logit and the last probability a stage wrote.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
#[repr(C)]
pub struct TokenData {
    /// Token id (index in the vocabulary).
    pub id: u32,
    /// The logit as edited by the stages so far (`-inf` = masked but still present).
    pub logit: f32,
    /// Probability as written by the last stage that computed one; stale otherwise.
    pub p: f32,
}

/// `f32::total_cmp`'s order as the order of `u32`s: negative values get every bit but the
/// sign flipped (a larger magnitude, a smaller key), then every key its sign bit.
#[inline]
pub(crate) fn total_order_key(x: f32) -> u32 {
    let b = x.to_bits();
    b ^ ((((b as i32) >> 31) as u32) >> 1) ^ 0x8000_0000
}

/// Fills `keys` (cleared first) with one key per entry of `data`, whose ascending order is the
/// entries' by logit, largest first (`f32::total_cmp`'s order, but `-0.0` equal to `0.0`), ties
/// in their order in `data`. The low 32 bits of a key are its entry's index in `data`.
///
/// PERF: sorting these `u64`s (`sort_unstable` sorts small runs of integers without branches)
/// and reading the entries back by index takes about half the time of sorting the 12-byte
/// entries with a float comparator: 0.22 against 0.45 µs for the ~50 entries a `top_k(40)`
/// gathers.
pub(crate) fn rank_keys(data: &[TokenData], keys: &mut Vec<u64>) {
    keys.clear();
    // `x + 0.0` is `0.0` for `-0.0` and `x` otherwise.
    keys.extend(data.iter().enumerate().map(|(i, t)| (u64::from(!total_order_key(t.logit + 0.0)) << 32) | i as u64));
}

/// Sorts the keys of [`rank_keys`] (as it left them: their low 32 bits ascending), using
/// `keys` as scratch (it may be left twice as long); returns the sorted keys. Many of them
/// (thousands: a whole row) go through a stable LSD radix sort of the high 32 bits, which
/// leaves equal high halves in their low halves' order, so the result is the full sort's.
///
/// PERF: `sort_unstable` of the 128,256 keys of a whole row took about 5 ms; four 8-bit
/// passes take a fraction of that.
pub(crate) fn sort_rank_keys(keys: &mut Vec<u64>) -> &[u64] {
    let m = keys.len();
    if m <= 2048 {
        keys.sort_unstable();
        return keys;
    }
    debug_assert!(keys.windows(2).all(|w| w[0] as u32 <= w[1] as u32), "the low halves out of order");
    lsd_radix_sort(keys, |k, pass| ((k >> (32 + 8 * pass)) & 0xff) as usize)
}

/// A stable LSD radix sort of `keys` by four 8-bit digits, `digit(key, pass)` for pass 0
/// (least significant) to 3, using `keys` itself as scratch (it is left twice as long);
/// returns the sorted keys. A pass in which every key has the same digit is skipped.
pub(crate) fn lsd_radix_sort<K: Copy + Default>(keys: &mut Vec<K>, digit: impl Fn(K, usize) -> usize) -> &[K] {
    let m = keys.len();
    let mut counts = [[0u32; 256]; 4];
    for &k in keys.iter() {
        for (pass, count) in counts.iter_mut().enumerate() {
            count[digit(k, pass)] += 1;
        }
    }
    keys.resize(2 * m, K::default());
    let (mut src, mut dst) = keys.split_at_mut(m);
    for (pass, count) in counts.iter().enumerate() {
        if count.iter().any(|&c| c as usize == m) {
            continue; // every key has the same digit here: the pass would not move anything
        }
        let mut offsets = [0u32; 256];
        let mut at = 0u32;
        for (o, &c) in offsets.iter_mut().zip(count.iter()) {
            *o = at;
            at += c;
        }
        for &k in src.iter() {
            let d = digit(k, pass);
            dst[offsets[d] as usize] = k;
            offsets[d] += 1;
        }
        std::mem::swap(&mut src, &mut dst);
    }
    src
}

/// Non-negative scores (not NaN: their bits order them) with a mass each, summed by bucket of
/// their top 10 bits (half a binade), for the `typical` samplers: they rank only the scores up
/// to the bucket where the running mass reaches their cut, then, should the cut lie beyond,
/// all of them ([`ScoreBuckets::limits`]).
#[derive(Debug, Default)]
pub(crate) struct ScoreBuckets(Vec<f64>);

impl ScoreBuckets {
    const SHIFT: u32 = 22;
    const BUCKETS: usize = 1 << (32 - Self::SHIFT);

    /// Sums the masses of `scores` (`(bits, mass)`) by bucket, replacing the last ones.
    ///
    /// PERF: four histograms, the `i`-th score into the `i % 4`-th, so that neighbouring scores
    /// in one bucket (most of a row's tail) do not wait on each other's additions; one
    /// histogram cost the `typical` samplers about 10% at V = 128k.
    pub(crate) fn fill(&mut self, scores: impl Iterator<Item = (u32, f64)>) {
        self.0.clear();
        self.0.resize(4 * Self::BUCKETS, 0.0);
        for (i, (bits, mass)) in scores.enumerate() {
            self.0[(i % 4) * Self::BUCKETS + (bits >> Self::SHIFT) as usize] += mass;
        }
    }

    /// The bounds to rank the scores below, in turn: the end of the first bucket where the
    /// running mass reaches `target` (where one does), then `u32::MAX` (every score).
    pub(crate) fn limits(&self, target: f64) -> impl Iterator<Item = u32> {
        let h = |part: usize, k: usize| self.0[part * Self::BUCKETS + k];
        let mut reached = 0.0;
        let first = (0..Self::BUCKETS).position(|k| {
            reached += (h(0, k) + h(1, k)) + (h(2, k) + h(3, k));
            reached >= target
        });
        // A score's bucket is at most 510 (`+inf`): the end fits.
        first.map(|k| (k as u32 + 1) << Self::SHIFT).into_iter().chain(std::iter::once(u32::MAX))
    }
}

/// Sorts the keys `bits << 32 | index` of the `scores` (their bits, by index) below `limit`
/// ascending, by score then index ([`lsd_radix_sort`], `keys` as scratch); returns them.
pub(crate) fn rank_scores_below<'a>(scores: &[u32], limit: u32, keys: &'a mut Vec<u64>) -> &'a [u64] {
    // PERF: a branch per score (taken by the few ranked ones, usually) cost less than writing
    // every key without one (1 MB at V = 128k).
    keys.clear();
    keys.extend(scores.iter().enumerate().filter(|&(_, &x)| x < limit).map(|(i, &x)| u64::from(x) << 32 | i as u64));
    lsd_radix_sort(keys, |k, pass| ((k >> (32 + 8 * pass)) & 0xff) as usize)
}

/// The candidate array of one sampling step. See the module docs.
#[derive(Debug, Default)]
pub struct Candidates {
    pub(crate) data: Vec<TokenData>,
    pub(crate) selected: Option<usize>,
    pub(crate) sorted: bool,
    pub(crate) vocab_size: usize,
    /// How many leading entries were dropped in place (XTC advances llama.cpp's data pointer).
    pub(crate) dropped_front: usize,
    /// Scratch space for stages that sort into a side buffer (reused across steps).
    pub(crate) scratch: Vec<TokenData>,
    /// Scratch histogram and bucket index buffers for llama.cpp's bucket sort.
    pub(crate) buckets: Vec<u8>,
    /// Scratch f64 weights (`exp(z - max)`) of the transformers softmax, computed once per
    /// entry and reused for the sum, the probabilities and the draw (reused across steps).
    pub(crate) wide: Vec<f64>,
    /// Scratch radix-sort keys (two halves: keys and the ping-pong buffer), reused.
    pub(crate) keys: Vec<u32>,
    /// Scratch f32 lanes (llama.cpp `dist`: the logits and their weights), reused.
    pub(crate) lanes: Vec<f32>,
    /// A sparse view of a dense transformers-convention row: `data` holds, in ascending id
    /// order, every token whose logit may be finite; every other token of the `vocab_size`
    /// is `-inf`. Set only by the transformers row fast path when sampling; the transformers
    /// stages either work on it as it is (where the result is provably the dense one) or
    /// expand it ([`ensure_dense`](crate::convention::transformers::ensure_dense)).
    pub(crate) sparse: bool,
}

impl Clone for Candidates {
    /// Clones the candidates, not the scratch buffers (they are refilled on use).
    fn clone(&self) -> Self {
        Candidates {
            data: self.data.clone(),
            selected: self.selected,
            sorted: self.sorted,
            vocab_size: self.vocab_size,
            dropped_front: self.dropped_front,
            scratch: Vec::new(),
            buckets: Vec::new(),
            wide: Vec::new(),
            keys: Vec::new(),
            lanes: Vec::new(),
            sparse: self.sparse,
        }
    }
}

impl Candidates {
    /// An empty set; fill it with [`Candidates::fill`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Builds candidates from a row, validated (see [`Logits::validate`]).
    pub fn from_logits<'a>(row: impl Into<Logits<'a>>) -> Result<Self> {
        let mut c = Candidates::new();
        c.fill(row.into())?;
        Ok(c)
    }

    /// Refills from a row exactly as `llama_sampler_sample` does: entry `i` is
    /// `(i, row[i], 0.0)`, unsorted, nothing selected. Reuses the buffer. NaN or `+inf`
    /// logits and empty rows are errors (and leave the previous contents cleared).
    pub fn fill(&mut self, row: Logits<'_>) -> Result<()> {
        self.data.clear();
        self.selected = None;
        self.sorted = false;
        self.dropped_front = 0;
        self.vocab_size = 0;
        self.sparse = false;
        row.validate()?;
        self.data.reserve(row.len());
        row.for_each(|i, v| self.data.push(TokenData { id: i as u32, logit: v, p: 0.0 }));
        self.vocab_size = row.len();
        Ok(())
    }

    /// Empties the set for a new row of `vocab_size` tokens (unsorted, nothing selected,
    /// nothing dropped), keeping the buffer; the caller pushes the candidates.
    pub(crate) fn begin(&mut self, vocab_size: usize) {
        self.data.clear();
        self.selected = None;
        self.sorted = false;
        self.dropped_front = 0;
        self.vocab_size = vocab_size;
        self.sparse = false;
    }

    /// [`Candidates::fill`] from an f32 row the caller has already validated.
    pub(crate) fn fill_validated(&mut self, row: &[f32]) {
        self.begin(row.len());
        self.data.extend(row.iter().enumerate().map(|(i, &v)| TokenData { id: i as u32, logit: v, p: 0.0 }));
    }

    /// The candidates in array order.
    pub fn as_slice(&self) -> &[TokenData] {
        &self.data
    }

    /// Mutable access for custom stages. Changing logits may invalidate [`Candidates::is_sorted`];
    /// call [`Candidates::set_sorted`] accordingly.
    pub fn as_mut_slice(&mut self) -> &mut [TokenData] {
        &mut self.data
    }

    /// Number of candidates left.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// True when no candidate is left.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The vocabulary size of the row these candidates came from.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Whether the array is known to be sorted by descending logit. As in llama.cpp, stages
    /// trust this flag, and a stage that edits logits without clearing it leaves it stale.
    pub fn is_sorted(&self) -> bool {
        self.sorted
    }

    /// Sets the sorted flag.
    pub fn set_sorted(&mut self, sorted: bool) {
        self.sorted = sorted;
    }

    /// Index (into the array) of the selected candidate, if a selecting stage ran.
    pub fn selected_index(&self) -> Option<usize> {
        self.selected
    }

    /// Token id of the selected candidate, if a selecting stage ran.
    pub fn selected_token(&self) -> Option<u32> {
        self.selected.and_then(|i| self.data.get(i)).map(|t| t.id)
    }

    /// Marks candidate `index` as selected.
    pub fn set_selected(&mut self, index: Option<usize>) {
        debug_assert!(index.is_none_or(|i| i < self.data.len()));
        self.selected = index;
    }

    /// Keeps the first `n` candidates.
    pub fn truncate(&mut self, n: usize) {
        self.data.truncate(n);
    }

    /// Drops the first `n` candidates (llama.cpp's XTC advances its data pointer).
    pub fn drop_front(&mut self, n: usize) {
        let n = n.min(self.data.len());
        self.data.drain(..n);
        self.dropped_front += n;
    }

    /// How many leading entries were dropped with [`Candidates::drop_front`] this step.
    pub fn dropped_front(&self) -> usize {
        self.dropped_front
    }

    /// The processed logits in vocabulary order: `-inf` for every token not in the set.
    pub fn write_dense(&self, out: &mut [f32]) {
        out.fill(f32::NEG_INFINITY);
        for t in &self.data {
            if let Some(slot) = out.get_mut(t.id as usize) {
                *slot = t.logit;
            }
        }
    }

    /// Number of candidates whose logit is not `-inf`.
    pub fn count_finite(&self) -> usize {
        self.data.iter().filter(|t| t.logit > f32::NEG_INFINITY).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`sort_rank_keys`] against `sort_unstable` on the keys of rows short and long, with
    /// ties, both zeros, infinities and runs of equal values (a pass that moves nothing).
    #[test]
    fn sort_rank_keys_is_the_full_sort() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for (len, spread) in [(10usize, 100u64), (2048, 7), (2049, 1000), (5000, 3), (40_000, 1 << 30), (9000, 1)] {
            let data: Vec<TokenData> = (0..len)
                .map(|i| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    let logit = match state % 50 {
                        0 => f32::INFINITY,
                        1 => f32::NEG_INFINITY,
                        2 => -0.0,
                        3 => 0.0,
                        _ => ((state >> 20) % spread) as f32 * 0.37 - 3.0,
                    };
                    TokenData { id: i as u32, logit, p: 0.0 }
                })
                .collect();
            let mut want = Vec::new();
            rank_keys(&data, &mut want);
            want.sort_unstable();
            let mut keys = Vec::new();
            rank_keys(&data, &mut keys);
            assert_eq!(sort_rank_keys(&mut keys), &want[..], "len {len}");
        }
    }
}
