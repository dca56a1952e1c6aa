//! `tokensieve bench`: microseconds per token for each chain, beside the floor.
//!
//! The floor is the median time of one SIMD max pass ([`tokensieve::arch::max`]) over the same
//! row, timed interleaved with the chain (one floor pass, one token, repeated), so both see the
//! same cache and clock state; the ratio is chain median / floor median. Every chain samples
//! the same row over and over, accepting each token (penalty windows and RNG steps move as in
//! generation). A chain with `penalties` first gets a 64-token history before timing starts.
//! A batch on `T > 1` threads is timed from one of the pool's threads (the caller among the
//! `T`, as an engine's worker calls `batch::sample`), beside the same batch sampled by a plain
//! loop on that thread, for the speed-up over one thread. Each f32 row starts `--offset` bytes
//! past a 64-byte boundary (0 by default; a batch's buffer starts there, its rows follow one
//! another), so that where the allocator put it does not move the numbers from one run to the
//! next.

use crate::args::InputArgs;
use crate::args::{BenchArgs, DtypeArg, RowsArg};
use crate::error::{bad, lib};
use crate::input::{load_logits, Data};
use anyhow::Result;
use half::{bf16, f16};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::hint::black_box;
use std::io::Write;
use std::time::{Duration, Instant};
use tokensieve::bench_rows::{self, Shape};
use tokensieve::sampler::BuildContext;
use tokensieve::{arch, batch, logprobs, Chain, Convention, Logits, LogitsBatch, RngConfig, TokenLogprob};

/// The workload table.
const DEFAULT_CHAINS: &[&str] = &[
    "top_k(40);top_p(0.95,1);min_p(0.05,1);temperature(0.8);dist",
    "penalties(64,1.1,0.1,0.1);top_k(40);top_p(0.95,1);min_p(0.05,1);temperature(0.8);dist",
    "top_p(0.95,1);dist",
    "temperature(0.8);dist",
    "min_p(0.05,1);temperature(0.8);dist",
    "greedy",
    "logprobs(20)",
];

/// The same workloads under the transformers convention, in the order generate() builds its
/// processors (repetition penalty, temperature, top-k, top-p, min-p), HF's penalty standing
/// in for llama.cpp's.
const TRANSFORMERS_CHAINS: &[&str] = &[
    "temperature(0.8);top_k(40);top_p(0.95);min_p(0.05);dist",
    "repetition_penalty(1.1);temperature(0.8);top_k(40);top_p(0.95);min_p(0.05);dist",
    "top_p(0.95);dist",
    "temperature(0.8);dist",
    "temperature(0.8);min_p(0.05);dist",
    "greedy",
    "logprobs(20)",
];

/// Warm-up before timing: at least this long and this many iterations.
const WARM_UP: Duration = Duration::from_millis(60);
const MIN_SAMPLES: usize = 30;

/// One result line (`--json`).
#[derive(Serialize)]
struct Line<'a> {
    chain: &'a str,
    vocab: usize,
    batch: usize,
    threads: usize,
    median_us: f64,
    p90_us: f64,
    floor_us: f64,
    ratio: f64,
    tokens_per_s: f64,
    /// Batch mode with more than one thread: the one-thread median (the same rows sampled by
    /// a plain loop on the calling thread, timed interleaved) over this one.
    #[serde(skip_serializing_if = "Option::is_none")]
    speedup_vs_1_thread: Option<f64>,
    path: String,
    isa: String,
    convention: &'a str,
    dtype: &'static str,
    /// `--offset`: the f32 rows' start, in bytes past a 64-byte boundary.
    offset: usize,
}

/// What is timed for one spec.
enum Workload {
    Chain(String),
    /// Raw logprobs of the row's top `n` (`logprobs(N)`).
    Logprobs(usize),
}

fn workload(spec: &str) -> Result<Workload> {
    let spec = spec.trim();
    if let Some(n) = spec.strip_prefix("logprobs(").and_then(|r| r.strip_suffix(')')) {
        let n = n.trim().parse().map_err(|_| bad(format!("--chain `{spec}`: logprobs(N) needs an integer N")))?;
        return Ok(Workload::Logprobs(n));
    }
    Ok(Workload::Chain(spec.to_string()))
}

