//! GGUF files with random weights: benchmark subjects at sizes we cannot download (7B
//! shapes), architecture checks against llama.cpp, and fuzz seeds. The vocabulary is
//! copied from a real GGUF so that llama.cpp and wgllm both load the result as they would a
//! real model. One writer per family: decoder transformers (`transformer.rs`), state-space
//! models (`ssm.rs`), BERT encoders (`bert.rs`); what they share is here.

mod added_tokens;
mod bert;
mod mmproj;
mod ssm;
mod transformer;

use crate::gguf::{GgmlType, GgufFile, GgufWriter, Value};
use crate::quant::quantize_row;
pub use added_tokens::{
    smolvlm_tokens, with_added_tokens, with_added_tokens_of_type, CONTROL, USER_DEFINED,
};
pub use mmproj::{synth_mmproj, synth_mmproj_gemma3, MmprojShape, SynthProjector};

/// Model dimensions of a synthetic llama.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SynthShape {
    pub n_embd: u32,
    pub n_layer: u32,
    pub n_ff: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    /// A mixture of experts' (experts, used per token), instead of the architecture's
    /// own (`wgllm synth --experts N --experts-used K`).
    pub experts: Option<(u32, u32)>,
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
            experts: None,
        };
        Some(match name {
            "micro" => s(32, 2, 64, 2, 1),      // fuzz seeds: a model in a few KiB
            "tiny" => s(256, 2, 512, 4, 2),     // architecture checks
            "135m" => s(576, 30, 1536, 9, 3),   // SmolLM2-135M
            "1b" => s(2048, 16, 8192, 32, 8),   // Llama-3.2-1B
            "7b" => s(4096, 32, 11008, 32, 32), // Llama-2-7B
            _ => return None,
        })
    }
    pub const PRESETS: &'static str = "micro, tiny, 135m, 1b, 7b";
}

