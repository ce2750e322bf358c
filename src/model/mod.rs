//! Models: hyperparameters and weights from a GGUF file, and one file per architecture
//! that builds the forward graph for a ubatch.

mod bert;
mod gemma;
mod gpt_oss;
mod hparams;
mod lfm2;
mod llama;
pub mod lora;
mod mamba;
pub mod synth;
pub mod synth_lora;
mod weights;

pub use crate::graph::inputs::{CacheKind, CacheState, GraphInput, GraphIo, InputData, UbatchView};
pub use hparams::{Arch, Hparams, LongRope, Ssm};
pub use weights::{
    BertLayer, BertWeights, Classifier, GateUp, LayerWeights, Lfm2Layer, Lfm2Mixer, ModelWeights,
    SsmLayer,
};

use crate::gguf::{GgmlType, GgufError, GgufFile};
use crate::gpu::{Gpu, GpuError, Placement};
use crate::graph::{AttnBlock, AttnInputs};
use crate::memory::{KvLayer, Memory};
use crate::ops::attention::AttnShape;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("{path}: unsupported model architecture `{arch}` (wgllm supports: {supported})")]
    UnsupportedArch {
        path: String,
        arch: String,
        supported: &'static str,
    },
    #[error("{path}: tensor `{tensor}` has type {ty}, which wgllm cannot compute with yet (supported: {supported})", supported = crate::quant::supported_names())]
    UnsupportedType {
        path: String,
        tensor: String,
        ty: GgmlType,
    },
    #[error("{path}: required tensor `{tensor}` is missing")]
    MissingTensor { path: String, tensor: String },
    #[error("{path}: tensor `{tensor}` has shape {got:?}, expected {want:?}")]
    BadShape {
        path: String,
        tensor: String,
        got: Vec<u64>,
        want: Vec<u64>,
    },
    #[error("{path}: {msg}")]
    BadHparams { path: String, msg: String },
}

/// A loaded model: hyperparameters plus weights resident on the GPU.
pub struct Model {
    pub hp: Hparams,
    pub weights: ModelWeights,
    /// The main device (the only one, unless the model is split: [`Model::placement`]).
    pub gpu: Arc<Gpu>,
    /// The devices the model runs on and each layer's.
    pub placement: Arc<Placement>,
    /// `general.name`, for logs.
    pub name: String,
    /// Parameters in the file, and those a token uses (see [`param_counts`]).
    pub n_params: u64,
    pub n_params_active: u64,
    /// `general.architecture` as the file spells it (an adapter must name the same).
    pub arch_name: String,
    /// LoRA adapters loaded for this model (`--lora`), in load order; a context says
    /// which apply and at what scale.
    pub loras: Vec<Arc<lora::LoraAdapter>>,
    /// [`GgufFile::fingerprint`] of its file: state files record it, and one saved from
    /// other weights of the same shape is refused.
    pub fingerprint: u64,
}

/// A parameter count as model names give it: "135M", "30.5B".
pub fn short_count(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.1}B", n as f64 / 1e9),
        n => format!("{}M", (n as f64 / 1e6).round()),
    }
}

/// The parameters in `f`'s tensors, and those one token uses: all but the unchosen
/// experts' (`expert_used_count` of `expert_count` experts' weights in a mixture).
pub fn param_counts(f: &GgufFile) -> (u64, u64) {
    // Saturating: a file's dimensions are its own to claim (a type of no bytes costs none).
    let sum = |n: u64, m: u64| n.saturating_add(m);
    let n_params = f.tensors.iter().map(|t| t.n_elements()).fold(0, sum);
    let arch = f
        .get("general.architecture")
        .and_then(|v| v.as_str())
        .unwrap_or("?");
    let count = |k: &str| f.get(&format!("{arch}.{k}")).and_then(|v| v.as_i64());
    let active = match (count("expert_count"), count("expert_used_count")) {
        (Some(ne), Some(nu)) if ne > 1 && nu > 0 && nu <= ne => {
            let experts: u64 = (f.tensors.iter())
                .filter(|t| t.name.ends_with("_exps.weight") || t.name.ends_with("_exps.bias"))
                .map(|t| t.n_elements())
                .fold(0, sum);
            n_params.saturating_sub(experts) + experts / ne as u64 * nu as u64
        }
        _ => n_params,
    };
    (n_params, active)
}

