//! rope_store: the fused step from a Q/K/V projection to the cache. From the projection's
//! output, rows of [q heads | k heads | v heads] per token, it writes rotated Q heads to a
//! Q tensor, rotated K heads and plain V heads straight into their cache cells, with an
//! optional RMS norm of each Q and K head first (Gemma). One dispatch where the unfused
//! graph had two RoPEs, two set_rows and (Gemma) two per-head norms: a decoded token's
//! dispatch count, not its bandwidth, bounds small-model decode on discrete GPUs.

use super::hadamard::hadamard_ref;
use super::kernels::{shape_suffix, Family, SHAPES};
use super::node::{GraphOp, OpCost, F32_BYTES};
use super::rms_norm::rms_norm_ref;
use super::rope::{rope_ref, RopeParams};
use super::set_rows::set_rows_ref;
use super::shaders::rope_store_source;
use super::uniforms::uniform_struct;
use super::{record, Dispatch, KernelKey, View, MAX_GROUPS};
use crate::gpu::{Gpu, GpuError, KernelShape};
use crate::kv::KvType;

/// The heads of one projection row and where its K/V go.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeStoreShape {
    pub n_head: u32,
    pub n_head_kv: u32,
    pub n_tok: u32,
    /// What the K and V caches hold.
    pub k_type: KvType,
    pub v_type: KvType,
    /// Walsh-Hadamard rotation of Q and K heads, and of V heads, in chunks of this many
    /// values (llama.cpp's attention rotation of a quantized cache; 0: none).
    pub rot_k: u32,
    pub rot_v: u32,
}

impl RopeStoreShape {
    /// Elements of one token's projection row: Q, K and V heads.
    pub fn row_len(&self, head_dim: u32) -> u32 {
        (self.n_head + 2 * self.n_head_kv) * head_dim
    }
}

/// The buffers rope_store reads and writes.
pub struct RopeStoreViews<'a> {
    /// (cos, sin) per token and rotated pair.
    pub table: &'a View,
    /// [row_len, n_tok] projection output.
    pub qkv: &'a View,
    /// [n_tok] cache cells.
    pub slots: &'a View,
    /// [head_dim * n_head, n_tok] rotated Q.
    pub q: &'a View,
    pub k_cache: &'a View,
    pub v_cache: &'a View,
    /// Per-head RMS norm weights of Q and K ([head_dim] each) and their epsilon.
    pub norm: Option<(&'a View, &'a View, f32)>,
}

pub fn rope_store(
    gpu: &Gpu,
    rp: &RopeParams,
    s: &RopeStoreShape,
    io: &RopeStoreViews,
) -> Result<Dispatch, GpuError> {
    let slots = s.n_head + 2 * s.n_head_kv;
    if s.n_head_kv == 0 || s.n_head == 0 || s.n_tok > MAX_GROUPS || slots > MAX_GROUPS {
        return Err(GpuError::Validation(format!(
            "rope_store: {} heads, {} KV heads and {} tokens do not fit one dispatch",
            s.n_head, s.n_head_kv, s.n_tok
        )));
    }
    if rp.n_dims > rp.head_dim || !rp.n_dims.is_multiple_of(2) {
        return Err(GpuError::Validation(format!(
            "rope_store: {} rotated dimensions in heads of {}",
            rp.n_dims, rp.head_dim
        )));
    }
    for n in [s.rot_k, s.rot_v].into_iter().filter(|&n| n > 0) {
        if !n.is_power_of_two() || !rp.head_dim.is_multiple_of(n) || rp.head_dim > 256 {
            return Err(GpuError::Validation(format!(
                "rope_store: a rotation in chunks of {n} needs a power of two dividing the head ({}, at most 256)",
                rp.head_dim
            )));
        }
    }
    for ty in [s.k_type, s.v_type] {
        let n_embd = rp.head_dim * s.n_head_kv;
        ty.check_shape(rp.head_dim, n_embd)
            .map_err(|e| GpuError::Validation(format!("rope_store: {e}")))?;
    }
    // CPU-like adapters take the barrier-free kernel where it applies: an invocation per
    // head slot, 64 slots a workgroup.
    let rows = gpu.kernels != KernelShape::Gpu
        && !s.k_type.is_packed()
        && !s.v_type.is_packed()
        && s.rot_k == 0
        && s.rot_v == 0;
    let key = KernelKey::RopeStore(Kernel {
        k: s.k_type,
        v: s.v_type,
        norm: io.norm.is_some(),
        shape: if rows {
            KernelShape::Cpu
        } else {
            KernelShape::Gpu
        },
    });
    let groups = if rows { slots.div_ceil(64) } else { slots };
    let params = RopeStoreUniform {
        head_dim: rp.head_dim,
        n_head: s.n_head,
        n_head_kv: s.n_head_kv,
        n_dims: rp.n_dims,
        neox: rp.neox as u32,
        eps: io.norm.map_or(0.0, |n| n.2),
        rot_k: s.rot_k,
        rot_v: s.rot_v,
    };
    let mut views = vec![io.table, io.qkv, io.slots, io.q, io.k_cache, io.v_cache];
    if let Some((qn, kn, _)) = io.norm {
        views.extend([qn, kn]);
    }
    record(
        gpu,
        "rope_store",
        gpu.pipeline(key)?,
        bytemuck::bytes_of(&params),
        &views,
        [groups, s.n_tok, 1],
    )
}

