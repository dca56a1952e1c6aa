//! The GBNF parser: llama.cpp's grammar language, with its syntax and quirks, into llama.cpp's
//! flat rule encoding (see [`Element`]).
//!
//! What it accepts, restated from llama.cpp's `llama_grammar_parser`:
//! * rules `name ::= body`; names are `[A-Za-z0-9-]+`; a rule defined twice keeps the last body;
//! * a newline ends a rule, except right after `::=`, inside `( … )` and right after `|`;
//! * `"literal"`, `[class]`, `[^class]` (`[]` and `[^]` are empty: they match ε), `.`, rule
//!   references, `( … )` groups, `*` `+` `?` `{m}` `{m,}` `{m,n}`, `#` comments;
//! * escapes `\xHH` `\uHHHH` `\UHHHHHHHH` `\t` `\r` `\n` `\\` `\"` `\[` `\]` `\-`; any other
//!   escape is an error;
//! * token references `<[id]>`, `<text>` (resolved through a vocabulary) and their negations
//!   `!<…>`;
//! * repetition is rewritten into generated rules exactly as llama.cpp does (`S{m,n}` → m copies
//!   of `S` and a chain of n−m nested optional rules), with its limits: m above 2000 is an error,
//!   n above 2000 means "no upper bound", and a repetition whose expansion multiplies to 2000
//!   rules or more is an error.
//!
//! Errors carry the line and column of the offending character. The parser never recurses
//! deeper than [`MAX_NESTING`] groups, so hostile input cannot overflow the stack.

use std::collections::BTreeMap;

use crate::error::{Error, Result};

/// llama.cpp's `MAX_REPETITION_THRESHOLD`.
pub const MAX_REPETITION_THRESHOLD: u64 = 2000;

/// Deepest nesting of `( … )` groups the parser accepts (llama.cpp has no limit and crashes on
/// about 60k nested groups, issue #26600).
pub const MAX_NESTING: usize = 256;

/// Most elements a grammar may expand to, after repetition is rewritten.
pub const MAX_ELEMENTS: usize = 1 << 22;

/// One element of a rule, as llama.cpp encodes it (`llama_grammar_element`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Element {
    /// End of a rule.
    End,
    /// Start of another alternative of the rule.
    Alt,
    /// Reference to rule `id`.
    RuleRef(u32),
    /// A character class starting with this code point (also a literal character).
    Char(u32),
    /// A negated character class starting with this code point.
    CharNot(u32),
    /// Upper bound of a range whose lower bound is the previous element.
    CharRngUpper(u32),
    /// Another code point (or range start) of the current class.
    CharAlt(u32),
    /// `.`: any code point.
    CharAny,
    /// `<[id]>`: exactly this token.
    Token(u32),
    /// `!<[id]>`: any token but this one.
    TokenNot(u32),
}

impl Element {
    /// True for `End` and `Alt`: the end of an alternative.
    pub fn is_end_of_sequence(self) -> bool {
        matches!(self, Element::End | Element::Alt)
    }
}

/// Resolves `<text>` token references (the text includes the angle brackets, as llama.cpp
/// tokenises it with special tokens enabled).
pub trait TokenLookup {
    /// The id of the single token whose text is exactly `text`, if any.
    fn lookup(&self, text: &[u8]) -> Option<u32>;
}

impl TokenLookup for crate::vocab::Vocab {
    fn lookup(&self, text: &[u8]) -> Option<u32> {
        self.token_id(text)
    }
}

/// A parsed grammar: rules in llama.cpp's flat encoding, indexed by symbol id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedGrammar {
    /// Symbol name → id, for every name used or generated (`root_1`, …).
    pub symbol_ids: BTreeMap<String, u32>,
    /// Rule bodies by symbol id; each ends with [`Element::End`].
    pub rules: Vec<Vec<Element>>,
}

impl ParsedGrammar {
    /// The symbol names in name order (llama.cpp's parser test compares these).
    pub fn symbol_names(&self) -> Vec<&str> {
        self.symbol_ids.keys().map(String::as_str).collect()
    }

    /// Total number of elements over all rules, `End`s included.
    pub fn n_elements(&self) -> usize {
        self.rules.iter().map(Vec::len).sum()
    }

    /// The name of symbol `id`.
    pub fn name_of(&self, id: u32) -> Option<&str> {
        self.symbol_ids.iter().find(|(_, &v)| v == id).map(|(k, _)| k.as_str())
    }
}

