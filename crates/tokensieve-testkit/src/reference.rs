//! Naive f64 reference implementations ("oracles") of the llama.cpp convention's samplers.
//!
//! Each function restates one sampler's *semantics* from `shared/reference/llama-cpp.md` §2 on
//! a plain working set `Vec<(id, logit)>` ([`Cand`]), as plainly as possible: widen to f64,
//! sort the whole set, compute softmaxes and sums directly, no buckets, no heaps, no early
//! exits. They exist so that every fast path in `tokensieve` can be property-tested against
//! something obviously right (STYLE.md habit 5).
//!
//! # How to compare against them
//!
//! The oracles compute in f64; llama.cpp (and so tokensieve) computes in f32 with unstable
//! sorts. A test must therefore compare **sets and values within a tolerance**, never bits and
//! never the order of equal logits:
//!
//! * **Sets:** compare the ids of the surviving candidates whose logit is finite (see
//!   [`finite_ids`]). Which `-inf` candidates remain in the array, and in which order, depends
//!   on the sort's tie order and is not part of the comparison.
//! * **Values:** a surviving candidate's f32 logit must equal the oracle's f64 value within a
//!   tolerance scaled to the magnitude of the *operands* (not of the result, which may come
//!   from a cancellation).
//! * **Ties and thresholds:** where the result depends on the order of exactly tied
//!   candidates (a cut between two equal logits, between two equal `typical` scores) or on a
//!   value within rounding distance of a threshold (a cumulative probability next to `p`, a
//!   logit next to min-p's cut, a mirostat `k` next to an integer), f32 and f64 may
//!   legitimately disagree. The oracles detect these cases with the margins below and set
//!   [`Out::ambiguous`] / [`Pick::ambiguous`]; a test must then skip the set comparison (it
//!   may still check invariants such as "at least one candidate survives").
//!
//! # Tie rule
//!
//! Where an oracle sorts, it sorts by logit descending and breaks ties by **ascending token
//! id** (`-0.0 == 0.0`; inputs are never NaN). llama.cpp's libstdc++ sorts order ties
//! differently, which is exactly why ties are reported as ambiguous rather than compared.
//!
//! # Degenerate input
//!
//! A working set with no finite logit has no defined softmax (llama.cpp computes
//! `exp(-inf - -inf)` = NaN). The oracles then return NaN probabilities and mark their results
//! ambiguous; tests are expected to check that tokensieve returns an error or leaves the set
//! alone, not to compare values.

use std::collections::BTreeSet;

/// A candidate of the working set: `(token id, logit)`. `-inf` = masked but present.
pub type Cand = (u32, f64);

/// Absolute margin on probabilities and cumulative probabilities (f32 softmax sums over up
/// to a few thousand candidates stay well within it).
pub const PROB_MARGIN: f64 = 1e-4;

/// Relative margin on logit-space thresholds and scores: a value `x` is "at" a threshold
/// computed from operands of magnitude `s` when `|x - threshold| <= REL_MARGIN * (1 + s)`.
pub const REL_MARGIN: f64 = 1e-4;

/// Margin, relative to the total weight, within which a draw's target counts as landing on
/// the boundary between two candidates (f32 `expf` weights vs f64).
pub const DRAW_MARGIN: f64 = 1e-5;

/// A dynamic temperature below this is treated as "at zero" by [`temp_ext`]: f32 may round
/// the entropy to exactly 0 (masking everything but the maximum) where f64 divides by a
/// tiny positive temperature.
pub const TEMP_ZERO_MARGIN: f64 = 1e-3;

/// The result of a truncating or masking oracle.
#[derive(Clone, Debug, PartialEq)]
pub struct Out {
    /// The working set after the stage, in the order llama.cpp leaves it (sorted stages:
    /// descending with ties by id; min-p's fast path: input order; typical: score order).
    pub set: Vec<Cand>,
    /// True when ties or threshold-adjacent values make the surviving set (or its size)
    /// implementation-dependent: skip set comparisons then.
    pub ambiguous: bool,
}

impl Out {
    fn exact(set: Vec<Cand>) -> Out {
        Out { set, ambiguous: false }
    }

    /// Ids of the surviving candidates with a finite logit.
    pub fn finite_ids(&self) -> BTreeSet<u32> {
        finite_ids(&self.set)
    }

