//! Router mode (`wgllm serve` with no model, as llama-server's router): many models
//! behind one address, each picked by a request's `model` (the body's, or `?model=` on a
//! GET), loaded on first use and unloaded least recently used past `--models-max`.
//!
//! llama-server runs each model as a child process and proxies HTTP to it; here each
//! loaded model is its own server state in this process — its own engine service on its
//! own device, its own routes — and a request is handed to those routes directly, so
//! streams, cancellation on disconnect and every endpoint behave exactly as on a
//! single-model server. Unloading drops the model's engine with its device memory.
//!
//! Scheduling follows llama-server's: a model serving a request is never evicted;
//! requests for a model that is not loaded wait in one first-in first-out queue, where
//! requests for the same model share one entry (one load, one slot); idle models are
//! evicted, least recently used first, while the queue wants more slots than are free;
//! the entry at the head loads its model when a slot is free; a client that leaves the
//! queue gives its place (and any slot freed for it) to the next.

pub mod catalog;
mod downloads;

use super::error::ApiError;
use super::{http, AppState, LoadFn, ServerOptions};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Json;
use catalog::Entry;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower::ServiceExt;

/// How the router is set up.
#[derive(Clone, Debug)]
pub struct RouterOptions {
    /// The router's own server options (address, API keys, CORS, body limits); its
    /// model fields are unused.
    pub server: ServerOptions,
    pub sources: catalog::Sources,
    /// Most models loaded at once (`--models-max`; 0: no limit).
    pub models_max: usize,
    /// Device memory the loaded models may hold together (`--models-memory-mib`).
    pub memory_budget: Option<u64>,
    /// Load a model on its first request (`--models-autoload`, the default).
    pub autoload: bool,
    /// Where `POST /models` downloads from and to (none: downloads refused).
    pub hub: Option<crate::hub::HubOptions>,
}

/// What one model is served with.
pub struct ModelSetup {
    pub opts: ServerOptions,
    pub load: LoadFn,
    /// The flags it was made from, for the listing.
    pub args: Vec<String>,
    /// The device memory its loads may allocate (set by the router before each load
    /// under `--models-memory-mib`; read by `load`).
    pub memory_cap: Arc<Mutex<Option<u64>>>,
}

/// Turns a catalog entry into its server (the command line parses the entry's flags
/// over the router's own, as llama-server renders a child's arguments).
pub type Prepare = Arc<dyn Fn(&Entry) -> anyhow::Result<ModelSetup> + Send + Sync>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Unloaded,
    Loading,
    Loaded,
}

struct Model {
    entry: Entry,
    status: Status,
    state: Option<Arc<AppState>>,
    routes: Option<axum::Router>,
    last_used: u64,
    in_flight: usize,
    stopping: bool,
    /// Why its last load failed.
    failed: Option<String>,
    /// Load attempts so far: a waiter that saw a later attempt fail gets its error.
    loads: u64,
    args: Vec<String>,
    /// Device bytes it held when it last loaded.
    held: Option<u64>,
}

impl Model {
    fn new(entry: Entry) -> Model {
        Model {
            entry,
            status: Status::Unloaded,
            state: None,
            routes: None,
            last_used: 0,
            in_flight: 0,
            stopping: false,
            failed: None,
            loads: 0,
            args: Vec::new(),
            held: None,
        }
    }
    /// The device memory it takes under a budget: what it held when it last loaded; one
    /// never loaded may take the whole budget (its files' size leaves out the caches and
    /// work buffers), so everything idle makes way for its first load.
    fn need(&self, budget: u64) -> u64 {
        self.held.unwrap_or(budget)
    }
    /// The least it can take: what it held, or its files' size.
    fn least(&self) -> u64 {
        self.held.unwrap_or_else(|| self.entry.file_bytes())
    }
    /// Holding (or taking) one of `--models-max`'s places.
    fn running(&self) -> bool {
        self.status != Status::Unloaded
    }
    fn sleeping(&self) -> bool {
        (self.state.as_ref())
            .and_then(|s| s.service.get())
            .is_some_and(|s| s.is_sleeping())
    }
    fn status_text(&self) -> &'static str {
        match self.status {
            Status::Unloaded => "unloaded",
            Status::Loading => "loading",
            Status::Loaded if self.sleeping() => "sleeping",
            Status::Loaded => "loaded",
        }
    }
}

/// A queued model: how many requests wait for it, and whether one of them loads it.
struct Waiting {
    name: String,
    waiters: usize,
    loading: bool,
}

struct Sched {
    models: Vec<Model>,
    queue: VecDeque<Waiting>,
    clock: u64,
}

