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
