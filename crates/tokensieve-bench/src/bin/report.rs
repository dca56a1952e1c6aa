//! Writes `BENCHMARKS.md`: every workload at every vocabulary size, tokensieve beside the floor
//! and each peer's time as a multiple of tokensieve's, tokensieve on the flat, wide and real
//! rows, and the batch throughput on one and two threads.
//!
//! ```text
//! cargo run -p tokensieve-bench --release --bin report -- [--vocab 32000,128256,151936,262144]
//!     [--seconds 0.5] [--repeat 1] [--out BENCHMARKS.md]   (add --features candle for candle-transformers)
//! ```
//!
//! With `--repeat N`, tokensieve's cells (both conventions, and their floors) are measured in N
//! passes over every cell, and each cell reports the median of its passes: on a shared machine
//! a burst of load then spoils one pass of a cell instead of the cell. The peers, 30 to 2,000
//! times slower, are measured once.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;
use tokensieve::sampler::BuildContext;
use tokensieve::{arch, batch, bench_rows, Chain, Logits, LogitsBatch, RngConfig};
use tokensieve_bench::{
    row, time_per_token, tokensieve_logits_runner, tokensieve_transformers_runner, Peer, Timing, Workload,
};

struct Args {
    vocab: Vec<usize>,
    seconds: f64,
    repeat: usize,
    out: PathBuf,
}

