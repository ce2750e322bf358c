//! The attention under the audit: the path the graph runs for the context's cache (its
//! K and V types, flash or not, the rotation of a quantized cache) with the model's
//! heads, scale, soft-cap and sinks, against the CPU's attention over the cache's values.

use super::{worst_row, AuditRow, Family, AUDIT_TOKENS, ROW_BOUND};
use crate::gpu::{Gpu, GpuError, KernelShape};
use crate::kv::KvChoice;
use crate::model::Hparams;
use crate::ops::attention::{
    attention_sinks_ref, attention_with, AttnShape, AttnViews, FlashKernel,
};
use crate::ops::softmax::SoftmaxParams;
use crate::ops::{run_now, View};

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
    // The scratch buffers are dropped by the end: no budget counts them.
    let mark = gpu.allocated_bytes();
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
        let mask = crate::tune::attn_run::causal_mask(n_tok, n_kv);
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
        let vs_cpu = worst_row(&rows, |_| h, |i, j| want[i * h + j], |i, j| got[i * h + j]);
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
    gpu.uncount_since(mark);
    Ok(out)
}
