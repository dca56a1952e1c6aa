//! Fast paths that read the logits row in place, under the llama.cpp convention.
//!
//! `llama_sampler_sample` copies the row into a vocabulary-sized array of `(id, logit, p)`
//! before the first stage runs; at V = 128k that copy alone costs more than llama.cpp's whole
//! default chain should. Most chains start with a stage that keeps few candidates or that
//! selects straight from the row, so [`Chain`](crate::Chain) hands the row to `prepare`
//! first, which
//!
//! 1. summarises the row in one SIMD pass ([`arch::summarize`]): validation, the maximum, and
//!    the maximum of every block of [`arch::BLOCK`] entries (f16/bf16 rows are widened into a
//!    reused buffer in the same pass; when sampling starts with `greedy`, which reads only the
//!    maximum's block, they are summarized part by part and not kept);
//! 2. folds leading `penalties` and `logit_bias` stages into a sparse *overlay* (id → edited
//!    logit, sorted by id): on an array still in vocabulary order they touch only the ids in
//!    the penalty window and the bias list, with the same f32 operations;
//! 3. runs the first stage after those straight on row + overlay when it is one of:
//!    * `top_k(k)`: the threshold `τ` = the `(k + e)`-th largest block maximum, where at most
//!      `e` overlay entries had a row value `>= τ`, is at most the k-th largest logit (that
//!      many blocks each hold an entry `>= τ`, at most `e` of them edited), so gathering the
//!      entries `>= τ` from the blocks whose maximum reaches it yields a superset of the top k
//!      from a few percent of the row (for `k + e` beyond the number of blocks, `τ` comes from
//!      counting the row's entries `>= τ` instead); equal values among the kept (or at the
//!      cut) take libstdc++'s heap select, replayed over the blocks that reach its minimum;
//!    * `top_k(k <= 128)`, then any of `top_p`, `min_p` and `temperature`, then `dist` (when
//!      sampling, equal values among the top k, as in f16/bf16 rows): those stages and the
//!      draw see only the sequence of kept values, so the chain runs on them with equal values
//!      in id order, and the token stands when no other entry holds its value; otherwise the
//!      heap select orders them and the chain runs again with the same draw;
//!    * `min_p(p)`: the maximum from the summary, then the entries `>= max + ln p` gathered in
//!      row order from the blocks that reach it (when sampling, a `min_p` that keeps every
//!      entry is skipped, so that a `[temperature;] dist` after it draws from the row);
//!    * `top_p(p)` (no overlay, V > 1024): the f32 softmax sum in row order reproduced exactly
//!      by [`arch::exp_sum_sequential`] (entries whose weight is below half an ulp of the
//!      running sum cannot change it and are never exponentiated), then the sorted top
//!      entries popped from a heap over a superset of the top 32 (then of the top 256) until
//!      the mass is reached, as llama.cpp's "sort the top 256 first" path does;
//!    * `top_p(p);[temperature(t < 1);]dist` (when sampling, no overlay, V > 1024): `dist`
//!      recomputes every weight over the survivors, so the softmax sum matters only through
//!      the cut. `NearSums` (below) bounds the sum instead of computing it, with room for
//!      llama.cpp's f32 rounding; the cut moves monotonically with the sum, and so does
//!      `dist`'s choice with the cut, so the draw is certain when the cuts at both ends of the
//!      interval choose the same token (the survivors' sum is bounded from the mass when the
//!      second cut lies far down; after a temperature below 1, each weight past the first cut
//!      is at most a known fraction of its weight at 1). Tries at masses 2^-2, 2^-5 and 2^-9;
//!      then the exact sum above pins the cut.
//!      Equal values change only which token holds a position, so a draw declines only
//!      where a neighbour holds the chosen value (the array path then draws with the same
//!      `u`). Where the cut lies beyond the first 256 entries (flat rows), llama.cpp sorts the
//!      whole array; the draw is then made over the row's values, grouped in buckets of
//!      value and only the buckets where the order can matter sorted (`bucket_draw`);
//!    * `top_p(p);min_p(q)` (when sampling, no overlay, V > 1024, `dist` last and nothing
//!      between that reads `p`): `min_p` keeps the sorted prefix up to its first entry below
//!      `max + ln q`, whatever lies past it, so `top_p`'s cut need only be bounded below: the
//!      cut at a lower bound of the softmax sum (from the block maxima's weights) is one.
//!      Where `min_p` cuts within it, the sum is never formed; else the exact sum above;
//!    * `greedy` (when sampling): the first entry equal to the maximum, in the block the
//!      summary found; when `greedy` is the first stage, step 1 is [`arch::locate_max`]
//!      instead (validation and the maximum's block, no block maxima), which costs little
//!      more than the floor;
//!    * `dist`, optionally after `temperature(t > 0)` (when sampling, no overlay): block sums of
//!      approximate weights ([`arch::exp_block_sums_approx`]: base-2 argument by one fused
//!      multiply-add, a quintic, f32 lane sums, and a certified error bound that is typically
//!      a few parts in 10^6 of the sum) locate the draw; the choice is certain when the target
//!      lies farther than the bound from both ends of the chosen entry's interval. Most blocks
//!      of a peaked row hold only weights far below the maximum's: `NearSums` bounds those
//!      by their block maxima instead of exponentiating them, and most of the others by cheap
//!      sums that pin each block within ±3% (a multiply-add and a conversion per weight,
//!      [`arch::cheap_block_sums_at`]), as long as both kinds of bounds add up to at most the
//!      try's mass (at first 2^-4 of the maximum's weight, which the sum exceeds); only the
//!      blocks with the widest intervals get the accurate sums. A draw it cannot certify tries
//!      again at 2^-8, 2^-12 and 2^-17,
//!      then with every block, exponentiating only the blocks each try adds. If even that
//!      cannot decide, block sums of the exact `expf` weights (error bound ~V·2^-52) try
//!      again, and after them the array path finishes with the same draw. The approximation
//!      only narrows down where the draw lands; the token is always llama.cpp's;
//!    * `mirostat` and `mirostat_v2` (no overlay): the full sort and softmax they start with,
//!      as far as the prefix they keep: the row's top entries sorted, their f32 softmax sum
//!      added in order and certified over the rest of the row in any order, in larger tries
//!      until the prefix and the entry after it are among them (see `mirostat`);
//!    * `top_n_sigma(n)` (when sampling, no overlay), followed only by `temperature`, `top_k`,
//!      `top_p`, `min_p`, `dist` and `greedy`: its threshold bounded from SIMD sums of the
//!      row (`top_n_sigma::Moments`), and the entries at or above the lower bound gathered, as
//!      long as none lies below the upper one (a second pass narrows the bounds first). llama.cpp masks the rest to `-inf` and keeps them in the
//!      array, where those stages give them no weight, so the survivors alone give the same
//!      token (see `top_n_sigma`);
//!    * `xtc` (when sampling): its draw first; a draw that leaves it out sends the rest of
//!      the chain to these paths, as if it came first (see `xtc`).
//!
//! A chain whose first stage follows the transformers convention goes to
//! `convention::transformers::row` (crate-private) after step 1.
//! Everything else (and every case a fast path cannot prove) builds the array exactly as
//! [`Candidates::fill`] does and runs the stages from the first.
//!
//! Where time goes: `top_k`, `min_p` and `greedy` cost about one pass over the row plus a few
//! percent of it. `dist` over the full row needs a cheap bound (4 vector operations per 8
//! entries) for the blocks its block maxima cannot bound, and one accurate exponential per
//! entry (~14 vector operations per 8 entries, an order of magnitude more than the max pass)
//! only for the few blocks holding most of the mass, plus passes over the block maxima; `top_p` and raw
//! logprobs only those of the entries that can change llama.cpp's f32 sum (typically a few
//! thousand at V = 128k).
//!
//! # What "exact" means here
//!
//! The candidates a fast path leaves are those the array path leaves, bit for bit: ids,
//! order, logits and `p`. The order needs care because llama.cpp sorts with libstdc++'s
//! unstable algorithms: for *distinct* values heap select, introsort and the 128-bucket sort
//! all leave plain descending order, so `top_k` and `top_p` check that the kept values (and
//! the first dropped one) are pairwise distinct and fall back to the array path on any exact
//! tie (`-0.0 == 0.0` counts as a tie). `min_p` keeps row order, which needs no check.
//! `p` values come from the same `expf` bits ([`arch::exp_shifted`] is checked against the
//! platform's `expf`) and the same f32 operations in the same order.
//!
//! `top_k;…;dist` on tied values leaves the kept candidates with equal values in id order
//! where llama.cpp's order could not change the token (`sample` only).
//! The selecting paths (`greedy`, `dist`, `top_p;dist`) are used by `sample` only, which then
//! leaves just the selected candidate in [`Candidates`] (building the full array would cost
//! more than the selection): its logit as processed and, for `dist`, its exact weight divided
//! by the sum of the block sums that located it: within `1e-12` relative of the array path's
//! `p` after the exact pass, within the certified bound of the try that located it after an
//! approximate one (relative to the sum, at most the try's mass: 2^-4 for the first try,
//! which locates most draws, 2^-17 for the fourth); not bit for bit. For `top_p;dist`, its
//! weight over `dist`'s sum at the earliest cut the bounds allow: the array path's `p`, bit
//! for bit, when that cut is the actual one, otherwise larger by at most the weights between
//! the two cuts. The token is always the one the array path selects. `apply` and processed logprobs always leave the full candidate
//! set, with every `p` as the array path computes it.

use crate::arch::{self, Summary, BLOCK};
use crate::candidates::{rank_keys, sort_rank_keys, total_order_key, Candidates, TokenData};
use crate::convention::{transformers, Convention};
use crate::error::{Error, Result};
use crate::logits::Logits;
use crate::sampler::dist::Dist;
use crate::sampler::mirostat::MuFeedback;
use crate::sampler::mirostat_v2::surprise_exceeds;
use crate::sampler::penalties::Penalties;
use crate::sampler::top_n_sigma::Moments;
use crate::sampler::{Sampler, Stage};
use crate::stdsort;

/// Reused buffers of the fast paths (owned by the [`Chain`](crate::Chain)).
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    /// f16/bf16 rows widened to f32: the row is `widened[widened_at]` (64-byte aligned, see
    /// [`arch::aligned_part`]).
    widened: Vec<f32>,
    widened_at: std::ops::Range<usize>,
    /// Whether `widened` holds the row of the last [`prepare`] (`greedy` on a half-precision
    /// row reads only the maximum's block, and leaves it stale).
    widened_now: bool,
    /// Maximum of every block of the row ([`arch::summarize`]).
    pub(crate) block_max: Vec<f32>,
    /// Sparse edits of leading penalties/logit_bias stages: (id, logit), sorted by id.
    pub(crate) overlay: Vec<(u32, f32)>,
    /// Entries gathered from the row.
    pub(crate) gathered: Vec<TokenData>,
    /// Indices of the blocks that reach a threshold.
    pub(crate) blocks: Vec<TokenData>,
    /// Sort keys of `gathered` ([`rank_keys`]).
    pub(crate) gathered_ranks: Vec<u64>,
    /// f64 weights of `gathered` (transformers row `top_p`), or of a sparse view
    /// (`transformers::tail`).
    pub(crate) top_weights: Vec<f64>,
    /// The positions of the tokens of a sparse view still in play, ascending
    /// (`transformers::tail`).
    pub(crate) live: Vec<u32>,
    /// Tokens a transformers `repetition_penalty` edits, with their processed logits.
    pub(crate) edited: Vec<TokenData>,
    /// Order keys of processed logits (transformers row path: the k-th largest).
    pub(crate) ranks: Vec<u32>,
    /// transformers row path: the gathered tokens ranked, `(!key << 32) | index`, sorted.
    pub(crate) ranked: Vec<u64>,
    /// transformers row path: the view's positions by descending logit, when the ranking
    /// gave them for this row's view (else empty): the fused tail's `top_p` order.
    pub(crate) view_desc: Vec<u32>,
    /// A min-heap of block maxima (threshold selection).
    heap: Vec<f32>,
    /// The row's top entries in descending order, their logits in the `logprob` fields
    /// ([`sorted_softmax_top`]'s sum).
    top_logits: Vec<crate::logprobs::TokenLogprob>,
    /// How many candidates [`mirostat`] kept last time: its next tries start there (`mu`
    /// moves a little per token).
    mirostat_kept: usize,
    /// Per-block f64 sums of weights (`dist`).
    pub(crate) block_sums: Vec<f64>,
    /// One block of weights (or a whole row's, sorted: `draw_by_sorting`).
    weights: Vec<f32>,
    /// A row's values, sorted (`draw_by_sorting`).
    sorted: Vec<f32>,
    /// `top_p;dist`'s draw beyond the first 256 entries ([`super::bucket_draw`]).
    buckets: super::bucket_draw::BucketScratch,
    /// llama.cpp's top 256 in its order, and their buckets ([`top_p_order`]).
    top_p_order: Vec<TokenData>,
    top_p_buckets: Vec<u8>,
    /// The row's descending entries [`sorted_prefix`] popped, kept across `top_p;dist`'s tries.
    prefix: PrefixCache,
    /// transformers' `top_p;dist` with the cut among the least likely tokens
    /// ([`crate::convention::transformers::bottom`]).
    pub(crate) bottom: crate::convention::transformers::bottom::BottomScratch,
    /// How far below the maximum every block's weights lie ([`NearSums`]).
    rungs: Vec<u8>,
    /// `far_at[k]`: the bound [`NearSums::widen`] gives the blocks on rungs `>= k` together.
    far_at: Vec<f64>,
    /// Indices of the blocks [`NearSums::widen`] exponentiates.
    near: Vec<u32>,
    /// Per-block sums of the cheap upper bounds of the weights ([`NearSums`]' middle tier).
    cheap: Vec<f32>,
    /// Per block, the group ([`group`]) of its cheap sum while [`NearSums`] holds it at its
    /// cheap estimate, else [`NOT_CHEAP`].
    cheap_group: Vec<u8>,
    /// [`CheapTier`]'s group sums (four interleaved sets of 256), kept here so that a tier
    /// neither zeroes nor moves 8 KiB per draw: only `cheap_live` (the last tier's range of
    /// groups, `lowest..above`) may be nonzero.
    cheap_groups: Vec<[f64; 256]>,
    cheap_live: (usize, usize),
    /// The row with the leading edits written into it ([`prepare_patched`]).
    pub(crate) patched: Vec<f32>,
    /// How many leading stages the row the fast paths read already reflects: 0, or the
    /// stages written into [`Scratch::patched`]. Their fallbacks fill the candidates from
    /// that row and run only the stages after these.
    pub(crate) row_applied: usize,
    /// The summary of the row of the last [`prepare`], while it is known valid.
    pub(crate) summary: Option<Summary>,
    /// Which path the last [`prepare`] took (for tests and benchmarks).
    pub(crate) path: Path,
    /// llama-server's summation order for raw logprobs.
    pub(crate) server_order: crate::logprobs::ServerOrder,
    /// Gathers the entries of `top_p;dist`'s exact softmax sum past the maximum's block
    /// ([`arch::exp_sum_sequential_below`]); grown in [`certain_top_p_draw`], which every such
    /// draw runs first, so that the exact sum never allocates.
    collector: arch::Collector,
    /// Recent `(need, max - threshold)` pairs of [`threshold`], so that the next row (similar
    /// to the last) usually gets its threshold from one counting pass.
    gaps: [(usize, f32); 4],
    /// [`lower_block_maxima`]'s edited tokens, sorted, and the blocks it lowered with their
    /// row maxima.
    edited_ids: Vec<u32>,
    lowered_blocks: Vec<(u32, f32)>,
    /// Whether the last [`gather_top_lowered`] needed the lowered maxima, and the gap that
    /// gave its `tau` there.
    lowered_last: bool,
    lowered_gap: f32,
}

/// Which path the last sampling call took (see [`Chain::last_path`](crate::Chain::last_path)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Path {
    /// No fast path applies to this chain: the candidate array was built.
    #[default]
    Array,
    /// The named stage ran on the row in place (or selected from it).
    Fast(&'static str),
    /// The named stage's fast path could not prove its result; the array path ran.
    Fallback(&'static str),
}

/// What [`prepare`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Prepared {
    /// The candidates are built and the first `applied` stages have run on them.
    Built {
        /// How many stages have run.
        applied: usize,
    },
    /// A selecting stage chose this token from the row; the candidates hold only it.
    Selected(u32),
}

/// Whether [`prepare`] must leave the full candidate set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Need {
    /// `apply`, processed logprobs: the candidates are observed.
    Candidates,
    /// `sample`: only the token is.
    Token,
}

/// Validates `row`, then either runs the chain's leading stages on the row in place (see the
/// module docs) or builds the candidate array exactly as [`Candidates::fill`] does. Errors as
/// `fill` (empty row, NaN or `+inf`), leaving the candidates empty, and as the stages.
pub(crate) fn prepare(
    stages: &mut [Stage],
    row: Logits<'_>,
    c: &mut Candidates,
    s: &mut Scratch,
    need: Need,
) -> Result<Prepared> {
    s.summary = None;
    s.path = Path::Array;
    s.widened_now = false;
    if row.is_empty() {
        c.begin(0);
        return Err(Error::empty_row());
    }
    if greedy_first(stages, need) {
        // A half-precision row is summarized part by part without being kept: `greedy` reads
        // only the maximum's block.
        let summary = match row {
            Logits::F32(_) => None,
            Logits::F16(h) => arch::summarize_f16(h, &mut s.block_max),
            Logits::Bf16(b) => arch::summarize_bf16(b, &mut s.block_max),
        };
        if let Some(summary) = summary {
            return greedy_half(row, summary, s, c).map(Prepared::Selected);
        }
    }
    s.widened_now = !matches!(row, Logits::F32(_));
    let mut widened = std::mem::take(&mut s.widened);
    // PERF: element by element through `Logits::for_each`, widening cost ~50x the floor at
    // V = 128k; the arch kernels convert 8 values per instruction, and summarize each part of
    // the widened row while it is in L1 (one pass over memory instead of two).
    let (r, summary): (&[f32], _) = match row {
        Logits::F32(r) => (r, None),
        _ => {
            let (summary, at) = arch::widen_summarize_aligned(row, &mut widened, &mut s.block_max)
                .expect("a half-precision row widens");
            s.widened_at = at.clone();
            (&widened[at], Some(summary))
        }
    };
    let out = prepare_f32(stages, row, (r, summary), c, s, need);
    s.widened = widened;
    out
}

/// [`prepare`] on the row as f32, with its [`arch::summarize`] when the widening computed it
/// (`s.block_max` holding the block maxima then).
fn prepare_f32(
    stages: &mut [Stage],
    row: Logits<'_>,
    (r, known): (&[f32], Option<arch::Summary>),
    c: &mut Candidates,
    s: &mut Scratch,
    need: Need,
) -> Result<Prepared> {
    // `greedy` first (so no overlay) when sampling needs only the maximum and its block:
    // [`arch::locate_max`] skips the block maxima (`s.block_max` is left empty; raw logprobs
    // compute them if asked). transformers' `greedy` on an unprocessed row is the same scan:
    // the lowest id among the maxima.
    if greedy_first(stages, need) {
        let summary = match known {
            Some(summary) => summary,
            None => {
                s.block_max.clear(); // not computed: `raw_logprobs` fills it if asked
                arch::locate_max(r)
            }
        };
        start_greedy(row, summary, s, c)?;
        return greedy(r, summary, s, c).map(Prepared::Selected);
    }
    let plan = patch_plan(stages);
    // For `apply` too: the candidates are llama.cpp's, in its order. Where it declines after
    // summarizing the row, that summary serves below.
    let mut known = known;
    if let Some(done) = plan.and_then(|plan| divided_first(stages, plan, (r, &mut known), c, s)) {
        return Ok(done);
    }
    if need == Need::Token {
        if let Some(plan) = plan {
            return prepare_patched(stages, plan, row, r, c, s, need);
        }
        // transformers' leading edits written into a copy: its summary serves, and the row's
        // own would be a second pass.
        if let Some(after) = transformers::row::patch_from_start(stages) {
            if let Some(done) = transformers::row::prepare_patched(stages, (0, after), r, s, c)? {
                return Ok(done);
            }
            s.path = Path::Array;
            if let Err(e) = row.validate() {
                c.begin(0);
                return Err(e);
            }
            return Ok(array(r, 0, c));
        }
    }
    let summary = match known {
        Some(summary) => summary,
        None => arch::summarize(r, &mut s.block_max),
    };
    if summary.suspect {
        if let Err(e) = row.validate() {
            c.begin(0);
            return Err(e);
        }
    }
    s.summary = Some(summary);

    s.overlay.clear();
    if need == Need::Token {
        if let Some((pen, first)) = lowering_penalties(stages) {
            if let Some(done) = top_k_dist(stages, first, r, s, c, Some(pen))? {
                return Ok(done);
            }
        }
    }
    let first = build_overlay(stages, r, s);
    if s.overlay.iter().any(|e| e.1.is_nan()) {
        c.fill_validated(r);
        return Ok(Prepared::Built { applied: 0 });
    }
    dispatch(stages, first, r, summary, c, s, need)
}

/// The overlay (`s.overlay`, empty) of the chain's leading `penalties` and `logit_bias`
/// stages (inert ones skipped) on `r`; returns the index of the first stage after them.
fn build_overlay(stages: &[Stage], r: &[f32], s: &mut Scratch) -> usize {
    let mut first = 0;
    while let Some(stage) = stages.get(first) {
        match stage {
            _ if stage.is_inert() => {}
            Stage::Penalties(pen) if s.overlay.is_empty() => penalties_overlay(pen, r, s),
            Stage::Penalties(pen) => {
                for (token, count) in pen.counts() {
                    if (token as usize) < r.len() {
                        let slot = overlay_slot(&mut s.overlay, token, r);
                        *slot = pen.penalised(*slot, count);
                    }
                }
            }
            Stage::LogitBias(bias) => {
                for &(id, b) in bias.entries() {
                    if let Ok(token) = u32::try_from(id) {
                        if (token as usize) < r.len() {
                            *overlay_slot(&mut s.overlay, token, r) += b;
                        }
                    }
                }
            }
            _ => break,
        }
        first += 1;
    }
    first
}

/// What [`prepare_patched`] writes into its copy of the row: the leading edits' overlay, then
/// a division by `div` (a temperature; 1 for none), for the stages from `first` on.
#[derive(Clone, Copy, Debug)]
struct PatchPlan {
    first: usize,
    div: f32,
}

/// The chain's leading edits (`penalties`, `logit_bias`) and temperature (`t > 0`), inert
/// stages aside, when a fast path needs them written into the row: edits followed by a stage
/// whose fast path reads the row without an overlay (`top_p`, and the `dist` paths with what
/// may come before them; those of `top_k`, `min_p` and `greedy` read row + overlay), or a
/// temperature (after any edits) followed by `top_p`, `top_k` or `min_p`, whose fast paths
/// read the row with no temperature before them (`dist`'s reads it with one). `None`
/// otherwise.
fn patch_plan(stages: &[Stage]) -> Option<PatchPlan> {
    // `temperature`: where the leading temperature is, and its divisor.
    let (mut edits, mut temperature) = (false, None);
    for (i, stage) in stages.iter().enumerate().filter(|(_, st)| !st.is_inert()) {
        match (stage, temperature) {
            (Stage::Penalties(_) | Stage::LogitBias(_), None) => edits = true,
            (Stage::Temperature(t), None) if t.t() > 0.0 => temperature = Some((i, t.t())),
            // Mirostat divides what it reads of the row itself ([`mirostat`], from `dispatch`).
            (Stage::Mirostat(_) | Stage::MirostatV2(_), Some(_)) if !edits && arch::Collector::available() => {
                return None
            }
            (
                Stage::TopP(_) | Stage::TopK(_) | Stage::MinP(_) | Stage::Mirostat(_) | Stage::MirostatV2(_),
                Some((_, div)),
            ) => return Some(PatchPlan { first: i, div }),
            (Stage::TopK(_) | Stage::MinP(_) | Stage::Greedy(_), None) => return None,
            (_, None) if edits => return Some(PatchPlan { first: i, div: 1.0 }),
            // The temperature stays a stage (`dist` reads the row through it).
            (_, Some((at, _))) if edits => return Some(PatchPlan { first: at, div: 1.0 }),
            _ => return None,
        }
    }
    None
}

