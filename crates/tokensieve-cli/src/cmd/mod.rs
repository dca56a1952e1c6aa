//! The subcommands.

pub mod apply;
pub mod bench;
pub mod explain;
pub mod generate;
pub mod sample;
pub mod svg;