fn parse_args() -> Result<Args, String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut a = Args {
        vocab: vec![32_000, 128_256, 151_936, 262_144],
        seconds: 0.5,
        repeat: 1,
        out: root.join("BENCHMARKS.md"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--vocab" => {
                a.vocab = value()?
                    .split(',')
                    .map(|v| v.trim().parse().map_err(|_| format!("bad --vocab {v}")))
                    .collect::<Result<_, _>>()?
            }
            "--seconds" => a.seconds = value()?.parse().map_err(|_| "bad --seconds".to_string())?,
            "--repeat" => {
                a.repeat = value()?.parse().ok().filter(|&n| n > 0).ok_or("--repeat needs a whole number >= 1")?
            }
            "--out" => a.out = PathBuf::from(value()?),
            "--help" | "-h" => {
                return Err("usage: report [--vocab V,V,...] [--seconds S] [--repeat N] [--out FILE]".into())
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

/// `name version` of the locked packages the table names.
fn versions() -> String {
    let lock =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.lock")).unwrap_or_default();
    let mut out = vec![format!("tokensieve {}", env!("CARGO_PKG_VERSION"))];
    for name in Peer::all().iter().skip(1).map(|p| p.name()) {
        let version = lock
            .split("[[package]]")
            .find(|block| block.contains(&format!("name = \"{name}\"\n")))
            .and_then(|block| {
                block.lines().find_map(|l| l.strip_prefix("version = \"")?.strip_suffix('"').map(String::from))
            })
            .unwrap_or_else(|| "?".into());
        out.push(format!("{name} {version}"));
    }
    out.join(", ")
}

fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name")?.split(':').nth(1).map(str::trim))
        .unwrap_or("unknown CPU");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rustc = std::process::Command::new("rustc")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    format!(
        "{model}, {cores} core(s), {} {}; kernels: {:?}{}, vectorised expf: {}; {rustc}",
        std::env::consts::OS,
        std::env::consts::ARCH,
        arch::isa(),
        match (arch::avx512(), arch::avx512vl()) {
            (true, true) => {
                " (+ AVX-512 kernels: the floor's max pass, the row summaries, approximate block sums, llama.cpp's softmax sum, block gathers, small sorts; AVX-512VL NaN watch in the widening and patching summaries)"
            }
            (true, false) => {
                " (+ AVX-512 kernels: the floor's max pass, the row summaries, approximate block sums, llama.cpp's softmax sum, block gathers, small sorts)"
            }
            (false, true) => " (+ AVX-512VL NaN watch in the widening and patching summaries)",
            (false, false) => "",
        },
        if arch::vectorised_exp() { "yes" } else { "no" }
    )
}

/// Days since 1970-01-01 to a civil date (proleptic Gregorian).
fn today() -> String {
    let days =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() / 86_400) as i64;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + (m <= 2) as i64;
    format!("{y:04}-{m:02}-{d:02}")
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let peers = Peer::all();
    let ours = measure_ours(&args);
    let mut md = String::new();
    let _ = writeln!(md, "# Benchmarks\n");
    let _ = writeln!(
        md,
        "Generated by `cargo run -p tokensieve-bench --release{} --bin report{}` on {}.\n\n* machine: {}\n* versions: {}\n* rows: `tokensieve::bench_rows` peaked (LM-like, softmax entropy 1.5 nats), one thread, the same row every token (each token accepted)\n* floor: median time of one SIMD max pass over the same row, timed interleaved with the sampler\n* cells: median µs per token; tokensieve's ratio is to the floor, each peer's to tokensieve (> 1 = slower than tokensieve); `n/a`: the peer has no such sampler\n* passes: {}\n",
        // The command as run: candle-transformers' column is there only with its feature.
        if cfg!(feature = "candle") { " --features candle" } else { "" },
        if args.repeat > 1 { format!(" -- --repeat {}", args.repeat) } else { String::new() },
        today(),
        machine(),
        versions(),
        if args.repeat > 1 {
            format!("tokensieve's cells and floors are the medians of {} passes over every cell; the peers, one pass", args.repeat)
        } else {
            "one (`--repeat N` takes the median of N passes for tokensieve's cells)".to_string()
        }
    );
    for (i, &v) in args.vocab.iter().enumerate() {
        let r = row(v);
        let _ = writeln!(md, "## V = {v}\n");
        let mut header = String::from("| workload | floor µs | tokensieve µs (× floor) |");
        let mut rule = String::from("|---|---:|---:|");
        for p in &peers[1..] {
            let _ = write!(header, " {} µs (× tokensieve) |", p.name());
            rule.push_str("---:|");
        }
        let _ = writeln!(md, "{header}\n{rule}");
        for (k, w) in Workload::ALL.into_iter().enumerate() {
            let t = ours[i][k][0];
            let mut line = format!(
                "| `{}` | {:.1} | {:.1} ({:.2}×) |",
                w.spec(),
                t.floor_us,
                t.median_us,
                t.median_us / t.floor_us
            );
            for &p in &peers[1..] {
                eprintln!("V={v} {} {}", p.name(), w.name());
                let cell = match p.runner(w, &r) {
                    None => "n/a".to_string(),
                    Some(step) => {
                        let peer = time_per_token(&r, args.seconds, step);
                        format!("{:.1} ({:.1}×)", peer.median_us, peer.median_us / t.median_us)
                    }
                };
                let _ = write!(line, " {cell} |");
            }
            let _ = writeln!(md, "{line}");
        }
        let _ = writeln!(md);
    }
    // The transformers convention: tokensieve alone (no in-process peer implements Hugging
    // Face's processors; candle's LogitsProcessor is behind the `candle` feature above).
    let _ = writeln!(
        md,
        "## Transformers convention\n\nThe same workloads under `--convention transformers` (Hugging Face's logits processors, bit for bit), in generate()'s processor order; tokensieve only.\n"
    );
    let _ = writeln!(md, "| V | workload | floor µs | tokensieve µs (× floor) |\n|---:|---|---:|---:|");
    for (i, &v) in args.vocab.iter().enumerate() {
        for (k, w) in Workload::ALL.into_iter().enumerate() {
            let t = ours[i][k][1];
            let _ = writeln!(
                md,
                "| {v} | `{}` | {:.1} | {:.1} ({:.2}×) |",
                w.transformers_spec(),
                t.floor_us,
                t.median_us,
                t.median_us / t.floor_us
            );
        }
    }
    let _ = writeln!(md);
    more_samplers_section(&mut md, args.seconds);
    other_rows_section(&mut md, args.seconds);
    half_rows_section(&mut md, args.seconds);
    batch_section(&mut md, args.seconds);
    // Keep the grammar benchmark's section (written by the `grammar` binary).
    if let Ok(old) = std::fs::read_to_string(&args.out) {
        if let Some(at) = old.find("## Grammar masks") {
            let _ = write!(md, "\n{}", &old[at..]);
        }
    }
    if let Err(e) = std::fs::write(&args.out, &md) {
        eprintln!("cannot write {}: {e}", args.out.display());
        std::process::exit(1);
    }
    eprintln!("wrote {}", args.out.display());
}

