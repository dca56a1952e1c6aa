//! A minimal GGUF v3 writer and a tiny random-weight llama model with a byte-level BPE
//! tokenizer, so that model loading, tokenization and generation are tested in seconds without
//! downloading anything.
//!
//! Format (GGUF v3, little-endian): magic `GGUF`, version 3, tensor count (u64), metadata count
//! (u64); each metadata entry is a key (u64 length + UTF-8), a value type (u32) and the value
//! (strings: u64 length + bytes; arrays: element type u32, count u64, elements); each tensor
//! info is a name, the number of dimensions (u32), the dimensions innermost first (u64 each),
//! the ggml type (u32: F32, F16, Q4_0, Q4_1, Q8_0, see [`TensorType`]) and the data offset (u64) from the start of the data section,
//! which begins at the next multiple of `general.alignment` (32) after the infos.

use std::io::Write;

/// A metadata value.
#[derive(Clone, Debug)]
pub enum Value {
    /// GGUF type 4.
    U32(u32),
    /// GGUF type 6.
    F32(f32),
    /// GGUF type 7.
    Bool(bool),
    /// GGUF type 8.
    Str(String),
    /// An array of strings (type 9 of type 8).
    Strs(Vec<String>),
    /// An array of i32 (type 9 of type 5).
    I32s(Vec<i32>),
}

/// How a tensor is stored (ggml type ids).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorType {
    /// 32-bit floats (0).
    F32 = 0,
    /// IEEE half precision (1).
    F16 = 1,
    /// Blocks of 32: an f16 scale `d` and 32 4-bit values `(q - 8) * d` (2).
    Q4_0 = 2,
    /// Blocks of 32: f16 `d` and `m`, 32 4-bit values `q * d + m` (3).
    Q4_1 = 3,
    /// Blocks of 32: an f16 scale and 32 signed bytes (8).
    Q8_0 = 8,
}

/// A tensor: name, ggml dimensions (innermost first), values (innermost fastest) and the type
/// it is stored as (quantized types need an innermost dimension that is a multiple of 32;
/// candle's Q4_1 kernel wants an even number of blocks, so 64).
#[derive(Clone, Debug)]
pub struct Tensor {
    /// Tensor name (`blk.0.attn_q.weight`).
    pub name: String,
    /// ggml `ne`: the innermost (contiguous) dimension first.
    pub dims: Vec<u64>,
    /// The values.
    pub data: Vec<f32>,
    /// How they are stored.
    pub ty: TensorType,
}

/// Encodes values as ggml stores them, quantizing as ggml's reference quantizers do.
pub fn encode(ty: TensorType, data: &[f32]) -> Vec<u8> {
    let f16 = |x: f32| half::f16::from_f32(x).to_le_bytes();
    let mut out = Vec::new();
    match ty {
        TensorType::F32 => data.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        TensorType::F16 => data.iter().for_each(|&x| out.extend_from_slice(&f16(x))),
        TensorType::Q8_0 => {
            for block in data.chunks(32) {
                let amax = block.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f16(d));
                out.extend(block.iter().map(|x| (x * id).round() as i8 as u8));
            }
        }
        TensorType::Q4_0 => {
            for block in data.chunks(32) {
                let max = block.iter().copied().fold(0.0f32, |m, x| if x.abs() > m.abs() { x } else { m });
                let d = max / -8.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f16(d));
                let q = |x: f32| ((x * id + 8.5) as u8).min(15);
                out.extend((0..16).map(|j| q(block[j]) | (q(block[j + 16]) << 4)));
            }
        }
        TensorType::Q4_1 => {
            for block in data.chunks(32) {
                let min = block.iter().copied().fold(f32::INFINITY, f32::min);
                let max = block.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let d = (max - min) / 15.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f16(d));
                out.extend_from_slice(&f16(min));
                let q = |x: f32| (((x - min) * id + 0.5) as u8).min(15);
                out.extend((0..16).map(|j| q(block[j]) | (q(block[j + 16]) << 4)));
            }
        }
    }
    out
}

