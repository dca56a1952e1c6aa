//! Building chains from what users write.
//!
//! * [`spec`]: the chain spec string of the CLI contract (`top_k(40);temperature(0.8);dist`).
//! * [`SamplingParams`]: llama.cpp's `common_params_sampling` (its fields, its defaults) plus
//!   the OpenAI logprobs fields, and the exact chain `common_sampler_init` builds from them,
//!   as a spec string ([`SamplingParams::chain_spec`]) or a [`Chain`]
//!   ([`SamplingParams::to_chain`]).
//! * Request bodies: [`SamplingParams::from_json`] reads a llama.cpp server `/completion` body
//!   ([`llama_server`]), an OpenAI chat/completions body ([`openai`]) or any mix of the two, as
//!   llama.cpp's server does.
//! * [`GenerationConfig`]: a Hugging Face `generation_config.json` (or the same fields as a
//!   request body) and the processor list transformers' `generate()` builds from it, under the
//!   transformers convention ([`generation_config`]).
//!
//! ```
//! use tokensieve::{params::SamplingParams, RngConfig};
//!
//! let params = SamplingParams::from_json(r#"{"temperature": 0.7, "top_k": 20, "seed": 42}"#)?;
//! assert_eq!(
//!     params.chain_spec()?,
//!     "penalties(64,1,0,0);dry(0,1.75,2,64);top_n_sigma(-1);top_k(20);typical(1,0);\
//!      top_p(0.95,0);min_p(0.05,0);xtc(0,0.1,0);temp_ext(0.7,0,1);dist"
//! );
//! let logits = [0.5f32, 3.0, 2.5, -1.0];
//! let mut chain = params.to_chain(logits.len(), RngConfig::mt19937(0))?; // the body's seed wins
//! let token = chain.sample(&logits)?;
//! assert!(token == 1 || token == 2);
//! # Ok::<(), tokensieve::Error>(())
//! ```

pub mod generation_config;
pub mod llama_server;
pub mod openai;
pub mod spec;

pub use generation_config::GenerationConfig;

use crate::chain::Chain;
use crate::convention::Convention;
use crate::error::{Error, Result};
use crate::logprobs::LogprobsMode;
use crate::rng::RngConfig;
use crate::sampler::BuildContext;
use std::fmt::Write as _;

/// One entry of a logit-bias list: `bias` is added to the logit of `token` (`-inf` bans it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogitBias {
    /// Token id.
    pub token: u32,
    /// Added to the token's logit.
    pub bias: f32,
}

/// A stage of llama.cpp's configurable sampler sequence (`common_sampler_type`).
///
/// Names and letters are llama.cpp's (`--samplers`, `--sampling-seq`). llama.cpp's `infill`
/// (needs a vocabulary) and `adaptive_p` are not available; naming them is an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SamplerType {
    /// `penalties` (`e`): repetition, frequency and presence penalties.
    Penalties,
    /// `dry` (`d`): DRY repetition penalty.
    Dry,
    /// `top_n_sigma` (`s`).
    TopNSigma,
    /// `top_k` (`k`).
    TopK,
    /// `typ_p` (`y`): locally typical sampling.
    TypicalP,
    /// `top_p` (`p`).
    TopP,
    /// `min_p` (`m`).
    MinP,
    /// `xtc` (`x`).
    Xtc,
    /// `temperature` (`t`): built as `temp_ext(temp, dynatemp_range, dynatemp_exponent)`.
    Temperature,
}

/// llama.cpp's alternative names (`common_sampler_types_from_names` with `allow_alt_names`).
const ALT_NAMES: &[(&str, SamplerType)] = &[
    ("top-k", SamplerType::TopK),
    ("top-p", SamplerType::TopP),
    ("top-n-sigma", SamplerType::TopNSigma),
    ("nucleus", SamplerType::TopP),
    ("typical-p", SamplerType::TypicalP),
    ("typical", SamplerType::TypicalP),
    ("typ-p", SamplerType::TypicalP),
    ("typ", SamplerType::TypicalP),
    ("min-p", SamplerType::MinP),
    ("temp", SamplerType::Temperature),
];

impl SamplerType {
    /// Every type, in llama.cpp's default order (`edskypmxt`).
    pub const DEFAULT_SEQUENCE: [SamplerType; 9] = [
        SamplerType::Penalties,
        SamplerType::Dry,
        SamplerType::TopNSigma,
        SamplerType::TopK,
        SamplerType::TypicalP,
        SamplerType::TopP,
        SamplerType::MinP,
        SamplerType::Xtc,
        SamplerType::Temperature,
    ];

