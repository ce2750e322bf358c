//! Hyperparameters from GGUF metadata.

use super::ModelError;
use crate::gguf::{quant, GgmlType, GgufFile};
use crate::ops::rope::{intern_factors, RopeParams};

/// The architectures wgllm runs. Qwen 2/3 and Phi-3 are llama-shaped blocks that differ
/// in data, not in structure: NeoX-style RoPE, Q/K/V biases (qwen2), per-head Q/K norms
/// (qwen3), fused QKV and gate/up tensors (phi3); the llama graph reads what the weights
/// have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Gemma3,
    Qwen2,
    Qwen3,
    Phi3,
}

pub const SUPPORTED_ARCHS: &str =
    "llama (Llama 1-3, Mistral, SmolLM...), qwen2, qwen3, phi3 (4k-context RoPE), gemma3";

/// Interleaved sliding-window attention: layer `il` attends over a window of `window`
/// positions unless `il % pattern == pattern - 1` (every `pattern`-th layer is global).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Swa {
    pub window: u32,
    pub pattern: u32,
}

#[derive(Clone, Debug)]
pub struct Hparams {
    pub arch: Arch,
    pub n_vocab: u32,
    pub n_embd: u32,
    pub n_layer: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    pub head_dim: u32,
    pub n_ff: u32,
    pub n_ctx_train: u32,
    pub eps: f32,
    /// RoPE of the global (full-attention) layers.
    pub rope: RopeParams,
    /// Sliding-window layers, if the model has them, and their own RoPE.
    pub swa: Option<Swa>,
    pub rope_swa: RopeParams,
    /// Softmax scale of the attention scores (1/sqrt(head_dim) unless the model says).
    pub attn_scale: f32,
    /// The token embeddings are multiplied by this (Gemma: sqrt(n_embd)).
    pub embd_scale: Option<f32>,
}

impl Hparams {
    pub fn n_embd_q(&self) -> u32 {
        self.head_dim * self.n_head
    }
    pub fn n_embd_kv(&self) -> u32 {
        self.head_dim * self.n_head_kv
    }

    /// Whether layer `il` attends over a sliding window (else over the whole context).
    pub fn is_swa(&self, il: usize) -> bool {
        self.swa
            .is_some_and(|s| s.pattern == 0 || (il as u32) % s.pattern < s.pattern - 1)
    }

    /// The window of layer `il`, None for a global layer.
    pub fn layer_window(&self, il: usize) -> Option<u32> {
        self.swa.filter(|_| self.is_swa(il)).map(|s| s.window)
    }

    /// The RoPE parameters layer `il` rotates Q and K with (the K-shift uses them too).
    pub fn layer_rope(&self, il: usize) -> RopeParams {
        if self.is_swa(il) {
            self.rope_swa
        } else {
            self.rope
        }
    }

