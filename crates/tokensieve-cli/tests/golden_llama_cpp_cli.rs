//! Conformance of the `tokensieve` binary with llama.cpp's own sampler library: every case of
//! `../shared/golden/llama.cpp` (format in its README) run through the CLI as a user would.
//!
//! * `tokensieve apply --chain CHAIN --rng mt19937 --seed SEED --history IDS --logits row.npy
//!   --out out.npy` must write output (a), the processed logits in vocabulary order, bit for bit.
//! * Cases that select a token (`n_steps` = 8) also run `tokensieve sample … --n 8`, whose
//!   token stream must equal the golden one.
//!
//! `degenerate` cases (a stage received only `-inf` logits, where llama.cpp samples a masked
//! token from NaN probabilities) may instead exit with status 2 and a "no candidate" error.
//! `GOLDEN_FILTER=text` runs only the cases whose group or chain contains `text`.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use tokensieve_testkit::cli::{self as cli, par_map, read_npy_f32, write_npy_f32, Run, ScratchDir};
use tokensieve_testkit::golden::{
    self,
    llama_cpp::{same_bits, Case, Set},
};

const BIN: &str = env!("CARGO_BIN_EXE_tokensieve");

enum Outcome {
    Match,
    /// Exit status 2 with this message.
    Error(String),
    Mismatch(String),
}

fn common_args(set: &Set, c: &Case, row_path: &Path) -> Vec<String> {
    let mut args = vec![
        "--chain".to_string(),
        c.chain.clone(),
        "--rng".into(),
        "mt19937".into(),
        "--seed".into(),
        c.seed.unwrap_or(0).to_string(),
        "--logits".into(),
        row_path.to_str().unwrap().into(),
    ];
    let history = set.history(c);
    if !history.is_empty() {
        args.push("--history".into());
        args.push(history.iter().map(u32::to_string).collect::<Vec<_>>().join(","));
    }
    args
}

/// Runs the binary; `Ok(stdout)` on success, `Err(outcome)` otherwise.
fn run(args: &[String]) -> Result<String, Outcome> {
    match cli::run(BIN, args) {
        Run::Ok(stdout) => Ok(stdout),
        Run::BadInput(stderr) => Err(Outcome::Error(stderr)),
        Run::Broken(why) => Err(Outcome::Mismatch(why)),
    }
}

fn run_case(set: &Set, c: &Case, row_path: &Path, out_path: &Path) -> Outcome {
    let mut apply = vec!["apply".to_string()];
    apply.extend(common_args(set, c, row_path));
    apply.extend(["--out".to_string(), out_path.to_str().unwrap().into()]);
    if let Err(outcome) = run(&apply) {
        return outcome;
    }
    let (shape, dense) = read_npy_f32(out_path);
    let _ = std::fs::remove_file(out_path);
    if shape != [set.rows[c.row].vocab as u64] {
        return Outcome::Mismatch(format!("OUT.npy shape {shape:?}"));
    }
    let golden = set.output(c);
    if !same_bits(&dense, golden) {
        let i = dense.iter().zip(golden).position(|(a, b)| a.to_bits() != b.to_bits()).unwrap_or(0);
        return Outcome::Mismatch(format!("(a) differs first at token {i}: ours {} golden {}", dense[i], golden[i]));
    }
    if c.n_steps > 0 {
        let mut sample = vec!["sample".to_string()];
        sample.extend(common_args(set, c, row_path));
        sample.extend(["--n".to_string(), c.n_steps.to_string()]);
        let stdout = match run(&sample) {
            Ok(s) => s,
            Err(outcome) => return outcome,
        };
        let tokens: Vec<u32> = stdout
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
                v["token"].as_u64().expect("a token") as u32
            })
            .collect();
        if tokens != c.tokens {
            return Outcome::Mismatch(format!("tokens: ours {tokens:?} golden {:?}", c.tokens));
        }
    }
    Outcome::Match
}

#[test]
fn every_llama_cpp_golden_case_through_the_cli() {
    let Some(set) = Set::load() else {
        assert!(!golden::goldens_required(), "TOKENSIEVE_REQUIRE_GOLDENS=1 but shared/golden/llama.cpp was not found");
        eprintln!("skipped: shared/golden/llama.cpp not found (set TOKENSIEVE_SHARED to its parent's parent)");
        return;
    };
    let dir = ScratchDir::new("golden-llama-cpp-cli");

    let filter = std::env::var("GOLDEN_FILTER").ok();
    let cases: Vec<&Case> = set
        .cases
        .iter()
        .filter(|c| filter.as_deref().is_none_or(|f| c.group.contains(f) || c.chain.contains(f)))
        .collect();
    // Each input row is written once.
    let mut written = HashSet::new();
    for c in &cases {
        if written.insert(c.row) {
            write_npy_f32(&dir.path(&format!("row-{}.npy", c.row)), &[set.row(c).len() as u64], set.row(c));
        }
    }

    let results: Vec<(usize, Outcome)> = par_map(&cases, |c| {
        let row_path = dir.path(&format!("row-{}.npy", c.row));
        let out_path = dir.path(&format!("out-{}.npy", c.id));
        run_case(&set, c, &row_path, &out_path)
    })
    .into_iter()
    .enumerate()
    .collect();
    drop(dir);

    let mut per_group: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    let mut failures = Vec::new();
    let mut degenerate_errors = 0;
    for (i, outcome) in &results {
        let c = cases[*i];
        let entry = per_group.entry(c.group.as_str()).or_default();
        entry.0 += 1;
        match outcome {
            Outcome::Match => entry.1 += 1,
            Outcome::Error(e) if c.degenerate && e.contains("no candidate") => degenerate_errors += 1,
            Outcome::Error(e) | Outcome::Mismatch(e) => failures.push(format!(
                "case {} [{}] {} (V={}, seed {:?}, degenerate={}): {e}",
                c.id, c.group, c.chain, set.rows[c.row].vocab, c.seed, c.degenerate
            )),
        }
    }
    for (g, (n, ok)) in &per_group {
        eprintln!("{g:24} {ok:5} / {n:5}");
    }
    eprintln!(
        "{} cases through the CLI: {} matched bit for bit, {degenerate_errors} degenerate cases exited with status 2 \
         by design, {} failed",
        cases.len(),
        cases.len() - failures.len() - degenerate_errors,
        failures.len()
    );
    for f in failures.iter().take(40) {
        eprintln!("{f}");
    }
    assert!(failures.is_empty(), "{} golden cases failed through the CLI", failures.len());
}
