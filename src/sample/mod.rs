//! Choosing the next token from logits, as llama.cpp's default sampler chain:
//! repetition penalty → top-k → top-p → min-p → temperature → random draw.
//!
//! Truncation (top-p, min-p) looks at the untempered distribution because temperature
//! comes last in that chain. With `temp <= 0` the penalised argmax is taken (greedy).
//! The random draw uses our own PCG32, so a given seed does not reproduce llama.cpp's
//! (Mersenne-Twister) random sequence, only its distribution.

use std::collections::{HashSet, VecDeque};

#[cfg(test)]
mod tests;

/// Sampling settings; the defaults are llama.cpp's.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerParams {
    /// Temperature; `<= 0` means greedy.
    pub temp: f32,
    /// Keep the k most likely tokens; `<= 0` keeps all.
    pub top_k: i32,
    /// Keep the smallest set of tokens whose probability reaches p; `>= 1` disables.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` × the most likely one; `<= 0` disables.
    pub min_p: f32,
    /// Penalty for tokens seen in the last `repeat_last_n`; `1.0` disables.
    pub repeat_penalty: f32,
    /// How many recent tokens the repetition penalty looks at; `0` disables.
    pub repeat_last_n: usize,
    /// Random seed; [`SamplerParams::RANDOM_SEED`] picks a fresh one each run.
    pub seed: u64,
    /// Tokens never sampled (a logit bias of -inf, as llama.cpp's --ignore-eos sets).
    pub banned: Vec<u32>,
}

impl SamplerParams {
    /// llama.cpp's "no seed given" value: draw a seed from the system.
    pub const RANDOM_SEED: u64 = 0xFFFF_FFFF;

    /// Argmax decoding.
    pub fn greedy() -> Self {
        Self {
            temp: 0.0,
            ..Self::default()
        }
    }
}

impl Default for SamplerParams {
    fn default() -> Self {
        Self {
            temp: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: Self::RANDOM_SEED,
            banned: Vec::new(),
        }
    }
}

/// PCG32 (XSH-RR): small, fast, and good enough for picking tokens.
#[derive(Debug, Clone)]
struct Pcg32 {
    state: u64,
    inc: u64,
}

impl Pcg32 {
    const MUL: u64 = 6364136223846793005;

    fn new(seed: u64) -> Self {
        let mut r = Self {
            state: 0,
            inc: (0xda3e39cb94b95bdb_u64 << 1) | 1,
        };
        r.next_u32();
        r.state = r.state.wrapping_add(seed);
        r.next_u32();
        r
    }

    fn next_u32(&mut self) -> u32 {
        let old = self.state;
        self.state = old.wrapping_mul(Self::MUL).wrapping_add(self.inc);
        let xorshifted = (((old >> 18) ^ old) >> 27) as u32;
        xorshifted.rotate_right((old >> 59) as u32)
    }

    /// Uniform in [0, 1) with 53 bits of precision.
    fn next_f64(&mut self) -> f64 {
        let hi = (self.next_u32() >> 5) as u64; // 27 bits
        let lo = (self.next_u32() >> 6) as u64; // 26 bits
        ((hi << 26) | lo) as f64 / (1u64 << 53) as f64
    }
}

fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        web_time::SystemTime::now()
            .duration_since(web_time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

#[derive(Debug, Clone, Copy)]
struct Cand {
    id: u32,
    logit: f32,
}

/// A stateful sampler: settings, RNG, and the recent-token history for penalties.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplerParams,
    n_vocab: usize,
    rng: Pcg32,
    seed: u64,
    history: VecDeque<u32>,
}

impl Sampler {
    pub fn new(params: SamplerParams, n_vocab: usize) -> Self {
        let seed = if params.seed == SamplerParams::RANDOM_SEED {
            fresh_seed()
        } else {
            params.seed
        };
        Self {
            rng: Pcg32::new(seed),
            history: VecDeque::with_capacity(params.repeat_last_n),
            params,
            n_vocab,
            seed,
        }
    }

