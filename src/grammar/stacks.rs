//! The pushdown matcher: a grammar's state is a set of stacks of rule positions, each
//! with a terminal (a character set or a token) on top. Accepting a character replaces
//! every stack by the stacks its matching successors expand to; a token is allowed when
//! some stack can take all of its characters (or could, once an incomplete UTF-8
//! character at its end is completed).

use super::gbnf::Elem;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};

/// A place in a rule: rule id and element index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Pos {
    pub(crate) rule: u32,
    pub(crate) at: u32,
}

pub(crate) type Stack = Vec<Pos>;

/// Most stacks a grammar's state may hold. An ambiguous grammar can double its stacks
/// with each character (`r ::= "a" r "b" | "a" r "c" | ""`); past this the matcher stops
/// instead of taking the memory and time of the engine thread that every session shares.
/// Grammars written for JSON or tool calls hold tens; a JSON schema's object with n
/// optional properties holds about 3n after a value (each later property may come next,
/// after any of the spacings), so this admits a few thousand of them.
pub(crate) const MAX_STACKS: usize = 16384;

/// Deepest a stack may grow (nested, not tail, recursion: one level per open group in
/// the text, or a long chain of rules each starting with the next).
pub(crate) const MAX_DEPTH: usize = 4096;

/// Most stacks one expansion may visit on its way to terminals (the leftmost
/// derivations of a rule can be exponentially many).
const MAX_EXPANSIONS: usize = 1 << 16;

/// Most positions all the stacks of a state may hold together: [`MAX_STACKS`] stacks
/// each [`MAX_DEPTH`] deep would be half a gigabyte per generation.
pub(crate) const MAX_POSITIONS: usize = 1 << 22;

/// Most work one step of the matcher may do (checking the candidates for the next
/// token, accepting a token, or expanding the start of a grammar). The bounds above hold
/// the size of a state, not how often the stacks are expanded while a step goes from one
/// state to the next: ambiguity nested inside ambiguity (`root ::= (.+)+` stacked a dozen
/// times) kept every stack of a state near the bounds, each expanding near its own
/// bound, for a fifth of a second per character on the engine thread every session
/// shares. Work is counted in units of about one candidate compared with a terminal
/// ([`EXPANSION_WORK`] and [`POSITION_WORK`] price a stack expanded):
/// this admits a JSON object of about 4 000 optional properties over SmolLM2's
/// vocabulary (1 000 take 8M units), and `cargo bench --bench grammar` puts a step that
/// runs out at under 0.2 s.
pub(crate) const MAX_WORK: usize = 1 << 25;

/// Work of expanding one stack, besides its positions: the allocation and hashing each
/// costs about as much as comparing 64 candidates.
const EXPANSION_WORK: usize = 64;

/// Work per position of a stack expanded (copied and hashed).
const POSITION_WORK: usize = 8;

/// What is left of one step's [`MAX_WORK`].
#[derive(Debug)]
pub(crate) struct Work(usize);

impl Work {
    pub(crate) fn new() -> Work {
        Work(MAX_WORK)
    }

    /// Takes `n` units, or fails (taking all that was left) when fewer remain.
    fn spend(&mut self, n: usize) -> Result<(), Overflow> {
        match self.0.checked_sub(n) {
            Some(left) => {
                self.0 = left;
                Ok(())
            }
            None => {
                self.0 = 0;
                Err(Overflow)
            }
        }
    }

    /// Whether the step ran out: its results are then incomplete.
    pub(crate) fn exhausted(&self) -> bool {
        self.0 == 0
    }

    /// Work done so far.
    pub(crate) fn used(&self) -> usize {
        MAX_WORK - self.0
    }
}

/// The matcher went past [`MAX_STACKS`], [`MAX_DEPTH`], [`MAX_EXPANSIONS`],
/// [`MAX_POSITIONS`] or [`MAX_WORK`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Overflow;

/// The bytes of an incomplete UTF-8 character at the end of a piece: the bits so far and
/// how many continuation bytes are missing (-1: the bytes were not UTF-8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Partial {
    pub(crate) value: u32,
    pub(crate) n_remain: i32,
}

