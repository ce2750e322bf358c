//! The engine's own task: it owns the [`Engine`], takes commands from the window and
//! sends back what happened, so a slow decode (seconds per token on a software adapter)
//! never freezes the window. Natively it is a thread blocking on the GPU; in a browser,
//! where nothing may block, it is an async task on the page's event loop that awaits
//! each step's readback (the page draws while the GPU works). The GPU device is the
//! window's: `Gpu` wraps the device egui draws with.

use crate::engine::{CacheMap, Engine, EngineOptions, Event, SessionId, SessionParams};
use crate::gpu::Gpu;
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::Arc;
use web_time::Instant;

/// Where a model comes from.
pub enum ModelSource {
    /// A file on disk (memory-mapped).
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    Path(PathBuf),
    /// A download (the page's own server or any URL that allows it), read into memory.
    #[cfg(target_arch = "wasm32")]
    Url(String),
    /// A file the page's user picked, read into memory.
    #[cfg(target_arch = "wasm32")]
    File(web_sys::File),
}

impl ModelSource {
    /// How the window names it.
    pub fn name(&self) -> String {
        match self {
            ModelSource::Path(p) => p.display().to_string(),
            #[cfg(target_arch = "wasm32")]
            ModelSource::Url(u) => u.clone(),
            #[cfg(target_arch = "wasm32")]
            ModelSource::File(f) => f.name(),
        }
    }
}

/// What the window asks of the engine.
pub enum Cmd {
    /// Load a model (replacing the one loaded), then open a session per sequence
    /// (`opts.n_seq_max`).
    Load {
        source: ModelSource,
        opts: Box<EngineOptions>,
        session: Box<SessionParams>,
    },
    Chat {
        chat: SessionId,
        text: String,
    },
    /// Raw text to continue (no chat template), as `wgllm run -p` does.
    Complete {
        chat: SessionId,
        text: String,
    },
    /// Sampling settings for a chat's next reply.
    Sampling {
        chat: SessionId,
        sampling: Box<crate::sample::SamplerParams>,
        n_predict: i32,
    },
    Stop(SessionId),
    Regenerate(SessionId),
    /// Forget a chat's conversation and cells and start it anew with these settings.
    Reset {
        chat: SessionId,
        session: Box<SessionParams>,
    },
}

/// A loaded model, as the window describes it.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    pub name: String,
    pub arch: String,
    /// The file (native) or URL / picked file name (browser).
    pub path: PathBuf,
    pub weights_mib: f64,
    pub n_ctx: u32,
    pub n_seq: u32,
    pub load_secs: f64,
}

/// What happened, for the window.
pub enum Update {
    /// Loading: `what` is being done (reading a download or file, uploading tensors),
    /// in bytes.
    Progress {
        what: &'static str,
        done: u64,
        total: u64,
    },
    Loaded(ModelInfo),
    /// A failure: of a chat's turn (`chat`) or of the engine (loading, a GPU step).
    Error {
        chat: Option<SessionId>,
        msg: String,
    },
    Event(Event),
    /// One decode step: its duration and the prompt and generated tokens it carried.
    Step {
        at: f64,
        secs: f64,
        n_prompt: usize,
        n_gen: usize,
    },
    Cache(CacheMap),
}

/// Starts the engine's task on `gpu`; `wake` is called after each batch of updates so
/// the window repaints.
pub fn spawn(
    gpu: Arc<Gpu>,
    rx: Receiver<Cmd>,
    tx: Sender<Update>,
    wake: impl Fn() + Send + 'static,
) {
    let worker = Worker {
        gpu,
        tx,
        wake: Box::new(wake),
        engine: None,
        started: Instant::now(),
        prompt_done: vec![0; crate::kv::MAX_SEQ as usize],
    };
    #[cfg(not(target_arch = "wasm32"))]
    std::thread::Builder::new()
        .name("wgllm-engine".into())
        .spawn(move || pollster::block_on(worker.run(rx)))
        .expect("spawning the engine thread");
    #[cfg(target_arch = "wasm32")]
    wasm_bindgen_futures::spawn_local(worker.run(rx));
}

