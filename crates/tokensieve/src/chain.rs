//! [`Chain`]: an ordered list of stages applied to one row per step, holding the sequence's
//! state (penalty windows, mirostat's `mu`, RNG streams) and a reusable candidate buffer.

use crate::candidates::Candidates;
use crate::error::{Error, Result};
use crate::logits::Logits;
use crate::logprobs::{self, LogprobsMode, Sampled, TokenLogprob};
use crate::params::spec;
use crate::sampler::{self, BuildContext, Sampler, Stage};

/// A sampling chain for one sequence.
///
/// Built with [`Chain::new`] it must end with a selecting stage (greedy, dist, mirostat,
/// mirostat_v2, gumbel), and no selecting stage may appear earlier: a chain that cannot pick a
/// token is a build error, never an abort at sampling time. [`Chain::for_apply`] builds a
/// chain that only processes logits (llama.cpp's `llama_sampler_apply`), for which the final
/// selecting stage is optional.
///
/// `clone` copies the sequence state (RNG included) but not the candidate buffer, so forking
/// a sequence is cheap.
///
/// ```
/// use tokensieve::{Chain, RngConfig, sampler::BuildContext};
/// let row = [0.1f32, 2.0, 1.5, -1.0];
/// let ctx = BuildContext::new(row.len(), RngConfig::philox(42));
/// let mut chain = Chain::from_spec("top_k(2);temperature(0.8);dist", &ctx).unwrap();
/// let token = chain.sample(&row).unwrap();
/// assert!(token == 1 || token == 2);
/// ```
#[derive(Debug)]
pub struct Chain {
    stages: Vec<Stage>,
    candidates: Candidates,
    n_accepted: u64,
}

impl Clone for Chain {
    fn clone(&self) -> Self {
        Chain { stages: self.stages.clone(), candidates: Candidates::new(), n_accepted: self.n_accepted }
    }
}

impl Chain {
    /// A chain that samples: must end with a selecting stage.
    pub fn new<S: Into<Stage>>(stages: impl IntoIterator<Item = S>) -> Result<Self> {
        let chain = Self::for_apply(stages)?;
        match chain.stages.last() {
            Some(last) if last.selects() => Ok(chain),
            Some(last) => Err(Error::chain(format!(
                "it ends with `{}`, which does not select a token; end it with greedy, dist, mirostat, mirostat_v2 or gumbel",
                last.name()
            ))),
            None => unreachable!("for_apply rejects empty chains"),
        }
    }

    /// A chain that may only process logits (no final selecting stage required).
    pub fn for_apply<S: Into<Stage>>(stages: impl IntoIterator<Item = S>) -> Result<Self> {
        let stages: Vec<Stage> = stages.into_iter().map(Into::into).collect();
        if stages.is_empty() {
            return Err(Error::chain("a chain needs at least one stage"));
        }
        if let Some(pos) = stages[..stages.len() - 1].iter().position(|s| s.selects()) {
            return Err(Error::chain(format!(
                "`{}` (stage {}) selects a token, so it must be the last stage",
                stages[pos].name(),
                pos + 1
            )));
        }
        Ok(Chain { stages, candidates: Candidates::new(), n_accepted: 0 })
    }

    /// Parses a spec string (llama.cpp convention) into a sampling chain.
    pub fn from_spec(spec: &str, ctx: &BuildContext<'_>) -> Result<Self> {
        Self::new(Self::build_stages(spec, ctx)?)
    }

    /// Parses a spec string into a processing-only chain (see [`Chain::for_apply`]).
    pub fn from_spec_for_apply(spec: &str, ctx: &BuildContext<'_>) -> Result<Self> {
        Self::for_apply(Self::build_stages(spec, ctx)?)
    }

    fn build_stages(spec: &str, ctx: &BuildContext<'_>) -> Result<Vec<Stage>> {
        spec::parse(spec)?.iter().map(|s| sampler::build_llama_cpp(s, ctx)).collect()
    }

    /// The stages in order.
    pub fn stages(&self) -> &[Stage] {
        &self.stages
    }

    /// True when the last stage selects a token.
    pub fn selects(&self) -> bool {
        self.stages.last().is_some_and(|s| s.selects())
    }

    /// Number of tokens accepted since the chain was built or reset.
    pub fn n_accepted(&self) -> u64 {
        self.n_accepted
    }

