//! Grammar-constrained sampling for tokensieve: llama.cpp's GBNF language and semantics, with
//! token masks fast enough to sit on every decoding step.
//!
//! ## Key types
//!
//! * [`Grammar`]: GBNF text parsed and checked ([`gbnf`] has the syntax, its llama.cpp quirks
//!   and limits). Errors carry line and column and never abort.
//! * [`Matcher`]: one sequence's position in the grammar (llama.cpp's set of parse stacks and
//!   pending partial UTF-8 character): `accept_token`, `accept_bytes`, `rollback`,
//!   `is_complete`, and the token mask for the next step.
//! * [`TokenIndex`]: a vocabulary prepared for masks (token bytes as llama.cpp's grammar sees
//!   them, end-of-generation set, byte trie); build it once per vocabulary from a
//!   [`vocab::Vocab`] (GGUF `tokenizer.ggml.tokens` or a Hugging Face `tokenizer.json`).
//! * Masks are packed `u32` bitmasks, `ceil(V/32)` words, bit `i % 32` of word `i / 32` set when
//!   token `i` is allowed; [`apply_bitmask`] applies one to a logits row on any backend.
//! * [`GrammarConstraint`]: a grammar as a [`tokensieve::Constraint`] in front of a
//!   [`tokensieve::Chain`], masked (exact) or in llama.cpp's fast rejection mode, optionally
//!   lazy (waiting for trigger tokens or patterns).
//! * [`json_schema`]: JSON Schema → GBNF, producing exactly llama.cpp's grammar.
//!
//! ## Usage
//!
//! ```
//! use std::sync::Arc;
//! use tokensieve_grammar::{is_allowed, Grammar, Matcher, TokenIndex};
//!
//! let grammar = Grammar::new(r#"
//! root   ::= "{" ws "\"ok\":" ws bool ws "}"
//! bool   ::= "true" | "false"
//! ws     ::= [ ]?
//! "#)?;
//! // A toy vocabulary; use `TokenIndex::from_vocab(&Vocab::from_file(path)?)` for a real one.
//! let tokens: [&[u8]; 6] = [b"{", b"\"ok\":", b" true", b"false", b"}", b"<eos>"];
//! let vocab = Arc::new(TokenIndex::new(tokens, &[5]));
//! let mut m = Matcher::with_vocab(&grammar, vocab)?;
//! for token in [0, 1, 2, 4] {
//!     let mask = m.mask()?;
//!     assert!(is_allowed(&mask, token));
//!     m.accept_token(token)?;
//! }
//! assert_eq!(m.allowed_tokens()?, [5]); // complete: only end-of-generation
//! # Ok::<(), tokensieve_grammar::Error>(())
//! ```
//!
//! ## Semantics
//!
//! The language and the token rules are llama.cpp's (`src/llama-grammar.cpp`), checked against
//! its own grammar tests (`tests/conformance.rs`): code points decoded from UTF-8 as llama.cpp
//! decodes them, a token split inside a character accepted when some completion could match
//! (with llama.cpp's over-rejection for negated classes), tokens with empty text never allowed,
//! special-token text matched as text, end-of-generation allowed exactly when the parse is
//! complete, and nothing but end-of-generation after that. Deliberate differences: a token
//! whose text is invalid UTF-8 is an error to accept (llama.cpp's mask never allows it either),
//! and `<text>` token references resolve by exact token text rather than by running the
//! tokenizer.
//!
//! ## Speed
//!
//! Parse stacks are hash-consed and state transitions memoised, so text the grammar has seen
//! costs a table lookup per character; masks are the OR of per-stack masks, each cached, and
//! computed the first time by a depth-first walk of the vocabulary's byte trie (see [`mask`]).
//! Work per step is bounded by [`Limits`]: a pathological grammar returns an error instead of
//! hanging. Measured numbers: `BENCHMARKS.md`.
#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod constraint;
pub(crate) mod engine;
pub mod error;
pub mod gbnf;
pub mod grammar;
pub mod json_schema;
pub mod mask;
pub mod matcher;
pub mod trie;
pub mod vocab;

pub use constraint::GrammarConstraint;
pub use engine::Limits;
pub use error::{Error, ErrorKind, Result};
pub use grammar::{Grammar, GrammarOptions};
pub use mask::{apply_bitmask, is_allowed};
pub use matcher::Matcher;
pub use trie::TokenIndex;
