//! The byte-level BPE tokenizer of a GGUF file (`tokenizer.ggml.model = "gpt2"`), built on the
//! Hugging Face `tokenizers` crate from the file's `tokenizer.ggml.tokens`, `merges` and
//! `token_type`, with the pre-tokenizer that `tokenizer.ggml.pre` names.
//!
//! Encoding goes through `tokenizers` (BPE model, pre-tokenizer, special tokens); decoding does
//! not need it: every token's bytes are precomputed (byte-level characters mapped back to
//! bytes), so streaming a token costs a table lookup.
//!
//! Pre-tokenizers, by `tokenizer.ggml.pre` (each the one the model's own `tokenizer.json`
//! declares, and the one llama.cpp's `llama-vocab.cpp` implements for that name):
//!
//! | `tokenizer.ggml.pre` | pre-tokenizer |
//! |---|---|
//! | `gpt-2`, `default`, absent | GPT-2's regex (the byte-level pre-tokenizer's own), byte-level |
//! | `llama-bpe`, `llama3`, `llama-v3` | Llama-3's regex (digits in groups of 3), byte-level; whole words found in the vocabulary skip the merges (`ignore_merges`) |
//! | `smollm`, `starcoder`, `refact` | every digit alone, then GPT-2's regex, byte-level |
//! | `qwen2` | NFC, Qwen2's regex (single digits), byte-level |
//!
//! Tokens of type control (3) and user-defined (4) are special tokens: they match as a whole
//! wherever they occur in the text (as in `tokenizers` and llama.cpp's `parse_special`).

use super::{meta_str, meta_u32, GgufMeta};
use anyhow::{anyhow, bail, Context, Result};
use std::collections::HashMap;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

/// GGUF token types (llama.cpp's `llama_token_type`).
const TYPE_NORMAL: i32 = 1;
const TYPE_CONTROL: i32 = 3;
const TYPE_USER_DEFINED: i32 = 4;

const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Texts that end a turn or a document in the common chat formats: a control token with one of
/// these texts stops generation, as llama.cpp's end-of-generation list does.
const END_OF_GENERATION_TEXTS: &[&str] = &[
    "<|endoftext|>",
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|end|>",
    "<end_of_turn>",
    "<EOT>",
];

/// A GGUF file's tokenizer.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// What each token writes into the text, by id (control tokens write nothing).
    bytes: Vec<Vec<u8>>,
    /// Each token's stored text (byte-level characters for normal tokens).
    texts: Vec<String>,
    types: Vec<i32>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    end_of_generation: Vec<u32>,
}

impl Tokenizer {
    /// Builds the tokenizer from a GGUF file's metadata.
    pub fn from_gguf(meta: &GgufMeta) -> Result<Self> {
        let model =
            meta_str(meta, "tokenizer.ggml.model")?.context("the file has no tokenizer (tokenizer.ggml.model)")?;
        if model != "gpt2" {
            bail!(
                "tokenizer.ggml.model is `{model}`: only byte-level BPE tokenizers (`gpt2`, as in GPT-2, Llama-3, \
                 SmolLM, Qwen2) are supported"
            );
        }
        let texts = string_array(meta, "tokenizer.ggml.tokens")?.context("the file has no tokenizer.ggml.tokens")?;
        if texts.is_empty() {
            bail!("tokenizer.ggml.tokens is empty");
        }
        let n = texts.len();
        let types = match meta.get("tokenizer.ggml.token_type") {
            Some(v) => {
                let types = v
                    .to_vec()
                    .map_err(|e| anyhow!("tokenizer.ggml.token_type: {e}"))?
                    .iter()
                    .map(|t| t.to_i32().map_err(|e| anyhow!("tokenizer.ggml.token_type: {e}")))
                    .collect::<Result<Vec<i32>>>()?;
                if types.len() != n {
                    bail!("tokenizer.ggml.token_type has {} entries for {n} tokens", types.len());
                }
                types
            }
            None => vec![TYPE_NORMAL; n],
        };
        let merges = string_array(meta, "tokenizer.ggml.merges")?.unwrap_or_default();
        let merges = merges
            .iter()
            .enumerate()
            .map(|(i, m)| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .ok_or_else(|| anyhow!("tokenizer.ggml.merges[{i}] = {m:?} is not two tokens separated by a space"))
            })
            .collect::<Result<Vec<_>>>()?;

        let pre = meta_str(meta, "tokenizer.ggml.pre")?.unwrap_or("default");
        let (pre_tokenizer, nfc, ignore_merges) = pre_tokenizer(pre)?;

