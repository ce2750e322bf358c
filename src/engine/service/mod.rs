//! The engine as a service: one thread owns the [`Engine`] and serves requests from any
//! number of callers through a cloneable, `Send + Sync` handle. A caller tokenizes (and
//! renders its chat template) on its own side, submits the tokens with their settings,
//! and reads the request's events from a channel — blocking (`blocking_recv`) or awaited
//! (`recv().await`) — so no async runtime's worker ever waits on the GPU. Requests wait
//! in a queue while every slot (cache sequence) is busy; each request has a key that is
//! never reused; a request whose reader is gone (a client that disconnected) is cancelled
//! at its next event and its slot freed.
//!
//! A request takes the idle slot whose cached tokens share the longest prefix with its
//! prompt (`cache_prompt`), else the one used least recently, as llama-server picks.
//! With a host prompt cache ([`ServiceOptions::cache_ram`], llama-server's `--cache-ram`),
//! a slot that shares less than a tenth of the prompt is first saved to the cache and
//! given the cached prompt sharing the most, and when a request starts, the idle slots
//! are saved (`--cache-idle-slots`; with a unified cache they are then cleared, freeing
//! their cells for the others).
//!
//! The loop is async: natively it runs on a thread of its own (blocking on the GPU there
//! is harmless), in a browser page as a task on the page's event loop that awaits each
//! step's readback and lets the page draw between steps.

mod worker;

use worker::{open_slots, Worker};

use super::{CacheMap, Engine, EngineError, Pooling, SessionParams, Timings, TokenProbs};
use crate::context::FullReason;
use crate::tokenizer::Tokenizer;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc as amp, oneshot};

/// What a command whose reply never comes answers: the engine's thread has stopped (the
/// server is shutting down, or its device is gone).
fn stopped() -> RequestError {
    RequestError::Unavailable("the engine has stopped (the server is shutting down)".into())
}

/// Loads the model again (a new device opened), for recovering from a lost device.
#[derive(Clone)]
pub struct Reload(pub Arc<dyn Fn() -> Result<Engine, String> + Send + Sync>);

impl std::fmt::Debug for Reload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reload")
    }
}

/// How the service keeps prompts beyond its slots, and recovers from a lost device.
#[derive(Clone, Debug, Default)]
pub struct ServiceOptions {
    /// How to load the model again when the GPU device is lost (a driver reset, a GPU
    /// switched off): the requests in flight fail, the service reloads and goes on
    /// serving. Without it a lost device fails every request until restarted.
    pub reload: Option<Reload>,
    /// A host prompt cache of at most this many bytes (`Some(None)`: no limit); `None`:
    /// no cache (llama-server's `--cache-ram N` in MiB, -1 no limit, 0 off).
    pub cache_ram: Option<Option<usize>>,
    /// Save the idle slots to the cache whenever a request starts, and with
    /// `kv_unified` clear them (`--cache-idle-slots`).
    pub cache_idle_slots: bool,
    /// Every slot draws on one shared cache (`--kv-unified`).
    pub kv_unified: bool,
    /// After this long without a command the service sleeps: the engine (its device,
    /// weights and cache) and the host prompt cache are dropped, and the next command
    /// that needs the model loads it again with [`Self::reload`], which must be set
    /// (llama-server's `--sleep-idle-seconds`). Native targets only.
    pub sleep_idle: Option<std::time::Duration>,
}

/// A request's key: unique for the service's lifetime (slots are reused, keys never).
pub type RequestKey = u64;

/// One completion: the prompt's tokens and how to generate.
#[derive(Clone, Debug, Default)]
pub struct Request {
    /// The prompt's tokens, with the placeholders of its images (see
    /// [`crate::engine::MediaPrompt`]).
    pub prompt: Vec<u32>,
    /// The prompt's images, in order.
    pub images: Vec<Arc<super::ImageChunk>>,
    /// Sampling, `n_predict`, context policy, `n_probs`.
    pub params: SessionParams,
    /// Reuse the cells of the longest prefix a slot already holds.
    pub cache_prompt: bool,
    /// Run on this slot (waiting for it if busy); `None`: the best idle one.
    pub slot: Option<u32>,
    /// Stop strings: generation ends at the first, which is not part of the text.
    pub stop: Vec<String>,
    /// llama-server's `n_indent`: after the first newline, a line indented by fewer
    /// spaces or tabs ends the generation (see [`crate::engine::IndentLimit`]); 0: none.
    pub n_indent: u32,
}

