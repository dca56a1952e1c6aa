//! A real language model for `generate` and `explain --prompt`: a llama-architecture GGUF
//! file run on the CPU by candle (`quantized_llama`: Q4_0, Q4_1, Q8_0, the k-quants, F16, F32
//! weights), its embedded byte-level BPE tokenizer and chat template.
//!
//! Compiled with the `model` feature (on by default); without it the commands that need a
//! model say so instead of missing.

pub mod chat;
pub mod locate;
pub mod stream;
pub mod tokenizer;

use anyhow::{anyhow, bail, Context, Result};
use candle_core::quantized::gguf_file;
use candle_core::{DType, Device, Tensor};
use candle_transformers::models::quantized_llama::{ModelWeights, MAX_SEQ_LEN};
use std::collections::HashMap;
use std::path::Path;

pub use tokenizer::Tokenizer;

/// A GGUF file's metadata.
pub type GgufMeta = HashMap<String, gguf_file::Value>;

/// A string value, `None` when the key is absent.
pub fn meta_str<'m>(meta: &'m GgufMeta, key: &str) -> Result<Option<&'m str>> {
    meta.get(key).map(|v| v.to_string().map(String::as_str).map_err(|e| anyhow!("{key}: {e}"))).transpose()
}

/// An unsigned integer value (any integer type), `None` when the key is absent.
pub fn meta_u32(meta: &GgufMeta, key: &str) -> Result<Option<u32>> {
    let Some(v) = meta.get(key) else { return Ok(None) };
    let n = match v {
        gguf_file::Value::U8(x) => i64::from(*x),
        gguf_file::Value::I8(x) => i64::from(*x),
        gguf_file::Value::U16(x) => i64::from(*x),
        gguf_file::Value::I16(x) => i64::from(*x),
        gguf_file::Value::U32(x) => i64::from(*x),
        gguf_file::Value::I32(x) => i64::from(*x),
        gguf_file::Value::U64(x) => i64::try_from(*x).unwrap_or(i64::MAX),
        gguf_file::Value::I64(x) => *x,
        other => bail!("{key}: expected an integer, found {:?}", other.value_type()),
    };
    u32::try_from(n).map(Some).map_err(|_| anyhow!("{key}: {n} is out of range"))
}

/// Reads only the metadata of a GGUF file (the tokenizer of a vocabulary-only file).
pub fn read_gguf_metadata(path: &Path) -> Result<GgufMeta> {
    let mut file = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let content =
        gguf_file::Content::read(&mut file).map_err(|e| anyhow!("{} is not a valid GGUF file: {e}", path.display()))?;
    Ok(content.metadata)
}

/// How the weight matrices are kept in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weights {
    /// [`Weights::F32`] when the unpacked matrices take at most [`AUTO_F32_LIMIT`] bytes, else
    /// [`Weights::Quantized`].
    Auto,
    /// Unpacked to f32 at load time (as ggml dequantizes): the forward pass is plain f32
    /// arithmetic, exact to a float reference, and fast where candle has no SIMD kernel for the
    /// stored type (Q4_1 on x86), at 4 bytes per weight.
    F32,
    /// As stored; candle multiplies quantized matrices with activations quantized to 8 bits,
    /// as ggml does.
    Quantized,
}

/// The most memory [`Weights::Auto`] spends on unpacked f32 matrices: 2 GiB (about 500M weights).
pub const AUTO_F32_LIMIT: u64 = 2 << 30;

/// candle decides once per thread, from `CANDLE_DEQUANTIZE_ALL`, whether it unpacks quantized
/// matrices: loads set it and build the weights on a fresh thread, one load at a time.
static LOAD_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn load_weights(
    content: gguf_file::Content,
    file: &mut std::fs::File,
    device: &Device,
    f32: bool,
) -> Result<ModelWeights> {
    let _one_at_a_time = LOAD_LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    const VAR: &str = "CANDLE_DEQUANTIZE_ALL";
    let previous = std::env::var_os(VAR);
    std::env::set_var(VAR, if f32 { "1" } else { "0" });
    let weights = std::thread::scope(|scope| scope.spawn(|| ModelWeights::from_gguf(content, file, device)).join());
    match previous {
        Some(v) => std::env::set_var(VAR, v),
        None => std::env::remove_var(VAR),
    }
    weights.map_err(|_| anyhow!("loading the weights panicked"))?.map_err(|e| anyhow!("cannot load the weights: {e}"))
}

