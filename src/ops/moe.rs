//! Mixture-of-experts feed-forwards, as llama.cpp's `build_moe_ffn` computes them: the
//! router's logits turned into each token's chosen experts and their weights
//! ([`moe_route`]), the chosen experts' products only ([`matmul_id`], ggml's `mul_mat_id`,
//! over a weight that stacks every expert's matrix), and each token's weighted sum of its
//! experts' outputs ([`moe_sum`]). For decode the expert products read each (token,
//! expert) pair's rows straight from the stacked tensor (a token's few experts are all
//! there is to read); for prompts the pairs are first grouped by expert on the GPU
//! ([`moe_group`]) and multiplied by the dense prompt kernels run over runs of one expert's
//! pairs (`shaders::Tokens::Grouped`), so an expert's rows are read once per tile of the
//! tokens that chose it, with the dense kernels' tiling and tuning.

use super::kernels::{kernel_files, Family};
use super::matmul::{CPU_MATMUL_ROWS, CPU_MATMUL_TOKENS, GPU_TILES};
use super::node::{GraphOp, OpCost, F32_BYTES};
use super::shaders::{self, compose, quant_source, weight_types, Tokens, QUANT_READ};
use super::uniforms::uniform_struct;
use super::{matmul, record, split_groups, Dispatch, KernelKey, View, Weight, MAX_GROUPS};
use crate::gguf::GgmlType;
use crate::gpu::{Gpu, GpuError};
use crate::quant;
use std::sync::Arc;

/// Most experts a token may use (the routing kernel's arrays).
pub const MAX_USED: u32 = 16;
/// Most experts a layer may have (the grouping kernel's workgroup arrays).
pub const MAX_EXPERTS: u32 = 512;
/// Fewest tokens whose expert products go through the grouping: below, each pair's rows
/// are read on their own (decode, small batches).
pub const GROUPED_MIN_TOKENS: u32 = 8;

/// How the expert products find their pairs: by each pair's expert id, or grouped by
/// expert ([`moe_group`]'s offsets and order).
#[derive(Clone, Copy)]
pub enum Pairs<'a> {
    Ids(&'a View),
    Grouped { offsets: &'a View, order: &'a View },
}

/// How the router's logits become probabilities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    /// softmax over all experts (Mixtral, Qwen MoE).
    Softmax,
    /// each logit's sigmoid.
    Sigmoid,
    /// the experts chosen on the logits, then softmax over the chosen ones (gpt-oss).
    SoftmaxWeight,
}

impl Gating {
    fn code(self) -> u32 {
        match self {
            Gating::Softmax => 0,
            Gating::Sigmoid => 1,
            Gating::SoftmaxWeight => 2,
        }
    }
}

/// A layer's routing: `n_used` of `n_expert` experts per token, the gating, whether the
/// chosen weights are renormalised to sum 1, and a scale (0 or 1: none).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeRouting {
    pub n_expert: u32,
    pub n_used: u32,
    pub gating: Gating,
    pub norm: bool,
    pub scale: f32,
}

impl MoeRouting {
    fn check(&self) -> Result<(), GpuError> {
        if self.n_used == 0 || self.n_used > self.n_expert || self.n_used > MAX_USED {
            return Err(GpuError::Validation(format!(
                "moe: {} experts used of {} (1 to {MAX_USED}, at most the experts there are)",
                self.n_used, self.n_expert
            )));
        }
        Ok(())
    }
}

/// Routes `n_tok` tokens: logits ([n_expert, n_tok] f32) to ids ([n_used, n_tok] u32) and
/// weights ([n_used, n_tok] f32).
pub fn moe_route(
    gpu: &Gpu,
    r: &MoeRouting,
    logits: &View,
    n_tok: u32,
    ids: &View,
    weights: &View,
) -> Result<Dispatch, GpuError> {
    r.check()?;
    let (gx, gy) = split_groups(n_tok.div_ceil(64));
    let params = MoeRouteUniform {
        n_tok,
        n_expert: r.n_expert,
        n_used: r.n_used,
        gating: r.gating.code(),
        norm: r.norm as u32,
        scale: r.scale,
        wg_x: gx,
        ..Default::default()
    };
    record(
        gpu,
        "moe_route",
        gpu.pipeline(KernelKey::Moe(Kernel::Route))?,
        bytemuck::bytes_of(&params),
        &[logits, ids, weights],
        [gx, gy, 1],
    )
}

