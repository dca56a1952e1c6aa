//! The fast mask (trie walk, per-stack and per-frame caches) against the token-by-token
//! definition, on random vocabularies and random walks through real grammars.

use std::sync::Arc;

use proptest::prelude::*;
use tokensieve_grammar::{is_allowed, Grammar, Matcher, TokenIndex};

const GRAMMARS: &[&str] = &[
    // json.gbnf (llama.cpp's example)
    r#"root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws
array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws
string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}"#,
    // nested, ambiguous and recursive structure
    r#"root ::= expr
expr ::= term ([-+*/] term)*
term ::= [0-9]+ | "(" expr ")" | "é" term"#,
    // non-ASCII classes and negation (partial UTF-8 across tokens)
    r#"root ::= ([^é"] | "é€")* "\"""#,
    r#"root ::= [a-zé-ü😀]{1,6} ("!" | [^a-z])?"#,
    // token elements
    r#"root ::= <[3]> (!<[4]>)* <[4]> "ab"?"#,
    // ambiguous optionals (llama.cpp #4218)
    r#"root ::= [0-9] ("a"? "a"? "a"? [0-9])*"#,
    r#"root ::= .* "z""#,
];

/// Bytes tokens are made of: ASCII the grammars use, pieces of multi-byte characters, and
/// bytes that are never valid UTF-8 leads.
const ATOMS: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b":",
    b",",
    b" ",
    b"\n",
    b"\t",
    b"a",
    b"b",
    b"z",
    b"e",
    b"1",
    b"0",
    b"9",
    b"-",
    b"+",
    b".",
    b"(",
    b")",
    b"!",
    b"\\",
    b"u",
    b"t",
    b"r",
    b"n",
    b"l",
    b"f",
    "é".as_bytes(),
    "€".as_bytes(),
    "😀".as_bytes(),
    &[0xC3],
    &[0xA9],
    &[0xE2, 0x82],
    &[0x82, 0xAC],
    &[0xF0],
    &[0x80],
    &[0xFF],
    &[0x00],
    b"true",
    b"null",
    b"\": ",
    b"\", \"",
];

fn vocab_strategy() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(prop::collection::vec(0..ATOMS.len(), 1..4), 40..120).prop_map(|toks| {
        let mut out: Vec<Vec<u8>> =
            toks.into_iter().map(|t| t.into_iter().flat_map(|a| ATOMS[a].to_vec()).collect()).collect();
        // Every single atom is a token too, so walks can always make progress.
        out.extend(ATOMS.iter().map(|a| a.to_vec()));
        out.push(Vec::new()); // an empty token: never allowed
        out
    })
}

fn check_walk(grammar: &str, vocab: Vec<Vec<u8>>, depth: usize, choices: &[usize]) -> Result<(), TestCaseError> {
    let eog = vocab.len() as u32 - 1;
    let index = Arc::new(TokenIndex::new(vocab.iter().map(Vec::as_slice), &[eog]));
    let grammar = Grammar::new(grammar).unwrap();
    let mut m = Matcher::with_vocab(&grammar, index.clone()).unwrap();
    m.set_cache_depth(depth);
    // Odd depths also look for loop slices above every subtree (the default needs large ones).
    if depth % 2 == 1 {
        m.set_slice_threshold(1);
    }
    for &choice in choices {
        let fast = m.mask().unwrap();
        let naive = m.mask_naive().unwrap();
        let diff: Vec<u32> =
            (0..index.len() as u32).filter(|&t| is_allowed(&fast, t) != is_allowed(&naive, t)).collect();
        prop_assert!(diff.is_empty(), "fast and naive masks differ on {:?}", diff);
        for t in 0..index.len() as u32 {
            prop_assert_eq!(m.allows(t).unwrap(), is_allowed(&naive, t), "allows({})", t);
        }
        let allowed: Vec<u32> = (0..index.len() as u32).filter(|&t| is_allowed(&fast, t) && !index.is_eog(t)).collect();
        if allowed.is_empty() {
            break;
        }
        let t = allowed[choice % allowed.len()];
        // An allowed token must be acceptable (llama.cpp's "unexpected empty stack" can't happen).
        m.accept_token(t).unwrap();
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn fast_mask_equals_token_by_token(
        g in 0..GRAMMARS.len(),
        vocab in vocab_strategy(),
        depth in 1usize..5,
        choices in prop::collection::vec(any::<usize>(), 1..12),
    ) {
        check_walk(GRAMMARS[g], vocab, depth, &choices)?;
    }
}

#[test]
fn every_grammar_walks_with_every_cache_depth() {
    let vocab: Vec<Vec<u8>> =
        ATOMS.iter().map(|a| a.to_vec()).chain([b"{\"".to_vec(), b"\"}".to_vec(), Vec::new()]).collect();
    for g in GRAMMARS {
        for depth in [1, 2, 3, 8] {
            check_walk(g, vocab.clone(), depth, &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]).unwrap();
        }
    }
}

#[test]
fn rejected_tokens_leave_the_state_unchanged() {
    let vocab: Vec<&[u8]> = vec![b"a", b"b", b"ab", b"</s>"];
    let index = Arc::new(TokenIndex::new(vocab, &[3]));
    let g = Grammar::new(r#"root ::= "ab""#).unwrap();
    let mut m = Matcher::with_vocab(&g, index).unwrap();
    let before = m.mask().unwrap();
    assert!(m.accept_token(1).is_err());
    assert!(m.accept_token(3).is_err(), "end of generation before the grammar is complete");
    assert!(m.accept_token(99).is_err());
    assert_eq!(m.mask().unwrap(), before);
    assert_eq!(m.history_len(), 0);
    m.accept_token(2).unwrap();
    assert!(m.is_complete());
    assert_eq!(m.allowed_tokens().unwrap(), [3]);
    m.accept_token(3).unwrap();
}
