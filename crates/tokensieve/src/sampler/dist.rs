//! `dist`: draws a token from the softmax of the current candidates.
//!
//! llama.cpp convention (newest, 0c1e570): no sort. Max = first logit if the array is flagged
//! sorted (the flag is trusted even when stale), else a scan; `p_i = expf(l_i - max)` stored as
//! f32 and summed in f64; one uniform f64 `u`; the first index in **array order** whose f64
//! running sum reaches `sum * u` is selected; in the same pass every `p` becomes `p / sum`.
//! A single candidate gets `p = 1` and still consumes one draw (keeps the stream aligned, as
//! llama.cpp does since backend sampling). If no index is found (NaN sums from a stale
//! sorted flag) the last candidate is selected, as in llama.cpp's release build.
//!
//! Draws: one f64 per application (two MT19937 words in `mt19937` mode).
//!
//! Where llama.cpp returns the last candidate for an array whose logits are all `-inf`,
//! tokensieve returns an error ([`Error::is_no_candidates`](crate::Error::is_no_candidates)).

use super::{require_finite_candidate, BuildContext, FromSpec, Sampler};
use crate::arch;
use crate::candidates::{Candidates, TokenData};
use crate::error::Result;
use crate::params::spec::Bound;
use crate::rng::{RngConfig, StageRng, Stream};

/// Sampling from the candidates' softmax.
///
/// ```
/// use tokensieve::{Candidates, RngConfig, sampler::{dist::Dist, Sampler}};
/// let mut dist = Dist::new(RngConfig::mt19937(42)).unwrap();
/// let mut c = Candidates::from_logits(&[1.0, 2.0, 3.0]).unwrap();
/// dist.apply(&mut c).unwrap();
/// assert!(c.selected_token().is_some());
/// ```
#[derive(Clone, Debug)]
pub struct Dist {
    rng: StageRng,
}

impl Dist {
    /// A `dist` stage drawing from `rng`.
    pub fn new(rng: RngConfig) -> Result<Self> {
        Ok(Dist { rng: StageRng::new(rng, Stream::Dist)? })
    }

    /// The uniform draw `apply` makes (the dense fast path in
    /// [`convention::llama_cpp::dense`](crate::convention::llama_cpp::dense) draws before it
    /// knows whether it can finish without the candidate array).
    pub(crate) fn draw(&mut self) -> f64 {
        self.rng.uniform_f64()
    }

    /// `apply` with the draw `u` already made: normalises `p` and selects. The candidates must
    /// hold a finite logit.
    pub(crate) fn select(c: &mut Candidates, u: f64) {
        let sorted = c.is_sorted();
        let data = c.as_mut_slice();
        if data.len() == 1 {
            data[0].p = 1.0;
            c.set_selected(Some(0));
            return;
        }
        let selected = if data.len() >= WIDE_MIN {
            let mut lanes = std::mem::take(&mut c.lanes);
            let i = select_wide(c.as_mut_slice(), sorted, u, &mut lanes);
            c.lanes = lanes;
            i
        } else {
            let mut max_l = data[0].logit;
            if !sorted {
                for t in &data[1..] {
                    max_l = max_l.max(t.logit);
                }
            }
            select_plain(data, max_l, u)
        };
        let last = c.len() - 1;
        c.set_selected(Some(selected.unwrap_or(last)));
    }
}

/// From this many candidates `dist` computes the weights in vectors ([`select_wide`]).
const WIDE_MIN: usize = 64;

/// llama.cpp's loop as written: the weights and their f64 sum, then the running sum in array
/// order to the first index reaching `sum * u`, normalising every `p` on the way.
fn select_plain(data: &mut [TokenData], max_l: f32, u: f64) -> Option<usize> {
    let mut sum = 0.0f64;
    for t in data.iter_mut() {
        let p = (t.logit - max_l).exp();
        t.p = p;
        sum += p as f64;
    }
    let target = sum * u;
    let mut running = 0.0f64;
    let mut selected = None;
    for (i, t) in data.iter_mut().enumerate() {
        if selected.is_none() {
            running += t.p as f64;
            if running >= target {
                selected = Some(i);
            }
        }
        t.p = (t.p as f64 / sum) as f32;
    }
    selected
}