/// CPU reference of [`moe_route`]: (ids, weights), the same f32 operations.
pub fn moe_route_ref(r: &MoeRouting, logits: &[f32], n_tok: usize) -> (Vec<u32>, Vec<f32>) {
    let (ne, nu) = (r.n_expert as usize, r.n_used as usize);
    let (mut ids, mut weights) = (Vec::new(), Vec::new());
    for l in logits.chunks(ne).take(n_tok) {
        let mx = l.iter().copied().fold(l[0], f32::max);
        let inv_sum = 1.0 / l.iter().map(|&v| (v - mx).exp()).sum::<f32>();
        let prob = |v: f32| match r.gating {
            Gating::Softmax => (v - mx).exp() * inv_sum,
            Gating::Sigmoid => 1.0 / (1.0 + (-v).exp()),
            Gating::SoftmaxWeight => v,
        };
        let mut chosen: Vec<usize> = Vec::with_capacity(nu);
        let mut w: Vec<f32> = Vec::with_capacity(nu);
        for _ in 0..nu {
            let (best, p) = (0..ne)
                .filter(|e| !chosen.contains(e))
                .map(|e| (e, prob(l[e])))
                .fold(None, |b: Option<(usize, f32)>, (e, p)| match b {
                    Some((_, bp)) if p <= bp => b,
                    _ => Some((e, p)),
                })
                .expect("an expert left");
            chosen.push(best);
            w.push(p);
        }
        if r.gating == Gating::SoftmaxWeight {
            let top = w[0];
            let mut sum = 0.0;
            for v in &mut w {
                *v = (*v - top).exp();
                sum += *v;
            }
            let inv = 1.0 / sum;
            w.iter_mut().for_each(|v| *v *= inv);
        }
        if r.norm {
            // 2^-14, the smallest normal f16, as llama.cpp clamps it.
            let sum = w.iter().sum::<f32>().max(1.0 / 16384.0);
            w.iter_mut().for_each(|v| *v /= sum);
        }
        if r.scale != 0.0 && r.scale != 1.0 {
            w.iter_mut().for_each(|v| *v *= r.scale);
        }
        ids.extend(chosen.iter().map(|&e| e as u32));
        weights.extend(w);
    }
    (ids, weights)
}

/// Groups the `n_pairs` pairs of `ids` by expert: `offsets` ([n_expert + 1] u32) and
/// `order` ([n_pairs] u32, the pairs of expert e at offsets[e]..offsets[e + 1]).
pub fn moe_group(
    gpu: &Gpu,
    ids: &View,
    n_pairs: u32,
    n_expert: u32,
    offsets: &View,
    order: &View,
) -> Result<Dispatch, GpuError> {
    if n_expert > MAX_EXPERTS {
        return Err(GpuError::Validation(format!(
            "moe_group: {n_expert} experts (at most {MAX_EXPERTS})"
        )));
    }
    let params = MoeGroupUniform {
        n_pairs,
        n_expert,
        ..Default::default()
    };
    record(
        gpu,
        "moe_group",
        gpu.pipeline(KernelKey::Moe(Kernel::Group))?,
        bytemuck::bytes_of(&params),
        &[ids, offsets, order],
        [1, 1, 1],
    )
}