/// A loaded model: weights, tokenizer, chat template, and the position of the next token.
pub struct Model {
    weights: ModelWeights,
    device: Device,
    /// The tokenizer embedded in the file.
    pub tokenizer: Tokenizer,
    /// The Jinja chat template embedded in the file (`tokenizer.chat_template`).
    pub chat_template: Option<String>,
    /// The file's name (`SmolLM2-135M-Instruct.Q4_1.gguf`), for messages.
    pub name: String,
    /// Most tokens a sequence may hold: the file's context length, capped by candle's RoPE table.
    pub n_ctx: usize,
    position: usize,
}

impl Model {
    /// Loads a llama-architecture GGUF file.
    pub fn load(path: &Path, weights: Weights) -> Result<Self> {
        let mut file = std::fs::File::open(path).with_context(|| format!("--model: cannot open {}", path.display()))?;
        let content = gguf_file::Content::read(&mut file)
            .map_err(|e| anyhow!("--model: {} is not a valid GGUF file: {e}", path.display()))?;
        let meta = &content.metadata;
        let arch = meta_str(meta, "general.architecture")?.unwrap_or("?");
        if arch != "llama" {
            bail!(
                "--model {}: general.architecture is `{arch}`; tokensieve runs llama-architecture models",
                path.display()
            );
        }
        let tokenizer = Tokenizer::from_gguf(meta).with_context(|| format!("--model {}", path.display()))?;
        let chat_template = meta_str(meta, "tokenizer.chat_template")?.map(str::to_string);
        let name = match path.file_name() {
            Some(file) => file.to_string_lossy().into_owned(),
            None => meta_str(meta, "general.name")?.unwrap_or("the model").to_string(),
        };
        let context_length = meta_u32(meta, "llama.context_length")?.map_or(MAX_SEQ_LEN, |n| n as usize);
        let n_ctx = context_length.min(MAX_SEQ_LEN);
        let f32 = match weights {
            Weights::F32 => true,
            Weights::Quantized => false,
            Weights::Auto => {
                let matrices: u64 = content
                    .tensor_infos
                    .values()
                    .filter(|t| t.shape.rank() == 2)
                    .map(|t| t.shape.elem_count() as u64)
                    .sum();
                matrices * 4 <= AUTO_F32_LIMIT
            }
        };
        let device = Device::Cpu;
        let weights =
            load_weights(content, &mut file, &device, f32).with_context(|| format!("--model {}", path.display()))?;
        Ok(Model { weights, device, tokenizer, chat_template, name, n_ctx, position: 0 })
    }

    /// Runs `tokens` at the next positions (the KV cache keeps the earlier ones) and returns
    /// the logits for the token after the last of them.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            bail!("nothing to run the model on (empty prompt)");
        }
        if self.position + tokens.len() > self.n_ctx {
            bail!(
                "the sequence would hold {} tokens, more than the model's context of {}",
                self.position + tokens.len(),
                self.n_ctx
            );
        }
        let input = Tensor::new(tokens, &self.device).and_then(|t| t.unsqueeze(0)).map_err(candle)?;
        let logits = self.weights.forward(&input, self.position).map_err(candle)?;
        self.position += tokens.len();
        logits.squeeze(0).and_then(|t| t.to_dtype(DType::F32)).and_then(|t| t.to_vec1::<f32>()).map_err(candle)
    }
}

