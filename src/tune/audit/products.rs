//! The dense matrix products of a model's graph under the audit: every weight a
//! decoder, state-space, LFM2 or BERT layer multiplies (a mixture's router and shared
//! expert among them), the output head and a classifier's, each through the kernel the
//! device would take, against the CPU on sampled rows of the file's own bytes and against
//! the portable kernels on every row.

use super::{
    activations, product_row, worst, worst_row, AuditRow, Part, AUDIT_TOKENS, MIN_VALUES_PER_ROW,
};
use crate::gguf::GgufFile;
use crate::gpu::{Gpu, GpuError};
use crate::model::Lfm2Mixer;
use crate::model::{Arch, Hparams, ModelWeights};
use crate::ops::glu::{glu_ref, Activation};
use crate::ops::kernels::Products;
use crate::ops::matmul::{self, matmul, matmul_glu, matmul_with};
use crate::ops::matmul_q8::{
    self, matmul_q8, matmul_q8_glu, matmul_q8_with, q8_bytes, quantize_q8, quantize_q8_ref,
};
use crate::ops::weight::{Ffn, GateUp, Weight};
use crate::ops::KernelKey;
use crate::ops::{run_now, View};
use crate::quant;
use std::collections::HashSet;

/// A matrix product the graph dispatches: the weight, the fused GLU epilogue where its
/// rows are interleaved (gate, up) pairs, and the layer it belongs to (None: the output
/// head, a classifier).
#[derive(Clone, Copy)]
pub(super) struct Product<'a> {
    pub w: &'a Weight,
    pub glu: Option<Activation>,
    pub layer: Option<usize>,
}

/// The activation of a model's gated feed-forwards.
pub(super) fn activation(hp: &Hparams) -> Activation {
    match hp.arch {
        Arch::Gemma2 | Arch::Gemma3 => Activation::Gelu,
        _ => Activation::Silu,
    }
}

/// The products of the graph, one per weight, in layer order, then the heads.
fn products<'a>(weights: &'a ModelWeights, hp: &Hparams) -> Vec<Product<'a>> {
    let act = activation(hp);
    let mut v = Vec::new();
    let plain = |v: &mut Vec<Product<'a>>, w: &'a Weight, layer: Option<usize>| {
        v.push(Product {
            w,
            glu: None,
            layer,
        })
    };
    let gate_up = |v: &mut Vec<Product<'a>>, g: &'a GateUp, layer: Option<usize>| match g {
        GateUp::Interleaved(w) => v.push(Product {
            w,
            glu: Some(act),
            layer,
        }),
        GateUp::Split { gate, up } => {
            for w in [gate, up] {
                v.push(Product {
                    w,
                    glu: None,
                    layer,
                })
            }
        }
    };
    for (il, l) in weights.layers.iter().enumerate() {
        let at = Some(il);
        l.qkv.iter().for_each(|w| plain(&mut v, w, at));
        plain(&mut v, &l.wo, at);
        match &l.ffn {
            Ffn::Dense { gate_up: g, down } => {
                gate_up(&mut v, g, at);
                plain(&mut v, down, at);
            }
            // The experts themselves are `super::experts`'.
            Ffn::Experts(e) => {
                plain(&mut v, &e.gate_inp, at);
                if let Some(sh) = &e.shared {
                    plain(&mut v, &sh.gate_inp, at);
                    gate_up(&mut v, &sh.gate_up, at);
                    plain(&mut v, &sh.down, at);
                }
            }
        }
    }
    for (il, l) in weights.ssm.iter().enumerate() {
        let at = Some(il);
        for w in [Some(&l.in_x), Some(&l.in_z), l.in_dt.as_ref()] {
            w.into_iter().for_each(|w| plain(&mut v, w, at));
        }
        for w in [
            l.x_dt.as_ref(),
            l.x_bc.as_ref(),
            l.dt.as_ref(),
            Some(&l.out),
        ] {
            w.into_iter().for_each(|w| plain(&mut v, w, at));
        }
    }
    for (il, l) in weights.lfm2.iter().enumerate() {
        let at = Some(il);
        match &l.mixer {
            Lfm2Mixer::Attention { qkv, wo, .. } => {
                qkv.iter().for_each(|w| plain(&mut v, w, at));
                plain(&mut v, wo, at);
            }
            Lfm2Mixer::Conv {
                in_b,
                in_c,
                in_x,
                out,
                ..
            } => [in_b, in_c, in_x, out]
                .into_iter()
                .for_each(|w| plain(&mut v, w, at)),
        }
        gate_up(&mut v, &l.gate_up, at);
        plain(&mut v, &l.down, at);
    }
    match &weights.bert {
        Some(b) => {
            for (il, l) in b.layers.iter().enumerate() {
                let at = Some(il);
                l.qkv.iter().for_each(|w| plain(&mut v, w, at));
                [&l.wo, &l.up, &l.down]
                    .into_iter()
                    .for_each(|w| plain(&mut v, w, at));
            }
            if let Some(c) = &b.classifier {
                for (w, _) in [c.dense.as_ref(), c.out.as_ref()].into_iter().flatten() {
                    plain(&mut v, w, None);
                }
            }
        }
        None => plain(&mut v, &weights.output, None),
    }
    if let Some(w) = &weights.cls_out {
        plain(&mut v, w, None);
    }
    v
}