    /// llama.cpp's canonical name (`common_sampler_type_to_str`).
    pub fn name(self) -> &'static str {
        match self {
            SamplerType::Penalties => "penalties",
            SamplerType::Dry => "dry",
            SamplerType::TopNSigma => "top_n_sigma",
            SamplerType::TopK => "top_k",
            SamplerType::TypicalP => "typ_p",
            SamplerType::TopP => "top_p",
            SamplerType::MinP => "min_p",
            SamplerType::Xtc => "xtc",
            SamplerType::Temperature => "temperature",
        }
    }

    /// llama.cpp's letter (`common_sampler_type_to_chr`).
    pub fn letter(self) -> char {
        match self {
            SamplerType::Penalties => 'e',
            SamplerType::Dry => 'd',
            SamplerType::TopNSigma => 's',
            SamplerType::TopK => 'k',
            SamplerType::TypicalP => 'y',
            SamplerType::TopP => 'p',
            SamplerType::MinP => 'm',
            SamplerType::Xtc => 'x',
            SamplerType::Temperature => 't',
        }
    }

    /// Looks up a canonical name or one of llama.cpp's alternative names (`top-k`, `nucleus`,
    /// `typical`, `temp`, …). Unknown names are an error naming them (llama.cpp skips them
    /// with a warning).
    ///
    /// ```
    /// use tokensieve::params::SamplerType;
    /// assert_eq!(SamplerType::from_name("nucleus").unwrap(), SamplerType::TopP);
    /// assert!(SamplerType::from_name("tfs_z").unwrap_err().to_string().contains("tfs_z"));
    /// ```
    pub fn from_name(name: &str) -> Result<Self> {
        if let Some(t) = Self::DEFAULT_SEQUENCE.iter().find(|t| t.name() == name) {
            return Ok(*t);
        }
        if let Some((_, t)) = ALT_NAMES.iter().find(|(n, _)| *n == name) {
            return Ok(*t);
        }
        let message = match name {
            "infill" | "adaptive_p" | "adaptive-p" => {
                format!("sampler `{name}` is not supported by tokensieve")
            }
            _ => format!(
                "unknown sampler name `{name}` (llama.cpp names: {})",
                Self::DEFAULT_SEQUENCE.map(Self::name).join(", ")
            ),
        };
        Err(Error::field("samplers", message))
    }

    /// Looks up a letter of llama.cpp's `--sampling-seq` (`e d s k y p m x t`).
    pub fn from_letter(letter: char) -> Result<Self> {
        if let Some(t) = Self::DEFAULT_SEQUENCE.iter().find(|t| t.letter() == letter) {
            return Ok(*t);
        }
        let message = match letter {
            'i' | 'a' => format!("sampler letter `{letter}` ({}) is not supported by tokensieve", {
                if letter == 'i' {
                    "infill"
                } else {
                    "adaptive_p"
                }
            }),
            _ => format!(
                "unknown sampler letter `{letter}` (llama.cpp letters: {})",
                Self::DEFAULT_SEQUENCE.map(Self::letter).iter().collect::<String>()
            ),
        };
        Err(Error::field("samplers", message))
    }

    /// A sequence given by names, in order (duplicates allowed, as in llama.cpp).
    pub fn parse_names<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> Result<Vec<Self>> {
        names.into_iter().map(|n| Self::from_name(n.as_ref())).collect()
    }

    /// A sequence given by letters, e.g. `"edskypmxt"` (llama.cpp's default order).
    ///
    /// ```
    /// use tokensieve::params::SamplerType;
    /// assert_eq!(SamplerType::parse_letters("edskypmxt").unwrap(), SamplerType::DEFAULT_SEQUENCE);
    /// assert!(SamplerType::parse_letters("kq").unwrap_err().to_string().contains("`q`"));
    /// ```
    pub fn parse_letters(letters: &str) -> Result<Vec<Self>> {
        letters.chars().map(Self::from_letter).collect()
    }
}

/// Mirostat mode (`mirostat` field: 0, 1 or 2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mirostat {
    /// The configurable sequence then `dist` (default).
    #[default]
    Off,
    /// `temperature(temp)` then `mirostat(tau, eta, 100)`; the sequence is ignored.
    V1,
    /// `temperature(temp)` then `mirostat_v2(tau, eta)`; the sequence is ignored.
    V2,
}

