//! `pattern` (a regular expression) to GBNF, as llama.cpp translates it.
//!
//! The translation is nearly one to one, because GBNF's syntax is close to that of regular
//! expressions: literals are gathered into quoted strings, `[…]` classes and `|` pass through
//! as written, `.` becomes a `dot` rule, `*`/`+`/`?` attach to the item before them, and
//! `{m,n}` on anything but a literal moves that item into a numbered sub-rule (`name-1`, …)
//! so the repetition stays short. `(?:…)` is a plain group; lookarounds and other `(?…)`
//! groups are dropped (llama.cpp only warns). The pattern must be anchored with `^` and `$`.
//!
//! Escapes such as `\d` or `\w` are copied into the GBNF literal unchanged, as llama.cpp does;
//! GBNF has no such escapes, so a grammar holding them fails to parse later.
//!
//! Where llama.cpp misbehaves on malformed patterns (reads past the end, loops forever, or
//! silently drops the rest of the pattern after a stray `)`), this translation returns an
//! error instead.

use std::collections::HashMap;

use super::converter::Converter;
use super::json::MAX_NESTING;
use super::numeric::repetition;
use crate::error::{Error, Result};

/// Characters that end a literal run.
const NON_LITERAL: &[char] = &['|', '.', '(', ')', '[', ']', '{', '}', '*', '+', '?'];
/// Characters whose backslash escape becomes the bare character inside a GBNF literal.
const UNESCAPE_IN_LITERAL: &[char] = &['^', '$', '.', '[', ']', '(', ')', '|', '{', '}', '*', '+', '?'];

/// One item of a sequence: GBNF text, and whether it is literal text still to be quoted.
#[derive(Clone, Debug)]
struct Item {
    text: String,
    literal: bool,
}

impl Item {
    fn rule(text: String) -> Item {
        Item { text, literal: false }
    }

    /// The item as GBNF: literal text is quoted.
    fn to_gbnf(&self) -> String {
        if self.literal {
            format!("\"{}\"", self.text)
        } else {
            self.text.clone()
        }
    }
}

fn pattern_error(pattern: &str, what: &str) -> Error {
    let shown: String = pattern.chars().take(120).collect();
    let ellipsis = if shown.len() < pattern.len() { "..." } else { "" };
    Error::schema(format!("cannot translate pattern /{shown}{ellipsis}/: {what}"))
}

struct PatternTranslator<'c> {
    converter: &'c mut Converter,
    /// The pattern between `^` and `$`.
    chars: Vec<char>,
    pos: usize,
    /// The rule the pattern becomes; sub-rules are named after it.
    name: String,
    /// Sub-rules made for `{m,n}` repetitions, by their GBNF text.
    sub_rules: HashMap<String, String>,
    /// The whole pattern, for error messages.
    pattern: String,
}

impl Converter {
    /// Translates `pattern` into a rule named `name` that matches a JSON string whose content
    /// matches the pattern. Returns the rule's name.
    pub(super) fn visit_pattern(&mut self, pattern: &str, name: &str) -> Result<String> {
        let chars: Vec<char> = pattern.chars().collect();
        if chars.len() < 2 || chars.first() != Some(&'^') || chars.last() != Some(&'$') {
            return Err(pattern_error(pattern, "a pattern must start with '^' and end with '$'"));
        }
        let mut translator = PatternTranslator {
            converter: self,
            chars: chars[1..chars.len() - 1].to_vec(),
            pos: 0,
            name: name.to_owned(),
            sub_rules: HashMap::new(),
            pattern: pattern.to_owned(),
        };
        let body = translator.sequence(0)?;
        Ok(self.add_rule(name, &format!("\"\\\"\" ({}) \"\\\"\" space", body.to_gbnf())))
    }
}

