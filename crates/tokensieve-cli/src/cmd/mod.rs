//! The subcommands.

pub mod apply;
pub mod sample;
