//! Goodness of fit: the drawing stages sample from the distribution they claim.
//!
//! Each test draws N tokens with fixed seeds (so the suite is deterministic: it either always
//! passes or always fails, never flakes), counts them per token id, and runs Pearson's
//! chi-square test against the expected probabilities from the f64 oracles of
//! `tokensieve_testkit::reference`:
//!
//! * `dist` (Philox and MT19937): `softmax(logits)` over the candidates it receives;
//! * `gumbel(T)`: `softmax(logits / T)`;
//! * `mirostat` / `mirostat_v2`: the softmax over the candidates their truncation keeps at a
//!   fixed `mu` (the initial `2·tau`). Their state moves after each draw, so every draw uses a
//!   fresh chain with its own seed (MT19937) or sequence id (Philox).
//!
//! Bins whose expected count is below 5 are pooled. The statistic is compared with the
//! chi-square critical value at p = 0.001 for the bins' degrees of freedom, computed with the
//! Wilson–Hilferty approximation ([`chi_square_critical`]). A draw of a token the expected
//! distribution gives probability 0 fails immediately. One test checks the procedure has
//! power: a slightly wrong expectation is rejected.

use tokensieve::sampler::BuildContext;
use tokensieve::{Chain, RngConfig};
use tokensieve_testkit::reference::{self as oracle, Cand};

/// Draws per test: enough to detect a few-percent error in a bin of probability 0.01.
const DRAWS: usize = 40_000;
/// Fewer for the mirostats, which build a fresh chain per draw.
const FRESH_DRAWS: usize = 20_000;

/// Upper 0.001 quantile of the standard normal distribution.
const Z_0_999: f64 = 3.090_232_306_167_813;

/// Critical value of the chi-square distribution with `dof` degrees of freedom at
/// significance 0.001, by the Wilson–Hilferty approximation: `(X/k)^(1/3)` is close to
/// normal with mean `1 − 2/(9k)` and variance `2/(9k)`, so
/// `χ²_crit ≈ k · (1 − 2/(9k) + z · sqrt(2/(9k)))³` with `z` the normal quantile. It errs on
/// the high side by about 3% at k = 1, 2% at k = 2 and under 1% from k = 10 on
/// (`wilson_hilferty_matches_tables`).
fn chi_square_critical(dof: usize) -> f64 {
    let k = dof as f64;
    let a = 2.0 / (9.0 * k);
    k * (1.0 - a + Z_0_999 * a.sqrt()).powi(3)
}

#[derive(Debug)]
struct Fit {
    stat: f64,
    dof: usize,
    critical: f64,
}

/// Pearson's chi-square of `counts` (indexed by token id) against `expected` probabilities
/// (same indexing, summing to 1). Bins with an expected count below 5 are pooled (and the
/// pool merged into the smallest bin if it is itself below 5).
fn goodness_of_fit(counts: &[u64], expected: &[f64]) -> Fit {
    assert_eq!(counts.len(), expected.len());
    let n: u64 = counts.iter().sum();
    let total_p: f64 = expected.iter().sum();
    assert!((total_p - 1.0).abs() < 1e-9, "expected probabilities sum to {total_p}");
    for (id, (&c, &p)) in counts.iter().zip(expected).enumerate() {
        assert!(!(c > 0 && p == 0.0), "token {id} was drawn {c} times but has probability 0");
    }
    let mut bins: Vec<(f64, f64)> = Vec::new(); // (observed, expected count)
    let mut pool = (0.0, 0.0);
    for (&c, &p) in counts.iter().zip(expected) {
        let e = p * n as f64;
        if e >= 5.0 {
            bins.push((c as f64, e));
        } else if p > 0.0 {
            pool.0 += c as f64;
            pool.1 += e;
        }
    }
    if pool.1 >= 5.0 {
        bins.push(pool);
    } else if pool.1 > 0.0 {
        let smallest = bins
            .iter_mut()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .expect("at least one bin has an expected count of 5 or more");
        smallest.0 += pool.0;
        smallest.1 += pool.1;
    }
    assert!(bins.len() >= 2, "a goodness-of-fit test needs at least two bins");
    let stat = bins.iter().map(|(o, e)| (o - e) * (o - e) / e).sum();
    let dof = bins.len() - 1;
    Fit { stat, dof, critical: chi_square_critical(dof) }
}

