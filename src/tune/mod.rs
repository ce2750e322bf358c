//! Choosing kernels and backend by measurement. llama.cpp picks kernel shapes from fixed
//! per-vendor tables; wgpu reaches devices no table lists (a software rasterizer, a
//! phone, a browser) through several backends each. So at first use of an adapter with
//! a model shape, `--kernels auto` times the candidate kernel shapes on one layer of the
//! model itself ([`measure`]; at first use briefly, on a spread of the candidates of the
//! shape the adapter type suggests, on the first backend only), and `wgllm tune` times
//! every candidate on every backend that reaches the same device (lavapipe's Vulkan and
//! llvmpipe's GL are one CPU), keeping the fastest. The choice is cached on disk ([`cache`]) per adapter, driver, wgllm version
//! and model shape; `wgllm tune` measures again, `wgllm devices` lists what was chosen.
//! `WGLLM_*` kernel overrides still win over measured choices.

#[cfg(not(target_arch = "wasm32"))]
mod attn_run;
#[cfg(not(target_arch = "wasm32"))]
pub mod audit;
pub mod cache;
pub mod check;
pub mod measure;

/// Tokens of the timed prompt ubatch (and of the attention checked with it): enough for
/// the tiled kernels to run full tiles.
pub const PROMPT_TOKENS: u32 = 64;

pub use cache::{TuneCache, TuneEntry};
pub use check::KernelCheck;
pub use measure::{CandidateTime, ShapeChoice};

use crate::gguf::GgufFile;
use crate::gpu::{AdapterSummary, Backend, Gpu, GpuError, GpuOptions, KernelShape, KernelTuning};
use crate::model::Hparams;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use web_time::Instant;

/// When to measure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TuneMode {
    /// Use the cached choice; measure (and cache) where there is none.
    #[default]
    Cached,
    /// Measure again, replacing the cached choice (`wgllm tune`).
    Redo,
    /// The built-in choice by adapter type (`--no-tune`).
    Off,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TuneOptions {
    pub mode: TuneMode,
    /// Where the cache file lives; `None`: [`default_cache_dir`].
    pub cache_dir: Option<PathBuf>,
}

impl TuneOptions {
    pub fn dir(&self) -> Option<PathBuf> {
        self.cache_dir.clone().or_else(default_cache_dir)
    }
}

/// `$XDG_CACHE_HOME/wgllm`, else `~/.cache/wgllm`.
pub fn default_cache_dir() -> Option<PathBuf> {
    let xdg = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty());
    let base = xdg
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("wgllm"))
}

/// The device an adapter is, whatever the backend: its name up to a '/' (GL appends
/// "/PCIe/SSE2" and the like) and its type. Backends with the same id compete.
pub fn hardware_id(a: &AdapterSummary) -> String {
    let name = a.name.split('/').next().unwrap_or("").trim();
    format!("{name} ({})", a.device_type)
}

/// What the timed layer is: the architecture, the matrix sizes and the weight types
/// (`-` for a tensor the file does not have; Phi-3's fused `attn_qkv` stands in for
/// Q/K/V).
pub fn model_id(hp: &Hparams, f: &GgufFile) -> String {
    let types: Vec<String> = [
        "attn_qkv",
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_output",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
    ]
    .iter()
    .map(|name| {
        f.tensor(&format!("blk.0.{name}.weight"))
            .map_or_else(|| "-".into(), |t| t.ty.to_string())
    })
    .collect();
    format!(
        "{:?} {}x{} q{}/kv{} {}",
        hp.arch,
        hp.n_embd,
        hp.n_ff,
        hp.n_embd_q(),
        hp.n_embd_kv(),
        types.join("/")
    )
    .to_lowercase()
}

/// One adapter the tuner may choose: its backend and index among that backend's adapters.
#[derive(Clone, Debug)]
struct Candidate {
    backend: Backend,
    // Read only where devices are opened by index (native targets).
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    index: usize,
    info: AdapterSummary,
}

fn backend_of(a: &AdapterSummary) -> Option<Backend> {
    a.backend.parse().ok()
}

