//! Random draws for the stages that need them (`dist`, `xtc`, `mirostat`, `mirostat_v2`,
//! `gumbel`).
//!
//! Two kinds, chosen per chain with [`RngConfig`]:
//!
//! * [`RngKind::Philox`] (default): counter-based. Draw `i` of a stage at step `s` of sequence
//!   `q` is `Philox4x32-10(counter = [i, stream, q, s], key = seed)`, where `stream` is fixed per
//!   sampler type (so adding a filter before `dist` does not shift its draws) and `s` counts
//!   the tokens accepted since the last reset. Nothing depends on which other sequences are in
//!   the batch or on which thread runs them.
//! * [`RngKind::Mt19937`]: one `std::mt19937` per stage, every stage seeded with the same
//!   32-bit seed (as llama.cpp's `common_sampler_init` does), draws made the way libstdc++
//!   makes them. With the same logits and seed the token stream equals llama.cpp's.
//!
//! Draws consumed per application (both kinds): `dist` one f64 (two MT words), also when a
//! single candidate is left (newest llama.cpp); `xtc` one f32 (one MT word) unless disabled or
//! fewer than two candidates; `mirostat`/`mirostat_v2` one f64 via `discrete_distribution`,
//! none when a single candidate is left; `gumbel` no sequential draws: one counter-based
//! noise value per token id; the transformers convention's `dist` one f64 (torch's own
//! generator is not reproduced).

pub mod mt19937;
pub mod philox;

use crate::error::{Error, Result};
pub use mt19937::Mt19937;

/// Which generator a chain's drawing stages use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RngKind {
    /// Counter-based Philox4x32-10 keyed by (seed, sequence, step): batch- and thread-invariant.
    #[default]
    Philox,
    /// llama.cpp's `std::mt19937` with libstdc++'s draws: the same tokens as llama.cpp.
    Mt19937,
}

impl std::str::FromStr for RngKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "philox" => Ok(RngKind::Philox),
            "mt19937" => Ok(RngKind::Mt19937),
            _ => Err(Error::parameter("rng", "kind", format!("must be `philox` or `mt19937`, got `{s}`"))),
        }
    }
}

/// Seed and stream of a chain's random draws.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RngConfig {
    /// Generator kind.
    pub kind: RngKind,
    /// The seed. `Mt19937` takes 32-bit seeds only (as llama.cpp).
    pub seed: u64,
    /// Sequence id (Philox only): rows of a batch that must draw independently get different
    /// ids; the same id gives the same draws whatever else is in the batch.
    pub sequence: u32,
}

impl RngConfig {
    /// Philox with this seed, sequence 0.
    pub fn philox(seed: u64) -> Self {
        RngConfig { kind: RngKind::Philox, seed, sequence: 0 }
    }
    /// llama.cpp-compatible MT19937 with this seed.
    pub fn mt19937(seed: u32) -> Self {
        RngConfig { kind: RngKind::Mt19937, seed: seed as u64, sequence: 0 }
    }
    /// The same configuration for another sequence id.
    pub fn with_sequence(self, sequence: u32) -> Self {
        RngConfig { sequence, ..self }
    }
}

/// Which sampler owns a stream; fixed values so a stage's draws do not depend on its position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum Stream {
    Dist = 1,
    Xtc = 2,
    Mirostat = 3,
    MirostatV2 = 4,
    Gumbel = 5,
    TransformersDist = 6,
}

/// The random state of one drawing stage.
#[derive(Clone, Debug)]
pub struct StageRng {
    stream: u32,
    /// Tokens accepted since the last reset.
    step: u32,
    inner: Inner,
}

#[derive(Clone, Debug)]
enum Inner {
    Mt { seed: u32, mt: Box<Mt19937> },
    Philox { seed: u64, sequence: u32, draw: u32 },
}

impl StageRng {
    pub(crate) fn new(config: RngConfig, stream: Stream) -> Result<Self> {
        let inner = match config.kind {
            RngKind::Mt19937 => {
                let seed = u32::try_from(config.seed).map_err(|_| {
                    Error::parameter(
                        "rng",
                        "seed",
                        format!("{} does not fit in 32 bits, which mt19937 (llama.cpp) requires", config.seed),
                    )
                })?;
                Inner::Mt { seed, mt: Box::new(Mt19937::new(seed)) }
            }
            RngKind::Philox => Inner::Philox { seed: config.seed, sequence: config.sequence, draw: 0 },
        };
        Ok(StageRng { stream: stream as u32, step: 0, inner })
    }

