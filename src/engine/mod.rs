//! The engine every front end stands on (CLI, desktop app, server, browser): a model,
//! its tokenizer and one inference context, serving [`Session`]s — one per cache
//! sequence — that are advanced together. Each [`Engine::step`] samples a token for every
//! generating session, adds a chunk of every waiting prompt, and decodes them all in one
//! batch (continuous batching: a prompt joins while others generate). Context shift,
//! Self-Extend, prompt-cache reuse and chat turns live here, not in a front end.
//!
//! Nothing in the engine blocks on the GPU where a browser cannot: `step_async` awaits
//! the logits readback; `step` blocks on it and exists on native targets only.

// The benchmark and perplexity loops block on the GPU: native front ends only.
mod ahead;
#[cfg(not(target_arch = "wasm32"))]
pub mod bench;
mod cache_map;
mod chat;
mod draw;
mod host_cache;
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
mod stream;

pub use cache_map::{CacheMap, StoreMap};
pub use chat::Conversation;
pub use host_cache::HostCache;
pub use options::{EngineOptions, SamplingPath};
pub use session::{Event, Phase, PromptCache, Session, SessionId, SessionParams, Stop, TokenProbs};
pub use shift::{CacheOp, Room, SeqShift, ShiftPolicy};
pub use slots::Snapshot;
pub use stream::{StopStrings, Timings, Utf8Stream};

use crate::context::{Batch, Context, ContextError};
use crate::gguf::{GgufError, GgufFile};
use crate::gpu::{Gpu, GpuError};
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
}

/// One log line for the kernels the tuner chose.
#[cfg(not(target_arch = "wasm32"))]
fn log_tuned(e: &crate::tune::TuneEntry, measured: bool, n_backends: usize) {
    log::info!(
        "kernels: {} on {} ({}; {}{} us per layer and decoded token, {:.1} per prompt token)",
        e.kernels,
        e.backend,
        if measured { "measured now" } else { "cached" },
        if n_backends > 1 {
            format!("best of {n_backends} backends; ")
        } else {
            String::new()
        },
        e.decode_us.round(),
        e.prompt_us
    );
    if let (Some(g), Some(h)) = (e.draw_gpu_busy_us, e.draw_host_us) {
        log::debug!("a token drawn on the GPU: {g:.0} us; read back and sampled: {h:.0} us");
    }
}

impl Engine {
    /// Opens a GGUF file, the GPU `opts` names, and uploads the weights; `progress(done,
    /// total)` is called in bytes as tensors are uploaded (native targets).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load(
        path: &std::path::Path,
        opts: &EngineOptions,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Engine, EngineError> {
        let start = Instant::now();
        // The file first: its errors are clearer than a GPU's.
        let (f, tokenizer) = Self::open_file(path)?;
        let gpu = Gpu::new(&Self::tuned_gpu(&f, opts)?)?;
        Self::load_opened(start, gpu, &f, tokenizer, opts, progress)
    }

    /// The GPU options with what [`crate::tune`] chose for this model (measured at first
    /// use of the adapter, then cached).
    #[cfg(not(target_arch = "wasm32"))]
    fn tuned_gpu(
        f: &GgufFile,
        opts: &EngineOptions,
    ) -> Result<crate::gpu::GpuOptions, EngineError> {
        let r = crate::tune::resolve(&opts.gpu, &opts.tune, f, &mut |backend, t| {
            log::debug!(
                "tune {backend} {} {}: {:.1} us per token",
                t.kernels,
                t.name,
                t.us_per_token
            )
        })?;
        if let Some(e) = r.entries.first() {
            log_tuned(e, r.measured, r.entries.len());
        }
        Ok(r.gpu)
    }

    /// [`Engine::load`] onto a GPU the caller opened or wrapped (the desktop app runs the
    /// model on the device its window draws with).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load_file_on(
        gpu: Arc<Gpu>,
        path: &std::path::Path,
        opts: &EngineOptions,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Engine, EngineError> {
        let start = Instant::now();
        let (f, tokenizer) = Self::open_file(path)?;
        let gpu = Self::tuned_device(gpu, &f, opts)?;
        Self::load_opened(start, gpu, &f, tokenizer, opts, progress)
    }