    /// The logit the oracle gives token `id`, if it is in the set.
    pub fn logit_of(&self, id: u32) -> Option<f64> {
        self.set.iter().find(|c| c.0 == id).map(|c| c.1)
    }
}

/// A selection made by an oracle for a given uniform draw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pick {
    /// Index into the working set (array order).
    pub index: usize,
    /// True when the draw's target lies within [`DRAW_MARGIN`] of a cumulative boundary, so
    /// rounding may move the selection to a neighbour.
    pub ambiguous: bool,
}

/// The working set `llama_sampler_sample` builds: `(i, row[i])` in vocabulary order.
pub fn from_row(row: &[f32]) -> Vec<Cand> {
    row.iter().enumerate().map(|(i, &l)| (i as u32, l as f64)).collect()
}

/// Ids of the candidates whose logit is finite.
pub fn finite_ids(set: &[Cand]) -> BTreeSet<u32> {
    set.iter().filter(|c| c.1.is_finite()).map(|c| c.0).collect()
}

/// Sorts by logit descending, ties by ascending id (the oracles' documented tie rule).
pub fn sort_desc(set: &mut [Cand]) {
    set.sort_by(|a, b| b.1.partial_cmp(&a.1).expect("oracle inputs are never NaN").then(a.0.cmp(&b.0)));
}

fn sorted(set: &[Cand]) -> Vec<Cand> {
    let mut s = set.to_vec();
    sort_desc(&mut s);
    s
}

fn max_logit(set: &[Cand]) -> f64 {
    set.iter().map(|c| c.1).fold(f64::NEG_INFINITY, f64::max)
}

fn has_finite(set: &[Cand]) -> bool {
    set.iter().any(|c| c.1.is_finite())
}

/// True when sorted positions `i` and `i + 1` hold equal finite logits, i.e. a cut between
/// them depends on the tie order.
fn tie_at(sorted: &[Cand], i: usize) -> bool {
    i + 1 < sorted.len() && sorted[i].1.is_finite() && sorted[i].1 == sorted[i + 1].1
}

/// Softmax of the set's logits, in set order: `exp(l - max) / Σ`. `-inf` gives 0. With no
/// finite logit every entry is NaN (llama.cpp's `exp(-inf - -inf)`).
pub fn softmax(set: &[Cand]) -> Vec<f64> {
    let max = max_logit(set);
    if max == f64::NEG_INFINITY {
        return vec![f64::NAN; set.len()];
    }
    let w: Vec<f64> = set.iter().map(|c| (c.1 - max).exp()).collect();
    let sum: f64 = w.iter().sum();
    w.into_iter().map(|x| x / sum).collect()
}

/// True when some probability of the set is zero or subnormal in f32 (a logit more than 87
/// below the maximum, or `-inf`): llama.cpp's f32 `logf(p)` is then `-inf` or imprecise
/// (typical's entropy turns NaN; mirostat's slope estimate breaks).
pub fn f32_underflows(set: &[Cand]) -> bool {
    let max = max_logit(set);
    set.iter().any(|c| c.1 - max < -87.0)
}

/// greedy: index of the **first** maximum in array order (strict `>`), `None` when every
/// logit is `-inf`.
pub fn greedy(set: &[Cand]) -> Option<usize> {
    if !has_finite(set) {
        return None;
    }
    let mut best = 0;
    for i in 1..set.len() {
        if set[i].1 > set[best].1 {
            best = i;
        }
    }
    Some(best)
}

/// dist's inverse-CDF selection for a uniform `u` in [0, 1): weights `exp(l - max)` in array
/// order, target `u · Σw`, the first index whose running sum reaches the target. `None` when
/// every logit is `-inf`. (llama.cpp does not sort here: the array order decides.)
pub fn dist_select(set: &[Cand], u: f64) -> Option<Pick> {
    if !has_finite(set) {
        return None;
    }
    let max = max_logit(set);
    let w: Vec<f64> = set.iter().map(|c| (c.1 - max).exp()).collect();
    let sum: f64 = w.iter().sum();
    let target = u * sum;
    let mut running = 0.0;
    let mut index = set.len() - 1;
    for (i, &wi) in w.iter().enumerate() {
        if running + wi >= target {
            index = i;
            break;
        }
        running += wi;
    }
    let before = running;
    let after = running + w[index];
    let margin = DRAW_MARGIN * sum;
    let ambiguous = (target - before).abs() <= margin || (after - target).abs() <= margin;
    Some(Pick { index, ambiguous })
}

