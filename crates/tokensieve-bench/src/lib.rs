//! Benchmarks of tokensieve against in-process peers, on the same rows.
//!
//! * [`Workload`]: the table (llama.cpp's default chain, the same after penalties,
//!   top-p without top-k, temperature + dist, min-p, greedy, raw logprobs of the top 20).
//! * [`Peer`]: tokensieve, `token-sampling`, `llm-samplers` (feature `peers`, on by default)
//!   and candle-transformers' `LogitsProcessor` (feature `candle`). Each peer runs each
//!   workload the way its documentation says to use it (building its own candidate list,
//!   tensor or logits object per token when its API requires it), or reports that it has no
//!   equivalent (`None`).
//! * [`time_per_token`]: the median and p90 of one token, interleaved with the floor (one SIMD
//!   max pass over the same row), as `tokensieve bench` measures.
//!
//! `cargo bench -p tokensieve-bench` runs the criterion benchmarks (`benches/peers.rs`);
//! `cargo run -p tokensieve-bench --release --bin report` writes `BENCHMARKS.md`.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::hint::black_box;
use std::time::Instant;
use tokensieve::bench_rows::{self, Shape};
use tokensieve::sampler::BuildContext;
use tokensieve::{arch, logprobs, Chain, Logits, RngConfig, TokenLogprob};

/// One benchmarked workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// `top_k(40);top_p(0.95,1);min_p(0.05,1);temperature(0.8);dist`.
    Default,
    /// The default chain after `penalties(64,1.1,0.1,0.1)`.
    Penalties,
    /// `top_p(0.95,1);dist`: no top-k, the classic full-sort trap.
    TopP,
    /// `temperature(0.8);dist` over the full vocabulary.
    Temperature,
    /// `min_p(0.05,1);temperature(0.8);dist`.
    MinP,
    /// `greedy`.
    Greedy,
    /// Raw logprobs of the row's top 20 (alone).
    Logprobs,
}

impl Workload {
    /// Every workload, in table order.
    pub const ALL: [Workload; 7] = [
        Workload::Default,
        Workload::Penalties,
        Workload::TopP,
        Workload::Temperature,
        Workload::MinP,
        Workload::Greedy,
        Workload::Logprobs,
    ];

    /// The tokensieve spec (or `logprobs(20)`).
    pub fn spec(self) -> &'static str {
        match self {
            Workload::Default => "top_k(40);top_p(0.95,1);min_p(0.05,1);temperature(0.8);dist",
            Workload::Penalties => {
                "penalties(64,1.1,0.1,0.1);top_k(40);top_p(0.95,1);min_p(0.05,1);temperature(0.8);dist"
            }
            Workload::TopP => "top_p(0.95,1);dist",
            Workload::Temperature => "temperature(0.8);dist",
            Workload::MinP => "min_p(0.05,1);temperature(0.8);dist",
            Workload::Greedy => "greedy",
            Workload::Logprobs => "logprobs(20)",
        }
    }

    /// The same workload under the transformers convention, in the order generate() builds
    /// its processors (HF's repetition penalty standing in for llama.cpp's penalties), as
    /// `tokensieve bench --convention transformers` runs it.
    pub fn transformers_spec(self) -> &'static str {
        match self {
            Workload::Default => "temperature(0.8);top_k(40);top_p(0.95);min_p(0.05);dist",
            Workload::Penalties => "repetition_penalty(1.1);temperature(0.8);top_k(40);top_p(0.95);min_p(0.05);dist",
            Workload::TopP => "top_p(0.95);dist",
            Workload::Temperature => "temperature(0.8);dist",
            Workload::MinP => "temperature(0.8);min_p(0.05);dist",
            Workload::Greedy => "greedy",
            Workload::Logprobs => "logprobs(20)",
        }
    }

    /// A short name for tables and benchmark ids.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Default => "default",
            Workload::Penalties => "penalties+default",
            Workload::TopP => "top_p",
            Workload::Temperature => "temperature+dist",
            Workload::MinP => "min_p",
            Workload::Greedy => "greedy",
            Workload::Logprobs => "logprobs20",
        }
    }
}

/// A sampling implementation under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// This workspace's library.
    Tokensieve,
    /// The `token-sampling` crate.
    #[cfg(feature = "peers")]
    TokenSampling,
    /// The `llm-samplers` crate.
    #[cfg(feature = "peers")]
    LlmSamplers,
    /// candle-transformers' `LogitsProcessor` (+ `utils::apply_repeat_penalty`).
    #[cfg(feature = "candle")]
    Candle,
}

impl Peer {
    /// Every peer compiled in, tokensieve first.
    pub fn all() -> Vec<Peer> {
        #[allow(unused_mut)]
        let mut v = vec![Peer::Tokensieve];
        #[cfg(feature = "peers")]
        v.extend([Peer::TokenSampling, Peer::LlmSamplers]);
        #[cfg(feature = "candle")]
        v.push(Peer::Candle);
        v
    }