/// What the unfused ops compute: per-head RMS norms, RoPE of Q and K, K and V rows into
/// their cells. `k_cache` and `v_cache` are f32 rows of n_head_kv * head_dim per cell.
/// Returns the rotated Q.
#[allow(clippy::too_many_arguments)]
pub fn rope_store_ref(
    rp: &RopeParams,
    s: &RopeStoreShape,
    qkv: &[f32],
    positions: &[f64],
    slots: &[u32],
    norm: Option<(&[f32], &[f32], f32)>,
    k_cache: &mut [f32],
    v_cache: &mut [f32],
) -> Vec<f32> {
    let hd = rp.head_dim as usize;
    let (nq, nkv) = (s.n_head as usize * hd, s.n_head_kv as usize * hd);
    let row = nq + 2 * nkv;
    let mut q = Vec::with_capacity(nq * positions.len());
    let mut k = Vec::with_capacity(nkv * positions.len());
    let mut v = Vec::with_capacity(nkv * positions.len());
    for r in qkv.chunks(row).take(positions.len()) {
        q.extend_from_slice(&r[..nq]);
        k.extend_from_slice(&r[nq..nq + nkv]);
        v.extend_from_slice(&r[nq + nkv..]);
    }
    if let Some((qn, kn, eps)) = norm {
        q = rms_norm_ref(&q, qn, hd, eps);
        k = rms_norm_ref(&k, kn, hd, eps);
    }
    let mut q = rope_ref(rp, &q, s.n_head as usize, positions);
    let mut k = rope_ref(rp, &k, s.n_head_kv as usize, positions);
    hadamard_ref(&mut q, s.rot_k as usize);
    hadamard_ref(&mut k, s.rot_k as usize);
    hadamard_ref(&mut v, s.rot_v as usize);
    set_rows_ref(k_cache, &k, slots, nkv);
    set_rows_ref(v_cache, &v, slots, nkv);
    q
}

uniform_struct! {
    /// rope_store: a Q/K/V projection row's heads to Q and the cache.
    RopeStoreUniform {
        head_dim: u32,
        n_head: u32,
        n_head_kv: u32,
        /// Rotated dimensions (<= head_dim); the rest pass through.
        n_dims: u32,
        /// 0: rotate pairs (2i, 2i+1); 1: pairs (i, i + n_dims/2).
        neox: u32,
        /// Epsilon of the per-head RMS norm (the norm variant only).
        eps: f32,
        /// Walsh-Hadamard rotation of Q and K heads (chunks of rot_k values) and of V heads
        /// (rot_v), llama.cpp's attention rotation of a quantized cache; 0: none.
        rot_k: u32,
        rot_v: u32,
    }
}