/// Why a request's generation ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// An end-of-generation token.
    Eos,
    /// `n_predict` tokens, or (without context shift) the slot's context is full.
    Limit,
    /// A stop string.
    Word(String),
    /// The slot's context is full and nothing could be shifted out.
    ContextFull(FullReason),
    /// Cancelled by the caller.
    Cancelled,
}

/// The end of a request.
#[derive(Clone, Debug)]
pub struct Finished {
    pub stop: StopReason,
    /// Text held back until the end (an incomplete character, a partial stop string).
    pub tail: String,
    pub timings: Timings,
    pub slot: u32,
    pub n_prompt: usize,
    /// Prompt tokens whose cells were reused from the slot's cache.
    pub n_cached: usize,
    pub n_generated: usize,
    /// The context was shifted, or generation stopped because the context was full.
    pub truncated: bool,
}

/// What a request's caller reads.
#[derive(Debug)]
pub enum RequestEvent {
    /// The request has a slot; `n_cached` of its `n_prompt` tokens are reused.
    Started {
        slot: u32,
        n_prompt: usize,
        n_cached: usize,
    },
    /// Prompt tokens decoded so far of those needing decoding.
    Progress {
        done: usize,
        total: usize,
    },
    /// A context shift dropped `n_discard` tokens after the first `n_keep`.
    Shifted {
        n_keep: i32,
        n_discard: i32,
    },
    /// Self-Extend regrouped positions; the slot now spans `n_past` positions.
    Extended {
        n_past: i32,
    },
    /// A generated token; `text` is what may be shown now (stop strings held back).
    Token {
        token: u32,
        text: String,
        probs: Option<Box<TokenProbs>>,
    },
    Finished(Box<Finished>),
    /// The request failed; nothing follows.
    Failed(RequestError),
}

/// Why a request failed: the caller's input, or the server.
#[derive(Clone, Debug, thiserror::Error)]
pub enum RequestError {
    #[error("{0}")]
    Invalid(String),
    /// The prompt does not fit a slot's context.
    #[error("request ({n_prompt} tokens) exceeds the available context size ({n_ctx} tokens), try increasing it")]
    ExceedsContext { n_prompt: usize, n_ctx: u32 },
    #[error("{0}")]
    Server(String),
    /// The service is stopping (the server was told to shut down): try again elsewhere.
    #[error("{0}")]
    Unavailable(String),
}

impl RequestError {
    fn from_engine(e: &EngineError) -> Self {
        match e {
            EngineError::PromptTooLong { .. }
            | EngineError::EmptyPrompt
            | EngineError::PromptFull { .. }
            | EngineError::Grammar(_)
            | EngineError::Options(_) => RequestError::Invalid(e.to_string()),
            _ => RequestError::Server(e.to_string()),
        }
    }
}

/// A slot as `/slots` shows it.
#[derive(Clone, Debug)]
pub struct SlotInfo {
    pub id: u32,
    pub n_ctx: u32,
    pub is_processing: bool,
    /// The request it runs, or ran last.
    pub request: Option<RequestKey>,
    pub params: SessionParams,
    /// Tokens its sequence holds.
    pub n_cached: usize,
    pub n_decoded: usize,
}

/// Counters and gauges for `/metrics` (llama-server's `llamacpp:*`).
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Prompt tokens decoded (not those reused from a slot's cache).
    pub prompt_tokens_total: u64,
    /// Prompt tokens reused from a slot's cache.
    pub prompt_tokens_cached_total: u64,
    pub prompt_seconds_total: f64,
    /// Tokens generated.
    pub tokens_predicted_total: u64,
    pub tokens_predicted_seconds_total: f64,
    pub n_decode_total: u64,
    pub n_busy_slots_total: u64,
    pub requests_processing: u64,
    pub requests_deferred: u64,
    pub requests_total: u64,
    pub kv_cells_used: u64,
    pub kv_cells_total: u64,
    /// Largest number of tokens a slot has held.
    pub n_tokens_max: u64,
    /// Bytes of GPU buffers alive on the model's device.
    pub gpu_buffer_bytes: u64,
    /// Bytes of slot snapshots the host prompt cache holds (it fills up to `--cache-ram`).
    pub prompt_cache_bytes: u64,
    /// Set while the service reloads the model after its device was lost: why.
    pub recovering: Option<String>,
}

/// What a slot file action did.
#[derive(Clone, Debug)]
pub struct SlotFileResult {
    pub tokens: usize,
    pub ms: f64,
}

