//! Grammar-mask benchmark: one thread, a real vocabulary (Llama-3's 128,256 tokens by
//! default), llama.cpp's `json.gbnf` and JSON schemas converted to GBNF, walking JSON documents
//! token by token (mask, then accept), as MaskBench measures.
//!
//! ```text
//! cargo run --release -p tokensieve-bench --bin grammar [-- --vocab PATH --repeat 5] [--json | --write BENCHMARKS.md]
//! ```
//!
//! `--write` replaces the "Grammar masks" section of BENCHMARKS.md (the `report` binary keeps
//! that section when it rewrites the rest).
//!
//! Documents are split into tokens by greedy longest match over the vocabulary (a valid token
//! sequence for the same bytes; not the model tokenizer's own split). Each document is walked
//! twice: *cold* with a fresh matcher (nothing cached: what the first request with a new
//! grammar costs) and *warm* with a matcher that shares the caches of earlier walks of the
//! same grammar (what a server reusing a compiled grammar sees).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use tokensieve_grammar::json_schema::{json_schema_str_to_gbnf, SchemaOptions};
use tokensieve_grammar::vocab::Vocab;
use tokensieve_grammar::{is_allowed, Grammar, Matcher, TokenIndex};

/// (name, schema or None for json.gbnf, documents)
fn workloads() -> Vec<(&'static str, Option<&'static str>, Vec<&'static str>)> {
    vec![
        (
            "json.gbnf",
            None,
            vec![
                r#"{"id": 1234, "title": "Grammar-constrained decoding", "tags": ["llm", "json", "gbnf"], "score": 0.875, "draft": false}"#,
                r#"{"user": {"name": "Zoë Müller", "email": "zoe@example.com", "age": 31}, "orders": [{"sku": "A-100", "qty": 2, "price": 19.99}, {"sku": "B-7", "qty": 1, "price": 5.5}], "note": "Leave at the door\nThanks!"}"#,
                r#"{"matrix": [[1, 0, 0], [0, 1, 0], [0, 0, 1]], "labels": {"x": "east", "y": "north", "z": "up"}, "meta": null}"#,
                r#"{"text": "The quick brown fox jumps over the lazy dog. Le renard brun rapide saute par-dessus le chien paresseux. 速い茶色の狐がのろまな犬を飛び越える。", "lang": ["en", "fr", "ja"]}"#,
            ],
        ),
        (
            "schema: tool call",
            Some(
                r#"{"type": "object", "properties": {"name": {"type": "string", "enum": ["get_weather", "search_web"]}, "arguments": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "minimum": 1, "maximum": 14}}, "required": ["city", "unit", "days"], "additionalProperties": false}}, "required": ["name", "arguments"], "additionalProperties": false}"#,
            ),
            vec![
                r#"{"name": "get_weather", "arguments": {"city": "San Francisco", "unit": "celsius", "days": 3}}"#,
                r#"{"name": "search_web", "arguments": {"city": "Zürich", "unit": "fahrenheit", "days": 14}}"#,
            ],
        ),
        (
            "schema: person",
            Some(
                r#"{"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 64}, "age": {"type": "integer", "minimum": 0}, "email": {"type": "string", "format": "email"}, "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["street", "city", "zip"], "additionalProperties": false}, "phones": {"type": "array", "items": {"type": "string"}, "maxItems": 4}}, "required": ["name", "age", "address", "phones"], "additionalProperties": false}"#,
            ),
            vec![
                r#"{"name": "Ada Lovelace", "age": 36, "address": {"street": "12 St James's Square", "city": "London", "zip": "10001"}, "phones": ["+44 20 7946 0018", "+44 20 7946 0019"]}"#,
            ],
        ),
        (
            "schema: catalog",
            Some(
                r#"{"type": "object", "properties": {"products": {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}, "price": {"type": "number"}, "in_stock": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["id", "name", "price", "in_stock", "tags"], "additionalProperties": false}}, "total": {"type": "number"}}, "required": ["products", "total"], "additionalProperties": false}"#,
            ),
            vec![
                r#"{"products": [{"id": 1, "name": "Keyboard", "price": 49.9, "in_stock": true, "tags": ["usb", "mechanical"]}, {"id": 2, "name": "Mouse", "price": 19.5, "in_stock": false, "tags": []}, {"id": 3, "name": "Monitor 27\"", "price": 229, "in_stock": true, "tags": ["4k", "ips", "hdr"]}], "total": 298.4}"#,
            ],
        ),
    ]
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i]
}

