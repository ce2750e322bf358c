//! Mamba and Mamba-2 files.

use super::{draw_values, random_tensor, row_type, Rng, SynthArch, SynthShape, WeightScale};
use crate::gguf::{GgmlType, GgufWriter, Value};
use crate::quant::quantize_row;

/// A Mamba or Mamba-2 model, laid out as llama.cpp's converter writes one (A as -exp of
/// its log, 2-D A and D for Mamba-2); the shape's head counts and feed-forward are unused.
/// Matrices take `ty` where their rows are whole blocks (dt's low-rank projection stays
/// f32), the convolution, A, D and the biases are f32.
pub(super) fn synth(
    arch: SynthArch,
    shape: SynthShape,
    ty: GgmlType,
    vocab: Vec<(String, Value)>,
    n_vocab: u64,
    scale: WeightScale,
    vocab_only: bool,
) -> GgufWriter {
    let (e, n_layer) = (shape.n_embd, shape.n_layer);
    let mamba2 = arch == SynthArch::Mamba2;
    let name = arch.gguf_arch();
    let key = |k: &str| format!("{name}.{k}");
    let (d_conv, d_inner) = (4u32, 2 * e);
    let d_state = if mamba2 { 64 } else { 16 };
    let n_group = 2u32;
    // Mamba: dt's rank ceil(n_embd / 16); Mamba-2: the heads, 64 channels each (fewer
    // where the inner size is too narrow for one head per group).
    let dt_rank = if mamba2 {
        d_inner / 64.min(d_inner / n_group)
    } else {
        e.div_ceil(16)
    };
    let u = Value::U32;
    let mut w = GgufWriter::new();
    w.meta("general.architecture", Value::String(name.into()))
        .meta(
            "general.name",
            Value::String(format!("synthetic {name} {e}x{n_layer} {ty}")),
        )
        .meta(&key("context_length"), u(1 << 20))
        .meta(&key("embedding_length"), u(e))
        .meta(&key("feed_forward_length"), u(0))
        .meta(&key("attention.head_count"), u(0))
        .meta(&key("block_count"), u(n_layer))
        .meta(&key("ssm.conv_kernel"), u(d_conv))
        .meta(&key("ssm.inner_size"), u(d_inner))
        .meta(&key("ssm.state_size"), u(d_state))
        .meta(&key("ssm.time_step_rank"), u(dt_rank))
        .meta(&key("attention.layer_norm_rms_epsilon"), Value::F32(1e-5));
    if mamba2 {
        w.meta(&key("ssm.group_count"), u(n_group));
    } else {
        w.meta(&key("ssm.dt_b_c_rms"), Value::Bool(false));
    }
    for (k, v) in vocab {
        w.meta(&k, v);
    }
    if vocab_only {
        return w;
    }
    let f32s = |v: &[f32]| quantize_row(GgmlType::F32, v);
    let fixed = matches!(scale, WeightScale::Fixed(_));
    let mut rng = Rng(0x5eed);
    let mut draw =
        |n: u64, center: f32, spread: f32| draw_values(&mut rng, fixed, n, center, spread);
    let mut mseed = 1u64;
    // `gain` scales a matrix past its fan-in (the output projections: the layers must
    // outweigh the embeddings in the residual stream for the state to show).
    let mut mat =
        |w: &mut GgufWriter, name: &str, cols: u64, rows: u64, embedding: bool, gain: f32| {
            mseed += 1;
            let std = match scale {
                WeightScale::Fixed(s) => s,
                WeightScale::FanIn if embedding => 3f32.sqrt(),
                WeightScale::FanIn => gain * 3f32.sqrt() / (cols as f32).sqrt(),
            };
            let t = row_type(ty, cols);
            let data = random_tensor(t, cols as usize, rows as usize, std, mseed);
            w.tensor(name, &[cols, rows], t, data);
        };
    let (e, di, ds, dr) = (e as u64, d_inner as u64, d_state as u64, dt_rank as u64);
    mat(&mut w, "token_embd.weight", e, n_vocab, true, 1.0);
    w.tensor(
        "output_norm.weight",
        &[e],
        GgmlType::F32,
        f32s(&draw(e, 1.0, 0.1)),
    );
    mat(&mut w, "output.weight", e, n_vocab, false, 1.0);
    let ng = n_group as u64;
    let ch = if mamba2 { di + 2 * ng * ds } else { di };
    for i in 0..n_layer {
        let b = |t: &str| format!("blk.{i}.{t}.weight");
        let bias = |t: &str| format!("blk.{i}.{t}.bias");
        let plain = |t: &str| format!("blk.{i}.{t}");
        w.tensor(
            &b("attn_norm"),
            &[e],
            GgmlType::F32,
            f32s(&draw(e, 1.0, 0.1)),
        );
        let in_rows = if mamba2 {
            2 * di + 2 * ng * ds + dr
        } else {
            2 * di
        };
        mat(&mut w, &b("ssm_in"), e, in_rows, false, 1.0);
        let conv = draw(d_conv as u64 * ch, 0.0, 0.5);
        w.tensor(
            &b("ssm_conv1d"),
            &[d_conv as u64, ch],
            GgmlType::F32,
            f32s(&conv),
        );
        w.tensor(
            &bias("ssm_conv1d"),
            &[ch],
            GgmlType::F32,
            f32s(&draw(ch, 0.0, 0.1)),
        );
        // dt = softplus(. + bias) around 0.3 (trained models start between 0.001 and 0.1;
        // larger steps make the state matter in a two-layer random model, so that a
        // wrong state update shows in its perplexity).
        let dt_b: Vec<f32> = draw(if mamba2 { dr } else { di }, -1.0, 0.5);
        if mamba2 {
            w.tensor(&bias("ssm_dt"), &[dr], GgmlType::F32, f32s(&dt_b));
            // A = -exp(A_log), A_log ~ log(uniform 1..16): one per head.
            let a: Vec<f32> = draw(dr, 0.0, 1.0)
                .iter()
                .map(|v| -(1.0 + 7.5 * (1.0 + v.clamp(-1.0, 1.0))))
                .collect();
            w.tensor(&plain("ssm_a"), &[1, dr], GgmlType::F32, f32s(&a));
            w.tensor(
                &plain("ssm_d"),
                &[1, dr],
                GgmlType::F32,
                f32s(&draw(dr, 0.0, 0.2)),
            );
            let g = di / ng;
            w.tensor(
                &b("ssm_norm"),
                &[g, ng],
                GgmlType::F32,
                f32s(&draw(di, 1.0, 0.1)),
            );
        } else {
            mat(&mut w, &b("ssm_x"), di, dr + 2 * ds, false, 1.0);
            mat(&mut w, &b("ssm_dt"), dr, di, false, 1.0);
            w.tensor(&bias("ssm_dt"), &[di], GgmlType::F32, f32s(&dt_b));
            // S4D-real: A[n] = -(n + 1) for every channel.
            let a: Vec<f32> = (0..di * ds).map(|k| -((k % ds) as f32 + 1.0)).collect();
            w.tensor(&plain("ssm_a"), &[ds, di], GgmlType::F32, f32s(&a));
            w.tensor(
                &plain("ssm_d"),
                &[di],
                GgmlType::F32,
                f32s(&draw(di, 0.0, 0.2)),
            );
        }
        mat(&mut w, &b("ssm_out"), di, e, false, 4.0);
    }
    w
}
