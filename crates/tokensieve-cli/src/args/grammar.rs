//! `tokensieve grammar …` and the grammar flags of `sample` and `generate`.

use clap::{ArgGroup, Args, Subcommand, ValueEnum};
use std::path::PathBuf;

/// `--grammar`, `--json-schema` and `--grammar-mode` of `sample` and `generate`.
#[derive(Debug, Args)]
pub struct ConstraintArgs {
    /// Constrain every sampled token to this GBNF grammar (llama.cpp's grammar language; `-`
    /// reads standard input). The grammar starts at the first sampled token: --history and the
    /// prompt are not fed to it. Once it is complete, only end-of-generation tokens are allowed.
    #[arg(long, value_name = "FILE.gbnf", conflicts_with = "json_schema")]
    pub grammar: Option<PathBuf>,
    /// Constrain the output to JSON valid under this JSON schema (converted to GBNF as
    /// llama.cpp's server converts `json_schema`).
    #[arg(long, value_name = "SCHEMA.json")]
    pub json_schema: Option<PathBuf>,
    /// How the grammar meets the chain: masked (mask the row first: exact, llama.cpp's
    /// grammar_first) or fast (run the chain unmasked, check the chosen token, redo it masked
    /// only if the grammar rejects it: llama.cpp's default).
    #[arg(long, value_enum, value_name = "MODE", default_value_t = GrammarModeArg::Masked)]
    pub grammar_mode: GrammarModeArg,
    /// The grammar's start symbol (llama.cpp's `grammar_root`).
    #[arg(long, value_name = "NAME", default_value = "root")]
    pub grammar_root: String,
}

/// `--grammar-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GrammarModeArg {
    /// Mask the row, then run the chain (exact).
    Masked,
    /// Check only the sampled token; mask and resample when it is rejected.
    Fast,
}

/// `tokensieve grammar`.
#[derive(Debug, Args)]
pub struct GrammarArgs {
    /// What to do with the grammar.
    #[command(subcommand)]
    pub command: GrammarCommand,
}

/// The `grammar` subcommands.
#[derive(Debug, Subcommand)]
pub enum GrammarCommand {
    /// Parse and check a grammar; print its size.
    #[command(after_help = CHECK_EXAMPLES)]
    Check(CheckArgs),
    /// Is a text a sentence of the grammar? Exit 0: accepted; 1: rejected (with the byte
    /// offset) or incomplete (a valid prefix).
    #[command(name = "match", after_help = MATCH_EXAMPLES)]
    Match(MatchArgs),
    /// The tokens the grammar allows after a prefix (text or token ids).
    #[command(after_help = MASK_EXAMPLES)]
    Mask(MaskArgs),
}

const CHECK_EXAMPLES: &str = "\
Examples:
  tokensieve grammar check json.gbnf
  tokensieve grammar check --json-schema schema.json --print     # the GBNF llama.cpp would use
  tokensieve grammar check tool.gbnf --vocab model.gguf          # resolves <|token|> references

A syntax error prints `error: FILE:LINE:COL: message` and exits with status 2.";

const MATCH_EXAMPLES: &str = "\
Examples:
  tokensieve grammar match json.gbnf --text '{\"a\": [1, 2]}'     # accepted (exit 0)
  tokensieve grammar match json.gbnf --text '{\"a\": }'           # rejected at byte 6: ... (exit 1)
  tokensieve grammar match --json-schema schema.json --text-file answer.json";

const MASK_EXAMPLES: &str = "\
Examples:
  tokensieve grammar mask json.gbnf --vocab tokenizer.json --prefix '{\"a\": '
  tokensieve grammar mask json.gbnf --vocab model.gguf --prefix-tokens 90,64 --json

--json prints one object: {\"allowed\": [ids…], \"count\": n, \"complete\": bool} (complete: the prefix is
already a sentence, so end-of-generation tokens are allowed). A prefix the grammar rejects exits with
status 1 and says where (byte offset, or token index).";

/// The grammar a `grammar` subcommand works on.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("grammar_source").required(true).args(["file", "json_schema"])))]
pub struct SourceArgs {
    /// The grammar: a GBNF file (- for standard input).
    #[arg(value_name = "FILE.gbnf")]
    pub file: Option<PathBuf>,
    /// A JSON schema instead of FILE.gbnf, converted to GBNF as llama.cpp does.
    #[arg(long, value_name = "SCHEMA.json", conflicts_with = "file")]
    pub json_schema: Option<PathBuf>,
    /// The start symbol.
    #[arg(long, value_name = "NAME", default_value = "root")]
    pub root: String,
}

/// `tokensieve grammar check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub source: SourceArgs,
    /// A vocabulary (GGUF, or a Hugging Face tokenizer.json) to resolve `<text>` token
    /// references.
    #[arg(long, value_name = "VOCAB")]
    pub vocab: Option<PathBuf>,
    /// Print the GBNF text (for --json-schema: the converted grammar) instead of the summary.
    #[arg(long)]
    pub print: bool,
}

/// `tokensieve grammar match`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("text_source").required(true).args(["text", "text_file"])))]
pub struct MatchArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub source: SourceArgs,
    /// The text to match.
    #[arg(long, value_name = "STRING", allow_hyphen_values = true)]
    pub text: Option<String>,
    /// Match the bytes of this file (all of them: a final newline is part of the text).
    #[arg(long, value_name = "PATH", conflicts_with = "text")]
    pub text_file: Option<PathBuf>,
}

/// `tokensieve grammar mask`.
#[derive(Debug, Args)]
pub struct MaskArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub source: SourceArgs,
    /// The vocabulary: a GGUF file (a model, or a vocabulary-only file) or a Hugging Face
    /// tokenizer.json.
    #[arg(long, value_name = "VOCAB")]
    pub vocab: PathBuf,
    /// Text already generated [default: none, the start of the grammar].
    #[arg(long, value_name = "STRING", allow_hyphen_values = true)]
    pub prefix: Option<String>,
    /// Tokens already generated: comma-separated ids or a .npy of integers.
    #[arg(long, value_name = "IDS", allow_hyphen_values = true, conflicts_with = "prefix")]
    pub prefix_tokens: Option<String>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}
