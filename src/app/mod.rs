//! The desktop demo app (`wgllm app`; cargo feature `app`): chat with a GGUF model in a
//! window, and watch the KV cache work — a map of every cell coloured by sequence, the
//! `n_kv` bound, cells a context shift or Self-Extend moved — beside a tokens/s chart.
//!
//! egui draws through egui-wgpu on the very device the model runs on: the window creates
//! the device (asking for the features and limits the kernels use), and the engine wraps
//! it with [`crate::gpu::Gpu::from_device`]. The engine lives on its own thread
//! ([`worker`]); the window only sends commands and draws what comes back.
//!
//! A headless drive (`--prompt TEXT --screenshot FILE.png`) loads the model, sends the
//! prompt, waits for the reply, saves a PNG of the window and exits: tests and docs/app.md
//! picture use it.
//!
//! Built for wasm32 the same app is a browser page ([`web`]): eframe draws on the page's
//! canvas with WebGPU, the model comes from a URL or a picked file, and the engine runs
//! as an async task instead of a thread.

#[cfg(target_arch = "wasm32")]
mod browser;
mod chart;
mod kv_map;
#[cfg(not(target_arch = "wasm32"))]
pub mod restore;
mod settings;
#[cfg(not(target_arch = "wasm32"))]
mod shot;
mod ui;
#[cfg(target_arch = "wasm32")]
pub mod web;
mod worker;

pub use settings::AppSettings;

use crate::gpu::{Backend, GpuOptions};
use std::path::PathBuf;
use std::sync::Arc;
#[cfg(not(target_arch = "wasm32"))]
use std::sync::Mutex;
use web_time::Duration;

/// Everything `wgllm app` takes from its flags.
#[derive(Clone, Debug)]
pub struct AppOptions {
    /// Model to load at start (else one is picked in the window).
    pub model: Option<PathBuf>,
    /// Folders whose `.gguf` files the model picker lists.
    pub model_dirs: Vec<PathBuf>,
    /// Backend, adapter and kernel choices for the window's (and so the model's) device.
    pub gpu: GpuOptions,
    /// The model's layers split over several adapters (`--device A,B`): the window's
    /// device is the main one, the others are opened beside it.
    pub split: Option<crate::engine::SplitSpec>,
    /// Whether the kernels are tuned for that device (see [`crate::tune`]).
    pub tune: crate::tune::TuneOptions,
    /// Context, sequences, sampling: the settings panel starts from these.
    pub settings: AppSettings,
    /// Headless drive: send `prompt` to the first chat once the model is loaded, report
    /// the reply (a PNG of the window natively, `#wgllm-result` on a page).
    pub drive: bool,
    /// Send this to the first chat once the model is loaded.
    pub prompt: Option<String>,
    /// The model's vision encoder (an mmproj file): chats then take images.
    pub mmproj: Option<PathBuf>,
    /// Images to send with `prompt` (the headless drive).
    pub images: Vec<PathBuf>,
    /// The prompt is raw text to continue (no chat template), as `wgllm run -p` takes it.
    pub raw: bool,
    /// Headless drive: after the reply, save the window here and exit.
    pub screenshot: Option<PathBuf>,
    /// Headless drive: give up (exit with an error) after this long.
    pub timeout: Duration,
    pub window_size: [f32; 2],
    /// Conversations to start the chats with: those of an app that lost its GPU and
    /// started this one (see [`restore`]).
    pub restore_chats: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("the window could not be opened: {0} (a display is needed: on a machine without one, run under Xvfb, e.g. `xvfb-run -a wgllm app ...`)")]
    Window(String),
    #[error("{0}")]
    Drive(String),
}