    /// The crate name.
    pub fn name(self) -> &'static str {
        match self {
            Peer::Tokensieve => "tokensieve",
            #[cfg(feature = "peers")]
            Peer::TokenSampling => "token-sampling",
            #[cfg(feature = "peers")]
            Peer::LlmSamplers => "llm-samplers",
            #[cfg(feature = "candle")]
            Peer::Candle => "candle-transformers",
        }
    }

    /// A closure sampling one token from `row` per call (accepting it into the peer's history
    /// where the workload has penalties), or `None` when the peer has no equivalent.
    pub fn runner<'a>(self, w: Workload, row: &'a [f32]) -> Option<Box<dyn FnMut() -> u32 + 'a>> {
        match self {
            Peer::Tokensieve => Some(tokensieve_runner(w, row)),
            #[cfg(feature = "peers")]
            Peer::TokenSampling => peers::token_sampling(w, row),
            #[cfg(feature = "peers")]
            Peer::LlmSamplers => peers::llm_samplers(w, row),
            #[cfg(feature = "candle")]
            Peer::Candle => candle_peer::runner(w, row),
        }
    }
}

/// The 64-token history every penalties workload starts from (spread over the vocabulary).
pub fn history(v: usize) -> Vec<u32> {
    (0..64u64).map(|j| ((j * 7919 + 13) % v as u64) as u32).collect()
}

/// The benchmark row: [`bench_rows`]' peaked shape (entropy 1.5 nats).
pub fn row(v: usize) -> Vec<f32> {
    bench_rows::row(Shape::Peaked, v, 0x5eed)
}

/// tokensieve on workload `w` under the transformers convention (raw logprobs are the same
/// under both).
pub fn tokensieve_transformers_runner(w: Workload, row: &[f32]) -> Box<dyn FnMut() -> u32 + '_> {
    if w == Workload::Logprobs {
        return tokensieve_runner(w, row);
    }
    let ctx = BuildContext::new(row.len(), RngConfig::philox(42)).with_convention(tokensieve::Convention::Transformers);
    let mut chain = Chain::from_spec(w.transformers_spec(), &ctx).expect("the workload specs build");
    for t in history(row.len()) {
        chain.accept(t);
    }
    Box::new(move || chain.sample(row).expect("a peaked row samples"))
}

fn tokensieve_runner(w: Workload, row: &[f32]) -> Box<dyn FnMut() -> u32 + '_> {
    tokensieve_logits_runner(w, Logits::F32(row), row.len())
}

/// tokensieve on workload `w` (llama.cpp convention) over a row of `v` logits in any dtype.
pub fn tokensieve_logits_runner(w: Workload, row: Logits<'_>, v: usize) -> Box<dyn FnMut() -> u32 + '_> {
    if w == Workload::Logprobs {
        let mut buf: Vec<TokenLogprob> = Vec::with_capacity(21);
        return Box::new(move || {
            black_box(logprobs::raw(row, 0, 20, &mut buf));
            buf[0].token
        });
    }
    let mut chain =
        Chain::from_spec(w.spec(), &BuildContext::new(v, RngConfig::philox(42))).expect("the workload specs build");
    for t in history(v) {
        chain.accept(t);
    }
    Box::new(move || chain.sample(row).expect("a peaked row samples"))
}

#[cfg(feature = "peers")]
mod peers {
    use super::{history, Workload};

    pub fn token_sampling(w: Workload, row: &[f32]) -> Option<Box<dyn FnMut() -> u32 + '_>> {
        use token_sampling::{Dist, Greedy, MinP, Penalties, SamplerChain, SplitMix64, Temperature, TopK, TopP};
        let default = |c: SamplerChain| {
            c.push(TopK { k: 40 })
                .push(TopP { p: 0.95, min_keep: 1 })
                .push(MinP { p: 0.05, min_keep: 1 })
                .push(Temperature { t: 0.8 })
                .push(Dist)
        };
        let chain = match w {
            Workload::Default => default(SamplerChain::new()),
            Workload::Penalties => {
                default(SamplerChain::new().push(Penalties { last_n: 64, repeat: 1.1, freq: 0.1, presence: 0.1 }))
            }
            Workload::TopP => SamplerChain::new().push(TopP { p: 0.95, min_keep: 1 }).push(Dist),
            Workload::Temperature => SamplerChain::new().push(Temperature { t: 0.8 }).push(Dist),
            Workload::MinP => {
                SamplerChain::new().push(MinP { p: 0.05, min_keep: 1 }).push(Temperature { t: 0.8 }).push(Dist)
            }
            Workload::Greedy => SamplerChain::new().push(Greedy),
            Workload::Logprobs => return None,
        };
        let mut chain = chain;
        let mut rng = SplitMix64::new(42);
        let mut logits = row.to_vec(); // its API takes `&mut [f32]`; it does not write to it
        let mut hist = history(row.len());
        Some(Box::new(move || {
            let window = &hist[hist.len().saturating_sub(64)..];
            let t = chain.sample(&mut logits, window, &mut rng).expect("token-sampling samples");
            hist.push(t);
            if hist.len() > 4096 {
                hist.drain(..hist.len() - 64);
            }
            t
        }))
    }

    pub fn llm_samplers(w: Workload, row: &[f32]) -> Option<Box<dyn FnMut() -> u32 + '_>> {
        use llm_samplers::prelude::*;
        use rand::{rngs::StdRng, SeedableRng};
        let default = |c: SamplerChain| {
            c + SampleTopK::new(40, 1)
                + SampleTopP::new(0.95, 1)
                + SampleMinP::new(0.05, 1)
                + SampleTemperature::new(0.8)
                + SampleRandDistrib::new()
        };
        let chain = match w {
            Workload::Default => default(SamplerChain::new()),
            Workload::Penalties => {
                default(SamplerChain::new() + SampleRepetition::new(1.1, 64) + SampleFreqPresence::new(0.1, 0.1, 64))
            }
            Workload::TopP => SamplerChain::new() + SampleTopP::new(0.95, 1) + SampleRandDistrib::new(),
            Workload::Temperature => SamplerChain::new() + SampleTemperature::new(0.8) + SampleRandDistrib::new(),
            Workload::MinP => {
                SamplerChain::new() + SampleMinP::new(0.05, 1) + SampleTemperature::new(0.8) + SampleRandDistrib::new()
            }
            Workload::Greedy => SamplerChain::new() + SampleGreedy::new(),
            Workload::Logprobs => return None,
        };
        let mut chain = chain;
        let mut res = SimpleSamplerResources::new(Some(Box::new(StdRng::seed_from_u64(42))), Some(history(row.len())));
        Some(Box::new(move || {
            // Its samplers reorder and prune the logits object, so it is rebuilt per token.
            let mut logits = Logits::try_from_iter(row.iter().copied()).expect("finite logits");
            let t = chain.sample_token(&mut res, &mut logits).expect("llm-samplers samples").expect("a token");
            let _ = res.with_last_tokens_mut(&mut |tokens| {
                tokens.push(t);
                if tokens.len() > 4096 {
                    tokens.drain(..tokens.len() - 64);
                }
            });
            t
        }))
    }
}

