//! Making an engine: the model file opened and checked, the GPU chosen (with the
//! kernels the tuner picked for it), the weights uploaded.

use super::{Engine, EngineError, EngineOptions};
use crate::gguf::GgufFile;
use crate::gpu::Gpu;
use crate::model::Model;
use crate::tokenizer::Tokenizer;
use std::sync::Arc;
use web_time::Instant;

/// What a load tells its caller as it goes: the weights uploaded, in bytes, and the
/// kernel measurement of a first use, which can take seconds on a slow device. A closure
/// over (done, total) bytes sees the upload only.
pub trait LoadProgress {
    /// `done` of `total` bytes of weights uploaded.
    fn upload(&mut self, done: u64, total: u64);
    /// Measuring kernels for `what` (adapter, backend, model) begins, for about
    /// `budget_secs` where it has a budget.
    fn tuning(&mut self, _what: &str, _budget_secs: Option<f64>) {}
    /// A candidate measured (`name`, its outcome).
    fn tuning_step(&mut self, _name: &str) {}
    /// The measurement ended.
    fn tuned(&mut self) {}
}

impl<F: FnMut(u64, u64)> LoadProgress for F {
    fn upload(&mut self, done: u64, total: u64) {
        self(done, total)
    }
}

/// The tuner's reports passed on to a load's progress, each candidate logged.
#[cfg(not(target_arch = "wasm32"))]
struct TuneToLoad<'a>(&'a mut dyn LoadProgress);

#[cfg(not(target_arch = "wasm32"))]
impl crate::tune::TuneReport for TuneToLoad<'_> {
    fn start(&mut self, what: &str, budget_secs: Option<f64>) {
        self.0.tuning(what, budget_secs)
    }
    fn candidate(&mut self, backend: &str, t: &crate::tune::CandidateTime) {
        log::debug!("tune {backend} {} {}: {}", t.kernels, t.name, t.outcome());
        self.0
            .tuning_step(&format!("{} {}: {}", t.kernels, t.name, t.outcome()))
    }
    fn done(&mut self, _secs: f64) {
        self.0.tuned()
    }
}

