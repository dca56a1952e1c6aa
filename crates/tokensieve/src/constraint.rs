//! Constraints: a per-sequence filter that decides which tokens may come next (a grammar, from
//! the `tokensieve-grammar` crate), applied before every other stage of a [`Chain`].
//!
//! The core library knows nothing about grammars; it only asks a [`Constraint`] for a packed
//! `u32` bitmask (bit `i % 32` of word `i / 32` set = token `i` allowed) or whether one token
//! is allowed, and tells it which token was chosen. Two ways to combine it with the chain
//! ([`ConstraintMode`]):
//!
//! * [`ConstraintMode::MaskFirst`]: mask the row, then run the chain. Exact: every stage sees
//!   only allowed tokens and probabilities are renormalised over them (llama.cpp's
//!   `grammar_first`).
//! * [`ConstraintMode::Rejection`]: run the chain on the unmasked row, check only the chosen
//!   token, and mask and run the chain again only if it is rejected. llama.cpp's default in
//!   `common_sampler_sample`; much cheaper per token, but with truncation samplers the
//!   distribution differs from masked sampling (see `shared/reference/gbnf.md` §1.3).
//!
//! [`Chain`]: crate::Chain

use std::fmt;

use crate::error::Result;

/// A filter on the next token, with its own per-sequence state.
pub trait Constraint: Send + fmt::Debug {
    /// False while the constraint waits for a trigger (a lazy grammar): nothing is masked.
    fn is_active(&self) -> bool {
        true
    }
    /// Writes the allowed-token bitmask for the next step (`mask.len() == ceil(V / 32)`).
    fn fill_mask(&mut self, mask: &mut [u32]) -> Result<()>;
    /// True when `token` may come next.
    fn allows(&mut self, token: u32) -> Result<bool>;
    /// Adds a chosen token to the sequence. An error leaves the state unchanged.
    fn accept(&mut self, token: u32) -> Result<()>;
    /// Back to the initial state.
    fn reset(&mut self);
    /// A copy with the same state, for [`Chain`](crate::Chain)'s `clone`.
    fn box_clone(&self) -> Box<dyn Constraint>;
}

/// How a [`Chain`](crate::Chain) combines its constraint with the stages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ConstraintMode {
    /// Mask the row, then run the chain (exact).
    #[default]
    MaskFirst,
    /// Run the chain, check the chosen token, mask and rerun only if it is rejected
    /// (llama.cpp's default fast mode).
    Rejection,
}

/// Sets `row[i] = -inf` for every token `i` whose bit is clear in `mask`; tokens past the end
/// of the mask are masked too. Fully allowed words are skipped.
///
/// ```
/// let mut row = [1.0f32, 2.0, 3.0, 4.0];
/// tokensieve::constraint::apply_bitmask(&mut row, &[0b0101]);
/// assert_eq!(row, [1.0, f32::NEG_INFINITY, 3.0, f32::NEG_INFINITY]);
/// ```
pub fn apply_bitmask(row: &mut [f32], mask: &[u32]) {
    for (chunk_index, chunk) in row.chunks_mut(32).enumerate() {
        let word = mask.get(chunk_index).copied().unwrap_or(0);
        if word == u32::MAX {
            continue;
        }
        if word == 0 {
            chunk.fill(f32::NEG_INFINITY);
            continue;
        }
        for (bit, value) in chunk.iter_mut().enumerate() {
            if word >> bit & 1 == 0 {
                *value = f32::NEG_INFINITY;
            }
        }
    }
}

/// A chain's constraint with its reusable buffers.
#[derive(Debug)]
pub(crate) struct Slot {
    pub inner: Box<dyn Constraint>,
    pub mode: ConstraintMode,
    pub mask: Vec<u32>,
    pub row: Vec<f32>,
}

impl Clone for Slot {
    fn clone(&self) -> Self {
        Slot { inner: self.inner.box_clone(), mode: self.mode, mask: Vec::new(), row: Vec::new() }
    }
}

impl Slot {
    /// Copies `row` into the slot's buffer (widened to f32) with disallowed tokens at -inf.
    pub fn mask_row(&mut self, row: crate::Logits<'_>) -> Result<()> {
        let words = row.len().div_ceil(32);
        self.mask.resize(words, 0);
        self.inner.fill_mask(&mut self.mask)?;
        self.row.clear();
        self.row.reserve(row.len());
        row.for_each(|_, v| self.row.push(v));
        apply_bitmask(&mut self.row, &self.mask);
        Ok(())
    }
}