    pub fn from_gguf(f: &GgufFile) -> Result<Self, ModelError> {
        let arch_name = f.architecture()?.to_string();
        let arch = match arch_name.as_str() {
            "llama" => Arch::Llama,
            "gemma3" => Arch::Gemma3,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "phi3" => Arch::Phi3,
            _ => {
                return Err(ModelError::UnsupportedArch {
                    path: f.path.clone(),
                    arch: arch_name,
                    supported: SUPPORTED_ARCHS,
                })
            }
        };
        let a = arch_name.as_str();
        let key = |k: &str| format!("{a}.{k}");
        let u = |k: &str| -> Result<u32, ModelError> {
            let v = f.get_u64(&key(k))?;
            u32::try_from(v).map_err(|_| ModelError::BadHparams {
                path: f.path.clone(),
                msg: format!("{} = {v} is out of range", key(k)),
            })
        };
        let n_embd = u("embedding_length")?;
        let n_head = u("attention.head_count")?;
        let n_head_kv = if f.get(&key("attention.head_count_kv")).is_some() {
            u("attention.head_count_kv")?
        } else {
            n_head
        };
        let bad = |msg: String| ModelError::BadHparams {
            path: f.path.clone(),
            msg,
        };
        if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(bad(format!(
                "head counts {n_head}/{n_head_kv} are inconsistent"
            )));
        }
        let head_dim = if f.get(&key("attention.key_length")).is_some() {
            u("attention.key_length")?
        } else {
            n_embd / n_head
        };
        let n_rot = if f.get(&key("rope.dimension_count")).is_some() {
            u("rope.dimension_count")?
        } else {
            head_dim
        };
        if n_embd == 0 || head_dim == 0 || head_dim % 4 != 0 || n_rot > head_dim || n_rot % 2 != 0 {
            return Err(bad(format!(
                "embedding width {n_embd}, head size {head_dim} / rotary dims {n_rot} are not supported"
            )));
        }
        let freq_base = f
            .get(&key("rope.freq_base"))
            .and_then(|v| v.as_f64())
            .unwrap_or(10000.0) as f32;
        let scaling = f
            .get(&key("rope.scaling.type"))
            .and_then(|v| v.as_str())
            .unwrap_or("none");
        let freq_scale = match scaling {
            "none" => 1.0,
            "linear" => 1.0 / f.get_f32(&key("rope.scaling.factor"))?,
            other => return Err(bad(format!("rope scaling `{other}` is not supported yet"))),
        };
        let n_vocab = f
            .tensor("token_embd.weight")
            .map(|t| t.dims.get(1).copied().unwrap_or(0) as u32)
            .ok_or_else(|| ModelError::MissingTensor {
                path: f.path.clone(),
                tensor: "token_embd.weight".into(),
            })?;
        // Llama rotates adjacent pairs; the others the two halves of a head (GPT-NeoX).
        let neox = arch != Arch::Llama;
        let mut rope = RopeParams::new(head_dim, n_rot, neox, freq_base, freq_scale);
        rope.freq_factors = rope_factors(f, arch, n_rot)?;
        let (swa, rope_swa, embd_scale) = match arch {
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Phi3 => (None, rope, None),
            Arch::Gemma3 => {
                // Five of every six layers see a window; they rotate with base 10 000
                // and no scaling, as llama.cpp fixes for this architecture.
                let window = u("attention.sliding_window")?;
                if window == 0 {
                    return Err(bad(format!("{} is 0", key("attention.sliding_window"))));
                }
                let swa = Swa { window, pattern: 6 };
                let local = RopeParams {
                    freq_base: 10_000.0,
                    freq_scale: 1.0,
                    ..rope
                };
                (Some(swa), local, Some((n_embd as f32).sqrt()))
            }
        };
        // Gemma 3 27B (62 layers) scales queries by n_embd / n_head rather than its head
        // size, as its reference implementation does.
        let n_layer = u("block_count")?;
        let query_scale_dim = if arch == Arch::Gemma3 && n_layer == 62 {
            n_embd / n_head
        } else {
            head_dim
        };
        Ok(Hparams {
            arch,
            n_vocab,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            n_ff: u("feed_forward_length")?,
            n_ctx_train: u("context_length")?,
            eps: f.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
            rope,
            swa,
            rope_swa,
            attn_scale: 1.0 / (query_scale_dim as f32).sqrt(),
            embd_scale,
        })
    }
}

/// RoPE frequency factors the file carries: Llama 3's `rope_freqs.weight` (its
/// long-context frequency scaling, one divisor per rotated pair). Phi-3's long/short
/// factor pairs are chosen by context length and come with a magnitude scale; they are
/// refused until that choice is made per context.
fn rope_factors(
    f: &GgufFile,
    arch: Arch,
    n_rot: u32,
) -> Result<Option<&'static [f32]>, ModelError> {
    if arch == Arch::Phi3
        && (f.tensor("rope_factors_long.weight").is_some()
            || f.tensor("rope_factors_short.weight").is_some())
    {
        return Err(ModelError::BadHparams {
            path: f.path.clone(),
            msg: "phi3 with long-context RoPE factors (rope_factors_long/short, e.g. \
                  Phi-3.5-mini or Phi-3-*-128k) is not supported yet; 4k-context Phi-3 models are"
                .into(),
        });
    }
    let Some(t) = f.tensor("rope_freqs.weight") else {
        return Ok(None);
    };
    let half = (n_rot / 2) as u64;
    if t.dims != [half] || !matches!(t.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16) {
        return Err(ModelError::BadShape {
            path: f.path.clone(),
            tensor: t.name.clone(),
            got: t.dims.clone(),
            want: vec![half],
        });
    }
    let mut v = vec![0f32; half as usize];
    quant::dequantize_row(t.ty, f.tensor_data(t), &mut v);
    if v.iter().any(|&x| !(x.is_finite() && x > 0.0)) {
        return Err(ModelError::BadHparams {
            path: f.path.clone(),
            msg: "rope_freqs.weight holds a factor that is not a positive number".into(),
        });
    }
    Ok(Some(intern_factors(&v)))
}
