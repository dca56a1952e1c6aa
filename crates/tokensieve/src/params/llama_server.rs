//! llama.cpp server request fields (`tools/server`, `params_from_json_cmpl`), read into
//! [`SamplingParams`]. Use [`SamplingParams::from_json`], which also reads the OpenAI fields.
//!
//! | field | `SamplingParams` | accepted values |
//! |---|---|---|
//! | `temperature` | `temp` | number |
//! | `dynatemp_range`, `dynatemp_exponent` | same names | number |
//! | `top_k` | `top_k` | integer (`<= 0` = off) |
//! | `top_p`, `min_p`, `top_n_sigma` | same names | number |
//! | `typical_p` | `typ_p` | number |
//! | `xtc_probability`, `xtc_threshold` | same names | number |
//! | `repeat_penalty` | `penalty_repeat` | number |
//! | `repeat_last_n` | `penalty_last_n` | integer `>= -1` (`-1` = context size) |
//! | `frequency_penalty`, `presence_penalty` | `penalty_freq`, `penalty_present` | number |
//! | `dry_multiplier`, `dry_allowed_length` | same names | number, integer `>= 0` |
//! | `dry_base` | `dry_base` | number; `< 1` is replaced by the default 1.75, as the server does |
//! | `dry_penalty_last_n` | same name | integer `>= -1` (`-1` = context size) |
//! | `dry_sequence_breakers` | same name | non-empty array of strings |
//! | `mirostat` | `mirostat` | 0, 1 or 2 |
//! | `mirostat_tau`, `mirostat_eta` | same names | number |
//! | `n_probs`, `min_keep` | same names | integer `>= 0` |
//! | `post_sampling_probs` | same name | boolean |
//! | `samplers` | `samplers` | array of names (aliases accepted) or a string of letters (`"edskypmxt"`) |
//! | `seed` | `seed` | integer `>= 0`; `-1` and `4294967295` (llama.cpp's "random") mean no seed |
//! | `logit_bias` | `logit_bias` | `[[id, bias], …]` or `{"id": bias, …}`; bias a number or `false` (ban) |
//! | `grammar` | `grammar` | a GBNF string (`""` = no grammar) |
//! | `json_schema` | `json_schema` | a JSON schema object (`{}` = any JSON object, as in llama.cpp) |
//! | `grammar_lazy` | `grammar_lazy` | boolean: the grammar waits for a trigger |
//! | `grammar_triggers` | `grammar_triggers` | `[{"type": 0-3, "value": "…", "token": id}]` (token, word, pattern, pattern_full) |
//!
//! `grammar` and `json_schema` (or OpenAI's `response_format`, see [`openai`](super::openai)),
//! and the lazy-grammar fields, are only carried: this crate knows no grammar. The caller compiles them (the
//! `tokensieve-grammar` crate) and puts the constraint in front of the chain with
//! [`Chain::with_constraint`](crate::Chain::with_constraint); `tokensieve sample` and
//! `tokensieve generate` do. Giving both is an error, as in llama.cpp's server.
//!
//! Numbers are read as JSON doubles and rounded to f32, as the server does. Where the server
//! would silently ignore something (a wrong type, an unknown sampler name, a malformed or
//! out-of-vocabulary logit-bias entry), tokensieve returns an error naming the field, so a
//! request never runs with parameters other than those written. Logit-bias keys that are token
//! *text* need a vocabulary and are an error. In the object form, numeric biases must lie in
//! [-100, 100] (OpenAI's range); the array form takes any number.
//!
//! Fields that do not change how one token is sampled from given logits ([`IGNORED_FIELDS`]:
//! `prompt`, `messages`, `stream`, `n_predict`, `stop`, …) are accepted and ignored. Sampling
//! features tokensieve does not have ([`UNSUPPORTED_FIELDS`]: `preserved_tokens`,
//! `ignore_eos`, …) are accepted only with their "off" value. Anything else
//! is an error.

use super::{GrammarTrigger, LogitBias, Mirostat, SamplerType, SamplingParams};
use crate::error::{Error, Result};
use serde_json::Value;

