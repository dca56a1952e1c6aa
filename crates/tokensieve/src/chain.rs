//! [`Chain`]: an ordered list of stages applied to one row per step, holding the sequence's
//! state (penalty windows, mirostat's `mu`, RNG streams) and a reusable candidate buffer.

use crate::candidates::Candidates;
use crate::constraint::{Constraint, ConstraintMode, Slot};
use crate::convention::llama_cpp::dense::{self, Need, Prepared};
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
/// Speed: the row is read in place. When the chain (after any leading `penalties` /
/// `logit_bias`) starts with `top_k`, `min_p` or `top_p`, that stage runs on the row directly
/// and only its survivors are ever copied; `sample` also selects straight from the row for
/// `greedy` and `[temperature;] dist` chains. The result is always the one the candidate-array
/// path gives (see [`convention::llama_cpp::dense`](crate::convention::llama_cpp::dense)), with
/// one visible difference: after such a direct `sample`, [`Chain::candidates`] holds only the
/// selected candidate (after `dist`, its `p` is approximate: within about 6% at worst;
/// `sample_with_logprobs` gives exact probabilities).
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
    dense: dense::Scratch,
    constraint: Option<Slot>,
}

impl Clone for Chain {
    fn clone(&self) -> Self {
        Chain {
            stages: self.stages.clone(),
            candidates: Candidates::new(),
            n_accepted: self.n_accepted,
            dense: dense::Scratch::default(),
            constraint: self.constraint.clone(),
        }
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
        Ok(Chain {
            stages,
            candidates: Candidates::new(),
            n_accepted: 0,
            dense: dense::Scratch::default(),
            constraint: None,
        })
    }

    /// Parses a spec string into a sampling chain, under the convention of `ctx`
    /// ([`BuildContext::convention`], llama.cpp unless set).
    pub fn from_spec(spec: &str, ctx: &BuildContext<'_>) -> Result<Self> {
        Self::new(Self::build_stages(spec, ctx)?)
    }

    /// Parses a spec string into a processing-only chain (see [`Chain::for_apply`]).
    pub fn from_spec_for_apply(spec: &str, ctx: &BuildContext<'_>) -> Result<Self> {
        Self::for_apply(Self::build_stages(spec, ctx)?)
    }

    fn build_stages(spec: &str, ctx: &BuildContext<'_>) -> Result<Vec<Stage>> {
        spec::parse(spec)?.iter().map(|s| sampler::build(s, ctx)).collect()
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
        let row = row.into();
        if self.constraint_active() {
            self.run_masked(row, Need::Candidates)?;
        } else {
            self.run(row, Need::Candidates)?;
        }
        Ok(&self.candidates)
    }

    /// Puts a constraint (a grammar) in front of every stage; see [`ConstraintMode`] for how
    /// the two combine. Tokens sampled by [`Chain::sample`] are accepted by the constraint
    /// too; [`Chain::accept`] (history, prompt) is not passed to it.
    pub fn with_constraint(mut self, constraint: Box<dyn Constraint>, mode: ConstraintMode) -> Self {
        self.constraint = Some(Slot { inner: constraint, mode, mask: Vec::new(), row: Vec::new() });
        self
    }

    /// The constraint, if any.
    pub fn constraint(&self) -> Option<&dyn Constraint> {
        self.constraint.as_ref().map(|s| s.inner.as_ref())
    }

    /// The constraint, mutably (to feed it tokens chosen elsewhere).
    pub fn constraint_mut(&mut self) -> Option<&mut (dyn Constraint + 'static)> {
        self.constraint.as_mut().map(|s| s.inner.as_mut())
    }

    fn constraint_active(&self) -> bool {
        self.constraint.as_ref().is_some_and(|s| s.inner.is_active())
    }

    /// Masks `row` with the constraint, then runs the stages on the masked copy.
    fn run_masked(&mut self, row: Logits<'_>, need: Need) -> Result<Option<u32>> {
        row.validate()?;
        let Some(slot) = self.constraint.as_mut() else { return self.run(row, need) };
        slot.mask_row(row)?;
        let masked = std::mem::take(&mut slot.row);
        let result = self.run(Logits::F32(&masked), need);
        if let Some(slot) = self.constraint.as_mut() {
            slot.row = masked;
        }
        result
    }

    /// Builds the candidates from `row` (in place where a fast path applies) and runs the
    /// stages; `Some(token)` when a selecting stage chose straight from the row.
    fn run(&mut self, row: Logits<'_>, need: Need) -> Result<Option<u32>> {
        let applied = match dense::prepare(&mut self.stages, row, &mut self.candidates, &mut self.dense, need)? {
            Prepared::Selected(token) => return Ok(Some(token)),
            Prepared::Built { applied } => applied,
        };
        for stage in &mut self.stages[applied..] {
            stage.apply(&mut self.candidates)?;
        }
        Ok(None)
    }