    /// The seed actually used (a drawn one when the params asked for a random seed).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    pub fn params(&self) -> &SamplerParams {
        &self.params
    }

    /// Records a token for the repetition penalty (prompt tokens too, if wanted).
    /// `sample` does not call this: the caller accepts what it keeps.
    pub fn accept(&mut self, token: u32) {
        if self.params.repeat_last_n == 0 {
            return;
        }
        if self.history.len() == self.params.repeat_last_n {
            self.history.pop_front();
        }
        self.history.push_back(token);
    }

    /// Forgets the penalty history (new conversation).
    pub fn reset(&mut self) {
        self.history.clear();
    }

    /// Picks the next token from one position's logits.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let n = logits.len().min(self.n_vocab.max(1));
        debug_assert!(
            logits.len() >= self.n_vocab,
            "fewer logits than vocabulary entries"
        );
        let mut c: Vec<Cand> = logits[..n]
            .iter()
            .enumerate()
            .map(|(i, &l)| Cand {
                id: i as u32,
                logit: l,
            })
            .collect();
        if c.is_empty() {
            return 0;
        }
        for &b in &self.params.banned {
            if let Some(x) = c.get_mut(b as usize) {
                x.logit = f32::NEG_INFINITY;
            }
        }
        self.penalize(&mut c);
        let p = &self.params;
        if p.temp <= 0.0 {
            // First maximum, like a strict `>` scan.
            let best = c
                .iter()
                .fold(c[0], |b, x| if x.logit > b.logit { *x } else { b });
            return best.id;
        }
        top_k(&mut c, p.top_k);
        top_p(&mut c, p.top_p);
        min_p(&mut c, p.min_p);
        for x in c.iter_mut() {
            x.logit /= p.temp;
        }
        self.draw(&c)
    }

    /// Repetition penalty over the distinct tokens in the history: a positive logit is
    /// divided by the penalty, a non-positive one multiplied, so both become less likely.
    fn penalize(&self, c: &mut [Cand]) {
        let pen = self.params.repeat_penalty;
        if pen == 1.0 || self.history.is_empty() {
            return;
        }
        let mut seen = HashSet::with_capacity(self.history.len());
        for &t in &self.history {
            if !seen.insert(t) {
                continue;
            }
            // Candidates are still indexed by id here.
            if let Some(x) = c.get_mut(t as usize) {
                x.logit = if x.logit <= 0.0 {
                    x.logit * pen
                } else {
                    x.logit / pen
                };
            }
        }
    }

    fn draw(&mut self, c: &[Cand]) -> u32 {
        let probs = softmax(c);
        let u = self.rng.next_f64();
        let mut acc = 0.0f64;
        for (x, &pr) in c.iter().zip(&probs) {
            acc += pr as f64;
            if u < acc {
                return x.id;
            }
        }
        // Rounding left `u` past the total: take the last token with any mass.
        c.iter()
            .zip(&probs)
            .rev()
            .find(|(_, &p)| p > 0.0)
            .map_or(c[0].id, |(x, _)| x.id)
    }
}

/// Sorts by logit, highest first (ties: lower id first).
fn sort_desc(c: &mut [Cand]) {
    c.sort_by(|a, b| b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id)));
}

fn softmax(c: &[Cand]) -> Vec<f32> {
    let max = c.iter().map(|x| x.logit).fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = c.iter().map(|x| (x.logit - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

fn top_k(c: &mut Vec<Cand>, k: i32) {
    if k <= 0 || k as usize >= c.len() {
        sort_desc(c);
        return;
    }
    let k = k as usize;
    c.select_nth_unstable_by(k - 1, |a, b| {
        b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
    });
    c.truncate(k);
    sort_desc(c);
}

/// Keeps the shortest most-likely prefix whose probability reaches `p` (at least one).
/// Expects `c` sorted.
fn top_p(c: &mut Vec<Cand>, p: f32) {
    if p >= 1.0 {
        return;
    }
    let probs = softmax(c);
    let mut cum = 0.0f32;
    let mut keep = c.len();
    for (i, pr) in probs.iter().enumerate() {
        cum += pr;
        if cum >= p {
            keep = i + 1;
            break;
        }
    }
    c.truncate(keep.max(1));
}

/// Keeps tokens with probability ≥ `p` × the top probability, i.e. logit ≥ max + ln p.
/// Expects `c` sorted.
fn min_p(c: &mut Vec<Cand>, p: f32) {
    if p <= 0.0 || c.is_empty() {
        return;
    }
    let min_logit = c[0].logit + p.ln();
    let keep = c.iter().take_while(|x| x.logit >= min_logit).count();
    c.truncate(keep.max(1));
}
