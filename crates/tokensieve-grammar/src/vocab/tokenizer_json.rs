//! Hugging Face `tokenizer.json`, read as llama.cpp sees the same tokenizer once converted to
//! GGUF by `convert_hf_to_gguf.py`.
//!
//! * `model.vocab`: a map from token to id (BPE, WordPiece, WordLevel) or a list of
//!   `[piece, score]` whose index is the id (Unigram).
//! * `added_tokens`: `{id, content, special}`; they replace the model's token of the same id.
//!   Special ones are control tokens, the others user-defined; either way the piece is the
//!   content (for `▁`-spelled vocabularies a user-defined token's `▁` is a space, as the
//!   converter writes it).
//! * Spelling: byte-level when the decoder or the pre-tokenizer is (or contains) `ByteLevel`;
//!   otherwise `▁`-spelled when the model is `Unigram`, or something uses `Metaspace`, or the
//!   decoder replaces `▁` or the normalizer writes it; otherwise WordPiece for `WordPiece`
//!   models (`##x` is `x`, `x` is ` x`, `[X]` is itself, as the converter spells them); else
//!   tokens are their text.
//! * Byte tokens: `<0xAB>` when the model has `byte_fallback` or the decoder has
//!   `ByteFallback`.
//! * The unknown token (`model.unk_token`, or `model.unk_id` for Unigram) has type unknown.
//! * Size: the largest id plus one; ids no token has are unused, with empty pieces.
//! * End of generation: from the token texts only (see the module docs of
//!   [`crate::vocab`]); `tokenizer.json` does not say which token is EOS.

use super::{build, RawTokens, SpecialIds, TokenType, Vocab, VocabKind};
use crate::{Error, Result};
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;
use std::borrow::Cow;
use std::fmt;

/// Ids at or above this (16.7M) are taken for corruption, not a vocabulary.
const MAX_ID: u64 = 1 << 24;

#[derive(Deserialize)]
struct TokenizerJson<'a> {
    #[serde(borrow)]
    model: ModelJson<'a>,
    #[serde(default)]
    added_tokens: Option<Vec<AddedToken>>,
    #[serde(default)]
    normalizer: Option<Value>,
    #[serde(default)]
    pre_tokenizer: Option<Value>,
    #[serde(default)]
    decoder: Option<Value>,
}

#[derive(Deserialize)]
struct ModelJson<'a> {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(borrow)]
    vocab: Entries<'a>,
    #[serde(default)]
    byte_fallback: Option<bool>,
    #[serde(default)]
    unk_token: Option<String>,
    #[serde(default)]
    unk_id: Option<u64>,
}

#[derive(Deserialize)]
struct AddedToken {
    id: u64,
    content: String,
    #[serde(default)]
    special: bool,
}

/// `model.vocab`: (token, id) pairs, borrowing the token text from the input where it has no
/// escapes (no allocation per token for most of them).
struct Entries<'a> {
    pairs: Vec<(Cow<'a, str>, u64)>,
    /// Whether the vocab was a list (Unigram) rather than a map.
    list: bool,
}

/// A string that borrows from the input when it can.
struct Text<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a token string")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> std::result::Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> std::result::Result<Self::Value, E> {
                Ok(Text(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> std::result::Result<Self::Value, E> {
                Ok(Text(Cow::Owned(s)))
            }
        }
        d.deserialize_str(V)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Entries<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entries<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map from token to id, or a list of [piece, score]")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Self::Value, A::Error> {
                let mut pairs = Vec::with_capacity(map.size_hint().unwrap_or(0).min(1 << 20));
                while let Some((Text(token), id)) = map.next_entry::<Text<'de>, u64>()? {
                    pairs.push((token, id));
                }
                Ok(Entries { pairs, list: false })
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Self::Value, A::Error> {
                let mut pairs = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
                while let Some((Text(piece), IgnoredAny)) = seq.next_element::<(Text<'de>, IgnoredAny)>()? {
                    pairs.push((piece, pairs.len() as u64));
                }
                Ok(Entries { pairs, list: true })
            }
        }
        d.deserialize_any(V)
    }
}

