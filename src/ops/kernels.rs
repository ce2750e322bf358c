//! One typed key per kernel variant. A [`KernelKey`] picks the pipeline in
//! [`crate::gpu::Gpu::pipeline`], generates its WGSL, and says which device features it
//! needs; [`KernelKey::all`] lists every variant the ops can ask for, which the offline
//! test validates with naga and translates to MSL and HLSL. The selection code only picks
//! values from the lists below and `Gpu::pipeline` refuses any other key, so a variant
//! that was never checked offline cannot reach a driver.

use super::binary::BinaryOp;
use super::glu::Activation;
use super::shaders::{self, compose, Tokens};
use super::uniforms::*;
use crate::gguf::GgmlType;
use crate::kv::KvType;
use std::collections::HashSet;
use std::fmt;
use std::sync::OnceLock;

/// Rows per invocation of the CPU-shaped matmul (`matmul.wgsl`) the tuning may choose.
pub const CPU_MATMUL_ROWS: &[u32] = &[1, 2, 4, 8];
/// Tokens per invocation of the CPU-shaped matmul the tuning may choose.
pub const CPU_MATMUL_TOKENS: &[u32] = &[1, 2, 4, 8, 16];
/// Weight rows per workgroup of the GPU matrix-vector matmul (`matmul_wg.wgsl`).
pub const GPU_VEC_ROWS: &[u32] = &[1, 2, 4, 8, 16, 32];
/// Tokens per workgroup of `matmul_wg.wgsl`: 1 for decode, 4 for small batches.
pub const GPU_VEC_TOKENS: &[u32] = &[1, 4];
/// (weight rows, tokens) per workgroup of the tiled prompt matmul (`matmul_tile.wgsl`).
/// 128x128 (8x8 accumulators per invocation, 32 KiB of workgroup memory) only where asked
/// for (`WGLLM_GPU_TILE`), for measuring.
pub const GPU_TILES: &[(u32, u32)] = &[(64, 64), (128, 64), (128, 128)];
/// Sides of the cooperative matrices the cooperative-matrix matmul multiplies (S x S x S,
/// f16 in, f32 accumulated): 16 as Vulkan drivers offer them (NVIDIA's; AMD's and Intel's
/// subgroups are not fixed at the 32 the kernel needs), 8 as Apple's simdgroup matrices.
pub const COOP_SIZES: &[u32] = &[8, 16];
/// The weight types with an integer-dot kernel: those whose GPU blocks are 32 codes of at
/// most 8 bits with one scale and offset (the K-quants' 32-weight sub-blocks of 4 and 5
/// bits, the non-linear 4-bit formats' codes as their signed 8-bit levels). Q2_K, Q3_K and
/// Q6_K scale each half of a 32-weight sub-block on its own, which this kernel's one
/// integer sum per block does not allow.
pub const Q8_TYPES: [GgmlType; 9] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Iq4Nl,
    GgmlType::Iq4Xs,
];

/// Weight rows per workgroup of the integer-dot matmul (`matmul_q8.wgsl`).
pub const Q8_MATMUL_ROWS: &[u32] = &[1, 2, 4];
/// Tokens per workgroup of the integer-dot matmul.
pub const Q8_MATMUL_TOKENS: &[u32] = &[1, 2, 4, 8];
/// (weight rows, tokens) per workgroup of the tiled integer-dot prompt matmul
/// (`matmul_q8_tile.wgsl`).
pub const Q8_TILES: &[(u32, u32)] = &[(64, 64), (128, 64)];
/// Tokens per invocation of the attention score and output kernels.
pub const ATTN_TB: &[u32] = &[1, 2, 4, 8];
/// Invocations per cell of the GPU score kernel (`attn_kq_lanes.wgsl`; its workgroups of
/// 64 cover 64 / KQ_LANES cells).
pub const KQ_LANES: u32 = 8;
/// Key vec4s per invocation of the GPU score kernel: heads of up to 256 values; larger
/// ones take `attn_kq.wgsl`.
pub const KQ_LANES_NK: &[u32] = &[1, 2, 4, 8];
/// Invocations per row of the softmax: 64 for CPU-like adapters, 256 for GPUs.
pub const SOFTMAX_WG: &[u32] = &[64, 256];
/// Largest head size the split attention output kernel has a variant for.
pub const MAX_SPLIT_HEAD_DIM: u32 = 2048;
/// Largest head the flash attention kernel holds (its D4 vec4s per row of workgroup memory).
pub const MAX_FLASH_HEAD_DIM: u32 = 128;
/// Heads (in vec4s) the CPU-shaped flash kernel's variants hold: a head takes the
/// smallest that fits (`attn_flash_rows.wgsl` keeps D4 vec4s per token in each
/// invocation's own arrays).
pub const FLASH_ROWS_D4: &[u32] = &[16, 32, 64];
/// Tokens per invocation of the CPU-shaped flash kernel: 1 for decode and large heads,
/// 2 for prompts with heads of up to 64 values.
pub const FLASH_ROWS_TB: &[u32] = &[1, 2];
/// vec4s of the head per slice of the tiled prompt score kernel: 8 (16 KiB of keys and
/// queries in workgroup memory), or 4 where the adapter has no more than 16 KiB.
pub const ATTN_TILE_DK: &[u32] = &[4, 8];
/// vec4s of the head per invocation of the tiled prompt output kernel (heads of up to
/// 64 and up to 128 values).
pub const ATTN_TILE_NI: &[u32] = &[1, 2];
/// Largest head the tiled prompt attention kernels hold.
pub const MAX_TILE_HEAD_DIM: u32 = 128;
/// State sizes (d_state, rounded up to one of these) the selective scan has variants for.
pub const SSM_DS: &[u32] = &[16, 32, 64, 128, 256];