/// The next command, waiting for one; `None` once the window is gone.
#[cfg(not(target_arch = "wasm32"))]
async fn next_cmd(rx: &Receiver<Cmd>) -> Option<Cmd> {
    rx.recv().ok()
}

/// The next command: a page cannot block, so it looks every 30 ms and lets the page run
/// in between.
#[cfg(target_arch = "wasm32")]
async fn next_cmd(rx: &Receiver<Cmd>) -> Option<Cmd> {
    loop {
        match rx.try_recv() {
            Ok(c) => return Some(c),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) => super::web::sleep_ms(30).await,
        }
    }
}

struct Worker {
    gpu: Arc<Gpu>,
    tx: Sender<Update>,
    wake: Box<dyn Fn() + Send>,
    engine: Option<Engine>,
    started: Instant,
    /// Per session, the input tokens already counted in a step (from its progress).
    prompt_done: Vec<usize>,
}

impl Worker {
    async fn run(mut self, rx: Receiver<Cmd>) {
        loop {
            let busy = self.engine.as_ref().is_some_and(Engine::is_busy);
            // Idle: wait for the window; busy: take what came in, then step.
            let cmd = if busy {
                match rx.try_recv() {
                    Ok(c) => Some(c),
                    Err(TryRecvError::Empty) => None,
                    Err(TryRecvError::Disconnected) => return,
                }
            } else {
                match next_cmd(&rx).await {
                    Some(c) => Some(c),
                    None => return,
                }
            };
            if let Some(c) = cmd {
                self.handle(c).await;
            } else {
                self.step().await;
            }
            (self.wake)();
            // Between steps the page gets a turn to draw what came back.
            #[cfg(target_arch = "wasm32")]
            super::web::sleep_ms(0).await;
        }
    }

    fn send(&self, u: Update) {
        // The window closed: nothing left to tell.
        let _ = self.tx.send(u);
    }

    fn fail(&self, chat: Option<SessionId>, msg: String) {
        log::warn!("app: {msg}");
        self.send(Update::Error { chat, msg });
    }

