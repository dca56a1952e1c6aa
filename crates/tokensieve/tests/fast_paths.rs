//! The in-place fast paths (`convention::llama_cpp::dense`) against the candidate-array path
//! they replace, bit for bit: the same candidates (ids, order, logit bits, `p` bits), sorted
//! flag and selection after `apply`, and the same tokens from `sample` over several steps.
//!
//! The array path is run by hand here: `Candidates::from_logits` (llama.cpp's fill) and every
//! stage's `apply` on a clone of the chain's stages (same parameters, same RNG state). Rows are
//! large enough for the fast paths to engage (they need more blocks than kept candidates) and
//! tie-heavy enough to hit their fallbacks: exact duplicates of the top values, values on a
//! coarse grid, `-0.0` beside `0.0`, `-inf`, huge magnitudes. Each property also counts how
//! often the fast path itself ran, so it cannot silently test only the fallback.

use proptest::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokensieve::convention::llama_cpp::dense::Path;
use tokensieve::sampler::{BuildContext, Sampler, Stage};
use tokensieve::{Candidates, Chain, RngConfig};
use tokensieve_testkit::generate::{self, RowKind, SplitMix64};
use tokensieve_testkit::proptest_support::check;

const CASES: u32 = 96;

/// A row of `v` logits: one of the generator's kinds, then some adversarial touches.
fn make_row(kind: RowKind, v: usize, seed: u64, touch: u8) -> Vec<f32> {
    let mut r = generate::row(kind, v, seed);
    let mut rng = SplitMix64::new(seed ^ 0x5eed);
    // Half the rows keep the generator's shape (the fast paths' home ground), half get a touch.
    match touch % 8 {
        // Duplicate some of the largest values at random positions (ties inside the top k).
        0 => {
            let mut sorted = r.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            for _ in 0..(1 + rng.below(6)) {
                let value = sorted[rng.below(sorted.len().min(60))];
                let at = rng.below(v);
                r[at] = value;
            }
        }
        // A coarse grid: ties everywhere.
        1 => r.iter_mut().for_each(|x| *x = (*x * 2.0).round() / 2.0),
        // Signed zeros at the top.
        2 => {
            let at = rng.below(v);
            let m = r.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            r[at] = m + 1.0;
            let other = rng.below(v);
            if other != at {
                r[at] = 0.0;
                r[other] = -0.0;
                r.iter_mut()
                    .enumerate()
                    .filter(|(i, x)| *i != at && *i != other && **x >= 0.0)
                    .for_each(|(_, x)| *x = -1.0);
            }
        }
        // Masked entries.
        3 => {
            for _ in 0..(v / 7) {
                let at = rng.below(v);
                r[at] = f32::NEG_INFINITY;
            }
            if r.iter().all(|x| *x == f32::NEG_INFINITY) {
                r[0] = 0.0;
            }
        }
        _ => {}
    }
    r
}

fn row_strategy() -> impl Strategy<Value = Vec<f32>> {
    let v = prop_oneof![1 => 129usize..2000, 3 => 2000usize..20_000, 1 => Just(32_000usize)];
    let natural = proptest::sample::select(vec![
        RowKind::Gaussian,
        RowKind::Peaked,
        RowKind::NegInf,
        RowKind::ShiftedUp,
        RowKind::ShiftedDown,
    ]);
    prop_oneof![
        (generate::row_kind(), v.clone(), any::<u64>(), any::<u8>())
            .prop_map(|(k, v, seed, touch)| make_row(k, v, seed, touch)),
        (natural, v, any::<u64>()).prop_map(|(k, v, seed)| generate::row(k, v, seed)),
    ]
}

fn prefix() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => Just(String::new()),
        1 => (1usize..64, 1.05f32..1.5, 0.0f32..0.3).prop_map(|(n, rep, fr)| format!("penalties({n},{rep},{fr},0.1);")),
        1 => (0u32..200, -5.0f32..5.0).prop_map(|(id, b)| format!("logit_bias({id}:{b} 3:-inf {id}:0.5 999999:1);")),
        1 => Just("penalties(64,1.1,0.1,0.1);logit_bias(5:2.5);".to_string()),
    ]
}

fn first_stage() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop_oneof![Just(1i32), Just(2), Just(5), Just(40), Just(100), Just(128), Just(129), Just(300)].prop_map(|k| format!("top_k({k})")),
        2 => (prop_oneof![Just(0.05f32), Just(1.0), Just(1.05), 0.0001f32..0.9], 0usize..4).prop_map(|(p, mk)| format!("min_p({p},{mk})")),
        2 => (prop_oneof![Just(0.95f32), Just(0.5), Just(0.0), 0.01f32..0.999], 0usize..4).prop_map(|(p, mk)| format!("top_p({p},{mk})")),
    ]
}

fn tail() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(";dist".to_string()),
        Just(";greedy".to_string()),
        Just(";top_p(0.95,1);min_p(0.05,1);temperature(0.8);dist".to_string()),
        Just(";temperature(0.7);dist".to_string()),
        Just(";min_p(0.05,1);temperature(0.8);dist".to_string()),
        Just(";min_p(0.3,2);xtc(0.5,0.1,1);dist".to_string()),
    ]
}

fn history() -> impl Strategy<Value = Vec<u32>> {
    proptest::collection::vec(prop_oneof![0u32..50, 0u32..40_000], 0..40)
}

/// The array path: llama.cpp's fill, then every stage.
fn array_path(stages: &mut [Stage], row: &[f32]) -> Result<Candidates, tokensieve::Error> {
    let mut c = Candidates::from_logits(row)?;
    for s in stages.iter_mut() {
        s.apply(&mut c)?;
    }
    Ok(c)
}

fn same(a: &Candidates, b: &Candidates) -> Result<(), String> {
    let bits =
        |c: &Candidates| c.as_slice().iter().map(|t| (t.id, t.logit.to_bits(), t.p.to_bits())).collect::<Vec<_>>();
    if bits(a) != bits(b) {
        let (x, y) = (bits(a), bits(b));
        let i = x.iter().zip(&y).position(|(p, q)| p != q).unwrap_or(x.len().min(y.len()));
        return Err(format!(
            "candidates differ at {i} (len {} vs {}): {:?} vs {:?}",
            x.len(),
            y.len(),
            x.get(i),
            y.get(i)
        ));
    }
    if a.is_sorted() != b.is_sorted() || a.selected_index() != b.selected_index() {
        return Err(format!(
            "sorted/selected {:?}/{:?} vs {:?}/{:?}",
            a.is_sorted(),
            a.selected_index(),
            b.is_sorted(),
            b.selected_index()
        ));
    }
    Ok(())
}

#[derive(Default)]
struct Paths {
    fast: AtomicUsize,
    fallback: AtomicUsize,
    array: AtomicUsize,
}