impl PatternTranslator<'_> {
    fn error(&self, what: &str) -> Error {
        pattern_error(&self.pattern, what)
    }

    fn at(&self, i: usize) -> Option<char> {
        self.chars.get(i).copied()
    }

    /// Reads items up to the `)` that closes the current group (consumed) or the end of the
    /// pattern, and joins them into one non-literal item.
    fn sequence(&mut self, depth: usize) -> Result<Item> {
        if depth > MAX_NESTING {
            return Err(self.error(&format!("groups nest deeper than {MAX_NESTING} levels")));
        }
        let mut seq: Vec<Item> = Vec::new();
        while let Some(c) = self.at(self.pos) {
            match c {
                '.' => {
                    let dot = self.converter.dot_rule();
                    seq.push(Item::rule(dot));
                    self.pos += 1;
                }
                '(' => {
                    self.pos += 1;
                    if self.at(self.pos) == Some('?') {
                        if self.at(self.pos + 1) == Some(':') {
                            // (?:…) is an ordinary group here.
                            self.pos += 2;
                        } else {
                            // Lookaround and other (?…) groups are not supported; llama.cpp
                            // warns and drops them.
                            self.skip_group();
                            continue;
                        }
                    }
                    let inner = self.sequence(depth + 1)?;
                    seq.push(Item::rule(format!("({})", inner.to_gbnf())));
                }
                ')' => {
                    if depth == 0 {
                        return Err(self.error("unbalanced ')'"));
                    }
                    self.pos += 1;
                    return Ok(join(seq));
                }
                '[' => {
                    let class = self.class()?;
                    seq.push(Item::rule(class));
                }
                '|' => {
                    seq.push(Item::rule("|".to_owned()));
                    self.pos += 1;
                }
                '*' | '+' | '?' => {
                    let Some(last) = seq.last_mut() else {
                        return Err(self.error(&format!("'{c}' has nothing to repeat")));
                    };
                    *last = Item::rule(format!("{}{c}", last.to_gbnf()));
                    self.pos += 1;
                }
                '{' => {
                    let (min, max) = self.braces()?;
                    let Some(last) = seq.pop() else {
                        return Err(self.error("'{' has nothing to repeat"));
                    };
                    let item = if last.literal { last.to_gbnf() } else { self.sub_rule(last.text) };
                    seq.push(Item::rule(repetition(&item, min, max, None)));
                }
                _ => {
                    let literal = self.literal()?;
                    if literal.is_empty() {
                        return Err(self.error(&format!("unbalanced '{c}'")));
                    }
                    seq.push(Item { text: literal, literal: true });
                }
            }
        }
        Ok(join(seq))
    }

    /// Skips an unsupported `(?…)` group; `pos` is just after its `(`.
    fn skip_group(&mut self) {
        let mut depth = 1usize;
        while depth > 0 {
            match self.at(self.pos) {
                None => break,
                Some('\\') if self.pos + 1 < self.chars.len() => self.pos += 2,
                Some(c) => {
                    if c == '(' {
                        depth += 1;
                    } else if c == ')' {
                        depth -= 1;
                    }
                    self.pos += 1;
                }
            }
        }
    }

    /// A `[…]` class, copied as written (escaped characters included).
    fn class(&mut self) -> Result<String> {
        let mut class = String::from("[");
        self.pos += 1;
        loop {
            match self.at(self.pos) {
                None => return Err(self.error("unbalanced '['")),
                Some(']') => break,
                Some('\\') => {
                    class.push('\\');
                    if let Some(next) = self.at(self.pos + 1) {
                        class.push(next);
                    }
                    self.pos += 2;
                }
                Some(c) => {
                    class.push(c);
                    self.pos += 1;
                }
            }
        }
        class.push(']');
        self.pos += 1;
        Ok(class)
    }

    /// A `{m}`, `{m,}`, `{,n}` or `{m,n}` quantifier: `(min, max)`, `None` for no maximum.
    fn braces(&mut self) -> Result<(u64, Option<u64>)> {
        self.pos += 1;
        let mut inner = String::new();
        loop {
            match self.at(self.pos) {
                None => return Err(self.error("unbalanced '{'")),
                Some('}') => break,
                Some(c) => {
                    inner.push(c);
                    self.pos += 1;
                }
            }
        }
        self.pos += 1;
        let parts: Vec<&str> = inner.split(',').collect();
        let number = |s: &str| -> Result<u64> {
            match parse_c_int(s) {
                Some(Ok(n)) => u64::try_from(n).map_err(|_| self.error(&format!("negative count in {{{inner}}}"))),
                Some(Err(())) => Err(self.error(&format!("count out of range in {{{inner}}}"))),
                None => Err(self.error(&format!("invalid number in {{{inner}}}"))),
            }
        };
        match parts.as_slice() {
            [exact] => {
                let n = number(exact)?;
                Ok((n, Some(n)))
            }
            [min, max] => {
                let min = if min.is_empty() { 0 } else { number(min)? };
                // i32::MAX is llama.cpp's "no maximum".
                let max = if max.is_empty() { None } else { Some(number(max)?).filter(|&m| m != i32::MAX as u64) };
                Ok((min, max))
            }
            _ => Err(self.error(&format!("wrong number of values in {{{inner}}}"))),
        }
    }

    /// The sub-rule holding `text`, made on first use and named `name-1`, `name-2`, ….
    fn sub_rule(&mut self, text: String) -> String {
        if let Some(id) = self.sub_rules.get(&text) {
            return id.clone();
        }
        let name = format!("{}-{}", self.name, self.sub_rules.len() + 1);
        let id = self.converter.add_rule(&name, &text);
        self.sub_rules.insert(text, id.clone());
        id
    }

    /// A run of literal characters, ready to sit between GBNF quotes. Empty when the
    /// character at `pos` cannot start a literal.
    fn literal(&mut self) -> Result<String> {
        let len = self.chars.len();
        let mut literal = String::new();
        while let Some(c) = self.at(self.pos) {
            let next = self.at(self.pos + 1);
            if c == '\\' {
                let Some(next) = next else {
                    return Err(self.error("the pattern ends with a lone '\\'"));
                };
                if !UNESCAPE_IN_LITERAL.contains(&next) {
                    literal.push('\\');
                }
                literal.push(next);
                self.pos += 2;
            } else if c == '"' {
                literal.push_str("\\\"");
                self.pos += 1;
            } else if !NON_LITERAL.contains(&c)
                && (self.pos + 1 == len
                    || literal.is_empty()
                    || next == Some('.')
                    || next.is_some_and(|n| !NON_LITERAL.contains(&n)))
            {
                // A character followed by a quantifier is left for a literal of its own, so
                // the quantifier applies to it alone.
                literal.push(c);
                self.pos += 1;
            } else {
                break;
            }
        }
        Ok(literal)
    }
}

