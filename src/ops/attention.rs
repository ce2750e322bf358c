//! Attention over the KV cache: scores (KQ), masked softmax, weighted sum of V (KQV).
//!
//! Three dispatches, each parallel over a different axis (cells, rows, head dims), so a
//! single decoded token still spreads its work across the adapter. On GPUs, prompts take
//! tiled kernels instead (scores and output as matrix products staged through workgroup
//! memory, the softmax between them), and a flash attention kernel (`attn_flash.wgsl`,
//! one dispatch that never writes the scores) can take their place when asked for
//! (`WGLLM_ATTN_FLASH=1`; slower so far).

use super::hadamard::{hadamard, hadamard_ref};
use super::kernels::{kernel_files, Family, Products};
use super::node::{GraphOp, OpCost, F32_BYTES};
use super::shaders::{self, compose, kv_reading, SOFTMAX_COMMON};
use super::softmax::{softmax_sinks, softmax_sinks_ref, SoftmaxParams};
use super::uniforms::uniform_struct;
use super::{record, split_groups, Dispatch, KernelKey, KernelTuning, View};
use crate::gpu::{Gpu, GpuError, KernelShape};
use crate::kv::KvType;

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
pub fn split_shapes() -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    for d4 in 1..=MAX_SPLIT_HEAD_DIM / 4 {
        let s = split_shape(d4);
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnShape {
    pub head_dim: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    pub n_tok: u32,
    /// Cells read from the cache (the padded bound, not the cache size).
    pub n_kv: u32,
    /// What the K and V caches hold (`-ctk`, `-ctv`); every kernel reads every type.
    pub k_type: KvType,
    pub v_type: KvType,
    /// Flash attention was asked for (`-fa on`): the flash kernel takes the attention
    /// wherever it applies (GPU-shaped kernels, heads it holds).
    pub flash: bool,
    /// llama.cpp's attention rotation of a quantized cache (`crate::kv::KvChoice`): the
    /// size of the Walsh-Hadamard chunks rope_store rotated Q and K heads by (unused
    /// here), and V heads by; attention rotates its output back by the latter. 0: none.
    pub rot_k: u32,
    pub rot_v: u32,
}

impl AttnShape {
    /// The score and one-pass output kernels' uniform block.
    fn uniform(&self) -> AttnUniform {
        AttnUniform {
            head_dim: self.head_dim,
            n_head: self.n_head,
            n_head_kv: self.n_head_kv,
            n_tok: self.n_tok,
            n_kv: self.n_kv,
            ..Default::default()
        }
    }
    /// The uniform block of the split output and flash kernels: the shape, the softmax's
    /// scale and ALiBi parameters, and the split's `chunk` of cells (0 for flash).
    fn split_uniform(&self, sm: &SoftmaxParams, chunk: u32) -> AttnSplitUniform {
        let (n_head_log2, m0, m1) = sm.alibi();
        AttnSplitUniform {
            head_dim: self.head_dim,
            n_head: self.n_head,
            n_head_kv: self.n_head_kv,
            n_tok: self.n_tok,
            n_kv: self.n_kv,
            chunk,
            has_mask: 1,
            n_head_log2,
            scale: sm.scale,
            max_bias: sm.max_bias,
            m0,
            m1,
            softcap: sm.softcap,
            ..Default::default()
        }
    }

    /// Tokens one pass of the three kernels takes. The scores of a pass (heads × tokens ×
    /// cells, f32) must fit one storage binding: at long contexts a big ubatch does not
    /// (SmolLM2 at -c 8192 -ub 512: 151 MB against lavapipe's 128 MiB), so it is cut into
    /// passes of fewer tokens, each starting on the adapter's storage offset alignment.
    pub fn tokens_per_pass(&self, gpu: &Gpu) -> Result<u32, GpuError> {
        self.tokens_fitting(gpu, self.n_head as u64 * self.n_kv as u64 * 4)
    }

    /// Tokens of a pass where each token takes `per_tok` bytes of the largest binding
    /// (scores, or the flash kernel's mask and query rows), passes starting on the
    /// adapter's storage offset alignment.
    fn tokens_fitting(&self, gpu: &Gpu, per_tok: u64) -> Result<u32, GpuError> {
        let fit = gpu.max_binding / per_tok.max(1);
        if fit >= self.n_tok as u64 {
            return Ok(self.n_tok);
        }
        let align = gpu.device.limits().min_storage_buffer_offset_alignment as u64;
        let step = |row_bytes: u64| align / gcd(align, row_bytes);
        let q_row = self.head_dim as u64 * self.n_head as u64 * 4;
        let (a, b) = (step(q_row), step(self.n_kv as u64 * 4));
        let unit = a / gcd(a, b) * b;
        let tc = fit / unit * unit;
        if tc == 0 {
            return Err(GpuError::Validation(format!(
                "attention over {} cache cells with {} heads needs {} bytes of scores (or mask) \
                 per token, more than this adapter's storage binding limit ({} bytes) allows; use a \
                 smaller context (-c)",
                self.n_kv, self.n_head, per_tok * unit, gpu.max_binding
            )));
        }
        Ok(tc as u32)
    }

    /// f32 elements of the scores scratch buffer (one pass of [`Self::tokens_per_pass`];
    /// 1 where a flash kernel takes the attention: it writes no scores).
    pub fn scores_len(&self, gpu: &Gpu) -> Result<u64, GpuError> {
        if self.flash(gpu) || self.flash_rows(gpu).is_some() {
            return Ok(1);
        }
        Ok(self.n_head as u64 * self.tokens_per_pass(gpu)? as u64 * self.n_kv as u64)
    }

    /// Chunks of cells the output is split into, or None for the one-pass output kernel.
    /// GPUs split the output over the cells (flash-decoding): one workgroup per
    /// head and dimension leaves most of a GPU idle and walks every cell in turn, which
    /// made a decoded token over 4096 cells cost 30x the llama.cpp Vulkan time on an H100.
    /// CPU-like adapters (lavapipe) keep the one-pass kernel, already spread over threads.
    fn split(&self, gpu: &Gpu) -> Option<Split> {
        // Heads larger than the split kernel's variants (none known) take the one-pass kernel.
        if gpu.kernels != KernelShape::Gpu
            || self.n_tok > split_max_tok(&gpu.tuning)
            || self.head_dim > MAX_SPLIT_HEAD_DIM
        {
            return None;
        }
        // Chunks of SPLIT_CHUNK cells (or `WGLLM_ATTN_CHUNK`), or fewer, longer chunks
        // where the partial sums of many tokens would not fit SPLIT_MAX_BYTES.
        let unit = gpu.tuning.attn_split_chunk.unwrap_or(SPLIT_CHUNK);
        let room = gpu.max_binding.min(SPLIT_MAX_BYTES);
        let per_split = self.partials_bytes(1) + self.stats_bytes(1);
        let max_splits = (room / per_split).min(u32::MAX as u64) as u32;
        let target = self.n_kv.div_ceil(unit).min(max_splits);
        if target < 2 {
            return None;
        }
        let chunk = self.n_kv.div_ceil(target).div_ceil(unit) * unit;
        let n_split = self.n_kv.div_ceil(chunk);
        (n_split > 1).then_some(Split { n_split, chunk })
    }

    /// Whether the flash kernel takes this attention: only where asked for
    /// (`tuning.attn_flash`, `WGLLM_ATTN_FLASH=1`) on GPU-shaped kernels, for heads it
    /// holds. Not by default: on an H100 it ran 7B pp512 at depth 4096 at 592 t/s against
    /// 1022 with the split path, and the 135M shape at 4.0k against 10.5k (split over
    /// chunks of cells; 567 and 3.1k over all cells per workgroup). Each invocation loads a
    /// vec4 of workgroup memory per vec4 multiply-add, and a tile takes five barriers:
    /// register tiles (several rows and columns per invocation) are the next step.
    fn flash(&self, gpu: &Gpu) -> bool {
        gpu.kernels == KernelShape::Gpu
            && self.head_dim <= MAX_FLASH_HEAD_DIM
            && (self.flash || gpu.tuning.attn_flash == Some(true))
    }

    /// The CPU-shaped flash kernel's variant and split, where it takes this attention:
    /// flash attention asked for (`-fa on`, or `auto`: on for CPU-shaped kernels) where
    /// [`cpu_flash_kernel`] holds, heads up to 4 * the largest of [`FLASH_ROWS_D4`]. Decided on the whole
    /// batch (the partials scratch is sized for it); a pass keeps its split.
    fn flash_rows(&self, gpu: &Gpu) -> Option<FlashRows> {
        let d4 = self.head_dim / 4;
        let bucket = *FLASH_ROWS_D4.iter().find(|&&b| b >= d4)?;
        if !cpu_flash_kernel(gpu) || !self.flash {
            return None;
        }
        // Tokens per invocation: each keeps TB x D4 vec4s of queries and outputs, which
        // spill out of a CPU's vector registers as they grow. lavapipe, SmolLM2 pp64 at
        // depth 1024, the kernel alone: TB 1 1086 ms, 2 620, 4 1190 (unfused: 931).
        let tb = if self.n_tok >= 2 {
            (32 / bucket).max(1)
        } else {
            1
        };
        // Chunks of cells until every lane of a CPU's threads has an invocation, each of
        // at least ROWS_MIN_CHUNK cells, their partials within SPLIT_MAX_BYTES. lavapipe
        // and llvmpipe (Mesa 22.3) end an invocation's loops after 65535 iterations in
        // all, silently: heads of 256 went wrong past ~480 cells an invocation. So a
        // chunk also keeps the kernel's loop trips (per cell at most: the head's vec4s
        // for the keys, the values and a rescale, each with TB tokens inside, and two
        // loops over the tokens) within ROWS_LOOP_BUDGET; where the partials cannot hold
        // that many chunks, the unfused kernels take the attention.
        let per_cell = bucket * (2 + 3 * tb) + 2 * tb;
        let max_chunk = (ROWS_LOOP_BUDGET / per_cell).max(1);
        let groups = self.n_tok.div_ceil(tb) * self.n_head;
        let room = gpu.max_binding.min(SPLIT_MAX_BYTES);
        let per_split = self.partials_bytes(1) + self.stats_bytes(1);
        let max_splits = (room / per_split.max(1)).min(u32::MAX as u64) as u32;
        let need = self.n_kv.div_ceil(max_chunk);
        if need > max_splits {
            return None;
        }
        let target = ROWS_MIN_INVOCATIONS
            .div_ceil(groups)
            .min(self.n_kv / ROWS_MIN_CHUNK)
            .max(need)
            .min(max_splits)
            .max(1);
        let chunk = self.n_kv.div_ceil(target).max(1);
        let split = Split {
            n_split: self.n_kv.div_ceil(chunk).max(1),
            chunk,
        };
        Some(FlashRows {
            d4: bucket,
            tb,
            split,
        })
    }

    /// Whether the tiled prompt kernels take this attention: GPU-shaped kernels, heads they
    /// hold, and at least [`tile_min_tok`] tokens (unless the flash kernel was asked for).
    fn tiled(&self, gpu: &Gpu) -> bool {
        gpu.kernels == KernelShape::Gpu
            && self.head_dim <= MAX_TILE_HEAD_DIM
            && self.n_tok >= tile_min_tok(&gpu.tuning)
            && !self.flash(gpu)
    }

    /// Chunks of cells of the tiled output kernel: [`TILE_CHUNK`] cells each, or fewer,
    /// longer chunks where every chunk's partial outputs would not fit SPLIT_MAX_BYTES;
    /// one chunk (no partials) over at most TILE_CHUNK cells.
    fn tile_split(&self, gpu: &Gpu) -> Split {
        let room = gpu.max_binding.min(SPLIT_MAX_BYTES);
        let max_splits = (room / self.partials_bytes(1).max(1)).clamp(1, u32::MAX as u64) as u32;
        let target = self.n_kv.div_ceil(TILE_CHUNK).clamp(1, max_splits);
        let chunk = self.n_kv.div_ceil(target).div_ceil(TILE_SLICE) * TILE_SLICE;
        Split {
            n_split: self.n_kv.div_ceil(chunk.max(1)).max(1),
            chunk: chunk.max(TILE_SLICE),
        }
    }

    fn partials_bytes(&self, n_split: u32) -> u64 {
        n_split as u64 * self.n_tok as u64 * self.n_head as u64 * self.head_dim as u64 * 4
    }

    /// The (max, sum) pairs of the split kernel: one per chunk, token and head.
    fn stats_bytes(&self, n_split: u32) -> u64 {
        n_split as u64 * self.n_tok as u64 * self.n_head as u64 * 8
    }

    /// Where the stats start in the partials scratch: after the partial outputs, on the
    /// adapter's storage offset alignment.
    fn stats_offset(&self, gpu: &Gpu, n_split: u32) -> u64 {
        let align = gpu.device.limits().min_storage_buffer_offset_alignment as u64;
        self.partials_bytes(n_split).div_ceil(align) * align
    }

    /// The partial outputs and their stats, for `n_split` chunks, in `partials`.
    fn split_views(&self, gpu: &Gpu, n_split: u32, partials: &View) -> (View, View) {
        let part = sub_view(partials, 0, self.partials_bytes(n_split));
        let offset = self.stats_offset(gpu, n_split);
        (part, sub_view(partials, offset, self.stats_bytes(n_split)))
    }

    /// f32 elements of the scratch buffer of the split kernel: partial outputs, then
    /// their stats (1 if unused).
    pub fn partials_len(&self, gpu: &Gpu) -> u64 {
        if let Some(fr) = self.flash_rows(gpu) {
            let n = fr.split.n_split;
            return (self.stats_offset(gpu, n) + self.stats_bytes(n)) / 4;
        }
        if self.tiled(gpu) {
            let sp = self.tile_split(gpu);
            return if sp.n_split > 1 {
                self.partials_bytes(sp.n_split) / 4
            } else {
                1
            };
        }
        self.split(gpu).map_or(1, |sp| {
            (self.stats_offset(gpu, sp.n_split) + self.stats_bytes(sp.n_split)) / 4
        })
    }
}

/// Most tokens for which GPU-shaped kernels split the attention output over cells: all
/// by default (`tuning.attn_split_max_tok`, `WGLLM_ATTN_SPLIT=N`, sets a limit, for
/// measuring). Prompts gain too: H100, pp512 with 8 as the limit vs none: SmolLM2 shape
/// 13.8k -> 21.2k t/s, 7B Q4_0 1300 -> 1539, and at depth 2048 4.4k -> 10.9k and 625 -> 1093.
fn split_max_tok(tuning: &KernelTuning) -> u32 {
    tuning.attn_split_max_tok.unwrap_or(u32::MAX)
}

/// Fewest tokens for which GPU-shaped kernels take the tiled prompt attention: 32 by
/// default (`tuning.attn_tile_min`, `WGLLM_ATTN_TILE_MIN=N`, for measuring). Below it a
/// tile of 64 tokens would be mostly empty, and the split path spreads a few tokens over
/// the device better.
fn tile_min_tok(tuning: &KernelTuning) -> u32 {
    tuning.attn_tile_min.unwrap_or(32)
}

/// Cells per chunk (workgroup z) of the tiled output kernel, at least: 4096 cells make 16
/// chunks, so a 7B's 512-token ubatch runs 16 x 32 heads x 4 token tiles.
const TILE_CHUNK: u32 = 256;
/// Cells per slice of the tiled output kernel (SC in attn_kqv_tile.wgsl): chunks are
/// multiples of it.
const TILE_SLICE: u32 = 16;

/// Largest partial-output scratch the split takes: beyond it, chunks grow past SPLIT_CHUNK
/// cells (7B, 512 tokens: 256 MiB holds 32 chunks).
const SPLIT_MAX_BYTES: u64 = 256 << 20;
/// Cells per workgroup of the split output kernel (at least; a multiple of it).
const SPLIT_CHUNK: u32 = 128;

/// Whether `gpu` runs the CPU-shaped flash kernel: wherever the kernels are CPU-shaped
/// (lavapipe, llvmpipe, SwiftShader natively and in a browser page).
pub fn cpu_flash_kernel(gpu: &Gpu) -> bool {
    gpu.kernels != KernelShape::Gpu
}

/// Invocations the CPU-shaped flash kernel aims for: lanes for 128 threads of 8 (a
/// decoded token's few heads are split over chunks of cells until they fill them).
const ROWS_MIN_INVOCATIONS: u32 = 1024;
/// Fewest cells per chunk of the CPU-shaped flash kernel.
const ROWS_MIN_CHUNK: u32 = 32;
/// Loop iterations one invocation of the CPU-shaped flash kernel may take: 3/4 of the
/// 65535 after which lavapipe's loop limiter stops it.
const ROWS_LOOP_BUDGET: u32 = 49152;

/// The CPU-shaped flash kernel's choice: head bucket, tokens per invocation, split.
#[derive(Clone, Copy, Debug)]
struct FlashRows {
    d4: u32,
    tb: u32,
    split: Split,
}

/// How the output is split: `n_split` chunks of `chunk` cells (the last one shorter).
#[derive(Clone, Copy, Debug)]
struct Split {
    n_split: u32,
    chunk: u32,
}

/// The split kernel's two dispatches: per chunk of cells the softmax's maximum and sum
/// and the weighted values, then the chunks joined (see attn_kqv_split.wgsl).
#[allow(clippy::too_many_arguments)]
fn kqv_split(
    gpu: &Gpu,
    s: &AttnShape,
    sm: &SoftmaxParams,
    sp: Split,
    [scores, mask, v]: [&View; 3],
    sk: Sinks,
    partials: &View,
    dst: &View,
) -> Result<Vec<Dispatch>, GpuError> {
    let d4 = s.head_dim / 4;
    let (lanes, nv) = split_shape(d4);
    let split = gpu.pipeline(KernelKey::Attention(Kernel::KqvSplit {
        v: s.v_type,
        lanes,
        nv,
    }))?;
    let kernel = ("attn_kqv_split", split, [sp.n_split, s.n_tok, s.n_head]);
    chunked_then_joined(
        gpu,
        s,
        sm,
        kernel,
        &[scores, mask, v],
        sp,
        sk,
        partials,
        dst,
    )
}

/// The attention sinks' buffer (a placeholder where there are none) and whether there are.
#[derive(Clone, Copy)]
struct Sinks<'a> {
    view: &'a View,
    on: bool,
}

