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
//! timing; this one decides what may run.

mod attention;
mod experts;
mod products;

pub use attention::audit_attention;

use crate::gguf::GgufFile;
use crate::gpu::{Gpu, GpuError, GpuOptions, KernelShape, KernelTuning};
use crate::kv::KvChoice;
use crate::model::{Hparams, ModelWeights};
use crate::ops::kernels::Products;
use crate::ops::{moe, KernelKey};
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

/// The worst row error of `got` against `want` over `rows` (labels for the report): each
/// row's root mean square difference over its values (`n_vals(i)` of row i: the tokens,
/// or the pairs that chose an expert), over the root mean square of all of `want`'s
/// values.
fn worst_row(
    rows: &[u32],
    n_vals: impl Fn(usize) -> usize,
    want: impl Fn(usize, usize) -> f32,
    got: impl Fn(usize, usize) -> f32,
) -> (f64, u32) {
    let (mut sum, mut count) = (0f64, 0usize);
    for i in 0..rows.len() {
        for t in 0..n_vals(i) {
            let w = want(i, t) as f64;
            sum += w * w;
            count += 1;
        }
    }
    let rms = (sum / count.max(1) as f64).sqrt().max(f64::MIN_POSITIVE);
    let mut worst = (0f64, rows.first().copied().unwrap_or(0));
    for (i, &r) in rows.iter().enumerate() {
        let n = n_vals(i);
        if n == 0 {
            continue;
        }
        let d: f64 = (0..n)
            .map(|t| (got(i, t) as f64 - want(i, t) as f64).powi(2))
            .sum::<f64>();
        let e = (d / n as f64).sqrt() / rms;
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

/// A product's check as a row of the audit, logged: `what` names the weight (and how it
/// was multiplied), `cpu_checked` whether the CPU's rows were there to compare with.
#[allow(clippy::too_many_arguments)]
fn product_row(
    gpu: &Gpu,
    key: KernelKey,
    weight: &str,
    what: &str,
    n_tok: u32,
    (vs_cpu, vs_portable): ((f64, u32), Option<(f64, u32)>),
    cpu_checked: bool,
    started: web_time::Instant,
) -> AuditRow {
    if !cpu_checked {
        log::debug!(
            "kernel audit: {weight} is not the file's; {key} compared with the portable kernels only"
        );
    }
    log::debug!(
        "kernel audit: {key} on {what} at {n_tok} tokens: row error {:.1e} against the CPU, {} against the portable kernels ({:.0} ms)",
        vs_cpu.0,
        vs_portable.map_or("-".into(), |p| format!("{:.1e}", p.0)),
        started.elapsed().as_secs_f64() * 1e3
    );
    AuditRow {
        kernel: key.to_string(),
        family: family(&key, &gpu.tuning),
        weight: weight.to_string(),
        n_tok,
        vs_cpu,
        vs_portable,
        bound: ROW_BOUND,
    }
}

/// The part of a model one device holds: its layers, and whether the output head (and
/// a classifier's) too. A model on one device is [`Part::whole`].
#[derive(Clone, Debug)]
pub struct Part {
    /// Whether each layer is here, by index.
    pub layers: Vec<bool>,
    pub head: bool,
}

impl Part {
    pub fn whole() -> Part {
        Part {
            layers: Vec::new(),
            head: true,
        }
    }

    /// Device `d`'s part of `placement` (the main one holds the head).
    pub fn of(placement: &crate::gpu::Placement, d: usize) -> Part {
        Part {
            layers: (0..placement.n_layer())
                .map(|il| placement.layer_device(il) == d)
                .collect(),
            head: placement.main_index() == d,
        }
    }

    fn is_whole(&self) -> bool {
        self.layers.is_empty() && self.head
    }

    /// Whether a product of `layer` (None: a head) runs here.
    fn holds(&self, layer: Option<usize>) -> bool {
        match layer {
            _ if self.is_whole() => true,
            Some(il) => self.layers.get(il).copied().unwrap_or(false),
            None => self.head,
        }
    }

    /// Whether any layer (and so an attention) runs here.
    fn has_layers(&self) -> bool {
        self.is_whole() || self.layers.iter().any(|&h| h)
    }
}

/// Checks every kernel the graph will dispatch for `weights` on `gpu` (its kernel choice
/// as it stands), each kernel once, on the first product that takes it: the dense
/// products ([`products`]) and the experts' ([`experts`]).
pub fn audit(
    gpu: &Gpu,
    f: &GgufFile,
    hp: &Hparams,
    weights: &ModelWeights,
) -> Result<Vec<AuditRow>, GpuError> {
    audit_part(gpu, f, hp, weights, &Part::whole())
}

/// [`audit`] over the products of one device's `part` of a split model.
pub fn audit_part(
    gpu: &Gpu,
    f: &GgufFile,
    hp: &Hparams,
    weights: &ModelWeights,
    part: &Part,
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
    // The scratch buffers are dropped by the end: no budget counts them.
    let mark = gpu.allocated_bytes();
    let mut out = products::audit_products(gpu, &portable, f, hp, weights, part, &mut seen)?;
    out.extend(experts::audit_experts(
        gpu, &portable, f, weights, part, &mut seen,
    )?);
    gpu.check()?;
    gpu.uncount_since(mark);
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
        k if k.product_instructions() == Products::IntegerDot => Family::IntegerDot,
        k if k.product_instructions() == Products::Matrix => Family::CoopMatrix,
        // The one kernel of a decoded token's expert products, on every adapter.
        KernelKey::Moe(moe::Kernel::Pairs { .. }) => Family::Portable,
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
/// family they asked for that fails refuses the load, with the reason. `kv`: the cache a
/// context would get on the device as it stands, whose attention is checked too.
pub fn settle(
    gpu: Arc<Gpu>,
    asked: &GpuOptions,
    f: &GgufFile,
    hp: &Hparams,
    weights: &ModelWeights,
    kv: &dyn Fn(&Gpu) -> Option<KvChoice>,
) -> Result<Arc<Gpu>, GpuError> {
    settle_part(gpu, asked, f, hp, weights, &Part::whole(), kv)
}

/// [`settle`] for one device's `part` of a split model: its layers' products and
/// attention, and the heads where it holds them.
pub fn settle_part(
    gpu: Arc<Gpu>,
    asked: &GpuOptions,
    f: &GgufFile,
    hp: &Hparams,
    weights: &ModelWeights,
    part: &Part,
    kv: &dyn Fn(&Gpu) -> Option<KvChoice>,
) -> Result<Arc<Gpu>, GpuError> {
    let mut gpu = gpu;
    let sinks = weights.layers.iter().any(|l| l.attn_sinks.is_some());
    // Each round drops at least one family; four families can be dropped.
    for _ in 0..5 {
        let mut rows = audit_part(&gpu, f, hp, weights, part)?;
        if let Some(kv) = kv(&gpu).filter(|_| part.has_layers()) {
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
                "{} on {}; it was asked for ({flag}) and cannot run there: drop it to let wgllm choose kernels that match on that device",
                bad.describe(),
                gpu.info.name
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
    use super::products::sample_rows;
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
            |_| n_tok as usize,
            |r, t| at(&want, r, t),
            |r, t| at(&close, r, t),
        );
        assert!(e.0 < ROW_BOUND, "{e:?}");
        let mut one = want.clone();
        for t in 0..n_tok as usize {
            one[t * n_rows + 1234] = 0.0;
        }
        let e = worst_row(
            &rows,
            |_| n_tok as usize,
            |r, t| at(&want, r, t),
            |r, t| at(&one, r, t),
        );
        assert!(e.0 > 10.0 * ROW_BOUND && e.1 == 1234, "{e:?}");
        // The whole-output error the tuner's check uses stays under its bound.
        assert!(crate::ops::nmse(&want, &one) < super::super::check::INT_DOT_BOUND);
        let mut nan = want.clone();
        nan[3] = f32::NAN;
        let e = worst_row(
            &rows,
            |_| n_tok as usize,
            |r, t| at(&want, r, t),
            |r, t| at(&nan, r, t),
        );
        assert!(e.0.is_infinite());
    }
}
