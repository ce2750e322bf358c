//! Hyperparameters from GGUF metadata.

use super::ModelError;
use crate::gguf::{GgmlType, GgufFile};
use crate::ops::moe::{Gating, MoeRouting, MAX_USED};
use crate::ops::rope::{intern_factors, RopeParams, Yarn};
use crate::quant;

/// The architectures wgllm runs. Qwen 2/3 and Phi-3 are llama-shaped blocks that differ
/// in data, not in structure: NeoX-style RoPE, Q/K/V biases (qwen2), per-head Q/K norms
/// (qwen3), fused QKV and gate/up tensors (phi3); the llama graph reads what the weights
/// have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    /// OpenAI's gpt-oss: llama-shaped attention with Q/K/V/O biases and a sink logit per
    /// head, a window on even layers, mixture-of-experts feed-forwards with biases, a
    /// clamped SwiGLU and the weights of the chosen experts' logits softmaxed.
    GptOss,
    /// Gemma 2: Gemma 3's sandwich blocks without Q/K norms, a window on every other
    /// layer, attention and final logits soft-capped.
    Gemma2,
    Gemma3,
    Qwen2,
    Qwen3,
    Phi3,
    /// State-space models: every layer a recurrent block (Mamba's selective scan, or
    /// Mamba-2's with grouped heads), no attention.
    Mamba,
    Mamba2,
    /// LiquidAI's hybrid: gated short convolutions (recurrent) and GQA attention layers
    /// with Q/K norms, each followed by a SwiGLU feed-forward.
    Lfm2,
    /// BERT encoders (embedding and reranking models): learned absolute positions and
    /// token types, post-norm blocks of biased non-causal attention and a GELU
    /// feed-forward, layer norms with biases, no output head (embeddings only).
    Bert,
}

pub const SUPPORTED_ARCHS: &str =
    "llama (Llama 1-3, Mistral, Mixtral, SmolLM...), qwen2, qwen2moe, qwen2vl (text), qwen3, qwen3moe, gpt-oss, phi3, gemma2, gemma3, mamba, mamba2, lfm2, bert";

/// The most layers a model may have (llama.cpp's `LLAMA_MAX_LAYERS`).
pub const MAX_LAYERS: u32 = 512;

/// The widest row any size of a model may make (2^24 values: 64 times the widest
/// feed-forward of today's models), checked before anything is sized from it.
pub const MAX_WIDTH: u64 = 1 << 24;

/// `{arch}.block_count`, at least one and at most [`MAX_LAYERS`].
fn layer_count(f: &GgufFile, key: &str) -> Result<u32, ModelError> {
    let n = f.get_u64(key)?;
    if n == 0 || n > MAX_LAYERS as u64 {
        return Err(ModelError::BadHparams {
            path: f.path.clone(),
            msg: format!("{key} = {n}: a model has 1 to {MAX_LAYERS} layers"),
        });
    }
    Ok(n as u32)
}

/// Recurrent families llama.cpp runs that wgllm does not (yet), refused by name.
const UNSUPPORTED_RECURRENT: &[&str] = &[
    "rwkv6",
    "rwkv6qwen2",
    "rwkv7",
    "arwkv7",
    "jamba",
    "falcon-h1",
    "granitehybrid",
    "plamo2",
    "nemotron_h",
    "qwen3next",
    "lfm2moe",
];

/// A state-space layer's sizes (llama.cpp's `ssm_*` hyperparameters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ssm {
    /// Width of the short convolution.
    pub d_conv: u32,
    /// Channels of the scan (2 x n_embd for Mamba).
    pub d_inner: u32,
    /// State values per channel.
    pub d_state: u32,
    /// Mamba: the rank of dt's projection; Mamba-2: the number of heads.
    pub dt_rank: u32,
    /// Mamba-2: groups of heads sharing B and C (1 for Mamba).
    pub n_group: u32,
}

impl Ssm {
    /// Channels of the convolution: x, and for Mamba-2 B and C too.
    pub fn conv_channels(&self, arch: Arch) -> u32 {
        match arch {
            Arch::Mamba2 => self.d_inner + 2 * self.n_group * self.d_state,
            _ => self.d_inner,
        }
    }
}

/// Phi-3's long-context RoPE: two sets of frequency factors, the long one for contexts
/// (per sequence) longer than the original training context, as llama.cpp chooses.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LongRope {
    pub short: &'static [f32],
    pub long: &'static [f32],
    pub n_ctx_orig: u32,
}

