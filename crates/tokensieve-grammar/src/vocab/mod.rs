//! Token vocabularies as llama.cpp's grammar sampler sees them.
//!
//! A [`Vocab`] holds, for every token id, the bytes that llama.cpp's
//! `llama_token_to_piece(token, special = true)` writes for it (the piece its grammar sampler
//! matches against the grammar), and the set of end-of-generation (EOG) tokens, which the
//! sampler allows only where the grammar may end.
//!
//! # Sources
//!
//! * GGUF files ([`Vocab::from_gguf_file`], [`Vocab::from_gguf_bytes`]): only the metadata
//!   (`tokenizer.ggml.*`) is read, never the tensors, so a model file of many gigabytes loads
//!   as fast as a vocabulary-only file.
//! * Hugging Face `tokenizer.json` ([`Vocab::from_tokenizer_json_file`],
//!   [`Vocab::from_tokenizer_json_str`]): read as llama.cpp would see the same tokenizer after
//!   `convert_hf_to_gguf.py`.
//! * Any list of byte strings ([`Vocab::from_token_bytes`]).
//!
//! # How a token becomes bytes (llama.cpp `src/llama-vocab.cpp`, `token_to_piece`)
//!
//! | token type | bytes |
//! |---|---|
//! | control, user-defined, unknown | the token's text as stored, unchanged (`<|im_end|>`, `<s>`, `<unk>`) |
//! | normal, byte-level BPE (GGUF `gpt2`) | each character mapped back to one byte through GPT-2's `bytes_to_unicode` table; a character outside the table gives `[UNK_BYTE_0x<its UTF-8 in hex><the whole token text>]`, as llama.cpp does |
//! | normal, SentencePiece-style (GGUF `llama`, `gemma4`, `t5`, `bert`) | the text with every `▁` (U+2581) replaced by a space |
//! | byte (`<0xAB>`) | the single byte 0xAB |
//! | unused, undefined | nothing (an empty piece: the grammar sampler never allows such a token) |
//!
//! A GGUF token with empty text is named `[EMPTY_<id>]`, as llama.cpp renames it when loading.
//!
//! # End of generation (llama.cpp `llama_vocab::impl::load`)
//!
//! The EOG set is the union of
//! * the `eos`, `eot` and `eom` ids of the metadata (for a GGUF file without
//!   `tokenizer.ggml.eos_token_id`, llama.cpp's default for the tokenizer model: 2 for `llama`,
//!   11 for `gpt2`, 1 for `t5`; ids outside the vocabulary are ignored);
//! * the FIM pad, repository and file-separator tokens, from the metadata or, where absent,
//!   found by their text (`<|fim_pad|>`, `<|fim_repo|>`, `<|repo_name|>`, `<reponame>`,
//!   `<|file_sep|>`, …; where several tokens match one role, the lowest id is taken);
//! * every token, whatever its type, whose text is one of llama.cpp's end texts:
//!   [`END_OF_GENERATION_TEXTS`]. Such tokens are also treated as control tokens (their piece is
//!   their text), as llama.cpp overrides their type.
//!
//! Then, as llama.cpp does: `<|end|>` leaves the set when `<|call|>` or `<|calls|>` is in it
//! together with `<|return|>` (gpt-oss) or `<|flush|>` (Solar-Open), and `</s>` leaves it when
//! `<|tool_response>` is in it (Gemma-4). For example Llama-3 gives {128001 `<|end_of_text|>`,
//! 128009 `<|eot_id|>`}, Qwen2 {128247 `</s>`, 151643 `<|endoftext|>`, 151645 `<|im_end|>`}
//! and Gemma-4 {1 `<eos>`, 50 `<|tool_response>`, 106 `<turn|>`}.

mod gguf;
mod tokenizer_json;

use crate::{Error, Result};
use std::fmt;
use std::path::Path;
use std::sync::OnceLock;

/// Texts that make a token end generation, whatever its type (llama.cpp's list, in its order).
pub const END_OF_GENERATION_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Texts by which llama.cpp finds the fill-in-the-middle tokens a file does not name, by role:
/// prefix, suffix, middle, pad, repository, file separator. The last three end generation.
const FIM_TEXTS: [&[&str]; 6] = [
    &[
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<｜fim▁begin｜>",
        "<PRE>",
        "▁<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
    ],
    &[
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<｜fim▁hole｜>",
        "<SUF>",
        "▁<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ],
    &[
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<｜fim▁end｜>",
        "<MID>",
        "▁<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ],
    &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"],
    &["<|file_sep|>"],
];

/// gpt-oss tokens that llama.cpp always renders as text (it makes them user-defined).
const ALWAYS_RENDERED_TEXTS: &[&str] = &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

/// How a vocabulary spells its tokens, which decides how a normal token's text becomes bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum VocabKind {
    /// Byte-level BPE (GGUF `gpt2`: GPT-2, Llama-3, Qwen2, SmolLM; tokenizer.json with a
    /// `ByteLevel` decoder or pre-tokenizer): each character stands for one byte.
    ByteLevelBpe,
    /// SentencePiece (GGUF `llama`: Llama-1/2, Mistral; tokenizer.json with `▁` for spaces):
    /// `▁` is a space, `<0xAB>` byte tokens.
    SentencePiece,
    /// BPE over SentencePiece-style pieces (GGUF `gemma4`, and `gpt2` files whose pre-tokenizer
    /// llama.cpp marks as escaping whitespace): decoded as [`VocabKind::SentencePiece`].
    SentencePieceBpe,
    /// SentencePiece Unigram (GGUF `t5`, tokenizer.json `Unigram`): decoded as
    /// [`VocabKind::SentencePiece`].
    Unigram,
    /// WordPiece (GGUF `bert`, whose converted tokens carry `▁` at word starts; tokenizer.json
    /// `WordPiece`, converted as llama.cpp's converter does: `##x` is `x`, `x` is ` x`).
    WordPiece,
    /// Tokens are their own bytes ([`Vocab::from_token_bytes`], or a tokenizer.json with
    /// neither byte-level nor `▁` spelling).
    Raw,
}

/// A token's type, as GGUF's `tokenizer.ggml.token_type` numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TokenType {
    /// 0, or a number llama.cpp does not know: the piece is empty.
    Undefined,
    /// 1: text decoded by the vocabulary's spelling ([`VocabKind`]).
    Normal,
    /// 2: the unknown token; its piece is its text.
    Unknown,
    /// 3: a control token (`<s>`, `<|im_end|>`); its piece is its text.
    Control,
    /// 4: a user-defined (added, not special) token; its piece is its text.
    UserDefined,
    /// 5: an unused slot: the piece is empty.
    Unused,
    /// 6: a byte token `<0xAB>`: the piece is that byte.
    Byte,
}

