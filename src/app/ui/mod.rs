//! The window: settings on the left, chats in the middle, speed and the cache map on the
//! right. It keeps only what it shows; the engine thread holds the model and the cache.

use super::chart::{self, Sample};
use super::kv_map;
use super::worker::{self, Cmd, ModelInfo, ModelSource, Update, Wake};
use super::{AppOptions, AppSettings, Outcome};
use crate::engine::{CacheMap, Event, SessionId, Stop};
use crate::gpu::Gpu;
#[cfg(not(target_arch = "wasm32"))]
use crate::gpu::{list_adapters, AdapterSummary, Backend};
use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use web_time::Instant;

mod drive;
mod images;
mod restart;

enum Load {
    None,
    Loading {
        what: &'static str,
        done: u64,
        total: u64,
    },
    Loaded(ModelInfo),
    Failed(String),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    User,
    Assistant,
    Note,
}

struct Chat {
    id: SessionId,
    messages: Vec<(Role, String)>,
    /// The images each user message went with, by the message's index.
    thumbs: std::collections::HashMap<usize, Vec<egui::TextureHandle>>,
    /// Images waiting for the next message.
    attached: Vec<images::Attached>,
    /// The path field of the attach row.
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    image_path: String,
    input: String,
    busy: bool,
    /// The prompt's decoding progress, while it runs.
    progress: Option<(usize, usize)>,
}

impl Chat {
    fn new(id: SessionId) -> Self {
        Chat {
            id,
            messages: Vec::new(),
            thumbs: Default::default(),
            attached: Vec::new(),
            image_path: String::new(),
            input: String::new(),
            busy: false,
            progress: None,
        }
    }
}

/// The headless drive's stages.
#[derive(PartialEq)]
enum Drive {
    WaitLoad,
    WaitReply,
    /// Frames drawn since the reply ended (the last text needs one to be laid out).
    Settle(u32),
    /// The screenshot is asked for; the window closes once it is saved.
    Shooting,
}

/// How soon the window repaints for progress that streams ([`Wake::Soon`]). Where the
/// adapter is the host's own cores (SwiftShader in a page, lavapipe), a frame is drawn by
/// the same cores that run the model and costs a good part of a token, so such updates
/// are gathered into one frame every [`FramePacing::ON_CPU`]; on a GPU each is drawn at
/// once. A reply's end, errors and the user's own input still repaint at once.
#[derive(Clone, Copy, Debug)]
struct FramePacing(Option<std::time::Duration>);

impl FramePacing {
    const ON_CPU: std::time::Duration = std::time::Duration::from_secs(4);

    fn for_gpu(gpu: &Gpu) -> FramePacing {
        FramePacing(gpu.info.runs_on_cpu().then_some(Self::ON_CPU))
    }

    fn wake(self, ctx: &egui::Context, w: Wake) {
        match (w, self.0) {
            // egui keeps the earliest repaint asked for: the first update after a frame
            // sets the next one.
            (Wake::Soon, Some(after)) => ctx.request_repaint_after(after),
            _ => ctx.request_repaint(),
        }
    }

    /// How often a drive (`--drive`, the page's test) looks at its timeout while the
    /// engine works.
    fn poll(self) -> std::time::Duration {
        self.0.unwrap_or(std::time::Duration::from_millis(250))
    }
}

