//! A Hugging Face `generation_config.json` (or the same fields as a request body), and the
//! processor list transformers' `generate()` builds from it (`GenerationMixin.
//! _get_logits_processor`, transformers 5.23.0), as a chain under the transformers convention.
//!
//! ```
//! use tokensieve::{params::GenerationConfig, RngConfig};
//!
//! // Llama 3's generation_config.json.
//! let config = GenerationConfig::from_json(
//!     r#"{"bos_token_id": 128000, "do_sample": true, "eos_token_id": [128001, 128009],
//!         "temperature": 0.6, "top_p": 0.9, "transformers_version": "4.45.0"}"#,
//! )?;
//! // top_k = 50 is transformers' default: do_sample alone means top-k 50.
//! assert_eq!(config.chain_spec()?, "temperature(0.6);top_k(50,1);top_p(0.9,1);dist");
//! let mut chain = config.to_chain(4, RngConfig::philox(42))?;
//! let token = chain.sample(&[0.5f32, 3.0, 2.5, -1.0])?;
//! assert!(token == 1 || token == 2);
//! # Ok::<(), tokensieve::Error>(())
//! ```
//!
//! # The processor list
//!
//! In `generate()`'s order, each only when its condition holds:
//!
//! | field | stage | condition |
//! |---|---|---|
//! | `sequence_bias` | `sequence_bias` | not null |
//! | `repetition_penalty` | `repetition_penalty` | not null, `!= 1.0` |
//! | `no_repeat_ngram_size` | `no_repeat_ngram` | not null, `> 0` |
//! | `bad_words_ids` | `sequence_bias` with `-inf` biases (`NoBadWordsLogitsProcessor`; single-token words equal to an eos id dropped) | not null |
//! | `min_length` + `eos_token_id` | `min_length` | `min_length > 0`, eos known, `min_new_tokens` null |
//! | `min_new_tokens` + `eos_token_id` | `min_new_tokens` | `min_new_tokens > 0`, eos known |
//! | `suppress_tokens` | `suppress_tokens` | not null |
//! | `begin_suppress_tokens` | `begin_suppress_tokens` (at the prompt length) | not null |
//! | `temperature` | `temperature` | `do_sample`, not null, `!= 1.0` |
//! | `top_k` | `top_k(k, 1)` | `do_sample`, not null, `!= 0` (default **50**) |
//! | `top_p` | `top_p(p, 1)` | `do_sample`, not null, `< 1.0` |
//! | `min_p` | `min_p(p, 1)` | `do_sample`, not null |
//! | `typical_p` | `typical(p, 1)` | `do_sample`, not null, `< 1.0` |
//! | `epsilon_cutoff` | `epsilon(e, 1)` | `do_sample`, `0 < e < 1` |
//! | `eta_cutoff` | `eta(e, 1)` | `do_sample`, `0 < e < 1` |
//! | `do_sample` | `dist`, or `greedy` when false (the default) | always |
//!
//! With `do_sample: false` no warper is built at all, whatever `temperature`, `top_k`, … say
//! (transformers only warns); `temperature: 0` is then fine. With `do_sample: true`, the
//! warpers' own validation applies (`temperature` must be `> 0`, `top_k > 0` unless 0 = off,
//! `top_p` in `[0, 1]`, …) and its errors name the field.
//!
//! When `min_new_tokens` is set, `generate()` overwrites `min_length` with `prompt length +
//! min_new_tokens` and adds both `MinLengthLogitsProcessor` and
//! `MinNewTokensLengthLogitsProcessor`, which then mask exactly the same steps; tokensieve
//! builds the one `min_new_tokens` stage.
//!
//! # Fields
//!
//! `null` means "not set" (transformers' `None`: e.g. `"top_k": null` turns top-k off), an
//! absent field takes transformers' default. Numbers may be written as integers where
//! transformers wants a float (`"temperature": 2`); integer fields must be integers.
//!
//! * **Used**: the fields in the table, `eos_token_id` (an id or a list), `do_sample`.
//! * **Checked but otherwise ignored**: `max_new_tokens` (`> 0`), `early_stopping` (a bool or
//!   `"never"`), `num_return_sequences` (must be 1 for greedy decoding), as
//!   `GenerationConfig.validate()` raises.
//! * **Ignored** (they do not change the processed logits or the token chosen from them):
//!   [`IGNORED_FIELDS`]: lengths and stopping (`max_length`, `max_time`, `stop_strings`), cache
//!   and compilation settings, output flags, special ids other than eos (`pad_token_id`,
//!   `bos_token_id`, `decoder_start_token_id`), beam-only settings (`length_penalty`,
//!   `diversity_penalty`, `num_beam_groups`), assistant settings, metadata
//!   (`transformers_version`, `_from_model_config`, …).
//! * **Unsupported** unless they hold their "off" value: [`UNSUPPORTED_FIELDS`] (beam search,
//!   contrastive search, DoLa, constrained and assisted decoding, classifier-free guidance,
//!   encoder-side penalties, forced BOS/EOS, `remove_invalid_values`, exponential decay length
//!   penalty, `renormalize_logits`, watermarking, top-H). They are an error naming the field.
//! * Anything else is an error naming the field.

