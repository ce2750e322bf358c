//! The service's thread: the loop that takes commands, starts queued requests on slots,
//! steps the engine and routes each event to its request; its recovery from a lost
//! device; and its sleep when idle (`sleep.rs`).

#[cfg(not(target_arch = "wasm32"))]
mod sleep;
mod slots;

use super::{
    Cmd, Finished, Queued, RequestError, RequestEvent, RequestKey, ServiceOptions, ServiceUpdate,
    Shared, Sink, SlotAction, SlotFileResult, SlotInfo, StopReason, WatchSink,
};
use crate::engine::{
    Engine, EngineError, Event, HostCache, IndentLimit, SessionParams, Stop, StopStrings, Timings,
};
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::sync::{mpsc as amp, oneshot};
use web_time::Instant;

/// A request running on a slot.
struct Active {
    key: RequestKey,
    sink: Sink,
    stop: StopStrings,
    indent: IndentLimit,
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

pub(super) struct Worker {
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
    /// Told to shut down: answered once the engine is dropped.
    stop: Option<oneshot::Sender<()>>,
    /// The idle timer's `Sleep` was taken: the loop hands over to the sleep.
    sleep_now: bool,
}

/// Why [`Worker::serve`] returned.
enum Ended {
    /// Told to stop: answer once the engine is dropped.
    Stop(oneshot::Sender<()>),
    /// Every handle is gone.
    Gone,
    /// Idle long enough: drop the engine until a command needs it.
    Sleep,
}

type SlotReply = oneshot::Sender<Result<SlotFileResult, RequestError>>;

/// Inputs embedded between checks that their caller still waits.
const EMBED_GROUP: usize = 16;

impl Worker {
    pub(super) fn new(engine: Engine, shared: Arc<Shared>) -> Self {
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
            stop: None,
            sleep_now: false,
        }
    }

    /// Takes the service's options: a host prompt cache where they ask for one.
    #[cfg(not(target_arch = "wasm32"))]
    pub(super) fn configure(&mut self, opts: ServiceOptions) {
        if let Some(limit) = opts.cache_ram {
            match limit {
                Some(b) => log::info!("prompt cache: up to {} MiB of host memory", b >> 20),
                None => log::info!("prompt cache: host memory without a limit"),
            }
            self.cache = Some(HostCache::new(limit));
            if opts.cache_idle_slots {
                log::debug!(
                    "idle slots are saved to the prompt cache when a request starts{} (__TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__)",
                    if opts.kv_unified { " and then cleared" } else { "" }
                );
            }
        }
        self.opts = opts;
    }

    pub(super) async fn run(mut self, mut rx: amp::UnboundedReceiver<Cmd>) {
        loop {
            match self.serve(&mut rx).await {
                Ended::Stop(done) => {
                    drop(self);
                    super::release_freed_heap();
                    log::info!("the engine has stopped and freed its device");
                    let _ = done.send(());
                    return;
                }
                Ended::Gone => return,
                #[cfg(not(target_arch = "wasm32"))]
                Ended::Sleep => match self.sleep(&mut rx).await {
                    Some(awake) => self = awake,
                    None => return,
                },
                #[cfg(target_arch = "wasm32")]
                Ended::Sleep => {}
            }
        }
    }