impl TokenType {
    /// The type GGUF's number stands for (unknown numbers are [`TokenType::Undefined`]).
    pub fn from_gguf(value: i32) -> TokenType {
        match value {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }
}

/// Every token's bytes as llama.cpp's grammar sampler sees them, and the end-of-generation set.
///
/// All token bytes are stored in one buffer with an offset per token. Lookups never panic: ids
/// outside the vocabulary give `None` or `false`.
///
/// ```
/// use tokensieve_grammar::vocab::Vocab;
///
/// let vocab = Vocab::from_token_bytes(vec![b"a".to_vec(), b"bc".to_vec(), b"</s>".to_vec()], vec![2]);
/// assert_eq!(vocab.len(), 3);
/// assert_eq!(vocab.get(1), Some(&b"bc"[..]));
/// assert_eq!(vocab.get(3), None);
/// assert!(vocab.is_eog(2));
/// assert_eq!(vocab.token_id(b"bc"), Some(1));
/// ```
#[derive(Clone)]
pub struct Vocab {
    /// Every token's bytes, one after the other.
    bytes: Vec<u8>,
    /// Token `i` is `bytes[offsets[i]..offsets[i + 1]]`; `len() + 1` entries.
    offsets: Vec<u32>,
    types: Vec<TokenType>,
    /// Sorted, without duplicates.
    eog: Vec<u32>,
    kind: VocabKind,
    max_token_len: usize,
    /// Pieces to ids, built on the first [`Vocab::token_id`].
    by_bytes: OnceLock<ByteIndex>,
}

impl fmt::Debug for Vocab {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Vocab")
            .field("kind", &self.kind)
            .field("len", &self.len())
            .field("bytes", &self.bytes.len())
            .field("eog", &self.eog)
            .finish()
    }
}

impl Vocab {
    /// Reads the vocabulary of a GGUF file: only its metadata, never its tensors.
    ///
    /// Errors (never panics) on files that are not GGUF v2/v3, are truncated or corrupt, have
    /// no `tokenizer.ggml.tokens`, or use a tokenizer model other than `gpt2`, `llama`,
    /// `gemma4`, `t5` and `bert`.
    pub fn from_gguf_file(path: &Path) -> Result<Vocab> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        let mut source = gguf::FileSource::new(file, len, path);
        gguf::read(&mut source).map_err(|e| in_file(path, e))
    }

    /// Reads the vocabulary of a GGUF file held in memory (see [`Vocab::from_gguf_file`]).
    pub fn from_gguf_bytes(bytes: &[u8]) -> Result<Vocab> {
        gguf::read(&mut gguf::SliceSource::new(bytes))
    }

    /// Reads a Hugging Face `tokenizer.json`.
    ///
    /// Byte-level when its decoder or pre-tokenizer is `ByteLevel`; SentencePiece-style (`▁`
    /// for spaces, `<0xAB>` byte tokens where the model has `byte_fallback`) when it uses
    /// `Metaspace` or replaces `▁`, or is a `Unigram` model. Added tokens are control tokens when
    /// `special`, user-defined otherwise, and their piece is their `content`. The vocabulary
    /// size is the largest id plus one; ids that no token has are unused, with empty pieces.
    /// The EOG set comes from the token texts only (see the module docs): `tokenizer.json`
    /// does not name the EOS token.
    pub fn from_tokenizer_json_file(path: &Path) -> Result<Vocab> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_tokenizer_json_str(&text).map_err(|e| in_file(path, e))
    }

    /// Reads a Hugging Face `tokenizer.json` held in a string (see
    /// [`Vocab::from_tokenizer_json_file`]).
    pub fn from_tokenizer_json_str(json: &str) -> Result<Vocab> {
        tokenizer_json::read(json)
    }

    /// Reads a GGUF file (recognised by its magic `GGUF`) or else a `tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<Vocab> {
        use std::io::Read;
        let mut magic = Vec::with_capacity(4);
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        file.take(4).read_to_end(&mut magic).map_err(|e| Error::io(path, e))?;
        if magic == b"GGUF" {
            Self::from_gguf_file(path)
        } else {
            Self::from_tokenizer_json_file(path)
        }
    }

    /// A vocabulary whose token `i` is `tokens[i]`, all of type [`TokenType::Normal`], with
    /// end-of-generation tokens `eog` (ids outside the vocabulary are dropped).
    pub fn from_token_bytes(tokens: Vec<Vec<u8>>, eog: Vec<u32>) -> Vocab {
        let total: usize = tokens.iter().map(Vec::len).sum();
        let mut bytes = Vec::with_capacity(total.min(u32::MAX as usize));
        let mut offsets = Vec::with_capacity(tokens.len() + 1);
        offsets.push(0u32);
        let mut max_token_len = 0;
        for token in &tokens {
            // Offsets are 32-bit: past 4 GiB in all (no real vocabulary comes near), the
            // remaining tokens are left empty rather than panicking.
            if let Ok(end) = u32::try_from(bytes.len() + token.len()) {
                bytes.extend_from_slice(token);
                max_token_len = max_token_len.max(token.len());
                offsets.push(end);
            } else {
                offsets.push(bytes.len() as u32);
            }
        }
        let types = vec![TokenType::Normal; tokens.len()];
        let mut eog: Vec<u32> = eog.into_iter().filter(|&id| (id as usize) < tokens.len()).collect();
        eog.sort_unstable();
        eog.dedup();
        Vocab { bytes, offsets, types, eog, kind: VocabKind::Raw, max_token_len, by_bytes: OnceLock::new() }
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.types.len()
    }

    /// Whether the vocabulary has no token.
    pub fn is_empty(&self) -> bool {
        self.types.is_empty()
    }

    /// The bytes of token `id` (`None` outside the vocabulary; an empty slice for tokens that
    /// write nothing, which the grammar sampler never allows).
    pub fn get(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        let start = *self.offsets.get(i)? as usize;
        let end = *self.offsets.get(i + 1)? as usize;
        self.bytes.get(start..end)
    }

    /// Every token's bytes, in id order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        self.offsets.windows(2).map(move |w| &self.bytes[w[0] as usize..w[1] as usize])
    }

    /// The length in bytes of the longest token.
    pub fn max_token_len(&self) -> usize {
        self.max_token_len
    }

    /// Whether token `id` ends generation (`false` outside the vocabulary).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// The end-of-generation tokens, in increasing order.
    pub fn eog_tokens(&self) -> &[u32] {
        &self.eog
    }

    /// The lowest id whose bytes are exactly `bytes` (`None` for empty `bytes`). The first call
    /// builds a hash index (a few milliseconds for 256K tokens).
    pub fn token_id(&self, bytes: &[u8]) -> Option<u32> {
        if bytes.is_empty() {
            return None;
        }
        self.by_bytes.get_or_init(|| ByteIndex::new(self)).find(self, bytes)
    }

    /// How the vocabulary spells its tokens.
    pub fn kind(&self) -> VocabKind {
        self.kind
    }

    /// The type of token `id` as the source gives it (`None` outside the vocabulary). llama.cpp
    /// treats end-of-generation texts as control tokens whatever their type here.
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    fn piece(&self, id: u32) -> &[u8] {
        let i = id as usize;
        &self.bytes[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }
}

