//! `--convention transformers` through the binary: spec chains, generation_config.json bodies
//! (`--params`), the default (greedy) chain, and the errors, as the CLI contract describes them.

use serde_json::Value;
use tokensieve_testkit::cli::{read_npy_f32, run, write_npy_f32, Run, ScratchDir};

const BIN: &str = env!("CARGO_BIN_EXE_tokensieve");
const NEG: f32 = f32::NEG_INFINITY;

fn args(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|p| p.to_string()).collect()
}

fn ok(parts: &[&str]) -> String {
    match run(BIN, &args(parts)) {
        Run::Ok(stdout) => stdout,
        other => panic!("{parts:?}: {other:?}"),
    }
}

fn bad(parts: &[&str], needle: &str) {
    match run(BIN, &args(parts)) {
        Run::BadInput(line) => assert!(line.contains(needle), "{parts:?}: `{line}` lacks `{needle}`"),
        other => panic!("{parts:?}: expected exit status 2, got {other:?}"),
    }
}

fn tokens(stdout: &str) -> Vec<u64> {
    stdout.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()["token"].as_u64().unwrap()).collect()
}

#[test]
fn the_same_spec_means_different_things_per_convention() {
    let d = ScratchDir::new("cli-hf-conventions");
    let row = d.path("row.npy");
    // Eight equal logits: llama.cpp's top_p(0.5) keeps a sorted prefix of 4 and truncates;
    // transformers' masks the first four (ascending sort, cum <= 0.5) and keeps the row dense.
    write_npy_f32(&row, &[8], &[0.0; 8]);
    let (r, o) = (row.to_str().unwrap(), d.path("out.npy"));
    let out = o.to_str().unwrap();
    ok(&["apply", "--convention", "transformers", "--chain", "top_p(0.5)", "--logits", r, "--out", out]);
    assert_eq!(read_npy_f32(&o).1, [NEG, NEG, NEG, NEG, 0.0, 0.0, 0.0, 0.0]);
    // top_k keeps every token tied with the k-th value under transformers.
    write_npy_f32(&row, &[5], &[1.0, 3.0, 2.0, 3.0, 2.0]);
    ok(&["apply", "--convention", "transformers", "--chain", "top_k(2)", "--logits", r, "--out", out]);
    assert_eq!(read_npy_f32(&o).1, [NEG, 3.0, NEG, 3.0, NEG]);
    // repetition_penalty sees the whole history, once per distinct id.
    ok(&[
        "apply",
        "--convention",
        "transformers",
        "--chain",
        "repetition_penalty(2)",
        "--history",
        "1,1,4",
        "--logits",
        r,
        "--out",
        out,
    ]);
    assert_eq!(read_npy_f32(&o).1, [1.0, 1.5, 2.0, 3.0, 1.0]);
}

