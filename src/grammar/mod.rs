//! Grammar-constrained sampling, as llama.cpp's GBNF grammars constrain it: a grammar
//! ([`Grammar`], parsed once) and its state in one generation ([`GrammarState`]), which
//! masks the tokens that cannot continue the text and advances with each accepted
//! token. JSON schemas become grammars in [`json_schema`].
//!
//! Token pieces are matched as text (control tokens by their written form), character by
//! character, including a UTF-8 character split across tokens; an end-of-generation
//! token is allowed only where the grammar may end. Left-recursive grammars are refused,
//! as in llama.cpp.

mod gbnf;
pub mod json_schema;
mod stacks;
#[cfg(test)]
mod tests;

use crate::tokenizer::Tokenizer;
use gbnf::Elem;
pub(crate) use stacks::MAX_WORK;
use stacks::{Cand, Overflow, Partial, Rules, Stack, StackSet, Work};
use std::cell::Cell;
use std::collections::HashSet;
use std::sync::Arc;

/// What went wrong with a grammar or a JSON schema.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GrammarError {
    #[error("grammar: {0}")]
    Parse(String),
    #[error("grammar: {0}")]
    Invalid(String),
    #[error("JSON schema: {0}")]
    Schema(String),
    #[error(
        "grammar: the token {token} ({piece:?}) does not continue the text the grammar allows"
    )]
    Rejected { token: u32, piece: String },
    #[error(
        "grammar: matching the text needs more than {} stacks, a stack deeper than {}, or more work per token than the matcher allows (an ambiguous or deeply recursive grammar); the generation ends here",
        stacks::MAX_STACKS,
        stacks::MAX_DEPTH
    )]
    TooComplex,
}

/// Longest token piece, in bytes, that a grammar lets through: the check walks a piece
/// one recursion per character, and a model file's vocabulary can hold pieces of any
/// length. Real vocabularies' longest pieces are a few hundred bytes.
const MAX_PIECE_BYTES: usize = 1024;

/// A parsed grammar with its start symbol `root`.
pub struct Grammar {
    rules: Rules,
    /// The stacks before any text.
    start: Vec<Stack>,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar")
            .field("rules", &self.rules.0.len())
            .finish()
    }
}

impl Grammar {
    /// Parses GBNF text. `<text>` token references need the model's tokenizer;
    /// `<[id]>` works without.
    pub fn parse(src: &str, tok: Option<&Tokenizer>) -> Result<Grammar, GrammarError> {
        let lookup = |text: &str| -> Option<u32> {
            let t = tok?.encode(text, false, true);
            (t.len() == 1).then(|| t[0])
        };
        let parsed = gbnf::parse(src, tok.is_some().then_some(&lookup as gbnf::TokenLookup))?;
        if parsed.rules.is_empty() {
            return Err(GrammarError::Invalid("the grammar has no rules".into()));
        }
        let Some(&root) = parsed.symbols.get("root") else {
            return Err(GrammarError::Invalid(
                "the grammar has no 'root' rule (generation starts there)".into(),
            ));
        };
        let rules = Rules(parsed.rules);
        if let Some(i) = left_recursive(&rules) {
            let name = (parsed.symbols.iter())
                .find(|(_, &v)| v as usize == i)
                .map_or("?", |(k, _)| k.as_str());
            return Err(GrammarError::Invalid(format!(
                "left recursion in rule '{name}' is not supported; rewrite it with repetition (* or +)"
            )));
        }
        let mut start = StackSet::default();
        let mut seen = HashSet::new();
        let mut work = Work::new();
        for alt in rules.alternatives(root) {
            let mut stack = Vec::new();
            if !rules.at(alt).ends_sequence() {
                stack.push(alt);
            }
            rules.advance(stack, &mut start, &mut seen, &mut work).map_err(|_| {
                GrammarError::Invalid(format!(
                    "the start of 'root' expands to more than {} alternatives, nests deeper than {} or takes too long to expand; simplify the grammar",
                    stacks::MAX_STACKS,
                    stacks::MAX_DEPTH
                ))
            })?;
        }
        Ok(Grammar {
            rules,
            start: start.list,
        })
    }
}