/// A kernel variant: the shader and every constant baked into its source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelKey {
    /// RMS norm: a workgroup per row (GPU-shaped), or with `rows` one invocation per row
    /// (CPU-shaped: no barriers).
    RmsNorm {
        rows: bool,
    },
    /// Residual add and RMS norm, shaped as [`KernelKey::RmsNorm`].
    AddRmsNorm {
        rows: bool,
    },
    /// Layer norm with weight and bias (BERT): a workgroup per row.
    LayerNorm,
    /// Sums of runs of rows (mean pooling).
    PoolRows,
    /// A LoRA adapter's scaled correction added into a matmul's output rows.
    AddScaled,
    Binary(BinaryOp),
    Glu(Activation),
    /// RoPE on f32 activations, or in place on an f16 K cache (the K-shift).
    Rope {
        f16: bool,
    },
    /// A Q/K/V projection's heads to a rotated Q and the K and V caches of types `k` and
    /// `v`, with per-head RMS norms of Q and K when `norm`: a workgroup per head, or with
    /// `rows` (plain caches, no rotation) one invocation per head (CPU-shaped: no barriers).
    RopeStore {
        k: KvType,
        v: KvType,
        norm: bool,
        rows: bool,
    },
    /// Copy of f32 rows into cache rows of type `ty` (quantizing a block at a time for
    /// the packed types).
    SetRows {
        ty: KvType,
    },
    /// Cache rows of type `ty` read back as f32 (the K-shift of a packed K cache).
    KvRead {
        ty: KvType,
    },
    /// Chunks of values times the Walsh-Hadamard matrix, in place (llama.cpp's attention
    /// rotation of a quantized cache): a workgroup per chunk (`wg`, GPUs) or an
    /// invocation per chunk (CPU-shaped: no barriers).
    Hadamard {
        wg: bool,
    },
    /// Masked softmax with `wg` invocations per row.
    Softmax {
        wg: u32,
    },
    /// Attention scores over a K cache of type `k`, `tb` tokens per invocation.
    AttnKq {
        k: KvType,
        tb: u32,
    },
    /// Attention scores on GPUs over a K cache of type `k`, `tb` tokens per invocation,
    /// [`KQ_LANES`] invocations per cell reading `nk` vec4s of its key each (see
    /// [`kq_lanes_nk`]).
    AttnKqLanes {
        k: KvType,
        tb: u32,
        nk: u32,
    },
    /// One-pass attention output over a V cache of type `v`, `tb` tokens per invocation.
    AttnKqv {
        v: KvType,
        tb: u32,
    },
    /// Attention softmax and output split over chunks of cells (flash-decoding):
    /// `lanes` invocations across a value row, `nv` vec4s each (see [`split_shape`]).
    AttnKqvSplit {
        v: KvType,
        lanes: u32,
        nv: u32,
    },
    /// The split kernel's partial outputs, rescaled to one maximum and normalised.
    AttnKqvSum,
    /// Prompt attention scores as a tiled product: 64 cells x 64 tokens per workgroup,
    /// the head in slices of `dk` vec4s.
    AttnKqTile {
        k: KvType,
        dk: u32,
    },
    /// Prompt attention output as a tiled product over the softmax's probabilities:
    /// `ni` vec4s of the head and 8 / `ni` tokens per invocation, one chunk of cells
    /// per workgroup z.
    AttnKqvTile {
        v: KvType,
        ni: u32,
    },
    /// The tiled output kernel's chunks added up.
    AttnKqvJoin,
    /// Prompt attention in one pass over tiles of cells with an online softmax
    /// (`attn_flash.wgsl`, heads up to [`MAX_FLASH_HEAD_DIM`]).
    /// With `split`, over one chunk of cells per workgroup z, into the split kernel's
    /// partials (joined by [`KernelKey::AttnKqvSum`]).
    AttnFlash {
        k: KvType,
        v: KvType,
        split: bool,
    },
    /// [`KernelKey::AttnFlash`] on f16 tiles (`attn_flash_coop.wgsl`, workgroups of 32),
    /// its two products on 16 x 16 cooperative matrices (`mma`, one 32-wide subgroup per
    /// workgroup) or as loops (the same kernel testable without the matrices).
    AttnFlashCoop {
        k: KvType,
        v: KvType,
        split: bool,
        mma: bool,
    },
    /// Flash attention on CPU-shaped adapters (`attn_flash_rows.wgsl`): `tb` tokens of a
    /// head per invocation over one chunk of cells, heads up to 4 * `d4` values, into the
    /// split kernel's partials (joined by [`KernelKey::AttnKqvSum`]).
    AttnFlashRows {
        k: KvType,
        v: KvType,
        d4: u32,
        tb: u32,
    },
    GetRows {
        ty: GgmlType,
    },
    /// The CPU-shaped matmul: `rows` rows and `tb` tokens per invocation; with `glu`,
    /// the fused epilogue over interleaved (gate, up) rows (`rows` even).
    Matmul {
        ty: GgmlType,
        rows: u32,
        tb: u32,
        subgroups: bool,
        glu: Option<Activation>,
    },
    /// The GPU matrix-vector matmul: `rows` rows per workgroup of 256, `tb` tokens,
    /// reduced with subgroupAdd when `subgroups`; with `glu`, the fused epilogue over
    /// interleaved (gate, up) rows (`rows` even).
    MatmulWg {
        ty: GgmlType,
        tb: u32,
        rows: u32,
        subgroups: bool,
        glu: Option<Activation>,
    },
    /// The GPU tiled prompt matmul: `bm` weight rows x `bn` tokens per workgroup.
    MatmulTile {
        ty: GgmlType,
        bm: u32,
        bn: u32,
    },
    /// The prompt matmul on cooperative matrices (`matmul_coop.wgsl`): `s` x `s` f16
    /// matrices, 2s weight rows x 2s tokens per workgroup of one 32-wide subgroup.
    MatmulCoop {
        ty: GgmlType,
        s: u32,
    },
    /// Activations to 8-bit blocks of 32 with their scales (`quantize_q8_1.wgsl`), for
    /// the integer-dot matmul.
    QuantizeQ8,
    /// The integer-dot matmul (`matmul_q8.wgsl`): `rows` weight rows and `tb` tokens per
    /// workgroup of 64, over x quantized by [`KernelKey::QuantizeQ8`]; its partial sums
    /// reduced with subgroupAdd when `subgroups`, else by a workgroup-memory tree.
    MatmulQ8 {
        ty: GgmlType,
        rows: u32,
        tb: u32,
        subgroups: bool,
    },
    /// The tiled integer-dot prompt matmul (`matmul_q8_tile.wgsl`): `bm` weight rows x
    /// `bn` tokens per workgroup of 256, blocks staged in workgroup memory.
    MatmulQ8Tile {
        ty: GgmlType,
        bm: u32,
        bn: u32,
    },
    /// Expert routing of a mixture-of-experts layer (`moe_route.wgsl`).
    MoeRoute,
    /// The chosen experts' matrix products over stacked `ty` experts (`matmul_id.wgsl`).
    MatmulId {
        ty: GgmlType,
    },
    /// The weighted sum of each token's experts' outputs (`moe_sum.wgsl`).
    MoeSum,
    /// A bias per expert added to each pair's output (gpt-oss).
    MoeAddId,
    /// A ubatch's (token, expert) pairs grouped by expert (`moe_group.wgsl`).
    MoeGroup,
    /// The experts' products for prompts, over pairs grouped by expert, in the
    /// CPU-shaped matmul's shape (`matmul.wgsl` over `shaders::Tokens::Grouped`): `rows`
    /// rows and `tb` pairs of one expert per invocation.
    MatmulIdRows {
        ty: GgmlType,
        rows: u32,
        tb: u32,
        subgroups: bool,
    },
    /// The same in the tiled prompt matmul's shape (`matmul_tile.wgsl` over
    /// `shaders::Tokens::Grouped`): `bm` rows x `bn` pairs of one expert per workgroup.
    MatmulIdTile {
        ty: GgmlType,
        bm: u32,
        bn: u32,
    },
    /// The short causal convolution of recurrent layers (Mamba, LFM2).
    SsmConv,
    /// The selective scan with states of up to `ds` values: an invocation per channel
    /// (`wg` false, CPU-shaped) or a workgroup per 256 / `ds` channels (GPUs).
    SsmScan {
        ds: u32,
        wg: bool,
    },
    /// Sampling's first pass: bias, penalties and each segment's top-k candidates; a
    /// workgroup per segment (`wg`, GPUs) or one invocation (CPU-shaped, no barriers).
    SampleTopk {
        wg: bool,
    },
    /// Sampling's second pass: the row's top-k, llama.cpp's chain and the draw; a
    /// workgroup per row (`wg`) or one invocation.
    SampleChain {
        wg: bool,
    },
}

