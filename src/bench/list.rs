//! llama-bench's value lists: `16,32`, and ranges `first-last` (step 1),
//! `first-last+step` and `first-last*mult`, both ends included when reached. Every value
//! of every list is combined with every other into tests.

/// A list or range that does not parse, with the text and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{text}`: {why} (expected values like `16,32`, `16-64`, `16-64+16` or `16-512*2`)")]
pub struct ListError {
    pub text: String,
    pub why: String,
}

fn err(text: &str, why: impl Into<String>) -> ListError {
    ListError {
        text: text.to_string(),
        why: why.into(),
    }
}

/// Most values one range may expand to (a typo such as `1-1000000` fails, not hangs).
const MAX_VALUES: usize = 4096;

fn number(text: &str, s: &str) -> Result<u32, ListError> {
    s.trim()
        .parse()
        .map_err(|_| err(text, format!("`{s}` is not a non-negative integer")))
}

/// Parses a comma list of numbers and ranges into its values, in order.
pub fn parse_u32_list(text: &str) -> Result<Vec<u32>, ListError> {
    let mut out = Vec::new();
    for item in text.split(',') {
        let item = item.trim();
        if item.is_empty() {
            return Err(err(text, "an empty item"));
        }
        let Some((first, rest)) = item.split_once('-') else {
            out.push(number(text, item)?);
            continue;
        };
        let first = number(text, first)?;
        let (last, next): (u32, Box<dyn Fn(u64) -> u64>) =
            if let Some((l, s)) = rest.split_once('+') {
                let step = number(text, s)? as u64;
                if step == 0 {
                    return Err(err(text, "a range step of 0"));
                }
                (number(text, l)?, Box::new(move |v| v + step))
            } else if let Some((l, m)) = rest.split_once('*') {
                let mult = number(text, m)? as u64;
                if mult < 2 {
                    return Err(err(text, "a range multiplier below 2"));
                }
                if first == 0 {
                    return Err(err(text, "a multiplied range starting at 0"));
                }
                (number(text, l)?, Box::new(move |v| v * mult))
            } else {
                (number(text, rest)?, Box::new(|v| v + 1))
            };
        if last < first {
            return Err(err(
                text,
                format!("the range ends ({last}) before it starts ({first})"),
            ));
        }
        let mut v = first as u64;
        while v <= last as u64 {
            out.push(v as u32);
            if out.len() > MAX_VALUES {
                return Err(err(text, format!("more than {MAX_VALUES} values")));
            }
            v = next(v);
        }
    }
    Ok(out)
}

/// Parses every occurrence of a flag (`-p 16 -p 32,64`) into one list.
pub fn parse_u32_lists(texts: &[String]) -> Result<Vec<u32>, ListError> {
    let mut out = Vec::new();
    for t in texts {
        out.extend(parse_u32_list(t)?);
    }
    Ok(out)
}

/// llama-bench's `-pg PP,TG`: one prompt-then-generate test of PP prompt tokens and TG
/// generated tokens.
pub fn parse_pg(text: &str) -> Result<(u32, u32), ListError> {
    match text.split(',').collect::<Vec<_>>()[..] {
        [p, n] => Ok((number(text, p)?, number(text, n)?)),
        _ => Err(ListError {
            text: text.to_string(),
            why: "-pg takes one pair PROMPT,GEN (repeat -pg for more pairs)".into(),
        }),
    }
}

/// A comma list of words (`vulkan,gl`, model paths), empty items refused.
pub fn parse_words(text: &str) -> Result<Vec<String>, ListError> {
    text.split(',')
        .map(|w| {
            let w = w.trim();
            if w.is_empty() {
                Err(err(text, "an empty item"))
            } else {
                Ok(w.to_string())
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_ranges() {
        assert_eq!(parse_u32_list("16,32").unwrap(), [16, 32]);
        assert_eq!(parse_u32_list("512").unwrap(), [512]);
        assert_eq!(parse_u32_list("1-4").unwrap(), [1, 2, 3, 4]);
        assert_eq!(parse_u32_list("16-64+16").unwrap(), [16, 32, 48, 64]);
        assert_eq!(parse_u32_list("16-60+16").unwrap(), [16, 32, 48]);
        assert_eq!(
            parse_u32_list("16-512*2").unwrap(),
            [16, 32, 64, 128, 256, 512]
        );
        assert_eq!(parse_u32_list("1-100*10").unwrap(), [1, 10, 100]);
        assert_eq!(parse_u32_list("0,8-9, 64").unwrap(), [0, 8, 9, 64]);
        assert_eq!(
            parse_u32_lists(&["1".into(), "2,3".into()]).unwrap(),
            [1, 2, 3]
        );
        assert_eq!(parse_pg("512,128").unwrap(), (512, 128));
        assert_eq!(parse_words("vulkan, gl").unwrap(), ["vulkan", "gl"]);
    }

    #[test]
    fn bad_lists_say_why() {
        for (bad, why) in [
            ("", "empty"),
            ("16,,32", "empty"),
            ("abc", "not a non-negative integer"),
            ("-5", "not a non-negative integer"),
            ("64-16", "before it starts"),
            ("16-64+0", "step of 0"),
            ("16-64*1", "multiplier below 2"),
            ("0-64*2", "starting at 0"),
            ("1-1000000", "more than"),
            ("16-x", "not a non-negative integer"),
        ] {
            let e = parse_u32_list(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
        assert!(parse_pg("512").is_err());
        assert!(parse_pg("512,128,4").is_err());
        assert!(parse_words("vulkan,").is_err());
    }
}
