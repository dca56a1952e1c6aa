//! # tokensieve
//!
//! Turns a row of LLM logits into the next token: every sampler the field uses, composed in
//! any order, exact to llama.cpp or to Hugging Face transformers where you ask for their
//! behaviour, deterministic everywhere.
//!
//! ## Key types
//!
//! * [`Chain`]: an ordered list of [`Stage`]s for one sequence, ending with a selecting stage.
//!   `sample` builds the candidate set from a row, applies each stage and accepts the token.
//! * [`Candidates`]: the working set (id, logit, p) the stages narrow, in llama.cpp's layout
//!   because candidate order is part of its semantics.
//! * [`sampler`]: one module per sampler, each implementing [`Sampler`];
//!   [`sampler::transformers`] holds Hugging Face's logits processors.
//! * [`Convention`]: whose arithmetic a spec string's stage names mean (llama.cpp by default,
//!   or transformers), chosen with [`sampler::BuildContext::with_convention`].
//! * [`params`]: chains from what users write: spec strings, llama.cpp / OpenAI request bodies
//!   ([`SamplingParams`]) and transformers' `generation_config.json`
//!   ([`params::GenerationConfig`]).
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
//! The same names under the transformers convention are Hugging Face's processors, bit for
//! bit (the history accepted first is their `input_ids`):
//!
//! ```
//! use tokensieve::{Chain, Convention, RngConfig, sampler::BuildContext};
//!
//! let logits = vec![1.0f32, 4.0, 3.5, 0.2, -2.0];
//! let ctx = BuildContext::new(logits.len(), RngConfig::philox(42)).with_convention(Convention::Transformers);
//! let mut chain = Chain::from_spec_for_apply("repetition_penalty(1.3);temperature(0.7);top_k(50);top_p(0.9)", &ctx)?;
//! chain.accept(1);
//! let processed = chain.apply(&logits)?; // still 5 entries, in vocabulary order; removed = -inf
//! assert_eq!(processed.len(), 5);
//! assert_eq!(processed.as_slice()[1].logit, 4.0f32 / 1.3f64 as f32 / 0.7f64 as f32);
//! # Ok::<(), tokensieve::Error>(())
//! ```
//!
//! ## Determinism
//!
//! Seeds are always passed in. Philox draws are keyed by (seed, sequence id, step), so a row
//! gets the same token whatever the batch composition or thread count. Ties are resolved as
//! the convention's reference engine resolves them (for llama.cpp and for torch's CPU sort
//! and topk alike: libstdc++'s algorithms, ported in [`stdsort`]).
//!
//! ## Untrusted input
//!
//! NaN or `+inf` logits, empty rows, out-of-range parameters, malformed spec strings and
//! chains that leave no candidate give an [`Error`], never a panic.
//!
//! ## Performance
//!
//! Nothing is allocated per token once a chain's buffers have grown (a counting-allocator test
//! holds every hot path to it). Under the llama.cpp convention the row is read in place: one
//! SIMD pass ([`arch`], AVX2 detected at run time, portable fallback) validates it and records
//! per-block maxima, and a leading `top_k`, `min_p` or `top_p` (after any `penalties` /
//! `logit_bias`, applied as sparse edits) runs on the row directly, so the 12-byte
//! candidate array is built only for its survivors; `sample` selects straight from the row for
//! `greedy` and `[temperature;] dist`. Every such path gives llama.cpp's candidates and tokens
//! bit for bit or falls back to the array path (see [`convention::llama_cpp::dense`]).
//! `tokensieve bench` (the CLI) times each chain beside one SIMD max pass over the same row.
//!
//! ## Features
//!
//! * `bench`: `bench_rows`, the realistic logit rows the benchmarks run on.
#![deny(missing_docs)]
// `unsafe` is denied everywhere but in `arch`, the SIMD kernels (see its module docs for the
// argument: runtime-detected target features, bounds from `chunks_exact`).
#![deny(unsafe_code)]

#[allow(unsafe_code)]
pub mod arch;
pub mod batch;
#[cfg(feature = "bench")]
pub mod bench_rows;
pub mod candidates;
pub mod chain;
pub mod constraint;
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
pub use constraint::{Constraint, ConstraintMode};
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