/// What a kernel's products should compile to ([`KernelKey::product_instructions`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Products {
    /// Cooperative matrices: matrix instructions (`v_wmma_*` on RDNA3).
    Matrix,
    /// Packed 4 x 8-bit dot products (`v_dot4_*` on AMD).
    IntegerDot,
    /// Ordinary arithmetic.
    Plain,
}

impl Products {
    /// The name the kernel index uses.
    pub fn name(&self) -> &'static str {
        match self {
            Products::Matrix => "matrix",
            Products::IntegerDot => "intdot",
            Products::Plain => "plain",
        }
    }
}

/// (lanes, vec4s per lane) of the split attention output kernel for rows of `d4` vec4s:
/// lanes is the largest power of two up to d4 (at most 64).
pub fn split_shape(d4: u32) -> (u32, u32) {
    let d4 = d4.max(1);
    let lanes = 1u32 << (31 - d4.min(64).leading_zeros());
    (lanes, d4.div_ceil(lanes))
}

/// Key vec4s per invocation of the GPU score kernel for heads of `d4` vec4s: the fewest
/// of [`KQ_LANES_NK`] that [`KQ_LANES`] lanes cover the head with, None for heads past
/// 256 values.
pub fn kq_lanes_nk(d4: u32) -> Option<u32> {
    let nk = d4.div_ceil(KQ_LANES).max(1).next_power_of_two();
    KQ_LANES_NK.contains(&nk).then_some(nk)
}

