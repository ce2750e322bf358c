//! matmul: dst[t][r] = dot(W[r], x[t]) with W read in its quantized block layout.

use super::glu::{glu_pairs, Activation};
use super::kernels::{Family, Products};
use super::node::{GraphOp, OpCost, F32_BYTES};
use super::shaders::{self, quant_source, weight_types, Tokens};
use super::uniforms::uniform_struct;
use super::{record, split_groups, Dispatch, KernelKey, KernelTuning, View, Weight};
use crate::gguf::GgmlType;
use crate::gpu::{Gpu, GpuError, KernelShape};
use crate::quant;
use std::sync::Arc;

/// (rows, tokens) per invocation: matrix-vector for one token, small tiles for batches;
/// `unrolled`: the kernels' loops are written out (`Gpu::unroll`, SwiftShader).
/// `tuning.matmul_tile` (`WGLLM_MATMUL_TILE=RxT`) overrides it, for benchmarking kernel shapes.
pub fn tile(tuning: &KernelTuning, n_tok: u32, unrolled: bool) -> (u32, u32) {
    if let Some(rt) = tuning.matmul_tile {
        return rt;
    }
    // The defaults where nothing was tuned, measured with SmolLM2 (wgllm bench). lavapipe:
    // decode 2x1 beat 1x1/4x1/8x1 on an Intel host and was within 10 % of the best on an
    // AMD EPYC (Zen 3) host; prompts 2x4 won on the Intel host, but on the EPYC host 4x8
    // ran pp64 at 5.6 t/s against 3.6 (8x8 5.3, 4x16 5.5, 2x8 4.0): bigger register tiles
    // keep more loaded weights reused. SwiftShader, unrolled (the browser page runs no
    // tuner, so these are its tiles): tg24 2x1 3.35, 4x1 3.82 and 3.66, 8x1 3.41; pp64
    // 4x8 8.6, 8x8 10.6, 4x16 8.5. Hosts differ: `crate::tune` measures them.
    let (decode, prompt) = if unrolled {
        ((4, 1), (8, 8))
    } else {
        ((2, 1), (4, 8))
    };
    if n_tok == 1 {
        tuning.cpu_decode_tile.unwrap_or(decode)
    } else if n_tok < 8 {
        (2, 4)
    } else {
        tuning.cpu_prompt_tile.unwrap_or(prompt)
    }
}

/// Fewest tokens for which GPU-shaped kernels use the tiled matmul (`tuning.tile_min`,
/// `WGLLM_TILE_MIN`, overrides the default 8); fewer go to the matrix-vector kernel.
pub fn gpu_tile_min(tuning: &KernelTuning) -> u32 {
    tuning.tile_min.unwrap_or(8).max(1)
}

/// Weight rows per workgroup of 256 in the GPU matrix-vector kernel: 4 by default (one
/// segment, 4 rows per invocation; on an H100, tg128 with 4, 8, 16 and 32 rows: 7B 181,
/// 184, 184 and 164 t/s, the 135M shape 438, 438, 415 and 412); `tuning.gpu_vec_rows`
/// (`WGLLM_GPU_VEC`, or the tuner) picks a power of two from 1 to 32.
pub fn gpu_vec_rows(tuning: &KernelTuning) -> u32 {
    tuning.gpu_vec_rows.unwrap_or(4)
}