/// Whether `value` is, or holds anywhere inside it, an object whose `"type"` is `name`.
fn has_type(value: &Value, name: &str) -> bool {
    match value {
        Value::Object(map) => {
            map.get("type").and_then(Value::as_str) == Some(name) || map.values().any(|v| has_type(v, name))
        }
        Value::Array(items) => items.iter().any(|v| has_type(v, name)),
        _ => false,
    }
}

/// Whether `value` holds a `Replace` whose pattern is the string `from` and content `to`.
fn has_replace(value: &Value, from: &str, to: &str) -> bool {
    match value {
        Value::Object(map) => {
            let this = map.get("type").and_then(Value::as_str) == Some("Replace")
                && map.get("pattern").and_then(|p| p.get("String")).and_then(Value::as_str) == Some(from)
                && map.get("content").and_then(Value::as_str) == Some(to);
            this || map.values().any(|v| has_replace(v, from, to))
        }
        Value::Array(items) => items.iter().any(|v| has_replace(v, from, to)),
        _ => false,
    }
}

fn is_byte_token(text: &str) -> bool {
    let b = text.as_bytes();
    b.len() == 6 && b.starts_with(b"<0x") && b[5] == b'>' && b[3].is_ascii_hexdigit() && b[4].is_ascii_hexdigit()
}

/// WordPiece tokens as `convert_hf_to_gguf.py` spells them for llama.cpp.
fn phantom_space(token: &str) -> Cow<'_, str> {
    if token.starts_with('[') && token.ends_with(']') {
        Cow::Borrowed(token)
    } else if let Some(rest) = token.strip_prefix("##") {
        Cow::Borrowed(rest)
    } else {
        Cow::Owned(format!("▁{token}"))
    }
}