impl Paths {
    fn note(&self, p: Path) {
        if std::env::var("FAST_PATHS_VERBOSE").is_ok() {
            eprintln!("path {p:?}");
        }
        let counter = match p {
            Path::Fast(_) => &self.fast,
            Path::Fallback(_) => &self.fallback,
            Path::Array => &self.array,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
    fn report(&self, name: &str, min_fast: f64) {
        let (f, b, a) = (
            self.fast.load(Ordering::Relaxed),
            self.fallback.load(Ordering::Relaxed),
            self.array.load(Ordering::Relaxed),
        );
        eprintln!("{name}: fast path {f}, fell back {b}, array path {a}");
        let total = (f + b + a).max(1);
        assert!(f as f64 >= min_fast * total as f64, "{name}: the fast path ran in only {f} of {total} steps");
        assert!(b > 0, "{name}: no case exercised a fallback");
    }
}

/// `apply`: the full candidate set, bit for bit.
#[test]
fn apply_matches_the_array_path() {
    let paths = Paths::default();
    let strategy = (row_strategy(), prefix(), first_stage(), tail(), history(), any::<u32>());
    check("fast_apply", CASES, strategy, |(row, prefix, first, tail, history, seed)| {
        let spec = format!("{prefix}{first}{tail}");
        let ctx = BuildContext::new(row.len(), RngConfig::mt19937(seed));
        let mut chain = Chain::from_spec_for_apply(&spec, &ctx).unwrap();
        for &t in &history {
            chain.accept(t);
        }
        let mut stages = chain.stages().to_vec();
        let want = array_path(&mut stages, &row);
        let got = chain.apply(&row).cloned();
        paths.note(chain.last_path());
        match (got, want) {
            (Ok(got), Ok(want)) => same(&got, &want).map_err(|e| TestCaseError::fail(format!("{spec}: {e}")))?,
            (Err(a), Err(b)) => prop_assert_eq!(a.to_string(), b.to_string()),
            (a, b) => prop_assert!(false, "{spec}: {:?} vs {:?}", a.map(|c| c.len()), b.map(|c| c.len())),
        }
        Ok(())
    });
    paths.report("apply", 0.25);
}

/// Three `sample` steps of the chain `spec` (after `history`) against the array path on a copy
/// of its stages with the same history, each token accepted on both sides: the same tokens,
/// or the same error.
fn sample_steps(
    ctx: &BuildContext<'_>,
    history: &[u32],
    row: &[f32],
    spec: &str,
    paths: &Paths,
) -> Result<(), TestCaseError> {
    let mut chain = Chain::from_spec(spec, ctx).unwrap();
    let mut stages = chain.stages().to_vec();
    for &t in history {
        chain.accept(t);
        stages.iter_mut().for_each(|s| s.accept(t));
    }
    for step in 0..3 {
        let want = array_path(&mut stages, row).map(|c| c.selected_token());
        let got = chain.sample(row);
        paths.note(chain.last_path());
        match (got, want) {
            (Ok(token), Ok(Some(want))) => {
                prop_assert_eq!(token, want, "{} step {}", spec, step);
                prop_assert_eq!(chain.candidates().selected_token(), Some(token));
                stages.iter_mut().for_each(|s| s.accept(token));
            }
            (Err(a), Err(b)) => {
                prop_assert_eq!(a.to_string(), b.to_string());
                break;
            }
            (a, b) => prop_assert!(false, "{spec} step {step}: {a:?} vs {b:?}"),
        }
    }
    Ok(())
}

/// `sample`: the same tokens over several steps (each accepted on both sides), for chains the
/// selecting fast paths take too.
#[test]
fn sample_matches_the_array_path() {
    let paths = Paths::default();
    let chain = prop_oneof![
        2 => (prefix(), first_stage(), tail()).prop_map(|(p, f, t)| format!("{p}{f}{t}")),
        1 => prefix().prop_map(|p| format!("{p}greedy")),
        2 => prop_oneof![
            Just("dist"),
            Just("temperature(0.8);dist"),
            Just("temperature(1.7);dist"),
            Just("temp_ext(0.5,0);dist"),
            Just("temperature(1e-30);dist"),
            Just("top_n_sigma(1);dist"),
            Just("top_n_sigma(0.5);top_k(40);top_p(0.95,1);min_p(0.05,1);temperature(0.8);dist"),
            Just("top_n_sigma(2);temperature(0.7);greedy"),
            Just("xtc(0.5,0.1,1);temperature(0.8);dist"),
            Just("xtc(0.5,0.1,1);top_k(40);top_p(0.95,1);min_p(0.05,1);temperature(0.8);dist"),
            Just("penalties(64,1.1,0.1,0.1);xtc(0.5,0.05,2);top_k(40);dist"),
            Just("xtc(1,0.2,1);dist"),
            Just("temperature(0.8);top_k(40);top_p(0.95,1);min_p(0.05,1);dist"),
            Just("temperature(3);top_k(5);dist"),
            Just("penalties(64,1.1,0.1,0.1);temperature(0.7);top_k(40);dist"),
        ]
            .prop_map(String::from),
    ];
    let rng = prop_oneof![any::<u32>().prop_map(RngConfig::mt19937), any::<u64>().prop_map(RngConfig::philox)];
    check("fast_sample", CASES, (row_strategy(), chain, history(), rng), |(row, spec, history, rng)| {
        sample_steps(&BuildContext::new(row.len(), rng), &history, &row, &spec, &paths)
    });
    paths.report("sample", 0.4);
}

/// Rows of `v` logits on which many draws land near an interval end, named: the generator's
/// flat, peaked, huge-valued and shifted rows, a nearly flat one, one in which every block
/// reaches `min_p(0.9)`'s threshold but every third entry does not, and one with an entry on
/// that threshold (`ln 0.9` below the maximum 0), which only the sum decides.
fn flat_and_long_tailed_rows(v: usize, seed: u64) -> Vec<(String, Vec<f32>)> {
    let mut rows: Vec<(String, Vec<f32>)> = [RowKind::Flat, RowKind::Peaked, RowKind::Huge, RowKind::ShiftedDown]
        .into_iter()
        .map(|kind| (format!("{kind:?}"), generate::row(kind, v, seed)))
        .collect();
    let nearly_flat: Vec<f32> = generate::row(RowKind::Gaussian, v, seed).iter().map(|x| x * 0.02).collect();
    let lower_third = nearly_flat.iter().enumerate().map(|(i, &x)| if i % 3 == 0 { -0.2 } else { x * 0.05 }).collect();
    let mut on_threshold: Vec<f32> = nearly_flat.iter().map(|x| x * 0.05).collect();
    let top = on_threshold.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    on_threshold.iter_mut().for_each(|x| *x -= top);
    on_threshold[v / 2] = 0.9f32.ln();
    rows.push(("nearly flat".into(), nearly_flat));
    rows.push(("lower third".into(), lower_third));
    rows.push(("on threshold".into(), on_threshold));
    rows
}

/// The `dist` fast path's certainty test on rows where many draws land near an interval end:
/// a flat row (every weight equal, so every boundary is a multiple of the same value), a
/// nearly flat one, and rows with a huge number of tiny weights. `min_p` first keeps every
/// entry of the (nearly) flat rows, so `dist` draws from the row there too.
#[test]
fn dist_on_flat_and_long_tailed_rows() {
    let mut after_min_p = 0;
    for (v, seed) in [(20_000usize, 1u64), (50_000, 2), (128_256, 3)] {
        for (kind, row) in flat_and_long_tailed_rows(v, seed) {
            for spec in [
                "dist",
                "temperature(0.8);dist",
                "temperature(3);dist",
                "min_p(0.05);temperature(0.8);dist",
                "min_p(0.9,2);dist",
            ] {
                let ctx = BuildContext::new(v, RngConfig::mt19937(seed as u32));
                let mut chain = Chain::from_spec(spec, &ctx).unwrap();
                let mut stages = chain.stages().to_vec();
                for step in 0..20 {
                    let want = array_path(&mut stages, &row).unwrap().selected_token().unwrap();
                    let got = chain.sample(&row).unwrap();
                    assert_eq!(got, want, "{spec} {kind} V={v} step {step}");
                    after_min_p += (spec.starts_with("min_p") && chain.last_path() != Path::Fast("min-p")) as usize;
                    stages.iter_mut().for_each(|s| s.accept(got));
                }
            }
        }
    }
    assert!(after_min_p >= 100, "min_p kept every entry in only {after_min_p} steps");
}

/// The transformers `dist` path's certainty test where many draws land near an interval end
/// (flat rows, long tails), against the array path.
#[test]
fn transformers_dist_on_flat_and_long_tailed_rows() {
    let (mut fast, mut flat_fast, mut after_min_p) = (0, 0, 0);
    for (v, seed) in [(20_000usize, 1u64), (128_256, 3)] {
        for (kind, row) in flat_and_long_tailed_rows(v, seed) {
            for spec in [
                "dist",
                "temperature(0.8);dist",
                "temperature(3);dist",
                "temperature(0.8);min_p(0.05);dist",
                "min_p(0.9,2);dist",
            ] {
                let ctx =
                    BuildContext::new(v, RngConfig::philox(seed)).with_convention(tokensieve::Convention::Transformers);
                let mut chain = Chain::from_spec(spec, &ctx).unwrap();
                let mut stages = chain.stages().to_vec();
                for step in 0..12 {
                    let want = array_path(&mut stages, &row).unwrap().selected_token().unwrap();
                    let got = chain.sample(&row).unwrap();
                    let took_fast = matches!(chain.last_path(), Path::Fast(_)) as usize;
                    let from_the_row =
                        matches!(chain.last_path(), Path::Fast("dist" | "dist (exact sums)") | Path::Fallback("dist"));
                    match kind.as_str() {
                        _ if spec.contains("min_p") => after_min_p += from_the_row as usize,
                        "Peaked" => fast += took_fast,
                        "Flat" => flat_fast += took_fast,
                        _ => {}
                    }
                    assert_eq!(got, want, "{spec} {kind} V={v} step {step}");
                    if kind == "on threshold" && spec.starts_with("min_p(0.9") {
                        assert!(!from_the_row, "a token on min_p's threshold was kept without the sum");
                    }
                    stages.iter_mut().for_each(|s| s.accept(got));
                }
            }
        }
    }
    // Flat rows put many interval ends near any target, too near for the approximate sums'
    // bound: the exact weights' sums decide those (their bound is the f64 additions' order).
    // Logits of magnitude 1e4 may fall back.
    assert!(fast >= 64, "the fast path ran in only {fast} of 72 steps on peaked rows");
    assert!(flat_fast >= 68, "the fast path ran in only {flat_fast} of 72 steps on flat rows");
    // `min_p` keeps every token of the flat and nearly flat rows (and of some Gaussian ones at
    // 0.05), so `dist` draws from the row there.
    assert!(after_min_p >= 60, "min_p kept every token in only {after_min_p} steps");
}

/// transformers' `top_p` on the row (`convention::transformers::row`), which needs rows whose
/// mass sits in a few hundred tokens: peaked rows at several sharpnesses, sampled over several
/// steps against the array path. The random chains above rarely reach it (their rows are
/// smaller or flatter), so this also counts the steps it decided itself.
#[test]
fn transformers_top_p_on_large_rows() {
    let mut fast = 0;
    let mut steps = 0;
    for (i, v) in [32_000usize, 128_256].into_iter().enumerate() {
        for kind in [RowKind::Peaked, RowKind::Gaussian, RowKind::ShiftedDown] {
            for scale in [1.0f32, 3.0, 10.0] {
                let row: Vec<f32> = generate::row(kind, v, i as u64 + 7).into_iter().map(|x| x * scale).collect();
                // A stage between `top_p` and `dist`, so that `top_p` leaves its survivors
                // (`top_p;dist` alone only draws: `transformers_top_p_dist_on_large_rows`).
                for spec in [
                    "top_p(0.95);temperature(0.9);dist",
                    "temperature(0.8);top_p(0.9);temperature(1.5);dist",
                    "top_p(0.5);temperature(0.9);dist",
                    "top_p(0.999,3);temperature(0.9);dist",
                ] {
                    let ctx = BuildContext::new(v, RngConfig::philox(i as u64 + 11))
                        .with_convention(tokensieve::Convention::Transformers);
                    let mut chain = Chain::from_spec(spec, &ctx).unwrap();
                    let mut stages = chain.stages().to_vec();
                    let (mut got_dense, mut want_dense) = (vec![0.0f32; v], vec![0.0f32; v]);
                    for step in 0..4 {
                        let want = array_path(&mut stages, &row).unwrap();
                        let got = chain.sample(&row).unwrap();
                        steps += 1;
                        fast += (chain.last_path() == Path::Fast("top_p")) as usize;
                        assert_eq!(Some(got), want.selected_token(), "{spec} {kind:?} x{scale} V={v} step {step}");
                        // The survivors too (the sparse view against the dense row), logit bits
                        // included: the token alone rarely tells a cut one position off.
                        chain.candidates().write_dense(&mut got_dense);
                        want.write_dense(&mut want_dense);
                        let bits = |d: &[f32]| d.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert!(
                            bits(&got_dense) == bits(&want_dense),
                            "{spec} {kind:?} x{scale} V={v} step {step}: survivors differ"
                        );
                        stages.iter_mut().for_each(|s| s.accept(got));
                    }
                }
            }
        }
    }
    eprintln!("transformers top_p on large rows: {fast} of {steps} took the fast path");
    assert!(fast >= steps / 4, "only {fast} of {steps}");
}

/// The real SmolLM2-135M row (the CLI's example: logits after "The capital of France is").
fn real_row() -> Vec<f32> {
    let npy = concat!(env!("CARGO_MANIFEST_DIR"), "/../tokensieve-cli/testdata/example-logits.npy");
    tokensieve_testkit::cli::read_npy_f32(npy.as_ref()).1
}

/// `top_n_sigma` on the whole row: its threshold bounded from the row's sums and the survivors
/// gathered (`dense::top_n_sigma`). Peaked, Gaussian, tied and bf16-rounded rows at three sizes
/// and the real SmolLM2 row, each with `-inf` entries too, and tails that sort (where equal
/// survivors must fall back) and that do not: the same tokens as the array path over several
/// steps, with the fast path taken on most steps of the rows without ties. `apply` (the
/// array, masked through the bounds) leaves the array path's candidates.
#[test]
fn top_n_sigma_on_large_rows() {
    let mut rows = vec![("real".to_string(), real_row())];
    for (i, v) in [4_099usize, 32_000, 128_256].into_iter().enumerate() {
        for kind in [RowKind::Peaked, RowKind::Gaussian, RowKind::Ties, RowKind::Bf16, RowKind::NegInf] {
            let row = generate::row(kind, v, i as u64 + 11);
            rows.push((format!("{kind:?} V={v}"), row));
        }
    }
    let mut masked = real_row();
    masked.iter_mut().step_by(7).for_each(|x| *x = f32::NEG_INFINITY);
    masked[0] = f32::NEG_INFINITY;
    rows.push(("real, every 7th -inf".to_string(), masked));
    // `expected`: steps on language-model-like rows with `n <= 1` and no `temperature` before a
    // sort, where the bounds should decide (a Gaussian row, or `n = 2`, puts many logits near
    // the threshold: the bounds' interval, about 0.4% of `n·σ` wide at V = 128k, then holds
    // some of them).
    let (mut fast, mut steps, mut expected, mut fast_expected, mut fell_back) = (0, 0, 0, 0, 0);
    for (name, row) in &rows {
        let lm_like = name.starts_with("Peaked") || name.starts_with("real");
        for spec in [
            "top_n_sigma(1);dist",
            "top_n_sigma(1);top_k(40);top_p(0.95,1);min_p(0.05,1);temperature(0.8);dist",
            "top_n_sigma(0.5);temperature(0.7);dist",
            "top_n_sigma(2);top_p(0.9,1);dist",
            "top_n_sigma(1.5);min_p(0.2,3);greedy",
            "top_n_sigma(1);temperature(0.8);top_k(5);dist",
        ] {
            let ctx = BuildContext::new(row.len(), RngConfig::mt19937(steps as u32));
            let mut chain = Chain::from_spec(spec, &ctx).unwrap();
            let mut stages = chain.stages().to_vec();
            for step in 0..3 {
                let want = array_path(&mut stages, row).unwrap();
                let got = chain.sample(row).unwrap();
                steps += 1;
                let path = chain.last_path();
                fast += (path == Path::Fast("top-n-sigma")) as usize;
                fell_back += (path == Path::Fallback("top-n-sigma")) as usize;
                if lm_like
                    && (spec.starts_with("top_n_sigma(1)") || spec.starts_with("top_n_sigma(0.5)"))
                    && !spec.contains("temperature(0.8);top_k")
                {
                    expected += 1;
                    fast_expected += (path == Path::Fast("top-n-sigma")) as usize;
                }
                assert_eq!(Some(got), want.selected_token(), "{spec} {name} step {step}");
                stages.iter_mut().for_each(|s| s.accept(got));
            }
            let mut applied =
                Chain::from_spec_for_apply(&spec.replace(";dist", "").replace(";greedy", ""), &ctx).unwrap();
            let want = array_path(&mut applied.stages().to_vec(), row).unwrap();
            let got = applied.apply(row).unwrap();
            same(got, &want).unwrap_or_else(|e| panic!("apply {spec} {name}: {e}"));
        }
    }
    eprintln!("top_n_sigma on large rows: {fast} of {steps} steps took the fast path, {fell_back} fell back");
    assert!(fast_expected * 10 >= expected * 9, "only {fast_expected} of {expected}");
    assert!(fell_back > 0, "no step fell back");
}

/// Rows for the whole-row `top_p` tests: the real row, then language-model-like (`Peaked`,
/// five seeds), Gaussian, tied, bf16-rounded, `-inf`-masked and flat rows at three sizes.
fn whole_row_top_p_rows() -> Vec<(String, Vec<f32>)> {
    let mut rows = vec![("real".to_string(), real_row())];
    for (i, v) in [4_099usize, 32_000, 128_256].into_iter().enumerate() {
        for kind in [RowKind::Peaked, RowKind::Gaussian, RowKind::Ties, RowKind::Bf16, RowKind::NegInf, RowKind::Flat] {
            rows.push((format!("{kind:?} V={v}"), generate::row(kind, v, i as u64 + 21)));
        }
        for seed in 100..104 {
            rows.push((format!("Peaked V={v} seed {seed}"), generate::row(RowKind::Peaked, v, seed)));
        }
    }
    rows
}

/// Samples each of `specs` for three steps on every row of [`whole_row_top_p_rows`] beside
/// the array path: the same tokens, the chosen candidate with the array path's processed
/// logit, and (where `path` was taken and left the candidates to the later stages) the same
/// candidates. Returns how often `path` was taken on the language-model-like rows with the
/// first spec, out of how many steps, and over all steps.
fn whole_row_top_p(specs: &[&str], path: Path) -> (usize, usize, usize, usize) {
    let (mut taken, mut steps, mut expected, mut taken_expected) = (0, 0, 0, 0);
    for (name, row) in &whole_row_top_p_rows() {
        let lm_like = name.starts_with("Peaked") || name.starts_with("real");
        for (j, spec) in specs.iter().enumerate() {
            let ctx = BuildContext::new(row.len(), RngConfig::philox(steps as u64));
            let mut chain = Chain::from_spec(spec, &ctx).unwrap();
            let mut stages = chain.stages().to_vec();
            for step in 0..3 {
                let want = array_path(&mut stages, row).unwrap();
                let got = chain.sample(row).unwrap();
                steps += 1;
                let this = chain.last_path() == path;
                taken += this as usize;
                if lm_like && j == 0 {
                    expected += 1;
                    taken_expected += this as usize;
                }
                let at = format!("{spec} {name} step {step}");
                assert_eq!(Some(got), want.selected_token(), "{at}");
                let chosen =
                    |c: &Candidates| c.selected_index().map(|i| (c.as_slice()[i].id, c.as_slice()[i].logit.to_bits()));
                assert_eq!(chosen(chain.candidates()), chosen(&want), "{at}");
                if this && chain.candidates().len() > 1 {
                    same(chain.candidates(), &want).unwrap_or_else(|e| panic!("{at}: {e}"));
                }
                stages.iter_mut().for_each(|s| s.accept(got));
            }
        }
    }
    (taken_expected, expected, taken, steps)
}

/// `top_p` then `min_p` over the whole row when sampling (`dense::top_p_bounded`): `top_p`'s
/// cut from a lower bound of llama.cpp's softmax sum, which need only reach past `min_p`'s
/// cut. The bound decides on most steps of the language-model-like rows with llama.cpp's
/// usual `min_p`. Chains it does not admit (no `dist` last, a stage that reads `p`) and a
/// `min_p` that keeps nearly everything (the exact sum decides) are among them.
#[test]
fn top_p_then_min_p_on_large_rows() {
    let (fast_expected, expected, fast, steps) = whole_row_top_p(
        &[
            "top_p(0.95,1);min_p(0.05,1);temperature(0.8);dist",
            "top_p(0.9,2);min_p(0.2,3);xtc(0.5,0.1,1);dist",
            "top_p(0.95,1);top_k(0);min_p(0.05,1);typical(0.9,1);temperature(0.7);dist",
            "top_p(0.99,1);min_p(0.0001,1);dist",
            "top_p(0.95,1);min_p(0.05,1);greedy",
            "top_p(0.95,1);min_p(0.05,1);mirostat_v2(5,0.1)",
        ],
        Path::Fast("top-p (bounded sum)"),
    );
    eprintln!("top_p then min_p: the bound decided {fast} of {steps} steps, {fast_expected} of {expected} expected");
    assert!(fast_expected * 10 >= expected * 9, "only {fast_expected} of {expected}");
}

/// `top_p;temperature;dist` over the whole row when sampling (`dense::top_p_dist` with a
/// temperature): the draw certified from bounds on the softmax sum, the survivors' weights
/// past the cut bounded through the temperature. The bounds decide on most steps of the
/// language-model-like rows at `t = 0.8`; a temperature above 1 takes the exact path.
#[test]
fn top_p_then_temperature_on_large_rows() {
    let (fast_expected, expected, fast, steps) = whole_row_top_p(
        &[
            "top_p(0.95,1);temperature(0.8);dist",
            "top_p(0.9,2);temperature(0.3);dist",
            "top_p(0.5,1);top_k(0);temperature(0.999);dist",
            "top_p(0.95,1);temperature(1.5);dist",
        ],
        Path::Fast("top-p;dist"),
    );
    eprintln!(
        "top_p then temperature: the bounds decided {fast} of {steps} steps, {fast_expected} of {expected} expected"
    );
    assert!(fast_expected * 10 >= expected * 8, "only {fast_expected} of {expected}");
}

/// `xtc` first when sampling: its draw made before the row is read, the rest of the chain on
/// the row when it does not fire (any fallback starting after it), the array path when it
/// does. Over 12 steps per chain the same tokens as the array path (so every stage's stream
/// stays aligned), on peaked rows, rows with ties and the real row, with penalties before it
/// (an overlay: the array path) and without, and with a stage after it whose fast path falls
/// back to the array (which must start after `xtc`, and run the penalties).
#[test]
fn xtc_first_draws_as_the_array_path() {
    let mut rows = vec![("real".to_string(), real_row())];
    for (i, v) in [4_099usize, 32_000].into_iter().enumerate() {
        for kind in [RowKind::Peaked, RowKind::Ties] {
            rows.push((format!("{kind:?} V={v}"), generate::row(kind, v, i as u64 + 3)));
        }
    }
    let (mut skipped, mut fired, mut steps) = (0, 0, 0);
    for (name, row) in &rows {
        for spec in [
            "xtc(0.5,0.1,1);temperature(0.8);dist",
            "xtc(0.5,0.05,1);top_k(40);top_p(0.95,1);min_p(0.05,1);temperature(0.8);dist",
            "xtc(0.3,0.1,2);top_k(3);dist",
            "penalties(64,1.1,0.1,0.1);xtc(0.5,0.05,2);top_k(40);dist",
            "xtc(0.5,0.1,1);greedy",
            // `min_p` keeping fewer than `min_keep`: its fast path falls back to the array.
            "xtc(0.5,0.1,1);min_p(0.5,100);temperature(0.8);dist",
            "penalties(64,1.5,0.5,0.5);xtc(0.5,0.1,1);min_p(0.5,100);dist",
        ] {
            for rng in [RngConfig::mt19937(steps as u32), RngConfig::philox(steps as u64)] {
                let ctx = BuildContext::new(row.len(), rng);
                let mut chain = Chain::from_spec(spec, &ctx).unwrap();
                let mut stages = chain.stages().to_vec();
                for step in 0..12 {
                    let want = array_path(&mut stages, row).unwrap();
                    let got = chain.sample(row).unwrap();
                    steps += 1;
                    match chain.last_path() {
                        Path::Fallback("xtc") => fired += 1,
                        _ => skipped += 1,
                    }
                    assert_eq!(Some(got), want.selected_token(), "{spec} {name} step {step}");
                    stages.iter_mut().for_each(|s| s.accept(got));
                }
            }
        }
    }
    eprintln!("xtc first: {skipped} of {steps} steps skipped it, {fired} took the array path");
    assert!(skipped * 3 >= steps && fired * 5 >= steps, "{skipped} skipped, {fired} fired of {steps}");
}

/// transformers' `epsilon` on the whole row (`row::cut_below`): each token's test is decided
/// by bounds on the softmax sum. Peaked, Gaussian and shifted rows at several sharpnesses and
/// the real SmolLM2 row, cutoffs from far below the tail to near the top, with and without
/// `min_tokens_to_keep`: the same tokens and survivors (the sparse view against the dense
/// row, logit bits included) as the array path over several steps, with the fast path taken
/// on most of them.
#[test]
fn transformers_epsilon_on_large_rows() {
    let mut rows = vec![("real".to_string(), real_row())];
    for (i, v) in [4_099usize, 32_000, 128_256].into_iter().enumerate() {
        for kind in [RowKind::Peaked, RowKind::Gaussian, RowKind::ShiftedDown] {
            for scale in [1.0f32, 3.0, 10.0] {
                let row = generate::row(kind, v, i as u64 + 7).into_iter().map(|x| x * scale).collect();
                rows.push((format!("{kind:?} x{scale} V={v}"), row));
            }
        }
    }
    let (mut fast, mut steps) = (0, 0);
    for (name, row) in &rows {
        // A stage after `epsilon`, so that its survivors are left to compare.
        for spec in [
            "epsilon(0.0003);temperature(0.9);dist",
            "temperature(0.8);epsilon(0.001,3);temperature(1.2);dist",
            "epsilon(1e-7);top_k(60);dist",
            "temperature(1.5);epsilon(0.2,2);temperature(0.9);dist",
            "epsilon(0.0003);dist",
        ] {
            let ctx = BuildContext::new(row.len(), RngConfig::philox(steps as u64))
                .with_convention(tokensieve::Convention::Transformers);
            let mut chain = Chain::from_spec(spec, &ctx).unwrap();
            let mut stages = chain.stages().to_vec();
            let (mut got_dense, mut want_dense) = (vec![0.0f32; row.len()], vec![0.0f32; row.len()]);
            for step in 0..4 {
                let want = array_path(&mut stages, row).unwrap();
                let got = chain.sample(row).unwrap();
                steps += 1;
                fast += (chain.last_path() == Path::Fast("epsilon")) as usize;
                assert_eq!(Some(got), want.selected_token(), "{spec} {name} step {step}");
                if spec.ends_with("temperature(0.9);dist") || spec.ends_with("temperature(1.2);dist") {
                    chain.candidates().write_dense(&mut got_dense);
                    want.write_dense(&mut want_dense);
                    let bits = |d: &[f32]| d.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert!(bits(&got_dense) == bits(&want_dense), "{spec} {name} step {step}: survivors differ");
                }
                stages.iter_mut().for_each(|s| s.accept(got));
            }
        }
    }
    eprintln!("transformers epsilon on large rows: {fast} of {steps} steps took the fast path");
    assert!(fast * 10 >= steps * 8, "only {fast} of {steps}");
}

/// `epsilon` with its cutoff exactly on a token's probability (which keeps it) and one f32
/// above it (which removes it): only the exact sums can decide that token, so the bounds must
/// hold it undecided until then. The survivors are the array path's.
#[test]
fn transformers_epsilon_cutoff_on_a_probability() {
    let mut checked = 0;
    for (i, v) in [4_099usize, 32_000].into_iter().enumerate() {
        for kind in [RowKind::Peaked, RowKind::Gaussian] {
            let row = generate::row(kind, v, i as u64 + 3);
            // transformers' softmax: f64 weights of the f32 differences, summed in id order.
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &z| m.max(z));
            let sum: f64 = row.iter().map(|&z| ((z - max) as f64).exp()).sum();
            let mut probs: Vec<f32> = row.iter().map(|&z| (((z - max) as f64).exp() / sum) as f32).collect();
            probs.sort_by(|a, b| b.total_cmp(a));
            for rank in [1usize, 5, 30, 200] {
                for cutoff in [probs[rank], probs[rank].next_up()] {
                    let spec = format!("epsilon({});temperature(0.9);dist", cutoff as f64);
                    let ctx = BuildContext::new(v, RngConfig::philox(rank as u64))
                        .with_convention(tokensieve::Convention::Transformers);
                    let mut chain = Chain::from_spec(&spec, &ctx).unwrap();
                    let mut stages = chain.stages().to_vec();
                    let want = array_path(&mut stages, &row).unwrap();
                    assert_eq!(Some(chain.sample(&row).unwrap()), want.selected_token(), "{spec} {kind:?} V={v}");
                    let (mut got_dense, mut want_dense) = (vec![0.0f32; v], vec![0.0f32; v]);
                    chain.candidates().write_dense(&mut got_dense);
                    want.write_dense(&mut want_dense);
                    let kept = |d: &[f32]| d.iter().filter(|x| x.is_finite()).count();
                    assert_eq!(kept(&got_dense), kept(&want_dense), "{spec} {kind:?} V={v}: survivors differ");
                    assert!(got_dense == want_dense, "{spec} {kind:?} V={v}: survivors differ");
                    checked += (chain.last_path() == Path::Fast("epsilon")) as usize;
                }
            }
        }
    }
    assert!(checked >= 24, "only {checked} decided on the row");
}

/// Transformers' `top_p;dist` when sampling (`row::top_p_dist`): the draw is certain from
/// bounds on the softmax sum when `dist` picks the same token over the survivors of every cut
/// they allow; otherwise `top_p` decides the cut and `dist` runs with the same draw. The same
/// rows as `transformers_top_p_on_large_rows`, more steps: the tokens are the array path's,
/// and the bounds decide most steps on peaked rows.
#[test]
fn transformers_top_p_dist_on_large_rows() {
    let (mut steps, mut certain) = (0, 0);
    let (mut peaked_steps, mut peaked_certain) = (0, 0);
    for (i, v) in [4_099usize, 32_000, 128_256].into_iter().enumerate() {
        for kind in [RowKind::Peaked, RowKind::Gaussian, RowKind::ShiftedDown, RowKind::Flat] {
            for scale in [1.0f32, 3.0, 10.0] {
                let row: Vec<f32> = generate::row(kind, v, i as u64 + 7).into_iter().map(|x| x * scale).collect();
                for spec in
                    ["top_p(0.95);dist", "temperature(0.8);top_p(0.9);dist", "top_p(0.5);dist", "top_p(0.999,3);dist"]
                {
                    let ctx = BuildContext::new(v, RngConfig::philox(i as u64 + 11))
                        .with_convention(tokensieve::Convention::Transformers);
                    let mut chain = Chain::from_spec(spec, &ctx).unwrap();
                    let mut stages = chain.stages().to_vec();
                    for step in 0..12 {
                        let want = array_path(&mut stages, &row).unwrap().selected_token();
                        let got = chain.sample(&row).unwrap();
                        assert_eq!(Some(got), want, "{spec} {kind:?} x{scale} V={v} step {step}");
                        assert_eq!(chain.candidates().selected_token(), Some(got));
                        let fast = (chain.last_path() == Path::Fast("top_p;dist")) as usize;
                        steps += 1;
                        certain += fast;
                        if kind == RowKind::Peaked && !spec.contains("0.999") {
                            peaked_steps += 1;
                            peaked_certain += fast;
                        }
                        stages.iter_mut().for_each(|s| s.accept(got));
                    }
                }
            }
        }
    }
    eprintln!(
        "transformers top_p;dist on large rows: {certain} of {steps} steps certain from the bounds, \
         {peaked_certain} of {peaked_steps} on peaked rows"
    );
    assert!(certain * 4 >= steps, "only {certain} of {steps} steps certain");
    assert!(
        peaked_certain * 10 >= peaked_steps * 8,
        "peaked rows: only {peaked_certain} of {peaked_steps} steps certain"
    );
}

/// Transformers' `top_p` on hot rows (a language-model-like row at temperatures 1.6 to 1.8:
/// the nucleus holds 570 to 6,100 tokens, beyond the top sets that the block maxima bound, so
/// the top set is gathered by counting passes over the row): every token is
/// the array path's, and the top set decides most draws (before, they went to the bottom set:
/// most of the row, sorted). Also `top_p` before another stage (its survivors as a view).
#[test]
fn transformers_top_p_on_hot_rows() {
    let (mut steps, mut from_top) = (0, 0);
    for (i, v) in [32_000usize, 128_256].into_iter().enumerate() {
        let row = generate::row(RowKind::Peaked, v, i as u64 + 5);
        for spec in [
            "temperature(1.6);top_p(0.95);dist",
            "temperature(1.7);top_p(0.9);dist",
            "temperature(1.8);top_p(0.9);dist",
            "temperature(1.7);top_p(0.95);min_p(0.0001);dist",
        ] {
            let ctx = BuildContext::new(v, RngConfig::philox(i as u64 + 31))
                .with_convention(tokensieve::Convention::Transformers);
            let mut chain = Chain::from_spec(spec, &ctx).unwrap();
            let mut stages = chain.stages().to_vec();
            for step in 0..4 {
                let want = array_path(&mut stages, &row).unwrap().selected_token();
                let got = chain.sample(&row).unwrap();
                assert_eq!(Some(got), want, "{spec} V={v} step {step}");
                steps += 1;
                from_top += matches!(chain.last_path(), Path::Fast("top_p;dist" | "top_p")) as usize;
                stages.iter_mut().for_each(|s| s.accept(got));
            }
        }
    }
    eprintln!("transformers top_p on hot rows: {from_top} of {steps} steps from the top set");
    assert!(from_top * 3 >= steps * 2, "only {from_top} of {steps} steps from the top set");
}

/// Transformers' `top_p;dist` on rows where most of the vocabulary survives (the cut among the
/// least likely tokens: `row::bottom`): nearly flat rows (the bench's, narrower and wider
/// ones), hot temperatures, ties (a coarse grid, bf16 rounding), `-inf` entries and a
/// `min_tokens_to_keep` that stops the cut, at several sizes. Every token is the array path's,
/// and its probability within the fast `dist`'s approximation of it.
#[test]
fn transformers_top_p_dist_from_below() {
    let (mut steps, mut below, mut flat_steps, mut flat_below) = (0, 0, 0, 0);
    for (i, v) in [1_000usize, 4_099, 32_000, 128_256].into_iter().enumerate() {
        let seed = i as u64 + 3;
        let gaussian = generate::row(RowKind::Gaussian, v, seed);
        // The bench's flat row: N(0, 0.05²).
        let bench_flat: Vec<f32> = gaussian.iter().map(|x| x * (0.05 / 3.0)).collect();
        let nearly_flat: Vec<f32> = gaussian.iter().map(|x| x * 0.02).collect();
        let uniform: Vec<f32> = {
            let mut rng = SplitMix64::new(seed);
            (0..v).map(|_| -3.0 * (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32).collect()
        };
        let grid: Vec<f32> = uniform.iter().map(|x| (x * 20.0).round() / 20.0).collect();
        let bf16: Vec<f32> = nearly_flat.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect();
        let masked: Vec<f32> =
            nearly_flat.iter().enumerate().map(|(j, &x)| if j % 5 == 2 { f32::NEG_INFINITY } else { x }).collect();
        let rows: [(&str, &[f32], bool); 8] = [
            ("bench flat", &bench_flat, true),
            ("nearly flat", &nearly_flat, true),
            ("uniform over 3 nats", &uniform, true),
            ("grid", &grid, false),
            ("bf16", &bf16, false),
            ("masked", &masked, true),
            ("gaussian", &gaussian, false),
            ("peaked", &generate::row(RowKind::Peaked, v, seed), false),
        ];
        for (kind, row, flat) in rows {
            let keep_most = format!("top_p(0.95,{});dist", v - v / 50);
            for spec in [
                "top_p(0.95);dist",
                "top_p(0.9);dist",
                "top_p(0.5);dist",
                "temperature(0.7);top_p(0.8);dist",
                "temperature(40.0);top_p(0.95);dist",
                keep_most.as_str(),
            ] {
                let ctx = BuildContext::new(v, RngConfig::philox(seed + 100))
                    .with_convention(tokensieve::Convention::Transformers);
                let mut chain = Chain::from_spec(spec, &ctx).unwrap();
                let mut stages = chain.stages().to_vec();
                for step in 0..6 {
                    let want = array_path(&mut stages, row).unwrap();
                    let got = chain.sample(row).unwrap();
                    let at = || format!("{spec} {kind} V={v} step {step}");
                    assert_eq!(Some(got), want.selected_token(), "{}", at());
                    let from_below = chain.last_path() == Path::Fast("top_p;dist (from below)");
                    if from_below {
                        let p = chain.candidates().as_slice()[0].p;
                        let want_p = want.as_slice()[got as usize].p;
                        assert!(((p - want_p) / want_p).abs() < 1e-5, "{}: p {p} against {want_p}", at());
                    }
                    steps += 1;
                    below += from_below as usize;
                    if flat && !spec.starts_with("temperature(0.7)") {
                        flat_steps += 1;
                        flat_below += from_below as usize;
                    }
                    stages.iter_mut().for_each(|s| s.accept(got));
                }
            }
        }
    }
    eprintln!(
        "transformers top_p;dist from below: {below} of {steps} steps, {flat_below} of {flat_steps} on flat rows"
    );
    assert!(flat_below * 10 >= flat_steps * 7, "flat rows: only {flat_below} of {flat_steps} steps from below");
}

/// The exact softmax sum that skips provable no-op additions, and `top_p` built on it, on
/// large rows of every realistic shape, sharpened and flattened (so that the mass is reached
/// within the first 32, within 256, or not at all).
#[test]
fn top_p_and_its_softmax_sum_on_large_rows() {
    let mut fast = 0;
    for (i, v) in [1025usize, 4096, 32_000, 128_256].into_iter().enumerate() {
        for kind in [RowKind::Peaked, RowKind::Gaussian, RowKind::ShiftedDown, RowKind::ShiftedUp, RowKind::NegInf] {
            for scale in [0.3f32, 1.0, 3.0] {
                let row: Vec<f32> = generate::row(kind, v, i as u64 + 1).into_iter().map(|x| x * scale).collect();
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut plain = 0.0f32;
                for &x in &row {
                    plain += (x - max).exp();
                }
                let mut bm = Vec::new();
                tokensieve::arch::summarize(&row, &mut bm);
                assert_eq!(
                    tokensieve::arch::exp_sum_sequential(0.0, &row, max, &bm).to_bits(),
                    plain.to_bits(),
                    "{kind:?} V={v}"
                );
                for p in [0.3f32, 0.9, 0.95, 0.999] {
                    let spec = format!("top_p({p},1)");
                    let mut chain =
                        Chain::from_spec_for_apply(&spec, &BuildContext::new(v, RngConfig::philox(1))).unwrap();
                    let mut stages = chain.stages().to_vec();
                    let want = array_path(&mut stages, &row).unwrap();
                    let got = chain.apply(&row).unwrap().clone();
                    fast += matches!(chain.last_path(), Path::Fast(_)) as usize;
                    same(&got, &want).unwrap_or_else(|e| panic!("{spec} {kind:?} x{scale} V={v}: {e}"));
                }
            }
        }
    }
    eprintln!("top_p on large rows: {fast} of 240 took the fast path");
    assert!(fast >= 100, "only {fast} of 240");
}

/// `top_k(k)` with more survivors than the row has blocks of 64 (so the block maxima cannot
/// bound the k-th largest; the row's values are counted instead), with and without penalties,
/// on rows with ties and masked entries, up to `k = V`: the candidates are the array path's,
/// bit for bit, under both conventions.
#[test]
fn top_k_past_the_block_count() {
    use tokensieve::Convention;
    let mut fast = 0;
    let mut total = 0;
    for (v, seed) in [(300usize, 1u64), (2_000, 2), (32_000, 3)] {
        for kind in [RowKind::Peaked, RowKind::Ties, RowKind::NegInf, RowKind::Gaussian] {
            let row = generate::row(kind, v, seed);
            for k in [v / 64 + 1, v / 8, v / 2, v - 1, v] {
                for prefix in ["", "penalties(64,1.3,0.5,0.5);"] {
                    for convention in [Convention::LlamaCpp, Convention::Transformers] {
                        let spec = match convention {
                            Convention::LlamaCpp => format!("{prefix}top_k({k});greedy"),
                            Convention::Transformers => format!("top_k({k});greedy"),
                        };
                        let ctx = BuildContext::new(v, RngConfig::philox(seed)).with_convention(convention);
                        let mut chain = Chain::from_spec_for_apply(&spec, &ctx).unwrap();
                        for t in [3u32, 3, 17, (v - 1) as u32] {
                            chain.accept(t);
                        }
                        let mut stages = chain.stages().to_vec();
                        let want = array_path(&mut stages, &row).unwrap();
                        let got = chain.apply(&row).unwrap().clone();
                        same(&got, &want).unwrap_or_else(|e| panic!("{spec} {kind:?} V={v}: {e}"));
                        // Sampling takes the row path (transformers) or the same top_k.
                        let mut sampler = Chain::from_spec(&spec, &ctx).unwrap();
                        for t in [3u32, 3, 17, (v - 1) as u32] {
                            sampler.accept(t);
                        }
                        let token = sampler.sample(&row).unwrap();
                        assert_eq!(Some(token), want.selected_token(), "{spec} {kind:?} V={v}");
                        total += 1;
                        fast += matches!(sampler.last_path(), Path::Fast(_)) as usize;
                    }
                }
            }
        }
    }
    eprintln!("top_k past the block count: {fast} of {total} samples took a fast path");
    assert!(fast * 2 >= total, "only {fast} of {total}");
}

/// `top_p;dist` when sampling (`top_p_dist` in `convention::llama_cpp::dense`): the token is
/// certain from bounds on llama.cpp's f32 softmax sum when every cut they allow draws the same
/// entry; otherwise the exact sum runs, and where the cut lies beyond the first 256 entries
/// the draw is made over the sorted values. On large rows of every realistic shape, sharpened and
/// flattened, with masses that cut within the first 32, within 256 and beyond, the tokens are
/// the array path's over many steps, and the bounds decide most steps on peaked rows.
#[test]
fn top_p_dist_on_large_rows() {
    let (mut steps, mut certain, mut sorted) = (0, 0, 0);
    let (mut bf16_steps, mut bf16_array) = (0, 0);
    let (mut peaked_steps, mut peaked_certain) = (0, 0);
    for (i, v) in [1025usize, 4096, 32_000, 128_256].into_iter().enumerate() {
        for kind in
            [RowKind::Peaked, RowKind::Gaussian, RowKind::ShiftedDown, RowKind::NegInf, RowKind::Flat, RowKind::Bf16]
        {
            for scale in [0.3f32, 1.0, 3.0] {
                // `Bf16` here: a language-model-like row as an engine hands it over in bfloat16
                // (exact ties everywhere below the top few).
                let row: Vec<f32> = match kind {
                    RowKind::Bf16 => generate::row(RowKind::Peaked, v, i as u64 + 7)
                        .into_iter()
                        .map(|x| half::bf16::from_f32(x * scale).to_f32())
                        .collect(),
                    _ => generate::row(kind, v, i as u64 + 7).into_iter().map(|x| x * scale).collect(),
                };
                for spec in
                    ["top_p(0.95);dist", "top_p(0.5,3);dist", "top_p(0.999);dist", "top_p(0.9);temperature(1);dist"]
                {
                    let ctx = BuildContext::new(v, RngConfig::philox(i as u64));
                    let mut chain = Chain::from_spec(spec, &ctx).unwrap();
                    let mut stages = chain.stages().to_vec();
                    for step in 0..12 {
                        let want = array_path(&mut stages, &row).unwrap().selected_token().unwrap();
                        let got = chain.sample(&row).unwrap();
                        assert_eq!(got, want, "{spec} {kind:?} x{scale} V={v} step {step}");
                        assert_eq!(chain.candidates().selected_token(), Some(got));
                        let fast = (chain.last_path() == Path::Fast("top-p;dist")) as usize;
                        steps += 1;
                        certain += fast;
                        sorted += (chain.last_path() == Path::Fast("top-p;dist (sorted)")) as usize;
                        if kind == RowKind::Bf16 && scale >= 1.0 {
                            bf16_steps += 1;
                            bf16_array += (chain.last_path() == Path::Fallback("top-p")) as usize;
                        }
                        // Language-model-like rows whose mass lies within the top 256.
                        if kind == RowKind::Peaked && scale >= 1.0 && !spec.contains("0.999") {
                            peaked_steps += 1;
                            peaked_certain += fast;
                        }
                        stages.iter_mut().for_each(|s| s.accept(got));
                    }
                }
            }
        }
    }
    eprintln!(
        "top_p;dist on large rows: {certain} of {steps} steps certain from the bounds, \
         {peaked_certain} of {peaked_steps} on peaked rows, {sorted} drawn over the sorted row, \
         {bf16_array} of {bf16_steps} on bf16 rows on the array path"
    );
    assert!(certain * 4 >= steps, "only {certain} of {steps} steps certain");
    assert!(sorted * 10 >= steps, "only {sorted} of {steps} steps drawn over the sorted row");
    // Ties everywhere but at the top: a tie at the chosen value within the first 256 is put
    // in llama.cpp's order by replaying its bucket sort; only draws beyond them take the array.
    assert!(bf16_array * 20 <= bf16_steps, "bf16 rows: {bf16_array} of {bf16_steps} steps took the array path");
    assert!(
        peaked_certain * 10 >= peaked_steps * 8,
        "peaked rows: only {peaked_certain} of {peaked_steps} steps certain"
    );
}

/// `top_p;dist` where two entries hold the value at the cut: which of them llama.cpp keeps, and
/// so which token a draw landing there picks, is libstdc++'s sort order (its bucket sort of
/// the top 256, here a boundary bucket of 2,044 entries below -10 that `std::partial_sort`
/// orders). The fast path replays that order for the draws that land there, and certifies the
/// others without it.
#[test]
fn top_p_dist_replays_a_tie_at_the_chosen_position() {
    for (first, second) in [(5usize, 900usize), (900, 5), (1500, 100), (100, 1500), (1024, 1025)] {
        // Weights 1, 0.61, 0.37, 0.37 and a tail of distinct tiny ones: p = 0.8 cuts after the
        // first of the equal pair.
        let mut row: Vec<f32> = (0..2048).map(|i| -30.0 + i as f32 * 1e-4).collect();
        row[10] = 0.0;
        row[20] = -0.5;
        row[first] = -1.0;
        row[second] = -1.0;
        let ctx = BuildContext::new(row.len(), RngConfig::philox(first as u64));
        let mut chain = Chain::from_spec("top_p(0.8);dist", &ctx).unwrap();
        let mut stages = chain.stages().to_vec();
        let (mut fast, mut replayed) = (0, 0);
        for step in 0..200 {
            let want = array_path(&mut stages, &row).unwrap().selected_token().unwrap();
            let got = chain.sample(&row).unwrap();
            assert_eq!(got, want, "ties at {first} and {second}, step {step}");
            match chain.last_path() {
                Path::Fast("top-p;dist (ties replayed)" | "top-p;dist (exact sum, ties replayed)") => replayed += 1,
                Path::Fast(_) => fast += 1,
                other => panic!("ties at {first} and {second}, step {step}: {other:?}"),
            }
            stages.iter_mut().for_each(|s| s.accept(got));
        }
        assert!(fast >= 100 && replayed >= 10, "ties at {first} and {second}: {fast} fast, {replayed} replayed");
    }
}

/// `top_p;dist` on rows whose top values come in groups of equal ones (bf16 rounding, and a
/// coarse grid), where llama.cpp's bucket sort puts far more than 16 entries in the buckets
/// that hold the draws: `N(0, 3.6²)` at V = 32,000 has about 100 entries in its top bucket
/// (everything from 9.92 up), which `std::sort` orders by introsort, not stably; at 4 times
/// that spread the top bucket alone holds more than 256 and `std::partial_sort`'s heap orders
/// it. So the replayed order is libstdc++'s own, not the ids'. The same tokens as the array
/// path, step by step, with ties replayed often.
#[test]
fn top_p_dist_replays_libstdcxx_order_in_crowded_buckets() {
    let (mut steps, mut replayed) = (0, 0);
    for (v, seed) in [(4_096usize, 11u64), (32_000, 12)] {
        for scale in [1.2f32, 4.0] {
            for grid in [0.0f32, 0.25, 1.0] {
                let row: Vec<f32> = generate::row(RowKind::Gaussian, v, seed)
                    .into_iter()
                    .map(|x| {
                        if grid > 0.0 {
                            (x * scale / grid).round() * grid
                        } else {
                            half::bf16::from_f32(x * scale).to_f32()
                        }
                    })
                    .collect();
                let mut here = 0;
                for spec in ["top_p(0.95);dist", "top_p(0.6,2);temperature(0.7);dist"] {
                    let ctx = BuildContext::new(v, RngConfig::philox(seed));
                    let mut chain = Chain::from_spec(spec, &ctx).unwrap();
                    let mut stages = chain.stages().to_vec();
                    for step in 0..40 {
                        let want = array_path(&mut stages, &row).unwrap().selected_token().unwrap();
                        let got = chain.sample(&row).unwrap();
                        assert_eq!(got, want, "{spec} x{scale} grid {grid} V={v} step {step}");
                        assert_eq!(chain.candidates().selected_token(), Some(got));
                        steps += 1;
                        here += matches!(chain.last_path(), Path::Fast(p) if p.ends_with("ties replayed)")) as usize;
                        stages.iter_mut().for_each(|s| s.accept(got));
                    }
                }
                eprintln!("x{scale} grid {grid} V={v}: {here}");
                replayed += here;
            }
        }
    }
    eprintln!("top_p;dist on tied rows: {replayed} of {steps} steps replayed llama.cpp's order");
    assert!(replayed * 4 >= steps, "only {replayed} of {steps} steps landed on a tie");
}

/// A transformers-convention chain the row path (`convention::transformers::row`) may take:
/// elementwise stages, then `top_k`, `min_p` or `greedy`, then stages that run on its sparse
/// view. Parameters include the edges: `k` of 1 and near `V`, `min_p` of 0 and 1,
/// `min_tokens_to_keep` above 1 (torch's tie-dependent `topk` restoration), temperatures that
/// make ties (huge divisors) and overflow (tiny ones on huge logits).
fn hf_chain() -> impl Strategy<Value = String> {
    let temperature = prop_oneof![
        Just("temperature(0.8);"),
        Just("temperature(0.7);"),
        Just("temperature(1e6);"),
        Just("temperature(1e-30);"),
        Just("temperature(1.3);temperature(0.6);"),
    ];
    let prefix = prop_oneof![
        2 => Just(String::new()),
        3 => temperature.clone().prop_map(String::from),
        2 => (prop_oneof![Just(1.1f32), Just(0.7), Just(1.5)], temperature)
            .prop_map(|(p, t)| format!("repetition_penalty({p});{t}")),
        1 => Just("temperature(0.9);repetition_penalty(1.2);".to_string()),
        1 => Just("repetition_penalty(1.3);".to_string()),
        1 => Just("repetition_penalty(1.3);repetition_penalty(0.8);temperature(0.8);".to_string()),
        1 => Just("repetition_penalty(1.2);temperature(0.9);repetition_penalty(1.1);".to_string()),
    ];
    let reduce = prop_oneof![
        3 => prop_oneof![Just(1i32), Just(2), Just(40), Just(50), Just(129), Just(1000)].prop_map(|k| format!("top_k({k})")),
        1 => (1i32..20, 2i32..60).prop_map(|(k, mk)| format!("top_k({k},{mk})")),
        2 => (prop_oneof![Just(0.05f32), Just(0.0), Just(1.0), 0.0001f32..0.9], prop_oneof![3 => Just(1i32), 1 => 2i32..5])
            .prop_map(|(p, mk)| format!("min_p({p},{mk})")),
        1 => Just("greedy".to_string()),
        2 => Just("dist".to_string()),
        2 => (prop_oneof![Just(0.95f32), Just(0.5), Just(0.999), 0.01f32..0.99], prop_oneof![3 => Just(1i32), 1 => 2i32..300])
            .prop_map(|(p, mk)| format!("top_p({p},{mk})")),
        2 => (prop_oneof![Just(0.0003f64), Just(0.02), Just(0.9), 1e-9f64..0.5], prop_oneof![3 => Just(1i32), 1 => 2i32..60])
            .prop_map(|(e, mk)| format!("epsilon({e},{mk})")),
    ];
    let tail = prop_oneof![
        Just(";dist"),
        Just(";greedy"),
        Just(";top_p(0.95);min_p(0.05);dist"),
        Just(";top_p(0.5,3);dist"),
        Just(";min_p(0.3,4);top_p(0.9,2);dist"),
        Just(";temperature(0.7);min_p(0.1,2);dist"),
        Just(";top_k(5);dist"),
        Just(";typical(0.9);dist"),
        Just(";typical(0.5,3);top_p(0.9);dist"),
        Just(";epsilon(0.0003);dist"),
        Just(";min_p(0.05);epsilon(0.01,3);dist"),
        Just(";eta(0.0003);dist"),
        Just(";eta(0.05,60);dist"),
    ];
    (prefix, reduce, tail)
        .prop_map(|(p, r, t)| if r == "greedy" || r == "dist" { format!("{p}{r}") } else { format!("{p}{r}{t}") })
}

/// Transformers convention, `sample`: the row path's tokens are the array path's (the dense
/// row through every stage), over several steps with the penalties' history growing.
#[test]
fn transformers_sample_matches_the_array_path() {
    let paths = Paths::default();
    let rng = prop_oneof![any::<u32>().prop_map(RngConfig::mt19937), any::<u64>().prop_map(RngConfig::philox)];
    let huge = (any::<u64>(), 2000usize..20_000).prop_map(|(seed, v)| {
        // Logits near f32::MAX: a tiny temperature overflows them to +inf.
        generate::row(RowKind::Gaussian, v, seed).into_iter().map(|x| x * 1e37).collect::<Vec<f32>>()
    });
    let rows = prop_oneof![6 => row_strategy(), 1 => huge];
    check("hf_fast_sample", CASES, (rows, hf_chain(), history(), rng), |(row, spec, history, rng)| {
        let ctx = BuildContext::new(row.len(), rng).with_convention(tokensieve::Convention::Transformers);
        sample_steps(&ctx, &history, &row, &spec, &paths)
    });
    paths.report("transformers sample", 0.4);
}

/// Transformers convention, `repetition_penalty` over a history that holds the row's top
/// tokens (a long generation has sampled them): before the temperatures (generate()'s order)
/// the penalised logits are read off the row in place by `top_k`, `min_p` and `greedy`, and a
/// penalty strong enough pushes top tokens below the k-th value (or, below 1, lifts them).
/// The history is short, or long as a prompt makes it (thousands of tokens, most far below
/// the top). The same tokens as the array path over many steps, with the fast path taken.
/// The paths a chain took over a run of steps.
#[derive(Debug, Default)]
struct Tally {
    fast: usize,
    fell_back: usize,
    array: usize,
    steps: usize,
}

impl Tally {
    /// Counts one step that took `path`.
    fn note(&mut self, path: Path) {
        match path {
            Path::Fast(_) => self.fast += 1,
            Path::Fallback(_) => self.fell_back += 1,
            Path::Array => self.array += 1,
        }
        self.steps += 1;
    }
}

/// `chain` and `stages` (a copy of its stages for the array path) accept `history`, then
/// `chain` samples `row` 40 times, each token checked against the array path (and accepted by
/// both); the paths it took are added to `tally`.
fn run_against_array_path(
    chain: &mut Chain,
    stages: &mut [Stage],
    row: &[f32],
    history: impl IntoIterator<Item = u32>,
    label: &str,
    tally: &mut Tally,
) {
    for t in history {
        chain.accept(t);
        stages.iter_mut().for_each(|s| s.accept(t));
    }
    for step in 0..40 {
        let want = array_path(stages, row).unwrap().selected_token().unwrap();
        let got = chain.sample(row).unwrap();
        assert_eq!(got, want, "{label}, step {step}");
        tally.note(chain.last_path());
        stages.iter_mut().for_each(|s| s.accept(got));
    }
}

#[test]
fn transformers_penalties_on_the_top_tokens() {
    let mut tally = Tally::default();
    for (case, &(kind, v)) in
        [(RowKind::Peaked, 32_000), (RowKind::Gaussian, 5_000), (RowKind::Peaked, 129_000), (RowKind::ShiftedUp, 9_000)]
            .iter()
            .enumerate()
    {
        let row = generate::row(kind, v, 7 + case as u64);
        let mut order: Vec<u32> = (0..v as u32).collect();
        order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]));
        for (j, (spec, prompt)) in [
            "repetition_penalty(1.1);temperature(0.8);top_k(40);top_p(0.95);min_p(0.05);dist",
            "repetition_penalty(3.0);temperature(0.8);top_k(40);dist",
            "repetition_penalty(0.7);temperature(0.8);top_k(10);dist",
            "repetition_penalty(1.5);top_k(5);dist",
            "repetition_penalty(2.0);repetition_penalty(1.2);temperature(0.7);top_k(40);dist",
            "repetition_penalty(1.3);temperature(0.8);min_p(0.05);dist",
            "repetition_penalty(20.0);temperature(0.8);greedy",
            "temperature(0.8);repetition_penalty(1.4);top_k(40);dist",
        ]
        .iter()
        .flat_map(|spec| [(spec, 0usize), (spec, 3000)])
        .enumerate()
        {
            let ctx =
                BuildContext::new(v, RngConfig::philox(j as u64)).with_convention(tokensieve::Convention::Transformers);
            let mut chain = Chain::from_spec(spec, &ctx).unwrap();
            let mut stages = chain.stages().to_vec();
            // The top 60 tokens, every other one, and some spread over the row (a prompt's
            // worth of them, ids past the row's end too, for the long history).
            let spread = (0..40 + prompt).map(|i| (i * 7919 % (v + v / 8)) as u32);
            let history = order.iter().take(60).step_by(2).copied().chain(spread);
            let label = format!("{spec} after a prompt of {prompt} on {kind:?} {v}");
            run_against_array_path(&mut chain, &mut stages, &row, history, &label, &mut tally);
        }
    }
    let Tally { fast, steps, .. } = tally;
    assert!(fast * 10 >= steps * 9, "the fast path ran in only {fast} of {steps} steps");
}