use crate::chain::Chain;
use crate::convention::Convention;
use crate::error::{Error, Result};
use crate::rng::RngConfig;
use crate::sampler::transformers::{
    epsilon::Epsilon, eta::Eta, min_p::MinP, repetition_penalty::RepetitionPenalty, sequence_bias::SequenceBias,
    temperature::Temperature, top_k::TopK, top_p::TopP, typical::Typical,
};
use crate::sampler::BuildContext;
use serde_json::Value;
use std::fmt::Write as _;

/// Fields that do not change the processed logits or the token chosen from them.
pub const IGNORED_FIELDS: &[&str] = &[
    "max_length",
    "max_new_tokens",
    "max_time",
    "stop_strings",
    "early_stopping",
    "use_cache",
    "cache_implementation",
    "cache_config",
    "return_legacy_cache",
    "prefill_chunk_size",
    "num_beam_groups",
    "diversity_penalty",
    "length_penalty",
    "low_memory",
    "num_return_sequences",
    "output_attentions",
    "output_hidden_states",
    "output_scores",
    "output_logits",
    "return_dict_in_generate",
    "pad_token_id",
    "bos_token_id",
    "decoder_start_token_id",
    "is_assistant",
    "num_assistant_tokens",
    "num_assistant_tokens_schedule",
    "assistant_confidence_threshold",
    "max_matching_ngram_size",
    "assistant_lookbehind",
    "target_lookbehind",
    "compile_config",
    "disable_compile",
    "use_model_defaults",
    "transformers_version",
    "_from_model_config",
    "_commit_hash",
    "_original_object_hash",
];

/// Fields whose processors or decoding modes tokensieve does not implement: accepted only with
/// their "off" value (`null`, or the value in parentheses in [`GenerationConfig`]'s docs).
pub const UNSUPPORTED_FIELDS: &[&str] = &[
    "num_beams",
    "penalty_alpha",
    "dola_layers",
    "constraints",
    "force_words_ids",
    "guidance_scale",
    "encoder_repetition_penalty",
    "encoder_no_repeat_ngram_size",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "forced_decoder_ids",
    "remove_invalid_values",
    "exponential_decay_length_penalty",
    "renormalize_logits",
    "watermarking_config",
    "top_h",
    "prompt_lookup_num_tokens",
    "assistant_early_exit",
    "token_healing",
];