/// [`select_plain`]'s results, bit for bit, with llama.cpp's maximum (the first logit if
/// `sorted`, else the largest):
///
/// * the logits copied into `lanes` (reused scratch) and their maximum located in one SIMD
///   pass ([`arch::locate_max`]); with a NaN or `+inf` among them, or a stale sorted flag (a
///   logit above the first), [`select_plain`] runs instead, as it reproduces llama.cpp's
///   arithmetic whatever the weights. (The largest logit found by a scan may differ from this
///   one only in the sign of a zero, which changes no weight.)
/// * the weights by [`arch::exp_shifted`] (the platform's `expf` bits, 8 at a time with AVX2);
/// * when every nonzero weight is at least `2^-k` with `k = 30 - ceil(log2 n)`, every f64 sum
///   of them is exact: each weight (an f32 at most 1) is a multiple of `2^-(k + 23)`, so any
///   partial sum is a multiple of it below `n <= 2^(30 - k)`, which takes at most 53 bits.
///   Then the sum does not depend on the order of the additions, and neither do the running
///   sums: the total is summed in 8 lanes and the running sum advances 64 weights at a time,
///   entering only the chunk where it reaches the target. Otherwise both run in order, as
///   there;
/// * the probabilities divided in a contiguous pass, then stored.
///
/// On a nearly uniform row that `min_p` or `top_p` leaves almost whole, this spares most of a
/// vocabulary of scalar `expf` calls and the chains of dependent f64 additions.
fn select_wide(data: &mut [TokenData], sorted: bool, u: f64, lanes: &mut Vec<f32>) -> Option<usize> {
    let n = data.len();
    lanes.clear();
    lanes.extend(data.iter().map(|t| t.logit));
    let summary = arch::locate_max(lanes);
    let max_l = if sorted { data[0].logit } else { summary.max };
    if summary.suspect || summary.max > max_l || max_l == f32::NEG_INFINITY {
        let max_l = if sorted { max_l } else { data.iter().fold(data[0].logit, |m, t| m.max(t.logit)) };
        return select_plain(data, max_l, u);
    }
    lanes.resize(2 * n, 0.0);
    let (xs, ws) = lanes.split_at_mut(n);
    arch::exp_shifted(xs, 1.0, max_l, ws);
    let k = 30 - (n - 1).ilog2() as i32 - 1; // 30 - ceil(log2 n), n >= 2
    let exact = k >= 0 && {
        let floor = 2f32.powi(-k);
        ws.iter().all(|&w| w == 0.0 || w >= floor)
    };
    let (sum, selected) = if exact {
        let mut acc = [0.0f64; 8];
        let chunks = ws.chunks_exact(8);
        let tail: f64 = chunks.remainder().iter().map(|&w| w as f64).sum();
        for c in chunks {
            for (a, &w) in acc.iter_mut().zip(c) {
                *a += w as f64;
            }
        }
        let sum = acc.iter().sum::<f64>() + tail;
        let target = sum * u;
        let mut running = 0.0f64;
        let mut selected = None;
        for (ci, chunk) in ws.chunks(64).enumerate() {
            let whole: f64 = chunk.iter().map(|&w| w as f64).sum();
            if running + whole >= target {
                for (j, &w) in chunk.iter().enumerate() {
                    running += w as f64;
                    if running >= target {
                        selected = Some(ci * 64 + j);
                        break;
                    }
                }
                break;
            }
            running += whole;
        }
        (sum, selected)
    } else {
        let mut sum = 0.0f64;
        for &w in ws.iter() {
            sum += w as f64;
        }
        let target = sum * u;
        let mut running = 0.0f64;
        let selected = ws.iter().position(|&w| {
            running += w as f64;
            running >= target
        });
        (sum, selected)
    };
    for (x, &w) in xs.iter_mut().zip(ws.iter()) {
        *x = (w as f64 / sum) as f32;
    }
    for (t, &p) in data.iter_mut().zip(xs.iter()) {
        t.p = p;
    }
    selected
}

impl Sampler for Dist {
    fn name(&self) -> &'static str {
        "dist"
    }

    fn apply(&mut self, c: &mut Candidates) -> Result<()> {
        require_finite_candidate("dist", c)?;
        let u = self.draw();
        Dist::select(c, u);
        Ok(())
    }

    fn accept(&mut self, _token: u32) {
        self.rng.accept();
    }

    fn reset(&mut self) {
        self.rng.reset();
    }

    fn selects(&self) -> bool {
        true
    }
}

