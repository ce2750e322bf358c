//! Llama-shaped GGUF files with random weights: benchmark subjects at sizes we cannot
//! download (7B shapes), and fuzz seeds. The vocabulary is copied from a real GGUF so
//! that llama.cpp and wgllm both load the result as they would a real model.

use crate::gguf::quant::quantize_row;
use crate::gguf::{GgmlType, GgufFile, GgufWriter, Value};

/// Model dimensions of a synthetic llama.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SynthShape {
    pub n_embd: u32,
    pub n_layer: u32,
    pub n_ff: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
}

impl SynthShape {
    /// Named shapes of well-known llama models.
    pub fn preset(name: &str) -> Option<Self> {
        let s = |n_embd, n_layer, n_ff, n_head, n_head_kv| SynthShape {
            n_embd,
            n_layer,
            n_ff,
            n_head,
            n_head_kv,
        };
        Some(match name {
            "135m" => s(576, 30, 1536, 9, 3),   // SmolLM2-135M
            "1b" => s(2048, 16, 8192, 32, 8),   // Llama-3.2-1B
            "7b" => s(4096, 32, 11008, 32, 32), // Llama-2-7B
            _ => return None,
        })
    }
    pub const PRESETS: &'static str = "135m, 1b, 7b";
}

/// Metadata keys of `src` that make up its tokenizer.
pub fn vocab_metadata(src: &GgufFile) -> Vec<(String, Value)> {
    src.metadata
        .iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// A tiny deterministic generator; weights only need to be plausible, not good.
struct Rng(u64);
impl Rng {
    fn normalish(&mut self) -> f32 {
        // Sum of four uniforms: close enough to a normal for weights.
        let mut acc = 0.0;
        for _ in 0..4 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            acc += (self.0 >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
        }
        acc
    }
}

/// `rows` rows of `n` random values (scale `std`), quantized to `ty`, on all cores.
fn random_tensor(ty: GgmlType, n: usize, rows: usize, std: f32, seed: u64) -> Vec<u8> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = rows.div_ceil(threads).max(1);
    let parts: Vec<Vec<u8>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..rows)
            .step_by(per)
            .map(|r0| {
                s.spawn(move || {
                    let mut rng = Rng(seed ^ (r0 as u64).wrapping_mul(0x9e3779b97f4a7c15));
                    let mut out = Vec::new();
                    let mut row = vec![0f32; n];
                    for _ in r0..(r0 + per).min(rows) {
                        row.iter_mut().for_each(|v| *v = rng.normalish() * std);
                        out.extend(quantize_row(ty, &row));
                    }
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    parts.concat()
}

/// A llama-architecture model with random weights (see the module docs).
pub fn synth_llama(
    shape: SynthShape,
    ty: GgmlType,
    vocab: Vec<(String, Value)>,
    n_vocab: u64,
    std: f32,
    vocab_only: bool,
) -> GgufWriter {
    synth(shape, ty, vocab, n_vocab, std, vocab_only, None)
}

/// A gemma3-architecture model with random weights: sliding window `window` on five of
/// every six layers, per-head Q/K norms, sandwich norms, the output tied to the
/// embeddings. For testing the sliding-window cache on shapes that decode in
/// milliseconds.
pub fn synth_gemma3(
    shape: SynthShape,
    ty: GgmlType,
    vocab: Vec<(String, Value)>,
    n_vocab: u64,
    std: f32,
    window: u32,
) -> GgufWriter {
    synth(shape, ty, vocab, n_vocab, std, false, Some(window))
}

fn synth(
    shape: SynthShape,
    ty: GgmlType,
    vocab: Vec<(String, Value)>,
    n_vocab: u64,
    std: f32,
    vocab_only: bool,
    gemma_window: Option<u32>,
) -> GgufWriter {
    let SynthShape {
        n_embd,
        n_layer,
        n_ff,
        n_head,
        n_head_kv,
    } = shape;
    let arch = if gemma_window.is_some() {
        "gemma3"
    } else {
        "llama"
    };
    let key = |k: &str| format!("{arch}.{k}");
    let mut w = GgufWriter::new();
    let u = Value::U32;
    w.meta("general.architecture", Value::String(arch.into()))
        .meta(
            "general.name",
            Value::String(format!("synthetic {arch} {n_embd}x{n_layer} {ty}")),
        )
        .meta(&key("context_length"), u(4096))
        .meta(&key("embedding_length"), u(n_embd))
        .meta(&key("block_count"), u(n_layer))
        .meta(&key("feed_forward_length"), u(n_ff))
        .meta(&key("attention.head_count"), u(n_head))
        .meta(&key("attention.head_count_kv"), u(n_head_kv))
        .meta(&key("attention.layer_norm_rms_epsilon"), Value::F32(1e-5))
        .meta(&key("rope.dimension_count"), u(n_embd / n_head));
    match gemma_window {
        // Gemma's global layers rotate with base 1e6 (the local ones with 1e4, fixed).
        Some(window) => w
            .meta(&key("rope.freq_base"), Value::F32(1_000_000.0))
            .meta(&key("attention.sliding_window"), u(window)),
        None => w.meta(&key("rope.freq_base"), Value::F32(10000.0)),
    };
    for (k, v) in vocab {
        w.meta(&k, v);
    }
    if vocab_only {
        return w;
    }
    let e = n_embd as u64;
    let hd = (n_embd / n_head) as u64;
    let kv = hd * n_head_kv as u64;
    let f = n_ff as u64;
    let ones = |n: u64| quantize_row(GgmlType::F32, &vec![1.0; n as usize]);
    let mut seed = 1u64;
    let mut mat = |w: &mut GgufWriter, name: &str, cols: u64, rows: u64| {
        seed += 1;
        let data = random_tensor(ty, cols as usize, rows as usize, std, seed);
        w.tensor(name, &[cols, rows], ty, data);
    };
    mat(&mut w, "token_embd.weight", e, n_vocab);
    w.tensor("output_norm.weight", &[e], GgmlType::F32, ones(e));
    if gemma_window.is_none() {
        mat(&mut w, "output.weight", e, n_vocab);
    }
    for i in 0..n_layer {
        let b = |t: &str| format!("blk.{i}.{t}.weight");
        w.tensor(&b("attn_norm"), &[e], GgmlType::F32, ones(e));
        mat(&mut w, &b("attn_q"), e, e);
        mat(&mut w, &b("attn_k"), e, kv);
        mat(&mut w, &b("attn_v"), e, kv);
        mat(&mut w, &b("attn_output"), e, e);
        w.tensor(&b("ffn_norm"), &[e], GgmlType::F32, ones(e));
        mat(&mut w, &b("ffn_gate"), e, f);
        mat(&mut w, &b("ffn_up"), e, f);
        mat(&mut w, &b("ffn_down"), f, e);
        if gemma_window.is_some() {
            w.tensor(&b("attn_q_norm"), &[hd], GgmlType::F32, ones(hd));
            w.tensor(&b("attn_k_norm"), &[hd], GgmlType::F32, ones(hd));
            w.tensor(&b("post_attention_norm"), &[e], GgmlType::F32, ones(e));
            w.tensor(&b("post_ffw_norm"), &[e], GgmlType::F32, ones(e));
        }
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_llama_parses_with_the_expected_shapes() {
        let shape = SynthShape {
            n_embd: 64,
            n_layer: 2,
            n_ff: 96,
            n_head: 4,
            n_head_kv: 2,
        };
        let vocab = vec![(
            "tokenizer.ggml.tokens".to_string(),
            Value::Array((0..100).map(|i| Value::String(format!("t{i}"))).collect()),
        )];
        let path = std::env::temp_dir().join(format!("wgllm-synth-{}.gguf", std::process::id()));
        synth_llama(shape, GgmlType::Q4_0, vocab, 100, 0.02, false)
            .write(&path)
            .unwrap();
        let f = GgufFile::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let hp = crate::model::Hparams::from_gguf(&f).unwrap();
        assert_eq!((hp.n_embd, hp.n_layer, hp.n_head_kv), (64, 2, 2));
        assert_eq!(f.tensors.len(), 3 + 9 * 2);
        let k = f.tensor("blk.1.attn_k.weight").unwrap();
        assert_eq!(k.dims, vec![64, 32]);
        assert_eq!(k.ty, GgmlType::Q4_0);
        // The weights are random but plausible: dequantized, they have the scale asked for.
        let q = f.tensor("blk.0.ffn_down.weight").unwrap();
        let mut row = vec![0f32; 96];
        crate::gguf::quant::dequantize_row(GgmlType::Q4_0, &f.tensor_data(q)[..3 * 18], &mut row);
        let rms = (row.iter().map(|v| v * v).sum::<f32>() / 96.0).sqrt();
        assert!((0.005..0.05).contains(&rms), "rms {rms}");
    }
}