/// The fields of a `GenerationConfig` that shape the logits processors, with transformers'
/// defaults. `None` is transformers' `None` (JSON `null`). Build it with
/// [`GenerationConfig::from_json`] or [`Default`] and field assignment.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct GenerationConfig {
    /// Sample (`dist` and the warpers) or decode greedily (default `false`).
    pub do_sample: bool,
    /// Temperature (default 1.0; applied when `!= 1.0`).
    pub temperature: Option<f64>,
    /// Top-k (default 50; 0 or `None` = off).
    pub top_k: Option<i64>,
    /// Top-p (default 1.0; applied when `< 1.0`).
    pub top_p: Option<f64>,
    /// Min-p (default `None`; applied whenever set).
    pub min_p: Option<f64>,
    /// Typical-p (default 1.0; applied when `< 1.0`).
    pub typical_p: Option<f64>,
    /// Epsilon cutoff (default 0.0; applied when strictly inside (0, 1)).
    pub epsilon_cutoff: Option<f64>,
    /// Eta cutoff (default 0.0; applied when strictly inside (0, 1)).
    pub eta_cutoff: Option<f64>,
    /// Repetition penalty (default 1.0; applied when `!= 1.0`).
    pub repetition_penalty: Option<f64>,
    /// No-repeat n-gram size (default 0; applied when `> 0`).
    pub no_repeat_ngram_size: Option<i64>,
    /// Minimum length, prompt included (default 0; needs `eos_token_id`).
    pub min_length: Option<i64>,
    /// Minimum number of generated tokens (default `None`; needs `eos_token_id`).
    pub min_new_tokens: Option<i64>,
    /// End-of-sequence id(s).
    pub eos_token_id: Option<Vec<i64>>,
    /// Banned token sequences.
    pub bad_words_ids: Option<Vec<Vec<i64>>>,
    /// `[ids, bias]` pairs.
    pub sequence_bias: Option<Vec<(Vec<i64>, f64)>>,
    /// Ids suppressed at every step.
    pub suppress_tokens: Option<Vec<i64>>,
    /// Ids suppressed at the first generated position.
    pub begin_suppress_tokens: Option<Vec<i64>>,
    /// Checked only (`> 0`).
    pub max_new_tokens: Option<i64>,
    /// Checked only (1 for greedy decoding).
    pub num_return_sequences: i64,
}

impl Default for GenerationConfig {
    /// transformers' global defaults: greedy decoding, no processor.
    fn default() -> Self {
        GenerationConfig {
            do_sample: false,
            temperature: Some(1.0),
            top_k: Some(50),
            top_p: Some(1.0),
            min_p: None,
            typical_p: Some(1.0),
            epsilon_cutoff: Some(0.0),
            eta_cutoff: Some(0.0),
            repetition_penalty: Some(1.0),
            no_repeat_ngram_size: Some(0),
            min_length: Some(0),
            min_new_tokens: None,
            eos_token_id: None,
            bad_words_ids: None,
            sequence_bias: None,
            suppress_tokens: None,
            begin_suppress_tokens: None,
            max_new_tokens: None,
            num_return_sequences: 1,
        }
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn float(key: &str, v: &Value) -> Result<f64> {
    v.as_f64().ok_or_else(|| Error::field(key, format!("must be a number, got {}", type_name(v))))
}

fn int(key: &str, v: &Value) -> Result<i64> {
    v.as_i64().ok_or_else(|| match v {
        Value::Number(_) => Error::field(key, format!("must be an integer, got {v}")),
        _ => Error::field(key, format!("must be an integer, got {}", type_name(v))),
    })
}

fn ids(key: &str, v: &Value) -> Result<Vec<i64>> {
    match v {
        Value::Array(items) => items.iter().map(|i| int(key, i)).collect(),
        _ => Err(Error::field(key, format!("must be a list of token ids, got {}", type_name(v)))),
    }
}

/// The "off" value of an unsupported field.
fn is_off(key: &str, v: &Value) -> bool {
    match (key, v) {
        (_, Value::Null) => true,
        ("num_beams", v) => v.as_f64() == Some(1.0),
        ("penalty_alpha", v) => v.as_f64() == Some(0.0),
        ("guidance_scale" | "encoder_repetition_penalty", v) => v.as_f64() == Some(1.0),
        ("encoder_no_repeat_ngram_size", v) => v.as_f64() == Some(0.0),
        ("remove_invalid_values" | "renormalize_logits" | "token_healing", Value::Bool(b)) => !b,
        _ => false,
    }
}

fn list_text(ids: &[i64]) -> String {
    let mut s = String::from("[");
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(s, "{id}");
    }
    s.push(']');
    s
}

/// A stage's error re-labelled with the field it came from.
fn from_field(field: &str, e: Error) -> Error {
    Error::field(field, e.to_string())
}

impl GenerationConfig {
    /// Reads a `generation_config.json` or a request body with the same fields. Absent fields
    /// keep transformers' defaults, `null` unsets a field. An unknown field, a wrong type or an
    /// unsupported feature is an error naming the field; so is malformed JSON.
    pub fn from_json(body: &str) -> Result<Self> {
        let value: Value = serde_json::from_str(body)
            .map_err(|e| Error::invalid(format!("the generation config is not valid JSON: {e}")))?;
        Self::from_json_value(&value)
    }

