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
//! | `response_format` | `json_schema` | `{"type": "text"}` (no constraint), `{"type": "json_object"}` (any JSON object, or `"schema": {…}`), `{"type": "json_schema", "json_schema": {"schema": {…}}}` |
//!
//! The shared fields (`temperature` … `seed`) are parsed by [`llama_server`](super::llama_server)
//! under the same names. As in llama.cpp's server, `logprobs: true` asks for `top_logprobs`
//! alternatives (20 when `top_logprobs` is absent), and an explicit `n_probs` wins over both.
//! OpenAI's `frequency_penalty`/`presence_penalty` act through llama.cpp's `penalties` stage
//! over its `repeat_last_n` window (64 tokens by default), not over the whole text.
//!
//! `response_format` becomes a JSON schema as llama.cpp's server turns it into one
//! (`oaicompat_chat_params_parse`): `json_object` is the schema `{}` (any JSON object, the
//! converter's reading of an empty schema) unless it carries a `schema`; `json_schema` is its
//! `json_schema.schema` (`{}` when absent); `text` or no `type` is no constraint. Where llama.cpp
//! lets one source override another, tokensieve refuses the body instead: `response_format`
//! with a JSON type together with `json_schema` or `grammar` is an error naming the field.

use super::llama_server::{int_field, schema_object, type_name};
use super::SamplingParams;
use crate::error::{Error, Result};
use serde_json::{Map, Value};

/// The OpenAI-only fields read by this module.
pub const FIELDS: &[&str] = &["logprobs", "top_logprobs", "n", "response_format"];

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
        // Read by `resolve_response_format`, once every field is known.
        "response_format" => {}
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

/// After every field is read: turns `response_format` into `json_schema`, and refuses a body
/// that gives two constraints (`grammar`, `json_schema`, a JSON `response_format`).
pub(crate) fn resolve_response_format(p: &mut SamplingParams, body: &Map<String, Value>) -> Result<()> {
    let from_format = match body.get("response_format").filter(|v| !v.is_null()) {
        Some(v) => response_format(v)?,
        None => None,
    };
    let schema_field = if let Some(schema) = from_format {
        if p.json_schema.is_some() {
            return Err(Error::field(
                "response_format",
                "gives a JSON schema and so does `json_schema`: give the schema once",
            ));
        }
        p.json_schema = Some(schema);
        "response_format"
    } else {
        "json_schema"
    };
    if p.grammar.is_some() && p.json_schema.is_some() {
        return Err(Error::field(
            "grammar",
            format!("cannot be combined with `{schema_field}`: give either a grammar or a JSON schema, not both"),
        ));
    }
    Ok(())
}

/// The JSON schema a `response_format` stands for (`None`: plain text).
fn response_format(v: &Value) -> Result<Option<Value>> {
    let Value::Object(format) = v else {
        return Err(Error::field(
            "response_format",
            format!("must be an object such as {{\"type\": \"json_object\"}}, got {}", type_name(v)),
        ));
    };
    let given = |o: &Map<String, Value>, k: &str| o.get(k).filter(|v| !v.is_null()).cloned();
    let ty = match format.get("type") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(t)) => t.clone(),
        Some(t) => return Err(Error::field("response_format.type", format!("must be a string, got {}", type_name(t)))),
    };
    let any_object = || Value::Object(Map::new());
    match ty.as_str() {
        "" | "text" => Ok(None),
        "json_object" => match given(format, "schema") {
            Some(schema) => schema_object("response_format.schema", &schema).map(Some),
            None => Ok(Some(any_object())),
        },
        "json_schema" => match given(format, "json_schema") {
            None => Ok(Some(any_object())),
            Some(Value::Object(wrapper)) => match given(&wrapper, "schema") {
                Some(schema) => schema_object("response_format.json_schema.schema", &schema).map(Some),
                None => Ok(Some(any_object())),
            },
            Some(w) => Err(Error::field(
                "response_format.json_schema",
                format!("must be an object {{\"name\": …, \"schema\": {{…}}}}, got {}", type_name(&w)),
            )),
        },
        other => Err(Error::field(
            "response_format.type",
            format!("must be \"text\", \"json_object\" or \"json_schema\", got \"{other}\""),
        )),
    }
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
    fn response_format_becomes_a_json_schema_as_in_llama_cpp() {
        let schema = |body: &str| parse(body).unwrap().json_schema;
        assert_eq!(schema(r#"{"response_format": {"type": "text"}}"#), None);
        assert_eq!(schema(r#"{"response_format": {}}"#), None);
        assert_eq!(schema(r#"{"response_format": {"type": "json_object"}}"#), Some(serde_json::json!({})));
        assert_eq!(
            schema(r#"{"response_format": {"type": "json_object", "schema": {"type": "array"}}}"#),
            Some(serde_json::json!({"type": "array"}))
        );
        assert_eq!(
            schema(
                r#"{"response_format": {"type": "json_schema", "json_schema":
                    {"name": "x", "strict": true, "schema": {"type": "object", "required": ["a"]}}}}"#
            ),
            Some(serde_json::json!({"type": "object", "required": ["a"]}))
        );
        assert_eq!(
            schema(r#"{"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}"#),
            Some(serde_json::json!({}))
        );
        // A text response_format beside a grammar is fine; the grammar stays.
        let p = parse(r#"{"response_format": {"type": "text"}, "grammar": "root ::= \"a\""}"#).unwrap();
        assert!(p.grammar.is_some() && p.json_schema.is_none());
    }

    #[test]
    fn response_format_errors_name_the_field() {
        for (body, needle) in [
            (r#"{"response_format": "json"}"#, "field `response_format`: must be an object"),
            (
                r#"{"response_format": {"type": "yaml"}}"#,
                "field `response_format.type`: must be \"text\", \"json_object\" or \"json_schema\", got \"yaml\"",
            ),
            (r#"{"response_format": {"type": 1}}"#, "field `response_format.type`: must be a string"),
            (
                r#"{"response_format": {"type": "json_object", "schema": []}}"#,
                "field `response_format.schema`: must be a JSON schema (an object)",
            ),
            (
                r#"{"response_format": {"type": "json_schema", "json_schema": "s"}}"#,
                "field `response_format.json_schema`: must be an object",
            ),
            (
                r#"{"response_format": {"type": "json_schema", "json_schema": {"schema": 3}}}"#,
                "field `response_format.json_schema.schema`: must be a JSON schema (an object), got a number",
            ),
            (
                r#"{"response_format": {"type": "json_object"}, "json_schema": {}}"#,
                "field `response_format`: gives a JSON schema and so does `json_schema`",
            ),
            (
                r#"{"response_format": {"type": "json_object"}, "grammar": "root ::= \"a\""}"#,
                "field `grammar`: cannot be combined with `response_format`",
            ),
        ] {
            let e = parse(body).unwrap_err().to_string();
            assert!(e.contains(needle), "{body}: {e}");
        }
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