/// The sampling fields read by this module (shared ones included: `temperature`, `top_p`,
/// `frequency_penalty`, `presence_penalty`, `seed`, `logit_bias`).
pub const FIELDS: &[&str] = &[
    "temperature",
    "dynatemp_range",
    "dynatemp_exponent",
    "top_k",
    "top_p",
    "min_p",
    "top_n_sigma",
    "typical_p",
    "xtc_probability",
    "xtc_threshold",
    "repeat_penalty",
    "repeat_last_n",
    "frequency_penalty",
    "presence_penalty",
    "dry_multiplier",
    "dry_base",
    "dry_allowed_length",
    "dry_penalty_last_n",
    "dry_sequence_breakers",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
    "n_probs",
    "min_keep",
    "post_sampling_probs",
    "samplers",
    "seed",
    "logit_bias",
    "grammar",
    "json_schema",
];

/// Request fields (llama.cpp server or OpenAI) that do not affect sampling one token from given
/// logits; accepted and ignored.
pub const IGNORED_FIELDS: &[&str] = &[
    "model",
    "prompt",
    "messages",
    "suffix",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "n_predict",
    "n_keep",
    "n_discard",
    "n_indent",
    "stop",
    "user",
    "cache_prompt",
    "id_slot",
    "t_max_predict_ms",
    "timings_per_token",
    "return_tokens",
    "return_progress",
    "response_fields",
    "adaptive_decay",
];

/// Sampling features of llama.cpp's server or OpenAI that tokensieve does not have: accepted
/// only with the value that turns them off (`preserved_tokens: []`, `ignore_eos: false`, a
/// negative `adaptive_target`, `backend_sampling: false`), an error otherwise.
pub const UNSUPPORTED_FIELDS: &[&str] = &["preserved_tokens", "ignore_eos", "adaptive_target", "backend_sampling"];

/// For a field of [`UNSUPPORTED_FIELDS`]: whether `v` is its "off" value.
pub(crate) fn is_off(key: &str, v: &Value) -> bool {
    match key {
        "ignore_eos" | "backend_sampling" => v == &Value::Bool(false),
        "preserved_tokens" => v.as_array().is_some_and(Vec::is_empty),
        "adaptive_target" => v.as_f64().is_some_and(|x| x < 0.0),
        _ => false,
    }
}

/// JSON type name for error messages.
pub(crate) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A number rounded to f32 (double first, as nlohmann's `get<float>` does).
pub(crate) fn f32_field(key: &str, v: &Value) -> Result<f32> {
    let x = v.as_f64().ok_or_else(|| Error::field(key, format!("must be a number, got {}", type_name(v))))?;
    let f = x as f32;
    if f.is_finite() {
        Ok(f)
    } else {
        Err(Error::field(key, format!("{v} is out of range for a 32-bit float")))
    }
}

/// An integer in `min..=max`.
pub(crate) fn int_field(key: &str, v: &Value, min: i64, max: i64) -> Result<i64> {
    let x = match v {
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(x), _) => x,
            (None, Some(_)) => i64::MAX,
            (None, None) => return Err(Error::field(key, format!("must be an integer, got {n}"))),
        },
        _ => return Err(Error::field(key, format!("must be an integer, got {}", type_name(v)))),
    };
    if x < min || x > max {
        let range = if max != i32::MAX as i64 && max != i64::MAX {
            format!("in {min}..={max}")
        } else if min == i32::MIN as i64 {
            "that fits in 32 bits".to_string()
        } else {
            format!(">= {min}")
        };
        return Err(Error::field(key, format!("must be an integer {range}, got {v}")));
    }
    Ok(x)
}

fn i32_field(key: &str, v: &Value, min: i32) -> Result<i32> {
    Ok(int_field(key, v, min as i64, i32::MAX as i64)? as i32)
}

/// A boolean.
pub(crate) fn bool_field(key: &str, v: &Value) -> Result<bool> {
    v.as_bool().ok_or_else(|| Error::field(key, format!("must be true or false, got {}", type_name(v))))
}