/// An open-addressing hash table from piece to the lowest id with that piece.
#[derive(Clone)]
struct ByteIndex {
    /// Token ids, [`ByteIndex::EMPTY`] for free slots; a power of two long.
    slots: Box<[u32]>,
}

impl ByteIndex {
    const EMPTY: u32 = u32::MAX;

    fn hash(bytes: &[u8]) -> usize {
        // FNV-1a: pieces are short and the table only needs a fair spread.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        (h ^ (h >> 32)) as usize
    }

    fn new(vocab: &Vocab) -> Self {
        let size = (vocab.len() * 2).next_power_of_two().max(2);
        let mask = size - 1;
        let mut slots = vec![Self::EMPTY; size].into_boxed_slice();
        for id in 0..vocab.len() as u32 {
            let piece = vocab.piece(id);
            if piece.is_empty() {
                continue;
            }
            let mut i = Self::hash(piece) & mask;
            loop {
                let slot = slots[i];
                if slot == Self::EMPTY {
                    slots[i] = id;
                    break;
                }
                if vocab.piece(slot) == piece {
                    // Ids are inserted in increasing order: the lower one stays.
                    break;
                }
                i = (i + 1) & mask;
            }
        }
        ByteIndex { slots }
    }

    fn find(&self, vocab: &Vocab, bytes: &[u8]) -> Option<u32> {
        let mask = self.slots.len() - 1;
        let mut i = Self::hash(bytes) & mask;
        loop {
            let slot = self.slots[i];
            if slot == Self::EMPTY {
                return None;
            }
            if vocab.piece(slot) == bytes {
                return Some(slot);
            }
            i = (i + 1) & mask;
        }
    }
}

/// Prefixes an error with the file it came from.
fn in_file(path: &Path, e: Error) -> Error {
    if e.kind() == crate::ErrorKind::Io {
        return e;
    }
    Error::new(e.kind(), format!("{}: {}", path.display(), e.message()))
}

/// Token texts as the source stores them (byte-level characters, `▁`, `<0xAB>`), one buffer
/// with offsets, and their types.
pub(crate) struct RawTokens {
    texts: Vec<u8>,
    offsets: Vec<u32>,
    types: Vec<TokenType>,
}

impl RawTokens {
    fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    fn text(&self, id: usize) -> &[u8] {
        &self.texts[self.offsets[id] as usize..self.offsets[id + 1] as usize]
    }
}

/// Special token ids that the source names (GGUF metadata), each inside the vocabulary.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SpecialIds {
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    /// Prefix, suffix, middle, pad, repository, file separator (the order of [`FIM_TEXTS`]).
    fim: [Option<u32>; 6],
}

/// How one token's piece is made (llama.cpp's token attributes after its load-time fixes).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Piece {
    /// The stored text, unchanged (control, user-defined, unknown).
    Text,
    /// The text decoded by the vocabulary's spelling.
    Normal,
    /// The byte a `<0xAB>` token names.
    Byte,
    /// Nothing (unused, undefined).
    Empty,
}

