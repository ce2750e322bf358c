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

use super::host_cache::shared_prefix;
use super::{
    CacheMap, Engine, EngineError, Event, HostCache, SessionParams, StopStrings, Timings,
    TokenProbs,
};
use crate::context::FullReason;
use crate::engine::Stop;
use crate::tokenizer::Tokenizer;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc as amp, oneshot};
use web_time::Instant;

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
}

/// A request's key: unique for the service's lifetime (slots are reused, keys never).
pub type RequestKey = u64;

/// One completion: the prompt's tokens and how to generate.
#[derive(Clone, Debug, Default)]
pub struct Request {
    pub prompt: Vec<u32>,
    /// Sampling, `n_predict`, context policy, `n_probs`.
    pub params: SessionParams,
    /// Reuse the cells of the longest prefix a slot already holds.
    pub cache_prompt: bool,
    /// Run on this slot (waiting for it if busy); `None`: the best idle one.
    pub slot: Option<u32>,
    /// Stop strings: generation ends at the first, which is not part of the text.
    pub stop: Vec<String>,
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
}

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
}

struct Shared {
    cmd: amp::UnboundedSender<Cmd>,
    next_key: AtomicU64,
    tokenizer: Tokenizer,
    info: ServiceInfo,
    stats: Mutex<Stats>,
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
        let (service, mut worker, rx) = Self::build(engine)?;
        if let Some(limit) = opts.cache_ram {
            match limit {
                Some(b) => log::info!("prompt cache: up to {} MiB of host memory", b >> 20),
                None => log::info!("prompt cache: host memory without a limit"),
            }
            worker.cache = Some(HostCache::new(limit));
            if opts.cache_idle_slots {
                log::debug!(
                    "idle slots are saved to the prompt cache when a request starts{} (__TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__)",
                    if opts.kv_unified { " and then cleared" } else { "" }
                );
            }
        }
        worker.opts = opts;
        std::thread::Builder::new()
            .name("wgllm-engine".into())
            .spawn(move || pollster::block_on(worker.run(rx)))
            .map_err(|e| EngineError::Options(format!("starting the engine thread: {e}")))?;
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
        open_slots(&mut engine, n_slots)?;
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
        };
        let shared = Arc::new(Shared {
            cmd: tx,
            next_key: AtomicU64::new(1),
            tokenizer: engine.tokenizer.clone(),
            info,
            stats: Mutex::new(Stats {
                kv_cells_total: engine.n_ctx() as u64,
                ..Stats::default()
            }),
        });
        // Injected faults (tests) count from here: the model is loaded.
        engine.model.gpu.arm_faults();
        let worker = Worker::new(engine, shared.clone());
        Ok((EngineService { shared }, worker, rx))
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.shared.tokenizer
    }

    pub fn info(&self) -> &ServiceInfo {
        &self.shared.info
    }

    pub fn stats(&self) -> Stats {
        self.shared.stats.lock().unwrap().clone()
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
                sink(RequestEvent::Failed(RequestError::Server(
                    "the engine has stopped".into(),
                )));
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
        rx.await
            .unwrap_or_else(|_| Err(RequestError::Server("the engine thread has stopped".into())))
    }
}

/// A request running on a slot.
struct Active {
    key: RequestKey,
    sink: Sink,
    stop: StopStrings,
    n_prompt: usize,
    n_cached: usize,
    n_generated: usize,
    shifted: bool,
    /// `n_predict` was cut to what the slot's context holds (no context shift).
    limit_is_context: bool,
    /// The caller is gone or cancelled: finish without telling anyone.
    dropped: bool,
}

struct Slot {
    active: Option<Active>,
    last_key: Option<RequestKey>,
    last_used: u64,
}

