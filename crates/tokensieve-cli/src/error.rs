//! Exit statuses: 2 for bad input (anything the user typed or passed), 1 for internal failures.
//! Errors travel as `anyhow::Error`; bad input is marked with [`BadInput`] or is a
//! `tokensieve::Error` that says so.

use std::fmt;

/// Marks an error as caused by the user's input (exit status 2).
#[derive(Debug)]
pub struct BadInput(pub String);

impl fmt::Display for BadInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadInput {}

/// Not an error: the command has printed its verdict (`grammar match` says `rejected` or
/// `incomplete`) and exits with this status, without an `error:` line.
#[derive(Debug)]
pub struct Verdict(pub u8);

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "exit status {}", self.0)
    }
}

impl std::error::Error for Verdict {}

/// A bad-input error with this message.
pub fn bad(message: impl Into<String>) -> anyhow::Error {
    BadInput(message.into()).into()
}

/// Wraps a library error (already a value that says whether it is bad input) with context.
pub fn lib(context: impl fmt::Display, e: tokensieve::Error) -> anyhow::Error {
    anyhow::Error::new(e).context(context.to_string())
}

/// The exit status for an error.
pub fn exit_code(e: &anyhow::Error) -> i32 {
    for cause in e.chain() {
        if cause.is::<BadInput>() {
            return 2;
        }
        if let Some(te) = cause.downcast_ref::<tokensieve::Error>() {
            return if te.is_bad_input() { 2 } else { 1 };
        }
    }
    1
}

/// The one-line message: the context chain joined with ": ", newlines flattened.
pub fn one_line(e: &anyhow::Error) -> String {
    format!("{e:#}").replace(['\r', '\n'], " ")
}
