//! [`GrammarConstraint`]: a grammar as a [`tokensieve::Constraint`], so a [`tokensieve::Chain`]
//! applies it before its other stages, in llama.cpp's masked or fast (rejection) mode, with
//! llama.cpp's lazy grammars that wait for a trigger.

use std::sync::Arc;

use regex::bytes::Regex;
use tokensieve::params::GrammarTrigger;
use tokensieve::Constraint;

use crate::error::{Error, Result};
use crate::grammar::Grammar;
use crate::matcher::Matcher;
use crate::trie::TokenIndex;

/// A grammar constraining a sequence's tokens.
///
/// ```
/// use std::sync::Arc;
/// use tokensieve::{Chain, ConstraintMode, RngConfig, sampler::BuildContext};
/// use tokensieve_grammar::{Grammar, GrammarConstraint, TokenIndex};
///
/// let vocab = Arc::new(TokenIndex::new([b"yes".as_slice(), b"no", b"maybe", b"</s>"], &[3]));
/// let grammar = Grammar::new(r#"root ::= "yes" | "no""#).unwrap();
/// let constraint = GrammarConstraint::new(&grammar, vocab).unwrap();
/// let ctx = BuildContext::new(4, RngConfig::philox(0));
/// let mut chain = Chain::from_spec("greedy", &ctx).unwrap()
///     .with_constraint(Box::new(constraint), ConstraintMode::MaskFirst);
/// let logits = [0.0f32, 1.0, 9.0, 5.0]; // "maybe" is most likely, but not allowed
/// assert_eq!(chain.sample(&logits).unwrap(), 1);   // "no"
/// assert_eq!(chain.sample(&logits).unwrap(), 3);   // then only end-of-generation
/// ```
#[derive(Clone, Debug)]
pub struct GrammarConstraint {
    matcher: Matcher,
    lazy: Option<Lazy>,
}

/// llama.cpp's lazy-grammar state: tokens are buffered until a trigger token or pattern.
#[derive(Clone, Debug)]
struct Lazy {
    trigger_tokens: Vec<u32>,
    patterns: Vec<Regex>,
    awaiting: bool,
    buffer: Vec<u8>,
    /// (token, start, end) of each buffered token's piece in `buffer`.
    positions: Vec<(u32, usize, usize)>,
}

impl GrammarConstraint {
    /// A grammar over `vocab`, active from the first token.
    pub fn new(grammar: &Grammar, vocab: Arc<TokenIndex>) -> Result<Self> {
        Ok(GrammarConstraint { matcher: Matcher::with_vocab(grammar, vocab)?, lazy: None })
    }

    /// Wraps an existing matcher (its current state is kept).
    pub fn from_matcher(matcher: Matcher) -> Result<Self> {
        if matcher.vocab().is_none() {
            return Err(Error::token("a grammar constraint needs a matcher built with a vocabulary"));
        }
        Ok(GrammarConstraint { matcher, lazy: None })
    }

    /// A lazy grammar (llama.cpp's `llama_sampler_init_grammar_lazy_patterns`): nothing is
    /// constrained until a token in `trigger_tokens` is accepted (it is then fed to the
    /// grammar) or the text so far matches one of `trigger_patterns` (regular expressions;
    /// the grammar then starts at the first non-empty capture group, or at the match, and the
    /// buffered tokens from there are replayed into it, cut where the match starts).
    pub fn lazy(
        grammar: &Grammar,
        vocab: Arc<TokenIndex>,
        trigger_tokens: &[u32],
        trigger_patterns: &[&str],
    ) -> Result<Self> {
        let patterns = trigger_patterns
            .iter()
            .map(|p| Regex::new(p).map_err(|e| Error::build(format!("trigger pattern `{p}`: {e}"))))
            .collect::<Result<Vec<_>>>()?;
        if trigger_tokens.is_empty() && patterns.is_empty() {
            return Err(Error::build("a lazy grammar needs at least one trigger token or pattern"));
        }
        Ok(GrammarConstraint {
            matcher: Matcher::with_vocab(grammar, vocab)?,
            lazy: Some(Lazy {
                trigger_tokens: trigger_tokens.to_vec(),
                patterns,
                awaiting: true,
                buffer: Vec::new(),
                positions: Vec::new(),
            }),
        })
    }

