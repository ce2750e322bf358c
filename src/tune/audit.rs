//! No fast kernel runs on a device before it matched there, whatever chose it: the
//! tuner, `--kernels`, `--no-tune` or a `WGLLM_*` switch. After the weights are on the
//! device, every matrix product the model's graph will dispatch (each weight of every
//! layer and the output head, at one decoded token, a small batch and a prompt whose
//! token counts leave partial groups and tiles) runs once on random activations, and its
//! kernel is compared two ways: with a plain CPU computation on sampled rows (the first
//! and last rows, rows at tile edges, a spread between) from the file's own bytes, and
//! with the portable kernels' output on the same device, every row. The error is taken row
//! by row — the root mean square of a row's difference over the tokens, over the root mean
//! square of all reference outputs — so that one wrong row, or one token of a tile edge,
//! fails where an error over the whole output would average it away.
//!
//! The attention the graph runs is checked the same way ([`audit_attention`]): the
//! context's K and V cache types, flash or not, the model's heads, scale, soft-cap and
//! sinks, at the same token counts over cells that end in a partial chunk, against the
//! CPU's attention over the cache's own values.
//!
//! A kernel that fails is dropped for the portable or float one of its family and the
//! products checked again; where the user asked for it, the load is refused with the
//! reason instead. The tuner's own check (`super::check`) still decides what is worth
//! timing; this one decides what may run. Experts' products (mixtures of experts) are
//! not covered here yet.

use crate::gguf::{quant, GgufFile};
use crate::gpu::{Gpu, GpuError, GpuOptions, KernelShape, KernelTuning};
use crate::kv::KvChoice;
use crate::model::{Arch, Hparams, ModelWeights};
use crate::ops::attention::{
    attention_sinks_ref, attention_with, AttnShape, AttnViews, FlashKernel,
};
use crate::ops::glu::{glu_ref, Activation};
use crate::ops::kernels::{KernelKey, Products};
use crate::ops::matmul::{self, matmul, matmul_glu, matmul_with};
use crate::ops::matmul_q8::{
    self, matmul_q8, matmul_q8_glu, matmul_q8_with, q8_bytes, quantize_q8, quantize_q8_ref,
};
use crate::ops::softmax::SoftmaxParams;
use crate::ops::weight::{Ffn, GateUp, Weight};
use crate::ops::{run_now, View};
use std::collections::HashSet;
use std::sync::Arc;

/// Token counts each product is checked at: one decoded token, a batch that leaves a
/// partial group of the 4- and 8-token variants, and a prompt that leaves a partial
/// 64-token tile.
pub const AUDIT_TOKENS: [u32; 3] = [1, 5, 69];

/// Values of each output row a check compares at least: a kernel checked at fewer tokens
/// runs again on other activations.
const MIN_VALUES_PER_ROW: u32 = 4;

/// The larger of two (error, row) pairs.
fn worst(a: (f64, u32), b: (f64, u32)) -> (f64, u32) {
    if b.0 > a.0 {
        b
    } else {
        a
    }
}

/// Largest row error (see the module doc) a kernel may show: the same products in
/// another order stay near 1e-6, through f16 operands (cooperative matrices) near 1e-3;
/// a wrong row is near 1. The integer-dot kernels are compared on the 8-bit activations
/// they multiply ([`rounded_to_q8`]), so the one bound holds them too.
pub const ROW_BOUND: f64 = 1e-2;

/// One kernel's check: the product it was run on and its worst row errors.
#[derive(Clone, Debug)]
pub struct AuditRow {
    /// The kernel (or the attention path) checked.
    pub kernel: String,
    /// What is dropped where it fails.
    pub family: Family,
    /// The weight it multiplied, and how many tokens.
    pub weight: String,
    pub n_tok: u32,
    /// Worst row error against the CPU on the sampled rows, and the row.
    pub vs_cpu: (f64, u32),
    /// Worst row error against the portable kernels on the device (every row), and the
    /// row; None where the kernel is the portable one itself.
    pub vs_portable: Option<(f64, u32)>,
    pub bound: f64,
}