/// One log line for the kernels the tuner chose.
#[cfg(not(target_arch = "wasm32"))]
fn log_tuned(e: &crate::tune::TuneEntry, measured: bool, n_backends: usize) {
    let how = match (measured, e.first_use) {
        (true, true) => format!(
            "measured now, at first use: {} candidates left to `wgllm tune -m MODEL`, which may find faster ones",
            e.left
        ),
        (true, false) => "measured now".into(),
        (false, true) => "cached from a first use; `wgllm tune -m MODEL` measures every candidate".into(),
        (false, false) => "cached".into(),
    };
    log::info!(
        "kernels: {} on {} ({}; {}{} us per layer and decoded token, {:.1} per prompt token)",
        e.kernels,
        e.backend,
        how,
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
        progress: &mut dyn LoadProgress,
    ) -> Result<Engine, EngineError> {
        let start = Instant::now();
        let compiling = crate::gpu::compile_secs();
        // The file first: its errors are clearer than a GPU's.
        let (f, tokenizer) = Self::open_file(path)?;
        if let Some(split) = opts.split.as_ref().filter(|s| s.devices.len() > 1) {
            return Self::load_split(start, split, None, &f, tokenizer, opts, progress);
        }
        let tuning = Instant::now();
        let gpu = Gpu::new(&Self::tuned_gpu(&f, opts, progress)?)?;
        let tuning = tuning.elapsed().as_secs_f64();
        let tune_compiling = crate::gpu::compile_secs() - compiling;
        let e = Self::load_opened(start, gpu, &f, tokenizer, opts, &mut |done, total| {
            progress.upload(done, total)
        })?;
        // The model's own kernels compile when its first step's graph is built and run
        // (`context::run`), after the load.
        log::info!(
            "load time {:.2} s: choosing kernels {tuning:.2} s (compiling candidates {tune_compiling:.2} s of it), opening the file and uploading the weights {:.2} s",
            e.load_time.as_secs_f64(),
            e.load_time.as_secs_f64() - tuning,
        );
        Ok(e)
    }

    /// [`Engine::load`] over several adapters, the layers split by `split`: each adapter
    /// opened with its own kernel choices (the tuner keys on the adapter), each part
    /// checked against its device's memory where that is known, then uploaded. `given`:
    /// the main device, already opened by the caller (the app's window device); the
    /// others are opened here.
    #[cfg(not(target_arch = "wasm32"))]
    #[allow(clippy::too_many_arguments)]
    fn load_split(
        start: Instant,
        split: &super::SplitSpec,
        given: Option<Arc<Gpu>>,
        f: &GgufFile,
        tokenizer: Tokenizer,
        opts: &EngineOptions,
        progress: &mut dyn LoadProgress,
    ) -> Result<Engine, EngineError> {
        let hp = crate::model::Hparams::from_gguf(f)?;
        for (k, d) in split.devices.iter().enumerate() {
            if split.devices[..k].contains(d) {
                return Err(EngineError::Options(format!(
                    "adapter {d} is named twice: each part of a split goes to a different adapter"
                )));
            }
        }
        if split.main >= split.devices.len() {
            return Err(EngineError::Options(format!(
                "-mg {}: the main GPU indexes the {} adapters of the split",
                split.main,
                split.devices.len()
            )));
        }
        if !opts.lora.is_empty() {
            return Err(EngineError::Options(
                "LoRA adapters on a model split over devices are not built yet: each pair would have to live on its layer's device; run the model on one adapter".into(),
            ));
        }
        let layers =
            crate::gpu::layers_by_shares(split.devices.len(), &split.shares, hp.n_layer as usize)?;
        let need = split_bytes(f, &layers, split.main, split.devices.len());
        let mut gpus = Vec::new();
        for (k, &d) in split.devices.iter().enumerate() {
            let gpu = match &given {
                Some(g) if k == split.main => Self::tuned_device(g.clone(), f, opts)?,
                _ => {
                    let mut o = opts.clone();
                    o.gpu.adapter_index = Some(d);
                    Gpu::new(&Self::tuned_gpu(f, &o, progress)?)?
                }
            };
            if let Some(budget) = gpu.memory_budget {
                if need[k] > budget {
                    let runs: Vec<String> = (0..layers.len())
                        .filter(|&il| layers[il] == k)
                        .map(|il| il.to_string())
                        .collect();
                    return Err(EngineError::Options(format!(
                        "the split's part on adapter {d} ({}: layers {}{}) needs {} MiB of weights, over the {} MiB that device has; give it a smaller share with -ts, or add an adapter",
                        gpu.info.name,
                        if runs.is_empty() { "none".into() } else { runs.join(",") },
                        if k == split.main { ", the embeddings and the output head" } else { "" },
                        need[k] >> 20,
                        budget >> 20
                    )));
                }
            }
            gpus.push(gpu);
        }
        let placement = crate::gpu::Placement::new(gpus, split.main, layers)?;
        log::info!("split by layers: {}", placement.describe());
        let t = Instant::now();
        let mut model = Model::load_placed(placement, f, &mut |done, total| {
            progress.upload(done, total)
        })?;
        audit_devices(&mut model, f, opts)?;
        if let Ok(p) = opts.context_params(&model.hp) {
            model.hp.fit_context(p.n_ctx, p.n_seq_max);
        }
        log::info!(
            "loaded {} ({} layers, {:.1} MiB over {} devices) in {:.2} s",
            model.name,
            model.hp.n_layer,
            model.weights.gpu_bytes as f64 / (1 << 20) as f64,
            model.placement.gpus().len(),
            t.elapsed().as_secs_f64()
        );
        let mut e = Self::new(Arc::new(model), tokenizer, opts)?;
        e.load_time = start.elapsed();
        Ok(e)
    }

    /// The GPU options with what [`crate::tune`] chose for this model (measured at first
    /// use of the adapter, then cached).
    #[cfg(not(target_arch = "wasm32"))]
    pub(super) fn tuned_gpu(
        f: &GgufFile,
        opts: &EngineOptions,
        progress: &mut dyn LoadProgress,
    ) -> Result<crate::gpu::GpuOptions, EngineError> {
        let r = crate::tune::resolve(&opts.gpu, &opts.tune, f, &mut TuneToLoad(progress))?;
        if let Some(e) = r.entries.first() {
            log_tuned(e, r.measured, r.entries.len());
        }
        Ok(r.gpu)
    }

    /// [`Engine::load`] onto a GPU the caller opened or wrapped (the desktop app runs the
    /// model on the device its window draws with). With `opts.split` over several
    /// adapters, `gpu` is the main one (it must be adapter `devices[main]`) and the others
    /// are opened here.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load_file_on(
        gpu: Arc<Gpu>,
        path: &std::path::Path,
        opts: &EngineOptions,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Engine, EngineError> {
        let start = Instant::now();
        let (f, tokenizer) = Self::open_file(path)?;
        if let Some(split) = opts.split.as_ref().filter(|s| s.devices.len() > 1) {
            let mut upload = |done, total| progress(done, total);
            let g = Some(gpu);
            return Self::load_split(start, split, g, &f, tokenizer, opts, &mut upload);
        }
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

    /// Reads and uploads the `--lora` adapters for `model`, in order.
    fn load_adapters(model: &mut Model, opts: &EngineOptions) -> Result<(), EngineError> {
        // A page reads no adapter files (refused below).
        #[cfg(target_arch = "wasm32")]
        let _ = &model;
        for spec in &opts.lora {
            #[cfg(not(target_arch = "wasm32"))]
            {
                if !spec.path.exists() {
                    return Err(EngineError::MissingFile(spec.path.display().to_string()));
                }
                let f = GgufFile::open(&spec.path)?;
                let a = crate::model::lora::LoraAdapter::load(model, &f)?;
                log::info!(
                    "LoRA adapter {}: {} tensors adapted, alpha {}, scale {}{} ({:.1} MiB)",
                    a.path,
                    a.n_pairs(),
                    a.alpha,
                    spec.scale,
                    if opts.lora_init_without_apply {
                        ", not applied until set"
                    } else {
                        ""
                    },
                    a.gpu_bytes as f64 / (1 << 20) as f64
                );
                model.loras.push(Arc::new(a));
            }
            #[cfg(target_arch = "wasm32")]
            return Err(EngineError::Options(format!(
                "{}: LoRA adapters are loaded from files, which a page cannot open",
                spec.path.display()
            )));
        }
        Ok(())
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
        #[cfg(not(target_arch = "wasm32"))]
        audit_devices(&mut model, f, opts)?;
        if let Ok(p) = opts.context_params(&model.hp) {
            model.hp.fit_context(p.n_ctx, p.n_seq_max);
        }
        Self::load_adapters(&mut model, opts)?;
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

/// No kernel runs before it matched on its device (`tune::audit`): each device of the
/// model's placement is settled on its part (its layers' products and attention, and the
/// heads on the main one), and the model takes the devices as settled.
#[cfg(not(target_arch = "wasm32"))]
fn audit_devices(model: &mut Model, f: &GgufFile, opts: &EngineOptions) -> Result<(), EngineError> {
    use crate::tune::audit::{settle_part, Part};
    let audited = Instant::now();
    let placement = model.placement.clone();
    let mut gpus: Vec<Arc<Gpu>> = placement.gpus().to_vec();
    // The cache a context of these options would get, over every device as it stands
    // (a split model's cache types suit every device).
    let params = opts.context_params(&model.hp).ok();
    let (hd, n_embd_kv) = (model.hp.head_dim, model.hp.n_embd_kv());
    for d in 0..gpus.len() {
        let kv = |g: &Gpu| {
            let p = params.as_ref().filter(|_| model.hp.has_attention())?;
            let all: Vec<&Gpu> = (0..gpus.len())
                .map(|i| if i == d { g } else { &*gpus[i] })
                .collect();
            crate::memory::kv_choice(&p.kv, &all, hd, n_embd_kv).ok()
        };
        let part = Part::of(&placement, d);
        let settled = settle_part(
            gpus[d].clone(),
            &opts.gpu,
            f,
            &model.hp,
            &model.weights,
            &part,
            &kv,
        )?;
        gpus[d] = settled;
    }
    let same = (gpus.iter().zip(placement.gpus())).all(|(a, b)| Arc::ptr_eq(a, b));
    if !same {
        model.placement = Arc::new(placement.with_gpus(gpus)?);
        model.gpu = model.placement.main().clone();
    }
    log::info!("kernel audit {:.2} s", audited.elapsed().as_secs_f64());
    Ok(())
}

#[cfg(not(target_arch = "wasm32"))]
/// The bytes of `f`'s tensors each of `n_dev` devices takes when layer `il` goes to
/// device `layers[il]` and everything outside the layers to `main` (the file's sizes:
/// the GPU layouts are within a few percent of them).
fn split_bytes(f: &GgufFile, layers: &[usize], main: usize, n_dev: usize) -> Vec<u64> {
    let mut need = vec![0u64; n_dev];
    for t in &f.tensors {
        let layer = (t.name.strip_prefix("blk."))
            .and_then(|r| r.split('.').next())
            .and_then(|n| n.parse::<usize>().ok());
        let d = layer.and_then(|il| layers.get(il).copied()).unwrap_or(main);
        need[d] += t.n_bytes;
    }
    need
}