    /// Runs every stage once on a fresh candidate set built from `row` (llama.cpp's
    /// `llama_sampler_apply` on the array `llama_sampler_sample` builds). Accepts nothing.
    pub fn apply<'a>(&mut self, row: impl Into<Logits<'a>>) -> Result<&Candidates> {
        self.candidates.fill(row.into())?;
        for stage in &mut self.stages {
            stage.apply(&mut self.candidates)?;
        }
        Ok(&self.candidates)
    }

    /// Samples one token from `row` and accepts it (llama.cpp's `llama_sampler_sample`).
    pub fn sample<'a>(&mut self, row: impl Into<Logits<'a>>) -> Result<u32> {
        let token = self.select(row.into())?;
        self.accept(token);
        Ok(token)
    }

    /// Samples one token and reports its logprob and the `top_n` most likely alternatives,
    /// computed in `mode` (see [`LogprobsMode`]). Accepts the token.
    pub fn sample_with_logprobs<'a>(
        &mut self,
        row: impl Into<Logits<'a>>,
        mode: LogprobsMode,
        top_n: usize,
    ) -> Result<Sampled> {
        let mut top_logprobs = Vec::with_capacity(top_n + 1);
        let (token, logprob) = self.sample_with_logprobs_into(row, mode, top_n, &mut top_logprobs)?;
        Ok(Sampled { token, logprob, top_logprobs })
    }

    /// As [`Chain::sample_with_logprobs`], writing the alternatives into a caller-owned buffer
    /// (cleared first) so that an inference loop allocates nothing per token. Returns the
    /// token and its logprob.
    pub fn sample_with_logprobs_into<'a>(
        &mut self,
        row: impl Into<Logits<'a>>,
        mode: LogprobsMode,
        top_n: usize,
        top_logprobs: &mut Vec<TokenLogprob>,
    ) -> Result<(u32, f32)> {
        let row = row.into();
        let token = self.select(row)?;
        let logprob = match mode {
            LogprobsMode::Raw => logprobs::raw(row, token, top_n, top_logprobs),
            LogprobsMode::Processed => logprobs::processed(&self.candidates, token, top_n, top_logprobs),
        };
        self.accept(token);
        Ok((token, logprob))
    }

    fn select(&mut self, row: Logits<'_>) -> Result<u32> {
        if !self.selects() {
            return Err(Error::chain("this chain was built for `apply` and has no selecting stage"));
        }
        self.apply(row)?;
        self.candidates.selected_token().ok_or_else(|| {
            Error::internal(format!(
                "the selecting stage `{}` did not select a token",
                self.stages.last().map_or("?", |s| s.name())
            ))
        })
    }

    /// Adds `token` to the sequence: every stage sees it (penalty windows, mirostat's `mu`,
    /// RNG step). Call it for prompt/history tokens too, oldest first.
    pub fn accept(&mut self, token: u32) {
        for stage in &mut self.stages {
            stage.accept(token);
        }
        self.n_accepted += 1;
    }

    /// Restores every stage's initial state (RNG streams restart from their seeds).
    pub fn reset(&mut self) {
        for stage in &mut self.stages {
            stage.reset();
        }
        self.n_accepted = 0;
    }

    /// The candidates left by the last `apply`/`sample`.
    pub fn candidates(&self) -> &Candidates {
        &self.candidates
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::RngConfig;
    use crate::sampler::{dist::Dist, greedy::Greedy, top_k::TopK};

    #[test]
    fn a_chain_without_a_selecting_stage_is_a_build_error() {
        let e = Chain::new([Stage::from(TopK::new(3))]).unwrap_err();
        assert!(e.to_string().contains("does not select"), "{e}");
        assert!(Chain::for_apply([Stage::from(TopK::new(3))]).is_ok());
        let e = Chain::new(Vec::<Stage>::new()).unwrap_err();
        assert!(e.to_string().contains("at least one"));
    }

    #[test]
    fn a_selecting_stage_must_be_last() {
        let e = Chain::new([Stage::from(Greedy), Stage::from(TopK::new(3)), Stage::from(Greedy)]).unwrap_err();
        assert!(e.to_string().contains("must be the last"), "{e}");
    }

    #[test]
    fn sampling_from_an_apply_chain_is_an_error_not_a_panic() {
        let mut c = Chain::for_apply([Stage::from(TopK::new(3))]).unwrap();
        assert!(c.sample(&[1.0f32, 2.0]).is_err());
    }

    #[test]
    fn clone_copies_rng_state_and_reset_restarts_it() {
        let row: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut a = Chain::new([Stage::from(Dist::new(RngConfig::mt19937(9)).unwrap())]).unwrap();
        let first: Vec<u32> = (0..5).map(|_| a.sample(&row).unwrap()).collect();
        let mut b = a.clone();
        assert_eq!(a.sample(&row).unwrap(), b.sample(&row).unwrap());
        a.reset();
        let again: Vec<u32> = (0..5).map(|_| a.sample(&row).unwrap()).collect();
        assert_eq!(first, again);
    }

    #[test]
    fn bad_rows_are_errors_and_leave_the_chain_usable() {
        let mut c = Chain::new([Stage::from(Greedy)]).unwrap();
        assert!(c.sample(&[f32::NAN, 1.0]).is_err());
        assert!(c.sample(&[] as &[f32; 0]).is_err());
        assert!(c.sample(&[f32::NEG_INFINITY; 4]).unwrap_err().is_no_candidates());
        assert_eq!(c.n_accepted(), 0);
        assert_eq!(c.sample(&[0.0f32, 1.0]).unwrap(), 1);
    }
}
