//! Counted repetition (`minItems`/`maxItems`, `minLength`/`maxLength`, regex `{m,n}`) and
//! integer ranges (`minimum`/`maximum`) written as GBNF, in llama.cpp's exact spelling.

use crate::error::{Error, Result};

/// `item` repeated between `min` and `max` times (`None`: no upper bound), each repetition
/// after the first preceded by `separator` when one is given.
///
/// The spelling follows llama.cpp: `x?`, `x+`, `x*`, `x{m,n}`, `x{m,}`, an empty string for
/// `max == 0`, and with a separator `x (sep x){m-1,n-1}`, wrapped in `( … )?` when `min == 0`.
pub(crate) fn repetition(item: &str, min: u64, max: Option<u64>, separator: Option<&str>) -> String {
    if max == Some(0) {
        return String::new();
    }
    if min == 0 && max == Some(1) {
        return format!("{item}?");
    }
    let Some(separator) = separator else {
        return match (min, max) {
            (1, None) => format!("{item}+"),
            (0, None) => format!("{item}*"),
            (min, None) => format!("{item}{{{min},}}"),
            (min, Some(max)) => format!("{item}{{{min},{max}}}"),
        };
    };
    let rest =
        repetition(&format!("({separator} {item})"), min.saturating_sub(1), max.map(|m| m.saturating_sub(1)), None);
    let sequence = format!("{item} {rest}");
    if min == 0 {
        format!("({sequence})?")
    } else {
        sequence
    }
}

/// Decimal digits a bounded integer may spend, as llama.cpp allows (`[0-9]{0,15}` after the
/// leading digit).
const DECIMALS: u32 = 16;

/// GBNF for the integers in `[min, max]` (either bound may be absent), without the
/// surrounding parentheses and `space`.
///
/// The shape of the output is llama.cpp's: a negative part `"-" ( … )`, then for each decimal
/// length a run of digit classes. Reproducing it byte for byte is the point, including its
/// quirks when `min > max` (the result is then not the empty set). `i64::MIN` as a minimum and
/// `i64::MAX` as a maximum count as "no bound", as they do in llama.cpp.
pub(crate) fn integer_range(min: Option<i64>, max: Option<i64>) -> Result<String> {
    let min = min.filter(|&m| m != i64::MIN);
    let max = max.filter(|&m| m != i64::MAX);
    let mut w = RangeWriter { out: String::new() };
    w.range(min, max, DECIMALS, true)?;
    Ok(w.out)
}

struct RangeWriter {
    out: String,
}

fn negate(v: i64) -> Result<i64> {
    v.checked_neg().ok_or_else(|| Error::schema(format!("integer bound {v} is out of range")))
}

/// Turns a bound produced by negation back into "absent" when it hits the sentinel, as
/// llama.cpp's int64 sentinels do.
fn bound(v: i64, sentinel: i64) -> Option<i64> {
    (v != sentinel).then_some(v)
}

impl RangeWriter {
    fn push(&mut self, s: &str) {
        self.out.push_str(s);
    }

    fn digit_range(&mut self, from: u8, to: u8) {
        self.out.push('[');
        self.out.push(from as char);
        if from != to {
            self.out.push('-');
            self.out.push(to as char);
        }
        self.out.push(']');
    }

    /// `[0-9]`, `[0-9]{n}` or `[0-9]{m,n}`.
    fn more_digits(&mut self, min_digits: i64, max_digits: i64) {
        self.push("[0-9]");
        if min_digits == max_digits && min_digits == 1 {
            return;
        }
        self.push(&format!("{{{min_digits}"));
        if max_digits != min_digits {
            self.push(",");
            if max_digits != i64::from(i32::MAX) {
                self.push(&max_digits.to_string());
            }
        }
        self.push("}");
    }

    /// All decimal strings of `from.len()` digits between `from` and `to` (same length in
    /// every call llama.cpp makes; other inputs are handled without panicking).
    fn uniform_range(&mut self, from: &[u8], to: &[u8]) {
        let mut i = 0;
        while i < from.len() && i < to.len() && from[i] == to[i] {
            i += 1;
        }
        if i > 0 {
            self.push("\"");
            self.push(&String::from_utf8_lossy(&from[..i]));
            self.push("\"");
        }
        let (Some(&f), Some(&t)) = (from.get(i), to.get(i)) else {
            return;
        };
        if i > 0 {
            self.push(" ");
        }
        let sub_len = from.len() - i - 1;
        if sub_len == 0 {
            // Always a two-ended class here, even for equal digits (llama.cpp does the same).
            self.push(&format!("[{}-{}]", f as char, t as char));
            return;
        }
        let from_sub = &from[i + 1..];
        let to_sub = to.get(i + 1..).unwrap_or(&[]);
        let zeros = vec![b'0'; sub_len];
        let nines = vec![b'9'; sub_len];
        let mut to_reached = false;
        self.push("(");
        if from_sub == zeros.as_slice() {
            self.digit_range(f, t.wrapping_sub(1));
            self.push(" ");
            self.more_digits(sub_len as i64, sub_len as i64);
        } else {
            self.push(&format!("[{}] (", f as char));
            self.uniform_range(from_sub, &nines);
            self.push(")");
            if f < t.wrapping_sub(1) {
                self.push(" | ");
                if to_sub == nines.as_slice() {
                    self.digit_range(f + 1, t);
                    to_reached = true;
                } else {
                    self.digit_range(f + 1, t.wrapping_sub(1));
                }
                self.push(" ");
                self.more_digits(sub_len as i64, sub_len as i64);
            }
        }
        if !to_reached {
            self.push(" | ");
            self.digit_range(t, t);
            self.push(" ");
            self.uniform_range(&zeros, to_sub);
        }
        self.push(")");
    }