struct Walk {
    masks_us: Vec<f64>,
    accepts_us: Vec<f64>,
}

fn walk(m: &mut Matcher, index: &TokenIndex, doc: &str, mask: &mut [u32], out: &mut Walk) -> Result<(), String> {
    let tokens = index.greedy_tokenize(doc.as_bytes()).ok_or("the vocabulary does not cover the document")?;
    for &t in &tokens {
        let start = Instant::now();
        m.fill_mask(mask).map_err(|e| e.to_string())?;
        out.masks_us.push(start.elapsed().as_secs_f64() * 1e6);
        if !is_allowed(mask, t) {
            return Err(format!(
                "token {t} {:?} is masked: the document does not fit the grammar",
                index.token_bytes(t)
            ));
        }
        let start = Instant::now();
        m.accept_token(t).map_err(|e| e.to_string())?;
        out.accepts_us.push(start.elapsed().as_secs_f64() * 1e6);
    }
    let start = Instant::now();
    m.fill_mask(mask).map_err(|e| e.to_string())?;
    out.masks_us.push(start.elapsed().as_secs_f64() * 1e6);
    if !m.is_complete() {
        return Err("the document is not a complete sentence of the grammar".into());
    }
    Ok(())
}

fn default_vocab() -> Option<PathBuf> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.ancestors().map(|a| a.join("shared/data/vocab/ggml-vocab-llama-bpe.gguf")).find(|p| p.exists()).or_else(|| {
        std::env::var_os("TOKENSIEVE_SHARED").map(|s| Path::new(&s).join("data/vocab/ggml-vocab-llama-bpe.gguf"))
    })
}

fn json_gbnf() -> Result<String, String> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = here
        .ancestors()
        .map(|a| a.join("shared/grammar/llama.cpp/grammars/json.gbnf"))
        .find(|p| p.exists())
        .ok_or("shared/grammar/llama.cpp/grammars/json.gbnf not found")?;
    std::fs::read_to_string(path).map_err(|e| e.to_string())
}

fn summary(label: &str, values: &mut [f64]) -> serde_json::Value {
    values.sort_by(f64::total_cmp);
    let (p50, p90, p99, max) = (
        percentile(values, 0.5),
        percentile(values, 0.9),
        percentile(values, 0.99),
        values.last().copied().unwrap_or(f64::NAN),
    );
    let mean = values.iter().sum::<f64>() / values.len().max(1) as f64;
    serde_json::json!({"what": label, "n": values.len(), "p50_us": p50, "p90_us": p90, "p99_us": p99, "max_us": max, "mean_us": mean})
}