/// Every distinct [`split_shape`] for head sizes up to [`MAX_SPLIT_HEAD_DIM`].
fn split_shapes() -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    for d4 in 1..=MAX_SPLIT_HEAD_DIM / 4 {
        let s = split_shape(d4);
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

/// No epilogue, or the fused GLU with each activation.
fn glu_epilogues() -> impl Iterator<Item = Option<Activation>> {
    std::iter::once(None).chain(Activation::FUSED.iter().map(|&a| Some(a)))
}

fn kv_type(f16: bool) -> String {
    if f16 { "f16" } else { "f32" }.to_string()
}

impl KernelKey {
    /// Every variant the ops can request: the offline check's list, and the set
    /// `Gpu::pipeline` accepts.
    pub fn all() -> Vec<KernelKey> {
        use KernelKey::*;
        let mut v = vec![
            AttnKqvSum,
            AttnKqvJoin,
            SsmConv,
            QuantizeQ8,
            MoeRoute,
            MoeSum,
            MoeAddId,
            MoeGroup,
        ];
        for ty in Q8_TYPES {
            for &rows in Q8_MATMUL_ROWS {
                for subgroups in [false, true] {
                    v.extend(Q8_MATMUL_TOKENS.iter().map(|&tb| MatmulQ8 {
                        ty,
                        rows,
                        tb,
                        subgroups,
                    }));
                }
            }
            v.extend(Q8_TILES.iter().map(|&(bm, bn)| MatmulQ8Tile { ty, bm, bn }));
        }
        v.extend([false, true].map(|wg| Hadamard { wg }));
        v.extend([false, true].map(|rows| RmsNorm { rows }));
        v.extend([false, true].map(|rows| AddRmsNorm { rows }));
        v.extend([false, true].map(|wg| SampleTopk { wg }));
        v.extend([false, true].map(|wg| SampleChain { wg }));
        for &ds in SSM_DS {
            v.extend([false, true].map(|wg| SsmScan { ds, wg }));
        }
        v.push(LayerNorm);
        v.push(PoolRows);
        v.push(AddScaled);
        v.extend(BinaryOp::ALL.iter().map(|&op| Binary(op)));
        v.extend(Activation::ALL.iter().map(|&act| Glu(act)));
        v.extend(SOFTMAX_WG.iter().map(|&wg| Softmax { wg }));
        v.extend([false, true].map(|f16| Rope { f16 }));
        for ty in KvType::ALL {
            let (k, kv) = (ty, ty);
            v.push(SetRows { ty });
            v.push(KvRead { ty });
            for &tb in ATTN_TB {
                v.push(AttnKq { k, tb });
                v.push(AttnKqv { v: kv, tb });
                v.extend(KQ_LANES_NK.iter().map(|&nk| AttnKqLanes { k, tb, nk }));
            }
            for (lanes, nv) in split_shapes() {
                v.push(AttnKqvSplit { v: kv, lanes, nv });
            }
            v.extend(ATTN_TILE_DK.iter().map(|&dk| AttnKqTile { k, dk }));
            v.extend(ATTN_TILE_NI.iter().map(|&ni| AttnKqvTile { v: kv, ni }));
            // K and V types combine freely, as llama.cpp's -ctk and -ctv.
            for vt in KvType::ALL {
                for norm in [false, true] {
                    v.push(RopeStore {
                        k,
                        v: vt,
                        norm,
                        rows: false,
                    });
                    if !k.is_packed() && !vt.is_packed() {
                        v.push(RopeStore {
                            k,
                            v: vt,
                            norm,
                            rows: true,
                        });
                    }
                }
                for split in [false, true] {
                    v.push(AttnFlash { k, v: vt, split });
                    for mma in [false, true] {
                        v.push(AttnFlashCoop {
                            k,
                            v: vt,
                            split,
                            mma,
                        });
                    }
                }
                for &d4 in FLASH_ROWS_D4 {
                    for &tb in FLASH_ROWS_TB {
                        v.push(AttnFlashRows { k, v: vt, d4, tb });
                    }
                }
            }
        }
        for ty in shaders::weight_types() {
            v.push(GetRows { ty });
            for glu in glu_epilogues() {
                // The fused epilogue pairs rows within an invocation (a workgroup).
                let rows_ok = |rows: u32| glu.is_none() || rows.is_multiple_of(2);
                for &rows in CPU_MATMUL_ROWS.iter().filter(|&&r| rows_ok(r)) {
                    for &tb in CPU_MATMUL_TOKENS {
                        // x's loads are shared over a subgroup for batches only.
                        for subgroups in [false, true].into_iter().filter(|&s| !s || tb > 1) {
                            v.push(Matmul {
                                ty,
                                rows,
                                tb,
                                subgroups,
                                glu,
                            });
                            // The same tiles over an expert's grouped pairs (prompts).
                            if glu.is_none() && tb > 1 {
                                v.push(MatmulIdRows {
                                    ty,
                                    rows,
                                    tb,
                                    subgroups,
                                });
                            }
                        }
                    }
                }
                for &tb in GPU_VEC_TOKENS {
                    for &rows in GPU_VEC_ROWS.iter().filter(|&&r| rows_ok(r)) {
                        for subgroups in [false, true] {
                            v.push(MatmulWg {
                                ty,
                                tb,
                                rows,
                                subgroups,
                                glu,
                            });
                        }
                    }
                }
            }
            for &(bm, bn) in GPU_TILES {
                v.push(MatmulTile { ty, bm, bn });
                v.push(MatmulIdTile { ty, bm, bn });
            }
            v.push(MatmulId { ty });
            for &s in COOP_SIZES {
                v.push(MatmulCoop { ty, s });
            }
        }
        v
    }

    /// Whether [`Self::all`] lists this key (the set is built once).
    pub fn is_known(&self) -> bool {
        static ALL: OnceLock<HashSet<KernelKey>> = OnceLock::new();
        ALL.get_or_init(|| Self::all().into_iter().collect())
            .contains(self)
    }

    /// The device features the shader needs: shader-f16 for an f16 KV cache, subgroups
    /// for the subgroupAdd reduction.
    pub fn features(&self) -> wgpu::Features {
        use KernelKey::*;
        let f16 = |t: KvType| t == KvType::F16;
        match *self {
            Rope { f16: true } => wgpu::Features::SHADER_F16,
            SetRows { ty: t }
            | KvRead { ty: t }
            | AttnKq { k: t, .. }
            | AttnKqLanes { k: t, .. }
            | AttnKqv { v: t, .. }
            | AttnKqvSplit { v: t, .. }
            | AttnKqTile { k: t, .. }
            | AttnKqvTile { v: t, .. }
                if f16(t) =>
            {
                wgpu::Features::SHADER_F16
            }
            RopeStore { k, v, .. } | AttnFlash { k, v, .. } | AttnFlashRows { k, v, .. }
                if f16(k) || f16(v) =>
            {
                wgpu::Features::SHADER_F16
            }
            MatmulWg {
                subgroups: true, ..
            }
            | Matmul {
                subgroups: true, ..
            }
            | MatmulIdRows {
                subgroups: true, ..
            }
            | MatmulQ8 {
                subgroups: true, ..
            } => wgpu::Features::SUBGROUP,
            MatmulCoop { .. } | AttnFlashCoop { mma: true, .. } => {
                wgpu::Features::SHADER_F16 | wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
            }
            AttnFlashCoop { mma: false, .. } => wgpu::Features::SHADER_F16,
            _ => wgpu::Features::empty(),
        }
    }

    /// The naga capabilities matching [`Self::features`]. Every kernel may use
    /// `unpack2x16float` (f16 scales read from f32 words), which needs no device feature.
    pub fn naga_capabilities(&self) -> naga::valid::Capabilities {
        use naga::valid::Capabilities as C;
        let f = self.features();
        let mut caps = C::SHADER_FLOAT16_IN_FLOAT32;
        if f.contains(wgpu::Features::SHADER_F16) {
            caps |= C::SHADER_FLOAT16;
        }
        if f.contains(wgpu::Features::SUBGROUP) {
            caps |= C::SUBGROUP;
        }
        if f.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
            caps |= C::COOPERATIVE_MATRIX;
        }
        caps
    }

    /// Invocations per workgroup (x; y and z are 1).
    pub fn workgroup_size(&self) -> u32 {
        use KernelKey::*;
        match *self {
            Binary(_)
            | Glu(_)
            | LayerNorm
            | MatmulWg { .. }
            | MatmulTile { .. }
            | MatmulIdTile { .. }
            | MatmulQ8Tile { .. }
            | MoeGroup
            | RmsNorm { rows: false }
            | AddRmsNorm { rows: false }
            | AttnKqTile { .. }
            | AttnKqvTile { .. }
            | SsmScan { wg: true, .. }
            | SampleTopk { wg: true }
            | SampleChain { wg: true }
            | AddScaled => 256,
            SampleTopk { wg: false } | SampleChain { wg: false } => 1,
            Softmax { wg } => wg,
            RmsNorm { rows: true }
            | AddRmsNorm { rows: true }
            | PoolRows
            | Rope { .. }
            | RopeStore { .. }
            | SetRows { .. }
            | KvRead { .. }
            | Hadamard { .. }
            | AttnKq { .. }
            | AttnKqLanes { .. }
            | AttnKqv { .. }
            | AttnKqvSplit { .. }
            | AttnFlash { .. }
            | AttnFlashRows { .. }
            | AttnKqvSum
            | AttnKqvJoin
            | GetRows { .. }
            | Matmul { .. }
            | QuantizeQ8
            | MoeRoute
            | MatmulId { .. }
            | MatmulIdRows { .. }
            | MoeSum
            | MoeAddId
            | MatmulQ8 { .. }
            | SsmConv
            | SsmScan { wg: false, .. } => 64,
            MatmulCoop { .. } | AttnFlashCoop { .. } => 32,
        }
    }

    /// For the matmul kernels: (weight rows, tokens) one workgroup computes, from which
    /// the dispatch size follows.
    pub fn matmul_block(&self) -> Option<(u32, u32)> {
        match *self {
            KernelKey::Matmul { rows, tb, .. } | KernelKey::MatmulIdRows { rows, tb, .. } => {
                Some((64 * rows, tb))
            }
            KernelKey::MatmulWg { rows, tb, .. } => Some((rows, tb)),
            KernelKey::MatmulTile { bm, bn, .. } | KernelKey::MatmulIdTile { bm, bn, .. } => {
                Some((bm, bn))
            }
            KernelKey::MatmulCoop { s, .. } => Some((2 * s, 2 * s)),
            KernelKey::MatmulQ8 { rows, tb, .. } => Some((rows, tb)),
            KernelKey::MatmulQ8Tile { bm, bn, .. } => Some((bm, bn)),
            _ => None,
        }
    }

    /// Whether only CPU-shaped adapters (lavapipe, llvmpipe, SwiftShader) select this
    /// variant: a GPU's model step never runs it (`ops::*::kernel` pick these only where
    /// `Gpu::kernels` is not `KernelShape::Gpu`).
    pub fn cpu_shaped(&self) -> bool {
        use KernelKey::*;
        matches!(
            self,
            Matmul { .. }
                | MatmulIdRows { .. }
                | RmsNorm { rows: true }
                | AddRmsNorm { rows: true }
                | RopeStore { rows: true, .. }
                | AttnFlashRows { .. }
                | SsmScan { wg: false, .. }
                | SampleTopk { wg: false }
                | SampleChain { wg: false }
                | Softmax { wg: 64 }
                | Hadamard { wg: false }
        )
    }

    /// The instructions a GPU compiler must make of this kernel's products where the
    /// device has them: matrix instructions for the cooperative-matrix kernels, packed
    /// dot products for the integer-dot ones (`scripts/kernel-stats.sh` checks both in
    /// the disassembly).
    pub fn product_instructions(&self) -> Products {
        use KernelKey::*;
        match self {
            MatmulCoop { .. } | AttnFlashCoop { mma: true, .. } => Products::Matrix,
            MatmulQ8 { .. } | MatmulQ8Tile { .. } => Products::IntegerDot,
            _ => Products::Plain,
        }
    }

    /// The activation of a matmul's fused GLU epilogue, if it has one.
    pub fn glu(&self) -> Option<Activation> {
        match *self {
            KernelKey::Matmul { glu, .. } | KernelKey::MatmulWg { glu, .. } => glu,
            _ => None,
        }
    }

    /// The WGSL `struct Params` of the kernel's uniform block.
    pub fn uniform_wgsl(&self) -> &'static str {
        use KernelKey::*;
        match self {
            RmsNorm { .. } | AddRmsNorm { .. } | LayerNorm => NormUniform::WGSL,
            PoolRows => SetRowsUniform::WGSL,
            AddScaled => AddScaledUniform::WGSL,
            Binary(_) => BinaryUniform::WGSL,
            Glu(_) => GluUniform::WGSL,
            Rope { .. } => RopeUniform::WGSL,
            SetRows { .. } | KvRead { .. } | Hadamard { .. } => SetRowsUniform::WGSL,
            RopeStore { .. } => RopeStoreUniform::WGSL,
            Softmax { .. } => SoftmaxUniform::WGSL,
            AttnKq { .. } | AttnKqLanes { .. } | AttnKqv { .. } | AttnKqTile { .. } => {
                AttnUniform::WGSL
            }
            AttnKqvSplit { .. }
            | AttnFlash { .. }
            | AttnFlashCoop { .. }
            | AttnFlashRows { .. }
            | AttnKqvTile { .. } => AttnSplitUniform::WGSL,
            AttnKqvSum | AttnKqvJoin => AttnSumUniform::WGSL,
            GetRows { .. } => GetRowsUniform::WGSL,
            Matmul { .. } | MatmulWg { .. } | MatmulTile { .. } | MatmulCoop { .. } => {
                MatmulUniform::WGSL
            }
            QuantizeQ8 => QuantizeQ8Uniform::WGSL,
            MatmulQ8 { .. } | MatmulQ8Tile { .. } => MatmulQ8Uniform::WGSL,
            MoeRoute => MoeRouteUniform::WGSL,
            MatmulId { .. } | MatmulIdRows { .. } | MatmulIdTile { .. } => MatmulIdUniform::WGSL,
            MoeGroup => MoeGroupUniform::WGSL,
            MoeSum => MoeSumUniform::WGSL,
            MoeAddId => MoeAddIdUniform::WGSL,
            SsmConv => SsmConvUniform::WGSL,
            SsmScan { .. } => SsmScanUniform::WGSL,
            SampleTopk { .. } | SampleChain { .. } => SampleUniform::WGSL,
        }
    }

    /// The complete WGSL module (entry point `main`), or why there is none (a weight
    /// type without a GPU snippet).
    pub fn source(&self) -> Result<String, String> {
        use KernelKey::*;
        let quant = |ty: GgmlType| {
            shaders::quant_snippet(ty).ok_or_else(|| format!("no GPU kernels for weight type {ty}"))
        };
        let body = match *self {
            RmsNorm { rows } => shaders::norm_source(shaders::RMS_NORM, rows),
            AddRmsNorm { rows } => shaders::norm_source(shaders::ADD_RMS_NORM, rows),
            LayerNorm => shaders::LAYER_NORM.to_string(),
            PoolRows => shaders::POOL_ROWS.to_string(),
            AddScaled => shaders::ADD_SCALED.to_string(),
            Binary(op) => compose(&[shaders::BINARY], &[("OP", op.expr().to_string())]),
            Glu(act) => compose(
                &[shaders::ACT, shaders::GLU],
                &[("ACT", act.wgsl().to_string())],
            ),
            Rope { f16 } => compose(&[shaders::ROPE], &[("KV_T", kv_type(f16))]),
            SetRows { ty } => shaders::set_rows_source(ty),
            KvRead { ty } => shaders::kv_reading(shaders::KV_READ, Some(ty), None, &[]),
            RopeStore { k, v, norm, rows } => shaders::rope_store_source(k, v, norm, rows),
            Hadamard { wg: false } => shaders::HADAMARD.to_string(),
            Hadamard { wg: true } => shaders::HADAMARD_WG.to_string(),
            Softmax { wg } => compose(
                &[shaders::SOFTMAX_COMMON, shaders::SOFTMAX],
                &[("WG", wg.to_string())],
            ),
            AttnKq { k, tb } => shaders::kv_reading(
                &[shaders::ATTN_KQ_IO, shaders::ATTN_KQ].concat(),
                Some(k),
                None,
                &[("TB", tb.to_string())],
            ),
            AttnKqLanes { k, tb, nk } => shaders::kv_reading(
                &[shaders::ATTN_KQ_IO, shaders::ATTN_KQ_LANES].concat(),
                Some(k),
                None,
                &[
                    ("TB", tb.to_string()),
                    ("NK", nk.to_string()),
                    ("LANES", KQ_LANES.to_string()),
                ],
            ),
            AttnKqv { v, tb } => {
                shaders::kv_reading(shaders::ATTN_KQV, None, Some(v), &[("TB", tb.to_string())])
            }
            AttnKqvSplit { v, lanes, nv } => shaders::kv_reading(
                &compose(&[shaders::SOFTMAX_COMMON, shaders::ATTN_KQV_SPLIT], &[]),
                None,
                Some(v),
                &[("LANES", lanes.to_string()), ("NV", nv.to_string())],
            ),
            AttnKqvSum => shaders::ATTN_KQV_SUM.to_string(),
            AttnKqTile { k, dk } => shaders::kv_reading(
                &[shaders::ATTN_KQ_IO, shaders::ATTN_KQ_TILE].concat(),
                Some(k),
                None,
                &[("DK", dk.to_string())],
            ),
            AttnKqvTile { v, ni } => shaders::kv_reading(
                shaders::ATTN_KQV_TILE,
                None,
                Some(v),
                &[("NI", ni.to_string()), ("TM", (8 / ni).to_string())],
            ),
            AttnKqvJoin => shaders::ATTN_KQV_JOIN.to_string(),
            AttnFlash { k, v, split } => shaders::attn_flash_source(k, v, split),
            AttnFlashCoop { k, v, split, mma } => shaders::attn_flash_coop_source(k, v, split, mma),
            AttnFlashRows { k, v, d4, tb } => shaders::kv_reading(
                &compose(&[shaders::SOFTMAX_COMMON, shaders::ATTN_FLASH_ROWS], &[]),
                Some(k),
                Some(v),
                &[("D4", d4.to_string()), ("TB", tb.to_string())],
            ),
            GetRows { ty } => compose(&[&quant(ty)?, shaders::QUANT_READ, shaders::GET_ROWS], &[]),
            Matmul {
                ty,
                rows,
                tb,
                subgroups,
                glu,
            } => shaders::matmul_source(
                &quant(ty)?,
                rows,
                tb,
                glu.map(Activation::wgsl),
                subgroups,
                Tokens::Dense,
            ),
            MatmulWg {
                ty,
                tb,
                rows,
                subgroups,
                glu,
            } => shaders::matmul_wg_source(
                &quant(ty)?,
                tb,
                rows,
                subgroups,
                glu.map(Activation::wgsl),
            ),
            MatmulTile { ty, bm, bn } => {
                shaders::matmul_tile_source(&quant(ty)?, bm, bn, Tokens::Dense)
            }
            MatmulCoop { ty, s } => shaders::matmul_coop_source(&quant(ty)?, s),
            QuantizeQ8 => shaders::QUANTIZE_Q8_1.to_string(),
            MatmulQ8 {
                ty,
                rows,
                tb,
                subgroups,
            } => compose(
                &[shaders::MATMUL_Q8, shaders::Q8_WEIGHTS],
                &[
                    ("TB", tb.to_string()),
                    ("ROWS", rows.to_string()),
                    shaders::q8_reduce_args(subgroups),
                    shaders::q8_reduce(subgroups),
                    (
                        "LOAD_W",
                        format!("load_w_{}", ty.to_string().to_lowercase()),
                    ),
                ],
            ),
            MatmulQ8Tile { ty, bm, bn } => compose(
                &[shaders::MATMUL_Q8_TILE, shaders::Q8_WEIGHTS],
                &[
                    ("BM", bm.to_string()),
                    ("BN", bn.to_string()),
                    (
                        "LOAD_W",
                        format!("load_w_{}", ty.to_string().to_lowercase()),
                    ),
                ],
            ),
            MoeRoute => shaders::MOE_ROUTE.to_string(),
            MatmulId { ty } => {
                compose(&[&quant(ty)?, shaders::QUANT_READ, shaders::MATMUL_ID], &[])
            }
            MoeSum => shaders::MOE_SUM.to_string(),
            MoeAddId => shaders::MOE_ADD_ID.to_string(),
            MoeGroup => shaders::MOE_GROUP.to_string(),
            MatmulIdRows {
                ty,
                rows,
                tb,
                subgroups,
            } => shaders::matmul_source(&quant(ty)?, rows, tb, None, subgroups, Tokens::Grouped),
            MatmulIdTile { ty, bm, bn } => {
                shaders::matmul_tile_source(&quant(ty)?, bm, bn, Tokens::Grouped)
            }
            SsmConv => compose(&[shaders::ACT, shaders::SSM_CONV], &[]),
            SsmScan { ds, wg } => compose(
                &[
                    &format!("const DS: u32 = {ds}u;"),
                    shaders::ACT,
                    shaders::SSM_SCAN_COMMON,
                    if wg {
                        shaders::SSM_SCAN_WG
                    } else {
                        shaders::SSM_SCAN
                    },
                ],
                &[],
            ),
            SampleTopk { wg } => sample_source(
                wg,
                shaders::SAMPLE_LOGIT,
                shaders::SAMPLE_TOPK,
                shaders::SAMPLE_TOPK_ONE,
            ),
            SampleChain { wg } => sample_source(
                wg,
                shaders::SAMPLE_DRAW,
                shaders::SAMPLE_CHAIN,
                shaders::SAMPLE_CHAIN_ONE,
            ),
        };
        // `enable` directives must precede every declaration.
        let mut enable = String::new();
        if self.features().contains(wgpu::Features::SHADER_F16) {
            enable += "enable f16;\n";
        }
        if (self.features()).contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
            enable += "enable wgpu_cooperative_matrix;\n";
        }
        Ok(format!("{enable}{}\n{body}", self.uniform_wgsl()))
    }
}

