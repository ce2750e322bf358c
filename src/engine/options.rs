//! Everything that decides how an engine is built: context and batch sizes, sequences,
//! the GPU and its kernel choices. Front ends fill one of these from their flags.

use crate::context::ContextParams;
use crate::gpu::GpuOptions;
use crate::model::Hparams;
use crate::tune::TuneOptions;

/// How to build an [`super::Engine`]. The defaults are llama.cpp's.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Cache cells (`-c`); 0: the model's training context, capped at 4096.
    pub n_ctx: u32,
    /// Most tokens one decode call takes (`-b`).
    pub n_batch: u32,
    /// Most tokens one graph computes (`-ub`).
    pub n_ubatch: u32,
    /// Sessions served at once (`-np`), each on its own sequence of the cache, each with
    /// an equal share of the cells for its context-shift decisions.
    pub n_seq_max: u32,
    /// Compact the cache when this share of the cells below the used bound are holes
    /// (`--defrag-thold`; <= 0: never).
    pub defrag_thold: f32,
    /// Sliding-window layers keep a full-size cache (`--swa-full`) instead of a rolling
    /// buffer of their window.
    pub swa_full: bool,
    /// Positions the rolling buffer never drops (`--keep` plus BOS: a context shift
    /// brings them back inside the window); `u32::MAX` keeps everything.
    pub swa_keep: u32,
    /// Every session may use the whole cache (llama.cpp's `--kv-unified`) instead of an
    /// equal share; when the cells run out, the step fails for every session in it.
    pub kv_unified: bool,
    /// Cache types and flash attention (-ctk, -ctv, -fa).
    pub kv: crate::kv::KvConfig,
    /// Backend, adapter, f16/subgroups, kernel shapes and tuning.
    pub gpu: GpuOptions,
    /// Whether `--kernels auto` / `--backend auto` are decided by measurement (cached),
    /// see [`crate::tune`].
    pub tune: TuneOptions,
    /// Where generated tokens are sampled (`--sampling`).
    pub sampling: SamplingPath,
    /// Where tokens are drawn on the GPU, submit each step before the last one's tokens
    /// are read (see `engine/ahead.rs`).
    pub decode_ahead: bool,
    /// An embeddings engine (`--embeddings`): steps output hidden states, read by
    /// [`super::Engine::embed`], and nothing is generated.
    pub embeddings: bool,
    /// A reranking engine (`--reranking`): an embeddings engine whose outputs are a
    /// reranker's classifier scores ([`super::Pooling::Rank`]).
    pub reranking: bool,
    /// LoRA adapter files loaded with the model (`--lora`, `--lora-scaled`), in order:
    /// their ids. Each applies at its scale unless `lora_init_without_apply`.
    pub lora: Vec<LoraSpec>,
    /// Load the adapters with every scale 0 (`--lora-init-without-apply`): a server sets
    /// them later (`POST /lora-adapters`, or per request).
    pub lora_init_without_apply: bool,
    /// Several devices, the model's layers split over them (`--device A,B -sm layer`);
    /// `None`: the one adapter of `gpu`.
    pub split: Option<SplitSpec>,
    /// A split model overlaps the ubatches of a batch on its devices (off: each ubatch
    /// passes every device before the next starts; `wgllm bench --no-pipeline`).
    pub pipeline: bool,
}

/// A model split by layers over several adapters (llama.cpp's `-sm layer`): each holds
/// its layers' weights and their part of the cache; the main one also holds the
/// embeddings, the output head and GPU sampling.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SplitSpec {
    /// Adapter indices of `gpu.backend`'s list (`wgllm devices`), in layer order.
    pub devices: Vec<usize>,
    /// Each device's share of the layers (`-ts`); empty: equal shares (wgpu reports no
    /// adapter's memory size to share by).
    pub shares: Vec<f32>,
    /// Which of `devices` is the main one (`-mg`, an index into `devices`).
    pub main: usize,
}

/// One `--lora` file and its scale.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraSpec {
    pub path: std::path::PathBuf,
    pub scale: f32,
}

/// Where a generated token is sampled: on the host from the read-back logits, or on the
/// GPU (`crate::ops::sample`), which reads back only the token. Sessions whose settings
/// the GPU chain lacks (a grammar, typical-p, XTC, top-n-sigma, dynamic temperature,
/// top-k off or above 256, the model's own token probabilities) sample on the host
/// either way; post-sampling probabilities come with the GPU's token.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SamplingPath {
    /// Where the tuner measured a token cheaper picked (`crate::tune`); without a
    /// measurement (a page, `--no-tune`), the GPU on GPU-shaped adapters and the host on
    /// CPU-shaped ones (lavapipe).
    #[default]
    Auto,
    Cpu,
    Gpu,
}

impl std::str::FromStr for SamplingPath {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "auto" => SamplingPath::Auto,
            "cpu" => SamplingPath::Cpu,
            "gpu" => SamplingPath::Gpu,
            other => {
                return Err(format!(
                    "unknown sampling path `{other}` (choose auto, cpu or gpu)"
                ))
            }
        })
    }
}

impl std::fmt::Display for SamplingPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SamplingPath::Auto => "auto",
            SamplingPath::Cpu => "cpu",
            SamplingPath::Gpu => "gpu",
        })
    }
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            n_ctx: 4096,
            n_batch: 2048,
            n_ubatch: 512,
            n_seq_max: 1,
            defrag_thold: -1.0,
            swa_full: false,
            swa_keep: 0,
            kv_unified: false,
            kv: Default::default(),
            gpu: GpuOptions::default(),
            tune: TuneOptions::default(),
            sampling: SamplingPath::Auto,
            decode_ahead: true,
            embeddings: false,
            reranking: false,
            lora: Vec::new(),
            lora_init_without_apply: false,
            split: None,
            pipeline: true,
        }
    }
}

impl EngineOptions {
    /// The context parameters for a model, with llama.cpp's defaults and clamps: the
    /// batch no larger than the context, the ubatch no larger than the batch.
    pub fn context_params(&self, hp: &Hparams) -> Result<ContextParams, String> {
        let n_ctx = if self.n_ctx == 0 {
            hp.n_ctx_train.min(4096)
        } else {
            self.n_ctx
        };
        if self.n_batch == 0 || self.n_ubatch == 0 {
            return Err(format!(
                "batch sizes must be positive (-b {}, -ub {})",
                self.n_batch, self.n_ubatch
            ));
        }
        if n_ctx > hp.n_ctx_train {
            log::warn!(
                "context size {n_ctx} is larger than the model's training context {}",
                hp.n_ctx_train
            );
        }
        Ok(ContextParams {
            n_ctx,
            n_batch: self.n_batch.min(n_ctx),
            n_ubatch: self.n_ubatch.min(self.n_batch).min(n_ctx),
            n_seq_max: self.n_seq_max,
            defrag_thold: self.defrag_thold,
            swa_full: self.swa_full,
            swa_keep: self.swa_keep.min(n_ctx),
            kv: self.kv,
            embeddings: self.embeddings || self.reranking,
            rank: self.reranking,
        })
    }
}
