//! Loaders for `../shared/golden/*`: outputs of the real reference engines. The format is
//! specified in each set's README; the files are read, never written.

use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Finds the shared data directory: `$TOKENSIEVE_SHARED`, or the first `shared/` beside an
/// ancestor of this crate's directory (the checkout layout: `<root>/main/…` next to
/// `<root>/shared/`).
pub fn shared_dir() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TOKENSIEVE_SHARED") {
        return Some(PathBuf::from(p));
    }
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.ancestors().map(|a| a.join("shared")).find(|p| p.join("golden").is_dir())
}

/// True when the environment demands the goldens be present (`TOKENSIEVE_REQUIRE_GOLDENS=1`,
/// set by `.ci/run`); tests then fail instead of skipping when they are missing.
pub fn goldens_required() -> bool {
    std::env::var("TOKENSIEVE_REQUIRE_GOLDENS").is_ok_and(|v| v == "1")
}

fn read_f32(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
}

fn read_u32(path: &Path) -> Vec<u32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    bytes.chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).collect()
}

/// The llama.cpp golden set (`shared/golden/llama.cpp`, format in its README).
pub mod llama_cpp {
    use super::*;

    /// One input row.
    #[derive(Clone, Debug, Deserialize)]
    pub struct Row {
        /// Row index.
        pub id: usize,
        /// Vocabulary size.
        pub vocab: usize,
        /// How the logits were generated.
        pub kind: String,
        /// Offset into `inputs.f32`.
        pub offset: usize,
    }

    /// One case: a chain run on a row (README §2).
    #[derive(Clone, Debug, Deserialize)]
    #[allow(missing_docs)]
    pub struct Case {
        pub id: usize,
        pub row: usize,
        pub group: String,
        pub chain: String,
        pub seed: Option<u32>,
        pub names: Vec<String>,
        pub history_offset: usize,
        pub history_len: usize,
        pub out_offset: usize,
        pub order_offset: usize,
        pub size: usize,
        pub selected: i64,
        pub data_offset: usize,
        pub n_finite: usize,
        pub n_steps: usize,
        pub tokens: Vec<u32>,
        pub sizes: Vec<usize>,
        pub tie_sensitive: bool,
        pub tie_set: bool,
        pub tie_order: bool,
        pub tie_tokens: bool,
        pub neginf_order: bool,
        pub ub: bool,
        pub degenerate: bool,
        pub stale_sorted: bool,
    }

    #[derive(Deserialize)]
    struct Manifest {
        rows: Vec<Row>,
        cases: Vec<Case>,
    }

    /// The whole set in memory (about 20 MB).
    pub struct Set {
        /// Rows, by id.
        pub rows: Vec<Row>,
        /// Cases, by id.
        pub cases: Vec<Case>,
        inputs: Vec<f32>,
        outputs: Vec<f32>,
        order: Vec<u32>,
        probs: Vec<f32>,
        history: Vec<u32>,
    }

    impl Set {
        /// Loads the set, or `None` when `shared/golden/llama.cpp` is not there.
        pub fn load() -> Option<Set> {
            let dir = shared_dir()?.join("golden").join("llama.cpp");
            let manifest = std::fs::read_to_string(dir.join("manifest.json")).ok()?;
            let m: Manifest = serde_json::from_str(&manifest).expect("manifest.json parses");
            Some(Set {
                rows: m.rows,
                cases: m.cases,
                inputs: read_f32(&dir.join("inputs.f32")),
                outputs: read_f32(&dir.join("outputs.f32")),
                order: read_u32(&dir.join("order.u32")),
                probs: read_f32(&dir.join("probs.f32")),
                history: read_u32(&dir.join("history.u32")),
            })
        }

        /// The input logits of a case.
        pub fn row(&self, c: &Case) -> &[f32] {
            let r = &self.rows[c.row];
            &self.inputs[r.offset..r.offset + r.vocab]
        }
        /// The history accepted before step 1, oldest first.
        pub fn history(&self, c: &Case) -> &[u32] {
            &self.history[c.history_offset..c.history_offset + c.history_len]
        }
        /// Output (a): processed logits in vocabulary order.
        pub fn output(&self, c: &Case) -> &[f32] {
            let v = self.rows[c.row].vocab;
            &self.outputs[c.out_offset..c.out_offset + v]
        }
        /// Output (b): final candidate ids in array order.
        pub fn order(&self, c: &Case) -> &[u32] {
            &self.order[c.order_offset..c.order_offset + c.size]
        }
        /// Output (c): the `p` fields of the final candidates.
        pub fn probs(&self, c: &Case) -> &[f32] {
            &self.probs[c.order_offset..c.order_offset + c.size]
        }
    }

