//! Decoder transformers: llama and the architectures that add to its layout (Qwen2/3 and
//! their mixtures, Mixtral, Phi-3, gpt-oss, Gemma 2/3, LFM2's hybrid of attention and short
//! convolutions).

use super::{
    llama3_rope_factors, random_tensor, row_type, Rng, SynthArch, SynthShape, WeightScale,
};
use crate::gguf::{GgmlType, GgufWriter, Value};
use crate::quant::quantize_row;

/// What the tensors of a file depend on, read once from its architecture and shape.
struct Layout {
    arch: SynthArch,
    shape: SynthShape,
    /// Values per head.
    hd: u32,
    /// The global layers' RoPE base (Llama 3's factors are made for it).
    base: f32,
    /// A mixture's (experts, used per token, expert width).
    experts: Option<(u32, u32, u32)>,
}

impl Layout {
    fn lfm2(&self) -> bool {
        self.arch == SynthArch::Lfm2
    }
    /// LFM2's even layers are convolutions.
    fn conv_layer(&self, i: u32) -> bool {
        self.lfm2() && i.is_multiple_of(2)
    }
    fn phi3(&self) -> bool {
        matches!(self.arch, SynthArch::Phi3 | SynthArch::Phi3Long)
    }
    fn gpt_oss(&self) -> bool {
        matches!(self.arch, SynthArch::GptOss { .. })
    }
    fn gemma(&self) -> bool {
        matches!(
            self.arch,
            SynthArch::Gemma2 { .. } | SynthArch::Gemma3 { .. }
        )
    }
}

/// A decoder of `arch` (not Mamba, BERT or a reranker's head: `super::synth` writes those).
pub(super) fn synth(
    arch: SynthArch,
    shape: SynthShape,
    ty: GgmlType,
    vocab: Vec<(String, Value)>,
    n_vocab: u64,
    scale: WeightScale,
    vocab_only: bool,
) -> GgufWriter {
    let mut w = GgufWriter::new();
    let layout = metadata(&mut w, arch, shape, ty);
    for (k, v) in vocab {
        w.meta(&k, v);
    }
    if vocab_only {
        return w;
    }
    let mut t = Tensors {
        w: &mut w,
        ty,
        scale,
        gemma2: matches!(arch, SynthArch::Gemma2 { .. }),
        seed: 1,
        mseed: 1,
    };
    globals(&mut t, &layout, n_vocab);
    for i in 0..shape.n_layer {
        layer(&mut t, &layout, i);
    }
    w
}

/// The architecture's keys, in the order the reference files were written with.
fn metadata(w: &mut GgufWriter, arch: SynthArch, shape: SynthShape, ty: GgmlType) -> Layout {
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
        SynthArch::Qwen2Vl => {
            let pairs = hd / 2;
            let (t, hw) = (pairs / 4, pairs * 3 / 8);
            let sections = [t, hw, pairs - t - hw, 0];
            let v = sections.iter().map(|&s| Value::I32(s as i32)).collect();
            w.meta(&key("rope.dimension_sections"), Value::Array(v));
            500_000.0
        }
        SynthArch::Llama | SynthArch::Mixtral | SynthArch::Phi3 | SynthArch::Phi3Long => 10_000.0,
        SynthArch::Mamba | SynthArch::Mamba2 => unreachable!("written by ssm::synth"),
        SynthArch::Bert | SynthArch::BertRank => unreachable!("written by bert::synth"),
        SynthArch::Qwen3Rank => unreachable!("written as qwen3 with a head"),
    };
    w.meta(&key("rope.freq_base"), Value::F32(base));
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
    if arch == SynthArch::Qwen2Yarn || matches!(arch, SynthArch::GptOss { .. }) {
        w.meta(&key("rope.scaling.type"), Value::String("yarn".into()))
            .meta(&key("rope.scaling.factor"), Value::F32(4.0))
            .meta(&key("rope.scaling.original_context_length"), u(256));
    }
    Layout {
        arch,
        shape,
        hd,
        base,
        experts,
    }
}

/// Writes tensors with random values, each from its own seed: matrices are seeded 2, 3,
/// ... in file order (the files benchmarks and tests were made with); vectors draw from
/// their own counter.
struct Tensors<'a> {
    w: &'a mut GgufWriter,
    ty: GgmlType,
    scale: WeightScale,
    gemma2: bool,
    seed: u64,
    mseed: u64,
}