#[test]
fn generation_configs_and_the_default_chain() {
    let d = ScratchDir::new("cli-hf-params");
    let row = d.path("row.npy");
    write_npy_f32(&row, &[6], &[1.0, 4.0, 3.5, 0.2, -2.0, 4.0]);
    let r = row.to_str().unwrap();
    // No --chain / --params: generate()'s default, greedy (lowest id among the maxima).
    assert_eq!(tokens(&ok(&["sample", "--convention", "transformers", "--logits", r, "--n", "3"])), [1, 1, 1]);
    // A generation_config.json: suppress token 1, top_k 2 (tied values kept), sample.
    let config = d.path("generation_config.json");
    std::fs::write(&config, r#"{"do_sample": true, "top_k": 2, "suppress_tokens": [1], "temperature": 0.5}"#).unwrap();
    let c = config.to_str().unwrap();
    let out = ok(&["sample", "--convention", "transformers", "--params", c, "--logits", r, "--n", "20", "--seed", "3"]);
    assert!(tokens(&out).iter().all(|&t| t == 2 || t == 5), "{out}");
    let o = d.path("out.npy");
    ok(&["apply", "--convention", "transformers", "--params", c, "--logits", r, "--out", o.to_str().unwrap()]);
    assert_eq!(read_npy_f32(&o).1, [NEG, NEG, 7.0, NEG, NEG, 8.0]);
    // Same seed, same tokens.
    let again =
        ok(&["sample", "--convention", "transformers", "--params", c, "--logits", r, "--n", "20", "--seed", "3"]);
    assert_eq!(out, again);
}

#[test]
fn transformers_errors_name_the_field_or_parameter() {
    let d = ScratchDir::new("cli-hf-errors");
    let row = d.path("row.npy");
    write_npy_f32(&row, &[4], &[0.0; 4]);
    let r = row.to_str().unwrap();
    let body = |name: &str, json: &str| {
        let p = d.path(name);
        std::fs::write(&p, json).unwrap();
        p.to_str().unwrap().to_string()
    };
    let zero_t = body("t0.json", r#"{"do_sample": true, "temperature": 0.0}"#);
    bad(&["sample", "--convention", "transformers", "--params", &zero_t, "--logits", r], "field `temperature`");
    let beams = body("beams.json", r#"{"num_beams": 4}"#);
    bad(&["sample", "--convention", "transformers", "--params", &beams, "--logits", r], "field `num_beams`");
    let unknown = body("unknown.json", r#"{"top_q": 1}"#);
    bad(&["sample", "--convention", "transformers", "--params", &unknown, "--logits", r], "field `top_q`");
    // A generation config read as a llama.cpp body says what to do.
    let gc = body("gc.json", r#"{"do_sample": true, "top_k": 5}"#);
    bad(&["sample", "--params", &gc, "--logits", r], "--convention transformers");
    bad(&["sample", "--convention", "transformers", "--chain", "top_k(0);dist", "--logits", r], "top_k: parameter `k`");
    bad(
        &["sample", "--convention", "transformers", "--chain", "sequence_bias([[[9],1.0]]);dist", "--logits", r],
        "token id 9",
    );
}

/// The two-line examples of the README's convention table, one pair per sampler name.
#[test]
fn readme_convention_examples_hold() {
    let d = ScratchDir::new("cli-hf-readme");
    let row = d.path("row.npy");
    let out = d.path("out.npy");
    let (r, o) = (row.to_str().unwrap().to_string(), out.to_str().unwrap().to_string());
    let sample = |logits: &[f32], chain: &str, extra: &[&str], convention: &str| -> Vec<u64> {
        write_npy_f32(&row, &[logits.len() as u64], logits);
        let mut a = vec!["sample", "--convention", convention, "--chain", chain, "--logits", &r];
        a.extend(extra);
        tokens(&ok(&a))
    };
    let apply = |logits: &[f32], chain: &str, convention: &str| -> Vec<f32> {
        write_npy_f32(&row, &[logits.len() as u64], logits);
        ok(&["apply", "--convention", convention, "--chain", chain, "--logits", &r, "--out", &o]);
        read_npy_f32(&out).1
    };
    let greedy_row = [1.0f32, 3.0, 0.0, 3.0, 3.0, 3.0, 2.0];
    assert_eq!(sample(&greedy_row, "top_k(3);greedy", &[], "llama.cpp"), [4]);
    assert_eq!(sample(&greedy_row, "top_k(3);greedy", &[], "transformers"), [1]);
    let dist_row = [1.0f32, 4.0, 3.5, 0.2, -2.0, 3.9];
    let draw = ["--rng", "mt19937", "--seed", "42", "--n", "8"];
    assert_eq!(sample(&dist_row, "top_k(3);dist", &draw, "llama.cpp"), [2, 1, 2, 5, 5, 1, 5, 1]);
    assert_eq!(sample(&dist_row, "top_k(3);dist", &draw, "transformers"), [5, 1, 5, 2, 2, 1, 2, 1]);
    assert_eq!(apply(&[1.0, 3.0, 2.0, 3.0], "temperature(0)", "llama.cpp"), [NEG, 3.0, NEG, NEG]);
    write_npy_f32(&row, &[4], &[1.0, 3.0, 2.0, 3.0]);
    bad(
        &["apply", "--convention", "transformers", "--chain", "temperature(0)", "--logits", &r, "--out", &o],
        "has to be a strictly positive float",
    );
    assert_eq!(apply(&[1.0, 3.0, 2.0, 3.0], "top_k(1)", "llama.cpp"), [NEG, 3.0, NEG, NEG]);
    assert_eq!(apply(&[1.0, 3.0, 2.0, 3.0], "top_k(1)", "transformers"), [NEG, 3.0, NEG, 3.0]);
    assert_eq!(apply(&[0.0, -200.0, 1.0], "top_p(1)", "llama.cpp"), [0.0, -200.0, 1.0]);
    assert_eq!(apply(&[0.0, -200.0, 1.0], "top_p(1)", "transformers"), [0.0, NEG, 1.0]);
    let ln_005 = 0.05f32.ln();
    assert_eq!(ln_005, -2.995_732_3);
    assert_eq!(apply(&[0.0, ln_005], "min_p(0.05)", "llama.cpp"), [0.0, ln_005]);
    assert_eq!(apply(&[0.0, ln_005], "min_p(0.05)", "transformers"), [0.0, NEG]);
    assert_eq!(apply(&[0.0; 4], "typical(0.5)", "llama.cpp"), [0.0, 0.0, NEG, 0.0]);
    assert_eq!(apply(&[0.0; 4], "typical(0.5)", "transformers"), [0.0; 4]);
}