/// A piece of text as code points, continuing `start`; the piece stops at a NUL byte,
/// and bytes that are not UTF-8 give no code points and `n_remain` -1 (as llama.cpp
/// decodes token pieces for its grammar).
pub(crate) fn decode(bytes: &[u8], start: Partial) -> (Vec<u32>, Partial) {
    let bytes = match bytes.iter().position(|&b| b == 0) {
        Some(n) => &bytes[..n],
        None => bytes,
    };
    let mut cps = Vec::with_capacity(bytes.len());
    let mut i = 0;
    let mut value = start.value;
    let mut n_remain = start.n_remain;
    while i < bytes.len() && n_remain > 0 {
        let b = bytes[i];
        if b >> 6 != 2 {
            return (
                Vec::new(),
                Partial {
                    value: 0,
                    n_remain: -1,
                },
            );
        }
        value = (value << 6) | (b & 0x3F) as u32;
        i += 1;
        n_remain -= 1;
    }
    if start.n_remain > 0 && n_remain == 0 {
        cps.push(value);
    }
    while i < bytes.len() {
        let first = bytes[i];
        n_remain = match first >> 4 {
            0..=7 => 0,
            8..=11 => -1,
            12 | 13 => 1,
            14 => 2,
            _ => 3,
        };
        if n_remain < 0 {
            return (
                Vec::new(),
                Partial {
                    value: 0,
                    n_remain: -1,
                },
            );
        }
        value = first as u32 & ((1u32 << (7 - n_remain)) - 1);
        i += 1;
        while i < bytes.len() && n_remain > 0 {
            value = (value << 6) | (bytes[i] & 0x3F) as u32;
            i += 1;
            n_remain -= 1;
        }
        if n_remain == 0 {
            cps.push(value);
        }
    }
    (cps, Partial { value, n_remain })
}

/// Rule storage with position helpers.
pub(crate) struct Rules(pub(crate) Vec<Vec<Elem>>);

impl Rules {
    pub(crate) fn at(&self, p: Pos) -> Elem {
        self.0[p.rule as usize][p.at as usize]
    }
    fn next(p: Pos) -> Pos {
        Pos {
            rule: p.rule,
            at: p.at + 1,
        }
    }

    /// Where each alternative of rule `id` starts (an empty one starts on its end).
    pub(crate) fn alternatives(&self, id: u32) -> Vec<Pos> {
        let mut out = vec![Pos { rule: id, at: 0 }];
        for (i, e) in self.0[id as usize].iter().enumerate() {
            if *e == Elem::Alt {
                out.push(Pos {
                    rule: id,
                    at: i as u32 + 1,
                });
            }
        }
        out
    }

    /// Whether `c` is in the character set at `p`, and the position after the set.
    pub(crate) fn match_char(&self, p: Pos, c: u32) -> (bool, Pos) {
        let first = self.at(p);
        let positive = matches!(first, Elem::Char(_) | Elem::CharAny);
        let mut found = false;
        let mut q = p;
        loop {
            let e = self.at(q);
            let v = char_value(e);
            if let Elem::CharRngUpper(hi) = self.at(Self::next(q)) {
                found |= v <= c && c <= hi;
                q.at += 2;
            } else if e == Elem::CharAny {
                found = true;
                q.at += 1;
            } else {
                found |= v == c;
                q.at += 1;
            }
            if !matches!(self.at(q), Elem::CharAlt(_)) {
                break;
            }
        }
        (found == positive, q)
    }

    /// Whether some completion of the incomplete character `partial` could be in the set
    /// at `p`.
    pub(crate) fn match_partial(&self, p: Pos, partial: Partial) -> bool {
        let positive = matches!(self.at(p), Elem::Char(_) | Elem::CharAny);
        let n = partial.n_remain;
        if n < 0 || (n == 1 && partial.value < 2) {
            return false;
        }
        let mut low = partial.value << (n * 6);
        let high = low | ((1u32 << (n * 6)) - 1);
        if low == 0 {
            if n == 2 {
                low = 1 << 11;
            } else if n == 3 {
                low = 1 << 16;
            }
        }
        let mut q = p;
        loop {
            let e = self.at(q);
            let v = char_value(e);
            if let Elem::CharRngUpper(hi) = self.at(Self::next(q)) {
                if v <= high && low <= hi {
                    return positive;
                }
                q.at += 2;
            } else if e == Elem::CharAny {
                return true;
            } else {
                if low <= v && v <= high {
                    return positive;
                }
                q.at += 1;
            }
            if !matches!(self.at(q), Elem::CharAlt(_)) {
                return !positive;
            }
        }
    }