/// The chosen experts' products: for each pair p = t * n_used + j, dst row p
/// ([w_rows, n_tok * n_used] f32) = expert ids[p]'s matrix · x's row p (`x_per_pair`) or
/// t. `w` stacks `n_expert` experts of `w.n_rows / n_expert` rows (uploaded with
/// [`Weight::upload_experts`], so each chunk holds whole experts): one dispatch per chunk,
/// each pair's rows on their own ([`Pairs::Ids`]) or a tile of an expert's pairs at a
/// time ([`Pairs::Grouped`], [`grouped_kernel`]).
#[allow(clippy::too_many_arguments)]
pub fn matmul_id(
    gpu: &Gpu,
    w: &Weight,
    n_expert: u32,
    x: &View,
    x_per_pair: bool,
    pairs: Pairs,
    n_used: u32,
    n_tok: u32,
    dst: &View,
) -> Result<Vec<Dispatch>, GpuError> {
    if n_expert == 0 || !w.n_rows.is_multiple_of(n_expert) {
        return Err(GpuError::Validation(format!(
            "matmul_id {}: {} rows are not {n_expert} experts' worth",
            w.name, w.n_rows
        )));
    }
    let rows = w.n_rows / n_expert;
    let n_pairs = n_tok * n_used;
    if n_pairs > MAX_GROUPS {
        return Err(GpuError::Validation(format!(
            "matmul_id {}: {n_pairs} (token, expert) pairs exceed one dispatch ({MAX_GROUPS}); use a smaller ubatch (-ub)",
            w.name
        )));
    }
    if rows.div_ceil(4) > MAX_GROUPS {
        return Err(GpuError::Validation(format!(
            "matmul_id {}: experts of {rows} rows exceed one dispatch",
            w.name
        )));
    }
    let grouped = matches!(pairs, Pairs::Grouped { .. });
    let key = kernel(gpu, w.ty, rows, n_expert, n_used, n_tok, grouped);
    let pipeline = gpu.pipeline(key)?;
    let (gx, gy) = split_groups(rows.div_ceil(4));
    // The grouped kernels' workgroups: x along an expert's rows, y over the chunk's
    // experts, z along an expert's run of pairs (at most n_tok: a token chooses an
    // expert once); tiles past the end of a run leave at once.
    let (block_rows, block_pairs) = key.matmul_block().unwrap_or((1, 1));
    let heads = quant::format(w.ty).is_some_and(|f| f.gpu_head_words() > 0);
    // `WGLLM_FAULT=wrong-row`: the fast grouped kernels leave each chunk's last expert
    // unwritten (their row count is also the experts' stride, so no row can go alone).
    let (wrong_expert, _) = matmul::faults(gpu, key, false, 1, n_tok);
    w.chunks
        .iter()
        .map(|c| {
            if !c.row_begin.is_multiple_of(rows) || !c.n_rows.is_multiple_of(rows) {
                return Err(GpuError::Validation(format!(
                    "matmul_id {}: a chunk of rows {}..{} splits an expert of {rows} rows",
                    w.name,
                    c.row_begin,
                    c.row_begin + c.n_rows
                )));
            }
            let (e_begin, e_end) = (c.row_begin / rows, (c.row_begin + c.n_rows) / rows);
            let params = MatmulIdUniform {
                k: w.n_cols,
                n_rows: rows,
                row_words: w.row_words,
                n_used,
                e_begin,
                e_end,
                x_per_pair: x_per_pair as u32,
                wg_x: gx,
            };
            let params = bytemuck::bytes_of(&params);
            let wv = View::whole(&c.buf);
            match pairs {
                Pairs::Ids(ids) => record(
                    gpu,
                    "matmul_id",
                    pipeline.clone(),
                    params,
                    &[&wv, x, ids, dst],
                    [gx, gy, n_pairs],
                ),
                Pairs::Grouped { offsets, order } => {
                    // The CPU-shaped kernel reads block heads through a last binding of
                    // the weights, which only types with heads have.
                    let views: &[&View] = match key {
                        KernelKey::Moe(Kernel::CpuRows { .. }) if heads => {
                            &[&wv, x, dst, offsets, order, &wv]
                        }
                        _ => &[&wv, x, dst, offsets, order],
                    };
                    record(
                        gpu,
                        "matmul_id_grouped",
                        pipeline.clone(),
                        params,
                        views,
                        [
                            rows.div_ceil(block_rows),
                            e_end - e_begin - wrong_expert,
                            n_tok.div_ceil(block_pairs),
                        ],
                    )
                }
            }
        })
        .collect()
}

