//! Pieces of GBNF text (literals, set characters, repetitions, rule names) that the rule
//! writer and the pattern converter both produce.

/// `item` repeated `min` to `max` (None: unbounded) times, `sep` between repetitions.
pub(super) fn repetition(item: &str, min: usize, max: Option<usize>, sep: &str) -> String {
    if max == Some(0) {
        return String::new();
    }
    if min == 0 && max == Some(1) {
        return format!("{item}?");
    }
    if sep.is_empty() {
        return match (min, max) {
            (1, None) => format!("{item}+"),
            (0, None) => format!("{item}*"),
            (lo, Some(hi)) => format!("{item}{{{lo},{hi}}}"),
            (lo, None) => format!("{item}{{{lo},}}"),
        };
    }
    let rest = repetition(
        &format!("({sep} {item})"),
        min.saturating_sub(1),
        max.map(|m| m - 1),
        "",
    );
    let r = format!("{item} {rest}");
    if min == 0 {
        format!("({r})?")
    } else {
        r
    }
}

/// A GBNF string literal.
pub(super) fn literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '\r' => out.push_str("\\r"),
            '\n' => out.push_str("\\n"),
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// One character inside a GBNF `[...]` set.
pub(super) fn set_char(c: char) -> String {
    match c {
        '\\' | ']' | '-' | '"' | '^' | '[' => format!("\\x{:02X}", c as u32),
        '\r' => "\\r".into(),
        '\n' => "\\n".into(),
        '\t' => "\\t".into(),
        c => c.to_string(),
    }
}

/// A rule name made from a property or definition name: each run of characters a GBNF
/// name cannot hold becomes one `-`.
pub(super) fn rule_name(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut in_bad = false;
    for c in s.chars() {
        if c.is_ascii_alphanumeric() || c == '-' {
            out.push(c);
            in_bad = false;
        } else if !in_bad {
            out.push('-');
            in_bad = true;
        }
    }
    out
}
