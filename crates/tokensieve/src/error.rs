//! The crate's error type: an opaque struct around a private kind, so new cases can be added
//! without breaking callers. Every message says what went wrong and where (parameter name,
//! token id, position in a spec string).

use std::fmt;

/// A `Result` whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in tokensieve. Inspect it with [`Error::is_bad_input`] or its
/// `Display` text; the variants are private so that new ones are not breaking changes.
#[derive(Clone, Debug, PartialEq)]
pub struct Error {
    kind: ErrorKind,
}

#[derive(Clone, Debug, PartialEq)]
enum ErrorKind {
    EmptyRow,
    NonFiniteLogit { token: usize, value: f32 },
    NoCandidates { stage: &'static str },
    Parameter { stage: String, name: String, message: String },
    Chain(String),
    Spec { position: usize, message: String },
    Field { field: String, message: String },
    Invalid(String),
    Internal(String),
    TokenOutOfRange { what: &'static str, token: i64, vocab: usize },
}

impl Error {
    pub(crate) fn empty_row() -> Self {
        Error { kind: ErrorKind::EmptyRow }
    }
    pub(crate) fn non_finite_logit(token: usize, value: f32) -> Self {
        Error { kind: ErrorKind::NonFiniteLogit { token, value } }
    }
    pub(crate) fn no_candidates(stage: &'static str) -> Self {
        Error { kind: ErrorKind::NoCandidates { stage } }
    }
    /// A sampler parameter outside its domain: `stage` is the sampler's name, `name` the parameter's.
    pub fn parameter(stage: impl Into<String>, name: impl Into<String>, message: impl Into<String>) -> Self {
        Error { kind: ErrorKind::Parameter { stage: stage.into(), name: name.into(), message: message.into() } }
    }
    /// A broken invariant of tokensieve itself (a bug), not of the input.
    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Error { kind: ErrorKind::Internal(message.into()) }
    }
    pub(crate) fn chain(message: impl Into<String>) -> Self {
        Error { kind: ErrorKind::Chain(message.into()) }
    }
    pub(crate) fn spec(position: usize, message: impl Into<String>) -> Self {
        Error { kind: ErrorKind::Spec { position, message: message.into() } }
    }
    /// A JSON body field that is unknown, of the wrong type or out of range.
    pub fn field(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error { kind: ErrorKind::Field { field: field.into(), message: message.into() } }
    }
    /// Invalid input described by `message` alone (data of the wrong shape, a malformed
    /// request body, an unsupported option).
    pub fn invalid(message: impl Into<String>) -> Self {
        Error { kind: ErrorKind::Invalid(message.into()) }
    }
    /// A token id outside `0..vocab` where one must be valid (`what` says where it came from).
    pub fn token_out_of_range(what: &'static str, token: i64, vocab: usize) -> Self {
        Error { kind: ErrorKind::TokenOutOfRange { what, token, vocab } }
    }

    /// True for errors caused by the caller's input (parameters, logits, spec strings, JSON),
    /// false for internal failures. The CLI maps the first to exit status 2.
    pub fn is_bad_input(&self) -> bool {
        !matches!(self.kind, ErrorKind::Internal(_))
    }

    /// True when a token had to be selected but every candidate was masked (`-inf`).
    pub fn is_no_candidates(&self) -> bool {
        matches!(self.kind, ErrorKind::NoCandidates { .. })
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ErrorKind::EmptyRow => write!(f, "the logits row is empty (vocabulary size 0)"),
            ErrorKind::NonFiniteLogit { token, value } => {
                write!(f, "logit of token {token} is {value}; logits must be finite or -inf")
            }
            ErrorKind::NoCandidates { stage } => {
                write!(f, "{stage}: no candidate left to select (every logit is -inf after the previous stages)")
            }
            ErrorKind::Parameter { stage, name, message } => write!(f, "{stage}: parameter `{name}` {message}"),
            ErrorKind::Chain(message) => write!(f, "invalid chain: {message}"),
            ErrorKind::Spec { position, message } => write!(f, "chain spec, at byte {position}: {message}"),
            ErrorKind::Field { field, message } => write!(f, "field `{field}`: {message}"),
            ErrorKind::Invalid(message) => write!(f, "{message}"),
            ErrorKind::Internal(message) => write!(f, "internal error (please report): {message}"),
            ErrorKind::TokenOutOfRange { what, token, vocab } => {
                write!(f, "{what}: token id {token} is out of range for a vocabulary of {vocab}")
            }
        }
    }
}

impl std::error::Error for Error {}
