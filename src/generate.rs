//! The generation loop shared by `run`, `chat` and the examples: prompt in batches, then
//! one token per step, streaming text as whole UTF-8 characters.

use crate::context::{Batch, Context, ContextError, FullReason};
use crate::sample::Sampler;
use crate::tokenizer::Tokenizer;
use std::time::{Duration, Instant};

/// Counters printed at the end as llama.cpp prints them.
#[derive(Clone, Debug, Default)]
pub struct Timings {
    pub load: Duration,
    pub prompt: Duration,
    pub prompt_tokens: usize,
    pub eval: Duration,
    pub eval_tokens: usize,
}

impl Timings {
    fn line(label: &str, d: Duration, n: usize, unit: &str) -> String {
        let ms = d.as_secs_f64() * 1e3;
        let per = if n > 0 { ms / n as f64 } else { 0.0 };
        let tps = if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
        format!("{label} = {ms:10.2} ms / {n:5} {unit} ({per:8.2} ms per token, {tps:8.2} tokens per second)")
    }

    /// The summary block (for stderr).
    pub fn report(&self) -> String {
        let total = self.load + self.prompt + self.eval;
        [
            format!(
                "wgllm_perf:        load time = {:10.2} ms",
                self.load.as_secs_f64() * 1e3
            ),
            Self::line(
                "wgllm_perf: prompt eval time",
                self.prompt,
                self.prompt_tokens,
                "tokens",
            ),
            Self::line(
                "wgllm_perf:        eval time",
                self.eval,
                self.eval_tokens,
                "runs  ",
            ),
            format!(
                "wgllm_perf:       total time = {:10.2} ms / {:5} tokens",
                total.as_secs_f64() * 1e3,
                self.prompt_tokens + self.eval_tokens
            ),
        ]
        .join("\n")
    }
}

/// Turns token pieces into text, holding back an incomplete UTF-8 sequence.
#[derive(Default)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(s) => s.len(),
            // An error with no length is an incomplete tail: keep it for the next piece.
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.pending.len(),
        };
        let text = String::from_utf8_lossy(&self.pending[..valid]).into_owned();
        self.pending.drain(..valid);
        text
    }

    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

/// What to do when the cache fills up: llama.cpp's context shift (keep the first
/// `n_keep` tokens, drop half of the rest) or Self-Extend (group positions by `ga_n`
/// beyond windows of `ga_w`). With neither, a full context stops generation.
#[derive(Clone, Copy, Debug)]
pub struct ShiftPolicy {
    pub context_shift: bool,
    pub n_keep: i32,
    pub ga_n: i32,
    pub ga_w: i32,
}

impl Default for ShiftPolicy {
    fn default() -> Self {
        Self {
            context_shift: true,
            n_keep: 0,
            ga_n: 1,
            ga_w: 512,
        }
    }
}

/// A cache operation the feeder performed, as llama.cpp's reference loop records them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheOp {
    pub op: &'static str,
    pub p0: i32,
    pub p1: i32,
    pub v: i32,
    pub n_past: i32,
}

/// Feeds tokens of sequence 0 into a context the way llama-completion does: in chunks of
/// n_batch, shifting the context (or applying Self-Extend) before a chunk that would not
/// fit. Tracks n_past and logs every cache operation.
pub struct Feeder<'a> {
    pub ctx: &'a mut Context,
    pub policy: ShiftPolicy,
    pub n_past: i32,
    ga_i: i32,
    pub ops: Vec<CacheOp>,
    /// Print the cell view after every decode (`-dkvc`).
    pub dump_cells: bool,
}

impl<'a> Feeder<'a> {
    pub fn new(ctx: &'a mut Context, policy: ShiftPolicy) -> Result<Self, ContextError> {
        if policy.ga_n < 1
            || (policy.ga_n > 1 && (policy.ga_w <= 0 || policy.ga_w % policy.ga_n != 0))
        {
            return Err(ContextError::BadBatch(format!(
                "--grp-attn-n {} / --grp-attn-w {}: the width must be a positive multiple of the factor",
                policy.ga_n, policy.ga_w
            )));
        }
        Ok(Self {
            ctx,
            policy,
            n_past: 0,
            ga_i: 0,
            ops: Vec::new(),
            dump_cells: false,
        })
    }

    fn log(&mut self, op: &'static str, p0: i32, p1: i32, v: i32) {
        log::debug!("cache: {op}({p0}, {p1}, {v}) at n_past {}", self.n_past);
        self.ops.push(CacheOp {
            op,
            p0,
            p1,
            v,
            n_past: self.n_past,
        });
    }

