//! The `tokensieve` command. See `tokensieve --help` and ARCHITECTURE.md's CLI contract.
#![forbid(unsafe_code)]

mod args;
mod cmd;
mod error;
mod grammar;
mod input;
#[cfg(feature = "model")]
mod model;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match args::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return clap_error(e),
    };
    // Nothing a user types should panic; if a bug does, report it on one line, status 1.
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
        eprintln!("error: internal failure (a bug in tokensieve){at}: {msg}");
    }));
    let result = std::panic::catch_unwind(|| match &cli.command {
        args::Command::Apply(a) => cmd::apply::run(a),
        args::Command::Sample(a) => cmd::sample::run(a),
        args::Command::Generate(a) => cmd::generate::run(a),
        args::Command::Explain(a) => cmd::explain::run(a),
        args::Command::Bench(a) => cmd::bench::run(a),
        args::Command::Grammar(a) => cmd::grammar::run(a),
    });
    match result {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Ok(Err(e)) if e.is::<error::Verdict>() => ExitCode::from(e.downcast_ref::<error::Verdict>().map_or(1, |v| v.0)),
        Ok(Err(e)) => {
            eprintln!("error: {}", error::one_line(&e));
            ExitCode::from(error::exit_code(&e) as u8)
        }
        Err(_) => ExitCode::from(1),
    }
}

/// Help and version go to stdout with status 0; every other clap error becomes one
/// `error:` line with status 2.
fn clap_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            ExitCode::SUCCESS
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            ExitCode::from(2)
        }
        _ => {
            // clap's first paragraph, on one line (a missing argument is listed below it).
            let text = e.render().to_string();
            let first: Vec<&str> = text
                .lines()
                .skip_while(|l| l.trim().is_empty())
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            let first = first.join(" ");
            let first = first.strip_prefix("error: ").unwrap_or(&first);
            eprintln!("error: {first} (see --help)");
            ExitCode::from(2)
        }
    }
}

/// `tokensieve sample … | head` closes stdout early: not an error.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
}
