//! Integer ranges (`minimum` / `maximum`) as GBNF alternations of digit classes.

use crate::grammar::GrammarError;

/// The canonical decimal integers from `min` to `max` (a missing bound: up to 16 digits
/// on that side), as a GBNF alternation.
pub(super) fn int_range(min: Option<i64>, max: Option<i64>) -> Result<String, GrammarError> {
    const WIDEST: u64 = 9_999_999_999_999_999; // 16 digits
    let neg = |lo: u64, hi: u64| format!("\"-\" ({})", naturals(lo, hi));
    Ok(match (min, max) {
        (Some(lo), Some(hi)) if lo > hi => {
            return Err(GrammarError::Schema(format!(
                "minimum {lo} is greater than maximum {hi}: no integer fits"
            )))
        }
        (Some(lo), Some(hi)) if hi < 0 => neg(hi.unsigned_abs(), lo.unsigned_abs()),
        (Some(lo), Some(hi)) if lo < 0 => {
            format!("{} | {}", neg(1, lo.unsigned_abs()), naturals(0, hi as u64))
        }
        (Some(lo), Some(hi)) => naturals(lo as u64, hi as u64),
        (Some(lo), None) if lo < 0 => {
            format!("{} | {}", neg(1, lo.unsigned_abs()), naturals(0, WIDEST))
        }
        (Some(lo), None) => naturals((lo as u64).min(WIDEST), WIDEST),
        (None, Some(hi)) if hi < 0 => neg(hi.unsigned_abs().min(WIDEST), WIDEST),
        (None, Some(hi)) => format!("{} | {}", neg(1, WIDEST), naturals(0, hi as u64)),
        (None, None) => naturals(0, WIDEST),
    })
}

/// The numbers `lo..=hi` (`lo <= hi`) written without leading zeros.
fn naturals(lo: u64, hi: u64) -> String {
    let mut alts = Vec::new();
    let (lo_s, hi_s) = (lo.to_string(), hi.to_string());
    for len in lo_s.len()..=hi_s.len() {
        let first = if len == 1 {
            0
        } else {
            10u64.pow(len as u32 - 1)
        };
        let last = 10u64.saturating_pow(len as u32).saturating_sub(1);
        let a = lo.max(first);
        let b = hi.min(last);
        if a <= b {
            alts.push(same_length(&a.to_string(), &b.to_string()));
        }
    }
    alts.join(" | ")
}

/// The digit strings of one length from `a` to `b` (`a <= b`).
fn same_length(a: &str, b: &str) -> String {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let mut out = String::new();
    if common > 0 {
        out.push_str(&format!(
            "\"{}\"",
            std::str::from_utf8(&a[..common]).unwrap_or("")
        ));
    }
    if common == a.len() {
        return out;
    }
    if !out.is_empty() {
        out.push(' ');
    }
    let (x, y) = (a[common], b[common]);
    let rest = a.len() - common - 1;
    if rest == 0 {
        out.push_str(&format!("[{}-{}]", x as char, y as char));
        return out;
    }
    let a_rest = std::str::from_utf8(&a[common + 1..]).unwrap_or("");
    let b_rest = std::str::from_utf8(&b[common + 1..]).unwrap_or("");
    let zeros = "0".repeat(rest);
    let nines = "9".repeat(rest);
    let any = |n: usize| {
        if n == 1 {
            "[0-9]".to_string()
        } else {
            format!("[0-9]{{{n}}}")
        }
    };
    let mut alts = Vec::new();
    // From a: the first digit as in a, the rest from a's rest up.
    let (low_digit, high_digit);
    if a_rest == zeros {
        low_digit = x;
    } else {
        alts.push(format!("[{}] ({})", x as char, same_length(a_rest, &nines)));
        low_digit = x + 1;
    }
    if b_rest == nines {
        high_digit = y;
    } else {
        high_digit = y - 1;
    }
    if low_digit <= high_digit {
        alts.push(format!(
            "[{}-{}] {}",
            low_digit as char,
            high_digit as char,
            any(rest)
        ));
    }
    if b_rest != nines {
        alts.push(format!("[{}] ({})", y as char, same_length(&zeros, b_rest)));
    }
    out.push_str(&format!("({})", alts.join(" | ")));
    out
}