        let mut vocab: ahash::AHashMap<String, u32> = ahash::AHashMap::with_capacity(n);
        for (id, text) in texts.iter().enumerate() {
            // A duplicate text keeps its first id, as llama.cpp's token_to_id map does.
            vocab.entry(text.clone()).or_insert(id as u32);
        }
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(ignore_merges)
            .build()
            .map_err(|e| anyhow!("cannot build the BPE model: {e}"))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(pre_tokenizer));
        if nfc {
            inner.with_normalizer(Some(NFC)).map_err(|e| anyhow!("cannot set the NFC normalizer: {e}"))?;
        }
        let special: Vec<AddedToken> = texts
            .iter()
            .zip(&types)
            .filter(|(_, &t)| t == TYPE_CONTROL || t == TYPE_USER_DEFINED)
            .map(|(text, _)| AddedToken::from(text.clone(), true))
            .collect();
        inner.add_special_tokens(special).map_err(|e| anyhow!("cannot add the special tokens: {e}"))?;

        let decode = byte_decoder();
        let bytes = texts
            .iter()
            .zip(&types)
            .map(|(text, &t)| match t {
                TYPE_CONTROL => Vec::new(),
                TYPE_USER_DEFINED => text.as_bytes().to_vec(),
                _ => byte_level_to_bytes(text, &decode),
            })
            .collect();

        let id = |key: &str| -> Result<Option<u32>> { Ok(meta_u32(meta, key)?.filter(|&id| (id as usize) < n)) };
        let bos = id("tokenizer.ggml.bos_token_id")?;
        let eos = id("tokenizer.ggml.eos_token_id")?;
        let mut end_of_generation: Vec<u32> =
            [eos, id("tokenizer.ggml.eot_token_id")?, id("tokenizer.ggml.eom_token_id")?]
                .into_iter()
                .flatten()
                .collect();
        for (i, (text, &t)) in texts.iter().zip(&types).enumerate() {
            if t == TYPE_CONTROL && END_OF_GENERATION_TEXTS.contains(&text.as_str()) {
                end_of_generation.push(i as u32);
            }
        }
        end_of_generation.sort_unstable();
        end_of_generation.dedup();
        let add_bos = match meta.get("tokenizer.ggml.add_bos_token") {
            Some(v) => v.to_bool().map_err(|e| anyhow!("tokenizer.ggml.add_bos_token: {e}"))?,
            None => false,
        };
        Ok(Tokenizer { inner, bytes, texts, types, bos, eos, add_bos, end_of_generation })
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.texts.len()
    }

    /// Encodes `text`, special tokens included; adds the BOS token first when the file asks
    /// for it (`tokenizer.ggml.add_bos_token`) and `add_bos` is set, unless the text already
    /// starts with it.
    pub fn encode(&self, text: &str, add_bos: bool) -> Result<Vec<u32>> {
        let encoding = self.inner.encode(text, false).map_err(|e| anyhow!("cannot tokenize the prompt: {e}"))?;
        let mut ids = encoding.get_ids().to_vec();
        if let (true, true, Some(bos)) = (add_bos, self.add_bos, self.bos) {
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
        Ok(ids)
    }

    /// The bytes token `id` adds to the text (empty for control tokens and unknown ids).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.bytes.get(id as usize).map_or(&[], Vec::as_slice)
    }

    /// Every token's bytes, by id, control tokens as their text (what DRY's sequence breakers
    /// are matched against).
    pub fn vocabulary_bytes(&self) -> Vec<Vec<u8>> {
        self.bytes
            .iter()
            .zip(&self.texts)
            .zip(&self.types)
            .map(|((b, text), &t)| if t == TYPE_CONTROL { text.as_bytes().to_vec() } else { b.clone() })
            .collect()
    }

    /// A printable form of token `id` for tables: its text with invalid UTF-8 shown as `\xNN`
    /// and control characters escaped, control tokens as their name.
    pub fn display(&self, id: u32) -> String {
        let Some(&t) = self.types.get(id as usize) else { return format!("<{id}?>") };
        if t == TYPE_CONTROL {
            return self.texts[id as usize].clone();
        }
        escape_bytes(self.token_bytes(id))
    }

    /// True for the tokens that end generation (EOS, EOT, EOM and the end-of-turn control
    /// tokens of the common chat formats).
    pub fn is_end_of_generation(&self, id: u32) -> bool {
        self.end_of_generation.binary_search(&id).is_ok()
    }

    /// The BOS token's text, if the file names one.
    pub fn bos_text(&self) -> Option<&str> {
        self.bos.map(|id| self.texts[id as usize].as_str())
    }

    /// The EOS token's text, if the file names one.
    pub fn eos_text(&self) -> Option<&str> {
        self.eos.map(|id| self.texts[id as usize].as_str())
    }
}