struct Worker {
    engine: Engine,
    /// The host prompt cache, where `opts` asks for one (native targets: a snapshot
    /// waits on the GPU).
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    cache: Option<HostCache>,
    opts: ServiceOptions,
    shared: Arc<Shared>,
    slots: Vec<Slot>,
    queue: VecDeque<Box<Queued>>,
    uses: u64,
    watchers: Vec<WatchSink>,
    /// Slot actions waiting for their slot to be idle.
    pending: Vec<(u32, SlotAction, SlotReply)>,
    /// The device was lost and the model could not be loaded again: every request and
    /// slot action gets this at once (nothing can run; stepping would only fail again).
    dead: Option<RequestError>,
}

type SlotReply = oneshot::Sender<Result<SlotFileResult, RequestError>>;

impl Worker {
    fn new(engine: Engine, shared: Arc<Shared>) -> Self {
        let n = shared.info.n_slots as usize;
        Worker {
            engine,
            cache: None,
            opts: ServiceOptions::default(),
            shared,
            slots: (0..n)
                .map(|_| Slot {
                    active: None,
                    last_key: None,
                    last_used: 0,
                })
                .collect(),
            queue: VecDeque::new(),
            uses: 0,
            watchers: Vec::new(),
            pending: Vec::new(),
            dead: None,
        }
    }

    async fn run(mut self, mut rx: amp::UnboundedReceiver<Cmd>) {
        loop {
            if let Some(err) = self.dead.clone() {
                match rx.recv().await {
                    Some(c) => Self::refuse(c, &err),
                    None => return,
                }
                continue;
            }
            // Idle with nothing waiting: wait for a command; otherwise take what came,
            // start what waits, then step. (With the engine idle every slot is free, so
            // whatever is queued starts now.)
            if !self.engine.is_busy() && self.queue.is_empty() && self.pending.is_empty() {
                match rx.recv().await {
                    Some(c) => self.handle(c),
                    // Every handle is gone: the engine (and its GPU buffers) go with us.
                    None => return,
                }
            }
            while let Ok(c) = rx.try_recv() {
                self.handle(c);
            }
            self.run_slot_actions();
            self.assign();
            if self.engine.is_busy() {
                self.step().await;
                self.run_slot_actions();
                // Between steps a page gets a turn to draw what came back.
                #[cfg(target_arch = "wasm32")]
                super::pause::pause_ms(0).await;
            }
            self.publish_gauges();
        }
    }

    /// Answers a command of a service whose device is gone for good with `err`.
    fn refuse(c: Cmd, err: &RequestError) {
        match c {
            Cmd::Submit(mut q) => {
                (q.sink)(RequestEvent::Failed(err.clone()));
            }
            Cmd::Slot { reply, .. } => {
                let _ = reply.send(Err(err.clone()));
            }
            Cmd::Slots(reply) => {
                let _ = reply.send(Vec::new());
            }
            Cmd::Watch(_) | Cmd::Cancel(_) => {}
        }
    }

    /// The device is gone and stays gone: what is in flight or queued fails with `why`,
    /// and so does everything after ([`Worker::refuse`]).
    fn give_up(&mut self, why: String) {
        let err = RequestError::Server(why);
        self.fail_in_flight(&err);
        for mut q in self.queue.drain(..) {
            (q.sink)(RequestEvent::Failed(err.clone()));
        }
        self.dead = Some(err);
    }

