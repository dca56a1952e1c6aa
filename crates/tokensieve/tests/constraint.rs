//! A chain with a constraint in front: both modes pick only allowed tokens, the masked row is
//! what the stages see, and a constraint error leaves the chain as it was.

use tokensieve::constraint::apply_bitmask;
use tokensieve::{sampler::BuildContext, Chain, Constraint, ConstraintMode, Result, RngConfig};

/// Allows the tokens of `allowed[step]` at each step (a toy grammar).
#[derive(Clone, Debug)]
struct Script {
    allowed: Vec<Vec<u32>>,
    step: usize,
    checks: usize,
}

impl Constraint for Script {
    fn fill_mask(&mut self, mask: &mut [u32]) -> Result<()> {
        mask.fill(0);
        for &t in &self.allowed[self.step] {
            mask[(t / 32) as usize] |= 1 << (t % 32);
        }
        Ok(())
    }
    fn allows(&mut self, token: u32) -> Result<bool> {
        self.checks += 1;
        Ok(self.allowed[self.step].contains(&token))
    }
    fn accept(&mut self, token: u32) -> Result<()> {
        if !self.allowed[self.step].contains(&token) {
            return Err(tokensieve::Error::invalid(format!("token {token} not allowed")));
        }
        self.step += 1;
        Ok(())
    }
    fn reset(&mut self) {
        self.step = 0;
    }
    fn box_clone(&self) -> Box<dyn Constraint> {
        Box::new(self.clone())
    }
}

fn row() -> Vec<f32> {
    (0..100).map(|i| ((i * 37 % 100) as f32) / 10.0).collect()
}

fn script() -> Script {
    Script { allowed: vec![vec![3, 40, 77], vec![5], vec![0, 99]], step: 0, checks: 0 }
}

#[test]
fn both_modes_sample_only_allowed_tokens() {
    for mode in [ConstraintMode::MaskFirst, ConstraintMode::Rejection] {
        for seed in 0..20 {
            let ctx = BuildContext::new(100, RngConfig::philox(seed));
            let mut chain = Chain::from_spec("top_k(40);temperature(1.5);dist", &ctx)
                .unwrap()
                .with_constraint(Box::new(script()), mode);
            let a = chain.sample(&row()).unwrap();
            let b = chain.sample(&row()).unwrap();
            let c = chain.sample(&row()).unwrap();
            assert!([3, 40, 77].contains(&a) && b == 5 && [0, 99].contains(&c), "{mode:?}: {a} {b} {c}");
        }
    }
}

#[test]
fn rejection_mode_checks_one_token_when_it_passes() {
    // Greedy picks token 27 (the row's maximum 9.9); allow it: one check, no mask needed.
    let r = row();
    let best = (0..100).max_by(|&a, &b| r[a].total_cmp(&r[b])).unwrap() as u32;
    let s = Script { allowed: vec![vec![best, 1]], step: 0, checks: 0 };
    let ctx = BuildContext::new(100, RngConfig::philox(0));
    let mut chain = Chain::from_spec("greedy", &ctx).unwrap().with_constraint(Box::new(s), ConstraintMode::Rejection);
    assert_eq!(chain.sample(&r).unwrap(), best);
}

#[test]
fn masked_apply_matches_applying_the_bitmask_by_hand() {
    let ctx = BuildContext::new(100, RngConfig::philox(0));
    let mut constrained = Chain::from_spec_for_apply("top_k(2);temperature(0.5)", &ctx)
        .unwrap()
        .with_constraint(Box::new(script()), ConstraintMode::MaskFirst);
    let mut plain = Chain::from_spec_for_apply("top_k(2);temperature(0.5)", &ctx).unwrap();
    let mut masked = row();
    let mut mask = vec![0u32; 4];
    script().fill_mask(&mut mask).unwrap();
    apply_bitmask(&mut masked, &mask);
    let a = constrained.apply(&row()).unwrap().clone();
    let b = plain.apply(&masked).unwrap();
    assert_eq!(a.as_slice(), b.as_slice());
}

#[test]
fn a_constraint_error_changes_nothing_and_clone_reset_carry_state() {
    let ctx = BuildContext::new(100, RngConfig::philox(1));
    let mut chain =
        Chain::from_spec("greedy", &ctx).unwrap().with_constraint(Box::new(script()), ConstraintMode::MaskFirst);
    // Every allowed token masked out by the row itself: no candidate, nothing accepted.
    let mut dead = row();
    for t in [3, 40, 77] {
        dead[t] = f32::NEG_INFINITY;
    }
    assert!(chain.sample(&dead).unwrap_err().is_no_candidates());
    assert_eq!(chain.n_accepted(), 0);
    let first = chain.sample(&row()).unwrap();
    let mut fork = chain.clone();
    assert_eq!(fork.sample(&row()).unwrap(), 5);
    assert_eq!(chain.sample(&row()).unwrap(), 5);
    chain.reset();
    assert_eq!(chain.sample(&row()).unwrap(), first);
    // NaN rows are still errors with a constraint.
    let mut bad = row();
    bad[7] = f32::NAN;
    assert!(chain.sample(&bad).is_err());
}