/// libstdc++'s `std::discrete_distribution` (mirostat's draw) over probabilities `probs` for
/// a uniform `u`: cumulative sums normalised by the total, the last forced to 1, first index
/// with cumulative ≥ `u`. Fewer than two weights: index 0 and no draw is consumed.
pub fn discrete_select(probs: &[f64], u: f64) -> Pick {
    if probs.len() < 2 {
        return Pick { index: 0, ambiguous: false };
    }
    let sum: f64 = probs.iter().sum();
    let mut cum = Vec::with_capacity(probs.len());
    let mut run = 0.0;
    for p in probs {
        run += p / sum;
        cum.push(run);
    }
    *cum.last_mut().expect("len >= 2") = 1.0;
    let index = cum.iter().position(|&c| c >= u).unwrap_or(probs.len() - 1);
    let before = if index == 0 { 0.0 } else { cum[index - 1] };
    let ambiguous = (u - before).abs() <= DRAW_MARGIN || (cum[index] - u).abs() <= DRAW_MARGIN;
    Pick { index, ambiguous }
}

/// top-k: `k <= 0` leaves the set alone; otherwise the `min(k, len)` largest, sorted.
/// Ambiguous when the cut separates two equal finite logits.
pub fn top_k(set: &[Cand], k: i64) -> Out {
    if k <= 0 {
        return Out::exact(set.to_vec());
    }
    let s = sorted(set);
    let k = (k as usize).min(s.len());
    let ambiguous = k < s.len() && tie_at(&s, k - 1);
    Out { set: s[..k].to_vec(), ambiguous }
}

/// top-p: `p >= 1` leaves the set alone. Otherwise softmax over the current set, sorted, and
/// the shortest prefix whose cumulative probability is `>= p` **and** whose length is
/// `>= min_keep` (at least one candidate); everything if the sum never reaches `p`.
pub fn top_p(set: &[Cand], p: f64, min_keep: usize) -> Out {
    if p >= 1.0 {
        return Out::exact(set.to_vec());
    }
    let s = sorted(set);
    let probs = softmax(&s);
    let mut last = s.len();
    let mut cum = 0.0;
    let mut ambiguous = !has_finite(&s);
    for (i, &pi) in probs.iter().enumerate() {
        cum += pi;
        if (cum - p).abs() <= PROB_MARGIN {
            ambiguous = true;
        }
        if cum >= p && i + 1 >= min_keep {
            last = i + 1;
            break;
        }
    }
    if last < s.len() && tie_at(&s, last - 1) {
        ambiguous = true;
    }
    Out { set: s[..last].to_vec(), ambiguous }
}

/// min-p: `p <= 0` leaves the set alone. Keeps the candidates with `logit >= max + ln p`, in
/// input order, when there are at least `max(1, min_keep)` of them (llama.cpp's unsorted
/// path); otherwise the sorted prefix of length `max(1, min_keep, #above)` (its sorted path:
/// the first token is always kept). Ambiguous when a finite logit is within [`REL_MARGIN`] of
/// the threshold, or the sorted path cuts between ties.
///
/// `input_sorted` says whether the array arrives flagged sorted (then llama.cpp always takes
/// the sorted path, which keeps the same set but in sorted order).
pub fn min_p(set: &[Cand], p: f64, min_keep: usize, input_sorted: bool) -> Out {
    if p <= 0.0 || set.is_empty() {
        return Out::exact(set.to_vec());
    }
    let max = max_logit(set);
    let ln_p = p.ln();
    let threshold = max + ln_p;
    // ln(1) = 0 exactly in f32 too, so p = 1 has an exact threshold (the maximum itself).
    let tol = if ln_p == 0.0 { 0.0 } else { REL_MARGIN * (1.0 + max.abs() + ln_p.abs()) };
    let mut ambiguous =
        !has_finite(set) || (tol > 0.0 && set.iter().any(|c| c.1.is_finite() && (c.1 - threshold).abs() <= tol));
    let above: Vec<Cand> = set.iter().copied().filter(|c| c.1 >= threshold).collect();
    if !input_sorted && !above.is_empty() && above.len() >= min_keep {
        return Out { set: above, ambiguous };
    }
    let s = sorted(set);
    let n = above.len().max(min_keep).max(1).min(s.len());
    if n < s.len() && tie_at(&s, n - 1) {
        ambiguous = true;
    }
    Out { set: s[..n].to_vec(), ambiguous }
}

