//! `tokensieve bench`: the JSON-lines contract and the errors (timings themselves are not
//! asserted: no timed assertions in tests).

use serde_json::Value;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_tokensieve");

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).output().expect("runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn json_lines_have_the_contract_keys() {
    let (code, stdout, stderr) = run(&[
        "bench",
        "--vocab",
        "3000,5000",
        "--seconds",
        "0.01",
        "--json",
        "--chain",
        "top_k(40);temperature(0.8);dist",
        "--chain",
        "greedy",
        "--chain",
        "logprobs(5)",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let lines: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).expect("a JSON object per line")).collect();
    assert_eq!(lines.len(), 6);
    for l in &lines {
        for key in ["chain", "vocab", "batch", "threads", "median_us", "p90_us", "floor_us", "ratio"] {
            assert!(l.get(key).is_some(), "missing `{key}` in {l}");
        }
        assert!(l["median_us"].as_f64().unwrap() > 0.0 && l["floor_us"].as_f64().unwrap() > 0.0);
        assert!(l["p90_us"].as_f64().unwrap() >= l["median_us"].as_f64().unwrap());
    }
    assert_eq!(lines[0]["vocab"], 3000);
    assert_eq!(lines[3]["vocab"], 5000);
    assert_eq!(lines[1]["chain"], "greedy");
    assert_eq!(lines[1]["path"], "fast:greedy");
}

#[test]
fn batch_mode_and_every_row_shape_run() {
    for rows in ["peaked", "flat", "wide", "real"] {
        let (code, stdout, stderr) = run(&[
            "bench",
            "--vocab",
            "2048",
            "--batch",
            "3",
            "--threads",
            "2",
            "--rows",
            rows,
            "--seconds",
            "0.01",
            "--chain",
            "top_p(0.95,1);dist",
        ]);
        assert_eq!(code, 0, "{rows}: {stderr}");
        assert!(stdout.contains("top_p(0.95,1);dist"), "{rows}: {stdout}");
    }
}

#[test]
fn a_batch_on_several_threads_reports_its_speedup_over_one() {
    let bench = |threads: &str| {
        let (code, stdout, stderr) = run(&[
            "bench",
            "--vocab",
            "2048",
            "--batch",
            "4",
            "--threads",
            threads,
            "--seconds",
            "0.01",
            "--json",
            "--chain",
            "top_k(40);temperature(0.8);dist",
            "--chain",
            "logprobs(5)",
        ]);
        assert_eq!(code, 0, "{stderr}");
        stdout.lines().map(|l| serde_json::from_str(l).expect("a JSON object per line")).collect::<Vec<Value>>()
    };
    let two = bench("2");
    assert_eq!(two.len(), 2);
    for l in &two {
        assert_eq!(l["threads"], 2);
        let speedup = l["speedup_vs_1_thread"].as_f64().unwrap_or_else(|| panic!("no speed-up in {l}"));
        assert!(speedup.is_finite() && speedup > 0.0, "{l}");
    }
    // One thread has nothing to compare with.
    assert!(bench("1").iter().all(|l| l.get("speedup_vs_1_thread").is_none()));
}

#[test]
fn the_transformers_convention_runs_its_own_default_table() {
    let (code, stdout, stderr) =
        run(&["bench", "--convention", "transformers", "--vocab", "2000", "--seconds", "0.01", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let lines: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).expect("a JSON object per line")).collect();
    assert_eq!(lines.len(), 7);
    assert!(lines.iter().all(|l| l["convention"] == "transformers"), "{stdout}");
    assert!(lines[1]["chain"].as_str().unwrap().starts_with("repetition_penalty("), "{stdout}");
}

#[test]
fn half_precision_rows_run_alone_and_in_batches() {
    for dtype in ["f16", "bf16"] {
        for batch in ["1", "3"] {
            let (code, stdout, stderr) =
                run(&["bench", "--dtype", dtype, "--batch", batch, "--vocab", "3000", "--seconds", "0.01", "--json"]);
            assert_eq!(code, 0, "{stderr}");
            let lines: Vec<serde_json::Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
            assert_eq!(lines.len(), 7, "{stdout}");
            assert!(lines.iter().all(|l| l["dtype"] == dtype && l["median_us"].as_f64().unwrap() > 0.0), "{stdout}");
        }
    }
}

#[test]
fn bad_chains_and_options_are_one_line_errors() {
    for args in [
        &["bench", "--convention", "vllm", "--seconds", "0.01"][..],
        &["bench", "--convention", "transformers", "--chain", "penalties(64,1.1,0,0)", "--seconds", "0.01"],
        &["bench", "--chain", "top_k(", "--seconds", "0.01"],
        &["bench", "--chain", "logprobs(x)"],
        &["bench", "--seconds", "0"],
        &["bench", "--vocab", "0"],
        &["bench", "--offset", "3"],
        &["bench", "--offset", "64"],
        &["bench", "--offset", "x"],
    ] {
        let (code, stdout, stderr) = run(args);
        assert_eq!(code, 2, "{args:?}: {stdout} {stderr}");
        assert!(stderr.starts_with("error:") && stderr.trim().lines().count() == 1, "{args:?}: {stderr}");
    }
}

#[test]
fn rows_start_where_offset_says() {
    for offset in ["0", "16", "60"] {
        let (code, stdout, stderr) =
            run(&["bench", "--vocab", "3000", "--offset", offset, "--seconds", "0.01", "--json", "--chain", "greedy"]);
        assert_eq!(code, 0, "{stderr}");
        let line: Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
        assert_eq!(line["offset"].to_string(), offset, "{line}");
        assert_eq!(line["path"], "fast:greedy");
    }
    let (code, stdout, stderr) =
        run(&["bench", "--vocab", "3000", "--offset", "16", "--seconds", "0.01", "--chain", "greedy"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("16 bytes past a 64-byte boundary"), "{stdout}");
}
