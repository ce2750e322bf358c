//! Byte-level BPE ("gpt2" tokenizer model): pre-tokenizer regexes, the GPT-2
//! byte↔unicode alphabet, and rank-ordered merging.
//!
//! llama.cpp splits text with a list of regexes applied one after another: each regex
//! splits every piece produced by the previous one, and the text between matches is
//! kept as pieces of its own. The words are then mapped into the GPT-2 byte alphabet
//! and merged, lowest merge rank first (ties: leftmost pair first).

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::sync::OnceLock;

use fancy_regex::Regex;

use super::pre::PreTokenizer;
use super::TokenizerError;

/// Letters, digits and punctuation new in Unicode 16.0. llama.cpp's character tables
/// (Unicode 15.1) see them as unassigned, while the regex crate knows them, so they are
/// swapped for unassigned stand-ins before splitting.
#[rustfmt::skip]
const UNICODE16_ADDED: &[(u32, u32)] = &[
    (0x01B4E, 0x01B4F), (0x01B7F, 0x01B7F), (0x01C89, 0x01C8A), (0x0A7CB, 0x0A7CD),
    (0x0A7DA, 0x0A7DC), (0x105C0, 0x105F3), (0x10D40, 0x10D65), (0x10D6E, 0x10D85),
    (0x10EC2, 0x10EC4), (0x11380, 0x11389), (0x1138B, 0x1138B), (0x1138E, 0x1138E),
    (0x11390, 0x113B5), (0x113B7, 0x113B7), (0x113D1, 0x113D1), (0x113D3, 0x113D5),
    (0x113D7, 0x113D8), (0x116D0, 0x116E3), (0x11BC0, 0x11BE1), (0x11BF0, 0x11BF9),
    (0x13460, 0x143FA), (0x16100, 0x1611D), (0x16130, 0x16139), (0x16D40, 0x16D79),
    (0x18CFF, 0x18CFF), (0x1CCF0, 0x1CCF9), (0x1E5D0, 0x1E5ED), (0x1E5F0, 0x1E5FA),
    (0x1E5FF, 0x1E5FF),
];

fn unicode16_added(c: char) -> bool {
    let c = c as u32;
    c >= 0x1B4E
        && UNICODE16_ADDED
            .binary_search_by(|&(lo, hi)| {
                if hi < c {
                    Ordering::Less
                } else if lo > c {
                    Ordering::Greater
                } else {
                    Ordering::Equal
                }
            })
            .is_ok()
}

/// `text` with Unicode-16 additions replaced by unassigned code points of the same
/// UTF-8 length (noncharacters), which every regex class treats as llama.cpp does.
fn as_llama_sees(text: &str) -> Cow<'_, str> {
    if text.is_ascii() || !text.chars().any(unicode16_added) {
        return Cow::Borrowed(text);
    }
    let stand_in = |c: char| match c.len_utf8() {
        3 => '\u{FFFE}',
        4 => '\u{10FFFE}',
        _ => '\u{0378}',
    };
    Cow::Owned(
        text.chars()
            .map(|c| if unicode16_added(c) { stand_in(c) } else { c })
            .collect(),
    )
}

/// The GPT-2 byte alphabet: printable Latin-1 bytes stand for themselves, the other 68
/// bytes are moved, in order, to U+0100 onwards, so every byte is a visible character.
fn byte_alphabet() -> &'static ([char; 256], HashMap<char, u8>) {
    static TABLE: OnceLock<([char; 256], HashMap<char, u8>)> = OnceLock::new();
    TABLE.get_or_init(|| {
        let keeps = |b: u32| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
        let mut enc = ['\0'; 256];
        let mut moved = 0u32;
        for b in 0..256u32 {
            let cp = if keeps(b) {
                b
            } else {
                moved += 1;
                255 + moved
            };
            enc[b as usize] = char::from_u32(cp).expect("alphabet code points are valid");
        }
        let dec = enc.iter().enumerate().map(|(b, &c)| (c, b as u8)).collect();
        (enc, dec)
    })
}