impl<'a> Sinks<'a> {
    fn given(self) -> Option<&'a View> {
        self.on.then_some(self.view)
    }
}

/// A kernel (label, pipeline, workgroups) that reads `inputs` and writes each chunk's
/// partial outputs and (max, sum) stats (bound after the inputs, in `partials`), then
/// the chunks joined into `dst`: the split output kernel and both flash kernels.
#[allow(clippy::too_many_arguments)]
fn chunked_then_joined(
    gpu: &Gpu,
    s: &AttnShape,
    sm: &SoftmaxParams,
    (label, pipeline, groups): (
        &'static str,
        std::sync::Arc<wgpu::ComputePipeline>,
        [u32; 3],
    ),
    inputs: &[&View],
    sp: Split,
    sk: Sinks,
    partials: &View,
    dst: &View,
) -> Result<Vec<Dispatch>, GpuError> {
    let params = s.split_uniform(sm, sp.chunk);
    let (part, stats) = s.split_views(gpu, sp.n_split, partials);
    let io: Vec<&View> = inputs.iter().copied().chain([&part, &stats]).collect();
    let params = bytemuck::bytes_of(&params);
    Ok(vec![
        record(gpu, label, pipeline, params, &io, groups)?,
        join_splits(gpu, s, sp.n_split, [&part, &stats], sk, dst)?,
    ])
}