/// A Q/K/V projection's heads to a rotated Q and the K and V caches of types `k` and `v`,
/// with per-head RMS norms of Q and K when `norm`: a workgroup per head (GPU-shaped), or
/// for plain caches without rotation one invocation per head (CPU-shaped: no barriers).
/// Its sources are shared with the cache formats' writers (`shaders::rope_store_source`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Kernel {
    pub k: KvType,
    pub v: KvType,
    pub norm: bool,
    pub shape: KernelShape,
}

impl Family for Kernel {
    const FILES: &'static [(&'static str, &'static str)] = &[];
    fn variants() -> Vec<Self> {
        let mut v = Vec::new();
        // K and V types combine freely, as llama.cpp's -ctk and -ctv.
        for k in KvType::ALL {
            for vt in KvType::ALL {
                for norm in [false, true] {
                    for shape in SHAPES {
                        let plain = !k.is_packed() && !vt.is_packed();
                        if shape == KernelShape::Gpu || plain {
                            v.push(Kernel {
                                k,
                                v: vt,
                                norm,
                                shape,
                            });
                        }
                    }
                }
            }
        }
        v
    }
    fn body(&self) -> Result<String, String> {
        let rows = self.shape == KernelShape::Cpu;
        Ok(rope_store_source(self.k, self.v, self.norm, rows))
    }
    fn uniform_wgsl(&self) -> &'static str {
        RopeStoreUniform::WGSL
    }
    fn workgroup_size(&self) -> u32 {
        64
    }
    fn features(&self) -> wgpu::Features {
        match self.k == KvType::F16 || self.v == KvType::F16 {
            true => wgpu::Features::SHADER_F16,
            false => wgpu::Features::empty(),
        }
    }
    fn cpu_shaped(&self) -> bool {
        self.shape == KernelShape::Cpu
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (k, v) = (self.k, self.v);
        let norm = if self.norm { "_norm" } else { "" };
        let rows = shape_suffix(self.shape);
        write!(f, "rope_store_{k}_{v}{norm}{rows}")
    }
}

/// The graph's `Op::RopeStore`: reads [table, qkv, slots(, q_norm, k_norm)], writes [q,
/// k_cache, v_cache]
pub struct RopeStoreNode {
    pub p: RopeParams,
    pub shape: RopeStoreShape,
    /// Epsilon of the per-head Q/K norms, when the node reads their weights.
    pub norm_eps: Option<f32>,
}

impl GraphOp for RopeStoreNode {
    fn kind(&self) -> String {
        "rope_store".into()
    }

    fn cost(&self) -> OpCost {
        let Self { p, shape: s, .. } = self;
        let t = s.n_tok as u64;
        let row = s.row_len(p.head_dim) as u64;
        let kv = 2 * s.n_head_kv as u64 * p.head_dim as u64;
        let q = row - kv;
        let hd = p.head_dim as u64 * s.n_head_kv as u64;
        let kv_bytes = (s.k_type.row_bytes(hd) + s.v_type.row_bytes(hd)) * t;
        let table = t * p.n_dims as u64 / 2 * 2 * F32_BYTES;
        // The projection row in, Q out, K and V into the cache; the rotations
        // of Q and K heads as in RoPE.
        let heads = (s.n_head + s.n_head_kv) as u64;
        OpCost::new(
            row * t * F32_BYTES + q * t * F32_BYTES + kv_bytes + table + t * F32_BYTES,
            3 * p.n_dims as u64 / 2 * 2 * heads * t,
        )
    }

    fn record(
        &self,
        gpu: &Gpu,
        r: &[View],
        w: &[View],
        dispatches: &mut Vec<Dispatch>,
    ) -> Result<(), GpuError> {
        let Self { p, shape, norm_eps } = self;
        let io = RopeStoreViews {
            table: &r[0],
            qkv: &r[1],
            slots: &r[2],
            q: &w[0],
            k_cache: &w[1],
            v_cache: &w[2],
            norm: norm_eps.map(|eps| (&r[3], &r[4], eps)),
        };
        dispatches.push(rope_store(gpu, p, shape, &io)?);
        Ok(())
    }
}
