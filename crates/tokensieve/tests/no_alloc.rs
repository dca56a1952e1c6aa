//! Zero heap allocations per token after warm-up: a counting global allocator watches the
//! sampling calls of this thread only (other test threads allocate freely).
//!
//! Each chain samples a few tokens to warm up (buffers reach their final size, penalty windows
//! fill), then must sample many more without a single allocation.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use tokensieve::{sampler::BuildContext, Chain, Convention, Logits, LogprobsMode, RngConfig, TokenLogprob};
use tokensieve_testkit::generate::{self, RowKind};

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<usize> = const { Cell::new(0) };
}

fn note_allocation() {
    // `try_with`: the thread-locals may already be gone while a thread shuts down.
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = COUNT.try_with(|c| c.set(c.get() + 1));
        }
    });
}

// SAFETY: every call forwards to `System` with the caller's arguments unchanged, so the
// `GlobalAlloc` contract is upheld by `System`; the bookkeeping touches only const-initialised
// thread-locals (no allocation, no re-entrancy).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: forwarded unchanged (see above).
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: forwarded unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation();
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made by `f` on this thread.
fn allocations(f: impl FnOnce()) -> usize {
    COUNT.with(|c| c.set(0));
    COUNTING.with(|on| on.set(true));
    f();
    COUNTING.with(|on| on.set(false));
    COUNT.with(|c| c.get())
}

const CHAINS: &[&str] = &[
    "top_k(40);top_p(0.95,1);min_p(0.05,1);temperature(0.8);dist",
    "penalties(64,1.1,0.1,0.1);top_k(40);top_p(0.95,1);min_p(0.05,1);temperature(0.8);dist",
    "top_p(0.95,1);dist",
    "temperature(0.8);dist",
    "min_p(0.05,1);temperature(0.8);dist",
    "greedy",
    // llama.cpp's default chain with `top_k` off: `top_p`'s cut bounded, then `min_p`.
    "top_p(0.95,1);min_p(0.05,1);temperature(0.8);dist",
    // The same without `min_p`: the draw certified through the temperature.
    "top_p(0.95,1);temperature(0.8);dist",
    // Edits and a temperature written into a reused copy of the row.
    "penalties(64,1.1,0.1,0.1);top_p(0.95,1);dist",
    "logit_bias(5:1.5 9:-inf);temperature(0.8);top_p(0.95,1);dist",
    // The temperature first: the top of the raw row, divided.
    "temperature(0.8);top_k(40);top_p(0.95,1);min_p(0.05,1);dist",
    "temperature(0.8);min_p(0.05,1);dist",
];

/// Samples `row` `warm` times with `chain`, then asserts that `measured` more tokens
/// allocate nothing.
fn assert_quiet_after_warm_up(chain: &mut Chain, row: &[f32], warm: usize, measured: usize, label: &str) {
    for step in 0..warm {
        chain.sample(row).unwrap_or_else(|e| panic!("{label}, warm-up step {step}: {e}"));
    }
    let n = allocations(|| {
        for _ in 0..measured {
            chain.sample(row).unwrap();
        }
    });
    assert_eq!(n, 0, "{label} allocated {n} times in {measured} tokens after warm-up");
}

#[test]
fn sampling_allocates_nothing_after_warm_up() {
    for vocab in [32_000usize, 128_256] {
        let row = generate::row(RowKind::Peaked, vocab, 7);
        for spec in CHAINS {
            for rng in [RngConfig::philox(3), RngConfig::mt19937(3)] {
                let mut chain = Chain::from_spec(spec, &BuildContext::new(vocab, rng)).unwrap();
                // Sampling the same row over and over, `penalties` before `top_p` keeps moving
                // to new tokens: its window holds more distinct ones for a few hundred steps,
                // and its counts and the overlay grow with them (to at most 64).
                assert_quiet_after_warm_up(&mut chain, &row, 400, 32, &format!("`{spec}` (V = {vocab}, {rng:?})"));
            }
        }
    }
}

/// Penalties before `top_k` on a nearly flat row, where the sampled tokens are the row's top
/// ones and the fast path lowers the maxima of their blocks: its buffers are sized on the
/// first token, whichever later token first needs them.
#[test]
fn penalties_on_a_nearly_flat_row_allocate_nothing_after_warm_up() {
    let vocab = 32_000;
    let row: Vec<f32> = generate::row(RowKind::Gaussian, vocab, 7).iter().map(|x| x / 60.0).collect();
    for (spec, convention) in [
        ("penalties(64,1.1,0.1,0.1);top_k(40);top_p(0.95,1);min_p(0.05,1);temperature(0.8);dist", Convention::LlamaCpp),
        ("repetition_penalty(1.1);temperature(0.8);top_k(40);top_p(0.95);min_p(0.05);dist", Convention::Transformers),
    ] {
        let ctx = BuildContext::new(vocab, RngConfig::philox(3)).with_convention(convention);
        let mut chain = Chain::from_spec(spec, &ctx).unwrap();
        assert_quiet_after_warm_up(&mut chain, &row, 400, 32, &format!("`{spec}`"));
    }
}