/// The chunks' partial outputs and (max, sum) stats joined into the output
/// (attn_kqv_sum.wgsl).
fn join_splits(
    gpu: &Gpu,
    s: &AttnShape,
    n_split: u32,
    [part, stats]: [&View; 2],
    sk: Sinks,
    dst: &View,
) -> Result<Dispatch, GpuError> {
    let d4 = s.head_dim / 4;
    let n = d4 * s.n_head * s.n_tok;
    let (gx, gy) = split_groups(n.div_ceil(64));
    record(
        gpu,
        "attn_kqv_sum",
        gpu.pipeline(KernelKey::Attention(Kernel::KqvSum))?,
        bytemuck::bytes_of(&AttnSumUniform {
            n,
            n_split,
            d4,
            n_head: s.n_head,
            has_sinks: sk.on as u32,
            ..Default::default()
        }),
        &[part, stats, dst, sk.view],
        [gx, gy, 1],
    )
}

/// Which kernel takes a GPU-shaped flash attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlashKernel {
    /// `attn_flash.wgsl`: f32 tiles, vec4 products.
    Plain,
    /// `attn_flash_coop.wgsl`: f16 tiles, both products on 16 x 16 cooperative matrices
    /// (`mma`), or the same kernel with its products as loops over the same workgroup
    /// memory (runs wherever shader-f16 does: the op tests check everything around the
    /// products on devices without the matrices).
    Coop { mma: bool },
}