impl Model {
    /// What the memory needs to know of this model: each layer's kind (attention with
    /// its keys' RoPE and whether it sees a sliding window, or a recurrent state) and
    /// the rows' sizes.
    pub fn memory_shape(&self) -> crate::memory::MemoryShape {
        use crate::memory::LayerMemory;
        let hp = &self.hp;
        let layers = (0..hp.n_layer as usize)
            .map(|il| {
                if hp.is_recurrent(il) {
                    LayerMemory::Recurrent
                } else {
                    LayerMemory::Attention {
                        rope: hp.layer_rope(il),
                        swa: hp.is_swa(il),
                    }
                }
            })
            .collect();
        crate::memory::MemoryShape {
            gpu: self.gpu.clone(),
            placement: self.placement.clone(),
            layers,
            n_head_kv: hp.n_head_kv,
            head_dim: hp.head_dim,
            n_embd_r: hp.n_embd_r(),
            n_embd_s: hp.n_embd_s(),
            swa_window: hp.swa.map(|s| s.window),
        }
    }

    /// Reads hyperparameters and uploads every weight. `progress(done, total)` is called
    /// in bytes as tensors are uploaded.
    pub fn load(
        gpu: Arc<Gpu>,
        f: &GgufFile,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Model, ModelError> {
        let hp = Hparams::from_gguf(f)?;
        let placement = Placement::single(gpu, hp.n_layer as usize);
        Self::load_placed(placement, f, progress)
    }

    /// [`Model::load`] over several devices: each layer's weights go to its device in
    /// `placement` (made for this file's layer count), the rest to the main device.
    pub fn load_placed(
        placement: Placement,
        f: &GgufFile,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Model, ModelError> {
        let hp = Hparams::from_gguf(f)?;
        if placement.n_layer() != hp.n_layer as usize {
            return Err(ModelError::BadHparams {
                path: f.path.clone(),
                msg: format!(
                    "a placement of {} layers for a model of {}",
                    placement.n_layer(),
                    hp.n_layer
                ),
            });
        }
        if placement.is_split() && hp.arch == Arch::Bert {
            return Err(ModelError::BadHparams {
                path: f.path.clone(),
                msg: "BERT encoders run on one device: a layer split (-sm layer) is for decoders; use --device with one adapter".into(),
            });
        }
        let weights = ModelWeights::load(&placement, f, &hp, progress)?;
        let gpu = placement.main().clone();
        let name = f
            .get("general.name")
            .and_then(|v| v.as_str())
            .unwrap_or("model")
            .to_string();
        let (n_params, n_params_active) = param_counts(f);
        Ok(Model {
            hp,
            weights,
            gpu,
            placement: Arc::new(placement),
            name,
            n_params,
            n_params_active,
            arch_name: f.architecture()?.to_string(),
            loras: Vec::new(),
            fingerprint: f.fingerprint(),
        })
    }

    /// The per-ubatch inputs this model's graph reads, without repeats; the context
    /// allocates and fills one buffer for each.
    pub fn inputs(&self) -> Vec<GraphInput> {
        crate::graph::inputs::dedup(match self.hp.arch {
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Phi3 => llama::inputs(&self.hp),
            Arch::Gemma2 | Arch::Gemma3 | Arch::GptOss => windowed_inputs(&self.hp),
            Arch::Mamba | Arch::Mamba2 => mamba::inputs(),
            Arch::Lfm2 => lfm2::inputs(&self.hp),
            Arch::Bert => bert::inputs(&self.hp),
        })
    }

    /// Builds the forward graph for one ubatch over the buffers of [`Self::inputs`] and
    /// the layers of `mem`.
    pub fn build_graph(
        &self,
        io: &GraphIo,
        mem: &dyn Memory,
    ) -> Result<crate::graph::Graph, GpuError> {
        match self.hp.arch {
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Phi3 => llama::build(self, io, mem),
            Arch::Gemma2 | Arch::Gemma3 => gemma::build(self, io, mem),
            Arch::GptOss => gpt_oss::build(self, io, mem),
            Arch::Mamba | Arch::Mamba2 => mamba::build(self, io, mem),
            Arch::Lfm2 => lfm2::build(self, io, mem),
            Arch::Bert => bert::build(self, io, mem),
        }
    }

    /// Whether the model ends in an output head (logits); an encoder's output is its
    /// states, for an embeddings context.
    pub fn has_output_head(&self) -> bool {
        self.hp.arch != Arch::Bert
    }

    /// Whether the model has a classifier head that scores a sequence (a reranker).
    pub fn has_classifier(&self) -> bool {
        (self.weights.bert.as_ref()).is_some_and(|b| b.classifier.is_some())
            || self.weights.cls_out.is_some()
    }

    /// Floats the classifier head gives per sequence: its scores, or where it ends in
    /// the dense layer (no `cls.output`, as jina-reranker-v1) that layer's n_embd, of
    /// which a reranker's score is the first.
    pub fn n_rank_out(&self) -> u32 {
        match self
            .weights
            .bert
            .as_ref()
            .and_then(|b| b.classifier.as_ref())
        {
            Some(c) if c.out.is_none() => self.hp.n_embd,
            _ => self.hp.n_cls_out,
        }
    }

    /// The positions a model with learned position embeddings has rows for (none for
    /// the others).
    pub fn max_positions(&self) -> Option<u32> {
        (self.hp.arch == Arch::Bert).then_some(self.hp.n_ctx_train)
    }
}

/// The builder every architecture starts with: nodes on the model's devices (the main
/// one until [`crate::graph::GraphBuilder::layer`]), the graph inputs' copies on the
/// others, and the LoRA corrections of `io`.
fn builder(m: &Model, io: &GraphIo) -> crate::graph::GraphBuilder {
    crate::graph::GraphBuilder::new(m.placement.clone())
        .with_mirrors(io.mirrors.clone())
        .with_lora(io.lora.clone())
}

/// The output head every architecture ends with, on the main device: the rows that want
/// logits, the final norm, the projection into the context's logits buffer; then the
/// graph is built.
fn output_head(
    mut g: crate::graph::GraphBuilder,
    m: &Model,
    io: &GraphIo,
    x: crate::graph::TensorId,
) -> Result<crate::graph::Graph, GpuError> {
    let (hp, w) = (&m.hp, &m.weights);
    g.main();
    if io.n_out == 0 {
        return g.build();
    }
    let x = if io.n_out < io.n_tok {
        let out_ids = g.input(io.out_ids()?, [io.n_out, 1]);
        g.select_rows(x, out_ids)
    } else {
        x
    };
    let output_norm = w.output_norm.as_ref().ok_or_else(|| {
        GpuError::Validation("the model has no final norm for an output head".into())
    })?;
    if io.rank {
        // A decoder reranker (llama.cpp's rank pooling of Qwen3): its label tokens'
        // logits of the final norm's output, softmaxed.
        let head = w.cls_out.as_ref().ok_or_else(|| {
            GpuError::Validation("reranking with a model that has no classifier head".into())
        })?;
        let out = g.input(io.logits.clone(), [head.n_rows, io.n_out]);
        let cur = g.rms_norm(x, output_norm, hp.eps);
        g.matmul_into(head, cur, out);
        g.softmax_rows_in_place(out);
        return g.build();
    }
    if io.embeddings {
        // llama.cpp's embeddings: the final norm's output, before the projection.
        let out = g.input(io.logits.clone(), [hp.n_embd, io.n_out]);
        g.rms_norm_into(x, output_norm, hp.eps, out);
        return g.build();
    }
    let logits = g.input(io.logits.clone(), [hp.n_vocab, io.n_out]);
    let cur = g.rms_norm(x, output_norm, hp.eps);
    match &w.logit_softcap {
        // Gemma 2 caps the logits: the projection to scratch, capped into the logits.
        Some(cap) => {
            let raw = g.matmul(&w.output, cur);
            let cap = g.input(cap.clone(), [1, 1]);
            g.softcap_into(raw, cap, logits);
        }
        None => g.matmul_into(&w.output, cur, logits),
    }
    g.build()
}

/// A decoder's input rows for the ubatch: its tokens' embedding rows (times the model's
/// embedding scale, Gemma's sqrt(n_embd)), or the rows the batch brought in their place
/// (an image's embeddings, which llama.cpp does not scale either).
fn input_rows(
    g: &mut crate::graph::GraphBuilder,
    m: &Model,
    io: &GraphIo,
    tokens: crate::graph::TensorId,
) -> Result<crate::graph::TensorId, GpuError> {
    let (hp, w) = (&m.hp, &m.weights);
    if io.embd_input {
        return Ok(g.input(io.embd(hp.n_embd)?, [hp.n_embd, io.n_tok]));
    }
    let x = g.get_rows(&w.tok_embd, tokens);
    Ok(match &w.embd_scale {
        Some(s) => {
            let s = g.input(s.clone(), [1, 1]);
            g.mul(x, s)
        }
        None => x,
    })
}

/// The mask of the sliding-window layers (a causal one serves the global layers).
fn window_mask(hp: &Hparams) -> crate::kv::MaskKind {
    crate::kv::MaskKind {
        swa: hp.swa.map(|s| s.window as i32),
        alibi: false,
        non_causal: false,
    }
}

/// The inputs of a model whose attention layers all read one K/V store with the causal
/// mask and one RoPE table (llama and its relatives, LFM2's attention layers): declared
/// and fetched side by side, as llama.cpp's `build_inp_*` helpers do.
struct Causal {
    tokens: crate::graph::TensorId,
    attn: AttnInputs,
}

impl Causal {
    /// What the graph reads per ubatch.
    fn declare(hp: &Hparams) -> Vec<GraphInput> {
        vec![
            GraphInput::Tokens,
            GraphInput::Embd(hp.n_embd),
            GraphInput::KvSlots(CacheKind::Full),
            GraphInput::OutIds,
            GraphInput::KqMask(crate::kv::MaskKind::default()),
            GraphInput::Rope(hp.rope),
        ]
    }

    /// The declared inputs of the ubatch `io` describes, as graph tensors.
    fn new(
        g: &mut crate::graph::GraphBuilder,
        hp: &Hparams,
        io: &GraphIo,
        mem: &dyn Memory,
    ) -> Result<Self, GpuError> {
        let t = io.n_tok;
        let mask = crate::kv::MaskKind::default();
        Ok(Causal {
            tokens: g.input(io.tokens()?, [t, 1]),
            attn: AttnInputs {
                slots: g.input(io.kv_slots(CacheKind::Full)?, [t, 1]),
                mask: g.input(io.mask(mask)?, [io.n_kv, t]),
                rope: g.input(io.rope(hp.rope)?, [hp.rope.n_dims, t]),
                rope_p: hp.rope,
                shape: attn_shape(hp, mem, t, io.n_kv),
                sp: softmax_params(hp),
            },
        })
    }
}

/// The attention softmax of every layer: the model's scale and soft-cap (Gemma 2's), no
/// ALiBi.
fn softmax_params(hp: &Hparams) -> crate::ops::softmax::SoftmaxParams {
    crate::ops::softmax::SoftmaxParams {
        scale: hp.attn_scale,
        max_bias: 0.0,
        n_head: hp.n_head,
        softcap: hp.attn_softcap,
    }
}

/// Layer `lw`'s attention over its cache `kv` reading `inp`, with the Q/K/V biases and
/// per-head Q/K norms the file has.
fn layer_attn<'a>(
    lw: &'a LayerWeights,
    kv: &KvLayer<'a>,
    inp: AttnInputs,
    eps: f32,
) -> AttnBlock<'a> {
    let qk_norm = (lw.attn_q_norm.as_ref()).zip(lw.attn_k_norm.as_ref());
    AttnBlock {
        qkv_bias: lw.qkv_bias.as_ref(),
        qk_norm: qk_norm.map(|(q, k)| (q, k, eps)),
        ..AttnBlock::new(&lw.qkv, &lw.wo, (kv.k, kv.v), inp)
    }
}

