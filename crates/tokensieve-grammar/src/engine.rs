//! The matching engine: llama.cpp's pushdown semantics (a set of stacks of grammar positions,
//! advanced until every stack has a terminal on top) over *interned* persistent stacks.
//!
//! * A stack is a node id: `(position, parent)` pairs are hash-consed, so equal stacks have
//!   equal ids, forking is free and llama.cpp's duplicate-stack checks are an id comparison.
//!   [`EMPTY`] is the empty stack (a complete parse); [`BOTTOM`] stands for "the rest of the
//!   stack, not known here" in truncated stacks used to cache masks (see `mask.rs`).
//! * A parse state is a *set* of stacks, interned the same way ([`DEAD`] is the empty set).
//!   Transitions `(set, code point) → set` are memoised (a dense table for ASCII), so walking
//!   text the grammar has seen before costs one table lookup per character: in effect a DFA
//!   built lazily from the pushdown automaton.
//! * Code points come from UTF-8 exactly as llama.cpp's `decode_utf8` produces them (see
//!   [`Utf8`]), including its quirks.
//!
//! Every operation is bounded by [`Limits`]; a pathological grammar (ambiguous optionals that
//! make the set of stacks explode, llama.cpp issue #4218) returns a [`Limit`](crate::ErrorKind::Limit)
//! error instead of hanging.

use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::error::{Error, Result};
use crate::gbnf::Element;
use crate::grammar::Compiled;

/// The empty stack: the parse is complete.
pub(crate) const EMPTY: u32 = 0;
/// The unknown rest of a truncated stack.
pub(crate) const BOTTOM: u32 = 1;
/// The empty set of stacks: nothing can follow.
pub(crate) const DEAD: u32 = 0;
const UNKNOWN: u32 = u32::MAX;

/// Bounds on the work one grammar may cost. The defaults are far above what real grammars
/// (json.gbnf, the JSON-schema converter's output, llama.cpp's examples) need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most stacks in one parse state (llama.cpp has no bound; #4218 shows 75 after 5 chars).
    pub max_stacks: usize,
    /// Most stack expansions while advancing one stack (catches grammars whose expansion does
    /// not terminate, which llama.cpp's left-recursion check misses).
    pub max_expansions: usize,
    /// Most distinct stack nodes and state sets kept by one grammar engine (memory bound).
    pub max_nodes: usize,
    /// Most code-point transitions computed while building one token mask (time bound per
    /// token; cached transitions are free).
    pub max_mask_transitions: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_stacks: 4096, max_expansions: 200_000, max_nodes: 8 << 20, max_mask_transitions: 2_000_000 }
    }
}

/// A character class, precompiled from llama.cpp's `CHAR`/`CHAR_NOT`/`CHAR_ALT`/
/// `CHAR_RNG_UPPER`/`CHAR_ANY` run.
#[derive(Clone, Debug)]
struct Class {
    positive: bool,
    any: bool,
    /// Inclusive ranges (a single character is `(c, c)`).
    ranges: Box<[(u32, u32)]>,
    /// Match results for code points 0..128, negation applied.
    ascii: u128,
    /// Bit `b - 0xC0` set when the class may match a character that UTF-8 lead byte `b`
    /// starts (see [`lead_range`]); clear only when it surely matches none.
    lead: u64,
    /// Position of the element after the class.
    end: u32,
}

impl Class {
    fn matches(&self, cp: u32) -> bool {
        if cp < 128 {
            return self.ascii >> cp & 1 == 1;
        }
        self.any || self.ranges.iter().any(|&(lo, hi)| lo <= cp && cp <= hi) == self.positive
    }

    /// llama.cpp's `llama_grammar_match_partial_char`: could some completion of `partial`
    /// satisfy this class? (For a negated class it answers "no" as soon as one completion
    /// falls in the excluded set: llama.cpp's over-rejection, kept.)
    fn matches_partial(&self, partial: Utf8) -> bool {
        let (value, n) = (partial.value, partial.n_remain);
        if n < 0 || (n == 1 && value < 2) {
            return false;
        }
        let shift = 6 * n as u32;
        let mut low = value << shift;
        let high = low | ((1u32 << shift) - 1);
        if low == 0 {
            if n == 2 {
                low = 1 << 11;
            } else if n == 3 {
                low = 1 << 16;
            }
        }
        if self.any {
            return true;
        }
        let overlap = self.ranges.iter().any(|&(lo, hi)| lo <= high && low <= hi);
        if overlap {
            self.positive
        } else {
            !self.positive
        }
    }
}

/// The UTF-8 decoder state llama.cpp keeps between tokens (`llama_partial_utf8`), plus
/// whether the pending sequence was carried over from an earlier token: llama.cpp checks the
/// continuation bytes of a carried sequence but not those of a sequence that starts inside
/// the current token.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Utf8 {
    pub value: u32,
    /// Bytes still expected; `-1` after an invalid sequence.
    pub n_remain: i8,
    carried: bool,
}