/// Sets `key` from `value` if it is one of [`FIELDS`]; `Ok(false)` for other keys.
pub(crate) fn set_field(p: &mut SamplingParams, key: &str, v: &Value) -> Result<bool> {
    match key {
        "temperature" => p.temp = f32_field(key, v)?,
        "dynatemp_range" => p.dynatemp_range = f32_field(key, v)?,
        "dynatemp_exponent" => p.dynatemp_exponent = f32_field(key, v)?,
        "top_k" => p.top_k = i32_field(key, v, i32::MIN)?,
        "top_p" => p.top_p = f32_field(key, v)?,
        "min_p" => p.min_p = f32_field(key, v)?,
        "top_n_sigma" => p.top_n_sigma = f32_field(key, v)?,
        "typical_p" => p.typ_p = f32_field(key, v)?,
        "xtc_probability" => p.xtc_probability = f32_field(key, v)?,
        "xtc_threshold" => p.xtc_threshold = f32_field(key, v)?,
        "repeat_penalty" => p.penalty_repeat = f32_field(key, v)?,
        "repeat_last_n" => p.penalty_last_n = i32_field(key, v, -1)?,
        "frequency_penalty" => p.penalty_freq = f32_field(key, v)?,
        "presence_penalty" => p.penalty_present = f32_field(key, v)?,
        "dry_multiplier" => p.dry_multiplier = f32_field(key, v)?,
        "dry_base" => {
            // The server replaces a base below 1 (which would make DRY inert) by its default.
            let base = f32_field(key, v)?;
            p.dry_base = if base < 1.0 { SamplingParams::default().dry_base } else { base };
        }
        "dry_allowed_length" => p.dry_allowed_length = i32_field(key, v, 0)?,
        "dry_penalty_last_n" => p.dry_penalty_last_n = i32_field(key, v, -1)?,
        "dry_sequence_breakers" => p.dry_sequence_breakers = breakers(v)?,
        "mirostat" => {
            p.mirostat = match int_field(key, v, 0, 2)? {
                0 => Mirostat::Off,
                1 => Mirostat::V1,
                _ => Mirostat::V2,
            }
        }
        "mirostat_tau" => p.mirostat_tau = f32_field(key, v)?,
        "mirostat_eta" => p.mirostat_eta = f32_field(key, v)?,
        "n_probs" => p.n_probs = i32_field(key, v, 0)?,
        "min_keep" => p.min_keep = i32_field(key, v, 0)?,
        "post_sampling_probs" => p.post_sampling_probs = bool_field(key, v)?,
        "samplers" => p.samplers = samplers(v)?,
        "seed" => p.seed = seed(v)?,
        "logit_bias" => p.logit_bias = logit_bias(v)?,
        "grammar" => match v {
            Value::String(g) => p.grammar = Some(g.clone()).filter(|g| !g.is_empty()),
            _ => return Err(Error::field(key, format!("must be a GBNF grammar (a string), got {}", type_name(v)))),
        },
        "json_schema" => p.json_schema = Some(schema_object(key, v)?),
        "grammar_lazy" => p.grammar_lazy = bool_field(key, v)?,
        "grammar_triggers" => p.grammar_triggers = grammar_triggers(v)?,
        _ => return Ok(false),
    }
    Ok(true)
}

/// `grammar_triggers`: `[{"type": 0..=3, "value": "…", "token": id}, …]` (`token` only, and
/// required, for type 0).
fn grammar_triggers(v: &Value) -> Result<Vec<GrammarTrigger>> {
    const KEY: &str = "grammar_triggers";
    let Value::Array(items) = v else {
        return Err(Error::field(KEY, format!("must be an array of triggers, got {}", type_name(v))));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let bad = |what: String| Error::field(KEY, format!("trigger {i}: {what}"));
            let Value::Object(t) = t else {
                return Err(bad(format!("must be an object {{\"type\", \"value\"}}, got {}", type_name(t))));
            };
            let value = match t.get("value") {
                Some(Value::String(s)) => s.clone(),
                Some(other) => return Err(bad(format!("`value` must be a string, got {}", type_name(other)))),
                None => return Err(bad("`value` is missing".into())),
            };
            match t.get("type").and_then(Value::as_u64) {
                Some(0) => match t.get("token").and_then(Value::as_u64).and_then(|x| u32::try_from(x).ok()) {
                    Some(token) => Ok(GrammarTrigger::Token(token)),
                    None => Err(bad("a token trigger (type 0) needs `token`, a token id".into())),
                },
                Some(1) => Ok(GrammarTrigger::Word(value)),
                Some(2) => Ok(GrammarTrigger::Pattern(value)),
                Some(3) => Ok(GrammarTrigger::PatternFull(value)),
                _ => Err(bad(format!(
                    "`type` must be 0 (token), 1 (word), 2 (pattern) or 3 (pattern_full), got {}",
                    t.get("type").map_or("nothing".to_string(), |x| x.to_string())
                ))),
            }
        })
        .collect()
}

