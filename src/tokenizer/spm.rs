//! SentencePiece-style BPE ("llama" tokenizer model, used by Llama-2 and Gemma).
//!
//! Start from single characters and repeatedly merge the adjacent pair whose joined
//! text is a vocabulary token with the highest score (ties: leftmost). Characters that
//! never become tokens fall back to byte tokens `<0xNN>`.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::Tokenizer;

struct Sym {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge; the heap pops the highest score, then the leftmost pair.
struct Pair {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl PartialEq for Pair {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Pair {}
impl Ord for Pair {
    fn cmp(&self, o: &Self) -> Ordering {
        self.score.total_cmp(&o.score).then(o.left.cmp(&self.left))
    }
}
impl PartialOrd for Pair {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// Where a long text starts to be cut into parts. The merge holds about 80 bytes per
/// character, and SentencePiece merges a whole fragment at once, so a text longer than
/// this is merged in parts of between this and twice this many bytes: each cut before
/// the first word's `▁` past this length (never inside a run of them, which the
/// vocabulary has tokens for), else after the first newline, else (a run of twice this
/// length with neither: text with no spaces, as Chinese or Japanese is written) at a
/// character boundary. Tokens of words joined by spaces never span words, so only such
/// runs can tokenize differently from llama.cpp, at the cut.
pub const MAX_PART_BYTES: usize = 16384;

/// Tokenizes `text` (spaces already escaped to U+2581) and appends the ids to `out`.
pub(super) fn tokenize(tok: &Tokenizer, text: &str, out: &mut Vec<u32>) {
    let mut rest = text;
    while rest.len() > 2 * MAX_PART_BYTES {
        let window = &rest[..floor_boundary(rest, 2 * MAX_PART_BYTES)];
        let past = || (window.char_indices()).skip_while(|&(i, _)| i < MAX_PART_BYTES);
        // The first `▁` past the limit that follows something else; else the first
        // newline's end; else the limit.
        let cut = past()
            .find(|&(i, c)| c == '\u{2581}' && !window[..i].ends_with('\u{2581}'))
            .map(|(i, _)| i)
            .or_else(|| past().find(|&(_, c)| c == '\n').map(|(i, _)| i + 1))
            .unwrap_or_else(|| floor_boundary(rest, MAX_PART_BYTES));
        tokenize_part(tok, &rest[..cut], out);
        rest = &rest[cut..];
    }
    tokenize_part(tok, rest, out);
}

/// The largest character boundary of `s` at or below `at` (and above 0 where `s` is not
/// empty).
fn floor_boundary(s: &str, at: usize) -> usize {
    let mut i = at.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    if i == 0 {
        i = s.chars().next().map_or(0, char::len_utf8);
    }
    i
}

fn tokenize_part(tok: &Tokenizer, text: &str, out: &mut Vec<u32>) {
    let mut syms: Vec<Sym> = text
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
    let push = |heap: &mut BinaryHeap<Pair>, syms: &[Sym], l: usize, r: usize| {
        let (a, b) = (&syms[l], &syms[r]);
        let joined = &text[a.start..b.start + b.len];
        if let Some(id) = tok.token_id(joined) {
            heap.push(Pair {
                score: tok.tokens[id as usize].score,
                left: l,
                right: r,
                len: joined.len(),
            });
        }
    };
    for i in 1..n {
        push(&mut heap, &syms, i - 1, i);
    }
    while let Some(p) = heap.pop() {
        let (l, r) = (p.left, p.right);
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
    // Every merged symbol is a token by construction, so only single characters can
    // miss the vocabulary; those go out byte by byte.
    let mut i = Some(0).filter(|_| n > 0);
    while let Some(k) = i {
        let s = &text[syms[k].start..syms[k].start + syms[k].len];
        match tok.token_id(s) {
            Some(id) => out.push(id),
            None => out.extend(s.bytes().filter_map(|b| tok.byte_to_token(b))),
        }
        i = syms[k].next;
    }
}