impl AuditRow {
    pub fn passed(&self) -> bool {
        self.vs_cpu.0 <= self.bound && self.vs_portable.is_none_or(|p| p.0 <= self.bound)
    }

    /// What went wrong, in a sentence.
    pub fn describe(&self) -> String {
        let (e, row, against) = match self.vs_portable {
            Some((e, r)) if e > self.vs_cpu.0 => (e, r, "the portable kernels"),
            _ => (self.vs_cpu.0, self.vs_cpu.1, "the CPU"),
        };
        format!(
            "{} on {} at {} tokens: row {row} differs from {against} by {} (bound {:.0e})",
            self.kernel,
            self.weight,
            self.n_tok,
            if e.is_finite() {
                format!("{e:.1e}")
            } else {
                "a value that is not a number".into()
            },
            self.bound
        )
    }
}

/// A matrix product the graph dispatches: the weight, the fused GLU epilogue where its
/// rows are interleaved (gate, up) pairs.
#[derive(Clone, Copy)]
struct Product<'a> {
    w: &'a Weight,
    glu: Option<Activation>,
}

/// The products of the graph, one per weight: each decoder layer's projections and
/// dense feed-forward (a mixture's experts excepted), the output head, a reranker's head.
fn products<'a>(weights: &'a ModelWeights, hp: &Hparams) -> Vec<Product<'a>> {
    let act = match hp.arch {
        Arch::Gemma2 | Arch::Gemma3 => Activation::Gelu,
        _ => Activation::Silu,
    };
    let mut v = Vec::new();
    let gate_up = |v: &mut Vec<Product<'a>>, g: &'a GateUp| match g {
        GateUp::Interleaved(w) => v.push(Product { w, glu: Some(act) }),
        GateUp::Split { gate, up } => {
            v.push(Product { w: gate, glu: None });
            v.push(Product { w: up, glu: None });
        }
    };
    for l in &weights.layers {
        v.extend(l.qkv.iter().map(|w| Product { w, glu: None }));
        v.push(Product {
            w: &l.wo,
            glu: None,
        });
        if let Ffn::Dense { gate_up: g, down } = &l.ffn {
            gate_up(&mut v, g);
            v.push(Product { w: down, glu: None });
        }
    }
    for l in &weights.lfm2 {
        gate_up(&mut v, &l.gate_up);
        v.push(Product {
            w: &l.down,
            glu: None,
        });
    }
    if weights.bert.is_none() {
        v.push(Product {
            w: &weights.output,
            glu: None,
        });
    }
    if let Some(w) = &weights.cls_out {
        v.push(Product { w, glu: None });
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
fn sample_rows(n: u32) -> Vec<u32> {
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
/// a GLU's one tensor holds the gate rows, then the up rows).
fn file_row(f: &GgufFile, w: &Weight, interleaved: bool, r: u32) -> Option<Vec<f32>> {
    let parts: Vec<_> = w
        .name
        .split('+')
        .map(|n| f.tensor(n))
        .collect::<Option<_>>()?;
    let (part, row) = if interleaved && parts.len() == 1 {
        // One tensor whose first half of rows is the gate, the second the up (Phi-3).
        let half = *parts[0].dims.get(1)? as u32 / 2;
        (parts[0], (r % 2) * half + r / 2)
    } else if interleaved {
        let n = parts.len() as u32;
        (parts[(r % n) as usize], r / n)
    } else {
        let mut row = r;
        let mut at = None;
        for t in &parts {
            let rows = *t.dims.get(1)? as u32;
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
    let dot = |row: &[f32]| -> Vec<f32> {
        (0..n_tok as usize)
            .map(|t| {
                let xs = &x[t * k..(t + 1) * k];
                row.iter()
                    .zip(xs)
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum::<f64>() as f32
            })
            .collect()
    };
    rows.iter()
        .map(|&r| match p.glu {
            Some(act) => {
                let gate = dot(&file_row(f, p.w, true, 2 * r)?);
                let up = dot(&file_row(f, p.w, true, 2 * r + 1)?);
                Some(glu_ref(act, &gate, &up))
            }
            None => Some(dot(&file_row(f, p.w, false, r)?)),
        })
        .collect()
}

/// The worst row error of `got` against `want` over `rows`: each row's root mean square
/// difference over the tokens, over the root mean square of all of `want`'s values.
/// `at(r, t)` reads a token-major output of `n_rows` rows.
fn worst_row(
    rows: &[u32],
    n_tok: u32,
    want: impl Fn(usize, usize) -> f32,
    got: impl Fn(usize, usize) -> f32,
) -> (f64, u32) {
    let (mut sum, mut count) = (0f64, 0usize);
    for i in 0..rows.len() {
        for t in 0..n_tok as usize {
            let w = want(i, t) as f64;
            sum += w * w;
            count += 1;
        }
    }
    let rms = (sum / count.max(1) as f64).sqrt().max(f64::MIN_POSITIVE);
    let mut worst = (0f64, rows.first().copied().unwrap_or(0));
    for (i, &r) in rows.iter().enumerate() {
        let d: f64 = (0..n_tok as usize)
            .map(|t| (got(i, t) as f64 - want(i, t) as f64).powi(2))
            .sum::<f64>();
        let e = (d / n_tok as f64).sqrt() / rms;
        let e = if e.is_nan() { f64::INFINITY } else { e };
        if e > worst.0 {
            worst = (e, r);
        }
    }
    worst
}

/// Random activations, roughly normal, of `n` values (a fixed stream per seed).
fn activations(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = crate::model::synth::Rng(seed);
    (0..n).map(|_| rng.normalish()).collect()
}

/// Checks every kernel the graph will dispatch for `weights` on `gpu` (its kernel choice
/// as it stands), each kernel once, on the first product that takes it.
pub fn audit(
    gpu: &Gpu,
    f: &GgufFile,
    hp: &Hparams,
    weights: &ModelWeights,
) -> Result<Vec<AuditRow>, GpuError> {
    let portable = gpu.retuned(
        KernelShape::Cpu,
        KernelTuning {
            int_dot: Some(false),
            coop_matrix: Some(false),
            ..Default::default()
        },
    );
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for full in products(weights, hp) {
        for n_tok in AUDIT_TOKENS {
            let key = kernel_of(gpu, &full, n_tok);
            if !seen.insert(key) {
                continue;
            }
            // A large weight's first rows, through the kernel the whole would take (a
            // fused GLU's choice cannot be given: its first rows where they take it).
            let part = first_rows(full.w);
            let (p, forced) = match &part {
                Some(w) if full.glu.is_none() => (Product { w, glu: None }, Some(key)),
                Some(w) if kernel_of(gpu, &Product { w, glu: full.glu }, n_tok) == key => {
                    (Product { w, glu: full.glu }, None)
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
                            n_tok,
                            |i, t| cpu[i][t],
                            |i, t| at(&got, rows[i] as usize, t),
                        );
                        vs_cpu = worst(vs_cpu, e);
                    }
                    None => cpu_checked = false,
                }
                if kernel_of(&portable, &p, n_tok) != key {
                    let want = run_product(&portable, &p, &x, n_tok, None)?;
                    let all: Vec<u32> = (0..n_rows as u32).collect();
                    let e = worst_row(&all, n_tok, |r, t| at(&want, r, t), |r, t| at(&got, r, t));
                    vs_portable = Some(vs_portable.map_or(e, |p| worst(p, e)));
                }
            }
            if !cpu_checked {
                log::debug!(
                    "kernel audit: {} is not the file's; {key} compared with the portable kernels only",
                    p.w.name
                );
            }
            log::debug!(
                "kernel audit: {key} on {} at {n_tok} tokens: row error {:.1e} against the CPU, {} against the portable kernels ({:.0} ms)",
                p.w.name,
                vs_cpu.0,
                vs_portable.map_or("-".into(), |p| format!("{:.1e}", p.0)),
                started.elapsed().as_secs_f64() * 1e3
            );
            out.push(AuditRow {
                kernel: key.to_string(),
                family: family(&key, &gpu.tuning),
                weight: p.w.name.clone(),
                n_tok,
                vs_cpu,
                vs_portable,
                bound: ROW_BOUND,
            });
        }
    }
    gpu.check()?;
    Ok(out)
}

/// Cells the attention check reads: several of the split and tiled kernels' chunks of
/// 64 and 128 cells, the last one partial.
const ATTN_CELLS: u32 = 333;

/// The attention path `gpu` takes for a cache `kv`: its name and the family dropped where
/// it fails.
fn attention_path(gpu: &Gpu, kv: &KvChoice, fk: FlashKernel) -> (&'static str, Family) {
    match (gpu.kernels == KernelShape::Gpu, kv.flash, fk) {
        (true, true, FlashKernel::Coop { .. }) => (
            "flash attention on cooperative matrices",
            Family::CoopMatrix,
        ),
        (true, true, _) => ("GPU flash attention", Family::GpuShaped),
        (true, false, _) => ("GPU score, softmax and output kernels", Family::GpuShaped),
        (false, true, _) => ("CPU-shaped flash attention", Family::Portable),
        (false, false, _) => ("portable attention", Family::Portable),
    }
}

/// Checks the attention the graph runs for a cache `kv` (its K and V types, flash or not,
/// the rotation of a quantized cache) with the model's heads, its scale and soft-cap and
/// (`sinks`) a sink logit per head, at each of [`AUDIT_TOKENS`] tokens at the end of
/// [`ATTN_CELLS`] cells, causal, against the CPU's attention over the same cache values;
/// a row is one head's output for one token.
pub fn audit_attention(
    gpu: &Gpu,
    hp: &Hparams,
    kv: KvChoice,
    sinks: bool,
) -> Result<Vec<AuditRow>, GpuError> {
    let (hd, nh, nkv) = (hp.head_dim, hp.n_head, hp.n_head_kv);
    if hd == 0 || !hd.is_multiple_of(4) || nkv == 0 || !nh.is_multiple_of(nkv) {
        return Ok(Vec::new());
    }
    let fk = FlashKernel::for_gpu(gpu);
    let (path, family) = attention_path(gpu, &kv, fk);
    let mut out = Vec::new();
    for n_tok in AUDIT_TOKENS {
        let started = web_time::Instant::now();
        let n_kv = ATTN_CELLS.max(n_tok);
        let shape = AttnShape {
            head_dim: hd,
            n_head: nh,
            n_head_kv: nkv,
            n_tok,
            n_kv,
            k_type: kv.type_k,
            v_type: kv.type_v,
            flash: kv.flash,
            rot_k: kv.rot_k,
            rot_v: kv.rot_v,
        };
        let sp = SoftmaxParams {
            scale: hp.attn_scale,
            max_bias: 0.0,
            n_head: nh,
            softcap: hp.attn_softcap,
        };
        let mut rng = crate::model::synth::Rng(0xa77e + n_tok as u64);
        let mut random = |n: u32| -> Vec<f32> { (0..n).map(|_| rng.normalish()).collect() };
        let q = random(hd * nh * n_tok);
        let (k, v) = (random(hd * nkv * n_kv), random(hd * nkv * n_kv));
        let sink_logits = sinks.then(|| random(nh));
        let (k_words, v_words) = (kv.type_k.encode(&k), kv.type_v.encode(&v));
        // The CPU reads the values the cache holds (rounded to its type).
        let (k_vals, v_vals) = (kv.type_k.decode(&k_words), kv.type_v.decode(&v_words));
        let mask = super::attn_run::causal_mask(n_tok, n_kv);
        let up = |name: &str, words: &[u32]| -> Result<View, GpuError> {
            Ok(View::whole(&gpu.upload(name, bytemuck::cast_slice(words))?))
        };
        let scratch = |name: &str, n: u64| -> Result<View, GpuError> {
            Ok(View::whole(&gpu.storage(name, n.max(1) * 4)?))
        };
        let n_out = (hd * nh * n_tok) as u64;
        let (qv, kv_, vv) = (
            up("audit_q", bytemuck::cast_slice(&q))?,
            up("audit_k", &k_words)?,
            up("audit_v", &v_words)?,
        );
        let mv = up("audit_mask", bytemuck::cast_slice(&mask))?;
        let sv = match &sink_logits {
            Some(s) => Some(up("audit_sinks", bytemuck::cast_slice(s))?),
            None => None,
        };
        let dst = scratch("audit_attn_out", n_out)?;
        let io = AttnViews {
            q: &qv,
            k: &kv_,
            v: &vv,
            mask: &mv,
            scores: &scratch("audit_scores", shape.scores_len(gpu)?)?,
            partials: &scratch("audit_partials", shape.partials_len(gpu))?,
            dst: &dst,
            sinks: sv.as_ref(),
        };
        run_now(gpu, &attention_with(gpu, &shape, &sp, &io, fk)?)?;
        let got = gpu.read_f32(&dst.buf, 0, n_out as usize)?;
        let want = attention_sinks_ref(
            &shape,
            &sp,
            &q,
            &k_vals,
            &v_vals,
            &mask,
            sink_logits.as_deref(),
        );
        let rows: Vec<u32> = (0..nh * n_tok).collect();
        let h = hd as usize;
        let vs_cpu = worst_row(&rows, hd, |i, j| want[i * h + j], |i, j| got[i * h + j]);
        log::debug!(
            "kernel audit: {path} (K {}, V {}) at {n_tok} tokens over {n_kv} cells: row error {:.1e} against the CPU ({:.0} ms)",
            kv.type_k,
            kv.type_v,
            vs_cpu.0,
            started.elapsed().as_secs_f64() * 1e3
        );
        out.push(AuditRow {
            kernel: format!("{path} (K {}, V {})", kv.type_k, kv.type_v),
            family,
            weight: format!("random heads of the model's shape over {n_kv} cells"),
            n_tok,
            vs_cpu,
            vs_portable: None,
            bound: ROW_BOUND,
        });
    }
    gpu.check()?;
    Ok(out)
}

/// A kernel family a failed kernel is dropped with, and what replaces it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    IntegerDot,
    CoopMatrix,
    GpuShaped,
    /// The portable kernels in a tuned tile; the default tile replaces them.
    TunedTile,
    /// The portable kernels themselves: nothing is left to fall back on.
    Portable,
}

fn family(key: &KernelKey, tuning: &KernelTuning) -> Family {
    match key {
        KernelKey::MatmulQ8 { .. } | KernelKey::MatmulQ8Tile { .. } => Family::IntegerDot,
        KernelKey::MatmulCoop { .. } => Family::CoopMatrix,
        k if !k.cpu_shaped() => Family::GpuShaped,
        _ if tuning.cpu_decode_tile.is_some()
            || tuning.cpu_prompt_tile.is_some()
            || tuning.matmul_tile.is_some() =>
        {
            Family::TunedTile
        }
        _ => Family::Portable,
    }
}

/// Checks the kernels `gpu` would run for the model ([`audit`]) and returns the device
/// with only kernels that matched: a failed family is dropped for the portable or float
/// kernels and the products checked again. `asked` are the options the user gave: a
/// family they asked for that fails refuses the load, with the reason.
pub fn settle(
    gpu: Arc<Gpu>,
    asked: &GpuOptions,
    f: &GgufFile,
    hp: &Hparams,
    weights: &ModelWeights,
    kv: &dyn Fn(&Gpu) -> Option<KvChoice>,
) -> Result<Arc<Gpu>, GpuError> {
    let mut gpu = gpu;
    let sinks = weights.layers.iter().any(|l| l.attn_sinks.is_some());
    // Each round drops at least one family; four families can be dropped.
    for _ in 0..5 {
        let mut rows = audit(&gpu, f, hp, weights)?;
        if let Some(kv) = kv(&gpu) {
            rows.extend(audit_attention(&gpu, hp, kv, sinks)?);
        }
        log::info!(
            "kernel audit on {}: {} kernels and attention paths checked against the CPU and the portable kernels",
            gpu.info.name,
            rows.len()
        );
        let Some(bad) = rows.iter().find(|r| !r.passed()) else {
            return Ok(gpu);
        };
        let (mut kernels, mut tuning) = (gpu.kernels, gpu.tuning.clone());
        let refuse = |flag: &str| {
            Err(GpuError::Validation(format!(
                "{}; it was asked for ({flag}) and cannot run here: drop it to let wgllm choose kernels that match on this device",
                bad.describe()
            )))
        };
        let fam = bad.family;
        match fam {
            Family::IntegerDot if asked.tuning.int_dot == Some(true) => {
                return refuse("WGLLM_INT_DOT=1")
            }
            Family::IntegerDot => tuning.int_dot = Some(false),
            Family::CoopMatrix if asked.tuning.coop_matrix == Some(true) => {
                return refuse("WGLLM_COOP_MATRIX=1")
            }
            Family::CoopMatrix => tuning.coop_matrix = Some(false),
            Family::GpuShaped if asked.kernels == KernelShape::Gpu => {
                return refuse("--kernels gpu")
            }
            Family::GpuShaped => kernels = KernelShape::Cpu,
            Family::TunedTile if asked.tuning.matmul_tile.is_some() => {
                return refuse("WGLLM_MATMUL_TILE")
            }
            Family::TunedTile => {
                tuning.cpu_decode_tile = None;
                tuning.cpu_prompt_tile = None;
                tuning.matmul_tile = None;
            }
            Family::Portable => {
                return Err(GpuError::Validation(format!(
                    "{}: the portable kernels compute wrong products on {}, so no kernel can be trusted there; try another backend (--backend) or adapter (--device), or update the driver",
                    bad.describe(),
                    gpu.info.name
                )))
            }
        }
        log::warn!(
            "dropped the {fam:?} kernels on {}: {}; the {} kernels run instead",
            gpu.info.name,
            bad.describe(),
            match fam {
                Family::GpuShaped => "portable",
                Family::TunedTile => "default-tile",
                _ => "float",
            }
        );
        gpu = gpu.retuned(kernels, tuning);
    }
    Err(GpuError::Validation(
        "the kernel audit dropped every kernel family and still found a wrong product".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampled_rows_cover_ends_and_tile_edges() {
        let r = sample_rows(576);
        for want in [0, 1, 63, 64, 127, 128, 255, 256, 288, 511, 512, 574, 575] {
            assert!(r.contains(&want), "{want}: {r:?}");
        }
        assert!(r.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(sample_rows(1), vec![0]);
    }

    /// One row wrong among many fails the row error that an error over the whole output
    /// would average away; rounding-sized differences pass.
    #[test]
    fn one_wrong_row_fails_the_row_bound() {
        let (n_rows, n_tok) = (2000usize, 5u32);
        let want: Vec<f32> = activations(n_rows * n_tok as usize, 7);
        let at = |v: &[f32], r: usize, t: usize| v[t * n_rows + r];
        let rows: Vec<u32> = (0..n_rows as u32).collect();
        let mut close = want.clone();
        for v in close.iter_mut() {
            *v *= 1.0 + 1e-4;
        }
        let e = worst_row(
            &rows,
            n_tok,
            |r, t| at(&want, r, t),
            |r, t| at(&close, r, t),
        );
        assert!(e.0 < ROW_BOUND, "{e:?}");
        let mut one = want.clone();
        for t in 0..n_tok as usize {
            one[t * n_rows + 1234] = 0.0;
        }
        let e = worst_row(&rows, n_tok, |r, t| at(&want, r, t), |r, t| at(&one, r, t));
        assert!(e.0 > 10.0 * ROW_BOUND && e.1 == 1234, "{e:?}");
        // The whole-output error the tuner's check uses stays under its bound.
        assert!(crate::ops::nmse(&want, &one) < super::super::check::INT_DOT_BOUND);
        let mut nan = want.clone();
        nan[3] = f32::NAN;
        let e = worst_row(&rows, n_tok, |r, t| at(&want, r, t), |r, t| at(&nan, r, t));
        assert!(e.0.is_infinite());
    }
}