/// llama.cpp's `penalties` before `top_k` over a long window (thousands of tokens, many seen
/// more than once, some past the row's end), on the row's top tokens: the fast path reads the
/// edits of a lowering `penalties` off the gathered entries, and builds the overlay for the
/// others (`repeat < 1`, a negative frequency penalty, logit bias beside it). Each chain is
/// checked against the array path over 40 steps, after a short and after a long history.
#[test]
fn llama_cpp_penalties_over_long_windows() {
    let mut tally = Tally::default();
    for (case, &(kind, v)) in
        [(RowKind::Peaked, 32_000), (RowKind::Gaussian, 5_000), (RowKind::Peaked, 129_000), (RowKind::ShiftedUp, 9_000)]
            .iter()
            .enumerate()
    {
        let row = generate::row(kind, v, 11 + case as u64);
        let mut order: Vec<u32> = (0..v as u32).collect();
        order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]));
        for (j, (spec, prompt)) in [
            "penalties(8192,1.1,0.1,0.1);top_k(40);top_p(0.95,1);min_p(0.05,1);temperature(0.8);dist",
            "penalties(8192,3.0,1.0,0.5);top_k(40);temperature(0.8);dist",
            "penalties(8192,1.5,0,0);top_k(5);dist",
            "penalties(8192,1,0,2.5);top_k(40);min_p(0.05,1);dist",
            "penalties(100,1.2,0.3,0);top_k(20);top_p(0.9,1);dist",
            "penalties(8192,0.8,0.1,0.1);top_k(40);dist",
            "penalties(8192,1.1,-0.5,0);top_k(40);dist",
            "penalties(8192,1,0,-4);top_k(10);dist",
            "penalties(8192,1,-3,0);top_k(40);dist",
            "penalties(8192,1.1,0.1,0.1);logit_bias(5:2.5 17:-1);top_k(40);dist",
        ]
        .iter()
        .flat_map(|spec| [(spec, 0usize), (spec, 3000)])
        .enumerate()
        {
            let ctx = BuildContext::new(v, RngConfig::philox(j as u64));
            let mut chain = Chain::from_spec(spec, &ctx).unwrap();
            let mut stages = chain.stages().to_vec();
            // The top 60 tokens, every other one twice, and a prompt's worth spread over the
            // row (ids past its end too), each some number of times.
            let spread = (0..40 + prompt).map(|i| (i * 7919 % (v + v / 8)) as u32);
            let top = order.iter().take(60).step_by(2).flat_map(|&t| [t, t]);
            let history = top.chain(spread.flat_map(|t| std::iter::repeat_n(t, 1 + t as usize % 3)));
            let label = format!("{spec} after a prompt of {prompt} on {kind:?} {v}");
            run_against_array_path(&mut chain, &mut stages, &row, history, &label, &mut tally);
        }
    }
    let Tally { fast, steps, .. } = tally;
    assert!(fast * 10 >= steps * 9, "the fast path ran in only {fast} of {steps} steps");
}