pub struct App {
    opts: AppOptions,
    /// The window's context, for textures made outside a frame's drawing.
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    ctx: egui::Context,
    frames: FramePacing,
    settings: AppSettings,
    tx: worker::Commands,
    rx: Receiver<Update>,
    gpu: Arc<Gpu>,
    #[cfg(not(target_arch = "wasm32"))]
    adapters: Vec<AdapterSummary>,
    models: Vec<PathBuf>,
    model_path: String,
    load: Load,
    error: Option<String>,
    chats: Vec<Chat>,
    active: usize,
    samples: Vec<Sample>,
    cache: Option<CacheMap>,
    drive: Option<Drive>,
    /// The first chat's last reply: prompt tokens and t/s, reply tokens and t/s.
    last_speed: (usize, f64, usize, f64),
    started: Instant,
    outcome: Arc<Mutex<Outcome>>,
    /// The GPU was lost: why, and the conversations to carry over (handled at the next
    /// frame, which has the window's context).
    lost: Option<(String, Vec<Vec<crate::tokenizer::ChatMessage>>)>,
    /// A file the page's picker returned, to load at the next frame.
    #[cfg(target_arch = "wasm32")]
    picked: std::rc::Rc<std::cell::RefCell<Option<web_sys::File>>>,
    /// The last picked file: Load reads it again while the model field names it.
    #[cfg(target_arch = "wasm32")]
    picked_file: Option<web_sys::File>,
    /// The drive's images a page's worker downloaded, attached when the model is loaded.
    fetched: Vec<(String, Vec<u8>)>,
    /// Files dropped on a page, read: (chat, name, bytes), attached at the next frame.
    #[cfg(target_arch = "wasm32")]
    read_drops: std::rc::Rc<std::cell::RefCell<Vec<ReadDrop>>>,
}

/// A file dropped on a page, read: its chat, its name and its bytes (or why not).
#[cfg(target_arch = "wasm32")]
type ReadDrop = (usize, String, Result<Vec<u8>, String>);

/// `.gguf` files in `dirs` (not recursive), sorted, then the models `-hf` downloaded
/// into the Hugging Face cache (llama.cpp's downloads too).
#[cfg(not(target_arch = "wasm32"))]
fn find_models(dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = dirs
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|rd| rd.flatten().map(|e| e.path()))
        .filter(|p| {
            p.extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
        })
        .collect();
    found.sort();
    #[cfg(feature = "hub")]
    if let Some(hub) = crate::hub::cache::hub_dir() {
        found.extend(crate::hub::cache::cached_models(&hub));
    }
    found
}

impl App {
    pub fn new(
        cc: &eframe::CreationContext<'_>,
        opts: AppOptions,
        outcome: Arc<Mutex<Outcome>>,
    ) -> Result<App, String> {
        let rs = cc
            .wgpu_render_state
            .as_ref()
            .ok_or("the window has no wgpu renderer")?;
        let gpu = Gpu::from_device(&rs.adapter, rs.device.clone(), rs.queue.clone(), &opts.gpu)
            .map_err(|e| e.to_string())?;
        log::info!(
            "app: drawing and running the model on {} ({})",
            gpu.info.name,
            gpu.info.backend
        );
        let (up_tx, up_rx) = channel();
        let ctx = cc.egui_ctx.clone();
        let frames = FramePacing::for_gpu(&gpu);
        let cmd_tx = worker::spawn(gpu.clone(), up_tx, move |w| frames.wake(&ctx, w));
        #[cfg(not(target_arch = "wasm32"))]
        let (models, adapters) = (find_models(&opts.model_dirs), list_adapters(Backend::Auto));
        // A page has no folders to list, and one adapter: the browser's.
        #[cfg(target_arch = "wasm32")]
        let models = Vec::new();
        let model_path = opts
            .model
            .as_ref()
            .or(models.first())
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let drive = opts.drive.then_some(Drive::WaitLoad);
        let mut app = App {
            ctx: cc.egui_ctx.clone(),
            frames,
            settings: opts.settings.clone(),
            tx: cmd_tx,
            rx: up_rx,
            gpu,
            #[cfg(not(target_arch = "wasm32"))]
            adapters,
            models,
            model_path,
            load: Load::None,
            error: None,
            chats: Vec::new(),
            active: 0,
            samples: Vec::new(),
            cache: None,
            drive,
            last_speed: (0, 0.0, 0, 0.0),
            started: Instant::now(),
            outcome,
            lost: None,
            opts,
            #[cfg(target_arch = "wasm32")]
            picked: Default::default(),
            #[cfg(target_arch = "wasm32")]
            picked_file: None,
            fetched: Vec::new(),
            #[cfg(target_arch = "wasm32")]
            read_drops: Default::default(),
        };
        if app.opts.model.is_some() {
            app.start_load();
        } else if app.drive.is_some() {
            app.fail_drive("a drive needs a model (-m, or ?model= on a page)".into());
        }
        Ok(app)
    }