/// One byte through [`Utf8::step`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decoded {
    /// A complete code point.
    Char(u32),
    /// More bytes are needed.
    Pending,
    /// An invalid sequence: llama.cpp rejects the whole token.
    Invalid,
}

impl Utf8 {
    /// The state a new token starts from: a pending sequence becomes "carried".
    pub fn carry(self) -> Utf8 {
        if self.n_remain > 0 {
            Utf8 { carried: true, ..self }
        } else {
            Utf8::default()
        }
    }

    pub fn is_pending(self) -> bool {
        self.n_remain != 0
    }

    pub fn step(&mut self, b: u8) -> Decoded {
        if self.n_remain > 0 {
            if self.carried && b >> 6 != 2 {
                *self = Utf8 { value: 0, n_remain: -1, carried: false };
                return Decoded::Invalid;
            }
            self.value = (self.value << 6) + u32::from(b & 0x3F);
            self.n_remain -= 1;
            if self.n_remain == 0 {
                self.carried = false;
                return Decoded::Char(self.value);
            }
            return Decoded::Pending;
        }
        const LEN: [i8; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4];
        let n = LEN[usize::from(b >> 4)] - 1;
        if n < 0 {
            *self = Utf8 { value: 0, n_remain: -1, carried: false };
            return Decoded::Invalid;
        }
        let mask = (1u16 << (7 - n)) as u8 - 1;
        *self = Utf8 { value: u32::from(b & mask), n_remain: n, carried: false };
        if n == 0 {
            Decoded::Char(self.value)
        } else {
            Decoded::Pending
        }
    }
}

/// What one token does to a state, for a mask: allowed, not allowed, or (for truncated
/// stacks) "depends on the part of the stack not known here".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Accept,
    Reject,
    Uncertain,
}

#[derive(Clone, Debug)]
struct WideTable {
    bounds: Vec<u32>,
    next: Vec<u32>,
}

#[derive(Clone, Copy, Debug)]
struct Node {
    pos: u32,
    parent: u32,
}

#[derive(Clone, Copy, Debug)]
struct SetInfo {
    start: u32,
    len: u32,
    flags: u8,
}

pub(crate) const HAS_EMPTY: u8 = 1;
pub(crate) const HAS_BOTTOM: u8 = 2;
pub(crate) const HAS_TOKEN: u8 = 4;

/// Interned stacks and state sets of one grammar, with memoised advances and transitions.
#[derive(Debug)]
pub(crate) struct Engine {
    pub(crate) grammar: Arc<Compiled>,
    limits: Limits,
    /// Class index by position (`u32::MAX`: not a class start).
    class_at: Vec<u32>,
    classes: Vec<Class>,
    nodes: Vec<Node>,
    node_ids: FxHashMap<(u32, u32), u32>,
    advanced: FxHashMap<u32, u32>,
    sets: Vec<SetInfo>,
    members: Vec<u32>,
    set_ids: FxHashMap<Box<[u32]>, u32>,
    /// Per set: the union of its stacks' classes' `ascii` and `lead` bits (what a character
    /// must hit for the set not to die), so most dead transitions cost a bit test.
    viable: Vec<(u128, u64)>,
    ascii: Vec<Option<Box<[u32; 128]>>>,
    /// Per set: the ASCII characters that lead back to the same set (`None`: not computed).
    loops: Vec<Option<u128>>,
    transitions: FxHashMap<(u32, u32), u32>,
    /// Per set: the code points >= 128 cut into intervals on which every stack's class
    /// answers the same, with the transition of each interval (filled on first use).
    wide: Vec<Option<Box<WideTable>>>,
    /// Transitions computed since [`Engine::reset_budget`] (for `max_mask_transitions`).
    pub(crate) budget_used: usize,
    todo: Vec<u32>,
    seen: FxHashSet<u32>,
    out: Vec<u32>,
    /// Scratch buffers of [`Engine::step_slow`].
    matched: Vec<u32>,
    next: Vec<u32>,
    /// `(set, signature) → set`: see [`Engine::step_slow`].
    by_signature: FxHashMap<(u32, u64), u32>,
    /// [`Engine::loop_entry`] of the sets asked so far.
    entries: FxHashMap<u32, (u128, u32)>,
    singletons: FxHashMap<u32, u32>,
}

