//! The transformers convention's row fast path, for sampling (only the token is observed).
//!
//! HF processors rewrite the whole `(batch, vocab)` score tensor at every step, and the
//! array path reproduces that on a dense candidate array: at V = 128k a chain such as
//! `temperature;top_k;top_p;min_p;dist` costs a few milliseconds, nearly all of it spent on
//! entries that are `-inf` after `top_k`. Here the leading stages run on the row in place
//! and leave a **sparse view** ([`Candidates::sparse`]): in ascending id order, every token
//! whose processed logit may be finite, with that logit. The stages after it treat the view
//! as the dense row (see each stage's `apply`); where only the dense row can decide (ties
//! that torch's sort order breaks), they expand it first.
//!
//! What runs in place:
//! * **Elementwise stages** first: `repetition_penalty` (a sparse edit of the seen tokens)
//!   and `temperature` (`z / fl32(t)`, monotone: `a <= b` implies `a / t <= b / t`). A token
//!   no penalty touches has processed logit `f(z)`, `f` the temperatures in order. When every
//!   penalty comes before every temperature (generate()'s order), the penalised raw logits
//!   are an overlay on the row, and every token's processed logit is `f` of row + overlay.
//!   A single such penalty of at least 1 only lowers logits: then no overlay is built at all,
//!   and each entry gathered from the row is penalised if the history holds it (a bitset
//!   test), so the cost does not grow with the history (transformers penalises the prompt).
//! * Then **`top_k(k)`**: the k-th largest processed logit `tau` is the k-th largest over
//!   the `k` largest untouched raw logits (their images under `f` are the `k` largest
//!   untouched processed logits, `f` being monotone) and the edited tokens. The survivors
//!   are the tokens with processed logit `>= tau`: gathered from the row above a raw bound
//!   below which `f` cannot reach `tau` ([`raw_floor`]), then tested exactly.
//! * Or **`greedy`**: `top_k(1)`'s survivors are the maxima; the lowest id wins.
//! * Or **`dist`** after at most one temperature: the draw is located with approximate
//!   per-block sums of the weights and certified against their error bound
//!   ([`locate_draw`]), as llama.cpp's `dist` fast path does; uncertain draws (the target
//!   within rounding of an interval end) take the array path with the same draw.
//! * Or **`min_p(p)`**: a token survives when `fl32(w / S) >= fl32(p * fl32(1 / S))`, `w` its
//!   weight `exp(fl32(z - max))` and `S` the sum of all weights. Both sides carry `1 / S`, so
//!   up to a relative error below `2^-21` the test is `w >= p`, i.e. `fl32(z - max) >= ln p`,
//!   decided without `S` unless the difference is within `2^-19` of `ln p` (then the array
//!   path runs). When `dist` follows and every token lies above that band (a nearly flat
//!   row), `min_p` keeps them all and `dist` draws from the row ([`min_p_keeps_all`]).
//! * Or **`top_p(p)`** after at most one temperature: only a gathered top set is sorted; bounds
//!   on `S` bound the cumsum at each of its positions, and the cut is taken where they agree
//!   ([`top_p`]). The set grows fourfold while the cut lies below it, or, on a hot row whose
//!   nucleus holds thousands of tokens, to a size estimated from a sample of the row, up to an
//!   eighth of the row ([`largest_top_set`]).
//! * Or **`top_p(p);dist`**: the same bounds, coarser; where they leave the cut among a few
//!   positions, the draw is certain if `dist` picks the same token over the survivors of
//!   each ([`top_p_dist`]). Where most of the row survives (a nearly flat row), only the
//!   tokens below the cut are ranked instead ([`bottom`](super::bottom)).
//! * Or **`epsilon(e)`** after at most one temperature: a token goes when `fl32(w / S) < e`
//!   (and it is below the `min_tokens_to_keep`-th logit); `S >= 1`, so below `w < e` every
//!   token goes, and the few above are decided by bounds on `S` ([`cut_below`]).
//!
//! After `top_k` or `min_p`, a tail of `top_p`/`min_p` stages and `dist` runs fused over the
//! sparse view, each token's weight computed once (`tail`).
//!
//! Anything else (another first stage, a stage after them this module does not know to
//! be sparse-safe, non-finite processed logits, fewer finite logits than `k`) takes the
//! array path; the result is the same either way, which the tests below check against it.

use crate::arch::{self, BLOCK};
use crate::candidates::{sort_rank_keys, total_order_key, Candidates, TokenData};
use crate::convention::llama_cpp::dense::{
    crossing_block, f32_at_least, f32_at_most, gather_at_least, gather_lowered, gather_top, gather_top_lowered, total,
    undivided_floor, NearSums, Path, Prepared, Scratch, DRAW_FAR_MASSES,
};
use crate::convention::transformers::bottom::{self, TopPDraw};
use crate::convention::transformers::{from_sort_key, weight, weights_into};
use crate::error::Result;
use crate::sampler::transformers::dist::Dist;
use crate::sampler::transformers::repetition_penalty::RepetitionPenalty;
use crate::sampler::{Sampler, Stage};

/// Whether `stage` can run on a sparse view and give the dense row's result (or expands it).
fn sparse_safe(stage: &Stage) -> bool {
    stage.is_inert()
        || matches!(
            stage,
            Stage::HfTemperature(_)
                | Stage::HfTopK(_)
                | Stage::HfTopP(_)
                | Stage::HfMinP(_)
                | Stage::HfDist(_)
                | Stage::HfGreedy(_)
                | Stage::HfTypical(_)
                | Stage::HfEpsilon(_)
                | Stage::HfEta(_)
        )
}

/// The processed logits of tokens no penalty touches, in place: the temperatures of `prefix`
/// in order. Stage by stage over all of them (the same operations on each token in the same
/// order), so the divisions are independent of each other rather than a chain per token
/// behind a match on every stage.
fn untouched(prefix: &[Stage], tokens: &mut [TokenData]) {
    for stage in prefix {
        if let Stage::HfTemperature(t) = stage {
            if !stage.is_inert() {
                tokens.iter_mut().for_each(|x| x.logit = t.scale(x.logit));
            }
        }
    }
}

/// Fills `edited` with the processed logits of the tokens of `overlay` (ascending ids, each
/// `< r.len()`), whatever touches them: `prefix` in order. Stage by stage over all of them,
/// which applies the same operations to each token in the same order as going token by token;
/// a penalty's membership test walks its sorted `seen` list beside the ascending ids (PERF:
/// no binary search per token and penalty: the bench's 64-token history made those a tenth of
/// a transformers chain at V = 32k).
fn process_edited(prefix: &[Stage], r: &[f32], overlay: &[(u32, f32)], edited: &mut Vec<TokenData>) {
    edited.clear();
    edited.extend(overlay.iter().map(|&(id, _)| TokenData { id, logit: r[id as usize], p: 0.0 }));
    for stage in prefix {
        match stage {
            _ if stage.is_inert() => {}
            Stage::HfTemperature(t) => edited.iter_mut().for_each(|e| e.logit = t.scale(e.logit)),
            Stage::HfRepetitionPenalty(p) => {
                let mut seen = p.seen().iter().peekable();
                for e in edited.iter_mut() {
                    while seen.next_if(|&&id| id < e.id).is_some() {}
                    if seen.peek() == Some(&&e.id) {
                        e.logit = p.penalise(e.logit);
                    }
                }
            }
            _ => {}
        }
    }
}