/// Whether a ubatch of `n_tok` tokens groups its (token, expert) pairs by expert
/// ([`moe_group`]) before the expert products: from [`GROUPED_MIN_TOKENS`] on.
pub fn grouped(n_tok: u32) -> bool {
    n_tok >= GROUPED_MIN_TOKENS
}

/// The kernel [`matmul_id`] takes for experts of `rows` rows of `ty`, `n_used` of
/// `n_expert` per token, over `n_tok` tokens' pairs, `grouped` or each pair on its own.
pub fn kernel(
    gpu: &Gpu,
    ty: GgmlType,
    rows: u32,
    n_expert: u32,
    n_used: u32,
    n_tok: u32,
    grouped: bool,
) -> KernelKey {
    match grouped {
        true => grouped_kernel(gpu, ty, rows, (n_tok * n_used).div_ceil(n_expert)),
        false => KernelKey::Moe(Kernel::Pairs { ty }),
    }
}

/// The grouped expert products' kernel for experts of `rows` rows of `ty` with about
/// `pairs` pairs each: the tile the dense prompt matmul takes for that many tokens (as
/// tuned), in the tiled shape on GPU-shaped adapters.
pub fn grouped_kernel(gpu: &Gpu, ty: GgmlType, rows: u32, pairs: u32) -> KernelKey {
    if gpu.kernels == crate::gpu::KernelShape::Gpu {
        let (bm, bn) = matmul::gpu_tile(gpu, rows, pairs);
        return KernelKey::Moe(Kernel::GpuTile { ty, bm, bn });
    }
    let (rows_per, tb) = matmul::tile(&gpu.tuning, pairs.max(2), gpu.unroll);
    KernelKey::Moe(Kernel::CpuRows {
        ty,
        rows: rows_per,
        tb,
        subgroups: gpu.has_subgroups && gpu.info.subgroup_size.0 >= 8,
    })
}

/// CPU reference of [`matmul_id`] on GGUF bytes `data` (`n_expert` experts of
/// [k, rows] `ty`, stacked) and f32 x: each pair's row through its expert, as the plain
/// matmul reference computes a row.
#[allow(clippy::too_many_arguments)]
pub fn matmul_id_ref(
    ty: GgmlType,
    data: &[u8],
    k: usize,
    rows: usize,
    x: &[f32],
    x_per_pair: bool,
    ids: &[u32],
    n_used: usize,
) -> Vec<f32> {
    let expert_bytes = ty.row_bytes(k as u64).expect("whole blocks") as usize * rows;
    let mut out = Vec::with_capacity(ids.len() * rows);
    for (pair, &e) in ids.iter().enumerate() {
        let xrow = if x_per_pair { pair } else { pair / n_used };
        let w = &data[e as usize * expert_bytes..(e as usize + 1) * expert_bytes];
        out.extend(super::matmul::matmul_ref(
            ty,
            w,
            k,
            rows,
            &x[xrow * k..(xrow + 1) * k],
            1,
        ));
    }
    out
}

/// dst ([n_out, n_tok]) = each token's sum over its experts j of weights[t][j] times y's
/// row t * n_used + j ([n_out, n_tok * n_used]).
pub fn moe_sum(
    gpu: &Gpu,
    y: &View,
    weights: &View,
    n_out: u32,
    n_used: u32,
    n_tok: u32,
    dst: &View,
) -> Result<Dispatch, GpuError> {
    let n = n_out * n_tok;
    let (gx, gy) = split_groups(n.div_ceil(64));
    let params = MoeSumUniform {
        n,
        n_out,
        n_used,
        wg_x: gx,
    };
    record(
        gpu,
        "moe_sum",
        gpu.pipeline(KernelKey::Moe(Kernel::Sum))?,
        bytemuck::bytes_of(&params),
        &[y, weights, dst],
        [gx, gy, 1],
    )
}