/// An action on an idle slot's cache.
#[derive(Clone, Debug)]
pub enum SlotAction {
    Save(PathBuf),
    Restore(PathBuf),
    Erase,
}

/// What a watcher hears after every step: for displays (tokens/s charts, cache maps).
#[derive(Clone, Debug)]
pub enum ServiceUpdate {
    /// One decode: its time and the prompt and generated tokens it carried.
    Step {
        secs: f64,
        n_prompt: usize,
        n_gen: usize,
    },
    /// Every store's cells after the step (or after a slot action).
    Cache(CacheMap),
}

/// Where a request's events go: returns false once nobody listens (the request is then
/// cancelled).
pub type Sink = Box<dyn FnMut(RequestEvent) -> bool + Send>;
/// Where a watcher's updates go: returns false once it is gone.
pub type WatchSink = Box<dyn FnMut(ServiceUpdate) -> bool + Send>;

enum Cmd {
    Submit(Box<Queued>),
    Watch(WatchSink),
    Cancel(RequestKey),
    Slots(oneshot::Sender<Vec<SlotInfo>>),
    Slot {
        slot: u32,
        action: SlotAction,
        reply: oneshot::Sender<Result<SlotFileResult, RequestError>>,
    },
    Embed {
        inputs: Vec<Vec<u32>>,
        pooling: Pooling,
        reply: oneshot::Sender<EmbedResult>,
    },
    /// The LoRA scales new requests take, set first where `set` holds new ones.
    Lora {
        set: Option<Vec<f32>>,
        reply: oneshot::Sender<Result<Vec<f32>, RequestError>>,
    },
    /// Fail everything in flight and queued as unavailable, drop the engine (its device
    /// and buffers), then answer.
    Shutdown(oneshot::Sender<()>),
    /// Sleep now if nothing ran for [`ServiceOptions::sleep_idle`] (sent by the idle
    /// timer; neither this nor a sleeping service's `Cancel` or `Watch` counts as use).
    /// Pages do not sleep: there the timer never runs.
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    Sleep,
    /// Be awake (loading the model again if asleep), then answer.
    Wake(oneshot::Sender<Result<(), RequestError>>),
}

/// Each input's embedding (one vector, or one per token without pooling).
pub type EmbedResult = Result<Vec<Vec<Vec<f32>>>, RequestError>;

struct Queued {
    key: RequestKey,
    req: Request,
    sink: Sink,
}

/// What the model is, for front ends.
#[derive(Clone, Debug)]
pub struct ServiceInfo {
    pub model_name: String,
    pub arch: String,
    pub n_ctx: u32,
    pub n_ctx_slot: u32,
    pub n_slots: u32,
    pub n_vocab: u32,
    pub n_embd: u32,
    pub n_ctx_train: u32,
    pub model_bytes: u64,
    /// Device memory held once the service started (weights, caches, work buffers), on
    /// every device of the model.
    pub device_bytes: u64,
    /// An embeddings engine (`--embeddings`): it embeds and generates nothing.
    pub embeddings: bool,
    /// The loaded LoRA adapters, by id.
    pub loras: Vec<LoraInfo>,
}

/// A loaded LoRA adapter as `/lora-adapters` lists it.
#[derive(Clone, Debug)]
pub struct LoraInfo {
    pub path: String,
    pub task_name: String,
    pub prompt_prefix: String,
}

struct Shared {
    cmd: amp::UnboundedSender<Cmd>,
    next_key: AtomicU64,
    tokenizer: Tokenizer,
    image_prep: Option<Arc<crate::vision::ImagePrep>>,
    info: ServiceInfo,
    stats: Mutex<Stats>,
    /// The engine is dropped until a command wakes the service.
    sleeping: AtomicBool,
    /// When the worker last took a command or stepped (the idle timer's start).
    last_active: Mutex<web_time::Instant>,
}

/// A handle to the engine's thread; clone it freely.
#[derive(Clone)]
pub struct EngineService {
    shared: Arc<Shared>,
}

/// A submitted request: its key and its events. Dropping it cancels the request.
pub struct Ticket {
    pub key: RequestKey,
    pub events: amp::UnboundedReceiver<RequestEvent>,
    service: EngineService,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.service.send(Cmd::Cancel(self.key));
    }
}

