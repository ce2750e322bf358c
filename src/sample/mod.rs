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

#[cfg(test)]
mod fixture;
mod gpu_plan;
#[cfg(test)]
mod reference_tests;
mod rng;
mod stdsort;
#[cfg(test)]
mod tests;

use crate::grammar::{GrammarError, GrammarState};
pub use gpu_plan::{dense_bias, gpu_row, FLAG_BIAS, FLAG_PENALTIES, RING_MAX};
use rng::Mt19937;

/// Sampling settings; the defaults are llama.cpp's (`common_params_sampling`).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerParams {
    /// Temperature; `<= 0` keeps only the most likely token (greedy).
    pub temp: f32,
    /// Dynamic temperature: the temperature ranges over `temp ± dynatemp_range` with the
    /// normalised entropy of the candidates; `<= 0` disables.
    pub dynatemp_range: f32,
    /// Dynamic temperature: the exponent applied to the normalised entropy.
    pub dynatemp_exponent: f32,
    /// Keep the k most likely tokens; `<= 0` keeps all.
    pub top_k: i32,
    /// Keep the smallest set of tokens whose probability reaches p; `>= 1` disables.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` × the most likely one; `<= 0` disables.
    pub min_p: f32,
    /// Locally typical sampling; `>= 1` disables.
    pub typical_p: f32,
    /// Keep tokens whose logit is within `top_n_sigma` standard deviations of the
    /// largest; `<= 0` disables.
    pub top_n_sigma: f32,
    /// XTC: the chance, per token, of removing all but the least likely of the tokens
    /// above `xtc_threshold`; `<= 0` disables.
    pub xtc_probability: f32,
    /// XTC threshold; `> 0.5` disables XTC.
    pub xtc_threshold: f32,
    /// The fewest candidates top-p, min-p, typical-p and XTC leave (0: no minimum).
    pub min_keep: usize,
    /// Penalty for tokens seen in the last `repeat_last_n`; `1.0` disables.
    pub repeat_penalty: f32,
    /// Subtracted from a logit once per occurrence in the last `repeat_last_n` tokens.
    pub frequency_penalty: f32,
    /// Subtracted from a logit once if the token occurs in the last `repeat_last_n`.
    pub presence_penalty: f32,
    /// How many recent tokens the penalties look at; `0` disables them.
    pub repeat_last_n: usize,
    /// DRY repetition penalty. Not implemented: must stay 0 ([`SamplerParams::validate`]).
    pub dry_multiplier: f32,
    /// Added to the given tokens' logits before anything else (`-inf` bans a token).
    pub logit_bias: Vec<(u32, f32)>,
    /// Random seed; only its low 32 bits are used, as llama.cpp's seed is a `uint32_t`.
    /// [`SamplerParams::RANDOM_SEED`] (low bits all ones) picks a fresh one.
    pub seed: u64,
    /// Tokens never sampled: a logit bias of -inf after `logit_bias` (what llama.cpp's
    /// --ignore-eos adds for the end-of-generation tokens).
    pub banned: Vec<u32>,
    /// A GBNF grammar the generated text must follow (llama.cpp's `--grammar`; JSON
    /// schemas arrive converted by [`crate::grammar::json_schema`]).
    pub grammar: Option<String>,
}

impl SamplerParams {
    /// llama.cpp's `LLAMA_DEFAULT_SEED`: draw a seed from the system.
    pub const RANDOM_SEED: u64 = 0xFFFF_FFFF;

    /// Argmax decoding (llama.cpp's `--temp 0`).
    pub fn greedy() -> Self {
        Self {
            temp: 0.0,
            ..Self::default()
        }
    }

