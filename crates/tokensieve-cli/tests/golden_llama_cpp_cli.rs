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

use npyz::WriterBuilder;
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
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

fn write_row(path: &Path, row: &[f32]) {
    let mut buf = Vec::new();
    let mut w = npyz::WriteOptions::<f32>::new()
        .default_dtype()
        .shape(&[row.len() as u64])
        .writer(&mut buf)
        .begin_nd()
        .unwrap();
    w.extend(row.iter().copied()).unwrap();
    w.finish().unwrap();
    std::fs::write(path, buf).unwrap();
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
    let o = Command::new(BIN).args(args).output().expect("running tokensieve");
    let stderr = String::from_utf8_lossy(&o.stderr).trim().to_string();
    match o.status.code() {
        Some(0) => Ok(String::from_utf8(o.stdout).expect("utf-8 stdout")),
        Some(2) if stderr.starts_with("error: ") && stderr.lines().count() == 1 => Err(Outcome::Error(stderr)),
        code => Err(Outcome::Mismatch(format!("exit status {code:?}, stderr: {stderr}"))),
    }
}

fn run_case(set: &Set, c: &Case, row_path: &Path, out_path: &Path) -> Outcome {
    let mut apply = vec!["apply".to_string()];
    apply.extend(common_args(set, c, row_path));
    apply.extend(["--out".to_string(), out_path.to_str().unwrap().into()]);
    if let Err(outcome) = run(&apply) {
        return outcome;
    }
    let bytes = std::fs::read(out_path).expect("reading OUT.npy");
    let _ = std::fs::remove_file(out_path);
    let file = npyz::NpyFile::new(&bytes[..]).expect("OUT.npy parses");
    if file.shape() != [set.rows[c.row].vocab as u64] {
        return Outcome::Mismatch(format!("OUT.npy shape {:?}", file.shape()));
    }
    let dense: Vec<f32> = file.into_vec().expect("OUT.npy is f32");
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
    let dir: PathBuf = std::env::temp_dir().join(format!("tokensieve-golden-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();

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
            write_row(&dir.join(format!("row-{}.npy", c.row)), set.row(c));
        }
    }

    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<(usize, Outcome)>> = Mutex::new(Vec::with_capacity(cases.len()));
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, 8);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(c) = cases.get(i) else { break };
                let row_path = dir.join(format!("row-{}.npy", c.row));
                let out_path = dir.join(format!("out-{}.npy", c.id));
                let outcome = run_case(&set, c, &row_path, &out_path);
                results.lock().unwrap().push((i, outcome));
            });
        }
    });
    let _ = std::fs::remove_dir_all(&dir);

    let mut results = results.into_inner().unwrap();
    results.sort_by_key(|r| r.0);
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