/// Whether some rule can reach itself without consuming a character (the index of the
/// first one found, in llama.cpp's search order).
///
/// An edge runs from a rule to each rule it refers to at the start of an alternative, or
/// after rules there that have an empty alternative of their own. A depth-first search
/// over those edges with an explicit stack: a chain of rules as long as a request cares to
/// write must not recurse on the parsing thread's stack.
fn left_recursive(rules: &Rules) -> Option<usize> {
    let n = rules.0.len();
    // A rule may be empty if one of its alternatives is nothing but rules that may be
    // empty (none at all included), through any chain of them (`x ::= y`,
    // `y ::= "a" |`). llama.cpp looks only at a rule's own empty alternatives, so it
    // takes `root ::= x root "e"` with those two and then aborts (std::bad_alloc,
    // expanding the recursion); here it is refused as left recursion. Found in time
    // linear in the grammar: each alternative of rule references counts the references
    // not yet known to be empty, and a rule found empty lowers the counts of the
    // alternatives that refer to it.
    let mut may_be_empty = vec![false; n];
    let mut pending: Vec<(usize, usize)> = Vec::new(); // (rule, references left)
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); n]; // rule -> alternatives using it
    let mut found = Vec::new();
    for (i, rule) in rules.0.iter().enumerate() {
        let mut refs: Vec<usize> = Vec::new();
        let mut only_refs = true;
        for e in rule {
            match *e {
                e if e.ends_sequence() => {
                    if only_refs {
                        if refs.is_empty() {
                            found.push(i);
                        } else {
                            let alt = pending.len();
                            pending.push((i, refs.len()));
                            for &r in &refs {
                                users[r].push(alt);
                            }
                        }
                    }
                    refs.clear();
                    only_refs = true;
                }
                Elem::RuleRef(r) if (r as usize) < n => refs.push(r as usize),
                _ => only_refs = false,
            }
        }
    }
    while let Some(i) = found.pop() {
        if std::mem::replace(&mut may_be_empty[i], true) {
            continue;
        }
        for &alt in &users[i] {
            let (rule, left) = &mut pending[alt];
            *left -= 1;
            if *left == 0 && !may_be_empty[*rule] {
                found.push(*rule);
            }
        }
    }
    let leftmost = |i: usize| -> Vec<usize> {
        let mut out = Vec::new();
        let mut open = true;
        for e in &rules.0[i] {
            match *e {
                Elem::RuleRef(r) if open => {
                    out.push(r as usize);
                    open = may_be_empty.get(r as usize).copied().unwrap_or(false);
                }
                e if e.ends_sequence() => open = true,
                _ => open = false,
            }
        }
        out
    };
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        InProgress,
        Done,
    }
    let mut mark = vec![Mark::New; n];
    for root in 0..n {
        if mark[root] != Mark::New {
            continue;
        }
        // (rule, its leftmost references, how many of them were followed)
        let mut path: Vec<(usize, Vec<usize>, usize)> = vec![(root, leftmost(root), 0)];
        mark[root] = Mark::InProgress;
        while let Some((i, refs, k)) = path.last_mut() {
            let Some(&r) = refs.get(*k) else {
                mark[*i] = Mark::Done;
                path.pop();
                continue;
            };
            *k += 1;
            match mark.get(r).copied() {
                Some(Mark::InProgress) => return Some(root),
                Some(Mark::New) => {
                    mark[r] = Mark::InProgress;
                    path.push((r, leftmost(r), 0));
                }
                Some(Mark::Done) | None => {}
            }
        }
    }
    None
}

/// Every token's text as the grammar sees it, decoded once per vocabulary.
pub struct TokenPieces {
    bytes: Vec<Vec<u8>>,
    eog: Vec<bool>,
    /// Code points of every piece (decoded from a clean start), concatenated.
    text: Vec<u32>,
    /// Where each piece's code points start in `text` (one more entry than pieces).
    offsets: Vec<u32>,
    /// The incomplete character each piece ends with.
    tails: Vec<Partial>,
}

impl std::fmt::Debug for TokenPieces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TokenPieces({} tokens)", self.bytes.len())
    }
}

impl TokenPieces {
    pub fn new(tok: &Tokenizer) -> TokenPieces {
        let n = tok.n_vocab() as u32;
        Self::from_pieces(
            (0..n).map(|t| tok.token_to_piece(t, true)).collect(),
            (0..n).map(|t| tok.is_eog(t)).collect(),
        )
    }

    /// Pieces given directly (each token's bytes, and whether it ends generation).
    pub fn from_pieces(bytes: Vec<Vec<u8>>, eog: Vec<bool>) -> TokenPieces {
        let n = bytes.len();
        let mut text = Vec::new();
        let mut offsets = Vec::with_capacity(n + 1);
        let mut tails = Vec::with_capacity(n);
        for b in &bytes {
            offsets.push(text.len() as u32);
            let (cps, tail) = stacks::decode(b, Partial::default());
            text.extend_from_slice(&cps);
            tails.push(tail);
        }
        offsets.push(text.len() as u32);
        TokenPieces {
            bytes,
            eog,
            text,
            offsets,
            tails,
        }
    }