/// `temperature(t);top_k(k)` ([`divided_first`]) without the copy: `top_k` on the
/// divided row keeps the `k` largest of `fl32(x / t)`, which the division (monotone) takes
/// from the `k` largest raw entries. That is llama.cpp's result, in its order, when those
/// divided values are distinct and the largest dropped one lies strictly below them (distinct
/// logits may divide to equal values); then the candidates are the divided top `k`, sorted.
/// `None` otherwise (ties), for the copy.
///
/// PERF: the copy divides every entry (a division and a store per entry): 31 µs for
/// `temperature(0.8);top_k(40);top_p;min_p;dist` at V = 128,256 on Zen 4, against 6 µs with
/// the temperature last.
fn divided_top_k(k: usize, plan: PatchPlan, r: &[f32], c: &mut Candidates, s: &mut Scratch) -> Option<Prepared> {
    if rank_top(k, r, s, None) != Some(true) {
        return None;
    }
    let div = plan.div;
    let (g, keys) = (&s.gathered, &s.gathered_ranks);
    let raw = |i: usize| g[keys[i] as u32 as usize].logit;
    // The largest dropped entry divided: the (k+1)-th ranked, or below the least kept (every
    // entry not gathered is).
    let dropped = if keys.len() > k { raw(k) / div } else { raw(k - 1).next_down() / div };
    let distinct = (1..k).all(|i| raw(i - 1) / div != raw(i) / div) && raw(k - 1) / div > dropped;
    if !distinct {
        return None;
    }
    c.begin(r.len());
    c.data.extend(keys[..k].iter().map(|&key| {
        let t = g[key as u32 as usize];
        TokenData { logit: t.logit / div, ..t }
    }));
    c.sorted = true;
    s.path = Path::Fast("top-k (divided)");
    Some(Prepared::Built { applied: plan.first + 1 })
}

/// A leading `temperature(t)` (`plan`, from [`patch_plan`]; inert stages aside, nothing else
/// before it) read through instead of divided into a copy of the row, where the stage after it
/// is `top_k(k <= 128)` ([`divided_top_k`]) or `min_p` ([`divided_min_p`]) and the row is
/// NaN-free with a finite divided maximum: the row's summary (into `s`, no overlay, and into
/// `known` if it was not there), then that stage's path. `None` (nothing observable done) for
/// the copy.
fn divided_first(
    stages: &[Stage],
    plan: PatchPlan,
    (r, known): (&[f32], &mut Option<Summary>),
    c: &mut Candidates,
    s: &mut Scratch,
) -> Option<Prepared> {
    let only_temperature =
        stages[..plan.first].iter().filter(|st| !st.is_inert()).all(|st| matches!(st, Stage::Temperature(_)));
    let top_k = match stages.get(plan.first) {
        Some(Stage::TopK(t)) => Some((t.k() as usize).min(r.len())),
        Some(Stage::MinP(_)) => None,
        _ => return None,
    };
    if plan.div == 1.0 || !only_temperature || top_k.is_some_and(|k| k == 0 || k > 128) {
        return None;
    }
    let summary = *known.get_or_insert_with(|| arch::summarize(r, &mut s.block_max));
    let max = summary.max / plan.div;
    if summary.suspect || !max.is_finite() {
        return None;
    }
    s.summary = Some(summary);
    s.overlay.clear();
    match (&stages[plan.first], top_k) {
        (_, Some(k)) => divided_top_k(k, plan, r, c, s),
        (Stage::MinP(m), None) => divided_min_p(m.params(), max, plan, r, c, s),
        _ => None,
    }
}

/// `temperature(t);min_p(p, min_keep)` ([`divided_first`]; `max` the divided maximum) without
/// the copy: llama.cpp's unsorted `min_p` keeps, in row order, the entries whose divided logit
/// `fl32(x / t)` reaches `fl32(max + logf(p))`; they are gathered from the raw row above a raw bound
/// ([`raw_bound`](crate::logprobs::raw_bound)), divided and tested. `None` where that path would
/// not succeed (no survivor, fewer than `min_keep`), and where a quarter of the blocks reach the
/// bound (a nearly flat row: the copy's path draws from the row when every entry survives).
fn divided_min_p(
    (p, min_keep): (f32, usize),
    max: f32,
    plan: PatchPlan,
    r: &[f32],
    c: &mut Candidates,
    s: &mut Scratch,
) -> Option<Prepared> {
    let min_logit = max + p.ln();
    let raw = crate::logprobs::raw_bound(min_logit, plan.div);
    if min_logit.is_nan() || arch::count_ge(&s.block_max, raw) * 4 > s.block_max.len() {
        return None;
    }
    gather_at_least(r, &s.block_max, &[], raw, &mut s.gathered, &mut s.blocks);
    let div = plan.div;
    s.gathered.iter_mut().for_each(|t| t.logit /= div);
    s.gathered.retain(|t| t.logit >= min_logit);
    let n = s.gathered.len();
    if n == 0 || n < min_keep {
        return None;
    }
    c.begin(r.len());
    c.data.extend_from_slice(&s.gathered);
    s.path = Path::Fast("min-p (divided)");
    Some(Prepared::Built { applied: plan.first + 1 })
}

/// [`dispatch`] on a copy of the row with the overlay's edits written into it (and divided by
/// a leading temperature: [`patch_plan`]), for the paths that read the row without them, where
/// the chain's leading edits (`penalties`, `logit_bias` before `top_p`, `temperature` or
/// `dist`), or a temperature before `top_p`, `top_k` or `min_p`, would otherwise send it to
/// the candidate array. The copy, with the values the array path computes, is the row those
/// paths see; their fallbacks fill the candidates from it and run the stages after the edits
/// ([`Scratch::row_applied`]). The summary of the copy is dropped afterwards: raw logprobs
/// read the input row.
///
/// PERF: the copy and its summary are one pass ([`arch::patch_summarize`]); the candidate array
/// they replace cost 300 µs a token at V = 32,000 and 930 µs at 128,256 (`penalties` before
/// `top_p(0.95);min_p(0.05);temperature(0.8);dist`, about 250 and 110 times the floor).
fn prepare_patched(
    stages: &mut [Stage],
    PatchPlan { first, div }: PatchPlan,
    row: Logits<'_>,
    r: &[f32],
    c: &mut Candidates,
    s: &mut Scratch,
    need: Need,
) -> Result<Prepared> {
    s.overlay.clear();
    build_overlay(stages, r, s);
    let mut patched = std::mem::take(&mut s.patched);
    // The overlay's edits are taken from the row's values: a NaN there is the row's, or an
    // edit's that the array path would meet too (the row is validated below either way).
    let summary = if s.overlay.iter().any(|e| e.1.is_nan()) {
        None
    } else {
        Some(arch::patch_summarize(r, &s.overlay, div, &mut patched, &mut s.block_max))
    };
    s.overlay.clear();
    let out = match summary {
        Some(summary) if !summary.suspect && summary.max > f32::NEG_INFINITY => {
            s.summary = Some(summary);
            s.row_applied = first;
            let out = dispatch(stages, first, &patched, summary, c, s, need);
            s.row_applied = 0;
            out
        }
        _ => match row.validate() {
            // NaN or `+inf` in the row.
            Err(e) => {
                c.begin(0);
                Err(e)
            }
            // An edit made NaN or `+inf` (a bias), or masked every entry: the array path.
            Ok(()) => {
                s.path = Path::Array;
                Ok(array(r, 0, c))
            }
        },
    };
    // Raw logprobs read the input row, not this summary of the patched one.
    s.summary = None;
    s.patched = patched;
    out
}

/// The fast path for the stages from `first` on `r` (summarised as `summary`, the block
/// maxima in `s`), given the overlay of the stages before `first` in `s`; the candidate
/// array where none applies.
fn dispatch(
    stages: &mut [Stage],
    first: usize,
    r: &[f32],
    summary: Summary,
    c: &mut Candidates,
    s: &mut Scratch,
    need: Need,
) -> Result<Prepared> {
    if let Some(Stage::Xtc(x)) = stages.get_mut(first) {
        if need == Need::Token && !x.is_inert() && r.len() >= 2 {
            return xtc(stages, first, r, summary, c, s);
        }
    }
    if need == Need::Token && s.overlay.is_empty() {
        if let Some(done) = top_p_dist(stages, first, r, summary, s, c)? {
            return Ok(done);
        }
    }
    // `min_p` that keeps every entry leaves the array as llama.cpp fills it: the rest of the
    // chain runs as if it came first (on nearly flat rows, `[temperature;] dist` then draws
    // from the row instead of an array of the whole vocabulary).
    if let Some(Stage::MinP(m)) = stages.get(first) {
        if need == Need::Token && s.overlay.is_empty() && min_p_keeps_all(m.params(), r, summary, s) {
            if let Some(done) = dist(stages, first + 1, r, summary, s, c)? {
                if let Prepared::Built { .. } = done {
                    s.path = Path::Fallback("dist");
                }
                return Ok(done);
            }
        }
    }
    if need == Need::Token {
        if let Some(done) = top_k_dist(stages, first, r, s, c, None)? {
            return Ok(done);
        }
    }
    if let Some((at, div)) = temperature_then_mirostat(stages, first).filter(|_| s.overlay.is_empty()) {
        if let Some(done) = mirostat(stages, at, r, summary, div, s, c, need)? {
            return Ok(done);
        }
        s.path = Path::Fallback(stages[at].name());
        return Ok(array(r, s.row_applied, c));
    }
    let done = match stages.get(first) {
        Some(Stage::TopK(t)) => top_k(t.k() as usize, r, s, c),
        Some(Stage::MinP(m)) => {
            let (p, min_keep) = m.params();
            min_p(p, min_keep, r, summary, s, c)
        }
        Some(Stage::TopP(t)) if s.overlay.is_empty() => {
            let (p, min_keep) = t.params();
            if let Some(min_p) = tail_after_top_p(need, &stages[first + 1..]) {
                if top_p_bounded((p, min_keep), min_p, r, summary, s, c) {
                    s.path = Path::Fast("top-p (bounded sum)");
                    return Ok(Prepared::Built { applied: first + 1 });
                }
            }
            top_p(p, min_keep, r, summary, s, c)
        }
        Some(Stage::Mirostat(_) | Stage::MirostatV2(_)) if s.overlay.is_empty() => {
            if let Some(done) = mirostat(stages, first, r, summary, 1.0, s, c, need)? {
                return Ok(done);
            }
            s.path = Path::Fallback(stages[first].name());
            return Ok(array(r, s.row_applied, c));
        }
        Some(stage)
            if need == Need::Token && s.overlay.is_empty() && stage.convention() == Convention::Transformers =>
        {
            let from = s.row_applied;
            return Ok(transformers::row::prepare(stages, first, r, s, c)?.unwrap_or_else(|| array(r, from, c)));
        }
        Some(Stage::TopNSigma(t)) if need == Need::Token && s.overlay.is_empty() && !t.is_inert() => {
            top_n_sigma(t.n(), &stages[first + 1..], r, s, c)
        }
        Some(Stage::Greedy(_)) if need == Need::Token => {
            s.path = Path::Fast("greedy");
            return greedy(r, summary, s, c).map(Prepared::Selected);
        }
        Some(_) if need == Need::Token && s.overlay.is_empty() => {
            if let Some(done) = dist(stages, first, r, summary, s, c)? {
                if let Prepared::Built { .. } = done {
                    s.path = Path::Fallback("dist");
                }
                return Ok(done);
            }
            return Ok(array(r, s.row_applied, c));
        }
        _ => return Ok(array(r, s.row_applied, c)),
    };
    let name = stages[first].name();
    if done {
        s.path = Path::Fast(name);
        Ok(Prepared::Built { applied: first + 1 })
    } else {
        s.path = Path::Fallback(name);
        Ok(array(r, s.row_applied, c))
    }
}

/// `temperature(t)` at `first` (`t > 0`) and `mirostat` or `mirostat_v2` next (inert stages
/// aside): the mirostat stage's index and `t`, where [`mirostat`] can divide its reads of the
/// row itself ([`arch::Collector`] available; [`patch_plan`] leaves these chains to it).
fn temperature_then_mirostat(stages: &[Stage], first: usize) -> Option<(usize, f32)> {
    let Some(Stage::Temperature(t)) = stages.get(first) else { return None };
    let at = stages.iter().skip(first + 1).position(|st| !st.is_inert())? + first + 1;
    let usable = t.t() > 0.0 && arch::Collector::available();
    (usable && matches!(stages[at], Stage::Mirostat(_) | Stage::MirostatV2(_))).then_some((at, t.t()))
}

/// `xtc` first when sampling: its draw, made here as its `apply` would make it (the array holds
/// the whole row, so at least two candidates). When the draw leaves the stage out, the row is
/// what llama.cpp's array would be after it (the leading edits left no overlay), and the rest
/// of the chain takes its own path on it, every fallback starting after `xtc`
/// ([`Scratch::row_applied`]); otherwise the array path, with the draw made. `xtc` applies
/// with chance `probability` (llama.cpp's usual 0.5 or less), so most tokens skip the array.
fn xtc(
    stages: &mut [Stage],
    first: usize,
    r: &[f32],
    summary: Summary,
    c: &mut Candidates,
    s: &mut Scratch,
) -> Result<Prepared> {
    let Stage::Xtc(x) = &mut stages[first] else { unreachable!("dispatch matched xtc") };
    let chance = x.draw();
    // With an overlay, `r` does not reflect the edits before `xtc`: the array path runs them.
    if !x.fires(chance) && s.overlay.is_empty() {
        let before = s.row_applied;
        s.row_applied = first + 1;
        let out = dispatch(stages, first + 1, r, summary, c, s, Need::Token);
        s.row_applied = before;
        return out;
    }
    c.fill_validated(r);
    for stage in &mut stages[s.row_applied..first] {
        stage.apply(c)?;
    }
    let Stage::Xtc(x) = &stages[first] else { unreachable!("dispatch matched xtc") };
    x.apply_drawn(c, chance);
    s.path = Path::Fallback("xtc");
    Ok(Prepared::Built { applied: first + 1 })
}

/// The array path: the candidates exactly as [`Candidates::fill`] builds them from `r`, which
/// reflects the first `applied` stages ([`Scratch::row_applied`]).
fn array(r: &[f32], applied: usize, c: &mut Candidates) -> Prepared {
    c.fill_validated(r);
    Prepared::Built { applied }
}

/// The first edits of the overlay (empty): `pen`'s, each token once, appended and then sorted
/// once rather than inserted one by one in order.
fn penalties_overlay(pen: &Penalties, r: &[f32], s: &mut Scratch) {
    let seen = pen.counts().filter(|&(token, _)| (token as usize) < r.len());
    s.overlay.extend(seen.map(|(token, count)| (token, pen.penalised(r[token as usize], count))));
    s.overlay.sort_unstable_by_key(|e| e.0);
    debug_assert!(s.overlay.windows(2).all(|w| w[0].0 < w[1].0), "a token counted twice");
}

/// `(i, first)` when the chain's leading stages (inert ones aside) are a `penalties` at `i`
/// that lowers every logit it edits ([`Penalties::lowers`]: common's, and any `repeat >= 1`
/// with no negative frequency or presence penalty), then the `top_k` at `first`. Its edits
/// are then read off the gathered entries ([`gather_top_lowered`]) instead of an overlay of
/// the whole window.
///
/// PERF: the overlay costs a load, an edit and a merge per token of the window, every step: a
/// window of the whole context (`last_n = -1` in llama-server, or thousands of tokens) made
/// that the largest part of the step.
fn lowering_penalties(stages: &[Stage]) -> Option<(usize, usize)> {
    let mut live = stages.iter().enumerate().filter(|(_, st)| !st.is_inert());
    match (live.next(), live.next()) {
        (Some((i, Stage::Penalties(pen))), Some((first, Stage::TopK(_)))) if pen.lowers() => Some((i, first)),
        _ => None,
    }
}

/// The `penalties` stage at `i` ([`lowering_penalties`]).
fn penalties_at(stages: &[Stage], i: usize) -> Option<&Penalties> {
    match stages.get(i) {
        Some(Stage::Penalties(pen)) => Some(pen),
        _ => None,
    }
}

/// The overlay's logit for `token`, inserted (from the row) if it has none yet.
fn overlay_slot<'o>(overlay: &'o mut Vec<(u32, f32)>, token: u32, r: &[f32]) -> &'o mut f32 {
    let at = match overlay.binary_search_by_key(&token, |e| e.0) {
        Ok(at) => at,
        Err(at) => {
            overlay.insert(at, (token, r[token as usize]));
            at
        }
    };
    &mut overlay[at].1
}

/// The `need`-th largest of `values` (`need >= 1`), by a bounded min-heap (or a selection for
/// large `need`); `None` when there are fewer values. Leaves the `need` largest values in
/// `heap` (in no particular order).
fn nth_largest(values: &[f32], need: usize, heap: &mut Vec<f32>) -> Option<f32> {
    if need == 0 || need > values.len() {
        return None;
    }
    heap.clear();
    if need > 128 {
        // A bounded heap costs O(n log need) here; selection is linear.
        heap.extend_from_slice(values);
        let (_, &mut nth, _) = heap.select_nth_unstable_by(need - 1, |a, b| b.total_cmp(a));
        heap.truncate(need);
        return Some(nth);
    }
    for &v in values {
        if heap.len() < need {
            heap.push(v);
            let mut i = heap.len() - 1;
            while i > 0 {
                let parent = (i - 1) / 2;
                if heap[parent] <= heap[i] {
                    break;
                }
                heap.swap(parent, i);
                i = parent;
            }
        } else if v > heap[0] {
            heap[0] = v;
            let mut i = 0;
            loop {
                let (l, r) = (2 * i + 1, 2 * i + 2);
                let mut smallest = i;
                if l < need && heap[l] < heap[smallest] {
                    smallest = l;
                }
                if r < need && heap[r] < heap[smallest] {
                    smallest = r;
                }
                if smallest == i {
                    break;
                }
                heap.swap(i, smallest);
                i = smallest;
            }
        }
    }
    Some(heap[0])
}

/// A `tau` with at least `need` block maxima `>= tau` (so at most the `need`-th largest),
/// without many more than `need` (every extra block is gathered, 64 entries each); `None`
/// when there are fewer than `need` blocks. Tries `max - gap` with the gap that worked for
/// this `need` before, counting with one SIMD pass over the block maxima (a few percent of
/// the row's cost), then bisects the gap a few times; selects exactly if that does not settle.
fn threshold(need: usize, max: f32, s: &mut Scratch) -> Option<f32> {
    threshold_near(need, max, None, s)
}

/// [`threshold`], starting from the gap `seed` if given, which is then not remembered either
/// (a `need` met once, whose gap would push out one that recurs).
fn threshold_near(need: usize, max: f32, seed: Option<f32>, s: &mut Scratch) -> Option<f32> {
    let blocks = s.block_max.len();
    if need == 0 || need > blocks {
        return None;
    }
    let slot = s.gaps.iter().position(|g| g.0 == need);
    let mut gap = seed.or(slot.map(|i| s.gaps[i].1)).unwrap_or(4.0);
    let keep = seed.is_none();
    if need * 4 <= blocks && max.is_finite() {
        // Gaps known to give too few (`lo`) and too many (`hi`) blocks.
        let (mut lo, mut hi) = (0.0f32, f32::INFINITY);
        for _ in 0..10 {
            let tau = max - gap;
            let n = arch::count_ge(&s.block_max, tau);
            if n >= need && n <= need + need / 4 + 8 {
                if keep {
                    remember(s, slot, need, gap);
                }
                return Some(tau);
            }
            if n < need {
                lo = gap;
            } else {
                hi = gap;
            }
            gap = if hi.is_finite() { 0.5 * (lo + hi) } else { gap * 2.0 };
        }
    }
    let tau = nth_largest(&s.block_max, need, &mut s.heap)?;
    if keep && max.is_finite() && tau.is_finite() {
        remember(s, slot, need, (max - tau).max(1e-6));
    }
    Some(tau)
}

/// A `tau` with at least `need` entries of the row `r` `>= tau`, and usually not many more:
/// `max - gap` for the gap that worked for this `need` before, checked by one counting pass
/// over the row, else bisected (a pass each). `None` when the row has fewer than `need`
/// entries or its maximum is not finite.
fn row_threshold(need: usize, max: f32, r: &[f32], s: &mut Scratch) -> Option<f32> {
    if need == 0 || need > r.len() || !max.is_finite() {
        return None;
    }
    let slot = s.gaps.iter().position(|g| g.0 == need);
    let Some(hi) = arch::settle_gap(r, need, max, slot.map_or(4.0, |i| s.gaps[i].1)) else {
        // Even every finite entry may not be enough: -inf entries count only at -inf.
        return (arch::count_ge(r, f32::NEG_INFINITY) >= need).then_some(f32::NEG_INFINITY);
    };
    remember(s, slot, need, hi);
    Some(max - hi)
}

fn remember(s: &mut Scratch, slot: Option<usize>, need: usize, gap: f32) {
    let i = slot.unwrap_or_else(|| s.gaps.iter().position(|g| g.0 == 0).unwrap_or(need % 4));
    s.gaps[i] = (need, gap);
}

/// Every entry of row + overlay with logit `>= tau`, in id order, into `out` (cleared);
/// `blocks` is scratch.
pub(crate) fn gather_at_least(
    r: &[f32],
    block_max: &[f32],
    overlay: &[(u32, f32)],
    tau: f32,
    out: &mut Vec<TokenData>,
    blocks: &mut Vec<TokenData>,
) {
    out.clear();
    arch::gather_blocks_ge(r, block_max, tau, out);
    if !overlay.is_empty() {
        // Merge in id order (both are sorted): an edited entry replaces the row's, and is
        // kept only if its edited value reaches `tau`.
        blocks.clear();
        let mut edits = overlay.iter().peekable();
        for t in out.iter() {
            let mut replaced = false;
            while let Some(&(id, logit)) = edits.next_if(|e| e.0 <= t.id) {
                replaced |= id == t.id;
                if logit >= tau {
                    blocks.push(TokenData { id, logit, p: 0.0 });
                }
            }
            if !replaced {
                blocks.push(*t);
            }
        }
        blocks.extend(edits.filter(|e| e.1 >= tau).map(|&(id, logit)| TokenData { id, logit, p: 0.0 }));
        std::mem::swap(out, blocks);
    }
}

