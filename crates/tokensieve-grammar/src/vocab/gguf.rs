//! A metadata-only GGUF reader for the vocabulary keys.
//!
//! Format (GGUF v2 and v3, little-endian): magic `GGUF`, version (u32), tensor count (u64),
//! metadata count (u64), then each metadata entry: a key (u64 length + UTF-8), a value type
//! (u32) and the value (scalars; strings as u64 length + bytes; arrays as element type u32,
//! count u64, elements). The tensor infos and data that follow are never read.
//!
//! Untrusted input: every length and count is checked against the bytes that remain before
//! anything is allocated or skipped, so a truncated or corrupt file gives an error, never a
//! panic or an allocation larger than the file.

use super::{build, RawTokens, SpecialIds, TokenType, Vocab, VocabKind};
use crate::{Error, Result};
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

/// More tokens than any real vocabulary (16.7M): a count above it is corruption.
const MAX_TOKENS: u64 = 1 << 24;
/// Longest token text accepted (real ones are at most a few hundred bytes).
const MAX_TOKEN_TEXT: u64 = 1 << 20;
/// Longest `tokenizer.ggml.model` / `pre` value kept.
const MAX_NAME: u64 = 4096;
/// Nesting of arrays of arrays skipped before giving up.
const MAX_ARRAY_DEPTH: u32 = 4;

// GGUF value types.
const T_U8: u32 = 0;
const T_I8: u32 = 1;
const T_U16: u32 = 2;
const T_I16: u32 = 3;
const T_U32: u32 = 4;
const T_I32: u32 = 5;
const T_F32: u32 = 6;
const T_BOOL: u32 = 7;
const T_STRING: u32 = 8;
const T_ARRAY: u32 = 9;
const T_U64: u32 = 10;
const T_I64: u32 = 11;
const T_F64: u32 = 12;

/// Where the metadata comes from: a byte slice or a file.
pub(super) trait Source {
    /// Fills `buf`, or fails if fewer bytes remain.
    fn read(&mut self, buf: &mut [u8]) -> Result<()>;
    /// Skips `n` bytes, or fails if fewer remain.
    fn skip(&mut self, n: u64) -> Result<()>;
    /// Bytes left in the input.
    fn remaining(&self) -> u64;
    /// Reads `n` strings (u64 length, then the bytes), passing each with its index to `f`;
    /// a string longer than `max` bytes is an error.
    fn strings(&mut self, n: u64, max: u64, f: &mut dyn FnMut(u64, &[u8])) -> Result<()>;
}

fn le_u64(bytes: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(a)
}

/// Checks the length of string `i` against the limit and the bytes left after it.
fn check_string(i: u64, len: u64, max: u64, left: u64) -> Result<()> {
    if len > max {
        return Err(Error::vocab(format!("entry {i} is {len} bytes long (at most {max} accepted)")));
    }
    if len > left {
        return Err(Error::vocab(format!("entry {i} claims {len} bytes but only {left} remain")));
    }
    Ok(())
}

fn truncated(need: u64, left: u64) -> Error {
    Error::vocab(format!("truncated: {need} more bytes needed, {left} left"))
}

/// A GGUF file in memory.
pub(super) struct SliceSource<'a> {
    rest: &'a [u8],
}

impl<'a> SliceSource<'a> {
    pub(super) fn new(bytes: &'a [u8]) -> Self {
        SliceSource { rest: bytes }
    }
}

impl Source for SliceSource<'_> {
    fn read(&mut self, buf: &mut [u8]) -> Result<()> {
        if buf.len() > self.rest.len() {
            return Err(truncated(buf.len() as u64, self.rest.len() as u64));
        }
        let (head, tail) = self.rest.split_at(buf.len());
        buf.copy_from_slice(head);
        self.rest = tail;
        Ok(())
    }

    fn skip(&mut self, n: u64) -> Result<()> {
        if n > self.rest.len() as u64 {
            return Err(truncated(n, self.rest.len() as u64));
        }
        self.rest = &self.rest[n as usize..];
        Ok(())
    }

    fn remaining(&self) -> u64 {
        self.rest.len() as u64
    }

    fn strings(&mut self, n: u64, max: u64, f: &mut dyn FnMut(u64, &[u8])) -> Result<()> {
        for i in 0..n {
            if self.rest.len() < 8 {
                return Err(truncated(8, self.rest.len() as u64));
            }
            let (len, tail) = (le_u64(self.rest), &self.rest[8..]);
            check_string(i, len, max, tail.len() as u64)?;
            let (text, rest) = tail.split_at(len as usize);
            f(i, text);
            self.rest = rest;
        }
        Ok(())
    }
}