/// The penalties' edits of `prefix` into `s.overlay` and `s.edited`; `false` when one gives
/// NaN or `+inf` (the array path decides then).
///
/// In general the edited tokens are hidden from the row scans (`-inf` in the overlay) and
/// their processed logits computed exactly into `s.edited`. But penalties that all come
/// before every temperature (generate()'s order) edit raw logits, which the temperatures then
/// scale like any other: the edited values go into the overlay instead, `s.edited` stays
/// empty, and row + overlay is one raw row for everything after (`untouched` skips
/// penalties). PERF: a long generation has penalised the row's top tokens; hidden, each one
/// made `gather_top` read one more block and the k-th selection run twice (the bench's
/// `repetition_penalty` chain at V = 32k: 3.6 µs before, 2.7 µs after).
fn edits(prefix: &[Stage], r: &[f32], s: &mut Scratch) -> bool {
    let v = r.len();
    let is = |st: &Stage, temperature: bool| {
        !st.is_inert()
            && matches!((st, temperature), (Stage::HfTemperature(_), true) | (Stage::HfRepetitionPenalty(_), false))
    };
    let split = prefix.iter().position(|st| is(st, true)).unwrap_or(prefix.len());
    let penalties_first = !prefix[split..].iter().any(|st| is(st, false));
    let mut penalties = prefix.iter().filter_map(|st| match st {
        Stage::HfRepetitionPenalty(p) if !st.is_inert() => Some(p),
        _ => None,
    });
    s.overlay.clear();
    s.edited.clear();
    match (penalties.next(), penalties.next()) {
        (None, _) => return true,
        (Some(p), None) if penalties_first => {
            // One penalty, the common case: its sorted, distinct list gives the overlay's ids.
            // The ids in range, as a slice: extended without a capacity check per id.
            let seen = p.seen();
            let seen = &seen[..seen.partition_point(|&id| (id as usize) < v)];
            s.overlay.extend(seen.iter().map(|&id| (id, p.penalise(r[id as usize]))));
            return !s.overlay.iter().any(|e| e.1.is_nan() || e.1 == f32::INFINITY);
        }
        _ => {}
    }
    for stage in prefix {
        if let Stage::HfRepetitionPenalty(p) = stage {
            if !stage.is_inert() {
                let seen = p.seen();
                let seen = &seen[..seen.partition_point(|&id| (id as usize) < v)];
                s.overlay.extend(seen.iter().map(|&id| (id, f32::NEG_INFINITY)));
            }
        }
    }
    // Each list is sorted and distinct already: one penalty costs a linear check here.
    s.overlay.sort_unstable_by_key(|e| e.0);
    s.overlay.dedup_by_key(|e| e.0);
    process_edited(if penalties_first { &prefix[..split] } else { prefix }, r, &s.overlay, &mut s.edited);
    if s.edited.iter().any(|t| t.logit.is_nan() || t.logit == f32::INFINITY) {
        return false;
    }
    if penalties_first {
        for (o, e) in s.overlay.iter_mut().zip(&s.edited) {
            o.1 = e.logit;
        }
        s.edited.clear();
    }
    true
}

/// The one penalty of `prefix` when it lowers every logit it edits and comes before every
/// temperature (generate()'s order, a penalty of at least 1): row + its edits then holds no
/// entry above the row's, and the row path reads the edits off the gathered entries
/// ([`gather_top_lowered`]) instead of building an overlay of the whole history.
fn lowering_penalty(prefix: &[Stage]) -> Option<&RepetitionPenalty> {
    let mut found = None;
    let mut scaled = false;
    for stage in prefix.iter().filter(|st| !st.is_inert()) {
        match stage {
            Stage::HfRepetitionPenalty(p) if found.is_none() && !scaled && p.lowers() => found = Some(p),
            Stage::HfTemperature(_) => scaled = true,
            _ => return None,
        }
    }
    found
}

/// Whether `stage` masks ids (`-inf`) by its state alone: `suppress_tokens`,
/// `begin_suppress_tokens`, `min_length`, `min_new_tokens`, `no_repeat_ngram`.
fn masks(stage: &Stage) -> bool {
    matches!(
        stage,
        Stage::HfSuppressTokens(_)
            | Stage::HfBeginSuppressTokens(_)
            | Stage::HfMinLength(_)
            | Stage::HfMinNewTokens(_)
            | Stage::HfNoRepeatNGram(_)
    )
}

/// [`edits_to_write`] for a chain from its first stage: `Some(after)` when [`prepare`] would
/// write its leading edits into a copy of the row, so that the caller need not summarise the
/// row itself first ([`prepare_patched`] summarises the copy).
pub(crate) fn patch_from_start(stages: &[Stage]) -> Option<usize> {
    let end = stages
        .iter()
        .position(|st| !(st.is_inert() || matches!(st, Stage::HfTemperature(_) | Stage::HfRepetitionPenalty(_))))
        .unwrap_or(stages.len());
    edits_to_write(stages, 0, end)
}

/// `Some(after)` when the chain's stages from `first` (inert ones aside) start with edits that
/// [`prepare_patched`] writes into a copy of the row, the stages from `after` then running on
/// it: masking stages ([`masks`]) and at most one `repetition_penalty`, in any order (a mask
/// and a penalty commute: `-inf` penalised is `-inf`). Masks always (no fast path reads them
/// otherwise); a penalty alone only before one temperature and `dist` or `top_p` (`end` is
/// the stage after the leading temperatures and penalties), as `top_k`, `min_p` and `greedy`
/// read a penalty's edits off the gathered tokens instead.
fn edits_to_write(stages: &[Stage], first: usize, end: usize) -> Option<usize> {
    let (mut penalties, mut masking, mut after) = (0, false, first);
    for (i, stage) in stages.iter().enumerate().skip(first) {
        match stage {
            _ if stage.is_inert() => {}
            Stage::HfRepetitionPenalty(_) => penalties += 1,
            _ if masks(stage) => masking = true,
            _ => break,
        }
        after = i + 1;
    }
    if penalties > 1 {
        return None;
    }
    if masking {
        return Some(after);
    }
    // A penalty alone: before every temperature, and read by `dist` or `top_p`.
    if penalties == 0 || !matches!(stages.get(end), Some(Stage::HfDist(_) | Stage::HfTopP(_))) {
        return None;
    }
    stages[after..end].iter().all(|st| st.is_inert() || matches!(st, Stage::HfTemperature(_))).then_some(after)
}

/// [`prepare`] from `after` on a copy of the row with the edits of the stages from `first` to
/// `after` ([`edits_to_write`]) written into it: each token the `repetition_penalty` has seen
/// penalised as its `apply` does, and each id a mask names `-inf` (the masks' state moves as
/// in their `apply`). That copy is the row the stages from `after` see. The fallbacks fill the
/// candidates from it and run the stages from `after` ([`Scratch::row_applied`]). `None` (the
/// candidates untouched, the summary of `r` dropped) where the copy holds `+inf` (a penalty
/// below 1 can overflow a logit) or nothing finite, where a mask falls on a NaN or `+inf` of
/// the row, or where no fast path serves the stages from `after`.
///
/// PERF: these chains took the candidate array: `repetition_penalty(1.1);temperature(0.8);
/// top_p(0.9);dist` 492 µs a token at V = 32,000 and 2.1 ms at 128,256 (`top_p` and `dist`
/// read the row through one temperature, and the penalty is not one);
/// `no_repeat_ngram(3);temperature(0.7);top_k(50);top_p(0.9);dist` 984 µs and
/// `suppress_tokens(1 2 3);temperature(0.7);top_p(0.9);dist` 2.3 ms at 128,256.
pub(crate) fn prepare_patched(
    stages: &mut [Stage],
    (first, after): (usize, usize),
    r: &[f32],
    s: &mut Scratch,
    c: &mut Candidates,
) -> Result<Option<Prepared>> {
    let v = r.len();
    s.overlay.clear();
    for stage in &mut stages[first..after] {
        let overlay = &mut s.overlay;
        let mut mask = |id: u32| {
            if (id as usize) < v {
                overlay.push((id, f32::NEG_INFINITY));
            }
        };
        match stage {
            _ if stage.is_inert() => {}
            Stage::HfRepetitionPenalty(p) => {
                let seen = p.seen().iter().filter(|&&id| (id as usize) < v);
                overlay.extend(seen.map(|&id| (id, p.penalise(r[id as usize]))));
            }
            Stage::HfSuppressTokens(m) => m.for_each_masked(&mut mask),
            Stage::HfBeginSuppressTokens(m) => m.for_each_masked(&mut mask),
            Stage::HfMinLength(m) => m.for_each_masked(&mut mask),
            Stage::HfMinNewTokens(m) => m.for_each_masked(&mut mask),
            Stage::HfNoRepeatNGram(m) => m.for_each_masked(&mut mask),
            // Not one `edits_to_write` takes: the array path (the masks' state moves again
            // there to where it is now).
            _ => return Ok(None),
        }
    }
    // By id, each once: a masked id stays `-inf`, penalised or not.
    s.overlay.sort_by_key(|e| e.0);
    s.overlay.dedup_by(|later, kept| {
        let same = later.0 == kept.0;
        if same {
            kept.1 = kept.1.min(later.1);
        }
        same
    });
    // A mask would hide a NaN or `+inf` of the row (the row may not have been validated: see
    // `dense::prepare`); the copy's summary catches the rest.
    if s.overlay.iter().any(|&(id, _)| r[id as usize].is_nan() || r[id as usize] == f32::INFINITY) {
        s.overlay.clear();
        s.summary = None;
        return Ok(None);
    }
    let mut patched = std::mem::take(&mut s.patched);
    let summary = arch::patch_summarize(r, &s.overlay, 1.0, &mut patched, &mut s.block_max);
    s.overlay.clear();
    let out = if summary.suspect || summary.max == f32::NEG_INFINITY {
        Ok(None)
    } else {
        let applied = s.row_applied;
        s.summary = Some(summary);
        s.row_applied = after;
        let out = prepare(stages, after, &patched, s, c);
        s.row_applied = applied;
        out
    };
    // Raw logprobs read the input row, not this summary of the patched one.
    s.summary = None;
    s.patched = patched;
    out
}

