//! # tokensieve
//!
//! Turns a row of LLM logits into the next token: every sampler the field uses, composed in
//! any order, exact to llama.cpp where you ask for its behaviour, deterministic everywhere.
//!
//! ## Key types
//!
//! * [`Chain`]: an ordered list of [`Stage`]s for one sequence, ending with a selecting stage.
//!   `sample` builds the candidate set from a row, applies each stage and accepts the token.
//! * [`Candidates`]: the working set (id, logit, p) the stages narrow, in llama.cpp's layout
//!   because candidate order is part of its semantics.
//! * [`sampler`]: one module per sampler, each implementing [`Sampler`].
//! * [`RngConfig`]: counter-based Philox (default; batch- and thread-invariant) or llama.cpp's
//!   MT19937 (the same token stream as llama.cpp for the same seed and logits).
//! * [`Logits`] / [`LogitsBatch`]: borrowed f32, f16 or bf16 rows, `[V]` or `[B, V]`.
//!
//! ## Usage
//!
//! ```
//! use tokensieve::{Chain, RngConfig, sampler::BuildContext};
//!
//! let logits = vec![1.0f32, 4.0, 3.5, 0.2, -2.0];
//! let ctx = BuildContext::new(logits.len(), RngConfig::mt19937(42));
//! // llama.cpp's default chain.
//! let mut chain = Chain::from_spec("top_k(40);top_p(0.95,1);min_p(0.05,1);temperature(0.8);dist", &ctx)?;
//! let token = chain.sample(&logits)?;
//! assert!(token == 1 || token == 2);
//! # Ok::<(), tokensieve::Error>(())
//! ```
//!
//! ## Determinism
//!
//! Seeds are always passed in. Philox draws are keyed by (seed, sequence id, step), so a row
//! gets the same token whatever the batch composition or thread count. Ties are resolved as
//! the convention's reference engine resolves them (for llama.cpp: libstdc++'s sort order).
//!
//! ## Untrusted input
//!
//! NaN or `+inf` logits, empty rows, out-of-range parameters, malformed spec strings and
//! chains that leave no candidate give an [`Error`], never a panic.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod batch;
pub mod candidates;
pub mod chain;
pub mod convention;
mod error;
pub mod logits;
pub mod logprobs;
pub mod params;
pub mod rng;
pub mod sampler;
pub mod stdsort;

pub use candidates::{Candidates, TokenData};
pub use chain::Chain;
pub use convention::Convention;
pub use error::{Error, Result};
pub use logits::{Logits, LogitsBatch};
pub use logprobs::{LogprobsMode, Sampled, TokenLogprob};
pub use params::SamplingParams;
pub use rng::{RngConfig, RngKind};
pub use sampler::{Sampler, Stage};

/// The README's Rust examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
