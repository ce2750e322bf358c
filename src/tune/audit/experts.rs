//! A mixture's expert products under the audit: each stacked expert weight (gate, up,
//! down) through [`matmul_id`] as the graph runs it — each (token, expert) pair's rows
//! on their own for a decoded token or a small batch, grouped by expert ([`moe_group`])
//! into the prompt tiles from [`moe::GROUPED_MIN_TOKENS`] tokens on — with every expert
//! chosen over the runs. A row is one expert's row over the pairs that chose it, so a
//! wrong row of one expert fails as a wrong row of a dense weight does.

use super::products::{dot, file_row, sample_rows};
use super::{
    activations, product_row, worst, worst_row, AuditRow, Part, AUDIT_TOKENS, MIN_VALUES_PER_ROW,
};
use crate::gguf::GgufFile;
use crate::gpu::{Gpu, GpuError};
use crate::model::ModelWeights;
use crate::ops::moe::{self, grouped, matmul_id, moe_group, MoeRouting, Pairs};
use crate::ops::weight::{Ffn, Weight};
use crate::ops::KernelKey;
use crate::ops::{run_now, View};
use std::collections::HashSet;

/// One stacked expert weight as the graph multiplies it: by its routing's experts, x
/// per pair (the down products) or per token (gate and up).
#[derive(Clone, Copy)]
struct ExpertProduct<'a> {
    w: &'a Weight,
    routing: MoeRouting,
    x_per_pair: bool,
    layer: usize,
}

impl ExpertProduct<'_> {
    /// Rows of one expert.
    fn rows(&self) -> u32 {
        self.w.n_rows / self.routing.n_expert
    }
}

fn expert_products(weights: &ModelWeights) -> Vec<ExpertProduct<'_>> {
    let mut v = Vec::new();
    for (layer, l) in weights.layers.iter().enumerate() {
        if let Ffn::Experts(e) = &l.ffn {
            for (w, x_per_pair) in [(&e.gate, false), (&e.up, false), (&e.down, true)] {
                v.push(ExpertProduct {
                    w,
                    routing: e.routing,
                    x_per_pair,
                    layer,
                });
            }
        }
    }
    v
}

/// The kernel `gpu` multiplies `p`'s pairs of `n_tok` tokens with, as the graph runs
/// them.
fn kernel_of(gpu: &Gpu, p: &ExpertProduct, n_tok: u32) -> KernelKey {
    let r = p.routing;
    let ty = p.w.ty;
    moe::kernel(
        gpu,
        ty,
        p.rows(),
        r.n_expert,
        r.n_used,
        n_tok,
        grouped(n_tok),
    )
}

/// Each pair's expert in run `run`: token t's j-th choice is expert t * n_used + j, moved
/// on by a run's pairs each run, modulo the experts — a token's choices distinct, every
/// expert chosen over enough runs.
fn choices(r: &MoeRouting, n_tok: u32, run: u32) -> Vec<u32> {
    let n_pairs = n_tok * r.n_used;
    (0..n_pairs)
        .map(|p| (p + run * n_pairs) % r.n_expert)
        .collect()
}

/// Runs that give every expert's rows [`MIN_VALUES_PER_ROW`] values (at most 32).
fn runs(r: &MoeRouting, n_tok: u32) -> u32 {
    (r.n_expert * MIN_VALUES_PER_ROW)
        .div_ceil(n_tok * r.n_used)
        .clamp(1, 32)
}

/// `p`'s products ([rows, n_pairs], pair-major) for activations `x` ([n_cols] per token,
/// or per pair) and experts `ids` on `gpu`, through the ops the graph records.
fn run_experts(
    gpu: &Gpu,
    p: &ExpertProduct,
    x: &[f32],
    ids: &[u32],
    n_tok: u32,
) -> Result<Vec<f32>, GpuError> {
    let r = p.routing;
    let n_pairs = n_tok * r.n_used;
    let up = |label: &str, bytes: &[u8]| -> Result<View, GpuError> {
        Ok(View::whole(&gpu.upload(label, bytes)?))
    };
    let scratch = |label: &str, n: u64| -> Result<View, GpuError> {
        Ok(View::whole(&gpu.storage(label, n.max(1) * 4)?))
    };
    let xv = up("audit_x", bytemuck::cast_slice(x))?;
    let idv = up("audit_ids", bytemuck::cast_slice(ids))?;
    // Zeroed: a row a kernel leaves unwritten reads as a wrong row.
    let dst = scratch("audit_out", p.rows() as u64 * n_pairs as u64)?;
    let mut d = Vec::new();
    let (offsets, order) = (
        scratch("audit_offsets", r.n_expert as u64 + 1)?,
        scratch("audit_order", n_pairs as u64)?,
    );
    let pairs = if grouped(n_tok) {
        d.push(moe_group(gpu, &idv, n_pairs, r.n_expert, &offsets, &order)?);
        Pairs::Grouped {
            offsets: &offsets,
            order: &order,
        }
    } else {
        Pairs::Ids(&idv)
    };
    d.extend(matmul_id(
        gpu,
        p.w,
        r.n_expert,
        &xv,
        p.x_per_pair,
        pairs,
        r.n_used,
        n_tok,
        &dst,
    )?);
    run_now(gpu, &d)?;
    gpu.read_f32(&dst.buf, 0, p.rows() as usize * n_pairs as usize)
}