/// A superset of the `k` largest entries of row + overlay (all entries `>= tau` for a `tau`
/// at most the k-th largest), or `None` when there are too few blocks to bound it.
///
/// `tau` is the `(k + e)`-th largest block maximum where at most `e` overlay entries have a
/// row value `>= tau` and an edited value below it: of the `k + e` blocks reaching `tau`, at
/// most `e` may have lost their only entry `>= tau` to an edit, so `k` blocks still hold one.
/// Usually `e = 0`: penalties lower a sampled (large) logit only a little, and it stays
/// above `tau`; otherwise `e` is the number of entries the first round caught, and if that
/// does not settle, every lowered entry. Returns `tau`.
pub(crate) fn gather_top(k: usize, r: &[f32], s: &mut Scratch) -> Option<f32> {
    let max = s.summary.map_or(f32::NEG_INFINITY, |m| m.max);
    // `seed`: the gap a round that allows only for the first round's catch starts from.
    let (mut extra, mut round, mut seed) = (0, 0, None);
    loop {
        let need = k + extra;
        let tau = threshold_for(need, max, seed, r, s)?;
        let large = s.overlay.iter().filter(|e| r[e.0 as usize] >= tau && e.1 < tau).count();
        if large <= extra {
            gather_at_least(r, &s.block_max, &s.overlay, tau, &mut s.gathered, &mut s.blocks);
            debug_assert!(s.gathered.len() >= k);
            return Some(tau);
        }
        // A lower `tau` may catch more lowered entries, so a round that counts all of them is
        // the last: `large` never exceeds that, whatever `tau`. Where the first round caught
        // only a few of them (a quarter at most), the second allows for just those first:
        // every block gathered beyond the `k` costs a read of 64 entries. On the real row with
        // llama.cpp's penalties (1 to 4 of 25 lowered entries caught at 32k) that gathers 55
        // blocks instead of 71 (the chain: 3.1 -> 2.9 µs at 32k, 7.6 -> 6.9 at 128k). Its
        // `need` varies from token to token, so its search starts from the first round's gap
        // and is not remembered (remembered, it pushed out the gaps that recur: a nearly flat
        // row took 8 -> 18 µs at 128k). PERF: where the first round caught many (a nearly flat
        // row: about 30 of 64), the second allowing for just those cost 8 -> 9 µs at 128k: a
        // lower `tau` catches more again there.
        round += 1;
        let lowered = s.overlay.iter().filter(|e| e.1 < r[e.0 as usize]).count();
        (extra, seed) =
            if round == 1 && large * 4 <= lowered { (large, Some((max - tau).max(1e-6))) } else { (lowered, None) };
    }
}

/// The entries of row + edits at or above `tau`, in id order, into `s.gathered`, where the
/// edits only lower entries: `edit(id, z)` is the edited logit (at most `z`) of an edited token
/// whose row logit is `z`, `None` for an untouched one. None below `tau` rises to it, so the
/// row's entries are gathered, each edited one lowered, and those an edit takes below `tau`
/// dropped; returns how many were dropped. One lookup per gathered entry, whatever the
/// number of edits.
pub(crate) fn gather_lowered(r: &[f32], tau: f32, s: &mut Scratch, edit: &impl Fn(u32, f32) -> Option<f32>) -> usize {
    gather_at_least(r, &s.block_max, &[], tau, &mut s.gathered, &mut s.blocks);
    let before = s.gathered.len();
    s.gathered.retain_mut(|t| {
        if let Some(z) = edit(t.id, t.logit) {
            debug_assert!(z <= t.logit, "an edit raised token {}", t.id);
            t.logit = z;
        }
        t.logit >= tau
    });
    before - s.gathered.len()
}

/// [`gather_top`] for row + edits that only lower entries ([`gather_lowered`]): a superset of
/// its `k` largest entries, all those at or above the returned `tau`, into `s.gathered`.
/// `edited` lists every token the edits may touch (repeats and ids past the row allowed).
///
/// The first round takes `tau` from the row's block maxima, as if nothing were edited: right
/// where the edits took few of the top entries away (a peaked row, whose sampled tokens stay
/// near the top after a penalty). Where that left fewer than `k` and the edited tokens are few
/// (at most [`LOWER_MAX`]: llama.cpp's usual window of 64, a short history), the maxima of
/// the blocks whose maximum an edit lowered are set to those of row + edits
/// ([`lower_block_maxima`]) for a second round, which then holds `k` (each of `k` blocks
/// reaching `tau` has an entry of row + edits there). On a nearly flat row most of the top `k`
/// are recently sampled tokens, pushed far down by a penalty: growing `need` by the drops
/// instead took four rounds and gathered hundreds of entries (13.6 µs a token at V = 32,000
/// with the bench's penalties chain). Many edited tokens are left to the rounds: lowering
/// would read most of the row's blocks, and look up most of its tokens (190 µs a token with
/// 8,000 in the window, against 8 for the rounds).
///
/// The rounds: a `tau` that `need` entries of the row reach holds at least `need - dropped`
/// of row + edits; where that is fewer than `k`, the next `need` is `k + dropped`, more than
/// before (the row had at least `need` entries and kept fewer than `k`), so the search ends
/// (`None` once the row has fewer than `need` entries).
pub(crate) fn gather_top_lowered(
    k: usize,
    r: &[f32],
    s: &mut Scratch,
    edit: impl Fn(u32, f32) -> Option<f32>,
    edited: impl ExactSizeIterator<Item = u32>,
) -> Option<f32> {
    let max = s.summary.map_or(f32::NEG_INFINITY, |m| m.max);
    // Room for a lowering up front, which a later token may be the first to need (no
    // allocation per token after the first).
    s.edited_ids.reserve(LOWER_MAX);
    s.lowered_blocks.reserve(LOWER_MAX);
    let lowerable = edited.len() <= LOWER_MAX && k <= s.block_max.len() && s.block_max.len() == r.len().div_ceil(BLOCK);
    let mut dropped = 0;
    let mut seed = None;
    if !(lowerable && s.lowered_last) {
        let tau = threshold_for(k, max, None, r, s)?;
        dropped = gather_lowered(r, tau, s, &edit);
        s.lowered_last = false;
        if s.gathered.len() >= k {
            return Some(tau);
        }
        seed = Some((max - tau).max(1e-6));
    }
    if lowerable {
        lower_block_maxima(r, s, &edit, edited);
        // Not from the remembered gap, which is the untouched row's, nor remembered.
        let tau = threshold_near(k, max, Some(seed.unwrap_or(s.lowered_gap)), s);
        if let Some(tau) = tau {
            gather_lowered(r, tau, s, &edit);
            s.lowered_gap = (max - tau).max(1e-6);
        }
        // Rows change little from token to token: where an edit took a block that reached
        // `tau` below it, the next row starts with the lowered maxima too.
        let bm = &mut s.block_max;
        s.lowered_last = tau.is_some_and(|tau| s.lowered_blocks.iter().any(|&(b, m)| m >= tau && bm[b as usize] < tau));
        for &(b, m) in &s.lowered_blocks {
            bm[b as usize] = m;
        }
        // `k` blocks reach `tau` with an entry of row + edits: `k` gathered (the rounds
        // below would take over, were that ever not so).
        debug_assert!(tau.is_none() || s.gathered.len() >= k);
        if tau.is_some() && s.gathered.len() >= k {
            return tau;
        }
    }
    let mut need = k + dropped;
    loop {
        let tau = threshold_for(need, max, None, r, s)?;
        let before = need;
        dropped = gather_lowered(r, tau, s, &edit);
        if s.gathered.len() >= k {
            return Some(tau);
        }
        // The second round allows for just the first's drops (a few, usually). Past it, the
        // edits reach deep (a token sampled over and over and penalised by its count, many
        // times over): `need` at least doubles, so the rounds, each a gather of about `need`
        // entries, cost about twice the last. PERF: `k + dropped` at every round took 37 µs a
        // token at V = 32,000 with the bench's chain and a window of 8,192 sampled tokens.
        need = (k + dropped).max(2 * before);
    }
}

/// The most edited tokens [`gather_top_lowered`] lowers block maxima for.
const LOWER_MAX: usize = 256;

/// Lowers the block maxima in `s.block_max` of the blocks whose maximum a token of `edited`
/// holds (ids past the row are skipped) to the maxima of row + edits there, and lists each
/// such block with its row maximum in `s.lowered_blocks`, for the caller to put back. One
/// `edit` per edited token of such a block, and a read of the block.
fn lower_block_maxima(
    r: &[f32],
    s: &mut Scratch,
    edit: &impl Fn(u32, f32) -> Option<f32>,
    edited: impl Iterator<Item = u32>,
) {
    let list = &mut s.edited_ids;
    list.clear();
    list.extend(edited.filter(|&id| (id as usize) < r.len()));
    list.sort_unstable();
    list.dedup();
    s.lowered_blocks.clear();
    let mut at = 0;
    while at < list.len() {
        let b = list[at] as usize / BLOCK;
        let first = at;
        while list.get(at).is_some_and(|&id| id as usize / BLOCK == b) {
            at += 1;
        }
        let ids = &list[first..at];
        if ids.iter().all(|&id| r[id as usize] < s.block_max[b]) {
            // The block's maximum is not edited: it stays.
            continue;
        }
        // The edited entries' new values, and the rest of the block as it is, without them
        // (PERF: writing the edits into a copy of the block and reading it back stalled on
        // store forwarding).
        let start = b * BLOCK;
        let (mut edited_max, mut mask) = (f32::NEG_INFINITY, 0u64);
        for &id in ids {
            let z = r[id as usize];
            edited_max = edited_max.max(edit(id, z).unwrap_or(z));
            mask |= 1 << (id as usize - start);
        }
        let rest = arch::max_except(&r[start..(start + BLOCK).min(r.len())], mask);
        s.lowered_blocks.push((b as u32, s.block_max[b]));
        s.block_max[b] = rest.max(edited_max);
    }
}

/// A `tau` that at least `need` entries of `r` reach, and usually not many more: from the
/// block maxima ([`threshold_near`], from the gap `seed` if given) while there are at least
/// `need` blocks, else counted on the row. `None` when the row has fewer than `need` entries
/// or no finite maximum.
pub(crate) fn threshold_for(need: usize, max: f32, seed: Option<f32>, r: &[f32], s: &mut Scratch) -> Option<f32> {
    if need > s.block_max.len() {
        // More than there are blocks: the block maxima cannot bound it; the row's own values
        // are counted instead.
        row_threshold(need, max, r, s)
    } else {
        threshold_near(need, max, seed, s)
    }
}

/// `top_k(k)` on the untouched row (llama_cpp::top_k: heap select or bucket sort, which for
/// distinct values both leave descending order).
fn top_k(k: usize, r: &[f32], s: &mut Scratch, c: &mut Candidates) -> bool {
    let k = k.min(r.len());
    match rank_top(k, r, s, None) {
        None => false,
        Some(true) => {
            fill_ranked(k, r.len(), s, c);
            true
        }
        // Ties (common in f16/bf16 rows): their order is libstdc++'s, replayed.
        Some(false) => k <= 128 && top_k_by_heap(k, r, s, c),
    }
}

/// Ranks the `k` largest entries of row + overlay (or row + `lowered`'s edits, with no overlay)
/// into `s.gathered_ranks[..k]` (keys into `s.gathered`): descending values, equal values by
/// id. `None` when there are too few blocks
/// to bound them; else whether that is llama.cpp's order, i.e. the kept values are distinct
/// and the first dropped one lies strictly below the last kept.
fn rank_top(k: usize, r: &[f32], s: &mut Scratch, lowered: Option<&Penalties>) -> Option<bool> {
    match lowered {
        Some(pen) => {
            let edit = |id, z| pen.count(id).map(|n| pen.penalised(z, n));
            gather_top_lowered(k, r, s, edit, pen.counts().map(|t| t.0))?
        }
        None => gather_top(k, r, s)?,
    };
    let g = &s.gathered;
    let keys = &mut s.gathered_ranks;
    rank_keys(g, keys);
    if keys.len() > 2 * k {
        keys.select_nth_unstable(k);
        arch::sort_keys(&mut keys[..k]);
    } else {
        // A superset not much larger than k (the usual case): one sort is cheaper than
        // selecting first.
        arch::sort_keys(keys);
    }
    let logit = |i: usize| g[keys[i] as u32 as usize].logit;
    // Distinct kept values, and the first dropped one strictly below the last kept.
    let distinct = (1..k).all(|i| logit(i - 1) != logit(i));
    Some(distinct && !(keys.len() > k && logit(k - 1) == logit(k)))
}

/// The `k` entries [`rank_top`] ranked, in its order, as the candidates of a row of `n`.
fn fill_ranked(k: usize, n: usize, s: &Scratch, c: &mut Candidates) {
    let g = &s.gathered;
    c.begin(n);
    c.data.extend(s.gathered_ranks[..k].iter().map(|&key| g[key as u32 as usize]));
    c.sorted = true;
}

/// `top_k(k)`, then `top_p`, `min_p` or `temperature` stages, then `dist`, when sampling, on a
/// row whose top `k` hold equal values (f16 and bf16 rows are full of them), where
/// [`top_k`] would replay libstdc++'s heap select for their order (about 270 heap insertions
/// at V = 32k). Those stages and `dist`'s draw see the kept values only, in descending
/// order: which of several equal values sits where changes no probability, cut or chosen
/// position, only the token at that position. So the chain runs on the ranking with equal
/// values by id, and the token stands if no other entry of row + overlay holds its value;
/// otherwise the heap select orders the kept entries and the chain runs again with the same
/// draw (the stages before `dist` keep no state). Without ties, just `top_k` (its ranking is
/// llama.cpp's order). `None`: not this chain, or too few blocks to bound the top `k`.
fn top_k_dist(
    stages: &mut [Stage],
    first: usize,
    r: &[f32],
    s: &mut Scratch,
    c: &mut Candidates,
    lowered: Option<usize>,
) -> Result<Option<Prepared>> {
    let Some(Stage::TopK(t)) = stages.get(first) else { return Ok(None) };
    let k = (t.k() as usize).min(r.len());
    let mut at = first + 1;
    while let Some(stage) = stages.get(at) {
        match stage {
            _ if stage.is_inert() => {}
            Stage::TopP(_) | Stage::MinP(_) | Stage::Temperature(_) => {}
            _ => break,
        }
        at += 1;
    }
    if k == 0 || k > 128 || !matches!(stages.get(at), Some(Stage::Dist(_))) {
        return Ok(None);
    }
    let pen = lowered.and_then(|i| penalties_at(stages, i));
    match rank_top(k, r, s, pen) {
        None => return Ok(None),
        Some(true) => {
            // No ties: the ranking is llama.cpp's order, and `top_k` is done.
            fill_ranked(k, r.len(), s, c);
            s.path = Path::Fast(stages[first].name());
            return Ok(Some(Prepared::Built { applied: first + 1 }));
        }
        Some(false) => fill_ranked(k, r.len(), s, c),
    }
    for stage in &mut stages[first + 1..at] {
        stage.apply(c)?;
    }
    let Some(Stage::Dist(d)) = stages.get_mut(at) else { return Ok(None) };
    // As `Dist::apply`: no draw without a finite candidate.
    crate::sampler::require_finite_candidate("dist", c)?;
    let u = d.draw();
    Dist::select(c, u);
    // The chosen token's value in row + overlay: every entry holding it was gathered (it is
    // at least the k-th largest). `==`, as llama.cpp's comparator: -0.0 ties 0.0.
    let value = c.selected_token().and_then(|token| s.gathered.iter().find(|t| t.id == token)).map(|t| t.logit);
    if value.is_some_and(|v| s.gathered.iter().filter(|t| t.logit == v).count() == 1) {
        s.path = Path::Fast("top-k;dist");
        return Ok(Some(Prepared::Built { applied: at + 1 }));
    }
    if let Some(pen) = lowered.and_then(|i| penalties_at(stages, i)) {
        // The heap select replays row + edits in id order: the overlay after all.
        penalties_overlay(pen, r, s);
    }
    if !top_k_by_heap(k, r, s, c) {
        s.path = Path::Fallback("top-k");
        return array_with_draw(stages, (s.row_applied, at), r, u, c);
    }
    s.path = Path::Fast("top-k;dist (ties replayed)");
    for stage in &mut stages[first + 1..at] {
        stage.apply(c)?;
    }
    Dist::select(c, u);
    Ok(Some(Prepared::Built { applied: at + 1 }))
}

/// The array path through the `dist` stage at `at`, with its draw `u` already made (the
/// stages before it keep no state, so a fast path that gave up may run them again): the
/// candidates from `r`, which reflects the stages before `from` ([`Scratch::row_applied`]),
/// then the stages from `from`.
fn array_with_draw(
    stages: &mut [Stage],
    (from, at): (usize, usize),
    r: &[f32],
    u: f64,
    c: &mut Candidates,
) -> Result<Option<Prepared>> {
    c.fill_validated(r);
    for stage in &mut stages[from..at] {
        stage.apply(c)?;
    }
    Dist::select(c, u);
    Ok(Some(Prepared::Built { applied: at + 1 }))
}

/// llama.cpp's `top_k(k <= 128)` on row + overlay exactly, ties included: libstdc++'s
/// `partial_sort` over the whole array, i.e. a heap of the first `k` entries, every later
/// entry that is *strictly* above the heap's smallest replacing it ([`stdsort::adjust_heap`]),
/// then `sort_heap`. An entry at or below the heap's smallest leaves the heap untouched, and
/// that smallest only rises, so a block whose maximum (edits included) does not exceed it is
/// skipped whole; the others are filtered with the SIMD `gather_ge` and replayed in order.
/// The result is the array path's, bit for bit and in order, at the cost of the blocks that
/// reach the running heap minimum.
fn top_k_by_heap(k: usize, r: &[f32], s: &mut Scratch, c: &mut Candidates) -> bool {
    let n = r.len();
    if k == 0 || s.block_max.len() != n.div_ceil(BLOCK) {
        return false;
    }
    let overlay = &s.overlay;
    let mut edit = 0; // the first overlay entry not yet passed
    let heap = &mut s.gathered;
    heap.clear();
    for (i, &x) in r[..k].iter().enumerate() {
        let mut logit = x;
        while edit < overlay.len() && (overlay[edit].0 as usize) < i {
            edit += 1;
        }
        if edit < overlay.len() && overlay[edit].0 as usize == i {
            logit = overlay[edit].1;
        }
        heap.push(TokenData { id: i as u32, logit, p: 0.0 });
    }
    while edit < overlay.len() && (overlay[edit].0 as usize) < k {
        edit += 1;
    }
    // llama.cpp's comparator (`>`: -0.0 and 0.0 are equal), not `desc`'s total order.
    let mut less = |a: &TokenData, b: &TokenData| crate::convention::llama_cpp::desc(a, b);
    stdsort::make_heap(heap, &mut less);
    let mut at = k;
    while at < n {
        // Fast-forward over the blocks that can change nothing: no edit, and a maximum at or
        // below the heap's smallest (which only rises), many at a time.
        let next_edit = overlay.get(edit).map_or(s.block_max.len(), |e| e.0 as usize / BLOCK);
        if let Some(quiet) = s.block_max.get(at / BLOCK..next_edit) {
            let skip = leading_at_most(quiet, heap[0].logit);
            if skip > 0 {
                at = (at / BLOCK + skip) * BLOCK;
                continue;
            }
        }
        let end = ((at / BLOCK + 1) * BLOCK).min(n);
        let first_edit = edit;
        while edit < overlay.len() && (overlay[edit].0 as usize) < end {
            edit += 1;
        }
        let edits = &overlay[first_edit..edit];
        let top = heap[0].logit;
        let block_max = edits.iter().fold(s.block_max[at / BLOCK], |m, e| m.max(e.1));
        if block_max > top {
            if edits.is_empty() {
                s.blocks.clear();
                arch::gather_ge(&r[at..end], at as u32, top, &mut s.blocks);
                for &t in s.blocks.iter() {
                    if t.logit > heap[0].logit {
                        stdsort::adjust_heap(heap, 0, k, t, &mut less);
                    }
                }
            } else {
                let mut e = edits.iter().peekable();
                for (i, &x) in r[at..end].iter().enumerate().map(|(j, x)| (at + j, x)) {
                    let logit = match e.next_if(|e| e.0 as usize == i) {
                        Some(&(_, v)) => v,
                        None => x,
                    };
                    if logit > heap[0].logit {
                        stdsort::adjust_heap(heap, 0, k, TokenData { id: i as u32, logit, p: 0.0 }, &mut less);
                    }
                }
            }
        }
        at = end;
    }
    stdsort::sort_heap(heap, &mut less);
    c.begin(n);
    c.data.extend_from_slice(heap);
    c.sorted = true;
    true
}

/// How many of the leading `maxima` are at or below `top`: 16 at a time without an early exit
/// inside (so that the test vectorises), then the one group that holds the first above it.
fn leading_at_most(maxima: &[f32], top: f32) -> usize {
    let mut skipped = 0;
    for group in maxima.chunks(16) {
        if group.iter().fold(false, |above, &m| above | (m > top)) {
            return skipped + group.iter().take_while(|&&m| m <= top).count();
        }
        skipped += group.len();
    }
    skipped
}

/// The maximum of row + overlay.
fn view_max(r: &[f32], summary: Summary, s: &mut Scratch) -> Option<f32> {
    if s.overlay.is_empty() {
        return Some(summary.max);
    }
    gather_top(1, r, s)?;
    Some(s.gathered.iter().fold(f32::NEG_INFINITY, |m, t| m.max(t.logit)))
}

/// `min_p(p, min_keep)` on the untouched row: its unsorted path (survivors in row order).
fn min_p(p: f32, min_keep: usize, r: &[f32], summary: Summary, s: &mut Scratch, c: &mut Candidates) -> bool {
    let Some(max) = view_max(r, summary, s) else { return false };
    if max == f32::NEG_INFINITY {
        return false; // llama.cpp's scan starts at -FLT_MAX; leave that case to the array path
    }
    let min_logit = max + p.ln();
    gather_at_least(r, &s.block_max, &s.overlay, min_logit, &mut s.gathered, &mut s.blocks);
    let n = s.gathered.len();
    if n == 0 || n < min_keep {
        return false;
    }
    c.begin(r.len());
    c.data.extend_from_slice(&s.gathered);
    true
}

/// Whether `min_p(p, min_keep)` on the untouched row keeps every entry (then llama.cpp leaves
/// the array as filled): every block's maximum reaches the threshold (a scan of the block
/// maxima that stops at the first below it, at once on a peaked row), and then every entry
/// does (one pass over the row).
fn min_p_keeps_all((p, min_keep): (f32, usize), r: &[f32], summary: Summary, s: &Scratch) -> bool {
    if summary.max == f32::NEG_INFINITY || min_keep > r.len() || s.block_max.len() != r.len().div_ceil(BLOCK) {
        return false;
    }
    let min_logit = summary.max + p.ln();
    s.block_max.iter().all(|&bm| bm >= min_logit) && arch::count_ge(r, min_logit) == r.len()
}

