//! `wgllm synth`: writes a GGUF with random weights, for benchmarks at sizes no test model
//! has (`--shape 7b`) and architecture checks against llama.cpp (`--arch qwen2
//! --trained-scale`), loadable by llama.cpp too.

use anyhow::{bail, Context as _, Result};
use clap::Args;
use std::path::PathBuf;
use wgllm::gguf::{GgufFile, Value};
use wgllm::model::synth::{
    self as model_synth, vocab_metadata, SynthArch, SynthShape, WeightScale,
};
use wgllm::quant;

#[derive(Args)]
pub struct SynthArgs {
    /// A GGUF whose tokenizer (all `tokenizer.*` metadata) the new file takes.
    #[arg(
        long = "vocab-from",
        required_unless_present_any = ["lora_for", "mmproj_for", "add_tokens_to"]
    )]
    pub vocab_from: Option<PathBuf>,
    /// Write a random LoRA adapter for this base model instead of a model (its attention
    /// and feed-forward projections and output head, in convert_lora_to_gguf.py's layout).
    #[arg(long = "lora-for", conflicts_with = "vocab_from")]
    pub lora_for: Option<PathBuf>,
    /// Write a random vision encoder (an mmproj file) for this language model instead of
    /// a model: its projection gives embeddings of the model's width.
    #[arg(long = "mmproj-for", conflicts_with_all = ["vocab_from", "lora_for"])]
    pub mmproj_for: Option<PathBuf>,
    /// Write a copy of this model with tokens added to its vocabulary (`--tokens`), each
    /// with a random embedding row, instead of a model with random weights.
    #[arg(long = "add-tokens-to", conflicts_with_all = ["vocab_from", "lora_for", "mmproj_for"])]
    pub add_tokens_to: Option<PathBuf>,
    /// The tokens `--add-tokens-to` adds: `smolvlm` (SmolVLM's image and turn tokens,
    /// which its language model adds to SmolLM2's) or a comma-separated list.
    #[arg(long, default_value = "smolvlm")]
    pub tokens: String,
    /// The added tokens' type: control (matched only where special tokens are parsed,
    /// never printed) or user (always matched and printed, as Qwen 3's `<think>`).
    #[arg(long = "token-type", default_value = "control")]
    pub token_type: String,
    /// The mmproj's projector (llama.cpp's `clip.projector_type`): gemma3, idefics3 or
    /// qwen25vl (`qwen2.5vl_merger`).
    #[arg(long, default_value = "gemma3")]
    pub projector: String,
    /// The mmproj's matrix type: f32, or f16 as llama.cpp's converter writes them.
    #[arg(long = "mmproj-type", default_value = "f32")]
    pub mmproj_type: String,
    /// The adapter's rank.
    #[arg(long = "lora-rank", default_value_t = 32)]
    pub lora_rank: u32,
    /// The adapter's `adapter.lora.alpha` (0: the scale applies unchanged).
    #[arg(long = "lora-alpha", default_value_t = 32.0)]
    pub lora_alpha: f32,
    /// The adapter's halves' type: f32, f16 or q8_0.
    #[arg(long = "lora-type", default_value = "f16")]
    pub lora_type: String,
    /// The correction's size against its input's (at scale 1).
    #[arg(long = "lora-strength", default_value_t = 0.1)]
    pub lora_strength: f32,
    /// Adapt the token embedding too (only for models with an output head of their own:
    /// llama.cpp applies an embedding pair to a tied head as well, where it cannot fit).
    #[arg(long = "lora-embedding")]
    pub lora_embedding: bool,
    /// The adapter's random seed.
    #[arg(long = "lora-seed", default_value_t = 1)]
    pub lora_seed: u64,
    /// Model shape: micro (fuzz seeds), tiny, 135m, 1b or 7b.
    #[arg(long, default_value = "7b")]
    pub shape: String,
    /// Architecture: llama, llama3 (with Llama 3 RoPE factors), qwen2, qwen2-yarn (YaRN
    /// RoPE scaling x4 over an original context of 256), qwen2vl (Qwen2-VL's language model:
    /// M-RoPE sections), qwen2moe (16 experts, 4 used, and a
    /// shared expert), qwen3, qwen3moe (16 experts, 4 used), mixtral (8 experts, 2 used),
    /// gpt-oss (sinks, biases, window 32 on even layers, YaRN, 16 experts, 4 used), phi3,
    /// phi3-long (long-context RoPE factors, original context 256), gemma2 (window 32 on
    /// even layers, soft caps), gemma3, mamba, mamba2, lfm2.
    #[arg(long, default_value = "llama")]
    pub arch: String,
    /// Weights scaled like a trained model's (1/sqrt(fan-in), norms and biases random
    /// around their neutral values) instead of a fixed small scale: logits with spread,
    /// for comparing perplexity with llama.cpp.
    #[arg(long)]
    pub trained_scale: bool,
    /// Weight type of the matrices: any type wgllm can quantize to (q4_0, q5_1, q8_0, f16, …).
    #[arg(long = "type", default_value = "q4_0")]
    pub ty: String,
    /// Experts of a mixture-of-experts architecture (qwen2moe, qwen3moe, mixtral, gpt-oss)
    /// instead of its default (16; Mixtral 8).
    #[arg(long)]
    pub experts: Option<u32>,
    /// Experts each token uses (default 4; Mixtral 2).
    #[arg(long = "experts-used")]
    pub experts_used: Option<u32>,
    /// Write only the metadata (a vocabulary file, as llama.cpp's ggml-vocab-*.gguf).
    #[arg(long)]
    pub vocab_only: bool,
    /// Set a tokenizer key in the written file, as llama.cpp's --override-kv spells it:
    /// KEY=TYPE:VALUE with TYPE int, float, bool or str (e.g.
    /// `tokenizer.ggml.fim_sep_token_id=int:6`); may be repeated.
    #[arg(long = "override-kv")]
    pub override_kv: Vec<String>,
    /// Output file.
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
}

