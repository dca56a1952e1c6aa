//! Per-draw minima, for comparing two builds on a noisy machine: samples the same seeded draws
//! of one chain several times over and keeps each draw's fastest time. A burst of noise slows
//! some passes, seldom the same draw in all of them, so the medians of these minima moved by a
//! few percent between runs where `tokensieve bench`'s medians moved by half (a shared 2-core
//! Xeon, 2026-11-29). Not the benchmark of record: that is `tokensieve bench`, whose medians
//! the speed targets are stated in.
//!
//! ```sh
//! cargo run --release -p tokensieve --features bench --example draw_minima -- \
//!     32000 "top_p(0.95);dist" real 2000 6 transformers
//! ```
//!
//! Arguments: the vocabulary size, the chain, the rows (`peaked`, `flat`, `wide`, `real` for the
//! CLI's example row, SmolLM2-135M's, or a path to an f32 `.npy` row; a real row is cut or
//! tiled to the size with each copy 2.0 lower, as `tokensieve bench --rows real` does), the
//! number of draws, the number of passes, and optionally `transformers` for that convention.
//! Run the two builds in turn, a few times each.
use std::time::Instant;
use tokensieve::bench_rows::{row, Shape};
use tokensieve::sampler::BuildContext;
use tokensieve::{arch, Chain, Convention, Logits, RngConfig};

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: draw_minima VOCAB CHAIN peaked|flat|wide|real|ROW.npy DRAWS PASSES [transformers]";
    if !(5..=6).contains(&args.len()) {
        return Err(usage.into());
    }
    let number = |i: usize, what: &str| -> Result<usize, String> {
        args[i].parse().ok().filter(|&n| n > 0).ok_or_else(|| format!("{what} must be a positive integer ({usage})"))
    };
    let (v, draws, passes) = (number(0, "VOCAB")?, number(3, "DRAWS")?, number(4, "PASSES")?);
    let convention = match args.get(5).map(String::as_str) {
        None => Convention::LlamaCpp,
        Some("transformers") => Convention::Transformers,
        Some(other) => return Err(format!("unknown convention `{other}` ({usage})")),
    };
    let logits = match args[2].as_str() {
        "peaked" => row(Shape::Peaked, v, 0x5eed),
        "flat" => row(Shape::Flat, v, 0x5eed),
        "wide" => row(Shape::Wide, v, 0x5eed),
        path => {
            let path = match path {
                "real" => concat!(env!("CARGO_MANIFEST_DIR"), "/../tokensieve-cli/testdata/example-logits.npy"),
                other => other,
            };
            if !std::path::Path::new(path).is_file() {
                return Err(format!("{path}: no such file ({usage})"));
            }
            let (_, real) = tokensieve_testkit::cli::read_npy_f32(std::path::Path::new(path));
            if real.is_empty() {
                return Err(format!("{path}: an empty row"));
            }
            (0..v).map(|j| real[j % real.len()] - 2.0 * (j / real.len()) as f32).collect()
        }
    };
    let ctx = BuildContext::new(v, RngConfig::philox(42)).with_convention(convention);
    // Each draw's fastest time over the passes; every pass starts from the same seed, so draw
    // `i` is the same draw in each.
    let mut best = vec![f64::INFINITY; draws];
    let mut floor = f64::INFINITY;
    for _ in 0..passes {
        let mut chain = Chain::from_spec(&args[1], &ctx).map_err(|e| e.to_string())?;
        for b in &mut best {
            let t = Instant::now();
            std::hint::black_box(chain.sample(Logits::F32(&logits)).map_err(|e| e.to_string())?);
            *b = b.min(t.elapsed().as_secs_f64() * 1e6);
        }
        for _ in 0..draws.min(1000) {
            let t = Instant::now();
            std::hint::black_box(arch::max(std::hint::black_box(&logits)));
            floor = floor.min(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    let mean = best.iter().sum::<f64>() / draws as f64;
    best.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| best[((draws - 1) as f64 * q).round() as usize];
    println!(
        "{} at V = {v}: per-draw minima over {passes} passes of {draws} draws: median {:.2} µs, p90 {:.2}, mean {mean:.2}; fastest floor (max pass) {floor:.2} µs",
        args[1],
        at(0.5),
        at(0.9)
    );
    Ok(())
}
