//! The [`Sampler`] trait and the samplers, one file each.
//!
//! A sampler reads and narrows a [`Candidates`] set in place; a *selecting* sampler (greedy,
//! dist, mirostat, mirostat_v2, gumbel) also marks the chosen candidate. [`Stage`] wraps every
//! implementation in one enum (cheap to clone, no boxing), and [`Chain`](crate::Chain) runs a
//! list of stages in order.
//!
//! Adding a sampler: write `sampler/name.rs` (or `sampler/transformers/name.rs`: the type, its
//! [`FromSpec`] impl, its docs and unit tests) and add one line to the `stages!` list below,
//! naming its convention and spec name. The same spec name may appear once per convention;
//! [`BuildContext::convention`] picks which one a spec string builds.

use crate::candidates::Candidates;
use crate::convention::Convention;
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
pub mod transformers;
pub mod typical;
pub mod xtc;

/// One stage of a sampling chain.
pub trait Sampler {
    /// The name llama.cpp's `llama_sampler_name` gives this stage (`"top-k"`, `"dist"`, …);
    /// transformers-convention stages use their spec name (`"top_k"`, `"repetition_penalty"`).
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
    /// Whose semantics a spec string's stage names mean (default: llama.cpp).
    pub convention: Convention,
}

impl<'a> BuildContext<'a> {
    /// A context for rows of `n_vocab` tokens with the given RNG, no vocabulary text, under
    /// the llama.cpp convention.
    pub fn new(n_vocab: usize, rng: RngConfig) -> Self {
        BuildContext { n_vocab, rng, vocab: None, convention: Convention::LlamaCpp }
    }

    /// The same context under another convention.
    ///
    /// ```
    /// use tokensieve::{Chain, Convention, RngConfig, sampler::BuildContext};
    /// let ctx = BuildContext::new(4, RngConfig::philox(0)).with_convention(Convention::Transformers);
    /// let mut chain = Chain::from_spec_for_apply("top_p(0.5)", &ctx).unwrap();
    /// let out = chain.apply(&[1.0f32, 1.0, 1.0, 1.0]).unwrap();
    /// // Ascending sort, remove cumulative mass <= 1 - 0.5: the first two of four equal tokens go.
    /// assert_eq!(out.count_finite(), 2);
    /// ```
    pub fn with_convention(self, convention: Convention) -> Self {
        BuildContext { convention, ..self }
    }
}

/// A sampler that can be built from a spec stage (`name(arg, key=value)`).
pub trait FromSpec: Sized {
    /// Parameter names in positional order (the CLI contract's order).
    const PARAMS: &'static [&'static str];
    /// Other names accepted for `key=value` arguments: `(alias, parameter)` (e.g. the
    /// reference engine's own argument name where the contract uses a shorter one).
    const ALIASES: &'static [(&'static str, &'static str)] = &[];
    /// Builds the sampler from bound arguments.
    fn from_spec(args: &Bound<'_>, ctx: &BuildContext<'_>) -> Result<Self>;
}

/// `convention!(llama_cpp)` → `Convention::LlamaCpp`: the convention named in a `stages!` entry.
macro_rules! convention {
    (llama_cpp) => {
        Convention::LlamaCpp
    };
    (transformers) => {
        Convention::Transformers
    };
}