fn candle(e: candle_core::Error) -> anyhow::Error {
    anyhow!("model: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use tokensieve_testkit::gguf;

    /// Writes the tiny random-weight model into a fresh file.
    pub(crate) fn tiny_model_file(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tokensieve-model-unit-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tiny.gguf");
        std::fs::write(&path, gguf::tiny_llama(3)).unwrap();
        path
    }

    #[test]
    fn the_tiny_model_loads_and_runs() {
        let path = tiny_model_file("load");
        let mut model = Model::load(&path, Weights::Auto).unwrap();
        assert_eq!(model.name, "tiny.gguf");
        assert_eq!(model.n_ctx, 256);
        assert_eq!(model.tokenizer.len(), 3 + 256 + gguf::TINY_MERGES.len());
        assert!(model.chat_template.as_deref().is_some_and(|t| t.contains("<|im_start|>")));
        let logits = model.forward(&[10, 20, 30]).unwrap();
        assert_eq!(logits.len(), model.tokenizer.len());
        assert!(logits.iter().all(|v| v.is_finite()));
        assert_eq!(model.position, 3);

        // The KV cache: one token at a time gives what the whole sequence gives at once.
        let mut stepwise = Model::load(&path, Weights::Auto).unwrap();
        stepwise.forward(&[10, 20]).unwrap();
        let last = stepwise.forward(&[30]).unwrap();
        let diff = logits.iter().zip(&last).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(diff < 1e-4, "{diff}");
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    /// The weight types the issue names (F16, Q8_0, Q4_1, Q4_0) load and compute what the F32
    /// weights compute, up to their rounding.
    #[test]
    fn quantized_weights_load_and_agree_with_f32() {
        let dir = std::env::temp_dir().join(format!("tokensieve-model-unit-{}-quant", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let run = |ty: gguf::TensorType, weights: Weights| {
            let path = dir.join(format!("tiny-{ty:?}.gguf"));
            std::fs::write(&path, gguf::tiny_llama_as(3, ty)).unwrap();
            Model::load(&path, weights).unwrap().forward(&[10, 20, 30, 40]).unwrap()
        };
        let reference = run(gguf::TensorType::F32, Weights::F32);
        let max_diff = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        let correlation = |a: &[f32], b: &[f32]| {
            let mean = |v: &[f32]| v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64;
            let (ma, mb) = (mean(a), mean(b));
            let (mut ab, mut aa, mut bb) = (0.0, 0.0, 0.0);
            for (&x, &y) in a.iter().zip(b) {
                let (x, y) = (f64::from(x) - ma, f64::from(y) - mb);
                ab += x * y;
                aa += x * x;
                bb += y * y;
            }
            ab / (aa * bb).sqrt()
        };
        let spread = reference.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        // The same stored weights, computed as stored (8-bit activations) or unpacked, agree up
        // to the activations' rounding; against the original f32 weights, up to the weights'
        // rounding (4-bit weights move random-weight logits a lot, but keep them correlated).
        for (ty, min_correlation) in [
            (gguf::TensorType::F16, 0.99999),
            (gguf::TensorType::Q8_0, 0.999),
            (gguf::TensorType::Q4_1, 0.9),
            (gguf::TensorType::Q4_0, 0.9),
        ] {
            let quantized = run(ty, Weights::Quantized);
            let unpacked = run(ty, Weights::F32);
            assert_eq!(quantized.len(), reference.len());
            let (d, r) = (max_diff(&quantized, &unpacked), correlation(&unpacked, &reference));
            eprintln!("{ty:?}: as stored vs unpacked {d}, unpacked vs f32 weights: r = {r:.4}");
            assert!(d <= 0.06 * spread, "{ty:?}: as stored vs unpacked: max |diff| {d}, logits up to {spread}");
            assert!(r >= min_correlation, "{ty:?}: r = {r}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_context_is_a_limit_not_a_crash() {
        let path = tiny_model_file("ctx");
        let mut model = Model::load(&path, Weights::Auto).unwrap();
        let e = model.forward(&vec![5u32; 257]).unwrap_err().to_string();
        assert!(e.contains("context of 256"), "{e}");
        assert!(model.forward(&[]).is_err());
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn other_architectures_and_junk_are_errors() {
        let dir = std::env::temp_dir().join(format!("tokensieve-model-unit-{}-arch", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("gpt2.gguf");
        gguf::write(&path, &[("general.architecture", gguf::Value::Str("gpt2".into()))], &[]).unwrap();
        let e = Model::load(&path, Weights::Auto).err().unwrap().to_string();
        assert!(e.contains("`gpt2`"), "{e}");
        std::fs::write(&path, b"GGUF junk").unwrap();
        assert!(Model::load(&path, Weights::Auto).err().unwrap().to_string().contains("not a valid GGUF"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The real model's forward pass against logits from an independent NumPy forward pass
    /// (`shared/data/reference/`).
    #[test]
    fn smollm2_matches_the_reference_logits() {
        let Some(shared) = tokensieve_testkit::golden::shared_dir() else {
            assert!(!tokensieve_testkit::golden::goldens_required(), "shared/ is missing");
            eprintln!("skipped: shared/ not found");
            return;
        };
        let path = shared.join("data/models/SmolLM2-135M-Instruct.Q4_1.gguf");
        let reference = shared.join("data/reference/smollm2-135m-q4_1-logits-capital-of-france.npy");
        if !path.is_file() || !reference.is_file() {
            assert!(!tokensieve_testkit::golden::goldens_required(), "{} is missing", path.display());
            eprintln!("skipped: {} not found", path.display());
            return;
        }
        let bytes = std::fs::read(&reference).unwrap();
        let want: Vec<f32> = npyz::NpyFile::new(&bytes[..]).unwrap().into_vec().unwrap();
        let argmax = |v: &[f32]| (0..v.len()).max_by(|&a, &b| v[a].total_cmp(&v[b]).then(b.cmp(&a))).unwrap();
        assert_eq!(argmax(&want), 7042);
        let p = |v: &[f32], i: usize| {
            let m = v[argmax(v)];
            f64::from(v[i] - m).exp() / v.iter().map(|&x| f64::from(x - m).exp()).sum::<f64>()
        };
        // Unpacked to f32 (the default for this model), the forward pass is the reference's
        // float arithmetic: equal up to summation order. As stored, candle multiplies Q4_1
        // weights with activations quantized to Q8_1, as ggml does: equal up to that rounding
        // (after removing the mean difference, which softmax ignores).
        for (weights, max_allowed, mean_allowed) in [(Weights::Auto, 0.01, 0.001), (Weights::Quantized, 1.0, 0.25)] {
            let mut model = Model::load(&path, weights).unwrap();
            let ids = model.tokenizer.encode("The capital of France is", true).unwrap();
            assert_eq!(ids, [504, 3575, 282, 4649, 314]);
            let logits = model.forward(&ids).unwrap();
            assert_eq!(logits.len(), want.len());
            assert_eq!(argmax(&logits), 7042, "\" Paris\"");
            let shift = logits.iter().zip(&want).map(|(a, b)| f64::from(a - b)).sum::<f64>() / want.len() as f64;
            let diffs: Vec<f64> = logits.iter().zip(&want).map(|(a, b)| (f64::from(a - b) - shift).abs()).collect();
            let max_diff = diffs.iter().copied().fold(0.0, f64::max);
            let mean_diff = diffs.iter().sum::<f64>() / diffs.len() as f64;
            eprintln!("{weights:?}: logits vs reference: shift {shift:.4}, then max |diff| {max_diff:.5}, mean {mean_diff:.5}");
            assert!(max_diff < max_allowed && mean_diff < mean_allowed, "{weights:?}: max {max_diff} mean {mean_diff}");
            let top = |v: &[f32]| {
                let mut ids: Vec<usize> = (0..v.len()).collect();
                ids.sort_by(|&a, &b| v[b].total_cmp(&v[a]));
                ids.truncate(3);
                ids
            };
            assert_eq!(top(&logits), top(&want), "{weights:?}: the three most likely tokens");
            assert!((p(&logits, 7042) - 0.773).abs() < 0.02, "{weights:?}: p(Paris) = {}", p(&logits, 7042));
        }
    }
}