#[cfg(feature = "candle")]
mod candle_peer {
    use super::{history, Workload};
    use candle_core::{Device, Tensor};
    use candle_transformers::generation::{LogitsProcessor, Sampling};

    /// candle has no min-p; its top-k-then-top-p stands for llama.cpp's default chain (without
    /// the min-p step) and `apply_repeat_penalty` (repeat only) for the penalties.
    pub fn runner(w: Workload, row: &[f32]) -> Option<Box<dyn FnMut() -> u32 + '_>> {
        let sampling = match w {
            Workload::Default | Workload::Penalties => Sampling::TopKThenTopP { k: 40, p: 0.95, temperature: 0.8 },
            Workload::TopP => Sampling::TopP { p: 0.95, temperature: 1.0 },
            Workload::Temperature => Sampling::All { temperature: 0.8 },
            Workload::Greedy => Sampling::ArgMax,
            Workload::MinP | Workload::Logprobs => return None,
        };
        let logits = Tensor::from_slice(row, row.len(), &Device::Cpu).ok()?;
        let mut lp = LogitsProcessor::from_sampling(42, sampling);
        let mut hist = history(row.len());
        let penalties = w == Workload::Penalties;
        Some(Box::new(move || {
            let t = if penalties {
                let window = &hist[hist.len().saturating_sub(64)..];
                let l = candle_transformers::utils::apply_repeat_penalty(&logits, 1.1, window).expect("penalty");
                lp.sample(&l).expect("candle samples")
            } else {
                lp.sample(&logits).expect("candle samples")
            };
            hist.push(t);
            if hist.len() > 4096 {
                hist.drain(..hist.len() - 64);
            }
            t
        }))
    }
}

/// Median and p90 microseconds of one call of `step`, and the floor's median (one
/// [`arch::max`] pass over `row`, timed interleaved with `step`), over at least `seconds`.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Median µs per token.
    pub median_us: f64,
    /// 90th percentile µs per token.
    pub p90_us: f64,
    /// Median µs of one max pass over the row.
    pub floor_us: f64,
}

/// See [`Timing`].
pub fn time_per_token(row: &[f32], seconds: f64, mut step: impl FnMut() -> u32) -> Timing {
    let floor = || {
        let t = Instant::now();
        black_box(arch::max(black_box(row)));
        t.elapsed().as_secs_f64() * 1e6
    };
    let warm = Instant::now();
    let mut n = 0;
    while warm.elapsed().as_secs_f64() < 0.05 || n < 3 {
        floor();
        black_box(step());
        n += 1;
    }
    let (mut s, mut f) = (Vec::new(), Vec::new());
    let start = Instant::now();
    while (start.elapsed().as_secs_f64() < seconds || s.len() < 20) && s.len() < 1_000_000 {
        f.push(floor());
        let t = Instant::now();
        black_box(step());
        s.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let q = |v: &mut Vec<f64>, q: f64| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[((v.len() - 1) as f64 * q).round() as usize]
    };
    Timing { median_us: q(&mut s, 0.5), p90_us: q(&mut s, 0.9), floor_us: q(&mut f, 0.5) }
}
