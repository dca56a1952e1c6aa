//! Property tests: every llama.cpp-convention sampler against the naive f64 oracles of
//! `tokensieve_testkit::reference`, on random and adversarial rows (exact ties, `-inf`, flat
//! rows, ±1e4 magnitudes, values outside [-10, 10], V = 1, vocabularies past the heap/bucket
//! sort switch at 128 and top-p's 1024 threshold).
//!
//! What is checked, per sampler:
//! * the ids of the surviving finite candidates equal the oracle's, unless the oracle reports
//!   the case ambiguous (a cut between exact ties, a value within rounding distance of a
//!   threshold): f32 vs f64 and libstdc++'s tie order may then legitimately differ;
//! * the surviving logits equal the oracle's values (bit for bit for stages that only move
//!   candidates; within a tolerance scaled to the operands for stages that compute);
//! * invariants on every output: no NaN from non-NaN input, unique in-range ids, a `sorted`
//!   flag only on a descending array, at least one candidate, a selection (when made) on a
//!   finite candidate; draws for the MT19937 stages reproduced from an independent generator;
//! * no panic on any input: NaN/`+inf` rows are errors, all-`-inf` rows are
//!   `no_candidates` errors for selecting chains, extreme parameters give a value or an error.
//!
//! Every run is deterministic (fixed proptest seeds, see `proptest_support`).

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokensieve::convention::llama_cpp::dense::Path;
use tokensieve::rng::Mt19937;
use tokensieve::sampler::{BuildContext, LLAMA_CPP_STAGE_NAMES};
use tokensieve::{Candidates, Chain, RngConfig, TokenData};
use tokensieve_testkit::generate;
use tokensieve_testkit::proptest_support::check;
use tokensieve_testkit::reference::{self as oracle, Cand, Out};

/// Cases per property: modest, so the whole file runs in seconds at opt-level 1.
const CASES: u32 = 160;
/// Largest vocabulary the row strategies draw (past 128: bucket sort; past 1024: top-p's
/// partial-sort heuristic).
const MAX_V: usize = 1400;

type TestResult = Result<(), TestCaseError>;

/// Counts how many cases were compared with the oracle's set and how many were skipped as
/// ambiguous, so a property cannot silently become vacuous.
#[derive(Default)]
struct Tally {
    compared: AtomicUsize,
    skipped: AtomicUsize,
}

impl Tally {
    /// Records one case; returns `true` when it must be compared (not ambiguous).
    fn compare(&self, ambiguous: bool) -> bool {
        let counter = if ambiguous { &self.skipped } else { &self.compared };
        counter.fetch_add(1, Ordering::Relaxed);
        !ambiguous
    }

    /// Prints the counts and fails when fewer than `min_fraction` of the cases were compared.
    fn report(&self, name: &str, min_fraction: f64) {
        let compared = self.compared.load(Ordering::Relaxed);
        let skipped = self.skipped.load(Ordering::Relaxed);
        eprintln!("{name}: {compared} cases compared with the oracle, {skipped} skipped as tie/threshold-ambiguous");
        let total = (compared + skipped).max(1);
        assert!(
            compared as f64 >= min_fraction * total as f64,
            "{name}: only {compared} of {total} cases were unambiguous; the property has become too weak"
        );
    }
}

fn ctx(v: usize, rng: RngConfig) -> BuildContext<'static> {
    BuildContext::new(v, rng)
}

/// Builds a chain that must build (valid parameters, known stages).
fn build(spec: &str, v: usize, rng: RngConfig) -> Chain {
    Chain::from_spec_for_apply(spec, &ctx(v, rng)).unwrap_or_else(|e| panic!("`{spec}` does not build: {e}"))
}

/// What a chain left after one step.
#[derive(Clone, Debug)]
struct Snap {
    cands: Vec<TokenData>,
    sorted: bool,
    selected: Option<usize>,
}

impl Snap {
    fn of(c: &Candidates) -> Snap {
        Snap { cands: c.as_slice().to_vec(), sorted: c.is_sorted(), selected: c.selected_index() }
    }
    fn finite_ids(&self) -> BTreeSet<u32> {
        self.cands.iter().filter(|t| t.logit.is_finite()).map(|t| t.id).collect()
    }
    fn working_set(&self) -> Vec<Cand> {
        self.cands.iter().map(|t| (t.id, t.logit as f64)).collect()
    }
}

/// Applies `spec` once to `row` after accepting `history`.
fn apply(spec: &str, row: &[f32], rng: RngConfig, history: &[u32]) -> Result<Snap, tokensieve::Error> {
    let mut chain = build(spec, row.len(), rng);
    for &t in history {
        chain.accept(t);
    }
    chain.apply(row).map(Snap::of)
}

/// Invariants every output of a valid row must satisfy.
fn invariants(spec: &str, row: &[f32], s: &Snap) -> TestResult {
    invariants_with(spec, row, s, true)
}