/// Penalties before `top_k` on nearly flat rows (N(0, 0.05²), as the bench's), where every
/// sampled token is one of the top few dozen and a penalty pushes it far down: the fast path
/// lowers the maxima of the blocks holding them ([`lower_block_maxima`] in the convention)
/// and keeps doing so from token to token. Both conventions, checked against the array path
/// at every step, with the default window and a history of the row's top tokens too, and with
/// rows that change from step to step (the lowered maxima must not outlive their row).
#[test]
fn penalties_on_nearly_flat_rows() {
    let mut tally = Tally::default();
    for (case, &v) in [32_000usize, 4_097, 128_256].iter().enumerate() {
        let rows: Vec<Vec<f32>> = (0..3)
            .map(|i| generate::row(RowKind::Gaussian, v, 31 + 3 * case as u64 + i).iter().map(|x| x / 60.0).collect())
            .collect();
        for (j, (spec, convention)) in [
            (
                "penalties(64,1.1,0.1,0.1);top_k(40);top_p(0.95,1);min_p(0.05,1);temperature(0.8);dist",
                tokensieve::Convention::LlamaCpp,
            ),
            ("penalties(64,1.5,0,0);top_k(5);dist", tokensieve::Convention::LlamaCpp),
            ("repetition_penalty(1.3);temperature(0.8);top_k(40);dist", tokensieve::Convention::Transformers),
        ]
        .into_iter()
        .enumerate()
        {
            let ctx = BuildContext::new(v, RngConfig::philox(j as u64)).with_convention(convention);
            let mut chain = Chain::from_spec(spec, &ctx).unwrap();
            let mut stages = chain.stages().to_vec();
            let mut order: Vec<u32> = (0..v as u32).collect();
            order.sort_by(|&a, &b| rows[0][b as usize].total_cmp(&rows[0][a as usize]));
            for t in order.iter().take(30).copied() {
                chain.accept(t);
                stages.iter_mut().for_each(|s| s.accept(t));
            }
            for step in 0..120 {
                // The same row for a while (the sampled tokens pile up at its top), then others.
                let row = &rows[if step < 60 { 0 } else { step % 3 }];
                let want = array_path(&mut stages, row).unwrap().selected_token().unwrap();
                let got = chain.sample(row).unwrap();
                assert_eq!(got, want, "{spec} on V = {v}, step {step}");
                tally.note(chain.last_path());
                stages.iter_mut().for_each(|s| s.accept(got));
            }
        }
    }
    let Tally { fast, steps, .. } = tally;
    assert!(fast * 10 >= steps * 9, "the fast path ran in only {fast} of {steps} steps");
}

