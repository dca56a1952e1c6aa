//! The stages after the row path's reduction, fused when sampling: `top_p` and `min_p` stages
//! (any number, in any order), then `dist`, on the sparse view the reduction left (a few
//! dozen tokens after `top_k(40)`).
//!
//! Run one by one, each of these stages computes its own softmax: `exp(f64(z - max))` of every
//! token in the view, three times over for `top_p;min_p;dist`. But the largest logit survives
//! every one of them (`top_p` never removes the last sorted position, `min_p` never the top
//! probability), so the weights are the same in each: here they are computed once, and each
//! stage does its own arithmetic on them (its sums in its own order, its f32 roundings, its
//! comparisons), removing tokens from a mask. A removed token's weight counts as the `+0.0`
//! that its `-inf` logit gives the stage, which adds nothing to an f64 sum.
//!
//! Where a stage's result would depend on the dense row or on torch's tie order (equal values
//! straddling `top_p`'s cut, `min_p`'s `topk` restoration), the fused tail gives up before
//! touching the view, and the stages run one by one with the same draw.

use super::{weights_into, Cumsum};
use crate::candidates::{total_order_key, Candidates, TokenData};
use crate::convention::llama_cpp::dense::{Prepared, Scratch};
use crate::error::Result;
use crate::sampler::transformers::dist::Dist;
use crate::sampler::{Sampler, Stage};

/// Samples with `stages[start..]` from the sparse view `c` when they are `top_p`/`min_p`
/// stages, then `dist` (inert stages anywhere): the token, the view left holding only it.
/// `None` (nothing drawn, `c` untouched) for any other tail. When the fused tail gives up,
/// the stages run one by one on the view, `dist` with the draw already made.
pub(crate) fn sample(
    stages: &mut [Stage],
    start: usize,
    c: &mut Candidates,
    s: &mut Scratch,
) -> Result<Option<Prepared>> {
    let mut at = None;
    for (i, stage) in stages.iter().enumerate().skip(start) {
        match stage {
            _ if stage.is_inert() => {}
            Stage::HfTopP(_) | Stage::HfMinP(_) => {}
            Stage::HfDist(_) => {
                at = Some(i);
                break;
            }
            _ => return Ok(None),
        }
    }
    let Some(at) = at else { return Ok(None) };
    let Stage::HfDist(d) = &mut stages[at] else { unreachable!("found above") };
    let u = d.draw();
    if let Some(token) = fused(&stages[start..at], c, u, s) {
        return Ok(Some(Prepared::Selected(token)));
    }
    for stage in &mut stages[start..at] {
        stage.apply(c)?;
    }
    Dist::apply_drawn(c, u)?;
    Ok(Some(Prepared::Built { applied: at + 1 }))
}

/// The fused tail over the view in `c` (finite logits, id order): `None`, `c` untouched, where
/// a stage needs more than the view's values. The tokens still in play are listed by their
/// positions in the view (ascending, so every sum below runs in id order over them): a removed
/// token adds nothing to a sum, and the later stages' sums and scans then run over the few
/// that `top_p` left instead of the whole view.
fn fused(tail: &[Stage], c: &mut Candidates, u: f64, s: &mut Scratch) -> Option<u32> {
    let data = &c.data;
    let max = data.iter().fold(f32::NEG_INFINITY, |m, t| m.max(t.logit));
    if !max.is_finite() || data.iter().any(|t| !t.logit.is_finite()) {
        return None;
    }
    let w = &mut s.top_weights;
    weights_into(data.iter().map(|t| t.logit), max, w);
    let live = &mut s.live;
    live.clear();
    live.extend(0..data.len() as u32);
    for stage in tail {
        match stage {
            _ if stage.is_inert() => {}
            Stage::HfTopP(tp) => {
                let (threshold, keep) = tp.params();
                // The row path's order of this view, while no token has left it.
                let order = (s.view_desc.len() == data.len() && live.len() == data.len()).then_some(&s.view_desc[..]);
                top_p(threshold, keep, c.vocab_size, data, w, live, order, &mut s.gathered_ranks)?;
            }
            Stage::HfMinP(mp) => {
                let (min_p, keep) = mp.params();
                self::min_p(min_p, keep, c.vocab_size, w, live)?;
            }
            _ => return None,
        }
    }
    // `dist`: the sum in id order, then the first running sum above `u` times it.
    let sum = live.iter().fold(0.0f64, |acc, &i| acc + w[i as usize]);
    let target = u * sum;
    let (mut running, mut chosen) = (0.0f64, None);
    for &i in live.iter() {
        let x = w[i as usize];
        if x > 0.0 {
            running += x;
            chosen = Some(i as usize);
            if running > target {
                break;
            }
        }
    }
    let i = chosen?;
    let t = data[i];
    let p = (w[i] / sum) as f32;
    c.begin(c.vocab_size);
    c.data.push(TokenData { p, ..t });
    c.selected = Some(0);
    Some(t.id)
}

