//! `tokensieve bench` arguments.

use super::DtypeArg;
use clap::{Args, ValueEnum};

/// `tokensieve bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Vocabulary size(s) to measure at, comma-separated (e.g. 32000,128256,151936,262144).
    /// With --rows real the embedded row (V = 49152) is used as is, or tiled with each copy
    /// shifted 2.0 lower to reach another size.
    #[arg(long, value_name = "V", value_delimiter = ',', default_value = "128256",
          value_parser = clap::value_parser!(u64).range(1..=16_777_216))]
    pub vocab: Vec<u64>,

    /// Rows sampled per iteration (B > 1: `batch::sample` on B rows, one chain per row).
    #[arg(long, value_name = "B", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub batch: u64,

    /// Worker threads for batch mode (a rayon pool of this size; the timing loop runs on one
    /// of them). With T > 1 the same batch is also sampled by a plain loop on one thread,
    /// interleaved, and the speed-up is printed (`speedup_vs_1_thread` in --json).
    #[arg(long, value_name = "T", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub threads: u64,

    /// A chain to measure (repeatable). Default: the workload table (llama.cpp's default
    /// chain, the same after penalties, top_p without top_k, temperature;dist, min_p, greedy)
    /// and `logprobs(20)`, the raw logprobs of the row's top 20 alone.
    #[arg(long, value_name = "SPEC")]
    pub chain: Vec<String>,

    /// The rows: peaked (language-model-like, entropy 1.5 nats), flat (nearly uniform), wide
    /// (N(0, 30²): most values outside llama.cpp's [-10, 10] bucket range), real (SmolLM2-135M's
    /// logits after "The capital of France is").
    #[arg(long, value_enum, default_value_t = RowsArg::Peaked)]
    pub rows: RowsArg,

    /// Measuring time per chain and vocabulary size, in seconds (after a short warm-up).
    #[arg(long, value_name = "S", default_value_t = 0.5)]
    pub seconds: f64,

    /// One JSON object per line: chain, vocab, batch, threads, median_us, p90_us, floor_us,
    /// ratio (and tokens_per_s, path, isa, convention, dtype).
    #[arg(long)]
    pub json: bool,

    /// Whose semantics the chains follow: llama.cpp, or transformers (Hugging Face's logits
    /// processors). Under transformers the default workloads are the same table in
    /// generate()'s processor order (temperature first, repetition_penalty for penalties).
    #[arg(long, value_name = "NAME", default_value = "llama.cpp")]
    pub convention: String,

    /// The rows' element type: f32, or f16/bf16 (the same values rounded to it, as an engine
    /// on a GPU hands them over). The chain widens them; the floor stays the f32 max pass over
    /// the rounded values, so the ratio includes the widening.
    #[arg(long, value_enum, default_value_t = DtypeArg::F32)]
    pub dtype: DtypeArg,

    /// Where each f32 row starts, in bytes past a 64-byte boundary (a multiple of 4 below 64),
    /// the same for every run (with --batch, the batch's buffer; its rows follow one another). 0 is how PyTorch and ggml place their buffers; glibc puts a
    /// Rust `Vec<f32>` of 128 KiB or more 16 bytes past a page boundary (`--offset 16`). Rows
    /// off a 32-byte boundary cost some kernels loads that straddle cache lines.
    #[arg(long, value_name = "BYTES", default_value_t = 0, value_parser = parse_offset)]
    pub offset: usize,
}

/// `--offset`: a multiple of 4 below 64.
fn parse_offset(s: &str) -> Result<usize, String> {
    let bytes: usize = s.parse().map_err(|_| format!("`{s}` is not a whole number of bytes"))?;
    if bytes < 64 && bytes.is_multiple_of(4) {
        Ok(bytes)
    } else {
        Err(format!("{bytes} is not a multiple of 4 below 64 (an f32 row starts on a 4-byte boundary)"))
    }
}

/// `--rows`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RowsArg {
    /// Language-model-like rows.
    Peaked,
    /// Nearly uniform rows.
    Flat,
    /// Values far outside [-10, 10].
    Wide,
    /// The embedded SmolLM2-135M row.
    Real,
}