/// The kernel that computes `p` at `n_tok` tokens on `gpu`.
fn kernel_of(gpu: &Gpu, p: &Product, n_tok: u32) -> KernelKey {
    if matmul_q8::chosen(&gpu.tuning, p.w, n_tok) {
        matmul_q8::kernel(gpu, p.w.ty, p.w.n_rows, n_tok)
    } else {
        matmul::kernel(gpu, p.w.ty, p.w.n_rows, n_tok, p.glu)
    }
}

/// `p`'s output ([out rows, n_tok], token-major) for activations `x` on `gpu`, through
/// the same ops the graph records; through kernel `forced` where given (a product without
/// a GLU).
fn run_product(
    gpu: &Gpu,
    p: &Product,
    x: &[f32],
    n_tok: u32,
    forced: Option<KernelKey>,
) -> Result<Vec<f32>, GpuError> {
    let w = p.w;
    let out_rows = if p.glu.is_some() {
        w.n_rows / 2
    } else {
        w.n_rows
    } as u64;
    let buf = |label: &str, bytes: u64| -> Result<View, GpuError> {
        Ok(View::whole(&gpu.storage(label, bytes.max(4))?))
    };
    let xv = buf("audit_x", x.len() as u64 * 4)?;
    gpu.write(&xv.buf, 0, bytemuck::cast_slice(x));
    // Outputs start at zero (wgpu's new buffers): a row a kernel leaves unwritten reads
    // as a wrong row, not as a number that is no number.
    let dst = buf("audit_out", out_rows * n_tok as u64 * 4)?;
    let pairs = buf("audit_pairs", w.n_rows as u64 * n_tok as u64 * 4)?;
    let mut d = Vec::new();
    if matmul_q8::chosen(&gpu.tuning, w, n_tok) {
        let xq = buf("audit_xq", q8_bytes(w.n_cols, n_tok))?;
        d.push(quantize_q8(gpu, &xv, w.n_cols, n_tok, &xq)?);
        d.extend(match (p.glu, forced) {
            (Some(a), _) => matmul_q8_glu(gpu, w, &xq, n_tok, a, &dst, &pairs)?,
            (None, Some(key)) => matmul_q8_with(gpu, key, w, &xq, n_tok, &dst)?,
            (None, None) => matmul_q8(gpu, w, &xq, n_tok, &dst)?,
        });
    } else {
        d.extend(match (p.glu, forced) {
            (Some(a), _) => matmul_glu(gpu, w, &xv, n_tok, a, &dst, &pairs)?,
            (None, Some(key)) => matmul_with(gpu, key, w, &xv, n_tok, &dst)?,
            (None, None) => matmul(gpu, w, &xv, n_tok, &dst)?,
        });
    }
    run_now(gpu, &d)?;
    gpu.read_f32(&dst.buf, 0, (out_rows * n_tok as u64) as usize)
}