    /// Expands `stack` until every resulting stack has a terminal on top (or is empty),
    /// adding those not already in `out`; stops at the matcher's bounds. A stack already
    /// in `seen` is not expanded again: what it expands to is in `out` already, so
    /// expansions that feed the same `out` may share one `seen`.
    pub(crate) fn advance(
        &self,
        stack: Stack,
        out: &mut StackSet,
        seen: &mut HashSet<Stack>,
        work: &mut Work,
    ) -> Result<(), Overflow> {
        let mut todo = vec![stack];
        let mut n_expanded = 0;
        while let Some(cur) = todo.pop() {
            if cur.len() > MAX_DEPTH
                || n_expanded >= MAX_EXPANSIONS
                || out.len() >= MAX_STACKS
                || out.n_positions > MAX_POSITIONS
            {
                return Err(Overflow);
            }
            work.spend(EXPANSION_WORK + POSITION_WORK * cur.len())?;
            if !seen.insert(cur.clone()) {
                continue;
            }
            n_expanded += 1;
            let Some(&top) = cur.last() else {
                out.insert(cur);
                continue;
            };
            match self.at(top) {
                Elem::RuleRef(id) => {
                    let after = Self::next(top);
                    for alt in self.alternatives(id) {
                        let mut next = cur[..cur.len() - 1].to_vec();
                        if !self.at(after).ends_sequence() {
                            next.push(after);
                        }
                        if !self.at(alt).ends_sequence() {
                            next.push(alt);
                        }
                        todo.push(next);
                    }
                }
                Elem::Char(_)
                | Elem::CharNot(_)
                | Elem::CharAny
                | Elem::Token(_)
                | Elem::TokenNot(_) => {
                    out.insert(cur);
                }
                // The parser never leaves a stack on the end of an alternative or inside a
                // set; such a stack matches nothing.
                Elem::End | Elem::Alt | Elem::CharAlt(_) | Elem::CharRngUpper(_) => {}
            }
        }
        Ok(())
    }

    /// The stacks after `stack` takes character `c` (none if it cannot), expanded with
    /// `seen` (see [`Rules::advance`]).
    pub(crate) fn accept_char(
        &self,
        stack: &Stack,
        c: u32,
        out: &mut StackSet,
        seen: &mut HashSet<Stack>,
        work: &mut Work,
    ) -> Result<(), Overflow> {
        let Some(&top) = stack.last() else {
            return Ok(());
        };
        if matches!(self.at(top), Elem::Token(_) | Elem::TokenNot(_)) {
            return Ok(());
        }
        let (ok, after) = self.match_char(top, c);
        if ok {
            let mut next = stack[..stack.len() - 1].to_vec();
            if !self.at(after).ends_sequence() {
                next.push(after);
            }
            self.advance(next, out, seen, work)?;
        }
        Ok(())
    }

    /// The stacks after `stack` takes a token whose id is matched against a token
    /// element on top.
    pub(crate) fn accept_token_elem(
        &self,
        stack: &Stack,
        token: u32,
        out: &mut StackSet,
        seen: &mut HashSet<Stack>,
        work: &mut Work,
    ) -> Result<(), Overflow> {
        let Some(&top) = stack.last() else {
            return Ok(());
        };
        if token_matches(self.at(top), token) {
            let mut next = stack[..stack.len() - 1].to_vec();
            let after = Self::next(top);
            if !self.at(after).ends_sequence() {
                next.push(after);
            }
            self.advance(next, out, seen, work)?;
        }
        Ok(())
    }

    /// The candidates no stack accepts (llama.cpp's rejection walk: candidates are
    /// filtered by their next code point against each stack's terminal, and the survivors
    /// go on against the stacks that follow). Stacks whose terminals on top are the same
    /// (the same character set, wherever in the grammar it is) are taken together: a
    /// candidate that terminal refuses is refused by all of them at the cost of one
    /// comparison, so a state of many stacks over a handful of terminals (a JSON object
    /// of many optional properties, each owing a `,` or a `}`) compares each candidate a
    /// handful of times. Once `work` runs out the stacks still to be walked are taken as
    /// refusing everything, so the rejects are then more than they should be: the caller
    /// checks [`Work::exhausted`].
    pub(crate) fn reject(
        &self,
        stacks: &[Stack],
        cands: Vec<Cand>,
        text: &[u32],
        work: &mut Work,
    ) -> Vec<Cand> {
        if cands.is_empty() || stacks.is_empty() {
            return cands;
        }
        // Stacks by their terminal (None: empty stacks), in the order first seen.
        let mut groups: Vec<(Option<Pos>, Vec<&Stack>)> = Vec::new();
        let mut index: HashMap<Option<&[Elem]>, usize> = HashMap::new();
        for s in stacks {
            let top = s.last().copied();
            let key = top.map(|p| self.terminal(p));
            let i = *index.entry(key).or_insert_with(|| {
                groups.push((top, Vec::new()));
                groups.len() - 1
            });
            groups[i].1.push(s);
        }
        let mut rejects = cands;
        for (top, group) in &groups {
            if rejects.is_empty() {
                break;
            }
            rejects = self.reject_for_terminal(*top, group, rejects, text, work);
        }
        rejects
    }

