//! Which sessions' chains the GPU can run (`src/ops/sample.rs`), and the settings row
//! it runs them with. The GPU chain is llama.cpp's default one — logit bias, repetition
//! penalties, top-k, top-p, min-p, temperature, the draw — starting from at most
//! [`MAX_K`] candidates; anything else keeps the session on the CPU chain.

use super::SamplerParams;
use crate::ops::sample::MAX_K;
use crate::ops::uniforms::SampleRow;

/// The longest penalty history (`repeat_last_n`) the GPU keeps per session.
pub const RING_MAX: u32 = 4096;

/// Flag bits of [`SampleRow::flags`].
pub const FLAG_BIAS: u32 = 1;
pub const FLAG_PENALTIES: u32 = 2;

/// The row settings for `p` (slot, logits row and uniform number still to fill in), or
/// why this chain stays on the CPU.
pub fn gpu_row(p: &SamplerParams, n_vocab: usize) -> Result<SampleRow, String> {
    if n_vocab > crate::ops::sample::MAX_VOCAB as usize {
        return Err(format!(
            "the vocabulary has {n_vocab} tokens (the GPU chain takes up to {})",
            crate::ops::sample::MAX_VOCAB
        ));
    }
    if p.grammar.is_some() {
        return Err("a grammar constrains it".into());
    }
    if p.typical_p < 1.0 {
        return Err("typical-p is on".into());
    }
    if p.xtc_on() {
        return Err("XTC is on".into());
    }
    if p.top_n_sigma > 0.0 {
        return Err("top-n-sigma is on".into());
    }
    if p.dynatemp_range > 0.0 {
        return Err("dynamic temperature is on".into());
    }
    if p.dry_multiplier != 0.0 {
        return Err("DRY is on".into());
    }
    // A greedy chain keeps the largest logit whatever the truncation samplers do.
    let k = if p.temp <= 0.0 {
        1
    } else if p.top_k <= 0 || p.top_k as u32 > MAX_K {
        return Err(format!(
            "top-k is {} (the GPU chain starts from 1 to {MAX_K} candidates)",
            p.top_k
        ));
    } else {
        p.top_k as u32
    };
    let mut flags = 0;
    if !p.logit_bias.is_empty() || !p.banned.is_empty() {
        flags |= FLAG_BIAS;
    }
    let mut ring_cap = 0;
    if p.penalties_on() {
        if p.repeat_last_n > RING_MAX as usize {
            return Err(format!(
                "the penalties look back {} tokens (the GPU keeps {RING_MAX})",
                p.repeat_last_n
            ));
        }
        flags |= FLAG_PENALTIES;
        ring_cap = p.repeat_last_n as u32;
    }
    Ok(SampleRow {
        k: k.min(n_vocab.max(1) as u32),
        flags,
        top_p: p.top_p,
        min_p: p.min_p,
        temp: p.temp,
        min_keep: p.min_keep.min(u32::MAX as usize) as u32,
        repeat_penalty: p.repeat_penalty,
        freq_penalty: p.frequency_penalty,
        presence_penalty: p.presence_penalty,
        ring_cap,
        ..Default::default()
    })
}

/// The dense logit bias of `p` over the vocabulary (entries for one token add up;
/// banned tokens get -inf).
pub fn dense_bias(p: &SamplerParams, n_vocab: usize) -> Vec<f32> {
    let mut bias = vec![0.0f32; n_vocab];
    let entries =
        (p.logit_bias.iter().copied()).chain(p.banned.iter().map(|&t| (t, f32::NEG_INFINITY)));
    for (t, b) in entries {
        if let Some(x) = bias.get_mut(t as usize) {
            *x += b;
        }
    }
    bias
}
