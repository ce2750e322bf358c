//! The engine every front end stands on (CLI, desktop app, server, browser): a model,
//! its tokenizer and one inference context, serving [`Session`]s — one per cache
//! sequence — that are advanced together. Each [`Engine::step`] samples a token for every
//! generating session, adds a chunk of every waiting prompt, and decodes them all in one
//! batch (continuous batching: a prompt joins while others generate). Context shift,
//! Self-Extend, prompt-cache reuse and chat turns live here, not in a front end.
//!
//! Nothing in the engine blocks on the GPU where a browser cannot: `step_async` awaits
//! the logits readback; `step` blocks on it and exists on native targets only.
//!
//! This file holds the engine's state and its session operations; making one is
//! `load.rs`, a session's input and prefix reuse `input.rs`, a step `step.rs`.

// The perplexity loop blocks on the GPU: native front ends only.
mod ahead;
mod cache_map;
mod chat;
mod draw;
mod embed;
mod host_cache;
mod input;
mod load;
mod media;
mod ngram;
mod options;
#[cfg(target_arch = "wasm32")]
pub mod pause;
#[cfg(not(target_arch = "wasm32"))]
pub mod perplexity;
mod rewind;
mod schedule;
pub mod service;
mod session;
mod shift;
mod slots;
mod speculate;
mod step;
mod stream;

pub use cache_map::{CacheMap, DevicePart, StoreMap};
pub use chat::Conversation;
pub use embed::{normalize, pool, Pooling};
pub use host_cache::HostCache;
pub use load::LoadProgress;
pub use media::{
    image_token, is_image_token, private_marker, whole_images, ImageChunk, MediaPrompt,
    PreparedImage,
};
pub use ngram::{ngram_draft, NgramParams};
pub use options::{EngineOptions, LoraSpec, SamplingPath, SplitSpec};
pub use session::{Event, Phase, PromptCache, Session, SessionId, SessionParams, Stop, TokenProbs};
pub use shift::{CacheOp, Room, SeqShift, ShiftPolicy};
pub use slots::Snapshot;
pub use speculate::{draft_incompatible, DraftStats, SpecParams};
pub use stream::{IndentLimit, StopStrings, Timings, Utf8Stream};