impl FlashKernel {
    /// What a flash attention on `gpu` takes: the matrices where [`flash_coop`] holds.
    pub fn for_gpu(gpu: &Gpu) -> FlashKernel {
        if flash_coop(gpu) {
            FlashKernel::Coop { mma: true }
        } else {
            FlashKernel::Plain
        }
    }

    fn key(self, s: &AttnShape, split: bool) -> (&'static str, KernelKey) {
        let (k, v) = (s.k_type, s.v_type);
        match self {
            FlashKernel::Plain => ("attn_flash", Kernel::Flash { k, v, split }.into()),
            FlashKernel::Coop { mma } => {
                let key = Kernel::FlashCoop { k, v, split, mma }.into();
                ("attn_flash_coop", key)
            }
        }
    }
}

/// The flash kernel `fk`: a workgroup per 16 tokens and head, over every cell, or with
/// `split` (the whole batch's, which `partials` was sized for) one workgroup per chunk of
/// cells too, joined after.
#[allow(clippy::too_many_arguments)]
fn flash(
    gpu: &Gpu,
    s: &AttnShape,
    sm: &SoftmaxParams,
    split: Option<Split>,
    fk: FlashKernel,
    [q, k, v, mask]: [&View; 4],
    sk: Sinks,
    partials: &View,
    dst: &View,
) -> Result<Vec<Dispatch>, GpuError> {
    let (label, key) = fk.key(s, split.is_some());
    let pipeline = gpu.pipeline(key)?;
    // `WGLLM_FAULT=wrong-head`: the last head left unwritten.
    let heads = s.n_head - gpu.fault_wrong_head() as u32;
    let groups = |n_split| [s.n_tok.div_ceil(16), heads, n_split];
    let Some(sp) = split else {
        let params = AttnSplitUniform {
            has_sinks: sk.on as u32,
            ..s.split_uniform(sm, 0)
        };
        let io = [q, k, v, mask, dst, sk.view];
        let d = record(
            gpu,
            label,
            pipeline,
            bytemuck::bytes_of(&params),
            &io,
            groups(1),
        )?;
        return Ok(vec![d]);
    };
    let kernel = (label, pipeline, groups(sp.n_split));
    chunked_then_joined(gpu, s, sm, kernel, &[q, k, v, mask], sp, sk, partials, dst)
}

/// Workgroup memory of the cooperative-matrix flash kernel (attn_flash_coop.wgsl: f16 Q,
/// K and V tiles, the scores, P, P V, zeros and the reductions), rounded up.
const FLASH_COOP_WORKGROUP_BYTES: u32 = 24 << 10;

/// Whether the flash kernel runs on cooperative matrices: where they are chosen
/// (`tuning.coop_matrix`, as for the prompt matmuls, whose check vouches for the device's
/// matrices), the device has the 16 x 16 ones the kernel multiplies, and the workgroup
/// memory it takes.
pub fn flash_coop(gpu: &Gpu) -> bool {
    gpu.tuning.coop_matrix == Some(true)
        && gpu.coop_size == Some(16)
        && gpu.info.max_workgroup_storage >= FLASH_COOP_WORKGROUP_BYTES
}

