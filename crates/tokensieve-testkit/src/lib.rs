//! Test support for tokensieve (not published): loaders for the reference engines' goldens,
//! naive f64 reference samplers (the oracles fast paths are held to), and logit generators.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod generate;
pub mod golden;
pub mod proptest_support;
pub mod reference;