    /// Samples one token from `row` and accepts it (llama.cpp's `llama_sampler_sample`).
    pub fn sample<'a>(&mut self, row: impl Into<Logits<'a>>) -> Result<u32> {
        let token = self.select(row.into(), Need::Token)?;
        self.accept_sampled(token)?;
        Ok(token)
    }

    /// Accepts a sampled token: the constraint first (an error there leaves every stage
    /// untouched), then every stage.
    fn accept_sampled(&mut self, token: u32) -> Result<()> {
        if let Some(slot) = self.constraint.as_mut() {
            slot.inner.accept(token)?;
        }
        self.accept(token);
        Ok(())
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
        let need = if mode == LogprobsMode::Processed { Need::Candidates } else { Need::Token };
        let token = self.select(row, need)?;
        let logprob = match mode {
            LogprobsMode::Raw => dense::raw_logprobs(row, token, top_n, top_logprobs, &mut self.dense)
                .unwrap_or_else(|| logprobs::raw(row, token, top_n, top_logprobs)),
            LogprobsMode::Processed => logprobs::processed(&self.candidates, token, top_n, top_logprobs),
        };
        self.accept_sampled(token)?;
        Ok((token, logprob))
    }

    fn select(&mut self, row: Logits<'_>, need: Need) -> Result<u32> {
        if !self.selects() {
            return Err(Error::chain("this chain was built for `apply` and has no selecting stage"));
        }
        if self.constraint_active() {
            let mode = self.constraint.as_ref().map_or(ConstraintMode::MaskFirst, |s| s.mode);
            if mode == ConstraintMode::Rejection {
                // llama.cpp's fast mode: sample unconstrained, check only the chosen token.
                let token = match self.run(row, need)? {
                    Some(token) => Some(token),
                    None => self.candidates.selected_token(),
                };
                if let Some(token) = token {
                    let slot = self.constraint.as_mut().expect("active");
                    if slot.inner.allows(token)? {
                        return Ok(token);
                    }
                }
            }
            if let Some(token) = self.run_masked(row, need)? {
                return Ok(token);
            }
        } else if let Some(token) = self.run(row, need)? {
            return Ok(token);
        }
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
        if let Some(slot) = self.constraint.as_mut() {
            slot.inner.reset();
        }
        self.n_accepted = 0;
    }

    /// Which path the last `apply`/`sample` took: the candidate array, or a stage's in-place
    /// fast path (see [`convention::llama_cpp::dense`](crate::convention::llama_cpp::dense)).
    /// For tests and benchmarks.
    #[doc(hidden)]
    pub fn last_path(&self) -> dense::Path {
        self.dense.path
    }

    /// The candidates left by the last `apply`/`sample` (after a `sample` that selected
    /// straight from the row, only the selected candidate; after a `sample` through `top_k`
    /// onto equal values, those in id order where llama.cpp's order could not change the
    /// token; see the type's docs).
    pub fn candidates(&self) -> &Candidates {
        &self.candidates
    }
}

/// Watching a chain work, stage by stage (`tokensieve explain`).
impl Chain {
    /// [`Chain::apply`], calling `observe(index, stage, candidates)` after each stage with the
    /// candidates that stage left. The stages run exactly as in `apply` (same state, same
    /// draws); nothing is accepted. Note that under the llama.cpp convention the `p` fields
    /// are stale unless the stage recomputed them: derive probabilities from the logits.
    ///
    /// ```
    /// use tokensieve::{Chain, RngConfig, sampler::BuildContext};
    /// let row = [0.1f32, 2.0, 1.5, -1.0];
    /// let ctx = BuildContext::new(row.len(), RngConfig::philox(0));
    /// let mut chain = Chain::from_spec("top_k(2);greedy", &ctx).unwrap();
    /// let mut sizes = Vec::new();
    /// chain.apply_observed(&row, |_, _, c| sizes.push(c.len())).unwrap();
    /// assert_eq!(sizes, [2, 2]);
    /// assert_eq!(chain.candidates().selected_token(), Some(1));
    /// ```
    pub fn apply_observed<'a>(
        &mut self,
        row: impl Into<Logits<'a>>,
        mut observe: impl FnMut(usize, &Stage, &Candidates),
    ) -> Result<&Candidates> {
        let row = row.into();
        if self.constraint_active() {
            let slot = self.constraint.as_mut().expect("active");
            row.validate()?;
            slot.mask_row(row)?;
            let masked = std::mem::take(&mut slot.row);
            let filled = self.candidates.fill(Logits::F32(&masked));
            if let Some(slot) = self.constraint.as_mut() {
                slot.row = masked;
            }
            filled?;
        } else {
            self.candidates.fill(row)?;
        }
        for (index, stage) in self.stages.iter_mut().enumerate() {
            stage.apply(&mut self.candidates)?;
            observe(index, stage, &self.candidates);
        }
        Ok(&self.candidates)
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

    #[test]
    fn apply_observed_sees_every_stage_and_matches_apply() {
        let row: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let build = || {
            Chain::new([
                Stage::from(TopK::new(10)),
                Stage::from(crate::sampler::temperature::Temperature::new(0.7).unwrap()),
                Stage::from(Dist::new(RngConfig::philox(3)).unwrap()),
            ])
            .unwrap()
        };
        let (mut a, mut b) = (build(), build());
        let mut seen = Vec::new();
        let observed = a.apply_observed(&row, |i, s, c| seen.push((i, s.name(), c.len()))).unwrap().clone();
        assert_eq!(seen, [(0, "top-k", 10), (1, "temp", 10), (2, "dist", 10)]);
        let applied = b.apply(&row).unwrap();
        assert_eq!(observed.as_slice(), applied.as_slice());
        assert_eq!(observed.selected_token(), applied.selected_token());
        assert_eq!(a.n_accepted(), 0);
    }
}