/// typical (locally typical sampling): `p >= 1` leaves the set alone. Softmax of the sorted
/// set, entropy `H = -Σ p ln p`, scores `|−ln p_i − H|`, candidates ordered by ascending
/// score (ties by sorted position), and the shortest prefix of that order whose cumulative
/// probability is `> p` (strict) with length `>= min_keep`. Output in score order.
///
/// Ambiguous when some probability underflows f32 (llama.cpp's entropy is then NaN), when a
/// cumulative sum is within [`PROB_MARGIN`] of `p`, or when the last kept candidate's score
/// is within [`REL_MARGIN`] of a neighbour's in score order (f32 may swap them, and the
/// swap moves the point where the cumulative sum crosses `p`).
pub fn typical(set: &[Cand], p: f64, min_keep: usize) -> Out {
    if p >= 1.0 {
        return Out::exact(set.to_vec());
    }
    let s = sorted(set);
    let probs = softmax(&s);
    let h: f64 = -probs.iter().filter(|&&q| q > 0.0).map(|&q| q * q.ln()).sum::<f64>();
    let scores: Vec<f64> = probs.iter().map(|&q| (-q.ln() - h).abs()).collect();
    let mut order: Vec<usize> = (0..s.len()).collect();
    order.sort_by(|&a, &b| scores[a].partial_cmp(&scores[b]).unwrap_or(std::cmp::Ordering::Equal).then(a.cmp(&b)));
    let mut ambiguous = f32_underflows(&s) || !has_finite(&s);
    let mut last = order.len();
    let mut cum = 0.0;
    for (i, &idx) in order.iter().enumerate() {
        cum += probs[idx];
        if (cum - p).abs() <= PROB_MARGIN {
            ambiguous = true;
        }
        if cum > p && i + 1 >= min_keep {
            last = i + 1;
            break;
        }
    }
    // f32 scores may order near-equal scores differently. Swapping two of them changes the
    // result only if the swap involves the candidate at the cut (it decides where the
    // cumulative sum crosses `p`), so look for a chain of near-equal scores through it.
    let near = |i: usize, j: usize| {
        let (a, b) = (scores[order[i]], scores[order[j]]);
        a == b || (a - b).abs() <= REL_MARGIN * (1.0 + a.abs())
    };
    let cut = last - 1;
    if (cut > 0 && near(cut - 1, cut)) || (cut + 1 < order.len() && near(cut, cut + 1)) {
        ambiguous = true;
    }
    Out { set: order[..last].iter().map(|&i| s[i]).collect(), ambiguous }
}

/// temperature: `t > 0` divides every logit by `t`; `t <= 0` keeps the **first** maximum in
/// array order and sets every other logit to `-inf` (the size is unchanged).
pub fn temperature(set: &[Cand], t: f64) -> Vec<Cand> {
    if t > 0.0 {
        return set.iter().map(|&(id, l)| (id, l / t)).collect();
    }
    let keep = greedy(set).unwrap_or(0);
    set.iter().enumerate().map(|(i, &(id, l))| (id, if i == keep { l } else { f64::NEG_INFINITY })).collect()
}

