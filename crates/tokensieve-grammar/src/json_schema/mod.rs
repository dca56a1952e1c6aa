//! JSON Schema to GBNF, producing the same grammar text as llama.cpp's
//! `json_schema_to_grammar` (common/json-schema-to-grammar.cpp).
//!
//! The output is a GBNF grammar whose `root` rule matches JSON documents valid under the
//! schema (within what the converter supports), with the rules printed one per line,
//! `name ::= body`, sorted by name. Every value is followed by `space`, which allows a little
//! whitespace (at most two newlines and twenty spaces or tabs) so a model cannot run away
//! with it. Rule names come from the path to each subschema (`root`, `address-street-kv`,
//! `items-item`, `ref-defs-Node`, …), and the bodies are spelled exactly as llama.cpp spells
//! them, so grammars can be compared byte for byte with llama.cpp's.
//!
//! # What is supported
//!
//! The keywords llama.cpp's converter understands: `type` (one or a list), `const`, `enum`,
//! `properties`, `required`, `additionalProperties`, `items`, `prefixItems`, `minItems`,
//! `maxItems`, `minLength`, `maxLength`, `pattern` (anchored with `^…$`), `format`
//! (`date`, `time`, `date-time`, `uuid`, `uuid1`–`uuid5`), `minimum`, `maximum`,
//! `exclusiveMinimum`, `exclusiveMaximum` (integers), `anyOf`, `oneOf`, `allOf` (merged
//! object properties, or common `enum` values), and local `$ref`s (`#/$defs/…`,
//! `#/definitions/…`, any `#/…` path). Other keywords are ignored, as in llama.cpp, and a
//! schema holding only annotations (`{"description": …}`) accepts any JSON value.
//!
//! Quirks of llama.cpp are kept on purpose, since matching it is the point: `{}` (and
//! `additionalProperties: {}`) mean "any object", `oneOf` is treated as `anyOf`, an `allOf`
//! without properties or enums becomes the empty object, nested `$defs` are hoisted to the
//! top, and property order follows the document.
//!
//! # Errors
//!
//! Everything that llama.cpp rejects is an [`Error`](crate::Error) of kind
//! [`ErrorKind::Schema`](crate::ErrorKind::Schema): unknown or malformed `type`s,
//! unresolvable or non-local `$ref`s (remote schemas are never fetched), patterns that are
//! not anchored, keywords of the wrong JSON type. So is input on which llama.cpp would crash,
//! hang or print a broken grammar: negative counts, integer bounds outside 64 bits, a stray
//! `)`, `]` or `}` or a trailing `\` in a pattern, and schemas nested deeper than 256 levels
//! (`$ref` and `allOf` chains included). Nothing here panics on user input.
//!
//! # Where the output differs from llama.cpp
//!
//! Only where llama.cpp's own output is broken or wrong:
//!
//! * A `$ref` inside an object that also has a `$ref` (typically definitions beside a
//!   top-level `$ref`) is resolved normally; llama.cpp never resolves it and emits `object`.
//! * Patterns and the "any other key" rule for `additionalProperties` work on characters,
//!   not bytes, so non-ASCII text stays valid UTF-8; characters that GBNF would misread in a
//!   character class (`]`, `\`, `-`, a lone `^`, control characters) are escaped.
//! * Remote `$ref`s are always an error (llama.cpp without a fetcher turns a remote ref
//!   without a `#` fragment into `object`).
//!
//! # Key order
//!
//! llama.cpp keeps object keys in document order, and the order of `properties` decides the
//! order of keys in the grammar. A `serde_json::Value` sorts its keys unless serde_json's
//! `preserve_order` feature is on, so for schemas given as text prefer
//! [`json_schema_str_to_gbnf`], which reads keys in document order whatever serde_json's
//! features are.

mod converter;
mod json;
mod numeric;
mod pattern;

use crate::error::Result;
use converter::Converter;
use json::Json;

