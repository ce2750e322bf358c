//! The app's go-between: it loads a model onto the window's device, then drives the
//! library's [`EngineService`] the way a server does — each chat is a slot; a message
//! renders the chat's whole conversation with the model's template and submits its
//! tokens, and the service reuses the cells of the prefix the slot already holds (so only
//! what the template adds is decoded) — and turns what comes back into the window's
//! updates. Natively it is a thread; in a browser, where nothing may block, a task on the
//! page's event loop (the service itself is one there too, awaiting each step's readback
//! while the page draws). The GPU device is the window's: `Gpu` wraps the device egui
//! draws with.

use crate::engine::service::{
    EngineService, Request, RequestEvent, RequestKey, ServiceUpdate, SlotAction, StopReason,
};
use crate::engine::{
    CacheMap, Engine, EngineError, EngineOptions, Event, MediaPrompt, PreparedImage, SessionId,
    SessionParams, Stop,
};
use crate::gpu::Gpu;
use crate::tokenizer::ChatMessage;
use crate::vision::RgbImage;
use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use tokio::sync::mpsc as amp;
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
        /// The model's vision encoder (an mmproj file; a URL on a page).
        mmproj: Option<PathBuf>,
        /// A page's images to download with the model (handed back as
        /// [`Update::Fetched`] before [`Update::Loaded`]).
        images: Vec<PathBuf>,
        opts: Box<EngineOptions>,
        session: Box<SessionParams>,
    },
    /// A chat turn: the user's text, and the images that go with it (before the text, as
    /// llama-mtmd-cli places them).
    Chat {
        chat: SessionId,
        text: String,
        images: Vec<Arc<RgbImage>>,
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
    /// Conversations carried over from an app that lost its GPU ([`Update::DeviceLost`]):
    /// each chat's turns, decoded again from their start at its next message. (A page
    /// cannot start itself again.)
    #[cfg(not(target_arch = "wasm32"))]
    Restore(Vec<Vec<ChatMessage>>),
}

/// A loaded model, as the window describes it.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    pub name: String,
    pub arch: String,
    /// The file (native) or URL / picked file name (browser).
    pub path: PathBuf,
    pub weights_mib: f64,
    /// Parameters, and those a token uses (fewer in a mixture of experts).
    pub n_params: u64,
    pub n_params_active: u64,
    pub n_ctx: u32,
    pub n_seq: u32,
    pub load_secs: f64,
    /// A vision encoder is loaded: chats take images.
    pub vision: bool,
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
    /// An image a page downloaded for its drive (`?image=`).
    #[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
    Fetched {
        name: String,
        bytes: Vec<u8>,
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
    /// The GPU was lost (a driver reset, a GPU switched off): the model and the window's
    /// device are gone with it. Each chat's conversation so far (a failed turn left out),
    /// for an app started again to carry on.
    DeviceLost {
        reason: String,
        chats: Vec<Vec<ChatMessage>>,
    },
}

/// The window's end of the worker's input.
pub struct Commands(amp::UnboundedSender<Input>);

impl Commands {
    /// False once the worker is gone.
    pub fn send(&self, c: Cmd) -> bool {
        self.0.send(Input::Cmd(c)).is_ok()
    }
}

/// Everything the worker waits for, on one channel.
enum Input {
    Cmd(Cmd),
    Request(SessionId, RequestEvent),
    Service(ServiceUpdate),
}

/// How soon the window should show what the worker just sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// A change the user waits on: a reply's end, an error, a loaded model, a command's
    /// effect.
    Now,
    /// Progress that streams (a token, prompt or load progress, a step's timing, a cache
    /// map): the window may gather several into one frame (see `ui::FramePacing`).
    Soon,
}

impl Wake {
    fn of(input: &Input) -> Wake {
        match input {
            Input::Service(_) => Wake::Soon,
            Input::Request(_, RequestEvent::Token { .. } | RequestEvent::Progress { .. }) => {
                Wake::Soon
            }
            _ => Wake::Now,
        }
    }
}

