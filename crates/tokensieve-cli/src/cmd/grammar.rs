//! `tokensieve grammar check | match | mask`.

use crate::args::{CheckArgs, GrammarArgs, GrammarCommand, MaskArgs, MatchArgs, SourceArgs};
use crate::error::{bad, Verdict};
use crate::grammar::{load_vocab, quote_bytes, GrammarSource};
use crate::input::load_ids;
use anyhow::{anyhow, Result};
use serde::Serialize;
use std::io::Write;
use std::sync::Arc;
use tokensieve_grammar::vocab::Vocab;
use tokensieve_grammar::{ErrorKind, Grammar, Matcher, TokenIndex};

/// How many allowed tokens the `mask` table shows.
const SHOWN: usize = 20;

/// Runs `grammar …`.
pub fn run(args: &GrammarArgs) -> Result<()> {
    match &args.command {
        GrammarCommand::Check(a) => check(a),
        GrammarCommand::Match(a) => matches(a),
        GrammarCommand::Mask(a) => mask(a),
    }
}

fn source(args: &SourceArgs) -> Result<GrammarSource> {
    match (&args.file, &args.json_schema) {
        (Some(path), _) => GrammarSource::gbnf_file(path),
        (None, Some(path)) => GrammarSource::schema_file(path),
        (None, None) => Err(bad("give a grammar file (FILE.gbnf, - for standard input) or --json-schema SCHEMA.json")),
    }
}

fn compile(args: &SourceArgs, vocab: Option<&Vocab>) -> Result<(GrammarSource, Grammar)> {
    let source = source(args)?;
    let grammar = source.compile(Some(&args.root), vocab)?;
    Ok((source, grammar))
}

fn check(args: &CheckArgs) -> Result<()> {
    let vocab = args.vocab.as_deref().map(|p| load_vocab(p, "--vocab")).transpose()?;
    let (source, grammar) = compile(&args.source, vocab.as_ref())?;
    // Building the start state runs the grammar's first expansion (limits included).
    Matcher::new(&grammar).map_err(|e| bad(format!("{}: {e}", source.origin())))?;
    let mut out = std::io::stdout().lock();
    if args.print {
        let gbnf = source.gbnf()?;
        out.write_all(gbnf.as_bytes())?;
        if !gbnf.ends_with('\n') {
            out.write_all(b"\n")?;
        }
    } else {
        writeln!(
            out,
            "ok: {}: {} rules, {} elements, start symbol `{}`",
            source.origin(),
            grammar.n_rules(),
            grammar.n_elements(),
            args.source.root
        )?;
    }
    out.flush()?;
    Ok(())
}

/// Where and why the grammar stopped accepting a text.
struct Rejection {
    /// Byte offset of the first character that no parse accepts.
    byte: usize,
    reason: String,
}

/// Feeds `bytes` to `matcher` one byte at a time, so that a rejection is located at the start
/// of the character no parse accepts.
fn feed(matcher: &mut Matcher, bytes: &[u8]) -> Result<Option<Rejection>> {
    let mut char_start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if !matcher.has_partial_char() {
            char_start = i;
        }
        if let Err(e) = matcher.accept_bytes(&[b]) {
            if e.kind() != ErrorKind::Rejected {
                return Err(bad(e.to_string()));
            }
            let reason = match std::str::from_utf8(&bytes[char_start..=i]) {
                Err(_) => "invalid UTF-8".to_string(),
                Ok(c) => {
                    let before = String::from_utf8_lossy(&bytes[..char_start]);
                    let tail: String = {
                        let chars: Vec<char> = before.chars().rev().take(24).collect();
                        chars.into_iter().rev().collect()
                    };
                    if char_start == 0 {
                        format!("the grammar does not start with {c:?}")
                    } else {
                        format!("{c:?} is not allowed after {tail:?}")
                    }
                }
            };
            return Ok(Some(Rejection { byte: char_start, reason }));
        }
    }
    Ok(None)
}

fn matches(args: &MatchArgs) -> Result<()> {
    let (_, grammar) = compile(&args.source, None)?;
    let text = match (&args.text, &args.text_file) {
        (Some(text), _) => text.as_bytes().to_vec(),
        (None, Some(path)) => {
            std::fs::read(path).map_err(|e| bad(format!("--text-file: cannot read {}: {e}", path.display())))?
        }
        (None, None) => return Err(bad("give the text with --text STRING or --text-file PATH")),
    };
    let mut matcher = Matcher::new(&grammar).map_err(|e| bad(e.to_string()))?;
    let rejection = feed(&mut matcher, &text)?;
    let mut out = std::io::stdout().lock();
    let status = match rejection {
        Some(r) => {
            writeln!(out, "rejected at byte {}: {}", r.byte, r.reason)?;
            1
        }
        None if matcher.has_partial_char() => {
            writeln!(out, "incomplete: the text ends inside a UTF-8 character")?;
            1
        }
        None if !matcher.is_complete() => {
            writeln!(out, "incomplete: the text is a valid prefix, but the grammar expects more")?;
            1
        }
        None => {
            writeln!(out, "accepted")?;
            0
        }
    };
    out.flush()?;
    if status == 0 {
        Ok(())
    } else {
        Err(Verdict(status).into())
    }
}

#[derive(Serialize)]
struct MaskJson<'a> {
    allowed: &'a [u32],
    count: usize,
    complete: bool,
}

fn mask(args: &MaskArgs) -> Result<()> {
    let vocab = load_vocab(&args.vocab, "--vocab")?;
    let (_, grammar) = compile(&args.source, Some(&vocab))?;
    let index = Arc::new(TokenIndex::from_vocab(&vocab));
    let mut matcher = Matcher::with_vocab(&grammar, index).map_err(|e| bad(e.to_string()))?;
    if let Some(prefix) = &args.prefix {
        if let Some(r) = feed(&mut matcher, prefix.as_bytes())? {
            return Err(anyhow!("--prefix: rejected at byte {}: {}", r.byte, r.reason));
        }
    }
    let ids = load_ids(args.prefix_tokens.as_deref(), vocab.len(), "--prefix-tokens")?;
    for (i, &id) in ids.iter().enumerate() {
        if let Err(e) = matcher.accept_token(id) {
            if e.kind() != ErrorKind::Rejected {
                return Err(bad(format!("--prefix-tokens: token index {i} (id {id}): {e}")));
            }
            let text = quote_bytes(vocab.get(id).unwrap_or_default());
            return Err(anyhow!("--prefix-tokens: rejected at token index {i} (id {id}, {text}): {}", e.message()));
        }
    }
    let allowed = matcher.allowed_tokens().map_err(|e| bad(e.to_string()))?;
    let complete = matcher.is_complete();
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer(&mut out, &MaskJson { allowed: &allowed, count: allowed.len(), complete })?;
        out.write_all(b"\n")?;
    } else {
        writeln!(
            out,
            "{} of {} tokens allowed; the text so far is {}",
            allowed.len(),
            vocab.len(),
            if complete { "a complete sentence (end-of-generation tokens allowed)" } else { "not a complete sentence" }
        )?;
        if !allowed.is_empty() {
            writeln!(out, "{:>8}  text", "id")?;
        }
        for &id in allowed.iter().take(SHOWN) {
            let eog = if vocab.is_eog(id) { "  (end of generation)" } else { "" };
            writeln!(out, "{id:>8}  {}{eog}", quote_bytes(vocab.get(id).unwrap_or_default()))?;
        }
        if allowed.len() > SHOWN {
            writeln!(out, "     ... and {} more (--json lists them all)", allowed.len() - SHOWN)?;
        }
    }
    out.flush()?;
    Ok(())
}
