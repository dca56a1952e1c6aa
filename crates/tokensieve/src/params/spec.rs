//! The chain spec string of the CLI contract: stages separated by `;`, each `name` or
//! `name(arg, …, key=value, …)`.
//!
//! Values keep their source text: a float parameter is parsed with `str::parse::<f32>()` (the
//! binary32 nearest to the decimal, which is what the llama.cpp goldens passed), never through
//! f64 (double rounding). Commas inside a JSON array (`sequence_bias([[[1,2],-1.5]])`) do not
//! split arguments.

use crate::error::{Error, Result};

/// One argument as written.
#[derive(Clone, Debug, PartialEq)]
pub struct Arg {
    /// `Some("p")` for `p=0.9`, `None` for a positional argument.
    pub key: Option<String>,
    /// The value's text, trimmed.
    pub text: String,
    /// Byte offset of the argument in the spec string (for error messages).
    pub position: usize,
}

/// One stage as written: `name(args)`.
#[derive(Clone, Debug, PartialEq)]
pub struct StageSpec {
    /// The stage name.
    pub name: String,
    /// Its arguments in order.
    pub args: Vec<Arg>,
    /// Byte offset of the name in the spec string.
    pub position: usize,
}

/// Parses a whole spec string into stages. Empty stages (`a;;b`) and unbalanced brackets are
/// errors that give the byte position.
///
/// ```
/// use tokensieve::params::spec::parse;
/// let stages = parse("top_k(40);top_p(0.95, min_keep=1);dist").unwrap();
/// assert_eq!(stages.len(), 3);
/// assert_eq!(stages[1].args[1].key.as_deref(), Some("min_keep"));
/// ```
pub fn parse(spec: &str) -> Result<Vec<StageSpec>> {
    let mut stages = Vec::new();
    for (start, part) in split_top_level(spec, ';')? {
        let trimmed_start = start + (part.len() - part.trim_start().len());
        let part = part.trim();
        if part.is_empty() {
            return Err(Error::spec(start, "empty stage (two `;` in a row, or a leading/trailing `;`)"));
        }
        stages.push(parse_stage(part, trimmed_start)?);
    }
    Ok(stages)
}

fn parse_stage(text: &str, position: usize) -> Result<StageSpec> {
    let (name, args) = match text.find('(') {
        None => (text, None),
        Some(open) => {
            if !text.ends_with(')') {
                return Err(Error::spec(position + text.len(), format!("stage `{text}`: missing `)` at the end")));
            }
            (text[..open].trim_end(), Some((open + 1, &text[open + 1..text.len() - 1])))
        }
    };
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        return Err(Error::spec(position, format!("`{name}` is not a stage name")));
    }
    let mut out = Vec::new();
    if let Some((offset, inner)) = args {
        if !inner.trim().is_empty() {
            for (start, raw) in split_top_level(inner, ',')? {
                let arg_pos = position + offset + start;
                let raw_t = raw.trim();
                if raw_t.is_empty() {
                    return Err(Error::spec(arg_pos, format!("{name}: empty argument")));
                }
                let (key, value) = match raw_t.find('=') {
                    Some(eq) if !raw_t.starts_with('[') && is_key(raw_t[..eq].trim()) => {
                        (Some(raw_t[..eq].trim().to_string()), raw_t[eq + 1..].trim().to_string())
                    }
                    _ => (None, raw_t.to_string()),
                };
                if value.is_empty() {
                    return Err(Error::spec(arg_pos, format!("{name}: argument `{raw_t}` has no value")));
                }
                out.push(Arg { key, text: value, position: arg_pos });
            }
        }
    }
    Ok(StageSpec { name: name.to_string(), args: out, position })
}