/// The pre-tokenizer for a `tokenizer.ggml.pre` name, whether NFC comes first, and whether
/// whole words in the vocabulary skip the merges.
fn pre_tokenizer(pre: &str) -> Result<(PreTokenizerWrapper, bool, bool)> {
    let split = |regex: &str| -> Result<PreTokenizerWrapper> {
        Ok(Split::new(SplitPattern::Regex(regex.to_string()), SplitDelimiterBehavior::Isolated, false)
            .map_err(|e| anyhow!("pre-tokenizer regex: {e}"))?
            .into())
    };
    let byte_level = |use_regex: bool| -> PreTokenizerWrapper { ByteLevel::new(false, true, use_regex).into() };
    Ok(match pre {
        "default" | "gpt-2" | "gpt2" => (byte_level(true), false, false),
        "llama-bpe" | "llama3" | "llama-v3" => {
            (Sequence::new(vec![split(LLAMA3_REGEX)?, byte_level(false)]).into(), false, true)
        }
        "smollm" | "starcoder" | "refact" => {
            (Sequence::new(vec![Digits::new(true).into(), byte_level(true)]).into(), false, false)
        }
        "qwen2" => (Sequence::new(vec![split(QWEN2_REGEX)?, byte_level(false)]).into(), true, false),
        other => bail!(
            "tokenizer.ggml.pre is `{other}`, a pre-tokenizer tokensieve does not know (supported: gpt-2, llama-bpe, \
             smollm, starcoder, refact, qwen2)"
        ),
    })
}

fn string_array(meta: &GgufMeta, key: &str) -> Result<Option<Vec<String>>> {
    let Some(v) = meta.get(key) else { return Ok(None) };
    let items = v.to_vec().map_err(|e| anyhow!("{key}: {e}"))?;
    items.iter().map(|s| s.to_string().cloned().map_err(|e| anyhow!("{key}: {e}"))).collect::<Result<_>>().map(Some)
}

/// GPT-2's byte-to-character table, inverted: printable bytes stand for themselves, the others
/// were shifted to U+0100 and up.
fn byte_decoder() -> HashMap<char, u8> {
    let mut map = HashMap::with_capacity(256);
    let mut shifted = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let c = if printable {
            char::from(b)
        } else {
            shifted += 1;
            char::from_u32(255 + shifted).expect("U+0100..U+0143 are characters")
        };
        map.insert(c, b);
    }
    map
}

