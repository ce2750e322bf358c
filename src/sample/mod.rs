//! Choosing the next token from logits, the way llama.cpp's common sampler does, down to
//! its random draws: the same logits, seed and settings pick the same token.
//!
//! The chain, in llama.cpp's default order:
//! logit bias → penalties (repeat / frequency / presence) → top-n-σ → top-k → typical-p →
//! top-p → min-p → XTC → temperature (optionally dynamic) → random draw.
//!
//! Things that matter for identical picks, all reproduced here:
//! - Randomness comes from `std::mt19937` seeded with the 32-bit seed; the final draw
//!   takes one `uniform_real_distribution<double>` value (two engine outputs) per sampled
//!   token, even when only one candidate is left, and accepting a token draws nothing.
//!   XTC has its own generator with the same seed and takes one
//!   `uniform_real_distribution<float>` value (one output) per token whenever it is on and
//!   at least two candidates reach it.
//! - Candidates are reordered with libstdc++'s unstable `std::sort`/`std::partial_sort`
//!   (plus llama.cpp's bucketed partial sort for more than 128 elements), so tied logits
//!   come out in the same order (`stdsort.rs`).
//! - Precision: logits, temperatures and the truncation samplers' probabilities are
//!   `f32`; the draw exponentiates in `f32` and accumulates in `f64`. `exp`/`ln`/`powf`
//!   are the platform's libm, as in llama.cpp (on Linux both use glibc's).
//! - A grammar ([`crate::grammar`]) constrains the pick as llama.cpp's common sampler
//!   does: the chain runs on the raw logits first; if its token does not fit the
//!   grammar, the chain runs again on logits with every token the grammar rejects set
//!   to -inf, drawing a second random number. Only generated tokens advance the grammar.
//! - DRY, mirostat, adaptive-p and custom sampler orders are not implemented.
//!
//! Tested against llama.cpp itself: `reference_tests.rs` replays tests/data/sampler,
//! recorded by scripts/record-sampler-ref.sh.
//! - `temp <= 0` is not a separate path: the chain still runs, temperature keeps only the
//!   first largest logit (in the order the chain left the candidates) and the draw still
//!   consumes its random number.

use std::collections::VecDeque;

pub mod budget;
mod chain;
#[cfg(test)]
mod fixture;
mod gpu_plan;
mod params;
#[cfg(test)]
mod reference_tests;
pub(crate) mod rng;
mod stdsort;
#[cfg(test)]
mod tests;

use crate::grammar::{GrammarError, GrammarState};
use chain::{
    draw, dynatemp, logit_bias, min_p, penalize, scale_by_temp, top_k, top_n_sigma, top_p, typical,
    xtc,
};
pub use gpu_plan::{dense_bias, gpu_row, FLAG_BIAS, FLAG_PENALTIES, RING_MAX};
use params::fresh_seed;
pub use params::SamplerParams;
use rng::Mt19937;

/// One candidate: llama.cpp's `llama_token_data`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Cand {
    pub(crate) id: u32,
    pub(crate) logit: f32,
    pub(crate) p: f32,
}

/// llama.cpp's candidate order: larger logit first (ties: wherever the sort leaves them).
fn by_logit(a: &Cand, b: &Cand) -> bool {
    a.logit > b.logit
}

/// The candidate list a chain works on (llama.cpp's `llama_token_data_array`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Cands {
    pub(crate) data: Vec<Cand>,
    /// Whether `data` is known to be in [`by_logit`] order.
    pub(crate) sorted: bool,
}

/// What one [`Sampler::sample`] decided, with the final distribution (for tests).
#[derive(Debug, Clone)]
pub(crate) struct Pick {
    pub(crate) token: u32,
    /// The candidates the draw chose from, `p` normalised.
    pub(crate) cands: Vec<Cand>,
    /// Index of the chosen one in `cands`.
    pub(crate) selected: usize,
    /// The uniform number the draw used (mismatch reports of the reference tests).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) rnd: f64,
}

