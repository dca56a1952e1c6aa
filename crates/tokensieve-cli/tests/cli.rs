//! The `tokensieve` binary against the CLI contract: happy paths and every error path (exit
//! status 2 and a single `error:` line on stderr, never a panic).

use half::{bf16, f16};
use npyz::WriterBuilder;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_tokensieve");

/// A fresh directory per test, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("tokensieve-cli-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
    fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }
    fn s(&self, file: &str) -> String {
        self.path(file).to_str().unwrap().to_string()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn write_npy<T: npyz::AutoSerialize + Copy>(path: &Path, shape: &[u64], data: &[T]) {
    let mut buf = Vec::new();
    let mut w = npyz::WriteOptions::<T>::new().default_dtype().shape(shape).writer(&mut buf).begin_nd().unwrap();
    w.extend(data.iter().copied()).unwrap();
    w.finish().unwrap();
    std::fs::write(path, buf).unwrap();
}

fn read_npy_f32(path: &Path) -> (Vec<u64>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap();
    let f = npyz::NpyFile::new(&bytes[..]).unwrap();
    assert_eq!(f.dtype(), npyz::DType::Plain("<f4".parse().unwrap()));
    let shape = f.shape().to_vec();
    (shape, f.into_vec::<f32>().unwrap())
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run<S: AsRef<str>>(args: &[S]) -> Out {
    let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
    let o = Command::new(BIN).args(args).output().unwrap();
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8(o.stdout).unwrap(),
        stderr: String::from_utf8(o.stderr).unwrap(),
    }
}

fn ok(args: &[&str]) -> String {
    let o = run(args);
    assert_eq!(o.code, 0, "{args:?}: {}", o.stderr);
    o.stdout
}

/// Asserts exit status 2 and exactly one stderr line, starting with `error:` and containing
/// `needle`.
fn fails<S: AsRef<str> + std::fmt::Debug>(args: &[S], needle: &str) {
    let o = run(args);
    assert_eq!(o.code, 2, "{args:?}: stdout {} stderr {}", o.stdout, o.stderr);
    let lines: Vec<&str> = o.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{args:?}: {}", o.stderr);
    assert!(lines[0].starts_with("error: "), "{}", lines[0]);
    assert!(lines[0].contains(needle), "{args:?}: `{}` lacks `{needle}`", lines[0]);
    assert!(!o.stderr.contains("panicked"));
}

fn v(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|p| p.to_string()).collect()
}

