//! [`Matcher`]: one sequence's position in a grammar.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::engine::{Decoded, Engine, Limits, Utf8, Verdict, DEAD};
use crate::error::{Error, Result};
use crate::grammar::Grammar;
use crate::mask::{self, MaskCache};
use crate::trie::TokenIndex;

/// Interned parse states and mask caches, shared by a matcher and its clones.
#[derive(Debug)]
pub(crate) struct Shared {
    pub engine: Engine,
    pub cache: MaskCache,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct State {
    set: u32,
    utf8: Utf8,
}

/// Where one sequence is in a grammar: llama.cpp's set of parse stacks plus the pending
/// partial UTF-8 character, with the history needed to roll back.
///
/// Clones share the grammar's interned states and caches (behind a mutex), so forking a
/// sequence, or running many sequences on one grammar, costs no recompilation; each clone
/// then moves on its own.
///
/// ```
/// use std::sync::Arc;
/// use tokensieve_grammar::{Grammar, Matcher, TokenIndex};
/// let grammar = Grammar::new(r#"root ::= "yes" | "no""#).unwrap();
/// let vocab = Arc::new(TokenIndex::new([b"y".as_slice(), b"es", b"no", b"yes!", b"</s>"], &[4]));
/// let mut m = Matcher::with_vocab(&grammar, vocab).unwrap();
/// assert_eq!(m.allowed_tokens().unwrap(), [0, 2]);   // "y", "no"
/// m.accept_token(0).unwrap();
/// assert_eq!(m.allowed_tokens().unwrap(), [1]);      // "es"
/// m.accept_token(1).unwrap();
/// assert!(m.is_complete());
/// assert_eq!(m.allowed_tokens().unwrap(), [4]);      // only end-of-generation
/// m.rollback(2).unwrap();
/// assert!(m.accept_token(3).is_err());               // "yes!" does not fit; state unchanged
/// ```
#[derive(Clone, Debug)]
pub struct Matcher {
    shared: Arc<Mutex<Shared>>,
    index: Option<Arc<TokenIndex>>,
    initial: State,
    state: State,
    history: Vec<State>,
}

impl Matcher {
    /// A matcher over text only (no vocabulary: token masks and token ids are unavailable).
    pub fn new(grammar: &Grammar) -> Result<Self> {
        Self::build(grammar, None, Limits::default())
    }

    /// A matcher that can compute masks over `vocab` and accept tokens by id.
    pub fn with_vocab(grammar: &Grammar, vocab: Arc<TokenIndex>) -> Result<Self> {
        Self::build(grammar, Some(vocab), Limits::default())
    }

    /// As [`Matcher::with_vocab`] (vocabulary optional) with explicit [`Limits`].
    pub fn with_limits(grammar: &Grammar, vocab: Option<Arc<TokenIndex>>, limits: Limits) -> Result<Self> {
        Self::build(grammar, vocab, limits)
    }