    /// Serves commands until told to stop, every handle is gone, or it is time to sleep.
    async fn serve(&mut self, rx: &mut amp::UnboundedReceiver<Cmd>) -> Ended {
        loop {
            // Told to stop wins over sleeping; and a sleep asked for before work came in
            // the same batch of commands waits for the next idle spell.
            if self.sleep_now && self.stop.is_none() {
                self.sleep_now = false;
                if self.may_sleep() {
                    return Ended::Sleep;
                }
            }
            if let Some(done) = self.stop.take() {
                let err = RequestError::Unavailable("the server is shutting down".into());
                self.fail_in_flight(&err);
                for mut q in self.queue.drain(..) {
                    (q.sink)(RequestEvent::Failed(err.clone()));
                }
                // Commands sent before this one and not yet taken get the same answer;
                // later ones find the channel closed.
                rx.close();
                while let Ok(c) = rx.try_recv() {
                    Self::refuse(c, &err);
                }
                return Ended::Stop(done);
            }
            if let Some(err) = self.dead.clone() {
                match rx.recv().await {
                    Some(Cmd::Shutdown(done)) => self.stop = Some(done),
                    Some(c) => Self::refuse(c, &err),
                    None => return Ended::Gone,
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
                    None => return Ended::Gone,
                }
            }
            while let Ok(c) = rx.try_recv() {
                self.handle(c);
                // Told to stop: what came after is refused there, nothing more runs.
                if self.stop.is_some() {
                    break;
                }
            }
            if self.stop.is_some() {
                continue;
            }
            self.run_slot_actions();
            self.assign();
            if self.engine.is_busy() {
                self.step().await;
                self.touch();
                self.run_slot_actions();
                // Between steps a page gets a turn to draw what came back.
                #[cfg(target_arch = "wasm32")]
                crate::engine::pause::pause_ms(0).await;
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
            Cmd::Embed { reply, .. } => {
                let _ = reply.send(Err(err.clone()));
            }
            Cmd::Lora { reply, .. } => {
                let _ = reply.send(Err(err.clone()));
            }
            Cmd::Wake(reply) => {
                let _ = reply.send(Err(err.clone()));
            }
            Cmd::Watch(_) | Cmd::Cancel(_) | Cmd::Sleep => {}
            // Already stopping (or dead): the engine goes when the loop sees it.
            Cmd::Shutdown(done) => {
                let _ = done.send(());
            }
        }
    }

    /// Nothing runs, waits or was asked for within the idle limit.
    fn may_sleep(&self) -> bool {
        let idle = !self.engine.is_busy() && self.queue.is_empty() && self.pending.is_empty();
        let quiet = self.shared.last_active.lock().unwrap().elapsed();
        idle && self.opts.sleep_idle.is_some_and(|limit| quiet >= limit)
    }

    /// Restarts the idle timer: the service was used now.
    fn touch(&self) {
        *self.shared.last_active.lock().unwrap() = Instant::now();
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
        if !matches!(c, Cmd::Sleep) {
            self.touch();
        }
        match c {
            Cmd::Sleep => {
                if self.may_sleep() {
                    self.sleep_now = true;
                }
            }

            Cmd::Wake(reply) => {
                let _ = reply.send(Ok(()));
            }
            Cmd::Submit(mut q) if self.shared.info.embeddings => {
                (q.sink)(RequestEvent::Failed(RequestError::Invalid(
                    "This server does not support completions. Start it without `--embeddings`"
                        .into(),
                )));
            }
            Cmd::Embed {
                inputs,
                pooling,
                reply,
            } => {
                // In groups, so that a caller who is gone (a client that hung up) stops
                // the work at the next group instead of its end.
                let mut out = Vec::with_capacity(inputs.len());
                for group in inputs.chunks(EMBED_GROUP) {
                    if reply.is_closed() {
                        log::debug!("embeddings: the caller is gone; the rest is not computed");
                        return;
                    }
                    match self.embed(group, pooling) {
                        Ok(v) => out.extend(v),
                        Err(e) => {
                            let _ = reply.send(Err(e));
                            return;
                        }
                    }
                }
                let _ = reply.send(Ok(out));
            }
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
            Cmd::Lora { set, reply } => {
                let r = match set {
                    Some(scales) => self.engine.set_lora_scales(&scales),
                    None => Ok(()),
                };
                let r = r
                    .map(|()| self.engine.lora_scales().to_vec())
                    .map_err(|e| RequestError::from_engine(&e));
                let _ = reply.send(r);
            }
            Cmd::Slot {
                slot,
                action,
                reply,
            } => self.pending.push((slot, action, reply)),
            Cmd::Shutdown(done) => self.stop = Some(done),
        }
    }

    /// Each input's embedding, between steps (an embeddings engine runs no sessions).
    fn embed(
        &mut self,
        inputs: &[Vec<u32>],
        pooling: crate::engine::Pooling,
    ) -> super::EmbedResult {
        #[cfg(not(target_arch = "wasm32"))]
        {
            let r = (self.engine.embed_many(inputs, pooling))
                .map_err(|e| RequestError::from_engine(&e));
            self.publish_gauges();
            r
        }
        #[cfg(target_arch = "wasm32")]
        {
            let _ = (inputs, pooling);
            Err(RequestError::Server(
                "embeddings are not served in a browser page".into(),
            ))
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
                    &e,
                    EngineError::Context(c) if matches!(c.kv(), Some(crate::kv::KvError::NoSlot { .. }))
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
        // The adapters' scales as they were set, not as the flags gave them.
        let mut engine = engine;
        if let Err(e) = engine.set_lora_scales(self.engine.lora_scales()) {
            log::error!("the LoRA scales could not be set again after the reload: {e}");
        }
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
                // Tokens after a stop string (several come in one step where a draft's
                // proposals were kept) are not part of the reply.
                if a.stop.found().is_some() {
                    return;
                }
                if a.indent.stopped() {
                    return;
                }
                a.n_generated += 1;
                let shown = a.indent.push(&a.stop.push(&text));
                if a.stop.found().is_some() || a.indent.stopped() {
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
                let mut tail = a.indent.push(&a.stop.push(&tail));
                let stop = match (stop, a.stop.found()) {
                    (_, Some(w)) => StopReason::Word(w.to_string()),
                    // A line short of `n_indent` ends the text as llama-server's limit does.
                    _ if a.indent.stopped() => StopReason::Limit,
                    (Stop::EndOfGeneration, _) => StopReason::Eos,
                    (Stop::MaxTokens, _) => StopReason::Limit,
                    (Stop::ContextFull(r), _) => StopReason::ContextFull(r),
                    (Stop::Cancelled | Stop::Fed, _) => StopReason::Cancelled,
                };
                if a.stop.found().is_none() {
                    tail.push_str(&a.indent.push(&a.stop.finish()));
                }
                tail.push_str(&a.indent.finish());
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
pub(super) fn open_slots(engine: &mut Engine, n_slots: u32) -> Result<(), EngineError> {
    for _ in engine.sessions().count() as u32..n_slots {
        engine.open_session(SessionParams::default())?;
    }
    Ok(())
}
