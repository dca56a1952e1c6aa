//! Bad input gets a clear error, never a panic, never a hang, never lost state: malformed
//! grammars, pathological grammars against the documented [`Limits`], tokens outside the
//! vocabulary, wrong buffer sizes, rollback past the start.

use std::sync::Arc;

use tokensieve_grammar::{ErrorKind, Grammar, Limits, Matcher, TokenIndex};

#[test]
fn malformed_grammars_are_syntax_errors_with_positions() {
    for (text, line, col) in [
        ("root ::= \"abc", 1, 14),
        ("root ::= [a-", 1, 13),
        ("root ::= (\"a\"", 1, 14),
        ("root ::= \"a\"\nfoo := \"b\"", 2, 5),
        ("root ::= \"\\q\"", 1, 11),
        ("root ::= \"a\"{3,1x}", 1, 17),
        ("ro_ot ::= \"a\"", 1, 3),
        ("", 0, 0),
    ] {
        let e = Grammar::new(text).unwrap_err();
        if text.is_empty() {
            assert_eq!(e.kind(), ErrorKind::Build, "an empty grammar has no root: {e}");
            continue;
        }
        assert_eq!(e.kind(), ErrorKind::Syntax, "{text:?}: {e}");
        assert_eq!(e.position(), Some((line, col)), "{text:?}: {e}");
    }
}

#[test]
fn arbitrary_bytes_never_panic() {
    let mut seed = 0x9E3779B97F4A7C15u64;
    let alphabet = b"root ::=\"[]()|*+?{},.-^\\\n abx0<>!#";
    for _ in 0..5000 {
        let len = (seed % 40) as usize;
        let text: String = (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                alphabet[(seed % alphabet.len() as u64) as usize] as char
            })
            .collect();
        if let Ok(g) = Grammar::new(&text) {
            let mut m = Matcher::new(&g).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            let _ = m.accept_str("ab0x");
        }
    }
}

#[test]
fn too_many_stacks_is_a_limit_error_and_the_state_survives() {
    // llama.cpp #4218's ambiguous optionals: 7 stacks; allow only 3.
    let g = Grammar::new(r#"root ::= [0-9] ("a"? "a"? "a"? "a"? "a"? [0-9])*"#).unwrap();
    let limits = Limits { max_stacks: 3, ..Limits::default() };
    let e = Matcher::with_limits(&g, None, limits).map(|mut m| m.accept_str("1")).unwrap().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Limit, "{e}");
    // With the default limits the same grammar stays small: equal stacks are shared.
    let mut m = Matcher::new(&g).unwrap();
    for _ in 0..500 {
        m.accept_str("1a").unwrap();
    }
    assert!(m.n_stacks() <= 8);
}

#[test]
fn expansion_that_never_ends_is_a_limit_error() {
    // `n` can be empty without an empty alternative of its own, so llama.cpp's left-recursion
    // check misses `a ::= n a …` and its stack expansion never terminates.
    let g = Grammar::new("root ::= a\na ::= n a \"x\" | \"y\"\nn ::= m\nm ::= \"\"").unwrap();
    let e = Matcher::with_limits(&g, None, Limits { max_expansions: 10_000, ..Limits::default() }).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Limit, "{e}");
}

#[test]
fn deep_recursion_hits_the_node_limit() {
    let g = Grammar::new(r#"root ::= "(" root ")" | "x""#).unwrap();
    let mut m = Matcher::with_limits(&g, None, Limits { max_nodes: 200, ..Limits::default() }).unwrap();
    let mut last = Ok(());
    for _ in 0..1000 {
        last = m.accept_str("(");
        if last.is_err() {
            break;
        }
    }
    assert_eq!(last.unwrap_err().kind(), ErrorKind::Limit);
    // The matcher is still usable at the state before the failing step.
    let depth = m.history_len();
    m.accept_str("x").unwrap();
    m.accept_str(&")".repeat(depth)).unwrap();
    assert!(m.is_complete());
}

#[test]
fn token_and_buffer_errors() {
    let index = Arc::new(TokenIndex::new([b"a".as_slice(), b"b"], &[]));
    let g = Grammar::new(r#"root ::= "a""#).unwrap();
    let mut m = Matcher::with_vocab(&g, index).unwrap();
    assert_eq!(m.accept_token(7).unwrap_err().kind(), ErrorKind::Token);
    assert!(!m.allows(7).unwrap());
    assert_eq!(m.fill_mask(&mut [0u32; 3]).unwrap_err().kind(), ErrorKind::Token);
    assert_eq!(m.rollback(1).unwrap_err().kind(), ErrorKind::Rejected);
    let mut text_only = Matcher::new(&g).unwrap();
    assert_eq!(text_only.mask().unwrap_err().kind(), ErrorKind::Token);
    assert_eq!(text_only.accept_str("b").unwrap_err().kind(), ErrorKind::Rejected);
    assert!(text_only.accept_bytes(&[0x80]).is_err());
    text_only.accept_str("a").unwrap();
    assert!(text_only.is_complete());
}