/// temp-ext (dynamic temperature). `delta <= 0`: plain [`temperature`]`(t)`. Otherwise, with
/// more than one candidate: sort, softmax, entropy over `p > 0` normalised by `ln(len)`,
/// `dyn_t = max(0, t − delta) + (t + delta − max(0, t − delta)) · (H / ln len)^exponent`,
/// then [`temperature`]`(dyn_t)` on the sorted set. Returns the result and the temperature
/// applied. Ambiguous when `|dyn_t| <` [`TEMP_ZERO_MARGIN`] (f32 may land on the other side
/// of zero), when the f32 entropy's rounding error moves `dyn_t` by more than 2e-4 of its
/// value (near-one-hot rows), or when the set has no finite logit.
pub fn temp_ext(set: &[Cand], t: f64, delta: f64, exponent: f64) -> (Out, f64) {
    if delta <= 0.0 {
        return (Out::exact(temperature(set, t)), t);
    }
    if set.len() <= 1 {
        return (Out::exact(set.to_vec()), 1.0);
    }
    let min_t = (t - delta).max(0.0);
    let max_t = t + delta;
    let max_entropy = (set.len() as f64).ln();
    let s = sorted(set);
    let probs = softmax(&s);
    let h: f64 = -probs.iter().filter(|&&q| q > 0.0).map(|&q| q * q.ln()).sum::<f64>();
    let dyn_t_at = |h: f64| min_t + (max_t - min_t) * (h.max(0.0) / max_entropy).powf(exponent);
    let dyn_t = dyn_t_at(h);
    // llama.cpp's f32 entropy carries an absolute error of a few 1e-7 (a p near 1 has an
    // f32 ulp of 6e-8, and so does its log) plus summation error; near-one-hot rows have
    // an entropy of that order, so the dynamic temperature is then only known roughly.
    let h_err = 3e-7 * (1.0 + h) + 1e-7 * s.len() as f64 * h;
    let spread = (dyn_t_at(h + h_err) - dyn_t_at(h - h_err)).abs();
    let ambiguous = dyn_t.abs() < TEMP_ZERO_MARGIN || spread > 2e-4 * dyn_t.abs() || !has_finite(&s);
    (Out { set: temperature(&s, dyn_t), ambiguous }, dyn_t)
}

/// top-n-sigma: `n <= 0` or fewer than two candidates leaves the set alone. Over the finite
/// logits: max, mean and population standard deviation σ; every logit `< max − n·σ` becomes
/// `-inf` (nothing is removed). Ambiguous when a finite logit is within [`REL_MARGIN`] of
/// the threshold (relative to the magnitudes involved).
pub fn top_n_sigma(set: &[Cand], n: f64) -> Out {
    if n <= 0.0 || set.len() <= 1 {
        return Out::exact(set.to_vec());
    }
    let finite: Vec<f64> = set.iter().map(|c| c.1).filter(|l| l.is_finite()).collect();
    if finite.is_empty() {
        return Out { set: set.to_vec(), ambiguous: true };
    }
    let count = finite.len() as f64;
    let max = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mean = finite.iter().sum::<f64>() / count;
    let sd = (finite.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / count).sqrt();
    let threshold = max - n * sd;
    let scale = finite.iter().map(|l| l.abs()).fold(0.0, f64::max) + n * sd;
    let tol = REL_MARGIN * (1.0 + scale);
    let ambiguous = finite.iter().any(|l| (l - threshold).abs() <= tol);
    let out = set.iter().map(|&(id, l)| (id, if l < threshold { f64::NEG_INFINITY } else { l })).collect();
    Out { set: out, ambiguous }
}

/// XTC ("exclude top choices") given its uniform `draw` (llama.cpp draws one f32 from XTC's
/// own generator, only when the stage is enabled and at least two candidates are present).
/// No-op when `probability <= 0`, `threshold > 0.5`, fewer than two candidates, or
/// `draw > probability`. Otherwise: sort, softmax, let `last` be the last index of the
/// leading run with `p >= threshold`; if `last > 0` and `len − last >= min_keep`, drop the
/// first `last` candidates (keeping the least likely of them). No renormalisation.
pub fn xtc(set: &[Cand], probability: f64, threshold: f64, min_keep: usize, draw: f64) -> Out {
    if set.len() < 2 || probability <= 0.0 || threshold > 0.5 || draw > probability {
        return Out::exact(set.to_vec());
    }
    let s = sorted(set);
    let probs = softmax(&s);
    let mut last = 0;
    for (i, &q) in probs.iter().enumerate() {
        if q >= threshold {
            last = i;
        } else {
            break;
        }
    }
    let mut ambiguous = !has_finite(&s) || probs.iter().any(|&q| (q - threshold).abs() <= PROB_MARGIN);
    if last > 0 && s.len() - last >= min_keep {
        if tie_at(&s, last - 1) {
            ambiguous = true;
        }
        return Out { set: s[last..].to_vec(), ambiguous };
    }
    Out { set: s, ambiguous }
}