    /// llama.cpp's deprecated trigger *words*: a lazy grammar triggered when any of the words
    /// appears (turned into one escaped alternation pattern, as llama.cpp does).
    pub fn lazy_words(
        grammar: &Grammar,
        vocab: Arc<TokenIndex>,
        trigger_tokens: &[u32],
        words: &[&str],
    ) -> Result<Self> {
        let pattern = if words.is_empty() {
            None
        } else {
            Some(format!(
                "[\\s\\S]*?({})[\\s\\S]*",
                words.iter().map(|w| regex::escape(w)).collect::<Vec<_>>().join("|")
            ))
        };
        let patterns: Vec<&str> = pattern.as_deref().into_iter().collect();
        Self::lazy(grammar, vocab, trigger_tokens, &patterns)
    }

    /// A lazy grammar from a request's `grammar_triggers`
    /// ([`SamplingParams::grammar_triggers`](tokensieve::params::SamplingParams::grammar_triggers)),
    /// turned into trigger tokens and patterns as llama.cpp's common sampler does: a word is
    /// searched as escaped text, a pattern as written, a full pattern anchored at both ends
    /// (`^…$`, unless it already is).
    pub fn with_triggers(grammar: &Grammar, vocab: Arc<TokenIndex>, triggers: &[GrammarTrigger]) -> Result<Self> {
        let mut tokens = Vec::new();
        let mut patterns = Vec::new();
        for trigger in triggers {
            match trigger {
                GrammarTrigger::Token(t) => {
                    if *t as usize >= vocab.len() {
                        return Err(Error::build(format!(
                            "trigger token {t} is outside the vocabulary of {} tokens",
                            vocab.len()
                        )));
                    }
                    tokens.push(*t);
                }
                GrammarTrigger::Word(w) => patterns.push(regex::escape(w)),
                GrammarTrigger::Pattern(p) => patterns.push(p.clone()),
                GrammarTrigger::PatternFull(p) => patterns.push(format!(
                    "{}{p}{}",
                    if p.starts_with('^') { "" } else { "^" },
                    if p.ends_with('$') && !p.is_empty() { "" } else { "$" }
                )),
            }
        }
        let patterns: Vec<&str> = patterns.iter().map(String::as_str).collect();
        Self::lazy(grammar, vocab, &tokens, &patterns)
    }

    /// The matcher (grammar state).
    pub fn matcher(&self) -> &Matcher {
        &self.matcher
    }

    /// True while a lazy grammar waits for its trigger.
    pub fn is_awaiting_trigger(&self) -> bool {
        self.lazy.as_ref().is_some_and(|l| l.awaiting)
    }

    fn accept_token(&mut self, token: u32) -> Result<()> {
        let Some(lazy) = self.lazy.as_mut().filter(|l| l.awaiting) else {
            return self.matcher.accept_token(token);
        };
        let index = Arc::clone(self.matcher.vocab().expect("built with a vocabulary"));
        if token as usize >= index.len() {
            return Err(Error::token(format!("token {token} is outside the vocabulary of {} tokens", index.len())));
        }
        if lazy.trigger_tokens.contains(&token) {
            self.matcher.accept_token(token)?;
            let lazy = self.lazy.as_mut().expect("lazy");
            lazy.awaiting = false;
            lazy.buffer.clear();
            lazy.positions.clear();
            return Ok(());
        }
        let piece = index.token_bytes(token);
        let start = lazy.buffer.len();
        lazy.buffer.extend_from_slice(piece);
        lazy.positions.push((token, start, lazy.buffer.len()));
        let found = lazy.patterns.iter().find_map(|re| {
            let caps = re.captures(&lazy.buffer)?;
            let group = (1..caps.len()).find_map(|i| caps.get(i).filter(|m| !m.is_empty()));
            Some(group.unwrap_or_else(|| caps.get(0).expect("group 0")).start())
        });
        let Some(at) = found else { return Ok(()) };
        // Replay the buffered tokens from the match on a copy, so a rejection changes nothing.
        let mut replay = self.matcher.clone();
        for &(tok, tok_start, tok_end) in &lazy.positions {
            if tok_end <= at {
                continue;
            }
            let from = tok_start.max(at);
            replay.accept_token_text(tok, &lazy.buffer[from..tok_end])?;
        }
        self.matcher = replay;
        let lazy = self.lazy.as_mut().expect("lazy");
        lazy.awaiting = false;
        lazy.buffer.clear();
        lazy.positions.clear();
        Ok(())
    }
}

impl Constraint for GrammarConstraint {
    fn is_active(&self) -> bool {
        !self.is_awaiting_trigger()
    }

    fn fill_mask(&mut self, mask: &mut [u32]) -> tokensieve::Result<()> {
        Ok(self.matcher.fill_mask(mask)?)
    }

    fn allows(&mut self, token: u32) -> tokensieve::Result<bool> {
        if self.is_awaiting_trigger() {
            return Ok(true);
        }
        Ok(self.matcher.allows(token)?)
    }