impl Engine {
    pub fn new(grammar: Arc<Compiled>, limits: Limits) -> Self {
        let mut class_at = vec![u32::MAX; grammar.elems.len()];
        let mut classes = Vec::new();
        for (pos, slot) in class_at.iter_mut().enumerate() {
            if matches!(grammar.elems[pos], Element::Char(_) | Element::CharNot(_) | Element::CharAny) {
                // A class starts at a Char/CharNot/CharAny that is not itself inside a class
                // (CharAlt / CharRngUpper follow their start, never precede it).
                *slot = classes.len() as u32;
                classes.push(compile_class(&grammar.elems, pos));
            }
        }
        let mut e = Engine {
            grammar,
            limits,
            class_at,
            classes,
            nodes: vec![Node { pos: u32::MAX, parent: u32::MAX }; 2],
            node_ids: FxHashMap::default(),
            advanced: FxHashMap::default(),
            sets: Vec::new(),
            members: Vec::new(),
            set_ids: FxHashMap::default(),
            viable: Vec::new(),
            ascii: Vec::new(),
            loops: Vec::new(),
            transitions: FxHashMap::default(),
            wide: Vec::new(),
            budget_used: 0,
            todo: Vec::new(),
            seen: FxHashSet::default(),
            out: Vec::new(),
            matched: Vec::new(),
            next: Vec::new(),
            by_signature: FxHashMap::default(),
            entries: FxHashMap::default(),
            singletons: FxHashMap::default(),
        };
        let dead = e.intern_sorted(&[]).expect("the empty set fits");
        debug_assert_eq!(dead, DEAD);
        e
    }

    /// The state llama.cpp's `llama_grammar_init_impl` starts from: one stack per alternative
    /// of the start rule, advanced.
    pub fn initial_set(&mut self) -> Result<u32> {
        let g = Arc::clone(&self.grammar);
        let mut all = Vec::new();
        for alt in alternatives(&g.elems, g.rule_start[g.root as usize]) {
            let stack = if g.elems[alt as usize].is_end_of_sequence() { EMPTY } else { self.push(EMPTY, alt)? };
            let set = self.advance(stack)?;
            all.extend_from_slice(self.set_members(set));
        }
        self.intern_unsorted(&mut all)
    }

    // ---- stacks ------------------------------------------------------------------------

    pub fn push(&mut self, parent: u32, pos: u32) -> Result<u32> {
        if let Some(&id) = self.node_ids.get(&(pos, parent)) {
            return Ok(id);
        }
        if self.nodes.len() >= self.limits.max_nodes {
            return Err(Error::limit(format!(
                "the grammar needed more than {} parse-stack nodes (Limits::max_nodes)",
                self.limits.max_nodes
            )));
        }
        let id = self.nodes.len() as u32;
        self.nodes.push(Node { pos, parent });
        self.node_ids.insert((pos, parent), id);
        Ok(id)
    }

    /// Top position of a non-empty stack.
    pub fn top(&self, stack: u32) -> u32 {
        self.nodes[stack as usize].pos
    }

    pub fn parent(&self, stack: u32) -> u32 {
        self.nodes[stack as usize].parent
    }

    /// The top `depth` frames of `stack` over [`BOTTOM`] (the stack itself when it is no
    /// deeper than `depth`).
    pub fn truncate(&mut self, stack: u32, depth: usize, frames: &mut Vec<u32>) -> Result<u32> {
        frames.clear();
        let mut s = stack;
        while s > BOTTOM && frames.len() < depth {
            frames.push(self.top(s));
            s = self.parent(s);
        }
        if s == EMPTY || s == BOTTOM {
            return Ok(stack);
        }
        let mut t = BOTTOM;
        for &pos in frames.iter().rev() {
            t = self.push(t, pos)?;
        }
        Ok(t)
    }

    /// llama.cpp's `llama_grammar_advance_stack`: expands rule references on top of `stack`
    /// until every resulting stack has a terminal on top or is empty. Memoised per stack.
    pub fn advance(&mut self, stack: u32) -> Result<u32> {
        if let Some(&set) = self.advanced.get(&stack) {
            return Ok(set);
        }
        let g = Arc::clone(&self.grammar);
        let mut todo = std::mem::take(&mut self.todo);
        let mut seen = std::mem::take(&mut self.seen);
        let mut out = std::mem::take(&mut self.out);
        todo.clear();
        seen.clear();
        out.clear();
        todo.push(stack);
        let mut result = Ok(());
        while let Some(s) = todo.pop() {
            if !seen.insert(s) {
                continue;
            }
            if seen.len() > self.limits.max_expansions {
                result = Err(Error::limit(format!(
                    "expanding one parse stack took more than {} steps (Limits::max_expansions): the grammar's \
                     expansion does not terminate or is too ambiguous",
                    self.limits.max_expansions
                )));
                break;
            }
            if s <= BOTTOM {
                out.push(s);
                continue;
            }
            let Node { pos, parent } = self.nodes[s as usize];
            match g.elems[pos as usize] {
                Element::RuleRef(rule) => {
                    let base = if g.elems[pos as usize + 1].is_end_of_sequence() {
                        Ok(parent)
                    } else {
                        self.push(parent, pos + 1)
                    };
                    let base = match base {
                        Ok(b) => b,
                        Err(e) => {
                            result = Err(e);
                            break;
                        }
                    };
                    for alt in alternatives(&g.elems, g.rule_start[rule as usize]) {
                        let next =
                            if g.elems[alt as usize].is_end_of_sequence() { Ok(base) } else { self.push(base, alt) };
                        match next {
                            Ok(n) => todo.push(n),
                            Err(e) => {
                                result = Err(e);
                                break;
                            }
                        }
                    }
                    if result.is_err() {
                        break;
                    }
                }
                Element::End | Element::Alt | Element::CharAlt(_) | Element::CharRngUpper(_) => {
                    result = Err(Error::new(crate::ErrorKind::Build, "internal: a parse stack stopped inside a class"));
                    break;
                }
                _ => out.push(s),
            }
        }
        let set = result.and_then(|()| self.intern_unsorted(&mut out));
        self.todo = todo;
        self.seen = seen;
        self.out = out;
        if let Ok(set) = set {
            self.advanced.insert(stack, set);
        }
        set
    }