    fn handle(&mut self, c: Cmd) {
        match c {
            Cmd::Submit(mut q) => {
                // A slot that does not exist is never free: refuse now, not wait forever.
                if let Some(slot) = q.req.slot.filter(|&s| s as usize >= self.slots.len()) {
                    (q.sink)(RequestEvent::Failed(RequestError::Invalid(format!(
                        "id_slot {slot} does not exist: the server has {} slots (0 to {}); start it with more (-np) or leave id_slot out",
                        self.slots.len(),
                        self.slots.len().saturating_sub(1)
                    ))));
                    return;
                }
                self.queue.push_back(q)
            }
            Cmd::Watch(mut w) => {
                if w(ServiceUpdate::Cache(self.engine.cache_map())) {
                    self.watchers.push(w);
                }
            }
            Cmd::Cancel(key) => {
                self.queue.retain(|q| q.key != key);
                let hit = self
                    .slots
                    .iter_mut()
                    .enumerate()
                    .find(|(_, s)| s.active.as_ref().is_some_and(|a| a.key == key));
                if let Some((i, s)) = hit {
                    s.active.as_mut().unwrap().dropped = true;
                    let _ = self.engine.cancel(i as u32);
                }
            }
            Cmd::Slots(reply) => {
                let _ = reply.send(self.slot_infos());
            }
            Cmd::Slot {
                slot,
                action,
                reply,
            } => self.pending.push((slot, action, reply)),
        }
    }

    fn slot_infos(&self) -> Vec<SlotInfo> {
        let n_ctx = self.engine.n_ctx_seq();
        (self.slots.iter().enumerate())
            .filter_map(|(i, slot)| {
                let s = self.engine.session(i as u32).ok()?;
                Some(SlotInfo {
                    id: i as u32,
                    n_ctx,
                    is_processing: slot.active.is_some(),
                    request: slot.active.as_ref().map(|a| a.key).or(slot.last_key),
                    params: s.params().clone(),
                    n_cached: s.history().len(),
                    n_decoded: s.generated().len(),
                })
            })
            .collect()
    }

    /// Runs the slot actions whose slots are idle (a busy slot's wait for its request
    /// to end, as llama-server defers them); they go before queued requests.
    fn run_slot_actions(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let mut ran = false;
        for (slot, action, reply) in std::mem::take(&mut self.pending) {
            let busy = (self.slots.get(slot as usize)).is_some_and(|s| s.active.is_some());
            if busy {
                self.pending.push((slot, action, reply));
            } else {
                let _ = reply.send(self.slot_action(slot, action));
                ran = true;
            }
        }
        if ran {
            self.tell_watchers(None);
        }
    }

    fn slot_action(
        &mut self,
        slot: u32,
        action: SlotAction,
    ) -> Result<SlotFileResult, RequestError> {
        if slot as usize >= self.slots.len() {
            return Err(RequestError::Invalid("Invalid slot ID".into()));
        }
        let t0 = Instant::now();
        let done = match &action {
            #[cfg(not(target_arch = "wasm32"))]
            SlotAction::Save(path) => self.engine.save_session(slot, path),
            #[cfg(target_arch = "wasm32")]
            SlotAction::Save(_) => Err(EngineError::Options("no file system".into())),
            SlotAction::Restore(path) => self.engine.restore_session(slot, path),
            SlotAction::Erase => self.engine.erase_session(slot),
        };
        let tokens = done.map_err(|e| match e {
            EngineError::Context(_) if matches!(action, SlotAction::Restore(_)) => {
                RequestError::Invalid(e.to_string())
            }
            e => RequestError::from_engine(&e),
        })?;
        Ok(SlotFileResult {
            tokens,
            ms: t0.elapsed().as_secs_f64() * 1e3,
        })
    }

    /// Gives queued requests idle slots, first come first served (a request for a
    /// particular slot waits for it without holding back the others).
    fn assign(&mut self) {
        let mut i = 0;
        while i < self.queue.len() {
            let Some(slot) = self.pick_slot(&self.queue[i].req) else {
                if self.queue[i].req.slot.is_some() {
                    i += 1;
                    continue;
                }
                break;
            };
            let q = self.queue.remove(i).unwrap();
            self.start(slot, *q);
        }
    }