    /// As [`GenerationConfig::from_json`], from a parsed value.
    pub fn from_json_value(body: &Value) -> Result<Self> {
        let obj = body.as_object().ok_or_else(|| {
            Error::invalid(format!("the generation config must be a JSON object, got {}", type_name(body)))
        })?;
        let mut c = GenerationConfig::default();
        let mut penalty_alpha = None;
        for (key, v) in obj {
            let k = key.as_str();
            let null = v.is_null();
            match k {
                "do_sample" => {
                    c.do_sample = match v {
                        Value::Bool(b) => *b,
                        Value::Null => false,
                        _ => return Err(Error::field(k, format!("must be a boolean, got {}", type_name(v)))),
                    }
                }
                "temperature" => c.temperature = if null { None } else { Some(float(k, v)?) },
                "top_k" => c.top_k = if null { None } else { Some(int(k, v)?) },
                "top_p" => c.top_p = if null { None } else { Some(float(k, v)?) },
                "min_p" => c.min_p = if null { None } else { Some(float(k, v)?) },
                "typical_p" => c.typical_p = if null { None } else { Some(float(k, v)?) },
                "epsilon_cutoff" => c.epsilon_cutoff = if null { None } else { Some(float(k, v)?) },
                "eta_cutoff" => c.eta_cutoff = if null { None } else { Some(float(k, v)?) },
                "repetition_penalty" => c.repetition_penalty = if null { None } else { Some(float(k, v)?) },
                "no_repeat_ngram_size" => c.no_repeat_ngram_size = if null { None } else { Some(int(k, v)?) },
                "min_length" => c.min_length = if null { None } else { Some(int(k, v)?) },
                "min_new_tokens" => c.min_new_tokens = if null { None } else { Some(int(k, v)?) },
                "max_new_tokens" => c.max_new_tokens = if null { None } else { Some(int(k, v)?) },
                "num_return_sequences" => c.num_return_sequences = if null { 1 } else { int(k, v)? },
                "eos_token_id" => {
                    c.eos_token_id = match v {
                        Value::Null => None,
                        Value::Array(_) => Some(ids(k, v)?),
                        _ => Some(vec![int(k, v)?]),
                    }
                }
                "suppress_tokens" => c.suppress_tokens = if null { None } else { Some(ids(k, v)?) },
                "begin_suppress_tokens" => c.begin_suppress_tokens = if null { None } else { Some(ids(k, v)?) },
                "bad_words_ids" => {
                    c.bad_words_ids = match v {
                        Value::Null => None,
                        Value::Array(words) => Some(words.iter().map(|w| ids(k, w)).collect::<Result<_>>()?),
                        _ => {
                            return Err(Error::field(
                                k,
                                format!("must be a list of lists of ids, got {}", type_name(v)),
                            ))
                        }
                    }
                }
                "sequence_bias" => {
                    c.sequence_bias = match v {
                        Value::Null => None,
                        Value::Array(pairs) => Some(
                            pairs
                                .iter()
                                .map(|p| match p.as_array().map(Vec::as_slice) {
                                    Some([seq, bias]) => Ok((ids(k, seq)?, float(k, bias)?)),
                                    _ => Err(Error::field(k, "each entry must be a pair [[ids...], bias]")),
                                })
                                .collect::<Result<_>>()?,
                        ),
                        _ => {
                            return Err(Error::field(
                                k,
                                format!("must be a list of [[ids...], bias] pairs, got {}", type_name(v)),
                            ))
                        }
                    }
                }
                "early_stopping" => match v {
                    Value::Null | Value::Bool(_) => {}
                    Value::String(s) if s == "never" => {}
                    _ => return Err(Error::field(k, format!("must be a boolean or \"never\", got {v}"))),
                },
                "penalty_alpha" => penalty_alpha = if null { None } else { Some(float(k, v)?) },
                _ if IGNORED_FIELDS.contains(&k) => {}
                _ if UNSUPPORTED_FIELDS.contains(&k) => {
                    if !is_off(k, v) {
                        return Err(Error::field(
                            k,
                            format!("is not supported by tokensieve (only its \"off\" value is accepted), got {v}"),
                        ));
                    }
                }
                _ => {
                    return Err(Error::field(k, "unknown field (not a transformers GenerationConfig field)"));
                }
            }
        }
        // Contrastive search: greedy mode with top_k > 1 and penalty_alpha > 0.
        if let Some(alpha) = penalty_alpha {
            if alpha > 0.0 && !c.do_sample && c.top_k.is_some_and(|k| k > 1) {
                return Err(Error::field(
                    "penalty_alpha",
                    "contrastive search (penalty_alpha > 0 with top_k > 1) is not supported by tokensieve",
                ));
            }
        }
        if let Some(n) = c.max_new_tokens {
            if n <= 0 {
                return Err(Error::field("max_new_tokens", format!("must be greater than 0, but is {n}")));
            }
        }
        if c.num_return_sequences != 1 && !c.do_sample {
            return Err(Error::field(
                "num_return_sequences",
                format!(
                    "greedy methods without beam search do not support num_return_sequences different than 1 (got {})",
                    c.num_return_sequences
                ),
            ));
        }
        Ok(c)
    }

