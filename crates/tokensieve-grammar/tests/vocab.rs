//! Vocabularies read from llama.cpp's vocabulary test files: sizes, end-of-generation sets, and
//! every expected tokenization of the 46 test strings decoding back to its input.
//!
//! The data lives in the shared directory (`shared/data/vocab/`), found from `TOKENSIEVE_SHARED`
//! or by walking up from this crate. Tests that need it print a note and pass when it is
//! absent, unless `TOKENSIEVE_REQUIRE_GOLDENS=1`.

use std::path::{Path, PathBuf};
use std::time::Instant;
use tokensieve_grammar::vocab::{TokenType, Vocab, VocabKind};
use tokensieve_grammar::ErrorKind;

fn shared_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("TOKENSIEVE_SHARED") {
        let dir = PathBuf::from(dir);
        if dir.join("data/vocab").is_dir() {
            return Some(dir);
        }
    }
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.ancestors().map(|a| a.join("shared")).find(|s| s.join("data/vocab").is_dir())
}

/// The shared data directory, or `None` (with a note) when it is absent and not required.
fn data() -> Option<PathBuf> {
    match shared_dir() {
        Some(dir) => Some(dir.join("data")),
        None if std::env::var("TOKENSIEVE_REQUIRE_GOLDENS").is_ok_and(|v| v == "1") => {
            panic!("TOKENSIEVE_REQUIRE_GOLDENS=1 but no shared/data/vocab was found (set TOKENSIEVE_SHARED)")
        }
        None => {
            eprintln!("note: shared/data/vocab not found (set TOKENSIEVE_SHARED); skipping");
            None
        }
    }
}

/// The test strings of a `.inp` file: separated by the line `__ggml_vocab_test__`, the last
/// one followed by that line or not.
fn test_strings(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut parts: Vec<String> = text.split("\n__ggml_vocab_test__\n").map(str::to_string).collect();
    if parts.last().is_some_and(String::is_empty) {
        parts.pop();
    }
    parts
}

fn expected_ids(path: &Path) -> Vec<Vec<u32>> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines().map(|line| line.split_whitespace().map(|id| id.parse().unwrap()).collect()).collect()
}

struct Case {
    file: &'static str,
    len: usize,
    kind: VocabKind,
    eog: &'static [u32],
    /// SentencePiece with llama.cpp's `add_space_prefix` (and HF's legacy Llama tokenizer):
    /// a non-empty input is encoded as " " + input.
    space_prefix: bool,
}

const CASES: &[Case] = &[
    Case {
        file: "ggml-vocab-gpt-2.gguf",
        len: 50_257,
        kind: VocabKind::ByteLevelBpe,
        eog: &[50256],
        space_prefix: false,
    },
    Case {
        file: "ggml-vocab-llama-spm.gguf",
        len: 32_000,
        kind: VocabKind::SentencePiece,
        eog: &[2],
        space_prefix: true,
    },
    Case {
        file: "ggml-vocab-llama-bpe.gguf",
        len: 128_256,
        kind: VocabKind::ByteLevelBpe,
        eog: &[128001, 128009],
        space_prefix: false,
    },
    // Qwen2's vocabulary has a normal token `</s>` (128247): llama.cpp makes it EOG by its text.
    Case {
        file: "ggml-vocab-qwen2.gguf",
        len: 151_936,
        kind: VocabKind::ByteLevelBpe,
        eog: &[128247, 151643, 151645],
        space_prefix: false,
    },
    // Gemma-4: `<eos>`, `<|tool_response>`, `<turn|>`; its normal `</s>` (212) is dropped.
    Case {
        file: "ggml-vocab-gemma-4.gguf",
        len: 262_144,
        kind: VocabKind::SentencePieceBpe,
        eog: &[1, 50, 106],
        space_prefix: false,
    },
];

