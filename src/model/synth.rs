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
        "llama, llama3, qwen2, qwen2-yarn, qwen2moe, qwen3, qwen3moe, mixtral, gpt-oss, phi3, phi3-long, gemma2, gemma3, mamba, mamba2, lfm2, bert, bert-rank, qwen3-rank";

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
        return synth_ssm(arch, shape, ty, vocab, n_vocab, scale, vocab_only);
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
        return synth_bert(shape, ty, vocab, n_vocab, scale, vocab_only, rank);
    }
    let SynthShape {
        n_embd,
        n_layer,
        n_ff,
        n_head,
        n_head_kv,
        experts: experts_override,
    } = shape;
    let name = arch.gguf_arch();
    let key = |k: &str| format!("{name}.{k}");
    let mut w = GgufWriter::new();
    let u = Value::U32;
    let hd = n_embd / n_head;
    w.meta("general.architecture", Value::String(name.into()))
        .meta(
            "general.name",
            Value::String(format!("synthetic {name} {n_embd}x{n_layer} {ty}")),
        )
        .meta(&key("context_length"), u(4096))
        .meta(&key("embedding_length"), u(n_embd))
        .meta(&key("block_count"), u(n_layer))
        .meta(&key("feed_forward_length"), u(n_ff))
        .meta(&key("attention.head_count"), u(n_head));
    // LFM2: KV heads per layer, 0 for the convolution layers.
    let lfm2 = arch == SynthArch::Lfm2;
    let conv_layer = |i: u32| lfm2 && i.is_multiple_of(2);
    let head_count_kv = if lfm2 {
        Value::Array(
            (0..n_layer)
                .map(|i| u(if conv_layer(i) { 0 } else { n_head_kv }))
                .collect(),
        )
    } else {
        u(n_head_kv)
    };
    w.meta(&key("attention.head_count_kv"), head_count_kv)
        .meta(&key("attention.layer_norm_rms_epsilon"), Value::F32(1e-5))
        .meta(&key("rope.dimension_count"), u(hd));
    if lfm2 {
        w.meta(&key("shortconv.l_cache"), u(3));
    }
    let base = match arch {
        // Gemma's global layers rotate with base 1e6 (the local ones with 1e4, fixed).
        SynthArch::Gemma3 { window } => {
            w.meta(&key("attention.sliding_window"), u(window));
            1_000_000.0
        }
        SynthArch::GptOss { window } => {
            w.meta(&key("attention.sliding_window"), u(window));
            150_000.0
        }
        SynthArch::Gemma2 { window } => {
            w.meta(&key("attention.sliding_window"), u(window))
                .meta(&key("attn_logit_softcapping"), Value::F32(2.0))
                .meta(&key("final_logit_softcapping"), Value::F32(15.0));
            10_000.0
        }
        SynthArch::Llama3
        | SynthArch::Qwen2
        | SynthArch::Qwen2Yarn
        | SynthArch::Qwen2Moe
        | SynthArch::Qwen3
        | SynthArch::Qwen3Moe => 500_000.0,
        SynthArch::Lfm2 => 1_000_000.0,
        SynthArch::Llama | SynthArch::Mixtral | SynthArch::Phi3 | SynthArch::Phi3Long => 10_000.0,
        SynthArch::Mamba | SynthArch::Mamba2 => unreachable!("written by synth_ssm"),
        SynthArch::Bert | SynthArch::BertRank => unreachable!("written by synth_bert"),
        SynthArch::Qwen3Rank => unreachable!("written as qwen3 with a head"),
    };
    w.meta(&key("rope.freq_base"), Value::F32(base));
    let phi3 = matches!(arch, SynthArch::Phi3 | SynthArch::Phi3Long);
    if arch == SynthArch::Phi3Long {
        w.meta(&key("rope.scaling.original_context_length"), u(256))
            .meta(&key("rope.scaling.attn_factor"), Value::F32(1.19));
    }
    // Experts: (count, used, width).
    let width = match arch {
        SynthArch::Qwen2Moe => n_ff / 4,
        SynthArch::Mixtral => n_ff,
        _ => n_ff / 2,
    };
    let experts = (experts_override.or(arch.default_experts())).map(|(n, used)| (n, used, width));
    if let Some((n, used, width)) = experts {
        w.meta(&key("expert_count"), u(n))
            .meta(&key("expert_used_count"), u(used));
        if matches!(
            arch,
            SynthArch::Qwen3Moe | SynthArch::Qwen2Moe | SynthArch::GptOss { .. }
        ) {
            w.meta(&key("expert_feed_forward_length"), u(width));
        }
        if arch == SynthArch::Qwen2Moe {
            w.meta(&key("expert_shared_feed_forward_length"), u(n_ff / 2));
        }
    }
    let gpt_oss = matches!(arch, SynthArch::GptOss { .. });
    if arch == SynthArch::Qwen2Yarn || gpt_oss {
        w.meta(&key("rope.scaling.type"), Value::String("yarn".into()))
            .meta(&key("rope.scaling.factor"), Value::F32(4.0))
            .meta(&key("rope.scaling.original_context_length"), u(256));
    }
    for (k, v) in vocab {
        w.meta(&k, v);
    }
    if vocab_only {
        return w;
    }
    let e = n_embd as u64;
    let kv = hd as u64 * n_head_kv as u64;
    let f = n_ff as u64;
    let f32s = |v: &[f32]| quantize_row(GgmlType::F32, v);
    let mut seed = 1u64;
    // A vector around `center` (norm weights near 1, biases near 0).
    // dims: [n], or [n, m] for per-expert vectors (gpt-oss's expert biases).
    let mut vector = |w: &mut GgufWriter, name: &str, dims: &[u64], center: f32, spread: f32| {
        seed += 1;
        let n: u64 = dims.iter().product();
        let v: Vec<f32> = match scale {
            WeightScale::Fixed(_) => vec![center; n as usize],
            WeightScale::FanIn => {
                let mut rng = Rng(seed.wrapping_mul(0x9e3779b97f4a7c15));
                (0..n)
                    .map(|_| center + spread * 3f32.sqrt() * rng.normalish())
                    .collect()
            }
        };
        w.tensor(name, dims, GgmlType::F32, f32s(&v));
    };
    // Matrices are seeded 2, 3, ... in file order (the files benchmarks and tests were
    // made with); vectors draw from their own counter.
    let mut mseed = 1u64;
    let gemma2 = matches!(arch, SynthArch::Gemma2 { .. });
    // dims: [cols, rows] or, for experts, [cols, rows, n_expert] (each expert's rows after
    // the last's).
    let mut mat = |w: &mut GgufWriter, name: &str, dims: &[u64], embedding: bool| {
        mseed += 1;
        let cols = dims[0];
        let rows: u64 = dims[1..].iter().product();
        // normalish() has a standard deviation of 1/sqrt(3): FanIn rescales it to the
        // target (Fixed keeps the factor, as its benchmark files always had).
        let std = match scale {
            WeightScale::Fixed(s) => s,
            // Gemma 2's tied output: embeddings of Gemma's own scale (the model multiplies
            // them by sqrt(n_embd)), so its logits spread about 4 wide and the cap bends
            // the top ones without flattening every row into ties.
            WeightScale::FanIn if embedding && gemma2 => 4.0 * 3f32.sqrt() / (cols as f32).sqrt(),
            WeightScale::FanIn if embedding => 3f32.sqrt(),
            WeightScale::FanIn => 3f32.sqrt() / (cols as f32).sqrt(),
        };
        let t = row_type(ty, cols);
        let data = random_tensor(t, cols as usize, rows as usize, std, mseed);
        w.tensor(name, dims, t, data);
    };
    let gemma = matches!(arch, SynthArch::Gemma2 { .. } | SynthArch::Gemma3 { .. });
    mat(&mut w, "token_embd.weight", &[e, n_vocab], true);
    // LFM2's converter names its final norm `token_embd_norm`.
    let output_norm = if lfm2 {
        "token_embd_norm.weight"
    } else {
        "output_norm.weight"
    };
    vector(&mut w, output_norm, &[e], 1.0, 0.1);
    // LFM2 ties its output to the embeddings; the synthetic one keeps its own, scaled to
    // the fan-in, so that its logits have a trained model's spread.
    if !gemma {
        mat(&mut w, "output.weight", &[e, n_vocab], false);
    }
    if arch == SynthArch::Phi3Long {
        let half = hd / 2;
        let ramp = |i: u32| i as f32 / half as f32;
        let short: Vec<f32> = (0..half).map(|i| 1.0 + 0.5 * ramp(i)).collect();
        let long: Vec<f32> = (0..half).map(|i| 1.0 + 20.0 * ramp(i) * ramp(i)).collect();
        w.tensor(
            "rope_factors_short.weight",
            &[half as u64],
            GgmlType::F32,
            f32s(&short),
        );
        w.tensor(
            "rope_factors_long.weight",
            &[half as u64],
            GgmlType::F32,
            f32s(&long),
        );
    }
    if arch == SynthArch::Llama3 {
        // A short original context, so the factors reach pairs a 128-token test turns.
        let factors = llama3_rope_factors(hd, base, 8.0, 1.0, 4.0, 64.0);
        w.tensor(
            "rope_freqs.weight",
            &[hd as u64 / 2],
            GgmlType::F32,
            f32s(&factors),
        );
    }
    for i in 0..n_layer {
        let b = |t: &str| format!("blk.{i}.{t}.weight");
        let bias = |t: &str| format!("blk.{i}.{t}.bias");
        vector(&mut w, &b("attn_norm"), &[e], 1.0, 0.1);
        if conv_layer(i) {
            // The width-3 convolution's weights are f32, as llama.cpp keeps them.
            let mut rng = Rng((i as u64 + 1).wrapping_mul(0x9e3779b97f4a7c15) ^ 0xc0ffee);
            let conv: Vec<f32> = (0..3 * e).map(|_| rng.normalish()).collect();
            w.tensor(&b("shortconv.conv"), &[3, e], GgmlType::F32, f32s(&conv));
            mat(&mut w, &b("shortconv.in_proj"), &[e, 3 * e], false);
            mat(&mut w, &b("shortconv.out_proj"), &[e, e], false);
        } else if phi3 {
            mat(&mut w, &b("attn_qkv"), &[e, e + 2 * kv], false);
        } else {
            mat(&mut w, &b("attn_q"), &[e, e], false);
            mat(&mut w, &b("attn_k"), &[e, kv], false);
            mat(&mut w, &b("attn_v"), &[e, kv], false);
        }
        if matches!(
            arch,
            SynthArch::Qwen2 | SynthArch::Qwen2Yarn | SynthArch::Qwen2Moe
        ) || gpt_oss
        {
            vector(&mut w, &bias("attn_q"), &[e], 0.0, 0.5);
            vector(&mut w, &bias("attn_k"), &[kv], 0.0, 0.5);
            vector(&mut w, &bias("attn_v"), &[kv], 0.0, 0.5);
        }
        if !conv_layer(i) {
            mat(&mut w, &b("attn_output"), &[e, e], false);
        }
        if gpt_oss {
            // Its converter names the feed-forward's norm `post_attention_norm`.
            vector(&mut w, &bias("attn_output"), &[e], 0.0, 0.5);
            vector(&mut w, &b("attn_sinks"), &[n_head as u64], 3.0, 1.0);
            vector(&mut w, &b("post_attention_norm"), &[e], 1.0, 0.1);
        } else {
            vector(&mut w, &b("ffn_norm"), &[e], 1.0, 0.1);
        }
        if let Some((n, _, width)) = experts {
            let (n, fe) = (n as u64, width as u64);
            mat(&mut w, &b("ffn_gate_inp"), &[e, n], false);
            mat(&mut w, &b("ffn_gate_exps"), &[e, fe, n], false);
            mat(&mut w, &b("ffn_up_exps"), &[e, fe, n], false);
            mat(&mut w, &b("ffn_down_exps"), &[fe, e, n], false);
            if gpt_oss {
                vector(&mut w, &bias("ffn_gate_inp"), &[n], 0.0, 0.5);
                vector(&mut w, &bias("ffn_gate_exps"), &[fe, n], 0.0, 0.5);
                vector(&mut w, &bias("ffn_up_exps"), &[fe, n], 0.0, 0.5);
                vector(&mut w, &bias("ffn_down_exps"), &[e, n], 0.0, 0.5);
            }
            if arch == SynthArch::Qwen2Moe {
                let sf = n_ff as u64 / 2;
                // Away from 0: llama.cpp's sigmoid of the gate is silu(g) / g.
                vector(&mut w, &b("ffn_gate_inp_shexp"), &[e], 0.05, 0.1);
                mat(&mut w, &b("ffn_gate_shexp"), &[e, sf], false);
                mat(&mut w, &b("ffn_up_shexp"), &[e, sf], false);
                mat(&mut w, &b("ffn_down_shexp"), &[sf, e], false);
            }
        } else {
            if phi3 {
                mat(&mut w, &b("ffn_up"), &[e, 2 * f], false);
            } else {
                mat(&mut w, &b("ffn_gate"), &[e, f], false);
                mat(&mut w, &b("ffn_up"), &[e, f], false);
            }
            mat(&mut w, &b("ffn_down"), &[f, e], false);
        }
        let qk_norms = matches!(
            arch,
            SynthArch::Qwen3 | SynthArch::Qwen3Moe | SynthArch::Gemma3 { .. }
        );
        if qk_norms || (lfm2 && !conv_layer(i)) {
            vector(&mut w, &b("attn_q_norm"), &[hd as u64], 1.0, 0.1);
            vector(&mut w, &b("attn_k_norm"), &[hd as u64], 1.0, 0.1);
        }
        if gemma {
            vector(&mut w, &b("post_attention_norm"), &[e], 1.0, 0.1);
            vector(&mut w, &b("post_ffw_norm"), &[e], 1.0, 0.1);
        }
    }
    w
}

/// A Mamba or Mamba-2 model, laid out as llama.cpp's converter writes one (A as -exp of
/// its log, 2-D A and D for Mamba-2); the shape's head counts and feed-forward are unused.
/// Matrices take `ty` where their rows are whole blocks (dt's low-rank projection stays
/// f32), the convolution, A, D and the biases are f32.
fn synth_ssm(
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

/// Learned positions of a synthetic BERT (bge's).
const BERT_POSITIONS: u64 = 512;

/// A BERT encoder with random weights, tensors named and shaped as llama.cpp's converter
/// writes bge models. The vocabulary must be a WordPiece one with its token-type count
/// (llama.cpp refuses BERT without it), as llama.cpp's ggml-vocab-bert-bge.gguf. With
/// `rank`, a reranker: a classifier head and rank pooling.
fn synth_bert(
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
        crate::gguf::quant::dequantize_row(GgmlType::Q4_0, &f.tensor_data(q)[..3 * 18], &mut row);
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