impl Tensors<'_> {
    /// A vector around `center` (norm weights near 1, biases near 0). dims: [n], or
    /// [n, m] for per-expert vectors (gpt-oss's expert biases).
    fn vector(&mut self, name: &str, dims: &[u64], center: f32, spread: f32) {
        self.seed += 1;
        let n: u64 = dims.iter().product();
        let v: Vec<f32> = match self.scale {
            WeightScale::Fixed(_) => vec![center; n as usize],
            WeightScale::FanIn => {
                let mut rng = Rng(self.seed.wrapping_mul(0x9e3779b97f4a7c15));
                (0..n)
                    .map(|_| center + spread * 3f32.sqrt() * rng.normalish())
                    .collect()
            }
        };
        self.f32s(name, dims, &v);
    }

    /// A matrix: dims [cols, rows] or, for experts, [cols, rows, n_expert] (each expert's
    /// rows after the last's).
    fn mat(&mut self, name: &str, dims: &[u64], embedding: bool) {
        self.mseed += 1;
        let cols = dims[0];
        let rows: u64 = dims[1..].iter().product();
        // normalish() has a standard deviation of 1/sqrt(3): FanIn rescales it to the
        // target (Fixed keeps the factor, as its benchmark files always had).
        let std = match self.scale {
            WeightScale::Fixed(s) => s,
            // Gemma 2's tied output: embeddings of Gemma's own scale (the model multiplies
            // them by sqrt(n_embd)), so its logits spread about 4 wide and the cap bends
            // the top ones without flattening every row into ties.
            WeightScale::FanIn if embedding && self.gemma2 => {
                4.0 * 3f32.sqrt() / (cols as f32).sqrt()
            }
            WeightScale::FanIn if embedding => 3f32.sqrt(),
            WeightScale::FanIn => 3f32.sqrt() / (cols as f32).sqrt(),
        };
        let t = row_type(self.ty, cols);
        let data = random_tensor(t, cols as usize, rows as usize, std, self.mseed);
        self.w.tensor(name, dims, t, data);
    }

    /// Values given, in f32.
    fn f32s(&mut self, name: &str, dims: &[u64], v: &[f32]) {
        self.w
            .tensor(name, dims, GgmlType::F32, quantize_row(GgmlType::F32, v));
    }
}

/// The embeddings, the final norm, the output (where not tied) and RoPE's factors.
fn globals(t: &mut Tensors, l: &Layout, n_vocab: u64) {
    let e = l.shape.n_embd as u64;
    t.mat("token_embd.weight", &[e, n_vocab], true);
    // LFM2's converter names its final norm `token_embd_norm`.
    let output_norm = if l.lfm2() {
        "token_embd_norm.weight"
    } else {
        "output_norm.weight"
    };
    t.vector(output_norm, &[e], 1.0, 0.1);
    // LFM2 ties its output to the embeddings; the synthetic one keeps its own, scaled to
    // the fan-in, so that its logits have a trained model's spread.
    if !l.gemma() {
        t.mat("output.weight", &[e, n_vocab], false);
    }
    let hd = l.hd;
    if l.arch == SynthArch::Phi3Long {
        let half = hd / 2;
        let ramp = |i: u32| i as f32 / half as f32;
        let short: Vec<f32> = (0..half).map(|i| 1.0 + 0.5 * ramp(i)).collect();
        let long: Vec<f32> = (0..half).map(|i| 1.0 + 20.0 * ramp(i) * ramp(i)).collect();
        t.f32s("rope_factors_short.weight", &[half as u64], &short);
        t.f32s("rope_factors_long.weight", &[half as u64], &long);
    }
    if l.arch == SynthArch::Llama3 {
        // A short original context, so the factors reach pairs a 128-token test turns.
        let factors = llama3_rope_factors(hd, l.base, 8.0, 1.0, 4.0, 64.0);
        t.f32s("rope_freqs.weight", &[hd as u64 / 2], &factors);
    }
}