/// (weight rows, tokens) per workgroup of the tiled prompt matmul for `n_rows` rows and
/// `n_tok` tokens: the largest tile the adapter's workgroup memory holds (128x128 takes
/// 32 KiB, 128x64 24 KiB, 64x64 16 KiB) while the matrix still makes enough of them
/// (128 of 128x128, 256 of 128x64). A bigger tile reuses each staged value over more rows
/// or tokens but makes fewer workgroups. On an H100, 7B pp512 (every matrix 256+ tiles of
/// 128x64) ran 1811 t/s against 1544 with 64x64, while the 135M shape's matrices (at most
/// 192 tiles) ran 35.0k against 31.2k with 64x64. On an H200, 128x128 everywhere ran 7B
/// pp512 at 1970 t/s against 1873 with 128x64 (its smallest matrices make 128 such tiles;
/// 128x128 only from 256 tiles ran 1919), and the 135M shape at 25.3k against 37.3k.
/// `tuning.gpu_tile` (`WGLLM_GPU_TILE=64x64|128x64|128x128`) overrides it where it fits.
pub fn gpu_tile(gpu: &Gpu, n_rows: u32, n_tok: u32) -> (u32, u32) {
    let room = gpu.info.max_workgroup_storage;
    let fits = |(bm, bn): (u32, u32)| room >= 8 * 16 * (bm + bn);
    if let Some(t) = gpu.tuning.gpu_tile.filter(|&t| fits(t)) {
        return t;
    }
    let tiles = |(bm, bn): (u32, u32)| n_rows.div_ceil(bm) * n_tok.div_ceil(bn);
    // Where no timing says otherwise, what AMD's compiler makes of the tiles: on its
    // compute chips (CDNA) 128x128 takes 240 registers a lane and leaves one wave per
    // SIMD, no latency hidden (docs/kernel-stats/gfx940.txt); 128x64 keeps two.
    let one_wave = |t: (u32, u32)| t == (128, 128) && gpu.info.is_amd_cdna();
    [((128, 128), 128), ((128, 64), 256)]
        .into_iter()
        .find(|&(t, enough)| fits(t) && tiles(t) >= enough && !one_wave(t))
        .map_or((64, 64), |(t, _)| t)
}

/// The matmul variant for `n_tok` tokens through a `ty` matrix of `n_rows` rows on `gpu`.
/// With `glu`, the variant with the fused GLU epilogue where the shape has one (rows per
/// invocation or workgroup rounded up to even); the tiled prompt matmul has none (its
/// invocations own rows 16 apart), so its key comes back without.
pub fn kernel(
    gpu: &Gpu,
    ty: GgmlType,
    n_rows: u32,
    n_tok: u32,
    glu: Option<Activation>,
) -> KernelKey {
    // Activations without an epilogue variant (gpt-oss's) take the products, then the GLU.
    let glu = glu.filter(|a| a.fusable());
    let even = |rows: u32| if glu.is_some() { rows.max(2) } else { rows };
    if gpu.kernels != KernelShape::Gpu {
        let (rows, tb) = tile(&gpu.tuning, n_tok, gpu.unroll);
        let rows = even(rows);
        // Subgroups share x's loads (eight lanes load one vec4 of a block each) for
        // batches: Gemma-3 pp128 on lavapipe 145 t/s against 91 without. Not for one
        // token per invocation (single-sequence decode), where the same kernel ran
        // 10-20 % slower (tg16 10.7 against 12.2-13.3 t/s), the more so the more rows an
        // invocation owns: llvmpipe's code for it is opaque to us, so measurement decides.
        let subgroups = tb > 1 && gpu.has_subgroups && gpu.info.subgroup_size.0 >= 8;
        return KernelKey::Matmul(Kernel::CpuRows {
            ty,
            rows,
            tb,
            subgroups,
            glu,
        });
    }
    if n_tok >= gpu_tile_min(&gpu.tuning) {
        // Cooperative matrices where chosen and the device has the ones the kernel needs.
        if let Some(s) = gpu
            .coop_size
            .filter(|_| gpu.tuning.coop_matrix == Some(true))
        {
            return KernelKey::Matmul(Kernel::GpuCoop { ty, s });
        }
        let (bm, bn) = gpu_tile(gpu, n_rows, n_tok);
        return KernelKey::Matmul(Kernel::GpuTile { ty, bm, bn });
    }
    let tb = if n_tok == 1 { 1 } else { 4 };
    let rows = even(gpu_vec_rows(&gpu.tuning));
    // subgroupAdd reduces within a segment only where the widest subgroup fits in its
    // invocations, and the narrowest holds a lane per row of an invocation.
    let rpt = super::shaders::gpu_vec_rows_per_invocation(rows);
    let (min_sg, max_sg) = gpu.info.subgroup_size;
    let subgroups = gpu.has_subgroups && max_sg > 0 && max_sg <= 256 * rpt / rows && min_sg >= rpt;
    KernelKey::Matmul(Kernel::GpuVec {
        ty,
        tb,
        rows,
        subgroups,
        glu,
    })
}

/// Where a matmul's rows go in dst: `row_offset` rows into rows of `stride` elements (a
/// projection writing its part of a wider tensor, as Q, K and V side by side).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MatmulOut {
    pub row_offset: u32,
    pub stride: u32,
}