/// Repetition penalties given the accepted history (oldest first). `last_n <= 0` or
/// `(repeat, freq, present) == (1, 0, 0)` leaves the set alone. Otherwise, with `c` the
/// count of a token among the last `last_n` history entries, every candidate with `c > 0`
/// gets `l · repeat` if `l <= 0` else `l / repeat`, then `− (c · freq + present)`.
pub fn penalties(set: &[Cand], history: &[u32], last_n: i64, repeat: f64, freq: f64, present: f64) -> Vec<Cand> {
    if last_n <= 0 || (repeat == 1.0 && freq == 0.0 && present == 0.0) {
        return set.to_vec();
    }
    let window = &history[history.len().saturating_sub(last_n as usize)..];
    set.iter()
        .map(|&(id, l)| {
            let c = window.iter().filter(|&&t| t == id).count() as f64;
            if c == 0.0 {
                return (id, l);
            }
            let l = if l <= 0.0 { l * repeat } else { l / repeat };
            (id, l - (c * freq + present))
        })
        .collect()
}

/// Logit bias: every `(id, bias)` entry adds `bias` to the candidate with that id, in list
/// order (duplicates add up; ids not in the set — negative, `>= V`, already removed — are
/// ignored; `-inf` bans).
pub fn logit_bias(set: &[Cand], biases: &[(i64, f64)]) -> Vec<Cand> {
    let mut out = set.to_vec();
    for &(id, b) in biases {
        for c in out.iter_mut() {
            if c.0 as i64 == id {
                c.1 += b;
            }
        }
    }
    out
}

/// Mirostat (v1)'s `k` (before the integer conversion) for the sorted softmax `probs`:
/// `t_i = ln((i+2)/(i+1))`, `b_i = ln(p_i / p_{i+1})` over `i < min(m − 1, len − 1)`,
/// `s = Σ t_i b_i / Σ t_i²`, `ε = s − 1`, `k = (ε · 2^mu / (1 − n_vocab^(−ε)))^(1/s)`.
/// NaN when the sums are empty (one candidate, `m <= 1`).
pub fn mirostat_k(probs: &[f64], n_vocab: usize, mu: f64, m: usize) -> f64 {
    mirostat_k_with(probs, n_vocab, mu, m, 0.0)
}

fn mirostat_k_with(probs: &[f64], n_vocab: usize, mu: f64, m: usize, ds: f64) -> f64 {
    let n = m.saturating_sub(1).min(probs.len().saturating_sub(1));
    let mut sum_tb = 0.0;
    let mut sum_tt = 0.0;
    for i in 0..n {
        let t = ((i + 2) as f64 / (i + 1) as f64).ln();
        let b = (probs[i] / probs[i + 1]).ln();
        sum_tb += t * b;
        sum_tt += t * t;
    }
    let s = sum_tb / sum_tt + ds;
    let eps = s - 1.0;
    ((eps * 2f64.powf(mu)) / (1.0 - (n_vocab as f64).powf(-eps))).powf(1.0 / s)
}

/// How many candidates `top_k(max(int(k), 1))` keeps out of `len`; `None` when `int(k)` is
/// undefined behaviour in C++ (k NaN, infinite or beyond i32).
fn mirostat_keep(k: f64, len: usize) -> Option<usize> {
    if !k.is_finite() || k >= 2147483648.0 || k <= -2147483649.0 {
        return None;
    }
    Some((k.trunc() as i64).max(1).min(len as i64) as usize)
}