    fn send(&mut self, cmd: Cmd) {
        if !self.tx.send(cmd) {
            self.error = Some("the engine thread has stopped".into());
        }
    }

    /// Loads what the model field names: a path natively, a URL on a page.
    fn start_load(&mut self) {
        let text = self.model_path.trim().to_string();
        #[cfg(not(target_arch = "wasm32"))]
        let source = ModelSource::Path(PathBuf::from(text));
        #[cfg(target_arch = "wasm32")]
        let source = match &self.picked_file {
            Some(f) if f.name() == text => ModelSource::File(f.clone()),
            _ => ModelSource::Url(text),
        };
        self.load_from(source);
    }

    fn load_from(&mut self, source: ModelSource) {
        self.chats.clear();
        self.cache = None;
        self.error = None;
        self.load = Load::Loading {
            what: "opening",
            done: 0,
            total: 0,
        };
        let mut opts = Box::new(
            self.settings
                .engine_options(&self.opts.gpu, &self.opts.tune),
        );
        opts.split = self.opts.split.clone();
        // Natively paths; on a page URLs (`?mmproj=`, and the drive's `?image=`, which
        // the worker downloads with the model and hands back before it is loaded).
        let mmproj = self.opts.mmproj.clone();
        let images = match cfg!(target_arch = "wasm32") && self.drive.is_some() {
            true => self.opts.images.clone(),
            false => Vec::new(),
        };
        self.send(Cmd::Load {
            source,
            mmproj,
            images,
            opts,
            session: Box::new(self.settings.session_params()),
        });
    }

    /// Sends chat `i`'s input: a chat turn, or with `raw` text to continue.
    fn send_message(&mut self, i: usize, raw: bool) {
        if raw && !self.chats[i].attached.is_empty() {
            let note = "error: images go with a chat message (Send), not with raw text to continue";
            self.chats[i].messages.push((Role::Note, note.into()));
            return;
        }
        let attached = std::mem::take(&mut self.chats[i].attached);
        let text = std::mem::take(&mut self.chats[i].input);
        if text.trim().is_empty() && attached.is_empty() {
            return;
        }
        let id = self.chats[i].id;
        let at = self.chats[i].messages.len();
        if !attached.is_empty() {
            let textures = attached.iter().map(|a| a.texture.clone()).collect();
            self.chats[i].thumbs.insert(at, textures);
        }
        let images = attached.into_iter().map(|a| a.image).collect();
        self.chats[i].messages.push((Role::User, text.clone()));
        self.chats[i]
            .messages
            .push((Role::Assistant, String::new()));
        self.chats[i].busy = true;
        self.send_sampling(id);
        self.send(if raw {
            Cmd::Complete { chat: id, text }
        } else {
            Cmd::Chat {
                chat: id,
                text,
                images,
            }
        });
    }

    /// The sampling panel's settings, for chat `id`'s next reply (the engine keeps its
    /// sampler when they have not changed).
    fn send_sampling(&mut self, id: SessionId) {
        let s = &self.settings;
        let (sampling, n_predict) = (Box::new(s.sampling.clone()), s.n_predict);
        self.send(Cmd::Sampling {
            chat: id,
            sampling,
            n_predict,
        });
    }

    fn chat_mut(&mut self, id: SessionId) -> Option<&mut Chat> {
        self.chats.iter_mut().find(|c| c.id == id)
    }