/// As [`invariants`]; `check_sorted = false` is for chains where a `logit_bias` after a sorting
/// stage may leave the flag stale on purpose (llama.cpp does, and later stages trust it; see
/// the golden README's `stale_sorted`): it skips the sorted-flag check, and the check that the
/// selected candidate is not masked (`dist` then takes a masked first entry as the maximum, and
/// falls back to the last candidate, whatever it holds, as llama.cpp does).
fn invariants_with(spec: &str, row: &[f32], s: &Snap, check_sorted: bool) -> TestResult {
    let v = row.len();
    prop_assert!(!s.cands.is_empty(), "{spec}: no candidate left");
    let mut seen = BTreeSet::new();
    for t in &s.cands {
        prop_assert!((t.id as usize) < v, "{spec}: id {} out of range", t.id);
        prop_assert!(seen.insert(t.id), "{spec}: id {} twice", t.id);
        prop_assert!(!t.logit.is_nan(), "{spec}: NaN logit for id {} from a NaN-free row", t.id);
    }
    if s.sorted && check_sorted {
        for w in s.cands.windows(2) {
            prop_assert!(w[0].logit >= w[1].logit, "{spec}: flagged sorted but {} < {}", w[0].logit, w[1].logit);
        }
    }
    if let Some(i) = s.selected {
        prop_assert!(i < s.cands.len(), "{spec}: selected index {i} out of {}", s.cands.len());
        prop_assert!(s.cands[i].logit.is_finite() || !check_sorted, "{spec}: selected a masked candidate");
    }
    Ok(())
}

fn same_set(spec: &str, s: &Snap, out: &Out) -> TestResult {
    let got = s.finite_ids();
    let want = out.finite_ids();
    if got != want {
        let extra: Vec<_> = got.difference(&want).collect();
        let missing: Vec<_> = want.difference(&got).collect();
        return Err(TestCaseError::fail(format!(
            "{spec}: surviving set differs from the oracle: {} kept vs {}; extra {extra:?}, missing {missing:?}",
            got.len(),
            want.len()
        )));
    }
    Ok(())
}

/// Surviving logits must be the input's, bit for bit (stages that only move candidates).
fn unchanged_values(spec: &str, row: &[f32], s: &Snap) -> TestResult {
    for t in &s.cands {
        if t.logit.is_finite() {
            let want = row[t.id as usize];
            prop_assert!(t.logit.to_bits() == want.to_bits(), "{spec}: id {} logit {} != input {want}", t.id, t.logit);
        }
    }
    Ok(())
}

/// Surviving logits within `tol(id, oracle value)` of the oracle's.
fn close_values(spec: &str, s: &Snap, out: &Out, tol: impl Fn(u32, f64) -> f64) -> TestResult {
    for t in &s.cands {
        let Some(want) = out.logit_of(t.id) else {
            prop_assert!(t.logit == f32::NEG_INFINITY, "{spec}: id {} is not in the oracle's set", t.id);
            continue;
        };
        let got = t.logit as f64;
        if want == f64::NEG_INFINITY || got == f64::NEG_INFINITY {
            prop_assert!(got == want, "{spec}: id {}: {got} vs oracle {want}", t.id);
            continue;
        }
        let tol = tol(t.id, want);
        prop_assert!((got - want).abs() <= tol, "{spec}: id {}: {got} vs oracle {want} (tolerance {tol:e})", t.id);
    }
    Ok(())
}

/// `p` fields within tolerance of `expected` (same order as the snapshot).
fn close_probs(spec: &str, s: &Snap, expected: &[f64]) -> TestResult {
    for (t, &q) in s.cands.iter().zip(expected) {
        let tol = 1e-6 + 2e-4 * q;
        prop_assert!(((t.p as f64) - q).abs() <= tol, "{spec}: id {} p {} vs oracle {q}", t.id, t.p);
    }
    Ok(())
}

fn f(x: f32) -> String {
    format!("{x}")
}

// ---------------------------------------------------------------------------------------
// Parameter strategies.

fn k_param() -> impl Strategy<Value = i32> {
    prop_oneof![Just(-1), Just(0), 1..=8i32, 1..=200i32, 1000..=1600i32]
}
fn min_keep() -> impl Strategy<Value = usize> {
    prop_oneof![Just(0usize), Just(1), 0..=4usize]
}
fn top_p_param() -> impl Strategy<Value = f32> {
    prop_oneof![Just(0.0f32), Just(1.0), 0.0f32..1.0, prop::sample::select(vec![0.5f32, 0.9, 0.95, 0.99])]
}
fn min_p_param() -> impl Strategy<Value = f32> {
    prop_oneof![Just(0.0f32), Just(1.0), Just(1.05), 0.0f32..1.0, 0.001f32..0.1]
}
fn typical_param() -> impl Strategy<Value = f32> {
    prop_oneof![Just(1.0f32), 0.05f32..0.999]
}
fn temperature_param() -> impl Strategy<Value = f32> {
    prop_oneof![Just(0.0f32), Just(-1.0), Just(1.0), 0.05f32..5.0]
}

// ---------------------------------------------------------------------------------------
// Selecting stages.