impl FromSpec for Dist {
    const PARAMS: &'static [&'static str] = &[];
    fn from_spec(_: &Bound<'_>, ctx: &BuildContext<'_>) -> Result<Self> {
        Dist::new(ctx.rng)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_candidate_consumes_a_draw() {
        let mut a = Dist::new(RngConfig::mt19937(1)).unwrap();
        let mut b = Dist::new(RngConfig::mt19937(1)).unwrap();
        let mut one = Candidates::from_logits(&[0.0]).unwrap();
        a.apply(&mut one).unwrap();
        assert_eq!(one.as_slice()[0].p, 1.0);
        let _ = b.rng.uniform_f64();
        let row = [0.1f32, 0.2, 0.3, 0.4];
        let mut ca = Candidates::from_logits(&row).unwrap();
        let mut cb = Candidates::from_logits(&row).unwrap();
        a.apply(&mut ca).unwrap();
        b.apply(&mut cb).unwrap();
        assert_eq!(ca.selected_index(), cb.selected_index());
    }

    /// The vector path is llama.cpp's loop bit for bit: the selected index and every `p`, on
    /// arrays whose weights allow the any-order sums (within ~10 nats of the maximum) and
    /// arrays that do not, with `-inf` entries, ties, draws at both ends, sorted flags (true
    /// and stale) and the values only the plain loop takes.
    #[test]
    fn the_wide_path_is_the_plain_loop() {
        use proptest::prelude::*;
        let value = prop_oneof![
            4 => -0.3f32..0.3,
            2 => -12.0f32..0.0,
            1 => -120.0f32..0.0,
            1 => proptest::sample::select(vec![0.0f32, -0.0, -1.0, f32::NEG_INFINITY]),
        ];
        let rows =
            prop_oneof![proptest::collection::vec(-0.3f32..0.3, 64..3000), proptest::collection::vec(value, 64..3000),];
        let u = prop_oneof![Just(0.0f64), Just(1.0 - f64::EPSILON / 2.0), 0.0f64..1.0];
        // 0: unsorted; 1: sorted and flagged; 2: flagged but not sorted (a stale flag); 3 and
        // 4: unsorted with a NaN or a +inf (which only the plain loop handles).
        let mode = 0u8..5;
        tokensieve_testkit::proptest_support::check("dist_wide", 256, (rows, u, mode), |(mut row, u, mode)| {
            prop_assume!(row.iter().any(|x| x.is_finite()));
            let third = row.len() / 3;
            match mode {
                1 => row.sort_by(|a, b| b.total_cmp(a)),
                // A stale flag over a first logit far below the rest: weights overflow.
                2 => row[0] = -200.0,
                3 => row[third] = f32::NAN,
                4 => row[third] = f32::INFINITY,
                _ => {}
            }
            let sorted = mode == 1 || mode == 2;
            let max = if sorted { row[0] } else { row.iter().fold(row[0], |m, &x| m.max(x)) };
            let mut plain: Vec<TokenData> =
                row.iter().enumerate().map(|(i, &l)| TokenData { id: i as u32, logit: l, p: 0.0 }).collect();
            let mut wide = plain.clone();
            let a = select_plain(&mut plain, max, u);
            let b = select_wide(&mut wide, sorted, u, &mut Vec::new());
            prop_assert_eq!(a, b);
            prop_assert!(plain.iter().zip(&wide).all(|(x, y)| x.p.to_bits() == y.p.to_bits()));
            Ok(())
        });
    }

    #[test]
    fn never_selects_a_masked_candidate_and_errors_when_all_are() {
        let mut d = Dist::new(RngConfig::philox(3)).unwrap();
        for _ in 0..200 {
            let mut c = Candidates::from_logits(&[f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY, 0.0]).unwrap();
            d.apply(&mut c).unwrap();
            assert!(matches!(c.selected_token(), Some(1) | Some(3)));
            d.accept(0);
        }
        let mut c = Candidates::from_logits(&[f32::NEG_INFINITY; 2]).unwrap();
        assert!(d.apply(&mut c).unwrap_err().is_no_candidates());
    }
}