/// The CPU-shaped flash kernel (attn_flash_rows.wgsl) over `fr`'s chunks of cells, then
/// the chunks joined (which also divides by the softmax's sum).
#[allow(clippy::too_many_arguments)]
fn flash_rows(
    gpu: &Gpu,
    s: &AttnShape,
    sm: &SoftmaxParams,
    fr: FlashRows,
    [q, k, v, mask]: [&View; 4],
    sk: Sinks,
    partials: &View,
    dst: &View,
) -> Result<Vec<Dispatch>, GpuError> {
    let tb = if s.n_tok >= fr.tb { fr.tb } else { 1 };
    let pipeline = gpu.pipeline(KernelKey::Attention(Kernel::CpuFlash {
        k: s.k_type,
        v: s.v_type,
        d4: fr.d4,
        tb,
    }))?;
    let sp = fr.split;
    // Invocations over (chunk, token group) pairs, token groups fastest.
    let groups = [
        (s.n_tok.div_ceil(tb) * sp.n_split).div_ceil(64),
        s.n_head,
        1,
    ];
    let kernel = ("attn_flash_rows", pipeline, groups);
    chunked_then_joined(gpu, s, sm, kernel, &[q, k, v, mask], sp, sk, partials, dst)
}

/// The tiled prompt kernels (one pass): scores 64 cells x 64 tokens per workgroup
/// (attn_kq_tile.wgsl), the softmax in place, then the output per tile of tokens and
/// chunk of cells (attn_kqv_tile.wgsl), the chunks added up where there are several.
#[allow(clippy::too_many_arguments)]
fn tiled(
    gpu: &Gpu,
    s: &AttnShape,
    sm: &SoftmaxParams,
    sp: Split,
    [q, k, v, mask]: [&View; 4],
    sk: Sinks,
    scores: &View,
    partials: &View,
    dst: &View,
) -> Result<Vec<Dispatch>, GpuError> {
    // 16 KiB of keys and queries per slice of 8 vec4s, plus two flags.
    let dk = if gpu.info.max_workgroup_storage >= 16 * 1024 + 16 {
        8
    } else {
        4
    };
    let d4 = s.head_dim / 4;
    let ni = d4.div_ceil(16);
    let tokens = 16 * (8 / ni);
    let mut out = vec![
        record(
            gpu,
            "attn_kq_tile",
            gpu.pipeline(KernelKey::Attention(Kernel::KqTile { k: s.k_type, dk }))?,
            bytemuck::bytes_of(&s.uniform()),
            &[q, k, scores, mask],
            [s.n_kv.div_ceil(64), s.n_tok.div_ceil(64), s.n_head],
        )?,
        softmax_sinks(gpu, sm, Some(mask), sk.given(), scores, s.n_kv, s.n_tok)?,
    ];
    let part = if sp.n_split > 1 {
        sub_view(partials, 0, s.partials_bytes(sp.n_split))
    } else {
        dst.clone()
    };
    out.push(record(
        gpu,
        "attn_kqv_tile",
        gpu.pipeline(KernelKey::Attention(Kernel::KqvTile { v: s.v_type, ni }))?,
        bytemuck::bytes_of(&s.split_uniform(sm, sp.chunk)),
        &[scores, v, &part],
        [s.n_tok.div_ceil(tokens), s.n_head, sp.n_split],
    )?);
    if sp.n_split > 1 {
        let n = d4 * s.n_head * s.n_tok;
        let (gx, gy) = split_groups(n.div_ceil(64));
        out.push(record(
            gpu,
            "attn_kqv_join",
            gpu.pipeline(KernelKey::Attention(Kernel::KqvJoin))?,
            bytemuck::bytes_of(&AttnSumUniform {
                n,
                n_split: sp.n_split,
                d4,
                ..Default::default()
            }),
            &[&part, dst],
            [gx, gy, 1],
        )?);
    }
    Ok(out)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// `v` narrowed to `len` bytes from `start` bytes in.
fn sub_view(v: &View, start: u64, len: u64) -> View {
    View {
        buf: v.buf.clone(),
        offset: v.offset + start,
        size: len,
    }
}

/// Tokens per invocation in the score and output kernels: each cached key or value row is
/// loaded once for that many tokens. `tuning.attn_tb` (`WGLLM_ATTN_TB`) overrides it, for
/// measuring.
fn tokens_per_invocation(tuning: &KernelTuning, n_tok: u32) -> u32 {
    if let Some(tb) = tuning.attn_tb {
        return tb;
    }
    // lavapipe, SmolLM2 pp128: 1 token 4.9 t/s, 4 tokens 6.2, 8 tokens 5.6.
    if n_tok >= 4 {
        4
    } else {
        1
    }
}

/// The views attention reads and writes. q: [head_dim, n_head, n_tok]; k, v: the cache,
/// [head_dim, n_head_kv, cells] (f16 or f32); mask: [n_kv, n_tok]; scores: scratch of
/// [`AttnShape::scores_len`]; partials: scratch of [`AttnShape::partials_len`];
/// dst: [head_dim * n_head, n_tok]; sinks: gpt-oss's attention sinks, one logit per
/// head ([n_head]) joining each row's softmax (its maximum and sum) with no value.
#[derive(Clone, Copy)]
pub struct AttnViews<'a> {
    pub q: &'a View,
    pub k: &'a View,
    pub v: &'a View,
    pub mask: &'a View,
    pub scores: &'a View,
    pub partials: &'a View,
    pub dst: &'a View,
    pub sinks: Option<&'a View>,
}

pub fn attention(
    gpu: &Gpu,
    s: &AttnShape,
    sp: &SoftmaxParams,
    io: &AttnViews,
) -> Result<Vec<Dispatch>, GpuError> {
    attention_with(gpu, s, sp, io, FlashKernel::for_gpu(gpu))
}