impl LongRope {
    /// The factors a context of `n_ctx` cells shared by `n_seq` sequences rotates with.
    /// llama.cpp sizes contexts in multiples of 256 (the whole, then each sequence's
    /// share) and chooses with that size; so does this, so that the same `-c` gives the
    /// same numbers.
    pub fn factors(&self, n_ctx: u32, n_seq: u32) -> &'static [f32] {
        let pad = |n: u32| n.div_ceil(256).saturating_mul(256);
        let n_ctx_seq = pad(pad(n_ctx) / n_seq.max(1));
        if n_ctx_seq > self.n_ctx_orig {
            self.long
        } else {
            self.short
        }
    }
}

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
    /// Phi-3's long/short factors; `rope` holds the short ones until [`Self::fit_context`].
    pub long_rope: Option<LongRope>,
    /// The state-space layers' sizes (Mamba, Mamba-2).
    pub ssm: Option<Ssm>,
    /// Which layers keep a recurrent state instead of attending (all of Mamba's, LFM2's
    /// convolution layers); empty: none.
    pub recurrent: Vec<bool>,
    /// LFM2: the width of the gated short convolution (its state keeps width - 1 inputs).
    pub shortconv_l_cache: u32,
    /// Mixture-of-experts feed-forwards (every layer's), if the model has them.
    pub moe: Option<Moe>,
    /// Gemma 2's soft-capping of the attention scores and of the output logits
    /// (x -> cap tanh(x / cap)); 0: none.
    pub attn_softcap: f32,
    pub final_softcap: f32,
    /// Whether a token attends only to earlier positions (`{arch}.attention.causal`,
    /// true unless the file says otherwise; BERT's converter writes false).
    pub causal: bool,
    /// Scores a classifier head gives (`{arch}.classifier.output_labels`' count, else 1).
    pub n_cls_out: u32,
    /// M-RoPE (Qwen2-VL): the rotated pairs' sections by position component (time, row,
    /// column, unused), `{arch}.rope.dimension_sections`. A text token's components are
    /// all its position, which M-RoPE rotates as the halves rotation (NeoX) does; an
    /// image's tokens would share a time and differ in row and column. Cells at such
    /// positions cannot be moved (no context shift, no Self-Extend), as in llama.cpp.
    pub mrope: Option<[u32; 4]>,
}

/// A mixture-of-experts feed-forward's sizes and routing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Moe {
    pub routing: MoeRouting,
    /// Each expert's feed-forward width.
    pub n_ff_exp: u32,
    /// Qwen2-MoE's shared expert beside the routed ones: its feed-forward width (0: none).
    pub n_ff_shexp: u32,
}

impl Hparams {
    pub fn n_embd_q(&self) -> u32 {
        self.head_dim * self.n_head
    }
    pub fn n_embd_kv(&self) -> u32 {
        self.head_dim * self.n_head_kv
    }

    /// Whether layer `il` keeps a recurrent state instead of attending.
    pub fn is_recurrent(&self, il: usize) -> bool {
        self.recurrent.get(il).copied().unwrap_or(false)
    }

    /// Whether some layer keeps a recurrent state.
    pub fn has_recurrent(&self) -> bool {
        self.recurrent.contains(&true)
    }

    /// Whether any layer attends (and so needs a K/V cache).
    pub fn has_attention(&self) -> bool {
        (0..self.n_layer as usize).any(|il| !self.is_recurrent(il))
    }

    /// Whether some layer is a decoder's attention layer with a gated feed-forward (what
    /// the kernel tuner times): not in state-space models nor in encoders.
    pub fn has_decoder_layer(&self) -> bool {
        self.has_attention() && self.arch != Arch::Bert
    }

    /// Values of a recurrent layer's conv state per sequence (llama.cpp's n_embd_r).
    pub fn n_embd_r(&self) -> u32 {
        if self.shortconv_l_cache > 0 {
            return (self.shortconv_l_cache - 1) * self.n_embd;
        }
        self.ssm
            .map_or(0, |s| (s.d_conv - 1) * s.conv_channels(self.arch))
    }

