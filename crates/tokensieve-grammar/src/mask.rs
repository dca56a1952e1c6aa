//! Token masks: which tokens the grammar allows next, as a packed `u32` bitmask (`ceil(V/32)`
//! words, bit `i % 32` of word `i / 32` set = token `i` allowed), and applying one to a row.
//!
//! How a mask is computed, fastest first:
//! 1. A parse state is a set of stacks and a token is allowed when *some* stack accepts it, so
//!    the mask of a state is the OR of its stacks' masks. Each stack's mask is memoised (a JSON
//!    document keeps coming back to the same stacks: inside a string, after a comma, …).
//! 2. A stack seen for the first time is split: its top `MaskCache::depth` frames (the
//!    *context-independent* part, XGrammar's term) are looked up in a second cache that holds
//!    the tokens accepted whatever lies below those frames, plus the parts of the trie whose
//!    tokens reach below them ("uncertain"). Only those parts are walked again from the real
//!    stack. Frames near the top recur across many stacks (every JSON string has the same top
//!    frames), so this cache is filled a few times per grammar.
//! 3. Filling that cache walks the vocabulary's byte trie depth-first, carrying the parse
//!    state down the path (transitions are memoised, so a step is a table lookup) and skipping
//!    a whole subtree at the first byte no stack accepts (for a multi-byte character, at its
//!    lead byte when no class can match any character it starts).
//! 4. Where the state loops on a set of ASCII characters (JSON string content, `.*`), a
//!    subtree made only of those characters is accepted whole without walking it, from a
//!    per-vocabulary "slice" computed once per alphabet (llguidance's slicer idea). Where
//!    every character of such an alphabet *enters* the loop (the start of a string's
//!    content), the slice's precomputed mask of the tokens made of it is set at once.
//!
//! Every path is checked against `Engine::token_verdict`, the token-by-token definition
//! that follows llama.cpp's `llama_grammar_reject_candidates`.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::engine::{Decoded, Engine, Utf8, Verdict, DEAD, EMPTY, HAS_BOTTOM, HAS_TOKEN};
use crate::error::{Error, Result};
use crate::trie::{Slice, TokenIndex};

/// Working out a state's loop alphabet costs about 130 transitions; it is done only for
/// states met above subtrees at least this large.
const SLICE_WORTH: usize = 512;

/// How many cached per-stack masks (and per-frame entries) to keep before starting over.
const MAX_CACHED: usize = 2048;

/// Cached partial masks of one (grammar, vocabulary) pair.
#[derive(Debug)]
pub(crate) struct MaskCache {
    /// How many top frames of a stack key the context-independent cache.
    pub depth: usize,
    /// Subtree size from which a state's loop alphabet is worked out (`SLICE_WORTH`).
    pub slice_worth: usize,
    /// Per stack: its mask (shared with the `by_frames` entry when no uncertain token of it
    /// is accepted).
    by_stack: FxHashMap<u32, Arc<Vec<u32>>>,
    by_frames: FxHashMap<u32, Frames>,
    frames_scratch: Vec<u32>,
    stacks_scratch: Vec<u32>,
    walk: Vec<WalkFrame>,
    /// Statistics for benchmarks: (stack hits, stack misses, frame misses).
    pub stats: (u64, u64, u64),
}

#[derive(Debug)]
struct Frames {
    accept: Arc<Vec<u32>>,
    uncertain: Arc<[u32]>,
}

#[derive(Clone, Copy, Debug, Default)]
struct WalkFrame {
    set: u32,
    flags: u8,
    /// Index of `set`'s loop slice in the walk's slice list, or `NO_SLICE`.
    slice: u8,
    dec: Utf8,
    uncertain: bool,
    /// Every node on the path from the root passes in the walk's entry slice: the tokens
    /// below that slice covers are decided already.
    covered: bool,
}

impl Default for MaskCache {
    fn default() -> Self {
        Self::with_depth(3)
    }
}