/// Leading `penalties` and `logit_bias` before a stage whose fast path reads the row without
/// an overlay (`top_p`, `temperature`, `dist`), or a temperature before `top_p`: the edits
/// (and the temperature) are written into a copy of the row, and the fast path runs on it, its
/// fallbacks running only the stages after them. Each
/// chain against the array path over 40 steps (each sampled token accepted), and the fast
/// path counted. A bias that overflows a logit to `+inf`, and a NaN in the row, take the array
/// path and the row's error as before.
#[test]
fn edits_before_top_p_and_dist_read_a_patched_row() {
    let mut tally = Tally::default();
    for (case, &(kind, v)) in
        [(RowKind::Peaked, 32_000), (RowKind::Gaussian, 5_000), (RowKind::Peaked, 129_000), (RowKind::ShiftedUp, 9_000)]
            .iter()
            .enumerate()
    {
        let row = generate::row(kind, v, 21 + case as u64);
        let mut order: Vec<u32> = (0..v as u32).collect();
        order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]));
        let (a, b, c) = (order[0], order[1], order[7]);
        for (j, spec) in [
            "penalties(64,1.1,0.1,0.1);top_p(0.95,1);dist".to_string(),
            "penalties(64,1.1,0.1,0.1);top_p(0.95,1);min_p(0.05,1);temperature(0.8);dist".to_string(),
            "penalties(256,1.3,0.5,0.5);temperature(0.8);dist".to_string(),
            format!("logit_bias({a}:-inf {b}:-2.5 {c}:3 40:-1);top_p(0.9,1);dist"),
            format!("logit_bias({a}:-inf);penalties(64,0.8,0,0);temperature(1.2);dist"),
            "penalties(64,1.1,0,0);dist".to_string(),
            // A leading temperature before `top_p` is written into the copy too.
            "temperature(0.8);top_p(0.95,1);dist".to_string(),
            "penalties(64,1.1,0.1,0.1);temperature(1.3);top_p(0.9,1);min_p(0.05,1);dist".to_string(),
            format!("logit_bias({b}:-inf);temperature(0.45);top_p(0.8,1);temperature(1.2);dist"),
            "penalties(64,1.1,0.1,0.1);temperature(0.7);top_k(40);dist".to_string(),
        ]
        .iter()
        .enumerate()
        {
            let ctx = BuildContext::new(v, RngConfig::philox(j as u64));
            let mut chain = Chain::from_spec(spec, &ctx).unwrap();
            let mut stages = chain.stages().to_vec();
            let history = order.iter().take(30).step_by(3).copied();
            let label = format!("{spec} on {kind:?} {v}");
            run_against_array_path(&mut chain, &mut stages, &row, history, &label, &mut tally);
        }
    }
    let Tally { fast, array, steps, .. } = tally;
    // `top_p` not followed by `dist` falls back on some flat rows; no step builds the array
    // from the input row.
    assert!(fast * 10 >= steps * 8, "the fast path ran in only {fast} of {steps} steps");
    assert_eq!(array, 0, "{array} of {steps} steps took the array path");

    // A bias that takes a logit near `f32::MAX` to `+inf`: the array path, as before.
    let mut row = generate::row(RowKind::Peaked, 5_000, 3);
    row[9] = 3e38;
    for spec in ["logit_bias(9:3e38);top_p(0.9,1);dist", "logit_bias(9:3e38);temperature(0.7);dist"] {
        let ctx = BuildContext::new(row.len(), RngConfig::philox(1));
        let mut chain = Chain::from_spec(spec, &ctx).unwrap();
        let mut stages = chain.stages().to_vec();
        let want = array_path(&mut stages, &row).map(|c| c.selected_token());
        let got = chain.sample(&row);
        assert_eq!(got.as_ref().ok().copied(), want.as_ref().ok().copied().flatten(), "{spec}");
        assert_eq!(got.is_err(), want.is_err(), "{spec}");
        assert_eq!(chain.last_path(), Path::Array, "{spec}");
    }
    // A NaN in the row: the row's error, and the chain keeps its state.
    row[4_000] = f32::NAN;
    let ctx = BuildContext::new(row.len(), RngConfig::philox(1));
    let mut chain = Chain::from_spec("penalties(64,1.1,0.1,0.1);top_p(0.9,1);dist", &ctx).unwrap();
    assert!(chain.sample(&row).is_err());
    row[4_000] = 0.0;
    assert!(chain.sample(&row).is_ok());
}