/// Metadata keys of `src` that make up its tokenizer.
pub fn vocab_metadata(src: &GgufFile) -> Vec<(String, Value)> {
    src.metadata
        .iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// A tiny deterministic generator; weights (and the tuner's logits) only need to be
/// plausible, not good.
pub(crate) struct Rng(pub(crate) u64);
impl Rng {
    pub(crate) fn normalish(&mut self) -> f32 {
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

/// The type a matrix of rows of `cols` values is written in: `ty`, or f32 where its rows
/// are not whole blocks of `ty` (a narrow expert's or a state-space projection's), as
/// llama-quantize falls back to another type for such tensors.
fn row_type(ty: GgmlType, cols: u64) -> GgmlType {
    if (cols as usize).is_multiple_of(ty.block_size()) {
        ty
    } else {
        GgmlType::F32
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

/// The architectures `synth` writes, with what each adds to the llama layout.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SynthArch {
    Llama,
    /// Llama with Llama 3's RoPE frequency factors (`rope_freqs.weight`).
    Llama3,
    /// Q/K/V biases, NeoX RoPE.
    Qwen2,
    /// Qwen2 with YaRN RoPE scaling (factor 4, as Qwen2.5 past 32k) over an original
    /// context of 256, so a context above 256 is past it.
    Qwen2Yarn,
    /// Qwen2-VL's language model: Qwen2 (the same weights and RoPE base) with M-RoPE
    /// sections (a quarter of the rotated pairs for time, three eighths each for row and
    /// column, as Qwen2-VL's 16, 24, 24) (`qwen2vl`).
    Qwen2Vl,
    /// Per-head Q/K norms, NeoX RoPE.
    Qwen3,
    /// Qwen2 with mixture-of-experts feed-forwards: 16 experts of a quarter of the
    /// feed-forward width, 4 used per token, their softmax weights kept as they are, and
    /// a shared expert of half the width gated per token (`qwen2moe`).
    Qwen2Moe,
    /// Qwen3 with mixture-of-experts feed-forwards: 16 experts of half the feed-forward
    /// width, 4 used per token (`qwen3moe`).
    Qwen3Moe,
    /// Llama with mixture-of-experts feed-forwards: 8 experts of the full width, 2 used
    /// per token (Mixtral's layout).
    Mixtral,
    /// Fused QKV and gate/up tensors, NeoX RoPE.
    Phi3,
    /// Phi-3 with long-context RoPE (short and long factor sets, a magnitude factor) and
    /// an original context of 256 (llama.cpp's smallest context), so a context above
    /// 256 takes the long factors.
    Phi3Long,
    /// gpt-oss: Q/K/V/O biases, a sink logit per head, a window of `window` on even
    /// layers, YaRN (x4 over an original context of 256), 16 experts of half the
    /// feed-forward width with biases, 4 used, their logits' softmax the weights.
    GptOss {
        window: u32,
    },
    /// Sliding window on even layers, sandwich norms, tied output, attention scores and
    /// logits soft-capped (at 2 and 15: tighter than Gemma 2's 50 and 30, so that
    /// random weights meet the caps).
    Gemma2 {
        window: u32,
    },
    /// Sliding window on five of every six layers, Q/K norms, sandwich norms, tied output.
    Gemma3 {
        window: u32,
    },
    /// State-space layers (Mamba: inner size 2 x embedding, states of 16, a convolution
    /// of 4); no attention, no feed-forward.
    Mamba,
    /// Mamba-2: heads of 64 channels (narrower below an inner size of 128) in 2 groups,
    /// states of 64.
    Mamba2,
    /// LFM2: gated short convolutions (width 3) on even layers, attention with Q/K norms
    /// on odd ones, SwiGLU feed-forwards, NeoX RoPE.
    Lfm2,
    /// A BERT encoder (bge's layout): 512 learned positions, two token types, post-norm
    /// blocks with biases everywhere, non-causal, CLS pooling declared; no output head.
    Bert,
    /// The same BERT as a reranker: a classifier head (dense + tanh, then one score) over
    /// the first token, rank pooling declared.
    BertRank,
    /// Qwen3 as a reranker, as llama.cpp's converter writes Qwen3-Reranker: a `cls.output`
    /// of two rows (labels yes, no) over the last token, rank pooling and a rerank
    /// template declared.
    Qwen3Rank,
}

impl SynthArch {
    pub fn by_name(name: &str) -> Option<Self> {
        Some(match name {
            "llama" => Self::Llama,
            "llama3" => Self::Llama3,
            "qwen2" => Self::Qwen2,
            "qwen2-yarn" => Self::Qwen2Yarn,
            // Qwen2.5-VL's language model is Qwen2-VL's architecture (llama.cpp has one).
            "qwen2vl" | "qwen25vl" => Self::Qwen2Vl,
            "qwen3" => Self::Qwen3,
            "qwen2moe" => Self::Qwen2Moe,
            "qwen3moe" => Self::Qwen3Moe,
            "mixtral" => Self::Mixtral,
            "phi3" => Self::Phi3,
            "phi3-long" => Self::Phi3Long,
            "gemma2" => Self::Gemma2 { window: 32 },
            "gpt-oss" => Self::GptOss { window: 32 },
            "gemma3" => Self::Gemma3 { window: 512 },
            "mamba" => Self::Mamba,
            "mamba2" => Self::Mamba2,
            "lfm2" => Self::Lfm2,
            "bert" => Self::Bert,
            "bert-rank" => Self::BertRank,
            "qwen3-rank" => Self::Qwen3Rank,
            _ => return None,
        })
    }
    pub const NAMES: &'static str =
        "llama, llama3, qwen2, qwen2-yarn, qwen2vl, qwen2moe, qwen3, qwen3moe, mixtral, gpt-oss, phi3, phi3-long, gemma2, gemma3, mamba, mamba2, lfm2, bert, bert-rank, qwen3-rank";

    /// (experts, used per token) of a mixture-of-experts architecture, None for others.
    pub fn default_experts(self) -> Option<(u32, u32)> {
        match self {
            Self::Qwen3Moe | Self::Qwen2Moe | Self::GptOss { .. } => Some((16, 4)),
            Self::Mixtral => Some((8, 2)),
            _ => None,
        }
    }

    /// `general.architecture`.
    pub fn gguf_arch(self) -> &'static str {
        match self {
            Self::Llama | Self::Llama3 | Self::Mixtral => "llama",
            Self::Qwen3Moe => "qwen3moe",
            Self::Qwen2Moe => "qwen2moe",
            Self::Qwen2 | Self::Qwen2Yarn => "qwen2",
            Self::Qwen2Vl => "qwen2vl",
            Self::Qwen3 | Self::Qwen3Rank => "qwen3",
            Self::Phi3 | Self::Phi3Long => "phi3",
            Self::Gemma2 { .. } => "gemma2",
            Self::GptOss { .. } => "gpt-oss",
            Self::Gemma3 { .. } => "gemma3",
            Self::Mamba => "mamba",
            Self::Mamba2 => "mamba2",
            Self::Lfm2 => "lfm2",
            Self::Bert | Self::BertRank => "bert",
        }
    }
}

/// How large the random weights are.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum WeightScale {
    /// Every matrix with this standard deviation, norms all ones (benchmark subjects).
    Fixed(f32),
    /// As a trained model's: matrices 1/sqrt(fan-in), embeddings 1, norms and biases
    /// random around their neutral values, so logits have spread and every tensor
    /// (a forgotten bias, a norm applied twice) shows in them.
    FanIn,
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
    synth(
        SynthArch::Llama,
        shape,
        ty,
        vocab,
        n_vocab,
        WeightScale::Fixed(std),
        vocab_only,
    )
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
    synth(
        SynthArch::Gemma3 { window },
        shape,
        ty,
        vocab,
        n_vocab,
        WeightScale::Fixed(std),
        false,
    )
}

/// Llama 3's frequency factors for `n_rot` rotated dims: pairs with wavelengths longer
/// than `orig_ctx / low` are slowed by `factor`, shorter than `orig_ctx / high` kept,
/// the band between blended (the published Llama 3.1 rule).
pub fn llama3_rope_factors(
    n_rot: u32,
    base: f32,
    factor: f32,
    low: f32,
    high: f32,
    orig_ctx: f32,
) -> Vec<f32> {
    (0..n_rot / 2)
        .map(|i| {
            let freq = (base as f64).powf(-2.0 * i as f64 / n_rot as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let (low_wl, high_wl) = ((orig_ctx / low) as f64, (orig_ctx / high) as f64);
            if wavelen < high_wl {
                1.0
            } else if wavelen > low_wl {
                factor
            } else {
                let smooth = ((orig_ctx as f64 / wavelen) - low as f64) / (high - low) as f64;
                (1.0 / ((1.0 - smooth) / factor as f64 + smooth)) as f32
            }
        })
        .collect()
}

/// Any of [`SynthArch`] with random weights.
pub fn synth(
    arch: SynthArch,
    shape: SynthShape,
    ty: GgmlType,
    vocab: Vec<(String, Value)>,
    n_vocab: u64,
    scale: WeightScale,
    vocab_only: bool,
) -> GgufWriter {
    if matches!(arch, SynthArch::Mamba | SynthArch::Mamba2) {
        return ssm::synth(arch, shape, ty, vocab, n_vocab, scale, vocab_only);
    }
    if arch == SynthArch::Qwen3Rank {
        let mut w = synth(
            SynthArch::Qwen3,
            shape,
            ty,
            vocab,
            n_vocab,
            scale,
            vocab_only,
        );
        w.meta(
            "qwen3.classifier.output_labels",
            Value::Array(vec![
                Value::String("yes".into()),
                Value::String("no".into()),
            ]),
        )
        .meta("qwen3.pooling_type", Value::U32(4))
        .meta(
            "tokenizer.chat_template.rerank",
            Value::String(QWEN3_RERANK_TEMPLATE.into()),
        );
        if !vocab_only {
            let e = shape.n_embd as usize;
            let std = match scale {
                WeightScale::Fixed(s) => s,
                WeightScale::FanIn => 3f32.sqrt() / (e as f32).sqrt(),
            };
            let data = random_tensor(GgmlType::F32, e, 2, std, 0x7e5);
            w.tensor("cls.output.weight", &[e as u64, 2], GgmlType::F32, data);
        }
        return w;
    }
    if matches!(arch, SynthArch::Bert | SynthArch::BertRank) {
        let rank = arch == SynthArch::BertRank;
        return bert::synth(shape, ty, vocab, n_vocab, scale, vocab_only, rank);
    }
    transformer::synth(arch, shape, ty, vocab, n_vocab, scale, vocab_only)
}

/// `n` values drawn around `center` with `spread` (uniform-ish, [`WeightScale::FanIn`]), or
/// `center` alone (`fixed`, [`WeightScale::Fixed`]).
fn draw_values(rng: &mut Rng, fixed: bool, n: u64, center: f32, spread: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let r = rng.normalish() * 3f32.sqrt();
            if fixed {
                center
            } else {
                center + spread * r
            }
        })
        .collect()
}

/// Qwen3-Reranker's layout of a query and a document (as its converter writes it,
/// shortened): a system turn, the pair, and the answer opened for "yes" or "no".
const QWEN3_RERANK_TEMPLATE: &str = "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n<Query>: {query}\n<Document>: {document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";

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
            experts: None,
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
        crate::quant::dequantize_row(GgmlType::Q4_0, &f.tensor_data(q)[..3 * 18], &mut row);
        let rms = (row.iter().map(|v| v * v).sum::<f32>() / 96.0).sqrt();
        assert!((0.005..0.05).contains(&rms), "rms {rms}");
    }

    /// A matrix whose rows are not whole blocks of the asked type (Qwen2-MoE's experts, a
    /// quarter of the feed-forward width: 128 values against Q4_K's 256) is written in
    /// f32, as llama-quantize falls back for such tensors; the rest keeps the type.
    #[test]
    fn matrices_of_partial_blocks_fall_back_to_f32() {
        let shape = SynthShape::preset("tiny").unwrap();
        let w = synth(
            SynthArch::Qwen2Moe,
            shape,
            GgmlType::Q4K,
            Vec::new(),
            64,
            WeightScale::Fixed(0.02),
            false,
        );
        let f = GgufFile::from_bytes("t.gguf", w.to_bytes()).unwrap();
        let ty = |name: &str| f.tensor(name).unwrap().ty;
        assert_eq!(ty("blk.0.ffn_down_exps.weight"), GgmlType::F32);
        assert_eq!(ty("blk.0.ffn_gate_exps.weight"), GgmlType::Q4K);
        assert_eq!(ty("blk.0.attn_q.weight"), GgmlType::Q4K);
        crate::model::Hparams::from_gguf(&f).unwrap();
    }
}