/// Options as llama.cpp's converter takes them. The defaults are llama.cpp's.
#[derive(Clone, Debug, Default)]
pub struct SchemaOptions {
    /// Let `.` in a `pattern` match line breaks too (llama.cpp's `dotall`). Default `false`:
    /// `.` matches any character except `\n` and `\r`.
    pub dotall: bool,
    /// Property names to place first, in this order, in every object (the `--prop-order`
    /// option of llama.cpp's Python converter). Properties not listed follow in document
    /// order. Default empty: document order, as llama.cpp's C++ converter does.
    pub prop_order: Vec<String>,
}

/// Parses JSON text into a `serde_json::Value`, with an [`ErrorKind::Schema`](crate::ErrorKind::Schema)
/// error that says where the text is malformed.
///
/// Unless serde_json's `preserve_order` feature is enabled, the `Value` sorts object keys; see
/// [`json_schema_str_to_gbnf`] to convert text with its key order intact.
pub fn schema_from_str(text: &str) -> Result<serde_json::Value> {
    serde_json::from_str(text).map_err(|e| json::parse_error(&e))
}

/// Converts a JSON schema to GBNF with the default [`SchemaOptions`].
///
/// Object keys are taken in the order the `Value` iterates them (sorted, unless serde_json's
/// `preserve_order` feature is on); [`json_schema_str_to_gbnf`] keeps document order.
///
/// ```
/// use tokensieve_grammar::json_schema::json_schema_to_gbnf;
///
/// let schema = serde_json::json!({
///     "type": "object",
///     "properties": { "ok": { "type": "boolean" } },
///     "required": ["ok"]
/// });
/// let gbnf = json_schema_to_gbnf(&schema)?;
/// assert_eq!(
///     gbnf,
///     concat!(
///         "boolean ::= (\"true\" | \"false\") space\n",
///         "ok-kv ::= \"\\\"ok\\\"\" space \":\" space boolean\n",
///         "root ::= \"{\" space ok-kv \"}\" space\n",
///         "space ::= | \" \" | \"\\n\"{1,2} [ \\t]{0,20}\n",
///     )
/// );
/// # Ok::<(), tokensieve_grammar::Error>(())
/// ```
pub fn json_schema_to_gbnf(schema: &serde_json::Value) -> Result<String> {
    json_schema_to_gbnf_with(schema, &SchemaOptions::default())
}

/// Converts a JSON schema to GBNF with the given options.
pub fn json_schema_to_gbnf_with(schema: &serde_json::Value, options: &SchemaOptions) -> Result<String> {
    convert(Json::from_value(schema)?, options)
}

/// Converts a JSON schema given as text, keeping object keys in document order as llama.cpp
/// does (whatever serde_json's features). Malformed JSON is an
/// [`ErrorKind::Schema`](crate::ErrorKind::Schema) error. serde_json refuses text nested more
/// than 128 levels deep.
pub fn json_schema_str_to_gbnf(schema: &str, options: &SchemaOptions) -> Result<String> {
    convert(Json::parse(schema)?, options)
}