/// `top_n_sigma(n)` on the untouched row when sampling, followed by `tail`: the candidates are
/// the entries it keeps, in row order, after an entry for token 0 (as `-inf`) when it masks
/// that one; `false` where that cannot be shown to give the array path's token.
///
/// llama.cpp keeps the masked entries in the array as `-inf`. The stages allowed after it
/// give them zero weight and never select one, so leaving them out changes no token, with
/// two exceptions handled here:
/// * `dist` with `u = 0` selects index 0 whatever its weight: token 0 stays at the front;
/// * a sort orders equal values by the whole array's history: where `top_k`, `top_p` or
///   `min_p` (whose fallback sorts) follow, the survivors must be pairwise distinct, and no
///   `temperature` may come before them (its rounding can make distinct values equal).
///
/// The bounds on the threshold ([`Moments::threshold_bounds`]) decide every entry below the
/// lower one; the gathered entries must all reach the upper one.
fn top_n_sigma(n: f32, tail: &[Stage], r: &[f32], s: &mut Scratch, c: &mut Candidates) -> bool {
    let (mut sorting, mut scaled) = (false, false);
    for stage in tail {
        match stage {
            _ if stage.is_inert() => {}
            Stage::Temperature(_) => scaled = true,
            Stage::TopK(_) | Stage::TopP(_) | Stage::MinP(_) if !scaled => sorting = true,
            Stage::Dist(_) | Stage::Greedy(_) => {}
            _ => return false,
        }
    }
    let moments = Moments::of_row(r);
    let Some((mut lo, mut hi)) = moments.threshold_bounds(n) else { return false };
    gather_at_least(r, &s.block_max, &[], lo, &mut s.gathered, &mut s.blocks);
    if s.gathered.iter().any(|t| t.logit < hi) {
        // A second pass narrows the interval (inside the first one).
        let Some(refined) = moments.refined_threshold_bounds(n, r, |&x| x) else { return false };
        (lo, hi) = refined;
        s.gathered.retain(|t| t.logit >= lo);
        if s.gathered.iter().any(|t| t.logit < hi) {
            return false;
        }
    }
    if sorting {
        // `+ 0.0` makes `-0.0` and `0.0` one key: they tie in llama.cpp's comparisons.
        s.ranks.clear();
        s.ranks.extend(s.gathered.iter().map(|t| total_order_key(t.logit + 0.0)));
        s.ranks.sort_unstable();
        if s.ranks.windows(2).any(|w| w[0] == w[1]) {
            return false;
        }
    }
    c.begin(r.len());
    if r[0] < lo {
        c.data.push(TokenData { id: 0, logit: f32::NEG_INFINITY, p: 0.0 });
    }
    c.data.extend_from_slice(&s.gathered);
    true
}

/// Pops the largest entry of a max-heap (by logit) stored in `h[..*len]`.
fn pop_max(h: &mut [TokenData], len: &mut usize) -> Option<TokenData> {
    if *len == 0 {
        return None;
    }
    let top = h[0];
    *len -= 1;
    h.swap(0, *len);
    sift_down(&mut h[..*len], 0);
    Some(top)
}

fn sift_down(h: &mut [TokenData], mut i: usize) {
    loop {
        let (l, r) = (2 * i + 1, 2 * i + 2);
        let mut largest = i;
        if l < h.len() && h[l].logit > h[largest].logit {
            largest = l;
        }
        if r < h.len() && h[r].logit > h[largest].logit {
            largest = r;
        }
        if largest == i {
            return;
        }
        h.swap(i, largest);
        i = largest;
    }
}

/// `top_p(p, min_keep)` on the untouched row of more than 1024 entries: llama.cpp's path that
/// sorts only the top 256 first, finished within those 256 (otherwise the array path runs).
fn top_p(p: f32, min_keep: usize, r: &[f32], summary: Summary, s: &mut Scratch, c: &mut Candidates) -> bool {
    if r.len() <= 1024 || summary.max == f32::NEG_INFINITY {
        return false;
    }
    let sum = arch::exp_sum_sequential(0.0, r, summary.max, &s.block_max);
    if sorted_prefix((p, min_keep), r, summary.max, (sum, sum), Ties::Matter, Reuse::Fresh, s, c).is_err() {
        return false;
    }
    c.sorted = true;
    true
}

/// The parameters of the `min_p` that follows `top_p` (inert stages apart) when `top_p`'s
/// prefix may be cut from a lower bound of its softmax sum ([`top_p_bounded`]): when
/// sampling, with `dist` last and only stages before it that read the logits or recompute `p`
/// from them (llama.cpp's `top_k`, `top_p`, `min_p`, `temperature`, `xtc`, `typical`), so
/// that the prefix's `p`, divided by the bound instead of the sum, is never read.
fn tail_after_top_p(need: Need, rest: &[Stage]) -> Option<(f32, usize)> {
    let mut live = rest.iter().filter(|st| !st.is_inert());
    if need != Need::Token || !matches!(live.clone().next_back(), Some(Stage::Dist(_))) {
        return None;
    }
    let recomputes = |st: &Stage| {
        matches!(
            st,
            Stage::TopK(_)
                | Stage::TopP(_)
                | Stage::MinP(_)
                | Stage::Temperature(_)
                | Stage::Xtc(_)
                | Stage::Typical(_)
                | Stage::Dist(_)
        )
    };
    if !live.clone().all(recomputes) {
        return None;
    }
    match live.next() {
        Some(Stage::MinP(m)) => Some(m.params()),
        _ => None,
    }
}

/// `top_p(p, min_keep)` followed by `min_p(min_p, keep)` (`min_p`, as [`tail_after_top_p`]
/// admits the chain), leaving what [`top_p`] leaves but for entries past the ones that `min_p`
/// keeps; `false` where that cannot be decided this way (`c` unspecified: [`top_p`] then
/// runs).
///
/// llama.cpp's sorted `min_p` keeps the prefix up to its first entry below `max + ln min_p`
/// (at least `keep` entries): the same entry for any prefix that reaches it. So `top_p`'s cut
/// need not be known, only bounded below: every running sum of `p = fl(w / S)` falls as its
/// softmax sum `S` grows, so the cut at a lower bound of `S` is a lower bound of the cut. The
/// bound comes from the block maxima (distinct entries of the row), one exponential per block.
/// Where `top_p` cuts first (a small `min_p`), the exact sum decides.
///
/// PERF: the exact sum ([`arch::exp_sum_sequential`]) was two thirds of
/// `top_p(0.95);min_p(0.05);temperature(0.8);dist`, llama.cpp's default chain with `top_k`
/// off: 21 µs at V = 128,256 (4.8× the floor), 8 µs with the bound; at 32,000, 7.0 and 2.6 µs.
/// Tighter bounds ([`NearSums`], as [`top_p_dist`] takes them) pinned the cut where `top_p`
/// cuts first only at their third try, which cost more than the exact sum at 32,000.
fn top_p_bounded(
    (p, min_keep): (f32, usize),
    (min_p, keep): (f32, usize),
    r: &[f32],
    summary: Summary,
    s: &mut Scratch,
    c: &mut Candidates,
) -> bool {
    let max = summary.max;
    if r.len() <= 1024 || max == f32::NEG_INFINITY {
        return false;
    }
    // Each of the `n` f32 additions multiplies by at least `1 - 2^-24`, so `S >= T (1 - n
    // 2^-24)` for `T` the exact sum of the weights, with room for the f64 sum of the maxima's
    // weights and `expf`'s bits. `S >= 1`: it holds the maximum's weight.
    let n = r.len() as f64;
    let maxima = arch::exp_shifted_sum(&s.block_max, 1.0, max);
    let lo = f32_at_most(maxima * (1.0 - (n + 8.0) * 2f64.powi(-24) - 2f64.powi(-20))).max(1.0);
    // The prefix up to the cut `k` at `lo`, sorted and tie-free, then the row's next values
    // (in some order among equal ones). A tie before the cut, or a cut beyond the first 256,
    // holds at `S` too: the exact sum would not do better.
    let Ok((k, _)) = sorted_prefix((p, min_keep), r, max, (lo, f32::INFINITY), Ties::Matter, Reuse::Fresh, s, c) else {
        return false;
    };
    // `min_p`'s cut: one past its last kept entry, the first (from 1) below `min_logit` and at
    // least `keep`. At `k` or before, any prefix from `k` on ends there too (at `k` itself, the
    // prefix of `k` by running out of entries).
    let min_logit = c.data[0].logit + min_p.ln();
    let min_p_cut = (1..c.data.len()).find(|&i| c.data[i].logit < min_logit && i >= keep);
    if min_p_cut.is_none_or(|i| i > k) {
        return false;
    }
    c.data.truncate(k);
    c.sorted = true;
    true
}

/// Whether [`sorted_prefix`] must leave llama.cpp's exact order (`Matter`: the candidates are
/// observed, so equal values anywhere in the prefix or at its cut decline), or only the
/// values in order and the entry after the prefix (`Allowed`: for a draw, whose token is
/// certain wherever its value is held by no neighbour).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ties {
    Matter,
    Allowed,
}

/// Whether [`sorted_prefix`] may read what an earlier call popped for the same row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reuse {
    /// A new row, or the gathered entries changed since: gather and pop afresh.
    Fresh,
    /// The same row as the last call with `Row` since a `Fresh` one (`top_p;dist`'s tries).
    Row,
}

/// Why [`sorted_prefix`] could not finish.
#[derive(Debug, PartialEq, Eq)]
enum Short {
    /// Equal logits among the prefix or at its cut: libstdc++'s order would decide.
    Tie,
    /// Not reached within llama.cpp's first 256: it sorts everything (or too few blocks).
    Beyond,
}

/// What [`sorted_prefix`] popped from its heap for the current row, in order, with the weights
/// it computed, and where the heap (in `Scratch::gathered`) stands. Within one draw of
/// [`top_p_dist`] every try pops the same descending sequence (equal values in some order,
/// which `Ties::Allowed` permits); only the sum's bounds change. So a later try reads the
/// entries the earlier ones popped and pops on from the heap where they stopped.
///
/// PERF: `top_p;dist` averages 1.5 tries per draw on the bench's rows at V = 32,000 and 1.6 at
/// 128,256; each try gathered the top 32 (or 256) again, rebuilt the heap and recomputed the
/// weights.
#[derive(Debug, Default)]
struct PrefixCache {
    /// Whether the rest describes the current row: set by a [`sorted_prefix`] that may reuse
    /// it, cleared by one that may not.
    live: bool,
    /// The superset the heap holds: 0 for the top 32, 1 for the top 256.
    stage: usize,
    /// The heap's length in `Scratch::gathered`.
    heap_len: usize,
    /// The entries popped so far, in order, and the weights of the first of them.
    popped: Vec<TokenData>,
    weights: Vec<f32>,
}

impl PrefixCache {
    /// Entry `i` of the descending sequence (`i` at most the number popped), popping it from
    /// the heap `g` if needed; `None` once the heap is empty.
    fn entry(&mut self, i: usize, g: &mut [TokenData]) -> Option<TokenData> {
        if i == self.popped.len() {
            let t = pop_max(g, &mut self.heap_len)?;
            self.popped.push(t);
        }
        Some(self.popped[i])
    }

    /// The weight `expf(x - max)` of entry `i` (already popped; weights are taken in order).
    fn weight(&mut self, i: usize, max: f32) -> f32 {
        if i == self.weights.len() {
            self.weights.push((self.popped[i].logit - max).exp());
        }
        self.weights[i]
    }
}

/// llama.cpp `top_p`'s kept prefix for a softmax sum in `[lo, hi]` (over a row of more than
/// 1024 entries, so its top-256 path): the row's entries in descending order with
/// `p = expf(x - max) / lo`, into `c` (begun), up to the cut `k` at `lo`: the first entry
/// whose running f32 sum of `p` reaches `p` with at least `min_keep` entries. Then up to
/// [`PAST_THE_CUT`] further entries, looking for the cut at `hi` (the same running sum with
/// `hi`), which is returned if found (`k` itself when `lo == hi`). The cut for any sum in
/// between lies between the two (see [`top_p_dist`]).
///
/// The prefix is popped from a heap over a superset of the top 32 first, then of the top 256
/// if the mass was not reached within the first. Descending order is the row's only for
/// pairwise distinct values, so any tie up to the cut at `lo` or at it is `Short::Tie`.
///
/// With `Reuse::Row`, the entries and weights an earlier call popped for the same row (also
/// with `Reuse::Row`, since the last `Reuse::Fresh`) are read again ([`PrefixCache`]); the
/// caller vouches that the row, its summary and `Scratch::gathered` are unchanged since.
#[allow(clippy::too_many_arguments)]
fn sorted_prefix(
    (p, min_keep): (f32, usize),
    r: &[f32],
    max: f32,
    (lo, hi): (f32, f32),
    ties: Ties,
    reuse: Reuse,
    s: &mut Scratch,
    c: &mut Candidates,
) -> std::result::Result<(usize, Option<usize>), Short> {
    const TOP: usize = 256;
    let check = ties == Ties::Matter;
    let blocks = s.block_max.len();
    let needs = [32.min(blocks), TOP.min(blocks)];
    let cached = reuse == Reuse::Row && s.prefix.live;
    let from = if cached { s.prefix.stage } else { 0 };
    for (stage, &need) in needs.iter().enumerate().skip(from) {
        if !(cached && stage == from) {
            if gather_top(need, r, s).is_none() {
                s.prefix.live = false;
                return Err(Short::Beyond);
            }
            let g = &mut s.gathered;
            let len = g.len();
            for i in (0..len / 2).rev() {
                sift_down(&mut g[..len], i);
            }
            let cache = &mut s.prefix;
            (cache.live, cache.stage, cache.heap_len) = (reuse == Reuse::Row, stage, len);
            cache.popped.clear();
            cache.weights.clear();
            // Room for every pop a call can make, up front: a later row may pop more.
            cache.popped.reserve(TOP + 1);
            cache.weights.reserve(TOP + 1);
        }
        let (g, cache) = (&mut s.gathered, &mut s.prefix);
        c.begin(r.len());
        let (mut cum, mut cum_hi) = (0.0f32, 0.0f32);
        let mut cut = None;
        for i in 0..TOP {
            // Every entry of the superset is >= the threshold, and every entry outside it is
            // below: popping it in order yields the row's descending order while it lasts.
            let Some(mut t) = cache.entry(i, g) else { break };
            let w = cache.weight(i, max);
            if cut.is_none() {
                if check && c.data.last().is_some_and(|prev| prev.logit == t.logit) {
                    return Err(Short::Tie);
                }
                t.p = w / lo;
                cum += t.p;
            }
            cum_hi += w / hi;
            c.data.push(t);
            if cut.is_none() && cum >= p && i + 1 >= min_keep {
                // The next entry: the row's next value (the largest outside the prefix).
                if check && cache.entry(i + 1, g).is_some_and(|next| next.logit == t.logit) {
                    return Err(Short::Tie);
                }
                cut = Some(i + 1);
            }
            if let Some(k) = cut {
                if cum_hi >= p && i + 1 >= min_keep {
                    // Where ties are allowed, the entry after the prefix too: its value tells
                    // whether the prefix's last one is tied.
                    if !check {
                        c.data.extend(cache.entry(i + 1, g));
                    }
                    return Ok((k, Some(i + 1)));
                }
                if i + 1 >= k + PAST_THE_CUT {
                    break;
                }
            }
        }
        if let Some(k) = cut {
            if !check {
                c.data.extend(cache.entry(c.data.len(), g));
            }
            return Ok((k, None));
        }
        if c.data.len() >= TOP {
            return Err(Short::Beyond);
        }
    }
    Err(Short::Beyond)
}

/// How many entries past the cut at the softmax sum's lower bound [`sorted_prefix`] pops
/// looking for the cut at its upper bound (without it, [`certain_draw`] bounds the
/// survivors' sum from the mass instead).
const PAST_THE_CUT: usize = 16;

/// The masses the tries of [`top_p_dist`] leave unexponentiated ([`NearSums`]). The first
/// pins the softmax sum within about 20%, which most draws need (they land on the few heavy
/// tokens): a draw is certain when it picks the same token for every cut the sum's interval
/// allows. Over 16 peaked rows per size and the real row, this ladder took 5–20% less time
/// than starting at 2^-4 or 2^-3; past the third try the rounding bounds, not the tiers,
/// set the interval.
const TOP_P_FAR_MASSES: [f64; 3] = [1.0 / 4.0, 1.0 / 32.0, 1.0 / 512.0];

/// llama.cpp's full sort and f32 softmax of the row `r` (maximum `max`), as far as its top
/// entries: at least `need` of them (all at or above some threshold) into `c` (begun, flagged
/// sorted), in descending order, each with `p = expf(x - max) / S` where `S` is the f32 sum of
/// every entry's `expf(x - max)` in that order. `false` (and `c` unspecified) where the entries
/// cannot be bounded by the block maxima, or where the order of the rest could change `S`.
///
/// `S` is summed over those entries in order, then from there over the rest of the row in any
/// order ([`ServerOrder::rest_unordered`](crate::logprobs::ServerOrder::rest_unordered)): it
/// certifies that no order of the remaining weights changes the sum, so the descending one
/// gives it too. Equal values need no order here (their weights are equal); which of them
/// sits where is for the caller to check. Returns `S`, or `None` where `false` is said above.
///
/// With `div != 1`, the row is `r` divided by that temperature, as llama.cpp's `temperature`
/// leaves it (`fl32(x / div)`; `max` the divided maximum): the top is gathered from `r` (the
/// division is monotone) and divided. Distinct entries may divide to equal values, so an entry
/// left below the gathering's bound may equal the least gathered one: those least ones are then
/// dropped, and the rest are all the row's entries above them.
fn sorted_softmax_top(need: usize, r: &[f32], div: f32, max: f32, s: &mut Scratch, c: &mut Candidates) -> Option<f32> {
    let tau = gather_top(need, r, s)?;
    if div != 1.0 {
        s.gathered.iter_mut().for_each(|t| t.logit /= div);
        if s.gathered.len() < r.len() {
            let least = s.gathered.iter().fold(f32::INFINITY, |m, t| m.min(t.logit));
            if tau.next_down() / div >= least {
                s.gathered.retain(|t| t.logit > least);
                if s.gathered.len() < need {
                    return None;
                }
            }
        }
    }
    let (g, keys) = (&s.gathered, &mut s.gathered_ranks);
    rank_keys(g, keys);
    let keys = sort_rank_keys(keys);
    let top = &mut s.top_logits;
    top.clear();
    top.extend(keys.iter().map(|&key| {
        let t = g[key as u32 as usize];
        crate::logprobs::TokenLogprob { token: t.id, logprob: t.logit }
    }));
    // The weights in order, exponentiated 8 or 16 at a time with the platform's `expf` bits.
    let (xs, ws) = (&mut s.sorted, &mut s.weights);
    xs.clear();
    xs.extend(top.iter().map(|t| t.logprob));
    ws.resize(xs.len(), 0.0);
    arch::exp_shifted(xs, 1.0, max, ws);
    let mut sum = 0.0f32;
    for &w in ws.iter() {
        sum += w;
    }
    let sum = s.server_order.rest_unordered(r, div, max, &s.block_max, top, sum)?;
    c.begin(r.len());
    c.data.extend(top.iter().zip(ws.iter()).map(|(t, &w)| TokenData { id: t.token, logit: t.logprob, p: w / sum }));
    c.sorted = true;
    Some(sum)
}

/// The sizes of the row's top [`mirostat`] tries before it gives up: each try gathers and
/// sorts about that many entries.
const MIROSTAT_TOPS: [usize; 4] = [64, 1024, 8192, usize::MAX];

/// `mirostat` or `mirostat_v2` at `first` on the untouched row (no overlay): both start with a
/// full sort and softmax of the candidates, then keep a prefix, whose length v1 takes from the
/// first `m` probabilities and v2 from the first surprise above `mu`. Only that prefix, one
/// entry past it and the softmax sum are needed: [`sorted_softmax_top`] gives the top entries
/// with their probabilities, in larger tries until the prefix and the entry after it are
/// among them (the last try sorts the whole row, as the array path does, but by integer keys
/// and without building the array first). Then the stage keeps, renormalises and draws as on
/// the array.
///
/// llama.cpp's order among equal values is its sort's, which this does not replay; it moves
/// only tokens, not values, so the draw picks the same position. Where the value there is
/// held by another entry of the prefix or the one after it, the candidate array is built and
/// the stage finishes on it with the same draw. `None` (before anything is drawn) where the
/// row is too short or flat for the tries.
///
/// Where the stage keeps the whole row (v1's `k` reaches `V`; v2's `mu` is above the surprise
/// of the row's least entry: `mu` climbs there on a confident model) and only the token is
/// observed, the draw needs the prefix it lands in, not the sort of the rest:
/// [`draw_in_prefix`] certifies it from bounds on the rest's mass ([`RowMass`]), and the
/// selected candidate alone is left, as after other draws straight from the row.
///
/// With `div != 1` (`temperature(div)` the only stage before it but inert ones), the stage's
/// row is `r` divided as llama.cpp's `temperature` leaves it, `fl32(x / div)`, and every read
/// of it divides what it reads ([`sorted_softmax_top`], the bounds on its mass and its least
/// entry) instead of a copy of the row being divided first.
///
/// PERF: the candidate array's full sort cost 15 ms a token at V = 128,256 (`mirostat_v2`),
/// and sorting the whole kept row by integer keys 2.9 ms; drawn in the top, 20 µs (the row's
/// minimum, for v2, one pass of it). A temperature before it divided a copy of the row first,
/// which at 128,256 took about as long as the rest (`temperature(0.8);mirostat_v2`: 36 µs).
#[allow(clippy::too_many_arguments)]
fn mirostat(
    stages: &mut [Stage],
    first: usize,
    r: &[f32],
    summary: Summary,
    div: f32,
    s: &mut Scratch,
    c: &mut Candidates,
    need: Need,
) -> Result<Option<Prepared>> {
    // The maximum of the stage's row (`div = 1`: `r`'s, exactly).
    let max = summary.max / div;
    if summary.max == f32::NEG_INFINITY || !max.is_finite() || r.len() <= MIROSTAT_TOPS[0] {
        return Ok(None);
    }
    // How many of the top entries the next try needs at least: v1's estimate reads `m`, and
    // the prefix kept last time (and the entry after it) is a good guess for this one's,
    // unless that was the whole row: then the draw may still land in a short prefix.
    let kept_before = if s.mirostat_kept >= r.len() { 0 } else { s.mirostat_kept.saturating_add(1) };
    let mut want = match &stages[first] {
        Stage::Mirostat(m) => m.estimate_reads(),
        _ => 1,
    }
    .max(kept_before);
    // The whole row is kept and only the token is observed: the draw over the row may be
    // certified from a prefix ([`draw_in_prefix`]).
    let only_token = need == Need::Token && stages[first + 1..].iter().all(|st| st.is_inert());
    let mut keeps_row = false;
    // The draw, once made (for keeping the whole row), and the row's weights' bounds.
    let mut drawn = None;
    let mut row_mass = None;
    let mut row_min = None;
    for top in MIROSTAT_TOPS {
        // A failed try (the rest's order could change the sum) may succeed with more entries
        // summed in order; the last, the whole row, sums all of them so.
        let Some(sum) = sorted_softmax_top(top.max(want).min(r.len()), r, div, max, s, c) else { continue };
        let whole = c.len() == r.len();
        let keep = match &stages[first] {
            Stage::Mirostat(m) if whole || c.len() >= want => {
                let k = m.top_k_estimate(c) as usize; // at least 1
                if k >= c.len() && !whole {
                    keeps_row = k >= r.len();
                    if !(keeps_row && only_token) {
                        // The prefix and the entry after it.
                        want = k.saturating_add(1);
                    }
                    None
                } else {
                    Some(k.min(c.len()))
                }
            }
            Stage::MirostatV2(m) => match m.cut(c) {
                Some(keep) => Some(keep.max(1)),
                None if whole => Some(c.len()),
                None => {
                    if only_token && !keeps_row {
                        let least = *row_min.get_or_insert_with(|| row_min_weight(r, div, max));
                        keeps_row = !surprise_exceeds(least / sum, m.mu());
                    }
                    None
                }
            },
            _ => None,
        };
        let Some(keep) = keep else {
            if keeps_row && only_token {
                let m = mu_feedback(&mut stages[first]);
                let u = *drawn.get_or_insert_with(|| m.draw(r.len()));
                let u = u.expect("a draw: the row has two or more entries");
                // The prefix's weights (`sorted_softmax_top`'s), summed before the bounds reuse
                // the scratch.
                debug_assert_eq!(s.weights.len(), c.len());
                let prefix_weights: f64 = s.weights.iter().map(|&w| w as f64).sum();
                let mass = row_mass.get_or_insert_with(|| RowMass::new(r, div, max, s));
                let mut picked = draw_in_prefix(c, prefix_weights, r.len(), sum, mass, u);
                while picked.is_none() && mass.tighten(r, div, max, s) {
                    picked = draw_in_prefix(c, prefix_weights, r.len(), sum, mass, u);
                }
                if let Some(idx) = picked {
                    m.select(c, idx);
                    // As after other draws straight from the row: the selected candidate alone.
                    let t = c.data[idx];
                    c.begin(c.vocab_size);
                    c.data.push(t);
                    c.selected = Some(0);
                    c.sorted = true;
                    s.mirostat_kept = r.len();
                    s.path = Path::Fast(match stages[first] {
                        Stage::Mirostat(_) => "mirostat (drawn in the top)",
                        _ => "mirostat-v2 (drawn in the top)",
                    });
                    return Ok(Some(Prepared::Built { applied: first + 1 }));
                }
            }
            continue;
        };
        // Equal values in the kept prefix, or at its end, are in the array path's sort order
        // there, which only moves tokens between their positions: the token picked stands
        // where no other entry of the prefix, nor the one after it, holds its value. The
        // candidates themselves stand only without such ties.
        let data = c.as_slice();
        let tied = data[..(keep + 1).min(data.len())].windows(2).any(|w| w[0].logit == w[1].logit);
        let after = data.get(keep).map(|t| t.logit);
        let certain = |c: &Candidates, i: usize| {
            let v = c.as_slice()[i].logit;
            !tied
                || (need == Need::Token
                    && after != Some(v)
                    && c.as_slice().iter().filter(|t| t.logit == v).count() == 1)
        };
        s.mirostat_kept = keep;
        let m = mu_feedback(&mut stages[first]);
        let u = drawn.unwrap_or_else(|| m.draw(keep));
        if m.finish(c, keep, u, &certain) {
            s.path = Path::Fast(stages[first].name());
        } else {
            // The array path's order, with the same draw.
            s.path = Path::Fallback(stages[first].name());
            c.fill_validated(r);
            for stage in &mut stages[s.row_applied..first] {
                stage.apply(c)?;
            }
            mu_feedback(&mut stages[first]).apply_drawn(c, Some(u));
        }
        return Ok(Some(Prepared::Built { applied: first + 1 }));
    }
    Ok(None)
}