/// A GGUF file on disk, read through a buffer; skipped values are seeked over.
pub(super) struct FileSource {
    reader: BufReader<std::fs::File>,
    remaining: u64,
    path: PathBuf,
}

impl FileSource {
    pub(super) fn new(file: std::fs::File, len: u64, path: &Path) -> Self {
        FileSource { reader: BufReader::with_capacity(1 << 16, file), remaining: len, path: path.to_path_buf() }
    }

    fn io(&self, e: std::io::Error, need: u64) -> Error {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            // The file shrank while being read.
            truncated(need, 0)
        } else {
            Error::io(&self.path, e)
        }
    }
}

impl Source for FileSource {
    fn read(&mut self, buf: &mut [u8]) -> Result<()> {
        let need = buf.len() as u64;
        if need > self.remaining {
            return Err(truncated(need, self.remaining));
        }
        self.reader.read_exact(buf).map_err(|e| self.io(e, need))?;
        self.remaining -= need;
        Ok(())
    }

    fn skip(&mut self, n: u64) -> Result<()> {
        if n > self.remaining {
            return Err(truncated(n, self.remaining));
        }
        // `n <= remaining <= file length`, far below i64::MAX.
        self.reader.seek_relative(n as i64).map_err(|e| self.io(e, n))?;
        self.remaining -= n;
        Ok(())
    }

    fn remaining(&self) -> u64 {
        self.remaining
    }

    fn strings(&mut self, n: u64, max: u64, f: &mut dyn FnMut(u64, &[u8])) -> Result<()> {
        use std::io::BufRead;
        let mut scratch = Vec::new();
        for i in 0..n {
            // Fast path: the whole string is in the read buffer.
            let buffered = match self.reader.fill_buf() {
                Ok(buf) => buf,
                Err(e) => return Err(self.io(e, 8)),
            };
            if buffered.len() >= 8 {
                let len = le_u64(buffered);
                check_string(i, len, max, self.remaining.saturating_sub(8))?;
                let used = 8 + len as usize;
                if buffered.len() >= used {
                    f(i, &buffered[8..used]);
                    self.reader.consume(used);
                    self.remaining -= used as u64;
                    continue;
                }
            }
            let mut len = [0u8; 8];
            self.read(&mut len)?;
            let len = u64::from_le_bytes(len);
            check_string(i, len, max, self.remaining)?;
            scratch.resize(len as usize, 0);
            self.read(&mut scratch)?;
            f(i, &scratch);
        }
        Ok(())
    }
}

/// Little-endian primitives over a [`Source`].
struct Reader<'s, S: Source> {
    src: &'s mut S,
}