/// `p`'s edit of the gathered entry `id` of logit `z` (for [`gather_top_lowered`]), `None` for
/// an unseen token.
///
/// PERF: transformers penalises every token of the prompt too. An overlay of all of them was
/// built, counted and merged at every step (2,000 seen tokens at V = 32,000: 9.8 µs a token,
/// against 2.5 µs for 70); a membership test per gathered entry costs the same for any
/// history.
fn penalty_edit(p: &RepetitionPenalty) -> impl Fn(u32, f32) -> Option<f32> + '_ {
    |id, z| p.has_seen(id).then(|| p.penalise(z))
}

/// A raw logit below which no untouched token reaches processed value `tau` (finite):
/// `f(z) >= tau` implies `z >= raw_floor(tau)`. Through each temperature backwards
/// ([`undivided_floor`]), rounded down to f32.
fn raw_floor(prefix: &[Stage], tau: f32) -> f32 {
    let mut bound = tau as f64;
    for stage in prefix.iter().rev() {
        if let Stage::HfTemperature(t) = stage {
            if !stage.is_inert() {
                bound = undivided_floor(bound, t.divisor());
            }
        }
    }
    f32_at_most(bound)
}

/// What the reducing stage at the end of the elementwise prefix is.
enum Reduce {
    TopK(usize),
    Greedy,
    MinP(f32, usize),
}

/// Runs `stages[first..]` on the row in place where it can (see the module docs): the
/// candidates are left as a sparse view and `Some(Built)` says how many stages ran, or a
/// greedy stage selected. `None`: this chain (or this row) takes the array path; the
/// candidates are untouched then. `r` is validated (no NaN, no `+inf`).
pub(crate) fn prepare(
    stages: &mut [Stage],
    first: usize,
    r: &[f32],
    s: &mut Scratch,
    c: &mut Candidates,
) -> Result<Option<Prepared>> {
    let v = r.len();
    // Set below only for the view this call builds.
    s.view_desc.clear();
    let mut end = first;
    while stages
        .get(end)
        .is_some_and(|st| st.is_inert() || matches!(st, Stage::HfTemperature(_) | Stage::HfRepetitionPenalty(_)))
    {
        end += 1;
    }
    if let Some(after) = edits_to_write(stages, first, end) {
        return prepare_patched(stages, (first, after), r, s, c);
    }
    // A chain with a stage this path knows at `end` that still ends up on the array path
    // fell back (labelled here, overwritten on success).
    if matches!(
        stages.get(end),
        Some(
            Stage::HfTopK(_)
                | Stage::HfGreedy(_)
                | Stage::HfMinP(_)
                | Stage::HfDist(_)
                | Stage::HfTopP(_)
                | Stage::HfEpsilon(_)
        )
    ) {
        s.path = Path::Fallback(stages[end].name());
    }
    let reduce = match stages.get(end) {
        Some(Stage::HfTopK(t)) if t.k() < v => Reduce::TopK(t.k()),
        Some(Stage::HfGreedy(_)) => Reduce::Greedy,
        Some(Stage::HfMinP(m)) => {
            let (p, keep) = m.params();
            let next = stages.iter().skip(end + 1).position(|st| !st.is_inert()).map(|i| end + 1 + i);
            if let Some(at) = next.filter(|&at| matches!(stages[at], Stage::HfDist(_))) {
                // PERF: on a nearly flat row `min_p` keeps every token, and a view of all of them
                // cost a few times the draw from the row (1 ms at V = 128k).
                if min_p_keeps_all(&stages[first..end], p, r, s) {
                    return dist(stages, (first, end, at), r, s, c);
                }
            }
            Reduce::MinP(p, keep)
        }
        Some(Stage::HfDist(_)) => return dist(stages, (first, end, end), r, s, c),
        Some(Stage::HfEpsilon(e)) => {
            if !stages[end + 1..].iter().all(sparse_safe) {
                return Ok(None);
            }
            let (cutoff, keep) = e.params();
            return cut_below(stages, (first, end), cutoff, keep, r, s, c);
        }
        Some(Stage::HfTopP(tp)) => {
            let (threshold, keep) = tp.params();
            let next = stages.iter().skip(end + 1).position(|st| !st.is_inert()).map(|i| end + 1 + i);
            if let Some(at) = next.filter(|&at| matches!(stages[at], Stage::HfDist(_))) {
                return top_p_dist(stages, (first, end, at), threshold, keep, r, s, c);
            }
            if !stages[end + 1..].iter().all(sparse_safe) {
                return Ok(None);
            }
            return top_p(&stages[first..end], threshold, keep, r, s, c).map(|done| {
                done.then(|| {
                    s.path = Path::Fast("top_p");
                    Prepared::Built { applied: end + 1 }
                })
            });
        }
        _ => return Ok(None),
    };
    if !stages[end + 1..].iter().all(sparse_safe) {
        return Ok(None);
    }
    let prefix = &stages[first..end];

    let lowering = lowering_penalty(prefix);
    if lowering.is_some() {
        s.overlay.clear();
        s.edited.clear();
    } else if !edits(prefix, r, s) {
        return Ok(None);
    }

    // The largest untouched tokens (a superset of the top `k`), as raw logits (or penalised
    // ones, by a lowering penalty).
    let k = match reduce {
        Reduce::TopK(k) => k,
        Reduce::Greedy | Reduce::MinP(..) => 1,
    };
    let gathered = match lowering {
        Some(p) => gather_top_lowered(k, r, s, penalty_edit(p), p.seen().iter().copied()),
        None => gather_top(k, r, s),
    };
    let Some(gathered_from) = gathered else { return Ok(None) };
    // The gathered tokens hold raw logits (penalised by a lowering penalty, which `untouched`
    // then skips): their processed logits, once, in place.
    let process = |g: &mut [TokenData]| untouched(prefix, g);
    process(&mut s.gathered);
    let mut ranked = false;
    let keep_at_least = match reduce {
        Reduce::TopK(_) | Reduce::Greedy => {
            // The k-th largest processed logit over the gathered and the edited tokens.
            // PERF: selected among integer keys (`total_cmp`'s order, reversed: the largest
            // logit first), whose partitions make no unpredictable float comparisons.
            let key = |z: f32| !total_order_key(z);
            let kth = |keys: &mut Vec<u32>| from_sort_key(!*keys.select_nth_unstable(k - 1).1);
            s.ranks.clear();
            if matches!(reduce, Reduce::TopK(_)) && s.edited.is_empty() && (k..=2 * k).contains(&s.gathered.len()) {
                // PERF: the usual case (no edited tokens, a superset not much larger than k):
                // one sort of the gathered keys, with their indices, gives the k-th largest
                // and the view's order, which the fused tail's `top_p` would otherwise sort
                // again: 155 ns for 45 keys against 90 to select and 135 to sort 40 (Zen 4);
                // the default chain at V = 32k went 2.25 -> 2.21 µs (interleaved runs).
                s.ranked.clear();
                s.ranked.extend(s.gathered.iter().enumerate().map(|(i, t)| u64::from(key(t.logit)) << 32 | i as u64));
                s.ranked.sort_unstable();
                ranked = true;
                from_sort_key(!((s.ranked[k - 1] >> 32) as u32))
            } else {
                s.ranks.extend(s.gathered.iter().map(|t| key(t.logit)));
                if s.ranks.len() >= k {
                    // PERF: the gathered tokens' k-th largest first: an edited token at or
                    // below it cannot change it, and most edited tokens (a long history) lie
                    // far below.
                    let tau = kth(&mut s.ranks);
                    let before = s.ranks.len();
                    let above = s.edited.iter().map(|t| t.logit).filter(|z| z.total_cmp(&tau).is_gt());
                    s.ranks.extend(above.map(key));
                    if s.ranks.len() > before {
                        kth(&mut s.ranks)
                    } else {
                        tau
                    }
                } else {
                    s.ranks.extend(s.edited.iter().map(|t| key(t.logit)));
                    if s.ranks.len() < k {
                        return Ok(None);
                    }
                    kth(&mut s.ranks)
                }
            }
        }
        Reduce::MinP(p, _) => {
            let max = s.gathered.iter().chain(&s.edited).map(|t| t.logit);
            let max = max.fold(f32::NEG_INFINITY, f32::max);
            match min_p_floor(p, max, v) {
                Some(floor) => floor,
                None => return Ok(None),
            }
        }
    };
    if !keep_at_least.is_finite() {
        return Ok(None); // fewer finite logits than k, or a processed logit overflowed
    }
    let floor = raw_floor(prefix, keep_at_least);
    if floor < gathered_from {
        match lowering {
            Some(p) => _ = gather_lowered(r, floor, s, &penalty_edit(p)),
            None => gather_at_least(r, &s.block_max, &s.overlay, floor, &mut s.gathered, &mut s.blocks),
        }
        process(&mut s.gathered);
        ranked = false; // another set of tokens
    }

    // The survivors, in id order: gathered (untouched, processed above) and edited tokens
    // merged.
    c.begin(v);
    if s.edited.is_empty() {
        survivors(keep_at_least, ranked, s, c);
    } else {
        let mut edits = s.edited.iter().peekable();
        for t in &s.gathered {
            while let Some(e) = edits.next_if(|e| e.id < t.id) {
                push_if(c, *e, keep_at_least);
            }
            push_if(c, TokenData { id: t.id, logit: t.logit, p: 0.0 }, keep_at_least);
        }
        for e in edits {
            push_if(c, *e, keep_at_least);
        }
    }
    if c.data.iter().any(|t| !t.logit.is_finite()) {
        c.begin(v);
        return Ok(None);
    }
    if ranked {
        view_order(keep_at_least, c.data.len(), s);
    }

    s.path = Path::Fast(stages[end].name());
    match reduce {
        Reduce::TopK(_) => {}
        Reduce::Greedy => {
            // Every survivor holds the maximum; the first (lowest id) is torch's argmax.
            let Some(&t) = c.data.first() else { return Ok(None) };
            c.data.truncate(1);
            c.selected = Some(0);
            return Ok(Some(Prepared::Selected(t.id)));
        }
        Reduce::MinP(p, keep) => {
            let max = c.data.iter().fold(f32::NEG_INFINITY, |m, t| m.max(t.logit));
            let ln_p = (p as f64).ln();
            let margin = 2f64.powi(-19);
            for t in c.data.iter_mut() {
                let y = (t.logit - max) as f64; // the f32 difference of the softmax
                if y < ln_p - margin {
                    t.logit = f32::NEG_INFINITY;
                } else if y <= ln_p + margin {
                    c.begin(v);
                    s.path = Path::Fallback("min_p");
                    return Ok(None); // within rounding of the threshold: only S can decide
                }
            }
            c.data.retain(|t| t.logit != f32::NEG_INFINITY);
            if keep > 1 && c.data.len() < keep {
                c.begin(v);
                s.path = Path::Fallback("min_p");
                return Ok(None); // torch's topk would bring tokens back: tie order matters
            }
        }
    }
    c.sparse = true;
    if let Some(done) = super::tail::sample(stages, end + 1, c, s)? {
        return Ok(Some(done));
    }
    Ok(Some(Prepared::Built { applied: end + 1 }))
}

