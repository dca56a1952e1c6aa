//! [`TokenIndex`]: a vocabulary prepared for mask computation: each token's bytes as the
//! grammar sees them, the end-of-generation set, and a byte trie of all tokens flattened in
//! depth-first order (built once per vocabulary and shared by every grammar and sequence).

use std::sync::{Arc, Mutex};

use rustc_hash::FxHashMap;

use crate::engine::Utf8;

/// A vocabulary indexed for grammar masks.
///
/// Token text follows llama.cpp's grammar sampler: the bytes `token_to_piece(special = true)`
/// gives, cut at the first NUL byte (llama.cpp reads them as C strings). Tokens whose text is
/// then empty are never allowed; end-of-generation tokens are allowed exactly when the parse
/// is complete and are never matched as text.
///
/// ```
/// use tokensieve_grammar::TokenIndex;
/// let index = TokenIndex::new([b"a".as_slice(), b"ab", b"", b"</s>"], &[3]);
/// assert_eq!(index.len(), 4);
/// assert_eq!(index.words(), 1);
/// assert!(index.is_eog(3));
/// ```
#[derive(Debug)]
pub struct TokenIndex {
    n_vocab: usize,
    /// Token bytes, back to back (NUL-truncated), and offsets (`n_vocab + 1`).
    bytes: Vec<u8>,
    offsets: Vec<u32>,
    eog: Vec<u32>,
    is_eog: Vec<bool>,
    pub(crate) trie: Trie,
    /// Per ASCII alphabet: which trie nodes have a subtree made only of its characters.
    slices: Mutex<FxHashMap<u128, Arc<Slice>>>,
}

/// The byte trie in depth-first order: node `i`'s subtree is `i..end[i]`; its children start
/// at `i + 1`. The root is implicit (depth 0).
#[derive(Debug, Default)]
pub(crate) struct Trie {
    pub byte: Vec<u8>,
    pub depth: Vec<u32>,
    pub end: Vec<u32>,
    /// Tokens ending at node `i`: `tokens[tok_off[i]..tok_off[i + 1]]`.
    pub tok_off: Vec<u32>,
    pub tokens: Vec<u32>,
    pub max_depth: usize,
}