/// llama.cpp's `common_params_sampling`: its fields, under its names, with its defaults, plus
/// OpenAI's `logprobs`, `top_logprobs` and `n`.
///
/// Build it with [`Default`] and field assignment, or from a request body with
/// [`SamplingParams::from_json`]; turn it into a chain with [`SamplingParams::to_chain`].
///
/// Differences from llama.cpp, on purpose:
///
/// * `seed` is an `Option`: `None` (llama.cpp's "random", `-1`/`0xFFFFFFFF`) means "the seed
///   of the [`RngConfig`] the chain is built with". tokensieve never draws a seed from the
///   system, so a chain is reproducible by default.
/// * `penalty_last_n` / `dry_penalty_last_n` of `-1` mean "the context size", as in
///   llama.cpp's server. tokensieve resolves them with [`SamplingParams::n_ctx`]; without it,
///   building the chain is an error naming the field, unless the stage is inert anyway (then
///   the window does not matter and is written as 0).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct SamplingParams {
    /// Seed of every drawing stage (`None`: the [`RngConfig`]'s seed).
    pub seed: Option<u64>,
    /// Number of top alternatives to report with each token (0 = none).
    pub n_probs: i32,
    /// Minimum number of candidates top-p, min-p, typical and XTC keep (0 = no minimum).
    pub min_keep: i32,
    /// Top-k (`<= 0` = off).
    pub top_k: i32,
    /// Top-p (`>= 1` = off).
    pub top_p: f32,
    /// Min-p (`<= 0` = off).
    pub min_p: f32,
    /// XTC probability (`<= 0` = off).
    pub xtc_probability: f32,
    /// XTC threshold (`> 0.5` = off).
    pub xtc_threshold: f32,
    /// Typical-p (`>= 1` = off).
    pub typ_p: f32,
    /// Temperature (`<= 0` = greedy).
    pub temp: f32,
    /// Dynamic temperature range (`<= 0` = off).
    pub dynatemp_range: f32,
    /// Dynamic temperature exponent.
    pub dynatemp_exponent: f32,
    /// Penalty window (0 = off, -1 = context size, see [`SamplingParams::n_ctx`]).
    pub penalty_last_n: i32,
    /// Repetition penalty (1 = off).
    pub penalty_repeat: f32,
    /// Frequency penalty (0 = off).
    pub penalty_freq: f32,
    /// Presence penalty (0 = off).
    pub penalty_present: f32,
    /// DRY multiplier (0 = off).
    pub dry_multiplier: f32,
    /// DRY base.
    pub dry_base: f32,
    /// DRY allowed length.
    pub dry_allowed_length: i32,
    /// DRY window (0 = off, -1 = context size).
    pub dry_penalty_last_n: i32,
    /// DRY sequence breakers.
    pub dry_sequence_breakers: Vec<String>,
    /// Mirostat mode.
    pub mirostat: Mirostat,
    /// Top-n-sigma (`<= 0` = off).
    pub top_n_sigma: f32,
    /// Mirostat target surprise.
    pub mirostat_tau: f32,
    /// Mirostat learning rate.
    pub mirostat_eta: f32,
    /// Logit biases, applied first (an empty list adds no stage).
    pub logit_bias: Vec<LogitBias>,
    /// The configurable sequence (ignored with mirostat).
    pub samplers: Vec<SamplerType>,
    /// OpenAI `logprobs`: whether logprobs were requested.
    pub logprobs: bool,
    /// OpenAI `top_logprobs` as given (0..=20); [`SamplingParams::n_probs`] holds the count used.
    pub top_logprobs: Option<u32>,
    /// OpenAI `n`: number of choices (at least 1).
    pub n: u32,
    /// llama.cpp's `post_sampling_probs`: report probabilities after the chain
    /// ([`LogprobsMode::Processed`]) instead of the raw model distribution.
    pub post_sampling_probs: bool,
    /// The context size that `-1` windows stand for (not a request field; llama.cpp's server
    /// uses the slot's context). `None`: unknown.
    pub n_ctx: Option<u32>,
    /// llama.cpp's `grammar`: GBNF text the sampled tokens must follow (`None`, or `""` in a
    /// body: no grammar). Carried, not applied: [`SamplingParams::build_chain`] ignores it; the
    /// caller compiles it with `tokensieve-grammar` and attaches it with
    /// [`Chain::with_constraint`].
    pub grammar: Option<String>,
    /// llama.cpp's `json_schema` (also set from OpenAI's `response_format`): a JSON schema the
    /// output must satisfy, `{}` meaning any JSON object. Carried like
    /// [`SamplingParams::grammar`]. A `serde_json::Value` sorts object keys (unless serde_json's
    /// `preserve_order` is on), while llama.cpp's converter follows the document's property
    /// order: to reproduce it, convert the schema's text as written in the body.
    pub json_schema: Option<serde_json::Value>,
    /// llama.cpp's `grammar_lazy`: the grammar constrains nothing until one of
    /// [`SamplingParams::grammar_triggers`] appears (tool calls inside free text). Carried like
    /// [`SamplingParams::grammar`].
    pub grammar_lazy: bool,
    /// llama.cpp's `grammar_triggers`: what wakes a lazy grammar (ignored, as by llama.cpp,
    /// unless [`SamplingParams::grammar_lazy`]).
    pub grammar_triggers: Vec<GrammarTrigger>,
}

