//! A budget of thinking tokens, as llama.cpp's reasoning-budget sampler keeps it: after
//! the opening tag's tokens, each generated token counts; when the budget is spent the
//! next tokens are forced (an optional message, then the closing tag), after which the
//! reply goes on freely. A closing tag the model writes itself ends the count; a new
//! opening tag starts a fresh one. The generation prompt's tokens are replayed first,
//! so a template that opens the turn inside the tag counts from the first token.
//!
//! One difference: llama.cpp waits for a token that ends a UTF-8 character before it
//! forces; here the forcing starts at once (the sampler knows no token texts).

use std::collections::VecDeque;

/// The budget's settings, as token ids (the server tokenizes the template's tags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThinkingBudget {
    /// Tokens of thinking before the closing tag is forced (0: at once).
    pub tokens: u32,
    /// The opening tag's tokens.
    pub start: Vec<u32>,
    /// The closing tag's tokens.
    pub end: Vec<u32>,
    /// What is forced when the budget is spent: the message's tokens, then the closing
    /// tag's.
    pub forced: Vec<u32>,
    /// The generation prompt's tokens, replayed before the first generated one.
    pub prefill: Vec<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Outside thinking.
    Idle,
    /// Inside thinking, this many tokens left.
    Counting(u32),
    /// Forcing `forced[i]` next.
    Forcing(usize),
    /// Thinking ended (a new opening tag re-arms).
    Done,
}

/// Recognises one token sequence in a stream of tokens.
#[derive(Debug, Clone)]
struct Matcher {
    recent: VecDeque<u32>,
}

impl Matcher {
    fn new() -> Matcher {
        Matcher {
            recent: VecDeque::new(),
        }
    }

    /// Whether `token` completes `seq`; a match starts the stream afresh.
    fn advance(&mut self, seq: &[u32], token: u32) -> bool {
        if seq.is_empty() {
            return false;
        }
        if self.recent.len() == seq.len() {
            self.recent.pop_front();
        }
        self.recent.push_back(token);
        let hit = self.recent.len() == seq.len() && self.recent.iter().eq(seq.iter());
        if hit {
            self.recent.clear();
        }
        hit
    }

    fn reset(&mut self) {
        self.recent.clear();
    }
}

/// The budget's progress through one generation.
#[derive(Debug, Clone)]
pub struct BudgetState {
    params: ThinkingBudget,
    state: State,
    start: Matcher,
    end: Matcher,
}

impl BudgetState {
    /// A fresh budget, the generation prompt replayed.
    pub fn new(params: &ThinkingBudget) -> BudgetState {
        let mut b = BudgetState {
            params: params.clone(),
            state: State::Idle,
            start: Matcher::new(),
            end: Matcher::new(),
        };
        for t in params.prefill.clone() {
            b.accept(t);
        }
        b
    }

    /// The token that must come next, if the budget is forcing one.
    pub fn forced(&self) -> Option<u32> {
        match self.state {
            State::Forcing(i) => self.params.forced.get(i).copied(),
            _ => None,
        }
    }

    /// Moves past a token of the reply.
    pub fn accept(&mut self, token: u32) {
        let p = &self.params;
        self.state = match self.state {
            State::Idle | State::Done => {
                if self.start.advance(&p.start, token) {
                    self.end.reset();
                    self.arm()
                } else {
                    self.state
                }
            }
            State::Counting(left) => {
                if self.end.advance(&p.end, token) {
                    State::Done
                } else if left <= 1 {
                    self.end.reset();
                    State::Forcing(0)
                } else {
                    State::Counting(left - 1)
                }
            }
            State::Forcing(i) => {
                self.end.advance(&p.end, token);
                if i + 1 >= p.forced.len() {
                    State::Done
                } else {
                    State::Forcing(i + 1)
                }
            }
        };
    }

    fn arm(&self) -> State {
        match self.params.tokens {
            0 if !self.params.forced.is_empty() => State::Forcing(0),
            0 => State::Done,
            n => State::Counting(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(tokens: u32, prefill: Vec<u32>) -> BudgetState {
        BudgetState::new(&ThinkingBudget {
            tokens,
            start: vec![10, 11],
            end: vec![20],
            forced: vec![30, 20],
            prefill,
        })
    }

    /// Feeds the reply, taking forced tokens where the budget forces: the tokens that
    /// came out.
    fn run(b: &mut BudgetState, model: &[u32]) -> Vec<u32> {
        let mut out = Vec::new();
        let mut model = model.iter();
        while out.len() < 12 {
            let t = match b.forced() {
                Some(t) => t,
                None => match model.next() {
                    Some(&t) => t,
                    None => break,
                },
            };
            b.accept(t);
            out.push(t);
        }
        out
    }

    #[test]
    fn the_closing_tag_is_forced_when_the_budget_is_spent() {
        let mut b = budget(3, vec![]);
        assert_eq!(
            run(&mut b, &[1, 10, 11, 2, 3, 4, 5, 6]),
            [1, 10, 11, 2, 3, 4, 30, 20, 5, 6]
        );
    }

    #[test]
    fn a_closing_tag_written_in_time_ends_the_count_and_a_new_one_rearms() {
        let mut b = budget(3, vec![]);
        let out = run(&mut b, &[10, 11, 2, 20, 5, 10, 11, 1, 2, 3, 4]);
        assert_eq!(out, [10, 11, 2, 20, 5, 10, 11, 1, 2, 3, 30, 20]);
    }

    #[test]
    fn a_prefilled_opening_counts_from_the_first_token_and_zero_forces_at_once() {
        let mut b = budget(2, vec![7, 10, 11]);
        assert_eq!(run(&mut b, &[1, 2, 3]), [1, 2, 30, 20, 3]);
        let mut b = budget(0, vec![10, 11]);
        assert_eq!(run(&mut b, &[1, 2]), [30, 20, 1, 2]);
    }
}