/// The adapters to compare: the one the options name, or with `--backend auto` the
/// default adapter and every other backend's view of the same device (the default first:
/// it wins ties).
#[cfg(not(target_arch = "wasm32"))]
fn candidates(opts: &GpuOptions) -> Result<Vec<Candidate>, GpuError> {
    // Each backend's own list, so that an index is what `--device` means there.
    let listed = |b: Backend| -> Vec<Candidate> {
        crate::gpu::list_adapters(b)
            .into_iter()
            .map(|info| Candidate {
                backend: b,
                index: info.index,
                info,
            })
            .collect()
    };
    // The adapter the options name, without opening a device for it.
    let opened = crate::gpu::adapter_summary(opts)?;
    let same = |c: &Candidate| c.info.name == opened.name && c.info.driver == opened.driver;
    let auto = opts.backend == Backend::Auto && opts.adapter_index.is_none();
    let mut out = Vec::new();
    for b in [Backend::Vulkan, Backend::Metal, Backend::Dx12, Backend::Gl] {
        let this = backend_of(&opened) == Some(b);
        // `--backend auto` honours WGPU_BACKEND, as opening does.
        if !Backend::Auto.backends().contains(b.backends()) || !(auto || this) {
            continue;
        }
        let found = listed(b).into_iter().find(|c| {
            if this {
                same(c)
            } else {
                hardware_id(&c.info) == hardware_id(&opened)
            }
        });
        out.extend(found);
    }
    out.sort_by_key(|c| !same(c));
    if out.is_empty() {
        return Err(GpuError::Validation(format!(
            "tuning: {} is not among the adapters wgpu lists",
            opened.name
        )));
    }
    Ok(out)
}

/// The key part of an entry for an adapter and model.
fn entry_for(
    c: &Candidate,
    model: &str,
    best: &ShapeChoice,
    checks: Vec<KernelCheck>,
) -> TuneEntry {
    TuneEntry {
        hardware: hardware_id(&c.info),
        adapter: c.info.name.clone(),
        backend: c.backend.to_string(),
        driver: c.info.driver.clone(),
        model: model.to_string(),
        wgllm: format!(
            "{} kernels {:016x} tuner {TUNER_REVISION}",
            env!("CARGO_PKG_VERSION"),
            crate::ops::kernels::fingerprint()
        ),
        kernels: best.kernels.to_string(),
        cpu_decode_tile: best.tuning.cpu_decode_tile,
        cpu_prompt_tile: best.tuning.cpu_prompt_tile,
        gpu_vec_rows: best.tuning.gpu_vec_rows,
        gpu_tile: best.tuning.gpu_tile,
        decode_us: best.decode_us,
        prompt_us: best.prompt_us,
        draw_gpu_busy_us: None,
        draw_host_us: None,
        int_dot_decode: best.tuning.int_dot_decode,
        int_dot_prompt: best.tuning.int_dot_prompt,
        coop_matrix: best.tuning.coop_matrix,
        checks,
        first_use: false,
        left: 0,
    }
}

/// What the tuner measures and checks, as part of a cache entry's key: entries of an
/// earlier revision are measured again (2: integer-dot candidates, and every candidate
/// checked on the device).
const TUNER_REVISION: u32 = 2;

/// What a measurement tells its caller as it goes, for progress: a first use's wait
/// shown on a terminal, `wgllm tune`'s table. A closure over (backend, candidate) sees
/// the candidates only.
pub trait TuneReport {
    /// Measuring `what` (adapter, backend and model) begins, for about `budget_secs`
    /// where it has a budget.
    fn start(&mut self, _what: &str, _budget_secs: Option<f64>) {}
    /// A candidate checked and timed (or dropped) on `backend`.
    fn candidate(&mut self, backend: &str, t: &CandidateTime);
    /// The measurement of one adapter ended after `secs`.
    fn done(&mut self, _secs: f64) {}
}

impl<F: FnMut(&str, &CandidateTime)> TuneReport for F {
    fn candidate(&mut self, backend: &str, t: &CandidateTime) {
        self(backend, t)
    }
}

/// What [`resolve`] decided, for the caller to report.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// The options to open the GPU with.
    pub gpu: GpuOptions,
    /// The entry per compared adapter, the chosen one first.
    pub entries: Vec<TuneEntry>,
    /// Whether anything was measured (else every entry came from the cache).
    pub measured: bool,
}

/// How much faster another backend must be to be chosen over the default one: switching
/// can cost features the timed layer does not show (GL has no shader-f16 for the cache).
pub const BACKEND_MARGIN: f64 = 0.05;