/// Layer `i`'s tensors.
fn layer(t: &mut Tensors, l: &Layout, i: u32) {
    let arch = l.arch;
    let e = l.shape.n_embd as u64;
    let kv = l.hd as u64 * l.shape.n_head_kv as u64;
    let f = l.shape.n_ff as u64;
    let (hd, gpt_oss) = (l.hd as u64, l.gpt_oss());
    let b = |t: &str| format!("blk.{i}.{t}.weight");
    let bias = |t: &str| format!("blk.{i}.{t}.bias");
    t.vector(&b("attn_norm"), &[e], 1.0, 0.1);
    if l.conv_layer(i) {
        // The width-3 convolution's weights are f32, as llama.cpp keeps them.
        let mut rng = Rng((i as u64 + 1).wrapping_mul(0x9e3779b97f4a7c15) ^ 0xc0ffee);
        let conv: Vec<f32> = (0..3 * e).map(|_| rng.normalish()).collect();
        t.f32s(&b("shortconv.conv"), &[3, e], &conv);
        t.mat(&b("shortconv.in_proj"), &[e, 3 * e], false);
        t.mat(&b("shortconv.out_proj"), &[e, e], false);
    } else if l.phi3() {
        t.mat(&b("attn_qkv"), &[e, e + 2 * kv], false);
    } else {
        t.mat(&b("attn_q"), &[e, e], false);
        t.mat(&b("attn_k"), &[e, kv], false);
        t.mat(&b("attn_v"), &[e, kv], false);
    }
    if matches!(
        arch,
        SynthArch::Qwen2 | SynthArch::Qwen2Yarn | SynthArch::Qwen2Moe | SynthArch::Qwen2Vl
    ) || gpt_oss
    {
        t.vector(&bias("attn_q"), &[e], 0.0, 0.5);
        t.vector(&bias("attn_k"), &[kv], 0.0, 0.5);
        t.vector(&bias("attn_v"), &[kv], 0.0, 0.5);
    }
    if !l.conv_layer(i) {
        t.mat(&b("attn_output"), &[e, e], false);
    }
    if gpt_oss {
        // Its converter names the feed-forward's norm `post_attention_norm`.
        t.vector(&bias("attn_output"), &[e], 0.0, 0.5);
        t.vector(&b("attn_sinks"), &[l.shape.n_head as u64], 3.0, 1.0);
        t.vector(&b("post_attention_norm"), &[e], 1.0, 0.1);
    } else {
        t.vector(&b("ffn_norm"), &[e], 1.0, 0.1);
    }
    if let Some((n, _, width)) = l.experts {
        let (n, fe) = (n as u64, width as u64);
        t.mat(&b("ffn_gate_inp"), &[e, n], false);
        t.mat(&b("ffn_gate_exps"), &[e, fe, n], false);
        t.mat(&b("ffn_up_exps"), &[e, fe, n], false);
        t.mat(&b("ffn_down_exps"), &[fe, e, n], false);
        if gpt_oss {
            t.vector(&bias("ffn_gate_inp"), &[n], 0.0, 0.5);
            t.vector(&bias("ffn_gate_exps"), &[fe, n], 0.0, 0.5);
            t.vector(&bias("ffn_up_exps"), &[fe, n], 0.0, 0.5);
            t.vector(&bias("ffn_down_exps"), &[e, n], 0.0, 0.5);
        }
        if arch == SynthArch::Qwen2Moe {
            let sf = f / 2;
            // Away from 0: llama.cpp's sigmoid of the gate is silu(g) / g.
            t.vector(&b("ffn_gate_inp_shexp"), &[e], 0.05, 0.1);
            t.mat(&b("ffn_gate_shexp"), &[e, sf], false);
            t.mat(&b("ffn_up_shexp"), &[e, sf], false);
            t.mat(&b("ffn_down_shexp"), &[sf, e], false);
        }
    } else {
        if l.phi3() {
            t.mat(&b("ffn_up"), &[e, 2 * f], false);
        } else {
            t.mat(&b("ffn_gate"), &[e, f], false);
            t.mat(&b("ffn_up"), &[e, f], false);
        }
        t.mat(&b("ffn_down"), &[f, e], false);
    }
    let qk_norms = matches!(
        arch,
        SynthArch::Qwen3 | SynthArch::Qwen3Moe | SynthArch::Gemma3 { .. }
    );
    if qk_norms || (l.lfm2() && !l.conv_layer(i)) {
        t.vector(&b("attn_q_norm"), &[hd], 1.0, 0.1);
        t.vector(&b("attn_k_norm"), &[hd], 1.0, 0.1);
    }
    if l.gemma() {
        t.vector(&b("post_attention_norm"), &[e], 1.0, 0.1);
        t.vector(&b("post_ffw_norm"), &[e], 1.0, 0.1);
    }
}