fn check_case(dir: &Path, case: &Case) {
    let path = dir.join("vocab").join(case.file);
    let vocab = Vocab::from_gguf_file(&path).unwrap_or_else(|e| panic!("{}: {e}", case.file));
    assert_eq!(vocab.len(), case.len, "{}", case.file);
    assert_eq!(vocab.kind(), case.kind, "{}", case.file);
    assert_eq!(vocab.eog_tokens(), case.eog, "{}", case.file);
    assert_eq!(vocab.iter().len(), case.len);

    let inputs = test_strings(&path.with_extension("gguf.inp"));
    let outputs = expected_ids(&path.with_extension("gguf.out"));
    assert_eq!(inputs.len(), 46, "{}", case.file);
    assert_eq!(outputs.len(), 46, "{}", case.file);
    let mut failures = Vec::new();
    for (i, (input, ids)) in inputs.iter().zip(&outputs).enumerate() {
        let mut decoded = Vec::new();
        for &id in ids {
            assert!(!vocab.is_eog(id), "{}: test {i} uses EOG token {id}", case.file);
            decoded.extend_from_slice(vocab.get(id).unwrap_or_else(|| panic!("{}: id {id} out of range", case.file)));
        }
        let mut want = Vec::new();
        if case.space_prefix && !input.is_empty() {
            want.push(b' ');
        }
        want.extend_from_slice(input.as_bytes());
        if decoded != want {
            failures.push(format!(
                "test {i}: ids {ids:?}\n  decoded {:?}\n  wanted  {:?}",
                String::from_utf8_lossy(&decoded),
                String::from_utf8_lossy(&want)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{}: {} of 46 strings do not round-trip:\n{}",
        case.file,
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn gpt2() {
    if let Some(dir) = data() {
        check_case(&dir, &CASES[0]);
    }
}

#[test]
fn llama_spm() {
    if let Some(dir) = data() {
        check_case(&dir, &CASES[1]);
        let v = Vocab::from_gguf_file(&dir.join("vocab/ggml-vocab-llama-spm.gguf")).unwrap();
        // Control and unknown tokens are their text; byte tokens are one byte.
        assert_eq!(v.get(0), Some(&b"<unk>"[..]));
        assert_eq!(v.get(1), Some(&b"<s>"[..]));
        assert_eq!(v.get(2), Some(&b"</s>"[..]));
        assert_eq!(v.get(3), Some(&[0u8][..]));
        assert_eq!(v.get(3 + 0x0A), Some(&b"\n"[..]));
        assert_eq!(v.token_type(0), Some(TokenType::Unknown));
        assert_eq!(v.token_type(3), Some(TokenType::Byte));
        // `<s>` as text resolves to its token.
        assert_eq!(v.token_id(b"<s>"), Some(1));
        assert_eq!(v.token_id(b" Hello"), Some(15043));
    }
}

#[test]
fn llama3() {
    if let Some(dir) = data() {
        check_case(&dir, &CASES[2]);
        let v = Vocab::from_gguf_file(&dir.join("vocab/ggml-vocab-llama-bpe.gguf")).unwrap();
        assert_eq!(v.get(128000), Some(&b"<|begin_of_text|>"[..]));
        assert_eq!(v.get(128009), Some(&b"<|eot_id|>"[..]));
        assert_eq!(v.token_id(b"<|eot_id|>"), Some(128009));
        assert_eq!(v.token_type(128009), Some(TokenType::Control));
    }
}

#[test]
fn qwen2() {
    if let Some(dir) = data() {
        check_case(&dir, &CASES[3]);
        let v = Vocab::from_gguf_file(&dir.join("vocab/ggml-vocab-qwen2.gguf")).unwrap();
        // Padding slots are user-defined tokens: their text is the piece.
        assert_eq!(v.get(151646), Some(&b"[PAD151646]"[..]));
        assert_eq!(v.token_id(b"<|im_start|>"), Some(151644));
    }
}

#[test]
fn gemma4() {
    if let Some(dir) = data() {
        check_case(&dir, &CASES[4]);
        let v = Vocab::from_gguf_file(&dir.join("vocab/ggml-vocab-gemma-4.gguf")).unwrap();
        assert_eq!(v.get(212), Some(&b"</s>"[..]));
        assert!(!v.is_eog(212));
        assert_eq!(v.get(106), Some(&b"<turn|>"[..]));
    }
}

/// A whole model file: only its metadata is read. SmolLM2's FIM repository token
/// `<reponame>` (4) ends generation by llama.cpp's text rule.
#[test]
fn model_file_reads_only_the_metadata() {
    let Some(dir) = data() else { return };
    let path = dir.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.is_file() {
        eprintln!("note: {} not found; skipping", path.display());
        return;
    }
    let start = Instant::now();
    let v = Vocab::from_file(&path).unwrap();
    eprintln!(
        "SmolLM2 model file ({} MB): vocabulary read in {:?}",
        std::fs::metadata(&path).unwrap().len() >> 20,
        start.elapsed()
    );
    assert_eq!(v.len(), 49_152);
    assert_eq!(v.kind(), VocabKind::ByteLevelBpe);
    assert_eq!(v.eog_tokens(), &[0, 2, 4]);
    assert_eq!(v.get(2), Some(&b"<|im_end|>"[..]));
}

/// Load time of the Llama-3 vocabulary (128,256 tokens); run with `--release --nocapture`.
#[test]
fn llama3_load_time() {
    let Some(dir) = data() else { return };
    let path = dir.join("vocab/ggml-vocab-llama-bpe.gguf");
    let bytes = std::fs::read(&path).unwrap();
    let mut file_times = Vec::new();
    let mut memory_times = Vec::new();
    for _ in 0..21 {
        let start = Instant::now();
        let v = Vocab::from_gguf_file(&path).unwrap();
        file_times.push(start.elapsed());
        assert_eq!(v.len(), 128_256);
        let start = Instant::now();
        let v = Vocab::from_gguf_bytes(&bytes).unwrap();
        memory_times.push(start.elapsed());
        assert_eq!(v.len(), 128_256);
    }
    file_times.sort();
    memory_times.sort();
    eprintln!(
        "Llama-3 vocabulary ({} MB GGUF): from file median {:?} (min {:?}); from memory median {:?} (min {:?})",
        bytes.len() >> 20,
        file_times[10],
        file_times[0],
        memory_times[10],
        memory_times[0]
    );
}

fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// A `tokenizer.json` written from a GGUF vocabulary (normal tokens spelled back into the
/// tokenizer's alphabet, the others as added tokens) reads back to the same pieces.
#[test]
fn tokenizer_json_agrees_with_gguf() {
    let Some(dir) = data() else { return };
    for (file, byte_level) in [("ggml-vocab-gpt-2.gguf", true), ("ggml-vocab-llama-spm.gguf", false)] {
        let gguf = Vocab::from_gguf_file(&dir.join("vocab").join(file)).unwrap();
        let mut vocab = Vec::new();
        let mut added = Vec::new();
        for (id, piece) in gguf.iter().enumerate() {
            let id = id as u32;
            let text = String::from_utf8(piece.to_vec());
            match gguf.token_type(id).unwrap() {
                TokenType::Normal if byte_level => {
                    let spelled: String = piece.iter().map(|&b| tokensieve_testkit::gguf::byte_to_char(b)).collect();
                    vocab.push(format!("{}: {id}", json_string(&spelled)));
                }
                TokenType::Normal => vocab.push(format!("{}: {id}", json_string(&text.unwrap().replace(' ', "▁")))),
                TokenType::Byte => vocab.push(format!("\"<0x{:02X}>\": {id}", piece[0])),
                _ => added
                    .push(format!("{{\"id\": {id}, \"content\": {}, \"special\": true}}", json_string(&text.unwrap()))),
            }
        }
        let decoder = if byte_level {
            r#"{"type": "ByteLevel"}"#
        } else {
            r#"{"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"}]}"#
        };
        let json = format!(
            "{{\"added_tokens\": [{}], \"decoder\": {decoder}, \"model\": {{\"type\": \"BPE\", \"vocab\": {{{}}}}}}}",
            added.join(","),
            vocab.join(",")
        );
        let path = std::env::temp_dir().join(format!("tokensieve-vocab-{}-{file}.json", std::process::id()));
        std::fs::write(&path, &json).unwrap();
        let from_json = Vocab::from_file(&path);
        std::fs::remove_file(&path).ok();
        let from_json = from_json.unwrap();
        assert_eq!(from_json.len(), gguf.len(), "{file}");
        assert!(from_json.iter().eq(gguf.iter()), "{file}: pieces differ");
        assert_eq!(from_json.eog_tokens(), gguf.eog_tokens(), "{file}");
    }
}

#[test]
fn missing_and_corrupt_files_are_errors() {
    let missing = Path::new("/definitely/not/here.gguf");
    assert_eq!(Vocab::from_gguf_file(missing).unwrap_err().kind(), ErrorKind::Io);
    assert_eq!(Vocab::from_file(missing).unwrap_err().kind(), ErrorKind::Io);
    let path = std::env::temp_dir().join(format!("tokensieve-vocab-{}-bad.gguf", std::process::id()));
    std::fs::write(&path, b"GGUF\x03\x00\x00\x00\x00").unwrap();
    let gguf = Vocab::from_file(&path).unwrap_err();
    std::fs::write(&path, b"{\"model\": 1}").unwrap();
    let json = Vocab::from_file(&path).unwrap_err();
    std::fs::remove_file(&path).ok();
    assert_eq!(gguf.kind(), ErrorKind::Vocab);
    assert!(gguf.message().contains("bad.gguf") && gguf.message().contains("truncated"), "{gguf}");
    assert_eq!(json.kind(), ErrorKind::Vocab);
    assert!(json.message().contains("tokenizer.json"), "{json}");
}