impl MaskCache {
    pub fn with_depth(depth: usize) -> Self {
        MaskCache {
            depth,
            slice_worth: SLICE_WORTH,
            by_stack: FxHashMap::default(),
            by_frames: FxHashMap::default(),
            frames_scratch: Vec::new(),
            stacks_scratch: Vec::new(),
            walk: Vec::new(),
            stats: (0, 0, 0),
        }
    }
}

#[inline]
fn set_bit(mask: &mut [u32], token: u32) {
    mask[(token / 32) as usize] |= 1 << (token % 32);
}

/// True when bit `token` of `mask` is set (false outside the mask).
#[inline]
pub fn is_allowed(mask: &[u32], token: u32) -> bool {
    mask.get((token / 32) as usize).is_some_and(|w| w >> (token % 32) & 1 == 1)
}

/// Sets `row[i] = -inf` for every token `i` whose bit is clear (llama.cpp's grammar `apply`,
/// XGrammar's `apply_token_bitmask_inplace`); the same function as
/// [`tokensieve::constraint::apply_bitmask`], usable on any backend's host copy of a row.
///
/// ```
/// use tokensieve_grammar::apply_bitmask;
/// let mut row = [1.0f32, 2.0, 3.0, 4.0];
/// apply_bitmask(&mut row, &[0b0101]);
/// assert_eq!(row, [1.0, f32::NEG_INFINITY, 3.0, f32::NEG_INFINITY]);
/// ```
pub use tokensieve::constraint::apply_bitmask;

/// Writes the mask of the state (`set`, `utf8`) into `out` (cleared first).
pub(crate) fn fill(
    engine: &mut Engine,
    cache: &mut MaskCache,
    index: &TokenIndex,
    set: u32,
    utf8: Utf8,
    out: &mut [u32],
) -> Result<()> {
    if out.len() != index.words() {
        return Err(Error::token(format!(
            "the mask buffer has {} words; a vocabulary of {} tokens needs {}",
            out.len(),
            index.len(),
            index.words()
        )));
    }
    out.fill(0);
    engine.reset_budget();
    if utf8.is_pending() || engine.has_token_top(set) {
        // After a token that ended inside a character, or with token elements on top: walk
        // the whole state (rare; not cached).
        let mut uncertain = Vec::new();
        walk(engine, cache, index, set, utf8, out, &mut uncertain, &[])?;
    } else {
        let mut stacks = std::mem::take(&mut cache.stacks_scratch);
        stacks.clear();
        stacks.extend(engine.set_members(set).iter().copied().filter(|&s| s != EMPTY));
        let result = stacks.iter().try_for_each(|&stack| or_stack_mask(engine, cache, index, stack, out));
        cache.stacks_scratch = stacks;
        result?;
    }
    let complete = engine.has_empty(set);
    for &t in index.eog_tokens() {
        if complete {
            set_bit(out, t);
        }
    }
    Ok(())
}

fn or_stack_mask(
    engine: &mut Engine,
    cache: &mut MaskCache,
    index: &TokenIndex,
    stack: u32,
    out: &mut [u32],
) -> Result<()> {
    if let Some(mask) = cache.by_stack.get(&stack) {
        cache.stats.0 += 1;
        or_into(out, mask);
        return Ok(());
    }
    cache.stats.1 += 1;
    let mut frames = std::mem::take(&mut cache.frames_scratch);
    let key = engine.truncate(stack, cache.depth, &mut frames);
    cache.frames_scratch = frames;
    let key = key?;
    if !cache.by_frames.contains_key(&key) {
        cache.stats.2 += 1;
        let set = engine.singleton(key)?;
        let mut accept = vec![0u32; index.words()];
        let mut uncertain = Vec::new();
        walk(engine, cache, index, set, Utf8::default(), &mut accept, &mut uncertain, &[])?;
        if cache.by_frames.len() >= MAX_CACHED {
            cache.by_frames.clear();
        }
        cache.by_frames.insert(key, Frames { accept: Arc::new(accept), uncertain: uncertain.into() });
    }
    let entry = &cache.by_frames[&key];
    let mut mask = Arc::clone(&entry.accept);
    if !entry.uncertain.is_empty() {
        // Settle the uncertain regions on the real stack (no BOTTOM there: nothing stays
        // uncertain).
        let regions = Arc::clone(&entry.uncertain);
        let set = engine.singleton(stack)?;
        let mut none = Vec::new();
        let settled: &mut Vec<u32> = Arc::make_mut(&mut mask);
        walk(engine, cache, index, set, Utf8::default(), settled, &mut none, &regions)?;
        debug_assert!(none.is_empty(), "a real stack left tokens uncertain");
    }
    or_into(out, &mask);
    if cache.by_stack.len() >= MAX_CACHED {
        cache.by_stack.clear();
    }
    cache.by_stack.insert(stack, mask);
    Ok(())
}