    fn pick_slot(&self, req: &Request) -> Option<u32> {
        let idle = |i: usize| self.is_idle(i);
        if let Some(s) = req.slot {
            return (s as usize)
                .lt(&self.slots.len())
                .then_some(s)
                .filter(|&s| idle(s as usize));
        }
        let lcp = |i: usize| self.shared_prefix(i as u32, &req.prompt);
        (0..self.slots.len())
            .filter(|&i| idle(i))
            .max_by_key(|&i| {
                let shared = if req.cache_prompt { lcp(i) } else { 0 };
                // Longest shared prefix first, then least recently used.
                (shared, u64::MAX - self.slots[i].last_used)
            })
            .map(|i| i as u32)
    }

    fn start(&mut self, slot: u32, q: Queued) {
        let Queued {
            key,
            mut req,
            mut sink,
        } = q;
        if req.slot.is_some_and(|s| s as usize >= self.slots.len()) {
            sink(RequestEvent::Failed(RequestError::Invalid(format!(
                "no slot {} (the server has {} slots)",
                req.slot.unwrap(),
                self.slots.len()
            ))));
            return;
        }
        let n_ctx = self.engine.n_ctx_seq() as usize;
        let n_prompt = req.prompt.len();
        let shift = req.params.shift;
        if n_prompt >= n_ctx && shift.ga_n == 1 {
            sink(RequestEvent::Failed(RequestError::ExceedsContext {
                n_prompt,
                n_ctx: n_ctx as u32,
            }));
            return;
        }
        // Without a context shift a reply ends where the slot's context does, as
        // llama-server ends it: one cell short of full.
        let mut limit_is_context = false;
        if !shift.context_shift && shift.ga_n == 1 {
            let room = (n_ctx - n_prompt) as i32;
            let n = req.params.n_predict;
            if n < 0 || n >= room {
                req.params.n_predict = room;
                limit_is_context = true;
            }
        }
        if req.cache_prompt && req.slot.is_none() {
            self.refill_from_cache(slot, &req.prompt);
        }
        let started = self
            .engine
            .start_request(slot, req.params, &req.prompt, req.cache_prompt);
        let n_cached = match started {
            Ok(n) => n,
            Err(e) => {
                sink(RequestEvent::Failed(RequestError::from_engine(&e)));
                return;
            }
        };
        self.uses += 1;
        let s = &mut self.slots[slot as usize];
        s.last_used = self.uses;
        s.last_key = Some(key);
        let dropped = !sink(RequestEvent::Started {
            slot,
            n_prompt,
            n_cached,
        });
        if dropped {
            let _ = self.engine.cancel(slot);
        }
        s.active = Some(Active {
            key,
            sink,
            stop: StopStrings::new(req.stop),
            n_prompt,
            n_cached,
            n_generated: 0,
            shifted: false,
            limit_is_context,
            dropped,
        });
        self.shared.stats.lock().unwrap().requests_total += 1;
        if self.opts.cache_idle_slots {
            self.save_idle_slots();
        }
    }

    /// Tokens slot `slot` already holds at the start of `prompt`.
    fn shared_prefix(&self, slot: u32, prompt: &[u32]) -> usize {
        (self.engine.session(slot)).map_or(0, |s| shared_prefix(s.history(), prompt))
    }

    fn is_idle(&self, i: usize) -> bool {
        self.slots[i].active.is_none() && !self.pending.iter().any(|p| p.0 as usize == i)
    }

    /// Saves slot `i`'s tokens and cells to the host cache unless it holds them already;
    /// true when they were added.
    #[cfg(not(target_arch = "wasm32"))]
    fn save_to_cache(&mut self, i: u32) -> bool {
        let Some(cache) = self.cache.as_mut() else {
            return false;
        };
        let covered = (self.engine.session(i)).map_or(true, |s| {
            s.history().is_empty() || cache.covers(s.history())
        });
        if covered {
            return false;
        }
        match self.engine.snapshot_session(i) {
            Ok(Some(snap)) => cache.insert(snap),
            Ok(None) => false,
            Err(e) => {
                log::warn!("slot {i} was not saved to the prompt cache: {e}");
                false
            }
        }
    }