impl EngineService {
    /// Moves `engine` onto a thread of its own, opening one session per sequence it
    /// serves (native targets).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn spawn(engine: Engine) -> Result<EngineService, EngineError> {
        Self::spawn_with(engine, ServiceOptions::default())
    }

    /// [`Self::spawn`] with a host prompt cache and its policy.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn spawn_with(engine: Engine, opts: ServiceOptions) -> Result<EngineService, EngineError> {
        if opts.sleep_idle.is_some() && opts.reload.is_none() {
            return Err(EngineError::Options(
                "a service that sleeps when idle needs a way to load the model again (ServiceOptions::reload)".into(),
            ));
        }
        let sleep_idle = opts.sleep_idle;
        let (service, mut worker, rx) = Self::build(engine)?;
        worker.configure(opts);
        std::thread::Builder::new()
            .name("wgllm-engine".into())
            .spawn(move || pollster::block_on(worker.run(rx)))
            .map_err(|e| EngineError::Options(format!("starting the engine thread: {e}")))?;
        if let Some(idle) = sleep_idle {
            let shared = Arc::downgrade(&service.shared);
            std::thread::Builder::new()
                .name("wgllm-idle-timer".into())
                .spawn(move || idle_timer(shared, idle))
                .map_err(|e| EngineError::Options(format!("starting the idle timer: {e}")))?;
        }
        Ok(service)
    }

    /// Runs `engine` as a task on the page's event loop (browsers), opening one session
    /// per sequence it serves.
    #[cfg(target_arch = "wasm32")]
    pub fn spawn_local(engine: Engine) -> Result<EngineService, EngineError> {
        let (service, worker, rx) = Self::build(engine)?;
        wasm_bindgen_futures::spawn_local(worker.run(rx));
        Ok(service)
    }

    fn build(
        mut engine: Engine,
    ) -> Result<(EngineService, Worker, amp::UnboundedReceiver<Cmd>), EngineError> {
        let n_slots = engine.context().params.n_seq_max;
        let embeddings = engine.context().params.embeddings;
        // An embeddings engine keeps its sequences free for `embed`.
        if !embeddings {
            open_slots(&mut engine, n_slots)?;
        }
        let (tx, rx) = amp::unbounded_channel();
        let hp = &engine.model.hp;
        let info = ServiceInfo {
            model_name: engine.model.name.clone(),
            arch: format!("{:?}", hp.arch).to_lowercase(),
            n_ctx: engine.n_ctx(),
            n_ctx_slot: engine.n_ctx_seq(),
            n_slots,
            n_vocab: hp.n_vocab,
            n_embd: hp.n_embd,
            n_ctx_train: hp.n_ctx_train,
            model_bytes: engine.model.weights.gpu_bytes,
            device_bytes: (engine.device_parts().iter()).map(|d| d.allocated).sum(),
            embeddings,
            loras: (engine.lora_adapters().iter())
                .map(|a| LoraInfo {
                    path: a.path.clone(),
                    task_name: a.task_name.clone(),
                    prompt_prefix: a.prompt_prefix.clone(),
                })
                .collect(),
        };
        let shared = Arc::new(Shared {
            cmd: tx,
            next_key: AtomicU64::new(1),
            tokenizer: engine.tokenizer.clone(),
            image_prep: engine.image_prep(),
            info,
            stats: Mutex::new(Stats {
                kv_cells_total: engine.n_ctx() as u64,
                ..Stats::default()
            }),
            sleeping: AtomicBool::new(false),
            last_active: Mutex::new(web_time::Instant::now()),
        });
        // Injected faults (tests) count from here: the model is loaded.
        engine.model.gpu.arm_faults();
        let worker = Worker::new(engine, shared.clone());
        Ok((EngineService { shared }, worker, rx))
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.shared.tokenizer
    }

    /// How images are prepared for the engine's vision encoder; `None` without one.
    pub fn image_prep(&self) -> Option<&Arc<crate::vision::ImagePrep>> {
        self.shared.image_prep.as_ref()
    }

    pub fn info(&self) -> &ServiceInfo {
        &self.shared.info
    }

    /// The counters as they were when the service last ran; while it sleeps they stay
    /// as they were when it fell asleep.
    pub fn stats(&self) -> Stats {
        self.shared.stats.lock().unwrap().clone()
    }

    /// The service sleeps: its model is not loaded (see [`ServiceOptions::sleep_idle`]).
    pub fn is_sleeping(&self) -> bool {
        self.shared.sleeping.load(Ordering::Relaxed)
    }

    /// Resolves once the service is awake, loading the model again if it sleeps; an
    /// error if that load fails (the service then stays asleep and the next command
    /// tries again) or the service has stopped.
    pub async fn wake(&self) -> Result<(), RequestError> {
        let (reply, rx) = oneshot::channel();
        self.send(Cmd::Wake(reply));
        rx.await.unwrap_or_else(|_| Err(stopped()))
    }

    fn send(&self, c: Cmd) -> bool {
        self.shared.cmd.send(c).is_ok()
    }

    /// Queues a request; its events arrive on the ticket.
    pub fn submit(&self, req: Request) -> Ticket {
        let (tx, events) = amp::unbounded_channel();
        let key = self.submit_to(req, Box::new(move |ev| tx.send(ev).is_ok()));
        Ticket {
            key,
            events,
            service: self.clone(),
        }
    }

    /// Queues a request whose events go to `sink` (a caller multiplexing many requests
    /// on one channel of its own); returns its key for [`EngineService::cancel`].
    pub fn submit_to(&self, req: Request, mut sink: Sink) -> RequestKey {
        let key = self.shared.next_key.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self
            .shared
            .cmd
            .send(Cmd::Submit(Box::new(Queued { key, req, sink })))
        {
            // The engine's loop is gone: say so instead of leaving the caller waiting.
            if let Cmd::Submit(q) = e.0 {
                sink = q.sink;
                sink(RequestEvent::Failed(stopped()));
            }
        }
        key
    }

    /// Step timings and cache maps after every step, until `sink` returns false.
    pub fn watch(&self, sink: WatchSink) {
        self.send(Cmd::Watch(sink));
    }

    /// Cancels a request (queued or running); unknown or finished keys are ignored.
    pub fn cancel(&self, key: RequestKey) {
        self.send(Cmd::Cancel(key));
    }

    /// The slots, as the engine thread sees them between steps.
    pub async fn slots(&self) -> Vec<SlotInfo> {
        let (tx, rx) = oneshot::channel();
        self.send(Cmd::Slots(tx));
        rx.await.unwrap_or_default()
    }

    /// The embeddings of `inputs` (token lists), pooled as `pooling` says, not
    /// normalised; an engine made without embeddings refuses.
    pub async fn embed(&self, inputs: Vec<Vec<u32>>, pooling: Pooling) -> EmbedResult {
        let (reply, rx) = oneshot::channel();
        self.send(Cmd::Embed {
            inputs,
            pooling,
            reply,
        });
        rx.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// The LoRA adapters' scales requests without a `lora` of their own take; with
    /// `set`, those become the new ones first (one per adapter, missing ones 0).
    pub async fn lora_scales(&self, set: Option<Vec<f32>>) -> Result<Vec<f32>, RequestError> {
        let (reply, rx) = oneshot::channel();
        self.send(Cmd::Lora { set, reply });
        rx.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// Stops the engine's thread: requests in flight and queued end with
    /// [`RequestError::Unavailable`] (a stream's error event, a 503), later ones are
    /// refused the same way, and the engine with its device is dropped. Resolves once it
    /// is (at once if the thread is already gone).
    pub async fn shutdown(&self) {
        let (done, rx) = oneshot::channel();
        if self.send(Cmd::Shutdown(done)) {
            let _ = rx.await;
        }
    }

    /// Saves, restores or erases an idle slot's cache.
    pub async fn slot_action(
        &self,
        slot: u32,
        action: SlotAction,
    ) -> Result<SlotFileResult, RequestError> {
        let (reply, rx) = oneshot::channel();
        self.send(Cmd::Slot {
            slot,
            action,
            reply,
        });
        rx.await.unwrap_or_else(|_| Err(stopped()))
    }
}

/// Asks the worker to sleep whenever nothing has run for `idle` (it declines if work
/// came meanwhile); ends with the service.
#[cfg(not(target_arch = "wasm32"))]
fn idle_timer(shared: std::sync::Weak<Shared>, idle: std::time::Duration) {
    loop {
        let Some(sh) = shared.upgrade() else { return };
        let quiet = sh.last_active.lock().unwrap().elapsed();
        let wait = if quiet >= idle {
            if !sh.sleeping.load(Ordering::Relaxed) && sh.cmd.send(Cmd::Sleep).is_err() {
                return;
            }
            idle
        } else {
            idle - quiet
        };
        drop(sh);
        std::thread::sleep(wait.max(std::time::Duration::from_millis(20)));
    }
}

/// Hands the heap's freed pages back to the system after an engine is dropped. glibc's
/// allocator keeps freed memory in its arenas for reuse, so without this a process that
/// unloaded (or put to sleep) a model would go on holding its host-side buffers (on a
/// software device, the "GPU" memory itself).
pub(crate) fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns unused pages of the allocator's own arenas; it
    // touches no memory in use and is safe to call from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}
