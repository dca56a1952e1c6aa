//! Masks over real vocabularies (`shared/data/vocab`): the fast mask equals the token-by-token
//! definition at every step of a JSON document walked token by token, every document token is
//! allowed when it comes, and end-of-generation is allowed exactly at the end.

use std::path::PathBuf;
use std::sync::Arc;

use tokensieve_grammar::{is_allowed, vocab::Vocab, Grammar, Matcher, TokenIndex};
use tokensieve_testkit::golden::{goldens_required, shared_dir};

fn shared_file(rel: &str) -> Option<PathBuf> {
    let path = shared_dir().map(|d| d.join(rel)).filter(|p| p.exists());
    if path.is_none() {
        assert!(!goldens_required(), "{rel} is missing and TOKENSIEVE_REQUIRE_GOLDENS=1");
        eprintln!("skipped: {rel} not found");
    }
    path
}

const DOC: &str = r#"{"name": "Ünïcødé ✓", "tags": ["a", "b\n"], "n": -12.5e3, "ok": true, "sub": {"x": null}}"#;

fn walk(vocab_file: &str, check_every: usize) {
    let Some(vocab_path) = shared_file(&format!("data/vocab/{vocab_file}")) else { return };
    let Some(gbnf) = shared_file("grammar/llama.cpp/grammars/json.gbnf") else { return };
    let vocab = Vocab::from_file(&vocab_path).unwrap();
    let index = Arc::new(TokenIndex::from_vocab(&vocab));
    let grammar = Grammar::new(&std::fs::read_to_string(gbnf).unwrap()).unwrap();
    let mut m = Matcher::with_vocab(&grammar, index.clone()).unwrap();
    let tokens = index.greedy_tokenize(DOC.as_bytes()).expect("the vocabulary covers the document");
    for (step, &t) in tokens.iter().enumerate() {
        let fast = m.mask().unwrap();
        assert!(is_allowed(&fast, t), "{vocab_file}: step {step}: token {t} {:?} masked", index.token_bytes(t));
        for &e in index.eog_tokens() {
            assert!(!is_allowed(&fast, e), "end of generation allowed before the end");
        }
        if step % check_every == 0 {
            let naive = m.mask_naive().unwrap();
            let diff: Vec<u32> =
                (0..index.len() as u32).filter(|&i| is_allowed(&fast, i) != is_allowed(&naive, i)).collect();
            assert!(
                diff.is_empty(),
                "{vocab_file}: step {step}: masks differ on {} tokens, e.g. {:?}",
                diff.len(),
                &diff[..diff.len().min(5)]
            );
        }
        m.accept_token(t).unwrap();
    }
    assert!(m.is_complete());
    let end = m.mask().unwrap();
    assert!(index.eog_tokens().iter().all(|&e| is_allowed(&end, e)));
    assert_eq!(end, m.mask_naive().unwrap());
}

#[test]
fn json_over_llama3() {
    walk("ggml-vocab-llama-bpe.gguf", 4);
}

#[test]
fn json_over_llama_spm() {
    walk("ggml-vocab-llama-spm.gguf", 3);
}

#[test]
fn json_over_qwen2() {
    walk("ggml-vocab-qwen2.gguf", 7);
}
