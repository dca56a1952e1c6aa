//! The JSON Schema → GBNF converter against llama.cpp's own expectations.
//!
//! Data: `shared/grammar/llama.cpp/json_schema_to_gbnf_cases.json` (the cases of llama.cpp's
//! tests/test-json-schema-to-grammar.cpp: schema text, the exact GBNF llama.cpp produces, and
//! whether conversion must succeed) and the `json_schema` entries of
//! `grammar_integration_cases.json`.
//!
//! The shared directory is `$TOKENSIEVE_SHARED`, or the first `shared/` holding `grammar/`
//! beside an ancestor of this crate. Without it the tests print a note and pass, unless
//! `TOKENSIEVE_REQUIRE_GOLDENS=1`, which makes missing data a failure.
//!
//! Comparison: llama.cpp's test compares `trim(actual) == trim(expected)`, where `trim` strips
//! spaces, tabs, CR and LF from both ends of the text and then deletes the spaces and tabs at
//! the start of every line (`std::regex_replace(s, "(^|\n)[ \t]+", "$1")`). The expected
//! strings are indented C++ raw strings, so this is what makes them comparable; [`normalise`]
//! does exactly the same, no more (trailing spaces and blank lines inside still count).

use std::path::PathBuf;

use serde::Deserialize;
use tokensieve_grammar::json_schema::{json_schema_str_to_gbnf, SchemaOptions};

fn shared_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("TOKENSIEVE_SHARED") {
        let dir = PathBuf::from(dir);
        return dir.join("grammar").is_dir().then_some(dir);
    }
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.ancestors().map(|a| a.join("shared")).find(|p| p.join("grammar").is_dir())
}

/// Reads `shared/grammar/llama.cpp/<file>`, or `None` (with a note) when the data is absent
/// and not required.
fn read_data(file: &str) -> Option<String> {
    let required = std::env::var("TOKENSIEVE_REQUIRE_GOLDENS").is_ok_and(|v| v == "1");
    let path = shared_dir().map(|d| d.join("grammar").join("llama.cpp").join(file));
    match path.as_ref().map(std::fs::read_to_string) {
        Some(Ok(text)) => Some(text),
        other => {
            let why = match other {
                Some(Err(e)) => {
                    format!("cannot read {}: {e}", path.as_ref().map(|p| p.display().to_string()).unwrap_or_default())
                }
                _ => "no shared/grammar directory found (set TOKENSIEVE_SHARED)".to_owned(),
            };
            assert!(!required, "TOKENSIEVE_REQUIRE_GOLDENS=1 but {why}");
            eprintln!("note: skipping, {why}");
            None
        }
    }
}

/// llama.cpp's `trim()` from tests/test-json-schema-to-grammar.cpp.
fn normalise(text: &str) -> String {
    let trimmed = text.trim_matches([' ', '\n', '\r', '\t']);
    trimmed.split('\n').map(|line| line.trim_start_matches([' ', '\t'])).collect::<Vec<_>>().join("\n")
}

#[derive(Deserialize)]
struct GoldenCase {
    name: String,
    schema: String,
    expected_gbnf: String,
    expected_status: String,
    converter_only: bool,
}

#[test]
fn llama_cpp_golden_cases() {
    let Some(text) = read_data("json_schema_to_gbnf_cases.json") else {
        return;
    };
    let cases: Vec<GoldenCase> = serde_json::from_str(&text).expect("json_schema_to_gbnf_cases.json parses");
    assert_eq!(cases.len(), 75, "the golden file holds 75 cases");

    let mut failures = Vec::new();
    let (mut matched, mut rejected) = (0, 0);
    for case in &cases {
        let result = json_schema_str_to_gbnf(&case.schema, &SchemaOptions::default());
        match (case.expected_status.as_str(), result) {
            ("SUCCESS", Ok(grammar)) => {
                if normalise(&grammar) == normalise(&case.expected_gbnf) {
                    matched += 1;
                } else {
                    failures.push(format!(
                        "{}: grammar differs\n--- expected\n{}\n--- actual\n{}",
                        case.name,
                        normalise(&case.expected_gbnf),
                        normalise(&grammar)
                    ));
                }
            }
            ("SUCCESS", Err(e)) => failures.push(format!("{}: expected a grammar, got error: {e}", case.name)),
            ("FAILURE", Err(_)) => rejected += 1,
            ("FAILURE", Ok(grammar)) => failures.push(format!("{}: expected an error, got:\n{grammar}", case.name)),
            (status, _) => failures.push(format!("{}: unknown expected_status {status}", case.name)),
        }
    }
    let converter_only = cases.iter().filter(|c| c.converter_only).count();
    println!(
        "json_schema golden: {matched} grammars identical, {rejected} expected failures rejected, of {} cases \
         ({converter_only} C++-converter-only)",
        cases.len()
    );
    assert!(failures.is_empty(), "{} of {} cases failed:\n\n{}", failures.len(), cases.len(), failures.join("\n\n"));
    assert_eq!(matched + rejected, cases.len());
}

#[derive(Deserialize)]
struct IntegrationCase {
    kind: String,
    #[serde(default)]
    group: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    schema: Option<String>,
}

#[test]
fn integration_case_schemas_convert() {
    let Some(text) = read_data("grammar_integration_cases.json") else {
        return;
    };
    let cases: Vec<IntegrationCase> = serde_json::from_str(&text).expect("grammar_integration_cases.json parses");
    let mut converted = 0;
    let mut failures = Vec::new();
    for case in cases.iter().filter(|c| c.kind == "json_schema") {
        let Some(schema) = &case.schema else {
            failures.push(format!("{}/{}: no schema", case.group, case.description));
            continue;
        };
        match json_schema_str_to_gbnf(schema, &SchemaOptions::default()) {
            Ok(grammar) => {
                assert!(grammar.lines().any(|l| l.starts_with("root ::= ")), "no root rule:\n{grammar}");
                converted += 1;
            }
            Err(e) => failures.push(format!("{}/{}: {e}", case.group, case.description)),
        }
    }
    println!("json_schema integration cases: {converted} schemas converted");
    assert!(failures.is_empty(), "schemas that did not convert:\n{}", failures.join("\n"));
    assert_eq!(converted, 33, "the integration file holds 33 json_schema cases");
}

#[test]
fn normalise_matches_llama_cpp_trim() {
    assert_eq!(normalise("\n    a ::= b\n      c ::= d  \n    "), "a ::= b\nc ::= d");
    assert_eq!(normalise("x\n\n\ty"), "x\n\ny");
}