/// The model's key and the cache, for one resolution.
struct Tuner<'a> {
    f: &'a GgufFile,
    hp: Hparams,
    model: String,
    mode: TuneMode,
    dir: Option<PathBuf>,
    cache: TuneCache,
    measured: bool,
    /// The user's `WGLLM_INT_DOT` (see `measure::measure`).
    user_int_dot: Option<bool>,
}

impl<'a> Tuner<'a> {
    fn new(
        f: &'a GgufFile,
        topts: &TuneOptions,
        user_int_dot: Option<bool>,
    ) -> Result<Self, GpuError> {
        let hp = Hparams::from_gguf(f).map_err(|e| GpuError::Validation(e.to_string()))?;
        let dir = topts.dir();
        Ok(Tuner {
            model: model_id(&hp, f),
            hp,
            f,
            mode: topts.mode,
            cache: dir.as_deref().map(TuneCache::load).unwrap_or_default(),
            dir,
            measured: false,
            user_int_dot,
        })
    }

    /// The cached entry for an adapter (in `Cached` mode).
    fn cached(&self, c: &Candidate) -> Option<TuneEntry> {
        let key = entry_for(c, &self.model, &ShapeChoice::placeholder(), Vec::new());
        self.cache.find(&key).cloned()
    }

    /// The cached entry for an adapter, or one measured on the device `open` gives (on
    /// kernel shape `only` where given, else on both).
    fn entry(
        &mut self,
        c: &Candidate,
        only: Option<KernelShape>,
        open: impl FnOnce() -> Result<Arc<Gpu>, GpuError>,
        report: &mut dyn TuneReport,
    ) -> Result<TuneEntry, GpuError> {
        if self.mode == TuneMode::Cached {
            if let Some(e) = self.cached(c) {
                return Ok(e);
            }
        }
        let effort = match self.mode {
            TuneMode::Cached => measure::Effort::FIRST_USE,
            _ => measure::Effort::FULL,
        };
        let what = format!("{} on {} ({})", c.info.name, c.backend, self.model);
        match effort.budget_secs {
            Some(secs) => log::info!(
                "tuning kernels for {what}: first use, about {secs:.0} s of measuring (`wgllm tune -m MODEL` measures every candidate)"
            ),
            None => log::info!("tuning kernels for {what}"),
        }
        report.start(&what, effort.budget_secs);
        let start = Instant::now();
        let gpu = open()?;
        let backend = c.backend.to_string();
        let user_int_dot = self.user_int_dot;
        let shapes = measure::measure(
            &gpu,
            self.f,
            &self.hp,
            only,
            effort,
            start,
            user_int_dot,
            &mut |t| report.candidate(&backend, t),
        )?;
        let best = shapes
            .iter()
            .min_by(|a, b| a.score().total_cmp(&b.score()))
            .expect("a shape measured");
        let checks = shapes.iter().flat_map(|s| s.checks.clone()).collect();
        let mut e = entry_for(c, &self.model, best, checks);
        e.first_use = effort.budget_secs.is_some();
        e.left = shapes.iter().map(|s| s.left).sum();
        // Where a token is cheaper picked, with the kernels just chosen; not at a first
        // use (compiling the sampling kernels alone took lavapipe 8 s on a cold driver
        // cache): without a time, `--sampling auto` takes the adapter type's default.
        #[cfg(not(target_arch = "wasm32"))]
        if effort.budget_secs.is_some() {
            log::debug!("tune: drawing on the GPU not timed at first use");
            e.left += 1;
        } else {
            let g = gpu.retuned(best.kernels, best.tuning.clone());
            match measure::measure_draws(&g, self.hp.n_vocab, effort) {
                Ok(t) => {
                    log::debug!(
                        "tune: a draw's empty round trip {:.0} us, GPU busy {:.0} us, host {:.0} us",
                        t.trip_us,
                        t.gpu_us,
                        t.host_us
                    );
                    (e.draw_gpu_busy_us, e.draw_host_us) = (Some(t.gpu_us), Some(t.host_us))
                }
                Err(err) => log::debug!("tune: drawing on the GPU not measured: {err}"),
            }
        }
        report.done(start.elapsed().as_secs_f64());
        self.cache.put(e.clone());
        self.measured = true;
        Ok(e)
    }

    /// Writes the cache if anything was measured; a cache that cannot be written costs
    /// only a measurement next time.
    fn save(&self) {
        if let (true, Some(dir)) = (self.measured, &self.dir) {
            if let Err(e) = self.cache.save(dir) {
                log::warn!(
                    "could not write the tuning cache in {}: {e} (the choice holds for this run only)",
                    dir.display()
                );
            }
        }
    }
}