/// One full measurement: every workload, cold and warm; the report as JSON.
fn measure(
    index: &Arc<TokenIndex>,
    vocab_path: &Path,
    (read_ms, index_ms, floor_us): (f64, f64, f64),
    mask: &mut [u32],
) -> Result<serde_json::Value, String> {
    let mut rows = Vec::new();
    let (mut all_cold, mut all_warm, mut all_accept, mut compiles) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let gbnf_json = json_gbnf()?;
    for (name, schema, docs) in workloads() {
        let start = Instant::now();
        let text = match schema {
            None => gbnf_json.clone(),
            Some(s) => json_schema_str_to_gbnf(s, &SchemaOptions::default()).map_err(|e| format!("{name}: {e}"))?,
        };
        let grammar = Grammar::new(&text).map_err(|e| format!("{name}: {e}"))?;
        let depth: Option<usize> = std::env::var("TOKENSIEVE_MASK_DEPTH").ok().and_then(|d| d.parse().ok());
        let new_matcher = || {
            let mut m = Matcher::with_vocab(&grammar, index.clone()).map_err(|e| e.to_string())?;
            if let Some(d) = depth {
                m.set_cache_depth(d);
            }
            Ok::<_, String>(m)
        };
        let template = new_matcher()?;
        let compile_us = start.elapsed().as_secs_f64() * 1e6;
        compiles.push(compile_us);
        let mut cold = Walk { masks_us: Vec::new(), accepts_us: Vec::new() };
        let mut warm = Walk { masks_us: Vec::new(), accepts_us: Vec::new() };
        for doc in &docs {
            let mut fresh = new_matcher()?;
            walk(&mut fresh, index, doc, mask, &mut cold).map_err(|e| format!("{name}: {e}"))?;
        }
        // Warm: two passes over the documents on clones of one matcher (shared caches); the
        // second pass is measured.
        for pass in 0..2 {
            for doc in &docs {
                let mut m = template.clone();
                m.reset();
                let mut sink = Walk { masks_us: Vec::new(), accepts_us: Vec::new() };
                walk(&mut m, index, doc, mask, if pass == 1 { &mut warm } else { &mut sink })
                    .map_err(|e| format!("{name}: {e}"))?;
            }
        }
        all_cold.extend_from_slice(&cold.masks_us);
        all_warm.extend_from_slice(&warm.masks_us);
        all_accept.extend_from_slice(&cold.accepts_us);
        rows.push(serde_json::json!({
            "grammar": name,
            "compile_us": compile_us,
            "mask_cold": summary("mask, cold", &mut cold.masks_us),
            "mask_warm": summary("mask, warm", &mut warm.masks_us),
            "accept": summary("accept", &mut cold.accepts_us),
        }));
    }
    compiles.sort_by(f64::total_cmp);
    Ok(serde_json::json!({
        "vocab": vocab_path.display().to_string(),
        "n_vocab": index.len(),
        "trie_nodes": index.trie_nodes(),
        "vocab_read_ms": read_ms,
        "index_build_ms": index_ms,
        "floor_mask_write_us": floor_us,
        "grammars": rows,
        "all": {
            "mask_cold": summary("mask, cold", &mut all_cold),
            "mask_warm": summary("mask, warm", &mut all_warm),
            "accept": summary("accept", &mut all_accept),
            "compile_max_us": compiles.last().copied().unwrap_or(f64::NAN),
        }
    }))
}