/// Starts the worker on `gpu`; `wake` is called after each update so the window
/// repaints.
pub fn spawn(gpu: Arc<Gpu>, tx: Sender<Update>, wake: impl Fn(Wake) + Send + 'static) -> Commands {
    let (in_tx, in_rx) = amp::unbounded_channel();
    let worker = Worker {
        gpu,
        tx,
        wake: Box::new(wake),
        input: in_tx.clone(),
        service: None,
        chats: Vec::new(),
        started: Instant::now(),
    };
    #[cfg(not(target_arch = "wasm32"))]
    std::thread::Builder::new()
        .name("wgllm-app".into())
        .spawn(move || pollster::block_on(worker.run(in_rx)))
        .expect("spawning the app's worker thread");
    #[cfg(target_arch = "wasm32")]
    wasm_bindgen_futures::spawn_local(worker.run(in_rx));
    Commands(in_tx)
}

/// A chat as the worker keeps it: its settings, its conversation (or, for raw text, the
/// tokens its slot holds), and the request running for it.
struct ChatState {
    params: SessionParams,
    messages: Vec<ChatMessage>,
    /// The slot's tokens after the last reply (prompt and reply), for raw continuation.
    tokens: Vec<u32>,
    /// Every image of the conversation, in order (a chat renders all its turns).
    images: Vec<Arc<PreparedImage>>,
    /// Images the last turn added (dropped again if the turn fails).
    turn_images: usize,
    /// The last request's prompt and whether it was a chat turn, for regenerating.
    last: Option<(MediaPrompt, bool)>,
    running: Option<RequestKey>,
    reply: String,
    reply_tokens: Vec<u32>,
}

impl ChatState {
    fn new(params: SessionParams) -> Self {
        ChatState {
            params,
            messages: Vec::new(),
            tokens: Vec::new(),
            images: Vec::new(),
            turn_images: 0,
            last: None,
            running: None,
            reply: String::new(),
            reply_tokens: Vec::new(),
        }
    }
}

struct Worker {
    gpu: Arc<Gpu>,
    tx: Sender<Update>,
    wake: Box<dyn Fn(Wake) + Send>,
    /// For the service's sinks, which feed this worker's own input.
    input: amp::UnboundedSender<Input>,
    service: Option<EngineService>,
    chats: Vec<ChatState>,
    started: Instant,
}

