//! Random LoRA adapters for a base GGUF, in the layout llama.cpp's
//! `convert_lora_to_gguf.py` writes (`general.type` adapter, `adapter.type` lora,
//! `adapter.lora.alpha`, `<base tensor>.lora_a` [n_in, r] and `.lora_b` [r, n_out]), so
//! that llama.cpp and wgllm can be compared on the same adapter without a trained one.

use super::synth::Rng;
use crate::gguf::{GgmlType, GgufFile, GgufWriter, Value};
use crate::quant;

/// What to write.
#[derive(Clone, Debug)]
pub struct LoraSynth {
    pub rank: u32,
    /// `adapter.lora.alpha` (applied as alpha / rank).
    pub alpha: f32,
    /// The halves' type: f32, f16 or q8_0 (convert_lora_to_gguf's choices besides bf16).
    pub ty: GgmlType,
    /// How large the correction is against a unit input: its outputs' spread at scale 1
    /// is about this times the input's root mean square.
    pub strength: f32,
    pub seed: u64,
    /// Adapt the token embedding too (llama.cpp's flipped layout: A [r, n_vocab], B [r,
    /// n_embd]). llama.cpp applies such a pair to a tied output head as well, where its
    /// shapes do not fit, so only models with their own `output.weight` should take it.
    pub embedding: bool,
}

/// The projections a LoRA fine-tune usually adapts (PEFT's q/k/v/o and gate/up/down
/// modules), plus the output head.
const LAYER_TENSORS: &[&str] = &[
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_qkv",
    "attn_output",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
];

fn adapted(name: &str) -> bool {
    if name == "output.weight" {
        return true;
    }
    let Some(rest) = name.strip_prefix("blk.") else {
        return false;
    };
    let Some((layer, tensor)) = rest.split_once('.') else {
        return false;
    };
    layer.parse::<u32>().is_ok()
        && tensor
            .strip_suffix(".weight")
            .is_some_and(|t| LAYER_TENSORS.contains(&t))
}

/// `rows` rows of `n` values of spread `std`, encoded as `ty`.
fn values(rng: &mut Rng, ty: GgmlType, n: usize, rows: usize, std: f32) -> Vec<u8> {
    // normalish() spreads as sqrt(1/3).
    let k = std * 3f32.sqrt();
    let v: Vec<f32> = (0..n * rows).map(|_| rng.normalish() * k).collect();
    match ty {
        GgmlType::F32 => bytemuck::cast_slice(&v).to_vec(),
        _ => v
            .chunks(n)
            .flat_map(|row| quant::quantize_row(ty, row))
            .collect(),
    }
}

/// The adapter for `base`, or why it cannot be written.
pub fn synth_lora(base: &GgufFile, p: &LoraSynth) -> Result<GgufWriter, String> {
    if !matches!(p.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::Q8_0) {
        return Err(format!("adapter type {}: choose f32, f16 or q8_0", p.ty));
    }
    let bs = p.ty.block_size() as u32;
    if p.rank == 0 || !p.rank.is_multiple_of(bs) {
        return Err(format!(
            "rank {}: B's rows are the rank long, and {} stores rows in blocks of {bs}",
            p.rank, p.ty
        ));
    }
    if !(p.alpha.is_finite() && p.strength.is_finite()) {
        return Err("alpha and strength must be finite numbers".into());
    }
    let arch = base.architecture().map_err(|e| e.to_string())?.to_string();
    let mut w = GgufWriter::new();
    w.meta("general.architecture", Value::String(arch))
        .meta("general.type", Value::String("adapter".into()))
        .meta("general.name", Value::String("synthetic LoRA".into()))
        .meta("adapter.type", Value::String("lora".into()))
        .meta("adapter.lora.alpha", Value::F32(p.alpha));
    let r = p.rank as usize;
    // Applied as alpha / r times B A x: A x spreads as the input does (A's spread is
    // 1 / sqrt(n_in)), B's rows of r sum that up, so B's spread is chosen to make the
    // whole about `strength` times the input.
    let applied = if p.alpha == 0.0 {
        1.0
    } else {
        p.alpha / r as f32
    };
    let b_std = p.strength / (applied * (r as f32).sqrt());
    let mut rng = Rng(p.seed.wrapping_mul(0x9e3779b97f4a7c15) | 1);
    if p.embedding && base.tensor("output.weight").is_none() {
        return Err(format!(
            "{}: the model's output head is its token embedding (tied), and an embedding pair cannot apply to the head; leave out --lora-embedding",
            base.path
        ));
    }
    let phi3_fused = base.tensor("blk.0.ffn_gate.weight").is_none();
    let mut n_pairs = 0;
    for t in &base.tensors {
        // Phi-3's fused gate/up tensor is not adapted (see `model::lora`).
        if phi3_fused && t.name.ends_with(".ffn_up.weight") {
            continue;
        }
        let embedding = p.embedding && t.name == "token_embd.weight";
        if t.dims.len() != 2 || !(adapted(&t.name) || embedding) {
            continue;
        }
        let (n_in, n_out) = (t.dims[0], t.dims[1]);
        let a_name = format!("{}.lora_a", t.name);
        let b_name = format!("{}.lora_b", t.name);
        if embedding {
            // Rows of A are looked up by token: each a unit-spread r-vector.
            let a = values(&mut rng, p.ty, r, n_out as usize, 1.0);
            let b = values(&mut rng, p.ty, r, n_in as usize, b_std);
            w.tensor(&a_name, &[r as u64, n_out], p.ty, a);
            w.tensor(&b_name, &[r as u64, n_in], p.ty, b);
        } else {
            if !n_in.is_multiple_of(bs as u64) {
                return Err(format!(
                    "{}: rows of {n_in} are not whole {} blocks",
                    t.name, p.ty
                ));
            }
            let a_std = 1.0 / (n_in as f32).sqrt();
            let a = values(&mut rng, p.ty, n_in as usize, r, a_std);
            let b = values(&mut rng, p.ty, r, n_out as usize, b_std);
            w.tensor(&a_name, &[n_in, r as u64], p.ty, a);
            w.tensor(&b_name, &[r as u64, n_out], p.ty, b);
        }
        n_pairs += 1;
    }
    if n_pairs == 0 {
        return Err(format!(
            "{}: no tensor to adapt (attention and feed-forward projections, the output head)",
            base.path
        ));
    }
    Ok(w)
}
