//! The generation loop shared by `run`, `chat` and the examples: prompt in batches, then
//! one token per step, streaming text as whole UTF-8 characters.

use crate::context::{Batch, Context, ContextError};
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

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    EndOfGeneration,
    MaxTokens,
    ContextFull,
    Interrupted,
}

/// Feeds `prompt` (from position `n_past`), then samples up to `n_predict` tokens
/// (negative: until the context is full or end of generation). Calls `on_token` with each
/// new token; returning false stops. Returns the tokens generated and why it stopped.
#[allow(clippy::too_many_arguments)]
pub fn generate(
    ctx: &mut Context,
    tok: &Tokenizer,
    sampler: &mut Sampler,
    prompt: &[u32],
    n_past: &mut i32,
    n_predict: i32,
    timings: &mut Timings,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<(Vec<u32>, Stop), ContextError> {
    let n_batch = ctx.params.n_batch as usize;
    let start = Instant::now();
    let mut logits = Vec::new();
    for chunk in prompt.chunks(n_batch) {
        logits = ctx.decode(&Batch::simple(chunk, *n_past, false))?;
        *n_past += chunk.len() as i32;
    }
    timings.prompt += start.elapsed();
    timings.prompt_tokens += prompt.len();
    for &t in prompt {
        sampler.accept(t);
    }
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
        if *n_past as u32 >= ctx.n_ctx() {
            return Ok((out, Stop::ContextFull));
        }
        let step = Instant::now();
        logits = ctx.decode(&Batch::simple(&[t], *n_past, false))?;
        *n_past += 1;
        timings.eval += step.elapsed();
        timings.eval_tokens += 1;
    }
}