/// One of llama.cpp's `grammar_triggers`. In a body: `{"type": 0, "value": "…", "token": id}`
/// with type 0 = token, 1 = word, 2 = pattern, 3 = pattern_full (llama.cpp's
/// `common_grammar_trigger_type`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GrammarTrigger {
    /// Accepting this token wakes the grammar, which the token then starts.
    Token(u32),
    /// This text anywhere in the output wakes the grammar, which starts at it.
    Word(String),
    /// A match of this regular expression anywhere in the output (the grammar starts at its
    /// first non-empty capture group, or at the match).
    Pattern(String),
    /// This regular expression matching the whole output so far.
    PatternFull(String),
}

/// llama.cpp's default DRY sequence breakers.
pub const DEFAULT_DRY_SEQUENCE_BREAKERS: [&str; 4] = ["\n", ":", "\"", "*"];

/// The `m` llama.cpp's `common_sampler_init` passes to mirostat v1.
const MIROSTAT_M: i32 = 100;

impl Default for SamplingParams {
    /// llama.cpp's defaults (`common/common.h`), no seed, no logprobs, one choice.
    fn default() -> Self {
        SamplingParams {
            seed: None,
            n_probs: 0,
            min_keep: 0,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            xtc_probability: 0.0,
            xtc_threshold: 0.10,
            typ_p: 1.0,
            temp: 0.80,
            dynatemp_range: 0.0,
            dynatemp_exponent: 1.0,
            penalty_last_n: 64,
            penalty_repeat: 1.0,
            penalty_freq: 0.0,
            penalty_present: 0.0,
            dry_multiplier: 0.0,
            dry_base: 1.75,
            dry_allowed_length: 2,
            dry_penalty_last_n: 64,
            dry_sequence_breakers: DEFAULT_DRY_SEQUENCE_BREAKERS.map(String::from).to_vec(),
            mirostat: Mirostat::Off,
            top_n_sigma: -1.0,
            mirostat_tau: 5.0,
            mirostat_eta: 0.10,
            logit_bias: Vec::new(),
            samplers: SamplerType::DEFAULT_SEQUENCE.to_vec(),
            logprobs: false,
            top_logprobs: None,
            n: 1,
            post_sampling_probs: false,
            n_ctx: None,
            grammar: None,
            json_schema: None,
            grammar_lazy: false,
            grammar_triggers: Vec::new(),
        }
    }
}

/// Writes an f32 so that `str::parse::<f32>` gives it back bit for bit (`inf`, `-inf` too).
fn num(out: &mut String, v: f32) {
    let _ = write!(out, "{v}");
}

impl SamplingParams {
    /// Reads a request body: llama.cpp server fields ([`llama_server`]), OpenAI fields
    /// ([`openai`]) or both, as llama.cpp's server accepts them. Fields not given keep
    /// llama.cpp's defaults; `null` counts as not given. An unknown field, a wrong type or an
    /// out-of-range value is an error naming the field; so is malformed JSON.
    pub fn from_json(body: &str) -> Result<Self> {
        let value: serde_json::Value = serde_json::from_str(body)
            .map_err(|e| Error::invalid(format!("the request body is not valid JSON: {e}")))?;
        Self::from_json_value(&value)
    }