/// What role a token's text gives it in llama.cpp's load-time fixes.
enum Role {
    EndOfGeneration,
    Fim(usize),
    AlwaysRendered,
}

fn role(text: &[u8]) -> Option<Role> {
    // Every listed text starts with one of these bytes and is at most 28 bytes long: most
    // tokens are rejected without comparing strings.
    if text.len() > 28 || !matches!(text.first(), Some(b'<' | b'[' | b'_' | 0xE2)) {
        return None;
    }
    if END_OF_GENERATION_TEXTS.iter().any(|t| t.as_bytes() == text) {
        return Some(Role::EndOfGeneration);
    }
    if let Some(k) = FIM_TEXTS.iter().position(|texts| texts.iter().any(|t| t.as_bytes() == text)) {
        return Some(Role::Fim(k));
    }
    if ALWAYS_RENDERED_TEXTS.iter().any(|t| t.as_bytes() == text) {
        return Some(Role::AlwaysRendered);
    }
    None
}

/// Builds the vocabulary: the end-of-generation set and every token's piece, as llama.cpp's
/// `llama_vocab::impl::load` and `token_to_piece` do.
fn build(kind: VocabKind, raw: RawTokens, mut ids: SpecialIds) -> Result<Vocab> {
    let n = raw.len();
    let mut pieces: Vec<Piece> = raw
        .types
        .iter()
        .map(|t| match t {
            TokenType::Control | TokenType::UserDefined | TokenType::Unknown => Piece::Text,
            TokenType::Normal => Piece::Normal,
            TokenType::Byte => Piece::Byte,
            TokenType::Unused | TokenType::Undefined => Piece::Empty,
        })
        .collect();

    let mut end_texts = Vec::new();
    let mut rendered = Vec::new();
    let mut fim_found: [Option<u32>; 6] = [None; 6];
    for id in 0..n {
        match role(raw.text(id)) {
            Some(Role::EndOfGeneration) => end_texts.push(id as u32),
            Some(Role::Fim(k)) => {
                fim_found[k].get_or_insert(id as u32);
            }
            Some(Role::AlwaysRendered) => rendered.push(id as u32),
            None => {}
        }
    }
    for (named, found) in ids.fim.iter_mut().zip(fim_found) {
        if named.is_none() {
            if let Some(id) = found {
                // llama.cpp makes a FIM token found by its text a control token.
                *named = Some(id);
                pieces[id as usize] = Piece::Text;
            }
        }
    }

    let mut eog: Vec<u32> = ids.fim[3..].iter().flatten().copied().collect();
    for &id in &end_texts {
        eog.push(id);
        pieces[id as usize] = Piece::Text;
    }
    for &id in &rendered {
        pieces[id as usize] = Piece::Text;
    }
    eog.extend([ids.eos, ids.eot, ids.eom].into_iter().flatten());
    eog.sort_unstable();
    eog.dedup();

    let find = |eog: &[u32], text: &str| eog.iter().copied().find(|&id| raw.text(id as usize) == text.as_bytes());
    // gpt-oss (o200k_harmony) and Solar-Open: `<|end|>` ends a message, not the generation.
    let has_return = find(&eog, "<|return|>").is_some();
    let has_call = find(&eog, "<|call|>").or_else(|| find(&eog, "<|calls|>")).is_some();
    let has_flush = find(&eog, "<|flush|>").is_some();
    if let Some(end) = find(&eog, "<|end|>") {
        if has_call && (has_return || has_flush) {
            eog.retain(|&id| id != end);
            pieces[end as usize] = Piece::Text;
        }
    }
    // Gemma-4 (and PaddleOCR): `</s>` is an ordinary token there.
    if find(&eog, "<|tool_response>").is_some() {
        if let Some(s) = find(&eog, "</s>") {
            eog.retain(|&id| id != s);
            pieces[s as usize] = Piece::Normal;
        }
    }

    // The pieces overwrite the texts they come from: a piece is almost never longer than its
    // text, so no second buffer is needed (fewer fresh pages to fault in, a large part of the
    // load time of a big vocabulary). Once earlier pieces have shrunk by at least a token's
    // length, the token decodes straight into the freed room; otherwise it goes through
    // `scratch`. A piece longer than its text (an `[UNK_BYTE_…]` marker) spills the rest into a
    // new buffer.
    let RawTokens { mut texts, mut offsets, types } = raw;
    let mut scratch = Vec::new();
    let mut spill: Option<Vec<u8>> = None;
    let (mut start, mut written, mut max_token_len) = (0usize, 0usize, 0usize);
    for (id, &piece) in pieces.iter().enumerate() {
        let end = offsets[id + 1] as usize;
        let byte_error = |text: &[u8]| {
            Error::vocab(format!("token {id} is a byte token but its text {:?} is not <0xAB>", lossy(text)))
        };
        let direct = if spill.is_none() && start - written >= end - start {
            let (head, tail) = texts.split_at_mut(start);
            let text = &tail[..end - start];
            write_piece(kind, piece, text, &mut head[written..]).ok_or_else(|| byte_error(text))?
        } else {
            None
        };
        let len = match direct {
            Some(len) => len,
            None => {
                let text = &texts[start..end];
                scratch.clear();
                scratch.resize(text.len(), 0);
                match write_piece(kind, piece, text, &mut scratch).ok_or_else(|| byte_error(text))? {
                    Some(len) => scratch.truncate(len),
                    None => {
                        scratch.clear();
                        decode_byte_level_slow(text, &mut scratch);
                    }
                }
                match &mut spill {
                    // The next token's text starts at `end`: writing up to there loses nothing
                    // unread.
                    None if written + scratch.len() <= end => {
                        texts[written..written + scratch.len()].copy_from_slice(&scratch)
                    }
                    None => {
                        let mut out = Vec::with_capacity(written + scratch.len() + 2 * (texts.len() - end));
                        out.extend_from_slice(&texts[..written]);
                        out.extend_from_slice(&scratch);
                        spill = Some(out);
                    }
                    Some(out) => out.extend_from_slice(&scratch),
                }
                scratch.len()
            }
        };
        written += len;
        max_token_len = max_token_len.max(len);
        offsets[id + 1] =
            u32::try_from(written).map_err(|_| Error::vocab("the token pieces add up to more than 4 GiB"))?;
        start = end;
    }
    let bytes = match spill {
        Some(out) => out,
        None => {
            texts.truncate(written);
            texts
        }
    };
    Ok(Vocab { bytes, offsets, types, eog, kind, max_token_len, by_bytes: OnceLock::new() })
}