    /// Bitwise equality of two f32 slices (distinguishes -0.0, equates NaN payloads by bits).
    pub fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
    }
}

/// The transformers golden set (`shared/golden/transformers`, format in its README): outputs of
/// Hugging Face transformers' own logits processors.
pub mod transformers {
    use super::*;
    use std::fmt::Write as _;

    /// One input row.
    #[derive(Clone, Debug, Deserialize)]
    pub struct Row {
        /// Row index.
        pub id: usize,
        /// Vocabulary size.
        pub vocab: usize,
        /// How the logits were generated (`gauss`, `zipf`, `ties`, `bf16`, …).
        pub kind: String,
        /// Offset into `inputs.f32`.
        pub offset: usize,
        /// Offset into `history.u32`.
        pub history_offset: usize,
        /// Length of the token history.
        pub history_len: usize,
    }

    /// One processor application, with transformers' constructor arguments.
    #[derive(Clone, Debug, Deserialize, PartialEq)]
    #[serde(tag = "op", rename_all = "snake_case")]
    #[allow(missing_docs)]
    pub enum Op {
        Temperature { temperature: f64 },
        TopK { top_k: i64, min_tokens_to_keep: i64 },
        TopP { top_p: f64, min_tokens_to_keep: i64 },
        MinP { min_p: f64, min_tokens_to_keep: i64 },
        Typical { mass: f64, min_tokens_to_keep: i64 },
        Epsilon { epsilon: f64, min_tokens_to_keep: i64 },
        Eta { epsilon: f64, min_tokens_to_keep: i64 },
        RepetitionPenalty { penalty: f64 },
        NoRepeatNgram { ngram_size: i64 },
        SequenceBias { sequence_bias: Vec<(Vec<i64>, f64)> },
        MinLength { min_length: i64, eos_token_id: Vec<i64> },
    }

    impl Op {
        /// The op's name in the manifest (`top_p`, `no_repeat_ngram`, …).
        pub fn name(&self) -> &'static str {
            match self {
                Op::Temperature { .. } => "temperature",
                Op::TopK { .. } => "top_k",
                Op::TopP { .. } => "top_p",
                Op::MinP { .. } => "min_p",
                Op::Typical { .. } => "typical",
                Op::Epsilon { .. } => "epsilon",
                Op::Eta { .. } => "eta",
                Op::RepetitionPenalty { .. } => "repetition_penalty",
                Op::NoRepeatNgram { .. } => "no_repeat_ngram",
                Op::SequenceBias { .. } => "sequence_bias",
                Op::MinLength { .. } => "min_length",
            }
        }

