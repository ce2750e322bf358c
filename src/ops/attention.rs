//! Attention over the KV cache: scores (KQ), masked softmax, weighted sum of V (KQV).
//!
//! Three dispatches, each parallel over a different axis (cells, rows, head dims), so a
//! single decoded token still spreads its work across the adapter.

use super::softmax::{softmax, softmax_ref, SoftmaxParams};
use super::{record, shaders, Dispatch, View};
use crate::gpu::{Gpu, GpuError};

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnShape {
    pub head_dim: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    pub n_tok: u32,
    /// Cells read from the cache (the padded bound, not the cache size).
    pub n_kv: u32,
    /// The cache holds f16 (adapters with shader-f16) rather than f32.
    pub kv_f16: bool,
}

impl AttnShape {
    fn params(&self) -> [u32; 8] {
        [
            self.head_dim,
            self.n_head,
            self.n_head_kv,
            self.n_tok,
            self.n_kv,
            0,
            0,
            0,
        ]
    }
    /// f32 elements of the scores scratch buffer.
    pub fn scores_len(&self) -> u64 {
        self.n_head as u64 * self.n_tok as u64 * self.n_kv as u64
    }
}

/// Tokens per invocation in the score and output kernels: each cached key or value row is
/// loaded once for that many tokens. `WGLLM_ATTN_TB` overrides it, for measuring.
fn tokens_per_invocation(n_tok: u32) -> u32 {
    if let Some(tb) = std::env::var("WGLLM_ATTN_TB")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .filter(|&t| t > 0)
    {
        return tb;
    }
    // lavapipe, SmolLM2 pp128: 1 token 4.9 t/s, 4 tokens 6.2, 8 tokens 5.6.
    if n_tok >= 4 {
        4
    } else {
        1
    }
}

/// q: [head_dim, n_head, n_tok]; k, v: cache [head_dim, n_head_kv, cells] (f16 or f32);
/// mask: [n_kv, n_tok]; scores: scratch; dst: [head_dim * n_head, n_tok].
#[allow(clippy::too_many_arguments)]
pub fn attention(
    gpu: &Gpu,
    s: &AttnShape,
    sp: &SoftmaxParams,
    q: &View,
    k: &View,
    v: &View,
    mask: &View,
    scores: &View,
    dst: &View,
) -> Result<Vec<Dispatch>, GpuError> {
    if !s.head_dim.is_multiple_of(4) || !s.n_head.is_multiple_of(s.n_head_kv) {
        return Err(GpuError::Validation(format!(
            "attention: head_dim {} must be a multiple of 4 and n_head {} a multiple of n_head_kv {}",
            s.head_dim, s.n_head, s.n_head_kv
        )));
    }
    let f16 = s.kv_f16;
    let tb = tokens_per_invocation(s.n_tok);
    let kq = gpu.pipeline(&format!("attn_kq_{f16}_{tb}"), || {
        shaders::kv_source_tb(shaders::ATTN_KQ, f16, tb)
    })?;
    let kqv = gpu.pipeline(&format!("attn_kqv_{f16}_{tb}"), || {
        shaders::kv_source_tb(shaders::ATTN_KQV, f16, tb)
    })?;
    let params = s.params();
    Ok(vec![
        record(
            gpu,
            "attn_kq",
            kq,
            bytemuck::cast_slice(&params),
            &[q, k, scores],
            [s.n_kv.div_ceil(64), s.n_tok.div_ceil(tb), s.n_head],
        )?,
        softmax(gpu, sp, Some(mask), scores, s.n_kv, s.n_tok)?,
        record(
            gpu,
            "attn_kqv",
            kqv,
            bytemuck::cast_slice(&params),
            &[scores, v, dst],
            [s.head_dim.div_ceil(64), s.n_tok.div_ceil(tb), s.n_head],
        )?,
    ])
}

/// CPU reference with the same layouts (k and v as f32 values).
pub fn attention_ref(
    s: &AttnShape,
    sp: &SoftmaxParams,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: &[f32],
) -> Vec<f32> {
    let (hd, nh, nkvh, nt, nkv) = (
        s.head_dim as usize,
        s.n_head as usize,
        s.n_head_kv as usize,
        s.n_tok as usize,
        s.n_kv as usize,
    );
    let g = nh / nkvh;
    let mut scores = vec![0.0f32; nh * nt * nkv];
    for h in 0..nh {
        for t in 0..nt {
            for c in 0..nkv {
                let qo = (t * nh + h) * hd;
                let ko = (c * nkvh + h / g) * hd;
                let d: f64 = (0..hd).map(|i| q[qo + i] as f64 * k[ko + i] as f64).sum();
                scores[(h * nt + t) * nkv + c] = d as f32;
            }
        }
    }
    let probs = softmax_ref(sp, &scores, Some(mask), nkv, nt);
    let mut out = vec![0.0f32; hd * nh * nt];
    for h in 0..nh {
        for t in 0..nt {
            for d in 0..hd {
                let acc: f64 = (0..nkv)
                    .map(|c| {
                        probs[(h * nt + t) * nkv + c] as f64 * v[(c * nkvh + h / g) * hd + d] as f64
                    })
                    .sum();
                out[(t * nh + h) * hd + d] = acc as f32;
            }
        }
    }
    out
}