/// `epsilon` (`cutoff` its `fl32(epsilon)`, `stages[end]`) on the untouched row after at most
/// one temperature (`stages[first..end]`): a token is removed when its probability
/// `fl32(w / S)` is below `cutoff` and its processed logit below the `keep`-th largest, `w` its
/// weight `exp(f64(fl32(z - max)))` and `S` the f64 sum of every weight. The survivors are
/// left as a sparse view (the removed tokens are the dense row's `-inf`), the stages after it
/// run on it (fused where they can: `tail`).
///
/// `S >= 1` (the maximum's weight), so `p <= w`: a token whose weight is below `cutoff` is
/// removed whatever `S` is, and below the processed logit `min_p_floor(cutoff)` every weight
/// is. The tokens at or above it (or at or above the `keep`-th largest, if that is lower) are
/// gathered from the row, and each one's test is decided by bounds on `S`
/// ([`tightening_sums`], then the exact weights summed in blocks as [`locate_draw`]'s last
/// try): `fl32(w / S)` lies between `fl32(w / S_hi)` and `fl32(w / S_lo)`, division and
/// rounding being monotone. A token those leave on both sides of `cutoff` (within about
/// `2^-40` of it, with the exact sums), or a penalty before it: the array path.
fn cut_below(
    stages: &mut [Stage],
    (first, end): (usize, usize),
    cutoff: f32,
    keep: usize,
    r: &[f32],
    s: &mut Scratch,
    c: &mut Candidates,
) -> Result<Option<Prepared>> {
    let n = r.len();
    let prefix = &stages[first..end];
    let Some((t, max)) = one_temperature(prefix, s) else { return Ok(None) };
    let Some(floor) = min_p_floor(cutoff, max, n) else { return Ok(None) };
    // The `keep`-th largest processed logit: the `keep`-th of a gathered superset of the
    // largest raw logits (the temperature is monotone).
    let kth = if keep <= 1 {
        max
    } else {
        if gather_top(keep, r, s).is_none() {
            return Ok(None);
        }
        untouched(prefix, &mut s.gathered);
        if s.gathered.len() < keep {
            return Ok(None);
        }
        s.ranks.clear();
        s.ranks.extend(s.gathered.iter().map(|t| !total_order_key(t.logit)));
        from_sort_key(!*s.ranks.select_nth_unstable(keep - 1).1)
    };
    // Below both the floor and the `keep`-th largest, every token is removed.
    let bound = floor.min(kth);
    if !bound.is_finite() {
        return Ok(None);
    }
    gather_at_least(r, &s.block_max, &[], raw_floor(prefix, bound), &mut s.gathered, &mut s.blocks);
    untouched(prefix, &mut s.gathered);
    weights_into(s.gathered.iter().map(|t| t.logit), max, &mut s.top_weights);
    // `Some(S_lo)` when every gathered token's test comes out the same for any `S` within
    // `sum ± err`.
    let decide = |sum: f64, err: f64, s: &mut Scratch| {
        let (lo, hi) = (sum - err, sum + err);
        let open = |(tok, &w): (&TokenData, &f64)| {
            tok.logit < kth && ((w / lo) as f32 >= cutoff) != ((w / hi) as f32 >= cutoff)
        };
        (lo > 0.0 && !s.gathered.iter().zip(&s.top_weights).any(open)).then_some(lo)
    };
    let lo = tightening_sums(r, t, max, &TOP_P_FAR_MASSES, s, decide).or_else(|| {
        arch::exp64_block_sums(r, t, max, &mut s.block_sums);
        let sum = total(&s.block_sums);
        decide(sum, sum * (n as f64 + 8.0) * f64::EPSILON * 2.0 + n as f64 * 1.2e-38, s)
    });
    let Some(lo) = lo else { return Ok(None) };
    c.begin(n);
    for (tok, &w) in s.gathered.iter().zip(&s.top_weights) {
        if tok.logit >= kth || (w / lo) as f32 >= cutoff {
            c.data.push(TokenData { id: tok.id, logit: tok.logit, p: 0.0 });
        }
    }
    c.sparse = true;
    s.path = Path::Fast(stages[end].name());
    if let Some(done) = super::tail::sample(stages, end + 1, c, s)? {
        return Ok(Some(done));
    }
    Ok(Some(Prepared::Built { applied: end + 1 }))
}

/// `[temperature(t);] dist` on the untouched row: the token transformers' `dist` selects for
/// this step's draw `u`, located with approximate per-block sums and certified (see
/// [`locate_draw`]); where it cannot be, the array path runs with the same draw. The prefix is
/// `stages[first..end]`, `dist` is `stages[at]`, and the stages between leave this row as it is
/// (the caller has checked).
fn dist(
    stages: &mut [Stage],
    (first, end, at): (usize, usize, usize),
    r: &[f32],
    s: &mut Scratch,
    c: &mut Candidates,
) -> Result<Option<Prepared>> {
    let Some((t, max)) = one_temperature(&stages[first..end], s) else { return Ok(None) };
    let Some(Stage::HfDist(d)) = stages.get_mut(at) else { return Ok(None) };
    let u = d.draw();
    if let Some((id, sum, exact)) = locate_draw(r, t, max, u, s) {
        // Its probability against the sum that located it (approximate, as llama.cpp's
        // `dist` fast path leaves it).
        let logit = r[id as usize] / t;
        let p = (weight(logit, max) / sum) as f32;
        c.begin(r.len());
        c.data.push(TokenData { id, logit, p });
        c.selected = Some(0);
        s.path = Path::Fast(if exact { "dist (exact sums)" } else { "dist" });
        return Ok(Some(Prepared::Selected(id)));
    }
    c.fill_validated(r);
    // `r` reflects the stages before `s.row_applied` (a patched row, see `dense`).
    for stage in &mut stages[s.row_applied..at] {
        stage.apply(c)?;
    }
    Dist::select(c, u);
    s.path = Path::Fallback("dist");
    Ok(Some(Prepared::Built { applied: at + 1 }))
}