/// transformers' `repetition_penalty` before the temperature of `top_p` or `dist`, and the masking
/// processors (`no_repeat_ngram`, `suppress_tokens`, `min_length`, ...) before anything: their
/// edits are written into a copy of the row, and the fast path runs on it. Rows on a coarse grid (ties
/// everywhere) send some draws to the fallbacks, which must run only the stages after the
/// penalty. Each chain against the array path over 40 steps.
#[test]
fn transformers_penalty_before_top_p_and_dist_reads_a_patched_row() {
    let mut tally = Tally::default();
    for (case, &(kind, v, grid)) in [
        (RowKind::Peaked, 32_000, 0.0f32),
        (RowKind::Gaussian, 5_000, 0.5),
        (RowKind::Peaked, 129_000, 0.0),
        (RowKind::Peaked, 9_000, 0.25),
    ]
    .iter()
    .enumerate()
    {
        let mut row = generate::row(kind, v, 31 + case as u64);
        if grid > 0.0 {
            row.iter_mut().for_each(|x| *x = (*x / grid).round() * grid);
        }
        let mut order: Vec<u32> = (0..v as u32).collect();
        order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]));
        for (j, spec) in [
            "repetition_penalty(1.1);temperature(0.8);top_p(0.9);dist",
            "repetition_penalty(1.3);top_p(0.95);dist",
            "repetition_penalty(1.5);temperature(0.7);dist",
            "repetition_penalty(0.8);temperature(1.2);top_p(0.5);dist",
            "repetition_penalty(1.2);top_p(0.9);min_p(0.05);dist",
            // Masks (by state alone), before and beside the penalty.
            "no_repeat_ngram(2);temperature(0.7);top_k(50);top_p(0.9);dist",
            "suppress_tokens(1 2 3 99999999);repetition_penalty(1.2);temperature(0.7);top_p(0.9);dist",
            "min_new_tokens(20,eos=7 8);begin_suppress_tokens(0 5);no_repeat_ngram(3);temperature(0.9);dist",
            "min_length(400,eos=9);repetition_penalty(1.1);top_k(40);dist",
        ]
        .iter()
        .enumerate()
        {
            let ctx =
                BuildContext::new(v, RngConfig::philox(j as u64)).with_convention(tokensieve::Convention::Transformers);
            let mut chain = Chain::from_spec(spec, &ctx).unwrap();
            let mut stages = chain.stages().to_vec();
            // Some masked ids are in the history too (penalised and masked).
            let masked = [1, 2, 9, 7];
            let prompt = order.iter().take(40).step_by(2).copied().chain((0..300).map(|i| (i * 7919 % v) as u32));
            let label = format!("{spec} on {kind:?} {v} (grid {grid})");
            run_against_array_path(&mut chain, &mut stages, &row, prompt.chain(masked), &label, &mut tally);
        }
    }
    let Tally { fast, fell_back, steps, .. } = tally;
    assert!(fast * 10 >= steps * 7, "the fast path ran in only {fast} of {steps} steps");
    assert!(fell_back > 0, "no draw reached a fallback");

    // A NaN or `+inf` of the row under a mask is still the row's error (the copy would hide
    // it), and the chain samples the next, valid row.
    for bad in [f32::NAN, f32::INFINITY] {
        let mut row = generate::row(RowKind::Peaked, 5_000, 5);
        row[2] = bad;
        let ctx =
            BuildContext::new(row.len(), RngConfig::philox(1)).with_convention(tokensieve::Convention::Transformers);
        let mut chain = Chain::from_spec("suppress_tokens(2);temperature(0.7);top_p(0.9);dist", &ctx).unwrap();
        assert!(chain.sample(&row).is_err(), "{bad} under a mask");
        row[2] = 0.0;
        assert!(chain.sample(&row).is_ok());
    }
}