    // ---- sets --------------------------------------------------------------------------

    /// Interns the set of `stacks` (sorted and deduplicated in place; the caller keeps the
    /// buffer for reuse).
    fn intern_unsorted(&mut self, stacks: &mut Vec<u32>) -> Result<u32> {
        stacks.sort_unstable();
        stacks.dedup();
        self.intern_sorted(stacks)
    }

    fn intern_sorted(&mut self, stacks: &[u32]) -> Result<u32> {
        if let Some(&id) = self.set_ids.get(stacks) {
            return Ok(id);
        }
        if stacks.len() > self.limits.max_stacks {
            return Err(Error::limit(format!(
                "the parse state grew to {} stacks, more than Limits::max_stacks = {}: the grammar is too ambiguous \
                 (for example `x? x? x?`; write `x{{0,3}}`)",
                stacks.len(),
                self.limits.max_stacks
            )));
        }
        if self.sets.len() >= self.limits.max_nodes {
            return Err(Error::limit(format!(
                "the grammar needed more than {} parse states (Limits::max_nodes)",
                self.limits.max_nodes
            )));
        }
        let mut flags = 0;
        let (mut ascii, mut lead) = (0u128, 0u64);
        for &s in stacks {
            flags |= match s {
                EMPTY => HAS_EMPTY,
                BOTTOM => HAS_BOTTOM,
                _ => match self.grammar.elems[self.top(s) as usize] {
                    Element::Token(_) | Element::TokenNot(_) => HAS_TOKEN,
                    _ => 0,
                },
            };
            if s > BOTTOM {
                if let Some(class) = self.classes.get(self.class_at[self.top(s) as usize] as usize) {
                    ascii |= class.ascii;
                    lead |= class.lead;
                }
            }
        }
        let id = self.sets.len() as u32;
        self.sets.push(SetInfo { start: self.members.len() as u32, len: stacks.len() as u32, flags });
        self.members.extend_from_slice(stacks);
        self.set_ids.insert(stacks.into(), id);
        self.viable.push((ascii, lead));
        self.ascii.push(None);
        self.loops.push(None);
        self.wide.push(None);
        Ok(id)
    }

    pub fn set_members(&self, set: u32) -> &[u32] {
        let info = self.sets[set as usize];
        &self.members[info.start as usize..(info.start + info.len) as usize]
    }

    /// The ASCII characters some stack of `set` takes (as bits): the others kill it.
    #[inline]
    pub fn ascii_viable(&self, set: u32) -> u128 {
        self.viable[set as usize].0
    }

    /// False when no character starting with UTF-8 lead byte `lead` (0xC0..=0xFF) can be
    /// consumed by `set`: every token whose next character starts so dies there.
    #[inline]
    pub fn lead_viable(&self, set: u32, lead: u8) -> bool {
        self.viable[set as usize].1 >> (lead.wrapping_sub(0xC0) & 63) & 1 == 1
    }

    /// `HAS_EMPTY | HAS_BOTTOM | HAS_TOKEN` bits of `set`.
    #[inline]
    pub fn flags(&self, set: u32) -> u8 {
        self.sets[set as usize].flags
    }

    pub fn has_empty(&self, set: u32) -> bool {
        self.sets[set as usize].flags & HAS_EMPTY != 0
    }

    pub fn has_bottom(&self, set: u32) -> bool {
        self.sets[set as usize].flags & HAS_BOTTOM != 0
    }

    pub fn has_token_top(&self, set: u32) -> bool {
        self.sets[set as usize].flags & HAS_TOKEN != 0
    }

