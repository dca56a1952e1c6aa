//! Reproducibility: the same seed gives the same tokens whatever runs them.
//!
//! * Thread count: `batch::sample` inside rayon pools of 1, 2 and 4 threads, and a plain
//!   sequential loop, give identical tokens (and identical logprobs) for every row.
//! * Batch composition: with Philox, a row's tokens depend only on (seed, sequence id, its
//!   own chain and logits): sampled alone, in a batch of 8, with the rows permuted, or next
//!   to different neighbours, they are the same. With MT19937 each chain carries its own
//!   stream, so the same holds.
//! * `reset` restarts every stream (MT19937 and Philox) and state (penalty window, mirostat's
//!   `mu`): the same history and rows give the same tokens again.
//! * `clone` forks a sequence: the original and the clone continue identically, and neither
//!   disturbs the other.

use rayon::ThreadPoolBuilder;
use tokensieve::sampler::BuildContext;
use tokensieve::{batch, Chain, LogitsBatch, LogprobsMode, RngConfig, Sampled};
use tokensieve_testkit::generate::{self, RowKind};

const V: usize = 500;
const B: usize = 8;
const STEPS: usize = 12;

/// Chains covering every drawing stage and the stateful ones.
fn specs() -> Vec<&'static str> {
    let all = [
        "dist",
        "top_k(40);top_p(0.95,1);min_p(0.05,1);temperature(0.8);dist",
        "top_k(40);temperature(1.5);dist",
        "penalties(64,1.3,0.2,0.2);top_k(50);dist",
        "xtc(0.5,0.1,1);dist",
        "typical(0.9,1);temp_ext(0.8,0.5,1);dist",
        "top_n_sigma(1.5);dist",
        "temperature(0.8);mirostat(5,0.1,100)",
        "mirostat_v2(4,0.2)",
        "gumbel(0.9)",
        "logit_bias(3:2.5 7:-inf);top_k(20);greedy",
    ];
    all.to_vec()
}

fn rows() -> Vec<Vec<f32>> {
    let kinds = [
        RowKind::Peaked,
        RowKind::Gaussian,
        RowKind::Ties,
        RowKind::NegInf,
        RowKind::Flat,
        RowKind::ShiftedUp,
        RowKind::Bf16,
        RowKind::ShiftedDown,
    ];
    kinds.iter().enumerate().map(|(i, &k)| generate::row(k, V, 1000 + i as u64)).collect()
}

/// A history so that penalties have something to bite on.
fn history() -> Vec<u32> {
    (0..40).map(|i| (i * 7 % 13) as u32).collect()
}

fn rng(kind_mt: bool, sequence: u32) -> RngConfig {
    if kind_mt {
        // MT19937 has no sequence id: give each row its own seed instead.
        RngConfig::mt19937(4242 + sequence)
    } else {
        RngConfig::philox(4242).with_sequence(sequence)
    }
}

fn chain(spec: &str, rng: RngConfig) -> Chain {
    let mut c = Chain::from_spec(spec, &BuildContext::new(V, rng)).unwrap();
    for t in history() {
        c.accept(t);
    }
    c
}

fn flatten(rows: &[&[f32]]) -> Vec<f32> {
    rows.iter().flat_map(|r| r.iter().copied()).collect()
}

/// `STEPS` steps of `batch::sample`; result `[row][step]`.
fn run_batch(chains: &mut [Chain], rows: &[&[f32]]) -> Vec<Vec<u32>> {
    let data = flatten(rows);
    let batch = LogitsBatch::new(&data[..], rows.len(), V).unwrap();
    let mut out = vec![Vec::with_capacity(STEPS); rows.len()];
    for _ in 0..STEPS {
        for (i, r) in batch::sample(chains, &batch).unwrap().into_iter().enumerate() {
            out[i].push(r.unwrap());
        }
    }
    out
}

/// The same with logprobs.
fn run_batch_logprobs(chains: &mut [Chain], rows: &[&[f32]]) -> Vec<Vec<Sampled>> {
    let data = flatten(rows);
    let batch = LogitsBatch::new(&data[..], rows.len(), V).unwrap();
    let mut out = vec![Vec::with_capacity(STEPS); rows.len()];
    for _ in 0..STEPS {
        let results = batch::sample_with_logprobs(chains, &batch, LogprobsMode::Raw, 5).unwrap();
        for (i, r) in results.into_iter().enumerate() {
            out[i].push(r.unwrap());
        }
    }
    out
}

#[test]
fn same_tokens_whatever_the_thread_count() {
    let rows = rows();
    let row_refs: Vec<&[f32]> = rows.iter().map(|r| &r[..]).collect();
    for spec in specs() {
        for mt in [false, true] {
            let fresh = || (0..B as u32).map(|q| chain(spec, rng(mt, q))).collect::<Vec<_>>();
            // Reference: one row at a time, no rayon.
            let mut sequential = fresh();
            let expected: Vec<Vec<u32>> = sequential
                .iter_mut()
                .zip(&row_refs)
                .map(|(c, r)| (0..STEPS).map(|_| c.sample(*r).unwrap()).collect())
                .collect();
            let mut expected_lp = None;
            for threads in [1, 2, 4] {
                let pool = ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                let mut chains = fresh();
                let got = pool.install(|| run_batch(&mut chains, &row_refs));
                assert_eq!(got, expected, "`{spec}` (mt19937: {mt}) with {threads} threads");
                let mut chains = fresh();
                let lp = pool.install(|| run_batch_logprobs(&mut chains, &row_refs));
                let tokens: Vec<Vec<u32>> = lp.iter().map(|r| r.iter().map(|s| s.token).collect()).collect();
                assert_eq!(tokens, expected, "`{spec}` (mt19937: {mt}) logprobs run, {threads} threads");
                match &expected_lp {
                    None => expected_lp = Some(lp),
                    Some(e) => assert_eq!(&lp, e, "`{spec}` (mt19937: {mt}): logprobs differ with {threads} threads"),
                }
            }
        }
    }
}