/// What a headless drive saw, for the caller to print (the library never prints).
#[derive(Clone, Debug, Default)]
pub struct DriveReport {
    /// The first chat's last reply.
    pub reply: String,
    /// Its prompt and reply tokens and speeds (tokens/s), as the chat's note shows them.
    pub prompt_tokens: usize,
    pub prompt_tps: f64,
    pub eval_tokens: usize,
    pub eval_tps: f64,
    /// Per K/V store: name, used cells, cells, cells moved by a shift.
    pub stores: Vec<(&'static str, usize, usize, usize)>,
    /// The devices the model runs on (several for a split), each with the cache bytes
    /// it holds over every store.
    pub devices: Vec<(crate::engine::DevicePart, u64)>,
}

/// The drive's result, filled by the window.
#[derive(Debug, Default)]
struct Outcome {
    error: Option<String>,
    report: Option<DriveReport>,
    /// The app this one started after losing its GPU: a drive's result is its result.
    #[cfg(not(target_arch = "wasm32"))]
    restarted: Option<std::process::Child>,
}

/// Opens the window and runs until it is closed (or, driven, until the screenshot is
/// saved). Blocks; native targets. Returns what a drive saw.
#[cfg(not(target_arch = "wasm32"))]
pub fn run(opts: AppOptions) -> Result<Option<DriveReport>, AppError> {
    let outcome: Arc<Mutex<Outcome>> = Arc::default();
    let native = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default()
            .with_title("wgllm")
            .with_inner_size(opts.window_size),
        wgpu_options: wgpu_config(&opts.gpu),
        ..Default::default()
    };
    let out = outcome.clone();
    let result = eframe::run_native(
        "wgllm",
        native,
        Box::new(move |cc| {
            let app = ui::App::new(cc, opts, out).map_err(|e| e.to_string())?;
            Ok(Box::new(app))
        }),
    );
    result.map_err(|e| AppError::Window(e.to_string()))?;
    let taken = std::mem::take(&mut *outcome.lock().unwrap());
    if let Some(mut child) = taken.restarted {
        // The new app drives on and reports (its output is this one's).
        let status = child
            .wait()
            .map_err(|e| AppError::Drive(format!("waiting for the app started again: {e}")))?;
        return match status.success() {
            true => Ok(None),
            false => Err(AppError::Drive(format!(
                "the app started again after the GPU was lost failed ({status})"
            ))),
        };
    }
    match taken.error {
        Some(msg) => Err(AppError::Drive(msg)),
        None => Ok(taken.report),
    }
}

/// The window's device: on the adapter `--backend`/`--device` name, with the features
/// and limits the kernels use (shader-f16, subgroups and timestamps where the adapter has
/// them and the flags allow; the adapter's own limits, for large storage bindings).
fn wgpu_config(gpu: &GpuOptions) -> eframe::egui_wgpu::WgpuConfiguration {
    let mut setup = eframe::egui_wgpu::WgpuSetupCreateNew::without_display_handle();
    if gpu.backend != Backend::Auto {
        setup.instance_descriptor.backends = gpu.backend.backends();
    }
    let index = gpu.adapter_index;
    if let Some(i) = index {
        setup.native_adapter_selector = Some(Arc::new(move |adapters, _surface| {
            adapters.get(i).cloned().ok_or_else(|| {
                format!(
                    "--device {i}: there are {} adapters on this backend (see `wgllm devices`)",
                    adapters.len()
                )
            })
        }));
    }
    let (no_f16, no_subgroups) = (gpu.no_f16, gpu.no_subgroups);
    setup.device_descriptor = Arc::new(move |adapter| {
        let have = adapter.features();
        let mut want = wgpu::Features::empty();
        if !no_f16 {
            want |= wgpu::Features::SHADER_F16;
        }
        if !no_subgroups {
            want |= wgpu::Features::SUBGROUP;
        }
        want |= wgpu::Features::TIMESTAMP_QUERY;
        wgpu::DeviceDescriptor {
            label: Some("wgllm app"),
            required_features: want & have,
            required_limits: adapter.limits(),
            ..Default::default()
        }
    });
    eframe::egui_wgpu::WgpuConfiguration {
        wgpu_setup: eframe::egui_wgpu::WgpuSetup::CreateNew(setup),
        ..Default::default()
    }
}