/// CPU reference of [`moe_sum`] (the same order of additions).
pub fn moe_sum_ref(y: &[f32], weights: &[f32], n_out: usize, n_used: usize) -> Vec<f32> {
    weights
        .chunks(n_used)
        .enumerate()
        .flat_map(|(t, w)| {
            (0..n_out).map(move |i| {
                let row = |j: usize| y[(t * n_used + j) * n_out + i];
                (1..n_used).fold(row(0) * w[0], |acc, j| acc + row(j) * w[j])
            })
        })
        .collect()
}

/// Each (token, expert) pair's output `a` ([rows, n_pairs]) plus its expert's row of
/// `bias` ([rows, n_expert]), the experts named by `ids` ([n_pairs]): gpt-oss's expert
/// biases (llama.cpp's add_id).
pub fn moe_add_id(
    gpu: &Gpu,
    a: &View,
    bias: &View,
    ids: &View,
    rows: u32,
    n_pairs: u32,
    dst: &View,
) -> Result<Dispatch, GpuError> {
    let n = rows * n_pairs;
    let (gx, gy) = split_groups(n.div_ceil(64));
    let params = MoeAddIdUniform {
        n,
        rows,
        wg_x: gx,
        ..Default::default()
    };
    record(
        gpu,
        "moe_add_id",
        gpu.pipeline(KernelKey::Moe(Kernel::AddId))?,
        bytemuck::bytes_of(&params),
        &[a, bias, ids, dst],
        [gx, gy, 1],
    )
}

/// CPU reference of [`moe_add_id`].
pub fn moe_add_id_ref(a: &[f32], bias: &[f32], ids: &[u32], rows: usize) -> Vec<f32> {
    a.iter()
        .enumerate()
        .map(|(g, &v)| v + bias[ids[g / rows] as usize * rows + g % rows])
        .collect()
}

uniform_struct! {
    /// moe_route: `n_tok` tokens' router logits over `n_expert` experts to `n_used` chosen
    /// ones and their weights; `gating` 0 softmax, 1 sigmoid, 2 softmax over the chosen
    /// logits; `norm` renormalises the weights, `scale` multiplies them (0 or 1: not).
    MoeRouteUniform {
        n_tok: u32,
        n_expert: u32,
        n_used: u32,
        gating: u32,
        norm: u32,
        scale: f32,
        wg_x: u32,
        _pad0: u32,
    }
}

uniform_struct! {
    /// matmul_id: experts of `n_rows` rows of `k` values (`row_words` words each), the
    /// dispatch's chunk holding experts `e_begin..e_end`; `n_used` experts per token, x
    /// rows per pair (`x_per_pair`) or per token.
    MatmulIdUniform {
        k: u32,
        n_rows: u32,
        row_words: u32,
        n_used: u32,
        e_begin: u32,
        e_end: u32,
        x_per_pair: u32,
        wg_x: u32,
    }
}

uniform_struct! {
    /// moe_group: `n_pairs` (token, expert) pairs over `n_expert` experts.
    MoeGroupUniform {
        n_pairs: u32,
        n_expert: u32,
        _pad0: u32,
        _pad1: u32,
    }
}

uniform_struct! {
    /// moe_add_id: `n` values, pairs of `rows`, each plus its expert's bias row.
    MoeAddIdUniform {
        n: u32,
        rows: u32,
        wg_x: u32,
        _pad0: u32,
    }
}

uniform_struct! {
    /// moe_sum: `n` = tokens x `n_out` outputs, each a weighted sum over `n_used` experts.
    MoeSumUniform {
        n: u32,
        n_out: u32,
        n_used: u32,
        wg_x: u32,
    }
}