/// tokensieve's timings, `[vocab][workload][convention]` (llama.cpp, then transformers):
/// `args.repeat` passes over every cell, each cell the median of its passes (time, p90 and
/// floor each on its own).
fn measure_ours(args: &Args) -> Vec<Vec<[Timing; 2]>> {
    let rows: Vec<Vec<f32>> = args.vocab.iter().map(|&v| row(v)).collect();
    let mut passes: Vec<Vec<[Vec<Timing>; 2]>> =
        rows.iter().map(|_| Workload::ALL.iter().map(|_| [Vec::new(), Vec::new()]).collect()).collect();
    for pass in 1..=args.repeat {
        for (r, cells) in rows.iter().zip(&mut passes) {
            for (w, cell) in Workload::ALL.into_iter().zip(cells.iter_mut()) {
                eprintln!("pass {pass}/{} V={} tokensieve {}", args.repeat, r.len(), w.name());
                let llama = Peer::Tokensieve.runner(w, r).expect("tokensieve runs every workload");
                cell[0].push(time_per_token(r, args.seconds, llama));
                cell[1].push(time_per_token(r, args.seconds, tokensieve_transformers_runner(w, r)));
            }
        }
    }
    passes.iter().map(|cells| cells.iter().map(|[a, b]| [median_timing(a), median_timing(b)]).collect()).collect()
}