pub fn synth(a: &SynthArgs) -> Result<()> {
    if let Some(base) = &a.lora_for {
        return synth_lora(a, base);
    }
    if let Some(model) = &a.mmproj_for {
        return synth_mmproj(a, model);
    }
    if let Some(model) = &a.add_tokens_to {
        let f = GgufFile::open(model).with_context(|| format!("reading {}", model.display()))?;
        let tokens = match a.tokens.as_str() {
            "smolvlm" => model_synth::smolvlm_tokens(),
            list => list
                .split(',')
                .filter(|t| !t.is_empty())
                .map(str::to_string)
                .collect(),
        };
        let ty = match a.token_type.as_str() {
            "control" => model_synth::CONTROL,
            "user" => model_synth::USER_DEFINED,
            other => bail!("--token-type {other}: give control or user"),
        };
        let w =
            model_synth::with_added_tokens_of_type(&f, &tokens, ty).map_err(anyhow::Error::msg)?;
        w.write(&a.output)
            .with_context(|| format!("writing {}", a.output.display()))?;
        eprintln!(
            "wrote {} ({} with {} tokens added)",
            a.output.display(),
            model.display(),
            tokens.len()
        );
        return Ok(());
    }
    let Some(arch) = SynthArch::by_name(&a.arch) else {
        bail!(
            "unknown architecture `{}` (--arch takes one of: {})",
            a.arch,
            SynthArch::NAMES
        );
    };
    let Some(mut shape) = SynthShape::preset(&a.shape) else {
        bail!(
            "unknown shape `{}` (--shape takes one of: {})",
            a.shape,
            SynthShape::PRESETS
        );
    };
    if a.experts.is_some() || a.experts_used.is_some() {
        let Some((n, used)) = arch.default_experts() else {
            bail!(
                "--experts and --experts-used apply to the mixture-of-experts architectures \
                 (qwen2moe, qwen3moe, mixtral, gpt-oss), not `{}`",
                a.arch
            );
        };
        let (n, used) = (a.experts.unwrap_or(n), a.experts_used.unwrap_or(used));
        let max_used = wgllm::ops::moe::MAX_USED;
        if !(2..=512).contains(&n) || used < 1 || used > n || used > max_used {
            bail!(
                "{used} of {n} experts per token: wgllm runs 2 to 512 experts with 1 to \
                 {max_used} used (at most all of them)"
            );
        }
        shape.experts = Some((n, used));
    }
    let ty = match quant::format_by_name(&a.ty) {
        Some(f) if f.quantizer().is_some() => f.ty(),
        _ => bail!(
            "unknown weight type `{}` (--type takes one of: {})",
            a.ty,
            quant::quantizable_names()
        ),
    };
    let bs = ty.block_size() as u32;
    if !shape.n_embd.is_multiple_of(bs) || !shape.n_ff.is_multiple_of(bs) {
        bail!(
            "{ty} stores rows in blocks of {bs} weights, and the {} shape's rows of {} and {} \
             are not whole blocks",
            a.shape,
            shape.n_embd,
            shape.n_ff
        );
    }
    let vocab_from = a.vocab_from.as_ref().context("--vocab-from is needed")?;
    let src = GgufFile::open(vocab_from)?;
    let n_vocab = src
        .get_array("tokenizer.ggml.tokens")
        .with_context(|| format!("{} has no vocabulary", vocab_from.display()))?
        .len() as u64;
    log::info!(
        "writing {} ({:?}, {ty}, {n_vocab} tokens)",
        a.output.display(),
        shape
    );
    let mut vocab = vocab_metadata(&src);
    for kv in &a.override_kv {
        let (key, value) = override_kv(kv)?;
        vocab.retain(|(k, _)| *k != key);
        vocab.push((key, value));
    }
    let scale = if a.trained_scale {
        WeightScale::FanIn
    } else {
        WeightScale::Fixed(0.02)
    };
    let w = model_synth::synth(arch, shape, ty, vocab, n_vocab, scale, a.vocab_only);
    w.write(&a.output)
        .with_context(|| format!("writing {}", a.output.display()))?;
    Ok(())
}