    /// The caller's device with the kernels [`crate::tune`] chose for this model on it
    /// (measured at first use, then cached); a page runs no tuner and keeps the built-in
    /// choice for the adapter.
    fn tuned_device(
        gpu: Arc<Gpu>,
        f: &GgufFile,
        opts: &EngineOptions,
    ) -> Result<Arc<Gpu>, EngineError> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            let tuned = crate::tune::retune_device(&gpu, &opts.gpu, &opts.tune, f)?;
            if let Some(e) = &tuned.entry {
                log_tuned(e, tuned.measured, 1);
            }
            Ok(tuned.gpu)
        }
        #[cfg(target_arch = "wasm32")]
        {
            let _ = (f, opts);
            Ok(gpu)
        }
    }

    /// [`Engine::load_file_on`] for a file already read into memory (a browser page's
    /// picked file or download): `bytes` is the only copy, parsed in place and uploaded
    /// tensor by tensor. In a browser the kernels are the built-in choice for the adapter
    /// (no tuning run).
    pub fn load_bytes_on(
        gpu: Arc<Gpu>,
        name: &str,
        bytes: Vec<u8>,
        opts: &EngineOptions,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Engine, EngineError> {
        let start = Instant::now();
        let (f, tokenizer) = Self::check_file(GgufFile::from_bytes(name, bytes)?)?;
        let gpu = Self::tuned_device(gpu, &f, opts)?;
        Self::load_opened(start, gpu, &f, tokenizer, opts, progress)
    }

    /// [`Engine::load_on`], timed from `start` (when the file was first touched).
    fn load_opened(
        start: Instant,
        gpu: Arc<Gpu>,
        f: &GgufFile,
        tokenizer: Tokenizer,
        opts: &EngineOptions,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Engine, EngineError> {
        let mut e = Self::load_on(gpu, f, tokenizer, opts, progress)?;
        e.load_time = start.elapsed();
        Ok(e)
    }

    /// Opens and checks a GGUF file: it exists, its architecture is one we run, its
    /// tokenizer reads (with Gemma's turn template where a Gemma file has none).
    #[cfg(not(target_arch = "wasm32"))]
    fn open_file(path: &std::path::Path) -> Result<(GgufFile, Tokenizer), EngineError> {
        if !path.exists() {
            return Err(EngineError::MissingFile(path.display().to_string()));
        }
        Self::check_file(GgufFile::open(path)?)
    }

    /// The checks of [`Engine::open_file`] on a parsed file, wherever its bytes are.
    fn check_file(f: GgufFile) -> Result<(GgufFile, Tokenizer), EngineError> {
        // The architecture first: the clearest error comes first.
        let hp = crate::model::Hparams::from_gguf(&f)?;
        let mut tokenizer = Tokenizer::from_gguf(&f)?;
        if tokenizer.chat_template().is_none() && hp.arch == crate::model::Arch::Gemma3 {
            log::info!("the GGUF has no chat template: using Gemma's turn format (llama.cpp would use ChatML)");
            tokenizer.set_default_chat_template(crate::tokenizer::GEMMA);
        }
        Ok((f, tokenizer))
    }

    /// Uploads the model in `f` to `gpu` — which may wrap a device the host created
    /// ([`Gpu::from_device`]) — and builds the context.
    pub fn load_on(
        gpu: Arc<Gpu>,
        f: &GgufFile,
        tokenizer: Tokenizer,
        opts: &EngineOptions,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Engine, EngineError> {
        let start = Instant::now();
        let mut model = Model::load(gpu, f, progress)?;
        if let Ok(p) = opts.context_params(&model.hp) {
            model.hp.fit_context(p.n_ctx, p.n_seq_max);
        }
        log::info!(
            "loaded {} ({} layers, {:.1} MiB on {} via {})",
            model.name,
            model.hp.n_layer,
            model.weights.gpu_bytes as f64 / (1 << 20) as f64,
            model.gpu.info.name,
            model.gpu.info.backend
        );
        let mut e = Self::new(Arc::new(model), tokenizer, opts)?;
        e.load_time = start.elapsed();
        Ok(e)
    }

    /// An engine over a model already loaded (several engines may share one model).
    pub fn new(
        model: Arc<Model>,
        tokenizer: Tokenizer,
        opts: &EngineOptions,
    ) -> Result<Engine, EngineError> {
        let params = opts
            .context_params(&model.hp)
            .map_err(EngineError::Options)?;
        let ctx = Context::new(model.clone(), params)?;
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
        let can_draw = tokenizer.n_vocab() == model.hp.n_vocab as usize;
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
        })
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

    /// Opens a session on the lowest free sequence.
    pub fn open_session(&mut self, params: SessionParams) -> Result<SessionId, EngineError> {
        let seq = self
            .sessions
            .iter()
            .position(Option::is_none)
            .ok_or(EngineError::NoFreeSequence(self.sessions.len() as u32))?;
        params.validate()?;
        let id = seq as SessionId;
        self.ctx.seq_rm(Some(id), -1, -1)?;
        let sampler = self.sampler_for(&params.sampling)?;
        self.sessions[seq] = Some(Session::new(id, params, sampler)?);
        Ok(id)
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
        if self.session(src)?.phase != Phase::Idle {
            return Err(EngineError::Busy(src));
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
        dst.shift.n_past = shift.n_past;
        dst.shift.n_keep = shift.n_keep;
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
        let tokens = tok.encode(&text, first, true);
        self.input(id, &tokens, true)?;
        Ok(tokens.len())
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

    /// Queues input for a session: checks, `--keep` resolution and prompt-cache reuse on
    /// the first input, sampler history.
    fn input(&mut self, id: SessionId, tokens: &[u32], generate: bool) -> Result<(), EngineError> {
        self.input_reusing(id, tokens, generate, None)
    }

    /// Starts a request on idle session `id`: a fresh session with `params` whose input
    /// is the whole prompt `tokens`. With `cache_prompt`, the cells of the longest prefix
    /// the prompt shares with what the sequence holds are kept (never the last token:
    /// its logits are needed); the rest of the sequence is dropped. Returns the tokens
    /// reused. A sequence that was shifted or extended keeps nothing (its cells no longer
    /// sit at the positions of its tokens).
    pub fn start_request(
        &mut self,
        id: SessionId,
        params: SessionParams,
        tokens: &[u32],
        cache_prompt: bool,
    ) -> Result<usize, EngineError> {
        let s = self.session(id)?;
        if s.phase != Phase::Idle {
            return Err(EngineError::Busy(id));
        }
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        params.validate()?;
        let kept = if cache_prompt && s.shift.ops.is_empty() {
            s.history.clone()
        } else {
            Vec::new()
        };
        let sampler = self.sampler_for(&params.sampling)?;
        self.sessions[id as usize] = Some(Session::new(id, params, sampler)?);
        self.input_reusing(id, tokens, true, Some(&kept))?;
        Ok(self.session(id)?.history.len())
    }

    /// [`Engine::input`]; on a session's first input, `kept` (the tokens its sequence
    /// still holds from an earlier request) gives the prefix to reuse.
    fn input_reusing(
        &mut self,
        id: SessionId,
        tokens: &[u32],
        generate: bool,
        kept: Option<&[u32]>,
    ) -> Result<(), EngineError> {
        let n_ctx_seq = self.n_ctx_seq() as usize;
        let add_bos = self.tokenizer.add_bos();
        let s = self.session(id)?;
        if s.phase != Phase::Idle {
            return Err(EngineError::Busy(id));
        }
        if tokens.is_empty() && (s.logits.is_none() || !generate) {
            return Err(EngineError::EmptyPrompt);
        }
        let n_vocab = self.model.hp.n_vocab;
        if let Some(&bad) = tokens.iter().find(|&&t| t >= n_vocab) {
            return Err(EngineError::Options(format!(
                "token id {bad} is out of the vocabulary (0..{n_vocab})"
            )));
        }
        let first = s.history.is_empty();
        let mut reuse = 0;
        if first {
            // llama-completion refuses a first prompt that leaves fewer than 4 cells (a
            // recurrent model alone has no cells to run out of).
            let bounded = self.ctx.memory().bounded();
            if bounded && s.params.shift.ga_n == 1 && tokens.len() > n_ctx_seq.saturating_sub(4) {
                return Err(EngineError::PromptTooLong {
                    n: tokens.len(),
                    max: n_ctx_seq.saturating_sub(4),
                });
            }
            if let Some(pc) = s.params.prompt_cache.clone() {
                reuse = self.reuse_prompt_cache(id, &pc.path, tokens)?;
            } else if let Some(kept) = kept {
                reuse = self.reuse_cells(id, kept, tokens)?;
            }
        }
        let s = self.session_mut(id)?;
        if first {
            s.shift.n_keep = s.params.shift.n_keep_for(tokens.len(), add_bos);
            s.save_cache_after_input = s
                .params
                .prompt_cache
                .as_ref()
                .is_some_and(|pc| !pc.read_only);
        }
        for &t in tokens {
            s.sampler.accept(t);
        }
        s.history.extend_from_slice(&tokens[..reuse]);
        s.shift.n_past += reuse as i32;
        s.pending = tokens[reuse..].iter().copied().collect();
        s.input_total = s.pending.len();
        s.input_done = 0;
        s.then_generate = generate;
        s.generated.clear();
        s.reply.clear();
        s.stream = Utf8Stream::default();
        s.phase = if s.pending.is_empty() {
            Phase::Generate
        } else {
            Phase::Prompt
        };
        Ok(())
    }

    /// Keeps the cells of the prefix `prompt` shares with `kept` (what sequence `id`
    /// holds) and drops the rest; returns how many prompt tokens need no decoding.
    fn reuse_cells(
        &mut self,
        id: SessionId,
        kept: &[u32],
        prompt: &[u32],
    ) -> Result<usize, EngineError> {
        let same = kept.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        let mut reuse = same.min(prompt.len() - 1);
        if reuse > 0 && !self.ctx.can_resume(id, reuse as i32) {
            log::debug!("session {id}: the cache no longer holds the state at token {reuse} (a sliding window dropped its start, or a recurrent state holds only its end); reprocessing the prompt");
            reuse = 0;
        }
        self.ctx.seq_rm(Some(id), reuse as i32, -1)?;
        Ok(reuse)
    }

    /// Loads the prompt-cache file (if it exists) into `id`'s sequence and keeps the
    /// cells of the longest prefix its tokens share with `prompt`; returns how many
    /// prompt tokens need no decoding (never the last one: its logits are needed).
    fn reuse_prompt_cache(
        &mut self,
        id: SessionId,
        path: &std::path::Path,
        prompt: &[u32],
    ) -> Result<usize, EngineError> {
        if !path.exists() {
            log::info!(
                "prompt cache {} does not exist yet; it will be created",
                path.display()
            );
            return Ok(0);
        }
        let saved = self.ctx.state_load(path, Some(id))?;
        let same = saved
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        let mut reuse = same.min(prompt.len() - 1);
        if !self.ctx.can_resume(id, reuse as i32) {
            // As llama.cpp does without --swa-full, but only when it must: the rolling
            // buffer no longer has the window before the shared prefix ends. A recurrent
            // state holds only the end of what was saved, so only an exact continuation
            // reuses it.
            let why = if self.ctx.memory().bounded() {
                "the sliding-window buffer no longer holds the window before token {reuse} (--swa-full keeps it)"
            } else {
                "a recurrent state holds only the end of the saved tokens, not token {reuse}"
            };
            log::info!(
                "prompt cache {}: {}; reprocessing the prompt",
                path.display(),
                why.replace("{reuse}", &reuse.to_string())
            );
            reuse = 0;
        }
        self.ctx.seq_rm(Some(id), reuse as i32, -1)?;
        log::info!(
            "prompt cache {}: {reuse} of {} prompt tokens reused",
            path.display(),
            prompt.len()
        );
        Ok(reuse)
    }

    /// One step, blocking on the GPU (native targets): see [`Engine::step_async`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn step(&mut self) -> Result<Vec<Event>, EngineError> {
        pollster::block_on(self.step_async())
    }

    /// One step of every session: each generating session samples a token; then one
    /// batch of at most n_batch tokens — one per generating session, then chunks of
    /// waiting prompts in session order — is decoded. Returns what happened; an `Err` is
    /// a failure of the whole step (the GPU), after which the cache is as before it.
    pub async fn step_async(&mut self) -> Result<Vec<Event>, EngineError> {
        if let Some(p) = self.pending.take() {
            return self.step_ahead(p).await;
        }
        let mut events = Vec::new();
        self.sample_all(&mut events);
        let (batch, mut parts) = self.plan_batch(&mut events)?;
        self.last_batch = (0, 0);
        if batch.tokens.is_empty() {
            return Ok(events);
        }
        let draws = self.plan_draws(&batch, &mut parts);
        if self.can_go_ahead(&batch, &parts) {
            self.submit_ahead(batch, parts, &draws)?;
            return Ok(events);
        }
        let start = Instant::now();
        let out = self.ctx.decode_drawing_async(&batch, &draws).await?;
        let dt = start.elapsed();
        self.n_steps += 1;
        let n_gen = parts.iter().filter(|p| p.generating).count();
        self.last_batch = (batch.tokens.len() - n_gen, n_gen);
        self.take_results(&batch, &parts, &out, dt, &mut events)?;
        Ok(events)
    }

    /// Cancellations, then a sampled token for each generating session.
    fn sample_all(&mut self, events: &mut Vec<Event>) {
        let tok = &self.tokenizer;
        for s in self.sessions.iter_mut().flatten() {
            if std::mem::take(&mut s.cancel) {
                if s.phase != Phase::Idle {
                    events.push(s.finish(Stop::Cancelled));
                    record_reply(tok, s);
                }
                continue;
            }
            // A token sampled earlier that did not fit the last batch is still to decode.
            if s.phase != Phase::Generate || s.next.is_some() {
                continue;
            }
            let n_predict = s.params.n_predict;
            if n_predict >= 0 && s.generated.len() >= n_predict as usize {
                events.push(s.finish(Stop::MaxTokens));
                record_reply(tok, s);
                continue;
            }
            // A grammar that allows nothing more ends the generation, as its
            // end-of-generation token would (also where --ignore-eos bans that token).
            if s.sampler.grammar_complete() {
                events.push(s.finish(Stop::EndOfGeneration));
                record_reply(tok, s);
                continue;
            }
            let (t, probs, accepted) = if let Some(d) = s.drawn.take() {
                // Drawn on the GPU with the stream's next number; the GPU also recorded
                // it in its copy of the penalty history.
                let accepted = s.sampler.accept_gpu_pick(d.token);
                self.ctx.set_sampler_stamp(s.id, s.sampler.history_stamp());
                self.n_gpu_draws += 1;
                // Only post-sampling probabilities are drawn on the GPU (draw.rs).
                let probs = (s.params.n_probs > 0).then(|| {
                    Box::new(TokenProbs {
                        prob: d.prob,
                        top: d.top,
                    })
                });
                (d.token, probs, accepted)
            } else if let Some(logits) = s.logits.take() {
                let picked = Self::sample_logits(s, &logits);
                s.logits = Some(logits);
                self.n_host_samples += 1;
                picked
            } else {
                continue;
            };
            match accepted {
                Ok(()) => {}
                Err(error @ GrammarError::TooComplex) => {
                    // The request's grammar needs more than the matcher may spend on a
                    // token: the client hears why, rather than a plain end.
                    s.finish(Stop::EndOfGeneration);
                    events.push(Event::Error {
                        session: s.id,
                        error: error.into(),
                    });
                    continue;
                }
                // Sampling only picks tokens the grammar allows; this is a bug if seen.
                Err(e) => log::error!("session {}: {e}", s.id),
            }
            if tok.is_eog(t) {
                events.push(s.finish(Stop::EndOfGeneration));
                record_reply(tok, s);
                continue;
            }
            s.generated.push(t);
            let text = s.stream.push(&tok.token_to_piece(t, false));
            s.reply.push_str(&text);
            s.next = Some(t);
            events.push(Event::Token {
                session: s.id,
                token: t,
                text,
                probs,
            });
        }
    }

    /// Samples a token from logits read back to the host (with its probabilities where
    /// asked for) and accepts it.
    fn sample_logits(
        s: &mut Session,
        logits: &[f32],
    ) -> (u32, Option<Box<TokenProbs>>, Result<(), GrammarError>) {
        let (t, probs) = if s.params.n_probs == 0 {
            (s.sampler.sample(logits), None)
        } else if s.params.post_sampling_probs {
            let (t, prob, top) = s.sampler.sample_with_probs(logits, s.params.n_probs);
            (t, Some(Box::new(TokenProbs { prob, top })))
        } else {
            let t = s.sampler.sample(logits);
            let p = TokenProbs::from_logits(logits, t, s.params.n_probs);
            (t, Some(Box::new(p)))
        };
        let accepted = s.sampler.accept_generated(t);
        (t, probs, accepted)
    }

    /// Makes room for each session's share of the batch and lays the batch out.
    fn plan_batch(&mut self, events: &mut Vec<Event>) -> Result<(Batch, Vec<Part>), EngineError> {
        let n_batch = self.ctx.params.n_batch as usize;
        let n_ctx_seq = self.n_ctx_seq() as i32;
        let mut batch = Batch::default();
        let mut parts = Vec::new();
        // Generating sessions first (one token each), then the waiting prompts, which
        // share the rest of the batch equally (starting from a different one each step,
        // so the remainder rotates): a short prompt is not held behind a long one.
        let generating: Vec<SessionId> = self
            .sessions()
            .filter(|s| s.phase == Phase::Generate && s.next.is_some())
            .map(|s| s.id)
            .collect();
        let mut prompts: Vec<(SessionId, usize)> = self
            .sessions()
            .filter(|s| s.phase == Phase::Prompt)
            .map(|s| (s.id, s.pending.len()))
            .collect();
        if !prompts.is_empty() {
            let k = self.n_steps as usize % prompts.len();
            prompts.rotate_left(k);
        }
        let room = n_batch.saturating_sub(generating.len());
        let needs: Vec<usize> = prompts.iter().map(|p| p.1).collect();
        let shares = schedule::fair_shares(&needs, room);
        let order: Vec<(SessionId, bool, usize)> = (generating.iter().map(|&id| (id, true, 1)))
            .chain(
                prompts
                    .iter()
                    .zip(shares)
                    .filter(|(_, n)| *n > 0)
                    .map(|(p, n)| (p.0, false, n)),
            )
            .collect();
        for &(id, generating, share) in &order {
            let room_left = n_batch - batch.tokens.len();
            if room_left == 0 {
                break;
            }
            let s = self.sessions[id as usize].as_mut().unwrap();
            let tokens: Vec<u32> = if generating {
                vec![s.next.unwrap()]
            } else {
                s.pending
                    .iter()
                    .take(share.min(room_left))
                    .copied()
                    .collect()
            };
            let n = tokens.len() as i32;
            match s.shift.make_room(&mut self.ctx, id, n, n_ctx_seq) {
                Ok(Room::Fits) => {}
                Ok(Room::Shifted { n_keep, n_discard }) => events.push(Event::ContextShifted {
                    session: id,
                    n_keep,
                    n_discard,
                }),
                Ok(Room::Extended { n_past }) => events.push(Event::ContextExtended {
                    session: id,
                    n_past,
                }),
                Err(ContextError::ContextFull { n_ctx, reason }) => {
                    let s = self.sessions[id as usize].as_mut().unwrap();
                    if generating {
                        events.push(s.finish(Stop::ContextFull(reason)));
                        record_reply(&self.tokenizer, s);
                    } else {
                        s.finish(Stop::ContextFull(reason));
                        events.push(Event::Error {
                            session: id,
                            error: if s.then_generate {
                                EngineError::PromptFull { n_ctx, reason }
                            } else {
                                EngineError::Context(ContextError::ContextFull { n_ctx, reason })
                            },
                        });
                    }
                    continue;
                }
                Err(e) => return Err(e.into()),
            }
            let s = self.sessions[id as usize].as_ref().unwrap();
            // Positions continue from the sequence's largest one, as llama.cpp assigns
            // them to a batch without positions (after Self-Extend, below n_past).
            let pos0 = self.ctx.memory().seq_pos_max(id) + 1;
            let last_of_input = generating || tokens.len() == s.pending.len();
            let every_row = !generating && s.fed_logits.is_some();
            for (i, &t) in tokens.iter().enumerate() {
                batch.tokens.push(t);
                batch.pos.push(pos0 + i as i32);
                batch.seq.push(1u64 << id);
                batch
                    .logits
                    .push(every_row || (last_of_input && i + 1 == tokens.len()));
            }
            parts.push(Part {
                id,
                len: tokens.len(),
                drawn: None,
                generating,
                logits: last_of_input,
                rows: if every_row {
                    tokens.len()
                } else {
                    last_of_input as usize
                },
            });
        }
        Ok((batch, parts))
    }

    /// Hands each session its decoded tokens and logits.
    fn take_results(
        &mut self,
        batch: &Batch,
        parts: &[Part],
        out: &crate::context::Decoded,
        dt: Duration,
        events: &mut Vec<Event>,
    ) -> Result<(), EngineError> {
        let n_vocab = self.model.hp.n_vocab as usize;
        let mut rows = out.logits.chunks(n_vocab.max(1));
        let mut at = 0;
        for p in parts {
            let toks = &batch.tokens[at..at + p.len];
            at += p.len;
            let part_rows: Vec<&[f32]> = rows.by_ref().take(p.rows).collect();
            let row = if p.logits {
                part_rows.last().copied()
            } else {
                None
            };
            let s = self.sessions[p.id as usize].as_mut().unwrap();
            if let Some(all) = s.fed_logits.as_mut().filter(|_| !p.generating) {
                all.extend(part_rows.iter().map(|r| r.to_vec()));
            }
            s.shift.n_past += p.len as i32;
            s.history.extend_from_slice(toks);
            if let Some(r) = row {
                s.logits = Some(r.to_vec());
            }
            if let Some(j) = p.drawn {
                s.drawn = Some(out.picks[j].clone());
                s.logits = None;
            }
            if p.generating {
                s.next = None;
                s.timings.eval += dt;
                s.timings.eval_tokens += 1;
                continue;
            }
            s.pending.drain(..p.len);
            s.input_done += p.len;
            s.timings.prompt += dt;
            s.timings.prompt_tokens += p.len;
            events.push(Event::PromptProgress {
                session: p.id,
                done: s.input_done,
                total: s.input_total,
            });
            if !s.pending.is_empty() {
                continue;
            }
            if std::mem::take(&mut s.save_cache_after_input) {
                let path = s.params.prompt_cache.as_ref().unwrap().path.clone();
                let history = s.history.clone();
                self.save_prompt_cache(p.id, &path, &history)?;
            }
            let pos = self.ctx.memory().seq_pos_max(p.id) + 1;
            let s = self.sessions[p.id as usize].as_mut().unwrap();
            if s.then_generate {
                s.reply_mark = Some(rewind::ReplyMark::take(s, pos));
                s.phase = Phase::Generate;
            } else {
                events.push(s.finish(Stop::Fed));
            }
        }
        Ok(())
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn save_prompt_cache(
        &mut self,
        id: SessionId,
        path: &std::path::Path,
        tokens: &[u32],
    ) -> Result<(), EngineError> {
        self.ctx.state_save(path, tokens, Some(id))?;
        Ok(())
    }

    #[cfg(target_arch = "wasm32")]
    fn save_prompt_cache(
        &mut self,
        _: SessionId,
        path: &std::path::Path,
        _: &[u32],
    ) -> Result<(), EngineError> {
        Err(EngineError::PromptCache(format!(
            "{}: prompt-cache files need a file system",
            path.display()
        )))
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

/// Records a finished chat reply in the session's conversation.
fn record_reply(tok: &Tokenizer, s: &mut Session) {
    let reply = s.reply.clone();
    if let Some(conv) = s.conversation.as_mut() {
        if let Err(e) = conv.assistant_reply(tok, &reply) {
            log::warn!("chat template while recording the reply: {e}");
        }
    }
}
