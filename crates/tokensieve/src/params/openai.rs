//! OpenAI chat/completions request fields, read into [`SamplingParams`] the way llama.cpp's
//! server reads them (`oaicompat_*_params_parse`). Use [`SamplingParams::from_json`], which
//! accepts OpenAI and llama.cpp fields in one body.
//!
//! | field | `SamplingParams` | accepted values |
//! |---|---|---|
//! | `temperature` | `temp` | number (llama.cpp's range: any; `<= 0` is greedy) |
//! | `top_p` | `top_p` | number |
//! | `frequency_penalty`, `presence_penalty` | `penalty_freq`, `penalty_present` | number |
//! | `logit_bias` | `logit_bias` | `{"token id": bias}`, bias in [-100, 100] (or `false` to ban) |
//! | `seed` | `seed` | integer `>= 0` |
//! | `logprobs` | `logprobs`, `n_probs` | `true`/`false` (chat), or an integer `>= 0` (completions: the number of alternatives) |
//! | `top_logprobs` | `top_logprobs`, `n_probs` | integer in 0..=20; needs `logprobs: true` |
//! | `n` | `n` | integer `>= 1` |
//!
//! The shared fields (`temperature` … `seed`) are parsed by [`llama_server`](super::llama_server)
//! under the same names. As in llama.cpp's server, `logprobs: true` asks for `top_logprobs`
//! alternatives (20 when `top_logprobs` is absent), and an explicit `n_probs` wins over both.
//! OpenAI's `frequency_penalty`/`presence_penalty` act through llama.cpp's `penalties` stage
//! over its `repeat_last_n` window (64 tokens by default), not over the whole text.

use super::llama_server::{int_field, type_name};
use super::SamplingParams;
use crate::error::{Error, Result};
use serde_json::{Map, Value};

/// The OpenAI-only fields read by this module.
pub const FIELDS: &[&str] = &["logprobs", "top_logprobs", "n"];

/// Alternatives reported for `logprobs: true` without `top_logprobs` (llama.cpp's choice).
pub const DEFAULT_TOP_LOGPROBS: u32 = 20;

/// Sets `key` from `value` if it is one of [`FIELDS`]; `Ok(false)` for other keys.
pub(crate) fn set_field(p: &mut SamplingParams, key: &str, v: &Value) -> Result<bool> {
    match key {
        "logprobs" => match v {
            Value::Bool(b) => p.logprobs = *b,
            Value::Number(_) => p.logprobs = int_field(key, v, 0, i32::MAX as i64)? > 0,
            _ => {
                return Err(Error::field(
                    key,
                    format!("must be true, false or a number of alternatives, got {}", type_name(v)),
                ))
            }
        },
        "top_logprobs" => p.top_logprobs = Some(int_field(key, v, 0, 20)? as u32),
        "n" => p.n = int_field(key, v, 1, u32::MAX as i64)? as u32,
        _ => return Ok(false),
    }
    Ok(true)
}

/// After every field is read: turns `logprobs`/`top_logprobs` into `n_probs` unless `n_probs`
/// was given, and rejects `top_logprobs` without `logprobs: true`.
pub(crate) fn resolve_logprobs(p: &mut SamplingParams, body: &Map<String, Value>) -> Result<()> {
    let given = |k: &str| body.get(k).is_some_and(|v| !v.is_null());
    let logprobs = body.get("logprobs").filter(|v| !v.is_null());
    if p.top_logprobs.is_some() && logprobs != Some(&Value::Bool(true)) {
        return Err(Error::field("top_logprobs", "needs `logprobs: true`"));
    }
    if given("n_probs") {
        return Ok(());
    }
    match logprobs {
        Some(Value::Bool(true)) => p.n_probs = p.top_logprobs.unwrap_or(DEFAULT_TOP_LOGPROBS) as i32,
        Some(Value::Number(n)) => p.n_probs = n.as_i64().unwrap_or(0) as i32,
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<SamplingParams> {
        SamplingParams::from_json(body)
    }

    #[test]
    fn an_openai_chat_body() {
        let p = parse(
            r#"{"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.5,
                "top_p": 0.9, "frequency_penalty": 0.5, "presence_penalty": -0.5, "seed": 7,
                "logit_bias": {"50256": -100, "11": 5}, "logprobs": true, "top_logprobs": 3, "n": 2,
                "max_tokens": 16, "stream": false, "user": "u"}"#,
        )
        .unwrap();
        assert_eq!((p.temp, p.top_p, p.penalty_freq, p.penalty_present), (0.5, 0.9, 0.5, -0.5));
        assert_eq!(p.seed, Some(7));
        assert_eq!(p.logit_bias.len(), 2);
        assert!(p.logprobs);
        assert_eq!((p.top_logprobs, p.n_probs, p.n), (Some(3), 3, 2));
        assert_eq!(p.top_n_logprobs(), 3);
        assert!(p.chain_spec().unwrap().starts_with("logit_bias(11:5 50256:-100);penalties(64,1,0.5,-0.5);"));
    }

    #[test]
    fn logprobs_resolution_follows_llama_cpp() {
        assert_eq!(parse(r#"{"logprobs": true}"#).unwrap().n_probs, 20);
        assert_eq!(parse(r#"{"logprobs": false}"#).unwrap().n_probs, 0);
        assert_eq!(parse(r#"{"logprobs": true, "top_logprobs": 0}"#).unwrap().n_probs, 0);
        let p = parse(r#"{"logprobs": 4}"#).unwrap();
        assert_eq!((p.logprobs, p.n_probs), (true, 4));
        assert_eq!(parse(r#"{"logprobs": true, "top_logprobs": 5, "n_probs": 2}"#).unwrap().n_probs, 2);
        assert_eq!(parse(r#"{"logprobs": 4, "n_probs": 1}"#).unwrap().n_probs, 1);
    }

    #[test]
    fn each_error_names_its_field() {
        for (body, needle) in [
            (r#"{"top_logprobs": 3}"#, "field `top_logprobs`: needs `logprobs: true`"),
            (r#"{"logprobs": false, "top_logprobs": 3}"#, "field `top_logprobs`"),
            (r#"{"logprobs": true, "top_logprobs": 21}"#, "field `top_logprobs`: must be an integer in 0..=20"),
            (r#"{"logprobs": "yes"}"#, "field `logprobs`"),
            (r#"{"logprobs": -1}"#, "field `logprobs`"),
            (r#"{"n": 0}"#, "field `n`: must be an integer in 1..="),
            (r#"{"n": "2"}"#, "field `n`: must be an integer, got a string"),
            (r#"{"logit_bias": {"5": -101}}"#, "field `logit_bias.5`: must be in [-100, 100]"),
        ] {
            let e = parse(body).unwrap_err().to_string();
            assert!(e.contains(needle), "{body}: {e}");
        }
    }
}
