//! Conventions: the same sampler name means different arithmetic in different engines.
//!
//! A chain is built under one convention. Everything that is specific to one engine's
//! arithmetic (sort algorithms and their tie order, f32 vs f64 sums, bucket ranges) lives in
//! the convention's module, not as branches inside the samplers' hot loops.
//!
//! * [`Convention::LlamaCpp`]: llama.cpp's `src/llama-sampler.cpp` at commit 0c1e570, checked
//!   bit for bit against its own outputs (`../shared/golden/llama.cpp`).
//! * [`Convention::Transformers`]: Hugging Face transformers 5.23.0's logits processors with
//!   torch 2.15 on CPU, checked against the processors' own outputs
//!   (`../shared/golden/transformers`): identical masks and bits on every case that is not
//!   within rounding noise of a threshold.
//!
//! The same stage name can mean different arithmetic (see the README's convention table);
//! [`crate::sampler::BuildContext::convention`] decides which one a spec string builds.

pub mod llama_cpp;
pub mod transformers;

use crate::error::{Error, Result};

/// Which engine's semantics a chain follows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Convention {
    /// llama.cpp (`../shared/reference/llama-cpp.md`).
    #[default]
    LlamaCpp,
    /// Hugging Face transformers' logits processors (`../shared/reference/transformers.md`).
    Transformers,
}

impl std::str::FromStr for Convention {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "llama.cpp" | "llama-cpp" | "llama_cpp" => Ok(Convention::LlamaCpp),
            "transformers" | "hf" => Ok(Convention::Transformers),
            _ => Err(Error::invalid(format!("unknown convention `{s}` (expected `llama.cpp` or `transformers`)"))),
        }
    }
}

impl std::fmt::Display for Convention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Convention::LlamaCpp => f.write_str("llama.cpp"),
            Convention::Transformers => f.write_str("transformers"),
        }
    }
}
