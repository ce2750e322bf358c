//! Matmuls by integer dot products, as llama.cpp's `mul_mat_vecq` does on GPUs that have
//! them: the activations are quantized once to 8-bit blocks of 32 with their scale
//! ([`quantize_q8`]), and each weight block's 32 codes are multiplied with a block of x by
//! eight packed 4x8-bit dot products (WGSL `dot4I8Packed`) into one integer, scaled once.
//! A block of x is read as 40 bytes instead of 128, and 32 multiply-adds become eight.
//!
//! These kernels compute a different sum from the float path (x is rounded to 8 bits), so
//! their references do the same integer arithmetic ([`quantize_q8_ref`],
//! [`matmul_q8_ref`]); against the float reference they differ by the activations'
//! rounding alone.

use super::glu::{glu_pairs, Activation};
use super::kernels::{kernel_files, Family, Products};
use super::matmul::{gpu_tile_min, MatmulOut};
use super::node::{GraphOp, OpCost, F32_BYTES};
use super::shaders::compose;
use super::uniforms::uniform_struct;
use super::{record, split_groups, Dispatch, KernelKey, View, Weight};
use crate::gguf::GgmlType;
use crate::gpu::{Gpu, GpuError, KernelShape};
use crate::quant;
use std::sync::Arc;

/// Weight rows per workgroup of the integer-dot matmul (`matmul_q8.wgsl`).
pub const Q8_MATMUL_ROWS: &[u32] = &[1, 2, 4];
/// Tokens per workgroup of the integer-dot matmul.
pub const Q8_MATMUL_TOKENS: &[u32] = &[1, 2, 4, 8];
/// (weight rows, tokens) per workgroup of the tiled integer-dot prompt matmul
/// (`matmul_q8_tile.wgsl`).
pub const Q8_TILES: &[(u32, u32)] = &[(64, 64), (128, 64)];

/// Whether weights of `ty` have an integer-dot kernel: those whose format has an
/// integer-dot loader (`crate::quant::IntDot`).
pub fn supports(ty: GgmlType) -> bool {
    quant::int_dot(ty).is_some()
}

/// Whether the integer-dot kernel can multiply by `w`: a type it has, whole blocks.
pub fn takes(w: &Weight) -> bool {
    supports(w.ty) && w.n_cols.is_multiple_of(32)
}

/// Whether a matmul of `n_tok` tokens through `w` takes the integer-dot kernel on a device
/// with `tuning`: its choice for that size (`WGLLM_INT_DOT`, or the tuner's), and a weight
/// the kernel can multiply. The graph builder and the tuner's timed layer both ask here.
pub fn chosen(tuning: &crate::gpu::KernelTuning, w: &Weight, n_tok: u32) -> bool {
    tuning.int_dot_for_tokens(n_tok) && takes(w)
}

/// Words of one quantized block of x: 8 words of codes and the (d, d * sum) pair.
const BLOCK_WORDS: u64 = 10;

/// Bytes that `n_tok` rows of `k` values take quantized ([`quantize_q8`]'s output).
pub fn q8_bytes(k: u32, n_tok: u32) -> u64 {
    (k / 32) as u64 * n_tok as u64 * BLOCK_WORDS * 4
}

/// x ([k, n_tok] f32, k a multiple of 32) to 8-bit blocks in `xq` (at least
/// [`q8_bytes`]): every block's codes first, then every block's (d, d * sum(q)).
pub fn quantize_q8(
    gpu: &Gpu,
    x: &View,
    k: u32,
    n_tok: u32,
    xq: &View,
) -> Result<Dispatch, GpuError> {
    if !k.is_multiple_of(32) {
        return Err(GpuError::Validation(format!(
            "quantize_q8: row length {k} is not a multiple of 32"
        )));
    }
    let n_blocks = k / 32 * n_tok;
    if xq.size < q8_bytes(k, n_tok) {
        return Err(GpuError::Validation(format!(
            "quantize_q8: {} bytes for {n_blocks} blocks, which take {}",
            xq.size,
            q8_bytes(k, n_tok)
        )));
    }
    let (gx, gy) = split_groups(n_blocks.div_ceil(64));
    let params = QuantizeQ8Uniform {
        n_blocks,
        ds_off: n_blocks * 8,
        wg_x: gx,
        ..Default::default()
    };
    record(
        gpu,
        "quantize_q8",
        gpu.pipeline(KernelKey::MatmulQ8(Kernel::Quantize))?,
        bytemuck::bytes_of(&params),
        &[x, xq],
        [gx, gy, 1],
    )
}

