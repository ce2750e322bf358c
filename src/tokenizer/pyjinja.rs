//! The parts of Python's Jinja2, as Hugging Face sets it up for chat templates, that
//! minijinja does differently out of the box: how values print (`True`, `None`, Python
//! reprs of lists and dicts), `tojson` (Python's `json.dumps`, not HTML-safe JSON) and
//! `strftime_now`. Chat templates were written against Python; a byte of difference in
//! the prompt is a different prompt for the model.

use std::fmt::Write as _;

use minijinja::value::{from_args, Rest, ValueKind, ValueOrKwargs};
use minijinja::{Error, ErrorKind, State, Value};

/// Python's `str(value)`, as Jinja2 prints `{{ value }}`. Undefined prints nothing.
pub(crate) fn py_str(v: &Value) -> String {
    match v.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::String => v.as_str().unwrap_or_default().to_string(),
        _ => py_repr(v),
    }
}

/// Python's `repr(value)`: what `str()` of a list or dict shows for its items.
pub(crate) fn py_repr(v: &Value) -> String {
    let mut out = String::new();
    write_repr(&mut out, v);
    out
}

fn write_repr(out: &mut String, v: &Value) {
    match v.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::Number => out.push_str(&py_number(v)),
        ValueKind::String => write_str_repr(out, v.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            let tuple = v.is_tuple();
            out.push(if tuple { '(' } else { '[' });
            let mut n = 0;
            if let Ok(it) = v.try_iter() {
                for (i, item) in it.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_repr(out, &item);
                    n += 1;
                }
            }
            if tuple && n == 1 {
                out.push(',');
            }
            out.push(if tuple { ')' } else { ']' });
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(it) = v.try_iter() {
                for (i, key) in it.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_repr(out, &key);
                    out.push_str(": ");
                    write_repr(out, &v.get_item(&key).unwrap_or_default());
                }
            }
            out.push('}');
        }
        _ => out.push_str(&v.to_string()),
    }
}

/// Python's string repr: single quotes unless the text has a single quote and no
/// double one; backslash escapes for quotes, `\\`, `\n`, `\r`, `\t` and other
/// unprintable characters.
fn write_str_repr(out: &mut String, s: &str) {
    let q = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..0xa0).contains(&(c as u32)) => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(q);
}

/// A number as Python prints it: integers plainly, floats by `repr` (shortest
/// round-trip digits, always with a `.0` or an exponent, `e+16`/`e-05` style exponents).
pub(crate) fn py_number(v: &Value) -> String {
    if v.is_integer() {
        return v.to_string();
    }
    let x = f64::try_from(v.clone()).unwrap_or(f64::NAN);
    py_float(x, "inf", "nan")
}

fn py_float(x: f64, inf: &str, nan: &str) -> String {
    if x.is_nan() {
        return nan.to_string();
    }
    if x.is_infinite() {
        return if x > 0.0 {
            inf.to_string()
        } else {
            format!("-{inf}")
        };
    }
    // Rust's `{:e}` gives the shortest round-trip digits, as Python's repr does; only the
    // layout differs.
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let body = if point <= 0 {
            format!("0.{}{}", "0".repeat((-point) as usize), digits)
        } else if point as usize >= digits.len() {
            format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
        } else {
            format!(
                "{}.{}",
                &digits[..point as usize],
                &digits[point as usize..]
            )
        };
        format!("{sign}{body}")
    } else {
        let m = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{m}e{esign}{:02}", exp.abs())
    }
}

