//! Vision encoders (mmproj files) with random weights, in the layout llama.cpp's
//! converter writes them, for checking wgllm's encoder against llama.cpp's on files small
//! enough for a test: `wgllm synth --mmproj-for MODEL --projector gemma3|idefics3`.

use super::Rng;
use crate::gguf::{GgmlType, GgufWriter, Value};
use crate::quant::quantize_row;

/// A vision encoder's dimensions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MmprojShape {
    pub image_size: u32,
    pub patch_size: u32,
    pub n_embd: u32,
    pub n_ff: u32,
    pub n_layer: u32,
    pub n_head: u32,
    /// The projector's pooling or shuffling cell (Gemma 3: 4).
    pub merge: u32,
    /// The longest side an image is resized to before tiling (idefics3; 0 for gemma3).
    pub longest_edge: u32,
}

impl MmprojShape {
    /// SigLIP's geometry shrunk: 224 pixels in patches of 14 (16 x 16 patches, pooled to
    /// 4 x 4 tokens), a width of 64 in 4 heads, and a feed-forward of 136, which is not
    /// whole blocks of 32 (as SigLIP's 4304 is not).
    pub fn tiny() -> Self {
        MmprojShape {
            image_size: 224,
            patch_size: 14,
            n_embd: 64,
            n_ff: 136,
            n_layer: 2,
            n_head: 4,
            merge: 4,
            longest_edge: 0,
        }
    }

    /// SmolVLM's geometry shrunk: tiles of 96 pixels in patches of 16 (6 x 6 patches,
    /// shuffled by cells of 2 into 3 x 3 tokens), images resized to 288 pixels on their
    /// long side (up to 3 x 3 tiles and the global view); the tiny width and feed-forward.
    pub fn tiny_idefics3() -> Self {
        MmprojShape {
            image_size: 96,
            patch_size: 16,
            merge: 2,
            longest_edge: 288,
            ..Self::tiny()
        }
    }

    /// Qwen2.5-VL's geometry shrunk: patches of 14 merged by cells of 2 (images of any
    /// size, in multiples of 28 pixels), windows of 112 pixels (4 x 4 cells), heads of 16
    /// (four rotary sections of 2 pairs); `image_size` only names the warm-up's size.
    pub fn tiny_qwen25vl() -> Self {
        MmprojShape {
            merge: 2,
            ..Self::tiny()
        }
    }
}

/// The projectors [`synth_mmproj`] writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SynthProjector {
    Gemma3,
    Idefics3,
    /// Qwen2.5-VL's `qwen2.5vl_merger`, with window attention in every layer but each
    /// second (`n_wa_pattern` 2).
    Qwen25vl,
}

/// A Gemma 3 mmproj whose projection gives `n_out`-wide embeddings (see [`synth_mmproj`]).
pub fn synth_mmproj_gemma3(shape: MmprojShape, n_out: u32, ty: GgmlType) -> GgufWriter {
    synth_mmproj(SynthProjector::Gemma3, shape, n_out, ty)
}

