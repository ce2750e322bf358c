//! GBNF text to rules: llama.cpp's grammar language, parsed into the flat element lists
//! the matcher walks.
//!
//! A rule is a list of [`Elem`]s: alternatives separated by `Alt`, closed by `End`. A
//! character set is one `Char`/`CharNot`/`CharAny` followed by `CharAlt`s and
//! `CharRngUpper`s (the upper end of a range). Groups become generated rules, and
//! repetitions are rewritten into chains of optional rules the way llama.cpp rewrites
//! them, so a grammar accepts exactly the strings it accepts there, with the same limits
//! (2000 repetitions).

use super::GrammarError;
use std::collections::HashMap;

/// One element of a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Elem {
    /// The end of a rule.
    End,
    /// The start of another alternative.
    Alt,
    RuleRef(u32),
    /// A character set's first character (or range start).
    Char(u32),
    /// A negated set's first character.
    CharNot(u32),
    /// Another character of the set.
    CharAlt(u32),
    /// The upper end of a range whose lower end precedes it.
    CharRngUpper(u32),
    /// `.`: any character.
    CharAny,
    /// `<[id]>` or `<text>`: exactly this token.
    Token(u32),
    /// `!<...>`: any token but this one.
    TokenNot(u32),
}

impl Elem {
    /// End of an alternative.
    pub(crate) fn ends_sequence(self) -> bool {
        matches!(self, Elem::End | Elem::Alt)
    }
}

/// The most repetitions (and repeated rules) llama.cpp allows.
const MAX_REPETITIONS: u64 = 2000;

/// How deep groups may nest. The parser recurses once per group, on whichever thread
/// parses (a server's worker with a small stack): a request of `((((...` nested 100 000
/// deep must get an error, not overflow that stack. Written grammars and those made from
/// JSON schemas nest a few levels.
pub(crate) const MAX_NESTING: usize = 256;

/// The most elements the rules may hold in all (8 bytes each). Repetition multiplies an
/// item (`"...long literal..."{2000}`, many times over), so a short text could otherwise
/// expand to gigabytes.
pub(crate) const MAX_ELEMS: usize = 1 << 22;

/// Parsed rules, indexed by symbol id, with the names they were given.
pub(crate) struct Parsed {
    pub(crate) rules: Vec<Vec<Elem>>,
    pub(crate) symbols: HashMap<String, u32>,
}

/// Turns `<text>` into the one token it must encode to.
pub(crate) type TokenLookup<'a> = &'a dyn Fn(&str) -> Option<u32>;

pub(crate) fn parse(src: &str, lookup: Option<TokenLookup>) -> Result<Parsed, GrammarError> {
    let mut p = Parser {
        src: src.as_bytes(),
        pos: 0,
        rules: Vec::new(),
        symbols: HashMap::new(),
        lookup,
        depth: 0,
        n_elems: 0,
    };
    p.skip_space(true);
    while p.pos < p.src.len() {
        p.rule()?;
    }
    let name_of = |id: u32| {
        (p.symbols.iter())
            .find(|(_, &v)| v == id)
            .map_or("?".to_string(), |(k, _)| k.clone())
    };
    for (i, rule) in p.rules.iter().enumerate() {
        if rule.is_empty() {
            return Err(GrammarError::Parse(format!(
                "undefined rule identifier '{}'",
                name_of(i as u32)
            )));
        }
        for e in rule {
            if let Elem::RuleRef(id) = *e {
                if p.rules.get(id as usize).is_none_or(|r| r.is_empty()) {
                    return Err(GrammarError::Parse(format!(
                        "undefined rule identifier '{}'",
                        name_of(id)
                    )));
                }
            }
        }
    }
    Ok(Parsed {
        rules: p.rules,
        symbols: p.symbols,
    })
}

struct Parser<'a> {
    src: &'a [u8],
    pos: usize,
    rules: Vec<Vec<Elem>>,
    symbols: HashMap<String, u32>,
    lookup: Option<TokenLookup<'a>>,
    /// Groups open around the current position.
    depth: usize,
    /// Elements in `rules` so far.
    n_elems: usize,
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-'
}

impl<'a> Parser<'a> {
    fn peek(&self) -> u8 {
        self.src.get(self.pos).copied().unwrap_or(0)
    }
    fn peek_at(&self, k: usize) -> u8 {
        self.src.get(self.pos + k).copied().unwrap_or(0)
    }