impl MatmulOut {
    /// The whole of dst: rows of w.n_rows.
    pub fn whole(w: &Weight) -> MatmulOut {
        MatmulOut {
            row_offset: 0,
            stride: w.n_rows,
        }
    }

    /// Refuses a placement where w's rows do not fit in dst's rows (`op` names the
    /// kernel in the message).
    pub fn check(&self, op: &str, w: &Weight) -> Result<(), GpuError> {
        if self.row_offset + w.n_rows > self.stride {
            return Err(GpuError::Validation(format!(
                "{op} {}: {} rows at row {} do not fit rows of {}",
                w.name, w.n_rows, self.row_offset, self.stride
            )));
        }
        Ok(())
    }
}

/// [`matmul`] through a given kernel variant rather than the device's choice for the
/// shape: the kernel audit checks a large weight's kernel on its first rows.
pub fn matmul_with(
    gpu: &Gpu,
    key: KernelKey,
    w: &Weight,
    x: &View,
    n_tok: u32,
    dst: &View,
) -> Result<Vec<Dispatch>, GpuError> {
    record_chunks(gpu, w, x, n_tok, dst, key, MatmulOut::whole(w))
}

/// x is [w.n_cols, n_tok] f32, dst is [w.n_rows, n_tok] f32. One dispatch per chunk.
pub fn matmul(
    gpu: &Gpu,
    w: &Weight,
    x: &View,
    n_tok: u32,
    dst: &View,
) -> Result<Vec<Dispatch>, GpuError> {
    matmul_at(gpu, w, x, n_tok, dst, MatmulOut::whole(w))
}

/// [`matmul`] into rows `out.row_offset..` of a dst whose rows are `out.stride` long.
pub fn matmul_at(
    gpu: &Gpu,
    w: &Weight,
    x: &View,
    n_tok: u32,
    dst: &View,
    out: MatmulOut,
) -> Result<Vec<Dispatch>, GpuError> {
    out.check("matmul", w)?;
    let key = kernel(gpu, w.ty, w.n_rows, n_tok, None);
    record_chunks(gpu, w, x, n_tok, dst, key, out)
}

/// act(gate · x) * (up · x) for a weight whose rows are interleaved (gate, up) pairs
/// (`Weight::upload_interleaved`): dst is [w.n_rows / 2, n_tok]. Decode and small
/// batches run one matmul with the GLU in its epilogue; the tiled prompt matmul writes
/// the pairs to `pairs` ([w.n_rows, n_tok]) and a GLU dispatch reads them.
pub fn matmul_glu(
    gpu: &Gpu,
    w: &Weight,
    x: &View,
    n_tok: u32,
    act: Activation,
    dst: &View,
    pairs: &View,
) -> Result<Vec<Dispatch>, GpuError> {
    if !w.n_rows.is_multiple_of(2) || w.chunks.iter().any(|c| c.row_begin % 2 != 0) {
        return Err(GpuError::Validation(format!(
            "matmul {}: a fused gate/up weight needs whole (gate, up) row pairs in each chunk",
            w.name
        )));
    }
    let key = kernel(gpu, w.ty, w.n_rows, n_tok, Some(act));
    let half = MatmulOut {
        row_offset: 0,
        stride: w.n_rows / 2,
    };
    let fused = matches!(
        key,
        KernelKey::Matmul(
            Kernel::CpuRows { glu: Some(_), .. } | Kernel::GpuVec { glu: Some(_), .. }
        )
    );
    if fused {
        return record_chunks(gpu, w, x, n_tok, dst, key, half);
    }
    let mut d = record_chunks(gpu, w, x, n_tok, pairs, key, MatmulOut::whole(w))?;
    d.push(glu_pairs(gpu, act, pairs, dst, half.stride * n_tok)?);
    Ok(d)
}

/// The rows and tokens a kernel broken on purpose leaves unwritten (`WGLLM_FAULT`:
/// `wrong-row` in every fast kernel, `wrong-tile-edge` in the tiled ones where the
/// tokens end in a partial tile of `tb`, for a `tiled` key); the portable kernels stay
/// correct, as the reference they are.
pub(crate) fn faults(gpu: &Gpu, key: KernelKey, tiled: bool, tb: u32, n_tok: u32) -> (u32, u32) {
    let fast = !key.cpu_shaped();
    let row = (gpu.fault_wrong_row() && fast) as u32;
    let edge = if gpu.fault_wrong_tile_edge() && tiled && n_tok > tb && !n_tok.is_multiple_of(tb) {
        n_tok % tb
    } else {
        0
    };
    (row, edge)
}