/// Rows a check multiplies at most: a larger weight (an output head of 262k rows) is
/// checked on its first rows, as many as keep its row count modulo the largest tile
/// (128 rows), where that leaves the kernel choice as it is.
const MAX_ROWS: u32 = 4096;

/// The first rows of `w` (see [`MAX_ROWS`]), None where it is small enough whole.
fn first_rows(w: &Weight) -> Option<Weight> {
    if w.n_rows <= MAX_ROWS {
        return None;
    }
    w.first_rows(MAX_ROWS - 128 + w.n_rows % 128, w.name.clone())
}

/// The activations an integer-dot kernel actually multiplies: x rounded to its 8-bit
/// blocks as [`quantize_q8`] rounds it. The references multiply these, so the kernel is
/// held to a float kernel's bound rather than to its rounding's.
fn rounded_to_q8(x: &[f32]) -> Vec<f32> {
    let q = quantize_q8_ref(x);
    (q.codes.iter().enumerate())
        .map(|(i, &c)| c as f32 * q.d[i / 32])
        .collect()
}

/// Rows the CPU computes: the first and last, rows either side of the tile edges up to
/// the first 256 and of the last whole 64- and 128-row tiles, and a spread between.
pub(super) fn sample_rows(n: u32) -> Vec<u32> {
    let mut v: Vec<u32> = vec![0, 1, n / 2, n.saturating_sub(2), n.saturating_sub(1)];
    for edge in [63, 64, 127, 128, 255, 256] {
        v.push(edge);
    }
    for tile in [64, 128] {
        let last = n / tile * tile;
        v.extend([last.saturating_sub(1), last]);
    }
    v.extend((0..24).map(|i| (i * n) / 24 + i % 7));
    v.retain(|&r| r < n);
    v.sort_unstable();
    v.dedup();
    v
}

/// Row `r` of the weight as the file holds it, dequantized: a fused weight's name joins
/// its parts' with '+' (rows interleaved for a GLU's pairs, else one part after another;
/// a GLU's one tensor holds the gate rows, then the up rows). A tensor of more than two
/// dimensions (a mixture's stacked experts) counts its rows over all of them.
pub(super) fn file_row(f: &GgufFile, w: &Weight, interleaved: bool, r: u32) -> Option<Vec<f32>> {
    let parts: Vec<_> = w
        .name
        .split('+')
        .map(|n| f.tensor(n))
        .collect::<Option<_>>()?;
    let rows_of = |dims: &[u64]| dims.get(1..).map(|d| d.iter().product::<u64>() as u32);
    let (part, row) = if interleaved && parts.len() == 1 {
        // One tensor whose first half of rows is the gate, the second the up (Phi-3).
        let half = rows_of(&parts[0].dims)? / 2;
        (parts[0], (r % 2) * half + r / 2)
    } else if interleaved {
        let n = parts.len() as u32;
        (parts[(r % n) as usize], r / n)
    } else {
        let mut row = r;
        let mut at = None;
        for t in &parts {
            let rows = rows_of(&t.dims)?;
            if row < rows {
                at = Some(t);
                break;
            }
            row -= rows;
        }
        (*at?, row)
    };
    let row_bytes = part.ty.row_bytes(w.n_cols as u64)? as usize;
    let data = f.tensor_data(part);
    let bytes = data.get(row as usize * row_bytes..(row as usize + 1) * row_bytes)?;
    let mut out = vec![0f32; w.n_cols as usize];
    quant::dequantize_row(part.ty, bytes, &mut out);
    Some(out)
}

/// The dot product in f64 of a weight row and an activation row.
pub(super) fn dot(row: &[f32], x: &[f32]) -> f32 {
    row.iter()
        .zip(x)
        .map(|(&a, &b)| a as f64 * b as f64)
        .sum::<f64>() as f32
}

