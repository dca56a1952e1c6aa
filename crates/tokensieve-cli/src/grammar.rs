//! Grammars for `sample`, `generate` and `grammar`: where the text comes from (a GBNF file, a
//! JSON schema file, a request body), compiling it with errors that point into it, the
//! vocabulary it runs over, and the constraint a chain gets.

use crate::args::{ConstraintArgs, GrammarModeArg};
use crate::error::bad;
use anyhow::Result;
use serde_json::value::RawValue;
use serde_json::Value;
use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use tokensieve::params::{GrammarTrigger, SamplingParams};
use tokensieve::{Chain, ConstraintMode};
use tokensieve_grammar::json_schema::{json_schema_str_to_gbnf, SchemaOptions};
use tokensieve_grammar::vocab::Vocab;
use tokensieve_grammar::{Grammar, GrammarConstraint, GrammarOptions, TokenIndex};

/// What the grammar text is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// GBNF.
    Gbnf,
    /// A JSON schema, converted to GBNF as llama.cpp's server does.
    Schema,
}

/// A grammar's text and where it came from (for messages).
#[derive(Clone, Debug)]
pub struct GrammarSource {
    kind: Kind,
    text: String,
    /// A file name (`FILE:LINE:COL: …` in messages) or a description of a body field.
    origin: String,
    is_file: bool,
    /// A lazy grammar's triggers (a body's `grammar_lazy` and `grammar_triggers`).
    lazy: Option<Vec<GrammarTrigger>>,
}

impl GrammarSource {
    /// A GBNF file (`-`: standard input).
    pub fn gbnf_file(path: &Path) -> Result<Self> {
        let (text, origin) = read_text(path)?;
        Ok(GrammarSource { kind: Kind::Gbnf, text, origin, is_file: true, lazy: None })
    }

    /// A JSON schema file (`-`: standard input).
    pub fn schema_file(path: &Path) -> Result<Self> {
        let (text, origin) = read_text(path)?;
        Ok(GrammarSource { kind: Kind::Schema, text, origin, is_file: true, lazy: None })
    }

    /// The grammar a request body asks for (`body` is its text, `name` its file name), lazy
    /// when it says `grammar_lazy`.
    pub fn from_params(params: &SamplingParams, body: &str, name: &str) -> Option<Self> {
        let lazy = params.grammar_lazy.then(|| params.grammar_triggers.clone());
        if let Some(grammar) = &params.grammar {
            return Some(GrammarSource {
                kind: Kind::Gbnf,
                text: grammar.clone(),
                origin: format!("--params {name}: field `grammar`"),
                is_file: false,
                lazy,
            });
        }
        let schema = params.json_schema.as_ref()?;
        let (text, field) = schema_as_written(body, schema).unwrap_or_else(|| {
            (schema.to_string(), if body_has(body, "json_schema") { "json_schema" } else { "response_format" })
        });
        Some(GrammarSource {
            kind: Kind::Schema,
            text,
            origin: format!("--params {name}: field `{field}`"),
            is_file: false,
            lazy,
        })
    }

    /// Where the grammar came from, for messages.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The GBNF text: the grammar itself, or the schema converted.
    pub fn gbnf(&self) -> Result<std::borrow::Cow<'_, str>> {
        match self.kind {
            Kind::Gbnf => Ok(std::borrow::Cow::Borrowed(&self.text)),
            Kind::Schema => json_schema_str_to_gbnf(&self.text, &SchemaOptions::default())
                .map(std::borrow::Cow::Owned)
                .map_err(|e| bad(format!("{}: {}", self.origin, e))),
        }
    }

    /// Parses and checks the grammar with start symbol `root` (default `root`); `vocab`
    /// resolves `<text>` token references.
    pub fn compile(&self, root: Option<&str>, vocab: Option<&Vocab>) -> Result<Grammar> {
        let gbnf = self.gbnf()?;
        let tokens = vocab.map(|v| v as &dyn tokensieve_grammar::gbnf::TokenLookup);
        Grammar::with_options(&gbnf, GrammarOptions { root, tokens }).map_err(|e| {
            let mut message = e.message().to_string();
            if vocab.is_none() && message.contains("needs a vocabulary") {
                message.push_str(" (give one with --vocab)");
            }
            let origin = match self.kind {
                Kind::Gbnf => self.origin.clone(),
                Kind::Schema => format!("{} (converted to GBNF)", self.origin),
            };
            match e.position() {
                Some((line, column)) if self.is_file && self.kind == Kind::Gbnf => {
                    bad(format!("{origin}:{line}:{column}: {message}"))
                }
                Some((line, column)) => bad(format!("{origin}: line {line}, column {column}: {message}")),
                None => bad(format!("{origin}: {message}")),
            }
        })
    }
}