/// Maps raw bytes into the GPT-2 alphabet.
pub(super) fn bytes_to_alphabet(bytes: &[u8]) -> String {
    let enc = &byte_alphabet().0;
    bytes.iter().map(|&b| enc[b as usize]).collect()
}

/// The raw byte an alphabet character stands for.
pub(super) fn alphabet_to_byte(c: char) -> Option<u8> {
    byte_alphabet().1.get(&c).copied()
}

/// The longest word merged whole. The merge holds about 80 bytes per character of its
/// word, so a pre-tokenizer that lets a run of letters (or of anything) through whole
/// would let one text take gigabytes; a longer word is merged in parts of this size, cut
/// at character boundaries. No word of a natural language comes near it, and no text of
/// llama.cpp's tokenizer tests has one, so tokens differ from llama.cpp's only inside
/// such runs (at the cuts).
pub const MAX_WORD_BYTES: usize = 2048;

/// `word` in parts of at most `max` bytes (at least one character each), cut at
/// character boundaries.
pub(super) fn bounded_parts(word: &str, max: usize) -> impl Iterator<Item = &str> {
    let mut rest = word;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut cut = rest.len().min(max);
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        if cut == 0 {
            cut = rest.chars().next().map_or(rest.len(), char::len_utf8);
        }
        let (part, tail) = rest.split_at(cut);
        rest = tail;
        Some(part)
    })
}

/// A compiled byte-level BPE: pre-tokenizer plus merge ranks.
#[derive(Clone)]
pub(super) struct Bpe {
    regexes: Vec<Regex>,
    /// `"left right"` → rank (merge sides never contain a space).
    ranks: HashMap<String, u32>,
    pre: PreTokenizer,
}

impl Bpe {
    pub fn new(pre: PreTokenizer, merges: &[&str]) -> Result<Self, TokenizerError> {
        let regexes = pre
            .regexes
            .iter()
            .map(|r| Regex::new(r).map_err(|e| TokenizerError::Regex(format!("{r}: {e}"))))
            .collect::<Result<Vec<_>, _>>()?;
        let mut ranks = HashMap::with_capacity(merges.len());
        for (rank, m) in merges.iter().enumerate() {
            // The separator is the first space after the first character, as llama.cpp reads it.
            let Some(first_len) = m.chars().next().map(char::len_utf8) else {
                continue;
            };
            if let Some(pos) = m[first_len..].find(' ') {
                let (l, r) = (&m[..first_len + pos], &m[first_len + pos + 1..]);
                ranks.entry(format!("{l} {r}")).or_insert(rank as u32);
            }
        }
        Ok(Self {
            regexes,
            ranks,
            pre,
        })
    }

    /// Whether tokens are written in the GPT-2 byte alphabet (else raw UTF-8 with `▁`
    /// for spaces and `<0xNN>` byte tokens).
    pub fn byte_encoded(&self) -> bool {
        self.pre.byte_encode
    }

    /// Tokenizes raw text (no special tokens in it): escape, split, merge each word.
    pub fn encode(&self, text: &str, lookup: &HashMap<String, u32>, out: &mut Vec<u32>) {
        let escaped;
        let text = if self.pre.escape_spaces {
            escaped = text.replace(' ', "\u{2581}");
            escaped.as_str()
        } else {
            text
        };
        for word in self.split(text) {
            for part in bounded_parts(word, MAX_WORD_BYTES) {
                if self.pre.byte_encode {
                    self.tokenize_word(&bytes_to_alphabet(part.as_bytes()), lookup, out);
                } else {
                    self.tokenize_word(part, lookup, out);
                }
            }
        }
    }

    fn rank(&self, left: &str, right: &str) -> Option<u32> {
        if left.contains(' ') || right.contains(' ') {
            return None;
        }
        self.ranks.get(&format!("{left} {right}")).copied()
    }