/// transformers' `top_p` ([`TopP`](crate::sampler::transformers::top_p::TopP)'s cut by value)
/// over the live tokens of a view of a row of `n` tokens: the live values sorted ascending
/// (the `-inf` tokens, `n` minus those, sort first with weight 0), their softmax sum in that
/// order, the f32 probabilities' cumsum against `threshold`, the last `keep` positions kept.
/// `None` when equal values straddle the cut.
///
/// `order`, when given, lists every live position by descending value (the row path's ranking,
/// [`super::row`]): its reverse is the ascending order. Equal values may sit in another order
/// than the sort's, which changes nothing: the sums see the same sequence of values, and the
/// cut gives up where equal values straddle it.
#[allow(clippy::too_many_arguments)]
fn top_p(
    threshold: f32,
    keep: usize,
    n: usize,
    data: &[TokenData],
    w: &[f64],
    live: &mut Vec<u32>,
    order: Option<&[u32]>,
    keys: &mut Vec<u64>,
) -> Option<()> {
    keys.clear();
    if let Some(order) = order {
        debug_assert_eq!(order.len(), live.len(), "top_p: the order must list every live position");
        // Positions only: `at` below reads the low 32 bits.
        keys.extend(order.iter().rev().map(|&i| u64::from(i)));
    } else {
        keys.extend(live.iter().map(|&i| (u64::from(total_order_key(data[i as usize].logit)) << 32) | u64::from(i)));
        // PERF: this sort is about 135 ns of the chain's 2.2 µs at V = 32,000 (40 keys, branch
        // misses), hence `order`. Measured on Zen 4 and not taken: an AVX-512 bitonic network
        // over up to 64 keys in registers (126 ns for 40: its 512-bit operations run at half
        // rate), counting ranks (220 ns), 32-bit packed keys (131 ns), the stable sort (290 ns).
        keys.sort_unstable();
    }
    let m = keys.len();
    let below = n - m;
    let removable = n.saturating_sub(keep);
    if m == 0 || removable <= below {
        return Some(());
    }
    let limit = removable - below;
    let at = |r: usize| keys[r] as u32 as usize;
    let mut sum = 0.0f64;
    for r in 0..m {
        sum += w[at(r)];
    }
    let mut cum = Cumsum::default();
    let mut r = 0;
    while r < limit && cum.push((w[at(r)] / sum) as f32) <= threshold {
        r += 1;
    }
    if r == 0 {
        return Some(());
    }
    let last = data[at(r - 1)].logit;
    if last == data[at(r)].logit {
        return None; // torch's sort order picks which of the equal values go
    }
    live.retain(|&i| data[i as usize].logit > last);
    Some(())
}