/// Reads a file, or standard input for `-`; the text and its name for messages.
fn read_text(path: &Path) -> Result<(String, String)> {
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).map_err(|e| bad(format!("cannot read standard input: {e}")))?;
        return Ok((text, "<stdin>".to_string()));
    }
    let text = std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read {}: {e}", path.display())))?;
    Ok((text, path.display().to_string()))
}

fn body_has(body: &str, key: &str) -> bool {
    serde_json::from_str::<HashMap<String, &RawValue>>(body)
        .is_ok_and(|m| m.get(key).is_some_and(|v| v.get() != "null"))
}

/// The body's schema as written (llama.cpp converts properties in document order; a `Value`
/// has sorted them), and the field it came from: whichever of `json_schema`,
/// `response_format.schema` and `response_format.json_schema.schema` holds `schema`.
fn schema_as_written(body: &str, schema: &Value) -> Option<(String, &'static str)> {
    fn fields(text: &str) -> Option<HashMap<String, &RawValue>> {
        serde_json::from_str(text).ok()
    }
    let top = fields(body)?;
    let format = top.get("response_format").and_then(|f| fields(f.get()));
    let wrapper = format.as_ref().and_then(|f| f.get("json_schema")).and_then(|w| fields(w.get()));
    let candidates = [
        (top.get("json_schema").copied(), "json_schema"),
        (format.as_ref().and_then(|f| f.get("schema").copied()), "response_format"),
        (wrapper.as_ref().and_then(|w| w.get("schema").copied()), "response_format"),
    ];
    candidates.into_iter().find_map(|(raw, field)| {
        let raw = raw?;
        (serde_json::from_str::<Value>(raw.get()).ok().as_ref() == Some(schema)).then(|| (raw.get().to_string(), field))
    })
}

/// Reads a vocabulary (GGUF, or a Hugging Face tokenizer.json) given to `flag`.
pub fn load_vocab(path: &Path, flag: &str) -> Result<Vocab> {
    Vocab::from_file(path).map_err(|e| bad(format!("{flag} {}: {}", path.display(), e)))
}

/// A compiled grammar over a vocabulary, ready to constrain chains.
pub struct Constrained {
    constraint: GrammarConstraint,
    mode: ConstraintMode,
    /// The vocabulary's end-of-generation tokens (`generate` stops at them).
    #[cfg_attr(not(feature = "model"), allow(dead_code))]
    eog: Vec<u32>,
}

impl Constrained {
    /// `source` over `vocab`, which must have exactly `n_vocab` tokens (the logits' size),
    /// starting at the rule `args.grammar_root`, in `args.grammar_mode`. `vocab_name` names the
    /// vocabulary in messages.
    pub fn new(
        source: &GrammarSource,
        vocab: &Vocab,
        vocab_name: &str,
        n_vocab: usize,
        args: &ConstraintArgs,
    ) -> Result<Self> {
        if vocab.len() != n_vocab {
            return Err(bad(format!(
                "{vocab_name} has {} tokens but the logits have {n_vocab} per row: the grammar's vocabulary must be the \
                 model's",
                vocab.len()
            )));
        }
        let grammar = source.compile(Some(&args.grammar_root), Some(vocab))?;
        let index = Arc::new(TokenIndex::from_vocab(vocab));
        let constraint = match &source.lazy {
            None => GrammarConstraint::new(&grammar, index),
            Some(triggers) => GrammarConstraint::with_triggers(&grammar, index, triggers),
        }
        .map_err(|e| bad(format!("{}: {}", source.origin(), e)))?;
        let mode = match args.grammar_mode {
            GrammarModeArg::Masked => ConstraintMode::MaskFirst,
            GrammarModeArg::Fast => ConstraintMode::Rejection,
        };
        Ok(Constrained { constraint, mode, eog: vocab.eog_tokens().to_vec() })
    }