impl Worker {
    async fn run(mut self, mut rx: amp::UnboundedReceiver<Input>) {
        while let Some(input) = rx.recv().await {
            let wake = Wake::of(&input);
            match input {
                Input::Cmd(c) => self.handle(c).await,
                Input::Request(chat, ev) => self.request_event(chat, ev),
                Input::Service(u) => self.service_update(u),
            }
            (self.wake)(wake);
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
                mmproj,
                images,
                opts,
                session,
            } => self.load(source, mmproj, images, &opts, &session).await,
            Cmd::Chat { chat, text, images } => self.turn(chat, Some((text, images)), None),
            Cmd::Complete { chat, text } => self.turn(chat, None, Some(text)),
            Cmd::Sampling {
                chat,
                sampling,
                n_predict,
            } => {
                if let Some(c) = self.chats.get_mut(chat as usize) {
                    c.params.sampling = *sampling;
                    c.params.n_predict = n_predict;
                }
            }
            Cmd::Stop(chat) => {
                let key = self.chats.get(chat as usize).and_then(|c| c.running);
                if let (Some(s), Some(k)) = (&self.service, key) {
                    s.cancel(k);
                }
            }
            Cmd::Regenerate(chat) => self.regenerate(chat),
            #[cfg(not(target_arch = "wasm32"))]
            Cmd::Restore(chats) => {
                for (c, messages) in self.chats.iter_mut().zip(chats) {
                    c.messages = messages;
                }
            }
            Cmd::Reset { chat, session } => {
                let Some(service) = self.service.clone() else {
                    return self.fail(Some(chat), "no model is loaded".into());
                };
                if let Some(k) = self.chats.get(chat as usize).and_then(|c| c.running) {
                    service.cancel(k);
                }
                if let Some(c) = self.chats.get_mut(chat as usize) {
                    *c = ChatState::new(*session);
                }
                // Waits for the slot to be idle (a cancelled reply ends at the next step).
                if let Err(e) = service.slot_action(chat, SlotAction::Erase).await {
                    self.fail(Some(chat), e.to_string());
                }
            }
        }
    }

    /// Submits chat `chat`'s next request: a chat turn (`user`, with its images) or raw
    /// text to continue.
    fn turn(
        &mut self,
        chat: SessionId,
        user: Option<(String, Vec<Arc<RgbImage>>)>,
        raw: Option<String>,
    ) {
        let Some(service) = self.service.clone() else {
            return self.fail(Some(chat), "no model is loaded".into());
        };
        let Some(c) = self.chats.get_mut(chat as usize) else {
            return self.fail(Some(chat), format!("no chat {chat}"));
        };
        if c.running.is_some() {
            return self.fail(Some(chat), EngineError::Busy(chat).to_string());
        }
        let tok = service.tokenizer();
        let prep = service.image_prep();
        c.turn_images = 0;
        let prompt = match (user, raw) {
            (Some((text, images)), _) => {
                if !images.is_empty() && prep.is_none() {
                    return self.fail(Some(chat), "this model has no vision encoder: load it with an mmproj file (wgllm app --mmproj FILE) to chat about images".into());
                }
                // A marker of this process's own: a `<__media__>` typed or replied stays text.
                let marker = crate::engine::private_marker();
                let text = format!("{}{text}", marker.repeat(images.len()));
                if let Some(prep) = prep {
                    let prepared = (images.iter())
                        .map(|img| PreparedImage::new(prep, img))
                        .collect::<Result<Vec<_>, _>>();
                    match prepared {
                        Ok(v) => c.images.extend(v),
                        Err(e) => return self.fail(Some(chat), e.to_string()),
                    }
                }
                c.turn_images = images.len();
                c.messages.push(ChatMessage::new("user", text));
                let built = tok
                    .apply_chat_template(&c.messages, true)
                    .map_err(|e| e.to_string());
                let built = built.and_then(|rendered| match prep {
                    Some(prep) if !c.images.is_empty() => {
                        MediaPrompt::build(tok, prep, &rendered, marker, &c.images, true)
                            .map_err(|e| e.to_string())
                    }
                    _ => Ok(MediaPrompt::text(tok.encode(&rendered, true, true))),
                });
                match built {
                    Ok(p) => p,
                    Err(e) => {
                        c.messages.pop();
                        let keep = c.images.len() - c.turn_images;
                        c.images.truncate(keep);
                        return self.fail(Some(chat), e);
                    }
                }
            }
            (None, Some(text)) => {
                let mut p = c.tokens.clone();
                p.extend(tok.encode(&text, p.is_empty(), true));
                // The slot's images stay where they are in its tokens.
                MediaPrompt {
                    tokens: p,
                    images: c.last.as_ref().map_or(Vec::new(), |l| l.0.images.clone()),
                }
            }
            (None, None) => return,
        };
        let is_chat = c.messages.last().is_some_and(|m| m.role == "user");
        self.submit(chat, prompt, is_chat);
    }

    fn submit(&mut self, chat: SessionId, prompt: MediaPrompt, is_chat: bool) {
        let (Some(service), Some(c)) = (self.service.clone(), self.chats.get_mut(chat as usize))
        else {
            return;
        };
        c.reply.clear();
        c.reply_tokens.clear();
        c.last = Some((prompt.clone(), is_chat));
        let input = self.input.clone();
        let key = service.submit_to(
            Request {
                prompt: prompt.tokens,
                images: prompt.images,
                params: c.params.clone(),
                cache_prompt: true,
                slot: Some(chat),
                stop: Vec::new(),
                n_indent: 0,
            },
            Box::new(move |ev| input.send(Input::Request(chat, ev)).is_ok()),
        );
        c.running = Some(key);
    }

    /// Drops chat `chat`'s last reply and asks for a new one to the same prompt (the
    /// slot's cells of the prompt are reused; with a fixed seed the reply repeats).
    fn regenerate(&mut self, chat: SessionId) {
        let Some(c) = self.chats.get_mut(chat as usize) else {
            return;
        };
        let Some((prompt, is_chat)) = c.last.clone().filter(|_| c.running.is_none()) else {
            return self.fail(
                Some(chat),
                format!("chat {chat} has no reply to regenerate yet"),
            );
        };
        if is_chat && c.messages.last().is_some_and(|m| m.role == "assistant") {
            c.messages.pop();
        }
        self.submit(chat, prompt, is_chat);
    }

    fn request_event(&mut self, chat: SessionId, ev: RequestEvent) {
        let Some(c) = self.chats.get_mut(chat as usize) else {
            return;
        };
        let event = match ev {
            RequestEvent::Started { .. } => return,
            RequestEvent::Progress { done, total } => Event::PromptProgress {
                session: chat,
                done,
                total,
            },
            RequestEvent::Shifted { n_keep, n_discard } => Event::ContextShifted {
                session: chat,
                n_keep,
                n_discard,
            },
            RequestEvent::Extended { n_past } => Event::ContextExtended {
                session: chat,
                n_past,
            },
            RequestEvent::Token { token, text, .. } => {
                c.reply.push_str(&text);
                c.reply_tokens.push(token);
                Event::Token {
                    session: chat,
                    token,
                    text,
                    probs: None,
                }
            }
            RequestEvent::Finished(end) => {
                c.running = None;
                c.reply.push_str(&end.tail);
                if let Some((prompt, is_chat)) = &c.last {
                    c.tokens = prompt.tokens.clone();
                    c.tokens.extend_from_slice(&c.reply_tokens);
                    if *is_chat {
                        c.messages
                            .push(ChatMessage::new("assistant", c.reply.clone()));
                    }
                }
                Event::Finished {
                    session: chat,
                    stop: match end.stop {
                        StopReason::Eos => Stop::EndOfGeneration,
                        StopReason::Limit | StopReason::Word(_) => Stop::MaxTokens,
                        StopReason::ContextFull(r) => Stop::ContextFull(r),
                        StopReason::Cancelled => Stop::Cancelled,
                    },
                    tail: end.tail,
                    timings: end.timings,
                }
            }
            RequestEvent::Failed(e) => {
                c.running = None;
                // The turn did not happen: the conversation is as it was before it.
                if c.last.as_ref().is_some_and(|l| l.1)
                    && c.messages.last().is_some_and(|m| m.role == "user")
                {
                    c.messages.pop();
                    let keep = c.images.len() - std::mem::take(&mut c.turn_images);
                    c.images.truncate(keep);
                }
                if let Some(reason) = self.gpu.lost_reason() {
                    return self.device_lost(reason);
                }
                Event::Error {
                    session: chat,
                    error: EngineError::Options(e.to_string()),
                }
            }
        };
        self.send(Update::Event(event));
    }

    /// The model's device is gone: the engine with it (once), and the window is told,
    /// with the conversations it can carry to an app started again.
    fn device_lost(&mut self, reason: String) {
        if self.service.take().is_none() {
            return;
        }
        let chats = self.chats.iter().map(|c| c.messages.clone()).collect();
        self.send(Update::DeviceLost { reason, chats });
    }

    fn service_update(&mut self, u: ServiceUpdate) {
        match u {
            ServiceUpdate::Step {
                secs,
                n_prompt,
                n_gen,
            } => self.send(Update::Step {
                at: self.started.elapsed().as_secs_f64() - secs,
                secs,
                n_prompt,
                n_gen,
            }),
            ServiceUpdate::Cache(m) => self.send(Update::Cache(m)),
        }
    }

    async fn load(
        &mut self,
        source: ModelSource,
        mmproj: Option<PathBuf>,
        images: Vec<PathBuf>,
        opts: &EngineOptions,
        session: &SessionParams,
    ) {
        // Free the old model's buffers before the new one's are made: the service's loop
        // ends (and drops its engine) when its last handle goes.
        self.service = None;
        self.chats.clear();
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
                let read = read_model(&remote, &mut |d, t| {
                    report(verb, d, t);
                    (self.wake)(Wake::Soon);
                })
                .await;
                self.load_bytes(&name, read, opts, &mut report).await
            }
        };
        let mut engine = match loaded {
            Ok(e) => e,
            Err(err) => return self.fail(None, format!("loading {name}: {err}")),
        };
        if let Some(p) = mmproj {
            let name = p.display().to_string();
            #[cfg(not(target_arch = "wasm32"))]
            let attached = engine.attach_vision(&name);
            // A page downloads the mmproj as it does the model.
            #[cfg(target_arch = "wasm32")]
            let attached = {
                let tx = self.tx.clone();
                let mut progress = |d, t| {
                    let _ = tx.send(Update::Progress {
                        what: "downloading the mmproj",
                        done: d,
                        total: t,
                    });
                    (self.wake)(Wake::Soon);
                };
                match super::browser::fetch_bytes(&name, &mut progress).await {
                    Ok(bytes) => {
                        let upload = async { engine.attach_vision_bytes(&name, bytes) };
                        self.gpu.scoped(upload).await
                    }
                    Err(e) => Err(crate::engine::EngineError::Options(e)),
                }
            };
            if let Err(err) = attached {
                return self.fail(None, format!("loading {name}: {err}"));
            }
        }
        #[cfg(target_arch = "wasm32")]
        for p in images {
            let url = p.display().to_string();
            match super::browser::fetch_bytes(&url, &mut |_, _| {}).await {
                Ok(bytes) => self.send(Update::Fetched { name: url, bytes }),
                Err(e) => return self.fail(None, format!("downloading {url}: {e}")),
            }
        }
        #[cfg(not(target_arch = "wasm32"))]
        drop(images);
        let info = ModelInfo {
            name: engine.model.name.clone(),
            arch: format!("{:?}", engine.model.hp.arch).to_lowercase(),
            path: PathBuf::from(&name),
            weights_mib: engine.model.weights.gpu_bytes as f64 / (1 << 20) as f64,
            n_params: engine.model.n_params,
            n_params_active: engine.model.n_params_active,
            n_ctx: engine.n_ctx(),
            n_seq: engine.context().params.n_seq_max,
            load_secs: engine.load_time.as_secs_f64(),
            vision: engine.vision().is_some(),
        };
        #[cfg(not(target_arch = "wasm32"))]
        let service = EngineService::spawn(engine);
        #[cfg(target_arch = "wasm32")]
        let service = EngineService::spawn_local(engine);
        match service {
            Ok(service) => {
                let input = self.input.clone();
                service.watch(Box::new(move |u| input.send(Input::Service(u)).is_ok()));
                self.chats = (0..info.n_seq)
                    .map(|_| ChatState::new(session.clone()))
                    .collect();
                self.service = Some(service);
                self.send(Update::Loaded(info));
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
}

/// The bytes of a model from a URL or a picked file (a page has no paths).
#[cfg(target_arch = "wasm32")]
async fn read_model(
    source: &ModelSource,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Vec<u8>, String> {
    match source {
        ModelSource::Url(url) => super::browser::fetch_bytes(url, progress).await,
        ModelSource::File(file) => super::browser::read_file(file, progress).await,
        ModelSource::Path(p) => Err(format!(
            "{}: a page cannot open paths; give a URL or pick a file",
            p.display()
        )),
    }
}