    fn accept(&mut self, token: u32) -> tokensieve::Result<()> {
        Ok(self.accept_token(token)?)
    }

    fn reset(&mut self) {
        self.matcher.reset();
        if let Some(lazy) = self.lazy.as_mut() {
            lazy.awaiting = true;
            lazy.buffer.clear();
            lazy.positions.clear();
        }
    }

    fn box_clone(&self) -> Box<dyn Constraint> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab() -> Arc<TokenIndex> {
        let toks: Vec<&[u8]> = vec![b"hello", b" <tool>", b"{\"a\"", b":1}", b"<call>", b"</s>", b" world", b"1}"];
        Arc::new(TokenIndex::new(toks, &[5]))
    }

    #[test]
    fn lazy_pattern_trigger_replays_the_match() {
        let g = Grammar::new(r#"root ::= "{\"a\":1}""#).unwrap();
        let mut c = GrammarConstraint::lazy(&g, vocab(), &[], &["<tool>(\\{[\\s\\S]*)"]).unwrap();
        assert!(!c.is_active());
        c.accept(0).unwrap(); // "hello": free text
        c.accept(6).unwrap();
        assert!(!c.is_active());
        c.accept(1).unwrap(); // " <tool>": matches the tag, but the group is empty
        assert!(!c.is_active());
        c.accept(2).unwrap(); // "{\"a\"": the group starts here; replayed into the grammar
        assert!(c.is_active());
        assert!(!c.allows(7).unwrap() || c.allows(3).unwrap());
        assert!(c.allows(3).unwrap());
        assert!(c.accept(0).is_err(), "now constrained");
        c.accept(3).unwrap();
        assert!(c.matcher().is_complete());
        c.reset();
        assert!(!c.is_active());
    }

    #[test]
    fn lazy_token_trigger_feeds_the_token() {
        let g = Grammar::new(r#"root ::= <[4]> "{\"a\":1}""#).unwrap();
        let mut c = GrammarConstraint::lazy(&g, vocab(), &[4], &[]).unwrap();
        c.accept(0).unwrap();
        assert!(!c.is_active());
        c.accept(4).unwrap();
        assert!(c.is_active());
        assert!(c.allows(2).unwrap());
        assert!(!c.allows(0).unwrap());
    }

    #[test]
    fn request_triggers_become_tokens_and_patterns() {
        let g = Grammar::new(r#"root ::= "{\"a\":1}""#).unwrap();
        // A word: escaped (`{` is literal), the grammar starts at it.
        let mut c = GrammarConstraint::with_triggers(&g, vocab(), &[GrammarTrigger::Word("{\"a\"".into())]).unwrap();
        c.accept(0).unwrap();
        assert!(!c.is_active());
        c.accept(2).unwrap();
        assert!(c.is_active());
        assert!(c.allows(3).unwrap() && !c.allows(7).unwrap());
        // A full pattern must match everything so far: `hello` first, then the object.
        let full = GrammarTrigger::PatternFull("hello(\\{[\\s\\S]*)".into());
        let mut c = GrammarConstraint::with_triggers(&g, vocab(), &[full]).unwrap();
        c.accept(6).unwrap(); // " world": not at the start
        c.accept(0).unwrap();
        c.accept(2).unwrap();
        assert!(!c.is_active(), "the buffer does not start with hello");
        let full = GrammarTrigger::PatternFull("hello(\\{[\\s\\S]*)".into());
        let mut c = GrammarConstraint::with_triggers(&g, vocab(), &[full]).unwrap();
        c.accept(0).unwrap();
        c.accept(2).unwrap();
        assert!(c.is_active());
        // A token, checked against the vocabulary.
        let mut c = GrammarConstraint::with_triggers(&g, vocab(), &[GrammarTrigger::Token(4)]).unwrap();
        c.accept(4).unwrap_err(); // the grammar does not start with `<call>`'s text
        assert!(!c.is_active(), "a rejected trigger token changes nothing");
        assert!(GrammarConstraint::with_triggers(&g, vocab(), &[GrammarTrigger::Token(99)]).is_err());
        assert!(GrammarConstraint::with_triggers(&g, vocab(), &[GrammarTrigger::Pattern("(".into())]).is_err());
        assert!(GrammarConstraint::with_triggers(&g, vocab(), &[]).is_err());
    }

    #[test]
    fn bad_trigger_patterns_are_errors() {
        let g = Grammar::new(r#"root ::= "a""#).unwrap();
        assert!(GrammarConstraint::lazy(&g, vocab(), &[], &["(unclosed"]).is_err());
        assert!(GrammarConstraint::lazy(&g, vocab(), &[], &[]).is_err());
    }
}