    /// The stages `generate()` builds, in its order, each as a spec stage (transformers
    /// convention), the last one `dist` or `greedy`. Invalid values are errors naming the field.
    pub fn stages(&self) -> Result<Vec<String>> {
        let mut out = Vec::new();
        let eos = self.eos_token_id.as_deref();
        if let Some(bias) = &self.sequence_bias {
            SequenceBias::new(bias).map_err(|e| from_field("sequence_bias", e))?;
            out.push(format!("sequence_bias({})", SequenceBias::format(bias)));
        }
        if let Some(p) = self.repetition_penalty.filter(|&p| p != 1.0) {
            RepetitionPenalty::new(p).map_err(|e| from_field("repetition_penalty", e))?;
            out.push(format!("repetition_penalty({p})"));
        }
        if let Some(n) = self.no_repeat_ngram_size.filter(|&n| n > 0) {
            out.push(format!("no_repeat_ngram({n})"));
        }
        if let Some(words) = &self.bad_words_ids {
            if words.is_empty() {
                return Err(Error::field("bad_words_ids", "has to be a non-empty list"));
            }
            let kept: Vec<(Vec<i64>, f64)> = words
                .iter()
                .filter(|w| !(w.len() == 1 && eos.is_some_and(|e| e.contains(&w[0]))))
                .map(|w| (w.clone(), f64::NEG_INFINITY))
                .collect();
            SequenceBias::bad_words(words, eos.unwrap_or(&[]))?;
            out.push(format!("sequence_bias({})", SequenceBias::format(&kept)));
        }
        if let Some(eos) = eos {
            match self.min_new_tokens {
                Some(n) if n > 0 => out.push(format!("min_new_tokens({n},eos={})", list_text(eos))),
                Some(_) => {} // min_length = prompt + n <= prompt: never masks a generated step
                None => {
                    if let Some(n) = self.min_length.filter(|&n| n > 0) {
                        out.push(format!("min_length({n},eos={})", list_text(eos)));
                    }
                }
            }
        }
        if let Some(ids) = &self.suppress_tokens {
            out.push(format!("suppress_tokens({})", list_text(ids)));
        }
        if let Some(ids) = &self.begin_suppress_tokens {
            out.push(format!("begin_suppress_tokens({})", list_text(ids)));
        }
        if !self.do_sample {
            out.push("greedy".into());
            return Ok(out);
        }
        if let Some(t) = self.temperature.filter(|&t| t != 1.0) {
            Temperature::new(t).map_err(|e| from_field("temperature", e))?;
            out.push(format!("temperature({t})"));
        }
        if let Some(k) = self.top_k.filter(|&k| k != 0) {
            TopK::new(k, 1).map_err(|e| from_field("top_k", e))?;
            out.push(format!("top_k({k},1)"));
        }
        if let Some(p) = self.top_p.filter(|&p| p < 1.0) {
            TopP::new(p, 1).map_err(|e| from_field("top_p", e))?;
            out.push(format!("top_p({p},1)"));
        }
        if let Some(p) = self.min_p {
            MinP::new(p, 1).map_err(|e| from_field("min_p", e))?;
            out.push(format!("min_p({p},1)"));
        }
        if let Some(p) = self.typical_p.filter(|&p| p < 1.0) {
            Typical::new(p, 1).map_err(|e| from_field("typical_p", e))?;
            out.push(format!("typical({p},1)"));
        }
        if let Some(e) = self.epsilon_cutoff.filter(|&e| e > 0.0 && e < 1.0) {
            Epsilon::new(e, 1).map_err(|err| from_field("epsilon_cutoff", err))?;
            out.push(format!("epsilon({e},1)"));
        }
        if let Some(e) = self.eta_cutoff.filter(|&e| e > 0.0 && e < 1.0) {
            Eta::new(e, 1).map_err(|err| from_field("eta_cutoff", err))?;
            out.push(format!("eta({e},1)"));
        }
        out.push("dist".into());
        Ok(out)
    }