/// The integer-dot variant for `n_tok` tokens through `n_rows` rows of `ty` on `gpu`. On
/// GPU-shaped kernels, prompts of at least the float path's tile threshold take the tiled
/// kernel (128 rows per workgroup where that still makes 256 workgroups, else 64: a GPU's
/// multiprocessors want several workgroups each). Otherwise the fewest tokens per workgroup
/// that cover them (at most 8), two rows per workgroup, reduced by subgroupAdd where the
/// adapter has subgroups that fit the workgroup of 64.
pub fn kernel(gpu: &Gpu, ty: GgmlType, n_rows: u32, n_tok: u32) -> KernelKey {
    if gpu.kernels == KernelShape::Gpu && n_tok >= gpu_tile_min(&gpu.tuning) {
        let tiles = |(bm, bn): (u32, u32)| n_rows.div_ceil(bm) * n_tok.div_ceil(bn);
        let (bm, bn) = if tiles(Q8_TILES[1]) >= 256 {
            Q8_TILES[1]
        } else {
            Q8_TILES[0]
        };
        return KernelKey::MatmulQ8(Kernel::Tile { ty, bm, bn });
    }
    let tb = Q8_MATMUL_TOKENS
        .iter()
        .copied()
        .find(|&t| t >= n_tok)
        .unwrap_or(*Q8_MATMUL_TOKENS.last().unwrap());
    let (min_sg, max_sg) = gpu.info.subgroup_size;
    KernelKey::MatmulQ8(Kernel::Vec {
        ty,
        rows: Q8_MATMUL_ROWS[1],
        tb,
        subgroups: gpu.has_subgroups && min_sg > 0 && max_sg <= 64,
    })
}

/// dst ([w.n_rows, n_tok] f32) = w · x, with x quantized by [`quantize_q8`] into `xq`.
/// One dispatch per chunk of w.
pub fn matmul_q8(
    gpu: &Gpu,
    w: &Weight,
    xq: &View,
    n_tok: u32,
    dst: &View,
) -> Result<Vec<Dispatch>, GpuError> {
    matmul_q8_at(gpu, w, xq, n_tok, dst, MatmulOut::whole(w))
}

/// [`matmul_q8`] into rows `out.row_offset..` of a dst whose rows are `out.stride` long.
pub fn matmul_q8_at(
    gpu: &Gpu,
    w: &Weight,
    xq: &View,
    n_tok: u32,
    dst: &View,
    out: MatmulOut,
) -> Result<Vec<Dispatch>, GpuError> {
    let key = kernel(gpu, w.ty, w.n_rows, n_tok);
    record_chunks(gpu, key, w, xq, n_tok, dst, out)
}

/// act(gate · x) * (up · x) for a weight of interleaved (gate, up) rows: the products
/// go to `pairs` ([w.n_rows, n_tok]), and a GLU dispatch writes dst ([w.n_rows / 2,
/// n_tok]).
pub fn matmul_q8_glu(
    gpu: &Gpu,
    w: &Weight,
    xq: &View,
    n_tok: u32,
    act: Activation,
    dst: &View,
    pairs: &View,
) -> Result<Vec<Dispatch>, GpuError> {
    let mut d = matmul_q8(gpu, w, xq, n_tok, pairs)?;
    d.push(glu_pairs(gpu, act, pairs, dst, w.n_rows / 2 * n_tok)?);
    Ok(d)
}

/// [`matmul_q8`] with the variant `key` (a [`Kernel::Vec`] or [`Kernel::Tile`] of w's
/// type).
pub fn matmul_q8_with(
    gpu: &Gpu,
    key: KernelKey,
    w: &Weight,
    xq: &View,
    n_tok: u32,
    dst: &View,
) -> Result<Vec<Dispatch>, GpuError> {
    record_chunks(gpu, key, w, xq, n_tok, dst, MatmulOut::whole(w))
}

