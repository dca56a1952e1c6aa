//! Command-line arguments (clap derive). The flags are the CLI contract of ARCHITECTURE.md:
//! extend, don't break.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

mod bench;
mod grammar;
pub use bench::{BenchArgs, RowsArg};
pub use grammar::{
    CheckArgs, ConstraintArgs, GrammarArgs, GrammarCommand, GrammarModeArg, MaskArgs, MatchArgs, SourceArgs,
};

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
  tokensieve generate 'The capital of France is' -n 16
  tokensieve explain --example --svg funnel.svg
  tokensieve grammar match json.gbnf --text '{\"a\": 1}'

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
    /// Generate text with a real model (llama-architecture GGUF, CPU), every token chosen by
    /// the chain; the text streams to stdout, timings to stderr.
    #[command(after_help = GENERATE_EXAMPLES)]
    Generate(GenerateArgs),
    /// Show what each stage of the chain does to one step's candidates: a table, or a funnel
    /// picture (--svg).
    #[command(after_help = EXPLAIN_EXAMPLES)]
    Explain(ExplainArgs),
    /// Time chains per token beside the floor (one SIMD max pass over the same row).
    #[command(after_help = BENCH_EXAMPLES)]
    Bench(BenchArgs),
    /// GBNF grammars (llama.cpp's): check one, match a text, list the tokens allowed after a
    /// prefix.
    Grammar(GrammarArgs),
}

const BENCH_EXAMPLES: &str = "\
Examples:
  # The issue's workload table at Llama-3's vocabulary size:
  tokensieve bench --vocab 128256
  # Every target size, as JSON lines:
  tokensieve bench --vocab 32000,128256,151936,262144 --json
  # One chain on the real row, and a batch of 64 rows on 2 threads:
  tokensieve bench --rows real --chain 'top_k(40);temperature(0.8);dist'
  tokensieve bench --vocab 128256 --batch 64 --threads 2 --chain 'top_k(40);top_p(0.95,1);min_p(0.05,1);temperature(0.8);dist'

Each line: the chain, median and p90 microseconds per token, the floor (median time of one SIMD
max pass over the same row, measured interleaved with the chain in the same run) and their
ratio. In batch mode the time per token is the batch time divided by B.";

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
  # Hugging Face transformers' processors, bit for bit (history = input_ids):
  tokensieve apply --convention transformers --chain 'repetition_penalty(1.2);temperature(0.7);top_k(50);top_p(0.9)' \\
                   --logits row.npy --history 12,7,7 --out processed.npy
  # The processors generate() builds from a model's generation_config.json:
  tokensieve apply --convention transformers --params generation_config.json --logits row.npy --out processed.npy

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
  # Only tokens a grammar allows, each step advancing it (the vocabulary must match the logits):
  tokensieve sample --chain greedy --logits row.npy --n 8 --grammar json.gbnf --vocab tokenizer.json