/// The kernel shape and tuned fields of an entry, under the user's `WGLLM_*` overrides.
fn entry_kernels(
    e: &TuneEntry,
    user: &KernelTuning,
) -> Result<(KernelShape, KernelTuning), GpuError> {
    let kernels = e.kernels.parse().map_err(GpuError::Validation)?;
    let tuned = KernelTuning {
        cpu_decode_tile: e.cpu_decode_tile,
        cpu_prompt_tile: e.cpu_prompt_tile,
        gpu_vec_rows: e.gpu_vec_rows,
        gpu_tile: e.gpu_tile,
        gpu_draws: e.gpu_draws(),
        int_dot_decode: e.int_dot_decode,
        int_dot_prompt: e.int_dot_prompt,
        coop_matrix: e.coop_matrix,
        ..Default::default()
    };
    let mut tuning = user.over(&tuned);
    // A kernel that failed its check on this device is not used, even when asked for.
    if refused(e, KernelCheck::is_int_dot, tuning.int_dot, "WGLLM_INT_DOT") {
        (tuning.int_dot, tuning.int_dot_decode, tuning.int_dot_prompt) =
            (Some(false), Some(false), Some(false));
    }
    if refused(
        e,
        KernelCheck::is_coop,
        tuning.coop_matrix,
        "WGLLM_COOP_MATRIX",
    ) {
        tuning.coop_matrix = Some(false);
    }
    tuning
        .validate()
        .map_err(|err| GpuError::Validation(format!("tuned kernels: {err}")))?;
    Ok((kernels, tuning))
}

/// Whether a kernel family (`of`) failed its check in entry `e`; the user asking for it
/// (`asked`, from `var`) is told it is not followed.
fn refused(e: &TuneEntry, of: fn(&KernelCheck) -> bool, asked: Option<bool>, var: &str) -> bool {
    let Some(c) = e.dropped().find(|c| of(c)) else {
        return false;
    };
    if asked == Some(true) {
        log::warn!(
            "{var}=1 not followed on {}: the {} kernels differ from the portable ones there (normalized error {:.1e}, bound {:.0e}); the float kernels run",
            e.adapter,
            c.name,
            c.nmse,
            c.bound
        );
    }
    true
}

/// The GPU options with `kernels auto` (and `backend auto`) decided by measurement (see
/// the module doc). Options that leave nothing to choose come back as they are.
/// `report` sees each measurement start and every candidate measured (with the adapter's
/// backend), for progress.
#[cfg(not(target_arch = "wasm32"))]
pub fn resolve(
    opts: &GpuOptions,
    topts: &TuneOptions,
    f: &GgufFile,
    report: &mut dyn TuneReport,
) -> Result<Resolved, GpuError> {
    if topts.mode == TuneMode::Off || opts.kernels != KernelShape::Auto || !tunable(f) {
        return Ok(Resolved {
            gpu: opts.clone(),
            entries: Vec::new(),
            measured: false,
        });
    }
    let mut tuner = Tuner::new(f, topts, opts.tuning.int_dot)?;
    let adapters = candidates(opts)?;
    let mut entries = Vec::new();
    // Which adapter each entry is for.
    let mut of_adapter = Vec::new();
    let mut not_compared = Vec::new();
    for (i, c) in adapters.iter().enumerate() {
        let mut plain = opts.clone();
        plain.backend = c.backend;
        plain.adapter_index = Some(c.index);
        plain.tuning = KernelTuning::default();
        // At first use only the first backend is timed (on a fresh machine its shader
        // compiles are most of the load); another backend reaching the same device
        // competes once `wgllm tune` has measured it.
        if i > 0 && topts.mode == TuneMode::Cached {
            match tuner.cached(c) {
                Some(e) => {
                    entries.push(e);
                    of_adapter.push(i);
                }
                None => not_compared.push(c.backend.to_string()),
            }
            continue;
        }
        // Another backend's view of the device (`wgllm tune`) is timed on the kernel
        // shape the first one chose: lavapipe's GL and Vulkan agree on the shape, and
        // the other's candidates would double the measurement.
        let first_shape = entries
            .first()
            .and_then(|e| entry_kernels(e, &KernelTuning::default()).ok())
            .map(|(shape, _)| shape);
        entries.push(tuner.entry(c, first_shape, || Gpu::new(&plain), report)?);
        of_adapter.push(i);
    }
    if tuner.measured && !not_compared.is_empty() {
        log::info!(
            "kernels measured on {} only at first use; `wgllm tune -m MODEL` also times {} on this device",
            adapters[0].backend,
            not_compared.join(", ")
        );
    }
    tuner.save();
    let chosen = choose(&entries);
    let (kernels, tuning) = entry_kernels(&entries[chosen], &opts.tuning)?;
    entries.swap(0, chosen);
    let chosen = of_adapter[chosen];
    let mut gpu = opts.clone();
    gpu.backend = adapters[chosen].backend;
    gpu.adapter_index = Some(adapters[chosen].index);
    gpu.kernels = kernels;
    gpu.tuning = tuning;
    Ok(Resolved {
        gpu,
        entries,
        measured: tuner.measured,
    })
}