/// The weight `expf(fl32(x / div) - max)` of the row's least entry `x`: over it the softmax's
/// smallest probability (the surprises grow down the sorted row).
fn row_min_weight(r: &[f32], div: f32, max: f32) -> f32 {
    let mut w = [0.0f32];
    arch::exp_shifted(&[arch::min(r)], div, max, &mut w);
    w[0]
}

/// Bounds on the sum of every weight `expf(x - max)` of a row, tightened on demand down
/// [`DRAW_FAR_MASSES`] ([`NearSums`]: the first bounds leave most blocks unexponentiated),
/// then from [`arch::exp_block_sums_approx`] where the tiers do not apply.
struct RowMass {
    near: Option<NearSums>,
    /// The next rung of [`DRAW_FAR_MASSES`].
    next: usize,
    lo: f64,
    hi: f64,
}

impl RowMass {
    /// The bounds for the row `r` divided by `div` (maximum `max`, divided), from its first
    /// tier.
    fn new(r: &[f32], div: f32, max: f32, s: &mut Scratch) -> Self {
        let near = NearSums::new(r, div, max, s);
        let mut mass = RowMass { near, next: 0, lo: 0.0, hi: f64::INFINITY };
        mass.tighten(r, div, max, s);
        mass
    }

    /// Narrows the bounds with the next tier; `false` when none is left.
    fn tighten(&mut self, r: &[f32], div: f32, max: f32, s: &mut Scratch) -> bool {
        let err = match &mut self.near {
            Some(near) if self.next < DRAW_FAR_MASSES.len() => near.widen(DRAW_FAR_MASSES[self.next], r, div, max, s),
            None if self.next == 0 => {
                s.block_sums.clear();
                s.block_sums.resize(r.len().div_ceil(BLOCK), 0.0);
                arch::exp_block_sums_approx(r, div, max, &mut s.block_sums)
            }
            _ => return false,
        };
        self.next += 1;
        let approx = total(&s.block_sums);
        // Either order of f64 summation is within (V + 8) half-ulps of the exact sum of the
        // weights (as `dist` bounds it), the blocks' own sums included.
        let rounding = (r.len() as f64 + 8.0) * f64::EPSILON * 2.0 * (approx + err);
        (self.lo, self.hi) = (self.lo.max(approx - err - rounding), self.hi.min(approx + err + rounding));
        true
    }
}

/// `discrete_distribution`'s pick over the probabilities of a whole sorted row when only its
/// first `c.len()` are at hand (`c`, with `p = w / sum` in f32 for their weights
/// `w = expf(x - max)`, whose f64 sum is `prefix_weights`; `v` the row's length, `mass` the
/// bounds on all its weights): `None` unless the draw
/// `u` lands on the same entry of the prefix for every total the rest allows, and no
/// neighbour holds its value.
///
/// The distribution normalises by the f64 sum of every `p` in sorted order: the prefix's
/// part is summed here as it does; the rest's `p` lie within `2^-24` (relative) and `2^-149`
/// of `w / sum`, whose sum `mass` bounds, and each of their additions rounds by at most
/// `2^-53` of the total. The cumulative sums of the prefix fall as the total grows (each
/// quotient and each rounded sum is monotone), so the picks at the total's bounds bound
/// every pick in between.
fn draw_in_prefix(c: &Candidates, prefix_weights: f64, v: usize, sum: f32, mass: &RowMass, u: f64) -> Option<usize> {
    let data = c.as_slice();
    let n = data.len();
    if n >= v {
        return None;
    }
    let slack = n as f64 * 2f64.powi(-52) * prefix_weights;
    let rest = ((mass.lo - prefix_weights - slack).max(0.0), (mass.hi - prefix_weights + slack).max(0.0));
    let (m, s64) = ((v - n) as f64, sum as f64);
    let rest_p = (
        (rest.0 / s64 * (1.0 - 2f64.powi(-22)) - m * 2f64.powi(-149)).max(0.0),
        rest.1 / s64 * (1.0 + 2f64.powi(-22)) + m * 2f64.powi(-149),
    );
    let mut head = 0.0f64;
    for t in data {
        head += t.p as f64;
    }
    let rounding = m * 2f64.powi(-52) * (head + rest_p.1);
    let total =
        ((head + rest_p.0 - rounding) * (1.0 - 2f64.powi(-50)), (head + rest_p.1 + rounding) * (1.0 + 2f64.powi(-50)));
    let pick = |total: f64| {
        let mut run = 0.0f64;
        data.iter().position(|t| {
            run += t.p as f64 / total;
            run >= u
        })
    };
    let i = pick(total.1)?;
    if pick(total.0) != Some(i) {
        return None;
    }
    let value = data[i].logit;
    let tied = (i > 0 && data[i - 1].logit == value) || data.get(i + 1).is_some_and(|t| t.logit == value);
    (!tied).then_some(i)
}

/// A `mirostat` or `mirostat_v2` stage's shared tail.
fn mu_feedback(stage: &mut Stage) -> &mut dyn MuFeedback {
    match stage {
        Stage::Mirostat(m) => m,
        Stage::MirostatV2(m) => m,
        _ => unreachable!("only called on a mirostat stage"),
    }
}

/// `top_p(p, min_keep);dist` on the untouched row of more than 1024 entries, when sampling,
/// optionally with a `temperature(t)` (`0 < t <= TOP_P_TEMP_MAX`) before `dist`, which
/// changes only `dist`'s weights. `None`: not this chain (or the row is out of its range).
///
/// llama.cpp's `top_p` needs its f32 softmax sum `S` (in row order) only for the cut, and
/// `dist` recomputes every weight over the survivors: when `dist` follows directly, the token
/// depends on `S` only through the cut. So instead of `S` itself
/// ([`arch::exp_sum_sequential`], several passes' worth at V = 32k), [`NearSums`] bounds it:
///
/// * the exact sum `T` of the weights lies within the tiers' bound of their total;
/// * `|S - T| <= Σ min(w_i, h)` with `h` half an ulp of the largest `S` can be: each f32
///   addition rounds by at most half an ulp of its result, and by at most the weight added
///   (the running sum itself is a representable neighbour); the block rungs bound the right
///   side;
/// * every `p_i = fl(w_i / S)`, and so every running sum of them, falls as `S` grows, so the
///   cut moves monotonically: the cuts at the interval's ends bound every cut it allows;
/// * `dist` over the top `k` picks the first `i` whose running f64 sum of weights `P(i + 1)`
///   reaches `u · P(k)`, which grows with `k`: the draw is certain when the two ends' cuts
///   pick the same token.
///
/// Otherwise the next try narrows the interval; after the last, the exact sum pins the cut.
/// Equal values (half-precision rows are full of them) change nothing above but which token
/// holds a position: where a neighbour holds the chosen value, llama.cpp's order of the top
/// 256 is replayed over the buckets it sorts ([`top_p_order`]). Beyond the first 256 entries a
/// tie at the chosen value goes to the array path, which draws with the same `u`. The token is
/// always the array path's.
fn top_p_dist(
    stages: &mut [Stage],
    first: usize,
    r: &[f32],
    summary: Summary,
    s: &mut Scratch,
    c: &mut Candidates,
) -> Result<Option<Prepared>> {
    let Some(Stage::TopP(top_p_stage)) = stages.get(first) else { return Ok(None) };
    let (p, min_keep) = top_p_stage.params();
    let next_live = |from: usize| stages.iter().skip(from).position(|st| !st.is_inert()).map(|i| from + i);
    let Some(mut at) = next_live(first + 1) else { return Ok(None) };
    // A temperature below 1 before `dist` scales only `dist`'s weights (see `certain_draw`).
    let mut temp = None;
    if let Stage::Temperature(t) = &stages[at] {
        if !(t.t() > 0.0 && t.t() <= TOP_P_TEMP_MAX) {
            return Ok(None);
        }
        temp = Some(t.t());
        let Some(next) = next_live(at + 1) else { return Ok(None) };
        at = next;
    }
    // The rounding bound below needs `V < 2^22`.
    let max = summary.max;
    if r.len() <= 1024 || r.len() >= 1 << 22 || max == f32::NEG_INFINITY {
        return Ok(None);
    }
    let Some(Stage::Dist(d)) = stages.get_mut(at) else { return Ok(None) };
    let u = d.draw();
    let mut sum_hi = f32::INFINITY;
    let beyond = beyond_by_block_maxima(p, max, &s.block_max)
        || match certain_top_p_draw(p, min_keep, r, max, u, temp, &mut sum_hi, s, c) {
            Ok((token, replayed)) => {
                s.path = Path::Fast(if replayed { "top-p;dist (ties replayed)" } else { "top-p;dist" });
                return Ok(Some(Prepared::Selected(token)));
            }
            Err(short) => short == Some(Short::Beyond),
        };
    // The exact sum: the cut is certain, and so is the draw unless several entries hold the
    // chosen value.
    let sum = arch::exp_sum_sequential_below(r, max, &s.block_max, summary.max_block, sum_hi, &mut s.collector);
    let prefix = if beyond {
        // Beyond at a lower bound of the sum is beyond at the sum (see `certain_top_p_draw`):
        // the prefix would only be gathered again to say so.
        Err(Short::Beyond)
    } else {
        sorted_prefix((p, min_keep), r, max, (sum, sum), Ties::Allowed, Reuse::Row, s, c)
    };
    let drawn = match prefix {
        Ok(cuts) => certain_draw(p, max, sum, 0.0, cuts, u, temp, s, c).and_then(|(i, cut_sum)| {
            let replayed = settle_tie(i, r, s, c)?;
            s.path =
                Path::Fast(if replayed { "top-p;dist (exact sum, ties replayed)" } else { "top-p;dist (exact sum)" });
            Some(select_prefix_entry(c, i, temp, cut_sum))
        }),
        // The draw over sorted values is written for `dist` straight after `top_p`.
        Err(Short::Beyond) if temp.is_some() => None,
        Err(Short::Beyond) => super::bucket_draw::draw(p, min_keep, r, max, sum, u, &mut s.buckets, c).inspect(|_| {
            s.path = Path::Fast("top-p;dist (sorted)");
        }),
        Err(Short::Tie) => None,
    };
    if let Some(token) = drawn {
        return Ok(Some(Prepared::Selected(token)));
    }
    s.path = Path::Fallback("top-p");
    array_with_draw(stages, (s.row_applied, at), r, u, c)
}

/// `top_p;dist`'s draw `u` when the cut lies beyond llama.cpp's first 256 entries (flat rows),
/// given the exact softmax sum `sum`. llama.cpp then sorts the whole array (libstdc++'s
/// bucket and heap sorts, which [`stdsort`] replays at some 80 ns per entry); but the cut,
/// `dist`'s sums and the chosen position depend on the sorted *values* only, and the token
/// on the order of equal values only where they sit at the chosen position. So only the
/// values are sorted (as integer order keys, by a radix sort), the cut and the draw follow llama.cpp's
/// arithmetic over them, and the token is the one entry holding the chosen value when no
/// other entry holds it (`None` otherwise: the array path decides).
///
/// The fast path no longer sorts the row ([`super::bucket_draw`] sorts only the buckets of
/// values where the order can matter); this whole-row version stays as its oracle.
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
pub(super) fn draw_by_sorting(
    p: f32,
    min_keep: usize,
    r: &[f32],
    max: f32,
    sum: f32,
    u: f64,
    s: &mut Scratch,
    c: &mut Candidates,
) -> Option<u32> {
    // The values as order keys, sorted ascending (then read from the end); `x + 0.0` is `0.0`
    // for `-0.0`, so equal values get equal keys.
    let keys = &mut s.ranks;
    keys.clear();
    keys.extend(r.iter().map(|&x| total_order_key(x + 0.0)));
    let ascending = transformers::sort_keys(keys);
    let values = &mut s.sorted;
    values.clear();
    values.extend(ascending.iter().rev().map(|&k| transformers::from_sort_key(k)));
    let weights = &mut s.weights;
    weights.resize(r.len(), 0.0);
    arch::exp_shifted(values, 1.0, max, weights);
    // llama.cpp's cut: the running f32 sum of `p` in descending order (all kept if it never
    // reaches `p`), and `dist`'s running f64 sums of the weights over the kept.
    let sums = &mut s.top_weights;
    sums.clear();
    sums.push(0.0);
    let (mut cum, mut running) = (0.0f32, 0.0f64);
    for (j, &w) in weights.iter().enumerate() {
        running += w as f64;
        sums.push(running);
        cum += w / sum;
        if cum >= p && j + 1 >= min_keep {
            break;
        }
    }
    let k = sums.len() - 1;
    let i = sums[1..].partition_point(|&run| run < sums[k] * u).min(k - 1);
    // Another entry of the chosen value: libstdc++'s order would pick which token.
    let tied = |j: usize| values.get(j) == Some(&values[i]);
    if (i > 0 && tied(i - 1)) || tied(i + 1) {
        return None;
    }
    let v = values[i];
    let id = r.iter().position(|&x| x + 0.0 == v)? as u32;
    c.begin(r.len());
    c.data.push(TokenData { id, logit: r[id as usize], p: (weights[i] as f64 / sums[k]) as f32 });
    c.selected = Some(0);
    Some(id)
}

/// [`top_p_dist`]'s tries for draw `u` (the row has more than 1024 and fewer than 2^22
/// entries, its maximum `max` is finite). When one certifies the token, leaves it alone in `c`
/// and returns it, and whether equal values at its position were put in llama.cpp's order
/// ([`settle_tie`]); its `p` is its weight over `dist`'s sum for the earliest cut the bounds
/// allow, which is the array path's `p` when the cut is certain too.
///
/// Otherwise returns why not, where known, and leaves in `sum_hi` the least upper bound of the
/// softmax sum the tries found (untouched if none): `Short::Beyond` when the cut lies beyond
/// llama.cpp's first 256 entries for a lower bound `lo` of the softmax sum. It then does so for
/// the sum itself and for every later try: each `fl(w / S)` falls (weakly) as `S` grows past
/// `lo`, and so does every running f32 sum of them (rounded addition is monotone), so the mass
/// reached within the 256 only falls; the tries stop there.
#[allow(clippy::too_many_arguments)]
fn certain_top_p_draw(
    p: f32,
    min_keep: usize,
    r: &[f32],
    max: f32,
    u: f64,
    temp: Option<f32>,
    sum_hi: &mut f32,
    s: &mut Scratch,
    c: &mut Candidates,
) -> std::result::Result<(u32, bool), Option<Short>> {
    s.collector.reserve(s.block_max.len());
    // The tries (and `top_p_dist`'s exact sum after them) share one prefix cache: none from an
    // earlier row.
    s.prefix.live = false;
    let mut near = NearSums::new(r, 1.0, max, s).ok_or(None)?;
    let (mut lo, mut hi) = (1.0f32, f32::INFINITY);
    for far_mass in TOP_P_FAR_MASSES {
        let err = near.widen(far_mass, r, 1.0, max, s);
        let (l, h) = near.sequential_sum_bounds(err, r.len(), s);
        // Both intervals hold `S`: so does their intersection.
        (lo, hi) = (lo.max(l), hi.min(h));
        *sum_hi = hi;
        debug_assert!(lo <= hi, "disjoint bounds on one sum");
        if beyond_at(p, lo) {
            return Err(Some(Short::Beyond));
        }
        let cuts = sorted_prefix((p, min_keep), r, max, (lo, hi), Ties::Allowed, Reuse::Row, s, c).map_err(Some)?;
        // What the f32 running sum of `p_j` can have lost to rounding before the cut: at most
        // 2^-25 per addition (every running sum is below `p <= 1`), and at most the `p_j`
        // added, which is at most `w_j / lo` (rounded up).
        let lost = (r.len() as f64 * 2f64.powi(-25))
            .min(near.rounding_bound(2f64.powi(-25) * lo as f64) / lo as f64 * (1.0 + 2f64.powi(-22)))
            + r.len() as f64 * 2f64.powi(-149);
        if let Some((i, cut_sum)) = certain_draw(p, max, hi, lost, cuts, u, temp, s, c) {
            let replayed = settle_tie(i, r, s, c).ok_or(None)?;
            return Ok((select_prefix_entry(c, i, temp, cut_sum), replayed));
        }
    }
    Err(None)
}

/// Puts at position `i` of the descending prefix in `c` ([`sorted_prefix`]'s, over the row
/// `r`) the token llama.cpp's `top_p` has there: the prefix's values are the row's in order,
/// but equal values in any order, so where a neighbour holds the value at `i` (the prefix
/// holds the entry after its end, if there is one; entries outside it are smaller), which of
/// them sits at `i` is libstdc++'s order, replayed by [`top_p_order`]. `Some(true)` when it was
/// replayed, `Some(false)` when there was no tie; `None` when the replay could not run.
fn settle_tie(i: usize, r: &[f32], s: &mut Scratch, c: &mut Candidates) -> Option<bool> {
    let value = c.data[i].logit;
    if !((i > 0 && c.data[i - 1].logit == value) || c.data.get(i + 1).is_some_and(|t| t.logit == value)) {
        return Some(false);
    }
    let held = top_p_order(r, s)?.get(i)?;
    // The same values in both orders: a mismatch would be a bug, and is declined (the array
    // path decides) rather than turned into a wrong token.
    debug_assert_eq!(held.logit, value);
    if held.logit != value {
        return None;
    }
    c.data[i].id = held.id;
    Some(true)
}

/// llama.cpp `top_p`'s first sort of a row of more than 1024 entries, in its order: the
/// bucket partial sort of the top 256 ([`super::bucket_partial_sort`]: 128 buckets over
/// [-10, 10], the row scattered into them in id order, each bucket sorted by `std::sort` and
/// the last by `std::partial_sort`), replayed over only the entries of the buckets it sorts.
/// The sort reads the buckets from the top until they hold 256 entries, so it reads exactly
/// the entries at or above the least value of the bucket holding the 256th largest; given
/// those in id order, it does what it does on the whole row. `None` where the block maxima
/// cannot bound the top 256 ([`gather_top`]).
///
/// PERF: where the chosen value was tied, the array path (the row as an array of 12-byte
/// entries, its softmax, and this sort over all of it) took 1.9 ms at V = 128,256 on bf16
/// rows, a tenth of whose draws land on a tie; this reads the top's buckets only.
fn top_p_order<'s>(r: &[f32], s: &'s mut Scratch) -> Option<&'s [TokenData]> {
    const TOP: usize = 256;
    // The gathered entries change: `sorted_prefix`'s heap is gone.
    s.prefix.live = false;
    let tau = gather_top(TOP, r, s)?;
    // Every entry at or above `tau` is gathered, at least 256 of them: the 256th largest lies
    // in `tau`'s bucket or above. The buckets above are whole; in `tau`'s own, all of it is
    // needed when the buckets above hold fewer than 256.
    let b = super::bucket_of(tau);
    if s.gathered.iter().filter(|t| super::bucket_of(t.logit) > b).count() < TOP {
        let floor = super::bucket_floor(b);
        if floor < tau {
            gather_at_least(r, &s.block_max, &s.overlay, floor, &mut s.gathered, &mut s.blocks);
        }
    }
    super::bucket_partial_sort(&s.gathered, TOP, &mut s.top_p_order, &mut s.top_p_buckets);
    Some(&s.top_p_order[..TOP.min(s.top_p_order.len())])
}

/// Whether the block maxima alone put llama.cpp's `top_p(p)` cut beyond its first 256 entries
/// ([`beyond_at`]), on a row whose maximum is `max`: on a nearly flat row, where most blocks
/// reach within a nat of the maximum, their weights' f32 running sum in block order bounds
/// the softmax sum from below (the row's running sum adds the same weights in the same order,
/// and more; rounded addition is monotone and every weight non-negative). [`top_p_dist`]'s
/// tries would spend a bound on the sum and a prefix of 256 entries to learn the same (flat
/// rows at V = 32,000: about a tenth of the draw). Elsewhere one count of the maxima.
fn beyond_by_block_maxima(p: f32, max: f32, block_max: &[f32]) -> bool {
    if arch::count_ge(block_max, max - 1.0) * 2 <= block_max.len() {
        return false;
    }
    let lo = block_max.iter().fold(0.0f32, |sum, &bm| sum + (bm - max).exp());
    beyond_at(p, lo)
}

/// Whether llama.cpp's `top_p(p)` cut surely lies beyond its first 256 entries for a
/// softmax sum `lo`, whatever they are (a nearly flat row): none of their `fl32(w / lo)` is
/// above `fl32(1 / lo)` (every weight is at most the maximum's, 1), so their running f32
/// sum stays below `256 · (1 / lo) · (1 + 2^-24) · (1 + 2^-24)^256`; if that is below `p`, so
/// is every running sum within them. [`sorted_prefix`] would pop all 256 to find out.
fn beyond_at(p: f32, lo: f32) -> bool {
    lo > 0.0 && 256.0 / lo as f64 * (1.0 + 2f64.powi(-14)) < p as f64
}

/// Leaves entry `i` of the prefix in `c` alone, selected, as `dist` leaves it after the
/// temperature `temp` (if any): its logit scaled, and its weight over `cut_sum`; its token.
fn select_prefix_entry(c: &mut Candidates, i: usize, temp: Option<f32>, cut_sum: f64) -> u32 {
    let t = c.data[i];
    let weight = dist_weight(t.logit, c.data[0].logit, temp);
    let logit = temp.map_or(t.logit, |temp| t.logit / temp);
    c.begin(c.vocab_size);
    c.data.push(TokenData { logit, p: (weight as f64 / cut_sum) as f32, ..t });
    c.selected = Some(0);
    t.id
}

