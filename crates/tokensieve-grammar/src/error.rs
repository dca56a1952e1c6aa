//! The crate's error type. Every error says what went wrong and, for grammar text, where
//! (1-based line and column). Nothing in this crate aborts the process on bad input.

use std::fmt;

/// A `Result` whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What kind of failure an [`Error`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The GBNF text does not parse (position given).
    Syntax,
    /// The grammar parses but cannot be built: missing start rule, left recursion, limits.
    Build,
    /// A JSON schema the converter cannot turn into a grammar.
    Schema,
    /// A vocabulary file that cannot be read or decoded.
    Vocab,
    /// Reading a file failed.
    Io,
    /// The grammar rejects the input (a token, a byte, a prefix).
    Rejected,
    /// A parse-state or time-per-token limit was hit (pathological grammar).
    Limit,
    /// A token id outside the vocabulary, or a token reference that does not resolve.
    Token,
}

/// Everything that can go wrong in tokensieve-grammar.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    /// 1-based (line, column) in the grammar text, for syntax errors.
    position: Option<(usize, usize)>,
}

impl Error {
    /// An error of `kind` described by `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error { kind, message: message.into(), position: None }
    }
    /// A syntax error at 1-based `line` and `column` of the grammar text.
    pub fn syntax(line: usize, column: usize, message: impl Into<String>) -> Self {
        Error { kind: ErrorKind::Syntax, message: message.into(), position: Some((line, column)) }
    }
    /// The grammar cannot be built.
    pub fn build(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Build, message)
    }
    /// A JSON schema the converter cannot handle.
    pub fn schema(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Schema, message)
    }
    /// A vocabulary that cannot be read or decoded.
    pub fn vocab(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Vocab, message)
    }
    /// Reading `path` failed.
    pub fn io(path: &std::path::Path, err: std::io::Error) -> Self {
        Self::new(ErrorKind::Io, format!("cannot read {}: {err}", path.display()))
    }
    /// The grammar rejects the input.
    pub fn rejected(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Rejected, message)
    }
    /// A documented limit was hit.
    pub fn limit(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Limit, message)
    }
    /// A bad token id or token reference.
    pub fn token(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Token, message)
    }

    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
    /// The message, without the position.
    pub fn message(&self) -> &str {
        &self.message
    }
    /// 1-based (line, column) in the grammar text, for syntax errors.
    pub fn position(&self) -> Option<(usize, usize)> {
        self.position
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.position {
            Some((line, column)) => write!(f, "grammar line {line}, column {column}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for Error {}

impl From<Error> for tokensieve::Error {
    fn from(e: Error) -> Self {
        tokensieve::Error::invalid(e.to_string())
    }
}