    /// An error at the current position: line, column and what follows.
    fn error(&self, what: &str) -> GrammarError {
        let before = &self.src[..self.pos.min(self.src.len())];
        let line = before.iter().filter(|&&c| c == b'\n').count() + 1;
        let col = before.iter().rev().take_while(|&&c| c != b'\n').count() + 1;
        let rest = String::from_utf8_lossy(&self.src[self.pos.min(self.src.len())..]);
        let rest: String = rest.lines().next().unwrap_or("").chars().take(40).collect();
        let at = if rest.is_empty() {
            "the end".to_string()
        } else {
            format!("'{rest}'")
        };
        GrammarError::Parse(format!("{what} at line {line}, column {col} ({at})"))
    }

    fn skip_space(&mut self, newline_ok: bool) {
        loop {
            match self.peek() {
                b' ' | b'\t' => self.pos += 1,
                b'\r' | b'\n' if newline_ok => self.pos += 1,
                b'#' => {
                    while !matches!(self.peek(), 0 | b'\r' | b'\n') {
                        self.pos += 1;
                    }
                }
                _ => return,
            }
        }
    }

    fn name(&mut self) -> Result<&'a str, GrammarError> {
        let start = self.pos;
        while is_word(self.peek()) {
            self.pos += 1;
        }
        if start == self.pos {
            return Err(self.error("expecting a name"));
        }
        // Word characters are ASCII.
        Ok(std::str::from_utf8(&self.src[start..self.pos]).unwrap_or_default())
    }

    fn int(&mut self) -> Result<u64, GrammarError> {
        let start = self.pos;
        while self.peek().is_ascii_digit() {
            self.pos += 1;
        }
        if start == self.pos {
            return Err(self.error("expecting an integer"));
        }
        let digits = std::str::from_utf8(&self.src[start..self.pos]).unwrap_or_default();
        digits
            .parse()
            .map_err(|_| self.error("the number is too large"))
    }

    fn symbol(&mut self, name: &str) -> u32 {
        let next = self.symbols.len() as u32;
        *self.symbols.entry(name.to_string()).or_insert(next)
    }

    /// A fresh symbol for a group or repetition inside rule `base`.
    fn generated_symbol(&mut self, base: &str) -> u32 {
        let id = self.symbols.len() as u32;
        self.symbols.insert(format!("{base}_{id}"), id);
        id
    }

    /// Refuses a grammar that would hold more than [`MAX_ELEMS`] elements once `more`
    /// are added.
    fn budget(&self, more: usize) -> Result<(), GrammarError> {
        if self.n_elems.saturating_add(more) > MAX_ELEMS {
            return Err(self.error(&format!(
                "the grammar expands to more than {MAX_ELEMS} elements; reduce its repetitions or the length of repeated items"
            )));
        }
        Ok(())
    }

    fn add_rule(&mut self, id: u32, rule: Vec<Elem>) {
        self.n_elems += rule.len();
        let i = id as usize;
        if self.rules.len() <= i {
            self.rules.resize(i + 1, Vec::new());
        }
        self.rules[i] = rule;
    }

    fn rule(&mut self) -> Result<(), GrammarError> {
        let name = self.name()?;
        self.skip_space(false);
        let id = self.symbol(name);
        if !self.src[self.pos..].starts_with(b"::=") {
            return Err(self.error("expecting ::="));
        }
        self.pos += 3;
        self.skip_space(true);
        self.alternates(name, id, false)?;
        match self.peek() {
            b'\r' => self.pos += if self.peek_at(1) == b'\n' { 2 } else { 1 },
            b'\n' => self.pos += 1,
            0 if self.pos >= self.src.len() => {}
            _ => return Err(self.error("expecting a newline or the end")),
        }
        self.skip_space(true);
        Ok(())
    }

    fn alternates(&mut self, name: &str, id: u32, nested: bool) -> Result<(), GrammarError> {
        let mut rule = Vec::new();
        self.sequence(name, &mut rule, nested)?;
        while self.peek() == b'|' {
            rule.push(Elem::Alt);
            self.pos += 1;
            self.skip_space(true);
            self.sequence(name, &mut rule, nested)?;
        }
        rule.push(Elem::End);
        self.add_rule(id, rule);
        Ok(())
    }

    /// One character of a literal or set: an escape or one UTF-8 character.
    fn char(&mut self) -> Result<u32, GrammarError> {
        if self.pos >= self.src.len() || self.peek() == 0 {
            return Err(self.error("unexpected end of input"));
        }
        if self.peek() == b'\\' {
            let c = self.peek_at(1);
            let hex = match c {
                b'x' => 2,
                b'u' => 4,
                b'U' => 8,
                b't' | b'r' | b'n' | b'\\' | b'"' | b'[' | b']' | b'-' => {
                    self.pos += 2;
                    return Ok(match c {
                        b't' => '\t' as u32,
                        b'r' => '\r' as u32,
                        b'n' => '\n' as u32,
                        other => other as u32,
                    });
                }
                _ => return Err(self.error("unknown escape")),
            };
            let start = self.pos + 2;
            let mut v = 0u32;
            for k in 0..hex {
                let d = (self.src.get(start + k).copied())
                    .and_then(|b| (b as char).to_digit(16))
                    .ok_or_else(|| {
                        self.error(&format!("expecting {hex} hex digits after \\{}", c as char))
                    })?;
                v = (v << 4) | d;
            }
            self.pos = start + hex;
            return Ok(v);
        }
        let (v, len) = decode_one(&self.src[self.pos..]);
        self.pos += len;
        Ok(v)
    }

    fn token(&mut self) -> Result<u32, GrammarError> {
        let start = self.pos;
        if self.peek() != b'<' {
            return Err(self.error("expecting '<'"));
        }
        self.pos += 1;
        if self.peek() == b'[' {
            self.pos += 1;
            let id = self.int()?;
            let id = u32::try_from(id).map_err(|_| self.error("token id too large"))?;
            if self.peek() != b']' || self.peek_at(1) != b'>' {
                return Err(self.error("expecting ']>'"));
            }
            self.pos += 2;
            return Ok(id);
        }
        while !matches!(self.peek(), 0 | b'>') {
            self.pos += 1;
        }
        if self.peek() != b'>' {
            return Err(self.error("expecting '>'"));
        }
        self.pos += 1;
        let text = String::from_utf8_lossy(&self.src[start..self.pos]).into_owned();
        let Some(lookup) = self.lookup else {
            return Err(self.error("no vocabulary to look the token up in"));
        };
        lookup(&text).ok_or_else(|| {
            GrammarError::Parse(format!(
                "invalid token '{text}': it is not exactly one token of this model's vocabulary"
            ))
        })
    }

    fn sequence(
        &mut self,
        name: &str,
        rule: &mut Vec<Elem>,
        nested: bool,
    ) -> Result<(), GrammarError> {
        let mut last_start = rule.len();
        let mut n_prev_rules: u64 = 1;
        while self.pos < self.src.len() {
            let c = self.peek();
            match c {
                b'"' => {
                    self.pos += 1;
                    last_start = rule.len();
                    n_prev_rules = 1;
                    while self.peek() != b'"' {
                        let ch = self.char()?;
                        rule.push(Elem::Char(ch));
                    }
                    self.pos += 1;
                    self.skip_space(nested);
                }
                b'[' => {
                    self.pos += 1;
                    let negated = self.peek() == b'^';
                    if negated {
                        self.pos += 1;
                    }
                    last_start = rule.len();
                    n_prev_rules = 1;
                    while self.peek() != b']' {
                        let ch = self.char()?;
                        rule.push(if last_start < rule.len() {
                            Elem::CharAlt(ch)
                        } else if negated {
                            Elem::CharNot(ch)
                        } else {
                            Elem::Char(ch)
                        });
                        if self.peek() == b'-' && self.peek_at(1) != b']' {
                            if self.pos + 1 >= self.src.len() {
                                return Err(self.error("unexpected end of input"));
                            }
                            self.pos += 1;
                            let hi = self.char()?;
                            rule.push(Elem::CharRngUpper(hi));
                        }
                    }
                    self.pos += 1;
                    self.skip_space(nested);
                }
                b'<' | b'!' => {
                    let not = c == b'!';
                    if not {
                        self.pos += 1;
                    }
                    let id = self.token()?;
                    last_start = rule.len();
                    n_prev_rules = 1;
                    rule.push(if not {
                        Elem::TokenNot(id)
                    } else {
                        Elem::Token(id)
                    });
                    self.skip_space(nested);
                }
                c if is_word(c) => {
                    let r = self.name()?;
                    let id = self.symbol(r);
                    self.skip_space(nested);
                    last_start = rule.len();
                    n_prev_rules = 1;
                    rule.push(Elem::RuleRef(id));
                }
                b'(' => {
                    if self.depth >= MAX_NESTING {
                        return Err(self.error(&format!(
                            "groups nested more than {MAX_NESTING} deep; name the inner groups as rules"
                        )));
                    }
                    self.pos += 1;
                    self.skip_space(true);
                    let before = self.symbols.len() as u64;
                    let sub = self.generated_symbol(name);
                    self.depth += 1;
                    let inner = self.alternates(name, sub, true);
                    self.depth -= 1;
                    inner?;
                    n_prev_rules = (self.symbols.len() as u64 - before).max(1);
                    last_start = rule.len();
                    rule.push(Elem::RuleRef(sub));
                    if self.peek() != b')' {
                        return Err(self.error("expecting ')'"));
                    }
                    self.pos += 1;
                    self.skip_space(nested);
                }
                b'.' => {
                    last_start = rule.len();
                    n_prev_rules = 1;
                    rule.push(Elem::CharAny);
                    self.pos += 1;
                    self.skip_space(nested);
                }
                b'*' | b'+' | b'?' => {
                    self.pos += 1;
                    self.skip_space(nested);
                    let (lo, hi) = match c {
                        b'*' => (0, None),
                        b'+' => (1, None),
                        _ => (0, Some(1)),
                    };
                    self.repeat(name, rule, last_start, &mut n_prev_rules, lo, hi)?;
                }
                b'{' => {
                    self.pos += 1;
                    self.skip_space(nested);
                    if !self.peek().is_ascii_digit() {
                        return Err(self.error("expecting an integer"));
                    }
                    let lo = self.int()?;
                    self.skip_space(nested);
                    let mut hi = None;
                    if self.peek() == b'}' {
                        hi = Some(lo);
                        self.pos += 1;
                    } else if self.peek() == b',' {
                        self.pos += 1;
                        self.skip_space(nested);
                        if self.peek().is_ascii_digit() {
                            hi = Some(self.int()?);
                            self.skip_space(nested);
                        }
                        if self.peek() != b'}' {
                            return Err(self.error("expecting '}'"));
                        }
                        self.pos += 1;
                    } else {
                        return Err(self.error("expecting ','"));
                    }
                    self.skip_space(nested);
                    if lo > MAX_REPETITIONS {
                        return Err(self.error(&format!(
                            "more than {MAX_REPETITIONS} repetitions; reduce the count"
                        )));
                    }
                    // A bound past the limit means no bound, as in llama.cpp.
                    let hi = hi.filter(|&h| h <= MAX_REPETITIONS);
                    self.repeat(name, rule, last_start, &mut n_prev_rules, lo, hi)?;
                }
                _ => break,
            }
        }
        Ok(())
    }

    /// Rewrites the item at `rule[last_start..]` as repeated `lo` to `hi` (None: no upper
    /// bound) times: `lo` copies, then a chain of optional rules.
    fn repeat(
        &mut self,
        name: &str,
        rule: &mut Vec<Elem>,
        last_start: usize,
        n_prev_rules: &mut u64,
        lo: u64,
        hi: Option<u64>,
    ) -> Result<(), GrammarError> {
        if last_start == rule.len() {
            return Err(self.error("expecting an item before */+/?/{"));
        }
        let item: Vec<Elem> = rule[last_start..].to_vec();
        let total = match hi {
            Some(h) if h > 0 => h,
            _ if lo > 0 => lo,
            _ => 1,
        };
        if n_prev_rules.saturating_mul(total) > MAX_REPETITIONS {
            return Err(self.error(&format!(
                "repeating this makes more than {MAX_REPETITIONS} rules; reduce the repetitions or the rule's complexity"
            )));
        }
        let n_opt = match hi {
            None => 1,
            Some(h) => h.saturating_sub(lo),
        };
        // `lo - 1` more copies here, and `n_opt` rules of the item and up to three more.
        let copies = (lo.saturating_sub(1)).saturating_add(n_opt) as usize;
        let more = copies.saturating_mul(item.len() + 3);
        self.budget(rule.len().saturating_add(more))?;
        if lo == 0 {
            rule.truncate(last_start);
        } else {
            for _ in 1..lo {
                rule.extend_from_slice(&item);
            }
        }
        let mut last_rec = 0u32;
        for i in 0..n_opt {
            let id = self.generated_symbol(name);
            let mut rec = item.clone();
            if hi.is_none() {
                rec.push(Elem::RuleRef(id));
            } else if i > 0 {
                rec.push(Elem::RuleRef(last_rec));
            }
            rec.push(Elem::Alt);
            rec.push(Elem::End);
            self.add_rule(id, rec);
            last_rec = id;
        }
        if n_opt > 0 {
            rule.push(Elem::RuleRef(last_rec));
        }
        *n_prev_rules *= total;
        Ok(())
    }
}

/// One UTF-8 character at the start of `s` (as llama.cpp reads it, without validation):
/// its code point and length.
fn decode_one(s: &[u8]) -> (u32, usize) {
    let first = s[0];
    let len = match first >> 4 {
        0xC | 0xD => 2,
        0xE => 3,
        0xF => 4,
        _ => 1,
    };
    let mut v = first as u32 & ((1u32 << (8 - len)) - 1);
    let mut n = 1;
    while n < len && n < s.len() && s[n] != 0 {
        v = (v << 6) | (s[n] & 0x3F) as u32;
        n += 1;
    }
    (v, n)
}