/// The largest temperature [`top_p_dist`] takes between `top_p` and `dist`: [`certain_draw`]'s
/// bound on the weights past the cut needs `t < 1` with room for rounding.
const TOP_P_TEMP_MAX: f32 = 0.999;

/// `dist`'s weight of an entry of logit `x` in `top_p`'s sorted prefix, whose first (largest)
/// logit is `first`, after llama.cpp's `temperature(temp)` if any: every logit divided by
/// `temp` in f32, then `expf(x' - first')` (the prefix stays sorted, so its first entry is
/// `dist`'s maximum).
fn dist_weight(x: f32, first: f32, temp: Option<f32>) -> f32 {
    match temp {
        Some(t) => (x / t - first / t).exp(),
        None => (x - first).exp(),
    }
}

/// [`top_p_dist`]'s test on the descending prefix in `c` ([`sorted_prefix`]'s, with its
/// cuts `k` at the lower and `k_hi` at the upper bound of the softmax sum, if found). The
/// actual cut `K` lies in `[k, k_hi]`. `dist` over the first `K` entries (after the
/// temperature `temp`, if any: see [`dist_weight`]) picks the first `i` whose running f64 sum
/// of weights `P(i + 1)` reaches `u · P(K)`, which grows with `K`: it is `dist`'s choice over
/// `k` when `P(i + 1) >= u · P(k_hi)`.
///
/// Without `k_hi`, `P(K)` is bounded from the mass. Without a temperature: if `K > k`, the
/// `K - 1` entries before it ran to an f32 sum `< p` of `p_j = fl(w_j / S)` (each at least
/// `(w_j / S)(1 - 2^-24)`), whose additions lost at most `lost` to rounding in all, so
/// `P(K - 1)` is at most about `S (p + lost)` with `S <= hi`, and the entry at `K` weighs at
/// most the one at `k`. With a temperature `t < 1`, that bound `U` on the weights `w_j` at
/// `t = 1` bounds their sum past `k`, `U - P₁(k)`, and each entry there weighs less at `t`
/// than at 1 by a factor that only shrinks down the prefix: with `d_j = x_0 - x_j >= d_k`, its
/// exact weights `e^(-d_j / t) = e^(-d_j) e^(-d_j (1/t - 1))`. Rounding (see
/// [`temperature_tail_factor`]) moves that by a few ulps.
///
/// Returns `i` and `P(k)` when certain.
#[allow(clippy::too_many_arguments)]
fn certain_draw(
    p: f32,
    max: f32,
    hi: f32,
    lost: f64,
    (k, k_hi): (usize, Option<usize>),
    u: f64,
    temp: Option<f32>,
    s: &mut Scratch,
    c: &Candidates,
) -> Option<(usize, f64)> {
    if k == 0 || k > c.data.len() {
        return None;
    }
    // The running f64 sums of the weights, in `dist`'s order (the prefix is descending, so
    // its first entry, the row's maximum, is `dist`'s).
    debug_assert!(c.data[0].logit == max);
    let sums = &mut s.top_weights;
    sums.clear();
    sums.push(0.0);
    let mut running = 0.0f64;
    for t in &c.data {
        running += dist_weight(t.logit, max, temp) as f64;
        sums.push(running);
    }
    // One exists: `u < 1`.
    let i = sums[1..=k].partition_point(|&run| run < sums[k] * u).min(k - 1);
    let upper = match (k_hi, temp) {
        (Some(k_hi), _) => sums[k_hi],
        (None, None) => {
            let last = sums[k] - sums[k - 1];
            // The f32 division's and the f64 sums' roundings, generously.
            ((hi as f64 * (p as f64 + lost) + last) * (1.0 + 2f64.powi(-20))).max(sums[k])
        }
        (None, Some(t)) => {
            // The entry past the prefix bounds every later one (no bound without it).
            let next = c.data.get(k)?.logit;
            let w = |x: f32| (x - max).exp() as f64;
            let (at_k, last) = (c.data[..k].iter().map(|e| w(e.logit)).sum::<f64>(), w(c.data[k - 1].logit));
            let mass = (hi as f64 * (p as f64 + lost) + last) * (1.0 + 2f64.powi(-20));
            let past = (mass - at_k).max(0.0) * temperature_tail_factor(t, max, next);
            // The f64 sums' roundings, and weights that underflowed, generously.
            (sums[k] + past) * (1.0 + 2f64.powi(-30)) + c.vocab_size as f64 * 2f64.powi(-120)
        }
    };
    (sums[i + 1] >= upper * u).then(|| (i, sums[k]))
}

/// A factor `G` such that `dist`'s weight of an entry of logit `x <= next` after llama.cpp's
/// `temperature(t)` (`t <= TOP_P_TEMP_MAX`), `v = expf(fl(fl(x / t) - fl(x_0 / t)))`, is at
/// most `G · w` for its weight `w = expf(fl(x - x_0))` at `t = 1`, `x_0` the maximum (give
/// or take `2^-149` on either side where `v` or `w` is subnormal: [`certain_draw`] adds room
/// for that per entry).
///
/// With `d = x_0 - x >= d_k = x_0 - next`: both quotients and the difference round by at most
/// `2^-24` relatively, and `|x| <= |x_0| + d`, so the exponent is at most
/// `-(d / t)(1 - 2^-23) + ε` with `ε = 2^-23 |x_0| / t`; `expf` adds at most an ulp. And
/// `w >= q (1 - 2^-23)` with `q = e^(-d (1 + 2^-24))`. So with `t'' = t (1 + 2^-24) / (1 -
/// 2^-23) < 1`, `v <= (1 + 2^-23) e^ε q^(1/t'')` and `q^(1/t'') = q · q^(1/t'' - 1) <= q ·
/// q_k^(1/t'' - 1)`, `q` being at most `q_k = e^(-d_k (1 + 2^-24))`.
fn temperature_tail_factor(t: f32, x_0: f32, next: f32) -> f64 {
    let (t, x_0, d_k) = (t as f64, x_0 as f64, (x_0 as f64 - next as f64).max(0.0));
    let t2 = t * (1.0 + 2f64.powi(-24)) / (1.0 - 2f64.powi(-23));
    let eps = 2f64.powi(-23) * x_0.abs() / t;
    let shrink = (-d_k * (1.0 + 2f64.powi(-24)) * (1.0 / t2 - 1.0)).exp();
    (1.0 + 2f64.powi(-23)) / (1.0 - 2f64.powi(-23)) * eps.exp() * shrink * (1.0 + 2f64.powi(-40))
}

/// `greedy` on the row + overlay: the first entry holding the maximum.
fn greedy(r: &[f32], summary: Summary, s: &mut Scratch, c: &mut Candidates) -> Result<u32> {
    let (id, logit) = if s.overlay.is_empty() {
        let start = summary.max_block * BLOCK;
        let block = &r[start..(start + BLOCK).min(r.len())];
        let i = block.iter().position(|&x| x == summary.max).unwrap_or(0);
        ((start + i) as u32, block[i])
    } else {
        match gather_top(1, r, s) {
            Some(_) => {
                let max = s.gathered.iter().fold(f32::NEG_INFINITY, |m, t| m.max(t.logit));
                let t = s.gathered.iter().find(|t| t.logit == max).copied().unwrap_or_default();
                (t.id, t.logit)
            }
            None => {
                // Fewer blocks than overlay entries: a plain scan of row + overlay.
                let mut best = (0u32, f32::NEG_INFINITY);
                let mut edits = s.overlay.iter().peekable();
                for (i, &x) in r.iter().enumerate() {
                    let x = match edits.peek() {
                        Some(&&(id, v)) if id as usize == i => {
                            edits.next();
                            v
                        }
                        _ => x,
                    };
                    if x > best.1 || i == 0 {
                        best = (i as u32, x);
                    }
                }
                best
            }
        }
    };
    if logit == f32::NEG_INFINITY {
        c.begin(r.len());
        return Err(Error::no_candidates("greedy"));
    }
    c.begin(r.len());
    c.data.push(TokenData { id, logit, p: 0.0 });
    c.selected = Some(0);
    Ok(id)
}

/// Whether sampling starts with `greedy` (either convention's: on an unprocessed row both pick
/// the lowest id among the maxima).
fn greedy_first(stages: &[Stage], need: Need) -> bool {
    need == Need::Token
        && matches!(stages.iter().find(|st| !st.is_inert()), Some(Stage::Greedy(_) | Stage::HfGreedy(_)))
}

/// A leading `greedy`'s start: the row validated where its `summary` saw a NaN or `+inf`
/// (the candidates left empty on an error), no overlay, the summary and the path recorded.
fn start_greedy(row: Logits<'_>, summary: Summary, s: &mut Scratch, c: &mut Candidates) -> Result<()> {
    if summary.suspect {
        if let Err(e) = row.validate() {
            c.begin(0);
            return Err(e);
        }
    }
    s.overlay.clear();
    s.summary = Some(summary);
    s.path = Path::Fast("greedy");
    Ok(())
}

/// [`greedy`] on a half-precision row from its `summary` alone (no overlay: `greedy` comes
/// first): the maximum's block widened, the first entry equal to the maximum in it.
fn greedy_half(row: Logits<'_>, summary: Summary, s: &mut Scratch, c: &mut Candidates) -> Result<u32> {
    start_greedy(row, summary, s, c)?;
    let start = summary.max_block * BLOCK;
    let id = (start..(start + BLOCK).min(row.len())).find(|&i| row.get(i) == summary.max).unwrap_or(start);
    let logit = row.get(id);
    c.begin(row.len());
    if logit == f32::NEG_INFINITY {
        return Err(Error::no_candidates("greedy"));
    }
    c.data.push(TokenData { id: id as u32, logit, p: 0.0 });
    c.selected = Some(0);
    Ok(id as u32)
}

/// `[temperature(t > 0);] dist` on the untouched row (when sampling). `None`: not this chain.
fn dist(
    stages: &mut [Stage],
    first: usize,
    r: &[f32],
    summary: Summary,
    s: &mut Scratch,
    c: &mut Candidates,
) -> Result<Option<Prepared>> {
    let (t, at) = match &stages[first] {
        Stage::Temperature(x) if x.t() > 0.0 => (x.t(), first + 1),
        Stage::TempExt(x) => match x.plain_temperature() {
            Some(t) if t > 0.0 => (t, first + 1),
            _ => return Ok(None),
        },
        Stage::Dist(_) => (1.0, first),
        _ => return Ok(None),
    };
    let Some(Stage::Dist(d)) = stages.get_mut(at) else { return Ok(None) };
    if summary.max == f32::NEG_INFINITY {
        c.begin(r.len());
        return Err(Error::no_candidates("dist"));
    }
    // Division by a positive t is monotone, so the maximum of the scaled logits is this.
    let max = summary.max / t;
    if !max.is_finite() {
        return Ok(None);
    }
    let u = d.draw();
    if let Some((id, exact_pass)) = locate_draw(r, t, max, u, s) {
        let logit = r[id as usize] / t;
        let sum = total(&s.block_sums);
        c.begin(r.len());
        c.data.push(TokenData { id, logit, p: ((logit - max).exp() as f64 / sum) as f32 });
        c.selected = Some(0);
        s.path = Path::Fast(if exact_pass { "dist (exact sums)" } else { "dist" });
        return Ok(Some(Prepared::Selected(id)));
    }
    // Not provable: the array path, with the draw already made.
    array_with_draw(stages, (s.row_applied, at), r, u, c)
}

/// The index llama.cpp's `dist` selects for draw `u` over `w_i = expf(r_i / t - max)`:
/// the first `i` whose running f64 sum reaches `u · Σ w` (both sums in row order). Computes
/// per-block sums instead, first of cheap approximate weights, then (if that cannot decide) of
/// the exact ones; returns the index only when the target is farther than the error bound of
/// those sums from both ends of entry `i`'s interval, and whether the exact pass was needed.
fn locate_draw(r: &[f32], t: f32, max: f32, u: f64, s: &mut Scratch) -> Option<(u32, bool)> {
    // Either order of f64 summation is within (V + 8) half-ulps of the exact sum of the
    // weights (each weight an f32, every partial sum <= the total); the approximate weights
    // add their own bound.
    let rounding = (r.len() as f64 + 8.0) * f64::EPSILON * 2.0;
    if let Some(mut near) = NearSums::new(r, t, max, s) {
        for far_mass in DRAW_FAR_MASSES {
            let err = near.widen(far_mass, r, t, max, s);
            if let Some(i) = crossing(r, t, max, u, err, rounding, s) {
                return Some((i, false));
            }
        }
    } else {
        s.block_sums.resize(r.len().div_ceil(BLOCK), 0.0);
        let approx_err = arch::exp_block_sums_approx(r, t, max, &mut s.block_sums);
        if let Some(i) = crossing(r, t, max, u, approx_err, rounding, s) {
            return Some((i, false));
        }
    }
    arch::exp_block_sums(r, t, max, &mut s.block_sums);
    crossing(r, t, max, u, 0.0, 2.0 * rounding, s).map(|i| (i, true))
}

/// The masses a draw's successive tries leave unexponentiated ([`NearSums`]). A try cannot
/// certify a draw landing within about its mass of an interval's end (or among tokens lighter
/// than that); the next try then computes the blocks it newly needs, and the last one
/// exponentiates all of them. The first tries are coarse because most draws land on the few
/// heavy tokens, far from their intervals' ends, and the cheap tier makes a coarse try nearly
/// free; over 16 peaked rows per size (`t = 0.8`) this ladder took 10–20% less time than
/// 2^-10, 2^-17, 0.
pub(crate) const DRAW_FAR_MASSES: [f64; 5] = [1.0 / 16.0, 1.0 / 256.0, 1.0 / 4096.0, 1.0 / 131_072.0, 0.0];

/// Rungs of [`NearSums`]: half a nat each, the last for everything from 63.5 nats down.
const RUNGS: usize = 128;

/// Approximate block sums of the weights `w = exp(fl32(fl32(r / t) - max))` computed only for
/// the blocks that can matter, for locating a draw or bounding the softmax sum.
///
/// Three tiers, from free to accurate:
/// * **Far.** Every block gets a *rung* `k` (half-nat steps below the maximum) such that each
///   of its weights is at most `e^(-k/2)`, from the block's maximum. [`NearSums::widen`]
///   chooses a cut: the blocks on the rungs from the far end up to it contribute at most
///   `BLOCK · e^(-k/2)` each, within a share of the given mass; they stay at 0 in
///   `s.block_sums`.
/// * **Cheap.** The other blocks first get [`arch::cheap_block_sums_at`]'s sums of upper
///   bounds (a multiply-add and a conversion per weight), which pin each block's sum within
///   about ±3%: `s.block_sums` holds the middle of that interval. (Not the blocks on the rungs
///   nearest the maximum when, by their rungs alone, the tier could not keep them:
///   [`CheapTier::reach`].) The rung bound is up to 64
///   times a block's sum, this one 6%, so far more blocks can be left unexponentiated.
/// * **Accurate.** The blocks with the widest cheap intervals, until those left fit the rest
///   of the mass, get [`arch::exp_block_sums_approx_at`]'s sums.
///
/// A later, smaller mass moves both cuts and computes only the blocks that newly need it; a
/// mass of 0 exponentiates every block. The sum of the weights is at least 1 (the maximum's
/// weight), so a mass is also a bound relative to it. Where the cheap kernel does not apply,
/// the far tier's cut takes the whole mass and every other block is exponentiated.
pub(crate) struct NearSums {
    hist: [u32; RUNGS],
    /// One above the highest rung holding a block (0 for none).
    top: usize,
    /// The blocks on rungs `>= cut` are not exponentiated (yet).
    cut: usize,
    /// The bound on any run of the exponentiated blocks.
    approx_err: f64,
    /// The cheap tier, `None` where [`arch::cheap_block_sums_at`] does not apply.
    cheap: Option<CheapTier>,
}

/// [`NearSums`]' cheap tier: the blocks held at their cheap estimates, grouped by the f32
/// exponent of their cheap sums `x` (a factor of 2 apart; `s.cheap_group` has each block's
/// group): `s.cheap_groups[j][e]` sums the `x` of group `e` (four interleaved sets, so that
/// neighbouring blocks in one group do not wait on each other's additions). The groups from
/// `above` up are empty: their blocks were exponentiated.
struct CheapTier {
    interval: CheapInterval,
    /// The lowest group holding a block, and one above the highest.
    lowest: usize,
    above: usize,
    /// How many blocks the tier holds.
    held: usize,
}

/// `s.cheap_group` of a block outside the cheap tier: above every group of a finite sum
/// (whose f32 exponent field is at most 254), so never in a range of groups that hold blocks.
const NOT_CHEAP: u8 = 255;

/// The share of a mass [`NearSums::widen`] gives the far tier (the rest goes to the cheap one).
const FAR_SHARE: f64 = 0.5;

/// What the far tier counts for each block on rung `k` (summed into `s.far_at` by
/// [`NearSums::new`]): `BLOCK · e^(-k/2)`, with `expf`'s rounding (under an ulp) and the
/// recurrence's (2^-40 per step) on top, from the far end down. PERF: a table, where the
/// recurrence ran in `widen`'s loop over the rungs, a chain of dependent multiplies on every
/// try.
static FAR_BOUNDS: std::sync::LazyLock<[f64; RUNGS]> = std::sync::LazyLock::new(|| {
    let step = 0.5f64.exp() * (1.0 + 1.0 / (1u64 << 40) as f64);
    let mut bound = (-((RUNGS - 1) as f64) / 2.0).exp() * (1.0 + 1.0 / 4_194_304.0) * BLOCK as f64;
    let mut bounds = [0.0; RUNGS];
    for b in bounds.iter_mut().rev() {
        *b = bound;
        bound *= step;
    }
    bounds
});

impl NearSums {
    /// The rungs of the blocks of the row [`prepare`] summarised (`s.block_sums` zeroed).
    /// `None` if it was not.
    pub(crate) fn new(r: &[f32], t: f32, max: f32, s: &mut Scratch) -> Option<Self> {
        let nb = r.len().div_ceil(BLOCK);
        if s.block_max.len() != nb {
            return None;
        }
        // In f32, so that the loop vectorises: with `p = fl32(bm · fl32(2 / t))` (clamped, so
        // that -inf blocks land on the last rung) and `m2 = 2 max`, `v = fl32(m2 - p)` is
        // within `2^-21 (|p| + |m2|)` of twice the exact `max - bm / t`, and that in turn
        // within `2^-22 (|p| + |m2|)` of `-2x` for llama.cpp's argument
        // `x = fl32(fl32(bm / t) - max)`: subtracting `2^-19 (|p| + |m2|)` leaves a lower bound
        // on `-2x` (with room for this line's own roundings). NaN cannot occur; the rung is
        // the bound's floor, clamped.
        let (s2, m2) = (2.0 / t, 2.0 * max);
        if !(s2.is_finite() && m2.is_finite()) {
            return None;
        }
        s.rungs.resize(nb, 0);
        arch::rungs(&s.block_max, s2, m2, (RUNGS - 1) as f32, &mut s.rungs);
        // Four histograms, so that neighbouring blocks on one rung do not wait on each other's
        // increments. PERF: `temperature;dist` at V = 32,000 (Intel Xeon, alternating call by
        // call) took 3.06–3.12 µs with four against 3.18–3.22 with eight, and 4.23–4.28
        // against 4.29–4.36 with two: clearing and merging more copies costs more than the
        // waits they save.
        let mut hists = [[0u32; RUNGS]; 4];
        let quads = s.rungs.chunks_exact(4);
        for &k in quads.remainder() {
            hists[0][k as usize] += 1;
        }
        for q in quads {
            for (h, &k) in hists.iter_mut().zip(q) {
                h[k as usize] += 1;
            }
        }
        let mut hist = hists[0];
        for h in &hists[1..] {
            hist.iter_mut().zip(h).for_each(|(a, b)| *a += b);
        }
        s.block_sums.clear();
        s.block_sums.resize(nb, 0.0);
        s.cheap.resize(nb, 0.0);
        s.cheap_group.clear();
        s.cheap_group.resize(nb, NOT_CHEAP);
        // Room for every block up front: a later try may list more blocks than any before.
        s.near.clear();
        s.near.reserve(nb);
        // Whether the cheap kernel applies (it computes nothing for an empty list).
        let cheap = arch::cheap_block_sums_at(r, t, max, &[], &mut s.cheap).map(|rho| {
            // Clear what the last tier left.
            s.cheap_groups.resize(4, [0.0; 256]);
            let (lowest, above) = std::mem::replace(&mut s.cheap_live, (256, 0));
            if lowest < above {
                s.cheap_groups.iter_mut().for_each(|g| g[lowest..above].fill(0.0));
            }
            CheapTier { interval: CheapInterval::new(rho), lowest: 256, above: 0, held: 0 }
        });
        let top = hist.iter().rposition(|&n| n > 0).map_or(0, |k| k + 1);
        // From the far end, as `widen` moves its cut: each rung's blocks at their bound
        // ([`FAR_BOUNDS`]); the empty rungs above `top` add nothing. PERF: once per row, where
        // each try summed them again (a chain of dependent additions).
        let bounds = &*FAR_BOUNDS;
        s.far_at.clear();
        s.far_at.resize(RUNGS + 1, 0.0);
        let mut far = 0.0f64;
        for k in (0..top).rev() {
            far += hist[k] as f64 * bounds[k];
            s.far_at[k] = far;
        }
        Some(Self { hist, top, cut: 0, approx_err: 0.0, cheap })
    }

    /// Moves the cuts until the blocks not exponentiated may hold at most `far_mass` (never
    /// back), computes the blocks that newly need it, and returns the bound on any run of
    /// `s.block_sums` against the exact weights' sums.
    pub(crate) fn widen(&mut self, far_mass: f64, r: &[f32], t: f32, max: f32, s: &mut Scratch) -> f64 {
        // The cheap tier is of no use to a try that leaves it no mass (its blocks are then all
        // exponentiated below).
        let cheap_new = self.cheap.is_some() && far_mass > 0.0;
        let far_budget = if cheap_new { far_mass * FAR_SHARE } else { far_mass };
        // The far tier: the rungs from the far end down while their blocks' bound
        // (`s.far_at`, which only grows on the way down) fits the budget.
        let mut cut = self.top.max(self.cut);
        while cut > self.cut && s.far_at[cut - 1] <= far_budget {
            cut -= 1;
        }
        let far = s.far_at[cut];
        if cut > self.cut {
            // The blocks between the cuts, in order. PERF: 32 rungs per compare and no branch
            // per block, where a loop over 8 rungs at a time and their set bits mispredicted
            // its exits.
            let from = self.cut;
            self.cut = cut;
            // The rungs the cheap tier could not keep go straight to the accurate one.
            let cheap_from = match &self.cheap {
                Some(tier) if cheap_new => tier.reach(&self.hist, &s.far_at, from, cut, far_mass - far),
                _ => cut,
            };
            if cheap_from > from {
                s.near.clear();
                arch::positions_in_range(&s.rungs, from as u8, cheap_from as u8, &mut s.near);
                self.approx_err += arch::exp_block_sums_approx_at(r, t, max, &s.near, &mut s.block_sums);
            }
            if let Some(tier) = self.cheap.as_mut().filter(|_| cheap_new && cut > cheap_from) {
                s.near.clear();
                arch::positions_in_range(&s.rungs, cheap_from as u8, cut as u8, &mut s.near);
                tier.add(r, t, max, s);
            }
        }
        let cheap_err = match &mut self.cheap {
            Some(tier) => {
                let (err, to_exponentiate) = tier.settle(far_mass - far, s);
                if to_exponentiate {
                    self.approx_err += arch::exp_block_sums_approx_at(r, t, max, &s.near, &mut s.block_sums);
                }
                err
            }
            None => 0.0,
        };
        self.approx_err + far + cheap_err
    }
}