/// One dispatch of `key` per chunk of w.
fn record_chunks(
    gpu: &Gpu,
    w: &Weight,
    x: &View,
    n_tok: u32,
    dst: &View,
    key: KernelKey,
    out: MatmulOut,
) -> Result<Vec<Dispatch>, GpuError> {
    w.check_blocks_of_32("matmul")?;
    let pipeline = gpu.pipeline(key)?;
    let heads = quant::format(w.ty).is_some_and(|f| f.gpu_head_words() > 0);
    let (rows_per_group, tb) = key
        .matmul_block()
        .ok_or_else(|| GpuError::Validation(format!("{key} is not a matmul kernel")))?;
    let tiled = matches!(
        key,
        KernelKey::Matmul(Kernel::GpuTile { .. } | Kernel::GpuCoop { .. })
    );
    let (wrong_row, wrong_edge) = faults(gpu, key, tiled, tb, n_tok);
    w.chunks
        .iter()
        .map(|c| {
            let (gx, gy) = split_groups(c.n_rows.div_ceil(rows_per_group));
            let params = MatmulUniform {
                k: w.n_cols,
                n_rows: c.n_rows - wrong_row,
                n_tok: n_tok - wrong_edge,
                row_words: w.row_words,
                out_row_offset: out.row_offset + c.row_begin,
                out_stride: out.stride,
                wg_x: gx,
                ..Default::default()
            };
            let wv = View::whole(&c.buf);
            // The CPU-shaped kernel reads block heads through a second binding (4) of the
            // weights, which only types with heads have.
            let views: &[&View] = match key {
                KernelKey::Matmul(Kernel::CpuRows { .. }) if heads => &[&wv, x, dst, &wv],
                _ => &[&wv, x, dst],
            };
            record(
                gpu,
                "matmul",
                pipeline.clone(),
                bytemuck::bytes_of(&params),
                views,
                [gx, gy, n_tok.div_ceil(tb)],
            )
        })
        .collect()
}

/// CPU reference: dequantize each row, then f64-accumulated dot products.
pub fn matmul_ref(
    ty: GgmlType,
    data: &[u8],
    n_cols: usize,
    n_rows: usize,
    x: &[f32],
    n_tok: usize,
) -> Vec<f32> {
    let row_bytes = ty.row_bytes(n_cols as u64).unwrap() as usize;
    let mut row = vec![0.0f32; n_cols];
    let mut out = vec![0.0; n_rows * n_tok];
    for r in 0..n_rows {
        quant::dequantize_row(ty, &data[r * row_bytes..(r + 1) * row_bytes], &mut row);
        for t in 0..n_tok {
            let xs = &x[t * n_cols..(t + 1) * n_cols];
            let s: f64 = row.iter().zip(xs).map(|(&a, &b)| a as f64 * b as f64).sum();
            out[t * n_rows + r] = s as f32;
        }
    }
    out
}

uniform_struct! {
    /// The three matmul kernels (matmul, matmul_wg, matmul_tile).
    MatmulUniform {
        /// Row length (a multiple of the block size).
        k: u32,
        /// Rows in this chunk.
        n_rows: u32,
        n_tok: u32,
        row_words: u32,
        /// First row of this chunk in dst (in weight rows, even with the GLU epilogue).
        out_row_offset: u32,
        /// dst row length (all rows of the matrix, or of the tensor the rows go into;
        /// half the weight's rows with the GLU epilogue).
        out_stride: u32,
        /// Workgroups along x (rows are split over x and y).
        wg_x: u32,
        _pad0: u32,
    }
}

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

/// No epilogue, or the fused GLU with each activation.
pub fn glu_epilogues() -> impl Iterator<Item = Option<Activation>> {
    std::iter::once(None).chain(Activation::FUSED.iter().map(|&a| Some(a)))
}