/// Runs `bench`.
pub fn run(args: &BenchArgs) -> Result<()> {
    if !(args.seconds.is_finite() && args.seconds > 0.0 && args.seconds <= 3600.0) {
        return Err(bad(format!("--seconds must be in (0, 3600], got {}", args.seconds)));
    }
    let convention: Convention = args.convention.parse().map_err(|e| lib("--convention", e))?;
    let defaults = if convention == Convention::Transformers { TRANSFORMERS_CHAINS } else { DEFAULT_CHAINS };
    let specs: Vec<String> =
        if args.chain.is_empty() { defaults.iter().map(|s| s.to_string()).collect() } else { args.chain.clone() };
    let workloads: Vec<Workload> = specs.iter().map(|s| workload(s)).collect::<Result<_>>()?;
    for (spec, w) in specs.iter().zip(&workloads) {
        if let Workload::Chain(c) = w {
            Chain::from_spec(c, &BuildContext::new(1000, RngConfig::philox(0)).with_convention(convention))
                .map_err(|e| lib(format!("--chain `{spec}`"), e))?;
        }
    }
    let (batch, threads) = (args.batch as usize, args.threads as usize);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| anyhow::anyhow!("cannot start {threads} worker threads: {e}"))?;
    let real = if args.rows == RowsArg::Real { Some(real_row()?) } else { None };

    let steps = (args.vocab.len() * workloads.len()) as u64;
    let estimate = steps as f64 * (args.seconds + WARM_UP.as_secs_f64());
    let progress = if estimate > 1.0 {
        let bar = ProgressBar::new(steps);
        bar.set_style(
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Some(bar)
    } else {
        None
    };

    let isa = format!("{:?}{}", arch::isa(), if arch::avx512() { " (+avx-512 kernels and floor)" } else { "" })
        .to_lowercase();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for &v in &args.vocab {
        let v = v as usize;
        let mut made: Vec<Vec<f32>> = (0..batch).map(|i| make_row(args.rows, real.as_deref(), v, i as u64)).collect();
        let v = made[0].len();
        let typed = Typed::new(args.dtype, &mut made);
        let placed: Vec<Placed> = made.iter().map(|r| Placed::new(r, args.offset)).collect();
        let rows: Vec<&[f32]> = placed.iter().map(Placed::row).collect();
        if !args.json {
            let note = progress.as_ref().map(|_| "").unwrap_or("");
            let line = format!(
                "{note}V = {v}, batch {batch}, {threads} thread(s), rows {:?} {:?} (entropy {:.2} nats, {} bytes past a 64-byte boundary), isa {isa}, vectorised expf: {}, convention {}",
                args.rows,
                args.dtype,
                bench_rows::entropy(rows[0]),
                args.offset,
                if arch::vectorised_exp() { "yes" } else { "no" },
                args.convention,
            )
            .to_lowercase();
            print_line(&progress, &mut out, &line)?;
            print_line(
                &progress,
                &mut out,
                &format!(
                    "{:<88} {:>10} {:>10} {:>10} {:>7}  path",
                    "chain", "median µs", "p90 µs", "floor µs", "ratio"
                ),
            )?;
        }
        for (spec, w) in specs.iter().zip(&workloads) {
            if let Some(bar) = &progress {
                bar.set_message(format!("V={v} {spec}"));
            }
            let m = match w {
                Workload::Chain(c) => measure_chain(c, convention, &rows, &typed, &pool, args.seconds)?,
                Workload::Logprobs(n) => measure_logprobs(*n, &rows, &typed, &pool, args.seconds)?,
            };
            let ratio = m.median_us / m.floor_us;
            let line = Line {
                chain: spec,
                vocab: v,
                batch,
                threads,
                median_us: round3(m.median_us),
                p90_us: round3(m.p90_us),
                floor_us: round3(m.floor_us),
                ratio: round3(ratio),
                tokens_per_s: (1e6 / m.median_us).round(),
                speedup_vs_1_thread: m.one_thread_us.map(|one| round3(one / m.median_us)),
                path: m.path,
                isa: isa.clone(),
                convention: &args.convention,
                dtype: match args.dtype {
                    DtypeArg::F32 => "f32",
                    DtypeArg::F16 => "f16",
                    DtypeArg::Bf16 => "bf16",
                },
                offset: args.offset,
            };
            let text = if args.json {
                serde_json::to_string(&line)?
            } else {
                let scaling = line
                    .speedup_vs_1_thread
                    .map(|x| format!("  ({x:.2}x the throughput of 1 thread)"))
                    .unwrap_or_default();
                format!(
                    "{:<88} {:>10.1} {:>10.1} {:>10.1} {:>6.2}x  {}{scaling}",
                    spec, line.median_us, line.p90_us, line.floor_us, line.ratio, line.path
                )
            };
            print_line(&progress, &mut out, &text)?;
            if let Some(bar) = &progress {
                bar.inc(1);
            }
        }
    }
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    out.flush()?;
    Ok(())
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Prints a result line without tearing the progress bar.
fn print_line(progress: &Option<ProgressBar>, out: &mut impl Write, line: &str) -> Result<()> {
    match progress {
        Some(bar) => bar.suspend(|| writeln!(out, "{line}").and_then(|_| out.flush()))?,
        None => writeln!(out, "{line}")?,
    }
    Ok(())
}

/// The embedded example row.
fn real_row() -> Result<Vec<f32>> {
    let input = load_logits(&InputArgs { logits: None, example: true, dtype: None })?;
    match input.data {
        Data::F32(d) => Ok(d),
        Data::F16(d) => Ok(d.iter().map(|x| x.to_f32()).collect()),
        Data::Bf16(d) => Ok(d.iter().map(|x| x.to_f32()).collect()),
    }
}

/// Row `i` of a batch of `v`-token rows.
fn make_row(rows: RowsArg, real: Option<&[f32]>, v: usize, i: u64) -> Vec<f32> {
    let seed = 0x5eed + i;
    match (rows, real) {
        (RowsArg::Real, Some(real)) => {
            // The real row as is, or tiled with each further copy 2.0 lower (no exact ties
            // between copies, the top stays the model's); batch rows rotate it.
            let n = real.len();
            let rot = (i as usize * 7919) % n;
            (0..v).map(|j| real[(j + rot) % n] - 2.0 * (j / n) as f32).collect()
        }
        (RowsArg::Flat, _) => bench_rows::row(Shape::Flat, v, seed),
        (RowsArg::Wide, _) => bench_rows::row(Shape::Wide, v, seed),
        _ => bench_rows::row(Shape::Peaked, v, seed),
    }
}

struct Measured {
    median_us: f64,
    p90_us: f64,
    floor_us: f64,
    /// The median of the one-thread reference, where one was timed.
    one_thread_us: Option<f64>,
    path: String,
}

/// What [`time_loop`] timed: µs per token of each step, and of the floor pass.
struct Timings {
    steps: Vec<Vec<f64>>,
    floor: Vec<f64>,
}

impl Timings {
    fn summarise(mut self, path: String) -> Measured {
        let pick = |v: &mut Vec<f64>, q: f64| {
            v.sort_by(|a, b| a.total_cmp(b));
            v[((v.len() - 1) as f64 * q).round() as usize]
        };
        let one_thread_us = self.steps.get_mut(1).map(|one| pick(one, 0.5));
        let chain = &mut self.steps[0];
        Measured {
            median_us: pick(chain, 0.5),
            p90_us: pick(chain, 0.9),
            floor_us: pick(&mut self.floor, 0.5),
            one_thread_us,
            path,
        }
    }
}

/// A timed step: one token per row of `rows`.
type Step<'a> = &'a mut dyn FnMut() -> Result<()>;

/// Times each of `steps` interleaved with the floor pass (one floor pass, then each step
/// once, repeated), so that all see the same cache and clock state. The steps take turns at
/// going first after the floor pass: at a batch's size (64 rows of 128k are 32 MiB) the one
/// that follows it finds more of the rows still in L3, which moved a two-thread batch's
/// speed-up over one thread between 1.55x and 1.7x (Zen 3) with the order fixed either way.
fn time_loop(seconds: f64, rows: &[&[f32]], steps: &mut [Step<'_>]) -> Result<Timings> {
    let per_token = rows.len() as f64;
    let floor = || {
        let t = Instant::now();
        for r in rows {
            black_box(arch::max(black_box(r)));
        }
        t.elapsed().as_secs_f64() * 1e6 / per_token
    };
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed() < WARM_UP || n < 5 {
        floor();
        for step in steps.iter_mut() {
            step()?;
        }
        n += 1;
    }
    let mut timings = Timings { steps: vec![Vec::new(); steps.len()], floor: Vec::new() };
    let start = Instant::now();
    while (start.elapsed().as_secs_f64() < seconds || timings.floor.len() < MIN_SAMPLES)
        && timings.floor.len() < 2_000_000
    {
        let first = timings.floor.len() % steps.len();
        timings.floor.push(floor());
        for k in (first..steps.len()).chain(0..first) {
            let t = Instant::now();
            steps[k]()?;
            timings.steps[k].push(t.elapsed().as_secs_f64() * 1e6 / per_token);
        }
    }
    Ok(timings)
}

/// Times a batch step, called from one of the pool's threads; beside it, on a pool of more
/// than one thread, the same batch sampled one row after the other on this thread.
fn time_batch(seconds: f64, rows: &[&[f32]], batched: Step<'_>, one_by_one: Step<'_>) -> Result<Timings> {
    if rayon::current_num_threads() > 1 {
        time_loop(seconds, rows, &mut [batched, one_by_one])
    } else {
        time_loop(seconds, rows, &mut [batched])
    }
}

fn path_name(p: tokensieve::convention::llama_cpp::dense::Path) -> String {
    use tokensieve::convention::llama_cpp::dense::Path;
    match p {
        Path::Array => "array".into(),
        Path::Fast(s) => format!("fast:{s}"),
        Path::Fallback(s) => format!("fallback:{s}"),
    }
}

/// An f32 row copied to start `offset` bytes past a 64-byte boundary (`--offset`), so that
/// every run reads it at the same alignment.
struct Placed {
    buf: Vec<f32>,
    at: usize,
    len: usize,
}

impl Placed {
    fn new(row: &[f32], offset: usize) -> Placed {
        let mut buf = vec![0.0f32; row.len() + 32];
        // `align_offset` of an f32 pointer to 64 bytes is at most 15 floats.
        let at = buf.as_ptr().align_offset(64) + offset / 4;
        buf[at..at + row.len()].copy_from_slice(row);
        Placed { buf, at, len: row.len() }
    }

    fn row(&self) -> &[f32] {
        &self.buf[self.at..self.at + self.len]
    }
}

/// The rows in the element type of `--dtype` (the f32 rows hold the same values).
enum Typed {
    F32,
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
}

impl Typed {
    /// Rounds `rows` to `dtype` in place and keeps the typed copy, flattened.
    fn new(dtype: DtypeArg, rows: &mut [Vec<f32>]) -> Typed {
        match dtype {
            DtypeArg::F32 => Typed::F32,
            DtypeArg::F16 => {
                let flat: Vec<f16> = rows.iter().flatten().map(|&x| f16::from_f32(x)).collect();
                rows.iter_mut().flatten().zip(&flat).for_each(|(x, h)| *x = h.to_f32());
                Typed::F16(flat)
            }
            DtypeArg::Bf16 => {
                let flat: Vec<bf16> = rows.iter().flatten().map(|&x| bf16::from_f32(x)).collect();
                rows.iter_mut().flatten().zip(&flat).for_each(|(x, h)| *x = h.to_f32());
                Typed::Bf16(flat)
            }
        }
    }

    /// Row `i` of `rows` (each `v` long) as the sampler receives it.
    fn row<'a>(&'a self, rows: &[&'a [f32]], i: usize) -> Logits<'a> {
        let v = rows[i].len();
        match self {
            Typed::F32 => Logits::F32(rows[i]),
            Typed::F16(h) => Logits::F16(&h[i * v..(i + 1) * v]),
            Typed::Bf16(b) => Logits::Bf16(&b[i * v..(i + 1) * v]),
        }
    }
}

fn measure_chain(
    spec: &str,
    convention: Convention,
    rows: &[&[f32]],
    typed: &Typed,
    pool: &rayon::ThreadPool,
    seconds: f64,
) -> Result<Measured> {
    let v = rows[0].len();
    let mut chains: Vec<Chain> = (0..rows.len())
        .map(|i| {
            let ctx = BuildContext::new(v, RngConfig::philox(42).with_sequence(i as u32)).with_convention(convention);
            Chain::from_spec(spec, &ctx)
        })
        .collect::<tokensieve::Result<_>>()
        .map_err(|e| lib(format!("--chain `{spec}`"), e))?;
    // A full penalty window: 64 tokens spread over the vocabulary.
    for chain in &mut chains {
        for j in 0..64u64 {
            chain.accept(((j * 7919 + 13) % v as u64) as u32);
        }
    }
    let timings = if rows.len() == 1 {
        let (chain, row) = (&mut chains[0], typed.row(rows, 0));
        time_loop(
            seconds,
            rows,
            &mut [&mut || {
                black_box(chain.sample(row).map_err(|e| lib(format!("--chain `{spec}`"), e))?);
                Ok(())
            }],
        )?
    } else {
        // The batch's rows one after the other, the first where the single rows start.
        let flat = Placed::new(&rows.concat(), rows[0].as_ptr() as usize % 64);
        let all = match typed {
            Typed::F32 => Logits::F32(flat.row()),
            Typed::F16(h) => Logits::F16(h),
            Typed::Bf16(b) => Logits::Bf16(b),
        };
        let batch_view = LogitsBatch::new(all, rows.len(), v).map_err(|e| lib("batch", e))?;
        let chains = &mut chains;
        // The loop runs on one of the pool's threads, as an engine's own worker would call
        // `batch::sample`: `T` threads in all, the caller among them.
        pool.install(|| {
            let chains = std::cell::RefCell::new(chains);
            let mut batched = || {
                let tokens = batch::sample(&mut chains.borrow_mut(), &batch_view).map_err(|e| lib("batch", e))?;
                for t in tokens {
                    black_box(t.map_err(|e| lib(format!("--chain `{spec}`"), e))?);
                }
                Ok(())
            };
            // The one-thread reference: the same chains and rows, a plain loop on this thread.
            let mut one_by_one = || {
                for (i, chain) in chains.borrow_mut().iter_mut().enumerate() {
                    black_box(chain.sample(batch_view.row(i)).map_err(|e| lib(format!("--chain `{spec}`"), e))?);
                }
                Ok(())
            };
            time_batch(seconds, rows, &mut batched, &mut one_by_one)
        })?
    };
    Ok(timings.summarise(path_name(chains[0].last_path())))
}

fn measure_logprobs(
    n: usize,
    rows: &[&[f32]],
    typed: &Typed,
    pool: &rayon::ThreadPool,
    seconds: f64,
) -> Result<Measured> {
    let mut bufs: Vec<Vec<TokenLogprob>> = (0..rows.len()).map(|_| Vec::with_capacity(n + 1)).collect();
    let run = |bufs: &mut Vec<Vec<TokenLogprob>>| {
        let bufs = std::cell::RefCell::new(bufs);
        let mut batched = || {
            use rayon::prelude::*;
            bufs.borrow_mut().par_iter_mut().enumerate().for_each(|(i, buf)| {
                black_box(logprobs::raw(typed.row(rows, i), 0, n, buf));
            });
            Ok(())
        };
        let mut one_by_one = || {
            for (i, buf) in bufs.borrow_mut().iter_mut().enumerate() {
                black_box(logprobs::raw(typed.row(rows, i), 0, n, buf));
            }
            Ok(())
        };
        if rows.len() == 1 {
            time_loop(seconds, rows, &mut [&mut one_by_one])
        } else {
            time_batch(seconds, rows, &mut batched, &mut one_by_one)
        }
    };
    // As for chains, a batch is timed from one of the pool's threads.
    let timings = if rows.len() == 1 { run(&mut bufs)? } else { pool.install(|| run(&mut bufs))? };
    Ok(timings.summarise("-".into()))
}