fn or_into(out: &mut [u32], mask: &[u32]) {
    for (o, m) in out.iter_mut().zip(mask) {
        *o |= m;
    }
}

/// An uncertain part of the trie (see [`walk`]): node `r >> 1`, with its whole subtree when
/// `r & 1` is set, else only the tokens ending at it.
fn region(node: usize, subtree: bool) -> u32 {
    (node as u32) << 1 | u32::from(subtree)
}

/// Depth-first walk of the token trie from `set`: sets the bits of accepted tokens in
/// `accept` and lists in `uncertain` the regions (see [`region`]), in trie order, whose
/// tokens' fate depends on frames below a truncated stack.
///
/// With `only` non-empty (regions, in trie order) the walk decides just the tokens of those
/// regions, visiting the nodes above them to carry the state down: how the uncertain tokens
/// of a truncated stack's walk are settled on the real stack, sharing the steps of common
/// prefixes instead of checking the tokens one by one.
#[allow(clippy::too_many_arguments)]
fn walk(
    engine: &mut Engine,
    cache: &mut MaskCache,
    index: &TokenIndex,
    set: u32,
    start: Utf8,
    accept: &mut [u32],
    uncertain: &mut Vec<u32>,
    only: &[u32],
) -> Result<()> {
    let trie = &index.trie;
    let mut frames = std::mem::take(&mut cache.walk);
    frames.clear();
    frames.resize(trie.max_depth + 1, WalkFrame::default());
    let n = trie.byte.len();
    let mut i = 0;
    // Where the parse state loops on some ASCII characters (JSON string content, `.*`),
    // subtrees made only of them are accepted whole, without walking: the vocabulary's
    // precomputed slice for that alphabet. Alphabets are computed for the states met near
    // the root (few, and where the big subtrees are) and reused deeper when known.
    let mut slices: Vec<(u128, Arc<Slice>)> = Vec::new();
    let worth = cache.slice_worth;
    // Slices assume the walk starts at a character boundary; a restricted walk covers little.
    let use_slices = !start.is_pending() && only.is_empty();
    let mut next_region = 0;
    let result = (|| {
        let root_slice = if use_slices { loop_slice(engine, index, &mut slices, set, n, worth)? } else { NO_SLICE };
        // Where every character of some loop's alphabet enters that loop (the first character
        // of a JSON string's content), all tokens made of the alphabet are accepted: the
        // slice's precomputed mask, set at once; the walk then skips the subtrees it covers.
        let mut entry = NO_SLICE;
        let plain = |flags: u8| flags & (HAS_TOKEN | HAS_BOTTOM) == 0;
        if use_slices && n >= worth && plain(engine.flags(set)) && engine.ascii_viable(set).count_ones() >= MIN_ENTRY {
            let (alphabet, target) = engine.loop_entry(set)?;
            if alphabet != 0 && plain(engine.flags(target)) {
                entry = slot_of(index, &mut slices, alphabet);
            }
            if entry != NO_SLICE {
                let slice = Arc::clone(&slices[entry as usize].1);
                or_into(accept, &slice.tokens);
                // Tokens that end inside a character: a verdict per decoder state (no BOTTOM
                // in either set, so none is uncertain).
                let mut last = None;
                for &(dec, entered, t) in slice.partial.iter() {
                    let accepted = match last {
                        Some((d, e, verdict)) if (d, e) == (dec, entered) => verdict,
                        _ => {
                            let verdict =
                                engine.partial_verdict(if entered { target } else { set }, dec) == Verdict::Accept;
                            last = Some((dec, entered, verdict));
                            verdict
                        }
                    };
                    if accepted {
                        set_bit(accept, t);
                    }
                }
            }
        }
        // The first bytes some stack can start a character with (the others kill the set, and
        // with no BOTTOM nor token element nothing is uncertain): the root's other children
        // are skipped without stepping. Most walks start from one stack with one first
        // character, so this is most of the trie's top level.
        let mut first = [u64::MAX; 4];
        if only.is_empty() && !start.is_pending() && plain(engine.flags(set)) {
            let ascii = engine.ascii_viable(set);
            first = [ascii as u64, (ascii >> 64) as u64, 0, 0];
            for lead in 0xC0..=0xFFu8 {
                if engine.lead_viable(set, lead) {
                    first[3] |= 1 << (lead - 0xC0);
                }
            }
        }
        frames[0] = WalkFrame {
            set,
            flags: engine.flags(set),
            slice: root_slice,
            dec: start.carry(),
            uncertain: false,
            covered: entry != NO_SLICE,
        };
        while i < n {
            // In a restricted walk: is node `i` in a region, or only above one?
            let mut inside = true;
            if !only.is_empty() {
                let mut skip = false;
                loop {
                    let Some(&r) = only.get(next_region) else {
                        return Ok(());
                    };
                    let node = (r >> 1) as usize;
                    let end = if r & 1 == 1 { trie.end[node] as usize } else { node + 1 };
                    if end <= i {
                        next_region += 1;
                        continue;
                    }
                    if i < node {
                        // Above the region, or beside it with nothing of it below.
                        inside = false;
                        skip = trie.end[i] as usize <= node;
                    }
                    break;
                }
                if skip {
                    i = trie.end[i] as usize;
                    continue;
                }
            }
            let depth = trie.depth[i] as usize;
            if depth == 1 {
                let b = trie.byte[i];
                if first[usize::from(b >> 6)] >> (b & 63) & 1 == 0 {
                    i = trie.end[i] as usize;
                    continue;
                }
            }
            let parent = frames[depth - 1];
            if parent.covered && slices[entry as usize].1.through(i) {
                i = trie.end[i] as usize;
                continue;
            }
            if parent.slice != NO_SLICE && !parent.dec.is_pending() && slices[parent.slice as usize].1.full(i) {
                trie.tokens_under(i).iter().for_each(|&t| set_bit(accept, t));
                i = trie.end[i] as usize;
                continue;
            }
            let mut frame = parent;
            let mut dec = parent.dec;
            match dec.step(trie.byte[i]) {
                Decoded::Invalid => {
                    i = trie.end[i] as usize;
                    continue;
                }
                Decoded::Pending => {
                    // A lead byte no stack's class can complete: every token below dies on
                    // this character (and none is uncertain: no BOTTOM was reachable).
                    if !parent.dec.is_pending()
                        && parent.flags & (HAS_TOKEN | HAS_BOTTOM) == 0
                        && !parent.uncertain
                        && !engine.lead_viable(parent.set, trie.byte[i])
                    {
                        i = trie.end[i] as usize;
                        continue;
                    }
                }
                Decoded::Char(cp) => {
                    if parent.flags & HAS_TOKEN != 0 {
                        // A token element on top: the token id decides; check each one.
                        let mut unsure = false;
                        for &t in trie.tokens_under(i) {
                            match engine.token_verdict(set, start, t, index.token_bytes(t))? {
                                Verdict::Accept => set_bit(accept, t),
                                Verdict::Uncertain => unsure = true,
                                Verdict::Reject => {}
                            }
                        }
                        if unsure {
                            uncertain.push(region(i, true));
                        }
                        i = trie.end[i] as usize;
                        continue;
                    }
                    if parent.flags & HAS_BOTTOM != 0 {
                        frame.uncertain = true;
                    }
                    frame.set = engine.step(parent.set, cp)?;
                    if frame.set == DEAD {
                        if frame.uncertain {
                            uncertain.push(region(i, true));
                        }
                        i = trie.end[i] as usize;
                        continue;
                    }
                    if frame.set != parent.set {
                        frame.flags = engine.flags(frame.set);
                        let subtree = trie.end[i] as usize - i;
                        frame.slice = if use_slices {
                            loop_slice(engine, index, &mut slices, frame.set, subtree, worth)?
                        } else {
                            NO_SLICE
                        };
                    }
                }
            }
            frame.dec = dec;
            frame.covered = parent.covered && slices[entry as usize].1.pass(i);
            frames[depth] = frame;
            if frame.slice != NO_SLICE && !dec.is_pending() && slices[frame.slice as usize].1.kids(i) {
                // The state after this node loops on the alphabet and everything below is made
                // of it: the token here and all below are accepted.
                trie.tokens_under(i).iter().for_each(|&t| set_bit(accept, t));
                i = trie.end[i] as usize;
                continue;
            }
            let here = trie.tokens_at(i);
            if !here.is_empty() && inside {
                let verdict = if !dec.is_pending() {
                    Verdict::Accept
                } else {
                    match engine.partial_verdict(frame.set, dec) {
                        Verdict::Reject if frame.uncertain => Verdict::Uncertain,
                        v => v,
                    }
                };
                match verdict {
                    Verdict::Accept => here.iter().for_each(|&t| set_bit(accept, t)),
                    Verdict::Uncertain => uncertain.push(region(i, false)),
                    Verdict::Reject => {}
                }
            }
            i += 1;
        }
        Ok(())
    })();
    cache.walk = frames;
    result
}