/// The options of Python's `json.dumps` that Hugging Face's `tojson` passes on.
struct JsonStyle {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

/// Hugging Face's `tojson` filter: `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, so non-ASCII text stays as it is, nothing is
/// HTML-escaped and the separators are Python's `", "` and `": "` (`","` between items
/// once an indent is given). Its arguments may come by position in that order, or by
/// name.
pub(crate) fn tojson(value: &Value, args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    let mut ensure_ascii = Value::from(false);
    let mut indent = Value::from(());
    let mut separators = Value::from(());
    let mut sort_keys = Value::from(false);
    let mut positional = 0;
    for a in args.iter().map(|a| &**a) {
        if a.is_kwargs() {
            for key in a.try_iter()? {
                let v = a.get_item(&key)?;
                match key.as_str().unwrap_or_default() {
                    "ensure_ascii" => ensure_ascii = v,
                    "indent" => indent = v,
                    "separators" => separators = v,
                    "sort_keys" => sort_keys = v,
                    other => {
                        return Err(Error::new(
                            ErrorKind::TooManyArguments,
                            format!("tojson() got an unexpected keyword argument '{other}'"),
                        ))
                    }
                }
            }
            continue;
        }
        match positional {
            0 => ensure_ascii = a.clone(),
            1 => indent = a.clone(),
            2 => separators = a.clone(),
            3 => sort_keys = a.clone(),
            _ => return Err(Error::from(ErrorKind::TooManyArguments)),
        }
        positional += 1;
    }
    // json.dumps: an int indent is that many spaces, a string is used as it is.
    let indent = match indent.kind() {
        ValueKind::None | ValueKind::Undefined => None,
        ValueKind::String => Some(indent.as_str().unwrap_or_default().to_string()),
        _ => {
            let n = indent.as_i64().unwrap_or(0).max(0) as usize;
            if n > MAX_INDENT {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: an indent of {n} (at most {MAX_INDENT} is taken)"),
                ));
            }
            Some(" ".repeat(n))
        }
    };
    if indent.as_ref().is_some_and(|i| i.len() > MAX_INDENT) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: an indent string over {MAX_INDENT} bytes"),
        ));
    }
    let (item_sep, key_sep) = if separators.is_none() || separators.is_undefined() {
        (
            if indent.is_some() { "," } else { ", " }.to_string(),
            ": ".to_string(),
        )
    } else {
        let a = separators.get_item_by_index(0)?;
        let b = separators.get_item_by_index(1)?;
        (
            a.as_str().unwrap_or_default().to_string(),
            b.as_str().unwrap_or_default().to_string(),
        )
    };
    let style = JsonStyle {
        ensure_ascii: ensure_ascii.is_true(),
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.is_true(),
    };
    let mut out = String::new();
    write_json(&mut out, value, &style, 0)?;
    Ok(Value::from(out))
}

/// Widest `tojson` indent, `zfill` and `str.format` width or precision a template may
/// ask for, the longest text `tojson` may write (the bound on a template's values,
/// `jinja_limits::MAX_VALUE_BYTES`: a request's tools and messages are what a model's
/// template dumps) and the longest `strftime_now` format: these bound what one request
/// can make the process allocate.
const MAX_INDENT: usize = 64;
const MAX_ZFILL: usize = 1 << 16;
const MAX_TOJSON_BYTES: usize = super::jinja_limits::MAX_VALUE_BYTES as usize;
const MAX_STRFTIME_FORMAT: usize = 1024;

fn json_newline(out: &mut String, style: &JsonStyle, depth: usize) -> Result<(), Error> {
    if let Some(ind) = &style.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(ind);
        }
        if out.len() > MAX_TOJSON_BYTES {
            return Err(tojson_too_long());
        }
    }
    Ok(())
}

fn tojson_too_long() -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("tojson: the text grows past {} MiB", MAX_TOJSON_BYTES >> 20),
    )
}

fn write_json(out: &mut String, v: &Value, style: &JsonStyle, depth: usize) -> Result<(), Error> {
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                out.push_str(&v.to_string());
            } else {
                let x = f64::try_from(v.clone()).unwrap_or(f64::NAN);
                out.push_str(&py_float(x, "Infinity", "NaN"));
            }
        }
        ValueKind::String => {
            let text = v.as_str().unwrap_or_default();
            // Escaping makes at most six bytes of one: check before, not after.
            if out.len().saturating_add(text.len().saturating_mul(6)) > MAX_TOJSON_BYTES {
                return Err(tojson_too_long());
            }
            write_json_str(out, text, style)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if out.len() > MAX_TOJSON_BYTES {
                    return Err(tojson_too_long());
                }
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                json_newline(out, style, depth + 1)?;
                write_json(out, item, style, depth + 1)?;
            }
            json_newline(out, style, depth)?;
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if style.sort_keys {
                keys.sort();
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if out.len() > MAX_TOJSON_BYTES {
                    return Err(tojson_too_long());
                }
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                json_newline(out, style, depth + 1)?;
                // json.dumps turns the keys it accepts into strings.
                let k = match key.kind() {
                    ValueKind::String => key.as_str().unwrap_or_default().to_string(),
                    ValueKind::None => "null".to_string(),
                    ValueKind::Bool => if key.is_true() { "true" } else { "false" }.to_string(),
                    ValueKind::Number => py_number(key),
                    _ => {
                        return Err(Error::new(
                            ErrorKind::InvalidOperation,
                            format!(
                                "keys must be str, int, float, bool or None, not {}",
                                key.kind()
                            ),
                        ))
                    }
                };
                write_json_str(out, &k, style);
                out.push_str(&style.key_sep);
                write_json(out, &v.get_item(key)?, style, depth + 1)?;
            }
            json_newline(out, style, depth)?;
            out.push('}');
        }
        ValueKind::Undefined => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "Object of type Undefined is not JSON serializable",
            ))
        }
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("Object of type {other} is not JSON serializable"),
            ))
        }
    }
    Ok(())
}

