//! Conventions: the same sampler name means different arithmetic in different engines.
//!
//! A chain is built under one convention. Everything that is specific to one engine's
//! arithmetic (sort algorithms and their tie order, f32 vs f64 sums, bucket ranges) lives in
//! the convention's module, not as branches inside the samplers' hot loops.
//!
//! * [`Convention::LlamaCpp`]: llama.cpp's `src/llama-sampler.cpp` at commit 0c1e570, checked
//!   bit for bit against its own outputs (`../shared/golden/llama.cpp`).
//!
//! The Hugging Face transformers convention and the exact fixed-point pipeline are separate
//! work items and are not available yet.

pub mod llama_cpp;

use crate::error::{Error, Result};

/// Which engine's semantics a chain follows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Convention {
    /// llama.cpp (`../shared/reference/llama-cpp.md`).
    #[default]
    LlamaCpp,
}

impl std::str::FromStr for Convention {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "llama.cpp" | "llama-cpp" | "llama_cpp" => Ok(Convention::LlamaCpp),
            "transformers" => {
                Err(Error::invalid("convention `transformers` is not implemented yet; only `llama.cpp` is available"))
            }
            _ => Err(Error::invalid(format!("unknown convention `{s}` (expected `llama.cpp`)"))),
        }
    }
}

impl std::fmt::Display for Convention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Convention::LlamaCpp => f.write_str("llama.cpp"),
        }
    }
}