/// The dense matmul kernels of one weight type (their sources are templates shared with
/// the experts' products, in `shaders`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// CPU-shaped: `rows` rows and `tb` tokens per invocation; with `glu`, the fused
    /// epilogue over interleaved (gate, up) rows (`rows` even).
    CpuRows {
        ty: GgmlType,
        rows: u32,
        tb: u32,
        subgroups: bool,
        glu: Option<Activation>,
    },
    /// The GPU matrix-vector matmul: `rows` rows per workgroup of 256, `tb` tokens,
    /// reduced with subgroupAdd when `subgroups`; with `glu`, the fused epilogue over
    /// interleaved (gate, up) rows (`rows` even).
    GpuVec {
        ty: GgmlType,
        tb: u32,
        rows: u32,
        subgroups: bool,
        glu: Option<Activation>,
    },
    /// The GPU tiled prompt matmul: `bm` weight rows x `bn` tokens per workgroup.
    GpuTile { ty: GgmlType, bm: u32, bn: u32 },
    /// The prompt matmul on cooperative matrices (`matmul_coop.wgsl`): `s` x `s` f16
    /// matrices, 2s weight rows x 2s tokens per workgroup of one 32-wide subgroup.
    GpuCoop { ty: GgmlType, s: u32 },
}

impl Family for Kernel {
    const FILES: &'static [(&'static str, &'static str)] = &[];
    fn variants() -> Vec<Self> {
        use Kernel::*;
        let mut v = Vec::new();
        for ty in weight_types() {
            for glu in glu_epilogues() {
                // The fused epilogue pairs rows within an invocation (a workgroup).
                let rows_ok = |rows: u32| glu.is_none() || rows.is_multiple_of(2);
                for &rows in CPU_MATMUL_ROWS.iter().filter(|&&r| rows_ok(r)) {
                    for &tb in CPU_MATMUL_TOKENS {
                        // x's loads are shared over a subgroup for batches only.
                        for subgroups in [false, true].into_iter().filter(|&s| !s || tb > 1) {
                            v.push(CpuRows {
                                ty,
                                rows,
                                tb,
                                subgroups,
                                glu,
                            });
                        }
                    }
                }
                for &tb in GPU_VEC_TOKENS {
                    for &rows in GPU_VEC_ROWS.iter().filter(|&&r| rows_ok(r)) {
                        for subgroups in [false, true] {
                            v.push(GpuVec {
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
            v.extend(GPU_TILES.iter().map(|&(bm, bn)| GpuTile { ty, bm, bn }));
            v.extend(COOP_SIZES.iter().map(|&s| GpuCoop { ty, s }));
        }
        v
    }
    fn body(&self) -> Result<String, String> {
        Ok(match *self {
            Kernel::CpuRows {
                ty,
                rows,
                tb,
                subgroups,
                glu,
            } => shaders::matmul_source(
                &quant_source(ty)?,
                rows,
                tb,
                glu.map(Activation::wgsl),
                subgroups,
                Tokens::Dense,
            ),
            Kernel::GpuVec {
                ty,
                tb,
                rows,
                subgroups,
                glu,
            } => shaders::matmul_wg_source(
                &quant_source(ty)?,
                tb,
                rows,
                subgroups,
                glu.map(Activation::wgsl),
            ),
            Kernel::GpuTile { ty, bm, bn } => {
                shaders::matmul_tile_source(&quant_source(ty)?, bm, bn, Tokens::Dense)
            }
            Kernel::GpuCoop { ty, s } => shaders::matmul_coop_source(&quant_source(ty)?, s),
        })
    }
    fn uniform_wgsl(&self) -> &'static str {
        MatmulUniform::WGSL
    }
    fn workgroup_size(&self) -> u32 {
        match self {
            Kernel::CpuRows { .. } => 64,
            Kernel::GpuVec { .. } | Kernel::GpuTile { .. } => 256,
            Kernel::GpuCoop { .. } => 32,
        }
    }
    fn features(&self) -> wgpu::Features {
        match *self {
            Kernel::CpuRows { subgroups, .. } | Kernel::GpuVec { subgroups, .. } if subgroups => {
                wgpu::Features::SUBGROUP
            }
            Kernel::GpuCoop { .. } => {
                wgpu::Features::SHADER_F16 | wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
            }
            _ => wgpu::Features::empty(),
        }
    }
    fn cpu_shaped(&self) -> bool {
        matches!(self, Kernel::CpuRows { .. })
    }
    fn matmul_block(&self) -> Option<(u32, u32)> {
        Some(match *self {
            Kernel::CpuRows { rows, tb, .. } => (64 * rows, tb),
            Kernel::GpuVec { rows, tb, .. } => (rows, tb),
            Kernel::GpuTile { bm, bn, .. } => (bm, bn),
            Kernel::GpuCoop { s, .. } => (2 * s, 2 * s),
        })
    }
    fn products(&self) -> Products {
        match self {
            Kernel::GpuCoop { .. } => Products::Matrix,
            _ => Products::Plain,
        }
    }
    /// `matmul_wg.wgsl` fills `red` and every row of `res` before its first barrier;
    /// `matmul_tile.wgsl` all 8 x BM weight and 8 x BN activation slots of each K block.
    fn writes_workgroup_memory_first(&self) -> bool {
        matches!(self, Kernel::GpuVec { .. } | Kernel::GpuTile { .. })
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sg = |s: bool| if s { "_sg" } else { "" };
        let glu =
            |g: Option<Activation>| g.map(|a| format!("_glu_{}", a.wgsl())).unwrap_or_default();
        match *self {
            Kernel::CpuRows {
                ty,
                rows,
                tb,
                subgroups,
                glu: g,
            } => write!(f, "matmul_{ty}_{rows}x{tb}{}{}", sg(subgroups), glu(g)),
            Kernel::GpuVec {
                ty,
                tb,
                rows,
                subgroups,
                glu: g,
            } => write!(
                f,
                "matmul_wg_{ty}_tb{tb}_rows{rows}{}{}",
                sg(subgroups),
                glu(g)
            ),
            Kernel::GpuTile { ty, bm, bn } => write!(f, "matmul_tile_{ty}_{bm}x{bn}"),
            Kernel::GpuCoop { ty, s } => write!(f, "matmul_coop_{ty}_{s}"),
        }
    }
}

/// The graph's `Op::Matmul`: reads [x], writes [dst]: w's rows go to rows
/// `out.row_offset..` of dst
pub struct MatmulNode {
    pub w: Arc<Weight>,
    pub n_tok: u32,
    pub out: MatmulOut,
}

impl GraphOp for MatmulNode {
    fn kind(&self) -> String {
        let Self { w, .. } = self;
        format!("matmul {}", w.ty).to_lowercase()
    }

    fn cost(&self) -> OpCost {
        let Self { w, n_tok, .. } = self;
        let x_bytes = w.n_cols as u64 * *n_tok as u64 * F32_BYTES;
        OpCost::matmul(w, *n_tok, x_bytes, w.n_rows as u64, 0)
    }

    fn record(
        &self,
        gpu: &Gpu,
        r: &[View],
        w: &[View],
        dispatches: &mut Vec<Dispatch>,
    ) -> Result<(), GpuError> {
        let Self { w: m, n_tok, out } = self;
        dispatches.extend(matmul_at(gpu, m, &r[0], *n_tok, &w[0], *out)?);
        Ok(())
    }
}

/// The graph's `Op::MatmulGlu`: reads [x], writes [dst, pairs]: act(gate · x) * (up · x)
/// for interleaved (gate, up) rows; `pairs` holds the matmul's output where the GLU is not
/// in its epilogue
pub struct MatmulGluNode {
    pub w: Arc<Weight>,
    pub n_tok: u32,
    pub act: Activation,
}

impl GraphOp for MatmulGluNode {
    fn kind(&self) -> String {
        let Self { w, .. } = self;
        format!("matmul_glu {}", w.ty).to_lowercase()
    }

    fn cost(&self) -> OpCost {
        // The matmul, writing half the rows, plus the activation per output.
        let Self { w, n_tok, .. } = self;
        let (x_bytes, half) = (
            w.n_cols as u64 * *n_tok as u64 * F32_BYTES,
            w.n_rows as u64 / 2,
        );
        OpCost::matmul(w, *n_tok, x_bytes, half, 5 * half)
    }

    fn record(
        &self,
        gpu: &Gpu,
        r: &[View],
        w: &[View],
        dispatches: &mut Vec<Dispatch>,
    ) -> Result<(), GpuError> {
        let Self { w: m, n_tok, act } = self;
        dispatches.extend(matmul_glu(gpu, m, &r[0], *n_tok, *act, &w[0], &w[1])?);
        Ok(())
    }
}