/// A `repetition_penalty` after a temperature rounds in that order: here the penalised token
/// (`fl32(fl32(b / 0.8) * 1.4)`) ties an untouched one exactly at `top_k(1)`, so both survive
/// and `dist` picks either, where the penalty taken first (`fl32(fl32(b * 1.4) / 0.8)`, one ulp
/// higher) would leave only the penalised one. Each draw on a fresh chain (an accepted token is
/// penalised from then on).
#[test]
fn transformers_penalty_after_temperature_keeps_its_rounding() {
    let (untouched, penalised) = (100usize, 3000usize);
    let mut row = vec![-20.0f32; 4096];
    row[untouched] = -3.666_018_2;
    row[penalised] = -2.618_584_4;
    let spec = "temperature(0.8);repetition_penalty(1.4);top_k(1);dist";
    let mut picked = [0usize; 2];
    for seed in 0..64 {
        let ctx =
            BuildContext::new(row.len(), RngConfig::philox(seed)).with_convention(tokensieve::Convention::Transformers);
        let mut chain = Chain::from_spec(spec, &ctx).unwrap();
        chain.accept(penalised as u32);
        let mut stages = chain.stages().to_vec();
        let want = array_path(&mut stages, &row).unwrap().selected_token().unwrap();
        let got = chain.sample(&row).unwrap();
        assert_eq!(got, want, "seed {seed}");
        assert!(matches!(chain.last_path(), Path::Fast(_)), "seed {seed}: {:?}", chain.last_path());
        picked[usize::from(got as usize == penalised)] += 1;
    }
    assert!(picked[0] > 0 && picked[1] > 0, "the tie did not hold: {picked:?}");
}

/// Raw logprobs beside a sampled token: the row path's top-n selection over block maxima
/// (computed on demand after `greedy`'s maximum-only scan) gives the scanning
/// implementation's list, bit for bit.
#[test]
fn raw_logprobs_match_the_scanning_implementation() {
    use tokensieve::{Convention, LogprobsMode};
    let chain = prop_oneof![
        Just(("greedy", Convention::LlamaCpp)),
        Just(("top_k(40);top_p(0.95,1);min_p(0.05,1);temperature(0.8);dist", Convention::LlamaCpp)),
        Just(("temperature(0.8);dist", Convention::LlamaCpp)),
        // The row is patched with the penalties' edits; raw logprobs read the input row.
        Just(("penalties(64,1.1,0.1,0.1);top_p(0.95,1);dist", Convention::LlamaCpp)),
        Just(("greedy", Convention::Transformers)),
        Just(("temperature(0.8);top_k(40);top_p(0.95);dist", Convention::Transformers)),
    ];
    check("fast_raw_logprobs", CASES, (row_strategy(), chain, 0usize..30), |(row, (spec, convention), n)| {
        let ctx = BuildContext::new(row.len(), RngConfig::philox(9)).with_convention(convention);
        let mut chain = Chain::from_spec(spec, &ctx).unwrap();
        for _ in 0..2 {
            let sampled = match chain.sample_with_logprobs(&row, LogprobsMode::Raw, n) {
                Ok(s) => s,
                Err(_) => return Ok(()), // an all -inf row: no token to report
            };
            let mut want = Vec::new();
            let logprob = tokensieve::logprobs::raw(row.as_slice().into(), sampled.token, n, &mut want);
            prop_assert_eq!(sampled.logprob.to_bits(), logprob.to_bits(), "{}", spec);
            let bits =
                |v: &[tokensieve::TokenLogprob]| v.iter().map(|t| (t.token, t.logprob.to_bits())).collect::<Vec<_>>();
            prop_assert_eq!(bits(&sampled.top_logprobs), bits(&want), "{}", spec);
        }
        Ok(())
    });
}

/// The same on f16 and bf16 rows, each `sample_with_logprobs` right after an `apply` of
/// another row of the same dtype: `greedy` summarizes a half-precision row without keeping it
/// widened, so the logprobs must not read the widened row the `apply` left behind.
#[test]
fn raw_logprobs_on_half_precision_rows_after_another_row() {
    use half::{bf16, f16};
    use tokensieve::{Convention, Logits, LogprobsMode};
    for (v, seed) in [(32_000usize, 1u64), (4_099, 3), (100, 5)] {
        let rows = [generate::row(RowKind::Peaked, v, seed), generate::row(RowKind::Gaussian, v, seed + 1)];
        let h: Vec<Vec<f16>> = rows.iter().map(|r| r.iter().map(|&x| f16::from_f32(x)).collect()).collect();
        let b: Vec<Vec<bf16>> = rows.iter().map(|r| r.iter().map(|&x| bf16::from_f32(x)).collect()).collect();
        for (spec, convention) in [
            ("greedy", Convention::LlamaCpp),
            ("greedy", Convention::Transformers),
            ("top_k(40);top_p(0.95,1);min_p(0.05,1);temperature(0.8);dist", Convention::LlamaCpp),
        ] {
            for which in 0..2 {
                let (row, other) = match which {
                    0 => (Logits::F16(&h[0]), Logits::F16(&h[1])),
                    _ => (Logits::Bf16(&b[1]), Logits::Bf16(&b[0])),
                };
                let ctx = BuildContext::new(v, RngConfig::philox(9)).with_convention(convention);
                let mut chain = Chain::from_spec(spec, &ctx).unwrap();
                for n in [0usize, 1, 20] {
                    chain.apply(other).unwrap();
                    let sampled = chain.sample_with_logprobs(row, LogprobsMode::Raw, n).unwrap();
                    let mut want = Vec::new();
                    let logprob = tokensieve::logprobs::raw(row, sampled.token, n, &mut want);
                    assert_eq!(sampled.logprob.to_bits(), logprob.to_bits(), "{spec} V={v} {which} n={n}");
                    let bits = |v: &[tokensieve::TokenLogprob]| {
                        v.iter().map(|t| (t.token, t.logprob.to_bits())).collect::<Vec<_>>()
                    };
                    assert_eq!(bits(&sampled.top_logprobs), bits(&want), "{spec} V={v} {which} n={n}");
                }
            }
        }
    }
}

/// f16 and bf16 rows (what candle and mistral.rs hand over): widened on the way in, and full
/// of exact ties, which `top_k(k <= 128)` resolves by replaying libstdc++'s heap select over
/// the blocks that reach the heap's minimum. The same candidates as the array path on the
/// widened row, in the same order, and the fast path (not the array) in almost every case.
#[test]
fn half_precision_rows_with_ties_take_the_fast_top_k() {
    use half::{bf16, f16};
    use tokensieve::Logits;
    let mut fast = 0;
    let mut total = 0;
    for (v, seed) in [(32_000usize, 1u64), (128_256, 2), (4_099, 3)] {
        for kind in [RowKind::Peaked, RowKind::Gaussian, RowKind::ShiftedUp] {
            let row = generate::row(kind, v, seed);
            let h: Vec<f16> = row.iter().map(|&x| f16::from_f32(x)).collect();
            let b: Vec<bf16> = row.iter().map(|&x| bf16::from_f32(x)).collect();
            for prefix in ["", "penalties(64,1.1,0.1,0.1);", "logit_bias(7:30 9:-inf 20:2.5);"] {
                for k in [1, 2, 40, 128] {
                    let spec = format!("{prefix}top_k({k});top_p(0.95,1);min_p(0.05,1);temperature(0.8);dist");
                    for (name, logits, widened) in [
                        ("f16", Logits::F16(&h), h.iter().map(|x| x.to_f32()).collect::<Vec<f32>>()),
                        ("bf16", Logits::Bf16(&b), b.iter().map(|x| x.to_f32()).collect::<Vec<f32>>()),
                    ] {
                        let ctx = BuildContext::new(v, RngConfig::mt19937(seed as u32));
                        let mut chain = Chain::from_spec_for_apply(&spec, &ctx).unwrap();
                        for t in [5u32, 7, 7, 100, 2000] {
                            chain.accept(t);
                        }
                        let mut stages = chain.stages().to_vec();
                        let want = array_path(&mut stages, &widened).unwrap();
                        let got = chain.apply(logits).unwrap().clone();
                        total += 1;
                        fast += matches!(chain.last_path(), Path::Fast(_)) as usize;
                        same(&got, &want).unwrap_or_else(|e| panic!("{spec} {name} {kind:?} V={v}: {e}"));
                    }
                }
            }
        }
    }
    assert!(fast * 10 >= total * 9, "the fast path ran in only {fast} of {total} cases");
}