/// One dispatch of `key` per chunk of w.
fn record_chunks(
    gpu: &Gpu,
    key: KernelKey,
    w: &Weight,
    xq: &View,
    n_tok: u32,
    dst: &View,
    out: MatmulOut,
) -> Result<Vec<Dispatch>, GpuError> {
    out.check("matmul_q8", w)?;
    let (ty, (rows, tb)) = match key {
        KernelKey::MatmulQ8(Kernel::Vec { ty, rows, tb, .. }) => (ty, (rows, tb)),
        KernelKey::MatmulQ8(Kernel::Tile { ty, bm, bn }) => (ty, (bm, bn)),
        _ => {
            return Err(GpuError::Validation(format!(
                "{key} is not an integer-dot matmul"
            )))
        }
    };
    if ty != w.ty || !supports(ty) {
        return Err(GpuError::Validation(format!(
            "matmul_q8 {}: weights of type {} through the {key} kernel (integer-dot kernels: {})",
            w.name,
            w.ty,
            quant::int_dot_types()
                .iter()
                .map(|t| t.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    w.check_blocks_of_32("matmul_q8")?;
    let pipeline = gpu.pipeline(key)?;
    let n_blocks = w.n_cols / 32 * n_tok;
    // A kernel broken on purpose (`WGLLM_FAULT=wrong-int-dot`): told each row is a block
    // shorter, it reads less than it should (so stays in bounds) and misplaces blocks.
    let k = if gpu.fault_wrong_int_dot() {
        w.n_cols - 32
    } else {
        w.n_cols
    };
    let tiled = matches!(key, KernelKey::MatmulQ8(Kernel::Tile { .. }));
    let (wrong_row, wrong_edge) = super::matmul::faults(gpu, key, tiled, tb, n_tok);
    w.chunks
        .iter()
        .map(|c| {
            let (gx, gy) = split_groups(c.n_rows.div_ceil(rows));
            let params = MatmulQ8Uniform {
                k,
                n_rows: c.n_rows - wrong_row,
                n_tok: n_tok - wrong_edge,
                row_words: w.row_words,
                out_row_offset: out.row_offset + c.row_begin,
                out_stride: out.stride,
                wg_x: gx,
                ds_off: n_blocks * 8,
            };
            record(
                gpu,
                "matmul_q8",
                pipeline.clone(),
                bytemuck::bytes_of(&params),
                &[&View::whole(&c.buf), xq, dst],
                [gx, gy, n_tok.div_ceil(tb)],
            )
        })
        .collect()
}

/// x in 8-bit blocks, as [`quantize_q8`] writes it: per block of 32 values, the codes, d
/// and d * sum(codes).
#[derive(Clone, Debug, PartialEq)]
pub struct Q8Blocks {
    pub codes: Vec<i8>,
    pub d: Vec<f32>,
    pub s: Vec<f32>,
}

impl Q8Blocks {
    /// Reads [`quantize_q8`]'s output words (`n_blocks` blocks).
    pub fn from_words(words: &[u32], n_blocks: usize) -> Q8Blocks {
        let codes = words[..n_blocks * 8]
            .iter()
            .flat_map(|w| w.to_le_bytes().map(|b| b as i8))
            .collect();
        let pairs = &words[n_blocks * 8..n_blocks * 10];
        Q8Blocks {
            codes,
            d: pairs
                .iter()
                .step_by(2)
                .map(|&w| f32::from_bits(w))
                .collect(),
            s: pairs
                .iter()
                .skip(1)
                .step_by(2)
                .map(|&w| f32::from_bits(w))
                .collect(),
        }
    }
}

/// CPU reference of [`quantize_q8`]: the same f32 operations (a scale d = max|x| / 127,
/// codes rounded half to even from x * (1 / d)).
pub fn quantize_q8_ref(x: &[f32]) -> Q8Blocks {
    let mut out = Q8Blocks {
        codes: Vec::with_capacity(x.len()),
        d: Vec::new(),
        s: Vec::new(),
    };
    for b in x.chunks(32) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for &v in b {
            let q = (v * id).round_ties_even() as i32;
            sum += q;
            out.codes.push(q as i8);
        }
        out.d.push(d);
        out.s.push(d * sum as f32);
    }
    out
}

/// CPU reference of [`matmul_q8`] on GGUF bytes `data` ([k, n] of `ty`, one
/// [`supports`]) and f32 x ([k, n_tok]): x quantized as [`quantize_q8_ref`] does, each
/// block's integer sum of products scaled in f32 as the kernel does, blocks added in f64.
pub fn matmul_q8_ref(
    ty: GgmlType,
    data: &[u8],
    k: usize,
    n: usize,
    x: &[f32],
    n_tok: usize,
) -> Vec<f32> {
    let xq = quantize_q8_ref(&x[..k * n_tok]);
    let nb = k / 32;
    let row_bytes = ty.row_bytes(k as u64).expect("whole blocks") as usize;
    let rows: Vec<Vec<quant::DotBlock>> = (0..n)
        .map(|r| quant::dot_blocks(ty, &data[r * row_bytes..(r + 1) * row_bytes]))
        .collect();
    let mut out = vec![0f32; n * n_tok];
    for t in 0..n_tok {
        for (r, blocks) in rows.iter().enumerate() {
            let mut acc = 0f64;
            for (b, (codes, (scale, offset))) in blocks.iter().enumerate() {
                let xb = t * nb + b;
                let sum: i32 = codes
                    .iter()
                    .zip(&xq.codes[xb * 32..xb * 32 + 32])
                    .map(|(&c, &q)| c * q as i32)
                    .sum();
                acc += (scale * xq.d[xb] * sum as f32 + offset * xq.s[xb]) as f64;
            }
            out[t * n + r] = acc as f32;
        }
    }
    out
}

uniform_struct! {
    /// quantize_q8_1: `n_blocks` blocks of 32 values to 8-bit blocks, whose (d, d * sum)
    /// pairs start at word `ds_off` of the output.
    QuantizeQ8Uniform {
        n_blocks: u32,
        ds_off: u32,
        /// Workgroups along x (blocks are split over x and y).
        wg_x: u32,
        _pad0: u32,
    }
}

uniform_struct! {
    /// matmul_q8: [`MatmulUniform`]'s fields, and where x's (d, d * sum) pairs start in
    /// its quantized blocks (in words).
    MatmulQ8Uniform {
        k: u32,
        n_rows: u32,
        n_tok: u32,
        row_words: u32,
        out_row_offset: u32,
        out_stride: u32,
        wg_x: u32,
        ds_off: u32,
    }
}

kernel_files! {
    QUANTIZE_Q8_1 = "kernels/quantize_q8_1.wgsl";
    /// What every weight type's `load_w` (`crate::quant::IntDot::wgsl`) may call.
    DOT_COMMON = "weights/dot_common.wgsl";
    MATMUL_Q8 = "kernels/matmul_q8.wgsl";
    MATMUL_Q8_TILE = "kernels/matmul_q8_tile.wgsl";
}

/// The integer-dot path's kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Activations to 8-bit blocks of 32 with their scales (`quantize_q8_1.wgsl`).
    Quantize,
    /// The integer-dot matmul (`matmul_q8.wgsl`): `rows` weight rows and `tb` tokens per
    /// workgroup of 64, over x quantized by [`Kernel::Quantize`]; its partial sums
    /// reduced with subgroupAdd when `subgroups`, else by a workgroup-memory tree.
    Vec {
        ty: GgmlType,
        rows: u32,
        tb: u32,
        subgroups: bool,
    },
    /// The tiled integer-dot prompt matmul (`matmul_q8_tile.wgsl`): `bm` weight rows x
    /// `bn` tokens per workgroup of 256, blocks staged in workgroup memory.
    Tile { ty: GgmlType, bm: u32, bn: u32 },
}

/// The integer-dot matmul's `SG_ARGS` slot: the subgroup builtins its reduction reads.
fn q8_reduce_args(subgroups: bool) -> (&'static str, String) {
    let args = if subgroups {
        // naga 30 enables subgroup builtins with the device feature, not `enable`.
        "@builtin(subgroup_invocation_id) sg_lane: u32, @builtin(subgroup_size) sg_size: u32,"
    } else {
        ""
    };
    ("SG_ARGS", args.to_string())
}

/// The integer-dot matmul's `REDUCE` slot: every (row, token) partial sum of the 64
/// invocations added into `red[i * 64]`, i = row * TB + token. Without subgroups a
/// workgroup-memory tree (six barriers); with them each subgroup's subgroupAdd, its sum
/// in `red[i * 64 + subgroup]`, then one invocation per value adds the 64 / sg_size sums
/// (one barrier; subgroups of at most 64, numbered by `lid / sg_size` as the GPU-shaped
/// float matmul assumes too).
fn q8_reduce(subgroups: bool) -> (&'static str, String) {
    let reduce = if subgroups {
        "\
    let nsg = 64u / sg_size;
    for (var i = 0u; i < ROWS * TB; i++) {
        let s = subgroupAdd(acc[i]);
        if (sg_lane == 0u) { red[i * 64u + lid / sg_size] = s; }
    }
    workgroupBarrier();
    if (lid < ROWS * TB) {
        var s = 0.0;
        for (var g = 0u; g < nsg; g++) { s += red[lid * 64u + g]; }
        red[lid * 64u] = s;
    }"
    } else {
        "\
    for (var i = 0u; i < ROWS * TB; i++) {
        red[i * 64u + lid] = acc[i];
    }
    workgroupBarrier();
    for (var half = 32u; half > 0u; half >>= 1u) {
        if (lid < half) {
            for (var i = 0u; i < ROWS * TB; i++) {
                red[i * 64u + lid] += red[i * 64u + lid + half];
            }
        }
        workgroupBarrier();
    }"
    };
    ("REDUCE", reduce.to_string())
}

/// A type's block loader (`load_w`), after the helpers the loaders share.
fn loader(ty: GgmlType) -> Result<String, String> {
    let dot = quant::int_dot(ty).ok_or_else(|| format!("no integer-dot kernel for {ty}"))?;
    Ok(format!("{DOT_COMMON}\n{}", dot.wgsl))
}

impl Family for Kernel {
    const FILES: &'static [(&'static str, &'static str)] = FILES;
    fn variants() -> Vec<Self> {
        let mut v = vec![Kernel::Quantize];
        for ty in quant::int_dot_types() {
            for &rows in Q8_MATMUL_ROWS {
                for subgroups in [false, true] {
                    v.extend(Q8_MATMUL_TOKENS.iter().map(|&tb| Kernel::Vec {
                        ty,
                        rows,
                        tb,
                        subgroups,
                    }));
                }
            }
            v.extend(Q8_TILES.iter().map(|&(bm, bn)| Kernel::Tile { ty, bm, bn }));
        }
        v
    }
    fn body(&self) -> Result<String, String> {
        Ok(match *self {
            Kernel::Quantize => QUANTIZE_Q8_1.to_string(),
            Kernel::Vec {
                ty,
                rows,
                tb,
                subgroups,
            } => compose(
                &[MATMUL_Q8, &loader(ty)?],
                &[
                    ("TB", tb.to_string()),
                    ("ROWS", rows.to_string()),
                    q8_reduce_args(subgroups),
                    q8_reduce(subgroups),
                ],
            ),
            Kernel::Tile { ty, bm, bn } => compose(
                &[MATMUL_Q8_TILE, &loader(ty)?],
                &[("BM", bm.to_string()), ("BN", bn.to_string())],
            ),
        })
    }
    fn uniform_wgsl(&self) -> &'static str {
        match self {
            Kernel::Quantize => QuantizeQ8Uniform::WGSL,
            _ => MatmulQ8Uniform::WGSL,
        }
    }
    fn workgroup_size(&self) -> u32 {
        match self {
            Kernel::Tile { .. } => 256,
            _ => 64,
        }
    }
    fn features(&self) -> wgpu::Features {
        match self {
            Kernel::Vec {
                subgroups: true, ..
            } => wgpu::Features::SUBGROUP,
            _ => wgpu::Features::empty(),
        }
    }
    fn matmul_block(&self) -> Option<(u32, u32)> {
        match *self {
            Kernel::Vec { rows, tb, .. } => Some((rows, tb)),
            Kernel::Tile { bm, bn, .. } => Some((bm, bn)),
            Kernel::Quantize => None,
        }
    }
    fn products(&self) -> Products {
        match self {
            Kernel::Quantize => Products::Plain,
            _ => Products::IntegerDot,
        }
    }
    /// `matmul_q8.wgsl` fills `red` for every (row, token) and invocation, or each
    /// subgroup's slot it then reads; `matmul_q8_tile.wgsl` every slot of a step's BK
    /// weight and x blocks, one block per loading invocation, before each step's first
    /// barrier.
    fn writes_workgroup_memory_first(&self) -> bool {
        !matches!(self, Kernel::Quantize)
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Kernel::Quantize => write!(f, "quantize_q8_1"),
            Kernel::Vec {
                ty,
                rows,
                tb,
                subgroups,
            } => write!(
                f,
                "matmul_q8_{ty}_r{rows}_t{tb}{}",
                if subgroups { "_sg" } else { "" }
            ),
            Kernel::Tile { ty, bm, bn } => write!(f, "matmul_q8_tile_{ty}_{bm}x{bn}"),
        }
    }
}