#[test]
fn greedy_selects_the_first_maximum_in_vocab_order() {
    check("greedy", CASES, generate::any_row_maybe_all_masked(MAX_V), |row| {
        let mut chain = Chain::from_spec("greedy", &ctx(row.len(), RngConfig::philox(0))).unwrap();
        match (chain.sample(&row), oracle::greedy(&oracle::from_row(&row))) {
            (Ok(token), Some(i)) => prop_assert_eq!(token, i as u32),
            (Err(e), None) => prop_assert!(e.is_no_candidates(), "{e}"),
            (got, want) => prop_assert!(false, "greedy: got {got:?}, oracle {want:?}"),
        }
        Ok(())
    });
}

/// The dist stage's selection is the oracle's inverse-CDF pick, in the array order the chain
/// leaves, for the draw an independent MT19937 makes from the same seed.
#[test]
fn dist_selects_by_inverse_cdf_in_array_order() {
    let prefix = prop_oneof![
        Just(String::new()),
        k_param().prop_map(|k| format!("top_k({k});")),
        (0.1f32..3.0).prop_map(|t| format!("temperature({});", f(t))),
    ];
    let tally = Tally::default();
    check("dist", CASES, (generate::any_row(MAX_V), prefix, any::<u32>()), |(row, prefix, seed)| {
        let spec = format!("{prefix}dist");
        let s = apply(&spec, &row, RngConfig::mt19937(seed), &[]).unwrap();
        invariants(&spec, &row, &s)?;
        let u = Mt19937::new(seed).canonical_f64();
        let pick = oracle::dist_select(&s.working_set(), u).expect("a finite candidate");
        prop_assert!(s.selected.is_some(), "{spec}: nothing selected");
        if tally.compare(pick.ambiguous) {
            prop_assert_eq!(s.selected, Some(pick.index), "{} u={}", spec, u);
        }
        close_probs(&spec, &s, &oracle::softmax(&s.working_set()))
    });
    tally.report("dist", 0.9);
}

#[test]
fn gumbel_selects_a_finite_candidate_and_is_greedy_at_zero_temperature() {
    let t = prop_oneof![Just(0.0f32), Just(-1.0), 0.05f32..5.0];
    let prefix = prop_oneof![Just(String::new()), (1..=8i32).prop_map(|k| format!("top_k({k});"))];
    check(
        "gumbel",
        CASES,
        (generate::any_row_maybe_all_masked(MAX_V), t, prefix, any::<u64>()),
        |(row, t, prefix, seed)| {
            let spec = format!("{prefix}gumbel({})", f(t));
            let set = oracle::from_row(&row);
            let result = apply(&spec, &row, RngConfig::philox(seed), &[]);
            let Some(first_max) = oracle::greedy(&set) else {
                prop_assert!(result.is_err_and(|e| e.is_no_candidates()), "{spec}: all-masked row");
                return Ok(());
            };
            let s = result.unwrap();
            invariants(&spec, &row, &s)?;
            let sel = s.cands[s.selected.expect("selected")];
            if prefix == "top_k(1);" {
                prop_assert_eq!(sel.logit, row[first_max]);
            }
            if t <= 0.0 && prefix.is_empty() {
                prop_assert_eq!(sel.id, first_max as u32, "{}: not the first maximum", spec);
            }
            Ok(())
        },
    );
}

// ---------------------------------------------------------------------------------------
// Filters.

#[test]
fn temperature_matches_oracle() {
    check("temperature", CASES, (generate::any_row(MAX_V), temperature_param()), |(row, t)| {
        let spec = format!("temperature({})", f(t));
        let s = apply(&spec, &row, RngConfig::philox(0), &[]).unwrap();
        invariants(&spec, &row, &s)?;
        prop_assert_eq!(s.cands.len(), row.len(), "{}: size changed", spec);
        let out = Out { set: oracle::temperature(&oracle::from_row(&row), t as f64), ambiguous: false };
        // t <= 0 keeps the first maximum in vocabulary order: exact, ties included.
        same_set(&spec, &s, &out)?;
        close_values(&spec, &s, &out, |_, want| 1e-6 * want.abs())
    });
}

#[test]
fn top_k_matches_oracle() {
    let tally = Tally::default();
    check("top_k", CASES, (generate::any_row(MAX_V), k_param()), |(row, k)| {
        let spec = format!("top_k({k})");
        let s = apply(&spec, &row, RngConfig::philox(0), &[]).unwrap();
        invariants(&spec, &row, &s)?;
        let out = oracle::top_k(&oracle::from_row(&row), k as i64);
        prop_assert_eq!(s.cands.len(), out.set.len(), "{}: size", spec);
        prop_assert_eq!(s.sorted, k > 0, "{}: sorted flag", spec);
        if tally.compare(out.ambiguous) {
            same_set(&spec, &s, &out)?;
        }
        unchanged_values(&spec, &row, &s)
    });
    tally.report("top_k", 0.6);
}