impl TokenIndex {
    /// Indexes `tokens` (the byte string of token id `i` at position `i`) with the given
    /// end-of-generation ids (ids outside the vocabulary are ignored).
    pub fn new<'a>(tokens: impl IntoIterator<Item = &'a [u8]>, eog: &[u32]) -> Self {
        let mut bytes = Vec::new();
        let mut offsets = vec![0u32];
        for t in tokens {
            let t = t.iter().position(|&b| b == 0).map_or(t, |nul| &t[..nul]);
            bytes.extend_from_slice(t);
            offsets.push(bytes.len() as u32);
        }
        let n_vocab = offsets.len() - 1;
        let mut is_eog = vec![false; n_vocab];
        let mut eog_list = Vec::new();
        for &e in eog {
            if let Some(flag) = is_eog.get_mut(e as usize) {
                if !*flag {
                    *flag = true;
                    eog_list.push(e);
                }
            }
        }
        eog_list.sort_unstable();
        let mut index = TokenIndex {
            n_vocab,
            bytes,
            offsets,
            eog: eog_list,
            is_eog,
            trie: Trie::default(),
            slices: Mutex::new(FxHashMap::default()),
        };
        index.trie = index.build_trie();
        index
    }

    /// Indexes a loaded vocabulary (its token bytes and end-of-generation set).
    pub fn from_vocab(vocab: &crate::vocab::Vocab) -> Self {
        Self::new(vocab.iter(), vocab.eog_tokens())
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.n_vocab
    }

    /// True for an empty vocabulary.
    pub fn is_empty(&self) -> bool {
        self.n_vocab == 0
    }

    /// Words in a mask: `ceil(len / 32)`.
    pub fn words(&self) -> usize {
        self.n_vocab.div_ceil(32)
    }

    /// The text of `token` as the grammar sees it (empty for ids outside the vocabulary).
    pub fn token_bytes(&self, token: u32) -> &[u8] {
        let t = token as usize;
        if t >= self.n_vocab {
            return &[];
        }
        &self.bytes[self.offsets[t] as usize..self.offsets[t + 1] as usize]
    }

    /// True for end-of-generation tokens.
    pub fn is_eog(&self, token: u32) -> bool {
        self.is_eog.get(token as usize).copied().unwrap_or(false)
    }

    /// The end-of-generation tokens, ascending.
    pub fn eog_tokens(&self) -> &[u32] {
        &self.eog
    }

    /// Splits `text` into tokens by greedy longest match over the vocabulary (not a model's
    /// real tokenisation, but a valid token sequence for the same bytes: benchmarks and tests
    /// walk documents with it). `None` when some byte starts no token.
    pub fn greedy_tokenize(&self, text: &[u8]) -> Option<Vec<u32>> {
        let trie = &self.trie;
        let mut out = Vec::new();
        let mut at = 0;
        while at < text.len() {
            let (mut best, mut best_len) = (None, 0);
            // Children of the root: nodes at depth 1, siblings linked by `end`.
            let (mut lo, mut hi) = (0usize, trie.byte.len());
            let mut depth = 0;
            while at + depth < text.len() {
                let b = text[at + depth];
                let mut child = lo;
                while child < hi && trie.byte[child] != b {
                    child = trie.end[child] as usize;
                }
                if child >= hi {
                    break;
                }
                depth += 1;
                if let Some(&t) = trie.tokens_at(child).first() {
                    best = Some(t);
                    best_len = depth;
                }
                lo = child + 1;
                hi = trie.end[child] as usize;
            }
            out.push(best?);
            at += best_len;
        }
        Some(out)
    }

    /// The trie nodes below which every token is accepted by a parse state that loops on
    /// `alphabet` (see `Engine::loop_alphabet`: ASCII bits, bit 0 for "every code point from
    /// 128 up"), assuming the node starts a character: each character completed below is in
    /// the alphabet, no byte is an invalid lead and no token ends inside a character. A
    /// bitset over trie nodes, computed once per alphabet and vocabulary (two passes over the
    /// trie) and shared by every grammar: llguidance's "slicer" idea, for the loops that
    /// accept almost everything (JSON string content, `.*`).
    pub(crate) fn slice(&self, alphabet: u128) -> Arc<Slice> {
        use crate::engine::Decoded;
        let mut slices = self.slices.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = slices.get(&alphabet) {
            return Arc::clone(s);
        }
        let t = &self.trie;
        let n = t.byte.len();
        // Forward: is each node's byte fine on its own (decoded along its path from a
        // character boundary at the root)? And does it pass (fine, or inside a character
        // whatever tokens end there)? Tokens on paths that pass throughout are `tokens` (they
        // end on a character boundary) or `partial` (they do not).
        let mut fine = vec![false; n];
        let mut pass = vec![0u64; n.div_ceil(64)];
        let mut tokens = vec![0u32; self.words()];
        let mut partial = Vec::new();
        let mut decoders = vec![Utf8::default(); t.max_depth + 1];
        // Per depth on the current path: every node so far passes; some character completed.
        let mut path_passes = vec![true; t.max_depth + 1];
        let mut entered = vec![false; t.max_depth + 1];
        for (i, fine) in fine.iter_mut().enumerate() {
            let d = t.depth[i] as usize;
            let mut dec = decoders[d - 1];
            let (passes, completed) = match dec.step(t.byte[i]) {
                Decoded::Invalid => (false, false),
                Decoded::Pending => {
                    *fine = t.tokens_at(i).is_empty();
                    (true, false)
                }
                Decoded::Char(cp) => {
                    *fine = if cp < 128 { cp != 0 && alphabet >> cp & 1 == 1 } else { alphabet & 1 == 1 };
                    (*fine, true)
                }
            };
            decoders[d] = dec;
            path_passes[d] = path_passes[d - 1] && passes;
            entered[d] = entered[d - 1] || completed;
            if passes {
                pass[i / 64] |= 1 << (i % 64);
            }
            if path_passes[d] {
                for &tok in t.tokens_at(i) {
                    if dec.is_pending() {
                        partial.push((dec, entered[d], tok));
                    } else {
                        tokens[(tok / 32) as usize] |= 1 << (tok % 32);
                    }
                }
            }
        }
        partial.sort_by_key(|&(dec, entered, tok)| (entered, dec.value, dec.n_remain, tok));
        // Backward: a node's children are all full, and a node is full when it is fine too;
        // likewise a node is `through` when it and all its children pass.
        let mut full = vec![0u64; n.div_ceil(64)];
        let mut kids = vec![0u64; n.div_ceil(64)];
        let mut through = vec![0u64; n.div_ceil(64)];
        let bit = |bits: &[u64], j: usize| bits[j / 64] >> (j % 64) & 1 == 1;
        for i in (0..n).rev() {
            let (mut all_full, mut all_through) = (true, true);
            let mut j = i + 1;
            while j < t.end[i] as usize && (all_full || all_through) {
                all_full &= bit(&full, j);
                all_through &= bit(&through, j);
                j = t.end[j] as usize;
            }
            if all_full {
                kids[i / 64] |= 1 << (i % 64);
                if fine[i] {
                    full[i / 64] |= 1 << (i % 64);
                }
            }
            if all_through && bit(&pass, i) {
                through[i / 64] |= 1 << (i % 64);
            }
        }
        let full = Arc::new(Slice {
            full: full.into(),
            kids: kids.into(),
            pass: pass.into(),
            through: through.into(),
            tokens: tokens.into(),
            partial: partial.into(),
        });
        if slices.len() >= 64 {
            slices.clear();
        }
        slices.insert(alphabet, Arc::clone(&full));
        full
    }

    /// Number of nodes in the token trie.
    pub fn trie_nodes(&self) -> usize {
        self.trie.byte.len()
    }

    fn build_trie(&self) -> Trie {
        let mut ids: Vec<u32> =
            (0..self.n_vocab as u32).filter(|&t| !self.is_eog[t as usize] && !self.token_bytes(t).is_empty()).collect();
        ids.sort_by(|&a, &b| self.token_bytes(a).cmp(self.token_bytes(b)).then(a.cmp(&b)));
        let mut trie = Trie::default();
        // `path[d]` = node index at depth d + 1 on the current path.
        let mut path: Vec<u32> = Vec::new();
        let mut prev: &[u8] = &[];
        let mut pending: Vec<(u32, u32)> = Vec::new(); // (node, token)
        for &id in &ids {
            let text = self.token_bytes(id);
            let common = prev.iter().zip(text).take_while(|(a, b)| a == b).count();
            path.truncate(common);
            for (d, &b) in text.iter().enumerate().skip(common) {
                let node = trie.byte.len() as u32;
                trie.byte.push(b);
                trie.depth.push(d as u32 + 1);
                path.push(node);
            }
            pending.push((*path.last().expect("tokens are not empty"), id));
            trie.max_depth = trie.max_depth.max(text.len());
            prev = text;
        }
        let n = trie.byte.len();
        // Subtree ends: the next node at the same or a smaller depth.
        trie.end = vec![n as u32; n];
        let mut open: Vec<u32> = Vec::new();
        for i in 0..n {
            while let Some(&top) = open.last() {
                if trie.depth[top as usize] >= trie.depth[i] {
                    trie.end[top as usize] = i as u32;
                    open.pop();
                } else {
                    break;
                }
            }
            open.push(i as u32);
        }
        // Tokens per node, in node order (ids sorted by text, so pending is in node order).
        trie.tok_off = vec![0; n + 1];
        for &(node, _) in &pending {
            trie.tok_off[node as usize + 1] += 1;
        }
        for i in 0..n {
            trie.tok_off[i + 1] += trie.tok_off[i];
        }
        trie.tokens = pending.iter().map(|&(_, t)| t).collect();
        trie
    }
}