    fn apply(&mut self, u: Update) {
        match u {
            Update::Progress { what, done, total } => {
                self.load = Load::Loading { what, done, total }
            }
            Update::Fetched { name, bytes } => self.fetched.push((name, bytes)),
            Update::Loaded(info) => {
                self.chats = (0..info.n_seq).map(Chat::new).collect();
                self.active = 0;
                self.load = Load::Loaded(info);
                #[cfg(not(target_arch = "wasm32"))]
                self.restore_chats();
                if self.drive == Some(Drive::WaitLoad) {
                    if let Some(p) = self.opts.prompt.clone() {
                        #[cfg(not(target_arch = "wasm32"))]
                        for img in self.opts.images.clone() {
                            self.attach_path(0, &img);
                        }
                        for (name, bytes) in std::mem::take(&mut self.fetched) {
                            self.attach(0, name, &bytes);
                        }
                        self.chats[0].input = p;
                        self.send_message(0, self.opts.raw);
                        self.drive = Some(Drive::WaitReply);
                    } else {
                        self.drive = Some(Drive::Settle(0));
                    }
                }
            }
            Update::Error { chat, msg } => {
                if let Some(c) = chat.and_then(|id| self.chat_mut(id)) {
                    c.busy = false;
                    c.progress = None;
                    if c.messages
                        .last()
                        .is_some_and(|m| m.0 == Role::Assistant && m.1.is_empty())
                    {
                        c.messages.pop();
                    }
                    c.messages.push((Role::Note, format!("error: {msg}")));
                } else if matches!(self.load, Load::Loading { .. }) {
                    self.load = Load::Failed(msg.clone());
                } else {
                    self.error = Some(msg.clone());
                }
                if self.drive.is_some() {
                    self.fail_drive(msg);
                }
            }
            Update::Event(ev) => self.event(ev),
            Update::Step {
                at,
                secs,
                n_prompt,
                n_gen,
            } => {
                if n_prompt > 0 {
                    self.samples.push(Sample {
                        at,
                        tps: n_prompt as f64 / secs,
                        prompt: true,
                    });
                } else if n_gen > 0 {
                    self.samples.push(Sample {
                        at,
                        tps: n_gen as f64 / secs,
                        prompt: false,
                    });
                }
                if self.samples.len() > 2000 {
                    self.samples.drain(..1000);
                }
            }
            Update::Cache(m) => self.cache = Some(m),
            Update::DeviceLost { reason, chats } => {
                let msg = format!("the GPU was lost ({reason})");
                for c in &mut self.chats {
                    if c.busy {
                        c.busy = false;
                        c.progress = None;
                        c.messages.push((Role::Note, format!("error: {msg}")));
                    }
                }
                self.error = Some(msg);
                self.lost = Some((reason, chats));
            }
        }
    }

    fn event(&mut self, ev: Event) {
        let id = ev.session();
        let drive_chat = id == 0;
        let Some(c) = self.chat_mut(id) else {
            return;
        };
        match ev {
            Event::PromptProgress { done, total, .. } => {
                c.progress = (done < total).then_some((done, total));
            }
            Event::Token { text, .. } => {
                c.progress = None;
                if let Some(m) = c.messages.last_mut().filter(|m| m.0 == Role::Assistant) {
                    m.1.push_str(&text);
                }
            }
            Event::ContextShifted {
                n_keep, n_discard, ..
            } => c.messages.push((
                Role::Note,
                format!("context shift: kept {n_keep} tokens, dropped the next {n_discard}"),
            )),
            Event::ContextExtended { n_past, .. } => c.messages.push((
                Role::Note,
                format!("Self-Extend: positions regrouped, the sequence now spans {n_past}"),
            )),
            Event::Finished {
                stop,
                tail,
                timings,
                ..
            } => {
                if let Some(m) = c.messages.iter_mut().rev().find(|m| m.0 == Role::Assistant) {
                    m.1.push_str(&tail);
                }
                c.busy = false;
                c.progress = None;
                let why = match stop {
                    Stop::EndOfGeneration => "end of reply".to_string(),
                    Stop::MaxTokens => "max tokens".to_string(),
                    Stop::Cancelled => "stopped".to_string(),
                    Stop::ContextFull(r) => format!("context full: {r}"),
                    Stop::Fed => "fed".to_string(),
                };
                let rate = |n: usize, d: std::time::Duration| n as f64 / d.as_secs_f64().max(1e-9);
                let speed = (
                    timings.prompt_tokens,
                    rate(timings.prompt_tokens, timings.prompt),
                    timings.eval_tokens,
                    rate(timings.eval_tokens, timings.eval),
                );
                c.messages.push((
                    Role::Note,
                    format!(
                        "{why} · prompt {} tokens at {:.1} t/s · reply {} tokens at {:.1} t/s",
                        timings.prompt_tokens,
                        rate(timings.prompt_tokens, timings.prompt),
                        timings.eval_tokens,
                        rate(timings.eval_tokens, timings.eval)
                    ),
                ));
                if drive_chat {
                    self.last_speed = speed;
                    if self.drive == Some(Drive::WaitReply) {
                        self.drive = Some(Drive::Settle(0));
                    }
                }
            }
            Event::Error { error, .. } => {
                c.busy = false;
                c.progress = None;
                c.messages.push((Role::Note, format!("error: {error}")));
                if drive_chat && self.drive == Some(Drive::WaitReply) {
                    self.fail_drive(error.to_string());
                }
            }
        }
    }