    fn build(grammar: &Grammar, index: Option<Arc<TokenIndex>>, limits: Limits) -> Result<Self> {
        let mut engine = Engine::new(Arc::clone(&grammar.inner), limits);
        let set = engine.initial_set()?;
        let initial = State { set, utf8: Utf8::default() };
        Ok(Matcher {
            shared: Arc::new(Mutex::new(Shared { engine, cache: MaskCache::default() })),
            index,
            initial,
            state: initial,
            history: Vec::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        // The shared part only grows (interned states, caches); a panic elsewhere cannot
        // leave it inconsistent for readers, so a poisoned lock is still usable.
        self.shared.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The vocabulary, if the matcher has one.
    pub fn vocab(&self) -> Option<&Arc<TokenIndex>> {
        self.index.as_ref()
    }

    fn index(&self) -> Result<&Arc<TokenIndex>> {
        self.index.as_ref().ok_or_else(|| Error::token("this matcher has no vocabulary; build it with_vocab"))
    }

    /// True when the text so far is a complete sentence (some parse stack is empty): the
    /// end-of-generation token is allowed now.
    pub fn is_complete(&self) -> bool {
        self.lock().engine.has_empty(self.state.set)
    }

    /// True when a partial UTF-8 character is pending (the last token ended inside one).
    pub fn has_partial_char(&self) -> bool {
        self.state.utf8.is_pending()
    }

    /// Number of parse stacks in the current state.
    pub fn n_stacks(&self) -> usize {
        self.lock().engine.set_members(self.state.set).len()
    }

    /// Number of accepted steps that [`Matcher::rollback`] can undo.
    pub fn history_len(&self) -> usize {
        self.history.len()
    }

    fn commit(&mut self, next: State) {
        self.history.push(self.state);
        self.state = next;
    }

    /// Consumes text (every stack steps through its code points, as llama.cpp's
    /// `llama_grammar_accept_str`). On rejection the state is unchanged and the error gives
    /// the byte offset where no parse survived.
    pub fn accept_bytes(&mut self, bytes: &[u8]) -> Result<()> {
        let shared = Arc::clone(&self.shared);
        let mut guard = shared.lock().unwrap_or_else(|p| p.into_inner());
        let engine = &mut guard.engine;
        let mut set = self.state.set;
        let mut dec = self.state.utf8.carry();
        for (offset, &b) in bytes.iter().enumerate() {
            match dec.step(b) {
                Decoded::Invalid => {
                    return Err(Error::rejected(format!("invalid UTF-8 at byte {offset}")));
                }
                Decoded::Pending => {}
                Decoded::Char(cp) => {
                    set = engine.step(set, cp)?;
                    if set == DEAD {
                        let ch = char::from_u32(cp).map_or_else(|| format!("U+{cp:04X}"), |c| format!("{c:?}"));
                        return Err(Error::rejected(format!("the grammar rejects {ch} at byte {offset}")));
                    }
                }
            }
        }
        drop(guard);
        self.commit(State { set, utf8: dec });
        Ok(())
    }

    /// [`Matcher::accept_bytes`] for a string.
    pub fn accept_str(&mut self, text: &str) -> Result<()> {
        self.accept_bytes(text.as_bytes())
    }

    /// Accepts a token by id (needs a vocabulary). An end-of-generation token is accepted
    /// only when the parse is complete and leaves the state as it is, as in llama.cpp.
    pub fn accept_token(&mut self, token: u32) -> Result<()> {
        let index = Arc::clone(self.index()?);
        if token as usize >= index.len() {
            return Err(Error::token(format!("token {token} is outside the vocabulary of {} tokens", index.len())));
        }
        if index.is_eog(token) {
            if !self.is_complete() {
                return Err(Error::rejected(format!("end-of-generation token {token} before the grammar is complete")));
            }
            self.commit(self.state);
            return Ok(());
        }
        let text = index.token_bytes(token);
        if text.is_empty() {
            return Err(Error::rejected(format!("token {token} has no text; the grammar never allows it")));
        }
        self.accept_token_text(token, text)
    }

    /// llama.cpp's `llama_grammar_accept_token` with an explicit piece: stacks topped by a
    /// token element test `token`, the others consume `text`. On rejection the state is
    /// unchanged.
    pub fn accept_token_text(&mut self, token: u32, text: &[u8]) -> Result<()> {
        let text = text.iter().position(|&b| b == 0).map_or(text, |nul| &text[..nul]);
        let (set, utf8) = self.lock().engine.accept_token(self.state.set, self.state.utf8, token, text)?;
        if set == DEAD {
            return Err(Error::rejected(format!(
                "the grammar rejects token {token} ({:?})",
                String::from_utf8_lossy(text)
            )));
        }
        self.commit(State { set, utf8 });
        Ok(())
    }

    /// Undoes the last `n` accepted steps (tokens or texts), for speculative decoding.
    pub fn rollback(&mut self, n: usize) -> Result<()> {
        if n > self.history.len() {
            return Err(Error::rejected(format!(
                "cannot roll back {n} steps: only {} have been accepted",
                self.history.len()
            )));
        }
        if n > 0 {
            self.state = self.history[self.history.len() - n];
            self.history.truncate(self.history.len() - n);
        }
        Ok(())
    }

    /// Back to the start of the grammar, history cleared.
    pub fn reset(&mut self) {
        self.state = self.initial;
        self.history.clear();
    }

    /// Is `token` allowed next? Checks this one token only: llama.cpp's fast mode tests the
    /// sampled token before computing any mask.
    pub fn allows(&mut self, token: u32) -> Result<bool> {
        let index = Arc::clone(self.index()?);
        if token as usize >= index.len() {
            return Ok(false);
        }
        if index.is_eog(token) {
            return Ok(self.is_complete());
        }
        let text = index.token_bytes(token);
        if text.is_empty() {
            return Ok(false);
        }
        let state = self.state;
        let verdict = self.lock().engine.token_verdict(state.set, state.utf8, token, text)?;
        Ok(verdict == Verdict::Accept)
    }

    /// Writes the allowed-token bitmask for the next step into `mask` (`ceil(V/32)` words).
    /// Allocation-free once the states it meets have been cached.
    pub fn fill_mask(&mut self, mask: &mut [u32]) -> Result<()> {
        let index = Arc::clone(self.index()?);
        let state = self.state;
        let mut guard = self.lock();
        let Shared { engine, cache } = &mut *guard;
        mask::fill(engine, cache, &index, state.set, state.utf8, mask)
    }

    /// The allowed-token bitmask for the next step.
    pub fn mask(&mut self) -> Result<Vec<u32>> {
        let mut mask = vec![0; self.index()?.words()];
        self.fill_mask(&mut mask)?;
        Ok(mask)
    }

    /// The allowed token ids for the next step, ascending.
    pub fn allowed_tokens(&mut self) -> Result<Vec<u32>> {
        let mask = self.mask()?;
        let n = self.index()?.len() as u32;
        Ok((0..n).filter(|&t| mask::is_allowed(&mask, t)).collect())
    }

    /// The mask computed token by token (slow; the definition the fast path is tested
    /// against).
    #[doc(hidden)]
    pub fn mask_naive(&mut self) -> Result<Vec<u32>> {
        let index = Arc::clone(self.index()?);
        let mut mask = vec![0; index.words()];
        let state = self.state;
        mask::fill_naive(&mut self.lock().engine, &index, state.set, state.utf8, &mut mask)?;
        Ok(mask)
    }

    /// Sets how many top stack frames key the context-independent mask cache (default 3;
    /// affects speed only, never the mask).
    #[doc(hidden)]
    pub fn set_cache_depth(&mut self, depth: usize) {
        let mut guard = self.lock();
        guard.cache = MaskCache::with_depth(depth.max(1));
    }

    /// Sets the subtree size from which the trie walk looks for a looping state's slice
    /// (default 512; affects speed only, never the mask). Tests set it low to exercise slices
    /// on small vocabularies.
    #[doc(hidden)]
    pub fn set_slice_threshold(&mut self, nodes: usize) {
        self.lock().cache.slice_worth = nodes.max(1);
    }

    /// Cache statistics: (stack hits, stack misses, frame-cache misses).
    #[doc(hidden)]
    pub fn cache_stats(&self) -> (u64, u64, u64) {
        self.lock().cache.stats
    }
}