/// A JSON schema: an object (`{}` is llama.cpp's "any JSON object").
pub(crate) fn schema_object(key: &str, v: &Value) -> Result<Value> {
    match v {
        Value::Object(_) => Ok(v.clone()),
        _ => Err(Error::field(key, format!("must be a JSON schema (an object), got {}", type_name(v)))),
    }
}

fn breakers(v: &Value) -> Result<Vec<String>> {
    const MSG: &str = "must be a non-empty array of strings";
    let arr = v.as_array().filter(|a| !a.is_empty()).ok_or_else(|| Error::field("dry_sequence_breakers", MSG))?;
    arr.iter()
        .enumerate()
        .map(|(i, s)| {
            s.as_str().map(String::from).ok_or_else(|| {
                Error::field(format!("dry_sequence_breakers[{i}]"), format!("must be a string, got {}", type_name(s)))
            })
        })
        .collect()
}

fn samplers(v: &Value) -> Result<Vec<SamplerType>> {
    match v {
        Value::String(letters) => SamplerType::parse_letters(letters),
        Value::Array(names) => names
            .iter()
            .enumerate()
            .map(|(i, n)| match n.as_str() {
                Some(name) => SamplerType::from_name(name),
                None => Err(Error::field(format!("samplers[{i}]"), format!("must be a string, got {}", type_name(n)))),
            })
            .collect(),
        _ => Err(Error::field(
            "samplers",
            format!("must be an array of sampler names or a string of sampler letters, got {}", type_name(v)),
        )),
    }
}

fn seed(v: &Value) -> Result<Option<u64>> {
    const MSG: &str = "must be an integer >= 0 (or -1, llama.cpp's random seed)";
    match v {
        Value::Number(n) => {
            if let Some(s) = n.as_u64() {
                // llama.cpp's LLAMA_DEFAULT_SEED: "pick a random seed".
                return Ok(if s == u32::MAX as u64 { None } else { Some(s) });
            }
            match n.as_i64() {
                Some(-1) => Ok(None),
                _ => Err(Error::field("seed", format!("{MSG}, got {n}"))),
            }
        }
        _ => Err(Error::field("seed", format!("{MSG}, got {}", type_name(v)))),
    }
}

/// A bias: a number, or `false` for `-inf`. `range` bounds numeric biases.
fn bias(key: &str, v: &Value, range: Option<f32>) -> Result<f32> {
    match v {
        Value::Bool(false) => Ok(f32::NEG_INFINITY),
        Value::Number(_) => {
            let b = f32_field(key, v)?;
            match range {
                Some(r) if !(-r..=r).contains(&b) => Err(Error::field(key, format!("must be in [-{r}, {r}], got {v}"))),
                _ => Ok(b),
            }
        }
        _ => Err(Error::field(key, format!("must be a number or false (ban), got {}", type_name(v)))),
    }
}

fn token_id(key: &str, v: &Value) -> Result<u32> {
    match v {
        Value::String(_) => Err(Error::field(
            key,
            "token text needs a vocabulary, which tokensieve does not have here; give the token id",
        )),
        Value::Number(n) => match n.as_u64().and_then(|t| u32::try_from(t).ok()) {
            Some(t) => Ok(t),
            None => Err(Error::field(key, format!("must be a token id (an integer in 0..=4294967295), got {n}"))),
        },
        _ => Err(Error::field(key, format!("must be a token id, got {}", type_name(v)))),
    }
}

