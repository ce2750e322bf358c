//! `pattern`: the regular expressions llama.cpp converts, as one GBNF rule body.

use super::text::{literal, repetition};

pub(super) enum PatternError {
    /// A valid expression with no grammar equivalent here.
    Unsupported(&'static str),
    Invalid(&'static str),
}

/// Characters a regular expression escapes that are plain in a GBNF literal.
const REGEX_ONLY_ESCAPES: &str = "^$.[]()|{}*+?";

/// The length of a GBNF escape (`\x41`, `\n`, ...) at the start of `s`, or 0.
fn gbnf_escape_len(s: &[u8]) -> usize {
    if s.len() < 2 || s[0] != b'\\' {
        return 0;
    }
    let hex = match s[1] {
        b'x' => 2,
        b'u' => 4,
        b'U' => 8,
        b't' | b'r' | b'n' | b'\\' | b'"' | b'[' | b']' | b'-' => return 2,
        _ => return 0,
    };
    match s.get(2..2 + hex) {
        Some(h) if h.iter().all(u8::is_ascii_hexdigit) => 2 + hex,
        _ => 0,
    }
}

/// The GBNF for the content of a JSON string matching `pattern` (which must be anchored
/// with `^` and `$`).
pub(super) fn pattern_rule(pattern: &str) -> Result<String, PatternError> {
    let inner = pattern
        .strip_prefix('^')
        .and_then(|p| p.strip_suffix('$'))
        .ok_or(PatternError::Unsupported("not anchored with '^' and '$'"))?;
    let b = inner.as_bytes();
    let mut i = 0;
    let mut depth = 0usize;
    // Each open group's terms; a term is one GBNF item a quantifier may follow.
    let mut groups: Vec<Vec<String>> = vec![Vec::new()];
    // What the last term carries: 0 no quantifier, 1 a quantifier, 2 a quantifier made
    // lazy (`*?`). As in ECMAScript, a quantifier cannot follow another (`a{2}*`, `a**`),
    // and laziness does not change what matches.
    let mut quantified = 0u8;
    while i < b.len() {
        let terms = groups.last_mut().expect("the outer group");
        let was = std::mem::take(&mut quantified);
        if matches!(b[i], b'*' | b'+' | b'?' | b'{') && was != 0 {
            if b[i] == b'?' && was == 1 {
                quantified = 2;
                i += 1;
                continue;
            }
            return Err(PatternError::Invalid(
                "nothing to repeat: a quantifier follows a quantifier",
            ));
        }
        match b[i] {
            b'.' => {
                terms.push(r"[^\x0A\x0D]".into());
                i += 1;
            }
            b'(' => {
                i += 1;
                if b.get(i) == Some(&b'?') {
                    if b.get(i + 1) != Some(&b':') {
                        return Err(PatternError::Unsupported(
                            "lookaround, named group or flags",
                        ));
                    }
                    i += 2;
                }
                depth += 1;
                if depth > 100 {
                    return Err(PatternError::Unsupported("pattern nesting too deep"));
                }
                groups.push(Vec::new());
            }
            b')' => {
                if depth == 0 {
                    return Err(PatternError::Invalid("unbalanced parentheses"));
                }
                depth -= 1;
                i += 1;
                let body = groups.pop().expect("an open group").join(" ");
                groups
                    .last_mut()
                    .expect("the outer group")
                    .push(format!("({body})"));
            }
            b'^' | b'$' => return Err(PatternError::Unsupported("anchor inside the pattern")),
            b'[' => {
                let start = i;
                i += 1;
                while i < b.len() && b[i] != b']' {
                    if b[i] == b'\\' {
                        let n = gbnf_escape_len(&b[i..]);
                        if n == 0 {
                            return Err(PatternError::Unsupported(
                                "an escape in a character class that GBNF lacks",
                            ));
                        }
                        i += n;
                    } else {
                        i += 1;
                    }
                }
                if i >= b.len() {
                    return Err(PatternError::Invalid("unterminated character class"));
                }
                i += 1;
                match &inner[start..i] {
                    // ECMAScript's class of no character matches nothing; GBNF has none.
                    "[]" => {
                        return Err(PatternError::Invalid(
                            "an empty character class [] matches nothing",
                        ))
                    }
                    // Its negation matches any character.
                    "[^]" => terms.push(".".into()),
                    class => terms.push(class.to_string()),
                }
            }
            b'|' => {
                terms.push("|".into());
                i += 1;
            }
            q @ (b'*' | b'+' | b'?') => {
                let last = terms.last_mut().filter(|t| *t != "|");
                let Some(last) = last else {
                    return Err(PatternError::Invalid("nothing to repeat"));
                };
                last.push(q as char);
                i += 1;
                quantified = 1;
            }
            b'{' => {
                let end = (inner[i..].find('}'))
                    .ok_or(PatternError::Unsupported("unterminated curly brackets"))?;
                let spec = &inner[i + 1..i + end];
                i += end + 1;
                let num = |s: &str| s.trim().parse::<usize>();
                let (lo, hi) = match spec.split_once(',') {
                    None => {
                        let n = num(spec).map_err(|_| {
                            PatternError::Unsupported("invalid number in curly brackets")
                        })?;
                        (n, Some(n))
                    }
                    Some((a, c)) => {
                        let lo = if a.is_empty() { Ok(0) } else { num(a) };
                        let hi = if c.is_empty() { None } else { Some(num(c)) };
                        let lo = lo.map_err(|_| {
                            PatternError::Unsupported("invalid number in curly brackets")
                        })?;
                        let hi = hi.transpose().map_err(|_| {
                            PatternError::Unsupported("invalid number in curly brackets")
                        })?;
                        (lo, hi)
                    }
                };
                let Some(last) = terms.last_mut().filter(|t| *t != "|") else {
                    return Err(PatternError::Invalid("nothing to repeat"));
                };
                *last = repetition(&format!("({last})"), lo, hi, "");
                quantified = 1;
            }
            b'\\' => {
                let Some(&next) = b.get(i + 1) else {
                    return Err(PatternError::Invalid("trailing backslash"));
                };
                if REGEX_ONLY_ESCAPES.as_bytes().contains(&next) {
                    terms.push(literal(&(next as char).to_string()));
                    i += 2;
                } else {
                    let n = gbnf_escape_len(&b[i..]);
                    if n == 0 {
                        return Err(PatternError::Unsupported(
                            "an escape GBNF lacks (such as \\d or \\w)",
                        ));
                    }
                    terms.push(format!("\"{}\"", &inner[i..i + n]));
                    i += n;
                }
            }
            b']' | b'}' => return Err(PatternError::Unsupported("a stray ']' or '}'")),
            _ => {
                let c = inner[i..].chars().next().expect("a character");
                terms.push(literal(&c.to_string()));
                i += c.len_utf8();
            }
        }
    }
    if depth != 0 {
        return Err(PatternError::Invalid("unbalanced parentheses"));
    }
    Ok(groups.pop().expect("the outer group").join(" "))
}