/// [`attention`] with flash kernel `fk` where a GPU-shaped flash attention takes it.
pub fn attention_with(
    gpu: &Gpu,
    s: &AttnShape,
    sp: &SoftmaxParams,
    io: &AttnViews,
    fk: FlashKernel,
) -> Result<Vec<Dispatch>, GpuError> {
    let AttnViews {
        q,
        k,
        v,
        mask,
        scores,
        partials,
        dst,
        sinks,
    } = *io;
    // Kernels bind a buffer where there are no sinks; they never read it.
    let unused = View::whole(gpu.placeholder());
    let sk = Sinks {
        view: sinks.unwrap_or(&unused),
        on: sinks.is_some(),
    };
    if s.head_dim == 0
        || !s.head_dim.is_multiple_of(4)
        || s.n_head_kv == 0
        || !s.n_head.is_multiple_of(s.n_head_kv)
    {
        return Err(GpuError::Validation(format!(
            "attention: head_dim {} must be a positive multiple of 4 and n_head {} a multiple of a nonzero n_head_kv {}",
            s.head_dim, s.n_head, s.n_head_kv
        )));
    }
    let tb = tokens_per_invocation(&gpu.tuning, s.n_tok);
    let q_row = s.head_dim as u64 * s.n_head as u64 * 4;
    let mask_row = s.n_kv as u64 * 4;
    // The flash kernel writes no scores: its passes only keep the mask and query rows
    // within a binding.
    let flash_on = s.flash(gpu);
    // Decided on the whole batch, whose partials the scratch was sized for.
    let tile_split = s.tiled(gpu).then(|| s.tile_split(gpu));
    let rows = s.flash_rows(gpu);
    let per_pass = if flash_on || rows.is_some() {
        s.tokens_fitting(gpu, mask_row.max(q_row))?
    } else {
        s.tokens_per_pass(gpu)?
    };
    let mut out = Vec::new();
    for t0 in (0..s.n_tok).step_by(per_pass as usize) {
        let n_tok = per_pass.min(s.n_tok - t0);
        let pass = AttnShape { n_tok, ..*s };
        let params = pass.uniform();
        let (t0, nt) = (t0 as u64, n_tok as u64);
        let q = sub_view(q, t0 * q_row, nt * q_row);
        let dst = sub_view(dst, t0 * q_row, nt * q_row);
        let mask = sub_view(mask, t0 * mask_row, nt * mask_row);
        if flash_on {
            let io = [&q, k, v, &mask];
            out.extend(flash(
                gpu,
                &pass,
                sp,
                s.split(gpu),
                fk,
                io,
                sk,
                partials,
                &dst,
            )?);
            continue;
        }
        if let Some(fr) = rows {
            let io = [&q, k, v, &mask];
            out.extend(flash_rows(gpu, &pass, sp, fr, io, sk, partials, &dst)?);
            continue;
        }
        let scores = sub_view(scores, 0, pass.n_head as u64 * nt * mask_row);
        if let Some(split) = tile_split {
            let io = [&q, k, v, &mask];
            out.extend(tiled(
                gpu, &pass, sp, split, io, sk, &scores, partials, &dst,
            )?);
            continue;
        }
        let (kq, cells) = score_kernel(gpu, s, tb);
        let kqv = gpu.pipeline(KernelKey::Attention(Kernel::Kqv { v: s.v_type, tb }))?;
        out.push(record(
            gpu,
            "attn_kq",
            gpu.pipeline(kq)?,
            bytemuck::bytes_of(&params),
            &[&q, k, &scores, &mask],
            [s.n_kv.div_ceil(cells), n_tok.div_ceil(tb), s.n_head],
        )?);
        if let Some(split) = s.split(gpu) {
            // The softmax is inside the split kernel.
            let io = [&scores, &mask, v];
            out.extend(kqv_split(gpu, &pass, sp, split, io, sk, partials, &dst)?);
            continue;
        }
        out.push(softmax_sinks(
            gpu,
            sp,
            Some(&mask),
            sk.given(),
            &scores,
            s.n_kv,
            n_tok,
        )?);
        out.push(record(
            gpu,
            "attn_kqv",
            kqv,
            bytemuck::bytes_of(&params),
            &[&scores, v, &dst],
            // Invocations over (vec4 of the head, group of tb tokens).
            [
                (s.head_dim / 4 * n_tok.div_ceil(tb)).div_ceil(64),
                1,
                s.n_head,
            ],
        )?);
    }
    // V was stored rotated (llama.cpp's attention rotation): rotate the output back.
    if let Some(chunks) = (s.n_tok * s.n_head * s.head_dim).checked_div(s.rot_v) {
        out.push(hadamard(gpu, io.dst, s.rot_v, chunks)?);
    }
    Ok(out)
}

/// The attention score kernel and the cells each of its workgroups covers: on GPUs
/// [`KQ_LANES`] invocations per cell (`attn_kq_lanes.wgsl`), whose loads take whole key
/// rows where one invocation per cell reads words a cache row apart; elsewhere, for heads
/// past 256 values, caches needing more than 65535 workgroups, or with
/// `WGLLM_ATTN_KQ_LANES=0`, one invocation per cell (`attn_kq.wgsl`).
fn score_kernel(gpu: &Gpu, s: &AttnShape, tb: u32) -> (KernelKey, u32) {
    let cells = 64 / KQ_LANES;
    let lanes = gpu.kernels == KernelShape::Gpu
        && gpu.tuning.attn_kq_lanes != Some(false)
        && s.n_kv.div_ceil(cells) <= 65535;
    match kq_lanes_nk(s.head_dim / 4).filter(|_| lanes) {
        Some(nk) => (
            KernelKey::Attention(Kernel::KqLanes {
                k: s.k_type,
                tb,
                nk,
            }),
            cells,
        ),
        None => (KernelKey::Attention(Kernel::Kq { k: s.k_type, tb }), 64),
    }
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
    attention_sinks_ref(s, sp, q, k, v, mask, None)
}

/// [`attention_ref`] with attention sinks (one logit per head).
pub fn attention_sinks_ref(
    s: &AttnShape,
    sp: &SoftmaxParams,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: &[f32],
    sinks: Option<&[f32]>,
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
    let probs = softmax_sinks_ref(sp, &scores, Some(mask), sinks, nkv, nt);
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
    hadamard_ref(&mut out, s.rot_v as usize);
    out
}