    /// Values of a recurrent layer's SSM state per sequence (llama.cpp's n_embd_s).
    pub fn n_embd_s(&self) -> u32 {
        self.ssm.map_or(0, |s| s.d_state * s.d_inner)
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

    /// Chooses what depends on the context size: Phi-3's long or short RoPE factors for
    /// `n_ctx` cells shared by `n_seq` sequences. Call before the model is shared.
    pub fn fit_context(&mut self, n_ctx: u32, n_seq: u32) {
        if let Some(lr) = self.long_rope {
            self.rope.freq_factors = Some(lr.factors(n_ctx, n_seq));
            self.rope_swa.freq_factors = self.rope.freq_factors;
        }
    }

    /// Whether these parameters serve such a context (false only for Phi-3 fitted to
    /// the other side of its original context).
    pub fn fits_context(&self, n_ctx: u32, n_seq: u32) -> bool {
        self.long_rope
            .is_none_or(|lr| self.rope.freq_factors == Some(lr.factors(n_ctx, n_seq)))
    }

    /// The hyperparameters `f`'s metadata gives, each read checked and their sizes
    /// bounded ([`Hparams::check_sizes`]) before anything is sized from them.
    pub fn from_gguf(f: &GgufFile) -> Result<Self, ModelError> {
        let hp = Self::read(f)?;
        hp.check_sizes().map_err(|msg| ModelError::BadHparams {
            path: f.path.clone(),
            msg,
        })?;
        Ok(hp)
    }

    /// Every width a tensor's rows, a buffer's stride or a kernel's parameter takes from
    /// these sizes, in u64: each within [`MAX_WIDTH`], so that the u32 arithmetic
    /// downstream cannot overflow; and a window a signed position can hold.
    fn check_sizes(&self) -> Result<(), String> {
        let w = |n: u32| n as u64;
        let q = w(self.head_dim) * w(self.n_head);
        let kv = w(self.head_dim) * w(self.n_head_kv);
        let mut widths = vec![
            ("the vocabulary", w(self.n_vocab)),
            ("the embedding", w(self.n_embd)),
            ("the queries (head size x heads)", q),
            ("Q, K and V together", q + 2 * kv),
            ("the fused gate and up projections", 2 * w(self.n_ff)),
        ];
        if let Some(m) = self.moe {
            widths.push(("an expert's gate and up", 2 * w(m.n_ff_exp)));
            widths.push(("the shared expert's gate and up", 2 * w(m.n_ff_shexp)));
        }
        if let Some(s) = self.ssm {
            let conv = w(s.d_inner) + 2 * w(s.n_group) * w(s.d_state);
            widths.push((
                "the state-space input projection",
                w(s.d_inner) + conv + w(s.dt_rank),
            ));
            widths.push(("the convolution state", w(s.d_conv) * conv));
            widths.push(("the scan state", w(s.d_state) * w(s.d_inner)));
        }
        widths.push((
            "the convolution state",
            w(self.shortconv_l_cache) * w(self.n_embd),
        ));
        if let Some((what, n)) = widths.into_iter().find(|&(_, n)| n > MAX_WIDTH) {
            return Err(format!(
                "{what} would be {n} values wide: wgllm runs models up to {MAX_WIDTH} wide"
            ));
        }
        if let Some(s) = self.swa.filter(|s| s.window > i32::MAX as u32) {
            return Err(format!(
                "a sliding window of {} positions is past the largest position ({})",
                s.window,
                i32::MAX
            ));
        }
        Ok(())
    }

    fn read(f: &GgufFile) -> Result<Self, ModelError> {
        let arch_name = f.architecture()?.to_string();
        let arch = match arch_name.as_str() {
            "llama" => Arch::Llama,
            "gemma2" => Arch::Gemma2,
            "gpt-oss" => Arch::GptOss,
            "gemma3" => Arch::Gemma3,
            // Qwen2's attention with experts and a shared expert (`Hparams::moe`); and
            // Qwen2-VL's and Qwen2.5-VL's language model, whose positions have several
            // components (`Hparams::mrope`).
            "qwen2" | "qwen2moe" | "qwen2vl" => Arch::Qwen2,
            // Qwen3's attention with mixture-of-experts feed-forwards (`Hparams::moe`).
            "qwen3" | "qwen3moe" => Arch::Qwen3,
            "phi3" => Arch::Phi3,
            "mamba" => Arch::Mamba,
            "mamba2" => Arch::Mamba2,
            "lfm2" => Arch::Lfm2,
            "bert" => Arch::Bert,
            other if UNSUPPORTED_RECURRENT.contains(&other) => {
                return Err(ModelError::BadHparams {
                    path: f.path.clone(),
                    msg: format!(
                        "`{other}` is a recurrent or hybrid family wgllm does not run yet (its recurrent and hybrid models: mamba, mamba2, lfm2)"
                    ),
                })
            }
            _ => {
                return Err(ModelError::UnsupportedArch {
                    path: f.path.clone(),
                    arch: arch_name,
                    supported: SUPPORTED_ARCHS,
                })
            }
        };
        if matches!(arch, Arch::Mamba | Arch::Mamba2) {
            return ssm_hparams(f, arch);
        }
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
        // LFM2 gives KV heads per layer, 0 for its convolution layers.
        let mut recurrent = Vec::new();
        let n_head_kv = match f.get(&key("attention.head_count_kv")) {
            Some(v) if v.as_array().is_some() => {
                let per_layer: Vec<u32> = (v.as_array().unwrap_or(&[]).iter())
                    .map(|x| x.as_i64().unwrap_or(-1).clamp(-1, u32::MAX as i64) as u32)
                    .collect();
                recurrent = per_layer.iter().map(|&n| n == 0).collect();
                let attn: Vec<u32> = per_layer.iter().copied().filter(|&n| n != 0).collect();
                match attn.first() {
                    Some(&n) if attn.iter().all(|&m| m == n) => n,
                    _ => {
                        return Err(ModelError::BadHparams {
                            path: f.path.clone(),
                            msg: format!(
                                "{} = {per_layer:?}: attention layers with different KV head counts are not supported",
                                key("attention.head_count_kv")
                            ),
                        })
                    }
                }
            }
            Some(_) => u("attention.head_count_kv")?,
            None => n_head,
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
        // BERT's positions are learned embeddings added to the input: nothing rotates.
        let n_rot = if arch == Arch::Bert {
            0
        } else if f.get(&key("rope.dimension_count")).is_some() {
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
            "linear" | "yarn" => 1.0 / f.get_f32(&key("rope.scaling.factor"))?,
            other => return Err(bad(format!("rope scaling `{other}` is not supported yet"))),
        };
        let n_vocab = vocab_size(f)?;
        // Llama rotates adjacent pairs; the others the two halves of a head (GPT-NeoX).
        let neox = arch != Arch::Llama;
        let mut rope = RopeParams::new(head_dim, n_rot, neox, freq_base, freq_scale);
        rope.freq_factors = rope_factors(f, "rope_freqs.weight", n_rot)?;
        if let Some(v) = f
            .get(&key("rope.scaling.attn_factor"))
            .and_then(|v| v.as_f64())
        {
            rope.attn_factor = v as f32;
        }
        let long_rope = match (
            rope_factors(f, "rope_factors_short.weight", n_rot)?,
            rope_factors(f, "rope_factors_long.weight", n_rot)?,
        ) {
            (Some(short), Some(long)) if arch == Arch::Phi3 => Some(LongRope {
                short,
                long,
                n_ctx_orig: match f.get(&key("rope.scaling.original_context_length")) {
                    Some(_) => u("rope.scaling.original_context_length")?,
                    None => u("context_length")?,
                },
            }),
            (None, None) => None,
            _ => {
                return Err(bad(
                    "rope_factors_short/long: a file needs both, and only phi3 uses them".into(),
                ))
            }
        };
        if let Some(lr) = long_rope {
            rope.freq_factors = Some(lr.short);
        }
        // The magnitude every layer's table carries beyond the file's attn_factor: YaRN's
        // cancelling pair below (1 for a factor over 1); a YaRN layer multiplies in its own
        // correction.
        let mut local_attn = rope.attn_factor;
        if scaling == "yarn" {
            let n_ctx_orig = match f.get(&key("rope.scaling.original_context_length")) {
                Some(_) => u("rope.scaling.original_context_length")?,
                None => u("context_length")?,
            };
            let g = yarn_attn_factor(freq_scale);
            local_attn = rope.attn_factor * g;
            rope.attn_factor = local_attn * (1.0 + 0.1 * (1.0 / freq_scale).ln());
            // llama.cpp reads the file's beta and ext_factor keys only for architectures
            // wgllm does not run (grok, mistral3): its defaults, then.
            rope.yarn = Some(Yarn::new(n_rot, n_ctx_orig, freq_base, 1.0, (32.0, 1.0)));
        }
        let (swa, rope_swa, embd_scale) = match arch {
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Phi3 | Arch::Bert => (None, rope, None),
            Arch::Mamba | Arch::Mamba2 => unreachable!("read by ssm_hparams"),
            Arch::Lfm2 => {
                if f.get(&key("attention.sliding_window")).is_some() {
                    return Err(bad(
                        "LFM2 with sliding-window attention layers is not supported yet".into(),
                    ));
                }
                (None, rope, None)
            }
            Arch::Gemma2 | Arch::GptOss => {
                // Even layers see a window, odd ones everything; both rotate with the
                // file's base unless it gives the window layers their own.
                let window = match f.get(&key("attention.sliding_window")) {
                    Some(_) => u("attention.sliding_window")?,
                    None if arch == Arch::GptOss => {
                        return Err(bad(format!(
                            "{} is missing",
                            key("attention.sliding_window")
                        )))
                    }
                    None => 4096,
                };
                if window == 0 {
                    return Err(bad(format!("{} is 0", key("attention.sliding_window"))));
                }
                let mut local = rope;
                if let Some(b) = f.get(&key("rope.freq_base_swa")).and_then(|v| v.as_f64()) {
                    local.freq_base = b as f32;
                }
                let swa = Swa { window, pattern: 2 };
                let embd_scale = (arch == Arch::Gemma2).then(|| (n_embd as f32).sqrt());
                (Some(swa), local, embd_scale)
            }
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
                    // Unscaled angles; with YaRN, llama.cpp's magnitude without the
                    // correction (log(1 / 1) = 0).
                    attn_factor: local_attn,
                    yarn: None,
                    ..rope
                };
                (Some(swa), local, Some((n_embd as f32).sqrt()))
            }
        };
        let n_layer = layer_count(f, &key("block_count"))?;
        let shortconv_l_cache = if arch == Arch::Lfm2 {
            let l = u("shortconv.l_cache")?;
            if !(2..=8).contains(&l) || recurrent.len() != n_layer as usize {
                return Err(bad(format!(
                    "LFM2: a convolution of width {l} (2-8 supported) and KV head counts for {} of {n_layer} layers",
                    recurrent.len()
                )));
            }
            l
        } else {
            0
        };
        let n_ff = u("feed_forward_length")?;
        let moe = moe_hparams(f, a, n_ff).map_err(bad)?;
        if arch == Arch::GptOss && moe.is_none() {
            return Err(bad(format!("{a} without experts ({a}.expert_count)")));
        }
        if matches!(
            arch,
            Arch::Gemma2 | Arch::Gemma3 | Arch::Phi3 | Arch::Lfm2 | Arch::Bert
        ) && moe.is_some()
        {
            return Err(bad(format!(
                "{a} with mixture-of-experts feed-forwards is not supported (experts: llama as Mixtral, qwen2moe, qwen3moe)"
            )));
        }
        // Gemma 2 caps its attention scores and logits (llama.cpp's defaults: 50 and 30).
        let (attn_softcap, final_softcap) = if arch == Arch::Gemma2 {
            let cap = |k: &str, default: f32| -> Result<f32, ModelError> {
                match f.get(&key(k)) {
                    None => Ok(default),
                    Some(_) => {
                        let v = f.get_f32(&key(k))?;
                        if v.is_finite() && v >= 0.0 {
                            Ok(v)
                        } else {
                            Err(bad(format!("{} = {v} is not a soft cap", key(k))))
                        }
                    }
                }
            };
            (
                cap("attn_logit_softcapping", 50.0)?,
                cap("final_logit_softcapping", 30.0)?,
            )
        } else {
            (0.0, 0.0)
        };
        // Gemma 2 27B (46 layers) and Gemma 3 27B (62) scale queries by n_embd / n_head,
        // as llama.cpp does.
        let query_scale_dim =
            if (arch == Arch::Gemma3 && n_layer == 62) || (arch == Arch::Gemma2 && n_layer == 46) {
                n_embd / n_head
            } else {
                head_dim
            };
        let mrope = match f.get(&key("rope.dimension_sections")) {
            None if arch_name == "qwen2vl" => {
                return Err(bad(format!(
                    "{} is missing: a qwen2vl model's positions need it",
                    key("rope.dimension_sections")
                )))
            }
            None => None,
            Some(v) => {
                let s: Vec<u32> = (v.as_array().unwrap_or_default().iter())
                    .filter_map(|x| x.as_i64())
                    .filter_map(|x| u32::try_from(x).ok())
                    .collect();
                let sum: u32 = s.iter().sum();
                if s.len() != 4 || sum == 0 {
                    return Err(bad(format!(
                        "{} must be 4 sections of rotated pairs, got {v:?}",
                        key("rope.dimension_sections")
                    )));
                }
                // A pair in the fourth section rotates text tokens by a component
                // llama.cpp sets to 0, which the halves rotation does not do.
                let first3 = s[0] + s[1] + s[2];
                if (0..n_rot / 2).any(|k| k % sum >= first3) {
                    return Err(bad(format!(
                        "{}: rotated pairs in the fourth section ({}) are not supported yet",
                        key("rope.dimension_sections"),
                        s[3]
                    )));
                }
                Some([s[0], s[1], s[2], s[3]])
            }
        };
        rope.mrope = mrope;
        Ok(Hparams {
            arch,
            n_vocab,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            mrope,
            n_ctx_train: u("context_length")?,
            // BERT's norms are layer norms, with their own key.
            eps: match arch {
                Arch::Bert => f.get_f32(&key("attention.layer_norm_epsilon"))?,
                _ => f.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
            },
            rope,
            swa,
            rope_swa,
            attn_scale: 1.0 / (query_scale_dim as f32).sqrt(),
            embd_scale,
            long_rope,
            ssm: None,
            shortconv_l_cache,
            recurrent,
            moe,
            attn_softcap,
            final_softcap,
            n_cls_out: match f.get(&key("classifier.output_labels")) {
                None => 1,
                Some(v) => match v.as_array() {
                    Some(labels) if !labels.is_empty() && labels.len() <= 4096 => {
                        labels.len() as u32
                    }
                    _ => {
                        return Err(bad(format!(
                            "{} must be a list of 1 to 4096 labels",
                            key("classifier.output_labels")
                        )))
                    }
                },
            },
            causal: match f.get(&key("attention.causal")) {
                None => true,
                Some(v) => v
                    .as_bool()
                    .ok_or_else(|| bad(format!("{} is not a boolean", key("attention.causal"))))?,
            },
        })
    }
}