fn convert(schema: Json, options: &SchemaOptions) -> Result<String> {
    Converter::new(schema, options)?.run()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn gbnf(schema: &str) -> Result<String> {
        json_schema_str_to_gbnf(schema, &SchemaOptions::default())
    }

    fn schema_error(schema: &str) -> String {
        match gbnf(schema) {
            Ok(grammar) => panic!("expected an error for {schema}, got:\n{grammar}"),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Schema, "{e}");
                e.message().to_owned()
            }
        }
    }

    /// The rule `name` of a grammar.
    fn rule<'g>(grammar: &'g str, name: &str) -> Option<&'g str> {
        grammar.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(" ::= "))
    }

    #[test]
    fn malformed_json() {
        assert!(schema_error("{\"type\": ").contains("malformed JSON"));
        assert!(schema_error("{} trailing").contains("malformed JSON"));
        let e = schema_from_str("[1,").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Schema);
        assert!(e.message().contains("line 1"), "{e}");
    }

    #[test]
    fn unresolvable_refs() {
        assert!(schema_error(r##"{"$ref": "#/definitions/missing"}"##).contains("cannot resolve $ref"));
        assert!(schema_error(r##"{"$ref": "#/definitions/a/0", "definitions": {"a": {}}}"##).contains("cannot resolve"));
        assert!(schema_error(r##"{"$ref": "#/items/5", "items": [{}]}"##).contains("cannot resolve"));
        assert!(schema_error(r##"{"$ref": "#/items/x", "items": [{}]}"##).contains("cannot resolve"));
        assert!(schema_error(r##"{"$ref": "other.json#/a"}"##).contains("unsupported $ref"));
        assert!(schema_error(r##"{"$ref": "#"}"##).contains("unsupported $ref"));
        assert!(schema_error(r##"{"$ref": 5}"##).contains("must be a string"));
        // An unused but broken ref is an error too, as in llama.cpp.
        assert!(schema_error(r##"{"type": "string", "definitions": {"x": {"$ref": "#/nope"}}}"##).contains("nope"));
    }

    #[test]
    fn remote_refs_are_not_fetched() {
        assert!(schema_error(r#"{"$ref": "https://example.com/schema.json#/a"}"#).contains("not fetched"));
        assert!(schema_error(r#"{"$ref": "https://example.com/schema.json"}"#).contains("not fetched"));
        assert!(schema_error(r#"{"$ref": "http://example.com/schema.json"}"#).contains("not fetched"));
    }

    #[test]
    fn wrong_types() {
        assert!(schema_error(r#"{"type": 5}"#).contains("unrecognized schema"));
        assert!(schema_error(r#"{"type": "kaboom"}"#).contains("unrecognized schema"));
        assert!(schema_error(r#"{"type": ["string", 5]}"#).contains("unrecognized schema"));
        assert!(schema_error(r#"{"format": 5}"#).contains("format"));
        assert!(schema_error(r#"{"anyOf": {"type": "string"}}"#).contains("anyOf"));
        assert!(schema_error(r#"{"oneOf": null}"#).contains("oneOf"));
        assert!(schema_error(r#"{"pattern": 5}"#).contains("pattern"));
        assert!(schema_error(r#"{"items": {}, "minItems": "2"}"#).contains("minItems"));
        assert!(schema_error(r#"{"items": {}, "minItems": -1}"#).contains("negative"));
        assert!(schema_error(r#"{"type": "string", "maxLength": -3}"#).contains("negative"));
        assert!(schema_error(r#"{"type": "string", "maxLength": 1e12}"#).contains("too large"));
        assert!(schema_error(r#"{"type": "integer", "minimum": "0"}"#).contains("minimum"));
        assert!(schema_error(r#"{"type": "integer", "maximum": 18446744073709551615}"#).contains("out of range"));
        assert!(schema_error(r#"{"type": "integer", "exclusiveMaximum": -9223372036854775808}"#).contains("range"));
        assert!(schema_error("true").contains("unrecognized schema"));
        assert!(schema_error("5").contains("unrecognized schema"));
        assert!(schema_error(r#"{"items": true}"#).contains("unrecognized schema"));
        assert!(schema_error(r#"{"properties": {"a": "string"}}"#).contains("unrecognized schema"));
    }

    #[test]
    fn bad_patterns() {
        for (pattern, what) in [
            ("abc", "'^'"),
            ("^abc", "'$'"),
            ("", "'^'"),
            ("^", "'^'"),
            ("^*a$", "nothing to repeat"),
            ("^{2}$", "nothing to repeat"),
            ("^a)b$", "unbalanced ')'"),
            ("^a]b$", "unbalanced ']'"),
            ("^a}b$", "unbalanced '}'"),
            ("^[ab$", "unbalanced '['"),
            ("^a{2$", "unbalanced '{'"),
            ("^a{x}$", "invalid number"),
            ("^a{1,2,3}$", "wrong number"),
            ("^a{-1}$", "negative"),
            ("^a{99999999999}$", "out of range"),
            ("^a\\$", "lone"),
        ] {
            let schema = serde_json::json!({ "type": "string", "pattern": pattern }).to_string();
            let message = schema_error(&schema);
            assert!(message.contains(what), "{pattern}: {message}");
        }
    }

    #[test]
    fn deep_nesting_is_refused() {
        // Through the text parser (serde_json stops at 128 levels).
        let deep = "{\"items\": ".repeat(200) + "{}" + &"}".repeat(200);
        assert!(schema_error(&deep).contains("nested more than 128 levels"));
        // Through a Value (no parser limit): the converter's own limit.
        let mut value = serde_json::json!({"type": "string"});
        for _ in 0..600 {
            value = serde_json::json!({ "items": value });
        }
        let e = json_schema_to_gbnf(&value).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Schema);
        assert!(e.message().contains("256"), "{e}");
        // 250 levels of items are fine.
        let mut value = serde_json::json!({"type": "string"});
        for _ in 0..250 {
            value = serde_json::json!({ "items": value });
        }
        assert!(json_schema_to_gbnf(&value).is_ok());
    }

    #[test]
    fn long_ref_chains_and_deep_groups_are_refused() {
        // Shallow JSON, but each $ref nests one conversion inside the next.
        let defs: serde_json::Map<String, serde_json::Value> = (0..300)
            .map(|i| (format!("d{i}"), serde_json::json!({ "$ref": format!("#/definitions/d{}", i + 1) })))
            .chain(std::iter::once(("d300".to_owned(), serde_json::json!({"type": "string"}))))
            .collect();
        let schema = serde_json::json!({ "$ref": "#/definitions/d0", "definitions": defs });
        let e = json_schema_to_gbnf(&schema).unwrap_err();
        assert!(e.message().contains("deeper than 256"), "{e}");
        // A shorter chain is fine.
        let defs: serde_json::Map<String, serde_json::Value> = (0..100)
            .map(|i| (format!("d{i}"), serde_json::json!({ "$ref": format!("#/definitions/d{}", i + 1) })))
            .chain(std::iter::once(("d100".to_owned(), serde_json::json!({"type": "string"}))))
            .collect();
        let g = json_schema_to_gbnf(&serde_json::json!({ "$ref": "#/definitions/d0", "definitions": defs })).unwrap();
        assert_eq!(rule(&g, "root"), Some("ref-definitions-d0"));
        assert_eq!(rule(&g, "ref-definitions-d99"), Some("string"));
        // Groups in a pattern.
        let pattern = format!("^{}a{}$", "(".repeat(300), ")".repeat(300));
        let e = json_schema_to_gbnf(&serde_json::json!({ "pattern": pattern })).unwrap_err();
        assert!(e.message().contains("deeper than 256"), "{e}");
    }

    #[test]
    fn ref_cycles_terminate() {
        // A $ref to itself becomes a self-referencing rule, as in llama.cpp.
        let g = gbnf(r##"{"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}"##).unwrap();
        assert_eq!(rule(&g, "ref-defs-a"), Some("ref-defs-a"));
        // A recursive structure.
        let g = gbnf(
            r##"{"$defs": {"node": {"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}}}, "$ref": "#/$defs/node"}"##,
        )
        .unwrap();
        assert_eq!(rule(&g, "ref-defs-node-next"), Some("ref-defs-node-next-0 | null"));
        assert_eq!(rule(&g, "ref-defs-node-next-0"), Some("ref-defs-node"));
        // allOf over a $ref cycle is bounded.
        let e = schema_error(r##"{"allOf": [{"$ref": "#/$defs/a"}], "$defs": {"a": {"$ref": "#/$defs/a"}}}"##);
        assert!(e.contains("allOf"), "{e}");
    }

    #[test]
    fn refs_beside_a_top_level_ref_are_resolved() {
        let g = gbnf(
            r##"{"$ref": "#/definitions/a", "definitions": {
                "a": {"type": "object", "properties": {"b": {"$ref": "#/definitions/b"}}, "required": ["b"]},
                "b": {"type": "integer"}}}"##,
        )
        .unwrap();
        assert_eq!(rule(&g, "ref-definitions-a-b"), Some("integer"));
        assert_eq!(rule(&g, "root"), Some("ref-definitions-a"));
    }

    #[test]
    fn nested_defs_are_hoisted() {
        let g = gbnf(
            r##"{"type": "object", "properties": {"p": {"$ref": "#/$defs/t", "$defs": {"t": {"type": "boolean"}}}}, "required": ["p"]}"##,
        )
        .unwrap();
        assert_eq!(rule(&g, "p-kv"), Some(r#""\"p\"" space ":" space p"#));
        assert_eq!(rule(&g, "p"), Some("boolean"));
    }

    #[test]
    fn document_order_through_text() {
        let schema = r#"{"properties": {"b": {"type": "string"}, "a": {"type": "string"}}, "required": ["a", "b"]}"#;
        let g = gbnf(schema).unwrap();
        assert_eq!(rule(&g, "root"), Some(r#""{" space b-kv "," space a-kv "}" space"#));
    }

    #[test]
    fn prop_order_option() {
        let schema = r#"{"properties": {"b": {"type": "string"}, "a": {"type": "string"}, "c": {"type": "string"}}, "required": ["a", "b", "c"]}"#;
        let options = SchemaOptions { prop_order: vec!["c".into(), "a".into()], ..SchemaOptions::default() };
        let g = json_schema_str_to_gbnf(schema, &options).unwrap();
        assert_eq!(rule(&g, "root"), Some(r#""{" space c-kv "," space a-kv "," space b-kv "}" space"#));
    }

    #[test]
    fn dotall_option() {
        let schema = r#"{"type": "string", "pattern": "^a.b$"}"#;
        let g = gbnf(schema).unwrap();
        assert_eq!(rule(&g, "dot"), Some(r"[^\x0A\x0D]"));
        let options = SchemaOptions { dotall: true, ..SchemaOptions::default() };
        let g = json_schema_str_to_gbnf(schema, &options).unwrap();
        assert_eq!(rule(&g, "dot"), Some(r"[\U00000000-\U0010FFFF]"));
        assert_eq!(rule(&g, "root"), Some(r#""\"" ("a" dot "b") "\"" space"#));
    }

    #[test]
    fn patterns() {
        let pat = |p: &str| {
            let schema = serde_json::json!({ "type": "string", "pattern": p }).to_string();
            let g = gbnf(&schema).unwrap();
            rule(&g, "root").map(str::to_owned).unwrap()
        };
        // Lookarounds are dropped.
        assert_eq!(pat("^(?=x)ab$"), r#""\"" ("ab") "\"" space"#);
        // Non-ASCII text stays whole.
        assert_eq!(pat("^é*ü$"), r#""\"" ("é"* "ü") "\"" space"#);
        assert_eq!(pat("^$"), r#""\"" () "\"" space"#);
        // An unclosed group is closed at the end, as in llama.cpp.
        assert_eq!(pat("^(ab$"), r#""\"" (("ab")) "\"" space"#);
        // The same repeated item shares one sub-rule.
        let schema = r#"{"type": "string", "pattern": "^[a-z]{2}-[a-z]{3}$"}"#;
        let g = gbnf(schema).unwrap();
        assert_eq!(rule(&g, "root"), Some(r#""\"" (root-1{2,2} "-" root-1{3,3}) "\"" space"#));
        assert_eq!(rule(&g, "root-1"), Some("[a-z]"));
    }

    #[test]
    fn additional_keys_escape_class_characters() {
        let g = gbnf(r#"{"properties": {"a]": {}, "-": {}, "^": {}}, "additionalProperties": true}"#).unwrap();
        assert_eq!(
            rule(&g, "additional-k"),
            Some(r#"["] ( [-] char+ | [\x5E] char+ | [a] ([\]] char+ | [^"\]] char*) | [^"\-^a] char* )? ["] space"#)
        );
    }

    #[test]
    fn constants_use_nlohmann_spelling() {
        let g = gbnf(r#"{"enum": [1.0, 1e20, 0.00001, -0.5, {"b": 1, "a": [true, null]}, "x\"y"]}"#).unwrap();
        assert_eq!(
            rule(&g, "root"),
            Some(r#"("1.0" | "1e+20" | "1e-05" | "-0.5" | "{\"b\":1,\"a\":[true,null]}" | "\"x\\\"y\"") space"#)
        );
    }

    #[test]
    fn value_and_text_entry_points_agree_on_sorted_keys() {
        let text =
            r#"{"type": "object", "properties": {"a": {"type": "integer", "minimum": 3}, "b": {"enum": [1, 2]}}}"#;
        let from_text = gbnf(text).unwrap();
        let from_value = json_schema_to_gbnf(&schema_from_str(text).unwrap()).unwrap();
        assert_eq!(from_text, from_value);
    }
}