/// Writes a token's piece into `out`, which has room for at least `text.len()` bytes; returns
/// its length, or `Some(None)` when the piece is longer than the text (a byte-level character
/// outside the table: see [`decode_byte_level_slow`]), or `None` for a bad byte token.
fn write_piece(kind: VocabKind, piece: Piece, text: &[u8], out: &mut [u8]) -> Option<Option<usize>> {
    Some(match piece {
        Piece::Text => {
            out[..text.len()].copy_from_slice(text);
            Some(text.len())
        }
        Piece::Empty => Some(0),
        Piece::Byte => {
            // A byte token's text has at least 3 bytes, so `out` has room.
            out[0] = parse_byte_token(text)?;
            Some(1)
        }
        Piece::Normal => match kind {
            VocabKind::ByteLevelBpe => decode_byte_level_fast(text, out),
            VocabKind::SentencePiece | VocabKind::SentencePieceBpe | VocabKind::Unigram | VocabKind::WordPiece => {
                Some(unescape_whitespace(text, out))
            }
            VocabKind::Raw => {
                out[..text.len()].copy_from_slice(text);
                Some(text.len())
            }
        },
    })
}

fn lossy(text: &[u8]) -> String {
    String::from_utf8_lossy(text).into_owned()
}

/// The byte a byte token names: llama.cpp reads the two characters after `<0x` with `strtol`
/// in base 16 (`None` when the text is shorter than 3 bytes, where llama.cpp throws).
fn parse_byte_token(text: &[u8]) -> Option<u8> {
    if text.len() < 3 {
        return None;
    }
    let mut value = 0u8;
    for &c in text[3..].iter().take(2) {
        match (c as char).to_digit(16) {
            Some(d) => value = value.wrapping_mul(16).wrapping_add(d as u8),
            None => break,
        }
    }
    Some(value)
}

/// llama.cpp's `llama_unescape_whitespace`: every `▁` (U+2581) becomes a space. Writes to
/// `out` (at least `text.len()` long) and returns the length.
fn unescape_whitespace(text: &[u8], out: &mut [u8]) -> usize {
    let (mut i, mut w) = (0, 0);
    while i < text.len() {
        if text[i] == 0xE2 && text.get(i + 1) == Some(&0x96) && text.get(i + 2) == Some(&0x81) {
            out[w] = b' ';
            i += 3;
        } else {
            out[w] = text[i];
            i += 1;
        }
        w += 1;
    }
    w
}