/// The inputs of a model whose layers alternate windowed and global attention (Gemma,
/// gpt-oss): two masks, the cells of both K/V stores, the RoPE tables of both kinds of
/// layer (one, where they rotate alike).
fn windowed_inputs(hp: &Hparams) -> Vec<GraphInput> {
    vec![
        GraphInput::Tokens,
        GraphInput::Embd(hp.n_embd),
        GraphInput::KvSlots(CacheKind::Full),
        GraphInput::KvSlots(CacheKind::Window),
        GraphInput::OutIds,
        GraphInput::KqMask(crate::kv::MaskKind::default()),
        GraphInput::KqMask(window_mask(hp)),
        GraphInput::Rope(hp.rope),
        GraphInput::Rope(hp.rope_swa),
    ]
}

/// The graph inputs of a windowed model's ubatch ([`windowed_inputs`]), index 0 for the
/// global layers and 1 for the window layers.
struct Windowed {
    tokens: crate::graph::TensorId,
    /// The cells of each K/V store's rows (the full store, the rolling buffer).
    slots: [crate::graph::TensorId; 2],
    masks: [crate::graph::TensorId; 2],
    ropes: [crate::graph::TensorId; 2],
    /// The attention shapes over each store's cells.
    shapes: [AttnShape; 2],
}