kernel_files! {
    MOE_ROUTE = "kernels/moe_route.wgsl";
    MATMUL_ID = "kernels/matmul_id.wgsl";
    MOE_GROUP = "kernels/moe_group.wgsl";
    MOE_SUM = "kernels/moe_sum.wgsl";
    MOE_ADD_ID = "kernels/moe_add_id.wgsl";
}

/// A mixture-of-experts layer's kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Expert routing (`moe_route.wgsl`).
    Route,
    /// The chosen experts' products over stacked `ty` experts, a pair at a time
    /// (`matmul_id.wgsl`).
    Pairs { ty: GgmlType },
    /// The weighted sum of each token's experts' outputs (`moe_sum.wgsl`).
    Sum,
    /// A bias per expert added to each pair's output (gpt-oss).
    AddId,
    /// A ubatch's (token, expert) pairs grouped by expert (`moe_group.wgsl`).
    Group,
    /// The experts' products for prompts, over pairs grouped by expert, in the CPU-shaped
    /// matmul's shape (`matmul.wgsl` over [`Tokens::Grouped`]): `rows` rows and `tb`
    /// pairs of one expert per invocation.
    CpuRows {
        ty: GgmlType,
        rows: u32,
        tb: u32,
        subgroups: bool,
    },
    /// The same in the tiled prompt matmul's shape (`matmul_tile.wgsl` over
    /// [`Tokens::Grouped`]): `bm` rows x `bn` pairs of one expert per workgroup.
    GpuTile { ty: GgmlType, bm: u32, bn: u32 },
}

impl Family for Kernel {
    const FILES: &'static [(&'static str, &'static str)] = FILES;
    fn variants() -> Vec<Self> {
        use Kernel::*;
        let mut v = vec![Route, Sum, AddId, Group];
        for ty in weight_types() {
            v.push(Pairs { ty });
            // The CPU-shaped matmul's batch tiles, with and without subgroups.
            for &rows in CPU_MATMUL_ROWS {
                for &tb in CPU_MATMUL_TOKENS.iter().filter(|&&tb| tb > 1) {
                    for subgroups in [false, true] {
                        v.push(CpuRows {
                            ty,
                            rows,
                            tb,
                            subgroups,
                        });
                    }
                }
            }
            v.extend(GPU_TILES.iter().map(|&(bm, bn)| GpuTile { ty, bm, bn }));
        }
        v
    }
    fn body(&self) -> Result<String, String> {
        Ok(match *self {
            Kernel::Route => MOE_ROUTE.to_string(),
            Kernel::Pairs { ty } => compose(&[&quant_source(ty)?, QUANT_READ, MATMUL_ID], &[]),
            Kernel::Sum => MOE_SUM.to_string(),
            Kernel::AddId => MOE_ADD_ID.to_string(),
            Kernel::Group => MOE_GROUP.to_string(),
            Kernel::CpuRows {
                ty,
                rows,
                tb,
                subgroups,
            } => shaders::matmul_source(
                &quant_source(ty)?,
                rows,
                tb,
                None,
                subgroups,
                Tokens::Grouped,
            ),
            Kernel::GpuTile { ty, bm, bn } => {
                shaders::matmul_tile_source(&quant_source(ty)?, bm, bn, Tokens::Grouped)
            }
        })
    }
    fn uniform_wgsl(&self) -> &'static str {
        match self {
            Kernel::Route => MoeRouteUniform::WGSL,
            Kernel::Pairs { .. } | Kernel::CpuRows { .. } | Kernel::GpuTile { .. } => {
                MatmulIdUniform::WGSL
            }
            Kernel::Sum => MoeSumUniform::WGSL,
            Kernel::AddId => MoeAddIdUniform::WGSL,
            Kernel::Group => MoeGroupUniform::WGSL,
        }
    }
    fn workgroup_size(&self) -> u32 {
        match self {
            Kernel::Group | Kernel::GpuTile { .. } => 256,
            _ => 64,
        }
    }
    fn features(&self) -> wgpu::Features {
        match self {
            Kernel::CpuRows {
                subgroups: true, ..
            } => wgpu::Features::SUBGROUP,
            _ => wgpu::Features::empty(),
        }
    }
    fn cpu_shaped(&self) -> bool {
        matches!(self, Kernel::CpuRows { .. })
    }
    fn matmul_block(&self) -> Option<(u32, u32)> {
        match *self {
            Kernel::CpuRows { rows, tb, .. } => Some((64 * rows, tb)),
            Kernel::GpuTile { bm, bn, .. } => Some((bm, bn)),
            _ => None,
        }
    }
    /// The tiled shape fills its slots as `matmul_tile.wgsl` does for dense products.
    fn writes_workgroup_memory_first(&self) -> bool {
        matches!(self, Kernel::GpuTile { .. })
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Kernel::Route => write!(f, "moe_route"),
            Kernel::Pairs { ty } => write!(f, "matmul_id_{ty}"),
            Kernel::Sum => write!(f, "moe_sum"),
            Kernel::AddId => write!(f, "moe_add_id"),
            Kernel::Group => write!(f, "moe_group"),
            Kernel::CpuRows {
                ty,
                rows,
                tb,
                subgroups,
            } => write!(
                f,
                "matmul_id_rows_{ty}_{rows}x{tb}{}",
                if subgroups { "_sg" } else { "" }
            ),
            Kernel::GpuTile { ty, bm, bn } => write!(f, "matmul_id_tile_{ty}_{bm}x{bn}"),
        }
    }
}