/// The per-field median of `ts` (the upper one of an even count).
fn median_timing(ts: &[Timing]) -> Timing {
    let med = |f: fn(&Timing) -> f64| {
        let mut v: Vec<f64> = ts.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Timing { median_us: med(|t| t.median_us), p90_us: med(|t| t.p90_us), floor_us: med(|t| t.floor_us) }
}

/// The batch target: 64 different rows of V = 128,256, llama.cpp's default chain (one chain
/// per row), sampled by `tokensieve::batch::sample` in a rayon pool of 1 and of 2 threads,
/// the two timed alternately so that both see the same machine. Tokens per second from the
/// median batch time.
/// The embedded real row (SmolLM2-135M's logits after "The capital of France is", the CLI's
/// example), tiled to `v` entries as `tokensieve bench --rows real` does: each further copy
/// 2.0 lower.
fn real_row(v: usize) -> Vec<f32> {
    const NPY: &[u8] = include_bytes!("../../../tokensieve-cli/testdata/example-logits.npy");
    let real: Vec<f32> =
        npyz::NpyFile::new(NPY).and_then(|f| f.into_vec::<f32>()).expect("the embedded example row is an f32 .npy");
    (0..v).map(|j| real[j % real.len()] - 2.0 * (j / real.len()) as f32).collect()
}

/// Chains beyond the issue's table that users turn on: `(convention, spec)`.
const MORE_SAMPLERS: [(tokensieve::Convention, &str); 16] = [
    (tokensieve::Convention::LlamaCpp, "mirostat_v2(5,0.1)"),
    (tokensieve::Convention::LlamaCpp, "temperature(0.8);mirostat_v2(5,0.1)"),
    (tokensieve::Convention::LlamaCpp, "temperature(0.8);mirostat(5,0.1,100)"),
    (tokensieve::Convention::LlamaCpp, "top_k(40);typical(0.9,1);top_p(0.95,1);min_p(0.05,1);temperature(0.8);dist"),
    (tokensieve::Convention::LlamaCpp, "typical(0.9,1);temperature(0.8);dist"),
    (tokensieve::Convention::LlamaCpp, "top_n_sigma(1);top_k(40);top_p(0.95,1);min_p(0.05,1);temperature(0.8);dist"),
    (tokensieve::Convention::LlamaCpp, "top_p(0.95,1);min_p(0.05,1);temperature(0.8);dist"),
    (tokensieve::Convention::LlamaCpp, "temperature(0.8);top_k(40);top_p(0.95,1);min_p(0.05,1);dist"),
    (tokensieve::Convention::LlamaCpp, "temperature(2);top_p(0.95,1);dist"),
    (tokensieve::Convention::Transformers, "temperature(2);top_p(0.95);dist"),
    (tokensieve::Convention::Transformers, "temperature(0.8);top_k(50);typical(0.9);dist"),
    (tokensieve::Convention::Transformers, "temperature(0.8);top_k(50);epsilon(0.0003);dist"),
    (tokensieve::Convention::Transformers, "temperature(0.8);top_k(50);eta(0.0003);dist"),
    (tokensieve::Convention::Transformers, "temperature(0.8);typical(0.9);dist"),
    (tokensieve::Convention::Transformers, "temperature(0.8);epsilon(0.0003);dist"),
    (tokensieve::Convention::Transformers, "temperature(0.8);eta(0.0003);dist"),
];

/// tokensieve alone on [`MORE_SAMPLERS`]: `sample` beside the floor, and `apply` (every
/// surviving candidate observed, so the candidate array is built where a stage needs it). Each
/// chain first runs 300 tokens on the row, so that mirostat's `mu` has settled (on this row it
/// climbs until the whole row is kept).
fn more_samplers_section(md: &mut String, seconds: f64) {
    let _ = writeln!(
        md,
        "## More samplers

tokensieve alone, on the peaked rows, for chains outside the issue's table: mirostat (llama.cpp's, with `mu` settled after 300 tokens: on this row every token is kept; after a temperature, as llama.cpp's common sampler builds it), the chains that put `typical`, `epsilon` or `eta` after a `top_k` (llama.cpp's order; transformers' `generate()` order with its default `top_k=50`), the same samplers over the whole row (`top_k` off), llama.cpp's default chain with `top_n_sigma(1)` on (its order puts it before `top_k`, over the whole row), the same with `top_k` off (`top_p` then over the whole row), its samplers with the temperature first (a custom order), and `top_p;dist` at a hot temperature in either convention (`temperature(2)`: the top 95% of the mass in about 2,000 tokens at V = 32,000 and 3,200 at 128,256). `sample` is timed beside the floor. `apply` returns every candidate: for mirostat the whole sorted row, built on the candidate array where equal values make llama.cpp's sort order matter (the bench's row holds some); for transformers the dense row, the removed tokens at `-inf`, as its processors return it. One pass.\n"
    );
    let _ = writeln!(
        md,
        "| convention | V | chain | floor µs | `sample` µs (× floor) | `apply` µs (× floor) |\n|---|---:|---|---:|---:|---:|"
    );
    for v in [32_000usize, 128_256] {
        let r = row(v);
        for (convention, spec) in MORE_SAMPLERS {
            eprintln!("more samplers: V={v} {spec}");
            let build = |apply: bool| {
                let ctx = BuildContext::new(v, RngConfig::philox(42)).with_convention(convention);
                let mut chain =
                    if apply { Chain::from_spec_for_apply(spec, &ctx) } else { Chain::from_spec(spec, &ctx) }
                        .expect("the chains build");
                for _ in 0..300 {
                    let t = if apply {
                        chain.apply(&r[..]).expect("a peaked row applies").selected_token().unwrap_or(0)
                    } else {
                        chain.sample(&r[..]).expect("a peaked row samples")
                    };
                    chain.accept(t);
                }
                chain
            };
            let mut sampler = build(false);
            let sampled = time_per_token(&r, seconds, || sampler.sample(&r[..]).expect("a peaked row samples"));
            let mut applier = build(true);
            let applied = time_per_token(&r, seconds, || {
                applier.apply(&r[..]).expect("a peaked row applies").selected_token().unwrap_or(0)
            });
            let name = match convention {
                tokensieve::Convention::LlamaCpp => "llama.cpp",
                tokensieve::Convention::Transformers => "transformers",
            };
            let _ = writeln!(
                md,
                "| {name} | {v} | `{spec}` | {:.1} | {:.1} ({:.2}×) | {:.1} ({:.1}×) |",
                sampled.floor_us,
                sampled.median_us,
                sampled.median_us / sampled.floor_us,
                applied.median_us,
                applied.median_us / applied.floor_us
            );
        }
    }
    let _ = writeln!(md);
}