fn lines(stdout: &str) -> Vec<Value> {
    stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

const ROW: [f32; 5] = [1.0, 4.0, 3.5, 0.2, -2.0];
const NEG: f32 = f32::NEG_INFINITY;

fn log_softmax(row: &[f32], i: usize) -> f64 {
    let z: f64 = row.iter().map(|&v| (v as f64).exp()).sum::<f64>().ln();
    row[i] as f64 - z
}

#[test]
fn apply_writes_processed_logits_in_vocab_order() {
    let d = Dir::new("apply");
    write_npy(&d.path("in.npy"), &[5], &ROW);
    ok(&["apply", "--chain", "top_k(2)", "--logits", &d.s("in.npy"), "--out", &d.s("out.npy")]);
    let (shape, out) = read_npy_f32(&d.path("out.npy"));
    assert_eq!(shape, [5]);
    assert_eq!(out, [NEG, 4.0, 3.5, NEG, NEG]);
    // A final selecting stage is allowed and does not change the output.
    ok(&["apply", "--chain", "top_k(2);temperature(2);dist", "--logits", &d.s("in.npy"), "--out", &d.s("o2.npy")]);
    assert_eq!(read_npy_f32(&d.path("o2.npy")).1, [NEG, 2.0, 1.75, NEG, NEG]);
}

#[test]
fn apply_batches_rows_independently_and_keeps_the_shape() {
    let d = Dir::new("apply-batch");
    let data = [0.0f32, 1.0, 2.0, 3.0, 3.0, 2.0, 1.0, 0.0];
    write_npy(&d.path("in.npy"), &[2, 4], &data);
    ok(&["apply", "--chain", "top_k(1)", "--logits", &d.s("in.npy"), "--out", &d.s("out.npy")]);
    let (shape, out) = read_npy_f32(&d.path("out.npy"));
    assert_eq!(shape, [2, 4]);
    assert_eq!(out, [NEG, NEG, NEG, 3.0, 3.0, NEG, NEG, NEG]);
}

#[test]
fn apply_sees_the_history() {
    let d = Dir::new("apply-history");
    write_npy(&d.path("in.npy"), &[5], &ROW);
    write_npy(&d.path("hist.npy"), &[3], &[1i64, 1, 4]);
    for history in ["1,1,4", " 1, 1 ,4", &d.s("hist.npy")] {
        ok(&[
            "apply",
            "--chain",
            "penalties(64,2,0.5,0)",
            "--logits",
            &d.s("in.npy"),
            "--history",
            history,
            "--out",
            &d.s("out.npy"),
        ]);
        // token 1: 4 / 2 - 2 * 0.5; token 4: -2 * 2 - 0.5; the others untouched.
        assert_eq!(read_npy_f32(&d.path("out.npy")).1, [1.0, 1.0, 3.5, 0.2, -4.5], "{history}");
    }
}

#[test]
fn half_precision_inputs() {
    let d = Dir::new("half");
    let h: Vec<f16> = ROW.iter().map(|&v| f16::from_f32(v)).collect();
    write_npy(&d.path("h.npy"), &[1, 5], &h);
    ok(&["apply", "--chain", "top_k(3)", "--logits", &d.s("h.npy"), "--out", &d.s("out.npy")]);
    let (shape, out) = read_npy_f32(&d.path("out.npy"));
    assert_eq!((shape, out), (vec![1, 5], vec![1.0, 4.0, 3.5, NEG, NEG]));

    let b: Vec<u16> = [0.3f32, 2.5, -1.0].iter().map(|&v| bf16::from_f32(v).to_bits()).collect();
    write_npy(&d.path("b.npy"), &[3], &b);
    ok(&["apply", "--chain", "top_k(2)", "--logits", &d.s("b.npy"), "--dtype", "bf16", "--out", &d.s("out.npy")]);
    assert_eq!(read_npy_f32(&d.path("out.npy")).1, [bf16::from_f32(0.3).to_f32(), 2.5, NEG]);
    let s = ok(&["sample", "--chain", "greedy", "--logits", &d.s("b.npy"), "--dtype", "bf16"]);
    assert_eq!(lines(&s)[0]["token"], 1);

    fails(&["sample", "--chain", "greedy", "--logits", &d.s("b.npy")], "--dtype bf16");
    fails(&["sample", "--chain", "greedy", "--logits", &d.s("h.npy"), "--dtype", "f32"], "--dtype f32");
}

#[test]
fn sample_prints_one_json_object_per_token() {
    let d = Dir::new("sample");
    write_npy(&d.path("in.npy"), &[5], &ROW);
    let out = lines(&ok(&["sample", "--chain", "greedy", "--logits", &d.s("in.npy")]));
    assert_eq!(out.len(), 1);
    let l = &out[0];
    assert_eq!((l["row"].as_u64(), l["step"].as_u64(), l["token"].as_u64()), (Some(0), Some(0), Some(1)));
    assert!((l["logprob"].as_f64().unwrap() - log_softmax(&ROW, 1)).abs() < 1e-6);
    assert_eq!(l["top_logprobs"], Value::Array(vec![]));
}

#[test]
fn sample_batches_and_steps() {
    let d = Dir::new("sample-batch");
    let data = [0.0f32, 1.0, 2.0, 9.0, 0.5, 0.1, 3.0, 0.0, 0.0];
    write_npy(&d.path("in.npy"), &[3, 3], &data);
    let out =
        lines(&ok(&["sample", "--chain", "top_k(2);dist", "--logits", &d.s("in.npy"), "--n", "3", "--seed", "5"]));
    assert_eq!(out.len(), 9);
    for (i, l) in out.iter().enumerate() {
        assert_eq!(l["step"].as_u64().unwrap() as usize, i / 3);
        assert_eq!(l["row"].as_u64().unwrap() as usize, i % 3);
        let row = l["row"].as_u64().unwrap() as usize;
        let tok = l["token"].as_u64().unwrap() as usize;
        let r = &data[row * 3..row * 3 + 3];
        let mut sorted = r.to_vec();
        sorted.sort_by(|a, b| b.total_cmp(a));
        assert!(r[tok] >= sorted[1], "row {row} sampled {tok} outside its top 2");
    }
    // Deterministic: the same command gives the same lines; the default seed is 0.
    let a = ok(&["sample", "--chain", "dist", "--logits", &d.s("in.npy"), "--n", "4"]);
    let b = ok(&["sample", "--chain", "dist", "--logits", &d.s("in.npy"), "--n", "4", "--seed", "0"]);
    assert_eq!(a, b);
    // Each row is its own Philox sequence (id = row index): its tokens do not depend on what
    // the other rows hold.
    let mut other = data;
    other[..6].copy_from_slice(&[5.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
    write_npy(&d.path("other.npy"), &[3, 3], &other);
    let b = ok(&["sample", "--chain", "dist", "--logits", &d.s("other.npy"), "--n", "4"]);
    let row2 = |s: &str| lines(s).into_iter().filter(|l| l["row"] == 2).map(|l| l["token"].clone()).collect::<Vec<_>>();
    assert_eq!(row2(&a), row2(&b));
}

#[test]
fn each_token_is_accepted_before_the_next_step() {
    let d = Dir::new("steps");
    write_npy(&d.path("in.npy"), &[3], &[1.0f32, 4.0, 3.5]);
    let out =
        lines(&ok(&["sample", "--chain", "penalties(64,100,0,0);greedy", "--logits", &d.s("in.npy"), "--n", "3"]));
    let tokens: Vec<u64> = out.iter().map(|l| l["token"].as_u64().unwrap()).collect();
    assert_eq!(tokens, [1, 2, 0]);
    // The history counts too.
    let out = lines(&ok(&[
        "sample",
        "--chain",
        "penalties(64,100,0,0);greedy",
        "--logits",
        &d.s("in.npy"),
        "--history",
        "1",
    ]));
    assert_eq!(out[0]["token"], 2);
}

#[test]
fn logprobs_raw_and_processed() {
    let d = Dir::new("logprobs");
    let row = [1.0f32, 4.0, NEG, 3.5, 0.2];
    write_npy(&d.path("in.npy"), &[5], &row);
    let out = lines(&ok(&["sample", "--chain", "top_k(2);greedy", "--logits", &d.s("in.npy"), "--logprobs", "5"]));
    let top = out[0]["top_logprobs"].as_array().unwrap();
    let ids: Vec<u64> = top.iter().map(|t| t["token"].as_u64().unwrap()).collect();
    assert_eq!(ids, [1, 3, 0, 4, 2]);
    assert!((top[1]["logprob"].as_f64().unwrap() - log_softmax(&row, 3)).abs() < 1e-6);
    // -inf has no JSON form: the lowest finite f32, as llama.cpp prints it.
    assert_eq!(top[4]["logprob"].as_f64().unwrap() as f32, f32::MIN);

    let out = lines(&ok(&[
        "sample",
        "--chain",
        "top_k(2);greedy",
        "--logits",
        &d.s("in.npy"),
        "--logprobs",
        "5",
        "--logprobs-mode",
        "processed",
    ]));
    let top = out[0]["top_logprobs"].as_array().unwrap();
    assert_eq!(top.len(), 2);
    let p1 = 1.0 / (1.0 + (-0.5f64).exp());
    assert!((out[0]["logprob"].as_f64().unwrap() - p1.ln()).abs() < 1e-6);
}

#[test]
fn params_bodies_in_both_flavours() {
    let d = Dir::new("params");
    write_npy(&d.path("in.npy"), &[5], &ROW);
    let body = |name: &str, json: &str| {
        std::fs::write(d.path(name), json).unwrap();
        d.s(name)
    };
    // llama.cpp server body: top-k 1 then dist is greedy; n_probs asks for alternatives.
    let llama = body("llama.json", r#"{"top_k": 1, "samplers": ["top_k"], "seed": 3, "n_probs": 2, "n_predict": 8}"#);
    let out = lines(&ok(&["sample", "--params", &llama, "--logits", &d.s("in.npy")]));
    assert_eq!(out[0]["token"], 1);
    assert_eq!(out[0]["top_logprobs"].as_array().unwrap().len(), 2);
    // OpenAI body: temperature 0 is greedy; logprobs/top_logprobs as in llama.cpp's server.
    let openai = body(
        "openai.json",
        r#"{"model": "m", "messages": [], "temperature": 0, "logprobs": true, "top_logprobs": 3, "logit_bias": {"2": 100}}"#,
    );
    let out = lines(&ok(&["sample", "--params", &openai, "--logits", &d.s("in.npy"), "--n", "2"]));
    assert_eq!(out.len(), 2);
    assert_eq!(out[0]["token"], 2);
    assert_eq!(out[0]["top_logprobs"].as_array().unwrap().len(), 3);
    // --logprobs overrides the body; post_sampling_probs switches to processed logprobs.
    let post = body("post.json", r#"{"top_k": 2, "samplers": "k", "post_sampling_probs": true, "n_probs": 5}"#);
    let out = lines(&ok(&["sample", "--params", &post, "--logits", &d.s("in.npy"), "--logprobs", "1"]));
    assert_eq!(out[0]["top_logprobs"].as_array().unwrap().len(), 1);
    let out = lines(&ok(&["sample", "--params", &post, "--logits", &d.s("in.npy")]));
    assert_eq!(out[0]["top_logprobs"].as_array().unwrap().len(), 2, "processed mode reports survivors only");
    // apply with a body: llama.cpp's default chain without the final draw's effect.
    let default = body("default.json", r#"{"temperature": 0.8}"#);
    ok(&["apply", "--params", &default, "--logits", &d.s("in.npy"), "--out", &d.s("out.npy")]);
    let out = read_npy_f32(&d.path("out.npy")).1;
    assert_eq!(out, [NEG, 4.0 / 0.8, 3.5 / 0.8, NEG, NEG]);
    // Without --chain or --params: the same default chain.
    ok(&["apply", "--logits", &d.s("in.npy"), "--out", &d.s("out2.npy")]);
    assert_eq!(read_npy_f32(&d.path("out2.npy")).1, out);
    // The body's seed is used unless --seed is given.
    let seeded = body("seeded.json", r#"{"seed": 11, "top_k": 0, "min_p": 0, "top_p": 1, "temperature": 1.5}"#);
    let unseeded = body("unseeded.json", r#"{"top_k": 0, "min_p": 0, "top_p": 1, "temperature": 1.5}"#);
    let a = ok(&["sample", "--params", &seeded, "--logits", &d.s("in.npy"), "--n", "16"]);
    let b = ok(&["sample", "--params", &unseeded, "--logits", &d.s("in.npy"), "--n", "16", "--seed", "11"]);
    assert_eq!(a, b);
    // repeat_last_n -1 covers the whole sequence.
    let ctx = body(
        "ctx.json",
        r#"{"repeat_last_n": -1, "repeat_penalty": 100, "samplers": ["penalties", "temperature"], "temperature": 0}"#,
    );
    let out = lines(&ok(&["sample", "--params", &ctx, "--logits", &d.s("in.npy"), "--n", "3"]));
    let tokens: Vec<u64> = out.iter().map(|l| l["token"].as_u64().unwrap()).collect();
    assert_eq!(tokens, [1, 2, 0]);
}

#[test]
fn the_example_row_is_built_in() {
    let out = lines(&ok(&["sample", "--example", "--chain", "greedy", "--logprobs", "1"]));
    assert_eq!(out[0]["token"], 7042, "\" Paris\" in SmolLM2's vocabulary");
    assert!((out[0]["logprob"].as_f64().unwrap() - 0.773f64.ln()).abs() < 0.01);
    let out = lines(&ok(&["sample", "--example", "--n", "5", "--logprobs", "5", "--seed", "42"]));
    assert_eq!(out.len(), 5);
}

#[test]
fn help_has_examples() {
    for cmd in ["apply", "sample"] {
        let o = ok(&[cmd, "--help"]);
        assert!(o.contains("Examples:") && o.contains(&format!("tokensieve {cmd}")), "{o}");
    }
}

#[test]
fn errors_exit_2_with_one_line() {
    let d = Dir::new("errors");
    write_npy(&d.path("in.npy"), &[5], &ROW);
    write_npy(&d.path("nan.npy"), &[3], &[0.0f32, f32::NAN, 1.0]);
    write_npy(&d.path("empty.npy"), &[0], &[] as &[f32]);
    write_npy(&d.path("emptyrow.npy"), &[2, 0], &[] as &[f32]);
    write_npy(&d.path("ints.npy"), &[3], &[1i32, 2, 3]);
    write_npy(&d.path("cube.npy"), &[1, 1, 2], &[1.0f32, 2.0]);
    std::fs::write(d.path("junk.npy"), b"not numpy").unwrap();
    std::fs::write(d.path("badfield.json"), r#"{"temperature": "hot"}"#).unwrap();
    std::fs::write(d.path("unknown.json"), r#"{"top_q": 1}"#).unwrap();
    std::fs::write(d.path("badjson.json"), r#"{"temperature": 0.8"#).unwrap();
    std::fs::write(d.path("range.json"), r#"{"logprobs": true, "top_logprobs": 50}"#).unwrap();
    std::fs::write(d.path("n.json"), r#"{"n": 3}"#).unwrap();
    std::fs::write(d.path("bias.json"), r#"{"logit_bias": [[9, 1]]}"#).unwrap();
    let input = d.s("in.npy");
    let sample = |extra: &[&str]| {
        let mut args = v(&["sample", "--logits", &input]);
        args.extend(v(extra));
        args
    };
    let cases: Vec<(Vec<String>, &str)> = vec![
        (sample(&["--chain", "top_k(40"]), "unclosed bracket"),
        (sample(&["--chain", "top_z(3);dist"]), "unknown stage `top_z`"),
        (sample(&["--chain", "min_p(0.05,-1);dist"]), "`min_keep` must be >= 0"),
        (sample(&["--chain", "top_k(40);top_p(0.9,1)"]), "does not select a token"),
        (sample(&["--chain", "greedy;top_k(3)"]), "must be the last stage"),
        (sample(&["--chain", "dist", "--rng", "mt19937", "--seed", "4294967296"]), "32 bits"),
        (sample(&["--chain", "greedy", "--history", "1,5"]), "token id 5 is out of range"),
        (sample(&["--chain", "greedy", "--history", "1,-2"]), "token id -2"),
        (sample(&["--chain", "greedy", "--history", "one"]), "`one` is not a token id"),
        (sample(&["--params", &d.s("badfield.json")]), "field `temperature`"),
        (sample(&["--params", &d.s("unknown.json")]), "field `top_q`: unknown field"),
        (sample(&["--params", &d.s("badjson.json")]), "not valid JSON"),
        (sample(&["--params", &d.s("range.json")]), "field `top_logprobs`"),
        (sample(&["--params", &d.s("n.json")]), "field `n`"),
        (sample(&["--params", &d.s("bias.json")]), "logit_bias: token id 9 is out of range"),
        (sample(&["--params", &d.s("missing.json")]), "cannot read"),
        (sample(&["--chain", "greedy", "--params", &d.s("n.json")]), "cannot be used with"),
        (sample(&["--convention", "transformers", "--chain", "top_p(1.5);dist"]), "top_p: parameter `p`"),
        (sample(&["--convention", "transformers", "--chain", "penalties(64,1.1,0,0);dist"]), "--convention llama.cpp"),
        (sample(&["--convention", "vllm"]), "unknown convention"),
        (sample(&["--n", "0"]), "--n"),
        (sample(&["--logprobs-mode", "cooked"]), "cooked"),
        (v(&["sample", "--chain", "greedy", "--logits", &d.s("nan.npy")]), "logit of token 1 is NaN"),
        (v(&["sample", "--chain", "greedy", "--logits", &d.s("empty.npy")]), "empty"),
        (v(&["sample", "--chain", "greedy", "--logits", &d.s("emptyrow.npy")]), "empty"),
        (v(&["sample", "--chain", "greedy", "--logits", &d.s("ints.npy")]), "must be f32 or f16"),
        (v(&["sample", "--chain", "greedy", "--logits", &d.s("cube.npy")]), "shape [V] or [B, V]"),
        (v(&["sample", "--chain", "greedy", "--logits", &d.s("junk.npy")]), "not a valid .npy"),
        (v(&["sample", "--chain", "greedy", "--logits", &d.s("nope.npy")]), "cannot read"),
        (v(&["sample", "--chain", "greedy"]), "--logits"),
        (v(&["sample", "--chain", "greedy", "--logits", &d.s("in.npy"), "--example"]), "cannot be used with"),
        (v(&["apply", "--chain", "top_k(2)", "--logits", &d.s("nan.npy"), "--out", &d.s("o.npy")]), "NaN"),
        (v(&["apply", "--chain", "top_k(2)", "--logits", &d.s("in.npy")]), "--out"),
        (
            v(&["apply", "--chain", "top_k(2)", "--logits", &d.s("in.npy"), "--out", &d.s("no/such/dir/o.npy")]),
            "cannot create",
        ),
        (
            v(&["apply", "--chain", "top_k(2)", "--logits", &d.s("in.npy"), "--out", &d.s("o.npy"), "--bogus"]),
            "--bogus",
        ),
        (v(&["frobnicate"]), "frobnicate"),
    ];
    for (args, needle) in &cases {
        fails(args, needle);
    }
    // A chain that leaves nothing to select is bad input too.
    write_npy(&d.path("masked.npy"), &[3], &[NEG, NEG, NEG]);
    fails(&["sample", "--chain", "dist", "--logits", &d.s("masked.npy")], "no candidate");
}