/// transformers' `min_p` ([`MinP`](crate::sampler::transformers::min_p::MinP) on a view) over
/// the live tokens: their softmax in id order, the top probability `fl32(1 / sum)`, and every
/// probability below `min_p` times it removed. `None` when fewer than `keep` probabilities
/// reach the threshold (torch's `topk` would restore some, by its tie order).
fn min_p(min_p: f32, keep: usize, n: usize, w: &[f64], live: &mut Vec<u32>) -> Option<()> {
    let sum = live.iter().fold(0.0f64, |acc, &i| acc + w[i as usize]);
    let threshold = min_p * (1.0 / sum) as f32;
    if threshold == 0.0 {
        return Some(());
    }
    let prob = |i: u32| (w[i as usize] / sum) as f32;
    let k = keep.min(n);
    if k > 1 && live.iter().filter(|&&i| prob(i) >= threshold).count() < k {
        return None;
    }
    live.retain(|&i| prob(i) >= threshold);
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::transformers::{min_p::MinP, top_p::TopP};
    use tokensieve_testkit::generate::SplitMix64;

    /// A sparse view of `m` tokens (ids spread over a row of `n`), its logits drawn from
    /// `shape`: Gaussian, a coarse grid (ties everywhere), or Gaussian with the top values
    /// duplicated (ties at the top).
    fn view(rng: &mut SplitMix64, shape: u64) -> Candidates {
        let m = 1 + rng.below(60);
        let n = m + rng.below(200);
        let mut c = Candidates::default();
        c.begin(n);
        let mut id = 0;
        for left in (1..=m).rev() {
            id += rng.below((n - id) - left + 1);
            let z = (rng.next_f64() * 2.0 - 1.0) as f32 * 6.0;
            let z = if shape == 1 { (z * 2.0).round() / 2.0 } else { z };
            c.data.push(TokenData { id: id as u32, logit: z, p: 0.0 });
            id += 1;
        }
        if shape == 2 && m > 3 {
            let top = c.data.iter().fold(f32::NEG_INFINITY, |a, t| a.max(t.logit));
            let k = rng.below(m);
            c.data[k].logit = top;
        }
        c.sparse = true;
        c
    }

    /// The fused tail against the stages run one by one on the same view (each stage's own
    /// `apply`, then `dist` with the same draw): the same token and probability wherever it
    /// does not give up, over tails of `top_p` and `min_p` with `min_tokens_to_keep` above 1,
    /// on views with ties; and it gives up on some (ties at a cut, `topk` restoration). Both
    /// with `top_p` sorting the view itself and with the row path's order given (equal values
    /// in the other order).
    #[test]
    fn the_fused_tail_is_the_stages_one_by_one() {
        let mut rng = SplitMix64::new(11);
        let (mut fused_draws, mut given_up) = (0, 0);
        let mut s = Scratch::default();
        for case in 0..600u64 {
            let c0 = view(&mut rng, case % 3);
            let p = [0.95, 0.5, 0.9, 0.2][rng.below(4)];
            let q = [0.05, 0.3, 0.6][rng.below(3)];
            let (k1, k2) = (1 + rng.below(4) as i64, 1 + rng.below(5) as i64);
            let top_p = Stage::HfTopP(TopP::new(p, k1).unwrap());
            let min_p = Stage::HfMinP(MinP::new(q, k2).unwrap());
            let tail = match case % 4 {
                0 => vec![top_p],
                1 => vec![min_p],
                2 => vec![top_p, min_p],
                _ => vec![min_p, top_p],
            };
            for j in 0..20 {
                let u = (j as f64 + 0.5) / 20.0;
                let mut want = c0.clone();
                for stage in &mut tail.clone() {
                    stage.apply(&mut want).unwrap();
                }
                Dist::apply_drawn(&mut want, u).unwrap();
                let picked = want.as_slice()[want.selected_index().unwrap()];
                // Without the row path's order, then with it: positions by descending value,
                // equal values in the reverse of the sort's order.
                for ranked in [false, true] {
                    s.view_desc.clear();
                    if ranked {
                        let z = |i: u32| total_order_key(c0.data[i as usize].logit);
                        s.view_desc.extend(0..c0.data.len() as u32);
                        s.view_desc.sort_by(|&a, &b| z(b).cmp(&z(a)).then(b.cmp(&a)));
                    }
                    let mut got = c0.clone();
                    match fused(&tail, &mut got, u, &mut s) {
                        Some(token) => {
                            assert_eq!(token, picked.id, "case {case} u {u} ranked {ranked}");
                            assert_eq!(got.as_slice(), [picked], "case {case} u {u} ranked {ranked}");
                            fused_draws += 1;
                        }
                        None => {
                            assert_eq!(got.as_slice(), c0.as_slice(), "case {case}: the view was touched");
                            given_up += 1;
                        }
                    }
                }
            }
        }
        assert!(fused_draws > 16_000 && given_up > 200, "{fused_draws} fused, {given_up} given up");
    }
}