    fn range(&mut self, min: Option<i64>, max: Option<i64>, decimals_left: u32, top_level: bool) -> Result<()> {
        let decimals = i64::from(decimals_left);
        let less_decimals = (decimals - 1).max(1);
        match (min, max) {
            (Some(mut min), Some(max)) => {
                if min < 0 && max < 0 {
                    self.push("\"-\" (");
                    self.range(bound(negate(max)?, i64::MIN), bound(negate(min)?, i64::MAX), decimals_left, true)?;
                    self.push(")");
                    return Ok(());
                }
                if min < 0 {
                    self.push("\"-\" (");
                    self.range(Some(0), bound(negate(min)?, i64::MAX), decimals_left, true)?;
                    self.push(") | ");
                    min = 0;
                }
                let mut min_s = min.to_string().into_bytes();
                let max_s = max.to_string().into_bytes();
                for digits in min_s.len()..max_s.len() {
                    self.uniform_range(&min_s, &vec![b'9'; digits]);
                    min_s = std::iter::once(b'1').chain(std::iter::repeat_n(b'0', digits)).collect();
                    self.push(" | ");
                }
                self.uniform_range(&min_s, &max_s);
                Ok(())
            }
            (Some(min), None) => {
                if min < 0 {
                    self.push("\"-\" (");
                    self.range(None, bound(negate(min)?, i64::MAX), decimals_left, false)?;
                    self.push(") | [0] | [1-9] ");
                    self.more_digits(0, decimals - 1);
                } else if min == 0 {
                    if top_level {
                        self.push("[0] | [1-9] ");
                        self.more_digits(0, less_decimals);
                    } else {
                        self.more_digits(1, decimals);
                    }
                } else if min <= 9 {
                    let c = b'0' + min as u8;
                    let range_start = if top_level { b'1' } else { b'0' };
                    if c > range_start {
                        self.digit_range(range_start, c - 1);
                        self.push(" ");
                        self.more_digits(1, less_decimals);
                        self.push(" | ");
                    }
                    self.digit_range(c, b'9');
                    self.push(" ");
                    self.more_digits(0, less_decimals);
                } else {
                    let min_s = min.to_string();
                    let len = min_s.len() as i64;
                    let c = min_s.as_bytes()[0];
                    if c > b'1' {
                        self.digit_range(if top_level { b'1' } else { b'0' }, c - 1);
                        self.push(" ");
                        self.more_digits(len, less_decimals);
                        self.push(" | ");
                    }
                    self.digit_range(c, c);
                    self.push(" (");
                    // The digits after the first, as a number ("205" -> 5).
                    let rest: i64 = min_s[1..].parse().unwrap_or(0);
                    self.range(Some(rest), None, less_decimals as u32, false)?;
                    self.push(")");
                    if c < b'9' {
                        self.push(" | ");
                        self.digit_range(c + 1, b'9');
                        self.push(" ");
                        self.more_digits(len - 1, less_decimals);
                    }
                }
                Ok(())
            }
            (None, Some(max)) => {
                if max >= 0 {
                    if top_level {
                        self.push("\"-\" [1-9] ");
                        self.more_digits(0, less_decimals);
                        self.push(" | ");
                    }
                    self.range(Some(0), Some(max), decimals_left, true)
                } else {
                    self.push("\"-\" (");
                    self.range(bound(negate(max)?, i64::MIN), None, decimals_left, false)?;
                    self.push(")");
                    Ok(())
                }
            }
            (None, None) => Err(Error::schema("an integer range needs a minimum or a maximum")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repetition_spellings() {
        assert_eq!(repetition("x", 0, Some(0), None), "");
        assert_eq!(repetition("x", 0, Some(1), None), "x?");
        assert_eq!(repetition("x", 1, None, None), "x+");
        assert_eq!(repetition("x", 0, None, None), "x*");
        assert_eq!(repetition("x", 3, None, None), "x{3,}");
        assert_eq!(repetition("x", 3, Some(3), None), "x{3,3}");
        assert_eq!(repetition("x", 0, Some(2), Some("\",\" space")), "(x (\",\" space x)?)?");
        assert_eq!(repetition("x", 3, Some(5), Some("\",\" space")), "x (\",\" space x){2,4}");
    }

    #[test]
    fn ranges() {
        let r = |min, max| integer_range(min, max).unwrap();
        assert_eq!(r(Some(0), None), "[0] | [1-9] [0-9]{0,15}");
        assert_eq!(
            r(Some(25), None),
            "[1] [0-9]{2,15} | [2] ([0-4] [0-9]{1,14} | [5-9] [0-9]{0,14}) | [3-9] [0-9]{1,15}"
        );
        assert_eq!(r(Some(-10), Some(10)), "\"-\" ([0-9] | \"10\") | [0-9] | \"10\"");
        assert_eq!(r(None, Some(-5)), "\"-\" ([0-4] [0-9]{1,15} | [5-9] [0-9]{0,15})");
        assert!(integer_range(None, None).is_err());
        // Extremes do not overflow. -(i64::MIN + 1) is i64::MAX, llama.cpp's "no bound", which
        // leaves the negative part without bounds: llama.cpp throws there, and so do we.
        assert!(integer_range(Some(i64::MIN + 1), None).is_err());
        assert!(integer_range(None, Some(i64::MIN + 1)).is_ok());
        assert!(integer_range(Some(i64::MIN + 1), Some(i64::MAX - 1)).is_ok());
        assert!(integer_range(Some(30), Some(5)).is_ok());
    }
}