/// The vocabulary size: the rows of the token embedding.
fn vocab_size(f: &GgufFile) -> Result<u32, ModelError> {
    let t = f
        .tensor("token_embd.weight")
        .ok_or_else(|| ModelError::MissingTensor {
            path: f.path.clone(),
            tensor: "token_embd.weight".into(),
        })?;
    // Its rows are the vocabulary: at least one, and few enough for a token id.
    match t.dims.get(1).map(|&n| u32::try_from(n)) {
        Some(Ok(n)) if n > 0 => Ok(n),
        _ => Err(ModelError::BadHparams {
            path: f.path.clone(),
            msg: format!(
                "token_embd.weight is {:?}: the embedding needs one row per token, at least one and at most 2^32 - 1",
                t.dims
            ),
        }),
    }
}

/// A state-space model's hyperparameters: no attention (head counts 0), the `ssm.*`
/// sizes, which the kernels must hold.
fn ssm_hparams(f: &GgufFile, arch: Arch) -> Result<Hparams, ModelError> {
    let a = f.architecture()?.to_string();
    let key = |k: &str| format!("{a}.{k}");
    let bad = |msg: String| ModelError::BadHparams {
        path: f.path.clone(),
        msg,
    };
    let u = |k: &str| -> Result<u32, ModelError> {
        let v = f.get_u64(&key(k))?;
        u32::try_from(v).map_err(|_| bad(format!("{} = {v} is out of range", key(k))))
    };
    let n_embd = u("embedding_length")?;
    let ssm = Ssm {
        d_conv: u("ssm.conv_kernel")?,
        d_inner: u("ssm.inner_size")?,
        d_state: u("ssm.state_size")?,
        dt_rank: u("ssm.time_step_rank")?,
        n_group: if arch == Arch::Mamba2 {
            u("ssm.group_count")?
        } else {
            1
        },
    };
    if f.get(&key("ssm.dt_b_c_rms")).and_then(|v| v.as_bool()) == Some(true) {
        return Err(bad(
            "RMS norms on dt, B and C (ssm.dt_b_c_rms: FalconMamba) are not supported yet".into(),
        ));
    }
    let max_ds = crate::ops::ssm::max_d_state();
    let heads_ok = match arch {
        Arch::Mamba2 => {
            ssm.dt_rank > 0
                && ssm.d_inner.is_multiple_of(ssm.dt_rank)
                && ssm.n_group > 0
                && ssm.dt_rank.is_multiple_of(ssm.n_group)
        }
        _ => ssm.dt_rank > 0 && Some(ssm.d_inner) == n_embd.checked_mul(2),
    };
    if !(2..=8).contains(&ssm.d_conv) || ssm.d_state == 0 || ssm.d_state > max_ds || !heads_ok {
        return Err(bad(format!(
            "state-space sizes {ssm:?} are not supported (convolution width 2-8, state size 1-{max_ds}; Mamba: inner size 2 x embedding; Mamba-2: inner size a multiple of the heads, heads of the groups)"
        )));
    }
    let n_vocab = vocab_size(f)?;
    let rope = RopeParams::new(4, 4, false, 10_000.0, 1.0);
    let n_layer = layer_count(f, &key("block_count"))?;
    Ok(Hparams {
        arch,
        n_vocab,
        n_embd,
        n_layer,
        n_head: 0,
        n_head_kv: 0,
        head_dim: 0,
        n_ff: 0,
        n_ctx_train: f
            .get(&key("context_length"))
            .and_then(|v| v.as_i64())
            .unwrap_or(1 << 20)
            .clamp(0, u32::MAX as i64) as u32,
        eps: f.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
        rope,
        swa: None,
        rope_swa: rope,
        attn_scale: 1.0,
        embd_scale: None,
        long_rope: None,
        ssm: Some(ssm),
        recurrent: vec![true; n_layer as usize],
        shortconv_l_cache: 0,
        moe: None,
        attn_softcap: 0.0,
        final_softcap: 0.0,
        causal: true,
        n_cls_out: 1,
        mrope: None,
    })
}