Each line: {\"row\", \"step\", \"token\", \"logprob\", \"top_logprobs\": [{\"token\", \"logprob\"}, ...]}.
logprob is the raw log-softmax of the input row unless --logprobs-mode processed; -inf is printed as
the lowest finite f32 (-3.4028235e38), as llama.cpp's server does. For a [B, V] input each row is its
own sequence (Philox sequence id = row). The same row is sampled --n times, each token accepted
before the next step (penalties see it).";

/// Where the chain comes from, and how it draws.
#[derive(Debug, Args)]
pub struct ChainArgs {
    /// Chain spec, e.g. 'top_k(40);top_p(0.95,1);temperature(0.8);dist'. Without --chain or
    /// --params: llama.cpp's default chain (common_sampler_init with default parameters), or
    /// under --convention transformers generate()'s default (greedy).
    #[arg(long, value_name = "SPEC", conflicts_with = "params")]
    pub chain: Option<String>,

    /// A request body (JSON): llama.cpp server /completion fields, OpenAI fields, or both.
    /// The chain is the one llama.cpp's common_sampler_init builds from it. Under
    /// --convention transformers: a generation_config.json (or a body with its fields), and
    /// the chain is the processor list transformers' generate() builds from it.
    #[arg(long, value_name = "BODY.json")]
    pub params: Option<PathBuf>,

    /// Whose arithmetic the stages follow: llama.cpp, or transformers (Hugging Face's logits
    /// processors; same stage names, different semantics, see the README's convention table).
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
    #[command(flatten)]
    #[allow(missing_docs)]
    pub constraint: ConstraintArgs,
    /// The vocabulary a grammar runs over (--grammar, --json-schema, or the body's grammar,
    /// json_schema or response_format): a GGUF file or a Hugging Face tokenizer.json with
    /// exactly as many tokens as the logits have per row.
    #[arg(long, value_name = "VOCAB")]
    pub vocab: Option<PathBuf>,
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

const GENERATE_EXAMPLES: &str = "\
Examples:
  # The default model (SmolLM2-135M-Instruct; fetch it once with scripts/fetch-model.sh),
  # llama.cpp's default chain, seed 0:
  tokensieve generate 'The capital of France is' -n 16
  # Greedy decoding, then a chat turn with the model's chat template:
  tokensieve generate --chain greedy 'The capital of France is'
  tokensieve generate --chat --seed 7 'Write a haiku about rivers.'
  # Each token with its 3 most likely alternatives (raw and processed probabilities):
  tokensieve generate --chain 'top_k(20);temperature(0.7);dist' --show-alternatives 3 'Once upon a time'
  # Another model, a request body for the chain:
  tokensieve generate --model Llama-3.2-1B-Instruct-Q8_0.gguf --params body.json --chat 'Hi!'
  # Output that follows a JSON schema (or --grammar FILE.gbnf; the model's vocabulary):
  tokensieve generate --chat --json-schema person.json 'Describe a person as JSON.' -n 64

Without --model, the default model is looked for in $TOKENSIEVE_SHARED/data/models/, in
shared/data/models/ beside the checkout, and in ${XDG_CACHE_HOME:-~/.cache}/tokensieve/, where
scripts/fetch-model.sh puts it. The prompt's tokens are accepted by the chain before the first
step (penalties and DRY see them). Generation stops at the model's end-of-generation token or
after -n tokens. The last stderr line gives the token count, the model's ms per token, the
sampler's µs per token and the share of time spent sampling.";

const EXPLAIN_EXAMPLES: &str = "\
Examples:
  # llama.cpp's default chain on the built-in example row (SmolLM2 after \"The capital of France is\"):
  tokensieve explain --example
  # A chain on row 3 of a batch, as a funnel picture:
  tokensieve explain --chain 'top_k(40);top_p(0.9,1);min_p(0.05);temperature(0.8);dist' \\
                     --logits batch.npy --row 3 --svg funnel.svg
  # The example row with SmolLM2's token texts:
  tokensieve explain --example --vocab SmolLM2-135M-Instruct.Q4_1.gguf
  # One real step of the default model, with the token texts:
  tokensieve explain --prompt 'The capital of France is' --chain 'top_k(10);top_p(0.8,1);dist'

One line per stage: finite candidates before and after, the probability mass the stage kept
(the softmax of its input, summed over the candidates it left), the entropy of its output (bits),
and the most likely tokens after it with their probability before -> after. Probabilities are
computed from the logits (softmax over the finite candidates), never from stale fields.";

/// `tokensieve generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// The prompt (with --chat: the user's message).
    #[arg(value_name = "PROMPT")]
    pub prompt: String,
    /// A llama-architecture GGUF model with its tokenizer [default: SmolLM2-135M-Instruct,
    /// see below].
    #[arg(long, value_name = "FILE.gguf")]
    pub model: Option<PathBuf>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub chain: ChainArgs,
    /// Most tokens to generate.
    #[arg(short = 'n', long = "max-tokens", value_name = "N", default_value_t = 128)]
    pub max_tokens: usize,
    /// Format the prompt as a user message with the model's chat template (ChatML for the
    /// default model).
    #[arg(long)]
    pub chat: bool,
    /// With --chat: a system message [default: the template's own, if any].
    #[arg(long, value_name = "TEXT", requires = "chat")]
    pub system: Option<String>,
    /// Print each token on its own line with its K most likely alternatives and their raw and
    /// processed probabilities, instead of streaming the text.
    #[arg(long, value_name = "K")]
    pub show_alternatives: Option<usize>,
    /// How the weight matrices are kept in memory.
    #[arg(long, value_enum, value_name = "HOW", default_value_t = WeightsArg::Auto)]
    pub weights: WeightsArg,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub constraint: ConstraintArgs,
}

/// `--weights`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WeightsArg {
    /// f32 when the unpacked matrices fit in 2 GiB (the default model does), else as stored.
    Auto,
    /// Unpacked to f32 at load time: plain float arithmetic (exact to a float reference), and
    /// faster where candle lacks a SIMD kernel for the stored type (Q4_1), at 4 bytes a weight.
    F32,
    /// As stored (Q4_0, Q4_1, Q8_0, ...): candle quantizes the activations to 8 bits, as ggml does.
    Quantized,
}

/// `tokensieve explain`.
#[derive(Debug, Args)]
pub struct ExplainArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub chain: ChainArgs,
    /// Logits, .npy of shape [V] or [B, V] (f32, f16, or bf16 bits with --dtype bf16).
    #[arg(long, value_name = "IN.npy", conflicts_with_all = ["example", "prompt"])]
    pub logits: Option<PathBuf>,
    /// Use the built-in example row (SmolLM2-135M-Instruct after "The capital of France is").
    #[arg(long, conflicts_with = "prompt")]
    pub example: bool,
    /// Element type of --logits [default: the file's own f32 or f16].
    #[arg(long, value_enum)]
    pub dtype: Option<DtypeArg>,
    /// Which row of a [B, V] --logits file.
    #[arg(long, value_name = "R", default_value_t = 0)]
    pub row: usize,
    /// Run the model on this prompt and explain the step after it (token texts shown).
    #[arg(long, value_name = "TEXT")]
    pub prompt: Option<String>,
    /// The model for --prompt [default: SmolLM2-135M-Instruct, as for generate].
    #[arg(long, value_name = "FILE.gguf", requires = "prompt")]
    pub model: Option<PathBuf>,
    /// With --prompt: format it with the model's chat template.
    #[arg(long, requires = "prompt")]
    pub chat: bool,
    /// With --prompt: how the weight matrices are kept in memory (see `generate --help`).
    #[arg(long, value_enum, value_name = "HOW", default_value_t = WeightsArg::Auto)]
    pub weights: WeightsArg,
    /// With --logits or --example: show token texts from this GGUF file's tokenizer (a model,
    /// or a vocabulary-only file).
    #[arg(long, value_name = "FILE.gguf", conflicts_with = "prompt")]
    pub vocab: Option<PathBuf>,
    /// How many of the most likely tokens to show per stage.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub top: usize,
    /// Also write the funnel picture (one band per stage) to this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub svg: Option<PathBuf>,
}
