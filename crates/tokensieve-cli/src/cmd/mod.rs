//! The subcommands.

pub mod apply;
pub mod bench;
pub mod explain;
pub mod generate;
pub mod grammar;
pub mod sample;
pub mod svg;