#[test]
fn top_p_matches_oracle() {
    let tally = Tally::default();
    check("top_p", CASES, (generate::any_row(MAX_V), top_p_param(), min_keep()), |(row, p, mk)| {
        let spec = format!("top_p({},{mk})", f(p));
        let s = apply(&spec, &row, RngConfig::philox(0), &[]).unwrap();
        invariants(&spec, &row, &s)?;
        let set = oracle::from_row(&row);
        let out = oracle::top_p(&set, p as f64, mk);
        if p < 1.0 {
            prop_assert!(s.sorted, "{spec}: output not flagged sorted");
            // p is the softmax over the input set, not renormalised over the survivors.
            let full = oracle::softmax(&set);
            let expected: Vec<f64> = s.cands.iter().map(|t| full[t.id as usize]).collect();
            close_probs(&spec, &s, &expected)?;
        }
        if tally.compare(out.ambiguous) {
            prop_assert_eq!(s.cands.len(), out.set.len(), "{}: size", spec);
            same_set(&spec, &s, &out)?;
        }
        unchanged_values(&spec, &row, &s)
    });
    tally.report("top_p", 0.5);
}

#[test]
fn min_p_matches_oracle() {
    let tally = Tally::default();
    check("min_p", CASES, (generate::any_row(MAX_V), min_p_param(), min_keep()), |(row, p, mk)| {
        let spec = format!("min_p({},{mk})", f(p));
        let s = apply(&spec, &row, RngConfig::philox(0), &[]).unwrap();
        invariants(&spec, &row, &s)?;
        let out = oracle::min_p(&oracle::from_row(&row), p as f64, mk, false);
        if tally.compare(out.ambiguous) {
            prop_assert_eq!(s.cands.len(), out.set.len(), "{}: size", spec);
            same_set(&spec, &s, &out)?;
            if !s.sorted {
                // The unsorted path keeps the input (vocabulary) order.
                prop_assert!(s.cands.windows(2).all(|w| w[0].id < w[1].id), "{spec}: order not preserved");
            }
        }
        unchanged_values(&spec, &row, &s)
    });
    tally.report("min_p", 0.5);
}

#[test]
fn typical_matches_oracle() {
    let tally = Tally::default();
    check("typical", CASES, (generate::any_row(MAX_V), typical_param(), min_keep()), |(row, p, mk)| {
        let spec = format!("typical({},{mk})", f(p));
        let s = apply(&spec, &row, RngConfig::philox(0), &[]).unwrap();
        invariants(&spec, &row, &s)?;
        let out = oracle::typical(&oracle::from_row(&row), p as f64, mk);
        if tally.compare(out.ambiguous) {
            prop_assert_eq!(s.cands.len(), out.set.len(), "{}: size", spec);
            same_set(&spec, &s, &out)?;
        }
        unchanged_values(&spec, &row, &s)
    });
    tally.report("typical", 0.25);
}

#[test]
fn temp_ext_matches_oracle() {
    let params = (
        prop_oneof![Just(0.0f32), Just(1.0), 0.0f32..2.0],
        prop_oneof![Just(0.0f32), Just(-0.3), 0.05f32..1.5],
        prop_oneof![Just(1.0f32), 0.25f32..3.0],
    );
    let tally = Tally::default();
    check("temp_ext", CASES, (generate::any_row(MAX_V), params), |(row, (t, delta, exponent))| {
        let spec = format!("temp_ext({},{},{})", f(t), f(delta), f(exponent));
        let s = apply(&spec, &row, RngConfig::philox(0), &[]).unwrap();
        invariants(&spec, &row, &s)?;
        prop_assert_eq!(s.cands.len(), row.len(), "{}: size changed", spec);
        let (out, dyn_t) = oracle::temp_ext(&oracle::from_row(&row), t as f64, delta as f64, exponent as f64);
        if !tally.compare(out.ambiguous) {
            // Near-zero dynamic temperature: at least the maximum survives.
            prop_assert!(s.cands.iter().any(|c| c.logit.is_finite()), "{spec}: everything masked");
            return Ok(());
        }
        same_set(&spec, &s, &out)?;
        // Plain temperature is one f32 division; the dynamic one also carries the f32
        // entropy's error, relative to every logit alike.
        let rel = if delta > 0.0 { 1e-3 } else { 1e-6 };
        close_values(&spec, &s, &out, |_, want| rel * want.abs() + 1e-6 / dyn_t.abs().max(1e-3))
    });
    tally.report("temp_ext", 0.5);
}

#[test]
fn top_n_sigma_matches_oracle() {
    let n = prop_oneof![Just(-1.0f32), Just(0.0), Just(1.0), 0.1f32..4.0];
    let tally = Tally::default();
    check("top_n_sigma", CASES, (generate::any_row(MAX_V), n), |(row, n)| {
        let spec = format!("top_n_sigma({})", f(n));
        let s = apply(&spec, &row, RngConfig::philox(0), &[]).unwrap();
        invariants(&spec, &row, &s)?;
        prop_assert_eq!(s.cands.len(), row.len(), "{}: size changed", spec);
        let out = oracle::top_n_sigma(&oracle::from_row(&row), n as f64);
        if tally.compare(out.ambiguous) {
            same_set(&spec, &s, &out)?;
        }
        prop_assert!(s.cands.iter().any(|c| c.logit.is_finite()), "{spec}: the maximum was masked");
        unchanged_values(&spec, &row, &s)
    });
    tally.report("top_n_sigma", 0.5);
}