fn assert_fits(name: &str, counts: &[u64], expected: &[f64]) {
    let fit = goodness_of_fit(counts, expected);
    eprintln!("{name}: chi-square {:.2} on {} dof (critical {:.2} at p = 0.001)", fit.stat, fit.dof, fit.critical);
    assert!(
        fit.stat < fit.critical,
        "{name}: the draws do not follow the expected distribution: chi-square {:.2} >= {:.2} ({} dof)\ncounts {counts:?}\nexpected {expected:?}",
        fit.stat,
        fit.critical,
        fit.dof
    );
}

/// A 32-token row with spread-out probabilities (largest about 0.2), a `-inf` entry and an
/// exact tie, in no particular order.
fn spread_row() -> Vec<f32> {
    let mut row: Vec<f32> = (0..32).map(|i| ((i * 13) % 32) as f32 * 0.11 - 2.0).collect();
    row[5] = f32::NEG_INFINITY;
    row[9] = row[20];
    row
}

/// A 64-token Zipf-like row (`−1.2·ln rank`), shuffled: what mirostat is designed for.
fn zipf_row() -> Vec<f32> {
    let mut ranks: Vec<usize> = (1..=64).collect();
    // A fixed permutation (multiplication by 27 mod 64 is a bijection on 0..64).
    ranks.sort_by_key(|&r| (r * 27) % 64);
    ranks.iter().map(|&r| -1.2 * (r as f32).ln()).collect()
}

/// Expected distribution over token ids: softmax of `set`'s logits, 0 for ids not in it.
fn expected_over_ids(v: usize, set: &[Cand]) -> Vec<f64> {
    let mut p = vec![0.0; v];
    for (c, q) in set.iter().zip(oracle::softmax(set)) {
        p[c.0 as usize] = q;
    }
    p
}

/// `DRAWS` tokens from one chain on one row (each `sample` accepts, so the RNG moves on).
fn sequential_counts(spec: &str, row: &[f32], rng: RngConfig) -> Vec<u64> {
    let mut chain = Chain::from_spec(spec, &BuildContext::new(row.len(), rng)).unwrap();
    let mut counts = vec![0u64; row.len()];
    for _ in 0..DRAWS {
        counts[chain.sample(row).unwrap() as usize] += 1;
    }
    counts
}

/// `FRESH_DRAWS` tokens, each from a fresh chain (draw `i` uses `rng_for(i)`).
fn fresh_counts(spec: &str, row: &[f32], rng_for: impl Fn(u32) -> RngConfig) -> Vec<u64> {
    let mut counts = vec![0u64; row.len()];
    for i in 0..FRESH_DRAWS as u32 {
        let mut chain = Chain::from_spec(spec, &BuildContext::new(row.len(), rng_for(i))).unwrap();
        counts[chain.sample(row).unwrap() as usize] += 1;
    }
    counts
}

#[test]
fn wilson_hilferty_matches_tables() {
    // Chi-square upper 0.001 critical values from standard tables.
    for (dof, table) in [(1, 10.828), (2, 13.816), (5, 20.515), (10, 29.588), (30, 59.703), (100, 149.449)] {
        let approx = chi_square_critical(dof);
        let rel = (approx - table) / table;
        assert!(rel >= 0.0, "dof {dof}: {approx} below the table's {table}");
        assert!(rel < if dof >= 10 { 0.01 } else { 0.035 }, "dof {dof}: {approx} vs {table}");
    }
}

#[test]
fn dist_philox_follows_the_softmax() {
    let row = spread_row();
    let counts = sequential_counts("dist", &row, RngConfig::philox(0x5eed));
    assert_fits("dist/philox", &counts, &expected_over_ids(row.len(), &oracle::from_row(&row)));
}