/// The graph's `Op::QuantizeQ8`: reads [x], writes [xq]: x ([k, n_tok] f32) as the 8-bit
/// blocks the integer-dot matmuls read (`ops::matmul_q8`)
pub struct QuantizeQ8Node {
    pub k: u32,
    pub n_tok: u32,
}

impl GraphOp for QuantizeQ8Node {
    fn kind(&self) -> String {
        "quantize_q8".into()
    }

    fn cost(&self) -> OpCost {
        let Self { k, n_tok } = self;
        let n = *k as u64 * *n_tok as u64;
        OpCost::new(n * F32_BYTES + q8_bytes(*k, *n_tok), 3 * n)
    }

    fn record(
        &self,
        gpu: &Gpu,
        r: &[View],
        w: &[View],
        dispatches: &mut Vec<Dispatch>,
    ) -> Result<(), GpuError> {
        let Self { k, n_tok } = self;
        dispatches.push(quantize_q8(gpu, &r[0], *k, *n_tok, &w[0])?);
        Ok(())
    }
}

/// The graph's `Op::MatmulQ8`: reads [xq], writes [dst]: [`Op::Matmul`] by integer dot
/// products
pub struct MatmulQ8Node {
    pub w: Arc<Weight>,
    pub n_tok: u32,
    pub out: MatmulOut,
}