    /// [`GenerationConfig::stages`] joined into one spec string (transformers convention).
    pub fn chain_spec(&self) -> Result<String> {
        Ok(self.stages()?.join(";"))
    }

    /// Builds the chain of [`GenerationConfig::chain_spec`] for rows of `ctx.n_vocab` tokens,
    /// under the transformers convention whatever `ctx` says. Accept the prompt's tokens before
    /// the first step: the stateful stages read them as `input_ids`.
    pub fn build_chain(&self, ctx: &BuildContext<'_>) -> Result<Chain> {
        Chain::from_spec(&self.chain_spec()?, &ctx.with_convention(Convention::Transformers))
    }

    /// [`GenerationConfig::build_chain`] for `n_vocab` tokens, drawing with `rng`.
    pub fn to_chain(&self, n_vocab: usize, rng: RngConfig) -> Result<Chain> {
        self.build_chain(&BuildContext::new(n_vocab, rng))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: &str) -> String {
        GenerationConfig::from_json(json).unwrap().chain_spec().unwrap()
    }

    fn error(json: &str) -> String {
        match GenerationConfig::from_json(json).and_then(|c| c.chain_spec()) {
            Ok(s) => panic!("{json}: expected an error, got {s}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn defaults_are_greedy_and_do_sample_alone_is_top_k_50() {
        assert_eq!(spec("{}"), "greedy");
        assert_eq!(spec(r#"{"do_sample": true}"#), "top_k(50,1);dist");
        assert_eq!(spec(r#"{"do_sample": true, "top_k": 0}"#), "dist");
        assert_eq!(spec(r#"{"do_sample": true, "top_k": null}"#), "dist");
        // Greedy ignores the warpers entirely, even invalid ones (transformers only warns).
        assert_eq!(spec(r#"{"temperature": 0.0, "top_p": 0.5, "top_k": -3}"#), "greedy");
    }

    #[test]
    fn every_processor_in_generate_s_order() {
        // The order transformers.md §2.1 verified with a local GPT-2: SequenceBias,
        // RepetitionPenalty, NoRepeatNGram, (NoBadWords), MinLength, (Suppress…), Temperature,
        // TopK, TopP, MinP, Typical, Epsilon, Eta. The JSON order does not matter.
        let json = r#"{
            "eta_cutoff": 0.001, "epsilon_cutoff": 0.0003, "typical_p": 0.95, "min_p": 0.05,
            "top_p": 0.9, "top_k": 40, "temperature": 0.7, "do_sample": true,
            "begin_suppress_tokens": [5], "suppress_tokens": [6, 7], "min_length": 10,
            "eos_token_id": 2, "bad_words_ids": [[3, 4], [2]], "no_repeat_ngram_size": 3,
            "repetition_penalty": 1.2, "sequence_bias": [[[9], -1.5], [[1, 8], 2]]
        }"#;
        assert_eq!(
            spec(json),
            "sequence_bias([[[9],-1.5],[[1,8],2]]);repetition_penalty(1.2);no_repeat_ngram(3);\
             sequence_bias([[[3,4],-inf]]);min_length(10,eos=[2]);suppress_tokens([6,7]);\
             begin_suppress_tokens([5]);temperature(0.7);top_k(40,1);top_p(0.9,1);min_p(0.05,1);\
             typical(0.95,1);epsilon(0.0003,1);eta(0.001,1);dist"
        );
        // The spec builds (vocabulary of 16).
        let c = GenerationConfig::from_json(json).unwrap();
        assert_eq!(c.to_chain(16, RngConfig::philox(0)).unwrap().stages().len(), 15);
    }

    #[test]
    fn conditions_follow_generate() {
        // Values at their "off" points add nothing.
        let off = r#"{"do_sample": true, "top_k": 0, "temperature": 1.0, "top_p": 1.0, "typical_p": 1.0,
                      "epsilon_cutoff": 0.0, "eta_cutoff": 1.0, "repetition_penalty": 1.0,
                      "no_repeat_ngram_size": 0, "min_length": 5}"#;
        assert_eq!(spec(off), "dist", "min_length without eos adds nothing");
        // min_new_tokens replaces min_length.
        assert_eq!(
            spec(r#"{"min_length": 50, "min_new_tokens": 3, "eos_token_id": [1, 2]}"#),
            "min_new_tokens(3,eos=[1,2]);greedy"
        );
        assert_eq!(spec(r#"{"min_length": 50, "min_new_tokens": 0, "eos_token_id": 1}"#), "greedy");
        // min_p 0 is "set", so it is applied.
        assert_eq!(spec(r#"{"do_sample": true, "top_k": null, "min_p": 0}"#), "min_p(0,1);dist");
    }

    #[test]
    fn bad_values_are_the_errors_transformers_raises_naming_the_field() {
        for (json, needle) in [
            (r#"{"do_sample": true, "temperature": 0.0}"#, "field `temperature`"),
            (r#"{"do_sample": true, "temperature": -1}"#, "strictly positive"),
            (r#"{"do_sample": true, "top_k": -1}"#, "field `top_k`"),
            (r#"{"do_sample": true, "top_p": -0.5}"#, "field `top_p`"),
            (r#"{"do_sample": true, "min_p": 2}"#, "field `min_p`"),
            (r#"{"do_sample": true, "typical_p": 0}"#, "field `typical_p`"),
            (r#"{"repetition_penalty": 0}"#, "field `repetition_penalty`"),
            (r#"{"bad_words_ids": [[2]], "eos_token_id": 2}"#, "field `bad_words_ids`"),
            (r#"{"bad_words_ids": []}"#, "non-empty"),
            (r#"{"sequence_bias": [[[-1], 1.0]]}"#, "field `sequence_bias`"),
            (r#"{"sequence_bias": [[1, 1.0]]}"#, "field `sequence_bias`"),
            (r#"{"top_k": 40.5}"#, "field `top_k`: must be an integer"),
            (r#"{"do_sample": "yes"}"#, "field `do_sample`"),
            (r#"{"max_new_tokens": 0}"#, "field `max_new_tokens`"),
            (r#"{"num_return_sequences": 2}"#, "field `num_return_sequences`"),
            (r#"{"early_stopping": "sometimes"}"#, "field `early_stopping`"),
            (r#"{"num_beams": 4}"#, "field `num_beams`: is not supported"),
            (r#"{"renormalize_logits": true}"#, "field `renormalize_logits`"),
            (r#"{"penalty_alpha": 0.6, "top_k": 4}"#, "contrastive search"),
            (r#"{"top_q": 0.5}"#, "field `top_q`: unknown field"),
            ("[1]", "must be a JSON object"),
            ("{", "not valid JSON"),
        ] {
            let e = error(json);
            assert!(e.contains(needle), "{json}: {e}");
        }
    }

    #[test]
    fn ignored_and_off_fields_are_accepted() {
        let json = r#"{"max_length": 20, "pad_token_id": 0, "bos_token_id": 1, "transformers_version": "5.23.0",
                       "num_beams": 1, "guidance_scale": null, "renormalize_logits": false, "use_cache": true,
                       "output_scores": true, "early_stopping": "never", "num_return_sequences": 1,
                       "penalty_alpha": 0.6, "do_sample": true, "top_k": 0, "_from_model_config": true}"#;
        assert_eq!(spec(json), "dist");
        let json = r#"{"max_length": 20, "pad_token_id": 0, "num_beams": 1, "penalty_alpha": 0.0}"#;
        assert_eq!(spec(json), "greedy");
    }

    #[test]
    fn the_chain_samples_as_configured() {
        // Greedy after a sequence bias and a suppression: the lowest id among the maxima.
        let c = GenerationConfig::from_json(r#"{"suppress_tokens": [3], "sequence_bias": [[[1], 1.0]]}"#).unwrap();
        let mut chain = c.to_chain(4, RngConfig::philox(0)).unwrap();
        assert_eq!(chain.sample(&[2.0f32, 1.0, 0.0, 9.0]).unwrap(), 0);
        // Under a llama.cpp context the chain is still built under the transformers convention.
        let ctx = BuildContext::new(4, RngConfig::philox(0));
        assert_eq!(c.build_chain(&ctx).unwrap().stages()[0].convention(), Convention::Transformers);
    }
}
