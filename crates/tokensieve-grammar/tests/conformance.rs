//! llama.cpp's grammar tests, restated as data in `shared/grammar/llama.cpp/`, run against
//! tokensieve-grammar: parser cases (including llama.cpp's symbol lists and element counts,
//! since we keep its rule encoding), integration cases (strings that must match or be
//! rejected, with llama.cpp's test protocol), build failures, and every example grammar and
//! converter output parsing.

use std::path::PathBuf;

use serde_json::Value;
use tokensieve_grammar::json_schema::{json_schema_str_to_gbnf, SchemaOptions};
use tokensieve_grammar::{gbnf, Grammar, GrammarOptions, Matcher};
use tokensieve_testkit::golden::{goldens_required, shared_dir};

fn grammar_dir() -> Option<PathBuf> {
    let dir = shared_dir().map(|d| d.join("grammar/llama.cpp")).filter(|d| d.is_dir());
    if dir.is_none() {
        assert!(!goldens_required(), "shared/grammar is missing and TOKENSIEVE_REQUIRE_GOLDENS=1");
        eprintln!("skipped: shared/grammar/llama.cpp not found (set TOKENSIEVE_SHARED)");
    }
    dir
}

fn load(name: &str) -> Option<Vec<Value>> {
    let path = grammar_dir()?.join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Some(serde_json::from_str(&text).unwrap())
}

/// llama.cpp's `match_string`: every code point is accepted as token 0 with that character as
/// its piece; `{"token": id}` is accepted as token `id` with piece `<[id]>`. A failure to
/// advance rejects; at the end some parse must be complete.
fn match_input(grammar: &Grammar, input: &Value) -> bool {
    let mut m = Matcher::new(grammar).unwrap();
    let mut pieces: Vec<(u32, Vec<u8>)> = Vec::new();
    let push_text = |s: &str, pieces: &mut Vec<(u32, Vec<u8>)>| {
        for ch in s.chars() {
            pieces.push((0, ch.to_string().into_bytes()));
        }
    };
    match input {
        Value::String(s) => push_text(s, &mut pieces),
        Value::Array(parts) => {
            for part in parts {
                if let Some(id) = part.get("token").and_then(Value::as_u64) {
                    pieces.push((id as u32, format!("<[{id}]>").into_bytes()));
                } else {
                    push_text(part["text"].as_str().unwrap(), &mut pieces);
                }
            }
        }
        other => panic!("unexpected input {other}"),
    }
    for (token, piece) in pieces {
        if m.accept_token_text(token, &piece).is_err() {
            return false;
        }
    }
    m.is_complete()
}

fn check_strings(case: &Value, grammar: &Grammar, failures: &mut Vec<String>) -> usize {
    let mut n = 0;
    for (key, want) in [("must_match", true), ("must_reject", false)] {
        for input in case[key].as_array().unwrap() {
            n += 1;
            if match_input(grammar, input) != want {
                failures.push(format!("{}: {key} {input}", case["description"]));
            }
        }
    }
    n
}

#[test]
fn integration_cases() {
    let Some(cases) = load("grammar_integration_cases.json") else { return };
    let mut failures = Vec::new();
    let (mut grammars, mut strings, mut schemas, mut schema_strings) = (0, 0, 0, 0);
    for case in &cases {
        let text = case["grammar"].as_str().unwrap_or("");
        let root = case.get("root_symbol").and_then(Value::as_str);
        let build = || Grammar::with_options(text, GrammarOptions { root, tokens: None });
        match case["kind"].as_str().unwrap() {
            "grammar" => {
                grammars += 1;
                let g = build().unwrap_or_else(|e| panic!("{}: {e}", case["description"]));
                strings += check_strings(case, &g, &mut failures);
            }
            "json_schema" => {
                schemas += 1;
                let schema = case["schema"].as_str().unwrap();
                let gbnf = json_schema_str_to_gbnf(schema, &SchemaOptions::default())
                    .unwrap_or_else(|e| panic!("{}: {e}", case["description"]));
                let g = Grammar::new(&gbnf).unwrap_or_else(|e| panic!("{}: {e}\n{gbnf}", case["description"]));
                schema_strings += check_strings(case, &g, &mut failures);
            }
            "grammar_build_must_fail" => {
                if build().is_ok() {
                    failures.push(format!("built, but must fail: {text}"));
                }
            }
            "grammar_parse_must_fail" => {
                if gbnf::parse(text, None).is_ok() {
                    failures.push(format!("parsed, but must fail: {text}"));
                }
            }
            "grammar_build_must_succeed" => {
                if let Err(e) = build() {
                    failures.push(format!("must build: {text}: {e}"));
                }
            }
            kind => panic!("unknown kind {kind}"),
        }
    }
    eprintln!("{grammars} grammars with {strings} strings, {schemas} schemas with {schema_strings} strings");
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    assert_eq!(grammars, 14);
    assert_eq!(strings, 139);
    assert_eq!(schemas, 33);
    assert_eq!(schema_strings, 246);
}

