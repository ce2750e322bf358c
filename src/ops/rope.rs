//! Rotary position embedding (normal and NeoX), in place. The angles are computed on the
//! host in f64 and uploaded as a (cos, sin) table; the shader only rotates.

use super::kernels::{float_name, kernel_files, Family};
use super::shaders::compose;
use super::uniforms::uniform_struct;
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
    /// YaRN's blend of interpolated and extrapolated angles, where the model's scaling is
    /// YaRN (`attn_factor` then holds its magnitude correction too).
    pub yarn: Option<Yarn>,
    /// M-RoPE's sections (Qwen2-VL): pair i turns by the component of the token's
    /// position its section names (time, row, column: [`RopeParams::table_mrope`]).
    pub mrope: Option<[u32; 4]>,
}

/// YaRN (ggml's `rope_yarn`): pair i's angle is the interpolated one (scaled by
/// `freq_scale`) blended toward the unscaled one by `ext_factor` times a ramp that is 1
/// below pair `corr_dims[0]` and 0 above `corr_dims[1]`: the fast-turning pairs keep
/// their angles, the slow ones are interpolated.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    pub ext_factor: f32,
    pub corr_dims: [f32; 2],
}

impl Yarn {
    /// The ramp's ends for `n_dims` rotated dimensions, the model's original context and
    /// frequency base, and the rotation counts beta_fast / beta_slow (32 and 1 unless the
    /// file says): the pairs that turn beta times over the original context.
    pub fn new(
        n_dims: u32,
        n_ctx_orig: u32,
        freq_base: f32,
        ext_factor: f32,
        (beta_fast, beta_slow): (f32, f32),
    ) -> Yarn {
        // ggml computes these in f32; so does this, so the ends round alike.
        let dim = |rotations: f32| {
            n_dims as f32 * (n_ctx_orig as f32 / (rotations * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * freq_base.ln())
        };
        Yarn {
            ext_factor,
            corr_dims: [
                dim(beta_fast).floor().max(0.0),
                dim(beta_slow).ceil().min(n_dims as f32 - 1.0),
            ],
        }
    }

    /// Pair i's angle from its extrapolated (unscaled) one.
    fn angle(&self, theta_extrap: f64, freq_scale: f64, i: usize) -> f64 {
        let [low, high] = self.corr_dims.map(|d| d as f64);
        let y = (i as f64 - low) / (high - low).max(0.001);
        let mix = (1.0 - y.clamp(0.0, 1.0)) * self.ext_factor as f64;
        let interp = freq_scale * theta_extrap;
        interp * (1.0 - mix) + theta_extrap * mix
    }
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
            yarn: None,
            mrope: None,
        }
    }

    /// (cos, sin) · attn_factor for every position and rotated pair:
    /// theta = p * scale * base^(-2i/n_dims) / factor_i, or with YaRN the blend of that
    /// and the unscaled angle ([`Yarn`]). The table is made on the host, so every scaling
    /// scheme is a change here, not in a kernel.
    pub fn table(&self, positions: &[f64]) -> Vec<[f32; 2]> {
        self.table_of(positions.len(), |t, _| positions[t])
    }

    /// The table for tokens of M-RoPE positions (time, row, column): pair i (of the
    /// global exponent i) turns by the component of section i mod the sections' sum
    /// (ggml's `rope_multi` in M-RoPE mode; the fourth section, which text would turn by
    /// 0, is refused when the model loads). Without sections, by the time alone.
    pub fn table_mrope(&self, positions: &[[i32; 3]]) -> Vec<[f32; 2]> {
        let Some(s) = self.mrope else {
            return self.table_of(positions.len(), |t, _| positions[t][0] as f64);
        };
        let sum = s.iter().sum::<u32>().max(1) as usize;
        let (a, b) = (s[0] as usize, (s[0] + s[1]) as usize);
        self.table_of(positions.len(), |t, i| {
            let sect = i % sum;
            let c = match sect {
                _ if sect < a => 0,
                _ if sect < b => 1,
                _ => 2,
            };
            positions[t][c] as f64
        })
    }

    /// The table of `n` tokens, token t's pair i turned by the position `pos(t, i)`.
    fn table_of(&self, n: usize, pos: impl Fn(usize, usize) -> f64) -> Vec<[f32; 2]> {
        let half = (self.n_dims / 2) as usize;
        let mut out = Vec::with_capacity(n * half);
        let m = self.attn_factor as f64;
        for t in 0..n {
            for i in 0..half {
                let p = pos(t, i);
                let inv = (self.freq_base as f64).powf(-2.0 * i as f64 / self.n_dims as f64);
                let factor = self.freq_factors.as_ref().map_or(1.0, |f| f[i] as f64);
                let extrap = p * inv / factor;
                let theta = match &self.yarn {
                    Some(y) => y.angle(extrap, self.freq_scale as f64, i),
                    None => extrap * self.freq_scale as f64,
                };
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
    let pipeline = gpu.pipeline(KernelKey::Rope(Kernel { f16: x_f16 }))?;
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

uniform_struct! {
    /// rope over [head_dim, n_head, n_tok].
    RopeUniform {
        head_dim: u32,
        n_head: u32,
        n_tok: u32,
        /// Rotated dimensions (<= head_dim); the rest pass through.
        n_dims: u32,
        /// 0: rotate pairs (2i, 2i+1); 1: pairs (i, i + n_dims/2).
        neox: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

kernel_files! {
    ROPE = "kernels/rope.wgsl";
}

/// RoPE on f32 activations, or in place on an f16 K cache (the K-shift).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Kernel {
    pub f16: bool,
}

impl Family for Kernel {
    const FILES: &'static [(&'static str, &'static str)] = FILES;
    fn variants() -> Vec<Self> {
        [false, true].map(|f16| Kernel { f16 }).to_vec()
    }
    fn body(&self) -> Result<String, String> {
        let ty = float_name(self.f16).to_string();
        Ok(compose(&[ROPE], &[("KV_T", ty)]))
    }
    fn uniform_wgsl(&self) -> &'static str {
        RopeUniform::WGSL
    }
    fn workgroup_size(&self) -> u32 {
        64
    }
    fn features(&self) -> wgpu::Features {
        match self.f16 {
            true => wgpu::Features::SHADER_F16,
            false => wgpu::Features::empty(),
        }
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rope_{}", float_name(self.f16))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// YaRN keeps the fast-turning pairs' unscaled angles, interpolates the slow ones',
    /// blends those between the ramp's ends, and with no blend (ext_factor 0) is linear
    /// scaling.
    #[test]
    fn yarn_blends_unscaled_and_interpolated_angles_by_pair() {
        let linear = RopeParams::new(64, 64, true, 10_000.0, 0.25);
        let y = Yarn::new(64, 256, 10_000.0, 1.0, (32.0, 1.0));
        let [low, high] = y.corr_dims;
        assert!(0.0 <= low && low < high && high < 31.0, "{:?}", y.corr_dims);
        let yarn = RopeParams {
            yarn: Some(y),
            ..linear
        };
        let unscaled = RopeParams {
            freq_scale: 1.0,
            ..linear
        };
        let p = [37.0];
        let (got, lin, raw) = (yarn.table(&p), linear.table(&p), unscaled.table(&p));
        let near = |a: [f32; 2], b: [f32; 2]| (a[0] - b[0]).abs() + (a[1] - b[1]).abs() < 1e-5;
        let mut blended = 0;
        for i in 0..32 {
            if (i as f32) <= low {
                assert!(
                    near(got[i], raw[i]),
                    "pair {i}: {:?} vs unscaled {:?}",
                    got[i],
                    raw[i]
                );
            } else if (i as f32) >= high {
                assert!(
                    near(got[i], lin[i]),
                    "pair {i}: {:?} vs linear {:?}",
                    got[i],
                    lin[i]
                );
            } else if !near(got[i], raw[i]) && !near(got[i], lin[i]) {
                blended += 1;
            }
        }
        assert!(blended > 0, "no pair between the ramp's ends is blended");
        let off = RopeParams {
            yarn: Some(Yarn::new(64, 256, 10_000.0, 0.0, (32.0, 1.0))),
            ..linear
        };
        assert_eq!(off.table(&p), linear.table(&p));
    }
}