    /// Rejects settings llama.cpp refuses (non-finite or non-positive repeat penalty,
    /// non-finite frequency/presence penalties, NaN elsewhere) and DRY, which is not built.
    pub fn validate(&self) -> Result<(), String> {
        let r = self.repeat_penalty;
        if !r.is_finite() || r <= 0.0 || !(1.0 / r).is_finite() {
            return Err(format!(
                "repeat_penalty must be finite and greater than 0, got {r}"
            ));
        }
        for (name, v) in [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            if !v.is_finite() {
                return Err(format!("{name} must be finite, got {v}"));
            }
        }
        for (name, v) in [
            ("temp", self.temp),
            ("dynatemp_range", self.dynatemp_range),
            ("dynatemp_exponent", self.dynatemp_exponent),
            ("top_p", self.top_p),
            ("min_p", self.min_p),
            ("typical_p", self.typical_p),
            ("top_n_sigma", self.top_n_sigma),
            ("xtc_probability", self.xtc_probability),
            ("xtc_threshold", self.xtc_threshold),
        ] {
            if v.is_nan() {
                return Err(format!("{name} must be a number, got NaN"));
            }
        }
        if let Some(&(t, _)) = self.logit_bias.iter().find(|(_, b)| b.is_nan()) {
            return Err(format!("logit_bias for token {t} is NaN"));
        }
        if self.dry_multiplier != 0.0 {
            return Err(format!(
                "DRY sampling is not built (dry_multiplier must be 0, got {})",
                self.dry_multiplier
            ));
        }
        Ok(())
    }

    /// The 32-bit seed llama.cpp would use, or `None` for a random one.
    fn seed_u32(&self) -> Option<u32> {
        let s = self.seed as u32;
        (s != Self::RANDOM_SEED as u32).then_some(s)
    }

    pub(crate) fn penalties_on(&self) -> bool {
        self.repeat_last_n > 0
            && !(self.repeat_penalty == 1.0
                && self.frequency_penalty == 0.0
                && self.presence_penalty == 0.0)
    }

    pub(crate) fn xtc_on(&self) -> bool {
        !(self.xtc_probability <= 0.0 || self.xtc_threshold > 0.5)
    }
}

impl Default for SamplerParams {
    fn default() -> Self {
        Self {
            temp: 0.8,
            dynatemp_range: 0.0,
            dynatemp_exponent: 1.0,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            typical_p: 1.0,
            top_n_sigma: -1.0,
            xtc_probability: 0.0,
            xtc_threshold: 0.1,
            min_keep: 0,
            repeat_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            repeat_last_n: 64,
            dry_multiplier: 0.0,
            logit_bias: Vec::new(),
            seed: Self::RANDOM_SEED,
            banned: Vec::new(),
            grammar: None,
        }
    }
}