#[test]
fn parser_cases() {
    let Some(cases) = load("grammar_parser_cases.json") else { return };
    let mut checked = 0;
    for case in &cases {
        let text = case["grammar"].as_str().unwrap();
        let parsed = gbnf::parse(text, None);
        if !case["must_parse"].as_bool().unwrap() {
            assert!(parsed.is_err(), "must not parse: {text}");
            continue;
        }
        let parsed = parsed.unwrap_or_else(|e| panic!("{text}: {e}"));
        let symbols: Vec<&str> = case["symbols"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
        assert_eq!(parsed.symbol_names(), symbols, "{text}");
        assert_eq!(parsed.n_elements(), case["n_elements"].as_u64().unwrap() as usize, "{text}");
        checked += 1;
    }
    assert_eq!(checked, 15);
}

#[test]
fn example_grammars_parse_and_build() {
    let Some(dir) = grammar_dir() else { return };
    let mut n = 0;
    for entry in std::fs::read_dir(dir.join("grammars")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let g = Grammar::new(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Matcher::new(&g).unwrap();
        n += 1;
    }
    assert_eq!(n, 8);
}

#[test]
fn example_grammars_accept_their_language() {
    let Some(dir) = grammar_dir() else { return };
    let read = |name: &str| Grammar::new(&std::fs::read_to_string(dir.join("grammars").join(name)).unwrap()).unwrap();
    let json = read("json.gbnf");
    assert!(json.matches(r#"{"a": [1, 2.5, -3], "b": {"c": "d\n\u00e9"}, "e": true}"#).unwrap());
    assert!(json.matches("{}").unwrap());
    assert!(!json.matches("[1, 2]").unwrap(), "json.gbnf's root is an object");
    // llama.cpp quirk kept: json.gbnf's exponent rule rejects 1e10.
    assert!(!json.matches(r#"{"a": 1e10}"#).unwrap());
    assert!(json.matches(r#"{"a": 1e1}"#).unwrap());
    let arith = read("arithmetic.gbnf");
    assert!(arith.matches("1+2*(3-x)=7\n").unwrap());
    assert!(!arith.matches("1+2*(3-x)\n").unwrap());
    let chess = read("chess.gbnf");
    assert!(chess.matches("1. e4 e5\n2. Nf3 Nc6\n").unwrap());
    assert!(!chess.matches("1. e4 e5\n").unwrap(), "at least one more move line");
    let list = read("list.gbnf");
    assert!(list.matches("- one\n- two\n").unwrap());
    assert!(!list.matches("one\n").unwrap());
    let japanese = read("japanese.gbnf");
    assert!(Matcher::new(&japanese).unwrap().accept_str("日本").is_ok());
}

#[test]
fn converter_outputs_parse() {
    let Some(cases) = load("json_schema_to_gbnf_cases.json") else { return };
    let mut n = 0;
    for case in &cases {
        if case["expected_status"] != "SUCCESS" {
            continue;
        }
        let text = case["expected_gbnf"].as_str().unwrap();
        Grammar::new(text).unwrap_or_else(|e| panic!("{}: {e}", case["name"]));
        n += 1;
    }
    assert_eq!(n, 73);
}