    /// As [`SamplingParams::from_json`], from a parsed value.
    pub fn from_json_value(body: &serde_json::Value) -> Result<Self> {
        let obj = body.as_object().ok_or_else(|| {
            Error::invalid(format!("the request body must be a JSON object, got {}", llama_server::type_name(body)))
        })?;
        let mut params = SamplingParams::default();
        for (key, value) in obj {
            if value.is_null() {
                continue;
            }
            if llama_server::set_field(&mut params, key, value)? || openai::set_field(&mut params, key, value)? {
                continue;
            }
            if llama_server::IGNORED_FIELDS.contains(&key.as_str()) {
                continue;
            }
            if llama_server::UNSUPPORTED_FIELDS.contains(&key.as_str()) {
                if llama_server::is_off(key, value) {
                    continue;
                }
                return Err(Error::field(
                    key.as_str(),
                    "is not supported by tokensieve (only its \"off\" value is accepted)",
                ));
            }
            return Err(Error::field(key.as_str(), "unknown field (not a llama.cpp server or OpenAI sampling field)"));
        }
        openai::resolve_logprobs(&mut params, obj)?;
        openai::resolve_response_format(&mut params, obj)?;
        Ok(params)
    }

    /// Where logprobs come from: [`LogprobsMode::Processed`] with `post_sampling_probs`.
    pub fn logprobs_mode(&self) -> LogprobsMode {
        if self.post_sampling_probs {
            LogprobsMode::Processed
        } else {
            LogprobsMode::Raw
        }
    }

    /// True when the body asks for a grammar or a JSON schema (which the caller must apply).
    pub fn is_constrained(&self) -> bool {
        self.grammar.is_some() || self.json_schema.is_some()
    }

    /// How many top alternatives to report with each token (`n_probs`, never negative).
    pub fn top_n_logprobs(&self) -> usize {
        self.n_probs.max(0) as usize
    }

    fn window(&self, field: &str, last_n: i32, inert: bool) -> Result<i32> {
        if last_n >= 0 {
            return Ok(last_n);
        }
        if last_n != -1 {
            return Err(Error::field(field, format!("must be >= -1, got {last_n}")));
        }
        match self.n_ctx {
            Some(n) => i32::try_from(n).map_err(|_| Error::field(field, format!("context size {n} is too large"))),
            None if inert => Ok(0),
            None => Err(Error::field(
                field,
                "-1 means the context size, which is unknown here: give a window size (or set `n_ctx`)",
            )),
        }
    }

    /// The chain llama.cpp's `common_sampler_init` builds from these parameters, as a spec
    /// string (llama.cpp convention):
    ///
    /// * `mirostat` off: `[logit_bias] → the sequence → dist`, every stage of the sequence
    ///   emitted, inert ones included, as llama.cpp builds them. `temperature` in the sequence
    ///   is `temp_ext(temp, dynatemp_range, dynatemp_exponent)`; `dry` carries
    ///   `breakers=[…]` only when they differ from llama.cpp's defaults.
    /// * `mirostat` 1 or 2: `[logit_bias] → temperature(temp) → mirostat(tau, eta, 100)` or
    ///   `mirostat_v2(tau, eta)`.
    ///
    /// Errors: a `-1` window with no [`SamplingParams::n_ctx`] on an active stage.
    pub fn chain_spec(&self) -> Result<String> {
        let mut s = String::new();
        if !self.logit_bias.is_empty() {
            s.push_str("logit_bias(");
            for (i, b) in self.logit_bias.iter().enumerate() {
                if i > 0 {
                    s.push(' ');
                }
                let _ = write!(s, "{}:", b.token);
                num(&mut s, b.bias);
            }
            s.push_str(");");
        }
        let mk = self.min_keep;
        match self.mirostat {
            Mirostat::V1 | Mirostat::V2 => {
                s.push_str("temperature(");
                num(&mut s, self.temp);
                s.push_str(");");
                s.push_str(if self.mirostat == Mirostat::V1 { "mirostat(" } else { "mirostat_v2(" });
                num(&mut s, self.mirostat_tau);
                s.push(',');
                num(&mut s, self.mirostat_eta);
                if self.mirostat == Mirostat::V1 {
                    let _ = write!(s, ",{MIROSTAT_M}");
                }
                s.push(')');
                return Ok(s);
            }
            Mirostat::Off => {}
        }
        for t in &self.samplers {
            match t {
                SamplerType::Penalties => {
                    let inert = self.penalty_repeat == 1.0 && self.penalty_freq == 0.0 && self.penalty_present == 0.0;
                    let last_n = self.window("repeat_last_n", self.penalty_last_n, inert)?;
                    let _ = write!(s, "penalties({last_n},");
                    num(&mut s, self.penalty_repeat);
                    s.push(',');
                    num(&mut s, self.penalty_freq);
                    s.push(',');
                    num(&mut s, self.penalty_present);
                    s.push(')');
                }
                SamplerType::Dry => {
                    let inert = self.dry_multiplier == 0.0 || self.dry_base < 1.0;
                    let last_n = self.window("dry_penalty_last_n", self.dry_penalty_last_n, inert)?;
                    s.push_str("dry(");
                    num(&mut s, self.dry_multiplier);
                    s.push(',');
                    num(&mut s, self.dry_base);
                    let _ = write!(s, ",{},{last_n}", self.dry_allowed_length);
                    if self.dry_sequence_breakers.iter().map(String::as_str).ne(DEFAULT_DRY_SEQUENCE_BREAKERS) {
                        let json = serde_json::to_string(&self.dry_sequence_breakers)
                            .map_err(|e| Error::field("dry_sequence_breakers", e.to_string()))?;
                        let _ = write!(s, ",breakers={json}");
                    }
                    s.push(')');
                }
                SamplerType::TopNSigma => {
                    s.push_str("top_n_sigma(");
                    num(&mut s, self.top_n_sigma);
                    s.push(')');
                }
                SamplerType::TopK => {
                    let _ = write!(s, "top_k({})", self.top_k);
                }
                SamplerType::TypicalP => {
                    s.push_str("typical(");
                    num(&mut s, self.typ_p);
                    let _ = write!(s, ",{mk})");
                }
                SamplerType::TopP => {
                    s.push_str("top_p(");
                    num(&mut s, self.top_p);
                    let _ = write!(s, ",{mk})");
                }
                SamplerType::MinP => {
                    s.push_str("min_p(");
                    num(&mut s, self.min_p);
                    let _ = write!(s, ",{mk})");
                }
                SamplerType::Xtc => {
                    s.push_str("xtc(");
                    num(&mut s, self.xtc_probability);
                    s.push(',');
                    num(&mut s, self.xtc_threshold);
                    let _ = write!(s, ",{mk})");
                }
                SamplerType::Temperature => {
                    s.push_str("temp_ext(");
                    num(&mut s, self.temp);
                    s.push(',');
                    num(&mut s, self.dynatemp_range);
                    s.push(',');
                    num(&mut s, self.dynatemp_exponent);
                    s.push(')');
                }
            }
            s.push(';');
        }
        s.push_str("dist");
        Ok(s)
    }