    /// A slot about to take `prompt` while sharing little of it (under a tenth, as
    /// llama-server's slot similarity) keeps its own prompt in the host cache and takes
    /// the cached prompt sharing the most, where one shares more than it does.
    #[cfg(not(target_arch = "wasm32"))]
    fn refill_from_cache(&mut self, slot: u32, prompt: &[u32]) {
        if self.cache.is_none() {
            return;
        }
        let shared = self.shared_prefix(slot, prompt);
        if shared * 10 >= prompt.len() {
            return;
        }
        log::debug!(
            "updating prompt cache: slot {slot} shares {shared} of the prompt's {} tokens",
            prompt.len()
        );
        self.save_to_cache(slot);
        let cache = self.cache.as_mut().expect("checked above");
        let Some((snap, n)) = cache.best(prompt, shared) else {
            return;
        };
        match self.engine.restore_snapshot(slot, snap) {
            Ok(_) => log::debug!("slot {slot}: {n} prompt tokens restored from the prompt cache"),
            Err(e) => log::warn!("slot {slot}: the prompt cache's entry was not restored: {e}"),
        }
    }

    /// Saves every idle slot to the host cache; with a unified cache, clears it too.
    #[cfg(not(target_arch = "wasm32"))]
    fn save_idle_slots(&mut self) {
        if self.cache.is_none() {
            return;
        }
        for i in 0..self.slots.len() {
            if !self.is_idle(i) {
                continue;
            }
            let id = i as u32;
            if self.save_to_cache(id) {
                log::debug!("slot {i}: saved to the prompt cache (__TEST_TAG_CACHE_IDLE_SLOT__)");
            }
            let holds = self
                .engine
                .session(id)
                .is_ok_and(|s| !s.history().is_empty());
            if self.opts.kv_unified && holds {
                if let Err(e) = self.engine.erase_session(id) {
                    log::warn!("slot {i} was not cleared: {e}");
                }
            }
        }
    }

    #[cfg(target_arch = "wasm32")]
    fn refill_from_cache(&mut self, _slot: u32, _prompt: &[u32]) {}

    #[cfg(target_arch = "wasm32")]
    fn save_idle_slots(&mut self) {}

    async fn step(&mut self) {
        let n_busy = self.slots.iter().filter(|s| s.active.is_some()).count() as u64;
        let t0 = Instant::now();
        let gpu = self.engine.model.gpu.clone();
        let stepped = gpu.scoped(self.engine.step_async()).await;
        let secs = t0.elapsed().as_secs_f64();
        match stepped {
            Ok(events) => {
                let mut st = self.shared.stats.lock().unwrap();
                st.n_decode_total += 1;
                st.n_busy_slots_total += n_busy;
                drop(st);
                for ev in events {
                    self.route(ev);
                }
                self.tell_watchers(Some(secs));
            }
            Err(e) if self.engine.model.gpu.is_lost() => self.recover(&e),
            Err(e) => {
                log::error!("decoding failed: {e}");
                let full = matches!(
                    e,
                    EngineError::Context(crate::context::ContextError::Kv(
                        crate::kv::KvError::NoSlot { .. }
                    ))
                );
                // llama-server's words for a shared cache that ran out (--kv-unified).
                let err = RequestError::Server(if full {
                    format!("Context size has been exceeded. ({e})")
                } else {
                    format!("decoding failed: {e}")
                });
                for i in 0..self.slots.len() {
                    if let Some(mut a) = self.slots[i].active.take() {
                        (a.sink)(RequestEvent::Failed(err.clone()));
                        let _ = self.engine.cancel(i as u32);
                    }
                }
                // Let the cancelled sessions finish so the engine is idle again.
                while self.engine.is_busy() {
                    if self.engine.step_async().await.is_err() {
                        break;
                    }
                }
            }
        }
    }

