//! Rotary position embedding (normal and NeoX), in place. The angles are computed on the
//! host in f64 and uploaded as a (cos, sin) table; the shader only rotates.

use super::uniforms::RopeUniform;
use super::{record, Dispatch, KernelKey, View};
use crate::gpu::{Gpu, GpuError};
use std::sync::Mutex;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    pub head_dim: u32,
    /// Rotated dimensions (n_rot); the rest of each head passes through.
    pub n_dims: u32,
    pub neox: bool,
    pub freq_base: f32,
    pub freq_scale: f32,
    /// Per-pair divisors of the angle (n_dims / 2 of them): Llama 3's frequency scaling
    /// (`rope_freqs.weight`), Phi-3's long/short factors.
    /// Interned (see [`intern_factors`]) so the parameters stay `Copy`.
    pub freq_factors: Option<&'static [f32]>,
    /// Multiplies cos and sin (1 unless the model's scaling asks otherwise).
    pub attn_factor: f32,
}

/// A `'static` copy of a model's RoPE frequency factors, shared by every load of the
/// same factors: each distinct array (a few hundred bytes) is kept for the life of the
/// process, which keeps [`RopeParams`] a small `Copy` value that graph inputs key on.
pub fn intern_factors(factors: &[f32]) -> &'static [f32] {
    static SEEN: Mutex<Vec<&'static [f32]>> = Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(f) = seen.iter().find(|f| **f == factors) {
        return f;
    }
    let f: &'static [f32] = Box::leak(factors.to_vec().into_boxed_slice());
    seen.push(f);
    f
}

impl RopeParams {
    /// Plain RoPE: no frequency factors, no magnitude scaling.
    pub fn new(head_dim: u32, n_dims: u32, neox: bool, freq_base: f32, freq_scale: f32) -> Self {
        Self {
            head_dim,
            n_dims,
            neox,
            freq_base,
            freq_scale,
            freq_factors: None,
            attn_factor: 1.0,
        }
    }

    /// (cos, sin) · attn_factor for every position and rotated pair:
    /// theta = p * scale * base^(-2i/n_dims) / factor_i. The table is made on the host,
    /// so every scaling scheme is a change here, not in a kernel.
    pub fn table(&self, positions: &[f64]) -> Vec<[f32; 2]> {
        let half = (self.n_dims / 2) as usize;
        let mut out = Vec::with_capacity(positions.len() * half);
        let m = self.attn_factor as f64;
        for &p in positions {
            for i in 0..half {
                let inv = (self.freq_base as f64).powf(-2.0 * i as f64 / self.n_dims as f64);
                let factor = self.freq_factors.as_ref().map_or(1.0, |f| f[i] as f64);
                let theta = p * self.freq_scale as f64 * inv / factor;
                out.push([(theta.cos() * m) as f32, (theta.sin() * m) as f32]);
            }
        }
        out
    }
}

/// Rotates x, [head_dim, n_head, n_tok], in place with the table for n_tok positions.
/// x holds f16 when `x_f16` (an f16 K cache being shifted), else f32.
pub fn rope(
    gpu: &Gpu,
    rp: &RopeParams,
    table: &View,
    x: &View,
    n_head: u32,
    n_tok: u32,
    x_f16: bool,
) -> Result<Dispatch, GpuError> {
    if n_tok > super::MAX_GROUPS {
        return Err(GpuError::Validation(format!(
            "rope: {n_tok} rows exceed one dispatch ({})",
            super::MAX_GROUPS
        )));
    }
    let pipeline = gpu.pipeline(KernelKey::Rope { f16: x_f16 })?;
    let params = RopeUniform {
        head_dim: rp.head_dim,
        n_head,
        n_tok,
        n_dims: rp.n_dims,
        neox: rp.neox as u32,
        ..Default::default()
    };
    record(
        gpu,
        "rope",
        pipeline,
        bytemuck::bytes_of(&params),
        &[table, x],
        [(rp.n_dims / 2).div_ceil(64), n_head, n_tok],
    )
}

/// CPU reference (f64 angles, f32 data).
pub fn rope_ref(rp: &RopeParams, x: &[f32], n_head: usize, positions: &[f64]) -> Vec<f32> {
    let mut out = x.to_vec();
    let hd = rp.head_dim as usize;
    let half = rp.n_dims as usize / 2;
    let table = rp.table(positions);
    for (t, _) in positions.iter().enumerate() {
        for h in 0..n_head {
            let base = (t * n_head + h) * hd;
            for i in 0..half {
                let (a, b) = if rp.neox {
                    (base + i, base + i + half)
                } else {
                    (base + 2 * i, base + 2 * i + 1)
                };
                let [c, s] = table[t * half + i];
                let (x0, x1) = (x[a] as f64, x[b] as f64);
                out[a] = (x0 * c as f64 - x1 * s as f64) as f32;
                out[b] = (x0 * s as f64 + x1 * c as f64) as f32;
            }
        }
    }
    out
}