#[test]
fn dist_mt19937_follows_the_softmax() {
    let row = spread_row();
    let counts = sequential_counts("dist", &row, RngConfig::mt19937(1234));
    assert_fits("dist/mt19937", &counts, &expected_over_ids(row.len(), &oracle::from_row(&row)));
}

#[test]
fn dist_after_top_k_and_temperature_follows_the_truncated_softmax() {
    let row = spread_row();
    let kept = oracle::top_k(&oracle::from_row(&row), 10);
    assert!(!kept.ambiguous);
    let expected = expected_over_ids(row.len(), &oracle::temperature(&kept.set, 0.7));
    for rng in [RngConfig::philox(77), RngConfig::mt19937(77)] {
        let counts = sequential_counts("top_k(10);temperature(0.7);dist", &row, rng);
        assert_fits(&format!("top_k;temperature;dist/{:?}", rng.kind), &counts, &expected);
    }
}

#[test]
fn chi_square_rejects_a_wrong_distribution() {
    // The same draws as `dist_philox_follows_the_softmax`, held against softmax(l / 0.9):
    // a mild error the test must catch, or it has no power.
    let row = spread_row();
    let counts = sequential_counts("dist", &row, RngConfig::philox(0x5eed));
    let wrong = expected_over_ids(row.len(), &oracle::temperature(&oracle::from_row(&row), 0.9));
    let fit = goodness_of_fit(&counts, &wrong);
    assert!(fit.stat > fit.critical, "a wrong expectation passed: {fit:?}");
}

#[test]
fn gumbel_follows_the_tempered_softmax() {
    let row = spread_row();
    for t in [1.0f32, 0.7] {
        let expected = expected_over_ids(row.len(), &oracle::temperature(&oracle::from_row(&row), t as f64));
        // (In mt19937 mode gumbel's noise is counter-based too, keyed by the 32-bit seed.)
        for rng in [RngConfig::philox(31337), RngConfig::mt19937(4242)] {
            let counts = sequential_counts(&format!("gumbel({t})"), &row, rng);
            assert_fits(&format!("gumbel({t})/{:?}", rng.kind), &counts, &expected);
        }
    }
}

#[test]
fn mirostat_follows_its_truncated_softmax() {
    let row = zipf_row();
    let (tau, eta, m) = (3.0f32, 0.1f32, 100);
    let kept = oracle::mirostat(&oracle::from_row(&row), row.len(), 2.0 * tau as f64, m);
    assert!(!kept.ambiguous, "pick parameters away from a threshold");
    assert!((4..40).contains(&kept.set.len()), "truncation keeps {} of 64: not a useful test", kept.set.len());
    let expected = expected_over_ids(row.len(), &kept.set);
    let spec = format!("mirostat({tau},{eta},{m})");
    let counts = fresh_counts(&spec, &row, RngConfig::mt19937);
    assert_fits("mirostat/mt19937", &counts, &expected);
    let counts = fresh_counts(&spec, &row, |i| RngConfig::philox(2024).with_sequence(i));
    assert_fits("mirostat/philox", &counts, &expected);
}

#[test]
fn mirostat_v2_follows_its_truncated_softmax() {
    let row = zipf_row();
    let (tau, eta) = (3.0f32, 0.1f32);
    let kept = oracle::mirostat_v2(&oracle::from_row(&row), 2.0 * tau as f64);
    assert!(!kept.ambiguous, "pick parameters away from a threshold");
    assert!((4..40).contains(&kept.set.len()), "truncation keeps {} of 64: not a useful test", kept.set.len());
    let expected = expected_over_ids(row.len(), &kept.set);
    let spec = format!("mirostat_v2({tau},{eta})");
    let counts = fresh_counts(&spec, &row, RngConfig::mt19937);
    assert_fits("mirostat_v2/mt19937", &counts, &expected);
    let counts = fresh_counts(&spec, &row, |i| RngConfig::philox(2024).with_sequence(i));
    assert_fits("mirostat_v2/philox", &counts, &expected);
}