    /// Makes room for `n` more tokens (context shift) or regroups positions (Self-Extend).
    fn before_decode(&mut self, n: i32) -> Result<(), ContextError> {
        let n_ctx = self.ctx.n_ctx() as i32;
        let p = self.policy;
        if p.ga_n == 1 {
            if self.n_past + n >= n_ctx {
                let n_discard = (self.n_past - p.n_keep) / 2;
                if !p.context_shift || n_discard <= 0 {
                    return Err(ContextError::ContextFull {
                        n_ctx: n_ctx as u32,
                        reason: if p.context_shift {
                            FullReason::KeepTooLarge
                        } else {
                            FullReason::ShiftOff
                        },
                    });
                }
                let (keep, past) = (p.n_keep, self.n_past);
                self.ctx.seq_rm(Some(0), keep, keep + n_discard)?;
                self.log("seq_rm", keep, keep + n_discard, 0);
                self.ctx.seq_add(0, keep + n_discard, past, -n_discard)?;
                self.log("seq_add", keep + n_discard, past, -n_discard);
                self.n_past -= n_discard;
            }
        } else {
            let (ga_n, ga_w) = (p.ga_n, p.ga_w);
            while self.n_past >= self.ga_i + ga_w {
                let ib = (ga_n * self.ga_i) / ga_w;
                let bd = (ga_w / ga_n) * (ga_n - 1);
                let dd = (ga_w / ga_n) - ib * bd - ga_w;
                let (gi, past) = (self.ga_i, self.n_past);
                self.ctx.seq_add(0, gi, past, ib * bd)?;
                self.log("seq_add", gi, past, ib * bd);
                self.ctx
                    .seq_div(0, gi + ib * bd, gi + ib * bd + ga_w, ga_n)?;
                self.log("seq_div", gi + ib * bd, gi + ib * bd + ga_w, ga_n);
                self.ctx
                    .seq_add(0, gi + ib * bd + ga_w, past + ib * bd, dd)?;
                self.log("seq_add", gi + ib * bd + ga_w, past + ib * bd, dd);
                self.n_past -= bd;
                self.ga_i += ga_w / ga_n;
            }
            // Grouping lowers n_past but frees no cell: the cells in use fill up first.
            let used = self.ctx.cells().used() as i32;
            if self.n_past.max(used) + n > n_ctx {
                return Err(ContextError::ContextFull {
                    n_ctx: n_ctx as u32,
                    reason: FullReason::SelfExtend,
                });
            }
        }
        Ok(())
    }

    /// Decodes `tokens` in chunks of n_batch; returns the logits of the last one.
    pub fn feed(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ContextError> {
        let n_batch = self.ctx.params.n_batch as usize;
        let mut logits = Vec::new();
        for chunk in tokens.chunks(n_batch) {
            self.before_decode(chunk.len() as i32)?;
            // Positions continue from the sequence's largest one, as llama.cpp assigns them
            // to a batch without positions. After Self-Extend this is below n_past.
            let pos = self.ctx.cells().seq_pos_max(0) + 1;
            logits = self.ctx.decode(&Batch::simple(chunk, pos, false))?;
            self.n_past += chunk.len() as i32;
            if self.dump_cells {
                eprint!("\n{}", self.ctx.cells().view());
            }
        }
        Ok(logits)
    }

    /// Feeds one token per step (teacher forcing): the logits after each, n_vocab apiece.
    pub fn feed_each(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>, ContextError> {
        tokens.iter().map(|&t| self.feed(&[t])).collect()
    }
}

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    EndOfGeneration,
    MaxTokens,
    /// The context filled up; the reason says why no room could be made.
    ContextFull(FullReason),
    Interrupted,
}

/// Feeds `prompt`, then samples up to `n_predict` tokens (negative: without limit, until
/// end of generation or, without context shift, a full context). Calls `on_token` with
/// each new token; returning false stops. Returns the tokens generated and why it stopped.
pub fn generate(
    feeder: &mut Feeder,
    tok: &Tokenizer,
    sampler: &mut Sampler,
    prompt: &[u32],
    n_predict: i32,
    timings: &mut Timings,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<(Vec<u32>, Stop), ContextError> {
    match feed_prompt(feeder, sampler, prompt, 0, timings) {
        Err(ContextError::ContextFull { reason, .. }) => {
            Ok((Vec::new(), Stop::ContextFull(reason)))
        }
        Err(e) => Err(e),
        Ok(logits) => {
            continue_generation(feeder, tok, sampler, logits, n_predict, timings, on_token)
        }
    }
}

/// Feeds the part of `prompt` not already cached (`prompt[cached..]`, at least the last
/// token, whose logits are needed) and returns those logits; a full context is the
/// `ContextFull` error, which says why. The whole prompt enters the sampler's history.
pub fn feed_prompt(
    feeder: &mut Feeder,
    sampler: &mut Sampler,
    prompt: &[u32],
    cached: usize,
    timings: &mut Timings,
) -> Result<Vec<f32>, ContextError> {
    let cached = cached.min(prompt.len().saturating_sub(1));
    let start = Instant::now();
    let logits = feeder.feed(&prompt[cached..])?;
    timings.prompt += start.elapsed();
    timings.prompt_tokens += prompt.len() - cached;
    for &t in prompt {
        sampler.accept(t);
    }
    Ok(logits)
}

/// Samples from `logits` and feeds each sampled token back, as [`generate`] does after
/// the prompt.
pub fn continue_generation(
    feeder: &mut Feeder,
    tok: &Tokenizer,
    sampler: &mut Sampler,
    mut logits: Vec<f32>,
    n_predict: i32,
    timings: &mut Timings,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<(Vec<u32>, Stop), ContextError> {
    let mut out = Vec::new();
    loop {
        if n_predict >= 0 && out.len() >= n_predict as usize {
            return Ok((out, Stop::MaxTokens));
        }
        let t = sampler.sample(&logits);
        sampler.accept(t);
        if tok.is_eog(t) {
            return Ok((out, Stop::EndOfGeneration));
        }
        out.push(t);
        if !on_token(t) {
            return Ok((out, Stop::Interrupted));
        }
        let step = Instant::now();
        logits = match feeder.feed(&[t]) {
            Err(ContextError::ContextFull { reason, .. }) => {
                return Ok((out, Stop::ContextFull(reason)))
            }
            other => other?,
        };
        timings.eval += step.elapsed();
        timings.eval_tokens += 1;
    }
}
