//! Making an engine: the model file opened and checked, the GPU chosen (with the
//! kernels the tuner picked for it), the weights uploaded.

use super::{Engine, EngineError, EngineOptions};
use crate::gguf::GgufFile;
use crate::gpu::Gpu;
use crate::model::Model;
use crate::tokenizer::Tokenizer;
use std::sync::Arc;
use web_time::Instant;

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
    pub(super) fn tuned_gpu(
        f: &GgufFile,
        opts: &EngineOptions,
    ) -> Result<crate::gpu::GpuOptions, EngineError> {
        let r = crate::tune::resolve(&opts.gpu, &opts.tune, f, &mut |backend, t| {
            log::debug!("tune {backend} {} {}: {}", t.kernels, t.name, t.outcome())
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
    pub(super) fn tuned_device(
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
    pub(super) fn load_opened(
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
    pub(super) fn open_file(path: &std::path::Path) -> Result<(GgufFile, Tokenizer), EngineError> {
        if !path.exists() {
            return Err(EngineError::MissingFile(path.display().to_string()));
        }
        Self::check_file(GgufFile::open(path)?)
    }

    /// The checks of [`Engine::open_file`] on a parsed file, wherever its bytes are.
    pub(super) fn check_file(f: GgufFile) -> Result<(GgufFile, Tokenizer), EngineError> {
        // The architecture first: the clearest error comes first.
        let hp = crate::model::Hparams::from_gguf(&f)?;
        let mut tokenizer = Tokenizer::from_gguf(&f)?;
        if tokenizer.chat_template().is_none()
            && matches!(
                hp.arch,
                crate::model::Arch::Gemma2 | crate::model::Arch::Gemma3
            )
        {
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
}