/// A stateful sampler: settings, random generators, and the recent-token history the
/// penalties look at.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplerParams,
    n_vocab: usize,
    seed: u32,
    /// The final draw's generator (llama.cpp's `dist` sampler).
    rng: Mt19937,
    /// XTC's own generator, seeded alike.
    xtc_rng: Mt19937,
    history: VecDeque<u32>,
    cur: Cands,
    scratch: Vec<Cand>,
    /// The grammar's progress through this generation, if the params have one.
    grammar: Option<GrammarState>,
    /// Which candidates the grammar allows (scratch).
    allowed: Vec<bool>,
    /// The thinking budget's progress, if the params have one.
    budget: Option<budget::BudgetState>,
    /// Changes whenever `history` does, unique across samplers: a GPU copy of the
    /// history is current while it remembers the same stamp.
    stamp: u64,
}

/// A fresh history stamp.
fn next_stamp() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Sampler {
    /// A sampler without a grammar (`params.grammar` must be `None`; see
    /// [`Sampler::with_grammar`]).
    pub fn new(params: SamplerParams, n_vocab: usize) -> Self {
        debug_assert!(
            params.grammar.is_none(),
            "a grammar needs Sampler::with_grammar"
        );
        Self::with_grammar(params, n_vocab, None)
    }

    /// A sampler constrained by `grammar` (the parsed form of `params.grammar`).
    pub fn with_grammar(
        params: SamplerParams,
        n_vocab: usize,
        grammar: Option<GrammarState>,
    ) -> Self {
        let seed = params.seed_u32().unwrap_or_else(fresh_seed);
        Self {
            budget: params
                .thinking_budget
                .as_ref()
                .map(budget::BudgetState::new),
            grammar,
            allowed: Vec::new(),
            rng: Mt19937::new(seed),
            xtc_rng: Mt19937::new(seed),
            history: VecDeque::with_capacity(params.repeat_last_n.min(4096)),
            params,
            n_vocab,
            seed,
            cur: Cands::default(),
            scratch: Vec::new(),
            stamp: next_stamp(),
        }
    }

    /// The 32-bit seed actually used (a drawn one when the params asked for a random
    /// seed); passing it as the seed repeats the run.
    pub fn seed(&self) -> u64 {
        self.seed as u64
    }

    pub fn params(&self) -> &SamplerParams {
        &self.params
    }

    /// Accepts a generated token: the grammar advances past it, and the penalties
    /// record it. An error means the grammar does not allow the token (it cannot come
    /// from [`Sampler::sample`]); the penalties record it anyway.
    pub fn accept_generated(&mut self, token: u32) -> Result<(), GrammarError> {
        self.accept(token);
        if let Some(b) = &mut self.budget {
            b.accept(token);
        }
        match &mut self.grammar {
            Some(g) => g.accept(token),
            None => Ok(()),
        }
    }

    /// The token the thinking budget forces next, if it forces one: the GPU chain does
    /// not draw then.
    pub fn forced(&self) -> Option<u32> {
        self.budget.as_ref().and_then(budget::BudgetState::forced)
    }

    /// Whether the grammar allows nothing but the end of generation here.
    pub fn grammar_complete(&self) -> bool {
        self.grammar.as_ref().is_some_and(|g| g.must_end())
    }

    /// Records a token for the penalties (prompt tokens too, if wanted). `sample` does not
    /// call this: the caller accepts what it keeps. Accepting draws no random numbers.
    /// An id outside the vocabulary (a position an image fills, which has no token) is
    /// not recorded, as llama.cpp accepts no token for an image's positions.
    pub fn accept(&mut self, token: u32) {
        if !self.params.penalties_on() || token as usize >= self.n_vocab {
            return;
        }
        if self.history.len() >= self.params.repeat_last_n {
            self.history.pop_front();
        }
        self.history.push_back(token);
        self.stamp = next_stamp();
    }

    /// The tokens the penalties look at, oldest first.
    pub fn penalty_history(&self) -> &VecDeque<u32> {
        &self.history
    }

    /// Identifies the current penalty history (see [`Sampler::penalty_history`]).
    pub fn history_stamp(&self) -> u64 {
        self.stamp
    }

    /// The uniform number the next draw will use, without using it up: the GPU chain
    /// draws with it, and [`Sampler::accept_gpu_pick`] then moves the stream on, so the
    /// stream is where the CPU chain would have left it.
    pub fn peek_uniform(&self) -> f64 {
        self.rng.clone().uniform_f64()
    }

    /// The uniform number `k` draws ahead of the next one (0: [`Sampler::peek_uniform`]),
    /// for a step submitted while earlier draws are still in flight.
    pub fn peek_uniform_at(&self, k: usize) -> f64 {
        let mut rng = self.rng.clone();
        for _ in 0..k {
            rng.uniform_f64();
        }
        rng.uniform_f64()
    }

    /// Takes a token the GPU chain drew with [`Sampler::peek_uniform`]'s number: the
    /// stream moves past that number and the token is accepted as
    /// [`Sampler::accept_generated`] accepts it.
    pub fn accept_gpu_pick(&mut self, token: u32) -> Result<(), GrammarError> {
        self.rng.uniform_f64();
        self.accept_generated(token)
    }

    /// Forgets the penalty history (new conversation). The random streams go on; unlike
    /// llama.cpp's `llama_sampler_reset`, which also reseeds them (see [`Sampler::reseed`]).
    pub fn reset(&mut self) {
        self.history.clear();
        self.stamp = next_stamp();
        if let Some(g) = &mut self.grammar {
            g.reset();
        }
        self.budget = (self.params.thinking_budget.as_ref()).map(budget::BudgetState::new);
    }

    /// Restarts the random streams from the seed (a fresh one if the params asked for a
    /// random seed): with [`Sampler::reset`], what llama.cpp's `llama_sampler_reset` does.
    pub fn reseed(&mut self) {
        self.seed = self.params.seed_u32().unwrap_or_else(fresh_seed);
        self.rng = Mt19937::new(self.seed);
        self.xtc_rng = Mt19937::new(self.seed);
    }

    /// Picks the next token from one position's logits.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        self.run(logits, false).token
    }

    /// [`Sampler::sample`], also returning the distribution the token was drawn from
    /// (after every stage of the chain): the `n` most likely candidates with their
    /// probabilities, most likely first, those of probability 0 left out.
    pub fn sample_with_probs(&mut self, logits: &[f32], n: usize) -> (u32, f32, Vec<(u32, f32)>) {
        let pick = self.run(logits, true);
        let chosen = pick.cands.get(pick.selected).map_or(0.0, |c| c.p);
        let mut top: Vec<(u32, f32)> = (pick.cands.iter())
            .filter(|c| c.p > 0.0)
            .map(|c| (c.id, c.p))
            .collect();
        top.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        top.truncate(n);
        (pick.token, chosen, top)
    }

    /// Runs the chain, again on the grammar's tokens alone if its first pick does not fit
    /// the grammar; `keep` also returns the final candidates.
    pub(crate) fn run(&mut self, logits: &[f32], keep: bool) -> Pick {
        // A forced token is the only candidate (the chain still draws its number, as
        // llama.cpp's does).
        let only;
        let logits = match self.forced().filter(|&t| (t as usize) < logits.len()) {
            Some(t) => {
                let mut l = vec![f32::NEG_INFINITY; logits.len()];
                l[t as usize] = if logits[t as usize].is_finite() {
                    logits[t as usize]
                } else {
                    0.0
                };
                only = l;
                &only[..]
            }
            None => logits,
        };
        let pick = self.run_chain(logits, keep, false, None);
        match &self.grammar {
            Some(g) if !g.allows(pick.token) => self.run_chain(logits, keep, true, None),
            _ => pick,
        }
    }

    /// The chain (no grammar) with the draw's uniform number given instead of drawn:
    /// the reference the GPU chain is compared with. Returns the token, its probability
    /// and the final candidates (p normalised), in the chain's order.
    pub fn pick_with_uniform(&mut self, logits: &[f32], u: f64) -> (u32, f32, Vec<(u32, f32)>) {
        let pick = self.run_chain(logits, true, false, Some(u));
        let p = pick.cands.get(pick.selected).map_or(0.0, |c| c.p);
        let cands = pick.cands.iter().map(|c| (c.id, c.p)).collect();
        (pick.token, p, cands)
    }

    /// Sets the logits of the candidates (still in id order) that the grammar rejects to
    /// -inf; false if it rejects them all.
    fn mask_by_grammar(&mut self, cur: &mut Cands) -> bool {
        let Some(g) = &self.grammar else {
            return true;
        };
        let ids: Vec<u32> = cur.data.iter().map(|c| c.id).collect();
        self.allowed.clear();
        self.allowed.resize(ids.len(), true);
        g.check(&ids, &mut self.allowed);
        let mut any = false;
        for (c, &ok) in cur.data.iter_mut().zip(&self.allowed) {
            if !ok {
                c.logit = f32::NEG_INFINITY;
            }
            any |= ok && c.logit > f32::NEG_INFINITY;
        }
        any
    }

    /// One pass of the chain (`masked`: on the grammar's tokens alone).
    fn run_chain(&mut self, logits: &[f32], keep: bool, masked: bool, u: Option<f64>) -> Pick {
        let n = logits.len().min(self.n_vocab.max(1));
        debug_assert!(
            logits.len() >= self.n_vocab,
            "fewer logits than vocabulary entries"
        );
        let mut cur = std::mem::take(&mut self.cur);
        cur.data.clear();
        cur.data
            .extend(logits[..n].iter().enumerate().map(|(i, &l)| Cand {
                id: i as u32,
                logit: l,
                p: 0.0,
            }));
        cur.sorted = false;
        if cur.data.is_empty() {
            self.cur = cur;
            return Pick {
                token: 0,
                cands: Vec::new(),
                selected: 0,
                rnd: 0.0,
            };
        }
        // The candidates are still indexed by id until the first sort.
        if masked && !self.mask_by_grammar(&mut cur) {
            // Nothing the grammar allows is left (end of generation banned where the
            // grammar must end, or no token spells what it needs): end the generation.
            // Or the grammar is too complex to check: accepting the pick then says so.
            let token = self.grammar.as_ref().and_then(|g| g.eog_token());
            if !self.grammar.as_ref().is_some_and(|g| g.too_complex()) {
                log::warn!("no token fits the grammar here; ending the generation");
            }
            self.cur = cur;
            return Pick {
                token: token.unwrap_or(0),
                cands: Vec::new(),
                selected: 0,
                rnd: 0.0,
            };
        }
        let p = &self.params;
        logit_bias(&mut cur, p);
        if p.penalties_on() {
            penalize(&mut cur, &self.history, p);
        }
        if p.top_n_sigma > 0.0 {
            top_n_sigma(&mut cur, p.top_n_sigma);
        }
        if p.top_k > 0 {
            top_k(&mut cur, p.top_k, &mut self.scratch);
        }
        if p.typical_p < 1.0 {
            typical(&mut cur, p.typical_p, p.min_keep, &mut self.scratch);
        }
        if p.top_p < 1.0 {
            top_p(&mut cur, p.top_p, p.min_keep, &mut self.scratch);
        }
        if p.min_p > 0.0 {
            min_p(&mut cur, p.min_p, p.min_keep, &mut self.scratch);
        }
        if p.xtc_on() {
            xtc(
                &mut cur,
                p.xtc_probability,
                p.xtc_threshold,
                p.min_keep,
                &mut self.xtc_rng,
                &mut self.scratch,
            );
        }
        if p.dynatemp_range > 0.0 {
            dynatemp(
                &mut cur,
                p.temp,
                p.dynatemp_range,
                p.dynatemp_exponent,
                &mut self.scratch,
            );
        } else if p.temp != 1.0 {
            scale_by_temp(&mut cur, p.temp);
        }
        let (selected, rnd) = draw(&mut cur, || u.unwrap_or_else(|| self.rng.uniform_f64()));
        let pick = Pick {
            token: cur.data[selected].id,
            cands: if keep { cur.data.clone() } else { Vec::new() },
            selected,
            rnd,
        };
        self.cur = cur;
        pick
    }
}