/// XTC with the f32 draw an independent MT19937 makes from the same seed.
#[test]
fn xtc_matches_oracle() {
    let params = (
        prop_oneof![Just(0.0f32), Just(1.0), Just(0.5), 0.0f32..1.0],
        prop_oneof![Just(0.6f32), Just(0.5), 0.01f32..0.5],
        0..=3usize,
    );
    let tally = Tally::default();
    check("xtc", CASES, (generate::any_row(MAX_V), params, any::<u32>()), |(row, (prob, thr, mk), seed)| {
        let spec = format!("xtc({},{},{mk})", f(prob), f(thr));
        let s = apply(&spec, &row, RngConfig::mt19937(seed), &[]).unwrap();
        invariants(&spec, &row, &s)?;
        let draw = Mt19937::new(seed).canonical_f32() as f64;
        let out = oracle::xtc(&oracle::from_row(&row), prob as f64, thr as f64, mk, draw);
        if tally.compare(out.ambiguous) {
            prop_assert_eq!(s.cands.len(), out.set.len(), "{}: size (draw {})", spec, draw);
            same_set(&spec, &s, &out)?;
        }
        prop_assert!(s.cands.iter().any(|c| c.logit.is_finite()), "{spec}: nothing finite left");
        unchanged_values(&spec, &row, &s)
    });
    tally.report("xtc", 0.5);
}

fn row_and_history() -> impl Strategy<Value = (Vec<f32>, Vec<u32>)> {
    generate::any_row(MAX_V).prop_flat_map(|row| {
        let v = row.len() as u32;
        // Mostly a few frequent tokens (so counts above 1 occur), some anywhere.
        let id = prop_oneof![3 => 0..v.min(12), 1 => 0..v];
        (Just(row), proptest::collection::vec(id, 0..80))
    })
}

#[test]
fn penalties_match_oracle() {
    let params = (
        prop_oneof![Just(0i32), Just(-1), 1..=8i32, 1..=100i32],
        prop_oneof![Just(1.0f32), 0.5f32..2.0],
        prop_oneof![Just(0.0f32), -1.0f32..1.0],
        prop_oneof![Just(0.0f32), -1.0f32..1.0],
    );
    check("penalties", CASES, (row_and_history(), params), |((row, history), (last_n, repeat, freq, present))| {
        let spec = format!("penalties({last_n},{},{},{})", f(repeat), f(freq), f(present));
        let s = apply(&spec, &row, RngConfig::philox(0), &history).unwrap();
        invariants(&spec, &row, &s)?;
        prop_assert_eq!(s.cands.len(), row.len(), "{}: size changed", spec);
        let set = oracle::from_row(&row);
        let out = Out {
            set: oracle::penalties(&set, &history, last_n as i64, repeat as f64, freq as f64, present as f64),
            ambiguous: false,
        };
        same_set(&spec, &s, &out)?;
        let window = &history[history.len().saturating_sub(last_n.max(0) as usize)..];
        let scale = (repeat as f64).max(1.0 / repeat as f64);
        close_values(&spec, &s, &out, |id, _| {
            let c = window.iter().filter(|&&t| t == id).count() as f64;
            1e-6 * (1.0 + (row[id as usize] as f64).abs() * scale + c * (freq as f64).abs() + (present as f64).abs())
        })
    });
}

