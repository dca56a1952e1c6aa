//! Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
//! counter-based generator. Output = a keyed bijection of a 128-bit counter, so any draw can be
//! computed directly from (seed, sequence, step, index) with no state to carry, which is what
//! makes sampling independent of batch composition and thread count.

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

#[inline]
fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let p = a as u64 * b as u64;
    ((p >> 32) as u32, p as u32)
}

/// Philox4x32 with 10 rounds: maps a 128-bit counter under a 64-bit key to 128 random bits.
#[inline]
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut c = counter;
    let mut k = key;
    for round in 0..10 {
        if round > 0 {
            k[0] = k[0].wrapping_add(W0);
            k[1] = k[1].wrapping_add(W1);
        }
        let (hi0, lo0) = mulhilo(M0, c[0]);
        let (hi1, lo1) = mulhilo(M1, c[2]);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// Uniform double in [0, 1) from two 32-bit words (53 random bits).
#[inline]
pub fn unit_f64(hi: u32, lo: u32) -> f64 {
    let bits = ((hi as u64) << 32 | lo as u64) >> 11;
    bits as f64 * (1.0 / 9007199254740992.0)
}

/// Uniform float in [0, 1) from one 32-bit word (24 random bits).
#[inline]
pub fn unit_f32(w: u32) -> f32 {
    (w >> 8) as f32 * (1.0 / 16777216.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Known-answer vectors published with Random123 (kat_vectors, philox4x32 R=10).
    #[test]
    fn known_answers() {
        assert_eq!(philox4x32_10([0; 4], [0; 2]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
        assert_eq!(philox4x32_10([u32::MAX; 4], [u32::MAX; 2]), [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]);
        assert_eq!(
            philox4x32_10([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0]),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn unit_draws_stay_in_range() {
        assert_eq!(unit_f64(0, 0), 0.0);
        assert!(unit_f64(u32::MAX, u32::MAX) < 1.0);
        assert!(unit_f32(u32::MAX) < 1.0);
    }
}