    /// Splits `text` into words, applying each regex to the pieces the previous one left.
    pub fn split<'t>(&self, text: &'t str) -> Vec<&'t str> {
        // Run the regexes on what llama.cpp's character tables see; stand-ins keep every
        // character's UTF-8 length, so the byte ranges carry over to `text` unchanged.
        let seen = as_llama_sees(text);
        let mut pieces = vec![(0, seen.len())];
        for re in &self.regexes {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for (start, end) in pieces {
                let piece = &seen[start..end];
                let mut last = 0;
                for m in re.find_iter(piece) {
                    let m = match m {
                        Ok(m) => m,
                        Err(e) => {
                            log::warn!("pre-tokenizer regex gave up ({e}); keeping the rest whole");
                            break;
                        }
                    };
                    if m.start() > last {
                        next.push((start + last, start + m.start()));
                    }
                    if m.end() > m.start() {
                        next.push((start + m.start(), start + m.end()));
                    }
                    last = m.end();
                }
                if last < piece.len() {
                    next.push((start + last, end));
                }
            }
            pieces = next;
        }
        pieces.into_iter().map(|(a, b)| &text[a..b]).collect()
    }

    /// Tokenizes one pre-tokenized word (already in the vocabulary's alphabet).
    fn tokenize_word(&self, word: &str, lookup: &HashMap<String, u32>, out: &mut Vec<u32>) {
        let whole = self.pre.ignore_merges
            || (self.pre.whole_newlines && !word.is_empty() && word.bytes().all(|b| b == b'\n'));
        if whole {
            if let Some(&id) = lookup.get(word) {
                out.push(id);
                return;
            }
        }
        let mut syms: Vec<Sym> = word
            .char_indices()
            .map(|(start, c)| Sym {
                start,
                len: c.len_utf8(),
                prev: None,
                next: None,
            })
            .collect();
        let n = syms.len();
        for (i, s) in syms.iter_mut().enumerate() {
            s.prev = i.checked_sub(1);
            s.next = (i + 1 < n).then_some(i + 1);
        }
        let mut heap = BinaryHeap::new();
        let text = |s: &Sym| &word[s.start..s.start + s.len];
        let push = |heap: &mut BinaryHeap<Pair>, syms: &[Sym], l: usize, r: usize| {
            if let Some(rank) = self.rank(text(&syms[l]), text(&syms[r])) {
                heap.push(Pair {
                    rank,
                    left: l,
                    right: r,
                    len: syms[l].len + syms[r].len,
                });
            }
        };
        for i in 1..n {
            push(&mut heap, &syms, i - 1, i);
        }
        while let Some(p) = heap.pop() {
            let (l, r) = (p.left, p.right);
            // Stale: one side was merged away or grew since this pair was queued.
            if syms[l].len == 0 || syms[r].len == 0 || syms[l].len + syms[r].len != p.len {
                continue;
            }
            syms[l].len += syms[r].len;
            syms[r].len = 0;
            syms[l].next = syms[r].next;
            if let Some(nx) = syms[r].next {
                syms[nx].prev = Some(l);
            }
            if let Some(pv) = syms[l].prev {
                push(&mut heap, &syms, pv, l);
            }
            if let Some(nx) = syms[l].next {
                push(&mut heap, &syms, l, nx);
            }
        }
        let mut i = Some(0).filter(|_| n > 0);
        while let Some(k) = i {
            let s = text(&syms[k]);
            match lookup.get(s) {
                Some(&id) => out.push(id),
                // Not a token: llama.cpp looks each byte up as a one-byte token text
                // (in the byte alphabet only ASCII can be one) or as `<0xNN>`; bytes
                // with no token are dropped.
                None => out.extend(s.bytes().filter_map(|b| {
                    if self.pre.byte_encode {
                        b.is_ascii()
                            .then(|| lookup.get(&(b as char).to_string()).copied())
                            .flatten()
                    } else {
                        lookup.get(&format!("<0x{b:02X}>")).copied()
                    }
                })),
            }
            i = syms[k].next;
        }
    }
}

struct Sym {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A queued merge; the heap pops the lowest rank, then the leftmost pair.
#[derive(PartialEq, Eq)]
struct Pair {
    rank: u32,
    left: usize,
    right: usize,
    len: usize,
}

impl Ord for Pair {
    fn cmp(&self, o: &Self) -> Ordering {
        o.rank.cmp(&self.rank).then(o.left.cmp(&self.left))
    }
}

impl PartialOrd for Pair {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