const ALIGNMENT: usize = 32;

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U32(x) => {
            out.extend_from_slice(&4u32.to_le_bytes());
            out.extend_from_slice(&x.to_le_bytes());
        }
        Value::F32(x) => {
            out.extend_from_slice(&6u32.to_le_bytes());
            out.extend_from_slice(&x.to_le_bytes());
        }
        Value::Bool(x) => {
            out.extend_from_slice(&7u32.to_le_bytes());
            out.push(u8::from(*x));
        }
        Value::Str(s) => {
            out.extend_from_slice(&8u32.to_le_bytes());
            string(out, s);
        }
        Value::Strs(items) => {
            out.extend_from_slice(&9u32.to_le_bytes());
            out.extend_from_slice(&8u32.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for s in items {
                string(out, s);
            }
        }
        Value::I32s(items) => {
            out.extend_from_slice(&9u32.to_le_bytes());
            out.extend_from_slice(&5u32.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for x in items {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
    }
}

/// Serialises a GGUF v3 file.
pub fn to_bytes(metadata: &[(&str, Value)], tensors: &[Tensor]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(b"GGUF");
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (key, v) in metadata {
        string(&mut out, key);
        value(&mut out, v);
    }
    let mut offset = 0usize;
    let mut data = Vec::with_capacity(tensors.len());
    for t in tensors {
        assert_eq!(t.dims.iter().product::<u64>() as usize, t.data.len(), "{}: dims and data disagree", t.name);
        if !matches!(t.ty, TensorType::F32 | TensorType::F16) {
            assert_eq!(t.dims[0] % 32, 0, "{}: quantized rows must be whole blocks of 32", t.name);
        }
        string(&mut out, &t.name);
        out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&(t.ty as u32).to_le_bytes());
        out.extend_from_slice(&(offset as u64).to_le_bytes());
        let bytes = encode(t.ty, &t.data);
        offset += bytes.len().div_ceil(ALIGNMENT) * ALIGNMENT;
        data.push(bytes);
    }
    out.resize(out.len().div_ceil(ALIGNMENT) * ALIGNMENT, 0);
    for bytes in data {
        out.extend_from_slice(&bytes);
        out.resize(out.len().div_ceil(ALIGNMENT) * ALIGNMENT, 0);
    }
    out
}

/// Writes a GGUF v3 file.
pub fn write(path: &std::path::Path, metadata: &[(&str, Value)], tensors: &[Tensor]) -> std::io::Result<()> {
    std::fs::File::create(path)?.write_all(&to_bytes(metadata, tensors))
}

/// GPT-2's byte-to-character table: the character that stands for each byte in a byte-level
/// BPE vocabulary.
pub fn byte_to_char(b: u8) -> char {
    let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable {
        return char::from(b);
    }
    let shifted = (0..b).filter(|&x| !matches!(x, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)).count() as u32;
    char::from_u32(256 + shifted).unwrap()
}

/// The tiny model's shape.
pub const TINY_EMBEDDING: usize = 64;
/// Attention heads (head size 16).
pub const TINY_HEADS: usize = 4;
/// Key/value heads (grouped-query attention).
pub const TINY_KV_HEADS: usize = 2;
/// Feed-forward width.
pub const TINY_FF: usize = 128;
/// Blocks.
pub const TINY_BLOCKS: usize = 2;

/// The tiny model's control tokens (ids 0, 1, 2): end of text, ChatML's turn markers; EOS is 2.
pub const TINY_CONTROL: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// The tiny model's merges (each adds the merged token to the vocabulary, in order, after the
/// 3 control tokens and the 256 byte tokens).
pub const TINY_MERGES: [(&str, &str); 12] = [
    ("Ġ", "t"),
    ("h", "e"),
    ("Ġt", "he"),
    ("l", "l"),
    ("e", "ll"),
    ("h", "ell"),
    ("hell", "o"),
    ("Ġ", "w"),
    ("o", "r"),
    ("Ġw", "or"),
    ("Ġwor", "ld"),
    ("l", "d"),
];

/// SmolLM2-135M-Instruct's chat template (ChatML with a default system message).
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// The tiny model's vocabulary: 3 control tokens, the 256 byte tokens in byte order, then one
/// token per merge. (`Ġwor` + `ld` needs `ld`, merged last: a word's merges apply by rank.)
pub fn tiny_vocabulary() -> (Vec<String>, Vec<i32>, Vec<String>) {
    let mut tokens: Vec<String> = TINY_CONTROL.iter().map(|s| s.to_string()).collect();
    let mut types = vec![3; TINY_CONTROL.len()];
    for b in 0..=255u8 {
        tokens.push(byte_to_char(b).to_string());
        types.push(1);
    }
    let mut merges = Vec::new();
    for (a, b) in TINY_MERGES {
        tokens.push(format!("{a}{b}"));
        types.push(1);
        merges.push(format!("{a} {b}"));
    }
    (tokens, types, merges)
}

/// Id of a byte's token in the tiny vocabulary.
pub fn tiny_byte_id(b: u8) -> u32 {
    TINY_CONTROL.len() as u32 + u32::from(b)
}

/// Id of a merged token (its text, e.g. `"Ġthe"`) in the tiny vocabulary.
pub fn tiny_merge_id(text: &str) -> u32 {
    let i = TINY_MERGES.iter().position(|(a, b)| format!("{a}{b}") == text).expect("a merge of the tiny vocabulary");
    (TINY_CONTROL.len() + 256 + i) as u32
}

/// Deterministic pseudo-random weights in `[-scale, scale)` (SplitMix64).
fn weights(seed: &mut u64, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = *seed;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            ((z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// A tiny llama model (2 blocks, d = 64, 4 heads / 2 KV heads, vocabulary 271) with random
/// F32 weights from `seed`, the tiny byte-level BPE vocabulary (`tokenizer.ggml.pre = smollm`),
/// EOS = `<|im_end|>` and the ChatML template: a few hundred kilobytes.
pub fn tiny_llama(seed: u64) -> Vec<u8> {
    tiny_llama_as(seed, TensorType::F32)
}

/// [`tiny_llama`] with its matrices stored as `ty` (the norms stay F32, as in real files).
pub fn tiny_llama_as(seed: u64, ty: TensorType) -> Vec<u8> {
    let (tokens, types, merges) = tiny_vocabulary();
    let vocab = tokens.len() as u64;
    let d = TINY_EMBEDDING as u64;
    let kv = (TINY_EMBEDDING / TINY_HEADS * TINY_KV_HEADS) as u64;
    let ff = TINY_FF as u64;
    let metadata: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::Str("llama".into())),
        ("general.name", Value::Str("tiny-random-llama".into())),
        ("general.alignment", Value::U32(ALIGNMENT as u32)),
        ("llama.block_count", Value::U32(TINY_BLOCKS as u32)),
        ("llama.context_length", Value::U32(256)),
        ("llama.embedding_length", Value::U32(TINY_EMBEDDING as u32)),
        ("llama.feed_forward_length", Value::U32(TINY_FF as u32)),
        ("llama.attention.head_count", Value::U32(TINY_HEADS as u32)),
        ("llama.attention.head_count_kv", Value::U32(TINY_KV_HEADS as u32)),
        ("llama.rope.dimension_count", Value::U32((TINY_EMBEDDING / TINY_HEADS) as u32)),
        ("llama.rope.freq_base", Value::F32(10000.0)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("tokenizer.ggml.model", Value::Str("gpt2".into())),
        ("tokenizer.ggml.pre", Value::Str("smollm".into())),
        ("tokenizer.ggml.tokens", Value::Strs(tokens)),
        ("tokenizer.ggml.token_type", Value::I32s(types)),
        ("tokenizer.ggml.merges", Value::Strs(merges)),
        ("tokenizer.ggml.bos_token_id", Value::U32(1)),
        ("tokenizer.ggml.eos_token_id", Value::U32(2)),
        ("tokenizer.ggml.add_bos_token", Value::Bool(false)),
        ("tokenizer.chat_template", Value::Str(CHATML_TEMPLATE.into())),
    ];
    let mut s = seed;
    let mut t = |name: String, dims: Vec<u64>, scale: f32| {
        let n = dims.iter().product::<u64>() as usize;
        let (data, ty) = if scale == 0.0 { (vec![1.0; n], TensorType::F32) } else { (weights(&mut s, n, scale), ty) };
        Tensor { name, dims, data, ty }
    };
    let mut tensors = vec![t("token_embd.weight".into(), vec![d, vocab], 1.0)];
    for i in 0..TINY_BLOCKS {
        let p = format!("blk.{i}");
        tensors.push(t(format!("{p}.attn_norm.weight"), vec![d], 0.0));
        tensors.push(t(format!("{p}.attn_q.weight"), vec![d, d], 0.3));
        tensors.push(t(format!("{p}.attn_k.weight"), vec![d, kv], 0.3));
        tensors.push(t(format!("{p}.attn_v.weight"), vec![d, kv], 0.3));
        tensors.push(t(format!("{p}.attn_output.weight"), vec![d, d], 0.3));
        tensors.push(t(format!("{p}.ffn_norm.weight"), vec![d], 0.0));
        tensors.push(t(format!("{p}.ffn_gate.weight"), vec![d, ff], 0.3));
        tensors.push(t(format!("{p}.ffn_up.weight"), vec![d, ff], 0.3));
        tensors.push(t(format!("{p}.ffn_down.weight"), vec![ff, d], 0.3));
    }
    tensors.push(t("output_norm.weight".into(), vec![d], 0.0));
    // No output.weight: the output projection is tied to the embeddings, as in SmolLM2.
    to_bytes(&metadata, &tensors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_table_is_gpt2s() {
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'a'), 'a');
        assert_eq!(byte_to_char(0), '\u{100}');
        assert_eq!(byte_to_char(0xAD), '\u{143}');
        let mut all: Vec<char> = (0..=255u8).map(byte_to_char).collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 256);
    }

    #[test]
    fn files_are_aligned_and_start_with_the_header() {
        let bytes = tiny_llama(1);
        assert_eq!(&bytes[..4], b"GGUF");
        assert_eq!(u32::from_le_bytes(bytes[4..8].try_into().unwrap()), 3);
        assert_eq!(bytes.len() % 32, 0);
        assert_eq!(tiny_merge_id("Ġthe"), 3 + 256 + 2);
    }

    #[test]
    fn quantized_blocks_have_ggml_sizes_and_round_trip() {
        let data: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
        assert_eq!(encode(TensorType::F16, &data).len(), 128);
        assert_eq!(encode(TensorType::Q8_0, &data).len(), 2 * 34);
        assert_eq!(encode(TensorType::Q4_0, &data).len(), 2 * 18);
        assert_eq!(encode(TensorType::Q4_1, &data).len(), 2 * 20);
        // Q4_1 decodes (as ggml does) to within half a step of the input.
        let b = encode(TensorType::Q4_1, &data[..32]);
        let d = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
        let m = half::f16::from_le_bytes([b[2], b[3]]).to_f32();
        for j in 0..16 {
            let (lo, hi) = (f32::from(b[4 + j] & 15), f32::from(b[4 + j] >> 4));
            assert!((lo * d + m - data[j]).abs() <= d * 0.51 + 1e-3);
            assert!((hi * d + m - data[j + 16]).abs() <= d * 0.51 + 1e-3);
        }
    }
}
