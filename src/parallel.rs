//! Several sequences decoded together: a shared prefix (a system prompt) is decoded once
//! in sequence 0 and shared with the others through seq_cp, then every sequence's own
//! prompt and each generation step go through the GPU in one batch, as llama.cpp's
//! `parallel` example serves its clients.

use crate::context::{Batch, Context, ContextError};
use crate::sample::Sampler;

/// One sequence's request: its own prompt tokens (after the shared prefix) and sampler.
pub struct Request {
    pub prompt: Vec<u32>,
    pub sampler: Sampler,
    /// Most tokens to generate.
    pub n_predict: usize,
}

/// Decodes `prefix` once and every request after it, request i in sequence i; returns
/// the tokens each generated. A request stops at `n_predict` or when `is_end` says so
/// (the end token is not returned). Needs a context with n_seq_max >= requests.
pub fn decode_shared_prefix(
    ctx: &mut Context,
    prefix: &[u32],
    requests: &mut [Request],
    is_end: &dyn Fn(u32) -> bool,
) -> Result<Vec<Vec<u32>>, ContextError> {
    let n = requests.len();
    if n as u32 > ctx.params.n_seq_max {
        return Err(ContextError::BadSeq {
            seq: n as u32 - 1,
            n_seq_max: ctx.params.n_seq_max,
        });
    }
    if requests.iter().any(|r| r.prompt.is_empty()) && prefix.is_empty() {
        return Err(ContextError::BadBatch(
            "a request has no tokens at all".into(),
        ));
    }
    for s in 0..n as u32 {
        ctx.seq_rm(Some(s), -1, -1)?;
    }
    let n_batch = ctx.params.n_batch as usize;
    // The prefix once, in sequence 0, then shared: cells then belong to every sequence.
    for (i, chunk) in prefix.chunks(n_batch).enumerate() {
        let b = Batch::simple(chunk, (i * n_batch) as i32, false);
        ctx.decode(&b)?;
    }
    for s in 1..n as u32 {
        ctx.seq_cp(0, s, -1, -1)?;
    }
    // Every request's prompt: tokens of all sequences share batches, logits for the last
    // of each. A request with an empty prompt needs the prefix's last logits again, so
    // its last prefix token is decoded anew in its own sequence.
    let mut pending: Vec<(u32, u32, i32, bool)> = Vec::new(); // (token, seq, pos, logits)
    for (s, r) in requests.iter().enumerate() {
        let (toks, pos0) = if r.prompt.is_empty() {
            ctx.seq_rm(Some(s as u32), prefix.len() as i32 - 1, -1)?;
            (&prefix[prefix.len() - 1..], prefix.len() as i32 - 1)
        } else {
            (&r.prompt[..], prefix.len() as i32)
        };
        for (i, &t) in toks.iter().enumerate() {
            pending.push((t, s as u32, pos0 + i as i32, i + 1 == toks.len()));
        }
    }
    let mut last_logits: Vec<Vec<f32>> = vec![Vec::new(); n];
    let mut next_pos: Vec<i32> = vec![0; n];
    for chunk in pending.chunks(n_batch) {
        let b = Batch {
            tokens: chunk.iter().map(|c| c.0).collect(),
            pos: chunk.iter().map(|c| c.2).collect(),
            seq: chunk.iter().map(|c| 1u64 << c.1).collect(),
            logits: chunk.iter().map(|c| c.3).collect(),
        };
        let logits = ctx.decode(&b)?;
        let n_vocab = logits.len() / chunk.iter().filter(|c| c.3).count().max(1);
        let mut rows = logits.chunks(n_vocab.max(1));
        for c in chunk.iter().filter(|c| c.3) {
            last_logits[c.1 as usize] = rows.next().unwrap_or_default().to_vec();
            next_pos[c.1 as usize] = c.2 + 1;
        }
    }
    // Generation: one token per live sequence per step, all in one batch.
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut live: Vec<bool> = requests.iter().map(|r| r.n_predict > 0).collect();
    loop {
        let mut b = Batch::default();
        let mut order = Vec::new();
        for s in 0..n {
            if !live[s] {
                continue;
            }
            let r = &mut requests[s];
            let t = r.sampler.sample(&last_logits[s]);
            r.sampler.accept(t);
            if is_end(t) {
                live[s] = false;
                continue;
            }
            out[s].push(t);
            if out[s].len() >= r.n_predict {
                live[s] = false;
                continue;
            }
            b.tokens.push(t);
            b.pos.push(next_pos[s]);
            b.seq.push(1u64 << s);
            b.logits.push(true);
            next_pos[s] += 1;
            order.push(s);
        }
        if order.is_empty() {
            return Ok(out);
        }
        let logits = ctx.decode(&b)?;
        let n_vocab = logits.len() / order.len();
        for (s, row) in order.into_iter().zip(logits.chunks(n_vocab)) {
            last_logits[s] = row.to_vec();
        }
    }
}
