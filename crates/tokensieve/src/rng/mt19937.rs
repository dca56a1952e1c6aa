//! 32-bit Mersenne Twister (`std::mt19937`) and the way GCC's libstdc++ turns its words into
//! floating-point draws. This is what llama.cpp's samplers use, so reproducing it (with the
//! same seed) reproduces llama.cpp's token stream.

/// `std::mt19937` seeded like `std::mt19937(seed)` (the standard `init_genrand`).
#[derive(Clone)]
pub struct Mt19937 {
    state: [u32; N],
    index: usize,
}

const N: usize = 624;
const M: usize = 397;

impl std::fmt::Debug for Mt19937 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mt19937").field("index", &self.index).finish_non_exhaustive()
    }
}

impl Mt19937 {
    /// Seeds the generator; equivalent to `std::mt19937 rng(seed)` or `rng.seed(seed)`.
    pub fn new(seed: u32) -> Self {
        let mut state = [0u32; N];
        state[0] = seed;
        for i in 1..N {
            state[i] = 1812433253u32.wrapping_mul(state[i - 1] ^ (state[i - 1] >> 30)).wrapping_add(i as u32);
        }
        Mt19937 { state, index: N }
    }

    fn twist(&mut self) {
        for i in 0..N {
            let y = (self.state[i] & 0x8000_0000) | (self.state[(i + 1) % N] & 0x7fff_ffff);
            let mut v = self.state[(i + M) % N] ^ (y >> 1);
            if y & 1 != 0 {
                v ^= 0x9908_b0df;
            }
            self.state[i] = v;
        }
        self.index = 0;
    }

    /// The next 32-bit output.
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            self.twist();
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^= y >> 18;
        y
    }

    /// libstdc++'s `generate_canonical<double, 53>`: two words `a`, `b`,
    /// `(a + b * 2^32) / 2^64` in double, clamped just below 1. This is what
    /// `uniform_real_distribution<double>(0, 1)` returns.
    pub fn canonical_f64(&mut self) -> f64 {
        let a = self.next_u32() as f64;
        let b = self.next_u32() as f64;
        let r = (a + b * 4294967296.0) / 18446744073709551616.0;
        if r >= 1.0 {
            1.0f64.next_down_compat()
        } else {
            r
        }
    }

    /// libstdc++'s `generate_canonical<float, 24>`: one word, converted to float, divided by
    /// 2^32 in float, clamped just below 1 (`uniform_real_distribution<float>(0, 1)`).
    pub fn canonical_f32(&mut self) -> f32 {
        let a = self.next_u32() as f32;
        let r = a / 4294967296.0f32;
        if r >= 1.0 {
            f32::from_bits(1.0f32.to_bits() - 1)
        } else {
            r
        }
    }
}

trait NextDown {
    fn next_down_compat(self) -> Self;
}
impl NextDown for f64 {
    fn next_down_compat(self) -> f64 {
        f64::from_bits(self.to_bits() - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_standard_10000th_output() {
        // C++11 [rand.predef]: the 10000th consecutive invocation of a default-constructed
        // mt19937 (seed 5489) produces 4123659995.
        let mut r = Mt19937::new(5489);
        let mut v = 0;
        for _ in 0..10000 {
            v = r.next_u32();
        }
        assert_eq!(v, 4123659995);
    }

    #[test]
    fn canonical_draws_use_two_words_for_double_and_one_for_float() {
        let mut a = Mt19937::new(42);
        let mut b = Mt19937::new(42);
        let w0 = b.next_u32() as f64;
        let w1 = b.next_u32() as f64;
        assert_eq!(a.canonical_f64(), (w0 + w1 * 4294967296.0) / 18446744073709551616.0);
        let w2 = b.next_u32();
        assert_eq!(a.canonical_f32(), w2 as f32 / 4294967296.0);
        assert_eq!(a.next_u32(), b.next_u32());
    }

    #[test]
    fn float_draw_is_clamped_below_one() {
        // u32::MAX rounds to 2^32 in f32, so the quotient would be exactly 1.
        let r = u32::MAX as f32 / 4294967296.0f32;
        assert_eq!(r, 1.0);
        assert!(f32::from_bits(1.0f32.to_bits() - 1) < 1.0);
    }
}