/// The stage names of one convention, in table order (a `const fn`, so the lists are constants).
const fn names_of<const N: usize>(table: &[(Convention, &'static str)], convention: Convention) -> [&'static str; N] {
    let mut out = [""; N];
    let (mut i, mut j) = (0, 0);
    while i < table.len() {
        if table[i].0 as u8 == convention as u8 {
            out[j] = table[i].1;
            j += 1;
        }
        i += 1;
    }
    out
}

const fn count_of(table: &[(Convention, &'static str)], convention: Convention) -> usize {
    let (mut i, mut n) = (0, 0);
    while i < table.len() {
        if table[i].0 as u8 == convention as u8 {
            n += 1;
        }
        i += 1;
    }
    n
}

/// Each entry: `Variant(type path) = convention "spec name"`. Generates [`Stage`], its
/// [`Sampler`] impl, `From` impls, the per-convention name lists and builders.
macro_rules! stages {
    ($( $(#[$doc:meta])* $variant:ident($ty:path) = $conv:ident $spec:literal ),* $(,)?) => {
        /// Any sampler, as one enum: what a [`Chain`](crate::Chain) holds.
        #[derive(Clone, Debug)]
        pub enum Stage {
            $( $(#[$doc])* $variant($ty), )*
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

        $( impl From<$ty> for Stage {
            fn from(s: $ty) -> Self { Stage::$variant(s) }
        } )*

        impl Stage {
            /// The convention this stage's arithmetic follows.
            pub fn convention(&self) -> Convention {
                match self { $( Stage::$variant(_) => convention!($conv), )* }
            }
        }

        /// Every (convention, spec name) pair, in table order.
        const STAGE_TABLE: &[(Convention, &str)] = &[$( (convention!($conv), $spec), )*];

        fn build_for(convention: Convention, spec: &StageSpec, ctx: &BuildContext<'_>) -> Result<Stage> {
            $( if convention == convention!($conv) && spec.name == $spec {
                let bound = spec.bind_with_aliases(<$ty as FromSpec>::PARAMS, <$ty as FromSpec>::ALIASES)?;
                return Ok(Stage::$variant(<$ty as FromSpec>::from_spec(&bound, ctx)?));
            } )*
            Err(unknown_stage(convention, spec))
        }
    };
}

const LLAMA_CPP_COUNT: usize = count_of(STAGE_TABLE, Convention::LlamaCpp);
const LLAMA_CPP_NAMES: [&str; LLAMA_CPP_COUNT] = names_of(STAGE_TABLE, Convention::LlamaCpp);
const TRANSFORMERS_COUNT: usize = count_of(STAGE_TABLE, Convention::Transformers);
const TRANSFORMERS_NAMES: [&str; TRANSFORMERS_COUNT] = names_of(STAGE_TABLE, Convention::Transformers);

/// The stage names the llama.cpp convention accepts in a spec string.
pub const LLAMA_CPP_STAGE_NAMES: &[&str] = &LLAMA_CPP_NAMES;

/// The stage names the transformers convention accepts in a spec string.
pub const TRANSFORMERS_STAGE_NAMES: &[&str] = &TRANSFORMERS_NAMES;

/// The stage names `convention` accepts in a spec string.
pub fn stage_names(convention: Convention) -> &'static [&'static str] {
    match convention {
        Convention::LlamaCpp => LLAMA_CPP_STAGE_NAMES,
        Convention::Transformers => TRANSFORMERS_STAGE_NAMES,
    }
}

fn unknown_stage(convention: Convention, spec: &StageSpec) -> Error {
    let other = match convention {
        Convention::LlamaCpp => Convention::Transformers,
        Convention::Transformers => Convention::LlamaCpp,
    };
    let hint = if stage_names(other).contains(&spec.name.as_str()) {
        format!("; `{}` exists under `--convention {other}`", spec.name)
    } else {
        String::new()
    };
    Error::spec(
        spec.position,
        format!(
            "unknown stage `{}` ({convention} convention stages: {}){hint}",
            spec.name,
            stage_names(convention).join(", ")
        ),
    )
}

/// Builds one stage of a spec string under the convention of `ctx`
/// ([`BuildContext::convention`]).
pub fn build(spec: &StageSpec, ctx: &BuildContext<'_>) -> Result<Stage> {
    build_for(ctx.convention, spec, ctx)
}

/// Builds one stage of a spec string under the llama.cpp convention (whatever `ctx` says).
pub fn build_llama_cpp(spec: &StageSpec, ctx: &BuildContext<'_>) -> Result<Stage> {
    build_for(Convention::LlamaCpp, spec, ctx)
}

/// Builds one stage of a spec string under the transformers convention (whatever `ctx` says).
pub fn build_transformers(spec: &StageSpec, ctx: &BuildContext<'_>) -> Result<Stage> {
    build_for(Convention::Transformers, spec, ctx)
}

stages! {
    /// Picks the first candidate with the largest logit.
    Greedy(greedy::Greedy) = llama_cpp "greedy",
    /// Draws from the softmax of the candidates (llama.cpp's default final stage).
    Dist(dist::Dist) = llama_cpp "dist",
    /// Divides logits by a temperature.
    Temperature(temperature::Temperature) = llama_cpp "temperature",
    /// Keeps the k most likely candidates.
    TopK(top_k::TopK) = llama_cpp "top_k",
    /// Repetition, frequency and presence penalties over the recent tokens.
    Penalties(penalties::Penalties) = llama_cpp "penalties",
    /// Adds fixed biases to chosen tokens' logits.
    LogitBias(logit_bias::LogitBias) = llama_cpp "logit_bias",
    /// Mirostat v1 (selects).
    Mirostat(mirostat::Mirostat) = llama_cpp "mirostat",
    /// Mirostat v2 (selects).
    MirostatV2(mirostat_v2::MirostatV2) = llama_cpp "mirostat_v2",
    /// DRY ("don't repeat yourself") repetition penalty.
    Dry(dry::Dry) = llama_cpp "dry",
    /// Gumbel-max selection with counter-based noise per token id (selects).
    Gumbel(gumbel::Gumbel) = llama_cpp "gumbel",
    /// Nucleus sampling: keeps the smallest most-likely prefix with mass `>= p`.
    TopP(top_p::TopP) = llama_cpp "top_p",
    /// Keeps candidates with probability at least `p` times the largest.
    MinP(min_p::MinP) = llama_cpp "min_p",
    /// Locally typical sampling.
    Typical(typical::Typical) = llama_cpp "typical",
    /// Dynamic (entropy-based) temperature.
    TempExt(temp_ext::TempExt) = llama_cpp "temp_ext",
    /// Masks logits more than `n` standard deviations below the maximum.
    TopNSigma(top_n_sigma::TopNSigma) = llama_cpp "top_n_sigma",
    /// Exclude top choices: with some chance, drops the most likely candidates above a threshold.
    Xtc(xtc::Xtc) = llama_cpp "xtc",

    /// transformers' `TemperatureLogitsWarper`.
    HfTemperature(transformers::temperature::Temperature) = transformers "temperature",
    /// transformers' `TopKLogitsWarper`.
    HfTopK(transformers::top_k::TopK) = transformers "top_k",
    /// transformers' `TopPLogitsWarper`.
    HfTopP(transformers::top_p::TopP) = transformers "top_p",
    /// transformers' `MinPLogitsWarper`.
    HfMinP(transformers::min_p::MinP) = transformers "min_p",
    /// transformers' `TypicalLogitsWarper`.
    HfTypical(transformers::typical::Typical) = transformers "typical",
    /// transformers' `EpsilonLogitsWarper`.
    HfEpsilon(transformers::epsilon::Epsilon) = transformers "epsilon",
    /// transformers' `EtaLogitsWarper`.
    HfEta(transformers::eta::Eta) = transformers "eta",
    /// transformers' `RepetitionPenaltyLogitsProcessor`.
    HfRepetitionPenalty(transformers::repetition_penalty::RepetitionPenalty) = transformers "repetition_penalty",
    /// transformers' `NoRepeatNGramLogitsProcessor`.
    HfNoRepeatNGram(transformers::no_repeat_ngram::NoRepeatNGram) = transformers "no_repeat_ngram",
    /// transformers' `SequenceBiasLogitsProcessor` (and `NoBadWordsLogitsProcessor`).
    HfSequenceBias(transformers::sequence_bias::SequenceBias) = transformers "sequence_bias",
    /// transformers' `MinLengthLogitsProcessor`.
    HfMinLength(transformers::min_length::MinLength) = transformers "min_length",
    /// transformers' `MinNewTokensLengthLogitsProcessor`.
    HfMinNewTokens(transformers::min_length::MinNewTokens) = transformers "min_new_tokens",
    /// transformers' `SuppressTokensLogitsProcessor`.
    HfSuppressTokens(transformers::suppress_tokens::SuppressTokens) = transformers "suppress_tokens",
    /// transformers' `SuppressTokensAtBeginLogitsProcessor`.
    HfBeginSuppressTokens(transformers::begin_suppress_tokens::BeginSuppressTokens) = transformers "begin_suppress_tokens",
    /// `generate()`'s greedy search: argmax, lowest id on ties (selects).
    HfGreedy(transformers::greedy::Greedy) = transformers "greedy",
    /// `generate()`'s sampling: softmax and one multinomial draw (selects).
    HfDist(transformers::dist::Dist) = transformers "dist",
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
