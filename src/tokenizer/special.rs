//! Splitting raw text around special tokens before the tokenizer proper runs.
//!
//! As in llama.cpp, special tokens are tried longest first; each one is cut out of every
//! text fragment that is still raw, so a longer token always wins over a shorter one it
//! contains. User-defined tokens are always recognised; control and unknown tokens only
//! when the caller asks to parse special tokens.

use super::{attr, Tokenizer};

/// A piece of the input: raw text still to tokenize, or a token already decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

/// C `isspace` in the "C" locale, which is what the strip attributes use.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

pub(super) fn partition<'a>(
    tok: &Tokenizer,
    text: &'a str,
    parse_special: bool,
) -> Vec<Fragment<'a>> {
    let mut frags = Vec::new();
    if text.is_empty() {
        return frags;
    }
    frags.push(Fragment::Text(text));
    for &id in &tok.special_order {
        let data = &tok.tokens[id as usize];
        if !parse_special && data.attr & (attr::CONTROL | attr::UNKNOWN) != 0 {
            continue;
        }
        let needle = data.text.as_str();
        // Cheap pre-check: a token absent from the whole text is absent from every fragment.
        if !text.contains(needle) {
            continue;
        }
        let mut next = Vec::with_capacity(frags.len() + 2);
        for f in frags {
            let Fragment::Text(mut rest) = f else {
                next.push(f);
                continue;
            };
            while let Some(pos) = rest.find(needle) {
                let mut left = &rest[..pos];
                if data.attr & attr::LSTRIP != 0 {
                    left = left.trim_end_matches(|c: char| c.is_ascii() && is_c_space(c as u8));
                }
                if !left.is_empty() {
                    next.push(Fragment::Text(left));
                }
                next.push(Fragment::Token(id));
                rest = &rest[pos + needle.len()..];
                if data.attr & attr::RSTRIP != 0 {
                    rest = rest.trim_start_matches(|c: char| c.is_ascii() && is_c_space(c as u8));
                }
            }
            if !rest.is_empty() {
                next.push(Fragment::Text(rest));
            }
        }
        frags = next;
    }
    frags
}