    /// `chain` with a fresh copy of the grammar in front (copies share the compiled states).
    pub fn attach(&self, chain: Chain) -> Chain {
        chain.with_constraint(Box::new(self.constraint.clone()), self.mode)
    }

    /// True for the vocabulary's end-of-generation tokens.
    #[cfg_attr(not(feature = "model"), allow(dead_code))]
    pub fn is_eog(&self, token: u32) -> bool {
        self.eog.binary_search(&token).is_ok()
    }
}

/// The grammar of `--grammar` / `--json-schema`, or of the body (not both).
pub fn source(args: &ConstraintArgs, from_body: Option<&GrammarSource>) -> Result<Option<GrammarSource>> {
    let flag = match (&args.grammar, &args.json_schema) {
        (Some(path), _) => Some(("--grammar", GrammarSource::gbnf_file(path)?)),
        (None, Some(path)) => Some(("--json-schema", GrammarSource::schema_file(path)?)),
        (None, None) => None,
    };
    match (flag, from_body) {
        (Some((flag, _)), Some(body)) => {
            Err(bad(format!("{flag} and {} both give a grammar: give one", body.origin())))
        }
        (Some((_, source)), None) => Ok(Some(source)),
        (None, body) => Ok(body.cloned()),
    }
}

/// A token's bytes for a table: quoted, with `"`, `\`, control characters and invalid UTF-8
/// escaped.
pub fn quote_bytes(bytes: &[u8]) -> String {
    format!("\"{}\"", escape_bytes(bytes, true))
}

/// Bytes as text for a table: valid UTF-8 as is (newlines, tabs and other control characters
/// escaped; with `quotes`, `"` and `\` too), other bytes as `\xNN`.
pub fn escape_bytes(bytes: &[u8], quotes: bool) -> String {
    let mut s = String::new();
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '"' if quotes => s.push_str("\\\""),
                '\\' if quotes => s.push_str("\\\\"),
                '\n' => s.push_str("\\n"),
                '\t' => s.push_str("\\t"),
                '\r' => s.push_str("\\r"),
                c if c.is_control() => s.push_str(&format!("\\u{{{:x}}}", c as u32)),
                c => s.push(c),
            }
        }
        for b in chunk.invalid() {
            s.push_str(&format!("\\x{b:02X}"));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_schema_keeps_its_property_order() {
        let body = r#"{"temperature": 0, "json_schema": {"type": "object", "properties": {"zeta": {}, "alpha": {}}}}"#;
        let params = SamplingParams::from_json(body).unwrap();
        let source = GrammarSource::from_params(&params, body, "b.json").unwrap();
        assert!(source.text.find("zeta").unwrap() < source.text.find("alpha").unwrap(), "{}", source.text);
        assert_eq!(source.origin(), "--params b.json: field `json_schema`");
        let gbnf = source.gbnf().unwrap();
        assert!(gbnf.contains("root ::= \"{\" space  (zeta-kv"), "{gbnf}");

        let body = r#"{"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema":
                      {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}}}}"#;
        let params = SamplingParams::from_json(body).unwrap();
        let source = GrammarSource::from_params(&params, body, "b.json").unwrap();
        assert!(source.text.find("\"b\"").unwrap() < source.text.find("\"a\"").unwrap(), "{}", source.text);
        assert_eq!(source.origin(), "--params b.json: field `response_format`");

        let body = r#"{"response_format": {"type": "json_object"}}"#;
        let params = SamplingParams::from_json(body).unwrap();
        let source = GrammarSource::from_params(&params, body, "b.json").unwrap();
        assert_eq!((source.text.as_str(), source.origin()), ("{}", "--params b.json: field `response_format`"));
    }

    #[test]
    fn quoting() {
        assert_eq!(quote_bytes(b"a\"b\\\n\x01\xff\xc3\xa9"), r#""a\"b\\\n\u{1}\xFFé""#);
    }
}