/// Characters printed as themselves in GPT-2's `bytes_to_unicode`: `!`..`~`, `¡`..`¬`, `®`..`ÿ`.
const fn is_printable_byte(b: u32) -> bool {
    (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
}

/// GPT-2's `bytes_to_unicode` inverted: the byte that each code point below 324 stands for,
/// or -1. Printable bytes stand for themselves; the 68 others are numbered from U+0100 up in
/// byte order.
const BYTE_OF_CHAR: [i16; 324] = {
    let mut table = [-1i16; 324];
    let mut next = 256;
    let mut b = 0;
    while b < 256 {
        if is_printable_byte(b) {
            table[b as usize] = b as i16;
        } else {
            table[next] = b as i16;
            next += 1;
        }
        b += 1;
    }
    table
};

/// llama.cpp's `unicode_cpt_from_utf8`: a lenient decoder (no overlong or surrogate checks);
/// an invalid lead or continuation byte gives U+FFFD and advances one byte.
fn next_code_point(text: &[u8], i: usize) -> (u32, usize) {
    let b0 = u32::from(text[i]);
    let cont = |k: usize| text.get(i + k).map(|&b| u32::from(b)).filter(|b| b & 0xC0 == 0x80);
    let (len, init) = match b0 {
        _ if b0 & 0x80 == 0 => return (b0, 1),
        _ if b0 & 0x40 == 0 => return (0xFFFD, 1),
        _ if b0 & 0x20 == 0 => (2, b0 & 0x1F),
        _ if b0 & 0x10 == 0 => (3, b0 & 0x0F),
        _ if b0 & 0x08 == 0 => (4, b0 & 0x07),
        _ => return (0xFFFD, 1),
    };
    let mut cp = init;
    for k in 1..len {
        match cont(k) {
            Some(c) => cp = (cp << 6) | (c & 0x3F),
            None => return (0xFFFD, 1),
        }
    }
    (cp, len)
}

/// llama.cpp's `unicode_cpt_to_utf8`, extended to the 21-bit values the lenient decoder makes.
fn push_utf8(cp: u32, out: &mut Vec<u8>) {
    match cp {
        0..=0x7F => out.push(cp as u8),
        0x80..=0x7FF => out.extend_from_slice(&[0xC0 | (cp >> 6) as u8, 0x80 | (cp & 0x3F) as u8]),
        0x800..=0xFFFF => {
            out.extend_from_slice(&[0xE0 | (cp >> 12) as u8, 0x80 | ((cp >> 6) & 0x3F) as u8, 0x80 | (cp & 0x3F) as u8])
        }
        _ => out.extend_from_slice(&[
            0xF0 | ((cp >> 18) & 0x07) as u8,
            0x80 | ((cp >> 12) & 0x3F) as u8,
            0x80 | ((cp >> 6) & 0x3F) as u8,
            0x80 | (cp & 0x3F) as u8,
        ]),
    }
}

/// llama.cpp's `llama_decode_text` for tokens whose characters are all in the byte table
/// (printable ASCII standing for itself, or a two-byte sequence below U+0144): each gives one
/// byte, written to `out` (at least `text.len()` long). `None` for any other character.
fn decode_byte_level_fast(text: &[u8], out: &mut [u8]) -> Option<usize> {
    let (mut i, mut w) = (0, 0);
    while i < text.len() {
        let b = text[i];
        out[w] = if (0x21..=0x7E).contains(&b) {
            i += 1;
            b
        } else {
            let c = *text.get(i + 1)?;
            if b & 0xE0 != 0xC0 || c & 0xC0 != 0x80 {
                return None;
            }
            let byte = *BYTE_OF_CHAR.get((usize::from(b & 0x1F) << 6) | usize::from(c & 0x3F))?;
            if byte < 0 {
                return None;
            }
            i += 2;
            byte as u8
        };
        w += 1;
    }
    Some(w)
}

/// llama.cpp's `llama_decode_text`: each character of a byte-level token back to its byte; a
/// character outside the table gives llama.cpp's `[UNK_BYTE_…]` marker.
fn decode_byte_level_slow(text: &[u8], out: &mut Vec<u8>) {
    let mut i = 0;
    while i < text.len() {
        let (cp, len) = next_code_point(text, i);
        i += len;
        match BYTE_OF_CHAR.get(cp as usize) {
            Some(&b) if b >= 0 => out.push(b as u8),
            _ => {
                // Not a byte-level character: llama.cpp writes a marker holding the character's
                // UTF-8 in hex followed by the whole token text.
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut utf8 = Vec::with_capacity(4);
                push_utf8(cp, &mut utf8);
                for b in utf8 {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text);
                out.push(b']');
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(texts: &[&str], types: &[TokenType]) -> RawTokens {
        let mut r = RawTokens { texts: Vec::new(), offsets: vec![0], types: types.to_vec() };
        for t in texts {
            r.texts.extend_from_slice(t.as_bytes());
            r.offsets.push(r.texts.len() as u32);
        }
        r
    }

    fn pieces(v: &Vocab) -> Vec<Vec<u8>> {
        v.iter().map(<[u8]>::to_vec).collect()
    }

    /// The character GPT-2's byte-level vocabularies use for byte `b`.
    fn char_of_byte(b: u8) -> char {
        let mut i = 0;
        while i < BYTE_OF_CHAR.len() {
            if BYTE_OF_CHAR[i] == i16::from(b) {
                return char::from_u32(i as u32).unwrap_or(char::REPLACEMENT_CHARACTER);
            }
            i += 1;
        }
        char::REPLACEMENT_CHARACTER
    }

    #[test]
    fn byte_table_is_gpt2s() {
        assert_eq!(char_of_byte(b' '), 'Ġ');
        assert_eq!(char_of_byte(b'\n'), 'Ċ');
        assert_eq!(char_of_byte(b'a'), 'a');
        assert_eq!(char_of_byte(0), '\u{100}');
        assert_eq!(char_of_byte(0xAD), '\u{143}');
        for b in 0..=255u8 {
            assert_eq!(BYTE_OF_CHAR[char_of_byte(b) as usize], i16::from(b));
        }
        assert_eq!(BYTE_OF_CHAR.iter().filter(|&&b| b >= 0).count(), 256);
    }

    #[test]
    fn listed_texts_pass_the_prefilter() {
        let all =
            END_OF_GENERATION_TEXTS.iter().chain(FIM_TEXTS.iter().flat_map(|t| t.iter())).chain(ALWAYS_RENDERED_TEXTS);
        for text in all {
            assert!(role(text.as_bytes()).is_some(), "{text}");
        }
        assert!(role(b"<|im_start|>").is_none());
        assert!(role("Ġ<|im_end|>".as_bytes()).is_none());
    }

    /// Byte-level decoding as `build` does it: the fast path, else the general one.
    fn decode_byte_level(text: &[u8], out: &mut Vec<u8>) {
        let mut buf = vec![0; text.len()];
        match decode_byte_level_fast(text, &mut buf) {
            Some(n) => out.extend_from_slice(&buf[..n]),
            None => decode_byte_level_slow(text, out),
        }
    }

    #[test]
    fn byte_level_tokens_decode_to_bytes() {
        let mut out = Vec::new();
        decode_byte_level("ĠhelloĊ".as_bytes(), &mut out);
        assert_eq!(out, b" hello\n");
        out.clear();
        // Two characters standing for the bytes of "é" (0xC3 0xA9).
        decode_byte_level("Ã©".as_bytes(), &mut out);
        assert_eq!(out, "é".as_bytes());
    }

    #[test]
    fn characters_outside_the_byte_table_give_llama_cpps_marker() {
        let mut out = Vec::new();
        decode_byte_level("a▁b".as_bytes(), &mut out);
        assert_eq!(out, "a[UNK_BYTE_0xe29681a▁b]b".as_bytes());
        out.clear();
        // Invalid UTF-8: U+FFFD per bad byte, as llama.cpp's decoder gives.
        decode_byte_level(&[b'x', 0xFF], &mut out);
        assert_eq!(out, b"x[UNK_BYTE_0xefbfbdx\xff]");
    }

    #[test]
    fn a_piece_longer_than_its_text_spills_to_a_new_buffer() {
        use TokenType::*;
        let r = raw(&["ab", "▁", "Ġc", "<|x|>", "<0x0A>"], &[Normal, Normal, Normal, Control, Byte]);
        let v = build(VocabKind::ByteLevelBpe, r, SpecialIds::default()).unwrap();
        let want: Vec<&[u8]> = vec![b"ab", "[UNK_BYTE_0xe29681▁]".as_bytes(), b" c", b"<|x|>", b"\n"];
        assert_eq!(pieces(&v), want);
        assert_eq!(v.max_token_len(), want[1].len());
        assert_eq!(v.token_id(b" c"), Some(2));
    }

    /// The pieces of one token, decoded on their own (no in-place writing, no fast paths).
    fn naive_piece(kind: VocabKind, ty: TokenType, text: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        match ty {
            TokenType::Control | TokenType::UserDefined | TokenType::Unknown => out.extend_from_slice(text),
            TokenType::Unused | TokenType::Undefined => {}
            TokenType::Byte => out.push(parse_byte_token(text).unwrap()),
            TokenType::Normal if kind == VocabKind::ByteLevelBpe => decode_byte_level_slow(text, &mut out),
            TokenType::Normal => {
                let mut rest = text;
                while let Some(at) = rest.windows(3).position(|w| w == "▁".as_bytes()) {
                    out.extend_from_slice(&rest[..at]);
                    out.push(b' ');
                    rest = &rest[at + 3..];
                }
                out.extend_from_slice(rest);
            }
        }
        out
    }

    proptest::proptest! {
        #[test]
        fn in_place_decoding_matches_token_by_token_decoding(
            tokens in proptest::collection::vec(
                (proptest::collection::vec(proptest::sample::select(vec![
                    "a", "Ġ", "Ċ", "▁", "é", "Ã", "©", "\u{100}", "\u{143}", "\u{144}", "🦙", "\u{ff}", "<", ">",
                ]), 0..6), 0..7usize, proptest::bool::ANY),
                0..24,
            ),
            byte_level in proptest::bool::ANY,
        ) {
            let kind = if byte_level { VocabKind::ByteLevelBpe } else { VocabKind::SentencePiece };
            let all = [TokenType::Normal, TokenType::Control, TokenType::UserDefined, TokenType::Unknown,
                       TokenType::Unused, TokenType::Undefined, TokenType::Byte];
            let mut texts: Vec<Vec<u8>> = Vec::new();
            let mut types = Vec::new();
            for (parts, ty, invalid) in &tokens {
                let ty = all[*ty];
                let mut text: Vec<u8> = if ty == TokenType::Byte { b"<0x7F>".to_vec() } else { parts.concat().into_bytes() };
                if *invalid && ty != TokenType::Byte {
                    text.push(0xC3);
                }
                texts.push(text);
                types.push(ty);
            }
            let mut r = RawTokens { texts: Vec::new(), offsets: vec![0], types: types.clone() };
            for t in &texts {
                r.texts.extend_from_slice(t);
                r.offsets.push(r.texts.len() as u32);
            }
            let v = build(kind, r, SpecialIds::default()).unwrap();
            let want: Vec<Vec<u8>> = texts.iter().zip(&types).map(|(t, &ty)| naive_piece(kind, ty, t)).collect();
            proptest::prop_assert_eq!(pieces(&v), want);
        }
    }

    #[test]
    fn lenient_utf8_matches_llama_cpp() {
        assert_eq!(next_code_point("é".as_bytes(), 0), (0xE9, 2));
        assert_eq!(next_code_point("▁".as_bytes(), 0), (0x2581, 3));
        assert_eq!(next_code_point("🦙".as_bytes(), 0), (0x1F999, 4));
        assert_eq!(next_code_point(&[0x80], 0), (0xFFFD, 1));
        assert_eq!(next_code_point(&[0xC3], 0), (0xFFFD, 1));
        assert_eq!(next_code_point(&[0xE2, 0x96, b'a'], 0), (0xFFFD, 1));
        // Overlong: accepted, as llama.cpp does.
        assert_eq!(next_code_point(&[0xC0, 0x80], 0), (0, 2));
    }

    #[test]
    fn sentencepiece_spaces_and_byte_tokens() {
        let mut out = [0u8; 16];
        let n = unescape_whitespace("▁the▁▁end▁".as_bytes(), &mut out);
        assert_eq!(&out[..n], b" the  end ");
        assert_eq!(parse_byte_token(b"<0x0A>"), Some(b'\n'));
        assert_eq!(parse_byte_token(b"<0xff>"), Some(0xFF));
        assert_eq!(parse_byte_token(b"<0xF>"), Some(0x0F));
        assert_eq!(parse_byte_token(b"<0x"), Some(0));
        assert_eq!(parse_byte_token(b"<0"), None);
    }

    #[test]
    fn pieces_follow_the_token_type() {
        use TokenType::*;
        let r = raw(
            &["<unk>", "<s>", "<0x41>", "▁hi", "<mask>", "▁▁", "<user>", "<weird>"],
            &[Unknown, Control, Byte, Normal, Unused, Normal, UserDefined, Undefined],
        );
        let v = build(VocabKind::SentencePiece, r, SpecialIds::default()).unwrap();
        let want: Vec<&[u8]> = vec![b"<unk>", b"<s>", b"A", b" hi", b"", b"  ", b"<user>", b""];
        assert_eq!(pieces(&v), want);
        assert_eq!(v.max_token_len(), 6);
        assert_eq!(v.token_type(2), Some(Byte));
        assert_eq!(v.token_type(8), None);

        let r = raw(&["<|im_start|>", "Ġworld", "Ċ", "<tag>"], &[Control, Normal, Normal, UserDefined]);
        let v = build(VocabKind::ByteLevelBpe, r, SpecialIds::default()).unwrap();
        let want: Vec<&[u8]> = vec![b"<|im_start|>", b" world", b"\n", b"<tag>"];
        assert_eq!(pieces(&v), want);
    }

    #[test]
    fn a_bad_byte_token_is_an_error() {
        let r = raw(&["<0"], &[TokenType::Byte]);
        let e = build(VocabKind::SentencePiece, r, SpecialIds::default()).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Vocab);
        assert!(e.message().contains("token 0"), "{e}");
    }

    #[test]
    fn end_texts_become_control_and_end_generation() {
        use TokenType::*;
        // A *normal* SentencePiece token `▁<PRE>` found as the FIM prefix is made control, so its
        // piece keeps the `▁`; `<|im_end|>` of type unused still ends generation, with its text.
        let r = raw(
            &["a", "<|im_end|>", "▁<PRE>", "<|fim_pad|>", "<|file_sep|>"],
            &[Normal, Unused, Normal, Normal, Normal],
        );
        let v = build(VocabKind::SentencePiece, r, SpecialIds::default()).unwrap();
        assert_eq!(v.eog_tokens(), &[1, 3, 4]);
        assert_eq!(v.get(1), Some(&b"<|im_end|>"[..]));
        assert_eq!(v.get(2), Some("▁<PRE>".as_bytes()));
        assert!(!v.is_eog(0) && !v.is_eog(99));
    }

    #[test]
    fn named_fim_ids_win_over_texts() {
        use TokenType::*;
        let r = raw(&["<|fim_pad|>", "x"], &[Normal, Normal]);
        let mut ids = SpecialIds::default();
        ids.fim[3] = Some(1);
        let v = build(VocabKind::Raw, r, ids).unwrap();
        assert_eq!(v.eog_tokens(), &[1]);
    }

    #[test]
    fn the_lowest_id_wins_among_fim_candidates() {
        use TokenType::*;
        let r = raw(&["<reponame>", "<|repo_name|>"], &[Control, Control]);
        let v = build(VocabKind::Raw, r, SpecialIds::default()).unwrap();
        assert_eq!(v.eog_tokens(), &[0]);
    }

    #[test]
    fn gpt_oss_end_leaves_the_eog_set() {
        use TokenType::*;
        let texts = ["<|return|>", "<|call|>", "<|end|>", "<|channel|>"];
        let v =
            build(VocabKind::ByteLevelBpe, raw(&texts, &[Control, Control, Control, Normal]), SpecialIds::default())
                .unwrap();
        assert_eq!(v.eog_tokens(), &[0, 1]);
        assert_eq!(v.get(3), Some(&b"<|channel|>"[..]));
        // Without `<|return|>`, `<|end|>` stays.
        let v = build(VocabKind::ByteLevelBpe, raw(&texts[1..], &[Control, Control, Control]), SpecialIds::default())
            .unwrap();
        assert_eq!(v.eog_tokens(), &[0, 1]);
        // Solar-Open's pair.
        let texts = ["<|calls|>", "<|flush|>", "<|end|>"];
        let v =
            build(VocabKind::ByteLevelBpe, raw(&texts, &[Control, Control, Control]), SpecialIds::default()).unwrap();
        assert_eq!(v.eog_tokens(), &[0, 1]);
    }

    #[test]
    fn gemma4_drops_end_of_sentence() {
        use TokenType::*;
        let r = raw(&["<eos>", "</s>", "<|tool_response>"], &[Control, Normal, UserDefined]);
        let v = build(VocabKind::SentencePieceBpe, r, SpecialIds::default()).unwrap();
        assert_eq!(v.eog_tokens(), &[0, 2]);
        let r = raw(&["<eos>", "</s>"], &[Control, Normal]);
        let v = build(VocabKind::SentencePieceBpe, r, SpecialIds::default()).unwrap();
        assert_eq!(v.eog_tokens(), &[0, 1]);
    }

    #[test]
    fn metadata_ids_end_generation() {
        let r = raw(&["a", "b", "c", "d"], &[TokenType::Normal; 4]);
        let ids = SpecialIds { eos: Some(3), eot: Some(1), eom: None, fim: [None; 6] };
        let v = build(VocabKind::Raw, r, ids).unwrap();
        assert_eq!(v.eog_tokens(), &[1, 3]);
    }

    #[test]
    fn token_id_finds_the_lowest_id() {
        let v = Vocab::from_token_bytes(
            vec![b"b".to_vec(), b"a".to_vec(), b"b".to_vec(), vec![], b"ab".to_vec()],
            vec![9, 4, 4],
        );
        assert_eq!(v.token_id(b"b"), Some(0));
        assert_eq!(v.token_id(b"a"), Some(1));
        assert_eq!(v.token_id(b"ab"), Some(4));
        assert_eq!(v.token_id(b"abc"), None);
        assert_eq!(v.token_id(b""), None);
        assert_eq!(v.eog_tokens(), &[4]);
        assert_eq!(v.kind(), VocabKind::Raw);
        assert_eq!(v.iter().len(), 5);
        let clone = v.clone();
        assert_eq!(clone.token_id(b"ab"), Some(4));
        assert!(format!("{v:?}").contains("len: 5"));
    }

    #[test]
    fn empty_vocabulary() {
        let v = Vocab::from_token_bytes(Vec::new(), vec![0]);
        assert!(v.is_empty());
        assert_eq!(v.get(0), None);
        assert_eq!(v.token_id(b"a"), None);
        assert!(v.eog_tokens().is_empty());
    }
}