#[test]
fn same_tokens_whatever_the_batch_composition() {
    let rows = rows();
    // Other rows to sit beside, never seen by the row under test.
    let strangers: Vec<Vec<f32>> = (0..B).map(|i| generate::row(RowKind::Gaussian, V, 77 + i as u64)).collect();
    let permutation = [5usize, 2, 7, 0, 3, 6, 1, 4];
    for spec in specs() {
        for mt in [false, true] {
            let seq = |r: usize| 100 + 7 * r as u32;
            // Alone: a batch of one per row.
            let alone: Vec<Vec<u32>> = (0..B)
                .map(|r| {
                    let mut c = vec![chain(spec, rng(mt, seq(r)))];
                    run_batch(&mut c, &[&rows[r][..]]).remove(0)
                })
                .collect();
            // All eight in order.
            let mut chains: Vec<Chain> = (0..B).map(|r| chain(spec, rng(mt, seq(r)))).collect();
            let refs: Vec<&[f32]> = rows.iter().map(|r| &r[..]).collect();
            assert_eq!(run_batch(&mut chains, &refs), alone, "`{spec}` (mt19937: {mt}): batch of 8 vs alone");
            // Permuted.
            let mut chains: Vec<Chain> = permutation.iter().map(|&r| chain(spec, rng(mt, seq(r)))).collect();
            let refs: Vec<&[f32]> = permutation.iter().map(|&r| &rows[r][..]).collect();
            let got = run_batch(&mut chains, &refs);
            for (pos, &r) in permutation.iter().enumerate() {
                assert_eq!(got[pos], alone[r], "`{spec}` (mt19937: {mt}): row {r} at position {pos}");
            }
            // Row 0 among strangers, at the last position.
            let mut chains: Vec<Chain> = (0..B - 1).map(|i| chain(spec, rng(mt, 900 + i as u32))).collect();
            chains.push(chain(spec, rng(mt, seq(0))));
            let mut refs: Vec<&[f32]> = strangers[..B - 1].iter().map(|r| &r[..]).collect();
            refs.push(&rows[0][..]);
            assert_eq!(run_batch(&mut chains, &refs)[B - 1], alone[0], "`{spec}` (mt19937: {mt}): among strangers");
        }
    }
}

#[test]
fn philox_sequence_ids_and_seeds_give_different_streams() {
    let row = generate::row(RowKind::Flat, V, 1);
    let tokens = |rng: RngConfig| {
        let mut c = chain("dist", rng);
        (0..STEPS).map(|_| c.sample(&row).unwrap()).collect::<Vec<_>>()
    };
    let base = tokens(RngConfig::philox(9).with_sequence(1));
    assert_eq!(base, tokens(RngConfig::philox(9).with_sequence(1)));
    assert_ne!(base, tokens(RngConfig::philox(9).with_sequence(2)));
    assert_ne!(base, tokens(RngConfig::philox(10).with_sequence(1)));
}

#[test]
fn reset_restarts_every_stream_and_state() {
    let rows = rows();
    for spec in specs() {
        for mt in [false, true] {
            let mut c = chain(spec, rng(mt, 3));
            let run = |c: &mut Chain| -> Vec<u32> {
                (0..2 * STEPS).map(|i| c.sample(&rows[i % rows.len()][..]).unwrap()).collect()
            };
            let first = run(&mut c);
            c.reset();
            assert_eq!(c.n_accepted(), 0);
            for t in history() {
                c.accept(t);
            }
            assert_eq!(run(&mut c), first, "`{spec}` (mt19937: {mt}) after reset");
        }
    }
}

#[test]
fn clone_forks_identically_and_independently() {
    let rows = rows();
    for spec in specs() {
        for mt in [false, true] {
            let mut original = chain(spec, rng(mt, 5));
            for row in &rows[..5] {
                original.sample(&row[..]).unwrap();
            }
            let mut fork = original.clone();
            let mut spare = original.clone();
            let continue_ = |c: &mut Chain| -> Vec<u32> {
                (0..STEPS).map(|i| c.sample(&rows[(i + 3) % rows.len()][..]).unwrap()).collect()
            };
            let a = continue_(&mut original);
            // The original moved on; the fork must still be where it was cloned.
            let b = continue_(&mut fork);
            assert_eq!(a, b, "`{spec}` (mt19937: {mt}): clone diverged");
            assert_eq!(continue_(&mut spare), a, "`{spec}` (mt19937: {mt}): second clone diverged");
        }
    }
}