pub(super) fn read(json: &str) -> Result<Vocab> {
    let parsed: TokenizerJson<'_> =
        serde_json::from_str(json).map_err(|e| Error::vocab(format!("tokenizer.json: {e}")))?;
    let model = parsed.model;
    let model_kind = model.kind.as_deref().unwrap_or(if model.vocab.list { "Unigram" } else { "BPE" });
    let none = Value::Null;
    let decoder = parsed.decoder.as_ref().unwrap_or(&none);
    let pre_tokenizer = parsed.pre_tokenizer.as_ref().unwrap_or(&none);
    let normalizer = parsed.normalizer.as_ref().unwrap_or(&none);

    let kind = if has_type(decoder, "ByteLevel") || has_type(pre_tokenizer, "ByteLevel") {
        VocabKind::ByteLevelBpe
    } else if model_kind == "Unigram" {
        VocabKind::Unigram
    } else if has_type(decoder, "Metaspace")
        || has_type(pre_tokenizer, "Metaspace")
        || has_replace(decoder, "▁", " ")
        || has_replace(normalizer, " ", "▁")
    {
        VocabKind::SentencePiece
    } else if model_kind == "WordPiece" {
        VocabKind::WordPiece
    } else {
        VocabKind::Raw
    };
    let byte_fallback = model.byte_fallback.unwrap_or(false) || has_type(decoder, "ByteFallback");
    let added = parsed.added_tokens.unwrap_or_default();

    let max_id = model.vocab.pairs.iter().map(|(_, id)| *id).chain(added.iter().map(|t| t.id)).max();
    let Some(max_id) = max_id else {
        return Err(Error::vocab("tokenizer.json: the vocabulary is empty"));
    };
    if max_id >= MAX_ID {
        return Err(Error::vocab(format!("tokenizer.json: token id {max_id} is too large (at most {})", MAX_ID - 1)));
    }
    let n = max_id as usize + 1;

    // Each id's text and type; added tokens replace the model's.
    let mut slots: Vec<Option<(Cow<'_, str>, TokenType)>> = vec![None; n];
    for (token, id) in model.vocab.pairs {
        let slot = &mut slots[id as usize];
        if let Some((other, _)) = slot {
            return Err(Error::vocab(format!("tokenizer.json: tokens {other:?} and {token:?} both have id {id}")));
        }
        let ty = if byte_fallback && is_byte_token(&token) { TokenType::Byte } else { TokenType::Normal };
        *slot = Some((token, ty));
    }
    let unk = match model_kind {
        "Unigram" => model.unk_id.filter(|&id| id < n as u64).map(|id| id as usize),
        _ => {
            model.unk_token.as_deref().and_then(|unk| slots.iter().position(|s| matches!(s, Some((t, _)) if t == unk)))
        }
    };
    if let Some(Some((_, ty))) = unk.map(|id| &mut slots[id]) {
        *ty = TokenType::Unknown;
    }
    let spaced = matches!(kind, VocabKind::SentencePiece | VocabKind::Unigram | VocabKind::WordPiece);
    for token in added {
        let (text, ty) = if token.special {
            (token.content, TokenType::Control)
        } else if spaced {
            (token.content.replace('▁', " "), TokenType::UserDefined)
        } else {
            (token.content, TokenType::UserDefined)
        };
        slots[token.id as usize] = Some((Cow::Owned(text), ty));
    }

    let total: usize = slots.iter().flatten().map(|(t, _)| t.len() + 3).sum();
    let mut raw = RawTokens {
        texts: Vec::with_capacity(total),
        offsets: Vec::with_capacity(n + 1),
        types: Vec::with_capacity(n),
    };
    raw.offsets.push(0);
    for slot in &slots {
        match slot {
            Some((text, ty)) => {
                if kind == VocabKind::WordPiece && *ty == TokenType::Normal {
                    raw.texts.extend_from_slice(phantom_space(text).as_bytes());
                } else {
                    raw.texts.extend_from_slice(text.as_bytes());
                }
                raw.types.push(*ty);
            }
            None => raw.types.push(TokenType::Unused),
        }
        let end = u32::try_from(raw.texts.len())
            .map_err(|_| Error::vocab("tokenizer.json: the token texts add up to more than 4 GiB"))?;
        raw.offsets.push(end);
    }
    build(kind, raw, SpecialIds::default()).map_err(|e| Error::vocab(format!("tokenizer.json: {}", e.message())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn pieces(v: &Vocab) -> Vec<Vec<u8>> {
        v.iter().map(<[u8]>::to_vec).collect()
    }

    fn err(json: &str) -> String {
        let e = Vocab::from_tokenizer_json_str(json).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Vocab);
        e.message().to_string()
    }

    #[test]
    fn byte_level_bpe() {
        let json = r#"{
            "added_tokens": [
                {"id": 3, "content": "<|endoftext|>", "special": true},
                {"id": 5, "content": "<|im_end|>", "special": true},
                {"id": 6, "content": "<tool>", "special": false}
            ],
            "normalizer": null,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split"}, {"type": "ByteLevel", "add_prefix_space": false}]},
            "decoder": {"type": "ByteLevel"},
            "model": {"type": "BPE", "vocab": {"\u0120hello": 0, "\u010a": 1, "a\"b": 2, "<|endoftext|>": 3}, "merges": []}
        }"#;
        let v = Vocab::from_tokenizer_json_str(json).unwrap();
        assert_eq!(v.kind(), VocabKind::ByteLevelBpe);
        let want: Vec<&[u8]> = vec![b" hello", b"\n", b"a\"b", b"<|endoftext|>", b"", b"<|im_end|>", b"<tool>"];
        assert_eq!(pieces(&v), want);
        assert_eq!(v.token_type(3), Some(TokenType::Control));
        assert_eq!(v.token_type(4), Some(TokenType::Unused));
        assert_eq!(v.token_type(6), Some(TokenType::UserDefined));
        assert_eq!(v.eog_tokens(), &[3, 5]);
    }

    #[test]
    fn sentencepiece_with_byte_fallback() {
        // Llama-2's layout: BPE, `▁` written by the normalizer, ByteFallback in the decoder.
        let json = r#"{
            "added_tokens": [{"id": 0, "content": "<unk>", "special": true}, {"id": 2, "content": "</s>", "special": true},
                             {"id": 6, "content": "▁<x>", "special": false}],
            "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                           {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
            "pre_tokenizer": null,
            "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                        {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
            "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": true,
                      "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "<0x0A>": 3, "▁the": 4, "<0x4>": 5}}
        }"#;
        let v = Vocab::from_tokenizer_json_str(json).unwrap();
        assert_eq!(v.kind(), VocabKind::SentencePiece);
        let want: Vec<&[u8]> = vec![b"<unk>", b"<s>", b"</s>", b"\n", b" the", b"<0x4>", b" <x>"];
        assert_eq!(pieces(&v), want);
        assert_eq!(v.token_type(1), Some(TokenType::Normal));
        assert_eq!(v.token_type(3), Some(TokenType::Byte));
        assert_eq!(v.eog_tokens(), &[2]);
    }

    #[test]
    fn unigram_list_vocabulary() {
        let json = r#"{"model": {"type": "Unigram", "unk_id": 1, "byte_fallback": false,
                       "vocab": [["<pad>", 0.0], ["<unk>", 0.0], ["▁a", -1.5], ["b", -2.0], ["<0x41>", -3]]},
                       "added_tokens": [{"id": 0, "content": "<pad>", "special": true}]}"#;
        let v = Vocab::from_tokenizer_json_str(json).unwrap();
        assert_eq!(v.kind(), VocabKind::Unigram);
        let want: Vec<&[u8]> = vec![b"<pad>", b"<unk>", b" a", b"b", b"<0x41>"];
        assert_eq!(pieces(&v), want);
        assert_eq!(v.token_type(1), Some(TokenType::Unknown));
        assert_eq!(v.token_type(4), Some(TokenType::Normal));
    }

    #[test]
    fn wordpiece_and_raw() {
        let json = r###"{"model": {"type": "WordPiece", "unk_token": "[UNK]", "vocab": {"[UNK]": 0, "hello": 1, "##ing": 2}}}"###;
        let v = Vocab::from_tokenizer_json_str(json).unwrap();
        assert_eq!(v.kind(), VocabKind::WordPiece);
        let want: Vec<&[u8]> = vec![b"[UNK]", b" hello", b"ing"];
        assert_eq!(pieces(&v), want);
        let json = r#"{"model": {"type": "WordLevel", "vocab": {"a b": 0, "▁c": 1}}}"#;
        let v = Vocab::from_tokenizer_json_str(json).unwrap();
        assert_eq!(v.kind(), VocabKind::Raw);
        let want: Vec<&[u8]> = vec![b"a b", "▁c".as_bytes()];
        assert_eq!(pieces(&v), want);
    }

    #[test]
    fn malformed_files_are_errors() {
        assert!(err("").contains("tokenizer.json"));
        assert!(err("{").contains("tokenizer.json"));
        assert!(err("[]").contains("tokenizer.json"));
        assert!(err(r#"{"added_tokens": []}"#).contains("model"));
        assert!(err(r#"{"model": {"vocab": 3}}"#).contains("map from token to id"));
        assert!(err(r#"{"model": {"vocab": {"a": -1}}}"#).contains("tokenizer.json"));
        assert!(err(r#"{"model": {"vocab": {"a": "x"}}}"#).contains("tokenizer.json"));
        assert!(err(r#"{"model": {"vocab": [["a"]]}}"#).contains("tokenizer.json"));
        assert!(err(r#"{"model": {"vocab": {}}}"#).contains("empty"));
        assert!(err(r#"{"model": {"vocab": {"a": 4294967296}}}"#).contains("too large"));
        assert!(err(r#"{"model": {"vocab": {"a": 0}}, "added_tokens": [{"id": 99999999, "content": "x"}]}"#)
            .contains("too large"));
        assert!(err(r#"{"model": {"vocab": {"a": 0, "b": 0}}}"#).contains("both have id 0"));
        assert!(err(r#"{"model": {"vocab": {"a": 0}}, "added_tokens": [{"content": "x"}]}"#).contains("id"));
    }
}
