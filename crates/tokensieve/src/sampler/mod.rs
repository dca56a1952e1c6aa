//! The [`Sampler`] trait and the samplers, one file each.
//!
//! A sampler reads and narrows a [`Candidates`] set in place; a *selecting* sampler (greedy,
//! dist, mirostat, mirostat_v2, gumbel) also marks the chosen candidate. [`Stage`] wraps every
//! implementation in one enum (cheap to clone, no boxing), and [`Chain`](crate::Chain) runs a
//! list of stages in order.
//!
//! Adding a sampler: write `sampler/name.rs` (the type, its [`FromSpec`] impl, its docs and
//! unit tests) and add one line to the `stages!` list below.

use crate::candidates::Candidates;
use crate::error::{Error, Result};
use crate::params::spec::{Bound, StageSpec};
use crate::rng::RngConfig;

pub mod dist;
pub mod dry;
pub mod greedy;
pub mod gumbel;
pub mod logit_bias;
pub mod min_p;
pub mod mirostat;
pub mod mirostat_v2;
pub mod penalties;
pub mod temp_ext;
pub mod temperature;
pub mod top_k;
pub mod top_n_sigma;
pub mod top_p;
pub mod typical;
pub mod xtc;

/// One stage of a sampling chain.
pub trait Sampler {
    /// The name llama.cpp's `llama_sampler_name` gives this stage (`"top-k"`, `"dist"`, …).
    fn name(&self) -> &'static str;
    /// Reads and narrows the candidates; a selecting sampler also sets the selection.
    fn apply(&mut self, candidates: &mut Candidates) -> Result<()>;
    /// Called with every token added to the sequence (history and sampled tokens alike).
    fn accept(&mut self, _token: u32) {}
    /// Restores the state the sampler had when it was built (RNG restarts from its seed).
    fn reset(&mut self) {}
    /// True for stages that choose the token (must be last in a chain).
    fn selects(&self) -> bool {
        false
    }
    /// True when the parameters make this stage a no-op (llama.cpp's "empty" sampler, shown
    /// with a leading `?` in its name).
    fn is_inert(&self) -> bool {
        false
    }
}

/// What a stage may need from outside its own parameters when built from a spec.
#[derive(Clone, Copy, Debug)]
pub struct BuildContext<'a> {
    /// Vocabulary size of the rows the chain will see (mirostat's `n_vocab`).
    pub n_vocab: usize,
    /// Seed and generator for the drawing stages; every drawing stage gets the same seed, as
    /// llama.cpp's `common_sampler_init` does.
    pub rng: RngConfig,
    /// Token byte strings, indexed by token id (DRY's sequence breakers need them).
    pub vocab: Option<&'a [Vec<u8>]>,
}

impl<'a> BuildContext<'a> {
    /// A context for rows of `n_vocab` tokens with the given RNG and no vocabulary text.
    pub fn new(n_vocab: usize, rng: RngConfig) -> Self {
        BuildContext { n_vocab, rng, vocab: None }
    }
}

/// A sampler that can be built from a spec stage (`name(arg, key=value)`).
pub trait FromSpec: Sized {
    /// Parameter names in positional order (the CLI contract's order).
    const PARAMS: &'static [&'static str];
    /// Builds the sampler from bound arguments.
    fn from_spec(args: &Bound<'_>, ctx: &BuildContext<'_>) -> Result<Self>;
}