impl NearSums {
    /// Bounds `(lo, hi)` on llama.cpp's f32 softmax sum in row order (the weights at `t = 1`
    /// added one by one from 0, over a row of fewer than 2^22 entries), from the bound `err`
    /// that the last [`NearSums::widen`] returned (see [`top_p_dist`] for the argument).
    fn sequential_sum_bounds(&self, err: f64, n: usize, s: &Scratch) -> (f32, f32) {
        let est = total(&s.block_sums);
        // The f64 sums (in blocks, then in total) and the flushed or subnormal weights, as in
        // `crossing`'s exact pass.
        let rounding = (n as f64 + 8.0) * f64::EPSILON * 4.0;
        let t_err = err + est * rounding + n as f64 * 1.2e-38;
        let (t_lo, t_hi) = (est - t_err, est + t_err);
        // Each f32 addition multiplies by at most 1 + 2^-24, so the f32 sum is at most
        // `(1 + 2^-24)^n <= e^(n 2^-24) <= 1 + n 2^-23` (as `n < 2^22`) times the exact one:
        // `h` is half an ulp of that bound's binade, so at least half an ulp of any running
        // sum.
        let above = t_hi * (1.0 + n as f64 * 2f64.powi(-23));
        let binade = ((above.to_bits() >> 52) & 0x7ff) as i32 - 1023;
        let round = self.rounding_bound(2f64.powi(binade - 24));
        // The sum holds the maximum's weight, 1: it is at least 1.
        (f32_at_most(t_lo - round).max(1.0), f32_at_least(t_hi + round))
    }

    /// A bound on `Σ min(w, h)` over every weight `w` of the row, each under its block's rung
    /// bound.
    fn rounding_bound(&self, h: f64) -> f64 {
        // Four partial sums, so that the additions do not wait on each other.
        let mut parts = [0.0f64; 4];
        for (hist, bounds) in self.hist.chunks_exact(4).zip(RUNG_BOUNDS.chunks_exact(4)) {
            for ((part, &blocks), &bound) in parts.iter_mut().zip(hist).zip(bounds) {
                *part += blocks as f64 * bound.min(h);
            }
        }
        // 128 f64 additions round by far less than 2^-40 of the sum.
        ((parts[0] + parts[1]) + (parts[2] + parts[3])) * BLOCK as f64 * (1.0 + 1.0 / (1u64 << 40) as f64)
    }
}

/// Every weight of a block on rung `k` is at most `e^(-k/2)` ([`NearSums`]); this is that, with
/// room for `expf`'s rounding (under an f32 ulp) and `exp`'s.
static RUNG_BOUNDS: std::sync::LazyLock<[f64; RUNGS]> =
    std::sync::LazyLock::new(|| std::array::from_fn(|k| (-(k as f64) / 2.0).exp() * (1.0 + 2f64.powi(-21))));

/// A bound below every `y` whose division by `div > 0` rounds to at least `bound`:
/// `fl32(y / div) >= bound` implies `y / div >= bound - ulp(bound)` (round to nearest moves a
/// value by at most half an ulp, and `|bound| 2^-23 + 2^-149` covers an ulp of any float at
/// or below `bound` in magnitude), so `y >= (bound - |bound| 2^-22 - 2^-148) div`, computed
/// in f64 with a relative margin for its own roundings. `-inf` stays `-inf`.
pub(crate) fn undivided_floor(bound: f64, div: f32) -> f64 {
    let y = (bound - bound.abs() * 2f64.powi(-22) - 2f64.powi(-148)) * div as f64;
    y - y.abs() * 2f64.powi(-40)
}

/// The largest f32 at most `x` (`x` not NaN).
pub(crate) fn f32_at_most(x: f64) -> f32 {
    let f = x as f32;
    if f as f64 > x {
        f.next_down()
    } else {
        f
    }
}

/// The smallest f32 at least `x` (`x` not NaN).
pub(crate) fn f32_at_least(x: f64) -> f32 {
    let f = x as f32;
    if (f as f64) < x {
        f.next_up()
    } else {
        f
    }
}

impl CheapTier {
    /// The nearest rung in `from..=to` from which on the tier may keep the blocks on the rungs
    /// `from..to` within `budget`; `to` when it can keep none of them. Those nearer go straight
    /// to the accurate tier: [`CheapTier::settle`] would only send them there after their
    /// cheap sums were computed. A block's cheap sum is at least its largest weight, about
    /// `e^(-(k + 1)/2)` on rung `k` or more, which is `e^(-1/2)/BLOCK` of what the far tier
    /// counts for it (`far_at`, `hist` the blocks per rung), so its interval is at least about
    /// that times the relative half-width. Going from the far end, the first rung whose blocks
    /// overflow the budget stays in the tier when it could keep at least half of them.
    ///
    /// PERF: on a nearly flat row every block sits on rung 0, within half a nat of the
    /// maximum, and a draw's first try gave all of them cheap sums, then exponentiated them
    /// all anyway: `temperature;dist` went from 21.7 to 16.1 µs at V = 32,000 and from 100 to
    /// 73 µs at 128,256 (one process, alternating), peaked and real rows unchanged.
    fn reach(&self, hist: &[u32; RUNGS], far_at: &[f64], from: usize, to: usize, budget: f64) -> usize {
        let per_far = self.interval.half_width((-0.5f64).exp() / BLOCK as f64);
        let need = |k: usize| (far_at[k] - far_at[to]) * per_far;
        let mut k = to;
        while k > from && need(k - 1) <= budget {
            k -= 1;
        }
        if k == from {
            return from;
        }
        // Rung `k - 1` overflows: how many of its blocks would fit.
        let each = (far_at[k - 1] - far_at[k]) * per_far / hist[k - 1].max(1) as f64;
        let room = (budget - need(k)).max(0.0) / each;
        if 2.0 * room >= hist[k - 1] as f64 {
            k - 1
        } else {
            k
        }
    }

    /// Takes the blocks listed in `s.near` into the tier: their cheap sums, their estimates in
    /// `s.block_sums`, their groups.
    fn add(&mut self, r: &[f32], t: f32, max: f32, s: &mut Scratch) {
        arch::cheap_block_sums_at(r, t, max, &s.near, &mut s.cheap);
        let c = self.interval;
        // The range in locals: as fields of `self` they were stored back on every block.
        let (mut lowest, mut above) = (self.lowest, self.above);
        let (cheap, sums, groups, tags) = (&s.cheap, &mut s.block_sums, &mut s.cheap_groups, &mut s.cheap_group);
        for (i, &b) in s.near.iter().enumerate() {
            let x = cheap[b as usize];
            sums[b as usize] = c.mid(x);
            let e = group(x);
            groups[i & 3][e] += x as f64;
            tags[b as usize] = e as u8;
            lowest = lowest.min(e);
            above = above.max(e + 1);
        }
        // Sums of weights at most 1 are finite: `settle`'s ranges of groups fit in a byte.
        debug_assert!(above <= usize::from(NOT_CHEAP), "a cheap sum that is not finite");
        (self.lowest, self.above) = (lowest, above);
        self.held += s.near.len();
        s.cheap_live = (lowest, above);
    }

    /// Chooses the blocks to exponentiate, the widest intervals first, until the half-widths
    /// of those left sum to at most about `budget` (all of them for a budget of 0): whole
    /// groups, the narrowest kept while they fit. Lists them in `s.near` (and returns `true`)
    /// unless there are none; returns the bound of the blocks left, from the f64 sums of their
    /// groups (each within `2^-40` relative of the exact sum for any row).
    fn settle(&mut self, budget: f64, s: &mut Scratch) -> (f64, bool) {
        let c = self.interval;
        let mut kept = 0.0f64;
        let mut keep_below = self.lowest;
        while keep_below < self.above {
            let x: f64 = s.cheap_groups.iter().map(|g| g[keep_below]).sum();
            let with = kept + c.half_width(x);
            if with > budget || budget <= 0.0 {
                break;
            }
            kept = with;
            keep_below += 1;
        }
        if keep_below >= self.above {
            // Room for the blocks' own `a` terms and the sums' rounding.
            return (kept * (1.0 + 2f64.powi(-40)) + self.held as f64 * c.abs(), false);
        }
        s.cheap_groups.iter_mut().for_each(|g| g[keep_below..self.above].fill(0.0));
        // The blocks of the groups that leave, by one vector scan of the blocks' group bytes.
        // PERF: compacting the list of the tier's blocks instead, a dependent load and a
        // branchless select per block on every try, was half of `widen` on the real row at
        // V = 128,256.
        s.near.clear();
        // `above <= 255`: groups of finite sums are at most 254.
        arch::positions_in_range(&s.cheap_group, keep_below as u8, self.above as u8, &mut s.near);
        for &b in &s.near {
            s.cheap_group[b as usize] = NOT_CHEAP;
        }
        self.above = keep_below;
        self.held -= s.near.len();
        s.cheap_live = (self.lowest, self.above);
        (kept * (1.0 + 2f64.powi(-40)) + self.held as f64 * c.abs(), true)
    }
}

/// The group of a cheap sum: its f32 exponent field.
#[inline]
fn group(x: f32) -> usize {
    (x.to_bits() >> 23) as usize & 255
}

/// The interval a cheap block sum `x` pins the block's weights to (see
/// [`arch::cheap_block_sums_at`]), `[x / (CHEAP_SPREAD·(1 + rho)) - a, x·(1 + rho) + a]` with
/// `a = BLOCK·2^-125`, as its middle and half-width (both linear in `x`).
#[derive(Clone, Copy)]
struct CheapInterval {
    mid: f64,
    half: f64,
}

impl CheapInterval {
    fn new(rho: f64) -> Self {
        let (hi, lo) = (1.0 + rho, 1.0 / (arch::CHEAP_SPREAD * (1.0 + rho)));
        Self { mid: (hi + lo) * 0.5, half: (hi - lo) * 0.5 }
    }

    #[inline]
    fn mid(self, x: f32) -> f64 {
        x as f64 * self.mid
    }

    /// The half-width for a block or a group's sum `x`, without the `a` terms.
    #[inline]
    fn half_width(self, x: f64) -> f64 {
        x * self.half
    }

    /// A block's `a`.
    fn abs(self) -> f64 {
        BLOCK as f64 * 2f64.powi(-125)
    }
}

/// The crossing of `u · Σ` over `s.block_sums` (absolute error `abs` on any run of blocks,
/// plus relative error `rel`), resolved inside the block with exact weights; `None` unless
/// certain.
///
/// `abs` must be a sum of non-negative bounds, one per block (as [`NearSums`]' tiers and the
/// approximate kernels' are: per weight, or per block): then the distance from the target to
/// the running sum before the crossing block, `u·Σ - P`, errs by `u·e' - (1 - u)·e` (`e`, `e'`
/// the errors of the blocks before it and of the others), at most `max(u, 1 - u)·abs`, where
/// the two errors bounded apart would take `2·abs`. (`rel`, the roundings of the f64 sums in
/// different orders, counts twice.)
fn crossing(r: &[f32], t: f32, max: f32, u: f64, abs: f64, rel: f64, s: &mut Scratch) -> Option<u32> {
    let sum = total(&s.block_sums);
    // Flushed or subnormal weights: at most 2^-126 each.
    let margin = u.max(1.0 - u) * abs + 2.0 * (sum * rel + r.len() as f64 * 1.2e-38);
    let target = sum * u;
    let (b, before) = crossing_block(&s.block_sums, target)?;
    let start = b * BLOCK;
    let block = &r[start..(start + BLOCK).min(r.len())];
    s.weights.resize(BLOCK, 0.0);
    let w = &mut s.weights[..block.len()];
    arch::exp_shifted(block, t, max, w);
    let mut running = before;
    for (j, &wj) in w.iter().enumerate() {
        let prev = running;
        running += wj as f64;
        if running >= target {
            let certain = prev + margin < target && target + margin <= running;
            return certain.then_some((start + j) as u32);
        }
    }
    None
}

/// The sum of `v` in f64, in four interleaved parts (not sequentially: a sum of every block is
/// latency-bound otherwise). Callers bound the rounding of any order of summation.
pub(crate) fn total(v: &[f64]) -> f64 {
    let mut parts = [0.0f64; 4];
    let quads = v.chunks_exact(4);
    let rest: f64 = quads.remainder().iter().sum();
    for q in quads {
        parts.iter_mut().zip(q).for_each(|(p, x)| *p += x);
    }
    (parts[0] + parts[1]) + (parts[2] + parts[3]) + rest
}

/// The first block whose running f64 sum of `block_sums` reaches `target`, and the sum of the
/// blocks before it. The running sum goes by groups of 8 blocks (each summed as a tree) and
/// then block by block inside the group that reaches `target`: a different order of
/// summation than a sequential one, which callers' bounds cover.
pub(crate) fn crossing_block(block_sums: &[f64], target: f64) -> Option<(usize, f64)> {
    let mut before = 0.0f64;
    for (g, group) in block_sums.chunks(8).enumerate() {
        let sum = match group {
            [a, b, c, d, e, f, g, h] => ((a + b) + (c + d)) + ((e + f) + (g + h)),
            _ => group.iter().sum(),
        };
        if before + sum >= target {
            for (i, &bs) in group.iter().enumerate() {
                let after = before + bs;
                if after >= target {
                    return Some((g * 8 + i, before));
                }
                before = after;
            }
        } else {
            before += sum;
        }
    }
    None
}

/// Raw logprobs of the row [`prepare`] last summarised, as [`logprobs::raw`](crate::logprobs::raw)
/// defines them, the top `n` by threshold selection over the block maxima (ties to the lower
/// id). `None` when this row was not summarised or `n` is too large for
/// the block bound; the caller then uses the scanning implementation.
pub(crate) fn raw_logprobs(
    row: Logits<'_>,
    token: u32,
    n: usize,
    out: &mut Vec<crate::logprobs::TokenLogprob>,
    s: &mut Scratch,
) -> Option<f32> {
    let summary = s.summary?;
    let mut widened = std::mem::take(&mut s.widened);
    match row {
        Logits::F16(h) if !s.widened_now => arch::widen_f16(h, &mut widened),
        Logits::Bf16(b) if !s.widened_now => arch::widen_bf16(b, &mut widened),
        _ => {}
    }
    if !s.widened_now {
        s.widened_at = 0..row.len();
    }
    s.widened_now = !matches!(row, Logits::F32(_));
    let r: &[f32] = match row {
        Logits::F32(r) => r,
        _ => &widened[s.widened_at.clone()],
    };
    let result = raw_logprobs_f32(r, summary, token, n, out, s);
    s.widened = widened;
    result
}