    async fn handle(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Load {
                source,
                opts,
                session,
            } => self.load(source, &opts, &session).await,
            Cmd::Chat { chat, text } => {
                self.with_engine(Some(chat), |e| e.chat(chat, &text).map(drop))
            }
            Cmd::Complete { chat, text } => {
                self.with_engine(Some(chat), |e| e.prompt_text(chat, &text).map(drop))
            }
            Cmd::Sampling {
                chat,
                sampling,
                n_predict,
            } => self.with_engine(Some(chat), |e| e.set_sampling(chat, *sampling, n_predict)),
            Cmd::Stop(chat) => self.with_engine(Some(chat), |e| e.cancel(chat)),
            Cmd::Regenerate(chat) => self.with_engine(Some(chat), |e| e.regenerate(chat)),
            Cmd::Reset { chat, session } => self.with_engine(Some(chat), |e| {
                e.close_session(chat)?;
                let id = e.open_session(*session)?;
                debug_assert_eq!(id, chat, "the lowest free sequence is the one closed");
                Ok(())
            }),
        }
        self.send_cache();
    }

    fn with_engine(
        &mut self,
        chat: Option<SessionId>,
        f: impl FnOnce(&mut Engine) -> Result<(), crate::engine::EngineError>,
    ) {
        let Some(e) = self.engine.as_mut() else {
            self.fail(chat, "no model is loaded".into());
            return;
        };
        if let Err(err) = f(e) {
            self.fail(chat, err.to_string());
        }
    }

    async fn load(&mut self, source: ModelSource, opts: &EngineOptions, session: &SessionParams) {
        // Free the old model's buffers before the new one's are made.
        self.engine = None;
        let name = source.name();
        let tx = self.tx.clone();
        let mut last = Instant::now();
        let mut report = move |what: &'static str, done: u64, total: u64| {
            if last.elapsed().as_millis() >= 50 || done == total {
                last = Instant::now();
                let _ = tx.send(Update::Progress { what, done, total });
            }
        };
        let loaded = match source {
            #[cfg(not(target_arch = "wasm32"))]
            ModelSource::Path(path) => {
                Engine::load_file_on(self.gpu.clone(), &path, opts, &mut |d, t| {
                    report("uploading", d, t)
                })
            }
            // A page's download or picked file, read into memory first.
            #[cfg(target_arch = "wasm32")]
            remote => {
                let verb = match remote {
                    ModelSource::Url(_) => "downloading",
                    _ => "reading",
                };
                let read = super::web::read_model(&remote, &mut |d, t| {
                    report(verb, d, t);
                    (self.wake)();
                })
                .await;
                self.load_bytes(&name, read, opts, &mut report).await
            }
        };
        let loaded = loaded.and_then(|mut e| {
            for _ in 0..opts.n_seq_max {
                e.open_session(session.clone())?;
            }
            Ok(e)
        });
        match loaded {
            Ok(e) => {
                self.send(Update::Loaded(ModelInfo {
                    name: e.model.name.clone(),
                    arch: format!("{:?}", e.model.hp.arch).to_lowercase(),
                    path: PathBuf::from(&name),
                    weights_mib: e.model.weights.gpu_bytes as f64 / (1 << 20) as f64,
                    n_ctx: e.n_ctx(),
                    n_seq: e.context().params.n_seq_max,
                    load_secs: e.load_time.as_secs_f64(),
                }));
                self.engine = Some(e);
            }
            Err(err) => self.fail(None, format!("loading {name}: {err}")),
        }
    }

    /// Uploads a model the page read into memory; a model the GPU has no room for
    /// fails here (the browser's out-of-memory answer is awaited).
    #[cfg(target_arch = "wasm32")]
    async fn load_bytes(
        &self,
        name: &str,
        read: Result<Vec<u8>, String>,
        opts: &EngineOptions,
        report: &mut dyn FnMut(&'static str, u64, u64),
    ) -> Result<Engine, crate::engine::EngineError> {
        let bytes = read.map_err(crate::engine::EngineError::Options)?;
        let upload = async {
            Engine::load_bytes_on(self.gpu.clone(), name, bytes, opts, &mut |d, t| {
                report("uploading", d, t)
            })
        };
        self.gpu.scoped(upload).await
    }

    async fn step(&mut self) {
        let Some(e) = self.engine.as_mut() else {
            return;
        };
        let t0 = Instant::now();
        let at = t0.duration_since(self.started).as_secs_f64();
        let events = match self.gpu.scoped(e.step_async()).await {
            Ok(ev) => ev,
            Err(err) => {
                // The step failed as a whole: stop every session so the loop ends.
                let ids: Vec<SessionId> = e.sessions().map(|s| s.id()).collect();
                for id in ids {
                    let _ = e.cancel(id);
                }
                self.fail(None, format!("decoding failed: {err}"));
                return;
            }
        };
        let secs = t0.elapsed().as_secs_f64();
        let (mut n_prompt, mut n_gen) = (0, 0);
        for ev in events {
            match &ev {
                Event::Token { .. } => n_gen += 1,
                // `done` counts this input's decoded tokens: the step added the rest.
                Event::PromptProgress { session, done, .. } => {
                    let seen = &mut self.prompt_done[*session as usize];
                    n_prompt += done.saturating_sub(*seen);
                    *seen = *done;
                }
                Event::Finished { session, .. } | Event::Error { session, .. } => {
                    self.prompt_done[*session as usize] = 0;
                }
                _ => {}
            }
            self.send(Update::Event(ev));
        }
        if n_prompt + n_gen > 0 {
            self.send(Update::Step {
                at,
                secs,
                n_prompt,
                n_gen,
            });
        }
        self.send_cache();
    }

    fn send_cache(&self) {
        if let Some(e) = &self.engine {
            self.send(Update::Cache(e.cache_map()));
        }
    }
}
