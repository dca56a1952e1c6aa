//! Grammars from the shell: `tokensieve grammar check | match | mask`, `sample --grammar /
//! --json-schema / --params` with a grammar, and `generate --grammar / --json-schema` on the
//! tiny model. A tiny tokenizer.json written here stands for the vocabulary; the llama-bpe
//! vocabulary and llama.cpp's json.gbnf from `shared/` are used when present (skipped with a
//! message otherwise, a failure when TOKENSIEVE_REQUIRE_GOLDENS=1).

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use tokensieve_testkit::cli::{write_npy_f32, ScratchDir};
use tokensieve_testkit::golden::{goldens_required, shared_dir};

const BIN: &str = env!("CARGO_BIN_EXE_tokensieve");

/// A small JSON grammar (llama.cpp's json.gbnf, without numbers' exponents).
const JSON_GBNF: &str = r#"root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ws
ws ::= | " " | "\n" [ \t]{0,20}
"#;

/// The tiny vocabulary: token id = index; `</s>` (14) ends generation.
const TOKENS: [&str; 15] = ["{", "}", "\"", "a", ":", " ", "1", "12", "x", "\"a\"", "[", "]", "true", "tr", "</s>"];
const EOS: u32 = 14;

fn tokenizer_json() -> String {
    let vocab: serde_json::Map<String, Value> =
        TOKENS[..14].iter().enumerate().map(|(i, t)| (t.to_string(), Value::from(i))).collect();
    serde_json::json!({
        "model": {"type": "BPE", "vocab": vocab},
        "added_tokens": [{"id": EOS, "content": "</s>", "special": true}],
    })
    .to_string()
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run_with_stdin<S: AsRef<str>>(args: &[S], stdin: Option<&str>) -> Out {
    let mut cmd = Command::new(BIN);
    cmd.args(args.iter().map(AsRef::as_ref));
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    if let Some(text) = stdin {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    }
    let o = child.wait_with_output().unwrap();
    let out = Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8(o.stdout).unwrap(),
        stderr: String::from_utf8(o.stderr).unwrap(),
    };
    assert!(!out.stderr.contains("panicked") && !out.stderr.contains("internal failure"), "{}", out.stderr);
    out
}

fn run<S: AsRef<str>>(args: &[S]) -> Out {
    run_with_stdin(args, None)
}

fn ok<S: AsRef<str> + std::fmt::Debug>(args: &[S]) -> String {
    let o = run(args);
    assert_eq!(o.code, 0, "{args:?}: {}", o.stderr);
    o.stdout
}

/// Exit status `code` with one line on stderr, starting with `error:` and containing `needle`.
fn fails_with<S: AsRef<str> + std::fmt::Debug>(code: i32, args: &[S], needle: &str) -> String {
    let o = run(args);
    assert_eq!(o.code, code, "{args:?}: stdout {} stderr {}", o.stdout, o.stderr);
    assert_eq!(o.stderr.lines().count(), 1, "{args:?}: {}", o.stderr);
    assert!(o.stderr.starts_with("error: ") && o.stderr.contains(needle), "{args:?}: `{}` lacks `{needle}`", o.stderr);
    o.stderr
}

fn fails<S: AsRef<str> + std::fmt::Debug>(args: &[S], needle: &str) -> String {
    fails_with(2, args, needle)
}

/// A scratch directory with the grammar (`json.gbnf`) and the tiny vocabulary (`tok.json`).
struct Files {
    dir: ScratchDir,
}

impl Files {
    fn new(name: &str) -> Files {
        let dir = ScratchDir::new(&format!("grammar-{name}"));
        std::fs::write(dir.path("json.gbnf"), JSON_GBNF).unwrap();
        std::fs::write(dir.path("tok.json"), tokenizer_json()).unwrap();
        Files { dir }
    }
    fn s(&self, file: &str) -> String {
        self.dir.path(file).to_str().unwrap().to_string()
    }
    fn write(&self, file: &str, text: &str) -> String {
        std::fs::write(self.dir.path(file), text).unwrap();
        self.s(file)
    }
    /// A logits row over the tiny vocabulary: `(id, logit)` pairs, 0 elsewhere.
    fn row(&self, file: &str, n: usize, logits: &[(u32, f32)]) -> String {
        let mut row = vec![0.0f32; n];
        for &(id, l) in logits {
            row[id as usize] = l;
        }
        write_npy_f32(&self.dir.path(file), &[n as u64], &row);
        self.s(file)
    }
}