/// A sampling pass: its shared part, then the workgroup kernel with the radix select
/// (`wg`) or the one-invocation kernel with the heap.
fn sample_source(wg: bool, shared: &str, kernel_wg: &str, kernel_one: &str) -> String {
    let (select, kernel) = match wg {
        true => (shaders::SAMPLE_SELECT, kernel_wg),
        false => (shaders::SAMPLE_HEAP, kernel_one),
    };
    compose(
        &[
            &SampleRow::wgsl(),
            shaders::SAMPLE_KEYS,
            shared,
            select,
            kernel,
        ],
        &[],
    )
}

fn glu_suffix(glu: Option<Activation>) -> String {
    glu.map(|a| format!("_glu_{}", a.wgsl()))
        .unwrap_or_default()
}

impl crate::gpu::Kernel for KernelKey {
    fn source(&self) -> Result<String, String> {
        KernelKey::source(self)
    }
    fn features(&self) -> wgpu::Features {
        KernelKey::features(self)
    }
    fn naga_capabilities(&self) -> naga::valid::Capabilities {
        KernelKey::naga_capabilities(self)
    }
    fn is_known(&self) -> bool {
        KernelKey::is_known(self)
    }
    /// The matmuls write all of their workgroup memory before their first barrier and
    /// read it only after (read from their sources: `matmul_q8.wgsl` fills `red` for every
    /// (row, token) and invocation, or each subgroup's slot it then reads;
    /// `matmul_wg.wgsl` the same for `red` and every row of `res`; `matmul_tile.wgsl` all
    /// 8 x BM weight and 8 x BN activation slots of each K block; `matmul_q8_tile.wgsl`
    /// every slot of a step's BK weight and x blocks, one block per loading invocation,
    /// before each step's first barrier; `hadamard_wg.wgsl` all n values of its chunk,
    /// the only ones it reads); the other kernels keep
    /// the zero-fill until someone reads them as closely.
    fn reads_unwritten_workgroup_memory(&self) -> bool {
        !matches!(
            self,
            KernelKey::MatmulQ8 { .. }
                | KernelKey::MatmulQ8Tile { .. }
                | KernelKey::MatmulWg { .. }
                | KernelKey::MatmulTile { .. }
                | KernelKey::MatmulIdTile { .. }
                | KernelKey::Hadamard { wg: true }
        )
    }
}