fn is_key(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Splits on `sep` outside brackets and quotes; yields (byte offset, piece).
fn split_top_level(s: &str, sep: char) -> Result<Vec<(usize, &str)>> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut in_str = false;
    let mut escaped = false;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        if in_str {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => {
                depth -= 1;
                if depth < 0 {
                    return Err(Error::spec(i, format!("unbalanced `{c}`")));
                }
            }
            c if c == sep && depth == 0 => {
                out.push((start, &s[start..i]));
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    if depth != 0 || in_str {
        return Err(Error::spec(s.len(), "unclosed bracket or string"));
    }
    out.push((start, &s[start..]));
    Ok(out)
}

/// A stage's arguments bound to its parameter names (positional first, then `key=value`).
#[derive(Debug)]
pub struct Bound<'a> {
    stage: &'a StageSpec,
    values: Vec<(&'static str, Option<&'a Arg>)>,
}

impl StageSpec {
    /// Binds the arguments to `params` (the sampler's parameter names in positional order).
    /// Too many positional arguments, an unknown key, or a parameter given twice is an error.
    pub fn bind(&self, params: &[&'static str]) -> Result<Bound<'_>> {
        self.bind_with_aliases(params, &[])
    }

    /// As [`StageSpec::bind`], also accepting `alias=value` for the parameters named in
    /// `aliases` (`(alias, parameter)` pairs).
    pub fn bind_with_aliases(&self, params: &[&'static str], aliases: &[(&str, &'static str)]) -> Result<Bound<'_>> {
        let mut values: Vec<(&'static str, Option<&Arg>)> = params.iter().map(|p| (*p, None)).collect();
        let mut positional = 0;
        let mut seen_named = false;
        for arg in &self.args {
            let slot = match &arg.key {
                None => {
                    if seen_named {
                        return Err(Error::spec(
                            arg.position,
                            format!("{}: positional argument after a named one", self.name),
                        ));
                    }
                    positional += 1;
                    if positional > params.len() {
                        return Err(Error::spec(
                            arg.position,
                            format!(
                                "{}: too many arguments (takes {}: {})",
                                self.name,
                                params.len(),
                                params.join(", ")
                            ),
                        ));
                    }
                    positional - 1
                }
                Some(key) => {
                    seen_named = true;
                    let canonical = aliases.iter().find(|(alias, _)| alias == key).map_or(key.as_str(), |(_, p)| *p);
                    params.iter().position(|p| *p == canonical).ok_or_else(|| {
                        Error::spec(
                            arg.position,
                            format!("{}: unknown parameter `{key}` (parameters: {})", self.name, params.join(", ")),
                        )
                    })?
                }
            };
            if values[slot].1.is_some() {
                return Err(Error::spec(
                    arg.position,
                    format!("{}: parameter `{}` given twice", self.name, params[slot]),
                ));
            }
            values[slot].1 = Some(arg);
        }
        Ok(Bound { stage: self, values })
    }
}

impl<'a> Bound<'a> {
    /// The stage these arguments belong to.
    pub fn stage(&self) -> &'a StageSpec {
        self.stage
    }

    /// The argument bound to `name`, if given.
    pub fn arg(&self, name: &str) -> Option<&'a Arg> {
        self.values.iter().find(|(n, _)| *n == name).and_then(|(_, a)| *a)
    }

    fn required(&self, name: &str) -> Result<&'a Arg> {
        self.arg(name)
            .ok_or_else(|| Error::spec(self.stage.position, format!("{}: missing parameter `{name}`", self.stage.name)))
    }

    /// A spec error at `arg`: parameter `name` must be `what`.
    pub fn bad(&self, arg: &Arg, name: &str, what: &str) -> Error {
        Error::spec(arg.position, format!("{}: parameter `{name}` must be {what}, got `{}`", self.stage.name, arg.text))
    }

    /// An f32 parameter (`inf`/`-inf` allowed, NaN rejected); `default` when absent
    /// (`None` = required).
    pub fn f32(&self, name: &str, default: Option<f32>) -> Result<f32> {
        let arg = match (self.arg(name), default) {
            (Some(a), _) => a,
            (None, Some(d)) => return Ok(d),
            (None, None) => self.required(name)?,
        };
        match arg.text.parse::<f32>() {
            Ok(v) if !v.is_nan() => Ok(v),
            _ => Err(self.bad(arg, name, "a number")),
        }
    }

    /// An f64 parameter (a Python float: `inf`/`-inf` allowed, NaN rejected); `default` when
    /// absent (`None` = required). The transformers convention keeps parameters as the double
    /// the user wrote and rounds them to f32 where torch does.
    pub fn f64(&self, name: &str, default: Option<f64>) -> Result<f64> {
        let arg = match (self.arg(name), default) {
            (Some(a), _) => a,
            (None, Some(d)) => return Ok(d),
            (None, None) => self.required(name)?,
        };
        match arg.text.parse::<f64>() {
            Ok(v) if !v.is_nan() => Ok(v),
            _ => Err(self.bad(arg, name, "a number")),
        }
    }

    /// An integer parameter (i64); `default` when absent (`None` = required).
    pub fn i64(&self, name: &str, default: Option<i64>) -> Result<i64> {
        let arg = match (self.arg(name), default) {
            (Some(a), _) => a,
            (None, Some(d)) => return Ok(d),
            (None, None) => self.required(name)?,
        };
        arg.text.parse::<i64>().map_err(|_| self.bad(arg, name, "an integer"))
    }

    /// A list of integers (token ids): space-separated (`3 17 42`) or a JSON array
    /// (`[3,17,42]`); `None` when the parameter is absent.
    pub fn ids(&self, name: &str) -> Result<Option<Vec<i64>>> {
        let Some(arg) = self.arg(name) else { return Ok(None) };
        let text = arg.text.trim();
        let inner = match text.strip_prefix('[') {
            Some(rest) => rest.strip_suffix(']').ok_or_else(|| self.bad(arg, name, "a list of token ids"))?,
            None => text,
        };
        inner
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty())
            .map(|s| s.parse::<i64>().map_err(|_| self.bad(arg, name, "a list of integer token ids")))
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// An integer parameter (i32); `default` when absent (`None` = required).
    pub fn i32(&self, name: &str, default: Option<i32>) -> Result<i32> {
        let arg = match (self.arg(name), default) {
            (Some(a), _) => a,
            (None, Some(d)) => return Ok(d),
            (None, None) => self.required(name)?,
        };
        arg.text.parse::<i32>().map_err(|_| self.bad(arg, name, "an integer"))
    }

    /// A text parameter, if given.
    pub fn text(&self, name: &str) -> Option<&'a str> {
        self.arg(name).map(|a| a.text.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_contract_examples() {
        let s = parse("penalties(64,1.1,0,0);top_k(40);top_p(0.95,1);min_p(0.05);temperature(0.8);dist").unwrap();
        assert_eq!(
            s.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
            ["penalties", "top_k", "top_p", "min_p", "temperature", "dist"]
        );
        let s = parse("logit_bias(4:1.5 0:-inf);greedy").unwrap();
        assert_eq!(s[0].args[0].text, "4:1.5 0:-inf");
        let s = parse("top_k(5,min_tokens_to_keep=3)").unwrap();
        assert_eq!(s[0].args[1].key.as_deref(), Some("min_tokens_to_keep"));
        let s = parse("sequence_bias([[[1,2],-1.5],[[3],2]]);dist").unwrap();
        assert_eq!(s[0].args.len(), 1);
        assert_eq!(s[0].args[0].text, "[[[1,2],-1.5],[[3],2]]");
    }

    #[test]
    fn binds_positional_and_named() {
        let s = parse("top_p(0.9, min_keep=3)").unwrap();
        let b = s[0].bind(&["p", "min_keep"]).unwrap();
        assert_eq!(b.f32("p", None).unwrap(), 0.9f32);
        assert_eq!(b.i32("min_keep", Some(1)).unwrap(), 3);
    }

    #[test]
    fn errors_name_the_problem_and_position() {
        for (spec, needle) in [
            ("top_k(40", "unclosed bracket"),
            ("top_k(40)x", "missing `)`"),
            ("top_k(40);;dist", "empty stage"),
            ("top_k(1,2)", "too many arguments"),
            ("top_k(q=1)", "unknown parameter `q`"),
            ("top_k(k=1,k=2)", "given twice"),
            ("top_k(abc)", "must be an integer"),
            ("top_k()", "missing parameter `k`"),
            ("top_p(nan)", "must be a number"),
            ("top%k", "not a stage name"),
        ] {
            let err = parse(spec).and_then(|s| {
                let b = s[0].bind(&["k"])?;
                if s[0].name == "top_p" {
                    b.f32("k", None)?;
                } else {
                    b.i32("k", None)?;
                }
                Ok(())
            });
            let msg = err.unwrap_err().to_string();
            assert!(msg.contains(needle), "{spec}: {msg}");
        }
    }

    #[test]
    fn aliases_doubles_and_id_lists() {
        let s = parse("top_p(top_p=0.95, min_tokens_to_keep=2);min_length(5,eos=1 2);x(ids=[3, 4,5])").unwrap();
        let b = s[0].bind_with_aliases(&["p", "min_tokens_to_keep"], &[("top_p", "p")]).unwrap();
        // Kept as the double written, not parsed as f32.
        assert_eq!(b.f64("p", None).unwrap(), 0.95f64);
        assert_eq!(b.i64("min_tokens_to_keep", Some(1)).unwrap(), 2);
        let b = s[1].bind(&["min_length", "eos"]).unwrap();
        assert_eq!(b.ids("eos").unwrap(), Some(vec![1, 2]));
        let b = s[2].bind(&["ids"]).unwrap();
        assert_eq!(b.ids("ids").unwrap(), Some(vec![3, 4, 5]));
        assert_eq!(b.ids("nope").unwrap(), None);
        let e = s[0].bind_with_aliases(&["p", "min_tokens_to_keep"], &[]).unwrap_err().to_string();
        assert!(e.contains("unknown parameter `top_p`"), "{e}");
        let s = parse("x(a=1,b=[1,x])").unwrap();
        assert!(s[0].bind(&["a", "b"]).unwrap().ids("b").unwrap_err().to_string().contains("token ids"));
    }

    #[test]
    fn infinities_parse() {
        let s = parse("x(-inf,inf)").unwrap();
        let b = s[0].bind(&["a", "b"]).unwrap();
        assert_eq!(b.f32("a", None).unwrap(), f32::NEG_INFINITY);
        assert_eq!(b.f32("b", None).unwrap(), f32::INFINITY);
    }
}