/// Checks every kernel `part`'s expert products take on `gpu` ([`super::audit`]), each
/// kernel once (`seen`): against the CPU on sampled rows of every expert, from the file's
/// bytes, and against the portable kernels (`portable`) on every row of every expert.
pub(super) fn audit_experts(
    gpu: &Gpu,
    portable: &Gpu,
    f: &GgufFile,
    weights: &ModelWeights,
    part: &Part,
    seen: &mut HashSet<KernelKey>,
) -> Result<Vec<AuditRow>, GpuError> {
    let mut out = Vec::new();
    for p in expert_products(weights) {
        if !part.holds(Some(p.layer)) {
            continue;
        }
        // The token counts whose kernels no product checked yet.
        let fresh: Vec<(u32, KernelKey)> = (AUDIT_TOKENS.into_iter())
            .map(|n| (n, kernel_of(gpu, &p, n)))
            .filter(|&(_, key)| seen.insert(key))
            .collect();
        if fresh.is_empty() {
            continue;
        }
        let r = p.routing;
        let (rows, k) = (p.rows(), p.w.n_cols as usize);
        // Sampled rows of each expert, as rows of the stacked weight (the reports' row).
        let within = sample_rows(rows);
        let stacked: Vec<u32> = (0..r.n_expert)
            .flat_map(|e| within.iter().map(move |&i| e * rows + i))
            .collect();
        let all: Vec<u32> = (0..r.n_expert * rows).collect();
        // The CPU's rows, dequantized once for every token count.
        let mut file_rows = Vec::new();
        for &s in &stacked {
            match file_row(f, p.w, false, s) {
                Some(row) => file_rows.push(row),
                None => break,
            }
        }
        let cpu_checked = file_rows.len() == stacked.len();
        for (n_tok, key) in fresh {
            let started = web_time::Instant::now();
            let n_pairs = n_tok * r.n_used;
            let x_rows = if p.x_per_pair { n_pairs } else { n_tok };
            let (mut vs_cpu, mut vs_portable) = ((0f64, 0u32), None);
            for run in 0..runs(&r, n_tok) {
                let ids = choices(&r, n_tok, run);
                let seed = 0xe4e7 + (n_tok as u64) * 64 + run as u64;
                let x = activations(x_rows as usize * k, seed);
                let got = run_experts(gpu, &p, &x, &ids, n_tok)?;
                // Each expert's pairs, in order; a stacked row's values are its expert's
                // pairs' outputs.
                let mut pairs_of = vec![Vec::new(); r.n_expert as usize];
                for (pair, &e) in ids.iter().enumerate() {
                    pairs_of[e as usize].push(pair);
                }
                let of = |s: u32| &pairs_of[(s / rows) as usize];
                let at =
                    |v: &[f32], s: u32, j: usize| v[of(s)[j] * rows as usize + (s % rows) as usize];
                if cpu_checked {
                    let x_of = |pair: usize| {
                        let row = if p.x_per_pair {
                            pair
                        } else {
                            pair / r.n_used as usize
                        };
                        &x[row * k..(row + 1) * k]
                    };
                    let want: Vec<Vec<f32>> = (stacked.iter().zip(&file_rows))
                        .map(|(&s, w)| of(s).iter().map(|&pair| dot(w, x_of(pair))).collect())
                        .collect();
                    let e = worst_row(
                        &stacked,
                        |i| want[i].len(),
                        |i, j| want[i][j],
                        |i, j| at(&got, stacked[i], j),
                    );
                    vs_cpu = worst(vs_cpu, e);
                }
                if kernel_of(portable, &p, n_tok) != key {
                    let want = run_experts(portable, &p, &x, &ids, n_tok)?;
                    let e = worst_row(
                        &all,
                        |i| of(all[i]).len(),
                        |i, j| at(&want, all[i], j),
                        |i, j| at(&got, all[i], j),
                    );
                    vs_portable = Some(vs_portable.map_or(e, |p| worst(p, e)));
                }
            }
            let name = &p.w.name;
            let what = format!("{name} ({} experts, {} per token)", r.n_expert, r.n_used);
            let checked = (vs_cpu, vs_portable);
            out.push(product_row(
                gpu,
                key,
                name,
                &what,
                n_tok,
                checked,
                cpu_checked,
                started,
            ));
        }
    }
    Ok(out)
}