/// The same chains and raw logprobs on f16 and bf16 rows (widened into reused buffers; their
/// ties take `top_k`'s heap replay and its draw on the ranking).
#[test]
fn half_precision_sampling_allocates_nothing_after_warm_up() {
    use half::{bf16, f16};
    let vocab = 32_000;
    let row = generate::row(RowKind::Peaked, vocab, 7);
    let h: Vec<f16> = row.iter().map(|&x| f16::from_f32(x)).collect();
    let b: Vec<bf16> = row.iter().map(|&x| bf16::from_f32(x)).collect();
    for (dtype, logits) in [("f16", Logits::F16(&h)), ("bf16", Logits::Bf16(&b))] {
        for spec in CHAINS {
            let mut chain = Chain::from_spec(spec, &BuildContext::new(vocab, RngConfig::philox(3))).unwrap();
            let mut top: Vec<TokenLogprob> = Vec::new();
            for step in 0..80 {
                chain.sample(logits).unwrap_or_else(|e| panic!("{spec}, warm-up step {step}: {e}"));
                chain.sample_with_logprobs_into(logits, LogprobsMode::Raw, 20, &mut top).unwrap();
            }
            let n = allocations(|| {
                for _ in 0..32 {
                    chain.sample(logits).unwrap();
                    chain.sample_with_logprobs_into(logits, LogprobsMode::Raw, 20, &mut top).unwrap();
                }
            });
            assert_eq!(n, 0, "`{spec}` on {dtype} allocated {n} times in 32 tokens after warm-up");
        }
    }
}

/// The transformers convention's chains (the bench's table but `repetition_penalty`, whose
/// list of seen tokens grows with every new token, as transformers' `input_ids` do).
const TRANSFORMERS_CHAINS: &[&str] = &[
    "temperature(0.8);top_k(40);top_p(0.95);min_p(0.05);dist",
    "top_p(0.95);dist",
    "temperature(0.8);dist",
    "temperature(0.8);min_p(0.05);dist",
    "greedy",
    // Masks written into a reused copy of the row.
    "suppress_tokens(1 2 3);temperature(0.8);top_p(0.95);dist",
    // The warpers after `top_k` on the view it leaves.
    "temperature(0.8);top_k(50);typical(0.9);dist",
    "temperature(0.8);top_k(50);epsilon(0.0003);dist",
    "temperature(0.8);top_k(50);eta(0.0003);dist",
];

#[test]
fn transformers_sampling_allocates_nothing_after_warm_up() {
    let vocab = 128_256;
    let row = generate::row(RowKind::Peaked, vocab, 7);
    for spec in TRANSFORMERS_CHAINS {
        let ctx = BuildContext::new(vocab, RngConfig::philox(3)).with_convention(Convention::Transformers);
        let mut chain = Chain::from_spec(spec, &ctx).unwrap();
        assert_quiet_after_warm_up(&mut chain, &row, 40, 16, &format!("transformers `{spec}`"));
    }
}

/// llama.cpp's mirostats on the row's top entries: on the same peaked row over and over, `mu`
/// climbs until the whole row is kept (by step 120 or so), after which every buffer has its
/// size.
#[test]
fn mirostat_allocates_nothing_once_mu_has_settled() {
    let vocab = 32_000;
    let row = generate::row(RowKind::Peaked, vocab, 7);
    for spec in ["mirostat_v2(5,0.1)", "temperature(0.8);mirostat_v2(5,0.1)", "mirostat(5,0.1,100)"] {
        let mut chain = Chain::from_spec(spec, &BuildContext::new(vocab, RngConfig::mt19937(3))).unwrap();
        for step in 0..200 {
            chain.sample(&row).unwrap_or_else(|e| panic!("{spec}, warm-up step {step}: {e}"));
        }
        let n = allocations(|| {
            for _ in 0..16 {
                chain.sample(&row).unwrap();
            }
        });
        assert_eq!(n, 0, "`{spec}` allocated {n} times in 16 tokens after warm-up");
    }
}

#[test]
fn logprobs_into_a_caller_buffer_allocate_nothing_after_warm_up() {
    let vocab = 128_256;
    let row = generate::row(RowKind::Peaked, vocab, 11);
    for mode in [LogprobsMode::Raw, LogprobsMode::Processed] {
        let mut chain = Chain::from_spec(CHAINS[0], &BuildContext::new(vocab, RngConfig::philox(5))).unwrap();
        let mut top: Vec<TokenLogprob> = Vec::new();
        for _ in 0..8 {
            chain.sample_with_logprobs_into(&row, mode, 20, &mut top).unwrap();
        }
        let n = allocations(|| {
            for _ in 0..16 {
                chain.sample_with_logprobs_into(&row, mode, 20, &mut top).unwrap();
            }
        });
        // Processed mode reports only the candidates the chain left (2 here).
        let expected_len = if mode == LogprobsMode::Raw { 20 } else { chain.candidates().count_finite().min(20) };
        assert_eq!(top.len(), expected_len);
        assert_eq!(n, 0, "{mode:?} logprobs allocated {n} times in 16 tokens after warm-up");
    }
}
