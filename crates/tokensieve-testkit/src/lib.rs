//! Test support for tokensieve (not published): loaders for the reference engines' goldens,
//! naive f64 reference samplers (the oracles fast paths are held to), logit generators, and a
//! GGUF writer with a tiny random-weight llama model.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod cli;
pub mod generate;
pub mod gguf;
pub mod golden;
pub mod proptest_support;
pub mod reference;