/// tokensieve alone on the other rows the issue names (flat, wide, the real model's), under
/// the llama.cpp convention, at two sizes. The floor is timed in its own run (a max pass
/// interleaved with nothing): on flat rows the array path's vocabulary-sized buffers push the
/// row out of cache, which would slow a floor timed beside them.
fn other_rows_section(md: &mut String, seconds: f64) {
    let _ = writeln!(
        md,
        "## Other rows\n\ntokensieve alone, under both conventions (raw logprobs are the same under both: llama.cpp's only), on the other rows of the issue: `flat` (`bench_rows` flat: N(0, 0.05²), entropy near ln V: `top_p` keeps most of the vocabulary, so llama.cpp's full sort is required, and transformers' ascending sort would be), `wide` (N(0, 30²): values far outside [-10, 10]) and `real` (SmolLM2-135M's logits after \"The capital of France is\", V = 49,152, cut or tiled with each copy 2.0 lower, as `tokensieve bench --rows real`). The floor is timed alone. One pass.\n"
    );
    let _ = writeln!(
        md,
        "| rows | V | convention | workload | floor µs | tokensieve µs (× floor) |\n|---|---:|---|---|---:|---:|"
    );
    for (name, make) in [
        ("flat", (|v| bench_rows::row(bench_rows::Shape::Flat, v, 0x5eed)) as fn(usize) -> Vec<f32>),
        ("wide", |v| bench_rows::row(bench_rows::Shape::Wide, v, 0x5eed)),
        ("real", real_row),
    ] {
        for v in [32_000usize, 128_256] {
            let r = make(v);
            let floor = time_per_token(&r, seconds.min(0.2), || 0).floor_us;
            for transformers in [false, true] {
                for w in Workload::ALL {
                    if transformers && w == Workload::Logprobs {
                        continue;
                    }
                    let (convention, spec) =
                        if transformers { ("transformers", w.transformers_spec()) } else { ("llama.cpp", w.spec()) };
                    eprintln!("other rows: {name} V={v} {convention} {}", w.name());
                    let step = if transformers {
                        tokensieve_transformers_runner(w, &r)
                    } else {
                        Peer::Tokensieve.runner(w, &r).expect("tokensieve runs every workload")
                    };
                    let t = time_per_token(&r, seconds, step);
                    let _ = writeln!(
                        md,
                        "| {name} | {v} | {convention} | `{spec}` | {floor:.1} | {:.1} ({:.1}×) |",
                        t.median_us,
                        t.median_us / floor
                    );
                }
            }
        }
    }
    let _ = writeln!(md);
}

/// tokensieve on the peaked rows rounded to f16 and bf16 (as an engine on a GPU hands them
/// over), each timed beside the f32 floor over the rounded values.
fn half_rows_section(md: &mut String, seconds: f64) {
    let _ = writeln!(
        md,
        "## Half-precision rows\n\ntokensieve alone, llama.cpp convention, on the peaked rows rounded to f16 and bf16 (`tokensieve bench --dtype`). The chain widens them to f32 in the pass that summarizes them; the floor is the f32 max pass over the rounded values, timed interleaved, so the ratio includes the widening. Rounding makes equal values common among the top tokens: `top_k` then orders them as libstdc++'s heap select does and `top_p` as llama.cpp's bucket sort does (each replayed over the entries it can reach), when sampling only where the draw lands on one of them. One pass.\n"
    );
    let _ = writeln!(md, "| dtype | V | workload | floor µs | tokensieve µs (× floor) |\n|---|---:|---|---:|---:|");
    for v in [32_000usize, 128_256] {
        let r = row(v);
        let h: Vec<half::f16> = r.iter().map(|&x| half::f16::from_f32(x)).collect();
        let b: Vec<half::bf16> = r.iter().map(|&x| half::bf16::from_f32(x)).collect();
        for (name, logits, widened) in [
            ("f16", Logits::F16(&h), h.iter().map(|x| x.to_f32()).collect::<Vec<f32>>()),
            ("bf16", Logits::Bf16(&b), b.iter().map(|x| x.to_f32()).collect::<Vec<f32>>()),
        ] {
            for w in Workload::ALL {
                eprintln!("half rows: {name} V={v} {}", w.name());
                let t = time_per_token(&widened, seconds, tokensieve_logits_runner(w, logits, v));
                let _ = writeln!(
                    md,
                    "| {name} | {v} | `{}` | {:.1} | {:.1} ({:.2}×) |",
                    w.spec(),
                    t.floor_us,
                    t.median_us,
                    t.median_us / t.floor_us
                );
            }
        }
    }
    let _ = writeln!(md);
}

