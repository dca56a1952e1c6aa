//! Command-line arguments (clap derive). The flags are the CLI contract of ARCHITECTURE.md:
//! extend, don't break.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// Turns LLM logits into the next token, exact to llama.cpp.
#[derive(Debug, Parser)]
#[command(name = "tokensieve", version, after_help = TOP_EXAMPLES)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

const TOP_EXAMPLES: &str = "\
Examples:
  tokensieve sample --example --n 5 --logprobs 5 --seed 42
  tokensieve sample --chain 'top_k(40);temperature(0.8);dist' --logits row.npy
  tokensieve apply  --chain 'top_k(40);top_p(0.95,1)' --logits row.npy --out processed.npy

Bad input prints one `error:` line and exits with status 2 (1 for internal failures).";

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the chain once over each row and write the processed logits (-inf = removed).
    #[command(after_help = APPLY_EXAMPLES)]
    Apply(ApplyArgs),
    /// Sample tokens and print one JSON object per token on stdout.
    #[command(after_help = SAMPLE_EXAMPLES)]
    Sample(SampleArgs),
}

const APPLY_EXAMPLES: &str = "\
Examples:
  # llama.cpp's default filters on one row, with a history for the penalties:
  tokensieve apply --chain 'penalties(64,1.1,0,0);top_k(40);top_p(0.95,1);min_p(0.05);temperature(0.8)' \\
                   --logits row.npy --history 12,7,7 --out processed.npy
  # The chain a llama.cpp server / OpenAI request body stands for, on a [B, V] batch of f16 logits:
  tokensieve apply --params body.json --logits batch_f16.npy --out processed.npy
  # bf16 logits stored as uint16, llama.cpp's random stream (XTC draws):
  tokensieve apply --chain 'top_k(40);xtc(0.5,0.1,1)' --logits row_bf16.npy --dtype bf16 \\
                   --rng mt19937 --seed 42 --out processed.npy

OUT.npy is f32 with the input's shape: the processed logits in vocabulary order, -inf for every
token the chain removed. A final selecting stage (dist, greedy, mirostat, ...) is optional; it
runs, but the token it picks is not part of the output.";

const SAMPLE_EXAMPLES: &str = "\
Examples:
  # The built-in example row (SmolLM2-135M after \"The capital of France is\"), llama.cpp's default chain:
  tokensieve sample --example --n 5 --logprobs 5 --seed 42
  # A custom chain, llama.cpp's exact token stream for seed 42:
  tokensieve sample --chain 'top_k(40);top_p(0.95,1);min_p(0.05,1);temperature(0.8);dist' \\
                    --logits row.npy --rng mt19937 --seed 42 --n 8
  # An OpenAI or llama.cpp server request body:
  echo '{\"temperature\": 0.7, \"top_p\": 0.9, \"logprobs\": true, \"top_logprobs\": 3}' > body.json
  tokensieve sample --params body.json --logits batch.npy

Each line: {\"row\", \"step\", \"token\", \"logprob\", \"top_logprobs\": [{\"token\", \"logprob\"}, ...]}.
logprob is the raw log-softmax of the input row unless --logprobs-mode processed; -inf is printed as
the lowest finite f32 (-3.4028235e38), as llama.cpp's server does. For a [B, V] input each row is its
own sequence (Philox sequence id = row). The same row is sampled --n times, each token accepted
before the next step (penalties see it).";

/// Where the chain comes from, and how it draws.
#[derive(Debug, Args)]
pub struct ChainArgs {
    /// Chain spec, e.g. 'top_k(40);top_p(0.95,1);temperature(0.8);dist'. Without --chain or
    /// --params: llama.cpp's default chain (common_sampler_init with default parameters).
    #[arg(long, value_name = "SPEC", conflicts_with = "params")]
    pub chain: Option<String>,

    /// A request body (JSON): llama.cpp server /completion fields, OpenAI fields, or both.
    /// The chain is the one llama.cpp's common_sampler_init builds from it.
    #[arg(long, value_name = "BODY.json")]
    pub params: Option<PathBuf>,

    /// Whose arithmetic the stages follow.
    #[arg(long, value_name = "NAME", default_value = "llama.cpp")]
    pub convention: String,

    /// Random generator: counter-based Philox (batch-invariant) or llama.cpp's MT19937.
    #[arg(long, value_enum, default_value_t = RngArg::Philox)]
    pub rng: RngArg,

    /// Seed of every drawing stage [default: the body's seed with --params, else 0].
    /// tokensieve never picks a random seed: the same command gives the same tokens.
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,

    /// Tokens already in the sequence, oldest first, as if each had been accepted:
    /// comma-separated ids (12,7,7) or a .npy of integers. Every row gets the same history.
    #[arg(long, value_name = "IDS", allow_hyphen_values = true)]
    pub history: Option<String>,
}

/// Where the logits come from.
#[derive(Debug, Args)]
pub struct InputArgs {
    /// Logits, .npy of shape [V] or [B, V] in C order: f32, f16, or uint16 holding bf16 bits
    /// (with --dtype bf16).
    #[arg(long, value_name = "IN.npy", required_unless_present = "example")]
    pub logits: Option<PathBuf>,

    /// Use the built-in example row instead of --logits: SmolLM2-135M-Instruct's logits
    /// (V = 49152) for the token after "The capital of France is".
    #[arg(long, conflicts_with = "logits")]
    pub example: bool,

    /// Element type of --logits [default: the file's own f32 or f16; bf16 must be asked for].
    #[arg(long, value_enum)]
    pub dtype: Option<DtypeArg>,
}

/// `tokensieve apply`.
#[derive(Debug, Args)]
pub struct ApplyArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub chain: ChainArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub input: InputArgs,
    /// Where to write the processed logits (.npy, f32, same shape as the input).
    #[arg(long, value_name = "OUT.npy")]
    pub out: PathBuf,
}

/// `tokensieve sample`.
#[derive(Debug, Args)]
pub struct SampleArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub chain: ChainArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub input: InputArgs,
    /// Tokens to sample per row (same logits each step; each token is accepted first).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub n: u32,
    /// Report the K most likely alternatives of each token [default: the body's
    /// n_probs / top_logprobs with --params, else 0].
    #[arg(long, value_name = "K")]
    pub logprobs: Option<usize>,
    /// raw: log-softmax of the input row (llama.cpp's server default); processed: over the
    /// candidates the chain left (post_sampling_probs) [default: raw, or the body's
    /// post_sampling_probs].
    #[arg(long, value_enum, value_name = "MODE")]
    pub logprobs_mode: Option<LogprobsModeArg>,
}

/// `--rng`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RngArg {
    /// Counter-based Philox4x32-10 keyed by (seed, row, step).
    Philox,
    /// std::mt19937 with libstdc++'s draws: llama.cpp's token stream.
    Mt19937,
}

/// `--dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DtypeArg {
    /// 32-bit floats (<f4).
    F32,
    /// IEEE half precision (<f2).
    F16,
    /// bfloat16 bits stored as uint16 (<u2).
    Bf16,
}

/// `--logprobs-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogprobsModeArg {
    /// Log-softmax of the input row.
    Raw,
    /// Log-softmax over the candidates left after the chain.
    Processed,
}
