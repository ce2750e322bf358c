//! The app on a browser page (wasm32): the same window, drawn by eframe on the page's
//! canvas through WebGPU, with the engine as an async task on the page's event loop.
//!
//! What the desktop gets from its flags the page gets from its address:
//! `?model=URL&prompt=TEXT&raw=1&temp=0&n=48&c=1024&np=1&seed=N&no_subgroups=1&no_f16=1`,
//! `mmproj=URL` (the model's vision encoder: chats then take dropped images) and, for a
//! drive, `image=URL[,URL]` (attached to the prompt),
//! `kernels=cpu|gpu`, `sampling=auto|cpu|gpu` and the `WGLLM_*` tuning variables by
//! name. With a `prompt`, the page drives itself as `wgllm app --screenshot` does: it loads the
//! model, sends the prompt, and when the reply has ended writes a JSON report into the
//! page's `#wgllm-result` element (tests read it there and screenshot the page).
//!
//! Memory: a page's wasm32 heap is at most 4 GiB and the model file is read into it
//! once (downloaded or picked file, chunk by chunk straight into one buffer) and then
//! uploaded to the GPU tensor by tensor. One buffer on wasm32 stops short of 2 GiB
//! (`isize::MAX`), so larger files are refused before any reading starts.

use super::browser::{document, has_webgpu, js_text, set_text};
use super::{AppOptions, AppSettings, Outcome};
use crate::gpu::{GpuOptions, KernelShape, KernelTuning};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use wasm_bindgen::JsCast;

/// Starts the app on the page's `<canvas id="wgllm-canvas">` (called by `main`).
pub fn start() {
    let _ = eframe::WebLogger::init(log::LevelFilter::Info);
    let opts = options_from_address();
    wasm_bindgen_futures::spawn_local(async move {
        if let Err(msg) = run(opts).await {
            log::error!("wgllm: {msg}");
            set_text("wgllm-error", &msg);
        }
    });
}

async fn run(opts: AppOptions) -> Result<(), String> {
    let canvas = document()?
        .get_element_by_id("wgllm-canvas")
        .ok_or("the page has no <canvas id=\"wgllm-canvas\">")?
        .dyn_into::<web_sys::HtmlCanvasElement>()
        .map_err(|_| "#wgllm-canvas is not a canvas")?;
    if !has_webgpu() {
        return Err("this browser has no WebGPU (navigator.gpu): use a recent Chrome, Edge or Safari, or Firefox with WebGPU enabled".into());
    }
    let web = eframe::WebOptions {
        wgpu_options: super::wgpu_config(&opts.gpu),
        ..Default::default()
    };
    let outcome: Arc<Mutex<Outcome>> = Arc::default();
    let runner = eframe::WebRunner::new();
    // After eframe's own hook (which logs the panic): say on the page that it stopped.
    let logged = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        logged(info);
        set_text("wgllm-error", &format!("wgllm stopped: {info}"));
    }));
    runner
        .start(
            canvas,
            web,
            Box::new(move |cc| {
                let app = super::ui::App::new(cc, opts, outcome).map_err(|e| e.to_string())?;
                Ok(Box::new(app))
            }),
        )
        .await
        .map_err(|e| format!("the page could not start WebGPU drawing: {}", js_text(&e)))
}

/// The app's options from the page address (see the module docs).
fn options_from_address() -> AppOptions {
    let query = web_sys::window()
        .and_then(|w| w.location().search().ok())
        .unwrap_or_default();
    let params = web_sys::UrlSearchParams::new_with_str(&query).ok();
    let get = |k: &str| params.as_ref().and_then(|p| p.get(k));
    let flag = |k: &str| get(k).is_some_and(|v| v != "0" && v != "false");
    let mut settings = AppSettings {
        n_parallel: 1,
        ..AppSettings::default()
    };
    if let Some(v) = get("c").and_then(|v| v.parse().ok()) {
        settings.n_ctx = v;
    }
    if let Some(v) = get("np").and_then(|v| v.parse().ok()) {
        settings.n_parallel = v;
    }
    if let Some(v) = get("n").and_then(|v| v.parse().ok()) {
        settings.n_predict = v;
    }
    if let Some(v) = get("temp").and_then(|v| v.parse().ok()) {
        settings.sampling.temp = v;
    }
    if let Some(v) = get("seed").and_then(|v| v.parse().ok()) {
        settings.sampling.seed = v;
    }
    let prompt = get("prompt").filter(|p| !p.trim().is_empty());
    // Kernel choices as the CLI takes them: `kernels=cpu|gpu` (--kernels) and the
    // `WGLLM_*` tuning variables by their own names. A page runs no tuner.
    let mut bad = Vec::new();
    let kernels = match get("kernels").map(|k| k.parse::<KernelShape>()) {
        Some(Ok(k)) => k,
        Some(Err(e)) => {
            bad.push(format!("kernels: {e}"));
            KernelShape::Auto
        }
        None => KernelShape::Auto,
    };
    match get("sampling").map(|s| s.parse()) {
        Some(Ok(s)) => settings.sampling_path = s,
        Some(Err(e)) => bad.push(format!("sampling: {e}")),
        None => {}
    }
    let tuning = KernelTuning::from_lookup(|var| get(var)).unwrap_or_else(|e| {
        bad.push(e.to_string());
        KernelTuning::default()
    });
    if !bad.is_empty() {
        set_text(
            "wgllm-error",
            &format!(
                "the page's address asks for what cannot be: {}",
                bad.join("; ")
            ),
        );
    }
    AppOptions {
        model: get("model").map(PathBuf::from),
        model_dirs: Vec::new(),
        gpu: GpuOptions {
            no_subgroups: flag("no_subgroups"),
            no_f16: flag("no_f16"),
            kernels,
            tuning,
            ..GpuOptions::default()
        },
        split: None,
        tune: crate::tune::TuneOptions::default(),
        settings,
        drive: prompt.is_some(),
        prompt,
        mmproj: get("mmproj").map(PathBuf::from),
        images: get("image").map_or(Vec::new(), |v| {
            v.split(',')
                .filter(|u| !u.is_empty())
                .map(PathBuf::from)
                .collect()
        }),
        raw: flag("raw"),
        screenshot: None,
        timeout: web_time::Duration::from_secs(
            get("timeout").and_then(|v| v.parse().ok()).unwrap_or(1800),
        ),
        window_size: [1280.0, 800.0],
        restore_chats: None,
    }
}