/// The CPU's output rows `rows` of `p` (each row's values over the tokens), or None
/// where the weight's name does not lead to the file's tensors ([`file_row`]).
fn cpu_rows(
    f: &GgufFile,
    p: &Product,
    x: &[f32],
    n_tok: u32,
    rows: &[u32],
) -> Option<Vec<Vec<f32>>> {
    let k = p.w.n_cols as usize;
    let over_tokens = |row: &[f32]| -> Vec<f32> {
        x.chunks(k)
            .take(n_tok as usize)
            .map(|xs| dot(row, xs))
            .collect()
    };
    rows.iter()
        .map(|&r| match p.glu {
            Some(act) => {
                let gate = over_tokens(&file_row(f, p.w, true, 2 * r)?);
                let up = over_tokens(&file_row(f, p.w, true, 2 * r + 1)?);
                Some(glu_ref(act, &gate, &up))
            }
            None => Some(over_tokens(&file_row(f, p.w, false, r)?)),
        })
        .collect()
}

/// Checks every kernel `part`'s dense products take on `gpu` ([`super::audit`]), each
/// kernel once (`seen`), on the first product that takes it; `portable` is the same
/// device on the portable kernels.
pub(super) fn audit_products(
    gpu: &Gpu,
    portable: &Gpu,
    f: &GgufFile,
    hp: &Hparams,
    weights: &ModelWeights,
    part: &Part,
    seen: &mut HashSet<KernelKey>,
) -> Result<Vec<AuditRow>, GpuError> {
    let mut out = Vec::new();
    for full in products(weights, hp) {
        if !part.holds(full.layer) {
            continue;
        }
        for n_tok in AUDIT_TOKENS {
            let key = kernel_of(gpu, &full, n_tok);
            if !seen.insert(key) {
                continue;
            }
            // A large weight's first rows, through the kernel the whole would take (a
            // fused GLU's choice cannot be given: its first rows where they take it).
            let first = first_rows(full.w);
            let (p, forced) = match &first {
                Some(w) if full.glu.is_none() => (Product { w, ..full }, Some(key)),
                Some(w) if kernel_of(gpu, &Product { w, ..full }, n_tok) == key => {
                    (Product { w, ..full }, None)
                }
                _ => (full, None),
            };
            let int_dot = key.product_instructions() == Products::IntegerDot;
            let started = web_time::Instant::now();
            // A token's output row can be near zero by chance, and a zeroed row then
            // hides; a few runs on other activations give every row several values.
            let runs = MIN_VALUES_PER_ROW.div_ceil(n_tok);
            let (mut vs_cpu, mut vs_portable) = ((0f64, 0u32), None);
            let mut cpu_checked = true;
            let each = |_| n_tok as usize;
            for run in 0..runs {
                let seed = 0xa0d1 + (n_tok as u64) * 16 + run as u64;
                let x = activations((p.w.n_cols * n_tok) as usize, seed);
                let got = run_product(gpu, &p, &x, n_tok, forced)?;
                let x = if int_dot { rounded_to_q8(&x) } else { x };
                let n_rows = got.len() / n_tok as usize;
                let at = |v: &[f32], r: usize, t: usize| v[t * n_rows + r];
                let rows = sample_rows(n_rows as u32);
                match cpu_rows(f, &p, &x, n_tok, &rows) {
                    Some(cpu) => {
                        let e = worst_row(
                            &rows,
                            each,
                            |i, t| cpu[i][t],
                            |i, t| at(&got, rows[i] as usize, t),
                        );
                        vs_cpu = worst(vs_cpu, e);
                    }
                    None => cpu_checked = false,
                }
                if kernel_of(portable, &p, n_tok) != key {
                    let want = run_product(portable, &p, &x, n_tok, None)?;
                    let all: Vec<u32> = (0..n_rows as u32).collect();
                    let e = worst_row(&all, each, |r, t| at(&want, r, t), |r, t| at(&got, r, t));
                    vs_portable = Some(vs_portable.map_or(e, |p| worst(p, e)));
                }
            }
            let name = &p.w.name;
            let checked = (vs_cpu, vs_portable);
            out.push(product_row(
                gpu,
                key,
                name,
                name,
                n_tok,
                checked,
                cpu_checked,
                started,
            ));
        }
    }
    Ok(out)
}