impl<S: Source> Reader<'_, S> {
    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut buf = [0u8; N];
        self.src.read(&mut buf)?;
        Ok(buf)
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A length or count of `n` items of at least `item` bytes each, checked against the input.
    fn count(&mut self, item: u64, what: &str) -> Result<u64> {
        let n = self.u64()?;
        let left = self.src.remaining();
        match n.checked_mul(item) {
            Some(bytes) if bytes <= left => Ok(n),
            _ => Err(Error::vocab(format!(
                "{what} claims {n} items of at least {item} bytes but only {left} bytes remain"
            ))),
        }
    }

    /// A string value: its length, then its bytes appended to `out`.
    fn string_into(&mut self, out: &mut Vec<u8>, max: u64, what: &str) -> Result<()> {
        let len = self.count(1, what)?;
        if len > max {
            return Err(Error::vocab(format!("{what} is {len} bytes long (at most {max} accepted)")));
        }
        let start = out.len();
        out.resize(start + len as usize, 0);
        self.src.read(&mut out[start..])
    }

    fn skip_value(&mut self, ty: u32, depth: u32) -> Result<()> {
        if let Some(size) = scalar_size(ty) {
            return self.src.skip(size);
        }
        match ty {
            T_STRING => {
                let len = self.count(1, "a string")?;
                self.src.skip(len)
            }
            T_ARRAY => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(Error::vocab("arrays nested too deeply"));
                }
                let elem = self.u32()?;
                if let Some(size) = scalar_size(elem) {
                    let n = self.count(size, "an array")?;
                    return self.src.skip(n * size);
                }
                match elem {
                    T_STRING => {
                        let n = self.count(8, "an array of strings")?;
                        self.src.strings(n, u64::MAX, &mut |_, _| {})
                    }
                    T_ARRAY => {
                        let n = self.count(12, "an array of arrays")?;
                        for _ in 0..n {
                            self.skip_value(T_ARRAY, depth + 1)?;
                        }
                        Ok(())
                    }
                    _ => Err(Error::vocab(format!("unknown array element type {elem}"))),
                }
            }
            _ => Err(Error::vocab(format!("unknown value type {ty}"))),
        }
    }

    /// An integer scalar of any width; `None` for a negative value.
    fn integer(&mut self, ty: u32) -> Result<Option<u64>> {
        let value: i128 = match ty {
            T_U8 => i128::from(self.array::<1>()?[0]),
            T_I8 => i128::from(i8::from_le_bytes(self.array()?)),
            T_U16 => i128::from(u16::from_le_bytes(self.array()?)),
            T_I16 => i128::from(i16::from_le_bytes(self.array()?)),
            T_U32 => i128::from(u32::from_le_bytes(self.array()?)),
            T_I32 => i128::from(i32::from_le_bytes(self.array()?)),
            T_U64 => i128::from(u64::from_le_bytes(self.array()?)),
            T_I64 => i128::from(i64::from_le_bytes(self.array()?)),
            _ => return Err(Error::vocab(format!("must be an integer, found value type {ty}"))),
        };
        Ok(u64::try_from(value).ok())
    }
}

fn scalar_size(ty: u32) -> Option<u64> {
    match ty {
        T_U8 | T_I8 | T_BOOL => Some(1),
        T_U16 | T_I16 => Some(2),
        T_U32 | T_I32 | T_F32 => Some(4),
        T_U64 | T_I64 | T_F64 => Some(8),
        _ => None,
    }
}

/// Metadata keys naming special tokens, in the order llama.cpp reads them (a later key
/// overrides an earlier one for the same role: the deprecated `prefix`/`suffix`/`middle` keys
/// override `fim_pre`/`fim_suf`/`fim_mid`).
const ID_KEYS: [(&str, IdRole); 12] = [
    ("tokenizer.ggml.eos_token_id", IdRole::Eos),
    ("tokenizer.ggml.eot_token_id", IdRole::Eot),
    ("tokenizer.ggml.eom_token_id", IdRole::Eom),
    ("tokenizer.ggml.fim_pre_token_id", IdRole::Fim(0)),
    ("tokenizer.ggml.fim_suf_token_id", IdRole::Fim(1)),
    ("tokenizer.ggml.fim_mid_token_id", IdRole::Fim(2)),
    ("tokenizer.ggml.fim_pad_token_id", IdRole::Fim(3)),
    ("tokenizer.ggml.fim_rep_token_id", IdRole::Fim(4)),
    ("tokenizer.ggml.fim_sep_token_id", IdRole::Fim(5)),
    ("tokenizer.ggml.prefix_token_id", IdRole::Fim(0)),
    ("tokenizer.ggml.suffix_token_id", IdRole::Fim(1)),
    ("tokenizer.ggml.middle_token_id", IdRole::Fim(2)),
];

#[derive(Clone, Copy)]
enum IdRole {
    Eos,
    Eot,
    Eom,
    Fim(usize),
}

/// What the vocabulary needs from the metadata.
#[derive(Default)]
struct Metadata {
    model: Option<String>,
    pre: Option<String>,
    /// Token texts, `[EMPTY_<id>]` for empty ones (as llama.cpp renames them), and offsets.
    tokens: Option<(Vec<u8>, Vec<u32>)>,
    types: Option<Vec<TokenType>>,
    /// Values of [`ID_KEYS`], by index (`None`: absent or negative).
    ids: [Option<u64>; ID_KEYS.len()],
}

