//! [`Grammar`]: a parsed and checked GBNF grammar, ready for matching.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gbnf::{self, Element, ParsedGrammar, TokenLookup};

/// A compiled grammar: llama.cpp's rules flattened into one element array, checked for
/// undefined rules, left recursion and the start symbol. Cheap to clone (shared).
///
/// ```
/// use tokensieve_grammar::Grammar;
/// let g = Grammar::new(r#"root ::= "yes" | "no""#).unwrap();
/// assert!(g.matches("yes").unwrap());
/// assert!(!g.matches("maybe").unwrap());
/// let e = Grammar::new("root ::= root \"a\"").unwrap_err();
/// assert!(e.to_string().contains("left recursion"));
/// ```
#[derive(Clone, Debug)]
pub struct Grammar {
    pub(crate) inner: Arc<Compiled>,
}

#[derive(Debug)]
pub(crate) struct Compiled {
    /// Every rule's elements, back to back; a position is an index into this array.
    pub elems: Vec<Element>,
    /// Where each rule (by symbol id) starts in `elems`.
    pub rule_start: Vec<u32>,
    /// The start rule.
    pub root: u32,
}

/// How to build a [`Grammar`] beyond its text.
#[derive(Clone, Copy, Default)]
pub struct GrammarOptions<'a> {
    /// The start symbol (llama.cpp's `grammar_root`); `"root"` when `None`.
    pub root: Option<&'a str>,
    /// Resolves `<text>` token references.
    pub tokens: Option<&'a dyn TokenLookup>,
}

impl Grammar {
    /// Parses and checks GBNF text with start symbol `root`.
    pub fn new(text: &str) -> Result<Self> {
        Self::with_options(text, GrammarOptions::default())
    }

    /// Parses and checks GBNF text with the given start symbol and token lookup.
    pub fn with_options(text: &str, options: GrammarOptions<'_>) -> Result<Self> {
        let parsed = gbnf::parse(text, options.tokens)?;
        Self::from_parsed(&parsed, options.root.unwrap_or("root"))
    }

    /// Builds from an already parsed grammar.
    pub fn from_parsed(parsed: &ParsedGrammar, root: &str) -> Result<Self> {
        let Some(&root_id) = parsed.symbol_ids.get(root) else {
            return Err(Error::build(format!("the grammar has no rule named `{root}` (the start symbol)")));
        };
        let mut names = vec![String::new(); parsed.rules.len()];
        for (name, &id) in &parsed.symbol_ids {
            if let Some(slot) = names.get_mut(id as usize) {
                slot.clone_from(name);
            }
        }
        if let Some(rule) = left_recursive_rule(&parsed.rules) {
            return Err(Error::build(format!(
                "left recursion in rule `{}`: llama.cpp grammars cannot be left-recursive",
                names.get(rule).map_or("?", String::as_str)
            )));
        }
        let mut elems = Vec::with_capacity(parsed.n_elements());
        let mut rule_start = Vec::with_capacity(parsed.rules.len());
        for rule in &parsed.rules {
            rule_start.push(u32::try_from(elems.len()).map_err(|_| Error::limit("grammar too large"))?);
            elems.extend_from_slice(rule);
        }
        Ok(Grammar { inner: Arc::new(Compiled { elems, rule_start, root: root_id }) })
    }

    /// Number of rules, generated ones included.
    pub fn n_rules(&self) -> usize {
        self.inner.rule_start.len()
    }

    /// Total elements over all rules.
    pub fn n_elements(&self) -> usize {
        self.inner.elems.len()
    }

    /// True when the whole of `text` is a sentence of the grammar (llama.cpp's test rule:
    /// consume every code point, then accept if a parse is complete).
    pub fn matches(&self, text: &str) -> Result<bool> {
        let mut m = crate::Matcher::new(self)?;
        Ok(m.accept_bytes(text.as_bytes()).is_ok() && m.is_complete())
    }
}

/// The first rule found to be left-recursive (directly or through rules that may be empty),
/// with llama.cpp's notion of "may be empty": a rule with an empty alternative.
fn left_recursive_rule(rules: &[Vec<Element>]) -> Option<usize> {
    let n = rules.len();
    let mut visited = vec![false; n];
    let mut in_progress = vec![false; n];
    let mut may_be_empty = vec![false; n];
    struct Frame {
        rule: usize,
        i: usize,
        leftmost: bool,
        child: Option<usize>,
    }
    let enter = |r: usize, in_progress: &mut Vec<bool>, may_be_empty: &mut Vec<bool>| {
        in_progress[r] = true;
        let mut at_start = true;
        for e in &rules[r] {
            if e.is_end_of_sequence() {
                if at_start {
                    may_be_empty[r] = true;
                    break;
                }
                at_start = true;
            } else {
                at_start = false;
            }
        }
        Frame { rule: r, i: 0, leftmost: true, child: None }
    };
    for start in 0..n {
        if visited[start] {
            continue;
        }
        let mut stack = vec![enter(start, &mut in_progress, &mut may_be_empty)];
        while let Some(top) = stack.last_mut() {
            if let Some(c) = top.child.take() {
                if !may_be_empty[c] {
                    top.leftmost = false;
                }
                top.i += 1;
                continue;
            }
            let rule = &rules[top.rule];
            let Some(&e) = rule.get(top.i) else {
                in_progress[top.rule] = false;
                visited[top.rule] = true;
                stack.pop();
                continue;
            };
            match e {
                Element::RuleRef(c) if top.leftmost => {
                    let c = c as usize;
                    if in_progress[c] {
                        return Some(c);
                    }
                    if visited[c] {
                        if !may_be_empty[c] {
                            top.leftmost = false;
                        }
                        top.i += 1;
                    } else {
                        top.child = Some(c);
                        stack.push(enter(c, &mut in_progress, &mut may_be_empty));
                    }
                }
                e if e.is_end_of_sequence() => {
                    top.leftmost = true;
                    top.i += 1;
                }
                _ => {
                    top.leftmost = false;
                    top.i += 1;
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn left_recursion_is_rejected() {
        for text in [
            "root ::= \"a\" | root \"a\"",
            "root ::= asdf\nasdf ::= \"a\" | asdf \"a\"",
            "root ::= asdf\nasdf ::= \"a\" | foo \"b\"\nfoo ::= \"c\" | asdf \"d\" | \"e\"",
            "root ::= asdf\nasdf ::= \"a\" | foo \"b\"\nfoo ::= \"c\" | empty asdf \"d\" | \"e\"\nempty ::= \"blah\" | ",
        ] {
            let e = Grammar::new(text).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Build, "{text}");
        }
        assert!(Grammar::new("root ::= \"a\" root | \"b\"").is_ok());
    }

    #[test]
    fn start_symbol() {
        let e = Grammar::new("rot ::= \"a\"").unwrap_err();
        assert!(e.to_string().contains("`root`"), "{e}");
        let g = Grammar::with_options("foobar ::= \"foobar\"", GrammarOptions { root: Some("foobar"), tokens: None });
        assert!(g.unwrap().matches("foobar").unwrap());
    }
}