    /// The ASCII characters `c` with `step(set, c) == set`, as bits; bit 0 set when every code
    /// point from 128 up does the same. A token made only of such characters is accepted in
    /// `set` and leaves it there (the body of a `[…]*` loop, JSON string content).
    pub fn loop_alphabet(&mut self, set: u32) -> Result<u128> {
        if let Some(bits) = self.loops[set as usize] {
            return Ok(bits);
        }
        let mut bits = 0u128;
        if set != DEAD {
            // A character no class takes kills the set: only the others can loop.
            let mut viable = self.viable[set as usize].0 & !1;
            while viable != 0 {
                let c = viable.trailing_zeros();
                viable &= viable - 1;
                if self.step(set, c)? == set {
                    bits |= 1 << c;
                }
            }
            // Bit 0 (NUL never occurs in token text): every code point >= 128 loops too.
            if self.sets[set as usize].len <= 64 {
                if self.wide[set as usize].is_none() {
                    let table = self.wide_table(set);
                    self.wide[set as usize] = Some(Box::new(table));
                }
                let bounds = self.wide[set as usize].as_ref().expect("built above").bounds.clone();
                let mut all = true;
                for b in bounds {
                    if self.step(set, b)? != set {
                        all = false;
                        break;
                    }
                }
                if all {
                    bits |= 1;
                }
            }
        }
        self.loops[set as usize] = Some(bits);
        Ok(bits)
    }

    /// An alphabet `A` (as in [`Engine::loop_alphabet`]) such that every character of `A` takes
    /// `set` to one same set that loops on `A` (`set` itself when it loops): then every token
    /// made only of `A`'s characters is accepted from `set`, the first character entering the
    /// loop and the others staying in it. Returns the alphabet (0 when none is found: a few
    /// candidates are tried, the sets reached on the first characters that do not kill `set`)
    /// and the looping set.
    pub fn loop_entry(&mut self, set: u32) -> Result<(u128, u32)> {
        if let Some(&entry) = self.entries.get(&set) {
            return Ok(entry);
        }
        let mut found = (0, DEAD);
        if set != DEAD && self.flags(set) & HAS_TOKEN == 0 {
            found = (self.loop_alphabet(set)?, set);
            let mut tried = [DEAD; 3];
            let mut n_tried = 0;
            let mut viable = self.viable[set as usize].0 & !1;
            while found.0 == 0 && viable != 0 && n_tried < tried.len() {
                let c = viable.trailing_zeros();
                viable &= viable - 1;
                let target = self.step(set, c)?;
                if target == DEAD || tried[..n_tried].contains(&target) {
                    continue;
                }
                tried[n_tried] = target;
                n_tried += 1;
                if self.flags(target) & HAS_TOKEN != 0 {
                    continue;
                }
                let alphabet = self.loop_alphabet(target)?;
                if alphabet != 0 && self.all_step_to(set, alphabet, target)? {
                    found = (alphabet, target);
                }
            }
        }
        self.entries.insert(set, found);
        Ok(found)
    }