/// `(t, max)` when `prefix` is at most one temperature `t` (1 without) and the row's largest
/// processed logit `max = fl32(max z / t)` is finite: the weights are then llama.cpp's
/// arguments. `None` for a penalty (its edits would need their own weights), two temperatures
/// (they round twice), or an all -inf row (the array path's error).
fn one_temperature(prefix: &[Stage], s: &Scratch) -> Option<(f32, f32)> {
    let mut t = 1.0f32;
    let mut temperatures = 0;
    for stage in prefix {
        match stage {
            _ if stage.is_inert() => {}
            Stage::HfTemperature(x) => {
                t = x.divisor();
                temperatures += 1;
            }
            _ => return None,
        }
    }
    let summary = s.summary?;
    if temperatures > 1 || summary.max == f32::NEG_INFINITY {
        return None;
    }
    // Division by t > 0 is monotone: the largest processed logit is the largest raw one's.
    let max = summary.max / t;
    max.is_finite().then_some((t, max))
}

/// Tries `f` on ever tighter approximations of the row's weights `exp(f64(fl32(fl32(z / t) -
/// max)))`: per block in `s.block_sums`, with the sum and a bound on its distance to the f64
/// sum of the exact weights in any order (see [`locate_draw`]). The blocks whose weights may
/// hold at most `masses[i]` are skipped by the `i`-th try ([`NearSums`]); the last mass should
/// be 0 (every block). Returns the first `Some` of `f`.
fn tightening_sums<T>(
    r: &[f32],
    t: f32,
    max: f32,
    masses: &[f64],
    s: &mut Scratch,
    mut f: impl FnMut(f64, f64, &mut Scratch) -> Option<T>,
) -> Option<T> {
    let n = r.len() as f64;
    // The sums' bound is against llama.cpp's f32 `expf` weights (exactly 0 where the sums are
    // exact); those are within an f32 ulp of the f64 `exp`'s: one more 2^-23 relative.
    let bounds = |approx_err: f64, s: &Scratch| {
        let sum = total(&s.block_sums);
        (sum, approx_err + sum * (2f64.powi(-23) + (n + 8.0) * f64::EPSILON * 2.0) + n * 1.2e-38)
    };
    let Some(mut near) = NearSums::new(r, t, max, s) else {
        s.block_sums.resize(r.len().div_ceil(BLOCK), 0.0);
        let (sum, err) = bounds(arch::exp_block_sums_approx(r, t, max, &mut s.block_sums), s);
        return f(sum, err, s);
    };
    for &mass in masses {
        let (sum, err) = bounds(near.widen(mass, r, t, max, s), s);
        if let Some(x) = f(sum, err, s) {
            return Some(x);
        }
    }
    None
}

/// The masses `top_p`'s tries leave unexponentiated ([`NearSums`]): its cut is decided by
/// bounds on the cumsum, which the first widens by 2^-10 of the sum, the second by 2^-14; an
/// undecided cut gets a last try with every block. A failed try costs little: the next one
/// computes only the blocks it newly needs and reuses the gathered top set. (Over 24 peaked
/// rows per size this ladder and finer ones, such as 2^-8, -10, -12, -14, were within the
/// machine's noise of each other, and 10–25% faster than a first try at 2^-14.)
const TOP_P_FAR_MASSES: [f64; 3] = [1.0 / 1024.0, 1.0 / 16_384.0, 0.0];

/// transformers' `top_p` on the row (see [`TopP`](crate::sampler::transformers::top_p::TopP)):
/// sort ascending, softmax, cumsum, remove the sorted prefix whose cumsum is `<= threshold`.
/// Returns `true` with the survivors left as a sparse view, or `false` (candidates untouched
/// or cleared) where the array path must decide.
///
/// Only the largest tokens are sorted. With `S` the softmax sum, bounded by approximate block
/// sums (`S_lo <= S <= S_hi`), and `A` the exact weights of a gathered top set `G` (every token
/// outside it strictly below every token in it), the cumsum right before `G` is
/// `C0 = Σ_{outside} fl32(w / S)`, within `[(1 - A / S_lo)(1 - d), (1 - A / S_hi)(1 + d)]`
/// (`d`: the f32 roundings of the probabilities and the f64 summation). Walking `G` upwards,
/// each probability lies in `[fl32(w / S_hi), fl32(w / S_lo)]`, rounding being monotone, and
/// so does every partial cumsum between the rounded low and high running sums: a position is
/// removed when even the high one is `<= threshold`, kept (and the walk ends) when even the
/// low one is above it; anything in between is left to the array path, as are equal values
/// straddling the cut (torch's sort order decides those).
fn top_p(
    prefix: &[Stage],
    threshold: f32,
    keep: usize,
    r: &[f32],
    s: &mut Scratch,
    c: &mut Candidates,
) -> Result<bool> {
    let Some((t, max)) = one_temperature(prefix, s) else { return Ok(false) };
    let n = r.len();
    if !(threshold > 0.0 && threshold < 1.0) || keep >= n {
        return Ok(false);
    }
    let mut top =
        TopSet { need: 64, a: None, grow_when_unsure: true, exhausted: false, floor: f32::INFINITY, estimate: None };
    tightening_sums(r, t, max, &TOP_P_FAR_MASSES, s, |sum, err, s| {
        match top_p_within(sum, err, t, max, threshold, keep, r, s, c, &mut top) {
            Ok(false) => None,
            decided => Some(decided),
        }
    })
    .unwrap_or(Ok(false))
}

/// The top set `G` of [`top_p`]'s tries, kept from one try to the next (it depends on the row
/// only): `s.gathered` holds `G` (processed logits, ascending) for `need` when `a` (the sum of
/// its exact weights) is known.
struct TopSet {
    need: usize,
    a: Option<f64>,
    /// Whether to gather a larger set when the bounds leave open whether the cut lies below
    /// `G` (`false`: only when it surely does).
    grow_when_unsure: bool,
    /// Set when the cut surely lies below the largest `G` worth gathering (most of the row
    /// survives): [`bottom`](super::bottom) ranks the tokens below the cut instead.
    exhausted: bool,
    /// The least processed logit gathered: `G` holds the tokens above it.
    floor: f32,
    /// The size of the nucleus as [`tokens_for_share`] estimates it, once it was needed.
    estimate: Option<usize>,
}

/// [`top_p`] given the softmax sum `S` within `sum ± err`: `Ok(false)` where the bounds (or
/// ties, or `min_tokens_to_keep`) leave it undecided.
#[allow(clippy::too_many_arguments)]
fn top_p_within(
    sum: f64,
    err: f64,
    t: f32,
    max: f32,
    threshold: f32,
    keep: usize,
    r: &[f32],
    s: &mut Scratch,
    c: &mut Candidates,
    top: &mut TopSet,
) -> Result<bool> {
    let n = r.len();
    let Some((cut, last)) = top_p_cuts(sum, err, t, max, threshold, keep, r, s, top) else { return Ok(false) };
    if cut != last {
        return Ok(false);
    }
    // The survivors, in id order (sorted as integer keys: id, then the logit's bits).
    let g = &s.gathered;
    c.begin(n);
    let keys = &mut s.gathered_ranks;
    keys.clear();
    keys.extend(g[cut..].iter().map(|tok| (u64::from(tok.id) << 32) | u64::from(tok.logit.to_bits())));
    arch::sort_keys(keys);
    c.data.extend(keys.iter().map(|&k| TokenData { id: (k >> 32) as u32, logit: f32::from_bits(k as u32), p: 0.0 }));
    c.sparse = true;
    Ok(true)
}