fn raw_logprobs_f32(
    r: &[f32],
    summary: Summary,
    token: u32,
    n: usize,
    out: &mut Vec<crate::logprobs::TokenLogprob>,
    s: &mut Scratch,
) -> Option<f32> {
    if summary.max == f32::NEG_INFINITY {
        return None;
    }
    let blocks = r.len().div_ceil(BLOCK);
    if s.block_max.len() != blocks {
        // The greedy path located the maximum without the block maxima.
        s.block_max.resize(blocks, f32::NEG_INFINITY);
        arch::block_max_into(r, &mut s.block_max);
    }
    out.clear();
    out.reserve(n + 1);
    if n > 0 {
        let tau = threshold(n, summary.max, s)?;
        gather_at_least(r, &s.block_max, &[], tau, &mut s.gathered, &mut s.blocks);
        // By logit, largest first, ties to the lower id: `gathered` is in id order. The
        // logprob fields hold the logits until the sum is known.
        let (g, keys) = (&s.gathered, &mut s.gathered_ranks);
        rank_keys(g, keys);
        if keys.len() > n {
            keys.select_nth_unstable(n);
        }
        let keep = n.min(keys.len());
        arch::sort_keys(&mut keys[..keep]);
        out.extend(keys[..keep].iter().map(|&key| {
            let t = g[key as u32 as usize];
            crate::logprobs::TokenLogprob { token: t.id, logprob: t.logit }
        }));
    }
    // llama-server's summation order (see `logprobs::ServerOrder`).
    let sum = s.server_order.sum(r, summary.max, &s.block_max, out);
    let lse = summary.max as f64 + (sum as f64).ln();
    for t in out.iter_mut() {
        t.logprob = (t.logprob as f64 - lse) as f32;
    }
    Some((r[token as usize] as f64 - lse) as f32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tokensieve_testkit::generate::{self, RowKind};

    /// [`NearSums`] on `row` at temperature `t`: every weight lies under its block's rung
    /// bound, every widening's sums are within the bound it returns on every run of blocks
    /// from the start, and the last (mass 0) has exponentiated every block, as the full pass
    /// does.
    fn check_near_sums(row: &[f32], t: f32) -> Result<(), TestCaseError> {
        let mut s = Scratch::default();
        let max = arch::summarize(row, &mut s.block_max).max / t;
        prop_assume!(max.is_finite());
        let Some(mut near) = NearSums::new(row, t, max, &mut s) else {
            prop_assert!(!(2.0 / t).is_finite() || !(2.0 * max).is_finite());
            return Ok(());
        };
        for (b, block) in row.chunks(BLOCK).enumerate() {
            let bound = (-(s.rungs[b] as f64) / 2.0).exp() * (1.0 + 2f64.powi(-21));
            for &z in block {
                let w = (z / t - max).exp() as f64;
                prop_assert!(w <= bound, "block {} rung {}: weight {:e} of {}", b, s.rungs[b], w, z);
            }
        }
        let nb = row.len().div_ceil(BLOCK);
        let mut exact = vec![0.0; nb];
        arch::exp_block_sums(row, t, max, &mut exact);
        let rounding = (nb as f64 + 8.0) * f64::EPSILON * 2.0;
        for mass in DRAW_FAR_MASSES {
            let err = near.widen(mass, row, t, max, &mut s);
            let (mut pe, mut pa) = (0.0f64, 0.0f64);
            for (b, (&e, &a)) in exact.iter().zip(&s.block_sums).enumerate() {
                pe += e;
                pa += a;
                prop_assert!(
                    (pa - pe).abs() <= err + rounding * pe,
                    "mass {:e} block {}: {} vs {} (bound {:e})",
                    mass,
                    b,
                    pa,
                    pe,
                    err
                );
            }
        }
        let mut full = vec![0.0; nb];
        arch::exp_block_sums_approx(row, t, max, &mut full);
        for (b, (&got, &want)) in s.block_sums.iter().zip(&full).enumerate() {
            prop_assert_eq!(got.to_bits(), want.to_bits(), "block {}", b);
        }
        Ok(())
    }

    /// [`sorted_softmax_top`] through a temperature, on rows of neighbouring floats that it
    /// merges (`x, x+ulp, x+2ulp, x+3ulp`: the block maxima are the tops of runs, so the
    /// gathering's bound splits runs that divide to one value): what it returns is a prefix of
    /// llama.cpp's array after `temperature(div)` and its sort, at least `need` long, with
    /// every entry of the divided row at or above its last value in it, and the array's f32
    /// sum in sorted order and probabilities exactly.
    #[test]
    fn the_sorted_top_through_a_temperature_is_a_prefix_of_the_divided_row() {
        let mut checked = 0;
        for (case, v) in [700usize, 3_000, 20_000].into_iter().enumerate() {
            for seed in 0..4u64 {
                let base = generate::row(RowKind::Peaked, v.div_ceil(4), seed * 7 + case as u64);
                let row: Vec<f32> = (0..v).map(|i| (0..i % 4).fold(base[i / 4], |x, _| x.next_up())).collect();
                for div in [3.0f32, 7.0, 0.3, 1.0] {
                    let divided: Vec<f32> = row.iter().map(|&x| x / div).collect();
                    let mut sorted = divided.clone();
                    sorted.sort_by(|a, b| b.total_cmp(a));
                    let max = sorted[0];
                    let mut want_sum = 0.0f32;
                    for &z in &sorted {
                        want_sum += (z - max).exp();
                    }
                    for need in [1usize, 5, 40, 64, 300] {
                        let mut s = Scratch::default();
                        let summary = arch::summarize(&row, &mut s.block_max);
                        s.summary = Some(summary);
                        assert_eq!(summary.max / div, max);
                        let mut c = Candidates::default();
                        let top = sorted_softmax_top(need, &row, div, max, &mut s, &mut c);
                        // Without the collector's kernels the divided row's sum is not certified.
                        if div != 1.0 && !arch::Collector::available() {
                            assert_eq!(top, None);
                            continue;
                        }
                        let Some(sum) = top else { continue };
                        let label = format!("v {v} seed {seed} div {div} need {need}");
                        let got = c.as_slice();
                        assert!(got.len() >= need, "{label}: {} entries", got.len());
                        assert_eq!(sum.to_bits(), want_sum.to_bits(), "{label}");
                        let last = got[got.len() - 1].logit;
                        assert_eq!(
                            divided.iter().filter(|&&z| z >= last).count(),
                            got.len(),
                            "{label}: not every entry above the last"
                        );
                        for (i, t) in got.iter().enumerate() {
                            assert_eq!(t.logit.to_bits(), sorted[i].to_bits(), "{label}: position {i}");
                            assert_eq!(t.logit.to_bits(), divided[t.id as usize].to_bits(), "{label}: token {}", t.id);
                            assert_eq!(
                                t.p.to_bits(),
                                ((t.logit - max).exp() / sum).to_bits(),
                                "{label}: p of {}",
                                t.id
                            );
                        }
                        checked += 1;
                    }
                }
            }
        }
        // Some tops are not certified (the rest's order could change the sum); without the
        // vectorised `expf`, none is (the mirostats then sort the whole row).
        if arch::Collector::available() {
            assert!(checked > 100, "only {checked} tops certified");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn near_sums_bound_every_block_and_every_run(
            kind in generate::row_kind(),
            v in 1usize..6000,
            seed in any::<u64>(),
            t in prop::sample::select(vec![1e-30f32, 1e-3, 0.1, 0.8, 1.0, 3.0, 1e3, 1e30]),
        ) {
            check_near_sums(&generate::row(kind, v, seed), t)?;
        }
    }

    #[test]
    fn near_sums_on_rows_far_below_zero_and_masked_blocks() {
        // Whole blocks of -inf (the last rung), logits near -1e30, near f32::MAX, and a
        // temperature whose `2 / t` is near f32::MAX.
        let mut row = generate::row(RowKind::Peaked, 3000, 7);
        row[640..1280].iter_mut().for_each(|x| *x = f32::NEG_INFINITY);
        check_near_sums(&row, 0.8).unwrap();
        let low: Vec<f32> = row.iter().map(|x| x - 1e30).collect();
        check_near_sums(&low, 1.0).unwrap();
        let high: Vec<f32> = row.iter().map(|x| x * 1e37).collect();
        check_near_sums(&high, 0.5).unwrap();
        let tiny: Vec<f32> = row.iter().map(|x| x * 1e-30).collect();
        check_near_sums(&tiny, 1e-38).unwrap();
    }

    /// A [`NearSums`] on a reused [`Scratch`] (its cheap tier's group sums live there) gives
    /// the same sums and bounds as on a fresh one.
    #[test]
    fn near_sums_on_a_reused_scratch_leave_nothing_behind() {
        let run = |row: &[f32], tries: usize, s: &mut Scratch| {
            let max = arch::summarize(row, &mut s.block_max).max;
            let mut near = NearSums::new(row, 1.0, max, s).unwrap();
            DRAW_FAR_MASSES[..tries]
                .iter()
                .map(|&m| (near.widen(m, row, 1.0, max, s).to_bits(), total(&s.block_sums).to_bits()))
                .collect::<Vec<_>>()
        };
        let first = generate::row(RowKind::Peaked, 32_000, 1);
        let second = generate::row(RowKind::Peaked, 32_000, 2);
        let mut reused = Scratch::default();
        // One try leaves the cheap tier holding blocks (the last, at mass 0, empties it).
        run(&first, 1, &mut reused);
        let all = DRAW_FAR_MASSES.len();
        assert_eq!(run(&second, all, &mut reused), run(&second, all, &mut Scratch::default()));
    }

    /// [`NearSums::sequential_sum_bounds`] holds llama.cpp's f32 softmax sum in row order
    /// after every try of [`top_p_dist`] and after the last (mass 0), where the rounding bound
    /// carries most of the interval, on rows of every kind, sharpened and flattened.
    #[test]
    fn sequential_sum_bounds_hold_the_f32_sum() {
        let mut widths = [0.0f64; 2];
        for (i, v) in [1025usize, 4099, 32_000, 128_256].into_iter().enumerate() {
            for kind in generate::RowKind::ALL {
                for scale in [0.1f32, 1.0, 4.0] {
                    let row: Vec<f32> = generate::row(kind, v, i as u64).into_iter().map(|x| x * scale).collect();
                    let mut s = Scratch::default();
                    let max = arch::summarize(&row, &mut s.block_max).max;
                    if !max.is_finite() {
                        continue;
                    }
                    let mut plain = 0.0f32;
                    for &x in &row {
                        plain += (x - max).exp();
                    }
                    let mut near = NearSums::new(&row, 1.0, max, &mut s).unwrap();
                    for mass in TOP_P_FAR_MASSES.into_iter().chain([0.0]) {
                        let err = near.widen(mass, &row, 1.0, max, &mut s);
                        let (lo, hi) = near.sequential_sum_bounds(err, row.len(), &s);
                        assert!(lo <= plain && plain <= hi, "{kind:?} x{scale} V={v} mass {mass}: {lo} {plain} {hi}");
                        if mass == 0.0 && kind == RowKind::Peaked && scale == 1.0 {
                            widths[0] = widths[0].max((hi - lo) as f64 / plain as f64);
                            widths[1] = widths[1].max(err / plain as f64);
                        }
                    }
                }
            }
        }
        // The rounding bound, not the tiers' error, sets the last interval's width.
        assert!(widths[0] > 10.0 * widths[1], "{widths:?}");
    }

    /// [`gather_top`] with penalties' overlay on the row's top entries: `tau` is at most the
    /// k-th largest value of row + overlay, and the gathered entries are exactly those at or
    /// above it, in id order. The overlays lower the top `n` entries by a little (most stay
    /// above the k-th value: the first round settles), by a share of them (the real row's
    /// case: a few drop below, and the second round allows for those), or by a lot (every
    /// lowered entry is allowed for), on the real SmolLM2 row and generated rows; and logit
    /// bias's edits, which keep the top entries in place (lowered a little) or hide some, and
    /// lift entries from the bottom of the row above the maximum (what [`gather_at_least`]'s
    /// merge replaces, drops and adds).
    #[test]
    fn gather_top_holds_the_k_largest_of_row_and_overlay() {
        /// Penalties lower the top `n` ids (divided by the first, less the second); logit bias
        /// lowers them a little or hides every other one (`-inf`), and raises three of the
        /// lowest above the maximum.
        #[derive(Clone, Copy, Debug)]
        enum Edits {
            Penalties(f32, f32),
            Bias { hide: bool },
        }
        let npy = concat!(env!("CARGO_MANIFEST_DIR"), "/../tokensieve-cli/testdata/example-logits.npy");
        let mut rows = vec![("real".to_string(), tokensieve_testkit::cli::read_npy_f32(npy.as_ref()).1)];
        for kind in [RowKind::Peaked, RowKind::Gaussian] {
            rows.push((format!("{kind:?}"), generate::row(kind, 32_000, 11)));
        }
        let mut checked = 0;
        for (name, row) in &rows {
            let mut order: Vec<u32> = (0..row.len() as u32).collect();
            order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]));
            for n in [5usize, 25, 64] {
                for edits in [
                    Edits::Penalties(1.1, 0.2),
                    Edits::Penalties(1.1, 1.5),
                    Edits::Penalties(2.0, 5.0),
                    Edits::Bias { hide: false },
                    Edits::Bias { hide: true },
                ] {
                    let mut overlay: Vec<(u32, f32)> = order[..n]
                        .iter()
                        .enumerate()
                        .map(|(rank, &id)| {
                            let x = row[id as usize];
                            let edited = match edits {
                                Edits::Penalties(scale, minus) => (if x > 0.0 { x / scale } else { x * scale }) - minus,
                                Edits::Bias { hide: true } if rank % 2 == 0 => f32::NEG_INFINITY,
                                Edits::Bias { .. } => x - 0.01,
                            };
                            (id, edited)
                        })
                        .collect();
                    if let Edits::Bias { .. } = edits {
                        let top = row[order[0] as usize];
                        overlay.extend(order[order.len() - 3..].iter().map(|&id| (id, top + 30.0)));
                    }
                    overlay.sort_by_key(|e| e.0);
                    let mut edited = row.clone();
                    overlay.iter().for_each(|&(id, x)| edited[id as usize] = x);
                    let mut sorted = edited.clone();
                    sorted.sort_by(|a, b| b.total_cmp(a));
                    for k in [1usize, 10, 40, 100] {
                        let mut s = Scratch::default();
                        s.summary = Some(arch::summarize(row, &mut s.block_max));
                        s.overlay = overlay.clone();
                        let tau = gather_top(k, row, &mut s).expect("enough blocks");
                        let ctx = format!("{name} n {n} {edits:?} k {k}");
                        assert!(tau <= sorted[k - 1], "{ctx}: tau {tau} above the k-th {}", sorted[k - 1]);
                        let want: Vec<(u32, f32)> = (0..row.len() as u32)
                            .filter(|&i| edited[i as usize] >= tau)
                            .map(|i| (i, edited[i as usize]))
                            .collect();
                        let got: Vec<(u32, f32)> = s.gathered.iter().map(|t| (t.id, t.logit)).collect();
                        assert_eq!(got, want, "{ctx}");
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, 3 * 3 * 5 * 4);
    }

    /// `dist`'s draw located from bounded block sums ([`locate_draw`]), for draws swept over
    /// `[0, 1)` (and some within 10^-3 of either end, where one part of the sums' error is
    /// nearly all of it) on nearly flat rows, where every weight is a few hundred-thousandths
    /// of the sum and many draws land within the bounds of an interval's end: every located
    /// token is the first whose f64 running sum of `expf` weights reaches `u` times their sum
    /// (llama.cpp's `dist`), and the bounds decide most draws before the exact pass.
    #[test]
    fn located_draws_are_the_running_sums() {
        let (mut draws, mut before_exact) = (0, 0);
        for (v, spread, t) in [(700usize, 0.1f32, 1.0f32), (5_000, 0.1, 0.8), (40_000, 0.1, 1.0), (40_000, 4.0, 1.5)] {
            let row: Vec<f32> =
                generate::row(RowKind::Gaussian, v, v as u64).iter().map(|x| x * spread / 3.0).collect();
            let mut s = Scratch::default();
            let summary = arch::summarize(&row, &mut s.block_max);
            s.summary = Some(summary);
            let max = summary.max / t;
            let weights: Vec<f64> = row.iter().map(|&z| f64::from(((z / t) - max).exp())).collect();
            let sum: f64 = weights.iter().sum();
            for j in 0..600 {
                let u = match j {
                    0..=19 => j as f64 * 5e-5,
                    20..=39 => 1.0 - (j - 19) as f64 * 5e-5,
                    _ => (j as f64 + 0.5) / 600.0,
                };
                let Some((id, exact)) = locate_draw(&row, t, max, u, &mut s) else { continue };
                // The first running sum (row order) reaching the target; the sum's own order is
                // llama.cpp's too, but a draw this test certifies cannot depend on it.
                let target = sum * u;
                let mut running = 0.0f64;
                let want = weights.iter().position(|&w| {
                    running += w;
                    running >= target
                });
                assert_eq!(Some(id as usize), want, "V={v} spread {spread} t={t} u={u}");
                draws += 1;
                before_exact += !exact as usize;
            }
        }
        assert!(before_exact * 10 >= draws * 6, "only {before_exact} of {draws} draws located before the exact pass");
    }

    /// [`beyond_by_block_maxima`] says "beyond" only where the exact sum's sorted prefix does
    /// (and its bound is below the exact sum): on flat rows of several spreads and sizes, for
    /// masses from 0.1 to 0.999; it says so on rows like the bench's flat one at `top_p(0.95)`
    /// (what it is for) and never on peaked ones.
    #[test]
    fn beyond_by_the_block_maxima_is_beyond_the_exact_prefix() {
        let (mut said, mut flat_95) = (0, 0);
        for v in [1025usize, 4096, 32_000, 128_256] {
            let mut rows: Vec<(String, Vec<f32>)> = [0.02f32, 0.05, 0.3, 1.0]
                .iter()
                .map(|&sd| {
                    (
                        format!("gaussian sd {sd}"),
                        generate::row(RowKind::Gaussian, v, 5).iter().map(|x| x * sd).collect(),
                    )
                })
                .collect();
            rows.push(("flat".into(), generate::row(RowKind::Flat, v, 5)));
            rows.push(("peaked".into(), generate::row(RowKind::Peaked, v, 5)));
            for (name, row) in &rows {
                let mut s = Scratch::default();
                let mut c = Candidates::default();
                let summary = arch::summarize(row, &mut s.block_max);
                let max = summary.max;
                s.summary = Some(summary);
                let sum = arch::exp_sum_sequential(0.0, row, max, &s.block_max);
                for p in [0.95f32, 0.5, 0.1, 0.999] {
                    let says = beyond_by_block_maxima(p, max, &s.block_max);
                    if name == "peaked" {
                        assert!(!says, "{name} V={v} top_p({p})");
                    }
                    // The bench's flat row: N(0, 0.05²).
                    if name == "gaussian sd 0.05" && p == 0.95 && v >= 32_000 {
                        assert!(says, "{name} V={v} top_p({p})");
                        flat_95 += 1;
                    }
                    if says {
                        said += 1;
                        assert!(beyond_at(p, sum), "{name} V={v} top_p({p})");
                        let exact =
                            sorted_prefix((p, 1), row, max, (sum, sum), Ties::Allowed, Reuse::Fresh, &mut s, &mut c);
                        assert_eq!(exact, Err(Short::Beyond), "{name} V={v} top_p({p})");
                    }
                }
            }
        }
        assert!(said >= 10 && flat_95 == 2, "{said} said beyond");
    }

    /// [`certain_top_p_draw`] against the array path (llama.cpp's fill, `top_p`, then `dist`
    /// with the same draw, with and without a `temperature` between) for draws spread over
    /// `[0, 1)`: every token it certifies is the array path's, with its processed logit. Rows:
    /// the real SmolLM2 row, whose cut bounds lie further apart than [`PAST_THE_CUT`] entries
    /// (so the survivors' sum is bounded from the mass), and generated rows whose cut falls
    /// within the first 32 entries, within 256, or beyond.
    /// [`sorted_prefix`] with `Reuse::Row`, called as `top_p_dist`'s tries call it (the same
    /// row, narrowing bounds on its sum, then the sum itself), returns what a fresh call
    /// returns and leaves the same values in the same order, whether the earlier calls stopped
    /// in the top 32, went on to the top 256 or ran out.
    #[test]
    fn sorted_prefix_reuses_its_pops_across_tries() {
        let mut rows: Vec<(String, Vec<f32>)> = Vec::new();
        for kind in [RowKind::Peaked, RowKind::Gaussian] {
            for scale in [0.3f32, 1.0, 2.0] {
                let row = generate::row(kind, 32_000, 7).into_iter().map(|x| x * scale).collect();
                rows.push((format!("{kind:?} x{scale}"), row));
            }
        }
        let bf16 =
            generate::row(RowKind::Peaked, 32_000, 8).into_iter().map(|x| half::bf16::from_f32(x * 2.0).to_f32());
        rows.push(("bf16 x2".into(), bf16.collect()));
        rows.push(("flat".into(), generate::row(RowKind::Flat, 4_096, 9)));
        let (mut reused, mut wide) = (0, 0);
        for (name, row) in &rows {
            // The row's values in descending order: every prefix must be a prefix of these.
            let mut descending = row.clone();
            descending.sort_by(|a, b| b.total_cmp(a));
            for (p, min_keep) in [(0.95f32, 1usize), (0.5, 3), (0.999, 1), (0.1, 40)] {
                let (mut s, mut c) = (Scratch::default(), Candidates::default());
                let summary = arch::summarize(row, &mut s.block_max);
                s.summary = Some(summary);
                let sum = arch::exp_sum_sequential(0.0, row, summary.max, &s.block_max);
                s.prefix.live = false;
                for (a, b) in [(0.8f32, 1.25f32), (0.97, 1.03), (0.999, 1.001), (1.0, 1.0)] {
                    let bounds = ((sum * a).max(1.0), sum * b);
                    reused += s.prefix.live as usize;
                    let got = sorted_prefix(
                        (p, min_keep),
                        row,
                        summary.max,
                        bounds,
                        Ties::Allowed,
                        Reuse::Row,
                        &mut s,
                        &mut c,
                    );
                    wide += (s.prefix.live && s.prefix.stage == 1) as usize;
                    let (mut fresh_s, mut fresh_c) = (Scratch::default(), Candidates::default());
                    fresh_s.block_max.clone_from(&s.block_max);
                    fresh_s.summary = Some(summary);
                    let want = sorted_prefix(
                        (p, min_keep),
                        row,
                        summary.max,
                        bounds,
                        Ties::Allowed,
                        Reuse::Fresh,
                        &mut fresh_s,
                        &mut fresh_c,
                    );
                    let ctx = format!("{name} top_p({p},{min_keep}) bounds {bounds:?}");
                    assert_eq!(got, want, "{ctx}");
                    let logits: Vec<f32> = c.data.iter().map(|t| t.logit).collect();
                    assert_eq!(logits, descending[..logits.len()], "{ctx}");
                    let values =
                        |c: &Candidates| c.data.iter().map(|t| (t.logit.to_bits(), t.p.to_bits())).collect::<Vec<_>>();
                    assert_eq!(values(&c), values(&fresh_c), "{ctx}");
                    // Equal values may sit in another order; a unique value is the same token.
                    for (g, w) in c.data.iter().zip(&fresh_c.data) {
                        if row.iter().filter(|&&x| x == g.logit).count() == 1 {
                            assert_eq!(g.id, w.id, "{ctx}");
                        }
                    }
                }
            }
        }
        assert!(reused >= 90, "only {reused} calls read an earlier call's pops");
        assert!(wide >= 8, "only {wide} calls went on to the top 256");
    }

    #[test]
    fn top_p_draws_are_certified_only_when_right() {
        use crate::sampler::temperature::Temperature;
        use crate::sampler::top_p::TopP;
        use crate::sampler::Sampler;
        let npy = concat!(env!("CARGO_MANIFEST_DIR"), "/../tokensieve-cli/testdata/example-logits.npy");
        let mut rows = vec![("real".to_string(), tokensieve_testkit::cli::read_npy_f32(npy.as_ref()).1)];
        for kind in [RowKind::Peaked, RowKind::Gaussian, RowKind::ShiftedDown] {
            for scale in [0.5f32, 1.0, 2.0] {
                let row = generate::row(kind, 32_000, 3).into_iter().map(|x| x * scale).collect();
                rows.push((format!("{kind:?} x{scale}"), row));
            }
        }
        // Rows as an engine hands them over in bfloat16: ties among the top entries, which
        // llama.cpp's bucket sort orders ([`settle_tie`]).
        for (seed, scale) in [(3u64, 1.0f32), (4, 2.0), (5, 4.0)] {
            let row = generate::row(RowKind::Peaked, 32_000, seed);
            let row = row.into_iter().map(|x| half::bf16::from_f32(x * scale).to_f32()).collect();
            rows.push((format!("bf16 x{scale}"), row));
        }
        let (mut draws, mut certified, mut by_mass, mut beyond, mut replayed) = (0, 0, 0, 0, 0);
        let (mut temp_draws, mut temp_certified, mut temp_by_mass) = (0, 0, 0);
        for (name, row) in &rows {
            for ((p, min_keep), temp) in [(0.95f32, 1usize), (0.5, 3), (0.999, 1), (0.1, 40)]
                .into_iter()
                .flat_map(|pk| [None, Some(0.8f32), Some(0.3)].map(|t| (pk, t)))
            {
                let mut s = Scratch::default();
                let mut c = Candidates::default();
                let summary = arch::summarize(row, &mut s.block_max);
                s.summary = Some(summary);
                let mut array = Candidates::from_logits(row.as_slice()).unwrap();
                TopP::new(p, min_keep).unwrap().apply(&mut array).unwrap();
                if let Some(t) = temp {
                    Temperature::new(t).unwrap().apply(&mut array).unwrap();
                }
                let softmax_sum = arch::exp_sum_sequential(0.0, row, summary.max, &s.block_max);
                for j in 0..400 {
                    let u = (j as f64 + 0.5) / 400.0;
                    let mut want = array.clone();
                    Dist::select(&mut want, u);
                    draws += 1;
                    temp_draws += temp.is_some() as usize;
                    let mut sum_hi = f32::INFINITY;
                    let drawn = certain_top_p_draw(p, min_keep, row, summary.max, u, temp, &mut sum_hi, &mut s, &mut c);
                    assert!(softmax_sum <= sum_hi, "{name}: the sum {softmax_sum} above its bound {sum_hi}");
                    match drawn {
                        Ok((token, tie)) => {
                            replayed += tie as usize;
                            let ctx = format!("{name} top_p({p},{min_keep}) temperature {temp:?} u = {u}");
                            assert_eq!(Some(token), want.selected_token(), "{ctx}");
                            assert_eq!(c.selected_token(), Some(token));
                            let chosen = |c: &Candidates| c.data[c.selected.unwrap()].logit.to_bits();
                            assert_eq!(chosen(&c), chosen(&want), "{ctx}");
                            certified += 1;
                            temp_certified += temp.is_some() as usize;
                            by_mass += (name == "real" && p == 0.95 && temp.is_none()) as usize;
                            temp_by_mass += (name == "real" && p == 0.95 && temp == Some(0.8)) as usize;
                        }
                        Err(Some(Short::Beyond)) => {
                            // `top_p_dist` then skips the exact sum's prefix: it must be beyond too.
                            let sum = arch::exp_sum_sequential(0.0, row, summary.max, &s.block_max);
                            let exact = sorted_prefix(
                                (p, min_keep),
                                row,
                                summary.max,
                                (sum, sum),
                                Ties::Allowed,
                                Reuse::Fresh,
                                &mut s,
                                &mut c,
                            );
                            assert_eq!(exact, Err(Short::Beyond), "{name} top_p({p},{min_keep}) u = {u}");
                            beyond += 1;
                        }
                        Err(_) => {}
                    }
                }
            }
        }
        assert!(beyond > 0, "no row's cut lay beyond the first 256");
        assert!(replayed >= 20, "only {replayed} draws landed on a tie");
        assert!(certified * 2 >= draws, "only {certified} of {draws} draws certified");
        assert!(temp_certified * 2 >= temp_draws, "only {temp_certified} of {temp_draws} draws certified");
        assert!(by_mass >= 200, "the real row: only {by_mass} of 400 draws certified");
        assert!(temp_by_mass >= 200, "the real row at t = 0.8: only {temp_by_mass} of 400 draws certified");
    }

    /// [`temperature_tail_factor`] bounds the weight after a temperature by the weight at
    /// `t = 1` for logits at or below `next`, over temperatures up to [`TOP_P_TEMP_MAX`],
    /// maxima of every size and entries just below, far below and at `next`, computed as
    /// llama.cpp computes both; and it is far below 1 for entries a few nats down.
    #[test]
    fn the_temperature_tail_factor_bounds_the_weights() {
        let mut rng = tokensieve_testkit::generate::SplitMix64::new(7);
        let mut unit = || rng.next_f64();
        for _ in 0..200_000 {
            let t = (0.05 + unit() * (TOP_P_TEMP_MAX as f64 - 0.05)) as f32;
            let t = if unit() < 0.05 { TOP_P_TEMP_MAX } else { t };
            let x_0 = ((unit() - 0.5) * 10f64.powf(unit() * 6.0)) as f32;
            let next = x_0 - (unit() * 10f64.powf(unit() * 3.0 - 2.0)) as f32;
            let x = if unit() < 0.3 { next } else { next - (unit() * 40.0) as f32 };
            let g = temperature_tail_factor(t, x_0, next);
            let v = (x / t - x_0 / t).exp() as f64;
            let w = (x - x_0).exp() as f64;
            let tiny = 2f64.powi(-149);
            assert!(v <= g * (w + tiny) + tiny, "t {t} x_0 {x_0} next {next} x {x}: {v} > {g} · {w}");
        }
        assert!(temperature_tail_factor(0.8, 10.0, 5.0) < 0.3);
    }

    /// [`draw_by_sorting`] against the array path (llama.cpp's fill, `top_p` with its full sort,
    /// then `dist` with the same draw) for draws spread over `[0, 1)`, on nearly flat rows
    /// whose cut lies beyond the first 256 entries: every token it returns is the array
    /// path's, and it declines exactly where the chosen value is held by several entries.
    #[test]
    fn draws_by_sorting_are_the_array_paths() {
        use crate::sampler::top_p::TopP;
        use crate::sampler::Sampler;
        let (mut drawn, mut declined) = (0, 0);
        for (v, seed) in [(2_000usize, 1u64), (32_000, 2)] {
            let gaussian: Vec<f32> = generate::row(RowKind::Gaussian, v, seed).iter().map(|x| x * 0.02).collect();
            // A coarse grid: ties everywhere.
            let grid: Vec<f32> = gaussian.iter().map(|x| (x * 300.0).round() / 300.0).collect();
            for row in [gaussian, grid] {
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0.0f32;
                for &x in &row {
                    sum += (x - max).exp();
                }
                for (p, min_keep) in [(0.95f32, 1usize), (0.5, 1), (0.3, 1500)] {
                    let mut array = Candidates::from_logits(row.as_slice()).unwrap();
                    TopP::new(p, min_keep).unwrap().apply(&mut array).unwrap();
                    let (mut s, mut c) = (Scratch::default(), Candidates::default());
                    for j in 0..200 {
                        let u = (j as f64 + 0.5) / 200.0;
                        let mut want = array.clone();
                        Dist::select(&mut want, u);
                        match draw_by_sorting(p, min_keep, &row, max, sum, u, &mut s, &mut c) {
                            Some(token) => {
                                assert_eq!(Some(token), want.selected_token(), "V={v} top_p({p},{min_keep}) u = {u}");
                                let t = want.as_slice()[want.selected_index().unwrap()];
                                assert_eq!(c.as_slice(), [t], "V={v} top_p({p},{min_keep}) u = {u}");
                                drawn += 1;
                            }
                            None => declined += 1,
                        }
                    }
                }
            }
        }
        assert!(drawn >= 1000 && declined >= 200, "{drawn} drawn, {declined} declined");
    }
}