/// Mirostat (v1)'s truncation at state `mu`: sort, softmax, [`mirostat_k`], keep the top
/// `max(int(k), 1)`. Ambiguous when `int(k)` is undefined (llama.cpp on x86-64 then keeps
/// one), when some probability among the first `m` underflows f32, when perturbing the slope
/// `s` or `mu` by 1e-4 changes the kept count, or when the cut separates equal logits. The
/// draw that follows is [`discrete_select`] over the [`softmax`] of the kept set.
pub fn mirostat(set: &[Cand], n_vocab: usize, mu: f64, m: usize) -> Out {
    let s = sorted(set);
    let probs = softmax(&s);
    let mut ambiguous = !has_finite(&s) || f32_underflows(&s[..m.min(s.len())]);
    let mut keep = None;
    for ds in [0.0, -1e-4, 1e-4] {
        for dmu in [0.0, -1e-4, 1e-4] {
            let k = mirostat_k_with(&probs, n_vocab, mu + dmu, m, ds);
            match (mirostat_keep(k, s.len()), keep) {
                (None, _) => ambiguous = true,
                (Some(n), None) => keep = Some(n),
                (Some(n), Some(first)) if n != first => ambiguous = true,
                _ => {}
            }
        }
    }
    let n = mirostat_keep(mirostat_k(&probs, n_vocab, mu, m), s.len()).unwrap_or(1);
    if n < s.len() && tie_at(&s, n - 1) {
        ambiguous = true;
    }
    Out { set: s[..n].to_vec(), ambiguous }
}

/// Mirostat v2's truncation at state `mu`: sort, softmax, keep the prefix before the first
/// candidate whose surprise `−log2 p` exceeds `mu` (at least one). Ambiguous when a surprise
/// is within [`REL_MARGIN`] of `mu`, or when the forced single survivor is one of tied maxima. The draw that follows is [`discrete_select`] over the
/// [`softmax`] of the kept set.
pub fn mirostat_v2(set: &[Cand], mu: f64) -> Out {
    let s = sorted(set);
    let probs = softmax(&s);
    let surprise: Vec<f64> = probs.iter().map(|q| -q.log2()).collect();
    let n = surprise.iter().position(|&x| x > mu).unwrap_or(s.len()).max(1);
    let tol = REL_MARGIN * (1.0 + mu.abs());
    // Tied candidates share a surprise, so only the forced "keep one" cut can split ties.
    let ambiguous = !has_finite(&s) || surprise.iter().any(|x| (x - mu).abs() <= tol) || tie_at(&s, n - 1);
    Out { set: s[..n].to_vec(), ambiguous }
}