    /// Does every character of `alphabet` (bit 0: every code point from 128 up) take `set` to
    /// `target`?
    fn all_step_to(&mut self, set: u32, alphabet: u128, target: u32) -> Result<bool> {
        let mut ascii = alphabet & !1;
        while ascii != 0 {
            let c = ascii.trailing_zeros();
            ascii &= ascii - 1;
            if self.step(set, c)? != target {
                return Ok(false);
            }
        }
        if alphabet & 1 == 1 {
            // Every interval of the wide table answers for all of its code points.
            if self.sets[set as usize].len > 64 {
                return Ok(false);
            }
            if self.wide[set as usize].is_none() {
                let table = self.wide_table(set);
                self.wide[set as usize] = Some(Box::new(table));
            }
            let bounds = self.wide[set as usize].as_ref().expect("built above").bounds.clone();
            for b in bounds {
                if self.step(set, b)? != target {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// [`Engine::loop_alphabet`] if already computed.
    #[inline]
    pub fn known_loop_alphabet(&self, set: u32) -> Option<u128> {
        self.loops[set as usize]
    }

    /// The set holding exactly `stack`, advanced.
    pub fn singleton(&mut self, stack: u32) -> Result<u32> {
        if let Some(&s) = self.singletons.get(&stack) {
            return Ok(s);
        }
        let s = self.advance(stack)?;
        self.singletons.insert(stack, s);
        Ok(s)
    }

    pub fn reset_budget(&mut self) {
        self.budget_used = 0;
    }

    /// llama.cpp's `llama_grammar_accept` of one code point on every stack of `set`: stacks
    /// whose top class matches move past it and are advanced; the others (token tops, empty
    /// stacks, [`BOTTOM`]) die.
    ///
    /// Memoised per (set, ASCII code point) in a dense table; for other code points per (set,
    /// interval of code points on which its stacks' classes all answer the same), so the
    /// thousands of distinct characters of a real vocabulary share a handful of entries.
    #[inline(always)]
    pub fn step(&mut self, set: u32, cp: u32) -> Result<u32> {
        if cp < 128 {
            if let Some(table) = &self.ascii[set as usize] {
                let next = table[cp as usize];
                if next != UNKNOWN {
                    return Ok(next);
                }
            }
        }
        self.step_table(set, cp)
    }

    #[inline(never)]
    fn step_table(&mut self, set: u32, cp: u32) -> Result<u32> {
        if cp < 128 {
            // No stack's class takes the character: the set dies, nothing to compute.
            let next = if self.viable[set as usize].0 >> cp & 1 == 0 { DEAD } else { self.step_slow(set, cp)? };
            self.ascii[set as usize].get_or_insert_with(|| Box::new([UNKNOWN; 128]))[cp as usize] = next;
            return Ok(next);
        }
        if let Some(table) = &self.wide[set as usize] {
            let slot = table.bounds.partition_point(|&b| b <= cp) - 1;
            let next = table.next[slot];
            if next != UNKNOWN {
                return Ok(next);
            }
            let next = self.step_slow(set, cp)?;
            self.wide[set as usize].as_mut().expect("built above").next[slot] = next;
            return Ok(next);
        }
        if self.sets[set as usize].len <= 64 {
            let table = self.wide_table(set);
            self.wide[set as usize] = Some(Box::new(table));
            return self.step(set, cp);
        }
        if let Some(&next) = self.transitions.get(&(set, cp)) {
            return Ok(next);
        }
        let next = self.step_slow(set, cp)?;
        self.transitions.insert((set, cp), next);
        Ok(next)
    }

    /// The interval table of `set` for code points >= 128: bounds where some stack's class
    /// starts or stops matching.
    fn wide_table(&self, set: u32) -> WideTable {
        let mut bounds = vec![128u32];
        for &s in self.set_members(set) {
            if s <= BOTTOM {
                continue;
            }
            let class = self.class_at[self.top(s) as usize];
            if class == u32::MAX || self.classes[class as usize].any {
                continue;
            }
            for &(lo, hi) in self.classes[class as usize].ranges.iter() {
                if hi >= 128 {
                    bounds.push(lo.max(128));
                    if hi < u32::MAX {
                        bounds.push(hi + 1);
                    }
                }
            }
        }
        bounds.sort_unstable();
        bounds.dedup();
        let next = vec![UNKNOWN; bounds.len()];
        WideTable { bounds, next }
    }

    #[cold]
    fn step_slow(&mut self, set: u32, cp: u32) -> Result<u32> {
        self.budget_used += 1;
        if self.budget_used > self.limits.max_mask_transitions {
            return Err(Error::limit(format!(
                "more than {} new parse transitions in one step (Limits::max_mask_transitions)",
                self.limits.max_mask_transitions
            )));
        }
        // The result depends only on which stacks' classes match `cp`: characters that match
        // the same stacks share it (all letters in a string, a run of digits), so it is
        // memoised by that signature (a bit per stack, for sets of up to 64 stacks).
        let info = self.sets[set as usize];
        let mut sig = 0u64;
        let mut matched = std::mem::take(&mut self.matched);
        matched.clear();
        for (k, i) in (info.start..info.start + info.len).enumerate() {
            let s = self.members[i as usize];
            if s <= BOTTOM {
                continue;
            }
            let class = self.class_at[self.nodes[s as usize].pos as usize];
            // A token element on top: characters do not match it.
            if class != u32::MAX && self.classes[class as usize].matches(cp) {
                matched.push(s);
                if k < 64 {
                    sig |= 1 << k;
                }
            }
        }
        let memo = info.len <= 64;
        if memo {
            if let Some(&next) = self.by_signature.get(&(set, sig)) {
                self.matched = matched;
                return Ok(next);
            }
        }
        let result = self.step_matched(&matched);
        self.matched = matched;
        let next = result?;
        if memo {
            self.by_signature.insert((set, sig), next);
        }
        Ok(next)
    }

    /// The set reached when the stacks `matched` (each topped by a class that took the
    /// character) move past their class and are advanced.
    fn step_matched(&mut self, matched: &[u32]) -> Result<u32> {
        let g = Arc::clone(&self.grammar);
        let mut next = std::mem::take(&mut self.next);
        next.clear();
        let mut result = Ok(());
        for &s in matched {
            let Node { pos, parent } = self.nodes[s as usize];
            let end = self.classes[self.class_at[pos as usize] as usize].end;
            let moved = if g.elems[end as usize].is_end_of_sequence() { Ok(parent) } else { self.push(parent, end) };
            match moved.and_then(|m| self.advance(m)) {
                Ok(advanced) => next.extend_from_slice(self.set_members(advanced)),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        let set = result.and_then(|()| self.intern_unsorted(&mut next));
        self.next = next;
        set
    }

    /// Does a token that ends (mid-character) with `partial` pending survive in `set`?
    /// `Uncertain` when only [`BOTTOM`] could tell.
    pub fn partial_verdict(&self, set: u32, partial: Utf8) -> Verdict {
        for &s in self.set_members(set) {
            if s <= BOTTOM {
                continue;
            }
            let class = self.class_at[self.top(s) as usize];
            if class != u32::MAX && self.classes[class as usize].matches_partial(partial) {
                return Verdict::Accept;
            }
        }
        if self.has_bottom(set) {
            Verdict::Uncertain
        } else {
            Verdict::Reject
        }
    }

    /// Is some stack of `set` topped by a token element that `token` satisfies?
    pub fn token_matches_top(&self, set: u32, token: u32) -> bool {
        self.set_members(set).iter().any(|&s| {
            s > BOTTOM
                && match self.grammar.elems[self.top(s) as usize] {
                    Element::Token(t) => t == token,
                    Element::TokenNot(t) => t != token,
                    _ => false,
                }
        })
    }

    /// The exact verdict of one token in `set` (llama.cpp's `llama_grammar_reject_candidates`
    /// for a single candidate), decoding `bytes` from `start`. The slow, obvious path: the
    /// trie walk in `mask.rs` must agree with it.
    pub fn token_verdict(&mut self, set: u32, start: Utf8, token: u32, bytes: &[u8]) -> Result<Verdict> {
        // llama.cpp decodes the whole token first: an invalid sequence anywhere rejects it,
        // even where a token element on top would have matched its id.
        let mut check = start.carry();
        if bytes.iter().any(|&b| check.step(b) == Decoded::Invalid) {
            return Ok(Verdict::Reject);
        }
        let mut cur = set;
        let mut dec = start.carry();
        let mut uncertain = false;
        for &b in bytes {
            match dec.step(b) {
                Decoded::Invalid => return Ok(Verdict::Reject),
                Decoded::Pending => {}
                Decoded::Char(cp) => {
                    if self.has_token_top(cur) && self.token_matches_top(cur, token) {
                        return Ok(Verdict::Accept);
                    }
                    if self.has_bottom(cur) {
                        uncertain = true;
                    }
                    cur = self.step(cur, cp)?;
                    if cur == DEAD {
                        return Ok(if uncertain { Verdict::Uncertain } else { Verdict::Reject });
                    }
                }
            }
        }
        if !dec.is_pending() {
            return Ok(Verdict::Accept);
        }
        // `cur` may be DEAD only if no character was consumed from an empty set.
        match self.partial_verdict(cur, dec) {
            Verdict::Reject if uncertain => Ok(Verdict::Uncertain),
            v => Ok(v),
        }
    }

    /// llama.cpp's `llama_grammar_accept_token`: token elements on top test the id; the other
    /// stacks consume the token's text. Returns the new set and decoder state; `DEAD` when no
    /// stack survives (llama.cpp throws there).
    pub fn accept_token(&mut self, set: u32, start: Utf8, token: u32, bytes: &[u8]) -> Result<(u32, Utf8)> {
        if !self.has_token_top(set) {
            // Only character stacks: stepping the whole set is the union of stepping each
            // stack (memoised, allocation-free).
            let mut dec = start.carry();
            let mut cur = set;
            let mut check = start.carry();
            if bytes.iter().any(|&b| check.step(b) == Decoded::Invalid) {
                return Ok((DEAD, check));
            }
            for &b in bytes {
                if let Decoded::Char(cp) = dec.step(b) {
                    cur = self.step(cur, cp)?;
                    if cur == DEAD {
                        break;
                    }
                }
            }
            return Ok((cur, dec));
        }
        let g = Arc::clone(&self.grammar);
        let mut cps: Vec<u32> = Vec::with_capacity(bytes.len());
        let mut dec = start.carry();
        for &b in bytes {
            match dec.step(b) {
                Decoded::Invalid => return Ok((DEAD, dec)),
                Decoded::Pending => {}
                Decoded::Char(cp) => cps.push(cp),
            }
        }
        let mut all = Vec::new();
        let stacks: Vec<u32> = self.set_members(set).to_vec();
        for s in stacks {
            if s <= BOTTOM {
                continue;
            }
            let Node { pos, parent } = self.nodes[s as usize];
            match g.elems[pos as usize] {
                Element::Token(t) | Element::TokenNot(t) => {
                    let is_not = matches!(g.elems[pos as usize], Element::TokenNot(_));
                    if (t == token) != is_not {
                        let moved = if g.elems[pos as usize + 1].is_end_of_sequence() {
                            parent
                        } else {
                            self.push(parent, pos + 1)?
                        };
                        let adv = self.advance(moved)?;
                        all.extend_from_slice(self.set_members(adv));
                    }
                }
                _ => {
                    let mut cur = self.singleton(s)?;
                    for &cp in &cps {
                        cur = self.step(cur, cp)?;
                        if cur == DEAD {
                            break;
                        }
                    }
                    all.extend_from_slice(self.set_members(cur));
                }
            }
        }
        Ok((self.intern_unsorted(&mut all)?, dec))
    }
}

/// Start positions of the alternatives of the rule starting at `start`.
fn alternatives(elems: &[Element], start: u32) -> impl Iterator<Item = u32> + '_ {
    let mut pos = Some(start);
    std::iter::from_fn(move || {
        let alt = pos?;
        let mut p = alt as usize;
        while !elems[p].is_end_of_sequence() {
            p += 1;
        }
        pos = if elems[p] == Element::Alt { Some(p as u32 + 1) } else { None };
        Some(alt)
    })
}

fn compile_class(elems: &[Element], start: usize) -> Class {
    let positive = !matches!(elems[start], Element::CharNot(_));
    let mut ranges = Vec::new();
    let mut any = false;
    let mut p = start;
    loop {
        let value = match elems[p] {
            Element::Char(c) | Element::CharNot(c) | Element::CharAlt(c) => c,
            Element::CharAny => {
                any = true;
                p += 1;
                if !matches!(elems[p], Element::CharAlt(_)) {
                    break;
                }
                continue;
            }
            _ => break,
        };
        if let Element::CharRngUpper(hi) = elems[p + 1] {
            ranges.push((value, hi));
            p += 2;
        } else {
            ranges.push((value, value));
            p += 1;
        }
        if !matches!(elems[p], Element::CharAlt(_)) {
            break;
        }
    }
    let mut class = Class { positive, any, ranges: ranges.into(), ascii: 0, lead: 0, end: p as u32 };
    let mut ascii = 0u128;
    for cp in 0..128u32 {
        let hit = class.any || class.ranges.iter().any(|&(lo, hi)| lo <= cp && cp <= hi) == class.positive;
        if hit {
            ascii |= 1 << cp;
        }
    }
    class.ascii = ascii;
    for b in 0xC0..=0xFFu8 {
        let (lo, hi) = lead_range(b);
        let hit = class.any
            || if class.positive {
                class.ranges.iter().any(|&(l, h)| l <= hi && lo <= h)
            } else {
                // Some value of [lo, hi] escapes the excluded ranges unless one range covers
                // it all (ranges are not merged: "may match" is the safe answer).
                !class.ranges.iter().any(|&(l, h)| l <= lo && hi <= h)
            };
        if hit {
            class.lead |= 1 << (b - 0xC0);
        }
    }
    class
}

/// The code points a character starting with lead byte `b` (0xC0..=0xFF) can decode to, as
/// [`Utf8::step`] decodes: the lead's payload followed by any 6-bit continuation payloads
/// (continuation bytes inside a token are not checked, so this is every such value).
fn lead_range(b: u8) -> (u32, u32) {
    let mut dec = Utf8::default();
    match dec.step(b) {
        Decoded::Pending => {
            let shift = 6 * dec.n_remain as u32;
            let lo = dec.value << shift;
            (lo, lo | ((1 << shift) - 1))
        }
        // Only lead bytes reach here; an impossible answer keeps the class "may match".
        _ => (0, u32::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(bytes: &[u8], start: Utf8) -> (Vec<Decoded>, Utf8) {
        let mut d = start.carry();
        let out = bytes.iter().map(|&b| d.step(b)).collect();
        (out, d)
    }

    #[test]
    fn utf8_as_llama_cpp_decodes_it() {
        let (out, end) = decode("aé€😀".as_bytes(), Utf8::default());
        let chars: Vec<u32> =
            out.iter().filter_map(|d| if let Decoded::Char(c) = d { Some(*c) } else { None }).collect();
        assert_eq!(chars, ['a' as u32, 'é' as u32, '€' as u32, '😀' as u32]);
        assert!(!end.is_pending());
        // A split character: pending, then completed by the next token.
        let (_, mid) = decode(&[0xC3], Utf8::default());
        assert_eq!((mid.value, mid.n_remain), (3, 1));
        let (out, _) = decode(&[0xA9], mid);
        assert_eq!(out, [Decoded::Char(0xE9)]);
        // A stray continuation byte is invalid; so is a carried sequence not continued.
        assert_eq!(decode(&[0x80], Utf8::default()).0, [Decoded::Invalid]);
        assert_eq!(decode(b"a", mid).0, [Decoded::Invalid]);
        // Inside one token llama.cpp does not check continuation bytes.
        assert_eq!(decode(&[0xC3, b'A'], Utf8::default()).0, [Decoded::Pending, Decoded::Char(0xC1)]);
    }

    #[test]
    fn partial_char_rules() {
        let class = |elems: &[Element]| compile_class(elems, 0);
        use Element::*;
        let e_acute = class(&[Char(0xE9), End]);
        let not_e_acute = class(&[CharNot(0xE9), End]);
        let lead_c3 = Utf8 { value: 3, n_remain: 1, carried: false };
        assert!(e_acute.matches_partial(lead_c3));
        // llama.cpp's over-rejection for negated classes.
        assert!(!not_e_acute.matches_partial(lead_c3));
        // Overlong two-byte leads are rejected.
        assert!(!class(&[CharAny, End]).matches_partial(Utf8 { value: 1, n_remain: 1, carried: false }));
    }
}