/// A JSON string as Python writes it: `\"`, `\\`, `\n`, `\r`, `\t`, `\b`, `\f`, other
/// control characters as `\u00XX`, and with `ensure_ascii` everything past ASCII as
/// `\uXXXX` (UTF-16 surrogate pairs above the BMP).
fn write_json_str(out: &mut String, s: &str, style: &JsonStyle) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if style.ensure_ascii && (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Refuses a `str.format` template whose fields ask for a width or precision over
/// [`MAX_ZFILL`] or take one from an argument (`{:{}}`): minijinja-contrib pads before
/// any fuel is charged, so `'{:>999999999999}'.format(0)` would make a terabyte.
fn check_format_widths(template: &str) -> Result<(), Error> {
    let refuse = |what: String| {
        Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("str.format: {what} (wgllm takes widths up to {MAX_ZFILL})"),
        ))
    };
    let mut rest = template;
    while let Some(open) = rest.find(['{', '}']) {
        let after = &rest[open + 1..];
        if rest[open..].starts_with("{{") || rest[open..].starts_with("}}") {
            rest = &after[1..]; // an escaped brace
            continue;
        }
        if rest[open..].starts_with('}') {
            rest = after; // a lone one, which Python refuses
            continue;
        }
        let Some(close) = after.find('}') else { break };
        let field = &after[..close];
        if field.contains('{') {
            return refuse(format!("a width taken from an argument in {{{field}}}"));
        }
        if let Some((_, spec)) = field.split_once(':') {
            for digits in spec
                .split(|c: char| !c.is_ascii_digit())
                .filter(|d| !d.is_empty())
            {
                if digits.len() > 6 || digits.parse::<usize>().unwrap_or(usize::MAX) > MAX_ZFILL {
                    return refuse(format!("a width or precision of {digits}"));
                }
            }
        }
        rest = &after[close + 1..];
    }
    Ok(())
}

/// Python methods on values, for the ones minijinja-contrib's pycompat does not have;
/// everything else goes on to pycompat. Methods that would change a list or dict fail
/// with the message of Jinja2's immutable sandbox, which Hugging Face renders in.
pub(crate) fn unknown_method(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let Some(s) = value.as_str() {
        if let Some(v) = str_method(s, method, args)? {
            return Ok(v);
        }
        if method == "format" {
            check_format_widths(s)?;
        }
    }
    let mutator = match value.kind() {
        ValueKind::Seq => [
            "append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse",
        ]
        .contains(&method)
        .then_some("list"),
        ValueKind::Map => ["clear", "pop", "popitem", "setdefault", "update"]
            .contains(&method)
            .then_some("dict"),
        _ => None,
    };
    if let Some(ty) = mutator {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("access to attribute '{method}' of '{ty}' object is unsafe."),
        ));
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

fn str_method(s: &str, method: &str, args: &[Value]) -> Result<Option<Value>, Error> {
    let v = match method {
        "rsplit" => {
            let (sep, maxsplit): (Option<Value>, Option<i64>) = from_args(args)?;
            let sep = sep.filter(|v| !v.is_none());
            let max = maxsplit.filter(|&m| m >= 0).map(|m| m as usize);
            let parts = match &sep {
                Some(sep) => {
                    let sep = sep.as_str().unwrap_or_default();
                    if sep.is_empty() {
                        return Err(Error::new(ErrorKind::InvalidOperation, "empty separator"));
                    }
                    let mut parts: Vec<&str> = match max {
                        Some(m) => s.rsplitn(m + 1, sep).collect(),
                        None => s.rsplit(sep).collect(),
                    };
                    parts.reverse();
                    parts.into_iter().map(str::to_string).collect()
                }
                None => rsplit_whitespace(s, max),
            };
            Value::from(parts)
        }
        "removeprefix" => {
            let (p,): (&str,) = from_args(args)?;
            Value::from(s.strip_prefix(p).unwrap_or(s))
        }
        "removesuffix" => {
            let (p,): (&str,) = from_args(args)?;
            Value::from(s.strip_suffix(p).unwrap_or(s))
        }
        "partition" | "rpartition" => {
            let (sep,): (&str,) = from_args(args)?;
            let found = if method == "partition" {
                s.find(sep)
            } else {
                s.rfind(sep)
            };
            let parts = match found {
                Some(i) => [&s[..i], sep, &s[i + sep.len()..]],
                None if method == "partition" => [s, "", ""],
                None => ["", "", s],
            };
            Value::from_object(minijinja::value::Tuple::new(
                parts.iter().map(|p| Value::from(*p)).collect(),
            ))
        }
        "zfill" => {
            let (width,): (usize,) = from_args(args)?;
            if width > MAX_ZFILL {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("zfill: a width of {width} (at most {MAX_ZFILL} is taken)"),
                ));
            }
            let n = s.chars().count();
            if n >= width {
                Value::from(s)
            } else {
                let (sign, digits) = match s.strip_prefix(['+', '-']) {
                    Some(rest) => (&s[..1], rest),
                    None => ("", s),
                };
                Value::from(format!("{sign}{}{digits}", "0".repeat(width - n)))
            }
        }
        "swapcase" => Value::from(
            s.chars()
                .flat_map(|c| {
                    if c.is_uppercase() {
                        c.to_lowercase().collect::<Vec<_>>()
                    } else {
                        c.to_uppercase().collect::<Vec<_>>()
                    }
                })
                .collect::<String>(),
        ),
        _ => return Ok(None),
    };
    Ok(Some(v))
}