/// Reads the header and every metadata entry, keeping the vocabulary keys.
fn read_metadata<S: Source>(src: &mut S) -> Result<Metadata> {
    let mut r = Reader { src };
    let header = |e: Error| Error::vocab(format!("GGUF header: {}", e.message()));
    let magic: [u8; 4] = r.array().map_err(header)?;
    if &magic != b"GGUF" {
        return Err(Error::vocab(format!("not a GGUF file: it starts with {magic:02x?}, not `GGUF`")));
    }
    let version = r.u32().map_err(header)?;
    match version {
        2 | 3 => {}
        1 => return Err(Error::vocab("GGUF version 1 is not supported (lengths are 32-bit there)")),
        v if matches!(v.swap_bytes(), 2 | 3) => return Err(Error::vocab("big-endian GGUF files are not supported")),
        v => return Err(Error::vocab(format!("unsupported GGUF version {v}"))),
    }
    let _tensor_count = r.u64().map_err(header)?;
    // Each entry takes at least 13 bytes (key length, value type, a one-byte value).
    let entries = r.count(13, "the metadata count").map_err(header)?;

    let mut meta = Metadata::default();
    let mut key = Vec::with_capacity(64);
    for index in 0..entries {
        let context = |key: &[u8], e: Error| {
            let name =
                if key.is_empty() { format!("entry {index}") } else { format!("`{}`", String::from_utf8_lossy(key)) };
            Error::vocab(format!("GGUF metadata {name}: {}", e.message()))
        };
        key.clear();
        let key_len = r.count(1, "a key").map_err(|e| context(&key, e))?;
        if key_len <= 64 {
            r.string_body(&mut key, key_len).map_err(|e| context(&[], e))?;
        } else {
            // Not a key this reader wants.
            r.src.skip(key_len).map_err(|e| context(&[], e))?;
        }
        read_entry(&mut r, &key, &mut meta).map_err(|e| context(&key, e))?;
    }
    Ok(meta)
}

impl<S: Source> Reader<'_, S> {
    fn string_body(&mut self, out: &mut Vec<u8>, len: u64) -> Result<()> {
        out.resize(len as usize, 0);
        self.src.read(out)
    }
}

fn read_entry<S: Source>(r: &mut Reader<'_, S>, key: &[u8], meta: &mut Metadata) -> Result<()> {
    let ty = r.u32()?;
    let duplicate = || Error::vocab("the key appears twice");
    match key {
        b"tokenizer.ggml.model" | b"tokenizer.ggml.pre" => {
            if ty != T_STRING {
                return Err(Error::vocab(format!("must be a string, found value type {ty}")));
            }
            let mut value = Vec::new();
            r.string_into(&mut value, MAX_NAME, "the value")?;
            let value = String::from_utf8_lossy(&value).into_owned();
            let slot = if key == b"tokenizer.ggml.model" { &mut meta.model } else { &mut meta.pre };
            if slot.replace(value).is_some() {
                return Err(duplicate());
            }
        }
        b"tokenizer.ggml.tokens" => {
            if meta.tokens.is_some() {
                return Err(duplicate());
            }
            meta.tokens = Some(read_tokens(r, ty)?);
        }
        b"tokenizer.ggml.token_type" => {
            if meta.types.is_some() {
                return Err(duplicate());
            }
            meta.types = Some(read_types(r, ty)?);
        }
        _ => match ID_KEYS.iter().position(|(name, _)| name.as_bytes() == key) {
            Some(i) => {
                if meta.ids[i].is_some() {
                    return Err(duplicate());
                }
                meta.ids[i] = r.integer(ty)?;
            }
            None => r.skip_value(ty, 0)?,
        },
    }
    Ok(())
}

fn array_header<S: Source>(r: &mut Reader<'_, S>, ty: u32, want: u32, what: &str) -> Result<u64> {
    if ty != T_ARRAY {
        return Err(Error::vocab(format!("must be an array of {what}, found value type {ty}")));
    }
    let elem = r.u32()?;
    if elem != want {
        return Err(Error::vocab(format!("must be an array of {what}, found elements of type {elem}")));
    }
    let item = if want == T_STRING { 8 } else { scalar_size(want).unwrap_or(1) };
    let n = r.count(item, "the array")?;
    if n > MAX_TOKENS {
        return Err(Error::vocab(format!("has {n} entries, more than the {MAX_TOKENS} accepted")));
    }
    Ok(n)
}