/// `wgllm tune --check`: every candidate kernel checked against the portable ones on the
/// device `opts` opens, on layer 0 of the model in `f`, none timed and nothing cached.
/// `report` sees each check (with the adapter's backend).
#[cfg(not(target_arch = "wasm32"))]
pub fn check_only(
    opts: &GpuOptions,
    f: &GgufFile,
    report: &mut dyn FnMut(&str, &CandidateTime),
) -> Result<Vec<KernelCheck>, GpuError> {
    let hp = Hparams::from_gguf(f).map_err(|e| GpuError::Validation(e.to_string()))?;
    if !hp.has_decoder_layer() {
        return Err(GpuError::Validation(
            "kernel checks run a decoder's attention layer, which this model has none of".into(),
        ));
    }
    let mut plain = opts.clone();
    plain.tuning = KernelTuning::default();
    let gpu = Gpu::new(&plain)?;
    let backend = gpu.info.backend.to_lowercase();
    measure::check_all(&gpu, f, &hp, &mut |t| report(&backend, t))
}

/// What [`retune_device`] made of a device.
pub struct Retuned {
    /// The device with the tuned kernel choice (or as it was).
    pub gpu: Arc<Gpu>,
    /// The choice, where tuning applied.
    pub entry: Option<TuneEntry>,
    /// Whether it was measured now (else cached).
    pub measured: bool,
}

/// For a device the caller opened (the desktop app's window device): the same device
/// with the kernel choice cached for its adapter and this model, measured on it at first
/// use. `opts` are the options it was opened with: a fixed `--kernels` or `--no-tune`
/// leaves it as it is.
pub fn retune_device(
    gpu: &Arc<Gpu>,
    opts: &GpuOptions,
    topts: &TuneOptions,
    f: &GgufFile,
) -> Result<Retuned, GpuError> {
    let unchanged = || Retuned {
        gpu: gpu.clone(),
        entry: None,
        measured: false,
    };
    if topts.mode == TuneMode::Off || opts.kernels != KernelShape::Auto || !tunable(f) {
        return Ok(unchanged());
    }
    let Some(backend) = backend_of(&gpu.info) else {
        return Ok(unchanged());
    };
    let c = Candidate {
        backend,
        index: gpu.info.index,
        info: gpu.info.clone(),
    };
    let mut tuner = Tuner::new(f, topts, gpu.tuning.int_dot)?;
    let e = tuner.entry(
        &c,
        None,
        || Ok(gpu.clone()),
        &mut |_: &str, _: &CandidateTime| {},
    )?;
    tuner.save();
    let (kernels, tuning) = entry_kernels(&e, &gpu.tuning)?;
    Ok(Retuned {
        gpu: gpu.retuned(kernels, tuning),
        entry: Some(e),
        measured: tuner.measured,
    })
}

/// Whether the tuner can time this model: it measures a decoder's attention layer with
/// its gated feed-forward, which a state-space model (Mamba, Mamba-2) and an encoder
/// (BERT: biased projections, an ungated feed-forward) do not have; those keep the
/// adapter's default kernels.
fn tunable(f: &GgufFile) -> bool {
    let ok = Hparams::from_gguf(f).map_or(true, |hp| hp.has_decoder_layer());
    if !ok {
        log::info!("kernel tuning times a decoder's attention layer, which this model has none of: the adapter's default kernels");
    }
    ok
}

/// The entry to use: the first (the default adapter) unless another scores better by
/// more than [`BACKEND_MARGIN`].
pub fn choose(entries: &[TuneEntry]) -> usize {
    let mut best = 0;
    for (i, e) in entries.iter().enumerate().skip(1) {
        if e.score() < entries[best].score() * (1.0 - BACKEND_MARGIN) {
            best = i;
        }
    }
    best
}