use crate::context::{Context, ContextError};
use crate::gguf::GgufError;
use crate::gpu::GpuError;
use crate::grammar::GrammarError;
use crate::kv::KvCells;
use crate::model::{Model, ModelError};
use crate::tokenizer::{TemplateError, Tokenizer, TokenizerError};
use std::sync::Arc;
use web_time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error(transparent)]
    Context(#[from] ContextError),
    #[error("reading the tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
    #[error("chat template: {0}")]
    Template(#[from] TemplateError),
    #[error("model file {0} does not exist (scripts/fetch-models.sh downloads the test models)")]
    MissingFile(String),
    #[error("{0}")]
    Options(String),
    #[error("no session {0} (it was never opened or is closed)")]
    NoSession(SessionId),
    #[error("all {0} sequences are in use; close a session or raise -np")]
    NoFreeSequence(u32),
    #[error("session {0} is still generating; cancel it or wait for it to finish")]
    Busy(SessionId),
    #[error(
        "prompt is too long ({n} tokens, max {max}); use a larger context (-c) or a shorter prompt"
    )]
    PromptTooLong { n: usize, max: usize },
    #[error("the prompt is empty after tokenization")]
    EmptyPrompt,
    #[error("the prompt does not fit in the context ({n_ctx} tokens): {reason}")]
    PromptFull {
        n_ctx: u32,
        reason: crate::context::FullReason,
    },
    #[error("{0}")]
    PromptCache(String),
    #[error(transparent)]
    Grammar(#[from] GrammarError),
    #[error(transparent)]
    Vision(#[from] crate::vision::VisionError),
    /// A prompt with images for an engine without a vision encoder (llama-server's
    /// refusal).
    #[error("image input is not supported by this model: load an mmproj file with --mmproj (or -hf a repository that has one)")]
    NoVision,
}

/// A loaded model with one context and the sessions using it.
pub struct Engine {
    pub model: Arc<Model>,
    pub tokenizer: Tokenizer,
    ctx: Context,
    /// Indexed by sequence id.
    sessions: Vec<Option<Session>>,
    /// Time spent loading, for the timing summary.
    pub load_time: Duration,
    /// Decodes run, for logs and tests.
    pub n_steps: u64,
    /// Tokens drawn on the GPU, and sampled on the host, since the engine was made.
    pub n_gpu_draws: u64,
    pub n_host_samples: u64,
    /// Steps submitted before the step before them was read.
    pub n_ahead: u64,
    /// What the last step decoded: prompt tokens and generated tokens.
    pub last_batch: (usize, usize),
    /// Sessions share the whole cache instead of an equal part each.
    kv_unified: bool,
    /// Every token's text for grammars, decoded when the first grammar arrives.
    token_pieces: Option<Arc<crate::grammar::TokenPieces>>,
    /// Generated tokens are drawn on the GPU where a session's chain allows
    /// (`--sampling`, resolved for this adapter), unless the session says otherwise.
    gpu_sampling: bool,
    /// The GPU chain can sample this model at all (its vocabulary fills the row).
    can_draw: bool,
    /// Steps are submitted before the last one is read (`ahead.rs`).
    decode_ahead: bool,
    /// The step submitted ahead and not read yet.
    pending: Option<ahead::Ahead>,
    /// When the last step submitted ahead was read (its successor's time starts there).
    last_read: Option<Instant>,
    /// The draft model of speculative decoding, if one is attached.
    drafter: Option<speculate::Drafter>,
    /// The LoRA scales new sessions take when their params give none.
    lora_default: crate::model::lora::LoraScales,
    /// The vision encoder images in prompts go through (`--mmproj`).
    vision: Option<Arc<crate::vision::VisionEncoder>>,
}

impl Engine {
    /// An engine over a model already loaded (several engines may share one model).
    pub fn new(
        model: Arc<Model>,
        tokenizer: Tokenizer,
        opts: &EngineOptions,
    ) -> Result<Engine, EngineError> {
        let params = opts
            .context_params(&model.hp)
            .map_err(EngineError::Options)?;
        let mut ctx = Context::new(model.clone(), params)?;
        ctx.set_pipelined(opts.pipeline);
        // The adapters loaded with the model, at their --lora scales (none applied with
        // --lora-init-without-apply, until a caller sets them).
        let lora_default: Vec<f32> = (0..model.loras.len())
            .map(|i| match opts.lora_init_without_apply {
                true => 0.0,
                false => opts.lora.get(i).map_or(1.0, |l| l.scale),
            })
            .collect();
        ctx.set_lora(&lora_default);
        let n = params.n_seq_max as usize;
        let gpu_sampling = match opts.sampling {
            SamplingPath::Cpu => false,
            SamplingPath::Gpu => true,
            // The tuner's measurement where there is one (not on a page), else the
            // GPU on GPU-shaped adapters.
            SamplingPath::Auto => (model.gpu.tuning.gpu_draws)
                .unwrap_or(model.gpu.kernels == crate::gpu::KernelShape::Gpu),
        };
        // The GPU chain ranges over the logits row; a vocabulary shorter than the row
        // (padded output weights) keeps sampling on the host, which stops at its end.
        let can_draw = tokenizer.n_vocab() == model.hp.n_vocab as usize && !opts.embeddings;
        let gpu_sampling = gpu_sampling && can_draw;
        log::debug!(
            "sampling on the {}",
            if gpu_sampling { "GPU" } else { "host" }
        );
        // A recurrent state cannot be cut back one position, and a unified cache can run
        // out of cells for a step submitted ahead.
        let decode_ahead = opts.decode_ahead
            && can_draw
            && !model.hp.recurrent.iter().any(|&r| r)
            && !opts.kv_unified;
        Ok(Engine {
            model,
            tokenizer,
            ctx,
            sessions: (0..n).map(|_| None).collect(),
            load_time: Duration::ZERO,
            n_steps: 0,
            n_gpu_draws: 0,
            n_host_samples: 0,
            n_ahead: 0,
            last_batch: (0, 0),
            kv_unified: opts.kv_unified,
            token_pieces: None,
            gpu_sampling,
            can_draw,
            decode_ahead,
            pending: None,
            last_read: None,
            drafter: None,
            lora_default,
            vision: None,
        })
    }

    /// Loads the mmproj file at `path` as the vision encoder of this engine's prompts, on
    /// the model's main device; refuses one whose embeddings are not as wide as the
    /// model's input, or a model that reads no input rows.
    pub fn attach_vision(&mut self, path: &str) -> Result<(), EngineError> {
        self.attach_vision_with(path, Default::default())
    }

    /// [`Engine::attach_vision`] with the tokens an image may take bounded (see
    /// [`crate::vision::VisionEncoder::load_with`]).
    pub fn attach_vision_with(
        &mut self,
        path: &str,
        limits: crate::vision::ImageTokens,
    ) -> Result<(), EngineError> {
        self.check_takes_rows(path)?;
        let enc = crate::vision::VisionEncoder::load_with(self.model.gpu.clone(), path, limits)?;
        self.attach_encoder(path, enc)
    }

    /// [`Engine::attach_vision`] of an mmproj file already read (a page's download).
    pub fn attach_vision_bytes(&mut self, name: &str, bytes: Vec<u8>) -> Result<(), EngineError> {
        self.check_takes_rows(name)?;
        let gpu = self.model.gpu.clone();
        let enc = crate::vision::VisionEncoder::load_bytes(gpu, name, bytes, Default::default())?;
        self.attach_encoder(name, enc)
    }

    /// Refuses a model that reads no input rows before an encoder is loaded for it.
    fn check_takes_rows(&self, path: &str) -> Result<(), EngineError> {
        let rows = crate::graph::GraphInput::Embd(self.model.hp.n_embd);
        if !self.model.inputs().contains(&rows) {
            return Err(EngineError::Options(format!(
                "{path}: a {:?} model takes token ids only, no image embeddings",
                self.model.hp.arch
            )));
        }
        Ok(())
    }

    /// Checks encoder `enc` (loaded from `path`) against the model and keeps it.
    fn attach_encoder(
        &mut self,
        path: &str,
        mut enc: crate::vision::VisionEncoder,
    ) -> Result<(), EngineError> {
        let n_embd = self.model.hp.n_embd;
        // An M-RoPE model places an image's tokens by their row and column, which only
        // an encoder that reads images at their own size gives (llama.cpp's converters
        // pair qwen2vl models with Qwen's encoders alone).
        if self.model.hp.mrope.is_some() && !enc.hp.projector.dynamic_size() {
            return Err(EngineError::Options(format!(
                "{path}: a {} projector's images are not placed by row and column, which this model's positions (M-RoPE) need: use the model's own mmproj",
                enc.hp.projector.name()
            )));
        }
        enc.prep = Arc::new(enc.prep.bind_vocab(&self.tokenizer)?);
        if enc.n_embd_out() != n_embd {
            return Err(EngineError::Options(format!(
                "{path}: the mmproj's embeddings are {} wide and the model's input is {n_embd}: this mmproj belongs to another model",
                enc.n_embd_out()
            )));
        }
        match enc.prep.dynamic {
            Some(d) => log::info!(
                "vision encoder {path}: projector {}, images of {} to {} tokens by their size",
                enc.hp.projector.name(),
                d.min_pixels / (enc.prep.cell * enc.prep.cell),
                (d.max_pixels / (enc.prep.cell * enc.prep.cell)).min(enc.prep.max_cells)
            ),
            None => log::info!(
                "vision encoder {path}: projector {}, {} tokens per encoder pass (an image, or a tile)",
                enc.hp.projector.name(),
                enc.n_tokens()
            ),
        }
        self.vision = Some(Arc::new(enc));
        Ok(())
    }

    /// The vision encoder (`--mmproj`), if one is attached.
    pub fn vision(&self) -> Option<&Arc<crate::vision::VisionEncoder>> {
        self.vision.as_ref()
    }

    /// How images are prepared for this engine's encoder; `None` without `--mmproj`.
    pub fn image_prep(&self) -> Option<Arc<crate::vision::ImagePrep>> {
        self.vision.as_ref().map(|v| v.prep.clone())
    }

    /// Whether generated tokens are drawn on the GPU where a session's chain allows.
    pub fn samples_on_gpu(&self) -> bool {
        self.gpu_sampling
    }

    pub fn context(&self) -> &Context {
        &self.ctx
    }
    /// The context itself, for batch-level work (benchmarks, perplexity). Sessions keep
    /// their own bookkeeping: do not edit their sequences through it.
    pub fn context_mut(&mut self) -> &mut Context {
        &mut self.ctx
    }
    pub fn cells(&self) -> &KvCells {
        self.ctx.cells()
    }
    pub fn n_ctx(&self) -> u32 {
        self.ctx.n_ctx()
    }
    /// Cells a session may fill before its context shifts: an equal share of the cache
    /// (all of it with `kv_unified`).
    pub fn n_ctx_seq(&self) -> u32 {
        if self.kv_unified {
            return self.ctx.n_ctx();
        }
        self.ctx.n_ctx() / self.ctx.params.n_seq_max
    }

    /// Refuses Self-Extend where the model's positions cannot be moved (M-RoPE; llama.cpp
    /// aborts there).
    pub(super) fn check_shift_policy(&self, params: &SessionParams) -> Result<(), EngineError> {
        if params.shift.ga_n > 1 && !self.ctx.can_shift() {
            return Err(EngineError::Options(
                "Self-Extend (--grp-attn-n) regroups cached positions, and this model's positions (M-RoPE) cannot be moved".into(),
            ));
        }
        Ok(())
    }

    /// Opens a session on the lowest free sequence.
    pub fn open_session(&mut self, params: SessionParams) -> Result<SessionId, EngineError> {
        let seq = self
            .sessions
            .iter()
            .position(Option::is_none)
            .ok_or(EngineError::NoFreeSequence(self.sessions.len() as u32))?;
        params.validate()?;
        self.check_shift_policy(&params)?;
        let id = seq as SessionId;
        self.ctx.seq_rm(Some(id), -1, -1)?;
        self.sessions[seq] = Some(self.new_session(id, params)?);
        Ok(id)
    }

    /// A fresh session on sequence `id`: its sampler, and the LoRA scales it decodes
    /// with (its own, or the engine's setting now).
    pub(super) fn new_session(
        &mut self,
        id: SessionId,
        params: SessionParams,
    ) -> Result<Session, EngineError> {
        let lora = match &params.lora {
            Some(scales) => self.check_lora(scales)?,
            None => self.lora_default.clone(),
        };
        let sampler = self.sampler_for(&params.sampling)?;
        let mut s = Session::new(id, params, sampler)?;
        s.lora = lora;
        Ok(s)
    }

    /// The loaded LoRA adapters, in load order (their ids).
    pub fn lora_adapters(&self) -> &[Arc<crate::model::lora::LoraAdapter>] {
        &self.model.loras
    }

    /// The adapters' scales sessions start with (llama-server's global setting).
    pub fn lora_scales(&self) -> &[f32] {
        &self.lora_default
    }

    /// Sets the scales sessions started from now on decode with where their request
    /// gives none (llama-server's `POST /lora-adapters`); running sessions keep theirs.
    pub fn set_lora_scales(&mut self, scales: &[f32]) -> Result<(), EngineError> {
        self.lora_default = self.check_lora(scales)?;
        Ok(())
    }

    /// `scales` as one finite scale per loaded adapter (missing ones 0).
    fn check_lora(&self, scales: &[f32]) -> Result<crate::model::lora::LoraScales, EngineError> {
        let n = self.model.loras.len();
        if scales.len() > n {
            return Err(EngineError::Options(format!(
                "{} LoRA scales given, and {n} adapter(s) are loaded (--lora)",
                scales.len()
            )));
        }
        if let Some(s) = scales.iter().find(|s| !s.is_finite()) {
            return Err(EngineError::Options(format!(
                "LoRA scale {s} is not a finite number"
            )));
        }
        let mut v = scales.to_vec();
        v.resize(n, 0.0);
        Ok(v)
    }

    /// A sampler for `params`, its grammar (if any) parsed against this vocabulary.
    pub(super) fn sampler_for(
        &mut self,
        params: &crate::sample::SamplerParams,
    ) -> Result<crate::sample::Sampler, EngineError> {
        use crate::grammar::{Grammar, GrammarState, TokenPieces};
        let grammar = match &params.grammar {
            None => None,
            Some(text) => {
                let g = Grammar::parse(text, Some(&self.tokenizer))?;
                let tok = &self.tokenizer;
                let pieces = (self.token_pieces)
                    .get_or_insert_with(|| Arc::new(TokenPieces::new(tok)))
                    .clone();
                Some(GrammarState::new(Arc::new(g), pieces))
            }
        };
        let n_vocab = self.tokenizer.n_vocab();
        Ok(crate::sample::Sampler::with_grammar(
            params.clone(),
            n_vocab,
            grammar,
        ))
    }

    /// A new session continuing from everything `src` has decoded (its cells are shared,
    /// not copied: a system prompt decoded once serves many conversations).
    pub fn fork_session(
        &mut self,
        src: SessionId,
        params: SessionParams,
    ) -> Result<SessionId, EngineError> {
        let s = self.session(src)?;
        if s.phase != Phase::Idle {
            return Err(EngineError::Busy(src));
        }
        let (old, new) = (s.shift.policy, params.shift);
        if s.shift.grouped() && (old.ga_n, old.ga_w) != (new.ga_n, new.ga_w) {
            return Err(EngineError::Options(format!(
                "session {src} has grouped its positions with Self-Extend (--grp-attn-n {}, --grp-attn-w {}): a fork goes on with the same settings, not {} and {}",
                old.ga_n, old.ga_w, new.ga_n, new.ga_w
            )));
        }
        let id = self.open_session(params)?;
        self.ctx.seq_cp(src, id, -1, -1)?;
        let (history, logits, shift) = {
            let s = self.session(src)?;
            (s.history.clone(), s.logits.clone(), s.shift.clone())
        };
        let dst = self.session_mut(id)?;
        for &t in &history {
            dst.sampler.accept(t);
        }
        dst.shift.continue_from(&shift);
        dst.history = history;
        dst.logits = logits;
        Ok(id)
    }

    /// Closes a session and frees its cells (cells shared with other sessions stay).
    pub fn close_session(&mut self, id: SessionId) -> Result<(), EngineError> {
        self.session(id)?;
        // A step in flight may still write its cell: the GPU runs it before anything
        // submitted later, so the cell is free for whoever takes it next.
        if let Some(p) = self.pending.as_mut() {
            p.close(id);
        }
        self.ctx.seq_rm(Some(id), -1, -1)?;
        self.sessions[id as usize] = None;
        Ok(())
    }

    pub fn session(&self, id: SessionId) -> Result<&Session, EngineError> {
        self.sessions
            .get(id as usize)
            .and_then(Option::as_ref)
            .ok_or(EngineError::NoSession(id))
    }

    fn session_mut(&mut self, id: SessionId) -> Result<&mut Session, EngineError> {
        self.sessions
            .get_mut(id as usize)
            .and_then(Option::as_mut)
            .ok_or(EngineError::NoSession(id))
    }

    /// The open sessions, by id.
    pub fn sessions(&self) -> impl Iterator<Item = &Session> {
        self.sessions.iter().flatten()
    }

    /// True while some session has work for the next step.
    pub fn is_busy(&self) -> bool {
        self.sessions().any(Session::is_busy)
    }

    /// Tokenizes `text` (with BOS where the model wants one, on a session's first input)
    /// and queues it for `id`, which then generates; returns the token count.
    pub fn prompt_text(&mut self, id: SessionId, text: &str) -> Result<usize, EngineError> {
        let first = self.session(id)?.history.is_empty();
        let tokens = self.tokenizer.encode(text, first, true);
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        self.input(id, &tokens, true)?;
        Ok(tokens.len())
    }

    /// Queues `tokens` for `id`, which then generates. With no tokens, a session that
    /// holds logits (a fork) starts generating from them.
    pub fn prompt_tokens(&mut self, id: SessionId, tokens: &[u32]) -> Result<(), EngineError> {
        self.input(id, tokens, true)
    }

    /// A chat turn: the user's message is rendered with the model's chat template and
    /// the text beyond what the cache holds is queued; the reply is generated and, when
    /// it ends, recorded in the conversation. Returns the tokens queued.
    pub fn chat(&mut self, id: SessionId, user: &str) -> Result<usize, EngineError> {
        self.chat_with_system(id, None, user)
    }

    /// [`Engine::chat`], with a system prompt on the conversation's first turn.
    pub fn chat_with_system(
        &mut self,
        id: SessionId,
        system: Option<&str>,
        user: &str,
    ) -> Result<usize, EngineError> {
        self.chat_media(id, system, user, &[])
    }

    /// Queues a prompt with images for `id` (see [`MediaPrompt`]), which then generates.
    pub fn prompt_media(&mut self, id: SessionId, prompt: &MediaPrompt) -> Result<(), EngineError> {
        self.input_media(id, &prompt.tokens, &prompt.images, true)
    }

    /// [`Engine::chat_with_system`] with images: `user` holds a
    /// [`crate::vision::MEDIA_MARKER`] for each image of `images`, in order.
    pub fn chat_media(
        &mut self,
        id: SessionId,
        system: Option<&str>,
        user: &str,
        images: &[Arc<PreparedImage>],
    ) -> Result<usize, EngineError> {
        let prep = match images.is_empty() {
            true => None,
            false => Some(self.image_prep().ok_or(EngineError::NoVision)?),
        };
        if self.session(id)?.phase != Phase::Idle {
            return Err(EngineError::Busy(id));
        }
        let tok = &self.tokenizer;
        let s = self.sessions[id as usize].as_mut().unwrap();
        let conv = s
            .conversation
            .get_or_insert_with(|| Conversation::new(system));
        let first = conv.is_empty() && s.history.is_empty();
        let text = conv.user_turn(tok, user)?;
        let prompt = match prep {
            // Text alone: a marker a user typed stays text.
            None => MediaPrompt::text(tok.encode(&text, first, true)),
            Some(prep) => {
                let marker = crate::vision::MEDIA_MARKER;
                MediaPrompt::build(tok, &prep, &text, marker, images, first)?
            }
        };
        self.prompt_media(id, &prompt)?;
        Ok(prompt.tokens.len())
    }

    /// Decodes `tokens` for `id` without generating (teacher forcing, shared prefixes),
    /// stepping every session until they are in; returns the logits after the last one.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn feed(&mut self, id: SessionId, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        pollster::block_on(self.feed_async(id, tokens))
    }

    /// [`Engine::feed`], awaiting readbacks. Events of other sessions stepped meanwhile
    /// are dropped: use it when `id` is the only busy session.
    pub async fn feed_async(
        &mut self,
        id: SessionId,
        tokens: &[u32],
    ) -> Result<Vec<f32>, EngineError> {
        self.input(id, tokens, false)?;
        while self.session(id)?.phase != Phase::Idle {
            for ev in self.step_async().await? {
                if let Event::Error { session, error } = ev {
                    if session == id {
                        return Err(error);
                    }
                }
            }
        }
        Ok(self.session(id)?.logits.clone().unwrap_or_default())
    }

    /// New sampling settings (and reply length) for an idle session; its conversation and
    /// cells stay. Settings equal to the current ones keep the sampler as it is, random
    /// stream included (a regenerated reply then differs); new ones start a new sampler
    /// whose penalty history is rebuilt from the tokens the sequence holds.
    pub fn set_sampling(
        &mut self,
        id: SessionId,
        sampling: crate::sample::SamplerParams,
        n_predict: i32,
    ) -> Result<(), EngineError> {
        if self.session(id)?.phase != Phase::Idle {
            return Err(EngineError::Busy(id));
        }
        let changed = self.session(id)?.params.sampling != sampling;
        let sampler = if changed {
            Some(self.sampler_for(&sampling)?)
        } else {
            None
        };
        let s = self.session_mut(id)?;
        s.params.n_predict = n_predict;
        if let Some(sampler) = sampler {
            s.params.sampling = sampling;
            s.sampler = sampler;
            s.refill_penalty_history();
        }
        Ok(())
    }

    /// [`Engine::feed`], returning the logits after every token (teacher forcing: the
    /// rows a one-token-at-a-time loop would see, computed in batches of up to `-b`).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn feed_all(
        &mut self,
        id: SessionId,
        tokens: &[u32],
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        self.session_mut(id)?.fed_logits = Some(Vec::new());
        let fed = self.feed(id, tokens);
        let rows = self.session_mut(id)?.fed_logits.take().unwrap_or_default();
        fed.map(|_| rows)
    }

    /// Stops `id`'s generation (or prompt) at the next step, which reports it finished.
    pub fn cancel(&mut self, id: SessionId) -> Result<(), EngineError> {
        let s = self.session_mut(id)?;
        if s.phase != Phase::Idle {
            s.cancel = true;
        }
        Ok(())
    }
}

/// A session's slice of a step's batch.
#[derive(Clone)]
struct Part {
    id: SessionId,
    len: usize,
    /// Its last token's row is drawn on the GPU: the index of the draw.
    drawn: Option<usize>,
    generating: bool,
    /// The slice ends the session's input: its last row becomes the session's logits.
    logits: bool,
    /// Logit rows the slice has in the step's output (every token's for `feed_all`).
    rows: usize,
}