    pub fn n_vocab(&self) -> usize {
        self.bytes.len()
    }

    /// A vocabulary of the 256 bytes (tokens 0..=255) and an end of generation (token
    /// 256): for checking texts against a grammar without a model.
    pub fn bytes() -> TokenPieces {
        let mut pieces: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        pieces.push(b"</s>".to_vec());
        let mut eog = vec![false; 256];
        eog.push(true);
        Self::from_pieces(pieces, eog)
    }
}

/// Whether `grammar` accepts all of `text` and may end after it, read byte by byte.
pub fn accepts_text(grammar: Arc<Grammar>, text: &str) -> bool {
    let mut s = GrammarState::new(grammar, Arc::new(TokenPieces::bytes()));
    for &b in text.as_bytes() {
        if !s.allows(b as u32) || s.accept(b as u32).is_err() {
            return false;
        }
    }
    s.allows(256)
}

/// A grammar's progress through one generation.
#[derive(Clone)]
pub struct GrammarState {
    grammar: Arc<Grammar>,
    pieces: Arc<TokenPieces>,
    stacks: Vec<Stack>,
    partial: Partial,
    /// A check ran out of work ([`stacks::MAX_WORK`]): what it allowed is incomplete, and
    /// the next `accept` ends the generation.
    too_complex: Cell<bool>,
    /// Work done by every check and accept since the start ([`stacks::MAX_WORK`] units).
    work_done: Cell<u64>,
}

impl std::fmt::Debug for GrammarState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarState")
            .field("stacks", &self.stacks.len())
            .finish()
    }
}

impl GrammarState {
    pub fn new(grammar: Arc<Grammar>, pieces: Arc<TokenPieces>) -> GrammarState {
        GrammarState {
            stacks: grammar.start.clone(),
            grammar,
            pieces,
            partial: Partial::default(),
            too_complex: Cell::new(false),
            work_done: Cell::new(0),
        }
    }

    /// Back to the start (a new generation).
    pub fn reset(&mut self) {
        self.stacks = self.grammar.start.clone();
        self.partial = Partial::default();
        self.too_complex.set(false);
        self.work_done.set(0);
    }

    /// The matcher's work in this generation so far, in the units of the bound on each
    /// step: what a grammar has cost the thread that runs it.
    pub fn work_done(&self) -> u64 {
        self.work_done.get()
    }

    /// Whether a check ran out of the work a step may do: it then allowed nothing, and
    /// [`GrammarState::accept`] answers [`GrammarError::TooComplex`].
    pub fn too_complex(&self) -> bool {
        self.too_complex.get()
    }

    /// Whether the text so far is a complete sentence of the grammar.
    pub fn may_end(&self) -> bool {
        self.stacks.iter().any(|s| s.is_empty())
    }

    /// Whether nothing but the end may follow.
    pub fn must_end(&self) -> bool {
        self.stacks.iter().all(|s| s.is_empty()) && self.partial.n_remain == 0
    }

    /// The first end-of-generation token of the vocabulary, if any.
    pub fn eog_token(&self) -> Option<u32> {
        self.pieces.eog.iter().position(|&e| e).map(|i| i as u32)
    }

    /// Whether `token` may come next.
    pub fn allows(&self, token: u32) -> bool {
        let mut ok = [true];
        self.check(&[token], &mut ok);
        ok[0]
    }

    /// Clears `allowed[i]` for each `tokens[i]` that cannot come next.
    pub fn check(&self, tokens: &[u32], allowed: &mut [bool]) {
        let p = &*self.pieces;
        let may_end = self.may_end();
        let mut cands = Vec::with_capacity(tokens.len());
        // Pieces continuing an incomplete character are decoded here; the rest come
        // decoded from `pieces`.
        let mut own_text: Vec<u32> = Vec::new();
        let continuing = self.partial.n_remain > 0;
        for (i, &t) in tokens.iter().enumerate() {
            let Some(bytes) = p.bytes.get(t as usize) else {
                allowed[i] = false;
                continue;
            };
            if p.eog[t as usize] {
                allowed[i] &= may_end;
                continue;
            }
            if bytes.first().is_none_or(|&b| b == 0) {
                allowed[i] = false;
                continue;
            }
            if bytes.len() > MAX_PIECE_BYTES {
                allowed[i] = false;
                continue;
            }
            let (pos, end, partial) = if continuing {
                let (cps, partial) = stacks::decode(bytes, self.partial);
                let pos = own_text.len() as u32;
                own_text.extend_from_slice(&cps);
                (pos, own_text.len() as u32, partial)
            } else {
                let (a, b) = (p.offsets[t as usize], p.offsets[t as usize + 1]);
                (a, b, p.tails[t as usize])
            };
            cands.push(Cand {
                index: i as u32,
                id: t,
                pos,
                end,
                partial,
            });
        }
        let text = if continuing { &own_text } else { &p.text };
        let mut work = Work::new();
        let rejects = self
            .grammar
            .rules
            .reject(&self.stacks, cands, text, &mut work);
        self.count(&work);
        if work.exhausted() {
            // The walk stopped part way: what it let through is only part of what the
            // grammar allows, and sampling from that part would skew the text unseen.
            self.too_complex.set(true);
            allowed.fill(false);
            return;
        }
        for r in rejects {
            allowed[r.index as usize] = false;
        }
    }