    /// The device is lost: fails the requests in flight (queued ones wait), loads the
    /// model again on a new device and opens the slots afresh. Their caches are gone: a
    /// request continuing a conversation has its whole prompt decoded again.
    #[cfg(not(target_arch = "wasm32"))]
    fn recover(&mut self, e: &EngineError) {
        let reason = self.engine.model.gpu.lost_reason().unwrap_or_default();
        log::error!("the GPU device was lost ({reason}) while decoding ({e})");
        let why = match self.opts.reload {
            Some(_) => format!(
                "the GPU device was lost ({reason}); the server is reloading the model: retry the request"
            ),
            None => format!("the GPU device was lost ({reason}); restart to load the model again"),
        };
        self.shared.stats.lock().unwrap().recovering = Some(why.clone());
        let Some(reload) = self.opts.reload.clone() else {
            log::error!("no way to reload the model here: restart to load it again");
            return self.give_up(why);
        };
        self.fail_in_flight(&RequestError::Server(why));
        let mut tries = 0;
        let engine = loop {
            tries += 1;
            let n = self.shared.info.n_slots;
            match (reload.0)().and_then(|mut e| {
                open_slots(&mut e, n).map_err(|err| err.to_string())?;
                Ok(e)
            }) {
                Ok(e) => break e,
                Err(err) if tries < 5 => {
                    log::error!("reloading the model failed ({err}); trying again");
                    std::thread::sleep(std::time::Duration::from_secs(2));
                }
                Err(err) => {
                    log::error!("reloading the model failed ({err}); restart the server");
                    let why = format!(
                        "the GPU device was lost ({reason}) and reloading the model failed ({err}); restart the server"
                    );
                    self.shared.stats.lock().unwrap().recovering = Some(why.clone());
                    return self.give_up(why);
                }
            }
        };
        engine.model.gpu.arm_faults();
        // The host prompt cache's snapshots are host bytes: they stay usable.
        self.engine = engine;
        self.shared.stats.lock().unwrap().recovering = None;
        log::info!("model reloaded on a new device; serving again");
    }

    #[cfg(target_arch = "wasm32")]
    fn recover(&mut self, e: &EngineError) {
        log::error!("the GPU device was lost ({e}); reload the page");
        self.give_up(format!("the GPU device was lost ({e}); reload the page"));
    }

    /// Fails every running request and waiting slot action with `err`.
    fn fail_in_flight(&mut self, err: &RequestError) {
        for slot in &mut self.slots {
            if let Some(mut a) = slot.active.take() {
                (a.sink)(RequestEvent::Failed(err.clone()));
            }
            slot.last_key = None;
        }
        for (_, _, reply) in self.pending.drain(..) {
            let _ = reply.send(Err(err.clone()));
        }
    }

    /// A step's figures (if one ran) and the cache map, to whoever watches.
    fn tell_watchers(&mut self, secs: Option<f64>) {
        if self.watchers.is_empty() {
            return;
        }
        let (n_prompt, n_gen) = self.engine.last_batch;
        let map = self.engine.cache_map();
        self.watchers.retain_mut(|w| {
            let ok = match secs {
                Some(secs) if n_prompt + n_gen > 0 => w(ServiceUpdate::Step {
                    secs,
                    n_prompt,
                    n_gen,
                }),
                _ => true,
            };
            ok && w(ServiceUpdate::Cache(map.clone()))
        });
    }