fn logit_bias(v: &Value) -> Result<Vec<LogitBias>> {
    match v {
        Value::Array(entries) => entries
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let key = format!("logit_bias[{i}]");
                match e.as_array().map(Vec::as_slice) {
                    Some([id, b]) => Ok(LogitBias { token: token_id(&key, id)?, bias: bias(&key, b, None)? }),
                    _ => Err(Error::field(key, format!("must be a pair [token id, bias], got {e}"))),
                }
            })
            .collect(),
        Value::Object(map) => map
            .iter()
            .map(|(id, b)| {
                let key = format!("logit_bias.{id}");
                let token = match id.trim().parse::<i64>() {
                    Ok(t) => token_id(&key, &Value::from(t))?,
                    Err(_) => token_id(&key, &Value::String(id.clone()))?,
                };
                Ok(LogitBias { token, bias: bias(&key, b, Some(100.0))? })
            })
            .collect(),
        _ => Err(Error::field(
            "logit_bias",
            format!("must be an array of [token id, bias] pairs or an object {{\"id\": bias}}, got {}", type_name(v)),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<SamplingParams> {
        SamplingParams::from_json(body)
    }

    fn err(body: &str) -> String {
        parse(body).unwrap_err().to_string()
    }

    #[test]
    fn every_field_lands_where_llama_cpp_puts_it() {
        let p = parse(
            r#"{"temperature": 0.7, "top_k": 20, "top_p": 0.9, "min_p": 0.1, "typical_p": 0.8,
                "repeat_penalty": 1.1, "repeat_last_n": 32, "presence_penalty": 0.3,
                "frequency_penalty": 0.2, "mirostat": 2, "mirostat_tau": 4.5, "mirostat_eta": 0.2,
                "dry_multiplier": 0.8, "dry_base": 2, "dry_allowed_length": 3, "dry_penalty_last_n": 128,
                "dry_sequence_breakers": ["\n", "--"], "xtc_probability": 0.5, "xtc_threshold": 0.2,
                "top_n_sigma": 1.5, "dynatemp_range": 0.3, "dynatemp_exponent": 1.2, "n_probs": 5,
                "min_keep": 2, "samplers": ["top_k", "temperature"], "seed": 42,
                "logit_bias": [[15, 1.5], [7, false]], "post_sampling_probs": true}"#,
        )
        .unwrap();
        let want = SamplingParams {
            temp: 0.7,
            top_k: 20,
            top_p: 0.9,
            min_p: 0.1,
            typ_p: 0.8,
            penalty_repeat: 1.1,
            penalty_last_n: 32,
            penalty_present: 0.3,
            penalty_freq: 0.2,
            mirostat: Mirostat::V2,
            mirostat_tau: 4.5,
            mirostat_eta: 0.2,
            dry_multiplier: 0.8,
            dry_base: 2.0,
            dry_allowed_length: 3,
            dry_penalty_last_n: 128,
            dry_sequence_breakers: vec!["\n".into(), "--".into()],
            xtc_probability: 0.5,
            xtc_threshold: 0.2,
            top_n_sigma: 1.5,
            dynatemp_range: 0.3,
            dynatemp_exponent: 1.2,
            n_probs: 5,
            min_keep: 2,
            samplers: vec![SamplerType::TopK, SamplerType::Temperature],
            seed: Some(42),
            logit_bias: vec![LogitBias { token: 15, bias: 1.5 }, LogitBias { token: 7, bias: f32::NEG_INFINITY }],
            post_sampling_probs: true,
            ..Default::default()
        };
        assert_eq!(p, want);
        assert_eq!(p.logprobs_mode(), crate::LogprobsMode::Processed);
        assert_eq!(p.top_n_logprobs(), 5);
    }

    #[test]
    fn floats_are_rounded_from_doubles_like_nlohmann() {
        let p = parse(r#"{"temperature": 0.8, "top_p": 1e-3, "min_p": 1}"#).unwrap();
        assert_eq!(p.temp.to_bits(), (0.8f64 as f32).to_bits());
        assert_eq!(p.top_p, 0.001f64 as f32);
        assert_eq!(p.min_p, 1.0);
    }

    #[test]
    fn null_means_not_given() {
        assert_eq!(parse(r#"{"top_k": null, "seed": null, "logit_bias": null}"#).unwrap(), SamplingParams::default());
    }

    #[test]
    fn samplers_by_letters_and_aliases() {
        let p = parse(r#"{"samplers": "kt"}"#).unwrap();
        assert_eq!(p.samplers, [SamplerType::TopK, SamplerType::Temperature]);
        let p = parse(r#"{"samplers": ["top-k", "nucleus", "typical", "temp"]}"#).unwrap();
        assert_eq!(p.samplers, [SamplerType::TopK, SamplerType::TopP, SamplerType::TypicalP, SamplerType::Temperature]);
        assert_eq!(parse(r#"{"samplers": []}"#).unwrap().chain_spec().unwrap(), "dist");
    }

    #[test]
    fn seeds() {
        assert_eq!(parse(r#"{"seed": 0}"#).unwrap().seed, Some(0));
        assert_eq!(parse(r#"{"seed": -1}"#).unwrap().seed, None);
        assert_eq!(parse(r#"{"seed": 4294967295}"#).unwrap().seed, None);
        assert_eq!(parse(r#"{"seed": 4294967296}"#).unwrap().seed, Some(1 << 32));
        assert_eq!(parse(r#"{"seed": 18446744073709551615}"#).unwrap().seed, Some(u64::MAX));
    }

    #[test]
    fn logit_bias_forms() {
        let p = parse(r#"{"logit_bias": {"15": -100, "7": false, " 3": 2.5}}"#).unwrap();
        let mut got: Vec<(u32, f32)> = p.logit_bias.iter().map(|b| (b.token, b.bias)).collect();
        got.sort_by_key(|g| g.0);
        assert_eq!(got, [(3, 2.5), (7, f32::NEG_INFINITY), (15, -100.0)]);
        let p = parse(r#"{"logit_bias": [[2, -300], [2, 1]]}"#).unwrap();
        assert_eq!(p.logit_bias, [LogitBias { token: 2, bias: -300.0 }, LogitBias { token: 2, bias: 1.0 }]);
        assert!(parse(r#"{"logit_bias": []}"#).unwrap().logit_bias.is_empty());
        assert_eq!(
            parse(r#"{"logit_bias": {"1": 1}}"#).unwrap().chain_spec().unwrap().split(';').next(),
            Some("logit_bias(1:1)")
        );
    }

    #[test]
    fn dry_base_below_one_takes_the_default_as_the_server_does() {
        assert_eq!(parse(r#"{"dry_base": 0.5}"#).unwrap().dry_base, 1.75);
    }

    #[test]
    fn ignored_and_unsupported_fields() {
        let p = parse(r#"{"prompt": "hi", "n_predict": 8, "stream": true, "stop": ["\n"], "model": "x"}"#).unwrap();
        assert_eq!(p, SamplingParams::default());
        assert!(parse(r#"{"grammar_lazy": false, "ignore_eos": false, "adaptive_target": -1}"#).is_ok());
        let e = err(r#"{"ignore_eos": true}"#);
        assert!(e.contains("`ignore_eos`") && e.contains("not supported"), "{e}");
        assert!(err(r#"{"ignore_eos": true}"#).contains("`ignore_eos`"));
    }

    #[test]
    fn lazy_grammar_triggers_are_carried_and_checked() {
        let p = parse(
            r#"{"grammar": "root ::= \"x\"", "grammar_lazy": true, "grammar_triggers": [
                {"type": 0, "value": "<tool>", "token": 7}, {"type": 1, "value": "<call>"},
                {"type": 2, "value": "a(b)"}, {"type": 3, "value": "x.*"}]}"#,
        )
        .unwrap();
        assert!(p.grammar_lazy);
        assert_eq!(
            p.grammar_triggers,
            [
                GrammarTrigger::Token(7),
                GrammarTrigger::Word("<call>".into()),
                GrammarTrigger::Pattern("a(b)".into()),
                GrammarTrigger::PatternFull("x.*".into())
            ]
        );
        assert!(!parse("{}").unwrap().grammar_lazy);
        for (body, needle) in [
            (r#"{"grammar_triggers": {}}"#, "must be an array"),
            (r#"{"grammar_triggers": [3]}"#, "trigger 0: must be an object"),
            (r#"{"grammar_triggers": [{"type": 1}]}"#, "`value` is missing"),
            (r#"{"grammar_triggers": [{"type": 1, "value": 2}]}"#, "`value` must be a string"),
            (r#"{"grammar_triggers": [{"type": 0, "value": "t"}]}"#, "needs `token`"),
            (r#"{"grammar_triggers": [{"type": 9, "value": "t"}]}"#, "got 9"),
            (r#"{"grammar_triggers": [{"value": "t"}]}"#, "got nothing"),
            (r#"{"grammar_lazy": 1}"#, "`grammar_lazy`"),
        ] {
            let e = err(body);
            assert!(e.contains(needle) && e.contains("grammar_"), "{body}: {e}");
        }
    }

    #[test]
    fn grammar_and_json_schema_are_carried() {
        let p = parse(r#"{"grammar": "root ::= \"a\""}"#).unwrap();
        assert_eq!(p.grammar.as_deref(), Some("root ::= \"a\""));
        assert!(p.is_constrained() && p.json_schema.is_none());
        let p = parse(r#"{"json_schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}"#).unwrap();
        assert_eq!(p.json_schema.as_ref().unwrap()["properties"]["a"]["type"], "integer");
        assert!(p.grammar.is_none());
        // llama.cpp's converter reads `{}` as "any JSON object": a constraint, not "off".
        assert_eq!(parse(r#"{"json_schema": {}}"#).unwrap().json_schema, Some(serde_json::json!({})));
        for off in [r#"{"grammar": ""}"#, r#"{"grammar": null, "json_schema": null}"#] {
            assert!(!parse(off).unwrap().is_constrained(), "{off}");
        }
        // Neither changes the chain.
        assert_eq!(
            parse(r#"{"grammar": "root ::= \"a\""}"#).unwrap().chain_spec().unwrap(),
            parse("{}").unwrap().chain_spec().unwrap()
        );
        for (body, needle) in [
            (r#"{"grammar": 1}"#, "field `grammar`: must be a GBNF grammar (a string), got a number"),
            (r#"{"grammar": ["root ::= \"a\""]}"#, "field `grammar`: must be a GBNF grammar (a string), got an array"),
            (r#"{"json_schema": "{}"}"#, "field `json_schema`: must be a JSON schema (an object), got a string"),
            (r#"{"json_schema": true}"#, "field `json_schema`: must be a JSON schema (an object), got a boolean"),
            (
                r#"{"grammar": "root ::= \"a\"", "json_schema": {}}"#,
                "field `grammar`: cannot be combined with `json_schema`",
            ),
        ] {
            assert!(err(body).contains(needle), "{body}: {}", err(body));
        }
    }

    #[test]
    fn each_error_names_its_field() {
        for (body, needle) in [
            (r#"{"temperature": "hot"}"#, "field `temperature`: must be a number, got a string"),
            (r#"{"top_k": 4.5}"#, "field `top_k`: must be an integer"),
            (r#"{"top_k": 3000000000}"#, "field `top_k`"),
            (r#"{"top_p": 1e300}"#, "field `top_p`: 1e+300 is out of range for a 32-bit float"),
            (r#"{"repeat_last_n": -2}"#, "field `repeat_last_n`: must be an integer >= -1"),
            (r#"{"dry_penalty_last_n": -5}"#, "field `dry_penalty_last_n`"),
            (r#"{"mirostat": 3}"#, "field `mirostat`: must be an integer in 0..=2"),
            (r#"{"n_probs": -1}"#, "field `n_probs`"),
            (r#"{"min_keep": -1}"#, "field `min_keep`"),
            (r#"{"post_sampling_probs": 1}"#, "field `post_sampling_probs`: must be true or false"),
            (r#"{"dry_sequence_breakers": []}"#, "field `dry_sequence_breakers`: must be a non-empty array"),
            (r#"{"dry_sequence_breakers": ["a", 1]}"#, "field `dry_sequence_breakers[1]`"),
            (r#"{"samplers": ["top_k", "tfs_z"]}"#, "field `samplers`: unknown sampler name `tfs_z`"),
            (r#"{"samplers": ["top_k", 3]}"#, "field `samplers[1]`"),
            (r#"{"samplers": "kq"}"#, "unknown sampler letter `q`"),
            (r#"{"samplers": 5}"#, "field `samplers`"),
            (r#"{"seed": -2}"#, "field `seed`"),
            (r#"{"seed": 1.5}"#, "field `seed`"),
            (r#"{"logit_bias": [[1]]}"#, "field `logit_bias[0]`: must be a pair"),
            (r#"{"logit_bias": [[1, 2], [-1, 2]]}"#, "field `logit_bias[1]`: must be a token id"),
            (r#"{"logit_bias": [[1.5, 2]]}"#, "field `logit_bias[0]`: must be a token id"),
            (r#"{"logit_bias": {"-3": 2}}"#, "field `logit_bias.-3`: must be a token id"),
            (r#"{"logit_bias": [[1, true]]}"#, "field `logit_bias[0]`: must be a number or false"),
            (r#"{"logit_bias": [["hello", 1]]}"#, "needs a vocabulary"),
            (r#"{"logit_bias": {"12": 101}}"#, "field `logit_bias.12`: must be in [-100, 100]"),
            (r#"{"logit_bias": {"hello": 1}}"#, "field `logit_bias.hello`: token text needs a vocabulary"),
            (r#"{"logit_bias": 3}"#, "field `logit_bias`"),
            (r#"{"top_q": 1}"#, "field `top_q`: unknown field"),
            (r#"{"temperature": 0.8"#, "not valid JSON"),
            (r#"[1, 2]"#, "must be a JSON object, got an array"),
        ] {
            let e = err(body);
            assert!(e.contains(needle), "{body}: {e}");
        }
    }
}