/// The graph's `Op::MoeRoute`: reads [logits], writes [ids, weights]: each token's experts
/// and their weights
pub struct MoeRouteNode {
    pub routing: MoeRouting,
    pub n_tok: u32,
}

impl GraphOp for MoeRouteNode {
    fn kind(&self) -> String {
        "moe_route".into()
    }

    fn cost(&self) -> OpCost {
        let Self { routing: r, n_tok } = self;
        let (e, u, t) = (r.n_expert as u64, r.n_used as u64, *n_tok as u64);
        OpCost::new((e + 2 * u) * t * F32_BYTES, (4 + u) * e * t)
    }

    fn record(
        &self,
        gpu: &Gpu,
        r: &[View],
        w: &[View],
        dispatches: &mut Vec<Dispatch>,
    ) -> Result<(), GpuError> {
        let Self { routing, n_tok } = self;
        dispatches.push(moe_route(gpu, routing, &r[0], *n_tok, &w[0], &w[1])?);
        Ok(())
    }
}

/// The graph's `Op::MatmulId`: reads [x, ids] (or, `grouped`, [x, offsets, order]), writes
/// [dst]: the chosen experts' products, x per (token, expert) pair or per token
pub struct MatmulIdNode {
    pub w: Arc<Weight>,
    pub n_expert: u32,
    pub n_used: u32,
    pub n_tok: u32,
    pub x_per_pair: bool,
    pub grouped: bool,
}

impl GraphOp for MatmulIdNode {
    fn kind(&self) -> String {
        let Self { w, .. } = self;
        format!("matmul_id {}", w.ty).to_lowercase()
    }

    fn cost(&self) -> OpCost {
        // The chosen experts' rows once per pair, or grouped once per expert chosen
        // (at most all of them), x per pair.
        let Self {
            w,
            n_expert,
            n_used,
            n_tok,
            x_per_pair,
            grouped,
        } = self;
        let pairs = *n_used as u64 * *n_tok as u64;
        let ne = *n_expert.max(&1) as u64;
        let (cols, rows) = (w.n_cols as u64, w.n_rows as u64 / ne);
        let x_rows = if *x_per_pair { pairs } else { *n_tok as u64 };
        let reads = if *grouped { pairs.min(ne) } else { pairs };
        OpCost::new(
            reads * (w.gpu_bytes() / ne) + pairs * rows * F32_BYTES + x_rows * cols * F32_BYTES,
            2 * pairs * rows * cols,
        )
    }