/// `sample` with `top_k`, value-only stages and `dist` on half-precision rows full of ties:
/// the chain runs on the ranking with equal values by id, and the token stands only where no
/// other entry holds its value; otherwise libstdc++'s order is replayed and the chain runs
/// again with the same draw. Against the array path on the widened row, 12 steps each (each
/// token accepted on both sides, so penalties' history grows): the same tokens, the same
/// candidates left after a replay, and both outcomes seen (the draw kept, and the tie replayed). Rows: the
/// generator's, and a coarse grid on which the top values themselves are tied.
#[test]
fn half_precision_ties_at_the_draw_replay_the_heap_with_the_same_draw() {
    use half::{bf16, f16};
    use tokensieve::Logits;
    let (mut kept, mut replayed, mut steps) = (0, 0, 0);
    for (v, seed) in [(32_000usize, 1u64), (4_099, 3)] {
        for kind in [RowKind::Peaked, RowKind::Gaussian, RowKind::ShiftedUp] {
            let row = generate::row(kind, v, seed);
            // A coarse grid: the largest values come in groups of equal ones.
            let grid: Vec<f32> = row.iter().map(|x| (x * 2.0).round() / 2.0).collect();
            for (rows, base) in [("row", &row), ("grid", &grid)] {
                let h: Vec<f16> = base.iter().map(|&x| f16::from_f32(x)).collect();
                let b: Vec<bf16> = base.iter().map(|&x| bf16::from_f32(x)).collect();
                for prefix in ["", "penalties(64,1.1,0.1,0.1);", "logit_bias(7:30 9:-inf 20:2.5);"] {
                    for (k, tail) in [
                        (40, "top_p(0.95,1);min_p(0.05,1);temperature(0.8);dist"),
                        (2, "temperature(0.8);dist"),
                        (128, "min_p(0.2,1);dist"),
                        (5, "temperature(0);dist"),
                        (20, "dist"),
                    ] {
                        let spec = format!("{prefix}top_k({k});{tail}");
                        for (name, logits, widened) in [
                            ("f16", Logits::F16(&h), h.iter().map(|x| x.to_f32()).collect::<Vec<f32>>()),
                            ("bf16", Logits::Bf16(&b), b.iter().map(|x| x.to_f32()).collect::<Vec<f32>>()),
                        ] {
                            let ctx = BuildContext::new(v, RngConfig::mt19937(seed as u32 + k as u32));
                            let mut chain = Chain::from_spec(&spec, &ctx).unwrap();
                            let mut stages = chain.stages().to_vec();
                            for step in 0..12 {
                                let want = array_path(&mut stages, &widened).unwrap();
                                let token = chain.sample(logits).unwrap();
                                let at = format!("{spec} {name} {rows} {kind:?} V={v} step {step}");
                                assert_eq!(Some(token), want.selected_token(), "{at}");
                                assert_eq!(chain.candidates().selected_token(), Some(token), "{at}");
                                match chain.last_path() {
                                    Path::Fast("top-k;dist") => kept += 1,
                                    // After the replay, llama.cpp's candidates exactly.
                                    Path::Fast("top-k;dist (ties replayed)") => {
                                        same(chain.candidates(), &want).unwrap_or_else(|e| panic!("{at}: {e}"));
                                        replayed += 1;
                                    }
                                    _ => {}
                                }
                                stages.iter_mut().for_each(|s| s.accept(token));
                                steps += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(kept * 2 >= steps, "the draw was kept in only {kept} of {steps} steps");
    assert!(replayed >= 20, "a tie at the draw was replayed in only {replayed} of {steps} steps");
}

/// After `sample` selected straight from the row with `[temperature;] dist`, the lone
/// candidate's `p` is its probability against the sums that located the draw: within the
/// locating try's mass of the exact softmax (at most 2^-4 of the sum, so about 6.7%
/// relative), under both conventions.
#[test]
fn a_direct_dist_leaves_the_selected_probability_within_its_bound() {
    use tokensieve::Convention;
    let mut checked = 0;
    for (v, seed) in [(4_099usize, 1u64), (32_000, 2), (128_256, 3)] {
        for kind in [RowKind::Peaked, RowKind::Gaussian] {
            let row = generate::row(kind, v, seed);
            let t = 0.8f64;
            let max = row.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64 / t));
            let sum: f64 = row.iter().map(|&x| (x as f64 / t - max).exp()).sum();
            for convention in [Convention::LlamaCpp, Convention::Transformers] {
                let ctx = BuildContext::new(v, RngConfig::philox(seed)).with_convention(convention);
                let mut chain = Chain::from_spec("temperature(0.8);dist", &ctx).unwrap();
                for _ in 0..20 {
                    let token = chain.sample(&row).unwrap();
                    if !matches!(chain.last_path(), Path::Fast(_)) {
                        continue;
                    }
                    let c = chain.candidates().as_slice();
                    assert_eq!(c.len(), 1);
                    let exact = (row[token as usize] as f64 / t - max).exp() / sum;
                    let got = c[0].p as f64;
                    assert!(
                        (got - exact).abs() <= 0.07 * exact,
                        "{convention:?} V = {v} {kind:?}: token {token} p {got:e}, exact {exact:e}"
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 100, "only {checked} direct draws");
}

/// llama.cpp's `mirostat` and `mirostat_v2` (alone, after a temperature, after penalties) on
/// the row's top entries instead of the fully sorted array: over many steps `mu` drifts (on a
/// peaked row it climbs until the whole row is kept), so the kept prefix runs from one entry
/// to all of them. Every step, `sample` gives the array path's token, its candidates the same
/// values and probability bits with the same one selected (their order among equal values is
/// the sort's only where they are observed; where the whole row is kept and the draw is made
/// from its top, the selected candidate alone), and `apply` the array path's candidates
/// exactly, on rows with and without ties, with `-inf` entries and with huge magnitudes (where
/// the picked value is tied, or `apply` meets a tie, the stage finishes on the array with the
/// same draw). The fast path is taken on most steps.
#[test]
fn mirostat_reads_the_top_of_the_row() {
    let mut tally = Tally::default();
    let mut drawn_in_top = 0;
    let specs = [
        "mirostat_v2(5,0.1)",
        "mirostat_v2(1,0.5)",
        "temperature(0.8);mirostat_v2(5,0.1)",
        "penalties(64,1.1,0.1,0.1);temperature(0.7);mirostat_v2(3,0.2)",
        "mirostat(5,0.1,100)",
        "temperature(0.8);mirostat(3,0.3,100)",
        "mirostat(8,0.2,10)",
        // `mu` high enough from the start that the whole row is kept.
        "mirostat_v2(40,0.1)",
        "mirostat(25,0.1,100)",
    ];
    let rows = [
        (RowKind::Peaked, 20_000),
        (RowKind::Gaussian, 3_000),
        (RowKind::Ties, 4_000),
        (RowKind::Bf16, 9_000),
        (RowKind::NegInf, 5_000),
        (RowKind::Huge, 2_000),
    ];
    for (case, &(kind, v)) in rows.iter().enumerate() {
        let row = generate::row(kind, v, 40 + case as u64);
        for (j, spec) in specs.iter().enumerate() {
            let label = format!("{spec} on {kind:?} {v}");
            let sampled_untied = matches!(kind, RowKind::Peaked | RowKind::Gaussian);
            drawn_in_top += mirostat_steps(spec, &row, j as u32 + 7, &label, sampled_untied.then_some(&mut tally));
        }
    }
    eprintln!("mirostat sampling: {tally:?}, {drawn_in_top} drawn in the top of a kept row");
    assert!(tally.fast * 10 >= tally.steps * 9, "the fast path was rarely taken: {tally:?}");
    // The top's softmax sum is certified against the rest by the vectorised `expf` (without
    // it, only the whole sorted row gives the sum, and the draw is made there).
    if tokensieve::arch::vectorised_exp() {
        assert!(drawn_in_top > 200, "the whole row was seldom kept and drawn from its top: {drawn_in_top}");
    }
}

/// 70 steps of `spec` on `row` (mt19937 seeded with `seed`), each checked against the array
/// path as [`mirostat_reads_the_top_of_the_row`] says; the paths sampling took are noted in
/// `tally` if given. Returns how many draws were made from the top of a kept row.
fn mirostat_steps(spec: &str, row: &[f32], seed: u32, label: &str, mut tally: Option<&mut Tally>) -> usize {
    let v = row.len();
    let ctx = BuildContext::new(v, RngConfig::mt19937(seed));
    let mut chain = Chain::from_spec(spec, &ctx).unwrap();
    let mut stages = chain.stages().to_vec();
    let mut applied = Chain::from_spec_for_apply(spec, &ctx).unwrap();
    let mut applied_stages = applied.stages().to_vec();
    let values = |c: &Candidates| {
        let v: Vec<_> = c.as_slice().iter().map(|t| (t.logit.to_bits(), t.p.to_bits())).collect();
        (v, c.selected_index())
    };
    let mut drawn_in_top = 0;
    for step in 0..70 {
        let label = format!("{label}, step {step}");
        let want = array_path(&mut stages, row).unwrap();
        let got = chain.sample(row).unwrap();
        assert_eq!(Some(got), want.selected_token(), "{label}");
        let in_top = matches!(chain.last_path(), Path::Fast(p) if p.ends_with("(drawn in the top)"));
        if in_top {
            // The whole row kept, the draw made from its top: the selected candidate alone, as
            // the array path has it.
            let c = chain.candidates();
            assert_eq!(c.len(), 1, "{label}");
            let (mut one, _) = values(&want);
            one = vec![one[want.selected_index().unwrap()]];
            assert_eq!(values(c), (one, Some(0)), "{label}");
            drawn_in_top += 1;
        } else {
            assert_eq!(values(chain.candidates()), values(&want), "{label}");
        }
        let want_applied = array_path(&mut applied_stages, row).unwrap();
        same(applied.apply(row).unwrap(), &want_applied).unwrap_or_else(|e| panic!("apply, {label}: {e}"));
        if let Some(tally) = tally.as_deref_mut() {
            tally.note(chain.last_path());
        }
        stages.iter_mut().for_each(|s| s.accept(got));
    }
    drawn_in_top
}

/// `temperature(t);top_k(k)` takes the top `k` of the raw row and divides it, and
/// `temperature(t);min_p(p)` the entries above a raw bound, instead of dividing a copy of the
/// row: on language-model-like rows (the peaked generator's, the real row), on rows of
/// neighbouring floats that the temperature merges (ties at `top_k`'s cut or among the kept,
/// where it must decline) and on a flat row (where `min_p` keeps nearly everything and
/// declines), every step's token equals the array path's, `apply`'s candidates too, and the
/// divided paths decide every step on the peaked rows where llama.cpp's fast path would.
#[test]
fn a_leading_temperature_divides_the_top() {
    let mut rows: Vec<(String, Vec<f32>)> = vec![("real".into(), real_row())];
    for (case, v) in [4_000usize, 32_000, 128_256].into_iter().enumerate() {
        rows.push((format!("peaked {v}"), generate::row(RowKind::Peaked, v, 70 + case as u64)));
        let base = generate::row(RowKind::Peaked, v.div_ceil(4), 80 + case as u64);
        let neighbours = (0..v).map(|i| (0..i % 4).fold(base[i / 4], |x, _| x.next_up())).collect();
        rows.push((format!("neighbours {v}"), neighbours));
    }
    rows.push(("flat 32000".into(), generate::row(RowKind::Flat, 32_000, 3)));
    // The maximum 0 and entries that `temperature(0.5)` (an exact division) takes exactly to
    // `min_p(0.05)`'s threshold `ln 0.05`, which keeps them.
    let mut on_threshold = generate::row(RowKind::Peaked, 32_000, 4);
    let top = on_threshold.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    on_threshold.iter_mut().for_each(|x| *x -= top);
    for i in (7..32_000).step_by(997) {
        on_threshold[i] = 0.05f32.ln() * 0.5;
    }
    rows.push(("on threshold 32000".into(), on_threshold));
    let specs = [
        "temperature(0.8);top_k(40);top_p(0.95,1);min_p(0.05,1);dist",
        "temperature(3);top_k(5);dist",
        "temperature(7);top_k(128);min_p(0.1,1);dist",
        "temperature(0.3);top_k(1);dist",
        "temperature(0.8);top_k(129);dist",
        // Ties at the cut, where the draw often lands.
        "temperature(7);top_k(1);dist",
        "temperature(3);top_k(2);dist",
        "temperature(0.8);min_p(0.05,1);dist",
        "temperature(3);min_p(0.5,1);top_k(3);dist",
        "temperature(0.3);min_p(0.2,1000);dist",
        "temperature(0.5);min_p(0.05,1);dist",
        // No survivor of the unsorted path: llama.cpp sorts.
        "temperature(0.8);min_p(1.05,1);dist",
    ];
    let (mut divided, mut lm_steps, mut declined) = (0, 0, 0);
    for (name, row) in &rows {
        for (j, spec) in specs.iter().enumerate() {
            let ctx = BuildContext::new(row.len(), RngConfig::mt19937(j as u32 + 11));
            let mut chain = Chain::from_spec(spec, &ctx).unwrap();
            let mut stages = chain.stages().to_vec();
            for step in 0..4 {
                let label = format!("{spec} on {name}, step {step}");
                let want = array_path(&mut stages, row).unwrap();
                let got = chain.sample(row).unwrap();
                assert_eq!(Some(got), want.selected_token(), "{label}");
                let took = matches!(chain.last_path(), Path::Fast(p) if p.ends_with("(divided)"));
                divided += usize::from(took);
                // (The real row's top values repeat: bf16-like logits.)
                let declines = ["top_k(129)", "min_p(1.05", "1000)"].iter().any(|d| spec.contains(d));
                if name.starts_with("peaked") && !declines {
                    lm_steps += 1;
                    assert!(took, "{label}: {:?}", chain.last_path());
                } else if !name.starts_with("real") && !declines && !took {
                    declined += 1;
                }
                stages.iter_mut().for_each(|s| s.accept(got));
            }
            // `apply` takes the divided path too (the candidates are observed).
            let mut applied = Chain::from_spec_for_apply(&spec.replace(";dist", ""), &ctx).unwrap();
            let want = array_path(&mut applied.stages().to_vec(), row).unwrap();
            same(applied.apply(row).unwrap(), &want).unwrap_or_else(|e| panic!("apply {spec} {name}: {e}"));
        }
    }
    eprintln!("temperature first: {divided} steps divided the top, {lm_steps} language-model-like, {declined} declined (merged ties, a flat row)");
    assert!(declined > 0, "no step declined");
}

/// `temperature(t);mirostat*` divides what it reads of the row instead of a copy of it, and
/// distinct logits may divide to equal values: rows whose entries are runs of neighbouring
/// floats (a peaked row's values, each repeated a few ulps apart), under temperatures that
/// merge neighbours (3, 7) and one that does not (0.3), with every cut and draw checked
/// against the array path as in [`mirostat_reads_the_top_of_the_row`].
#[test]
fn mirostat_after_a_temperature_that_merges_neighbours() {
    let specs = [
        "temperature(3);mirostat_v2(5,0.1)",
        "temperature(7);mirostat_v2(2,0.3)",
        "temperature(3);mirostat_v2(40,0.1)",
        "temperature(7);mirostat(5,0.1,100)",
        "temperature(0.3);mirostat_v2(3,0.2)",
        "temperature(3);mirostat(25,0.1,100)",
    ];
    let mut tally = Tally::default();
    let mut drawn_in_top = 0;
    for (case, v) in [3_000usize, 20_000].into_iter().enumerate() {
        let base = generate::row(RowKind::Peaked, v.div_ceil(4), 90 + case as u64);
        // Each value, then up to three of its neighbours above: ties once divided.
        let row: Vec<f32> = (0..v)
            .map(|i| {
                let x = base[i / 4];
                (0..i % 4).fold(x, |x, _| x.next_up())
            })
            .collect();
        for (j, spec) in specs.iter().enumerate() {
            let label = format!("{spec} on neighbours {v}");
            drawn_in_top += mirostat_steps(spec, &row, j as u32 + 3, &label, Some(&mut tally));
        }
    }
    eprintln!("mirostat after merging temperatures: {tally:?}, {drawn_in_top} drawn in the top");
    // Most picked values are tied here, which sends the stage to the array with its draw; the
    // fast path still decides some steps.
    assert!(tally.fast > 0, "the fast path was never taken: {tally:?}");
}