    /// Advances past `token`. An end-of-generation token is accepted where the grammar
    /// may end; a token the grammar does not allow is an error (and leaves the state as
    /// it was).
    pub fn accept(&mut self, token: u32) -> Result<(), GrammarError> {
        if self.too_complex.get() {
            return Err(self.stop_too_complex());
        }
        let p = &*self.pieces;
        let Some(bytes) = p.bytes.get(token as usize) else {
            return Err(self.rejected(token));
        };
        if p.eog[token as usize] {
            return if self.may_end() {
                Ok(())
            } else {
                Err(self.rejected(token))
            };
        }
        // Only what `check` allows (a piece starting with NUL spells nothing; one that is
        // only part of a character cannot match a token element).
        if !self.allows(token) {
            return Err(if self.too_complex.get() {
                self.stop_too_complex()
            } else {
                self.rejected(token)
            });
        }
        let (cps, partial) = stacks::decode(bytes, self.partial);
        let next = match self.advance_stacks(token, &cps, partial) {
            Ok(next) => next,
            Err(Overflow) => return Err(self.stop_too_complex()),
        };
        if next.is_empty() {
            return Err(self.rejected(token));
        }
        self.stacks = next;
        self.partial = partial;
        Ok(())
    }

    /// Adds a step's work to [`GrammarState::work_done`].
    fn count(&self, work: &Work) {
        self.work_done
            .set(self.work_done.get() + work.used() as u64);
    }

    /// Nothing more can be matched: the state allows only the end from here.
    fn stop_too_complex(&mut self) -> GrammarError {
        self.stacks.clear();
        self.partial = Partial::default();
        self.too_complex.set(false);
        GrammarError::TooComplex
    }

    /// The stacks after `token`, whose text is `cps` and then the incomplete character
    /// `partial`: only stacks that some completion of it could continue are kept (as
    /// `check` keeps them), and none if the bytes were not UTF-8.
    ///
    /// The stacks that read characters take them together, one character at a time,
    /// with one `seen` per character: a stack that several of them reach is expanded
    /// once.
    fn advance_stacks(
        &self,
        token: u32,
        cps: &[u32],
        partial: Partial,
    ) -> Result<Vec<Stack>, Overflow> {
        let mut work = Work::new();
        let next = self.advance_stacks_with(token, cps, partial, &mut work);
        self.count(&work);
        next
    }

    fn advance_stacks_with(
        &self,
        token: u32,
        cps: &[u32],
        partial: Partial,
        work: &mut Work,
    ) -> Result<Vec<Stack>, Overflow> {
        let rules = &self.grammar.rules;
        let mut next = StackSet::default();
        let mut seen = HashSet::new();
        let mut cur = Vec::new();
        for stack in &self.stacks {
            let Some(&top) = stack.last() else {
                continue;
            };
            if matches!(rules.at(top), Elem::Token(_) | Elem::TokenNot(_)) {
                rules.accept_token_elem(stack, token, &mut next, &mut seen, work)?;
            } else {
                cur.push(stack.clone());
            }
        }
        for &c in cps {
            if cur.is_empty() {
                break;
            }
            let mut after = StackSet::default();
            let mut seen = HashSet::new();
            for s in &cur {
                rules.accept_char(s, c, &mut after, &mut seen, work)?;
            }
            cur = after.list;
        }
        for s in cur {
            let fits = partial.n_remain == 0
                || s.last().is_some_and(|&top| {
                    !matches!(rules.at(top), Elem::Token(_) | Elem::TokenNot(_))
                        && rules.match_partial(top, partial)
                });
            if fits {
                next.insert(s);
            }
        }
        if next.len() > stacks::MAX_STACKS {
            return Err(Overflow);
        }
        Ok(next.list)
    }

    fn rejected(&self, token: u32) -> GrammarError {
        let piece = (self.pieces.bytes.get(token as usize))
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default();
        GrammarError::Rejected { token, piece }
    }
}