/// The median, leaf by leaf, of reports with the same shape (numbers; other leaves from the
/// first report).
fn median_report(reports: &[serde_json::Value]) -> serde_json::Value {
    use serde_json::Value;
    match &reports[0] {
        Value::Number(_) => {
            let mut v: Vec<f64> = reports.iter().filter_map(Value::as_f64).collect();
            v.sort_by(f64::total_cmp);
            serde_json::json!(v[v.len() / 2])
        }
        Value::Object(map) => Value::Object(
            map.keys()
                .map(|k| (k.clone(), median_report(&reports.iter().map(|r| r[k].clone()).collect::<Vec<_>>())))
                .collect(),
        ),
        Value::Array(items) => Value::Array(
            (0..items.len())
                .map(|i| median_report(&reports.iter().map(|r| r[i].clone()).collect::<Vec<_>>()))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let json_out = args.iter().any(|a| a == "--json");
    let vocab_path = match args.iter().position(|a| a == "--vocab") {
        Some(i) => PathBuf::from(args.get(i + 1).ok_or("--vocab needs a path")?),
        None => default_vocab().ok_or("no vocabulary: pass --vocab PATH (GGUF or tokenizer.json)")?,
    };

    let start = Instant::now();
    let vocab = Vocab::from_file(&vocab_path).map_err(|e| e.to_string())?;
    let read_ms = start.elapsed().as_secs_f64() * 1e3;
    let start = Instant::now();
    let index = Arc::new(TokenIndex::from_vocab(&vocab));
    let index_ms = start.elapsed().as_secs_f64() * 1e3;
    let mut mask = vec![0u32; index.words()];
    // The floor: one pass writing the mask (what any engine must at least do per step).
    let mut floor = Vec::new();
    for _ in 0..200 {
        let start = Instant::now();
        mask.fill(std::hint::black_box(u32::MAX));
        std::hint::black_box(&mask);
        floor.push(start.elapsed().as_secs_f64() * 1e6);
    }
    floor.sort_by(f64::total_cmp);

    let repeats: usize = match args.iter().position(|a| a == "--repeat") {
        Some(i) => args.get(i + 1).and_then(|r| r.parse().ok()).filter(|&r| r > 0).ok_or("--repeat needs a count")?,
        None => 5,
    };
    let mut reports = Vec::new();
    for _ in 0..repeats {
        reports.push(measure(&index, &vocab_path, (read_ms, index_ms, percentile(&floor, 0.5)), &mut mask)?);
    }
    let report = median_report(&reports);
    if json_out {
        println!("{}", serde_json::to_string_pretty(&report).unwrap());
        return Ok(());
    }
    let mut md = String::new();
    use std::fmt::Write as _;
    let _ = writeln!(
        md,
        "vocabulary: {} ({} tokens, {} trie nodes): read {:.1} ms, index {:.1} ms; floor (write one mask): {:.2} µs\n",
        vocab_path.display(),
        index.len(),
        index.trie_nodes(),
        read_ms,
        index_ms,
        percentile(&floor, 0.5)
    );
    let _ = writeln!(
        md,
        "| grammar | compile µs | masks | cold p50 / p99 / max µs | warm p50 / p99 / max µs | accept p50 / p99 µs |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|");
    let fmt = |v: &serde_json::Value| {
        format!(
            "{:.1} / {:.1} / {:.1}",
            v["p50_us"].as_f64().unwrap(),
            v["p99_us"].as_f64().unwrap(),
            v["max_us"].as_f64().unwrap()
        )
    };
    for r in report["grammars"].as_array().unwrap().iter().chain([&report["all"]]) {
        let name = r.get("grammar").and_then(|g| g.as_str()).unwrap_or("all");
        let compile = r.get("compile_us").or(r.get("compile_max_us")).and_then(|c| c.as_f64()).unwrap();
        let _ = writeln!(
            md,
            "| {name} | {compile:.0}{} | {} | {} | {} | {:.2} / {:.2} |",
            if name == "all" { " (max)" } else { "" },
            r["mask_cold"]["n"].as_f64().unwrap_or(0.0) as u64,
            fmt(&r["mask_cold"]),
            fmt(&r["mask_warm"]),
            r["accept"]["p50_us"].as_f64().unwrap(),
            r["accept"]["p99_us"].as_f64().unwrap()
        );
    }
    print!("{md}");
    if let Some(i) = args.iter().position(|a| a == "--write") {
        let path = PathBuf::from(args.get(i + 1).ok_or("--write needs a path")?);
        let old = std::fs::read_to_string(&path).unwrap_or_default();
        let head = old.find(SECTION).map_or(old.as_str(), |at| &old[..at]).trim_end();
        let date = std::process::Command::new("date").arg("+%Y-%m-%d").output().ok();
        let date = date.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).unwrap_or_default();
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .map_or("unknown CPU", |l| l.trim_start_matches([' ', '\t', ':']));
        let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
        let rustc = std::process::Command::new("rustc").arg("--version").output().ok();
        let rustc = rustc.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).unwrap_or_default();
        let text = format!(
            "{head}\n\n{SECTION}\n\nGenerated by `cargo run --release -p tokensieve-bench --bin grammar -- --write BENCHMARKS.md` on {date}, \
             one thread. Masks are timed with `Matcher::fill_mask` into a reused buffer, then the document's token is \
             accepted (`accept` column). *cold*: a fresh matcher per document (first use of the grammar); *warm*: \
             the documents walked again on clones of one matcher, sharing its caches. Documents are split by greedy \
             longest match over the vocabulary. `compile`: JSON Schema → GBNF (for schemas), parse, build and initial \
             state. Each number is the median over {repeats} full runs (`--repeat`); single runs on this shared \
             2-core machine vary by about ±30%.\n\n* machine: {cpu}, {cores} core(s); {rustc}\n* peers (not measured here: no llama.cpp or llguidance \
             build on this machine): MaskBench's published single-thread numbers on the same 128K Llama-3 tokenizer \
             (AMD EPYC 7V13, 2025-03, `shared/reference/gbnf.md` §3.3): llama.cpp mask p50 17,021 µs, p99 60,371 µs, \
             max 1,129,560 µs; llguidance p50 46 µs, p99 533 µs, max 33,055 µs; XGrammar p50 9 µs, p99 5,687 µs.\n\n{md}"
        );
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// The heading of this benchmark's section in BENCHMARKS.md.
const SECTION: &str = "## Grammar masks";