uniform_struct! {
    /// attn_kq and attn_kqv.
    AttnUniform {
        head_dim: u32,
        n_head: u32,
        n_head_kv: u32,
        n_tok: u32,
        n_kv: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

uniform_struct! {
    /// attn_kqv_split: the attention shape and the softmax's scale, mask and ALiBi.
    AttnSplitUniform {
        head_dim: u32,
        n_head: u32,
        n_head_kv: u32,
        n_tok: u32,
        n_kv: u32,
        /// Cells per chunk.
        chunk: u32,
        has_mask: u32,
        n_head_log2: u32,
        scale: f32,
        max_bias: f32,
        m0: f32,
        m1: f32,
        /// As [`SoftmaxUniform::softcap`].
        softcap: f32,
        /// As [`SoftmaxUniform::has_sinks`] (read by the flash kernels' whole-output store;
        /// split outputs take the sinks in the join).
        has_sinks: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

uniform_struct! {
    /// attn_kqv_sum: `n` vec4s (rows of `d4`) in each of `n_split` partial outputs.
    AttnSumUniform {
        n: u32,
        n_split: u32,
        d4: u32,
        n_head: u32,
        /// As [`SoftmaxUniform::has_sinks`] (attn_kqv_sum only).
        has_sinks: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

kernel_files! {
    /// The score kernels' bindings and query loads.
    ATTN_KQ_IO = "common/attn_kq_io.wgsl";
    ATTN_KQ = "kernels/attn_kq.wgsl";
    ATTN_KQ_LANES = "kernels/attn_kq_lanes.wgsl";
    ATTN_KQV = "kernels/attn_kqv.wgsl";
    ATTN_KQV_SPLIT = "kernels/attn_kqv_split.wgsl";
    ATTN_KQV_SUM = "kernels/attn_kqv_sum.wgsl";
    ATTN_KQ_TILE = "kernels/attn_kq_tile.wgsl";
    ATTN_KQV_TILE = "kernels/attn_kqv_tile.wgsl";
    ATTN_KQV_JOIN = "kernels/attn_kqv_join.wgsl";
    ATTN_FLASH_ROWS = "kernels/attn_flash_rows.wgsl";
}

/// The attention kernels, each over caches of the types it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Scores over a K cache of type `k`, `tb` tokens per invocation.
    Kq { k: KvType, tb: u32 },
    /// Scores on GPUs over a K cache of type `k`, `tb` tokens per invocation, [`KQ_LANES`]
    /// invocations per cell reading `nk` vec4s of its key each (see [`kq_lanes_nk`]).
    KqLanes { k: KvType, tb: u32, nk: u32 },
    /// One-pass output over a V cache of type `v`, `tb` tokens per invocation.
    Kqv { v: KvType, tb: u32 },
    /// Softmax and output split over chunks of cells (flash-decoding): `lanes`
    /// invocations across a value row, `nv` vec4s each (see [`split_shape`]).
    KqvSplit { v: KvType, lanes: u32, nv: u32 },
    /// The split kernel's partial outputs, rescaled to one maximum and normalised.
    KqvSum,
    /// Prompt scores as a tiled product: 64 cells x 64 tokens per workgroup, the head in
    /// slices of `dk` vec4s.
    KqTile { k: KvType, dk: u32 },
    /// Prompt output as a tiled product over the softmax's probabilities: `ni` vec4s of
    /// the head and 8 / `ni` tokens per invocation, one chunk of cells per workgroup z.
    KqvTile { v: KvType, ni: u32 },
    /// The tiled output kernel's chunks added up.
    KqvJoin,
    /// Prompt attention in one pass over tiles of cells with an online softmax
    /// (`attn_flash.wgsl`, heads up to [`MAX_FLASH_HEAD_DIM`]). With `split`, over one
    /// chunk of cells per workgroup z, into the split kernel's partials (joined by
    /// [`Kernel::KqvSum`]).
    Flash { k: KvType, v: KvType, split: bool },
    /// [`Kernel::Flash`] on f16 tiles (`attn_flash_coop.wgsl`, workgroups of 32), its two
    /// products on 16 x 16 cooperative matrices (`mma`, one 32-wide subgroup per
    /// workgroup) or as loops (the same kernel testable without the matrices).
    FlashCoop {
        k: KvType,
        v: KvType,
        split: bool,
        mma: bool,
    },
    /// Flash attention on CPU-shaped adapters (`attn_flash_rows.wgsl`): `tb` tokens of a
    /// head per invocation over one chunk of cells, heads up to 4 * `d4` values, into the
    /// split kernel's partials (joined by [`Kernel::KqvSum`]).
    CpuFlash {
        k: KvType,
        v: KvType,
        d4: u32,
        tb: u32,
    },
}

impl Family for Kernel {
    const FILES: &'static [(&'static str, &'static str)] = FILES;
    fn variants() -> Vec<Self> {
        use Kernel::*;
        let mut v = vec![KqvSum, KqvJoin];
        for ty in KvType::ALL {
            let (k, kv) = (ty, ty);
            for &tb in ATTN_TB {
                v.push(Kq { k, tb });
                v.push(Kqv { v: kv, tb });
                v.extend(KQ_LANES_NK.iter().map(|&nk| KqLanes { k, tb, nk }));
            }
            for (lanes, nv) in split_shapes() {
                v.push(KqvSplit { v: kv, lanes, nv });
            }
            v.extend(ATTN_TILE_DK.iter().map(|&dk| KqTile { k, dk }));
            v.extend(ATTN_TILE_NI.iter().map(|&ni| KqvTile { v: kv, ni }));
            // K and V types combine freely, as llama.cpp's -ctk and -ctv.
            for vt in KvType::ALL {
                for split in [false, true] {
                    v.push(Flash { k, v: vt, split });
                    for mma in [false, true] {
                        v.push(FlashCoop {
                            k,
                            v: vt,
                            split,
                            mma,
                        });
                    }
                }
                for &d4 in FLASH_ROWS_D4 {
                    for &tb in FLASH_ROWS_TB {
                        v.push(CpuFlash { k, v: vt, d4, tb });
                    }
                }
            }
        }
        v
    }
    fn body(&self) -> Result<String, String> {
        use Kernel::*;
        let kq = |kernel: &str| [ATTN_KQ_IO, kernel].concat();
        Ok(match *self {
            Kq { k, tb } => kv_reading(&kq(ATTN_KQ), Some(k), None, &[("TB", tb.to_string())]),
            KqLanes { k, tb, nk } => kv_reading(
                &kq(ATTN_KQ_LANES),
                Some(k),
                None,
                &[
                    ("TB", tb.to_string()),
                    ("NK", nk.to_string()),
                    ("LANES", KQ_LANES.to_string()),
                ],
            ),
            Kqv { v, tb } => kv_reading(ATTN_KQV, None, Some(v), &[("TB", tb.to_string())]),
            KqvSplit { v, lanes, nv } => kv_reading(
                &compose(&[SOFTMAX_COMMON, ATTN_KQV_SPLIT], &[]),
                None,
                Some(v),
                &[("LANES", lanes.to_string()), ("NV", nv.to_string())],
            ),
            KqvSum => ATTN_KQV_SUM.to_string(),
            KqTile { k, dk } => {
                kv_reading(&kq(ATTN_KQ_TILE), Some(k), None, &[("DK", dk.to_string())])
            }
            KqvTile { v, ni } => kv_reading(
                ATTN_KQV_TILE,
                None,
                Some(v),
                &[("NI", ni.to_string()), ("TM", (8 / ni).to_string())],
            ),
            KqvJoin => ATTN_KQV_JOIN.to_string(),
            Flash { k, v, split } => shaders::attn_flash_source(k, v, split),
            FlashCoop { k, v, split, mma } => shaders::attn_flash_coop_source(k, v, split, mma),
            CpuFlash { k, v, d4, tb } => kv_reading(
                &compose(&[SOFTMAX_COMMON, ATTN_FLASH_ROWS], &[]),
                Some(k),
                Some(v),
                &[("D4", d4.to_string()), ("TB", tb.to_string())],
            ),
        })
    }
    fn uniform_wgsl(&self) -> &'static str {
        use Kernel::*;
        match self {
            Kq { .. } | KqLanes { .. } | Kqv { .. } | KqTile { .. } => AttnUniform::WGSL,
            KqvSplit { .. }
            | Flash { .. }
            | FlashCoop { .. }
            | CpuFlash { .. }
            | KqvTile { .. } => AttnSplitUniform::WGSL,
            KqvSum | KqvJoin => AttnSumUniform::WGSL,
        }
    }
    fn workgroup_size(&self) -> u32 {
        match self {
            Kernel::KqTile { .. } | Kernel::KqvTile { .. } => 256,
            Kernel::FlashCoop { .. } => 32,
            _ => 64,
        }
    }
    fn features(&self) -> wgpu::Features {
        use Kernel::*;
        let f16 = |t: KvType| t == KvType::F16;
        let uses_f16 = match *self {
            Kq { k, .. } | KqLanes { k, .. } | KqTile { k, .. } => f16(k),
            Kqv { v, .. } | KqvSplit { v, .. } | KqvTile { v, .. } => f16(v),
            Flash { k, v, .. } | CpuFlash { k, v, .. } => f16(k) || f16(v),
            FlashCoop { mma: true, .. } => {
                return wgpu::Features::SHADER_F16 | wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
            }
            FlashCoop { mma: false, .. } => true,
            KqvSum | KqvJoin => false,
        };
        match uses_f16 {
            true => wgpu::Features::SHADER_F16,
            false => wgpu::Features::empty(),
        }
    }
    fn cpu_shaped(&self) -> bool {
        matches!(self, Kernel::CpuFlash { .. })
    }
    fn products(&self) -> Products {
        match self {
            Kernel::FlashCoop { mma: true, .. } => Products::Matrix,
            _ => Products::Plain,
        }
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use Kernel::*;
        let split = |s: bool| if s { "_split" } else { "" };
        match *self {
            Kq { k, tb } => write!(f, "attn_kq_{k}_tb{tb}"),
            KqLanes { k, tb, nk } => write!(f, "attn_kq_lanes_{k}_tb{tb}_nk{nk}"),
            Kqv { v, tb } => write!(f, "attn_kqv_{v}_tb{tb}"),
            KqvSplit { v, lanes, nv } => write!(f, "attn_kqv_split_{v}_{lanes}x{nv}"),
            KqvSum => write!(f, "attn_kqv_sum"),
            KqTile { k, dk } => write!(f, "attn_kq_tile_{k}_dk{dk}"),
            KqvTile { v, ni } => write!(f, "attn_kqv_tile_{v}_ni{ni}"),
            KqvJoin => write!(f, "attn_kqv_join"),
            Flash { k, v, split: s } => write!(f, "attn_flash_{k}_{v}{}", split(s)),
            FlashCoop {
                k,
                v,
                split: s,
                mma,
            } => write!(
                f,
                "attn_flash_coop_{k}_{v}{}{}",
                split(s),
                if mma { "" } else { "_loops" }
            ),
            CpuFlash { k, v, d4, tb } => write!(f, "attn_flash_rows_{k}_{v}_d{d4}_tb{tb}"),
        }
    }
}

/// The graph's `Op::Attention`: reads [q, k, v, mask(, sinks)], writes [scores, dst,
/// partials]
pub struct AttentionNode {
    pub shape: AttnShape,
    pub sp: SoftmaxParams,
}

impl GraphOp for AttentionNode {
    fn kind(&self) -> String {
        "attention".into()
    }

    fn cost(&self) -> OpCost {
        let Self { shape: s, .. } = self;
        let (hd, nh, nkv, nt) = (
            s.head_dim as u64,
            s.n_head as u64,
            s.n_kv as u64,
            s.n_tok as u64,
        );
        let row = s.n_head_kv as u64 * hd;
        let kv = nkv * (s.k_type.row_bytes(row) + s.v_type.row_bytes(row));
        let scores = nh * nt * nkv;
        // K and V once, Q in and the output out, the mask, and the scores written
        // by the first kernel, normalised in place and read by the last.
        let bytes =
            kv + 2 * nh * hd * nt * F32_BYTES + nkv * nt * F32_BYTES + 4 * scores * F32_BYTES;
        // QK^T and the weighted sum of V (2 flops per multiply-add each), plus a
        // few per score for the masked softmax.
        OpCost::new(bytes, 4 * nh * hd * nkv * nt + 5 * scores)
    }

    fn record(
        &self,
        gpu: &Gpu,
        r: &[View],
        w: &[View],
        dispatches: &mut Vec<Dispatch>,
    ) -> Result<(), GpuError> {
        let Self { shape, sp } = self;
        let io = AttnViews {
            q: &r[0],
            k: &r[1],
            v: &r[2],
            mask: &r[3],
            scores: &w[0],
            dst: &w[1],
            partials: &w[2],
            sinks: r.get(4),
        };
        dispatches.extend(attention(gpu, shape, sp, &io)?);
        Ok(())
    }
}