impl ShapeChoice {
    /// A choice with no times, for building cache keys.
    fn placeholder() -> ShapeChoice {
        ShapeChoice {
            kernels: KernelShape::Auto,
            tuning: KernelTuning::default(),
            decode_us: 0.0,
            prompt_us: 0.0,
            checks: Vec::new(),
            left: 0,
        }
    }
}

/// The cached entries in the cache directory of `topts`, for `wgllm devices`.
pub fn cached_entries(topts: &TuneOptions) -> (Option<PathBuf>, Vec<TuneEntry>) {
    let dir = topts.dir();
    let entries = dir
        .as_deref()
        .map(|d: &Path| TuneCache::load(d).entries)
        .unwrap_or_default();
    (dir.map(|d| TuneCache::file(&d)), entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_backend_must_be_clearly_faster() {
        let e = |backend: &str, decode_us: f64| TuneEntry {
            hardware: "h".into(),
            adapter: "a".into(),
            backend: backend.into(),
            driver: "d".into(),
            model: "m".into(),
            wgllm: "v".into(),
            kernels: "cpu".into(),
            cpu_decode_tile: None,
            cpu_prompt_tile: None,
            gpu_vec_rows: None,
            gpu_tile: None,
            decode_us,
            prompt_us: 0.0,
            draw_gpu_busy_us: None,
            draw_host_us: None,
            int_dot_decode: None,
            int_dot_prompt: None,
            coop_matrix: None,
            checks: Vec::new(),
            first_use: false,
            left: 0,
        };
        assert_eq!(choose(&[e("vulkan", 100.0), e("gl", 97.0)]), 0);
        assert_eq!(choose(&[e("vulkan", 100.0), e("gl", 90.0)]), 1);
        assert_eq!(choose(&[e("vulkan", 100.0)]), 0);
        // `--sampling auto` follows the measured draw, unless nothing was measured.
        let mut m = e("vulkan", 100.0);
        let draws = |m: &TuneEntry| {
            entry_kernels(m, &KernelTuning::default())
                .unwrap()
                .1
                .gpu_draws
        };
        assert_eq!(draws(&m), None);
        (m.draw_gpu_busy_us, m.draw_host_us) = (Some(40.0), Some(250.0));
        assert_eq!(draws(&m), Some(true));
        (m.draw_gpu_busy_us, m.draw_host_us) = (Some(2600.0), Some(220.0));
        assert_eq!(draws(&m), Some(false));

        // The integer-dot choice follows the measurement, under WGLLM_INT_DOT, unless the
        // kernels failed their check on the device: then not even WGLLM_INT_DOT=1 runs them.
        let forced = KernelTuning {
            int_dot: Some(true),
            ..Default::default()
        };
        let int_dot = |m: &TuneEntry, user: &KernelTuning| {
            let t = entry_kernels(m, user).unwrap().1;
            (t.int_dot_for_tokens(1), t.int_dot_for_tokens(64))
        };
        (m.int_dot_decode, m.int_dot_prompt) = (Some(true), Some(false));
        assert_eq!(int_dot(&m, &KernelTuning::default()), (true, false));
        assert_eq!(int_dot(&m, &forced), (true, true));
        m.checks.push(KernelCheck {
            name: "gpu prompt int-dot".into(),
            nmse: 0.05,
            bound: check::INT_DOT_BOUND,
        });
        assert_eq!(int_dot(&m, &KernelTuning::default()), (false, false));
        assert_eq!(int_dot(&m, &forced), (false, false));
    }

    #[test]
    fn hardware_ignores_what_gl_appends() {
        let a = |name: &str, backend: &str| AdapterSummary {
            index: 0,
            name: name.into(),
            backend: backend.into(),
            device_type: "DiscreteGpu".into(),
            vendor: 0,
            driver: String::new(),
            max_storage_binding: 0,
            max_buffer: 0,
            max_workgroup_storage: 0,
            shader_f16: false,
            subgroups: false,
            subgroup_size: (0, 0),
            cooperative_matrices: Vec::new(),
        };
        assert_eq!(
            hardware_id(&a("NVIDIA H100 80GB HBM3", "Vulkan")),
            hardware_id(&a("NVIDIA H100 80GB HBM3/PCIe/SSE2", "Gl"))
        );
    }
}