        /// The op as a spec stage under the transformers convention (parameters as the JSON
        /// doubles were written: Rust prints the shortest round-trip form).
        pub fn spec(&self) -> String {
            match self {
                Op::Temperature { temperature } => format!("temperature({temperature})"),
                Op::TopK { top_k, min_tokens_to_keep } => format!("top_k({top_k},{min_tokens_to_keep})"),
                Op::TopP { top_p, min_tokens_to_keep } => format!("top_p({top_p},{min_tokens_to_keep})"),
                Op::MinP { min_p, min_tokens_to_keep } => format!("min_p({min_p},{min_tokens_to_keep})"),
                Op::Typical { mass, min_tokens_to_keep } => format!("typical({mass},{min_tokens_to_keep})"),
                Op::Epsilon { epsilon, min_tokens_to_keep } => format!("epsilon({epsilon},{min_tokens_to_keep})"),
                Op::Eta { epsilon, min_tokens_to_keep } => format!("eta({epsilon},{min_tokens_to_keep})"),
                Op::RepetitionPenalty { penalty } => format!("repetition_penalty({penalty})"),
                Op::NoRepeatNgram { ngram_size } => format!("no_repeat_ngram({ngram_size})"),
                Op::SequenceBias { sequence_bias } => {
                    let mut s = String::from("sequence_bias([");
                    for (i, (ids, bias)) in sequence_bias.iter().enumerate() {
                        let ids: Vec<String> = ids.iter().map(i64::to_string).collect();
                        let _ = write!(s, "{}[[{}],{bias}]", if i > 0 { "," } else { "" }, ids.join(","));
                    }
                    s.push_str("])");
                    s
                }
                Op::MinLength { min_length, eos_token_id } => {
                    let ids: Vec<String> = eos_token_id.iter().map(i64::to_string).collect();
                    format!("min_length({min_length},eos={})", ids.join(" "))
                }
            }
        }
    }

    /// One case: ops applied in order to a row (README §3.1).
    #[derive(Clone, Debug, Deserialize)]
    #[allow(missing_docs)]
    pub struct Case {
        pub id: usize,
        pub row: usize,
        pub ops: Vec<Op>,
        pub offset: usize,
        pub n_kept: usize,
        pub fragile: bool,
        pub tie_split: bool,
        pub threshold_margin_lt: Option<f64>,
    }

    impl Case {
        /// The ops as one spec string (transformers convention).
        pub fn spec(&self) -> String {
            self.ops.iter().map(Op::spec).collect::<Vec<_>>().join(";")
        }

        /// The op names joined with `>` (the case's group in reports).
        pub fn group(&self) -> String {
            self.ops.iter().map(Op::name).collect::<Vec<_>>().join(">")
        }

        /// A `generation_config.json` for which transformers' `generate()` builds exactly this
        /// case's ops, when there is one: the ops in `generate()`'s order, each passing its
        /// condition (temperature != 1, top_p < 1, …), `min_tokens_to_keep` 1, and something
        /// left to select (`n_kept > 0`, since the config's chain ends with `dist`).
        pub fn generation_config(&self) -> Option<serde_json::Value> {
            use serde_json::{json, Map, Value};
            const ORDER: [&str; 11] = [
                "sequence_bias",
                "repetition_penalty",
                "no_repeat_ngram",
                "min_length",
                "temperature",
                "top_k",
                "top_p",
                "min_p",
                "typical",
                "epsilon",
                "eta",
            ];
            if self.n_kept == 0 {
                return None;
            }
            let mut m = Map::new();
            m.insert("do_sample".into(), Value::Bool(true));
            m.insert("top_k".into(), Value::Null); // generate()'s default would be 50
            let mut last = None;
            for op in &self.ops {
                let pos = ORDER.iter().position(|n| *n == op.name())?;
                if last.is_some_and(|l| l >= pos) {
                    return None;
                }
                last = Some(pos);
                let (key, value) = match op {
                    Op::Temperature { temperature } if *temperature != 1.0 => ("temperature", json!(temperature)),
                    Op::TopK { top_k, min_tokens_to_keep: 1 } => ("top_k", json!(top_k)),
                    Op::TopP { top_p, min_tokens_to_keep: 1 } if *top_p < 1.0 => ("top_p", json!(top_p)),
                    Op::MinP { min_p, min_tokens_to_keep: 1 } => ("min_p", json!(min_p)),
                    Op::Typical { mass, min_tokens_to_keep: 1 } if *mass < 1.0 => ("typical_p", json!(mass)),
                    Op::Epsilon { epsilon, min_tokens_to_keep: 1 } => ("epsilon_cutoff", json!(epsilon)),
                    Op::Eta { epsilon, min_tokens_to_keep: 1 } => ("eta_cutoff", json!(epsilon)),
                    Op::RepetitionPenalty { penalty } if *penalty != 1.0 => ("repetition_penalty", json!(penalty)),
                    Op::NoRepeatNgram { ngram_size } => ("no_repeat_ngram_size", json!(ngram_size)),
                    Op::SequenceBias { sequence_bias } => ("sequence_bias", json!(sequence_bias)),
                    Op::MinLength { min_length, eos_token_id } if *min_length > 0 && !eos_token_id.is_empty() => {
                        m.insert("eos_token_id".into(), json!(eos_token_id));
                        ("min_length", json!(min_length))
                    }
                    _ => return None,
                };
                m.insert(key.into(), value);
            }
            Some(Value::Object(m))
        }
    }

    #[derive(Deserialize)]
    struct Manifest {
        rows: Vec<Row>,
        cases: Vec<Case>,
    }

    /// The whole set in memory (about 22 MB).
    pub struct Set {
        /// Rows, by id.
        pub rows: Vec<Row>,
        /// Cases, by id.
        pub cases: Vec<Case>,
        inputs: Vec<f32>,
        outputs: Vec<f32>,
        history: Vec<u32>,
    }

    impl Set {
        /// Loads the set, or `None` when `shared/golden/transformers` is not there.
        pub fn load() -> Option<Set> {
            let dir = shared_dir()?.join("golden").join("transformers");
            let manifest = std::fs::read_to_string(dir.join("manifest.json")).ok()?;
            let m: Manifest = serde_json::from_str(&manifest).expect("manifest.json parses");
            Some(Set {
                rows: m.rows,
                cases: m.cases,
                inputs: read_f32(&dir.join("inputs.f32")),
                outputs: read_f32(&dir.join("outputs.f32")),
                history: read_u32(&dir.join("history.u32")),
            })
        }

        /// The input logits of a case.
        pub fn row(&self, c: &Case) -> &[f32] {
            let r = &self.rows[c.row];
            &self.inputs[r.offset..r.offset + r.vocab]
        }
        /// The row's token history (`input_ids`), oldest first.
        pub fn history(&self, c: &Case) -> &[u32] {
            let r = &self.rows[c.row];
            &self.history[r.history_offset..r.history_offset + r.history_len]
        }
        /// The expected processed logits.
        pub fn output(&self, c: &Case) -> &[f32] {
            let v = self.rows[c.row].vocab;
            &self.outputs[c.offset..c.offset + v]
        }
    }

    /// How a case's result is counted (README "Suggested Rust test policy").
    #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
    pub enum Class {
        /// Not fragile, no tie split: must match.
        Robust,
        /// Not fragile, ties split by the mask: must match (torch's sort order is ported).
        TieSplit,
        /// Within rounding noise of a threshold: reported, not required.
        Fragile,
    }

    impl Case {
        /// The case's class.
        pub fn class(&self) -> Class {
            if self.fragile {
                Class::Fragile
            } else if self.tie_split {
                Class::TieSplit
            } else {
                Class::Robust
            }
        }
    }

    /// Tallies matches per op group and class, and prints the report both golden tests show.
    #[derive(Default)]
    pub struct Tally {
        groups: std::collections::BTreeMap<String, (usize, usize)>,
        classes: std::collections::BTreeMap<Class, (usize, usize)>,
        /// Descriptions of the cases that had to match and did not.
        pub failures: Vec<String>,
        /// Descriptions of the fragile cases that did not match (allowed).
        pub fragile_misses: Vec<String>,
    }

    impl Tally {
        /// Records one case: `Ok(())` for a bit-identical result, `Err(why)` otherwise.
        pub fn record(&mut self, set: &Set, c: &Case, outcome: Result<(), String>) {
            let ok = outcome.is_ok();
            let g = self.groups.entry(c.group()).or_default();
            g.0 += 1;
            g.1 += ok as usize;
            let k = self.classes.entry(c.class()).or_default();
            k.0 += 1;
            k.1 += ok as usize;
            if let Err(why) = outcome {
                let r = &set.rows[c.row];
                let text = format!(
                    "case {} (row {}, V={}, kind={}, tie_split={}, margin {:?}): {}: {why}",
                    c.id,
                    c.row,
                    r.vocab,
                    r.kind,
                    c.tie_split,
                    c.threshold_margin_lt,
                    c.spec()
                );
                if c.class() == Class::Fragile {
                    self.fragile_misses.push(text);
                } else {
                    self.failures.push(text);
                }
            }
        }

        /// `(matched, total)` for a class.
        pub fn class_counts(&self, class: Class) -> (usize, usize) {
            self.classes.get(&class).map_or((0, 0), |&(n, ok)| (ok, n))
        }

        /// Prints per-group and per-class counts, then the first failures, to stderr.
        pub fn report(&self, what: &str) {
            for (g, (n, ok)) in &self.groups {
                eprintln!("{g:80} {ok:5} / {n:5}");
            }
            let (r_ok, r_n) = self.class_counts(Class::Robust);
            let (t_ok, t_n) = self.class_counts(Class::TieSplit);
            let (f_ok, f_n) = self.class_counts(Class::Fragile);
            eprintln!(
                "{what}: non-fragile {}/{} matched bit for bit (robust {r_ok}/{r_n}, tie_split {t_ok}/{t_n}); \
                 fragile {f_ok}/{f_n} matched (reported, not required)",
                r_ok + t_ok,
                r_n + t_n
            );
            for f in self.fragile_misses.iter().take(10) {
                eprintln!("fragile, differs (allowed): {f}");
            }
            for f in self.failures.iter().take(40) {
                eprintln!("{f}");
            }
        }
    }

    /// Compares a result with the golden row bit for bit; `Err` names the first difference.
    pub fn compare(ours: &[f32], golden: &[f32]) -> Result<(), String> {
        if ours.len() != golden.len() {
            return Err(format!("length {} vs {}", ours.len(), golden.len()));
        }
        match ours.iter().zip(golden).position(|(a, b)| a.to_bits() != b.to_bits()) {
            None => Ok(()),
            Some(i) => {
                let n_diff = ours.iter().zip(golden).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                Err(format!("{n_diff} tokens differ, first {i}: ours {:e} golden {:e}", ours[i], golden[i]))
            }
        }
    }
}