/// A RoPE frequency-factor tensor, if the file has it: Llama 3's `rope_freqs.weight`
/// (its long-context frequency scaling), Phi-3's `rope_factors_short/long.weight`; one
/// divisor per rotated pair.
/// The experts of architecture `a`'s feed-forwards, if its `expert_count` is over 1 (as
/// llama.cpp reads it): each token's `expert_used_count` experts chosen by softmax, each
/// `expert_feed_forward_length` wide (else Qwen-MoE's feed-forward width / experts used,
/// Mixtral's feed-forward width). Mixtral and Qwen3-MoE renormalise the chosen weights,
/// Qwen2-MoE keeps the softmax's probabilities and adds a shared expert
/// `expert_shared_feed_forward_length` wide (else the feed-forward width). llama.cpp
/// reads no weight scale for these architectures.
fn moe_hparams(f: &GgufFile, a: &str, n_ff: u32) -> Result<Option<Moe>, String> {
    let get = |k: &str| f.get(&format!("{a}.{k}")).and_then(|v| v.as_i64());
    let n_expert = get("expert_count").unwrap_or(0);
    if n_expert <= 1 {
        if matches!(a, "qwen2moe" | "gpt-oss") {
            return Err(format!("{a}.expert_count is missing or below 2"));
        }
        return Ok(None);
    }
    let n_used = get("expert_used_count").unwrap_or(0);
    if n_used < 1 || n_used > n_expert || n_used > MAX_USED as i64 || n_expert > 512 {
        return Err(format!(
            "{a}.expert_used_count = {n_used} of {n_expert} experts: 1 to {MAX_USED} of at most 512 are supported"
        ));
    }
    let qwen_moe = matches!(a, "qwen2moe" | "qwen3moe");
    // gpt-oss softmaxes the chosen experts' logits (the weights sum to 1 without a
    // renormalisation).
    let (gating, norm) = match a {
        "gpt-oss" => (Gating::SoftmaxWeight, false),
        "qwen2moe" => (Gating::Softmax, false),
        _ => (Gating::Softmax, true),
    };
    let n_ff_exp = match get("expert_feed_forward_length") {
        Some(v) if v > 0 => v,
        _ if qwen_moe => n_ff as i64 / n_used,
        _ => n_ff as i64,
    };
    let n_ff_shexp = match (a, get("expert_shared_feed_forward_length")) {
        ("qwen2moe", Some(v)) if v > 0 => v,
        ("qwen2moe", _) => n_ff as i64,
        _ => 0,
    };
    for (what, v) in [("an expert", n_ff_exp), ("a shared expert", n_ff_shexp)] {
        if v < 0 || v > u32::MAX as i64 || (v == 0 && what == "an expert") {
            return Err(format!("{a}: {what} feed-forward width of {v}"));
        }
    }
    Ok(Some(Moe {
        routing: MoeRouting {
            n_expert: n_expert as u32,
            n_used: n_used as u32,
            gating,
            norm,
            scale: 0.0,
        },
        n_ff_exp: n_ff_exp as u32,
        n_ff_shexp: n_ff_shexp as u32,
    }))
}