impl fmt::Display for KernelKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use KernelKey::*;
        let kv = |f16: bool| if f16 { "f16" } else { "f32" };
        match *self {
            RmsNorm { rows } => write!(f, "rms_norm{}", if rows { "_rows" } else { "" }),
            AddRmsNorm { rows } => write!(f, "add_rms_norm{}", if rows { "_rows" } else { "" }),
            LayerNorm => write!(f, "layer_norm"),
            PoolRows => write!(f, "pool_rows"),
            AddScaled => write!(f, "add_scaled"),
            Binary(op) => write!(f, "binary_{op:?}"),
            Glu(act) => write!(f, "glu_{act:?}"),
            Rope { f16 } => write!(f, "rope_{}", kv(f16)),
            SetRows { ty } => write!(f, "set_rows_{ty}"),
            KvRead { ty } => write!(f, "kv_read_{ty}"),
            Hadamard { wg } => write!(f, "hadamard{}", if wg { "_wg" } else { "" }),
            RopeStore { k, v, norm, rows } => {
                let norm = if norm { "_norm" } else { "" };
                let rows = if rows { "_rows" } else { "" };
                write!(f, "rope_store_{k}_{v}{norm}{rows}")
            }
            Softmax { wg } => write!(f, "softmax_{wg}"),
            AttnKq { k, tb } => write!(f, "attn_kq_{k}_tb{tb}"),
            AttnKqLanes { k, tb, nk } => write!(f, "attn_kq_lanes_{k}_tb{tb}_nk{nk}"),
            AttnKqv { v, tb } => write!(f, "attn_kqv_{v}_tb{tb}"),
            AttnKqvSplit { v, lanes, nv } => write!(f, "attn_kqv_split_{v}_{lanes}x{nv}"),
            AttnKqvSum => write!(f, "attn_kqv_sum"),
            AttnKqTile { k, dk } => write!(f, "attn_kq_tile_{k}_dk{dk}"),
            AttnKqvTile { v, ni } => write!(f, "attn_kqv_tile_{v}_ni{ni}"),
            AttnKqvJoin => write!(f, "attn_kqv_join"),
            AttnFlash { k, v, split } => {
                write!(f, "attn_flash_{k}_{v}{}", if split { "_split" } else { "" })
            }
            AttnFlashCoop { k, v, split, mma } => write!(
                f,
                "attn_flash_coop_{k}_{v}{}{}",
                if split { "_split" } else { "" },
                if mma { "" } else { "_loops" }
            ),
            AttnFlashRows { k, v, d4, tb } => write!(f, "attn_flash_rows_{k}_{v}_d{d4}_tb{tb}"),
            GetRows { ty } => write!(f, "get_rows_{ty}"),
            Matmul {
                ty,
                rows,
                tb,
                subgroups,
                glu,
            } => write!(
                f,
                "matmul_{ty}_{rows}x{tb}{}{}",
                if subgroups { "_sg" } else { "" },
                glu_suffix(glu)
            ),
            MatmulWg {
                ty,
                tb,
                rows,
                subgroups,
                glu,
            } => write!(
                f,
                "matmul_wg_{ty}_tb{tb}_rows{rows}{}{}",
                if subgroups { "_sg" } else { "" },
                glu_suffix(glu)
            ),
            MatmulTile { ty, bm, bn } => write!(f, "matmul_tile_{ty}_{bm}x{bn}"),
            MatmulCoop { ty, s } => write!(f, "matmul_coop_{ty}_{s}"),
            QuantizeQ8 => write!(f, "quantize_q8_1"),
            MatmulQ8 {
                ty,
                rows,
                tb,
                subgroups,
            } => write!(
                f,
                "matmul_q8_{ty}_r{rows}_t{tb}{}",
                if subgroups { "_sg" } else { "" }
            ),
            MatmulQ8Tile { ty, bm, bn } => write!(f, "matmul_q8_tile_{ty}_{bm}x{bn}"),
            MoeRoute => write!(f, "moe_route"),
            MatmulId { ty } => write!(f, "matmul_id_{ty}"),
            MoeSum => write!(f, "moe_sum"),
            MoeAddId => write!(f, "moe_add_id"),
            MoeGroup => write!(f, "moe_group"),
            MatmulIdRows {
                ty,
                rows,
                tb,
                subgroups,
            } => write!(
                f,
                "matmul_id_rows_{ty}_{rows}x{tb}{}",
                if subgroups { "_sg" } else { "" }
            ),
            MatmulIdTile { ty, bm, bn } => write!(f, "matmul_id_tile_{ty}_{bm}x{bn}"),
            SsmConv => write!(f, "ssm_conv"),
            SsmScan { ds, wg } => write!(f, "ssm_scan_ds{ds}{}", if wg { "_wg" } else { "" }),
            SampleTopk { wg } => write!(f, "sample_topk{}", if wg { "_wg" } else { "" }),
            SampleChain { wg } => write!(f, "sample_chain{}", if wg { "_wg" } else { "" }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::unroll::{unroll, MAX_TRIPS};
    use naga::back::{hlsl, msl};

    /// `src` (a key's WGSL) parsed and validated with only the capabilities `key` declares.
    fn validated(
        key: KernelKey,
        src: &str,
    ) -> Result<(naga::Module, naga::valid::ModuleInfo), String> {
        let module = naga::front::wgsl::parse_str(src)
            .map_err(|e| format!("parse: {}", e.emit_to_string(src)))?;
        let info = naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            key.naga_capabilities(),
        )
        .validate(&module)
        .map_err(|e| format!("validate: {}", e.emit_to_string(src)))?;
        Ok((module, info))
    }

    /// Parses and validates a key's WGSL with only the capabilities it declares, checks
    /// its workgroup size, and translates it the way wgpu's Metal and DX12 backends would.
    fn check(key: KernelKey) -> Result<(), String> {
        let (module, info) = validated(key, &key.source()?)?;
        let ep = module
            .entry_points
            .iter()
            .find(|ep| ep.name == "main")
            .ok_or("no entry point `main`")?;
        if ep.workgroup_size != [key.workgroup_size(), 1, 1] {
            return Err(format!(
                "workgroup size {:?}, the key says {}",
                ep.workgroup_size,
                key.workgroup_size()
            ));
        }
        let subgroups = key.features().contains(wgpu::Features::SUBGROUP);
        let f16 = key.features().contains(wgpu::Features::SHADER_F16);
        if let KernelKey::MatmulCoop { s, .. } = key {
            return check_coop(&module, &info, s);
        }
        if let KernelKey::AttnFlashCoop { mma: true, .. } = key {
            return check_coop(&module, &info, 16);
        }
        // Metal: MSL 2.0 is what wgpu's oldest supported macOS offers; simdgroup
        // reductions need 2.1. Bounds checks as wgpu enables them by default.
        let checks = naga::proc::BoundsCheckPolicies {
            index: naga::proc::BoundsCheckPolicy::ReadZeroSkipWrite,
            buffer: naga::proc::BoundsCheckPolicy::ReadZeroSkipWrite,
            ..Default::default()
        };
        let msl_opts = msl::Options {
            lang_version: if subgroups { (2, 1) } else { (2, 0) },
            bounds_check_policies: checks,
            ..Default::default()
        };
        let msl_pipe = msl::PipelineOptions {
            entry_point: Some((naga::ShaderStage::Compute, "main".into())),
            ..Default::default()
        };
        msl::write_string(&module, &info, &msl_opts, &msl_pipe)
            .map_err(|e| format!("MSL: {e:?}"))?;
        // DX12: shader model 5.1 (FXC) for the plain kernels, 6.0 for wave intrinsics,
        // 6.2 for native f16 (both through DXC).
        let hlsl_opts = hlsl::Options {
            shader_model: if f16 {
                hlsl::ShaderModel::V6_2
            } else if subgroups {
                hlsl::ShaderModel::V6_0
            } else {
                hlsl::ShaderModel::V5_1
            },
            ..Default::default()
        };
        let hlsl_pipe = hlsl::PipelineOptions {
            entry_point: Some((naga::ShaderStage::Compute, "main".into())),
        };
        let mut out = String::new();
        hlsl::Writer::new(&mut out, &hlsl_opts, &hlsl_pipe)
            .write(&module, &info, None)
            .map_err(|e| format!("HLSL: {e:?}"))?;
        Ok(())
    }

    /// A cooperative-matrix kernel as wgpu's backends that have them would take it: SPIR-V
    /// with the cooperative-matrix capability (Vulkan), and for the 8 x 8 size Apple's
    /// simdgroup matrices (MSL 2.3). DX12 has none through wgpu.
    fn check_coop(
        module: &naga::Module,
        info: &naga::valid::ModuleInfo,
        s: u32,
    ) -> Result<(), String> {
        let spv_opts = naga::back::spv::Options {
            lang_version: (1, 3),
            ..Default::default()
        };
        let spv_pipe = naga::back::spv::PipelineOptions {
            shader_stage: naga::ShaderStage::Compute,
            entry_point: "main".into(),
        };
        let words = naga::back::spv::write_vec(module, info, &spv_opts, Some(&spv_pipe))
            .map_err(|e| format!("SPIR-V: {e:?}"))?;
        // OpCapability CooperativeMatrixKHR (6022) is declared.
        if !words
            .windows(2)
            .any(|w| w[0] == (2 << 16 | 17) && w[1] == 6022)
        {
            return Err("SPIR-V without the CooperativeMatrixKHR capability".into());
        }
        if s == 8 {
            let msl_opts = msl::Options {
                lang_version: (2, 3),
                ..Default::default()
            };
            let msl_pipe = msl::PipelineOptions {
                entry_point: Some((naga::ShaderStage::Compute, "main".into())),
                ..Default::default()
            };
            let out = msl::write_string(module, info, &msl_opts, &msl_pipe)
                .map_err(|e| format!("MSL: {e:?}"))?;
            if !out.0.contains("simdgroup_multiply_accumulate") {
                return Err("MSL without simdgroup_multiply_accumulate".into());
            }
        }
        Ok(())
    }

    #[test]
    fn every_kernel_variant_validates_and_translates_to_msl_and_hlsl() {
        let failures: Vec<String> = KernelKey::all()
            .into_iter()
            .filter_map(|k| check(k).err().map(|e| format!("{k}: {e}")))
            .collect();
        assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    }

    /// What `Gpu::pipeline` compiles where the adapter keeps loops (SwiftShader): each
    /// variant with its short loops written out still parses and validates, and every
    /// loop the unroller may take is gone.
    #[test]
    fn every_kernel_variant_validates_unrolled() {
        let failures: Vec<String> = KernelKey::all()
            .into_iter()
            .filter_map(|k| {
                let src = k.source().map(|s| unroll(&s, MAX_TRIPS));
                let err = src.and_then(|src| validated(k, &src).map(drop)).err()?;
                Some(format!("{k}: {err}"))
            })
            .collect();
        assert!(failures.is_empty(), "{}", failures.join("\n\n"));
        let matmul = KernelKey::Matmul {
            ty: crate::gguf::GgmlType::Q4_1,
            rows: 2,
            tb: 1,
            subgroups: false,
            glu: None,
        };
        let src = matmul.source().unwrap();
        let unrolled = unroll(&src, MAX_TRIPS);
        // Only the loop over blocks (`nb`) is left.
        assert_eq!(unrolled.matches("for (").count(), 1, "{unrolled}");
        assert!(src.matches("for (").count() > 8);
    }

    /// What `Gpu::pipeline` compiles where the driver specializes on uniforms (lavapipe):
    /// every variant declares its parameters the one way the rewrite expects, and still
    /// validates reading them from storage.
    #[test]
    fn every_kernel_variant_validates_with_params_in_storage() {
        use crate::ops::uniforms::params_in_storage;
        let failures: Vec<String> = KernelKey::all()
            .into_iter()
            .filter_map(|k| {
                let src = k.source().and_then(|s| {
                    params_in_storage(&s).ok_or_else(|| "no parameter declaration".to_string())
                });
                let err = match src {
                    Ok(src) if src.contains("var<uniform>") => "a uniform is left".to_string(),
                    Ok(src) => validated(k, &src).err()?,
                    Err(e) => e,
                };
                Some(format!("{k}: {err}"))
            })
            .collect();
        assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    }

    #[test]
    fn all_covers_every_choice_the_ops_make() {
        let all = KernelKey::all();
        let set: HashSet<_> = all.iter().copied().collect();
        assert_eq!(set.len(), all.len(), "duplicate keys");
        let types = shaders::weight_types();
        assert!(types.len() >= 5, "{types:?}");
        let splits = split_shapes().len();
        // Lanes 1 to 32 with 1 or 2 vec4s each (1 lane only ever has 1), 64 lanes with 1 to 8.
        assert_eq!(splits, 19);
        let even = |rows: &[u32]| rows.iter().filter(|&&r| r % 2 == 0).count();
        // Plain matmuls, the experts' products, and the fused GLU epilogue (even rows only)
        // per activation.
        // CPU-shaped batches with and without subgroups, decode without.
        let cpu_tokens = 2 * CPU_MATMUL_TOKENS.len() - 1;
        // The experts' products: per pair, and over grouped pairs in the CPU-shaped
        // kernel's batch tiles (with and without subgroups) and the GPU tiles.
        let experts = 1 + CPU_MATMUL_ROWS.len() * (cpu_tokens - 1) + GPU_TILES.len();
        let per_type = 1
            + CPU_MATMUL_ROWS.len() * cpu_tokens
            + GPU_VEC_TOKENS.len() * GPU_VEC_ROWS.len() * 2
            + GPU_TILES.len()
            + COOP_SIZES.len()
            + experts
            + Activation::FUSED.len()
                * (even(CPU_MATMUL_ROWS) * cpu_tokens
                    + GPU_VEC_TOKENS.len() * even(GPU_VEC_ROWS) * 2);
        assert_eq!(experts, 36);
        assert_eq!(per_type, 68 + 34 + 2 * (27 + 20));
        // Both shapes of the two norms, the two joins, both shapes of hadamard, binary ops, GLUs,
        // softmaxes, rope in f32 and f16. The recurrent layers' convolution and both
        // shapes of the scan per state size. Both shapes of sampling's two passes. Expert
        // routing, grouping, biases and weighted sum (their products are per type). A
        // LoRA correction's scaled add.
        let shared = 2 * 2
            + 2
            + 2
            + 2
            + BinaryOp::ALL.len()
            + Activation::ALL.len()
            + SOFTMAX_WG.len()
            + 2
            + 1
            + 2 * SSM_DS.len()
            + 2 * 2
            + 4
            + 1;
        // Per cache type: set_rows, kv_read, the attention kernels, and per (K, V) pair
        // two rope_stores, two GPU flash kernels and four of f16 tiles (matrices or loops), the
        // CPU ones (head buckets x tokens).
        let tiles = ATTN_TILE_DK.len() + ATTN_TILE_NI.len();
        let n_kv = KvType::ALL.len();
        let per_pair = 8 + FLASH_ROWS_D4.len() * FLASH_ROWS_TB.len();
        let kv =
            n_kv * (2 + (2 + KQ_LANES_NK.len()) * ATTN_TB.len() + splits + tiles + per_pair * n_kv);
        // Plain (K, V) pairs also have the one-invocation-per-head rope_stores.
        let plain = KvType::ALL.iter().filter(|t| !t.is_packed()).count();
        let rows = 2 * plain * plain;
        // The activation quantizer, and per type every rows x tokens x reduction and the
        // tiles.
        let q8 = 1 + super::Q8_TYPES.len()
            * (Q8_MATMUL_ROWS.len() * Q8_MATMUL_TOKENS.len() * 2 + Q8_TILES.len());
        assert_eq!(all.len(), shared + kv + rows + types.len() * per_type + q8);
        // The default GPU path for 2-7 tokens, and the f32-cache attention for 4+ tokens,
        // which the hand-kept list used to miss.
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::F16,
        ] {
            for subgroups in [false, true] {
                for glu in glu_epilogues() {
                    assert!(set.contains(&KernelKey::MatmulWg {
                        ty,
                        tb: 4,
                        rows: 4,
                        subgroups,
                        glu
                    }));
                }
            }
        }
        for ty in KvType::ALL {
            assert!(set.contains(&KernelKey::AttnKq { k: ty, tb: 4 }));
            assert!(set.contains(&KernelKey::AttnKqv { v: ty, tb: 4 }));
            assert!(set.contains(&KernelKey::AttnFlash {
                k: ty,
                v: KvType::Q4_0,
                split: true
            }));
        }
        // Every split shape attention can pick for head sizes up to the limit.
        for head_dim in (4..=MAX_SPLIT_HEAD_DIM).step_by(4) {
            let (lanes, nv) = split_shape(head_dim / 4);
            assert!(set.contains(&KernelKey::AttnKqvSplit {
                v: KvType::F16,
                lanes,
                nv
            }));
        }
        assert!(!KernelKey::Softmax { wg: 128 }.is_known());
        assert!(!KernelKey::GetRows { ty: GgmlType::Q8K }.is_known());
    }
}