/// Per trie node, for one loop alphabet (see [`TokenIndex::slice`]).
#[derive(Debug)]
pub(crate) struct Slice {
    /// The node starts a character and it and everything below are accepted by the loop.
    pub full: Box<[u64]>,
    /// Every child of the node is `full` (a node without children counts).
    pub kids: Box<[u64]>,
    /// The node's byte passes: it is inside a character (whatever tokens end there) or
    /// completes one of the alphabet. Along a path of passing nodes from the root, a state
    /// that enters a loop on the alphabet with the first character stays in that loop.
    pub pass: Box<[u64]>,
    /// The node and everything below pass: each token below is in `tokens` or `partial`.
    pub through: Box<[u64]>,
    /// Mask of the tokens whose every node passes and that end on a character boundary:
    /// made only of the alphabet's characters. A state that enters a loop on the alphabet
    /// with any of them accepts them all.
    pub tokens: Box<[u32]>,
    /// The tokens whose every node passes but that end inside a character: the decoder
    /// state there, whether a character was completed before (the state is then the loop's,
    /// else the one the walk started from) and the token; sorted by state.
    pub partial: Box<[(Utf8, bool, u32)]>,
}

/// Bit `i` of a packed bitset.
#[inline]
fn bit(words: &[u64], i: usize) -> bool {
    words[i / 64] >> (i % 64) & 1 == 1
}

impl Slice {
    #[inline]
    pub fn full(&self, node: usize) -> bool {
        bit(&self.full, node)
    }

    #[inline]
    pub fn kids(&self, node: usize) -> bool {
        bit(&self.kids, node)
    }

    #[inline]
    pub fn pass(&self, node: usize) -> bool {
        bit(&self.pass, node)
    }

    #[inline]
    pub fn through(&self, node: usize) -> bool {
        bit(&self.through, node)
    }
}

impl Trie {
    pub fn tokens_at(&self, node: usize) -> &[u32] {
        &self.tokens[self.tok_off[node] as usize..self.tok_off[node + 1] as usize]
    }

    /// Every token ending in the subtree of `node`.
    pub fn tokens_under(&self, node: usize) -> &[u32] {
        &self.tokens[self.tok_off[node] as usize..self.tok_off[self.end[node] as usize] as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trie_is_depth_first_with_subtree_ends() {
        let toks: Vec<&[u8]> = vec![b"ab", b"a", b"b", b"abc", b"a", b"", b"x\0y"];
        let index = TokenIndex::new(toks, &[2]);
        let t = &index.trie;
        // Nodes: a(1) b(2) c(3) x(1); "b" is EOG, "" is empty: not in the trie.
        assert_eq!(t.byte, b"abcx");
        assert_eq!(t.depth, [1, 2, 3, 1]);
        assert_eq!(t.end, [3, 3, 3, 4]);
        assert_eq!(t.tokens_at(0), [1, 4]);
        assert_eq!(t.tokens_at(1), [0]);
        assert_eq!(t.tokens_at(3), [6]);
        assert_eq!(t.tokens_under(0), [1, 4, 0, 3]);
        assert_eq!(index.token_bytes(6), b"x");
        assert_eq!(index.token_bytes(99), b"");
        assert_eq!(index.greedy_tokenize(b"abcaxa"), Some(vec![3, 1, 6, 1]));
        assert_eq!(index.greedy_tokenize(b"q"), None);
    }
}