/// A normal token's bytes: each byte-level character back to its byte (a character outside
/// the table, which a well-formed vocabulary never has, keeps its UTF-8).
fn byte_level_to_bytes(text: &str, decode: &HashMap<char, u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match decode.get(&c) {
            Some(&b) => out.push(b),
            None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
    out
}

/// Bytes as text for a table (see [`crate::grammar::escape_bytes`]).
pub fn escape_bytes(bytes: &[u8]) -> String {
    crate::grammar::escape_bytes(bytes, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn the_byte_table_is_gpt2s() {
        let d = byte_decoder();
        assert_eq!(d.len(), 256);
        assert_eq!(d[&'Ġ'], b' ');
        assert_eq!(d[&'Ċ'], b'\n');
        assert_eq!(d[&'!'], b'!');
        assert_eq!(d[&'ĉ'], b'\t');
    }

    #[test]
    fn escaping_keeps_text_and_shows_bytes() {
        assert_eq!(escape_bytes(b" Paris\n"), " Paris\\n");
        assert_eq!(escape_bytes(&[0xE2, 0x82]), "\\xE2\\x82");
        assert_eq!(escape_bytes("é".as_bytes()), "é");
    }

    /// `shared/data/vocab`, or `None` (a skip) when it is absent and not required.
    fn vocab_dir() -> Option<PathBuf> {
        let dir = tokensieve_testkit::golden::shared_dir().map(|d| d.join("data").join("vocab"));
        match dir {
            Some(d) if d.is_dir() => Some(d),
            _ if tokensieve_testkit::golden::goldens_required() => {
                panic!("shared/data/vocab is missing and TOKENSIEVE_REQUIRE_GOLDENS=1")
            }
            _ => {
                eprintln!("skipped: shared/data/vocab not found (set TOKENSIEVE_SHARED)");
                None
            }
        }
    }

    /// llama.cpp's tokenizer test vectors (`.inp`: strings separated by
    /// `\n__ggml_vocab_test__\n`; `.out`: one line of space-separated ids per string, made by the
    /// reference Hugging Face tokenizer), without BOS.
    fn check_vectors(name: &str) {
        let Some(dir) = vocab_dir() else { return };
        let gguf = dir.join(format!("ggml-vocab-{name}.gguf"));
        let meta = super::super::read_gguf_metadata(&gguf).unwrap();
        let tokenizer = Tokenizer::from_gguf(&meta).unwrap();
        let inp = std::fs::read_to_string(gguf.with_extension("gguf.inp")).unwrap();
        let out = std::fs::read_to_string(gguf.with_extension("gguf.out")).unwrap();
        let mut inputs: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
        assert_eq!(inputs.pop(), Some(""), "the .inp file ends with a separator");
        let expected: Vec<&str> = out.lines().collect();
        assert_eq!(inputs.len(), expected.len());
        assert!(inputs.len() >= 40);
        let mut failures = Vec::new();
        for (text, want) in inputs.iter().zip(&expected) {
            let want: Vec<u32> = want.split_whitespace().map(|s| s.parse().unwrap()).collect();
            let got = tokenizer.encode(text, false).unwrap();
            if got != want {
                failures.push(format!("{text:?}: got {got:?}, want {want:?}"));
            }
            // Decoding gives the text back.
            let bytes: Vec<u8> = got.iter().flat_map(|&t| tokenizer.token_bytes(t).to_vec()).collect();
            if name != "qwen2" {
                assert_eq!(String::from_utf8_lossy(&bytes), *text, "{name}: decoding {text:?}");
            }
        }
        assert!(
            failures.is_empty(),
            "{name}: {} of {} strings differ:\n{}",
            failures.len(),
            inputs.len(),
            failures.join("\n")
        );
    }

    fn tiny() -> Tokenizer {
        use tokensieve_testkit::gguf;
        let dir = std::env::temp_dir().join(format!("tokensieve-tokenizer-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("tiny-{:?}.gguf", std::thread::current().id()));
        std::fs::write(&path, gguf::tiny_llama(1)).unwrap();
        let meta = super::super::read_gguf_metadata(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        Tokenizer::from_gguf(&meta).unwrap()
    }

    #[test]
    fn merges_apply_by_rank() {
        use tokensieve_testkit::gguf::{tiny_byte_id as b, tiny_merge_id as m};
        let t = tiny();
        // "hello": h+e (rank 1) first, so "hell"+"o" never forms: he, ll, o.
        assert_eq!(t.encode("hello world", true).unwrap(), [m("he"), m("ll"), b(b'o'), m("Ġworld")]);
        assert_eq!(t.encode(" the", true).unwrap(), [m("Ġthe")]);
        // smollm: every digit alone.
        assert_eq!(t.encode("42", true).unwrap(), [b(b'4'), b(b'2')]);
        // Bytes of a multi-byte character, each its own token.
        assert_eq!(t.encode("é", true).unwrap(), [b(0xC3), b(0xA9)]);
    }

    #[test]
    fn control_tokens_match_whole_and_decode_to_nothing() {
        use tokensieve_testkit::gguf::{tiny_byte_id as b, tiny_merge_id as m};
        let t = tiny();
        assert_eq!(t.encode("<|im_start|>the", true).unwrap(), [1, b(b't'), m("he")]);
        assert!(t.token_bytes(1).is_empty());
        assert_eq!(t.display(1), "<|im_start|>");
        assert_eq!(t.vocabulary_bytes()[2], b"<|im_end|>");
        assert_eq!(t.token_bytes(m("Ġworld")), b" world");
        assert_eq!(t.display(b(b'\n')), "\\n");
        assert!(t.is_end_of_generation(2) && t.is_end_of_generation(0) && !t.is_end_of_generation(1));
        assert_eq!((t.bos_text(), t.eos_text()), (Some("<|im_start|>"), Some("<|im_end|>")));
        // add_bos_token is false: no BOS even when asked.
        assert_eq!(t.encode("the", true).unwrap().first(), Some(&b(b't')));
    }

    #[test]
    fn unsupported_tokenizers_are_named() {
        let mut meta = GgufMeta::new();
        use candle_core::quantized::gguf_file::Value;
        meta.insert("tokenizer.ggml.model".into(), Value::String("llama".into()));
        let e = Tokenizer::from_gguf(&meta).err().unwrap().to_string();
        assert!(e.contains("`llama`"), "{e}");
        meta.insert("tokenizer.ggml.model".into(), Value::String("gpt2".into()));
        meta.insert("tokenizer.ggml.tokens".into(), Value::Array(vec![Value::String("a".into())]));
        meta.insert("tokenizer.ggml.pre".into(), Value::String("klingon".into()));
        let e = Tokenizer::from_gguf(&meta).err().unwrap().to_string();
        assert!(e.contains("`klingon`"), "{e}");
    }

    #[test]
    fn gpt2_reproduces_llama_cpp_test_vectors() {
        check_vectors("gpt-2");
    }

    #[test]
    fn llama3_reproduces_llama_cpp_test_vectors() {
        check_vectors("llama-bpe");
    }

    #[test]
    fn qwen2_reproduces_llama_cpp_test_vectors() {
        check_vectors("qwen2");
    }
}