    /// The adapter's name (browsers may keep it to themselves).
    fn adapter_name(&self) -> &str {
        match self.gpu.info.name.as_str() {
            "" => "unnamed adapter",
            n => n,
        }
    }

    fn top_bar(&mut self, ui: &mut egui::Ui) {
        ui.horizontal(|ui| {
            ui.heading("wgllm");
            ui.separator();
            let split = match self.opts.split.as_ref().map_or(0, |s| s.devices.len()) {
                n if n > 1 => format!(" · layers split over {n} devices"),
                _ => String::new(),
            };
            ui.label(format!(
                "{} · {} · {}{split}",
                self.adapter_name(),
                self.gpu.info.backend,
                if self.gpu.has_f16 { "f16" } else { "no f16" }
            ));
            ui.separator();
            match &self.load {
                Load::None => {
                    ui.label("no model loaded");
                }
                Load::Loading { what, done, total } => {
                    let f = if *total > 0 {
                        *done as f32 / *total as f32
                    } else {
                        0.0
                    };
                    ui.label(*what);
                    let text = match total {
                        0 => format!("{} MiB", done >> 20),
                        t => format!("{} / {} MiB", done >> 20, t >> 20),
                    };
                    ui.add(egui::ProgressBar::new(f).desired_width(240.0).text(text));
                }
                Load::Loaded(m) => {
                    ui.label(format!(
                        "{} ({}, {}, {:.0} MiB, -c {}, -np {}, loaded in {:.1} s)",
                        m.name,
                        m.arch,
                        params_text(m.n_params, m.n_params_active),
                        m.weights_mib,
                        m.n_ctx,
                        m.n_seq,
                        m.load_secs
                    ))
                    .on_hover_text(m.path.display().to_string());
                }
                Load::Failed(e) => {
                    ui.colored_label(egui::Color32::LIGHT_RED, format!("load failed: {e}"));
                }
            }
        });
        if let Some(e) = self.error.clone() {
            ui.horizontal(|ui| {
                ui.colored_label(egui::Color32::LIGHT_RED, e);
                if ui.small_button("dismiss").clicked() {
                    self.error = None;
                }
            });
        }
    }

    fn left_panel(&mut self, ui: &mut egui::Ui) {
        egui::ScrollArea::vertical().show(ui, |ui| {
            ui.strong("Model");
            #[cfg(not(target_arch = "wasm32"))]
            let hint = "path to a .gguf";
            #[cfg(target_arch = "wasm32")]
            let hint = "URL of a .gguf";
            ui.add(egui::TextEdit::singleline(&mut self.model_path).hint_text(hint));
            #[cfg(target_arch = "wasm32")]
            if ui
                .button("Open a file…")
                .on_hover_text("load a .gguf from this computer (read into the page's memory)")
                .clicked()
            {
                super::browser::pick_file(self.picked.clone(), ui.ctx().clone());
            }
            if !self.models.is_empty() {
                egui::ComboBox::from_id_salt("models")
                    .selected_text("model cache…")
                    .width(ui.available_width())
                    .show_ui(ui, |ui| {
                        for m in &self.models {
                            let name = m.file_name().unwrap_or_default().to_string_lossy();
                            if ui.selectable_label(false, name).clicked() {
                                self.model_path = m.display().to_string();
                            }
                        }
                    });
            }
            self.settings.context_ui(ui);
            let loading = matches!(self.load, Load::Loading { .. });
            if ui
                .add_enabled(!loading, egui::Button::new("Load"))
                .on_hover_text("load the model with these context settings")
                .clicked()
            {
                self.start_load();
            }
            ui.separator();
            self.gpu_ui(ui);
            ui.separator();
            ui.strong("Context policy (on chat reset)");
            self.settings.policy_ui(ui);
            ui.separator();
            ui.strong("Sampling (next reply)");
            self.settings.sampling_ui(ui);
        });
    }