/// A fresh 32-bit seed (never `RANDOM_SEED` itself, so it can be passed back).
fn fresh_seed() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        web_time::SystemTime::now()
            .duration_since(web_time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    let x = h.finish();
    let s = (x ^ (x >> 32)) as u32;
    if s == SamplerParams::RANDOM_SEED as u32 {
        0
    } else {
        s
    }
}

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
        match &mut self.grammar {
            Some(g) => g.accept(token),
            None => Ok(()),
        }
    }

    /// Whether the grammar allows nothing but the end of generation here.
    pub fn grammar_complete(&self) -> bool {
        self.grammar.as_ref().is_some_and(|g| g.must_end())
    }

    /// Records a token for the penalties (prompt tokens too, if wanted). `sample` does not
    /// call this: the caller accepts what it keeps. Accepting draws no random numbers.
    pub fn accept(&mut self, token: u32) {
        if !self.params.penalties_on() {
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

/// `std::max(a, b)`: `b` only if `a < b` (so NaN never replaces a value, nor is replaced).
fn cpp_max(a: f32, b: f32) -> f32 {
    if a < b {
        b
    } else {
        a
    }
}

fn logit_bias(cur: &mut Cands, p: &SamplerParams) {
    let bias = p
        .logit_bias
        .iter()
        .copied()
        .chain(p.banned.iter().map(|&t| (t, f32::NEG_INFINITY)));
    for (t, b) in bias {
        // A token past the candidates matches none of them.
        if let Some(c) = cur.data.get_mut(t as usize) {
            c.logit += b;
        }
    }
}

/// Repetition, frequency and presence penalties over the tokens in `history` (the last
/// `repeat_last_n` accepted): a token seen `count` times has a positive logit divided by
/// (a non-positive one multiplied by) `repeat_penalty` once, then
/// `count·frequency + presence` subtracted.
fn penalize(cur: &mut Cands, history: &VecDeque<u32>, p: &SamplerParams) {
    let mut seen: Vec<u32> = history.iter().copied().collect();
    seen.sort_unstable();
    for run in seen.chunk_by(|a, b| a == b) {
        // Candidates are in id order here (nothing has sorted them yet).
        let Some(c) = cur.data.get_mut(run[0] as usize) else {
            continue;
        };
        let count = run.len();
        if c.logit <= 0.0 {
            c.logit *= p.repeat_penalty;
        } else {
            c.logit /= p.repeat_penalty;
        }
        c.logit -= count as f32 * p.frequency_penalty + 1.0 * p.presence_penalty;
    }
    cur.sorted = false;
}

/// Masks (to -inf) logits more than `n` standard deviations below the largest.
fn top_n_sigma(cur: &mut Cands, n: f32) {
    if cur.data.len() <= 1 {
        return;
    }
    let mut max = cur.data[0].logit;
    let mut sum = 0.0f32;
    let mut valid = 0usize;
    for c in &cur.data {
        if c.logit != f32::NEG_INFINITY {
            max = cpp_max(max, c.logit);
            sum += c.logit;
            valid += 1;
        }
    }
    let mean = if valid > 0 { sum / valid as f32 } else { 0.0 };
    // The squares are taken (and summed) in double, the sum rounded back to float each step.
    let mut acc = 0.0f32;
    for c in &cur.data {
        if c.logit != f32::NEG_INFINITY {
            let d = (c.logit - mean) as f64;
            acc = (acc as f64 + d * d) as f32;
        }
    }
    let std = if valid > 0 {
        (acc / valid as f32).sqrt()
    } else {
        0.0
    };
    let cut = max - n * std;
    for c in &mut cur.data {
        if c.logit < cut {
            c.logit = f32::NEG_INFINITY;
        }
    }
}

/// llama.cpp's bucketed partial sort for large arrays: candidates go into 128 logit
/// buckets over [-10, 10) (outside: the end buckets), in their current order; the top
/// buckets that together hold at least `npartial` are `std::sort`ed, the last of them
/// only `std::partial_sort`ed as far as needed. `out` gets those buckets' candidates
/// (at least `npartial`, the first `npartial` in order).
fn bucket_partial_sort(cur: &[Cand], npartial: usize, out: &mut Vec<Cand>) {
    const NB: usize = 128;
    const LOW: f32 = -10.0;
    const HIGH: f32 = 10.0;
    let scale: f32 = NB as f32 / (HIGH - LOW);
    let inter: f32 = -LOW * scale;
    let bucket = |l: f32| -> usize {
        let x = scale * l + inter;
        // C++ `int(x)` as x86 computes it: out of range (or NaN) gives INT_MIN.
        let i = if !(-2_147_483_648.0..2_147_483_648.0).contains(&x) {
            i32::MIN
        } else {
            x as i32
        };
        i.clamp(0, NB as i32 - 1) as usize
    };
    let mut histo = [0usize; NB];
    let idx: Vec<u8> = cur
        .iter()
        .map(|c| {
            let b = bucket(c.logit);
            histo[b] += 1;
            b as u8
        })
        .collect();
    let mut nhave = 0;
    let mut ib = NB - 1;
    loop {
        nhave += histo[ib];
        if nhave >= npartial || ib == 0 {
            break;
        }
        ib -= 1;
    }
    // Start of each kept bucket in `out`, highest bucket first.
    let mut start = [0usize; NB];
    let mut at = 0;
    for j in (ib..NB).rev() {
        start[j] = at;
        at += histo[j];
    }
    out.clear();
    out.resize(
        nhave,
        Cand {
            id: 0,
            logit: 0.0,
            p: 0.0,
        },
    );
    for (c, &b) in cur.iter().zip(&idx) {
        let b = b as usize;
        if b >= ib {
            out[start[b]] = *c;
            start[b] += 1;
        }
    }
    let mut at = 0;
    let mut done = 0;
    for j in (ib + 1..NB).rev() {
        stdsort::sort(&mut out[at..at + histo[j]], &by_logit);
        at += histo[j];
        done += histo[j];
    }
    stdsort::partial_sort(&mut out[at..at + histo[ib]], npartial - done, &by_logit);
}

/// llama.cpp's in-place partial sort: keeps only the first `npartial`, in order.
fn partial_sort_inplace(cur: &mut Cands, npartial: usize, scratch: &mut Vec<Cand>) {
    if npartial <= 128 {
        stdsort::partial_sort(&mut cur.data, npartial, &by_logit);
    } else {
        bucket_partial_sort(&cur.data, npartial, scratch);
        cur.data[..npartial].copy_from_slice(&scratch[..npartial]);
    }
    cur.data.truncate(npartial);
    cur.sorted = true;
}

/// Softmax into `p` (float, max-subtracted), sorting first if `sort` is set.
fn softmax(cur: &mut Cands, sort: bool, scratch: &mut Vec<Cand>) {
    assert!(!cur.data.is_empty());
    if sort && !cur.sorted {
        let n = cur.data.len();
        partial_sort_inplace(cur, n, scratch);
    }
    let mut max = cur.data[0].logit;
    if !cur.sorted {
        for c in &cur.data[1..] {
            max = cpp_max(max, c.logit);
        }
    }
    let mut sum = 0.0f32;
    for c in &mut cur.data {
        c.p = (c.logit - max).exp();
        sum += c.p;
    }
    for c in &mut cur.data {
        c.p /= sum;
    }
}

fn top_k(cur: &mut Cands, k: i32, scratch: &mut Vec<Cand>) {
    let k = (k as usize).min(cur.data.len());
    if !cur.sorted {
        partial_sort_inplace(cur, k, scratch);
    }
    cur.data.truncate(k);
}

/// Locally typical sampling: keeps the tokens whose surprise is closest to the entropy,
/// until their probability exceeds `p`. Leaves the candidates in that order (unsorted).
fn typical(cur: &mut Cands, p: f32, min_keep: usize, scratch: &mut Vec<Cand>) {
    softmax(cur, true, scratch);
    let mut entropy = 0.0f32;
    for c in &cur.data {
        entropy += -c.p * c.p.ln();
    }
    let shifted: Vec<f32> = cur
        .data
        .iter()
        .map(|c| (-c.p.ln() - entropy).abs())
        .collect();
    let mut order: Vec<usize> = (0..cur.data.len()).collect();
    stdsort::sort(&mut order, &|&a: &usize, &b: &usize| {
        shifted[a] < shifted[b]
    });
    let mut cum = 0.0f32;
    let mut last = order.len();
    for (i, &k) in order.iter().enumerate() {
        cum += cur.data[k].p;
        if cum > p && (min_keep == 0 || i + 1 >= min_keep) {
            last = i + 1;
            break;
        }
    }
    scratch.clear();
    scratch.extend(order[..last].iter().map(|&k| cur.data[k]));
    cur.data.clear();
    cur.data.extend_from_slice(scratch);
    cur.sorted = false;
}

/// Nucleus sampling: keeps the most likely tokens until their probability reaches `p`.
fn top_p(cur: &mut Cands, p: f32, min_keep: usize, buf: &mut Vec<Cand>) {
    softmax(cur, false, buf);
    let size = cur.data.len();
    let mut k = size;
    // When unsorted and large, sort only the top 256 first, and everything only if the
    // nucleus turns out bigger than that.
    let mut in_buf = false;
    if !cur.sorted && size > 1024 {
        k = size.min(256);
        bucket_partial_sort(&cur.data, k, buf);
        in_buf = true;
    } else if !cur.sorted {
        partial_sort_inplace(cur, k, buf);
    }
    let mut cum = 0.0f32;
    let mut last = size;
    for i in 0..size {
        cum += if in_buf { buf[i].p } else { cur.data[i].p };
        if cum >= p && i + 1 >= min_keep {
            last = i + 1;
            break;
        }
        if !cur.sorted && i == k - 1 {
            k = size;
            bucket_partial_sort(&cur.data, k, buf);
        }
    }
    if !cur.sorted {
        cur.data.clear();
        cur.data.extend_from_slice(&buf[..last]);
        cur.sorted = true;
    }
    cur.data.truncate(last);
}

/// Drops tokens whose probability is below `p` × the largest, i.e. whose logit is below
/// `max + ln p`.
fn min_p(cur: &mut Cands, p: f32, min_keep: usize, scratch: &mut Vec<Cand>) {
    if cur.data.is_empty() {
        return;
    }
    if !cur.sorted {
        let mut max = -f32::MAX;
        for c in &cur.data {
            max = cpp_max(max, c.logit);
        }
        let min_logit = max + p.ln();
        scratch.clear();
        scratch.extend(cur.data.iter().filter(|c| c.logit >= min_logit).copied());
        if !scratch.is_empty() && scratch.len() >= min_keep {
            cur.data.clear();
            cur.data.extend_from_slice(scratch);
            return;
        }
        let n = cur.data.len();
        partial_sort_inplace(cur, n, scratch);
    }
    let min_logit = cur.data[0].logit + p.ln();
    let mut i = 1;
    while i < cur.data.len() {
        if cur.data[i].logit < min_logit && i >= min_keep {
            break;
        }
        i += 1;
    }
    cur.data.truncate(i);
}

/// Exclude Top Choices: with chance `prob`, drops every token at or above `threshold`
/// probability except the least likely of them.
fn xtc(
    cur: &mut Cands,
    prob: f32,
    threshold: f32,
    min_keep: usize,
    rng: &mut Mt19937,
    scratch: &mut Vec<Cand>,
) {
    if cur.data.len() < 2 {
        return;
    }
    let chance = rng.uniform_f32();
    if chance > prob {
        return;
    }
    softmax(cur, true, scratch);
    let mut pos_last = 0;
    for (i, c) in cur.data.iter().enumerate() {
        if c.p >= threshold {
            pos_last = i;
        } else {
            break;
        }
    }
    if cur.data.len() - pos_last >= min_keep && pos_last > 0 {
        cur.data.drain(..pos_last);
    }
}

/// Divides the logits by `temp`; `temp <= 0` keeps only the first largest logit (all
/// others become -inf).
fn scale_by_temp(cur: &mut Cands, temp: f32) {
    if cur.data.is_empty() {
        return;
    }
    if temp <= 0.0 {
        let mut max_i = 0;
        let mut max_l = cur.data[0].logit;
        for i in 1..cur.data.len() {
            if cur.data[i].logit > max_l {
                cur.data[max_i].logit = f32::NEG_INFINITY;
                max_i = i;
                max_l = cur.data[i].logit;
            } else {
                cur.data[i].logit = f32::NEG_INFINITY;
            }
        }
        return;
    }
    for c in &mut cur.data {
        c.logit /= temp;
    }
}

/// Dynamic temperature: maps the candidates' normalised entropy to a temperature in
/// `[max(0, temp - range), temp + range]`.
fn dynatemp(cur: &mut Cands, temp: f32, range: f32, exponent: f32, scratch: &mut Vec<Cand>) {
    let min_temp = 0.0f32.max(temp - range);
    let max_temp = temp + range;
    if cur.data.len() <= 1 {
        return;
    }
    let max_entropy = -(1.0f32 / cur.data.len() as f32).ln();
    softmax(cur, true, scratch);
    let mut entropy = 0.0f32;
    for c in &cur.data {
        if c.p > 0.0 {
            entropy -= c.p * c.p.ln();
        }
    }
    let normalized = entropy / max_entropy;
    let dyn_temp = min_temp + (max_temp - min_temp) * normalized.powf(exponent);
    scale_by_temp(cur, dyn_temp);
    // Probabilities for the scaled logits, in double (the draw recomputes its own).
    let max = cur.data[0].logit as f64;
    let mut sum = 0.0f64;
    for c in &mut cur.data {
        let p = (c.logit as f64 - max).exp();
        c.p = p as f32;
        sum += p;
    }
    for c in &mut cur.data {
        c.p = (c.p as f64 / sum) as f32;
    }
}

/// The final draw: softmax (float exponentials, double sums), one uniform double `u`,
/// and the first candidate where the running sum reaches `u` × the total. Returns the
/// chosen index and `u`. Draws even for a single candidate.
fn draw(cur: &mut Cands, mut uniform: impl FnMut() -> f64) -> (usize, f64) {
    if cur.data.len() == 1 {
        let u = uniform();
        cur.data[0].p = 1.0;
        return (0, u);
    }
    let mut max = cur.data[0].logit;
    if !cur.sorted {
        for c in &cur.data[1..] {
            max = cpp_max(max, c.logit);
        }
    }
    let mut total = 0.0f64;
    for c in &mut cur.data {
        c.p = (c.logit - max).exp();
        total += c.p as f64;
    }
    let u = uniform();
    let target = total * u;
    let mut run = 0.0f64;
    let mut selected = None;
    for (i, c) in cur.data.iter_mut().enumerate() {
        if selected.is_none() {
            run += c.p as f64;
            if run >= target {
                selected = Some(i);
            }
        }
        c.p = (c.p as f64 / total) as f32;
    }
    (selected.unwrap_or(cur.data.len() - 1), u)
}