/// Python's `str.rsplit()` without a separator: runs of whitespace split, at most
/// `max` times counted from the right; what is left over keeps its leading whitespace.
fn rsplit_whitespace(s: &str, max: Option<usize>) -> Vec<String> {
    let mut parts = Vec::new();
    let mut rest = s.trim_end();
    loop {
        if rest.is_empty() {
            break;
        }
        if max.is_some_and(|m| parts.len() == m) {
            parts.push(rest.to_string());
            break;
        }
        match rest.rfind(char::is_whitespace) {
            Some(i) => {
                let ws = rest[i..].chars().next().map_or(1, char::len_utf8);
                parts.push(rest[i + ws..].to_string());
                rest = rest[..i].trim_end();
            }
            None => {
                parts.push(rest.to_string());
                break;
            }
        }
    }
    parts.reverse();
    parts
}

/// `strftime_now(format)`: `now` formatted with C/Python strftime codes. A code chrono
/// does not know is an error, where Python would pass it to the C library.
pub(crate) fn strftime(now: &chrono::NaiveDateTime, format: &str) -> Result<String, Error> {
    // A specifier writes up to about twelve times its length (`%c`).
    if format.len() > MAX_STRFTIME_FORMAT {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "strftime_now: a format of {} bytes (at most {MAX_STRFTIME_FORMAT} are taken)",
                format.len()
            ),
        ));
    }
    let mut out = String::new();
    write!(out, "{}", now.format(format)).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: unsupported format {format:?}"),
        )
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_repr() {
        for (x, want) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (1e16, "1e+16"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (123456.789, "123456.789"),
            (-2.0, "-2.0"),
            (1e22, "1e+22"),
            (0.1, "0.1"),
        ] {
            assert_eq!(py_float(x, "inf", "nan"), want, "{x}");
        }
    }

    #[test]
    fn reprs() {
        let list = Value::from(vec![
            Value::from(1),
            Value::from("it's"),
            Value::from(true),
            Value::from(()),
        ]);
        let v = Value::from_pairs([("a", list), ("b", Value::from(2.5))]);
        assert_eq!(py_str(&v), "{'a': [1, \"it's\", True, None], 'b': 2.5}");
        assert_eq!(py_str(&Value::from("x")), "x");
    }

    #[test]
    fn json_like_python() {
        let empty: [(&str, Value); 0] = [];
        let v = Value::from_pairs([
            ("b", Value::from(vec![1, 2])),
            ("a", Value::from("é\"<>")),
            ("c", Value::from_pairs(empty)),
        ]);
        let j = |args: Vec<Value>| {
            let args = args.into_iter().map(ValueOrKwargs::from).collect();
            tojson(&v, Rest(args)).unwrap().to_string()
        };
        assert_eq!(j(vec![]), r#"{"b": [1, 2], "a": "é\"<>", "c": {}}"#);
        let kw = Value::from(minijinja::value::Kwargs::from_iter([
            ("indent", Value::from(2)),
            ("sort_keys", Value::from(true)),
        ]));
        assert_eq!(
            j(vec![kw]),
            "{\n  \"a\": \"é\\\"<>\",\n  \"b\": [\n    1,\n    2\n  ],\n  \"c\": {}\n}"
        );
        assert_eq!(
            j(vec![Value::from(true)]),
            r#"{"b": [1, 2], "a": "\u00e9\"<>", "c": {}}"#
        );
    }
}