fn tokens_of(stdout: &str) -> Vec<u32> {
    stdout.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()["token"].as_u64().unwrap() as u32).collect()
}

#[test]
fn check_reports_size_or_the_error_position() {
    let f = Files::new("check");
    let out = ok(&["grammar", "check", &f.s("json.gbnf")]);
    assert!(out.starts_with("ok: ") && out.contains(" rules, ") && out.contains(" elements"), "{out}");
    assert_eq!(out.lines().count(), 1, "{out}");
    // Line 2, column 16: `%` is not GBNF.
    let bad = f.write("bad.gbnf", "root ::= item+\nitem ::= \"a\" | %\n");
    fails(&["grammar", "check", &bad], &format!("{bad}:2:16: "));
    let unclosed = f.write("unclosed.gbnf", "root ::= [a-");
    fails(&["grammar", "check", &unclosed], &format!("{unclosed}:1:"));
    let undefined = f.write("undefined.gbnf", "root ::= \"a\" thing\n");
    fails(&["grammar", "check", &undefined], &format!("{undefined}:1:14: undefined rule `thing`"));
    let left = f.write("left.gbnf", "root ::= root \"a\" | \"b\"\n");
    fails(&["grammar", "check", &left], "left recursion");
    fails(&["grammar", "check", &f.s("json.gbnf"), "--root", "nothere"], "no rule named `nothere`");
    assert!(ok(&["grammar", "check", &f.s("json.gbnf"), "--root", "value"]).contains("start symbol `value`"));
    fails(&["grammar", "check", &f.s("absent.gbnf")], "cannot read");
    // Standard input.
    let o = run_with_stdin(&["grammar", "check", "-"], Some("root ::= [0-9]+\n"));
    assert_eq!(
        (o.code, o.stdout.as_str()),
        (0, "ok: <stdin>: 2 rules, 9 elements, start symbol `root`\n"),
        "{}",
        o.stderr
    );
    // Token references need a vocabulary.
    let tokens = f.write("tokens.gbnf", "root ::= \"1\" </s>\n");
    fails(&["grammar", "check", &tokens], "--vocab");
    assert!(ok(&["grammar", "check", &tokens, "--vocab", &f.s("tok.json")]).starts_with("ok: "));
}

