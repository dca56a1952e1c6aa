//! Building chains from what users write: the spec string of the CLI contract ([`spec`]).
pub mod spec;