/// An mmproj of `projector`'s layout whose projection gives `n_out`-wide embeddings (the
/// language model's width), matrices in `ty` (f32, or f16 as the converter writes),
/// vectors in f32; the weights scaled by their fan-in so that every tensor shows in the
/// output.
pub fn synth_mmproj(
    projector: SynthProjector,
    shape: MmprojShape,
    n_out: u32,
    ty: GgmlType,
) -> GgufWriter {
    let MmprojShape {
        image_size,
        patch_size: p,
        n_embd: e,
        n_ff: ff,
        n_layer,
        n_head,
        merge,
        longest_edge,
    } = shape;
    let name = match projector {
        SynthProjector::Gemma3 => "gemma3",
        SynthProjector::Idefics3 => "idefics3",
        SynthProjector::Qwen25vl => "qwen2.5vl_merger",
    };
    let qwen = projector == SynthProjector::Qwen25vl;
    let u = Value::U32;
    let f32s = |v: &[f32]| Value::Array(v.iter().map(|&x| Value::F32(x)).collect());
    let mut w = GgufWriter::new();
    w.meta("general.architecture", Value::String("clip".into()))
        .meta(
            "general.name",
            Value::String(format!("synthetic {name} mmproj {e}x{n_layer}")),
        )
        .meta("clip.has_vision_encoder", Value::Bool(true))
        .meta("clip.projector_type", Value::String(name.into()))
        .meta(
            match qwen {
                true => "clip.use_silu",
                false => "clip.use_gelu",
            },
            Value::Bool(true),
        )
        .meta("clip.vision.image_size", u(image_size))
        .meta("clip.vision.patch_size", u(p))
        .meta("clip.vision.embedding_length", u(e))
        .meta("clip.vision.feed_forward_length", u(ff))
        .meta("clip.vision.block_count", u(n_layer))
        .meta("clip.vision.attention.head_count", u(n_head))
        .meta("clip.vision.attention.layer_norm_epsilon", Value::F32(1e-6))
        .meta("clip.vision.projection_dim", u(n_out))
        .meta("clip.vision.image_mean", f32s(&[0.5, 0.5, 0.5]))
        .meta("clip.vision.image_std", f32s(&[0.5, 0.5, 0.5]));
    if qwen {
        w.meta("clip.vision.n_wa_pattern", u(2));
    } else if merge != 4 || projector == SynthProjector::Idefics3 {
        w.meta("clip.vision.projector.scale_factor", u(merge));
    }
    if projector == SynthProjector::Idefics3 {
        w.meta("clip.vision.preproc_image_size", u(longest_edge));
    }
    let mut rng = Rng(0x5191);
    let mut vector = |w: &mut GgufWriter, name: &str, n: u32, center: f32, spread: f32| {
        let v: Vec<f32> = (0..n).map(|_| center + spread * rng.normalish()).collect();
        w.tensor(
            name,
            &[n as u64],
            GgmlType::F32,
            quantize_row(GgmlType::F32, &v),
        );
    };
    let mut seed = 0x1e5u64;
    let mut matrix = |w: &mut GgufWriter, name: &str, dims: &[u64], fan_in: u64, ty: GgmlType| {
        seed += 1;
        let cols = dims[0] as usize;
        let rows = (dims.iter().product::<u64>() / dims[0]) as usize;
        // Uniform-ish of deviation 1/sqrt(fan-in) (normalish's deviation is 1/sqrt(3)).
        // One generator in row order: the same bytes on any number of cores.
        let std = 3f32.sqrt() / (fan_in as f32).sqrt();
        let mut rng = Rng(seed.wrapping_mul(0x9e3779b97f4a7c15));
        let mut data = Vec::new();
        for _ in 0..rows {
            let row: Vec<f32> = (0..cols).map(|_| rng.normalish() * std).collect();
            data.extend(quantize_row(ty, &row));
        }
        w.tensor(name, dims, ty, data);
    };
    let n_patch = (image_size / p) as u64 * (image_size / p) as u64;
    let (e64, ff64) = (e as u64, ff as u64);
    let kernel = [p as u64, p as u64, 3, e64];
    matrix(
        &mut w,
        "v.patch_embd.weight",
        &kernel,
        3 * (p * p) as u64,
        GgmlType::F32,
    );
    if qwen {
        // The converter splits the temporal pair of the 3D kernel in two; no bias and no
        // position embeddings (positions rotate).
        matrix(
            &mut w,
            "v.patch_embd.weight.1",
            &kernel,
            3 * (p * p) as u64,
            GgmlType::F32,
        );
    } else {
        vector(&mut w, "v.patch_embd.bias", e, 0.0, 0.2);
        // Position embeddings as large as the patches' (as trained ones are).
        matrix(
            &mut w,
            "v.position_embd.weight",
            &[e64, n_patch],
            1,
            GgmlType::F32,
        );
    }
    for il in 0..n_layer {
        let n = |s: &str| format!("v.blk.{il}.{s}");
        // Qwen2.5-VL's norms are RMS norms: a weight, no bias.
        vector(&mut w, &n("ln1.weight"), e, 1.0, 0.2);
        if !qwen {
            vector(&mut w, &n("ln1.bias"), e, 0.0, 0.2);
        }
        for t in ["attn_q", "attn_k", "attn_v", "attn_out"] {
            matrix(&mut w, &n(&format!("{t}.weight")), &[e64, e64], e64, ty);
            vector(&mut w, &n(&format!("{t}.bias")), e, 0.0, 0.2);
        }
        vector(&mut w, &n("ln2.weight"), e, 1.0, 0.2);
        if !qwen {
            vector(&mut w, &n("ln2.bias"), e, 0.0, 0.2);
        }
        if qwen {
            matrix(&mut w, &n("ffn_gate.weight"), &[e64, ff64], e64, ty);
            vector(&mut w, &n("ffn_gate.bias"), ff, 0.0, 0.2);
        }
        matrix(&mut w, &n("ffn_up.weight"), &[e64, ff64], e64, ty);
        vector(&mut w, &n("ffn_up.bias"), ff, 0.0, 0.2);
        matrix(&mut w, &n("ffn_down.weight"), &[ff64, e64], ff64, ty);
        vector(&mut w, &n("ffn_down.bias"), e, 0.0, 0.2);
    }
    vector(&mut w, "v.post_ln.weight", e, 1.0, 0.2);
    if !qwen {
        vector(&mut w, "v.post_ln.bias", e, 0.0, 0.2);
    }
    match projector {
        SynthProjector::Gemma3 => {
            // The converter has already added Gemma's 1 to this weight.
            vector(&mut w, "mm.soft_emb_norm.weight", e, 1.0, 0.2);
            matrix(
                &mut w,
                "mm.input_projection.weight",
                &[n_out as u64, e64],
                e64,
                ty,
            );
        }
        SynthProjector::Idefics3 => {
            let n_in = e64 * (merge * merge) as u64;
            matrix(
                &mut w,
                "mm.model.fc.weight",
                &[n_in, n_out as u64],
                n_in,
                ty,
            );
        }
        SynthProjector::Qwen25vl => {
            let n_in = e64 * 4;
            matrix(&mut w, "mm.0.weight", &[n_in, n_in], n_in, ty);
            vector(&mut w, "mm.0.bias", n_in as u32, 0.0, 0.2);
            matrix(&mut w, "mm.2.weight", &[n_in, n_out as u64], n_in, ty);
            vector(&mut w, "mm.2.bias", n_out, 0.0, 0.2);
        }
    }
    w
}
