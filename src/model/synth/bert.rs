//! BERT encoders and rerankers (bge's layout).

use super::{draw_values, random_tensor, row_type, Rng, SynthShape, WeightScale};
use crate::gguf::{GgmlType, GgufWriter, Value};
use crate::quant::quantize_row;

/// Learned positions of a synthetic BERT (bge's).
const BERT_POSITIONS: u64 = 512;

/// A BERT encoder with random weights, tensors named and shaped as llama.cpp's converter
/// writes bge models. The vocabulary must be a WordPiece one with its token-type count
/// (llama.cpp refuses BERT without it), as llama.cpp's ggml-vocab-bert-bge.gguf. With
/// `rank`, a reranker: a classifier head and rank pooling.
pub(super) fn synth(
    shape: SynthShape,
    ty: GgmlType,
    vocab: Vec<(String, Value)>,
    n_vocab: u64,
    scale: WeightScale,
    vocab_only: bool,
    rank: bool,
) -> GgufWriter {
    let (e, n_layer, ff) = (shape.n_embd, shape.n_layer, shape.n_ff);
    let key = |k: &str| format!("bert.{k}");
    let u = Value::U32;
    let mut w = GgufWriter::new();
    w.meta("general.architecture", Value::String("bert".into()))
        .meta(
            "general.name",
            Value::String(format!("synthetic bert {e}x{n_layer} {ty}")),
        )
        .meta(&key("context_length"), u(BERT_POSITIONS as u32))
        .meta(&key("embedding_length"), u(e))
        .meta(&key("feed_forward_length"), u(ff))
        .meta(&key("block_count"), u(n_layer))
        .meta(&key("attention.head_count"), u(shape.n_head))
        .meta(&key("attention.layer_norm_epsilon"), Value::F32(1e-12))
        .meta(&key("attention.causal"), Value::Bool(false))
        // CLS, as bge declares; rank for a reranker.
        .meta(&key("pooling_type"), u(if rank { 4 } else { 2 }));
    let n_types = vocab
        .iter()
        .find(|(k, _)| k == "tokenizer.ggml.token_type_count")
        .and_then(|(_, v)| v.as_i64())
        .unwrap_or(2)
        .max(1) as u64;
    for (k, v) in vocab {
        w.meta(&k, v);
    }
    if vocab_only {
        return w;
    }
    let f32s = |v: &[f32]| quantize_row(GgmlType::F32, v);
    let fixed = matches!(scale, WeightScale::Fixed(_));
    let mut rng = Rng(0xbe27);
    let mut draw =
        |n: u64, center: f32, spread: f32| draw_values(&mut rng, fixed, n, center, spread);
    let mut mseed = 1u64;
    let mut mat = |w: &mut GgufWriter, name: &str, cols: u64, rows: u64, std_fanin: f32| {
        mseed += 1;
        let std = match scale {
            WeightScale::Fixed(s) => s,
            WeightScale::FanIn => std_fanin,
        };
        let t = row_type(ty, cols);
        let data = random_tensor(t, cols as usize, rows as usize, std, mseed);
        w.tensor(name, &[cols, rows], t, data);
    };
    let (e, ff) = (e as u64, ff as u64);
    let fan_in = |cols: u64| 3f32.sqrt() / (cols as f32).sqrt();
    mat(&mut w, "token_embd.weight", e, n_vocab, 1.0);
    // Positions and types are added to the tokens' rows: smaller, so each shows but none
    // drowns the tokens.
    let pos = draw(e * BERT_POSITIONS, 0.0, 0.3);
    w.tensor(
        "position_embd.weight",
        &[e, BERT_POSITIONS],
        GgmlType::F32,
        f32s(&pos),
    );
    let types = draw(e * n_types, 0.0, 0.3);
    w.tensor(
        "token_types.weight",
        &[e, n_types],
        GgmlType::F32,
        f32s(&types),
    );
    let mut norm = |w: &mut GgufWriter, name: &str| {
        let (nw, nb) = (draw(e, 1.0, 0.1), draw(e, 0.0, 0.1));
        w.tensor(&format!("{name}.weight"), &[e], GgmlType::F32, f32s(&nw));
        w.tensor(&format!("{name}.bias"), &[e], GgmlType::F32, f32s(&nb));
    };
    norm(&mut w, "token_embd_norm");
    for i in 0..n_layer {
        let n = |t: &str| format!("blk.{i}.{t}.weight");
        for t in ["attn_q", "attn_k", "attn_v", "attn_output"] {
            mat(&mut w, &n(t), e, e, fan_in(e));
        }
        mat(&mut w, &n("ffn_up"), e, ff, fan_in(e));
        mat(&mut w, &n("ffn_down"), ff, e, fan_in(ff));
        norm(&mut w, &format!("blk.{i}.attn_output_norm"));
        norm(&mut w, &format!("blk.{i}.layer_output_norm"));
    }
    // The biases after the matrices: their own draws, in a fixed order.
    let mut rng_b = Rng(0xb1a5);
    for i in 0..n_layer {
        let b = |t: &str| format!("blk.{i}.{t}.bias");
        for (t, len) in [
            ("attn_q", e),
            ("attn_k", e),
            ("attn_v", e),
            ("attn_output", e),
            ("ffn_up", ff),
            ("ffn_down", e),
        ] {
            let v: Vec<f32> = (0..len)
                .map(|_| {
                    if fixed {
                        0.0
                    } else {
                        0.1 * rng_b.normalish() * 3f32.sqrt()
                    }
                })
                .collect();
            w.tensor(&b(t), &[len], GgmlType::F32, f32s(&v));
        }
    }
    if rank {
        // Dense + tanh, then one score: the BERT classifier llama.cpp's rank pooling runs.
        mat(&mut w, "cls.weight", e, e, fan_in(e));
        mat(&mut w, "cls.output.weight", e, 1, fan_in(e));
        let v: Vec<f32> = (0..e + 1)
            .map(|_| {
                if fixed {
                    0.0
                } else {
                    0.1 * rng_b.normalish() * 3f32.sqrt()
                }
            })
            .collect();
        w.tensor("cls.bias", &[e], GgmlType::F32, f32s(&v[..e as usize]));
        w.tensor(
            "cls.output.bias",
            &[1],
            GgmlType::F32,
            f32s(&v[e as usize..]),
        );
    }
    w
}