pub struct RouterState {
    opts: RouterOptions,
    prepare: Prepare,
    sched: Mutex<Sched>,
    changed: tokio::sync::Notify,
    /// llama-server's test hook (`LLAMA_SERVER_DEBUG_FAKE_TIMING`): 2 s more in every load
    /// and every forwarded request, so its tests can line requests up.
    fake_timing: bool,
    /// What `/models/sse` listeners hear.
    events: tokio::sync::broadcast::Sender<Value>,
    /// Models being downloaded (`POST /models`).
    downloading: Mutex<std::collections::HashSet<String>>,
    /// Which model each resumable stream (`X-Conversation-Id`) runs on, newest last.
    convs: Mutex<VecDeque<(String, String)>>,
}

/// Conversations remembered for routing `/v1/stream` (the oldest forgotten first).
const MAX_CONVS: usize = 1024;

impl Sched {
    fn find(&self, name: &str) -> Option<usize> {
        self.models.iter().position(|m| m.entry.name == name)
    }
    fn model(&mut self, name: &str) -> Option<&mut Model> {
        self.models.iter_mut().find(|m| m.entry.name == name)
    }
    fn resolve(&self, name: &str) -> Option<String> {
        (self.models.iter())
            .find(|m| m.entry.name == name)
            .or_else(|| {
                self.models
                    .iter()
                    .find(|m| m.entry.aliases.iter().any(|a| a == name))
            })
            .map(|m| m.entry.name.clone())
    }
    fn running(&self) -> usize {
        self.models.iter().filter(|m| m.running()).count()
    }
    fn has_room(&self, max: usize) -> bool {
        max == 0 || self.running() < max
    }
    /// Device memory held (or being taken) by the models running, but `except`.
    fn memory_used(&self, except: &str, budget: u64) -> u64 {
        (self.models.iter())
            .filter(|m| m.running() && m.entry.name != except)
            .fold(0, |a, m| a.saturating_add(m.need(budget)))
    }
    /// A place for `name`: one of `--models-max`'s, and room in the memory budget.
    fn has_room_for(&self, name: &str, max: usize, budget: Option<u64>) -> bool {
        self.has_room(max)
            && budget.is_none_or(|b| {
                let need = self.find(name).map_or(0, |i| self.models[i].need(b));
                self.memory_used(name, b).saturating_add(need) <= b
            })
    }
    fn queued(&mut self, name: &str) -> Option<&mut Waiting> {
        self.queue.iter_mut().find(|w| w.name == name)
    }
    /// The idle model used least long ago that nothing waits for, if any.
    fn victim(&self) -> Option<String> {
        (self.models.iter())
            .filter(|m| {
                m.in_flight == 0
                    && m.status == Status::Loaded
                    && !m.stopping
                    && !self.queue.iter().any(|w| w.name == m.entry.name)
            })
            .min_by_key(|m| m.last_used)
            .map(|m| m.entry.name.clone())
    }
    fn join(&mut self, name: &str) {
        match self.queued(name) {
            Some(w) => w.waiters += 1,
            None => self.queue.push_back(Waiting {
                name: name.to_string(),
                waiters: 1,
                loading: false,
            }),
        }
    }
    fn leave(&mut self, name: &str) {
        if let Some(i) = self.queue.iter().position(|w| w.name == name) {
            self.queue[i].waiters -= 1;
            if self.queue[i].waiters == 0 {
                self.queue.remove(i);
            }
        }
    }
}

impl RouterState {
    fn touch(&self, s: &mut Sched, name: &str) {
        s.clock += 1;
        let t = s.clock;
        if let Some(m) = s.model(name) {
            m.last_used = t;
        }
    }

    /// Evicts idle models while the queue wants more places than are free or being
    /// freed (never waits).
    fn tick(self: &Arc<Self>, s: &mut Sched) {
        self.tick_memory(s);
        let max = self.opts.models_max;
        if max == 0 || s.queue.is_empty() {
            return;
        }
        let running = s.running();
        let stopping = s
            .models
            .iter()
            .filter(|m| m.running() && m.stopping)
            .count();
        let mut needed = 0;
        for w in &s.queue {
            if !w.loading {
                needed += 1;
            }
        }
        let mut free = (max + stopping).saturating_sub(running) as i64;
        while free < needed {
            let Some(v) = s.victim() else { return };
            log::info!(
                "router: unloading {v}, the least recently used idle model, for a queued request"
            );
            self.stop(s, &v);
            free += 1;
        }
    }

