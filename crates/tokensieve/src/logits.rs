//! Input views: one logits row (`[V]`) or a batch (`[B, V]`) in f32, f16 or bf16, borrowed.

use crate::error::{Error, Result};
use half::{bf16, f16};

/// A borrowed row of logits, one value per token id, in any of the dtypes engines emit.
/// f32 rows are read in place. f16 and bf16 rows are widened to f32 (exactly) into a buffer
/// the chain reuses, in the same pass that summarizes them: no allocation after the first row
/// of a size.
#[derive(Clone, Copy, Debug)]
pub enum Logits<'a> {
    /// 32-bit floats.
    F32(&'a [f32]),
    /// IEEE half precision.
    F16(&'a [f16]),
    /// bfloat16.
    Bf16(&'a [bf16]),
}

impl<'a> From<&'a [f32]> for Logits<'a> {
    fn from(row: &'a [f32]) -> Self {
        Logits::F32(row)
    }
}
impl<'a> From<&'a Vec<f32>> for Logits<'a> {
    fn from(row: &'a Vec<f32>) -> Self {
        Logits::F32(row)
    }
}
impl<'a, const N: usize> From<&'a [f32; N]> for Logits<'a> {
    fn from(row: &'a [f32; N]) -> Self {
        Logits::F32(row)
    }
}
impl<'a> From<&'a [f16]> for Logits<'a> {
    fn from(row: &'a [f16]) -> Self {
        Logits::F16(row)
    }
}
impl<'a> From<&'a [bf16]> for Logits<'a> {
    fn from(row: &'a [bf16]) -> Self {
        Logits::Bf16(row)
    }
}

impl<'a> Logits<'a> {
    /// The vocabulary size V.
    pub fn len(&self) -> usize {
        match self {
            Logits::F32(r) => r.len(),
            Logits::F16(r) => r.len(),
            Logits::Bf16(r) => r.len(),
        }
    }

    /// True for an empty row (which every sampling call rejects).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The logit of token `id`, widened to f32. Panics if `id >= len()`, like slice indexing.
    #[inline]
    pub fn get(&self, id: usize) -> f32 {
        match self {
            Logits::F32(r) => r[id],
            Logits::F16(r) => r[id].to_f32(),
            Logits::Bf16(r) => r[id].to_f32(),
        }
    }

    /// Calls `f(id, logit)` for every token in vocabulary order.
    #[inline]
    pub fn for_each(&self, mut f: impl FnMut(usize, f32)) {
        match self {
            Logits::F32(r) => r.iter().enumerate().for_each(|(i, &v)| f(i, v)),
            Logits::F16(r) => r.iter().enumerate().for_each(|(i, v)| f(i, v.to_f32())),
            Logits::Bf16(r) => r.iter().enumerate().for_each(|(i, v)| f(i, v.to_f32())),
        }
    }

    /// Checks the row: non-empty, and every value finite or `-inf`. NaN and `+inf` are errors
    /// naming the first offending token, because llama.cpp turns them into NaN probabilities
    /// and an arbitrary token.
    pub fn validate(&self) -> Result<()> {
        if self.is_empty() {
            return Err(Error::empty_row());
        }
        let mut bad = None;
        self.for_each(|i, v| {
            if bad.is_none() && (v.is_nan() || v == f32::INFINITY) {
                bad = Some((i, v));
            }
        });
        match bad {
            Some((i, v)) => Err(Error::non_finite_logit(i, v)),
            None => Ok(()),
        }
    }
}

/// A borrowed `[B, V]` batch of logits in row-major (C) order.
#[derive(Clone, Copy, Debug)]
pub struct LogitsBatch<'a> {
    data: Logits<'a>,
    rows: usize,
    vocab: usize,
}

impl<'a> LogitsBatch<'a> {
    /// Views `data` as `rows` rows of `vocab` logits each.
    pub fn new(data: impl Into<Logits<'a>>, rows: usize, vocab: usize) -> Result<Self> {
        let data = data.into();
        if vocab == 0 {
            return Err(Error::empty_row());
        }
        if rows.checked_mul(vocab) != Some(data.len()) {
            return Err(Error::invalid(format!(
                "batch of {rows} rows x {vocab} tokens needs {} values, got {}",
                rows.saturating_mul(vocab),
                data.len()
            )));
        }
        Ok(LogitsBatch { data, rows, vocab })
    }

    /// Number of rows B.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Vocabulary size V.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Row `i` (panics if `i >= rows()`).
    pub fn row(&self, i: usize) -> Logits<'a> {
        let r = i * self.vocab..(i + 1) * self.vocab;
        match self.data {
            Logits::F32(d) => Logits::F32(&d[r]),
            Logits::F16(d) => Logits::F16(&d[r]),
            Logits::Bf16(d) => Logits::Bf16(&d[r]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_nan_and_positive_infinity_naming_the_token() {
        let e = Logits::from(&[0.0f32, f32::NAN][..]).validate().unwrap_err();
        assert!(e.to_string().contains("token 1"), "{e}");
        let e = Logits::from(&[f32::INFINITY, 0.0][..]).validate().unwrap_err();
        assert!(e.to_string().contains("token 0"), "{e}");
        assert!(Logits::from(&[f32::NEG_INFINITY, 1.0][..]).validate().is_ok());
    }

    #[test]
    fn rejects_empty_rows() {
        let e = Logits::from(&[][..] as &[f32]).validate().unwrap_err();
        assert!(e.to_string().contains("empty"));
    }

    #[test]
    fn widens_half_precision() {
        let h = [f16::from_f32(1.5), f16::from_f32(-2.0)];
        let b = [bf16::from_f32(0.25)];
        assert_eq!(Logits::from(&h[..]).get(1), -2.0);
        assert_eq!(Logits::from(&b[..]).get(0), 0.25);
    }

    #[test]
    fn batch_shape_is_checked() {
        let d = [0.0f32; 6];
        assert!(LogitsBatch::new(&d[..], 2, 3).is_ok());
        assert!(LogitsBatch::new(&d[..], 4, 2).is_err());
        let b = LogitsBatch::new(&d[..], 3, 2).unwrap();
        assert_eq!(b.row(2).len(), 2);
    }
}