/// Where `set` loops on some characters: the index in `slot` of the vocabulary's slice for
/// that alphabet (`NO_SLICE` when it does not, when the alphabet is not known and the subtree
/// below is smaller than `worth`, or when `slot` is full).
fn loop_slice(
    engine: &mut Engine,
    index: &TokenIndex,
    slot: &mut Vec<(u128, Arc<Slice>)>,
    set: u32,
    subtree: usize,
    worth: usize,
) -> Result<u8> {
    if engine.flags(set) & HAS_TOKEN != 0 {
        return Ok(NO_SLICE);
    }
    let alphabet = match engine.known_loop_alphabet(set) {
        Some(a) => a,
        None if subtree >= worth => engine.loop_alphabet(set)?,
        None => 0,
    };
    if alphabet == 0 {
        return Ok(NO_SLICE);
    }
    Ok(slot_of(index, slot, alphabet))
}

/// The index in `slot` of the vocabulary's slice for `alphabet` (`NO_SLICE` when `slot` is
/// full).
fn slot_of(index: &TokenIndex, slot: &mut Vec<(u128, Arc<Slice>)>, alphabet: u128) -> u8 {
    if let Some(at) = slot.iter().position(|(a, _)| *a == alphabet) {
        return at as u8;
    }
    if slot.len() >= MAX_SLICES_PER_WALK {
        return NO_SLICE;
    }
    slot.push((alphabet, index.slice(alphabet)));
    (slot.len() - 1) as u8
}

const NO_SLICE: u8 = u8::MAX;
/// Loop entries are looked for only from states that take at least this many ASCII
/// characters: the slice's mask pays for large alphabets (a string's content), and looking
/// costs transitions.
const MIN_ENTRY: u32 = 16;
const MAX_SLICES_PER_WALK: usize = 16;

/// The mask computed token by token with [`Engine::token_verdict`]: the slow, obvious
/// definition the fast paths are tested against.
pub(crate) fn fill_naive(engine: &mut Engine, index: &TokenIndex, set: u32, utf8: Utf8, out: &mut [u32]) -> Result<()> {
    out.fill(0);
    let complete = engine.has_empty(set);
    for t in 0..index.len() as u32 {
        let allowed = if index.is_eog(t) {
            complete
        } else {
            let bytes = index.token_bytes(t);
            !bytes.is_empty() && engine.token_verdict(set, utf8, t, bytes)? == Verdict::Accept
        };
        if allowed {
            set_bit(out, t);
        }
    }
    Ok(())
}
