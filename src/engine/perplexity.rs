//! llama-perplexity's method on an engine: non-overlapping chunks of n_ctx tokens, the
//! first token of each replaced by BOS where the model adds one, each chunk scored on its
//! second half with log-softmax in f64.

use super::{Engine, EngineError};
use crate::context::Batch;

/// Negative log-likelihood of `target` under `logits`.
pub fn nll(logits: &[f32], target: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    -(logits[target as usize] as f64 - max - sum.ln())
}

/// The running estimate after a chunk.
#[derive(Clone, Copy, Debug)]
pub struct ChunkScore {
    /// 1-based chunk number.
    pub chunk: usize,
    pub n_chunks: usize,
    /// exp(mean NLL) over every scored token so far.
    pub ppl: f64,
}

/// The final estimate with llama-perplexity's uncertainty.
#[derive(Clone, Copy, Debug)]
pub struct Perplexity {
    pub ppl: f64,
    pub uncertainty: f64,
    pub n_scored: usize,
}

/// How many chunks `n_tokens` give at the engine's context size (`max_chunks` < 0: all).
pub fn n_chunks(engine: &Engine, n_tokens: usize, max_chunks: i64) -> usize {
    let n = n_tokens / engine.n_ctx() as usize;
    if max_chunks >= 0 {
        n.min(max_chunks as usize)
    } else {
        n
    }
}

/// Scores `tokens` chunk by chunk, calling `on_chunk` after each (the engine's sessions
/// must be idle: every chunk clears the cache).
pub fn run(
    engine: &mut Engine,
    tokens: &[u32],
    max_chunks: i64,
    on_chunk: &mut dyn FnMut(&ChunkScore),
) -> Result<Perplexity, EngineError> {
    let n_ctx = engine.n_ctx() as usize;
    let n_chunk = n_chunks(engine, tokens.len(), max_chunks);
    if n_chunk == 0 {
        return Err(EngineError::Options(format!(
            "the text has {} tokens; perplexity needs at least 2 * n_ctx = {} (use a smaller -c)",
            tokens.len(),
            2 * n_ctx
        )));
    }
    let bos = engine
        .tokenizer
        .add_bos()
        .then(|| engine.tokenizer.bos())
        .flatten();
    let n_vocab = engine.model.hp.n_vocab as usize;
    let ctx = engine.context_mut();
    let n_batch = ctx.params.n_batch as usize;
    let first = n_ctx / 2;
    let (mut sum, mut sum2, mut count) = (0.0f64, 0.0f64, 0usize);
    for i in 0..n_chunk {
        let chunk = &tokens[i * n_ctx..(i + 1) * n_ctx];
        let mut input = chunk.to_vec();
        if let Some(b) = bos {
            input[0] = b;
        }
        ctx.clear();
        // Only the scored second half needs logits (as llama-perplexity asks for them):
        // the output projection over the whole vocabulary is most of a small model's work.
        let mut logits = Vec::with_capacity((n_ctx - first) * n_vocab);
        for (b, part) in input.chunks(n_batch).enumerate() {
            let mut batch = Batch::simple(part, (b * n_batch) as i32, false);
            for (k, l) in batch.logits.iter_mut().enumerate() {
                *l = b * n_batch + k >= first;
            }
            logits.extend(ctx.decode(&batch)?);
        }
        for j in first..n_ctx - 1 {
            let row = j - first;
            let v = nll(&logits[row * n_vocab..(row + 1) * n_vocab], chunk[j + 1]);
            sum += v;
            sum2 += v * v;
            count += 1;
        }
        on_chunk(&ChunkScore {
            chunk: i + 1,
            n_chunks: n_chunk,
            ppl: (sum / count as f64).exp(),
        });
    }
    ctx.clear();
    let mean = sum / count as f64;
    let ppl = mean.exp();
    let var = sum2 / count as f64 - mean * mean;
    let uncertainty = if var > 0.0 && count > 1 {
        (var / (count - 1) as f64).sqrt() * ppl
    } else {
        0.0
    };
    Ok(Perplexity {
        ppl,
        uncertainty,
        n_scored: count,
    })
}