fn batch_section(md: &mut String, seconds: f64) {
    const ROWS: usize = 64;
    const V: usize = 128_256;
    let spec = Workload::Default.spec();
    eprintln!("batch {ROWS} x {V}");
    let flat: Vec<f32> = (0..ROWS).flat_map(|i| bench_rows::row(bench_rows::Shape::Peaked, V, i as u64)).collect();
    let rows = LogitsBatch::new(Logits::F32(&flat), ROWS, V).expect("a well-formed batch");
    let mut chains: Vec<Chain> = (0..ROWS)
        .map(|i| {
            let ctx = BuildContext::new(V, RngConfig::philox(42).with_sequence(i as u32));
            Chain::from_spec(spec, &ctx).expect("the default chain builds")
        })
        .collect();
    let pools: Vec<rayon::ThreadPool> = [1, 2]
        .iter()
        .map(|&t| rayon::ThreadPoolBuilder::new().num_threads(t).build().expect("a thread pool"))
        .collect();
    // Per pool: the sampler's batch times, and the floor's (one max pass per row, split over
    // the pool's threads the same way): the machine's own scaling, as a control.
    let mut times: [(Vec<f64>, Vec<f64>); 2] = Default::default();
    let start = Instant::now();
    let mut rounds = 0;
    // Warm-up rounds first (not recorded), then at least 20 rounds and `4 × seconds`.
    while rounds < 25 || start.elapsed().as_secs_f64() < 4.0 * seconds {
        for (pool, (t, f)) in pools.iter().zip(times.iter_mut()) {
            let clock = Instant::now();
            for token in pool.install(|| batch::sample(&mut chains, &rows)).expect("a valid batch") {
                std::hint::black_box(token.expect("a token"));
            }
            let sampled = clock.elapsed().as_secs_f64();
            let clock = Instant::now();
            pool.install(|| {
                use rayon::prelude::*;
                flat.par_chunks(V).for_each(|r| {
                    std::hint::black_box(arch::max(std::hint::black_box(r)));
                })
            });
            if rounds >= 5 {
                t.push(sampled);
                f.push(clock.elapsed().as_secs_f64());
            }
        }
        rounds += 1;
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let medians: Vec<(f64, f64)> = times.iter_mut().map(|(t, f)| (median(t), median(f))).collect();
    let _ = writeln!(
        md,
        "## Batch\n\n{ROWS} different rows of V = {V} (`tokensieve::bench_rows` peaked), `{spec}`, one chain per row, `tokensieve::batch::sample` in a rayon pool; the pools of 1 and 2 threads timed alternately, median of {} batches each. The target is 2 threads >= 1.8× the 1-thread throughput. The floor columns time one max pass per row in the same pool: how far this machine itself scales to a second thread.\n\n| threads | ms per batch | tokens/s | × 1 thread | floor ms per batch | floor × 1 thread |\n|---:|---:|---:|---:|---:|---:|",
        times[0].0.len()
    );
    let (one, floor_one) = medians[0];
    for (threads, &(t, f)) in [1, 2].iter().zip(&medians) {
        let _ = writeln!(
            md,
            "| {threads} | {:.2} | {:.0} | {:.2}× | {:.2} | {:.2}× |",
            t * 1e3,
            ROWS as f64 / t,
            one / t,
            f * 1e3,
            floor_one / f
        );
    }
    let _ = writeln!(md);
}