/// The factor llama.cpp multiplies a YaRN model's RoPE magnitude by before ggml adds its
/// own correction (1 + 0.1 ln(1 / freq_scale)): YaRN's scale, then that correction
/// cancelled (so 1, up to rounding, for a factor over 1). In f32, as llama.cpp computes it.
fn yarn_attn_factor(freq_scale: f32) -> f32 {
    let factor = 1.0 / freq_scale;
    let mscale = if factor <= 1.0 {
        1.0
    } else {
        0.1 * factor.ln() + 1.0
    };
    mscale * (1.0 / (1.0 + 0.1 * factor.ln()))
}

fn rope_factors(
    f: &GgufFile,
    name: &str,
    n_rot: u32,
) -> Result<Option<&'static [f32]>, ModelError> {
    let Some(t) = f.tensor(name) else {
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
            msg: format!("{name} holds a factor that is not a positive number"),
        });
    }
    Ok(Some(intern_factors(&v)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::Value;
    use crate::model::synth::{synth, SynthArch, SynthShape, WeightScale};

    /// `arch` at the micro shape with metadata `changes`, read back.
    fn read_with(arch: &str, changes: &[(&str, Value)]) -> Result<Hparams, ModelError> {
        let arch = SynthArch::by_name(arch).unwrap();
        let shape = SynthShape::preset("micro").unwrap();
        let mut w = synth(
            arch,
            shape,
            GgmlType::Q8_0,
            Vec::new(),
            16,
            WeightScale::Fixed(0.02),
            false,
        );
        for (k, v) in changes {
            w.set_meta(&format!("{}.{k}", arch.gguf_arch()), v.clone());
        }
        let f = GgufFile::from_bytes("t.gguf", w.to_bytes()).unwrap();
        Hparams::from_gguf(&f)
    }

    fn refused(arch: &str, changes: &[(&str, Value)], says: &str) {
        match read_with(arch, changes) {
            Err(ModelError::BadHparams { msg, .. }) => assert!(msg.contains(says), "{msg}"),
            other => panic!("{changes:?}: {other:?}"),
        }
    }

    #[test]
    fn sizes_a_file_sets_are_bounded_before_anything_is_sized_from_them() {
        for arch in ["llama", "gemma2", "mamba", "mamba2", "qwen2moe", "lfm2"] {
            read_with(arch, &[]).unwrap_or_else(|e| panic!("{arch}: {e}"));
        }
        // 2^32 - 1 layers would be a vector of 32 GiB before the first tensor is missed.
        for arch in ["llama", "mamba"] {
            refused(
                arch,
                &[("block_count", Value::U32(u32::MAX))],
                "1 to 512 layers",
            );
            refused(arch, &[("block_count", Value::U32(0))], "1 to 512 layers");
        }
        // 65536 heads of 65536: the queries' width overflows u32.
        refused(
            "llama",
            &[
                ("attention.head_count", Value::U32(1 << 16)),
                ("attention.head_count_kv", Value::U32(1 << 16)),
                ("attention.key_length", Value::U32(1 << 16)),
            ],
            "the queries",
        );
        refused(
            "llama",
            &[("feed_forward_length", Value::U32(1 << 31))],
            "gate and up",
        );
        refused(
            "qwen2moe",
            &[("expert_feed_forward_length", Value::U32(u32::MAX))],
            "an expert's",
        );
        // Mamba's inner size is twice the embedding's: 2^31 x 2 used to wrap to 0.
        assert!(read_with("mamba", &[("embedding_length", Value::U32(1 << 31))]).is_err());
        refused(
            "mamba2",
            &[("ssm.state_size", Value::U32(u32::MAX))],
            "state",
        );
        // A window no signed position can hold.
        refused(
            "gemma2",
            &[("attention.sliding_window", Value::U32(1 << 31))],
            "sliding window",
        );
    }
}
