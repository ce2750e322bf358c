//! WordPiece ("bert" tokenizer model), as llama.cpp runs it for BERT-style embedding
//! vocabularies: normalize, cut at whitespace and punctuation, then match each word
//! greedily, longest token first, with a `▁` marking the start of the word.
//!
//! The normalization follows llama.cpp's tables rather than full Unicode: a code point
//! is replaced by the *first* code point of its NFD form, and lower-cased by the simple
//! (one code point) mapping.

use std::collections::HashMap;
use std::sync::OnceLock;

use regex::Regex;
use unicode_normalization::UnicodeNormalization;

/// A WordPiece tokenizer's options (from `tokenizer.ggml.normalizer.*`).
#[derive(Clone, Debug)]
pub(super) struct Wpm {
    pub lowercase: bool,
    pub strip_accents: bool,
    /// Longest token text in bytes: the longest match worth trying.
    pub max_token_len: usize,
}

/// Character classes llama.cpp's WordPiece split looks at.
struct Classes {
    mark: Regex,
    punct: Regex,
    symbol: Regex,
    control: Regex,
}

fn classes() -> &'static Classes {
    static C: OnceLock<Classes> = OnceLock::new();
    C.get_or_init(|| {
        let re = |s: &str| Regex::new(s).expect("a valid character class");
        Classes {
            mark: re(r"^\p{M}$"),
            punct: re(r"^\p{P}$"),
            symbol: re(r"^\p{S}$"),
            // Unassigned code points (Cn) are not control characters in llama.cpp's table.
            control: re(r"^[\p{Cc}\p{Cf}\p{Co}]$"),
        }
    })
}

fn is(re: &Regex, c: char) -> bool {
    let mut buf = [0u8; 4];
    re.is_match(c.encode_utf8(&mut buf))
}

/// Unicode's White_Space property, the set llama.cpp lists.
fn is_whitespace(c: char) -> bool {
    matches!(c as u32, 0x09..=0x0D | 0x20 | 0x85 | 0xA0 | 0x1680 | 0x2000..=0x200A
        | 0x2028 | 0x2029 | 0x202F | 0x205F | 0x3000)
}

/// CJK ideographs, each its own word (the ranges of BERT's tokenizer).
fn is_chinese(c: char) -> bool {
    matches!(c as u32, 0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F | 0x2B740..=0x2B81F | 0x2B920..=0x2CEAF | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

impl Wpm {
    /// Normalized words: whitespace separates, punctuation, ASCII symbols and CJK
    /// ideographs stand alone, control characters vanish.
    fn words(&self, text: &str) -> Vec<String> {
        let cls = classes();
        let mut words = vec![String::new()];
        for c in text.chars() {
            let c = if self.strip_accents {
                c.nfd().next().unwrap_or(c)
            } else {
                c
            };
            if is_whitespace(c) {
                if !words.last().unwrap().is_empty() {
                    words.push(String::new());
                }
                continue;
            }
            if c == '\0' || c == '\u{FFFD}' || is(&cls.control, c) {
                continue;
            }
            if self.strip_accents && is(&cls.mark, c) {
                continue;
            }
            let c = if self.lowercase {
                c.to_lowercase().next().unwrap_or(c)
            } else {
                c
            };
            let alone =
                is(&cls.punct, c) || ((c as u32) < 0x7F && is(&cls.symbol, c)) || is_chinese(c);
            if alone {
                if !words.last().unwrap().is_empty() {
                    words.push(String::new());
                }
                words.last_mut().unwrap().push(c);
                words.push(String::new());
            } else {
                words.last_mut().unwrap().push(c);
            }
        }
        if words.last().is_some_and(String::is_empty) {
            words.pop();
        }
        words
    }

    /// Tokenizes raw text: each word greedily, longest known piece first; a word with any
    /// piece missing becomes the unknown token as a whole.
    pub fn encode(
        &self,
        text: &str,
        lookup: &HashMap<String, u32>,
        unk: Option<u32>,
        out: &mut Vec<u32>,
    ) {
        for word in self.words(text) {
            let word = format!("\u{2581}{word}");
            let start_len = out.len();
            let mut i = 0;
            while i < word.len() {
                let longest = (i + self.max_token_len + 1).min(word.len());
                let found = (i + 1..=longest)
                    .rev()
                    .filter(|&j| word.is_char_boundary(j))
                    .find_map(|j| lookup.get(&word[i..j]).map(|&id| (id, j)));
                match found {
                    Some((id, j)) => {
                        out.push(id);
                        i = j;
                    }
                    None => {
                        out.truncate(start_len);
                        break;
                    }
                }
            }
            if out.len() == start_len {
                out.extend(unk);
            }
        }
    }
}
