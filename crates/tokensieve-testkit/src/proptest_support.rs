//! Running property tests deterministically.
//!
//! [`check`] runs a proptest strategy with a ChaCha generator seeded from the test's name and
//! no failure persistence: the same cases run on every machine and every run (no flakes, no
//! `proptest-regressions/` files written into the repository), whatever `PROPTEST_*`
//! variables say. `TOKENSIEVE_PROPTEST_SCALE=N` multiplies every case count by `N` for a
//! deeper local run (still deterministic).

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseResult, TestError, TestRng, TestRunner};
use std::fmt::Debug;

/// 32 seed bytes derived from `name` (FNV-1a, then SplitMix-style mixing).
fn seed_for(name: &str) -> [u8; 32] {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let mut rng = crate::generate::SplitMix64::new(h);
    let mut seed = [0u8; 32];
    for chunk in seed.chunks_exact_mut(8) {
        chunk.copy_from_slice(&rng.next_u64().to_le_bytes());
    }
    seed
}

/// The case-count multiplier from `TOKENSIEVE_PROPTEST_SCALE` (1 when unset or invalid).
pub fn scale() -> u32 {
    std::env::var("TOKENSIEVE_PROPTEST_SCALE").ok().and_then(|s| s.parse().ok()).filter(|&n| n >= 1).unwrap_or(1)
}

/// Runs `test` on `cases` values drawn from `strategy` with a generator seeded from `name`.
/// On failure, shrinks and panics with the reason and the minimal failing input (a panic in
/// `test` counts as a failure and is shrunk too).
pub fn check<S>(name: &str, cases: u32, strategy: S, test: impl Fn(S::Value) -> TestCaseResult)
where
    S: Strategy,
    S::Value: Debug,
{
    let config =
        Config { cases: cases * scale(), failure_persistence: None, max_shrink_iters: 4096, ..Config::default() };
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed_for(name));
    let mut runner = TestRunner::new_with_rng(config, rng);
    match runner.run(&strategy, test) {
        Ok(()) => {}
        Err(TestError::Fail(reason, value)) => {
            panic!("property `{name}` failed: {reason}\nminimal failing input: {value:?}")
        }
        Err(TestError::Abort(reason)) => panic!("property `{name}` aborted: {reason}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn runs_are_reproducible() {
        let run = || {
            let acc = AtomicU64::new(0);
            check("repro", 32, 0u64..1_000_000, |x| {
                acc.fetch_add(x, Ordering::Relaxed);
                Ok(())
            });
            acc.into_inner()
        };
        assert_eq!(run(), run());
    }

    #[test]
    #[should_panic(expected = "minimal failing input: 10")]
    fn failures_are_shrunk_and_reported() {
        check("shrink", 256, 0u32..1000, |x| {
            proptest::prop_assert!(x < 10);
            Ok(())
        });
    }
}