    /// With a memory budget: evicts idle models, least recently used first, while the
    /// model at the head of the queue does not fit beside those that keep running.
    fn tick_memory(self: &Arc<Self>, s: &mut Sched) {
        let Some(budget) = self.opts.memory_budget else {
            return;
        };
        let Some(head) = (s.queue.iter())
            .find(|w| !w.loading)
            .map(|w| w.name.clone())
        else {
            return;
        };
        let need = s.find(&head).map_or(0, |i| s.models[i].need(budget));
        // Models already unloading are counted free.
        let kept = |s: &Sched| -> u64 {
            (s.models.iter())
                .filter(|m| m.running() && !m.stopping && m.entry.name != head)
                .fold(0u64, |a, m| a.saturating_add(m.need(budget)))
        };
        while kept(s).saturating_add(need) > budget {
            let Some(v) = s.victim() else { return };
            log::info!(
                "router: unloading {v}, the least recently used idle model, to fit {head} ({} MiB) in --models-memory-mib {}",
                need >> 20,
                budget >> 20
            );
            self.stop(s, &v);
        }
    }

    /// The refusal for a model larger than the whole budget, if it is.
    fn too_big(&self, s: &Sched, name: &str) -> Option<ApiError> {
        let budget = self.opts.memory_budget?;
        let m = &s.models[s.find(name)?];
        let need = m.least();
        (need > budget).then(|| {
            let what = if m.held.is_some() {
                "held when it last loaded"
            } else {
                "its files' size, before the caches"
            };
            ApiError::server(format!(
                "model {name} needs {} MiB of device memory ({what}), more than the router's --models-memory-mib {}: raise the budget, or serve it with a smaller context or cache type",
                need.div_ceil(1 << 20),
                budget >> 20
            ))
        })
    }