impl Windowed {
    fn new(
        g: &mut crate::graph::GraphBuilder,
        hp: &Hparams,
        io: &GraphIo,
        mem: &dyn Memory,
    ) -> Result<Self, GpuError> {
        let t = io.n_tok;
        let global = crate::kv::MaskKind::default();
        Ok(Windowed {
            tokens: g.input(io.tokens()?, [t, 1]),
            slots: [
                g.input(io.kv_slots(CacheKind::Full)?, [t, 1]),
                g.input(io.kv_slots(CacheKind::Window)?, [t, 1]),
            ],
            masks: [
                g.input(io.mask(global)?, [io.n_kv, t]),
                g.input(io.mask(window_mask(hp))?, [io.n_kv_window, t]),
            ],
            ropes: [
                g.input(io.rope(hp.rope)?, [hp.rope.n_dims, t]),
                g.input(io.rope(hp.rope_swa)?, [hp.rope_swa.n_dims, t]),
            ],
            shapes: [
                attn_shape(hp, mem, t, io.n_kv),
                attn_shape(hp, mem, t, io.n_kv_window),
            ],
        })
    }

    /// Layer `il`'s attention inputs: slots and shape from the store the memory keeps its
    /// rows in (the rolling buffer, or the full store with --swa-full), mask and RoPE
    /// table from what the model says it sees.
    fn layer(&self, hp: &Hparams, il: usize, store: CacheKind) -> AttnInputs {
        let s = (store == CacheKind::Window) as usize;
        let k = hp.is_swa(il) as usize;
        AttnInputs {
            slots: self.slots[s],
            mask: self.masks[k],
            rope: self.ropes[k],
            rope_p: hp.layer_rope(il),
            shape: self.shapes[s],
            sp: softmax_params(hp),
        }
    }
}