/// The positions in [`top_p`]'s ascending top set `G` (`s.gathered`, with its weights in
/// `s.top_weights`) where the survivors may begin, given the softmax sum within `sum ± err`:
/// `Some((first, last))` when every token outside `G` is removed for sure and no equal values
/// straddle any of those positions (torch's sort order would pick which go).
#[allow(clippy::too_many_arguments)]
fn top_p_cuts(
    sum: f64,
    err: f64,
    t: f32,
    max: f32,
    threshold: f32,
    keep: usize,
    r: &[f32],
    s: &mut Scratch,
    top: &mut TopSet,
) -> Option<(usize, usize)> {
    let n = r.len();
    let (s_lo, s_hi) = (sum - err, sum + err);
    if s_lo.is_nan() || s_lo <= 0.0 {
        return None;
    }
    // Relative slack of the f64 sums (any order) and of each probability's f32 rounding.
    let slack = (n as f64 + 8.0) * f64::EPSILON * 2.0;
    let d = 2f64.powi(-24) + slack;
    let blocks = s.block_max.len();
    let (c0_lo, c0_hi) = loop {
        let a = match top.a {
            Some(a) => a,
            None => {
                if top.need > largest_top_set(n, blocks) || gather_top(top.need, r, s).is_none() {
                    return None;
                }
                // G: the gathered tokens strictly above the smallest gathered value (tokens
                // outside may equal it).
                s.gathered.iter_mut().for_each(|tok| tok.logit /= t);
                let floor = s.gathered.iter().fold(f32::INFINITY, |m, tok| m.min(tok.logit));
                s.gathered.retain(|tok| tok.logit > floor);
                top.floor = floor;
                sort_ascending_by_logit_then_id(&mut s.gathered, &mut s.gathered_ranks);
                // The weights, kept for the walk below.
                weights_into(s.gathered.iter().map(|tok| tok.logit), max, &mut s.top_weights);
                let a = s.top_weights.iter().sum();
                *top.a.insert(a)
            }
        };
        // The absolute terms: the sums' rounding against the exact `S - A`, and probabilities
        // rounded to subnormals (at most 2^-150 each).
        let c0_hi = (1.0 - a / s_hi) * (1.0 + d) + slack + n as f64 * 2f64.powi(-150);
        let c0_lo = ((1.0 - a / s_lo) * (1.0 - d) - slack - n as f64 * 2f64.powi(-150)).max(0.0);
        if (c0_hi as f32) <= threshold {
            // Every token outside G is removed (the cumsum only grows up to C0).
            break (c0_lo, c0_hi);
        }
        // The cut may lie at or below G: a larger top set, if there is one to gather (else
        // G stays for the next try). Where only the bounds' width leaves that open, a draw's
        // coarse try gives up instead: its next try narrows them.
        let most = largest_top_set(n, blocks);
        let below = (c0_lo as f32) > threshold;
        if top.need * 4 > most || (!top.grow_when_unsure && !below) {
            top.exhausted |= top.need * 4 > most && below;
            return None;
        }
        // The next G: four times the last, unless even that many more tokens, each as heavy as
        // the heaviest outside G, would leave the cut below it (a hot row: the nucleus holds
        // thousands of tokens). Then from an estimate of the nucleus (once per row): G and the
        // tokens below it that hold the rest of the share `1 - threshold` of the sum (`sum`:
        // S's estimate). Where that lies past any G worth gathering (a nearly flat row, a very
        // hot one), the cut is ranked from below.
        let m = s.gathered.len();
        let wanted = (1.0 - f64::from(threshold)) * sum - a;
        if wanted > (3 * m) as f64 * weight(top.floor, max) {
            let estimate =
                *top.estimate.get_or_insert_with(|| m + tokens_for_share(r, t, max, top.floor, wanted / (sum - a)));
            if estimate > most && below {
                top.exhausted = true;
                return None;
            }
            top.need = (top.need * 4).max(estimate + estimate / 2).min(most);
        } else {
            top.need *= 4;
        }
        top.a = None;
    };
    let g = &s.gathered;
    let m = g.len();
    let removable = n - keep;
    if n - m > removable {
        return None; // min_tokens_to_keep reaches below G, where ties go by torch's order
    }
    // Walking G upwards, a position is removed for sure while even the high cumsum is at most
    // the threshold, kept (with every position above) once even the low one exceeds it; the
    // survivors begin at the first kept position, somewhere between the first position not
    // removed for sure and the first kept for sure.
    let (mut lo, mut hi) = (c0_lo, c0_hi);
    let (mut first, mut last) = (None, None);
    for (j, &w) in s.top_weights.iter().enumerate() {
        if n - m + j >= removable {
            last = Some(j);
            break;
        }
        lo = (lo + (w / s_hi) as f32 as f64) * (1.0 - slack);
        hi = (hi + (w / s_lo) as f32 as f64) * (1.0 + slack);
        if hi as f32 <= threshold {
            continue; // removed whatever S is
        }
        first.get_or_insert(j);
        if lo as f32 > threshold {
            last = Some(j);
            break;
        }
    }
    let last = last?;
    let first = first.unwrap_or(last).min(last);
    if (first.max(1)..=last).any(|cut| g[cut - 1].logit == g[cut].logit) {
        return None; // equal values straddle a possible cut
    }
    Some((first, last))
}

/// About how many of the largest tokens below a top set hold the share `share` of the
/// softmax mass below it, every processed logit `z = fl32(r / t)` of theirs at or below
/// `floor` (`max` the row's): from [`bottom`]'s sample of the row
/// ([`sample_counts`](bottom::sample_counts)) in buckets an eighth of a nat wide. A share rather
/// than a mass, so that the sample's error in the total cancels. Where [`top_p_cuts`] sizes its
/// next top set, not a bound.
fn tokens_for_share(r: &[f32], t: f32, max: f32, floor: f32, share: f64) -> usize {
    const PER_NAT: f32 = 8.0;
    let mut counts = [0u32; 512];
    bottom::sample_counts(r, t, max, PER_NAT, floor, &mut counts);
    // Bucket `k`'s weight `e^(-k / 8)`, by one ratio from bucket to bucket.
    let step = (-1.0 / f64::from(PER_NAT)).exp();
    let mut w = 1.0;
    let mut total = 0.0;
    for &c in &counts {
        total += f64::from(c) * w;
        w *= step;
    }
    let (mut mass, mut seen) = (0.0, 0);
    w = 1.0;
    for &c in &counts {
        mass += f64::from(c) * w;
        seen += c as usize * bottom::STRIDE;
        w *= step;
        if mass >= share * total && total > 0.0 {
            return seen;
        }
    }
    r.len()
}

/// The most tokens [`top_p_cuts`] asks [`gather_top`] for, on a row of `n` tokens in `blocks`
/// blocks: an eighth of the row (beyond the blocks' count, `gather_top` finds its threshold by
/// counting passes over the row), so that a hot row whose nucleus holds a few thousand tokens
/// is ranked from the top. PERF: with half the blocks instead (about 1,000 tokens at V =
/// 128,256), `temperature(2);top_p(0.95);dist` on the bench's row (its nucleus: about 2,000
/// tokens at 32k, 3,200 at 128k) went to the bottom set, most of the row sorted: 1.0–1.3 ms a
/// token at 32k and 4.8–8.1 ms at 128k, against 0.18–0.26 and 0.65–0.69 ms now (Intel Xeon
/// with AVX-512, alternating runs of the two builds).
fn largest_top_set(n: usize, blocks: usize) -> usize {
    (blocks / 2).max(n / 8)
}

/// The masses the tries of [`top_p_dist`] leave unexponentiated ([`NearSums`]): coarser than
/// [`TOP_P_FAR_MASSES`], as a draw needs the cut only where it could change the token, but
/// finer than llama.cpp's `top_p;dist` ladder, as every token outside the top set must be
/// removed for sure (their mass is about `1 - p` of the sum). Over 16 peaked rows per size
/// this ladder took 5–15% less time than starting at 2^-2, 2^-3 or 2^-5.
const TOP_P_DRAW_MASSES: [f64; 3] = [1.0 / 16.0, 1.0 / 256.0, 1.0 / 4096.0];

/// At most this many possible cuts are tried for one draw (each costs a pass over the
/// survivors).
const MAX_CUTS: usize = 64;

/// `[temperature(t);] top_p;dist` on the untouched row (`stages[first..end]` the prefix,
/// `stages[end]` the `top_p`, `stages[at]` the `dist`, only inert stages between).
///
/// `dist` needs the survivors only through the token it draws: after bounds on the softmax
/// sum ([`tightening_sums`] at [`TOP_P_DRAW_MASSES`]) leave the cut among a few positions of
/// the top set ([`top_p_cuts`]), the draw `u` is certain when `dist` picks the same token
/// over the survivors of every one of them ([`draw_over_cuts`]). Otherwise [`top_p`] decides
/// the cut itself and `dist` runs on its survivors with the same draw (or the array path
/// does).
fn top_p_dist(
    stages: &mut [Stage],
    (first, end, at): (usize, usize, usize),
    threshold: f32,
    keep: usize,
    r: &[f32],
    s: &mut Scratch,
    c: &mut Candidates,
) -> Result<Option<Prepared>> {
    let Some((t, max)) = one_temperature(&stages[first..end], s) else { return Ok(None) };
    let n = r.len();
    if !(threshold > 0.0 && threshold < 1.0) || keep >= n {
        return Ok(None);
    }
    let Some(Stage::HfDist(dist)) = stages.get_mut(at) else { return Ok(None) };
    let d = TopPDraw { t, max, threshold, keep, u: dist.draw() };
    // A nearly flat row (most blocks reach within half a nat of the maximum): the cut lies
    // among the least likely tokens, below any top set worth gathering; rank those first.
    let blocks = s.block_max.len();
    let flat = arch::count_ge(&s.block_max, (max - 0.5) * t) * 2 > blocks;
    if flat {
        if let Some(id) = draw_from_below(d, r, s, c) {
            return Ok(Some(Prepared::Selected(id)));
        }
    }
    let (drawn, below) = certain_top_p_draw(d, r, s);
    if let Some((at_g, p)) = drawn {
        let tok = s.gathered[at_g];
        c.begin(n);
        c.data.push(TokenData { p, ..tok });
        c.selected = Some(0);
        s.path = Path::Fast("top_p;dist");
        return Ok(Some(Prepared::Selected(tok.id)));
    }
    if below && !flat {
        if let Some(id) = draw_from_below(d, r, s, c) {
            return Ok(Some(Prepared::Selected(id)));
        }
    }
    // The cut itself, then `dist` with the draw already made.
    if !below && top_p(&stages[first..end], threshold, keep, r, s, c)? {
        s.path = Path::Fast("top_p");
    } else {
        c.fill_validated(r);
        for stage in &mut stages[s.row_applied..at] {
            stage.apply(c)?;
        }
    }
    Dist::apply_drawn(c, d.u)?;
    Ok(Some(Prepared::Built { applied: at + 1 }))
}