    fn philox_block(&self, seed: u64, sequence: u32, index: u32) -> [u32; 4] {
        philox::philox4x32_10([index, self.stream, sequence, self.step], [seed as u32, (seed >> 32) as u32])
    }

    fn next_philox_block(&mut self) -> Option<[u32; 4]> {
        let Inner::Philox { seed, sequence, draw } = self.inner else { return None };
        let b = self.philox_block(seed, sequence, draw);
        if let Inner::Philox { draw, .. } = &mut self.inner {
            *draw = draw.wrapping_add(1);
        }
        Some(b)
    }

    /// One uniform double in [0, 1) (two MT words in `Mt19937` mode).
    pub fn uniform_f64(&mut self) -> f64 {
        if let Inner::Mt { mt, .. } = &mut self.inner {
            return mt.canonical_f64();
        }
        let b = self.next_philox_block().unwrap_or_default();
        philox::unit_f64(b[0], b[1])
    }

    /// One uniform float in [0, 1) (one MT word in `Mt19937` mode).
    pub fn uniform_f32(&mut self) -> f32 {
        if let Inner::Mt { mt, .. } = &mut self.inner {
            return mt.canonical_f32();
        }
        let b = self.next_philox_block().unwrap_or_default();
        philox::unit_f32(b[0])
    }

    /// A uniform double strictly inside (0, 1) for token `token` at the current step, computed
    /// from the counter alone (advances nothing). Gumbel-max uses it so that a token's noise
    /// does not depend on which other candidates are present. In `Mt19937` mode the noise is
    /// still counter-based, keyed by the 32-bit seed (llama.cpp has no Gumbel sampler to match).
    pub fn token_uniform_open(&self, token: u32) -> f64 {
        let (seed, sequence) = match self.inner {
            Inner::Mt { seed, .. } => (seed as u64, 0),
            Inner::Philox { seed, sequence, .. } => (seed, sequence),
        };
        let b = self.philox_block(seed, sequence, token);
        // 53 random bits plus half an ulp keeps the value strictly inside (0, 1).
        philox::unit_f64(b[0], b[1]) + 0.5 / 9007199254740992.0
    }

    /// Called when a token is accepted: the next step's draws start.
    pub fn accept(&mut self) {
        self.step = self.step.wrapping_add(1);
        if let Inner::Philox { draw, .. } = &mut self.inner {
            *draw = 0;
        }
    }

    /// Restarts the stream from the original seed (llama.cpp's `reset`).
    pub fn reset(&mut self) {
        self.step = 0;
        match &mut self.inner {
            Inner::Mt { seed, mt } => **mt = Mt19937::new(*seed),
            Inner::Philox { draw, .. } => *draw = 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_draws_depend_on_seed_sequence_and_step_only() {
        let cfg = RngConfig::philox(7).with_sequence(3);
        let mut a = StageRng::new(cfg, Stream::Dist).unwrap();
        let mut b = StageRng::new(cfg, Stream::Dist).unwrap();
        let first = a.uniform_f64();
        assert_eq!(first, b.uniform_f64());
        a.accept();
        assert_ne!(a.uniform_f64(), first);
        a.reset();
        assert_eq!(a.uniform_f64(), first);
        let mut other_seq = StageRng::new(cfg.with_sequence(4), Stream::Dist).unwrap();
        assert_ne!(other_seq.uniform_f64(), first);
    }

    #[test]
    fn mt_seeds_must_fit_32_bits() {
        let e =
            StageRng::new(RngConfig { kind: RngKind::Mt19937, seed: 1 << 40, sequence: 0 }, Stream::Dist).unwrap_err();
        assert!(e.to_string().contains("32 bits"));
    }

    #[test]
    fn gumbel_noise_changes_with_step_in_both_modes() {
        for cfg in [RngConfig::philox(1), RngConfig::mt19937(1)] {
            let mut r = StageRng::new(cfg, Stream::Gumbel).unwrap();
            let u0 = r.token_uniform_open(5);
            assert!(u0 > 0.0 && u0 < 1.0);
            r.accept();
            assert_ne!(r.token_uniform_open(5), u0);
        }
    }
}