#[test]
fn check_converts_json_schemas() {
    let f = Files::new("schema");
    let schema = f.write("s.json", r#"{"type": "object", "properties": {"zeta": {"type": "integer"}, "alpha": {"type": "boolean"}}, "required": ["zeta", "alpha"]}"#);
    let gbnf = ok(&["grammar", "check", "--json-schema", &schema, "--print"]);
    let root = gbnf.lines().find(|l| l.starts_with("root ::= ")).unwrap_or_else(|| panic!("{gbnf}"));
    // Properties in document order, as llama.cpp converts them.
    assert!(root.find("zeta-kv").unwrap() < root.find("alpha-kv").unwrap(), "{root}");
    assert!(ok(&["grammar", "check", "--json-schema", &schema]).starts_with("ok: "));
    let bad = f.write("bad.json", r#"{"type": "nonsense"}"#);
    fails(&["grammar", "check", "--json-schema", &bad], &bad);
    let malformed = f.write("malformed.json", "{\"type\": ");
    fails(&["grammar", "check", "--json-schema", &malformed], "malformed JSON schema");
    fails(&["grammar", "check", &f.s("json.gbnf"), "--json-schema", &schema], "cannot be used with");
    fails(&["grammar", "check"], "required");
}

#[test]
fn match_says_accepted_rejected_or_incomplete() {
    let f = Files::new("match");
    let g = f.s("json.gbnf");
    let o = run(&["grammar", "match", &g, "--text", r#"{"a": [1, 2, {"b": null}]}"#]);
    assert_eq!((o.code, o.stdout.as_str(), o.stderr.as_str()), (0, "accepted\n", ""));
    let o = run(&["grammar", "match", &g, "--text", r#"{"a": }"#]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(o.stdout.starts_with("rejected at byte 6: "), "{}", o.stdout);
    // The offset is the first byte of the character: "é" is 2 bytes.
    let o = run(&["grammar", "match", &g, "--text", "{\"é\": x}"]);
    assert!(o.stdout.starts_with("rejected at byte 7: \"x\" is not allowed after"), "{}", o.stdout);
    let o = run(&["grammar", "match", &g, "--text", "x"]);
    assert!(o.stdout.starts_with("rejected at byte 0: "), "{}", o.stdout);
    let o = run(&["grammar", "match", &g, "--text", r#"{"a": [1"#]);
    assert_eq!(o.code, 1);
    assert!(o.stdout.starts_with("incomplete"), "{}", o.stdout);
    assert_eq!(o.stderr, "");
    // After a complete sentence, more text is rejected.
    let o = run(&["grammar", "match", &g, "--text", "{} {}"]);
    assert!(o.code == 1 && o.stdout.starts_with("rejected at byte 3: "), "{}", o.stdout);
    // --text-file: every byte counts; invalid UTF-8 is a rejection.
    std::fs::write(f.dir.path("t.json"), b"{\"k\": \"v\"}\n").unwrap();
    assert_eq!(ok(&["grammar", "match", &g, "--text-file", &f.s("t.json")]), "accepted\n");
    std::fs::write(f.dir.path("bad.txt"), b"{\"k\xff\": 1}").unwrap();
    let o = run(&["grammar", "match", &g, "--text-file", &f.s("bad.txt")]);
    assert!(o.code == 1 && o.stdout.starts_with("rejected at byte 3: invalid UTF-8"), "{}", o.stdout);
    // With a JSON schema.
    let schema =
        f.write("s.json", r#"{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}"#);
    assert_eq!(ok(&["grammar", "match", "--json-schema", &schema, "--text", r#"{"n": 12}"#]), "accepted\n");
    let o = run(&["grammar", "match", "--json-schema", &schema, "--text", r#"{"n": true}"#]);
    assert!(o.code == 1 && o.stdout.starts_with("rejected at byte 6: "), "{}", o.stdout);
    fails(&["grammar", "match", &g], "required");
    fails(&["grammar", "match", &g, "--text", "{}", "--text-file", "x"], "cannot be used with");
}

#[test]
fn mask_lists_the_allowed_tokens() {
    let f = Files::new("mask");
    let (g, v) = (f.s("json.gbnf"), f.s("tok.json"));
    let mask = |args: &[&str]| -> Value {
        let mut all = vec!["grammar", "mask", &g, "--vocab", &v, "--json"];
        all.extend_from_slice(args);
        let out = ok(&all);
        assert_eq!(out.lines().count(), 1, "{out}");
        serde_json::from_str(&out).unwrap()
    };
    // Start: only an object may open.
    assert_eq!(mask(&[]), serde_json::json!({"allowed": [0], "count": 1, "complete": false}));
    // After `{"a": ` a value starts: `{`, `"`, `1`, `12`, `"a"`, `[`, `true`, `tr`; not a second
    // space (ws is at most one space), `}`, `:`, `a`, `x` or the end token.
    let expected = serde_json::json!({"allowed": [0, 2, 6, 7, 9, 10, 12, 13], "count": 8, "complete": false});
    assert_eq!(mask(&["--prefix", r#"{"a": "#]), expected);
    // The same prefix as tokens: `{` `"a"` `:` ` `.
    assert_eq!(mask(&["--prefix-tokens", "0,9,4,5"]), expected);
    // A complete object: the end token, or the optional space.
    assert_eq!(mask(&["--prefix", "{}"]), serde_json::json!({"allowed": [5, EOS], "count": 2, "complete": true}));
    // The table.
    let table = ok(&["grammar", "mask", &g, "--vocab", &v, "--prefix", "{}"]);
    assert!(table.starts_with("2 of 15 tokens allowed"), "{table}");
    assert!(table.contains("14  \"</s>\"  (end of generation)"), "{table}");
    // Rejected prefixes: status 1, with the position.
    fails_with(1, &["grammar", "mask", &g, "--vocab", &v, "--prefix", "{x"], "--prefix: rejected at byte 1: ");
    fails_with(
        1,
        &["grammar", "mask", &g, "--vocab", &v, "--prefix-tokens", "0,8"],
        "rejected at token index 1 (id 8, \"x\")",
    );
    fails_with(1, &["grammar", "mask", &g, "--vocab", &v, "--prefix-tokens", "0,14"], "token index 1");
    fails(&["grammar", "mask", &g, "--vocab", &v, "--prefix-tokens", "0,15"], "token id 15");
    fails(&["grammar", "mask", &g, "--vocab", &v, "--prefix-tokens", "0,q"], "`q`");
    fails(&["grammar", "mask", &g, "--vocab", &f.s("absent.json")], "--vocab");
    let junk = f.write("junk.json", "[1, 2]");
    fails(&["grammar", "mask", &g, "--vocab", &junk], "--vocab");
    fails(&["grammar", "mask", &g], "--vocab");
}

/// llama.cpp's json.gbnf over Llama-3's vocabulary (llama-bpe), checked token by token against
/// their texts.
#[test]
fn mask_on_the_llama_bpe_vocabulary() {
    use tokensieve_grammar::vocab::Vocab;
    let shared = shared_dir().unwrap_or_else(|| PathBuf::from("../shared"));
    let (grammar, vocab_path) =
        (shared.join("grammar/llama.cpp/grammars/json.gbnf"), shared.join("data/vocab/ggml-vocab-llama-bpe.gguf"));
    if !grammar.is_file() || !vocab_path.is_file() {
        assert!(!goldens_required(), "TOKENSIEVE_REQUIRE_GOLDENS=1 but {} is missing", vocab_path.display());
        eprintln!("skipped: shared json.gbnf or ggml-vocab-llama-bpe.gguf not found");
        return;
    }
    let vocab = Vocab::from_file(&vocab_path).unwrap();
    let (g, v) = (grammar.to_str().unwrap(), vocab_path.to_str().unwrap());
    let out = ok(&["grammar", "mask", g, "--vocab", v, "--prefix", r#"{"a": "#, "--json"]);
    let json: Value = serde_json::from_str(&out).unwrap();
    let allowed: Vec<u32> = json["allowed"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
    assert_eq!(json["count"].as_u64().unwrap() as usize, allowed.len());
    assert_eq!(json["complete"], false);
    let id = |text: &str| vocab.token_id(text.as_bytes()).unwrap_or_else(|| panic!("{text:?} is not a token"));
    for text in ["{", "\"", "[", "1", "-", "true", "null", "fa", "\"}", "\"\"", "{\"", "[\""] {
        assert!(allowed.contains(&id(text)), "{text:?} (id {}) should be allowed", id(text));
    }
    for text in ["}", " ", " \"", "a", ":", ",", "\n", "]", "<|eot_id|>", "<|end_of_text|>"] {
        assert!(!allowed.contains(&id(text)), "{text:?} (id {}) should not be allowed", id(text));
    }
    // Allowed tokens' texts continue the prefix within the grammar (a hundred of them, spread out).
    for &t in allowed.iter().step_by(allowed.len().div_ceil(100)) {
        let mut text = br#"{"a": "#.to_vec();
        text.extend_from_slice(vocab.get(t).unwrap());
        let Ok(text) = String::from_utf8(text) else { continue };
        let o = run(&["grammar", "match", g, "--text", &text]);
        assert!(o.code == 1 && o.stdout.starts_with("incomplete"), "token {t} {text:?}: {}", o.stdout);
    }
    // The same prefix given as tokens.
    let ids = [id("{\""), id("a"), id("\":"), id(" ")].map(|t| t.to_string()).join(",");
    assert_eq!(ok(&["grammar", "mask", g, "--vocab", v, "--prefix-tokens", &ids, "--json"]), out);
}

#[test]
fn sample_follows_the_grammar_where_greedy_would_not() {
    let f = Files::new("sample");
    let (g, v) = (f.s("json.gbnf"), f.s("tok.json"));
    // Unconstrained, greedy picks `x` (8), then `a` (3): neither fits a JSON object.
    let logits = f.row("row.npy", 15, &[(8, 10.0), (3, 9.0), (EOS, 8.0), (1, 7.0), (0, 5.0), (10, 4.0)]);
    assert_eq!(tokens_of(&ok(&["sample", "--chain", "greedy", "--logits", &logits])), [8]);
    let args = ["sample", "--chain", "greedy", "--logits", &logits, "--n", "4", "--grammar", &g, "--vocab", &v];
    // `{` (the only opening), `}` (the best token allowed next), then only the end token.
    assert_eq!(tokens_of(&ok(&args)), [0, 1, EOS, EOS]);
    let mut fast = args.to_vec();
    fast.extend(["--grammar-mode", "fast"]);
    assert_eq!(tokens_of(&ok(&fast)), [0, 1, EOS, EOS]);
    // A drawing chain never leaves the grammar either, and the logprobs are the raw row's.
    let chain = "top_k(3);temperature(2);dist";
    let out = ok(&[
        "sample",
        "--chain",
        chain,
        "--logits",
        &logits,
        "--n",
        "6",
        "--grammar",
        &g,
        "--vocab",
        &v,
        "--seed",
        "3",
    ]);
    let first: Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(first["token"], 0);
    assert!(first["logprob"].as_f64().unwrap() < -5.0, "{first}");
    // A batch: each row its own sequence.
    let rows: Vec<f32> = (0..2).flat_map(|_| (0..15).map(|i| if i == 8 { 10.0 } else { 0.0 })).collect();
    write_npy_f32(&f.dir.path("batch.npy"), &[2, 15], &rows);
    let out = ok(&["sample", "--chain", "greedy", "--logits", &f.s("batch.npy"), "--grammar", &g, "--vocab", &v]);
    assert_eq!(tokens_of(&out), [0, 0]);
    // A JSON schema file: an object with an integer `a`.
    let schema =
        f.write("s.json", r#"{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}"#);
    let out =
        ok(&["sample", "--chain", "greedy", "--logits", &logits, "--n", "12", "--json-schema", &schema, "--vocab", &v]);
    let tokens = tokens_of(&out);
    assert_eq!(tokens.last(), Some(&EOS), "{tokens:?}");
    let text: String = tokens.iter().take_while(|&&t| t != EOS).map(|&t| TOKENS[t as usize]).collect();
    let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    assert!(value["a"].is_u64(), "{text}");
}

#[test]
fn sample_grammar_errors() {
    let f = Files::new("sample-errors");
    let (g, v) = (f.s("json.gbnf"), f.s("tok.json"));
    let logits = f.row("row.npy", 15, &[(8, 1.0)]);
    let short = f.row("short.npy", 14, &[(8, 1.0)]);
    fails(&["sample", "--logits", &short, "--grammar", &g, "--vocab", &v], "has 15 tokens but the logits have 14");
    fails(&["sample", "--logits", &logits, "--grammar", &g], "--vocab");
    fails(&["sample", "--logits", &logits, "--vocab", &v], "only used with a grammar");
    let schema = f.write("s.json", "{}");
    fails(
        &["sample", "--logits", &logits, "--grammar", &g, "--json-schema", &schema, "--vocab", &v],
        "cannot be used with",
    );
    let bad = f.write("bad.gbnf", "root ::= (\"a\"\n");
    fails(&["sample", "--logits", &logits, "--grammar", &bad, "--vocab", &v], &format!("{bad}:"));
    fails(&["sample", "--logits", &logits, "--grammar", &g, "--vocab", &v, "--grammar-mode", "sloppy"], "sloppy");
    // Another start rule: --grammar-root; one the grammar lacks is an error naming it.
    let two = f.write("two.gbnf", "root ::= \"{}\"\nalt ::= \"[]\"\n");
    let alt = ["sample", "--chain", "greedy", "--logits", &logits, "--grammar", &two, "--vocab", &v];
    let first = |extra: &[&str]| tokens_of(&ok(&[&alt[..], extra].concat()))[0];
    assert_eq!(TOKENS[first(&[]) as usize].as_bytes()[0], b'{');
    assert_eq!(TOKENS[first(&["--grammar-root", "alt"]) as usize].as_bytes()[0], b'[');
    fails(&[&alt[..], &["--grammar-root", "nope"]].concat(), "nope");
    // A grammar with no end-of-generation token to finish with: a clear error, not a panic.
    let no_eos = f.row("no-eos.npy", 15, &[(EOS, f32::NEG_INFINITY)]);
    let done = f.write("done.gbnf", "root ::= \"{}\"\n");
    fails(
        &["sample", "--chain", "greedy", "--logits", &no_eos, "--grammar", &done, "--vocab", &v, "--n", "3"],
        "step 2",
    );
}

#[test]
fn params_bodies_carry_grammars() {
    let f = Files::new("params");
    let v = f.s("tok.json");
    let logits = f.row(
        "row.npy",
        15,
        &[(8, 10.0), (3, 9.0), (EOS, 8.0), (1, 7.0), (0, 5.0), (10, 4.0), (12, 3.0), (11, 2.0), (6, 1.0)],
    );
    let sample = |body: &str, n: &str| -> Vec<u32> {
        let body = f.write("body.json", body);
        tokens_of(&ok(&["sample", "--params", &body, "--logits", &logits, "--vocab", &v, "--n", n]))
    };
    // llama.cpp's `json_schema`: an array of booleans, at most one.
    let tokens = sample(
        r#"{"temperature": 0, "json_schema": {"type": "array", "items": {"type": "boolean"}, "maxItems": 1}}"#,
        "5",
    );
    assert_eq!(tokens, [10, 12, 11, EOS, EOS], "`[` `true` `]`");
    // `grammar`.
    let tokens = sample(r#"{"temperature": 0, "grammar": "root ::= \"tr\" \"ue\"? | \"1\""}"#, "2");
    assert_eq!(tokens, [12, EOS], "`true` in one token");
    // OpenAI's response_format: json_object is any JSON object, json_schema its schema.
    assert_eq!(sample(r#"{"temperature": 0, "response_format": {"type": "json_object"}}"#, "3"), [0, 1, EOS]);
    let tokens = sample(
        r#"{"temperature": 0, "response_format": {"type": "json_schema", "json_schema": {"name": "t",
            "schema": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 1}}}}"#,
        "4",
    );
    assert_eq!(tokens, [10, 6, 11, EOS], "`[` `1` `]`");
    // Without a grammar the body samples as before; text stays unconstrained.
    assert_eq!(
        tokens_of(&ok(&[
            "sample",
            "--params",
            &f.write("b.json", r#"{"temperature": 0, "response_format": {"type": "text"}}"#),
            "--logits",
            &logits
        ])),
        [8]
    );
    // A lazy grammar: free text (`x`, penalised after one use) until the trigger word `[`,
    // then the grammar from the trigger on; eagerly, the grammar must start at once.
    let row = f.row("lazy.npy", 15, &[(8, 10.0), (10, 9.0), (12, 7.0), (11, 6.0), (EOS, 5.0)]);
    let body = |lazy: bool| {
        format!(
            r#"{{"temperature": 0, "presence_penalty": 50, "grammar": "root ::= \"[\" \"true\" \"]\"",
                "grammar_lazy": {lazy}, "grammar_triggers": [{{"type": 1, "value": "["}}]}}"#
        )
    };
    let run = |body: &str, n: &str| {
        tokens_of(&ok(&["sample", "--params", &f.write("lazy.json", body), "--logits", &row, "--vocab", &v, "--n", n]))
    };
    assert_eq!(run(&body(true), "5"), [8, 10, 12, 11, EOS]);
    assert_eq!(run(&body(false), "4"), [10, 12, 11, EOS]);
    let no_trigger = body(true).replace(r#"{"type": 1, "value": "["}"#, "");
    fails(
        &["sample", "--params", &f.write("b0.json", &no_trigger), "--logits", &row, "--vocab", &v],
        "at least one trigger",
    );
    // Errors name the field.
    let body = f.write("b1.json", r#"{"json_schema": {"type": "object"}}"#);
    fails(&["sample", "--params", &body, "--logits", &logits], "field `json_schema`: a grammar needs the vocabulary");
    let body = f.write("b2.json", r#"{"grammar": "root ::= ", "json_schema": {}}"#);
    fails(&["sample", "--params", &body, "--logits", &logits, "--vocab", &v], "field `grammar`: cannot be combined");
    let body = f.write("b3.json", r#"{"json_schema": "{}"}"#);
    fails(
        &["sample", "--params", &body, "--logits", &logits, "--vocab", &v],
        "field `json_schema`: must be a JSON schema",
    );
    let body = f.write("b4.json", r#"{"grammar": "root ::= [a-"}"#);
    fails(&["sample", "--params", &body, "--logits", &logits, "--vocab", &v], "field `grammar`: line 1, column");
    let body = f.write("b5.json", r#"{"response_format": {"type": "xml"}}"#);
    fails(&["sample", "--params", &body, "--logits", &logits, "--vocab", &v], "field `response_format.type`");
    let body = f.write("b6.json", r#"{"grammar": "root ::= \"a\""}"#);
    fails(
        &["sample", "--params", &body, "--logits", &logits, "--vocab", &v, "--grammar", &f.s("json.gbnf")],
        "both give a grammar",
    );
    fails(&["apply", "--params", &body, "--logits", &logits, "--out", &f.s("o.npy")], "does not apply grammars");
    fails(&["explain", "--params", &body, "--logits", &logits], "does not apply grammars");
}

#[cfg(feature = "model")]
mod generate {
    use super::*;

    /// Writes the tiny model (vocabulary 271, byte-level BPE; `<|im_end|>` ends generation).
    fn tiny(f: &Files) -> String {
        std::fs::write(f.dir.path("tiny.gguf"), tokensieve_testkit::gguf::tiny_llama(7)).unwrap();
        f.s("tiny.gguf")
    }

    #[test]
    fn generate_follows_a_grammar_and_stops_when_it_is_complete() {
        let f = Files::new("generate");
        let model = tiny(&f);
        let g = f.write("hw.gbnf", "root ::= \"hello\" (\" world\" | \"!\")\n");
        for mode in ["masked", "fast"] {
            let args = [
                "generate",
                "--model",
                &model,
                "--grammar",
                &g,
                "--grammar-mode",
                mode,
                "-n",
                "40",
                "--seed",
                "1",
                "hi",
            ];
            let o = run(&args);
            assert_eq!(o.code, 0, "{}", o.stderr);
            assert!(o.stdout == "hello world\n" || o.stdout == "hello!\n", "{mode}: {:?}", o.stdout);
            assert!(o.stderr.contains("(end of generation)"), "{}", o.stderr);
        }
        // A JSON schema: the text parses and has the property.
        let schema = f.write("s.json", r#"{"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["n"], "additionalProperties": false}"#);
        let o = run(&[
            "generate",
            "--model",
            &model,
            "--json-schema",
            &schema,
            "-n",
            "200",
            "--chain",
            "top_k(5);dist",
            "--seed",
            "2",
            "hi",
        ]);
        assert_eq!(o.code, 0, "{}", o.stderr);
        assert!(o.stderr.contains("(end of generation)"), "{}", o.stderr);
        let value: Value = serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("{e}: {:?}", o.stdout));
        assert!(value["n"].as_u64().is_some_and(|n| n <= 99), "{value}");
        // A body's grammar.
        let body = f.write("body.json", r#"{"temperature": 0, "grammar": "root ::= \"the\""}"#);
        let o = run(&["generate", "--model", &model, "--params", &body, "-n", "10", "hi"]);
        assert_eq!((o.code, o.stdout.as_str()), (0, "the\n"), "{}", o.stderr);
        fails(&["generate", "--model", &model, "--params", &body, "--grammar", &g, "hi"], "both give a grammar");
        let bad = f.write("bad.gbnf", "root ::= \"a\" |\n  | [\n");
        fails(&["generate", "--model", &model, "--grammar", &bad, "hi"], &format!("{bad}:"));
    }
}