/// [`bottom::top_p_dist`]: the token selected in `c` when certain.
fn draw_from_below(d: TopPDraw, r: &[f32], s: &mut Scratch, c: &mut Candidates) -> Option<u32> {
    let mut b = std::mem::take(&mut s.bottom);
    let drawn = bottom::top_p_dist(d, r, s, &mut b);
    s.bottom = b;
    let (id, p) = drawn?;
    c.begin(r.len());
    c.data.push(TokenData { id, logit: r[id as usize] / d.t, p });
    c.selected = Some(0);
    s.path = Path::Fast("top_p;dist (from below)");
    Some(id)
}

/// [`top_p_dist`]'s tries for draw `u` (weights `exp(f64(fl32(r / t) - max))`): the chosen
/// token's position in the top set `G` (`s.gathered`) and its probability, when certain; and
/// whether the cut surely lies below the largest `G` worth gathering.
fn certain_top_p_draw(d: TopPDraw, r: &[f32], s: &mut Scratch) -> (Option<(usize, f32)>, bool) {
    let TopPDraw { t, max, threshold, keep, u } = d;
    // A smaller first top set than `top_p`'s: most draws are decided within it.
    let mut top =
        TopSet { need: 32, a: None, grow_when_unsure: false, exhausted: false, floor: f32::INFINITY, estimate: None };
    let drawn = tightening_sums(r, t, max, &TOP_P_DRAW_MASSES, s, |sum, err, s| {
        match top_p_cuts(sum, err, t, max, threshold, keep, r, s, &mut top) {
            Some((cut, last)) => (last - cut < MAX_CUTS).then(|| draw_over_cuts(cut, last, u, s)),
            // Tighter sums cannot bring the cut into `G`: no more tries.
            None => top.exhausted.then_some(None),
        }
    });
    (drawn.flatten(), top.exhausted)
}

/// `dist`'s choice for draw `u` over the survivors `G[cut..]` (in id order, weights from
/// `s.top_weights`) for every `cut` in `first..=last`: the choice's position in `G` and its
/// probability over the survivors of `first`, when all of them choose the same token.
fn draw_over_cuts(first: usize, last: usize, u: f64, s: &mut Scratch) -> Option<(usize, f32)> {
    // The positions of `G[first..]`, in id order.
    let keys = &mut s.gathered_ranks;
    keys.clear();
    keys.extend(s.gathered[first..].iter().enumerate().map(|(i, tok)| (u64::from(tok.id) << 32) | (first + i) as u64));
    arch::sort_keys(keys);
    let w = &s.top_weights;
    let choose = |cut: usize| {
        let kept = || keys.iter().map(|&k| k as u32 as usize).filter(move |&at| at >= cut);
        // `Dist::select`: the sum in id order, then the first running sum above `u` times it.
        let mut sum = 0.0f64;
        for at in kept() {
            sum += w[at];
        }
        let target = u * sum;
        let (mut running, mut last_positive) = (0.0f64, None);
        for at in kept() {
            if w[at] > 0.0 {
                running += w[at];
                last_positive = Some(at);
                if running > target {
                    return Some((at, sum));
                }
            }
        }
        last_positive.map(|at| (at, sum))
    };
    let (at, sum) = choose(first)?;
    ((first + 1..=last).all(|cut| choose(cut).is_some_and(|(other, _)| other == at)))
        .then(|| (at, (w[at] / sum) as f32))
}

/// Sorts `data` by logit, ascending (`f32::total_cmp`'s order), ties by ascending id, as
/// integer keys (`keys` is scratch); the `p` fields are zeroed.
///
/// PERF: about half the time of sorting the 12-byte entries with a float comparator (see
/// [`rank_keys`](crate::candidates::rank_keys)). Thousands of entries in id order (a hot
/// row's top set) go through the radix sort of [`sort_rank_keys`] instead, whose stable
/// passes over the high halves leave equal values in id order.
fn sort_ascending_by_logit_then_id(data: &mut [TokenData], keys: &mut Vec<u64>) {
    keys.clear();
    keys.extend(data.iter().map(|t| (u64::from(total_order_key(t.logit)) << 32) | u64::from(t.id)));
    let sorted: &[u64] = if keys.len() > 2048 && data.windows(2).all(|w| w[0].id < w[1].id) {
        sort_rank_keys(keys)
    } else {
        arch::sort_keys(keys);
        keys
    };
    for (t, &k) in data.iter_mut().zip(sorted) {
        *t = TokenData { id: k as u32, logit: from_sort_key((k >> 32) as u32), p: 0.0 };
    }
}

/// The token transformers' `dist` selects for draw `u` over the weights
/// `w_i = exp(f64(fl32(r_i / t) - max))`: the first whose running f64 sum (row order) exceeds
/// `u · Σ w`. The weights' arguments are llama.cpp's (`fl32(fl32(r_i / t) - max)`), so the
/// approximate block sums of llama.cpp's `expf` weights serve, their bound widened by `expf`'s
/// rounding against the f64 `exp`, the f64 summation and flushed weights
/// ([`tightening_sums`]). The crossing block is resolved with the exact weights, and the
/// token is returned only when the target is farther than the bound allows from both ends of
/// its interval (the sums' part of it `max(u, 1 - u)` times, the roundings twice: see
/// llama.cpp's `crossing`); with it, the sum of the weights as those sums estimate it, and
/// whether the exact sums below were needed.
///
/// Where those bounds stay too wide (a flat row: each weight is a few hundred thousandths of a
/// sum of 128k of them), a last try sums the exact weights themselves
/// ([`arch::exp64_block_sums`]), whose only difference from the array path's sum is the order
/// of the f64 additions.
fn locate_draw(r: &[f32], t: f32, max: f32, u: f64, s: &mut Scratch) -> Option<(u32, f64, bool)> {
    let n = r.len() as f64;
    let draw = |sum: f64, err: f64, s: &mut Scratch| {
        // The part of `err` that is a sum of non-negative per-block bounds (the approximate
        // sums' and `expf`'s against `exp`) counts `max(u, 1 - u)` times, the roundings of the
        // f64 sums twice (see llama.cpp's `crossing`).
        let rounding = sum * (n + 8.0) * f64::EPSILON * 2.0 + n * 1.2e-38;
        let margin = u.max(1.0 - u) * (err - rounding).max(0.0) + 2.0 * rounding;
        let target = sum * u;
        let (b, before) = crossing_block(&s.block_sums, target)?;
        let start = b * BLOCK;
        let mut running = before;
        for (j, &z) in r[start..(start + BLOCK).min(r.len())].iter().enumerate() {
            let w = weight(z / t, max);
            if w > 0.0 {
                let prev = running;
                running += w;
                if running > target {
                    let certain = prev + margin < target && target + margin < running;
                    return certain.then_some(((start + j) as u32, sum));
                }
            }
        }
        None
    };
    if let Some((id, sum)) = tightening_sums(r, t, max, &DRAW_FAR_MASSES, s, draw) {
        return Some((id, sum, false));
    }
    arch::exp64_block_sums(r, t, max, &mut s.block_sums);
    let sum = total(&s.block_sums);
    // Any two orders of adding the same n f64s are within 2 (n - 1) 2^-53 of their sum of
    // each other; with a margin, as in `tightening_sums`.
    draw(sum, sum * (n + 8.0) * f64::EPSILON * 2.0 + n * 1.2e-38, s).map(|(id, sum)| (id, sum, true))
}

/// The view's positions by descending logit into `s.view_desc`, from the ranking of the
/// gathered tokens (`s.ranked`), when the view is the `m` gathered tokens at or above
/// `at_least` (no edited tokens) in id order. Those are the first `m` ranked (the order is
/// `total_cmp`'s, where only `-0.0` and `+0.0` differ from `>=`, and they are adjacent), which
/// is checked at the boundary; each one's position is the count of survivors before it in the
/// gathered order (`s.ranks` holds those counts: [`survivors`] wrote them).
fn view_order(at_least: f32, m: usize, s: &mut Scratch) {
    let logit = |r: u64| s.gathered[r as u32 as usize].logit;
    let ranked = &s.ranked;
    if m == 0
        || ranked.len() < m
        || logit(ranked[m - 1]) < at_least
        || ranked.get(m).is_some_and(|&r| logit(r) >= at_least)
    {
        return;
    }
    s.view_desc.extend(ranked[..m].iter().map(|&r| s.ranks[r as u32 as usize]));
}