    /// The elements of the terminal at `p`: a token, or a character set with its
    /// alternatives and ranges.
    fn terminal(&self, p: Pos) -> &[Elem] {
        let rule = &self.0[p.rule as usize];
        let start = p.at as usize;
        let end = match rule[start] {
            Elem::Char(_) | Elem::CharNot(_) | Elem::CharAny => self.match_char(p, 0).1.at,
            _ => p.at + 1,
        };
        &rule[start..end as usize]
    }

    /// The candidates that none of `stacks` accepts, each with a terminal equal to the
    /// one at `top` on top.
    fn reject_for_terminal(
        &self,
        top: Option<Pos>,
        stacks: &[&Stack],
        cands: Vec<Cand>,
        text: &[u32],
        work: &mut Work,
    ) -> Vec<Cand> {
        if work.spend(cands.len()).is_err() {
            return cands;
        }
        let mut rejects = Vec::with_capacity(cands.len());
        let Some(top) = top else {
            for c in cands {
                if !c.at_end() || c.partial.n_remain != 0 {
                    rejects.push(c);
                }
            }
            return rejects;
        };
        let top_elem = self.at(top);
        if matches!(top_elem, Elem::Token(_) | Elem::TokenNot(_)) {
            for c in cands {
                let keep = if c.at_end() {
                    c.partial.n_remain == 0
                } else {
                    token_matches(top_elem, c.id)
                };
                if !keep {
                    rejects.push(c);
                }
            }
            return rejects;
        }
        let mut next = Vec::new();
        for c in cands {
            if c.at_end() {
                if c.partial.n_remain != 0 && !self.match_partial(top, c.partial) {
                    rejects.push(c);
                }
            } else if self.match_char(top, text[c.pos as usize]).0 {
                next.push(Cand {
                    pos: c.pos + 1,
                    ..c
                });
            } else {
                rejects.push(c);
            }
        }
        // Those that got past the terminal go on, against what lies after it in each
        // stack in turn, until one stack accepts them.
        for stack in stacks {
            if next.is_empty() {
                break;
            }
            let top = stack[stack.len() - 1];
            let after = self.match_char(top, 0).1;
            let mut rest = stack[..stack.len() - 1].to_vec();
            if !self.at(after).ends_sequence() {
                rest.push(after);
            }
            let mut next_stacks = StackSet::default();
            // Past the bounds the walk goes on with the stacks found so far: a token it
            // lets through is then refused by `accept`, which ends the generation.
            let _ = self.advance(rest, &mut next_stacks, &mut HashSet::new(), work);
            next = self.reject(&next_stacks.list, next, text, work);
        }
        // Rejected further on by every stack: back to where they started reading, for
        // the caller's other stacks.
        rejects.extend(next.into_iter().map(|c| Cand {
            pos: c.pos - 1,
            ..c
        }));
        rejects
    }
}

/// A token being checked: where its code points are (in a shared array) and how far the
/// walk has read them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cand {
    /// The candidate's index in the caller's list.
    pub(crate) index: u32,
    pub(crate) id: u32,
    pub(crate) pos: u32,
    pub(crate) end: u32,
    pub(crate) partial: Partial,
}

impl Cand {
    fn at_end(&self) -> bool {
        self.pos >= self.end
    }
}

fn char_value(e: Elem) -> u32 {
    match e {
        Elem::Char(v) | Elem::CharNot(v) | Elem::CharAlt(v) | Elem::CharRngUpper(v) => v,
        _ => 0,
    }
}

fn token_matches(e: Elem, token: u32) -> bool {
    match e {
        Elem::Token(t) => t == token,
        Elem::TokenNot(t) => t != token,
        _ => false,
    }
}

/// Stacks in the order first added, each once: a hashed index beside the list, since a
/// grammar's state may hold thousands of stacks and each character re-adds them all.
#[derive(Default)]
pub(crate) struct StackSet {
    pub(crate) list: Vec<Stack>,
    by_hash: HashMap<u64, Vec<u32>>,
    /// The stacks' lengths added up.
    n_positions: usize,
}

impl StackSet {
    /// Adds `s` unless it is already here; whether it was added.
    pub(crate) fn insert(&mut self, s: Stack) -> bool {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        s.hash(&mut h);
        let StackSet {
            list,
            by_hash,
            n_positions,
        } = self;
        let same = by_hash.entry(h.finish()).or_default();
        if same.iter().any(|&i| list[i as usize] == s) {
            return false;
        }
        same.push(list.len() as u32);
        *n_positions += s.len();
        list.push(s);
        true
    }

    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }
}