#[test]
fn logit_bias_matches_oracle() {
    let strategy = generate::any_row(MAX_V).prop_flat_map(|row| {
        let v = row.len() as i64;
        let bias = prop_oneof![4 => -5.0f32..5.0, 1 => Just(f32::NEG_INFINITY), 1 => Just(0.0f32)];
        (Just(row), proptest::collection::vec((-2..v + 2, bias), 1..6))
    });
    check("logit_bias", CASES, strategy, |(row, biases)| {
        let list: Vec<String> = biases.iter().map(|(id, b)| format!("{id}:{}", f(*b))).collect();
        let spec = format!("logit_bias({})", list.join(" "));
        let s = apply(&spec, &row, RngConfig::philox(0), &[]).unwrap();
        prop_assert_eq!(s.cands.len(), row.len(), "{}: size changed", spec);
        let wide: Vec<(i64, f64)> = biases.iter().map(|&(id, b)| (id, b as f64)).collect();
        let out = Out { set: oracle::logit_bias(&oracle::from_row(&row), &wide), ambiguous: false };
        same_set(&spec, &s, &out)?;
        close_values(&spec, &s, &out, |id, _| {
            let total: f64 = biases.iter().filter(|b| b.0 == id as i64).map(|b| (b.1 as f64).abs()).sum();
            1e-6 * ((row[id as usize] as f64).abs() + total) + 1e-30
        })?;
        if out.set.iter().any(|c| c.1.is_finite()) {
            invariants(&spec, &row, &s)?;
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------
// Mirostat: truncation, draw and mu update over several steps.

#[derive(Clone, Copy, Debug)]
enum Miro {
    V1 { m: usize },
    V2,
}

fn mirostat_steps(row: &[f32], tau: f32, eta: f32, which: Miro, seed: u32, tally: &Tally) -> TestResult {
    let spec = match which {
        Miro::V1 { m } => format!("mirostat({},{},{m})", f(tau), f(eta)),
        Miro::V2 => format!("mirostat_v2({},{})", f(tau), f(eta)),
    };
    let v = row.len();
    let set = oracle::from_row(row);
    let mut chain = Chain::from_spec(&spec, &ctx(v, RngConfig::mt19937(seed))).unwrap();
    let mut mt = Mt19937::new(seed);
    let mut mu = 2.0 * tau as f64;
    for step in 0..4 {
        let token = chain.sample(row).map_err(|e| TestCaseError::fail(format!("{spec} step {step}: {e}")))?;
        let s = Snap::of(chain.candidates());
        invariants(&spec, row, &s)?;
        prop_assert!(s.sorted, "{spec}: output not flagged sorted");
        unchanged_values(&spec, row, &s)?;
        let out = match which {
            Miro::V1 { m } => oracle::mirostat(&set, v, mu, m),
            Miro::V2 => oracle::mirostat_v2(&set, mu),
        };
        // The whole row kept and the draw made from its top: the selected candidate alone.
        let in_top = matches!(chain.last_path(), Path::Fast(p) if p.ends_with("(drawn in the top)"));
        // The draw is consumed only when more than one candidate is kept.
        let kept = if in_top { out.set.len() } else { s.cands.len() };
        let u = if kept > 1 { Some(mt.canonical_f64()) } else { None };
        if !tally.compare(out.ambiguous) {
            return Ok(()); // the states may diverge from here on
        }
        let (probs, sel) = if in_top {
            prop_assert_eq!(s.cands.len(), 1, "{} step {}: one candidate", spec, step);
            prop_assert_eq!(out.set.len(), v, "{} step {}: the whole row kept (mu {})", spec, step, mu);
            let probs = oracle::softmax(&out.set);
            let sel = out.set.iter().position(|c| c.0 == token).expect("every token is kept");
            // llama.cpp's f32 softmax: a sequential f32 sum of `v` weights errs by at most
            // `(v - 1)·2^-24` of it, `expf` and the division by an ulp or so each.
            let tol = (v as f64 + 4.0) * 2f64.powi(-24) * probs[sel];
            prop_assert!((s.cands[0].p as f64 - probs[sel]).abs() <= tol, "{}: p", spec);
            (probs, sel)
        } else {
            prop_assert_eq!(s.cands.len(), out.set.len(), "{} step {}: size (mu {})", spec, step, mu);
            same_set(&spec, &s, &out)?;
            let probs = oracle::softmax(&s.working_set());
            close_probs(&spec, &s, &probs)?;
            let sel = s.selected.expect("selected");
            prop_assert_eq!(token, s.cands[sel].id);
            (probs, sel)
        };
        if let Some(u) = u {
            let pick = oracle::discrete_select(&probs, u);
            if pick.ambiguous {
                return Ok(());
            }
            prop_assert_eq!(sel, pick.index, "{} step {}: draw {}", spec, step, u);
        }
        mu = oracle::mirostat_mu_update(mu, tau as f64, eta as f64, probs[sel]);
    }
    Ok(())
}

#[test]
fn mirostat_matches_oracle_over_steps() {
    let params = (0.5f32..10.0, 0.0f32..1.0, prop_oneof![Just(100usize), 2..=100usize], any::<u32>());
    let tally = Tally::default();
    check("mirostat", CASES, (generate::any_row(MAX_V), params), |(row, (tau, eta, m, seed))| {
        mirostat_steps(&row, tau, eta, Miro::V1 { m }, seed, &tally)
    });
    tally.report("mirostat (steps)", 0.4);
}

#[test]
fn mirostat_v2_matches_oracle_over_steps() {
    let params = (0.5f32..10.0, 0.0f32..1.0, any::<u32>());
    let tally = Tally::default();
    check("mirostat_v2", CASES, (generate::any_row(MAX_V), params), |(row, (tau, eta, seed))| {
        mirostat_steps(&row, tau, eta, Miro::V2, seed, &tally)
    });
    tally.report("mirostat_v2 (steps)", 0.4);
}

// ---------------------------------------------------------------------------------------
// Composition: llama.cpp's effective default chain against the composed oracles.

#[test]
fn default_chain_matches_composed_oracles() {
    let params = (k_param(), top_p_param(), min_keep(), min_p_param(), min_keep(), 0.1f32..3.0);
    let tally = Tally::default();
    check("default_chain", CASES, (generate::any_row(MAX_V), params), |(row, (k, p, mk1, mp, mk2, t))| {
        let spec = format!("top_k({k});top_p({},{mk1});min_p({},{mk2});temperature({})", f(p), f(mp), f(t));
        let s = apply(&spec, &row, RngConfig::philox(0), &[]).unwrap();
        invariants(&spec, &row, &s)?;
        let a = oracle::top_k(&oracle::from_row(&row), k as i64);
        let b = oracle::top_p(&a.set, p as f64, mk1);
        let sorted_before_min_p = k > 0 || p < 1.0;
        let c = oracle::min_p(&b.set, mp as f64, mk2, sorted_before_min_p);
        let out =
            Out { set: oracle::temperature(&c.set, t as f64), ambiguous: a.ambiguous || b.ambiguous || c.ambiguous };
        if tally.compare(out.ambiguous) {
            prop_assert_eq!(s.cands.len(), out.set.len(), "{}: size", spec);
            same_set(&spec, &s, &out)?;
            close_values(&spec, &s, &out, |_, want| 1e-6 * want.abs())?;
        }
        Ok(())
    });
    tally.report("default_chain", 0.3);
}

// ---------------------------------------------------------------------------------------
// Robustness: random chains, bad rows, extreme parameters.

/// A random (valid) non-selecting stage.
fn filter_stage() -> BoxedStrategy<String> {
    let mut pool: Vec<BoxedStrategy<String>> = vec![
        k_param().prop_map(|k| format!("top_k({k})")).boxed(),
        temperature_param().prop_map(|t| format!("temperature({})", f(t))).boxed(),
    ];
    let have = |s: &str| {
        assert!(LLAMA_CPP_STAGE_NAMES.contains(&s), "stage `{s}` is unknown to Chain::from_spec");
        true
    };
    if have("top_p") {
        pool.push((top_p_param(), min_keep()).prop_map(|(p, k)| format!("top_p({},{k})", f(p))).boxed());
    }
    if have("min_p") {
        pool.push((min_p_param(), min_keep()).prop_map(|(p, k)| format!("min_p({},{k})", f(p))).boxed());
    }
    if have("typical") {
        pool.push((typical_param(), min_keep()).prop_map(|(p, k)| format!("typical({},{k})", f(p))).boxed());
    }
    if have("temp_ext") {
        pool.push(
            (0.0f32..2.0, -0.5f32..1.5, 0.25f32..3.0)
                .prop_map(|(t, d, e)| format!("temp_ext({},{},{})", f(t), f(d), f(e)))
                .boxed(),
        );
    }
    if have("top_n_sigma") {
        pool.push((-1.0f32..4.0).prop_map(|n| format!("top_n_sigma({})", f(n))).boxed());
    }
    if have("xtc") {
        pool.push(
            (0.0f32..=1.0, 0.01f32..0.6, 0..=3usize)
                .prop_map(|(p, t, k)| format!("xtc({},{},{k})", f(p), f(t)))
                .boxed(),
        );
    }
    if have("penalties") {
        pool.push(
            (0..=64i32, 0.5f32..2.0, -1.0f32..1.0, -1.0f32..1.0)
                .prop_map(|(n, r, fr, pr)| format!("penalties({n},{},{},{})", f(r), f(fr), f(pr)))
                .boxed(),
        );
    }
    if have("logit_bias") {
        pool.push(
            proptest::collection::vec((0..40i64, -3.0f32..3.0), 1..4)
                .prop_map(|l| {
                    let l: Vec<String> = l.iter().map(|(i, b)| format!("{i}:{}", f(*b))).collect();
                    format!("logit_bias({})", l.join(" "))
                })
                .boxed(),
        );
    }
    proptest::strategy::Union::new(pool).boxed()
}

/// A random selecting stage.
fn selecting_stage() -> BoxedStrategy<String> {
    let have = |s: &str| {
        assert!(LLAMA_CPP_STAGE_NAMES.contains(&s), "stage `{s}` is unknown to Chain::from_spec");
        true
    };
    let mut pool: Vec<BoxedStrategy<String>> =
        vec![Just("greedy".to_string()).boxed(), Just("dist".to_string()).boxed()];
    if have("mirostat") {
        pool.push(
            (0.5f32..10.0, 0.0f32..1.0, 2..=100usize)
                .prop_map(|(t, e, m)| format!("mirostat({},{},{m})", f(t), f(e)))
                .boxed(),
        );
    }
    if have("mirostat_v2") {
        pool.push((0.5f32..10.0, 0.0f32..1.0).prop_map(|(t, e)| format!("mirostat_v2({},{})", f(t), f(e))).boxed());
    }
    if have("gumbel") {
        pool.push((0.0f32..3.0).prop_map(|t| format!("gumbel({})", f(t))).boxed());
    }
    proptest::strategy::Union::new(pool).boxed()
}

fn rng_config() -> impl Strategy<Value = RngConfig> {
    prop_oneof![any::<u64>().prop_map(RngConfig::philox), any::<u32>().prop_map(RngConfig::mt19937)]
}

/// Random chains of implemented stages never panic; on a row with a finite logit they
/// select a finite candidate over several steps, unless a stage that llama.cpp lets
/// degenerate on `-inf`/underflowing input (typical's NaN entropy) left only masked ones;
/// on an all-`-inf` row they return `no_candidates`.
#[test]
fn random_chains_select_finite_candidates_and_never_panic() {
    let chain = (proptest::collection::vec(filter_stage(), 0..5), selecting_stage()).prop_map(|(mut f, s)| {
        f.push(s);
        f.join(";")
    });
    check(
        "random_chains",
        CASES,
        (row_and_history(), chain, rng_config(), prop::bool::ANY),
        |((row, history), spec, rng, masked)| {
            let row = if masked { generate::all_masked(row.len()) } else { row };
            let mut chain = Chain::from_spec(&spec, &ctx(row.len(), rng)).unwrap_or_else(|e| panic!("{spec}: {e}"));
            for &t in &history {
                chain.accept(t);
            }
            for step in 0..3 {
                match chain.sample(&row) {
                    Ok(token) => {
                        prop_assert!(!masked, "{spec}: sampled {token} from an all-masked row");
                        let s = Snap::of(chain.candidates());
                        let stale_sorted_possible = spec.rfind("logit_bias").is_some_and(|at| at > 0);
                        invariants_with(&spec, &row, &s, !stale_sorted_possible)?;
                        prop_assert_eq!(Some(token), s.selected.map(|i| s.cands[i].id));
                    }
                    Err(e) => {
                        prop_assert!(e.is_no_candidates(), "{spec} step {step}: unexpected error {e}");
                        let may_degenerate =
                            spec.contains("typical") && oracle::f32_underflows(&oracle::from_row(&row));
                        prop_assert!(masked || may_degenerate, "{spec} step {step}: no candidate left from a live row");
                    }
                }
            }
            Ok(())
        },
    );
}

/// Every stage, fed NaN or `+inf` logits, returns an error (from `sample` and `apply`) and
/// stays usable.
#[test]
fn invalid_rows_are_errors_for_every_chain() {
    let chain = (proptest::collection::vec(filter_stage(), 0..4), selecting_stage()).prop_map(|(mut f, s)| {
        f.push(s);
        f.join(";")
    });
    check("invalid_rows", CASES, (generate::invalid_row(300), chain, rng_config()), |(row, spec, rng)| {
        let mut chain = Chain::from_spec(&spec, &ctx(row.len(), rng)).unwrap();
        let e = chain.sample(&row).expect_err("NaN/+inf row accepted");
        prop_assert!(!e.is_no_candidates(), "{spec}: wrong error kind: {e}");
        prop_assert!(chain.apply(&row).is_err(), "{spec}: apply accepted a NaN/+inf row");
        prop_assert_eq!(chain.n_accepted(), 0);
        let good: Vec<f32> = (0..row.len()).map(|i| i as f32 * 0.01).collect();
        prop_assert!(chain.sample(&good).is_ok(), "{spec}: unusable after an error");
        Ok(())
    });
}

/// Out-of-range and extreme parameters: building may fail, sampling may fail, nothing panics,
/// and a sampled token is in range.
#[test]
fn extreme_parameters_never_panic() {
    const SPECS: &[&str] = &[
        "temperature(1e-30)",
        "temperature(1e30)",
        "temperature(-1e30)",
        "top_k(2147483647)",
        "top_k(-2147483648)",
        "top_p(-1,0)",
        "top_p(2,5)",
        "top_p(0.5,2147483647)",
        "min_p(-1,0)",
        "min_p(100,0)",
        "min_p(1e-30,1000000)",
        "typical(0,1000000)",
        "typical(-1,0)",
        "temp_ext(1e-30,1e30,1e30)",
        "temp_ext(-5,2,0)",
        "temp_ext(0,1,-3)",
        "top_n_sigma(1e30)",
        "top_n_sigma(1e-30)",
        "xtc(1,0,0)",
        "xtc(1,-1,1000000)",
        "xtc(1,0.5,0)",
        "penalties(1000000,1e-30,1e30,-1e30)",
        "penalties(-5,0,0,0)",
        "penalties(64,0,0,0)",
        "penalties(64,-2,1,1)",
        "logit_bias(0:1e30 1:-1e30 99999999:1 -5:2)",
        "logit_bias(0:3.4e38 0:3.4e38)",
        "logit_bias(0:-inf 1:-inf 2:-inf)",
    ];
    const SELECTING: &[&str] = &[
        "dist",
        "greedy",
        "mirostat(1e30,1e30,1)",
        "mirostat(0,0,0)",
        "mirostat(-5,1,1000000)",
        "mirostat(5,0.1,100)",
        "mirostat_v2(1e30,1e30)",
        "mirostat_v2(-1,-1)",
        "mirostat_v2(5,0.1)",
        "gumbel(1e-30)",
        "gumbel(1e30)",
        "gumbel(-1)",
    ];
    let strategy = (
        row_and_history(),
        proptest::sample::select(SPECS),
        proptest::sample::select(SELECTING),
        rng_config(),
        prop::bool::ANY,
    );
    check("extreme_parameters", CASES, strategy, |((row, history), stage, last, rng, with_filter)| {
        let spec = if with_filter { format!("{stage};{last}") } else { last.to_string() };
        let Ok(mut chain) = Chain::from_spec(&spec, &ctx(row.len(), rng)) else {
            return Ok(()); // rejected parameters are a fine outcome
        };
        for &t in &history {
            chain.accept(t);
        }
        for _ in 0..3 {
            if let Ok(token) = chain.sample(&row) {
                prop_assert!((token as usize) < row.len(), "{spec}: token {token} out of range");
            }
        }
        let mut apply_chain = match Chain::from_spec_for_apply(stage, &ctx(row.len(), rng)) {
            Ok(c) => c,
            Err(_) => return Ok(()),
        };
        let _ = apply_chain.apply(&row);
        Ok(())
    });
}