impl GraphOp for MatmulQ8Node {
    fn kind(&self) -> String {
        let Self { w, .. } = self;
        format!("matmul_q8 {}", w.ty).to_lowercase()
    }

    fn cost(&self) -> OpCost {
        let Self { w, n_tok, .. } = self;
        OpCost::matmul(w, *n_tok, q8_bytes(w.n_cols, *n_tok), w.n_rows as u64, 0)
    }

    fn record(
        &self,
        gpu: &Gpu,
        r: &[View],
        w: &[View],
        dispatches: &mut Vec<Dispatch>,
    ) -> Result<(), GpuError> {
        let Self { w: m, n_tok, out } = self;
        dispatches.extend(matmul_q8_at(gpu, m, &r[0], *n_tok, &w[0], *out)?);
        Ok(())
    }
}

/// The graph's `Op::MatmulQ8Glu`: reads [xq], writes [dst, pairs]: [`Op::MatmulGlu`] by
/// integer dot products (the products to `pairs`, then the GLU)
pub struct MatmulQ8GluNode {
    pub w: Arc<Weight>,
    pub n_tok: u32,
    pub act: Activation,
}

impl GraphOp for MatmulQ8GluNode {
    fn kind(&self) -> String {
        let Self { w, .. } = self;
        format!("matmul_q8_glu {}", w.ty).to_lowercase()
    }

    fn cost(&self) -> OpCost {
        // The products to the pairs, read again by the GLU, which writes half.
        let Self { w, n_tok, .. } = self;
        let (rows, half) = (w.n_rows as u64, w.n_rows as u64 / 2);
        OpCost::matmul(
            w,
            *n_tok,
            q8_bytes(w.n_cols, *n_tok),
            2 * rows + half,
            5 * half,
        )
    }

    fn record(
        &self,
        gpu: &Gpu,
        r: &[View],
        w: &[View],
        dispatches: &mut Vec<Dispatch>,
    ) -> Result<(), GpuError> {
        let Self { w: m, n_tok, act } = self;
        dispatches.extend(matmul_q8_glu(gpu, m, &r[0], *n_tok, *act, &w[0], &w[1])?);
        Ok(())
    }
}