/// `--lora-for BASE`: a random adapter for BASE.
fn synth_lora(a: &SynthArgs, base: &std::path::Path) -> Result<()> {
    let ty = match a.lora_type.to_ascii_lowercase().as_str() {
        "f32" => wgllm::gguf::GgmlType::F32,
        "f16" => wgllm::gguf::GgmlType::F16,
        "q8_0" => wgllm::gguf::GgmlType::Q8_0,
        other => bail!("unknown adapter type `{other}` (--lora-type takes f32, f16 or q8_0)"),
    };
    let f = GgufFile::open(base)?;
    let p = wgllm::model::synth_lora::LoraSynth {
        rank: a.lora_rank,
        alpha: a.lora_alpha,
        ty,
        strength: a.lora_strength,
        seed: a.lora_seed,
        embedding: a.lora_embedding,
    };
    let w = wgllm::model::synth_lora::synth_lora(&f, &p).map_err(anyhow::Error::msg)?;
    w.write(&a.output)
        .with_context(|| format!("writing {}", a.output.display()))?;
    Ok(())
}

/// One `--override-kv KEY=TYPE:VALUE` (a `tokenizer.*` key: the rest of the metadata is
/// the architecture's, written by synth).
fn override_kv(kv: &str) -> Result<(String, Value)> {
    let usage = "--override-kv takes KEY=TYPE:VALUE with TYPE int, float, bool or str";
    let Some((key, typed)) = kv.split_once('=') else {
        bail!("`{kv}`: no `=` ({usage})");
    };
    if !key.starts_with("tokenizer.") {
        bail!("`{key}`: synth sets only tokenizer keys (the architecture's keys come from --arch and --shape)");
    }
    let Some((ty, v)) = typed.split_once(':') else {
        bail!("`{kv}`: no TYPE before the value ({usage})");
    };
    let bad = || anyhow::anyhow!("`{kv}`: `{v}` is not a {ty} ({usage})");
    let value = match ty {
        // Token ids and counts are u32 in llama.cpp's files (and it reads them so).
        "int" => {
            let n: i64 = v.parse().map_err(|_| bad())?;
            u32::try_from(n).map_or(Value::I64(n), Value::U32)
        }
        "float" => Value::F64(v.parse().map_err(|_| bad())?),
        "bool" => Value::Bool(v.parse().map_err(|_| bad())?),
        "str" => Value::String(v.to_string()),
        _ => bail!("`{kv}`: unknown type `{ty}` ({usage})"),
    };
    Ok((key.to_string(), value))
}

/// `--mmproj-for MODEL`: a random mmproj of `--projector`'s layout for MODEL's width.
fn synth_mmproj(a: &SynthArgs, model: &std::path::Path) -> Result<()> {
    let f = GgufFile::open(model).with_context(|| format!("reading {}", model.display()))?;
    let arch = f.architecture()?.to_string();
    let n_out = f.get_u64(&format!("{arch}.embedding_length"))? as u32;
    let ty = match a.mmproj_type.as_str() {
        "f32" => wgllm::gguf::GgmlType::F32,
        "f16" => wgllm::gguf::GgmlType::F16,
        t => bail!("--mmproj-type {t}: choose f32 or f16"),
    };
    use model_synth::{MmprojShape, SynthProjector};
    let (projector, shape) = match a.projector.as_str() {
        "gemma3" => (SynthProjector::Gemma3, MmprojShape::tiny()),
        "idefics3" => (SynthProjector::Idefics3, MmprojShape::tiny_idefics3()),
        "qwen25vl" | "qwen2.5vl_merger" => (SynthProjector::Qwen25vl, MmprojShape::tiny_qwen25vl()),
        p => bail!("--projector {p}: wgllm writes gemma3, idefics3 and qwen25vl mmproj files"),
    };
    let w = model_synth::synth_mmproj(projector, shape, n_out, ty);
    w.write(&a.output)
        .with_context(|| format!("writing {}", a.output.display()))?;
    eprintln!(
        "wrote {} ({} projector, embeddings of {n_out} for {})",
        a.output.display(),
        a.projector,
        model.display()
    );
    Ok(())
}