    fn record(
        &self,
        gpu: &Gpu,
        r: &[View],
        w: &[View],
        dispatches: &mut Vec<Dispatch>,
    ) -> Result<(), GpuError> {
        let Self {
            w: m,
            n_expert,
            n_used,
            n_tok,
            x_per_pair,
            grouped,
        } = self;
        let pairs = match grouped {
            true => Pairs::Grouped {
                offsets: &r[1],
                order: &r[2],
            },
            false => Pairs::Ids(&r[1]),
        };
        dispatches.extend(matmul_id(
            gpu,
            m,
            *n_expert,
            &r[0],
            *x_per_pair,
            pairs,
            *n_used,
            *n_tok,
            &w[0],
        )?);
        Ok(())
    }
}

/// The graph's `Op::MoeGroup`: reads [ids], writes [offsets, order]: the pairs grouped by
/// expert
pub struct MoeGroupNode {
    pub n_pairs: u32,
    pub n_expert: u32,
}

impl GraphOp for MoeGroupNode {
    fn kind(&self) -> String {
        "moe_group".into()
    }

    fn cost(&self) -> OpCost {
        let Self { n_pairs, n_expert } = self;
        OpCost::new(
            (2 * *n_pairs as u64 + *n_expert as u64) * F32_BYTES,
            2 * *n_pairs as u64,
        )
    }

    fn record(
        &self,
        gpu: &Gpu,
        r: &[View],
        w: &[View],
        dispatches: &mut Vec<Dispatch>,
    ) -> Result<(), GpuError> {
        let Self { n_pairs, n_expert } = self;
        dispatches.push(moe_group(gpu, &r[0], *n_pairs, *n_expert, &w[0], &w[1])?);
        Ok(())
    }
}

/// The graph's `Op::MoeAddId`: reads [a, bias, ids], writes [dst]: each pair's output plus
/// its expert's bias
pub struct MoeAddIdNode {
    pub rows: u32,
    pub n_pairs: u32,
}

impl GraphOp for MoeAddIdNode {
    fn kind(&self) -> String {
        "moe_add_id".into()
    }

    fn cost(&self) -> OpCost {
        let Self { rows, n_pairs } = self;
        let n = *rows as u64 * *n_pairs as u64;
        OpCost::new((3 * n + *n_pairs as u64) * F32_BYTES, n)
    }

    fn record(
        &self,
        gpu: &Gpu,
        r: &[View],
        w: &[View],
        dispatches: &mut Vec<Dispatch>,
    ) -> Result<(), GpuError> {
        let Self { rows, n_pairs } = self;
        dispatches.push(moe_add_id(
            gpu, &r[0], &r[1], &r[2], *rows, *n_pairs, &w[0],
        )?);
        Ok(())
    }
}

/// The graph's `Op::MoeSum`: reads [y, weights], writes [dst]: each token's weighted sum of
/// its experts' outputs
pub struct MoeSumNode {
    pub n_out: u32,
    pub n_used: u32,
    pub n_tok: u32,
}

impl GraphOp for MoeSumNode {
    fn kind(&self) -> String {
        "moe_sum".into()
    }

    fn cost(&self) -> OpCost {
        let Self {
            n_out,
            n_used,
            n_tok,
        } = self;
        let (n, u) = (*n_out as u64 * *n_tok as u64, *n_used as u64);
        OpCost::new(
            (u * n + n) * F32_BYTES + u * *n_tok as u64 * F32_BYTES,
            2 * u * n,
        )
    }

    fn record(
        &self,
        gpu: &Gpu,
        r: &[View],
        w: &[View],
        dispatches: &mut Vec<Dispatch>,
    ) -> Result<(), GpuError> {
        let Self {
            n_out,
            n_used,
            n_tok,
        } = self;
        dispatches.push(moe_sum(gpu, &r[0], &r[1], *n_out, *n_used, *n_tok, &w[0])?);
        Ok(())
    }
}
