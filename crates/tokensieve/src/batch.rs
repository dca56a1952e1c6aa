//! Sampling a `[B, V]` batch in parallel: one [`Chain`] per row (per-row parameters and
//! per-row state), rows spread over rayon's thread pool.
//!
//! Results do not depend on the thread count or on which other rows are in the batch: each
//! row only touches its own chain, and Philox draws are keyed by (seed, sequence, step).

use crate::chain::Chain;
use crate::error::{Error, Result};
use crate::logits::LogitsBatch;
use crate::logprobs::{LogprobsMode, Sampled};
use rayon::prelude::*;

fn check(chains: &[Chain], batch: &LogitsBatch<'_>) -> Result<()> {
    if chains.len() != batch.rows() {
        return Err(Error::invalid(format!("{} chains for a batch of {} rows", chains.len(), batch.rows())));
    }
    Ok(())
}

/// Samples one token per row with that row's chain and accepts it. Each row's result is
/// independent: one bad row does not stop the others.
///
/// ```
/// use tokensieve::{batch, Chain, LogitsBatch, RngConfig, sampler::BuildContext};
/// let rows = [0.0f32, 5.0, 1.0, /* row 2: */ 4.0, 0.0, 1.0];
/// let batch = LogitsBatch::new(&rows[..], 2, 3).unwrap();
/// let mut chains: Vec<Chain> = (0..2)
///     .map(|i| Chain::from_spec("greedy", &BuildContext::new(3, RngConfig::philox(1).with_sequence(i))).unwrap())
///     .collect();
/// let tokens = batch::sample(&mut chains, &batch).unwrap();
/// assert_eq!(tokens.into_iter().map(|t| t.unwrap()).collect::<Vec<_>>(), [1, 0]);
/// ```
pub fn sample(chains: &mut [Chain], batch: &LogitsBatch<'_>) -> Result<Vec<Result<u32>>> {
    check(chains, batch)?;
    Ok(chains.par_iter_mut().enumerate().map(|(i, chain)| chain.sample(batch.row(i))).collect())
}

/// As [`sample`], with logprobs for every row.
pub fn sample_with_logprobs(
    chains: &mut [Chain],
    batch: &LogitsBatch<'_>,
    mode: LogprobsMode,
    top_n: usize,
) -> Result<Vec<Result<Sampled>>> {
    check(chains, batch)?;
    Ok(chains
        .par_iter_mut()
        .enumerate()
        .map(|(i, chain)| chain.sample_with_logprobs(batch.row(i), mode, top_n))
        .collect())
}