    /// Starts unloading `name`: new requests wait for its next load; the requests in
    /// flight have its `stop-timeout` to finish.
    fn stop(self: &Arc<Self>, s: &mut Sched, name: &str) {
        let Some(m) = s.model(name) else { return };
        if m.stopping || m.status == Status::Unloaded {
            return;
        }
        m.stopping = true;
        // A model still loading is shut down when its load ends (see `spawn_load`).
        if m.status == Status::Loading {
            return;
        }
        let timeout = Duration::from_secs(m.entry.stop_timeout_s);
        let state = m.state.clone();
        let me = self.clone();
        let name = name.to_string();
        tokio::spawn(async move {
            let t0 = std::time::Instant::now();
            while t0.elapsed() < timeout {
                let busy = me
                    .sched
                    .lock()
                    .unwrap()
                    .model(&name)
                    .is_some_and(|m| m.in_flight > 0);
                if !busy {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if let Some(service) = state.as_ref().and_then(|s| s.service.get()) {
                service.shutdown().await;
            }
            drop(state);
            let mut s = me.sched.lock().unwrap();
            if let Some(m) = s.model(&name) {
                m.status = Status::Unloaded;
                m.state = None;
                m.routes = None;
                m.stopping = false;
            }
            if let Some(w) = s.queued(&name) {
                w.loading = false;
            }
            crate::engine::service::release_freed_heap();
            log::info!("router: {name} unloaded");
            me.notify("status_change", &name, json!({"status": "unloaded"}));
            me.tick(&mut s);
            drop(s);
            me.changed.notify_waiters();
        });
    }

    /// Loads `name` in the background (its place is already counted: status Loading).
    fn spawn_load(self: &Arc<Self>, s: &mut Sched, name: &str) {
        let Some(m) = s.model(name) else { return };
        m.status = Status::Loading;
        m.failed = None;
        m.loads += 1;
        let entry = m.entry.clone();
        // What the load may allocate: the budget less what the others hold, so a model
        // larger than its first estimate fails its load whole, never half-loaded.
        let cap = (self.opts.memory_budget).map(|b| b.saturating_sub(s.memory_used(name, b)));
        self.touch(s, name);
        self.notify("model_status", name, json!({"status": "loading"}));
        let me = self.clone();
        let name = name.to_string();
        tokio::spawn(async move {
            let t0 = std::time::Instant::now();
            let prepare = me.prepare.clone();
            let loaded = tokio::task::spawn_blocking(move || {
                let mut setup = prepare(&entry)?;
                *setup.memory_cap.lock().unwrap() = cap;
                // The router checks API keys; a model's own routes take every request.
                setup.opts.api_keys.clear();
                let args = setup.args.clone();
                Ok::<_, anyhow::Error>((super::loaded_state(setup.opts, setup.load)?, args))
            })
            .await
            .map_err(|e| anyhow::anyhow!("the loading thread failed: {e}"))
            .and_then(|r| r);
            let discard = {
                let mut s = me.sched.lock().unwrap();
                // The queue entry that asked for this load keeps its claim while its
                // waiters take the model (so it is no victim meanwhile); after a failure, or
                // once the model is unloaded again, it may claim anew.
                let ok = loaded.is_ok() && s.model(&name).is_some_and(|m| !m.stopping);
                if let Some(w) = s.queued(&name).filter(|_| !ok) {
                    w.loading = false;
                }
                // A load that ended for nobody (the model was stopped or removed while it
                // loaded) is shut down again.
                let mut discard = None;
                match s.model(&name) {
                    Some(m) if m.stopping => {
                        m.status = Status::Unloaded;
                        m.stopping = false;
                        discard = loaded.ok().map(|(state, _)| state);
                        log::info!("router: {name} was unloaded while it loaded");
                        me.notify("status_change", &name, json!({"status": "unloaded"}));
                    }
                    Some(m) => match loaded {
                        Ok((state, args)) => {
                            log::info!(
                                "router: {name} loaded in {:.2} s",
                                t0.elapsed().as_secs_f64()
                            );
                            m.routes = Some(http::router(state.clone()));
                            m.held = (state.service.get()).map(|sv| sv.info().device_bytes);
                            m.state = Some(state);
                            m.args = args;
                            m.status = Status::Loaded;
                            me.notify("status_change", &name, json!({"status": "loaded"}));
                        }
                        Err(e) => {
                            log::error!("router: loading {name} failed: {e:#}");
                            m.failed = Some(format!("{e:#}"));
                            m.status = Status::Unloaded;
                            me.notify(
                                "status_change",
                                &name,
                                json!({"status": "unloaded", "exit_code": 1}),
                            );
                        }
                    },
                    None => discard = loaded.ok().map(|(state, _)| state),
                }
                me.tick(&mut s);
                discard
            };
            me.changed.notify_waiters();
            if let Some(service) = discard.as_ref().and_then(|st| st.service.get()) {
                service.shutdown().await;
                drop(discard);
                crate::engine::service::release_freed_heap();
            }
        });
    }

    /// The model's routes for one request, counted busy (so never evicted) until the
    /// returned guard is dropped with the reply's body.
    fn begin(
        self: &Arc<Self>,
        s: &mut Sched,
        name: &str,
        post: bool,
    ) -> Result<(axum::Router, Busy), ApiError> {
        if post {
            self.touch(s, name);
        }
        let m = s
            .model(name)
            .ok_or_else(|| ApiError::invalid(format!("model '{name}' not found")))?;
        if m.status == Status::Loading {
            return Err(ApiError::unavailable("Loading model"));
        }
        let Some(routes) = m.routes.clone().filter(|_| !m.stopping) else {
            return Err(ApiError::invalid(format!(
                "model name={name} is not running"
            )));
        };
        m.in_flight += 1;
        Ok((
            routes,
            Busy {
                r: self.clone(),
                name: name.to_string(),
            },
        ))
    }

    /// Waits until `name` is loaded, queueing (and loading it, at the head of the queue)
    /// if it is not, then begins the request on it (its place in the queue handed over
    /// to the request under one lock, so the model cannot be evicted in between). A
    /// waiter that is dropped (its client left) leaves the queue.
    async fn ready(
        self: &Arc<Self>,
        name: &str,
        post: bool,
    ) -> Result<(axum::Router, Busy), ApiError> {
        struct InQueue<'a> {
            r: &'a Arc<RouterState>,
            name: &'a str,
            queued: bool,
        }
        impl Drop for InQueue<'_> {
            fn drop(&mut self) {
                if self.queued {
                    let mut s = self.r.sched.lock().unwrap();
                    s.leave(self.name);
                    self.r.tick(&mut s);
                    drop(s);
                    self.r.changed.notify_waiters();
                }
            }
        }
        let mut q = InQueue {
            r: self,
            name,
            queued: false,
        };
        let loads_before = self
            .sched
            .lock()
            .unwrap()
            .model(name)
            .map_or(0, |m| m.loads);
        loop {
            let wait = self.changed.notified();
            // What to do, decided under the lock; the waiting happens outside it.
            let claimed = {
                let mut s = self.sched.lock().unwrap();
                let Some(m) = s.model(name) else {
                    return Err(ApiError::invalid(format!("model '{name}' not found")));
                };
                let (status, stopping, failed) = (m.status, m.stopping, m.failed.clone());
                let tried = m.loads > loads_before;
                if status == Status::Loaded && !stopping {
                    let begun = self.begin(&mut s, name, post);
                    if q.queued {
                        s.leave(name);
                        q.queued = false;
                    }
                    return begun;
                }
                if status == Status::Unloaded && !stopping && tried {
                    if let Some(e) = failed {
                        return Err(ApiError::server(format!(
                            "model name={name} failed to load: {e}"
                        )));
                    }
                }
                if !q.queued && (status == Status::Unloaded || stopping) {
                    s.join(name);
                    q.queued = true;
                    self.tick(&mut s);
                }
                if let Some(e) = self.too_big(&s, name) {
                    return Err(e);
                }
                let head = (s.queue.front()).is_some_and(|w| w.name == name && !w.loading);
                let claim = status == Status::Unloaded
                    && head
                    && s.has_room_for(name, self.opts.models_max, self.opts.memory_budget);
                if claim {
                    s.queue.front_mut().unwrap().loading = true;
                }
                claim
            };
            if !claimed {
                let _ = tokio::time::timeout(Duration::from_millis(200), wait).await;
                continue;
            }
            // Our turn: load, unless the place went to another meanwhile.
            if self.fake_timing {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            let mut s = self.sched.lock().unwrap();
            let unloaded = s.model(name).is_some_and(|m| m.status == Status::Unloaded);
            if s.has_room_for(name, self.opts.models_max, self.opts.memory_budget) && unloaded {
                log::info!("router: loading {name} for a queued request");
                self.spawn_load(&mut s, name);
            } else if let Some(w) = s.queued(name) {
                w.loading = false;
            }
        }
    }

    /// `POST /models/load`: starts loading (evicting the least recently used idle model
    /// at the limit) and answers at once.
    async fn load_now(self: &Arc<Self>, name: &str) -> Result<(), ApiError> {
        if self.fake_timing {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        // At the limit (of places or memory): idle models go first, least recently used
        // first, and their unloads are waited for.
        let victims = {
            let mut s = self.sched.lock().unwrap();
            if let Some(e) = self.too_big(&s, name) {
                return Err(e);
            }
            let mut victims = Vec::new();
            let budget = self.opts.memory_budget.unwrap_or(u64::MAX);
            let need = s.find(name).map_or(0, |i| s.models[i].need(budget));
            loop {
                let kept = (s.models.iter())
                    .filter(|m| m.running() && !m.stopping && m.entry.name != name);
                let (n, bytes) = kept.fold((0, 0u64), |(n, b), m| {
                    (n + 1, b.saturating_add(m.need(budget)))
                });
                let max = self.opts.models_max;
                let fits = (max == 0 || n < max)
                    && (self.opts.memory_budget).is_none_or(|b| bytes.saturating_add(need) <= b);
                if fits {
                    break;
                }
                let Some(v) = s.victim() else { break };
                log::info!("router: unloading {v}, the least recently used, to load {name}");
                self.stop(&mut s, &v);
                victims.push(v);
            }
            victims
        };
        for v in victims {
            loop {
                let wait = self.changed.notified();
                if self
                    .sched
                    .lock()
                    .unwrap()
                    .model(&v)
                    .is_none_or(|m| m.status == Status::Unloaded)
                {
                    break;
                }
                let _ = tokio::time::timeout(Duration::from_millis(200), wait).await;
            }
        }
        let mut s = self.sched.lock().unwrap();
        if s.model(name).is_some_and(|m| m.running()) {
            return Err(ApiError::invalid("model is already running"));
        }
        if !s.has_room_for(name, self.opts.models_max, self.opts.memory_budget) {
            return Err(ApiError::server("model limit reached, try again later"));
        }
        self.spawn_load(&mut s, name);
        drop(s);
        self.changed.notify_waiters();
        Ok(())
    }

    fn listing(&self) -> Value {
        let s = self.sched.lock().unwrap();
        let now = super::wire::now();
        let data: Vec<Value> = (s.models.iter())
            .filter(|m| !m.entry.hidden)
            .map(|m| {
                let mut status = json!({"value": m.status_text(), "args": m.args});
                if let Some(p) = &m.entry.preset {
                    status["preset"] = json!(p);
                }
                if let Some(e) = &m.failed {
                    status["failed"] = json!(true);
                    status["exit_code"] = json!(1);
                    status["error"] = json!(e);
                }
                let mut item = json!({
                    "id": m.entry.name,
                    "aliases": m.entry.aliases,
                    "tags": m.entry.tags,
                    "object": "model",
                    "owned_by": "llamacpp",
                    "created": now,
                    "status": status,
                    "source": m.entry.source.as_str(),
                    "can_remove": false,
                });
                if let Some(info) = m
                    .state
                    .as_ref()
                    .and_then(|st| st.service.get())
                    .map(|sv| sv.info().clone())
                {
                    item["meta"] = json!({
                        "n_vocab": info.n_vocab,
                        "n_ctx_train": info.n_ctx_train,
                        "n_embd": info.n_embd,
                        "n_ctx": info.n_ctx_slot,
                        "size": info.model_bytes,
                        // wgllm's own: what --models-memory-mib counts for it.
                        "device_bytes": info.device_bytes,
                    });
                }
                item
            })
            .collect();
        json!({"object": "list", "data": data})
    }

    /// Reads the sources again: models whose flags changed or that are gone are
    /// unloaded, gone ones forgotten, new ones added.
    fn reload(self: &Arc<Self>) -> Result<(), ApiError> {
        let fresh = catalog::load(&self.opts.sources).map_err(ApiError::server)?;
        let mut s = self.sched.lock().unwrap();
        let old: Vec<String> = s.models.iter().map(|m| m.entry.name.clone()).collect();
        for name in &old {
            let keep = fresh.iter().find(|e| &e.name == name);
            let same = keep.is_some_and(|e| s.model(name).is_some_and(|m| m.entry == *e));
            if !same {
                self.stop(&mut s, name);
            }
            if keep.is_none() && s.model(name).is_some_and(|m| m.status == Status::Unloaded) {
                let i = s.find(name).unwrap();
                s.models.remove(i);
            }
        }
        for e in fresh {
            match s.model(&e.name) {
                Some(m) => m.entry = e,
                None => s.models.push(Model::new(e)),
            }
        }
        log::info!(
            "router: the model list was read again ({} models)",
            s.models.len()
        );
        drop(s);
        self.notify("models_reload", "*", Value::Null);
        Ok(())
    }
}

fn model_field(body: &Value) -> Result<String, ApiError> {
    match body.get("model") {
        Some(Value::String(m)) if !m.is_empty() => Ok(m.clone()),
        _ => Err(ApiError::invalid("model name is missing from the request")),
    }
}

fn query_param(req_query: Option<&str>, key: &str) -> Option<String> {
    let q = req_query?;
    url_pairs(q)
        .into_iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
}

/// A query string's pairs, percent-decoded (`+` as a space).
fn url_pairs(q: &str) -> Vec<(String, String)> {
    let decode = |s: &str| {
        let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
        let b = s.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            match b[i] {
                b'%' => {
                    match (
                        b.get(i + 1).and_then(|&c| hex(c)),
                        b.get(i + 2).and_then(|&c| hex(c)),
                    ) {
                        (Some(h), Some(l)) => {
                            out.push(h << 4 | l);
                            i += 3;
                            continue;
                        }
                        _ => out.push(b'%'),
                    }
                }
                b'+' => out.push(b' '),
                c => out.push(c),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(p), String::new()),
        })
        .collect()
}

/// A request's body, and its JSON read as every endpoint reads it (`wire::body_json`:
/// within the request budget, off the async runtime's threads).
async fn body_json(body: Body) -> Result<(axum::body::Bytes, Value), ApiError> {
    let bytes = axum::body::to_bytes(body, usize::MAX)
        .await
        .map_err(|e| ApiError::invalid(format!("reading the request body: {e}")))?;
    let v = super::off_runtime(|| super::wire::body_json(&bytes)).await?;
    Ok((bytes, v))
}

/// A request for a model's routes: the model from the body (`model`) or the query
/// (`?model=`), loaded first where autoload allows.
async fn dispatch(State(r): State<Arc<RouterState>>, req: Request) -> Response {
    match forward(&r, req).await {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    }
}

async fn forward(r: &Arc<RouterState>, req: Request) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    if !http::route_paths().contains(&path.as_str()) && !path.starts_with("/slots/") {
        return Err(ApiError::not_found(format!("File Not Found: {path}")));
    }
    let query = parts.uri.query().map(str::to_string);
    let (bytes, body) = body_json(body).await?;
    let post = parts.method == Method::POST;
    // A resumable stream's routes go to the model its conversation runs on.
    let conv_of = |id: &str| {
        (r.convs.lock().unwrap().iter().rev())
            .find(|(c, _)| c == id)
            .map(|(_, m)| m.clone())
    };
    let stream_route = path == "/v1/stream" || path == "/v1/streams/lookup";
    let asked = if stream_route {
        let id = if path == "/v1/stream" {
            query_param(query.as_deref(), "conv_id").unwrap_or_default()
        } else {
            (body.get("conversation_ids").and_then(Value::as_array))
                .and_then(|ids| {
                    (ids.iter().filter_map(Value::as_str)).find(|i| conv_of(i).is_some())
                })
                .unwrap_or_default()
                .to_string()
        };
        conv_of(&id).ok_or_else(|| {
            ApiError::not_found(format!("no stream is kept for conversation {id:?}"))
        })?
    } else if post {
        model_field(&body)?
    } else {
        query_param(query.as_deref(), "model")
            .filter(|m| !m.is_empty())
            .ok_or_else(|| ApiError::invalid("model name is missing from the request"))?
    };
    let autoload = match query_param(query.as_deref(), "autoload") {
        Some(v) => v == "true" || v == "1",
        None => r.opts.autoload,
    } && !stream_route;
    let name = {
        let s = r.sched.lock().unwrap();
        let name = s
            .resolve(&asked)
            .ok_or_else(|| ApiError::invalid(format!("model '{asked}' not found")))?;
        drop(s);
        name
    };
    // The model's routes, counted busy until its reply's body is gone.
    let (routes, busy) = if autoload {
        r.ready(&name, post).await?
    } else {
        let mut s = r.sched.lock().unwrap();
        if !s.model(&name).is_some_and(|m| m.running()) {
            if stream_route {
                return Err(ApiError::not_found(format!(
                    "model {name}, which kept the stream, is not loaded"
                )));
            }
            return Err(ApiError::invalid("model is not loaded"));
        }
        r.begin(&mut s, &name, post)?
    };
    if post && !stream_route {
        if let Some(id) = super::resumable::conversation_id(&parts.headers) {
            let mut c = r.convs.lock().unwrap();
            c.retain(|(k, _)| *k != id);
            c.push_back((id, name.clone()));
            if c.len() > MAX_CONVS {
                c.pop_front();
            }
        }
    }
    if r.fake_timing {
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let mut req = Request::from_parts(parts, Body::from(bytes));
    // The body was read (and its room counted) by the router's own layer.
    req.headers_mut().remove(axum::http::header::CONTENT_LENGTH);
    let resp = match routes.oneshot(req).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    let (parts, body) = resp.into_parts();
    use tokio_stream::StreamExt;
    let stream = body.into_data_stream().map(move |chunk| {
        let _ = &busy;
        chunk
    });
    Ok(Response::from_parts(parts, Body::from_stream(stream)))
}

/// A request in flight on a model: dropped with its reply's body.
struct Busy {
    r: Arc<RouterState>,
    name: String,
}

impl Drop for Busy {
    fn drop(&mut self) {
        let mut s = self.r.sched.lock().unwrap();
        if let Some(m) = s.model(&self.name) {
            m.in_flight = m.in_flight.saturating_sub(1);
            if m.in_flight == 0 {
                self.r.tick(&mut s);
            }
        }
        drop(s);
        self.r.changed.notify_waiters();
    }
}

async fn props(State(r): State<Arc<RouterState>>, req: Request) -> Response {
    if query_param(req.uri().query(), "model").is_some_and(|m| !m.is_empty()) {
        return dispatch(State(r), req).await;
    }
    Json(json!({
        "role": "router",
        "max_instances": r.opts.models_max,
        "models_autoload": r.opts.autoload,
        "model_alias": "llama-server",
        "model_path": "none",
        "default_generation_settings": {"params": {}, "n_ctx": 0},
        "build_info": super::native::build_info(),
        "cors_proxy_enabled": r.opts.server.cors_proxy,
    }))
    .into_response()
}

async fn models(State(r): State<Arc<RouterState>>, req: Request) -> Response {
    if query_param(req.uri().query(), "reload").is_some_and(|v| v == "1" || v == "true") {
        if let Err(e) = r.reload() {
            return e.into_response();
        }
    }
    Json(r.listing()).into_response()
}

async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn load(State(r): State<Arc<RouterState>>, body: Body) -> Response {
    let res = async {
        let (_, body) = body_json(body).await?;
        let asked = body.get("model").and_then(Value::as_str).unwrap_or("");
        let name = r.sched.lock().unwrap().resolve(asked);
        let Some(name) = name else {
            return Err(ApiError::not_found("model is not found"));
        };
        r.load_now(&name).await
    }
    .await;
    match res {
        Ok(()) => Json(json!({"success": true})).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn unload(State(r): State<Arc<RouterState>>, body: Body) -> Response {
    let res = async {
        let (_, body) = body_json(body).await?;
        let asked = body.get("model").and_then(Value::as_str).unwrap_or("");
        let mut s = r.sched.lock().unwrap();
        let Some(name) = s.resolve(asked) else {
            return Err(ApiError::invalid("model is not found"));
        };
        if !s.model(&name).is_some_and(|m| m.running() && !m.stopping) {
            return Err(ApiError::invalid("model is not running"));
        }
        log::info!("router: unloading {name} as asked");
        r.stop(&mut s, &name);
        Ok(())
    }
    .await;
    match res {
        Ok(()) => Json(json!({"success": true})).into_response(),
        Err(e) => e.into_response(),
    }
}

/// Runs the router until SIGINT or SIGTERM (see [`super::serve`]).
pub fn serve(
    opts: RouterOptions,
    prepare: Prepare,
    ready: impl FnOnce(&[std::net::SocketAddr]) + Send + 'static,
) -> anyhow::Result<()> {
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if opts.server.threads_http > 0 {
        rt.worker_threads(opts.server.threads_http);
    }
    let rt = rt.enable_all().build()?;
    let r = rt.block_on(run(opts, prepare, ready));
    rt.shutdown_timeout(Duration::from_millis(500));
    r
}

async fn run(
    opts: RouterOptions,
    prepare: Prepare,
    ready: impl FnOnce(&[std::net::SocketAddr]) + Send + 'static,
) -> anyhow::Result<()> {
    let list = catalog::load(&opts.sources).map_err(|e| anyhow::anyhow!("{e}"))?;
    let startup: Vec<String> = (list.iter())
        .filter(|e| e.load_on_startup)
        .map(|e| e.name.clone())
        .collect();
    if opts.models_max > 0 && startup.len() > opts.models_max {
        anyhow::bail!(
            "{} models are marked load-on-startup ({}), more than --models-max {}: raise --models-max or mark fewer",
            startup.len(),
            startup.join(", "),
            opts.models_max
        );
    }
    log::info!(
        "router: {} models ({}); at most {} loaded at once",
        list.len(),
        list.iter()
            .map(|e| e.name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        if opts.models_max == 0 {
            "any number".to_string()
        } else {
            opts.models_max.to_string()
        }
    );
    super::budget::set_limit(opts.server.request_budget);
    let grace = Duration::from_secs(opts.server.shutdown_grace_s);
    let mut signals = super::shutdown::Signals::listen(grace)
        .map_err(|e| anyhow::anyhow!("cannot listen for SIGINT/SIGTERM: {e}"))?;
    let front = AppState::new(opts.server.clone());
    let state = Arc::new(RouterState {
        fake_timing: std::env::var_os("LLAMA_SERVER_DEBUG_FAKE_TIMING")
            .is_some_and(|v| !v.is_empty()),
        prepare,
        sched: Mutex::new(Sched {
            models: list.into_iter().map(Model::new).collect(),
            queue: VecDeque::new(),
            clock: 0,
        }),
        changed: tokio::sync::Notify::new(),
        events: tokio::sync::broadcast::channel(256).0,
        downloading: Default::default(),
        convs: Default::default(),
        opts,
    });
    let routes = axum::Router::new()
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .route("/props", get(props))
        .route(
            "/models",
            get(models)
                .post(downloads::download)
                .delete(downloads::remove),
        )
        .route("/models/sse", get(downloads::events))
        // The web UI's MCP proxy belongs to the router itself (no model involved).
        .route(
            "/cors-proxy",
            get(super::cors_proxy::proxy)
                .post(super::cors_proxy::proxy)
                .with_state(front.clone()),
        )
        // So do the tools (built-in and MCP), as in llama-server.
        .route(
            "/tools",
            get(super::agent::list)
                .post(super::agent::call)
                .with_state(front.clone()),
        )
        .route("/v1/models", get(models))
        .route("/models/load", post(load))
        .route("/models/unload", post(unload))
        .fallback(dispatch)
        .with_state(state.clone());
    front.start_tools().await;
    let app = http::front_layers(routes, front.clone());
    let net = super::Listening::bind(&state.opts.server, app, "router").await?;
    {
        let mut s = state.sched.lock().unwrap();
        for name in startup {
            state.spawn_load(&mut s, &name);
        }
    }
    ready(&net.addrs);
    signals.first().await;
    front
        .stopping
        .store(true, std::sync::atomic::Ordering::Relaxed);
    front.stop_tools().await;
    let end = async {
        let services: Vec<_> = (state.sched.lock().unwrap().models.iter())
            .filter_map(|m| m.state.as_ref().and_then(|s| s.service.get()).cloned())
            .collect();
        for s in services {
            s.shutdown().await;
        }
    };
    net.close(grace, end).await
}

#[cfg(test)]
mod tests {
    use super::url_pairs;

    #[test]
    fn query_strings_decode_without_panicking() {
        assert_eq!(
            url_pairs("model=org%2Fname%3AQ8_0&autoload=1&x"),
            [
                ("model".to_string(), "org/name:Q8_0".to_string()),
                ("autoload".into(), "1".into()),
                ("x".into(), String::new())
            ]
        );
        assert_eq!(url_pairs("a=%Aé")[0].1, "%Aé");
        assert_eq!(url_pairs("a=%+1&b=c+d")[0].1, "% 1");
        assert_eq!(url_pairs("a=%")[0].1, "%");
        assert_eq!(url_pairs("b=c+d")[0].1, "c d");
    }
}