macro_rules! stages {
    ($( $(#[$doc:meta])* $variant:ident($module:ident :: $ty:ident) = $spec:literal ),* $(,)?) => {
        /// Any sampler, as one enum: what a [`Chain`](crate::Chain) holds.
        #[derive(Clone, Debug)]
        pub enum Stage {
            $( $(#[$doc])* $variant($module::$ty), )*
        }

        impl Sampler for Stage {
            fn name(&self) -> &'static str {
                match self { $( Stage::$variant(s) => s.name(), )* }
            }
            fn apply(&mut self, c: &mut Candidates) -> Result<()> {
                match self { $( Stage::$variant(s) => s.apply(c), )* }
            }
            fn accept(&mut self, token: u32) {
                match self { $( Stage::$variant(s) => s.accept(token), )* }
            }
            fn reset(&mut self) {
                match self { $( Stage::$variant(s) => s.reset(), )* }
            }
            fn selects(&self) -> bool {
                match self { $( Stage::$variant(s) => s.selects(), )* }
            }
            fn is_inert(&self) -> bool {
                match self { $( Stage::$variant(s) => s.is_inert(), )* }
            }
        }

        $( impl From<$module::$ty> for Stage {
            fn from(s: $module::$ty) -> Self { Stage::$variant(s) }
        } )*

        /// The stage names the llama.cpp convention accepts in a spec string.
        pub const LLAMA_CPP_STAGE_NAMES: &[&str] = &[$( $spec, )*];

        /// Builds one stage of a spec string under the llama.cpp convention.
        pub fn build_llama_cpp(spec: &StageSpec, ctx: &BuildContext<'_>) -> Result<Stage> {
            match spec.name.as_str() {
                $( $spec => {
                    let bound = spec.bind(<$module::$ty as FromSpec>::PARAMS)?;
                    Ok(Stage::$variant(<$module::$ty as FromSpec>::from_spec(&bound, ctx)?))
                } )*
                other => Err(Error::spec(
                    spec.position,
                    format!("unknown stage `{other}` (llama.cpp convention stages: {})", LLAMA_CPP_STAGE_NAMES.join(", ")),
                )),
            }
        }
    };
}

stages! {
    /// Picks the first candidate with the largest logit.
    Greedy(greedy::Greedy) = "greedy",
    /// Draws from the softmax of the candidates (llama.cpp's default final stage).
    Dist(dist::Dist) = "dist",
    /// Divides logits by a temperature.
    Temperature(temperature::Temperature) = "temperature",
    /// Keeps the k most likely candidates.
    TopK(top_k::TopK) = "top_k",
    /// Repetition, frequency and presence penalties over the recent tokens.
    Penalties(penalties::Penalties) = "penalties",
    /// Adds fixed biases to chosen tokens' logits.
    LogitBias(logit_bias::LogitBias) = "logit_bias",
    /// Mirostat v1 (selects).
    Mirostat(mirostat::Mirostat) = "mirostat",
    /// Mirostat v2 (selects).
    MirostatV2(mirostat_v2::MirostatV2) = "mirostat_v2",
    /// DRY ("don't repeat yourself") repetition penalty.
    Dry(dry::Dry) = "dry",
    /// Gumbel-max selection with counter-based noise per token id (selects).
    Gumbel(gumbel::Gumbel) = "gumbel",
    /// Nucleus sampling: keeps the smallest most-likely prefix with mass `>= p`.
    TopP(top_p::TopP) = "top_p",
    /// Keeps candidates with probability at least `p` times the largest.
    MinP(min_p::MinP) = "min_p",
    /// Locally typical sampling.
    Typical(typical::Typical) = "typical",
    /// Dynamic (entropy-based) temperature.
    TempExt(temp_ext::TempExt) = "temp_ext",
    /// Masks logits more than `n` standard deviations below the maximum.
    TopNSigma(top_n_sigma::TopNSigma) = "top_n_sigma",
    /// Exclude top choices: with some chance, drops the most likely candidates above a threshold.
    Xtc(xtc::Xtc) = "xtc",
}

/// Checks that `v` is finite, naming the stage and parameter otherwise.
pub(crate) fn require_finite(stage: &str, name: &str, v: f32) -> Result<f32> {
    if v.is_finite() {
        Ok(v)
    } else {
        Err(Error::parameter(stage, name, format!("must be a finite number, got {v}")))
    }
}

/// Converts a `min_keep` parameter (llama.cpp's `size_t`) to `usize`, rejecting negatives.
pub(crate) fn require_min_keep(stage: &str, v: i32) -> Result<usize> {
    usize::try_from(v).map_err(|_| Error::parameter(stage, "min_keep", format!("must be >= 0, got {v}")))
}

/// Error unless some candidate has a finite logit (a selecting stage needs one).
pub(crate) fn require_finite_candidate(stage: &'static str, c: &Candidates) -> Result<()> {
    if c.as_slice().iter().any(|t| t.logit > f32::NEG_INFINITY) {
        Ok(())
    } else {
        Err(Error::no_candidates(stage))
    }
}

/// Fixtures shared by the samplers' unit tests.
#[cfg(test)]
pub(crate) mod test_util {
    use crate::candidates::Candidates;

    /// Candidates whose logits are `ln p` for the given probabilities (llama.cpp's
    /// test-sampling.cpp builds its vectors this way).
    pub(crate) fn from_probs(probs: &[f32]) -> Candidates {
        let logits: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
        Candidates::from_logits(&logits).unwrap()
    }

    /// The candidates' ids in array order.
    pub(crate) fn ids(c: &Candidates) -> Vec<u32> {
        c.as_slice().iter().map(|t| t.id).collect()
    }
}