/// Both mirostats' state update after selecting a candidate of probability `p_selected`
/// (normalised over the kept set): `mu − eta · (−log2 p − tau)`.
pub fn mirostat_mu_update(mu: f64, tau: f64, eta: f64, p_selected: f64) -> f64 {
    mu - eta * (-p_selected.log2() - tau)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ln_row(p: &[f64]) -> Vec<f32> {
        p.iter().map(|x| x.ln() as f32).collect()
    }

    fn ids(out: &Out) -> Vec<u32> {
        out.set.iter().map(|c| c.0).collect()
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        assert_eq!(greedy(&from_row(&[1.0, 3.0, 3.0, f32::NEG_INFINITY])), Some(1));
        assert_eq!(greedy(&from_row(&[f32::NEG_INFINITY; 2])), None);
    }

    #[test]
    fn top_p_matches_llama_cpp_test_vectors() {
        let set = from_row(&ln_row(&[0.1, 0.2, 0.3, 0.4]));
        assert_eq!(ids(&top_p(&set, 0.7, 1)), [3, 2]);
        assert_eq!(ids(&top_p(&set, 0.8, 1)), [3, 2, 1]);
        assert_eq!(ids(&top_p(&set, 0.0, 1)), [3]);
        assert_eq!(ids(&top_p(&set, 0.0, 3)), [3, 2, 1]);
        assert_eq!(top_p(&set, 1.0, 1).set, set);
    }

    #[test]
    fn typical_matches_llama_cpp_test_vectors() {
        let set = from_row(&ln_row(&[0.97, 0.01, 0.01, 0.01]));
        assert_eq!(ids(&typical(&set, 0.5, 1)), [0]);
        let set = from_row(&ln_row(&[0.4, 0.2, 0.2, 0.2]));
        let out = typical(&set, 0.5, 1);
        assert_eq!(out.finite_ids(), BTreeSet::from([1, 2, 3]));
    }

    #[test]
    fn min_p_semantics() {
        let set = from_row(&ln_row(&[0.1, 0.2, 0.3, 0.4]));
        assert_eq!(ids(&min_p(&set, 0.45, 1, false)), [1, 2, 3]); // input order kept
        assert_eq!(ids(&min_p(&set, 1.05, 1, false)), [3]);
        assert_eq!(ids(&min_p(&set, 1.05, 3, false)), [3, 2, 1]);
        let tied = from_row(&[2.0, 1.0, 2.0]);
        assert_eq!(ids(&min_p(&tied, 1.0, 1, false)), [0, 2]);
    }

    #[test]
    fn xtc_matches_llama_cpp_test_vectors() {
        let set = from_row(&ln_row(&[0.4, 0.3, 0.2, 0.1]));
        assert_eq!(ids(&xtc(&set, 1.0, 0.09, 1, 0.5)), [3]);
        assert_eq!(ids(&xtc(&set, 1.0, 0.19, 1, 0.5)), [2, 3]);
        assert_eq!(ids(&xtc(&set, 1.0, 0.29, 1, 0.5)), [1, 2, 3]);
        assert_eq!(ids(&xtc(&set, 1.0, 0.39, 1, 0.5)), [0, 1, 2, 3]);
        assert_eq!(xtc(&set, 0.5, 0.09, 1, 0.6).set, set); // draw above probability
    }

    #[test]
    fn top_n_sigma_matches_llama_cpp_test_vector() {
        let set = from_row(&ln_row(&[0.1, 0.2, 0.3, 0.4]));
        let out = top_n_sigma(&set, 1.0);
        assert_eq!(out.finite_ids(), BTreeSet::from([2, 3]));
        let p = softmax(&out.set);
        assert!((p[3] - 0.4 / 0.7).abs() < 1e-6);
    }

    #[test]
    fn penalties_match_llama_cpp_test_vectors() {
        let set = from_row(&ln_row(&[0.2; 5]));
        let p = softmax(&penalties(&set, &[0], 64, 50.0, 0.0, 0.0));
        assert!(p[0] < 1e-6 && (p[1] - 0.25).abs() < 1e-3);
        let p = softmax(&penalties(&set, &[0, 1, 2, 0, 0], 64, 1.0, 5.0, 5.0));
        assert!(p[0] < 1e-6 && (p[1] - 2.3e-5).abs() < 1e-6 && (p[3] - 0.49998).abs() < 1e-5);
        // Only the window counts.
        assert_eq!(penalties(&set, &[0, 1], 1, 2.0, 0.0, 0.0)[0], set[0]);
    }

    #[test]
    fn temperature_at_or_below_zero_keeps_the_first_maximum() {
        let out = temperature(&from_row(&[1.0, 5.0, 5.0]), 0.0);
        assert_eq!(out, vec![(0, f64::NEG_INFINITY), (1, 5.0), (2, f64::NEG_INFINITY)]);
    }

    #[test]
    fn dist_and_discrete_selection() {
        let set = from_row(&ln_row(&[0.25, 0.25, 0.5]));
        assert_eq!(dist_select(&set, 0.1).unwrap().index, 0);
        assert_eq!(dist_select(&set, 0.3).unwrap().index, 1);
        assert_eq!(dist_select(&set, 0.9).unwrap().index, 2);
        assert!(dist_select(&set, 0.25).unwrap().ambiguous);
        assert_eq!(discrete_select(&[0.25, 0.25, 0.5], 0.6).index, 2);
        assert_eq!(discrete_select(&[1.0], 0.99), Pick { index: 0, ambiguous: false });
    }

    #[test]
    fn mirostat_k_on_a_zipf_row_is_finite_and_truncates() {
        let row: Vec<f32> = (1..=50).map(|r| -1.2 * (r as f32).ln()).collect();
        let set = from_row(&row);
        let out = mirostat(&set, 50, 6.0, 100);
        assert!(!out.ambiguous);
        assert!(out.set.len() > 1 && out.set.len() < 50, "{}", out.set.len());
        let v2 = mirostat_v2(&set, 4.0);
        let p = softmax(&sorted(&set));
        assert!(v2.set.len() == p.iter().filter(|q| -q.log2() <= 4.0).count());
        assert_eq!(mirostat_mu_update(10.0, 5.0, 0.1, 0.25), 10.0 - 0.1 * (2.0 - 5.0));
    }

    #[test]
    fn ties_at_a_cut_are_reported() {
        let set = from_row(&[1.0, 2.0, 2.0, 0.0]);
        assert!(top_k(&set, 1).ambiguous);
        assert!(!top_k(&set, 2).ambiguous);
    }
}