fn read_tokens<S: Source>(r: &mut Reader<'_, S>, ty: u32) -> Result<(Vec<u8>, Vec<u32>)> {
    let n = array_header(r, ty, T_STRING, "strings")?;
    // Capacity from the count is bounded by the input (8 bytes per entry at least) and by
    // MAX_TOKENS; the texts grow as they are actually read.
    let mut offsets = Vec::with_capacity(n as usize + 1);
    offsets.push(0u32);
    let mut texts = Vec::with_capacity((n as usize * 8).min(1 << 24));
    r.src
        .strings(n, MAX_TOKEN_TEXT, &mut |id, text| {
            if text.is_empty() {
                texts.extend_from_slice(format!("[EMPTY_{id}]").as_bytes());
            } else {
                texts.extend_from_slice(text);
            }
            // Checked below: the texts are at most the input's size.
            offsets.push(texts.len() as u32);
        })
        .map_err(|e| match e.message().strip_prefix("entry ") {
            Some(rest) => Error::vocab(format!("token {rest}")),
            None => e,
        })?;
    if u32::try_from(texts.len()).is_err() {
        return Err(Error::vocab("the token texts add up to more than 4 GiB"));
    }
    Ok((texts, offsets))
}

fn read_types<S: Source>(r: &mut Reader<'_, S>, ty: u32) -> Result<Vec<TokenType>> {
    let n = array_header(r, ty, T_I32, "32-bit integers")?;
    let mut types = Vec::with_capacity(n as usize);
    let mut chunk = [0u8; 4096];
    let mut left = n as usize * 4;
    while left > 0 {
        let k = left.min(chunk.len());
        r.src.read(&mut chunk[..k])?;
        types.extend(
            chunk[..k].chunks_exact(4).map(|c| TokenType::from_gguf(i32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
        );
        left -= k;
    }
    Ok(types)
}

/// Reads a GGUF vocabulary: the metadata, then the pieces and the EOG set.
pub(super) fn read<S: Source>(src: &mut S) -> Result<Vocab> {
    let meta = read_metadata(src)?;
    let model = meta.model.ok_or_else(|| Error::vocab("GGUF: no tokenizer.ggml.model: the file has no vocabulary"))?;
    let pre = meta.pre.as_deref().unwrap_or("");
    // llama.cpp's vocabulary types; `gpt2` files whose pre-tokenizer escapes whitespace hold
    // SentencePiece-style pieces, as `gemma4` files do.
    let (kind, default_eos) = match model.as_str() {
        "gpt2" if matches!(pre, "gemma4" | "granite-embed-multi-311m" | "sarvam-moe") => {
            (VocabKind::SentencePieceBpe, Some(11))
        }
        "gpt2" => (VocabKind::ByteLevelBpe, Some(11)),
        "gemma4" => (VocabKind::SentencePieceBpe, None),
        "llama" => (VocabKind::SentencePiece, Some(2)),
        "t5" => (VocabKind::Unigram, Some(1)),
        "bert" => (VocabKind::WordPiece, None),
        "no_vocab" | "none" => {
            return Err(Error::vocab("GGUF: the file has no vocabulary (tokenizer.ggml.model = none)"))
        }
        other => return Err(Error::vocab(format!("GGUF: tokenizer.ggml.model `{other}` is not supported"))),
    };
    let (texts, offsets) = meta.tokens.ok_or_else(|| Error::vocab("GGUF: no tokenizer.ggml.tokens"))?;
    let n = offsets.len() - 1;
    if n == 0 {
        return Err(Error::vocab("GGUF: tokenizer.ggml.tokens is empty"));
    }
    let types = match meta.types {
        Some(types) if types.len() < n => {
            return Err(Error::vocab(format!(
                "GGUF: tokenizer.ggml.token_type has {} entries for {n} tokens",
                types.len()
            )));
        }
        Some(mut types) => {
            types.truncate(n);
            types
        }
        None => vec![TokenType::Normal; n],
    };

    // As llama.cpp: a named id outside the vocabulary keeps the role's default (itself
    // dropped when outside the vocabulary).
    let in_range = |id: Option<u64>| id.filter(|&id| id < n as u64).map(|id| id as u32);
    let mut ids = SpecialIds { eos: in_range(default_eos), ..SpecialIds::default() };
    for ((_, role), value) in ID_KEYS.iter().zip(meta.ids) {
        if let Some(id) = in_range(value) {
            match *role {
                IdRole::Eos => ids.eos = Some(id),
                IdRole::Eot => ids.eot = Some(id),
                IdRole::Eom => ids.eom = Some(id),
                IdRole::Fim(k) => ids.fim[k] = Some(id),
            }
        }
    }
    build(kind, RawTokens { texts, offsets, types }, ids).map_err(|e| Error::vocab(format!("GGUF: {}", e.message())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;
    use tokensieve_testkit::gguf::{to_bytes, Value};

    fn file(meta: &[(&str, Value)]) -> Vec<u8> {
        to_bytes(meta, &[])
    }

    fn strs(items: &[&str]) -> Value {
        Value::Strs(items.iter().map(|s| s.to_string()).collect())
    }

    fn small() -> Vec<u8> {
        file(&[
            ("general.architecture", Value::Str("llama".into())),
            ("tokenizer.ggml.model", Value::Str("gpt2".into())),
            ("tokenizer.ggml.tokens", strs(&["<|endoftext|>", "Ġhi", "Ċ", "", "<0x41>"])),
            ("tokenizer.ggml.token_type", Value::I32s(vec![3, 1, 1, 1, 6])),
            ("tokenizer.ggml.merges", strs(&["Ġ h", "h i"])),
            ("tokenizer.ggml.add_bos_token", Value::Bool(false)),
            ("general.some_float", Value::F32(1.5)),
            ("tokenizer.ggml.eos_token_id", Value::U32(0)),
        ])
    }

    fn vocab_err(bytes: &[u8]) -> String {
        let e = Vocab::from_gguf_bytes(bytes).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Vocab);
        e.message().to_string()
    }

    #[test]
    fn reads_a_small_file() {
        let v = Vocab::from_gguf_bytes(&small()).unwrap();
        assert_eq!(v.len(), 5);
        assert_eq!(v.kind(), VocabKind::ByteLevelBpe);
        let pieces: Vec<&[u8]> = v.iter().collect();
        let want: Vec<&[u8]> = vec![b"<|endoftext|>", b" hi", b"\n", b"[EMPTY_3]", b"A"];
        assert_eq!(pieces, want);
        assert_eq!(v.eog_tokens(), &[0]);
        assert_eq!(v.token_type(4), Some(TokenType::Byte));
    }

    #[test]
    fn every_truncation_is_an_error() {
        let bytes = small();
        // The metadata ends where the (empty) tensor section would start; cutting anywhere
        // inside it must fail cleanly.
        let meta_end = bytes.len() - bytes.iter().rev().take_while(|&&b| b == 0).count();
        for cut in 0..meta_end {
            assert!(Vocab::from_gguf_bytes(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn bad_magic_and_versions() {
        let mut bytes = small();
        bytes[0] = b'X';
        assert!(vocab_err(&bytes).contains("not a GGUF file"));
        let mut bytes = small();
        bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
        assert!(vocab_err(&bytes).contains("version 1"));
        bytes[4..8].copy_from_slice(&3u32.to_be_bytes());
        assert!(vocab_err(&bytes).contains("big-endian"));
        bytes[4..8].copy_from_slice(&7u32.to_le_bytes());
        assert!(vocab_err(&bytes).contains("version 7"));
        assert!(vocab_err(b"").contains("truncated"));
    }

    fn header(kv: u64) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&kv.to_le_bytes());
        b
    }

    fn key(b: &mut Vec<u8>, k: &str, ty: u32) {
        b.extend_from_slice(&(k.len() as u64).to_le_bytes());
        b.extend_from_slice(k.as_bytes());
        b.extend_from_slice(&ty.to_le_bytes());
    }

    #[test]
    fn absurd_counts_and_lengths_are_errors() {
        // Metadata count far beyond the file.
        assert!(vocab_err(&header(u64::MAX)).contains("metadata count"));
        // A token array claiming 2^60 strings.
        let mut b = header(1);
        key(&mut b, "tokenizer.ggml.tokens", T_ARRAY);
        b.extend_from_slice(&T_STRING.to_le_bytes());
        b.extend_from_slice(&(1u64 << 60).to_le_bytes());
        b.extend_from_slice(&[0; 64]);
        let msg = vocab_err(&b);
        assert!(msg.contains("tokenizer.ggml.tokens") && msg.contains("claims"), "{msg}");
        // An array of u64 to skip whose byte size overflows.
        let mut b = header(1);
        key(&mut b, "general.junk", T_ARRAY);
        b.extend_from_slice(&T_U64.to_le_bytes());
        b.extend_from_slice(&(u64::MAX / 2).to_le_bytes());
        assert!(vocab_err(&b).contains("general.junk"));
        // A key of absurd length.
        let mut b = header(1);
        b.extend_from_slice(&u64::MAX.to_le_bytes());
        b.extend_from_slice(&[0; 16]);
        assert!(vocab_err(&b).contains("entry 0"));
        // A string value of absurd length.
        let mut b = header(1);
        key(&mut b, "general.name", T_STRING);
        b.extend_from_slice(&(1u64 << 40).to_le_bytes());
        assert!(vocab_err(&b).contains("general.name"));
        // An unknown value type.
        let mut b = header(1);
        key(&mut b, "general.x", 99);
        b.extend_from_slice(&[0; 16]);
        assert!(vocab_err(&b).contains("unknown value type 99"));
        // Arrays of arrays nested without end.
        let mut b = header(1);
        key(&mut b, "general.x", T_ARRAY);
        for _ in 0..8 {
            b.extend_from_slice(&T_ARRAY.to_le_bytes());
            b.extend_from_slice(&1u64.to_le_bytes());
        }
        b.extend_from_slice(&[0; 64]);
        assert!(vocab_err(&b).contains("nested"));
    }

    #[test]
    fn nested_arrays_and_all_scalars_are_skipped() {
        let mut b = header(4);
        key(&mut b, "general.nested", T_ARRAY);
        b.extend_from_slice(&T_ARRAY.to_le_bytes());
        b.extend_from_slice(&2u64.to_le_bytes());
        for _ in 0..2 {
            b.extend_from_slice(&T_U16.to_le_bytes());
            b.extend_from_slice(&3u64.to_le_bytes());
            b.extend_from_slice(&[1, 0, 2, 0, 3, 0]);
        }
        key(&mut b, "general.f64", T_F64);
        b.extend_from_slice(&1.0f64.to_le_bytes());
        key(&mut b, "tokenizer.ggml.model", T_STRING);
        b.extend_from_slice(&5u64.to_le_bytes());
        b.extend_from_slice(b"llama");
        key(&mut b, "tokenizer.ggml.tokens", T_ARRAY);
        b.extend_from_slice(&T_STRING.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(&4u64.to_le_bytes());
        b.extend_from_slice("▁a".as_bytes());
        let v = Vocab::from_gguf_bytes(&b).unwrap();
        assert_eq!(v.get(0), Some(&b" a"[..]));
        assert_eq!(v.token_type(0), Some(TokenType::Normal));
        assert_eq!(v.kind(), VocabKind::SentencePiece);
        // Default EOS of `llama` is 2: outside this one-token vocabulary, so none.
        assert!(v.eog_tokens().is_empty());
    }

    #[test]
    fn wrong_types_and_missing_keys() {
        let msg = vocab_err(&file(&[("tokenizer.ggml.tokens", strs(&["a"]))]));
        assert!(msg.contains("tokenizer.ggml.model"), "{msg}");
        let msg = vocab_err(&file(&[("tokenizer.ggml.model", Value::Str("gpt2".into()))]));
        assert!(msg.contains("no tokenizer.ggml.tokens"), "{msg}");
        let msg = vocab_err(&file(&[
            ("tokenizer.ggml.model", Value::Str("rwkv".into())),
            ("tokenizer.ggml.tokens", strs(&["a"])),
        ]));
        assert!(msg.contains("`rwkv` is not supported"), "{msg}");
        let msg = vocab_err(&file(&[("tokenizer.ggml.model", Value::U32(3))]));
        assert!(msg.contains("must be a string"), "{msg}");
        let msg = vocab_err(&file(&[("tokenizer.ggml.tokens", Value::I32s(vec![1]))]));
        assert!(msg.contains("array of strings"), "{msg}");
        let msg = vocab_err(&file(&[("tokenizer.ggml.token_type", strs(&["a"]))]));
        assert!(msg.contains("array of 32-bit integers"), "{msg}");
        let msg = vocab_err(&file(&[("tokenizer.ggml.eos_token_id", Value::Str("2".into()))]));
        assert!(msg.contains("must be an integer"), "{msg}");
        let msg = vocab_err(&file(&[
            ("tokenizer.ggml.model", Value::Str("gpt2".into())),
            ("tokenizer.ggml.tokens", strs(&["a", "b"])),
            ("tokenizer.ggml.token_type", Value::I32s(vec![1])),
        ]));
        assert!(msg.contains("1 entries for 2 tokens"), "{msg}");
        let msg = vocab_err(&file(&[
            ("tokenizer.ggml.model", Value::Str("gpt2".into())),
            ("tokenizer.ggml.model", Value::Str("gpt2".into())),
        ]));
        assert!(msg.contains("twice"), "{msg}");
        let msg = vocab_err(&file(&[
            ("tokenizer.ggml.model", Value::Str("gpt2".into())),
            ("tokenizer.ggml.tokens", strs(&[])),
        ]));
        assert!(msg.contains("empty"), "{msg}");
    }

    #[test]
    fn default_and_out_of_range_special_ids() {
        let mut tokens: Vec<String> = (0..12).map(|i| format!("t{i}")).collect();
        tokens[5] = "<|im_end|>".into();
        let base = |extra: Vec<(&'static str, Value)>| {
            let mut meta = vec![
                ("tokenizer.ggml.model", Value::Str("gpt2".into())),
                ("tokenizer.ggml.tokens", Value::Strs(tokens.clone())),
            ];
            meta.extend(extra);
            Vocab::from_gguf_bytes(&file(&meta)).unwrap()
        };
        // No EOS key: llama.cpp's default for `gpt2` is 11.
        assert_eq!(base(vec![]).eog_tokens(), &[5, 11]);
        // An EOS outside the vocabulary keeps the default.
        assert_eq!(base(vec![("tokenizer.ggml.eos_token_id", Value::U32(500))]).eog_tokens(), &[5, 11]);
        assert_eq!(base(vec![("tokenizer.ggml.eos_token_id", Value::U32(3))]).eog_tokens(), &[3, 5]);
        // EOT, EOM, and FIM pad/rep/sep ids end generation; the deprecated prefix key is read.
        let v = base(vec![
            ("tokenizer.ggml.eos_token_id", Value::U32(1)),
            ("tokenizer.ggml.eot_token_id", Value::U32(2)),
            ("tokenizer.ggml.eom_token_id", Value::U32(3)),
            ("tokenizer.ggml.fim_sep_token_id", Value::U32(4)),
            ("tokenizer.ggml.prefix_token_id", Value::U32(6)),
        ]);
        assert_eq!(v.eog_tokens(), &[1, 2, 3, 4, 5]);
    }

    #[test]
    fn model_kinds() {
        let kind = |model: &str, pre: &str| {
            let v = Vocab::from_gguf_bytes(&file(&[
                ("tokenizer.ggml.model", Value::Str(model.into())),
                ("tokenizer.ggml.pre", Value::Str(pre.into())),
                ("tokenizer.ggml.tokens", strs(&["▁x"])),
            ]))
            .unwrap();
            (v.kind(), v.get(0).unwrap().to_vec())
        };
        assert_eq!(kind("gpt2", "qwen2"), (VocabKind::ByteLevelBpe, b"[UNK_BYTE_0xe29681\xe2\x96\x81x]x".to_vec()));
        assert_eq!(kind("gpt2", "gemma4"), (VocabKind::SentencePieceBpe, b" x".to_vec()));
        assert_eq!(kind("gemma4", ""), (VocabKind::SentencePieceBpe, b" x".to_vec()));
        assert_eq!(kind("t5", ""), (VocabKind::Unigram, b" x".to_vec()));
        assert_eq!(kind("bert", ""), (VocabKind::WordPiece, b" x".to_vec()));
        let msg = vocab_err(&file(&[("tokenizer.ggml.model", Value::Str("none".into()))]));
        assert!(msg.contains("no vocabulary"), "{msg}");
    }
}