/// The gathered tokens at or above `at_least` into the empty `c`, in id order (no edited
/// tokens); with `ranked`, `s.ranks` gets each gathered token's count of survivors before it,
/// which [`view_order`] reads.
///
/// PERF: written branch-free (every token stored, the length advanced by the test): about one
/// gathered token in eight fails it at unpredictable places, and the branch per token cost
/// about 60 ns of the 2.3 µs default chain at V = 32,000 (Zen 4).
fn survivors(at_least: f32, ranked: bool, s: &mut Scratch, c: &mut Candidates) {
    let g = &s.gathered;
    c.data.resize(g.len(), TokenData::default());
    s.ranks.clear();
    let mut m = 0;
    if ranked {
        s.ranks.resize(g.len(), 0);
        for (t, at) in g.iter().zip(&mut s.ranks) {
            c.data[m] = TokenData { id: t.id, logit: t.logit, p: 0.0 };
            *at = m as u32;
            m += usize::from(t.logit >= at_least);
        }
    } else {
        for t in g {
            c.data[m] = TokenData { id: t.id, logit: t.logit, p: 0.0 };
            m += usize::from(t.logit >= at_least);
        }
    }
    c.data.truncate(m);
}

fn push_if(c: &mut Candidates, t: TokenData, at_least: f32) {
    if t.logit >= at_least {
        c.data.push(t);
    }
}

/// Whether `min_p(p)` keeps every token of the untouched row `r` after `prefix` (at most one
/// temperature, no penalty): each processed difference `fl32(f(z) - max)` lies above
/// `ln p + 2^-19`, the module docs' margin for keeping a token without the sum. Rounding is
/// monotone and every bound below is an f32, so `z >= ceiling` suffices: `fl32(z / t) >= h`
/// where `z >= h·t` (exact in f64), and `fl32(y - max) >= c` where `y >= max + c`, with `c` the
/// least f32 above `ln p + 2^-19`. The block maxima are scanned first (that fails at the first
/// block below it, at once on a peaked row), then the row is counted (`-inf` entries fail it).
fn min_p_keeps_all(prefix: &[Stage], p: f32, r: &[f32], s: &Scratch) -> bool {
    let Some((t, max)) = one_temperature(prefix, s) else { return false };
    if !(p > 0.0 && p < 1.0) || s.block_max.len() != r.len().div_ceil(BLOCK) {
        return false;
    }
    let keep_above = (p as f64).ln() + 2f64.powi(-19);
    let c = f32_at_least(keep_above);
    let c = if (c as f64) > keep_above { c } else { c.next_up() };
    let h = f32_at_least(max as f64 + c as f64);
    let ceiling = f32_at_least(h as f64 * t as f64);
    ceiling.is_finite() && s.block_max.iter().all(|&bm| bm >= ceiling) && arch::count_ge(r, ceiling) == r.len()
}

/// The processed logit below which `min_p(p)` removes a token for sure (see the module docs),
/// for a row whose largest processed logit is `max`; `None` where the test cannot be decided
/// without the sum (`p = 0` keeps everything, `p = 1` sits on the threshold, and thresholds
/// that may be subnormal round differently).
fn min_p_floor(p: f32, max: f32, v: usize) -> Option<f32> {
    if !(p > 0.0 && p < 1.0 && max.is_finite()) || (p as f64) / (v as f64) < 2f64.powi(-100) {
        return None;
    }
    // fl32(z - max) >= ln p - 2^-19 needs z - max >= (ln p - 2^-19)(1 + 2^-23) (rounding moves
    // a difference by at most half an ulp); a little more margin, then rounded down.
    let y = ((p as f64).ln() - 2f64.powi(-19)) * (1.0 + 2f64.powi(-20));
    let bound = max as f64 + y - (max as f64).abs() * 2f64.powi(-40);
    Some(f32_at_most(bound))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::transformers::temperature::Temperature;
    use proptest::prelude::*;

    #[test]
    fn f32_at_most_rounds_down() {
        assert_eq!(f32_at_most(1.5), 1.5);
        // 0.1 rounds up to f32; the largest f32 <= 0.1 is the one below it.
        assert_eq!(f32_at_most(0.1), f32::from_bits(0.1f32.to_bits() - 1));
        assert_eq!(f32_at_most(-0.1), -0.1f32);
        assert_eq!(f32_at_most(1e-50), 0.0);
        assert_eq!(f32_at_most(-1e-50), -f32::from_bits(1));
        assert_eq!(f32_at_most(1e39), f32::MAX);
    }

    #[test]
    fn raw_floor_never_cuts_a_token_that_reaches_tau() {
        // Every z (and the floats just below it) whose processed value is >= tau = f(z) must
        // be >= the floor, through one or two temperatures, for magnitudes from subnormal to
        // huge.
        let magnitude = prop_oneof![-1e3f32..1e3, -1e-38f32..1e-38, -3e38f32..3e38, -1e-42f32..1e-42];
        let temp = prop_oneof![1e-3f64..1e3, Just(1.0), Just(0.7), Just(1e-30), Just(1e30)];
        tokensieve_testkit::proptest_support::check(
            "hf_raw_floor",
            2048,
            (magnitude, temp.clone(), proptest::option::of(temp)),
            |(z, t1, t2)| {
                let mut prefix = vec![Stage::HfTemperature(Temperature::new(t1).unwrap())];
                if let Some(t2) = t2 {
                    prefix.push(Stage::HfTemperature(Temperature::new(t2).unwrap()));
                }
                let f = |z: f32| {
                    let mut one = [TokenData { id: 0, logit: z, p: 0.0 }];
                    untouched(&prefix, &mut one);
                    one[0].logit
                };
                let tau = f(z);
                if !tau.is_finite() {
                    return Ok(());
                }
                let floor = raw_floor(&prefix, tau);
                let mut x = z;
                for _ in 0..64 {
                    if f(x) >= tau {
                        prop_assert!(x >= floor, "z {x} reaches {tau} but the floor is {floor}");
                    }
                    x = f32_at_most(x as f64 - f64::from(x).abs() * 1e-9 - 1e-300);
                }
                Ok(())
            },
        );
    }

    /// [`certain_top_p_draw`] against the array path (the dense row through `top_p`, then
    /// `dist` with the same draw) for draws spread over `[0, 1)`: every token it certifies is
    /// the array path's, on the real SmolLM2 row and on generated rows of several shapes.
    #[test]
    fn top_p_draws_are_certified_only_when_right() {
        use crate::sampler::transformers::top_p::TopP;
        use tokensieve_testkit::generate::{self, RowKind};
        let npy = concat!(env!("CARGO_MANIFEST_DIR"), "/../tokensieve-cli/testdata/example-logits.npy");
        let mut rows = vec![("real".to_string(), tokensieve_testkit::cli::read_npy_f32(npy.as_ref()).1)];
        for kind in [RowKind::Peaked, RowKind::Gaussian, RowKind::ShiftedDown] {
            for scale in [1.0f32, 3.0] {
                let row = generate::row(kind, 32_000, 5).into_iter().map(|x| x * scale).collect();
                rows.push((format!("{kind:?} x{scale}"), row));
            }
        }
        let (mut draws, mut certified) = (0, 0);
        for (name, row) in &rows {
            for (p, keep) in [(0.95f64, 1i64), (0.5, 3), (0.9, 1)] {
                let stage = TopP::new(p, keep).unwrap();
                let (threshold, keep) = stage.params();
                let mut s = Scratch::default();
                s.summary = Some(arch::summarize(row, &mut s.block_max));
                let max = s.summary.unwrap().max;
                let mut array = Candidates::from_logits(row.as_slice()).unwrap();
                Stage::HfTopP(stage).apply(&mut array).unwrap();
                for j in 0..400 {
                    let u = (j as f64 + 0.5) / 400.0;
                    let mut want = array.clone();
                    Dist::select(&mut want, u);
                    draws += 1;
                    let d = TopPDraw { t: 1.0, max, threshold, keep, u };
                    if let (Some((at, _)), _) = certain_top_p_draw(d, row, &mut s) {
                        assert_eq!(Some(s.gathered[at].id), want.selected_token(), "{name} top_p({p},{keep}) u = {u}");
                        certified += 1;
                    }
                }
            }
        }
        assert!(certified * 2 >= draws, "only {certified} of {draws} draws certified");
    }
}