    /// Builds the chain of [`SamplingParams::chain_spec`] for rows of `ctx.n_vocab` tokens.
    /// `self.seed`, when set, replaces the seed of `ctx.rng` (kind and sequence are kept).
    /// Logit-bias ids must be below `n_vocab` (llama.cpp's server drops the others silently;
    /// here they are an error naming the id).
    pub fn build_chain(&self, ctx: &BuildContext<'_>) -> Result<Chain> {
        if let Some(b) = self.logit_bias.iter().find(|b| b.token as usize >= ctx.n_vocab) {
            return Err(Error::token_out_of_range("logit_bias", b.token as i64, ctx.n_vocab));
        }
        if self.min_keep < 0 {
            return Err(Error::field("min_keep", format!("must be >= 0, got {}", self.min_keep)));
        }
        let rng = RngConfig { seed: self.seed.unwrap_or(ctx.rng.seed), ..ctx.rng };
        // The spec is llama.cpp's, whatever convention `ctx` was made for.
        Chain::from_spec(&self.chain_spec()?, &BuildContext { rng, convention: Convention::LlamaCpp, ..*ctx })
    }

    /// [`SamplingParams::build_chain`] for `n_vocab` tokens, drawing with `rng`, no
    /// vocabulary text.
    pub fn to_chain(&self, n_vocab: usize, rng: RngConfig) -> Result<Chain> {
        self.build_chain(&BuildContext::new(n_vocab, rng))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT_SPEC: &str = "penalties(64,1,0,0);dry(0,1.75,2,64);top_n_sigma(-1);top_k(40);typical(1,0);\
                                top_p(0.95,0);min_p(0.05,0);xtc(0,0.1,0);temp_ext(0.8,0,1);dist";

    #[test]
    fn defaults_are_llama_cpp_common_defaults() {
        let p = SamplingParams::default();
        assert_eq!(p.chain_spec().unwrap(), DEFAULT_SPEC);
        assert_eq!(p.samplers.iter().map(|t| t.letter()).collect::<String>(), "edskypmxt");
        assert_eq!(p.dry_sequence_breakers, ["\n", ":", "\"", "*"]);
    }

    #[test]
    fn mirostat_replaces_the_sequence_and_keeps_the_bias_first() {
        let mut p = SamplingParams { mirostat: Mirostat::V1, ..Default::default() };
        p.logit_bias = vec![LogitBias { token: 3, bias: f32::NEG_INFINITY }, LogitBias { token: 0, bias: 1.5 }];
        assert_eq!(p.chain_spec().unwrap(), "logit_bias(3:-inf 0:1.5);temperature(0.8);mirostat(5,0.1,100)");
        p.mirostat = Mirostat::V2;
        p.logit_bias.clear();
        assert_eq!(p.chain_spec().unwrap(), "temperature(0.8);mirostat_v2(5,0.1)");
    }

    #[test]
    fn every_stage_gets_its_parameters() {
        let p = SamplingParams {
            top_k: 5,
            top_p: 0.9,
            min_p: 0.1,
            typ_p: 0.7,
            temp: 1.3,
            dynatemp_range: 0.5,
            dynatemp_exponent: 2.0,
            xtc_probability: 0.5,
            xtc_threshold: 0.2,
            top_n_sigma: 1.5,
            penalty_last_n: 32,
            penalty_repeat: 1.1,
            penalty_freq: 0.2,
            penalty_present: 0.3,
            dry_multiplier: 0.8,
            dry_base: 2.0,
            dry_allowed_length: 3,
            dry_penalty_last_n: 128,
            dry_sequence_breakers: vec!["\n".into(), "a\"b".into()],
            min_keep: 2,
            samplers: vec![SamplerType::TopK, SamplerType::Dry, SamplerType::Temperature, SamplerType::TopK],
            ..Default::default()
        };
        assert_eq!(
            p.chain_spec().unwrap(),
            r#"top_k(5);dry(0.8,2,3,128,breakers=["\n","a\"b"]);temp_ext(1.3,0.5,2);top_k(5);dist"#
        );
        let p = SamplingParams { samplers: SamplerType::DEFAULT_SEQUENCE.to_vec(), ..p };
        assert_eq!(
            p.chain_spec().unwrap(),
            "penalties(32,1.1,0.2,0.3);dry(0.8,2,3,128,breakers=[\"\\n\",\"a\\\"b\"]);top_n_sigma(1.5);top_k(5);\
             typical(0.7,2);top_p(0.9,2);min_p(0.1,2);xtc(0.5,0.2,2);temp_ext(1.3,0.5,2);dist"
        );
        let empty = SamplingParams { samplers: vec![], ..Default::default() };
        assert_eq!(empty.chain_spec().unwrap(), "dist");
    }

    #[test]
    fn spec_numbers_round_trip_bit_for_bit() {
        for v in [0.1f32, 0.95, 1.0 / 3.0, 1e-8, 3.4e38, -0.0, f32::MIN_POSITIVE, 0.8000001] {
            let mut s = String::new();
            num(&mut s, v);
            assert_eq!(s.parse::<f32>().unwrap().to_bits(), v.to_bits(), "{s}");
        }
    }

    #[test]
    fn minus_one_windows_need_a_context_size_unless_inert() {
        let mut p = SamplingParams { penalty_last_n: -1, dry_penalty_last_n: -1, ..Default::default() };
        assert!(p.chain_spec().unwrap().starts_with("penalties(0,1,0,0);dry(0,1.75,2,0);"));
        p.penalty_repeat = 1.1;
        let e = p.chain_spec().unwrap_err().to_string();
        assert!(e.contains("repeat_last_n") && e.contains("context size"), "{e}");
        p.n_ctx = Some(4096);
        assert!(p.chain_spec().unwrap().starts_with("penalties(4096,1.1,0,0);dry(0,1.75,2,4096);"));
        p.dry_multiplier = 0.8;
        p.n_ctx = None;
        p.penalty_last_n = 8;
        let e = p.chain_spec().unwrap_err().to_string();
        assert!(e.contains("dry_penalty_last_n"), "{e}");
        p.dry_penalty_last_n = -2;
        assert!(p.chain_spec().unwrap_err().to_string().contains(">= -1"));
    }

    #[test]
    fn sequences_by_name_alias_and_letter() {
        let names = ["penalties", "dry", "top-n-sigma", "top-k", "typical", "nucleus", "min-p", "xtc", "temp"];
        assert_eq!(SamplerType::parse_names(names).unwrap(), SamplerType::DEFAULT_SEQUENCE);
        let canonical = SamplerType::DEFAULT_SEQUENCE.map(SamplerType::name);
        assert_eq!(SamplerType::parse_names(canonical).unwrap(), SamplerType::DEFAULT_SEQUENCE);
        for alias in ["typ_p", "typ-p", "typ", "typical-p"] {
            assert_eq!(SamplerType::from_name(alias).unwrap(), SamplerType::TypicalP);
        }
        assert_eq!(SamplerType::parse_letters("kt").unwrap(), [SamplerType::TopK, SamplerType::Temperature]);
        let e = SamplerType::from_name("tfs_z").unwrap_err().to_string();
        assert!(e.contains("samplers") && e.contains("`tfs_z`"), "{e}");
        assert!(SamplerType::from_name("infill").unwrap_err().to_string().contains("not supported"));
        assert!(SamplerType::from_letter('a').unwrap_err().to_string().contains("adaptive_p"));
        assert!(SamplerType::parse_letters("kz").unwrap_err().to_string().contains("`z`"));
    }

    #[test]
    fn build_checks_bias_ids_and_applies_the_seed() {
        let p = SamplingParams { logit_bias: vec![LogitBias { token: 4, bias: 1.0 }], ..Default::default() };
        let e = p.to_chain(4, RngConfig::philox(0)).unwrap_err().to_string();
        assert!(e.contains("logit_bias") && e.contains("token id 4"), "{e}");
        let p = SamplingParams { seed: Some(1 << 40), samplers: vec![], ..Default::default() };
        let e = p.to_chain(4, RngConfig::mt19937(0)).unwrap_err().to_string();
        assert!(e.contains("32 bits"), "{e}");
        assert!(p.to_chain(4, RngConfig::philox(0)).is_ok());
    }

    /// `{"temperature": 0.8}` must be llama.cpp's default chain: checked against every
    /// `chain_default` / `chain_default_verbatim` golden case (outputs of llama.cpp's own
    /// `common_sampler_init` stages), processed logits, order and the 8-token stream.
    #[test]
    fn a_temperature_only_body_is_llama_cpp_s_default_chain() {
        use tokensieve_testkit::golden::{self, llama_cpp::same_bits, llama_cpp::Set};
        let params = SamplingParams::from_json(r#"{"temperature": 0.8}"#).unwrap();
        assert_eq!(params, SamplingParams::default());
        assert_eq!(params.chain_spec().unwrap(), DEFAULT_SPEC);
        let Some(set) = Set::load() else {
            assert!(!golden::goldens_required(), "TOKENSIEVE_REQUIRE_GOLDENS=1 but the llama.cpp goldens are missing");
            eprintln!("skipped: shared/golden/llama.cpp not found");
            return;
        };
        let mut checked = 0;
        for c in set.cases.iter().filter(|c| c.group == "chain_default" || c.group == "chain_default_verbatim") {
            let row = set.row(c);
            let mut chain = params.to_chain(row.len(), RngConfig::mt19937(c.seed.unwrap())).unwrap();
            for &t in set.history(c) {
                chain.accept(t);
            }
            let mut tokens = Vec::new();
            for step in 0..c.n_steps {
                let cands = chain.apply(row).unwrap();
                if step == 0 {
                    let mut dense = vec![0.0; row.len()];
                    cands.write_dense(&mut dense);
                    assert!(same_bits(&dense, set.output(c)), "case {}: processed logits differ", c.id);
                    let ids: Vec<u32> = cands.as_slice().iter().map(|t| t.id).collect();
                    assert_eq!(ids, set.order(c), "case {}: candidate order differs", c.id);
                }
                let token = cands.selected_token().unwrap();
                tokens.push(token);
                chain.accept(token);
            }
            assert_eq!(tokens, c.tokens, "case {}: token stream differs", c.id);
            checked += 1;
        }
        assert!(checked > 100, "only {checked} default-chain cases");
    }

    #[test]
    fn body_seed_matches_an_explicit_rng_seed() {
        let row: Vec<f32> = (0..64).map(|i| ((i * 37 % 11) as f32) * 0.3).collect();
        let p = SamplingParams { seed: Some(7), samplers: vec![SamplerType::TopK], ..Default::default() };
        let q = SamplingParams { samplers: vec![SamplerType::TopK], ..Default::default() };
        let mut a = p.to_chain(row.len(), RngConfig::mt19937(0)).unwrap();
        let mut b = q.to_chain(row.len(), RngConfig::mt19937(7)).unwrap();
        for _ in 0..16 {
            assert_eq!(a.sample(&row).unwrap(), b.sample(&row).unwrap());
        }
    }
}