/// Parses GBNF text. `tokens` resolves `<text>` references; without it they are an error.
pub fn parse(text: &str, tokens: Option<&dyn TokenLookup>) -> Result<ParsedGrammar> {
    let mut p = Parser {
        src: text.as_bytes(),
        symbol_ids: BTreeMap::new(),
        next_id: 0,
        rules: Vec::new(),
        tokens,
        depth: 0,
        n_elements: 0,
    };
    // llama.cpp reads a C string: a NUL ends the text.
    if let Some(nul) = p.src.iter().position(|&b| b == 0) {
        p.src = &p.src[..nul];
    }
    let mut pos = p.space(0, true);
    while pos < p.src.len() {
        pos = p.rule(pos)?;
    }
    p.check_defined()?;
    Ok(ParsedGrammar { symbol_ids: p.symbol_ids, rules: p.rules })
}

struct Parser<'a> {
    src: &'a [u8],
    symbol_ids: BTreeMap<String, u32>,
    next_id: u32,
    rules: Vec<Vec<Element>>,
    tokens: Option<&'a dyn TokenLookup>,
    depth: usize,
    n_elements: usize,
}

fn is_word_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-'
}

impl Parser<'_> {
    fn at(&self, pos: usize) -> u8 {
        self.src.get(pos).copied().unwrap_or(0)
    }

    fn error(&self, pos: usize, message: impl Into<String>) -> Error {
        let pos = pos.min(self.src.len());
        let before = &self.src[..pos];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let line_start = before.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let column = String::from_utf8_lossy(&self.src[line_start..pos]).chars().count() + 1;
        let rest = String::from_utf8_lossy(&self.src[pos..]);
        let excerpt: String = rest.chars().take(24).map(|c| if c == '\n' { '⏎' } else { c }).collect();
        let near = if excerpt.is_empty() { "at end of input".to_string() } else { format!("at `{excerpt}`") };
        Error::syntax(line, column, format!("{} {near}", message.into()))
    }

    fn space(&self, mut pos: usize, newline_ok: bool) -> usize {
        loop {
            match self.at(pos) {
                b' ' | b'\t' => pos += 1,
                b'\r' | b'\n' if newline_ok => pos += 1,
                b'#' => {
                    while !matches!(self.at(pos), 0 | b'\r' | b'\n') {
                        pos += 1;
                    }
                }
                _ => return pos,
            }
        }
    }

    fn name(&self, pos: usize) -> Result<usize> {
        let mut end = pos;
        while is_word_char(self.at(end)) {
            end += 1;
        }
        if end == pos {
            return Err(self.error(pos, "expecting a rule name"));
        }
        Ok(end)
    }

    fn int(&self, pos: usize) -> Result<(u64, usize)> {
        let mut end = pos;
        while self.at(end).is_ascii_digit() {
            end += 1;
        }
        if end == pos {
            return Err(self.error(pos, "expecting an integer"));
        }
        let digits = std::str::from_utf8(&self.src[pos..end]).unwrap_or("");
        let value = digits.parse::<u64>().map_err(|_| self.error(pos, "integer out of range"))?;
        Ok((value, end))
    }

    fn symbol_id(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.symbol_ids.get(name) {
            return id;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.symbol_ids.insert(name.to_string(), id);
        id
    }

    fn generate_symbol_id(&mut self, base: &str) -> u32 {
        let id = self.next_id;
        self.next_id += 1;
        self.symbol_ids.insert(format!("{base}_{id}"), id);
        id
    }

    fn add_rule(&mut self, id: u32, rule: Vec<Element>) -> Result<()> {
        let id = id as usize;
        if self.rules.len() <= id {
            self.rules.resize(id + 1, Vec::new());
        }
        self.n_elements = self.n_elements - self.rules[id].len() + rule.len();
        if self.n_elements > MAX_ELEMENTS {
            return Err(Error::limit(format!(
                "the grammar expands to more than {MAX_ELEMENTS} elements; reduce its repetitions"
            )));
        }
        self.rules[id] = rule;
        Ok(())
    }

    fn rule(&mut self, start: usize) -> Result<usize> {
        let name_end = self.name(start)?;
        let mut pos = self.space(name_end, false);
        let name = String::from_utf8_lossy(&self.src[start..name_end]).into_owned();
        let id = self.symbol_id(&name);
        if !self.src[pos..].starts_with(b"::=") {
            return Err(self.error(pos, "expecting `::=`"));
        }
        pos = self.space(pos + 3, true);
        pos = self.alternates(pos, &name, id, false)?;
        match self.at(pos) {
            b'\r' => pos += if self.at(pos + 1) == b'\n' { 2 } else { 1 },
            b'\n' => pos += 1,
            0 => {}
            _ => return Err(self.error(pos, "expecting a newline or the end of the grammar")),
        }
        Ok(self.space(pos, true))
    }

    fn alternates(&mut self, pos: usize, rule_name: &str, rule_id: u32, nested: bool) -> Result<usize> {
        let mut rule = Vec::new();
        let mut pos = self.sequence(pos, rule_name, &mut rule, nested)?;
        while self.at(pos) == b'|' {
            rule.push(Element::Alt);
            pos = self.space(pos + 1, true);
            pos = self.sequence(pos, rule_name, &mut rule, nested)?;
        }
        rule.push(Element::End);
        self.add_rule(rule_id, rule)?;
        Ok(pos)
    }

    /// One code point of a literal or class: an escape or one UTF-8 sequence, decoded as
    /// llama.cpp's `decode_utf8` does (the lead byte's high bits give the length; continuation
    /// bytes are not validated).
    fn char(&self, pos: usize) -> Result<(u32, usize)> {
        let c = self.at(pos);
        if c == b'\\' {
            let simple = |v: u8| Ok((u32::from(v), pos + 2));
            return match self.at(pos + 1) {
                b'x' => self.hex(pos + 2, 2),
                b'u' => self.hex(pos + 2, 4),
                b'U' => self.hex(pos + 2, 8),
                b't' => simple(b'\t'),
                b'r' => simple(b'\r'),
                b'n' => simple(b'\n'),
                e @ (b'\\' | b'"' | b'[' | b']' | b'-') => simple(e),
                _ => Err(self.error(pos, "unknown escape")),
            };
        }
        if c == 0 {
            return Err(self.error(pos, "unexpected end of input"));
        }
        const LEN: [usize; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
        let len = LEN[usize::from(c >> 4)];
        let mut value = u32::from(c & ((1u16 << (8 - len)) - 1) as u8);
        let mut end = pos + 1;
        while end < pos + len && self.at(end) != 0 {
            value = (value << 6) + u32::from(self.at(end) & 0x3F);
            end += 1;
        }
        Ok((value, end))
    }

    fn hex(&self, pos: usize, size: usize) -> Result<(u32, usize)> {
        let mut value: u32 = 0;
        for i in 0..size {
            let digit = (self.at(pos + i) as char).to_digit(16);
            match digit {
                Some(d) => value = (value << 4) | d,
                None => return Err(self.error(pos, format!("expecting {size} hex digits"))),
            }
        }
        Ok((value, pos + size))
    }

    fn token(&self, pos: usize) -> Result<(u32, usize)> {
        if self.at(pos) != b'<' {
            return Err(self.error(pos, "expecting `<`"));
        }
        let mut p = pos + 1;
        if self.at(p) == b'[' {
            let (id, end) = self.int(p + 1)?;
            p = end;
            if self.at(p) != b']' {
                return Err(self.error(p, "expecting `]`"));
            }
            if self.at(p + 1) != b'>' {
                return Err(self.error(p + 1, "expecting `>`"));
            }
            let id = u32::try_from(id).map_err(|_| self.error(pos, "token id out of range"))?;
            return Ok((id, p + 2));
        }
        while !matches!(self.at(p), 0 | b'>') {
            p += 1;
        }
        if self.at(p) != b'>' {
            return Err(self.error(p, "expecting `>`"));
        }
        p += 1;
        let text = &self.src[pos..p];
        let Some(tokens) = self.tokens else {
            return Err(self.error(pos, "a token given by its text needs a vocabulary"));
        };
        match tokens.lookup(text) {
            Some(id) => Ok((id, p)),
            None => Err(self.error(pos, format!("`{}` is not a single token", String::from_utf8_lossy(text)))),
        }
    }

    fn sequence(&mut self, src: usize, rule_name: &str, rule: &mut Vec<Element>, nested: bool) -> Result<usize> {
        let mut last_sym_start = rule.len();
        let mut n_prev_rules: u64 = 1;
        let mut pos = src;
        loop {
            let c = self.at(pos);
            match c {
                b'"' => {
                    pos += 1;
                    last_sym_start = rule.len();
                    n_prev_rules = 1;
                    while self.at(pos) != b'"' {
                        if self.at(pos) == 0 {
                            return Err(self.error(pos, "unexpected end of input in a string literal"));
                        }
                        let (ch, next) = self.char(pos)?;
                        pos = next;
                        rule.push(Element::Char(ch));
                    }
                    pos = self.space(pos + 1, nested);
                }
                b'[' => {
                    pos += 1;
                    let negated = self.at(pos) == b'^';
                    if negated {
                        pos += 1;
                    }
                    last_sym_start = rule.len();
                    n_prev_rules = 1;
                    while self.at(pos) != b']' {
                        if self.at(pos) == 0 {
                            return Err(self.error(pos, "unexpected end of input in a character class"));
                        }
                        let (ch, next) = self.char(pos)?;
                        pos = next;
                        rule.push(if last_sym_start < rule.len() {
                            Element::CharAlt(ch)
                        } else if negated {
                            Element::CharNot(ch)
                        } else {
                            Element::Char(ch)
                        });
                        if self.at(pos) == b'-' && self.at(pos + 1) != b']' {
                            if self.at(pos + 1) == 0 {
                                return Err(self.error(pos + 1, "unexpected end of input in a character class"));
                            }
                            let (end, next) = self.char(pos + 1)?;
                            pos = next;
                            rule.push(Element::CharRngUpper(end));
                        }
                    }
                    pos = self.space(pos + 1, nested);
                }
                b'<' | b'!' => {
                    let negated = c == b'!';
                    if negated {
                        pos += 1;
                    }
                    let (id, end) = self.token(pos)?;
                    last_sym_start = rule.len();
                    n_prev_rules = 1;
                    rule.push(if negated { Element::TokenNot(id) } else { Element::Token(id) });
                    pos = self.space(end, nested);
                }
                c if is_word_char(c) => {
                    let end = self.name(pos)?;
                    let name = String::from_utf8_lossy(&self.src[pos..end]).into_owned();
                    let id = self.symbol_id(&name);
                    pos = self.space(end, nested);
                    last_sym_start = rule.len();
                    n_prev_rules = 1;
                    rule.push(Element::RuleRef(id));
                }
                b'(' => {
                    if self.depth >= MAX_NESTING {
                        return Err(self.error(pos, format!("groups nested deeper than {MAX_NESTING}")));
                    }
                    pos = self.space(pos + 1, true);
                    let n_before = self.next_id;
                    let sub_id = self.generate_symbol_id(rule_name);
                    self.depth += 1;
                    let result = self.alternates(pos, rule_name, sub_id, true);
                    self.depth -= 1;
                    pos = result?;
                    n_prev_rules = u64::from(self.next_id - n_before).max(1);
                    last_sym_start = rule.len();
                    rule.push(Element::RuleRef(sub_id));
                    if self.at(pos) != b')' {
                        return Err(self.error(pos, "expecting `)`"));
                    }
                    pos = self.space(pos + 1, nested);
                }
                b'.' => {
                    last_sym_start = rule.len();
                    n_prev_rules = 1;
                    rule.push(Element::CharAny);
                    pos = self.space(pos + 1, nested);
                }
                b'*' | b'+' | b'?' => {
                    let at = pos;
                    pos = self.space(pos + 1, nested);
                    let (min, max) = match c {
                        b'*' => (0, None),
                        b'+' => (1, None),
                        _ => (0, Some(1)),
                    };
                    self.repeat(at, rule_name, rule, last_sym_start, &mut n_prev_rules, min, max)?;
                }
                b'{' => {
                    let at = pos;
                    pos = self.space(pos + 1, nested);
                    if !self.at(pos).is_ascii_digit() {
                        return Err(self.error(pos, "expecting an integer"));
                    }
                    let (min, end) = self.int(pos)?;
                    pos = self.space(end, nested);
                    let mut max = None;
                    match self.at(pos) {
                        b'}' => {
                            max = Some(min);
                            pos = self.space(pos + 1, nested);
                        }
                        b',' => {
                            pos = self.space(pos + 1, nested);
                            if self.at(pos).is_ascii_digit() {
                                let (m, end) = self.int(pos)?;
                                max = Some(m);
                                pos = self.space(end, nested);
                            }
                            if self.at(pos) != b'}' {
                                return Err(self.error(pos, "expecting `}`"));
                            }
                            pos = self.space(pos + 1, nested);
                        }
                        _ => return Err(self.error(pos, "expecting `,` or `}`")),
                    }
                    if min > MAX_REPETITION_THRESHOLD {
                        return Err(self.error(
                            at,
                            format!("{min} repetitions exceed llama.cpp's limit of {MAX_REPETITION_THRESHOLD}"),
                        ));
                    }
                    // llama.cpp: an upper bound above the threshold means "no upper bound".
                    if max.is_some_and(|m| m > MAX_REPETITION_THRESHOLD) {
                        max = None;
                    }
                    self.repeat(at, rule_name, rule, last_sym_start, &mut n_prev_rules, min, max)?;
                }
                _ => return Ok(pos),
            }
        }
    }

    /// Rewrites the symbol at `rule[last_sym_start..]` repeated `min..=max` times (`None`: no
    /// upper bound), as llama.cpp's `handle_repetitions`.
    #[allow(clippy::too_many_arguments)]
    fn repeat(
        &mut self,
        at: usize,
        rule_name: &str,
        rule: &mut Vec<Element>,
        last_sym_start: usize,
        n_prev_rules: &mut u64,
        min: u64,
        max: Option<u64>,
    ) -> Result<()> {
        if last_sym_start == rule.len() {
            return Err(self.error(at, "expecting an item before the repetition operator"));
        }
        let prev: Vec<Element> = rule[last_sym_start..].to_vec();
        let total_rules = match max {
            Some(m) if m > 0 => m,
            _ if min > 0 => min,
            _ => 1,
        };
        if n_prev_rules.saturating_mul(total_rules) >= MAX_REPETITION_THRESHOLD {
            return Err(self.error(
                at,
                format!(
                    "this repetition expands to {} rules, more than llama.cpp's limit of {MAX_REPETITION_THRESHOLD}",
                    n_prev_rules.saturating_mul(total_rules)
                ),
            ));
        }
        if min == 0 {
            rule.truncate(last_sym_start);
        } else {
            for _ in 1..min {
                rule.extend_from_slice(&prev);
            }
        }
        let n_opt = match max {
            None => 1,
            Some(m) => m.saturating_sub(min),
        };
        let mut last_rec_id = 0;
        for i in 0..n_opt {
            let mut rec = prev.clone();
            let rec_id = self.generate_symbol_id(rule_name);
            if max.is_none() {
                rec.push(Element::RuleRef(rec_id));
            } else if i > 0 {
                rec.push(Element::RuleRef(last_rec_id));
            }
            rec.push(Element::Alt);
            rec.push(Element::End);
            self.add_rule(rec_id, rec)?;
            last_rec_id = rec_id;
        }
        if n_opt > 0 {
            rule.push(Element::RuleRef(last_rec_id));
        }
        *n_prev_rules = n_prev_rules.saturating_mul(total_rules);
        Ok(())
    }

    fn check_defined(&self) -> Result<()> {
        let defined = |id: u32| self.rules.get(id as usize).is_some_and(|r| !r.is_empty());
        for (name, &id) in &self.symbol_ids {
            if !defined(id) {
                // Find where it is used, for the position.
                let pos = find_word(self.src, name.as_bytes()).unwrap_or(0);
                return Err(self.error(pos, format!("undefined rule `{name}`")));
            }
        }
        Ok(())
    }
}

/// First occurrence of `word` as a whole rule name in `src`.
fn find_word(src: &[u8], word: &[u8]) -> Option<usize> {
    (0..src.len().saturating_sub(word.len() - 1)).find(|&i| {
        src[i..].starts_with(word)
            && (i == 0 || !is_word_char(src[i - 1]))
            && !src.get(i + word.len()).copied().is_some_and(is_word_char)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(text: &str) -> ParsedGrammar {
        parse(text, None).unwrap_or_else(|e| panic!("{text:?}: {e}"))
    }

    #[test]
    fn literal_class_and_any() {
        let g = ok("root ::= \"ab\" [x-z0] [^q] .\n");
        let root = &g.rules[g.symbol_ids["root"] as usize];
        use Element::*;
        assert_eq!(
            root,
            &[
                Char('a' as u32),
                Char('b' as u32),
                Char('x' as u32),
                CharRngUpper('z' as u32),
                CharAlt('0' as u32),
                CharNot('q' as u32),
                CharAny,
                End
            ]
        );
    }

    #[test]
    fn empty_classes_add_nothing() {
        let g = ok("root ::= [] \"a\" [^]\n");
        assert_eq!(g.rules[0], [Element::Char('a' as u32), Element::End]);
        assert!(parse("root ::= [^]*", None).is_err());
    }

    #[test]
    fn escapes() {
        let g = ok(r#"root ::= "\x41\u00e9\U0001F600\t\r\n\\\"\[\]\-""#);
        let chars: Vec<u32> =
            g.rules[0].iter().filter_map(|e| if let Element::Char(c) = e { Some(*c) } else { None }).collect();
        assert_eq!(
            chars,
            [0x41, 0xE9, 0x1F600, 9, 13, 10, '\\' as u32, '"' as u32, '[' as u32, ']' as u32, '-' as u32]
        );
        for bad in [r#"root ::= "\d""#, r#"root ::= "\/""#, r#"root ::= "\0""#, r#"root ::= "\x4""#] {
            let e = parse(bad, None).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Syntax, "{bad}");
        }
    }

    #[test]
    fn errors_have_line_and_column() {
        let e = parse("root ::= a\na ::= \"x\" )\n", None).unwrap_err();
        assert_eq!(e.position(), Some((2, 11)), "{e}");
        let e = parse("root ::= \"a\"\n| \"b\"\n", None).unwrap_err();
        assert_eq!(e.position(), Some((2, 1)), "{e}");
        let e = parse("root ::= foo\n", None).unwrap_err();
        assert!(e.to_string().contains("undefined rule `foo`"), "{e}");
        assert_eq!(e.position(), Some((1, 10)));
    }

    #[test]
    fn newlines_allowed_after_assign_bar_and_in_groups() {
        ok("root ::=\n  \"a\" |\n  \"b\" (\n \"c\"\n | \"d\")\n");
        assert!(parse("root ::= \"a\"\n  \"b\"\n", None).is_err());
    }

    #[test]
    fn repetition_rewrites_as_llama_cpp() {
        let g = ok("root ::= \"a\"{2,4}\n");
        // root ::= a a root_2 ; root_1 ::= a | ; root_2 ::= a root_1 |
        assert_eq!(g.symbol_names(), ["root", "root_1", "root_2"]);
        use Element::*;
        let a = Char('a' as u32);
        assert_eq!(g.rules[0], [a, a, RuleRef(2), End]);
        assert_eq!(g.rules[1], [a, Alt, End]);
        assert_eq!(g.rules[2], [a, RuleRef(1), Alt, End]);
    }

    #[test]
    fn repetition_limits() {
        assert!(parse("root ::= \"a\"{2001}", None).is_err());
        assert!(parse("root ::= \"a\"{0,1999}", None).is_ok());
        // An upper bound above 2000 means unbounded.
        let g = ok("root ::= \"a\"{0,5000}");
        assert_eq!(g.rules.len(), 2);
        assert!(parse("root ::= \"a\"{,3}", None).is_err());
        assert!(parse("root ::= *", None).is_err());
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let text = format!("root ::= {}\"a\"{}", "(".repeat(100_000), ")".repeat(100_000));
        let e = parse(&text, None).unwrap_err();
        assert!(e.to_string().contains("nested"), "{e}");
    }

    #[test]
    fn tokens() {
        let g = ok("root ::= <[10]> !<[11]>");
        assert_eq!(g.rules[0], [Element::Token(10), Element::TokenNot(11), Element::End]);
        let e = parse("root ::= <think>", None).unwrap_err();
        assert!(e.to_string().contains("vocabulary"), "{e}");
        struct One;
        impl TokenLookup for One {
            fn lookup(&self, text: &[u8]) -> Option<u32> {
                (text == b"<think>").then_some(7)
            }
        }
        let g = parse("root ::= <think> !<think>", Some(&One)).unwrap();
        assert_eq!(g.rules[0], [Element::Token(7), Element::TokenNot(7), Element::End]);
        assert!(parse("root ::= <nope>", Some(&One)).is_err());
        assert!(parse("root ::= <[99999999999]>", None).is_err());
    }

    #[test]
    fn last_definition_wins() {
        let g = ok("root ::= \"a\"\nroot ::= \"b\"\n");
        assert_eq!(g.rules[0], [Element::Char('b' as u32), Element::End]);
    }
}