    fn route(&mut self, ev: Event) {
        let slot = ev.session();
        let Some(a) = self.slots[slot as usize].active.as_mut() else {
            return;
        };
        match ev {
            Event::PromptProgress { done, total, .. } => {
                if !a.dropped && !(a.sink)(RequestEvent::Progress { done, total }) {
                    a.dropped = true;
                    let _ = self.engine.cancel(slot);
                }
            }
            Event::Token {
                token, text, probs, ..
            } => {
                a.n_generated += 1;
                let shown = a.stop.push(&text);
                if a.stop.found().is_some() {
                    let _ = self.engine.cancel(slot);
                }
                let ev = RequestEvent::Token {
                    token,
                    text: shown,
                    probs,
                };
                if !a.dropped && !(a.sink)(ev) {
                    a.dropped = true;
                    let _ = self.engine.cancel(slot);
                }
            }
            Event::ContextShifted {
                n_keep, n_discard, ..
            } => {
                a.shifted = true;
                if !a.dropped {
                    (a.sink)(RequestEvent::Shifted { n_keep, n_discard });
                }
            }
            Event::ContextExtended { n_past, .. } => {
                a.shifted = true;
                if !a.dropped {
                    (a.sink)(RequestEvent::Extended { n_past });
                }
            }
            Event::Finished {
                stop,
                tail,
                timings,
                ..
            } => {
                let mut a = self.slots[slot as usize].active.take().unwrap();
                self.count(&timings, a.n_cached, a.n_generated);
                // The slot is free and counted before the caller hears of the end.
                self.publish_gauges();
                if a.dropped {
                    return;
                }
                let mut tail = a.stop.push(&tail);
                let stop = match (stop, a.stop.found()) {
                    (_, Some(w)) => StopReason::Word(w.to_string()),
                    (Stop::EndOfGeneration, _) => StopReason::Eos,
                    (Stop::MaxTokens, _) => StopReason::Limit,
                    (Stop::ContextFull(r), _) => StopReason::ContextFull(r),
                    (Stop::Cancelled | Stop::Fed, _) => StopReason::Cancelled,
                };
                if a.stop.found().is_none() {
                    tail.push_str(&a.stop.finish());
                }
                let truncated = a.shifted
                    || matches!(stop, StopReason::ContextFull(_))
                    || (stop == StopReason::Limit && a.limit_is_context);
                (a.sink)(RequestEvent::Finished(Box::new(Finished {
                    stop,
                    tail,
                    timings,
                    slot,
                    n_prompt: a.n_prompt,
                    n_cached: a.n_cached,
                    n_generated: a.n_generated,
                    truncated,
                })));
            }
            Event::Error { error, .. } => {
                let mut a = self.slots[slot as usize].active.take().unwrap();
                self.publish_gauges();
                if !a.dropped {
                    (a.sink)(RequestEvent::Failed(RequestError::from_engine(&error)));
                }
            }
        }
    }

    fn count(&self, t: &Timings, n_cached: usize, n_generated: usize) {
        let mut st = self.shared.stats.lock().unwrap();
        st.prompt_tokens_total += t.prompt_tokens as u64;
        st.prompt_tokens_cached_total += n_cached as u64;
        st.prompt_seconds_total += t.prompt.as_secs_f64();
        st.tokens_predicted_total += n_generated as u64;
        st.tokens_predicted_seconds_total += t.eval.as_secs_f64();
    }

    fn publish_gauges(&self) {
        let used = self.engine.context().memory().used();
        let max = (0..self.slots.len() as u32)
            .filter_map(|i| self.engine.session(i).ok())
            .map(|s| s.history().len() as u64)
            .max()
            .unwrap_or(0);
        let mut st = self.shared.stats.lock().unwrap();
        st.requests_processing = self.slots.iter().filter(|s| s.active.is_some()).count() as u64;
        st.requests_deferred = self.queue.len() as u64;
        st.kv_cells_used = used as u64;
        st.n_tokens_max = st.n_tokens_max.max(max);
        st.gpu_buffer_bytes = self.engine.context().model.gpu.live_buffer_bytes();
        st.prompt_cache_bytes = self.cache.as_ref().map_or(0, |c| c.bytes() as u64);
    }
}

/// Opens sessions on `engine` up to `n_slots`, one per slot.
fn open_slots(engine: &mut Engine, n_slots: u32) -> Result<(), EngineError> {
    for _ in engine.sessions().count() as u32..n_slots {
        engine.open_session(SessionParams::default())?;
    }
    Ok(())
}