    /// The adapters: natively every one wgpu finds (another restarts the app on it).
    #[cfg(not(target_arch = "wasm32"))]
    fn gpu_ui(&mut self, ui: &mut egui::Ui) {
        ui.strong("GPU");
        ui.label(match self.opts.split.as_ref().filter(|s| s.devices.len() > 1) {
            Some(_) => "the window draws on the split's main device (-mg); another adapter restarts the app on it alone",
            None => "the window and the model share one device; another adapter restarts the app on it",
        });
        let current = &self.gpu.info;
        let mut switch_to = None;
        for a in &self.adapters {
            let here = a.name == current.name && a.backend == current.backend;
            let label = format!("{} · {} · {}", a.name, a.backend, a.device_type);
            if ui.selectable_label(here, label).clicked() && !here {
                switch_to = Some(a.clone());
            }
        }
        if let Some(a) = switch_to {
            self.restart_on(ui.ctx(), &a);
        }
    }

    /// A page has the browser's adapter only.
    #[cfg(target_arch = "wasm32")]
    fn gpu_ui(&mut self, ui: &mut egui::Ui) {
        ui.strong("GPU");
        ui.label(format!(
            "the browser's WebGPU adapter: {} ({}, {})",
            self.adapter_name(),
            if self.gpu.has_f16 { "f16" } else { "no f16" },
            if self.gpu.has_subgroups {
                "subgroups"
            } else {
                "no subgroups"
            }
        ));
    }

    fn right_panel(&mut self, ui: &mut egui::Ui) {
        egui::ScrollArea::vertical().show(ui, |ui| {
            ui.strong("Speed");
            chart::show(ui, &self.samples);
            ui.separator();
            ui.strong("KV cache");
            ui.horizontal_wrapped(|ui| {
                for c in &self.chats {
                    ui.colored_label(kv_map::seq_color(c.id), format!("chat {}", c.id + 1));
                }
                ui.colored_label(kv_map::SHARED, "shared");
                ui.colored_label(kv_map::MOVED, "moved (ring)");
                ui.colored_label(egui::Color32::RED, "n_kv bound");
            });
            match &self.cache {
                Some(m) => kv_map::show(ui, m),
                None => {
                    ui.label("load a model to see its cache");
                }
            }
        });
    }