/// Joins a sequence into one item, merging neighbouring literals into one quoted string.
fn join(seq: Vec<Item>) -> Item {
    let mut parts: Vec<String> = Vec::new();
    let mut literal = String::new();
    for item in seq {
        if item.literal {
            literal.push_str(&item.text);
        } else {
            if !literal.is_empty() {
                parts.push(format!("\"{literal}\""));
                literal.clear();
            }
            parts.push(item.text);
        }
    }
    if !literal.is_empty() {
        parts.push(format!("\"{literal}\""));
    }
    Item::rule(parts.join(" "))
}

/// C's `stoi`: optional leading whitespace and sign, then at least one digit; anything after
/// the digits is ignored. `None` when there is no number, `Some(Err)` when it overflows `i32`.
fn parse_c_int(s: &str) -> Option<std::result::Result<i64, ()>> {
    let s = s.trim_start_matches([' ', '\t', '\n', '\r', '\x0B', '\x0C']);
    let (negative, rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let digits: &str = &rest[..rest.bytes().take_while(u8::is_ascii_digit).count()];
    if digits.is_empty() {
        return None;
    }
    let value = match digits.parse::<i64>() {
        Ok(v) if v <= i64::from(i32::MAX) + 1 => v,
        _ => return Some(Err(())),
    };
    let value = if negative { -value } else { value };
    if value > i64::from(i32::MAX) || value < i64::from(i32::MIN) {
        return Some(Err(()));
    }
    Some(Ok(value))
}

#[cfg(test)]
mod tests {
    use super::parse_c_int;

    #[test]
    fn c_int() {
        assert_eq!(parse_c_int(" 3 "), Some(Ok(3)));
        assert_eq!(parse_c_int("3a"), Some(Ok(3)));
        assert_eq!(parse_c_int("-2"), Some(Ok(-2)));
        assert_eq!(parse_c_int("+7"), Some(Ok(7)));
        assert_eq!(parse_c_int(""), None);
        assert_eq!(parse_c_int("x"), None);
        assert_eq!(parse_c_int("99999999999"), Some(Err(())));
        assert_eq!(parse_c_int("99999999999999999999999"), Some(Err(())));
    }
}