/// A recurrent ubatch's layout (the recurrent memory's equal split): the rows each
/// sequence set's states are gathered from and stored to, `n_s` sets of `n_t` tokens.
struct RsRows {
    src: crate::graph::TensorId,
    dst: crate::graph::TensorId,
    n_s: u32,
    n_t: u32,
}

impl RsRows {
    /// What the graph reads per ubatch for them.
    fn declare() -> Vec<GraphInput> {
        vec![GraphInput::RsSrc, GraphInput::RsDst]
    }

    /// The state rows of the ubatch `io` describes, as graph inputs.
    fn new(g: &mut crate::graph::GraphBuilder, io: &GraphIo) -> Result<RsRows, GpuError> {
        let t = io.n_tok;
        if io.n_rs == 0 || !t.is_multiple_of(io.n_rs) {
            return Err(GpuError::Validation(format!(
                "a recurrent ubatch of {t} tokens in {} sequence sets is not an equal split",
                io.n_rs
            )));
        }
        Ok(RsRows {
            src: g.input(io.input(GraphInput::RsSrc)?, [io.n_rs, 1]),
            dst: g.input(io.input(GraphInput::RsDst)?, [io.n_rs, 1]),
            n_s: io.n_rs,
            n_t: t / io.n_rs,
        })
    }
}

/// Layer `il`'s K/V handle; a memory without it is a wiring bug, reported.
fn kv_layer(mem: &dyn Memory, il: usize) -> Result<KvLayer<'_>, GpuError> {
    mem.layer(il).ok_or_else(|| {
        GpuError::Validation(format!(
            "the model's memory holds no K/V cache for layer {il}"
        ))
    })
}

/// The attention shape of a ubatch of `n_tok` tokens over `n_kv` cells of `mem`'s cache.
fn attn_shape(hp: &Hparams, mem: &dyn Memory, n_tok: u32, n_kv: u32) -> AttnShape {
    let c = mem.choice();
    AttnShape {
        head_dim: hp.head_dim,
        n_head: hp.n_head,
        n_head_kv: hp.n_head_kv,
        n_tok,
        n_kv,
        k_type: c.type_k,
        v_type: c.type_v,
        flash: c.flash,
        rot_k: c.rot_k,
        rot_v: c.rot_v,
    }
}