    fn chat_panel(&mut self, ui: &mut egui::Ui) {
        if self.chats.is_empty() {
            ui.centered_and_justified(|ui| {
                ui.label("Pick a model on the left and press Load.");
            });
            return;
        }
        ui.horizontal(|ui| {
            for i in 0..self.chats.len() {
                let c = &self.chats[i];
                let dot = if c.busy { " …" } else { "" };
                let text = egui::RichText::new(format!("Chat {}{dot}", c.id + 1))
                    .color(kv_map::seq_color(c.id));
                if ui.selectable_label(self.active == i, text).clicked() {
                    self.active = i;
                }
            }
        });
        ui.separator();
        let i = self.active.min(self.chats.len() - 1);
        let busy = self.chats[i].busy;
        let id = self.chats[i].id;
        // The input row at the bottom, the messages above it.
        egui::Panel::bottom("input").show(ui, |ui| {
            ui.add_space(4.0);
            self.attach_row(ui, i);
            let c = &mut self.chats[i];
            let edit = ui.add(
                egui::TextEdit::multiline(&mut c.input)
                    .desired_rows(2)
                    .desired_width(f32::INFINITY)
                    .hint_text("message (Enter sends, Shift+Enter a new line)"),
            );
            let enter = edit.has_focus()
                && ui.input(|inp| inp.key_pressed(egui::Key::Enter) && !inp.modifiers.shift);
            if enter && c.input.ends_with('\n') {
                c.input.pop();
            }
            ui.horizontal(|ui| {
                if (ui.add_enabled(!busy, egui::Button::new("Send")).clicked() || enter) && !busy {
                    self.send_message(i, false);
                }
                if ui
                    .add_enabled(!busy, egui::Button::new("Continue text"))
                    .on_hover_text("send the input as raw text for the model to continue (no chat template), as `wgllm run -p` does")
                    .clicked()
                {
                    self.send_message(i, true);
                }
                if ui.add_enabled(busy, egui::Button::new("Stop")).clicked() {
                    self.send(Cmd::Stop(id));
                }
                let has_reply = self.chats[i]
                    .messages
                    .iter()
                    .any(|m| m.0 == Role::Assistant);
                if ui
                    .add_enabled(!busy && has_reply, egui::Button::new("Regenerate"))
                    .clicked()
                {
                    self.regenerate(i);
                }
                if ui
                    .add_enabled(!busy, egui::Button::new("Reset chat"))
                    .on_hover_text(
                        "forget this conversation (frees its cells); applies the context policy",
                    )
                    .clicked()
                {
                    self.chats[i].messages.clear();
                    self.chats[i].thumbs.clear();
                    let session = Box::new(self.settings.session_params());
                    self.send(Cmd::Reset { chat: id, session });
                }
                if let Some((done, total)) = self.chats[i].progress {
                    ui.label(format!("prompt {done}/{total}"));
                }
            });
        });
        egui::CentralPanel::default().show(ui, |ui| {
            egui::ScrollArea::vertical()
                .stick_to_bottom(true)
                .auto_shrink([false, false])
                .show(ui, |ui| {
                    let c = &self.chats[i];
                    for (k, (role, text)) in c.messages.iter().enumerate() {
                        match role {
                            Role::User => {
                                ui.label(egui::RichText::new("you").strong());
                                if let Some(t) = c.thumbs.get(&k) {
                                    images::show_thumbs(ui, t);
                                }
                                ui.label(text);
                            }
                            Role::Assistant => {
                                ui.label(
                                    egui::RichText::new("model")
                                        .strong()
                                        .color(kv_map::seq_color(id)),
                                );
                                ui.label(if text.is_empty() && busy { "…" } else { text });
                            }
                            Role::Note => {
                                ui.label(egui::RichText::new(text).small().weak());
                            }
                        }
                        ui.add_space(4.0);
                    }
                });
        });
    }

    fn regenerate(&mut self, i: usize) {
        let c = &mut self.chats[i];
        // Drop the last reply and the notes after it; the engine cuts its cells.
        if let Some(pos) = c.messages.iter().rposition(|m| m.0 == Role::Assistant) {
            c.messages.truncate(pos);
        }
        c.messages.push((Role::Assistant, String::new()));
        c.busy = true;
        let id = c.id;
        self.send_sampling(id);
        self.send(Cmd::Regenerate(id));
    }
}

impl eframe::App for App {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        while let Ok(u) = self.rx.try_recv() {
            self.apply(u);
        }
        if let Some((reason, chats)) = self.lost.take() {
            self.after_loss(ui.ctx(), &reason, chats);
        }
        #[cfg(target_arch = "wasm32")]
        let picked = self.picked.borrow_mut().take();
        #[cfg(target_arch = "wasm32")]
        if let Some(f) = picked {
            self.model_path = f.name();
            self.picked_file = Some(f.clone());
            self.load_from(ModelSource::File(f));
        }
        let ctx = ui.ctx().clone();
        self.take_dropped(&ctx);
        #[cfg(target_arch = "wasm32")]
        self.take_read_drops();
        egui::Panel::top("top").show(ui, |ui| self.top_bar(ui));
        egui::Panel::left("settings")
            .default_size(290.0)
            .show(ui, |ui| self.left_panel(ui));
        egui::Panel::right("cache")
            .default_size(420.0)
            .show(ui, |ui| self.right_panel(ui));
        egui::CentralPanel::default().show(ui, |ui| self.chat_panel(ui));
        self.drive(&ctx);
    }
}

/// "135M params", or for a mixture of experts "30.5B params, 3.3B active".
fn params_text(total: u64, active: u64) -> String {
    let short = crate::model::short_count;
    match active < total {
        true => format!("{} params, {} active", short(total), short(active)),
        false => format!("{} params", short(total)),
    }
}
