//! Grammar-constrained sampling for tokensieve.
#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod constraint;
pub mod error;
pub mod gbnf;
pub mod grammar;
pub mod json_schema;
pub(crate) mod engine;
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
