//! Conformance of the `tokensieve` binary with Hugging Face transformers' own logits processors:
//! every case of `../shared/golden/transformers` (format in its README) run as a user would:
//!
//! * `tokensieve apply --convention transformers --chain SPEC --history IDS --logits row.npy
//!   --out out.npy` must write the expected processed logits bit for bit for every case not
//!   flagged `fragile` (`tie_split` included); fragile cases are counted and reported.
//! * Cases whose ops are a processor list `generate()` builds, with at least three ops, also run
//!   `tokensieve apply --convention transformers --params generation_config.json`, which must
//!   give the same bits.
//!
//! `GOLDEN_FILTER=text` runs only the cases whose spec contains `text`.

use std::collections::HashSet;
use std::path::Path;
use tokensieve_testkit::cli::{self as cli, par_map, read_npy_f32, write_npy_f32, Run, ScratchDir};
use tokensieve_testkit::golden::{
    self,
    transformers::{compare, Case, Class, Set, Tally},
};

const BIN: &str = env!("CARGO_BIN_EXE_tokensieve");

/// `apply` with `source` (`--chain SPEC` or `--params FILE`); the processed row.
fn apply(set: &Set, c: &Case, source: [String; 2], row_path: &Path, out_path: &Path) -> Result<Vec<f32>, String> {
    let mut args: Vec<String> = vec!["apply".into(), "--convention".into(), "transformers".into()];
    args.extend(source);
    args.extend(["--logits".into(), row_path.to_str().unwrap().into()]);
    args.extend(["--out".into(), out_path.to_str().unwrap().into()]);
    let history = set.history(c);
    if !history.is_empty() {
        args.push("--history".into());
        args.push(history.iter().map(u32::to_string).collect::<Vec<_>>().join(","));
    }
    match cli::run(BIN, &args) {
        Run::Ok(_) => {}
        Run::BadInput(e) | Run::Broken(e) => return Err(e),
    }
    let (shape, dense) = read_npy_f32(out_path);
    let _ = std::fs::remove_file(out_path);
    if shape != [set.rows[c.row].vocab as u64] {
        return Err(format!("OUT.npy shape {shape:?}"));
    }
    Ok(dense)
}

#[test]
fn every_transformers_golden_case_through_the_cli() {
    let Some(set) = Set::load() else {
        assert!(
            !golden::goldens_required(),
            "TOKENSIEVE_REQUIRE_GOLDENS=1 but shared/golden/transformers was not found"
        );
        eprintln!("skipped: shared/golden/transformers not found (set TOKENSIEVE_SHARED to its parent's parent)");
        return;
    };
    let dir = ScratchDir::new("golden-transformers-cli");
    let filter = std::env::var("GOLDEN_FILTER").ok();
    let cases: Vec<&Case> =
        set.cases.iter().filter(|c| filter.as_deref().is_none_or(|f| c.spec().contains(f))).collect();
    let mut written = HashSet::new();
    for c in &cases {
        if written.insert(c.row) {
            write_npy_f32(&dir.path(&format!("row-{}.npy", c.row)), &[set.row(c).len() as u64], set.row(c));
        }
    }

    let results = par_map(&cases, |c| {
        let row_path = dir.path(&format!("row-{}.npy", c.row));
        let out_path = dir.path(&format!("out-{}.npy", c.id));
        let by_spec = apply(&set, c, ["--chain".into(), c.spec()], &row_path, &out_path)
            .and_then(|dense| compare(&dense, set.output(c)));
        let by_config = c.generation_config().filter(|_| c.ops.len() >= 3).map(|json| {
            let path = dir.path(&format!("config-{}.json", c.id));
            std::fs::write(&path, json.to_string()).unwrap();
            let r = apply(&set, c, ["--params".into(), path.to_str().unwrap().into()], &row_path, &out_path)
                .and_then(|dense| compare(&dense, set.output(c)))
                .map_err(|e| format!("--params {json}: {e}"));
            let _ = std::fs::remove_file(&path);
            r
        });
        (by_spec, by_config)
    });
    drop(dir);

    let mut tally = Tally::default();
    let mut configs = Tally::default();
    for (c, (by_spec, by_config)) in cases.iter().zip(results) {
        tally.record(&set, c, by_spec);
        if let Some(r) = by_config {
            configs.record(&set, c, r);
        }
    }
    tally.report("CLI --chain");
    configs.report("CLI --params generation_config.json");
    let (ok, n) = tally.class_counts(Class::Robust);
    let (t_ok, t_n) = tally.class_counts(Class::TieSplit);
    assert!(
        tally.failures.is_empty() && configs.failures.is_empty(),
        "{} non-fragile golden cases failed through the CLI ({ok}/{n} robust, {t_ok}/{t_n} tie_split matched), \
         {} through --params",
        tally.failures.len(),
        configs.failures.len()
    );
}
