//! Choosing an adapter and opening a device with the adapter's own limits.

use super::pipeline::PipelineCache;
use super::GpuError;
use super::KernelTuning;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Which wgpu backend to use (`--backend`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Backend {
    #[default]
    Auto,
    Vulkan,
    Metal,
    Dx12,
    Gl,
}

impl Backend {
    /// The wgpu backends this choice enables (for hosts that create the instance).
    pub fn backends(self) -> wgpu::Backends {
        match self {
            // WGPU_BACKEND, when set, narrows `auto` (the GL test run uses it).
            Backend::Auto => wgpu::Backends::from_env().unwrap_or(wgpu::Backends::all()),
            Backend::Vulkan => wgpu::Backends::VULKAN,
            Backend::Metal => wgpu::Backends::METAL,
            Backend::Dx12 => wgpu::Backends::DX12,
            Backend::Gl => wgpu::Backends::GL,
        }
    }
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "auto" => Backend::Auto,
            "vulkan" | "vk" => Backend::Vulkan,
            "metal" | "mtl" => Backend::Metal,
            "dx12" | "d3d12" => Backend::Dx12,
            "gl" | "gles" | "opengl" => Backend::Gl,
            other => {
                return Err(format!(
                    "unknown backend `{other}` (choose auto, vulkan, metal, dx12 or gl)"
                ))
            }
        })
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Auto => "auto",
            Backend::Vulkan => "vulkan",
            Backend::Metal => "metal",
            Backend::Dx12 => "dx12",
            Backend::Gl => "gl",
        })
    }
}

/// Which kernel shapes to use: row-per-invocation loops for CPU-like adapters (lavapipe,
/// llvmpipe), tiled prompt matmuls and multi-row reductions for GPUs. `Auto` picks by adapter type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub enum KernelShape {
    #[default]
    Auto,
    Cpu,
    Gpu,
}

impl std::str::FromStr for KernelShape {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "auto" => KernelShape::Auto,
            "cpu" => KernelShape::Cpu,
            "gpu" => KernelShape::Gpu,
            other => {
                return Err(format!(
                    "unknown kernel shape `{other}` (choose auto, cpu or gpu)"
                ))
            }
        })
    }
}

impl fmt::Display for KernelShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KernelShape::Auto => "auto",
            KernelShape::Cpu => "cpu",
            KernelShape::Gpu => "gpu",
        })
    }
}

/// How to open the GPU. `no_f16` / `no_subgroups` force the portable paths even where the
/// adapter has the features, so tests cover both.
#[derive(Clone, Debug, Default)]
pub struct GpuOptions {
    pub backend: Backend,
    /// Index into the adapters of `backend`, as listed by `wgllm devices`.
    pub adapter_index: Option<usize>,
    pub no_f16: bool,
    pub no_subgroups: bool,
    /// Pretend the storage binding limit is this small (tests the tensor-splitting path).
    pub max_binding_override: Option<u64>,
    pub kernels: KernelShape,
    /// Overrides of kernel choices, for measuring (checked by `Gpu::new`).
    pub tuning: KernelTuning,
    /// Compile the kernels with wgpu's injected runtime checks (index clamping, loop
    /// counters, guarded division): for debugging a kernel. Off by default, as in
    /// llama.cpp's and every native runtime's shaders: the kernels are ours, each variant
    /// validated offline, their loops bounded, their divisors and buffer sizes checked on
    /// the host, and buffer accesses stay within bindings wherever the driver enforces
    /// robust access (wgpu asks for it). The checks cost lavapipe a third of its prompt
    /// speed (SmolLM2 pp64 51 against 75 t/s).
    pub shader_checks: bool,
    /// A fault to inject once the model is loaded (tests; `WGLLM_FAULT` where `None`).
    pub fault: Option<super::Fault>,
    /// Refuse buffers past this many bytes created on the device, as if its memory ended
    /// there: a test-only limit (wgpu reports no device's memory size), so that a model
    /// too big for one device can be shown to run split over two.
    pub memory_budget: Option<u64>,
}

/// One line of `wgllm devices`.
#[derive(Clone, Debug)]
pub struct AdapterSummary {
    pub index: usize,
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    pub max_storage_binding: u64,
    pub max_buffer: u64,
    pub max_workgroup_storage: u32,
    pub shader_f16: bool,
    pub subgroups: bool,
    pub subgroup_size: (u32, u32),
    /// The cooperative-matrix shapes the adapter offers through wgpu (`MxNxK a->c`), empty
    /// where it offers none: what a matrix-unit kernel could use there.
    pub cooperative_matrices: Vec<String>,
    /// The PCI vendor id (0x1002 AMD, 0x10de NVIDIA, 0x8086 Intel), 0 where unknown.
    pub vendor: u32,
}

impl AdapterSummary {
    /// Whether the adapter is one of AMD's compute chips (CDNA: Instinct MI100 to MI300;
    /// RADV names them GFX908 to GFX942), whose compiler gives the widest kernels far
    /// fewer waves than RDNA's (`docs/kernel-stats/`).
    pub fn is_amd_cdna(&self) -> bool {
        let name = self.name.to_ascii_uppercase();
        self.vendor == 0x1002
            && (name.contains("INSTINCT")
                || ["GFX908", "GFX90A", "GFX94"]
                    .iter()
                    .any(|g| name.contains(g)))
    }

    /// Whether the adapter is the host's own cores (lavapipe, llvmpipe, SwiftShader): it
    /// takes CPU-shaped kernels, and whatever else it draws competes with the model.
    pub fn runs_on_cpu(&self) -> bool {
        self.device_type == "Cpu" || self.name.contains("llvmpipe")
    }

    /// Whether the adapter's shader compiler keeps a kernel's loops as written, so that
    /// kernels run faster with their short loops unrolled in the source (`gpu::unroll`):
    /// SwiftShader, as its own Vulkan driver and as the CPU adapter of Chromium's WebGPU
    /// (which names no device to a page). Mesa's LLVM unrolls by itself, and its
    /// prompts ran slower unrolled again.
    pub fn keeps_loops(&self) -> bool {
        self.name.contains("SwiftShader")
            || (self.backend == "BrowserWebGpu" && self.device_type == "Cpu")
    }

    /// Whether the driver compiles a kernel again for each set of values its uniforms
    /// take in branch and loop conditions, and keeps every variant for the pipeline's
    /// life: lavapipe (Mesa's Vulkan on llvmpipe) does, so a server's memory grew with
    /// every new value a kernel's parameters took. Kernels there read their parameters
    /// from storage ([`super::params_in_storage`]), which it does not
    /// specialize on.
    pub fn specializes_on_uniforms(&self) -> bool {
        self.backend == "Vulkan" && self.name.contains("llvmpipe")
    }
}

fn instance(backend: Backend) -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    desc.backends = backend.backends();
    // No kernel is dispatched indirectly, so wgpu's validation of indirect dispatches
    // has nothing to check; its internal pipeline, made with every device, is one that
    // vkd3d (D3D12 under Wine) cannot create, which would fail the whole device there.
    desc.flags
        .remove(wgpu::InstanceFlags::VALIDATION_INDIRECT_CALL);
    wgpu::Instance::new(desc)
}

fn summarize(index: usize, a: &wgpu::Adapter) -> AdapterSummary {
    let info = a.get_info();
    let limits = a.limits();
    let features = a.features();
    AdapterSummary {
        index,
        name: info.name,
        backend: format!("{:?}", info.backend),
        device_type: format!("{:?}", info.device_type),
        driver: format!("{} {}", info.driver, info.driver_info)
            .trim()
            .to_string(),
        max_storage_binding: limits.max_storage_buffer_binding_size,
        max_buffer: limits.max_buffer_size,
        max_workgroup_storage: limits.max_compute_workgroup_storage_size,
        shader_f16: features.contains(wgpu::Features::SHADER_F16),
        subgroups: features.contains(wgpu::Features::SUBGROUP),
        subgroup_size: (info.subgroup_min_size, info.subgroup_max_size),
        vendor: info.vendor,
        cooperative_matrices: if features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
        {
            a.cooperative_matrix_properties()
                .iter()
                .map(|p| {
                    format!(
                        "{}x{}x{} {:?}->{:?}{}",
                        p.m_size,
                        p.n_size,
                        p.k_size,
                        p.ab_type,
                        p.cr_type,
                        if p.saturating_accumulation {
                            " (saturating)"
                        } else {
                            ""
                        }
                    )
                    .to_lowercase()
                })
                .collect()
        } else {
            Vec::new()
        },
    }
}

/// Every adapter the backend choice reaches, in the order `--device` indexes them.
#[cfg(not(target_arch = "wasm32"))]
pub fn list_adapters(backend: Backend) -> Vec<AdapterSummary> {
    let inst = instance(backend);
    let adapters = pollster::block_on(inst.enumerate_adapters(backend.backends()));
    adapters
        .iter()
        .enumerate()
        .map(|(i, a)| summarize(i, a))
        .collect()
}

/// The adapter `opts` name: `--device N` of the backend's list, or the backend's
/// high-performance default. No device is opened.
async fn pick_adapter(opts: &GpuOptions) -> Result<wgpu::Adapter, GpuError> {
    let inst = instance(opts.backend);
    let adapters = inst.enumerate_adapters(opts.backend.backends()).await;
    let count = adapters.len();
    Ok(match opts.adapter_index {
        Some(index) => adapters
            .into_iter()
            .nth(index)
            .ok_or(GpuError::BadAdapterIndex { index, count })?,
        None => {
            let req = wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                force_fallback_adapter: false,
                compatible_surface: None,
                apply_limit_buckets: false,
            };
            match inst.request_adapter(&req).await {
                Ok(a) => a,
                Err(_) => {
                    let all = instance(Backend::Auto);
                    let others = all.enumerate_adapters(wgpu::Backends::all()).await;
                    let available = if others.is_empty() {
                        " (no adapters on any backend)".to_string()
                    } else {
                        let names: Vec<String> = others
                            .iter()
                            .map(|a| {
                                let i = a.get_info();
                                format!("{} on {:?}", i.name, i.backend)
                            })
                            .collect();
                        format!(" (available: {})", names.join(", "))
                    };
                    return Err(GpuError::NoAdapter {
                        backend: opts.backend.to_string(),
                        available,
                    });
                }
            }
        }
    })
}

/// What [`Gpu::new`] would open for `opts`, without opening a device (the tuner asks
/// which adapter the options name).
#[cfg(not(target_arch = "wasm32"))]
pub fn adapter_summary(opts: &GpuOptions) -> Result<AdapterSummary, GpuError> {
    let a = pollster::block_on(pick_adapter(opts))?;
    Ok(summarize(opts.adapter_index.unwrap_or(0), &a))
}

/// An open device with its capabilities. Cheap to share (`Arc`).
pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: AdapterSummary,
    /// Largest storage binding we may use: the adapter's, or a smaller test override.
    pub max_binding: u64,
    pub has_f16: bool,
    pub has_subgroups: bool,
    /// The side S of the S x S x S f16 (f32 accumulated) cooperative matrices the
    /// cooperative-matrix matmul can use on this device ([`coop_size`]), if any.
    pub coop_size: Option<u32>,
    pub is_cpu: bool,
    /// Resolved kernel shape (never `Auto`).
    pub kernels: KernelShape,
    /// Kernels' short constant-bounded loops are written out before compiling (where the
    /// adapter [keeps loops](AdapterSummary::keeps_loops), or `WGLLM_UNROLL=1`); the same
    /// for every kernel of the device, so pipelines are cached by key alone.
    pub unroll: bool,
    /// Kernels bind their parameters as read-only storage, not as a uniform buffer (where
    /// the driver [specializes on uniforms](AdapterSummary::specializes_on_uniforms), or
    /// `WGLLM_PARAMS_STORAGE=1`); the same for every kernel of the device.
    pub params_in_storage: bool,
    /// The kernel overrides the ops apply (a copy of [`GpuOptions::tuning`]).
    pub tuning: KernelTuning,
    /// Kernels are compiled with wgpu's runtime checks ([`GpuOptions::shader_checks`]).
    pub shader_checks: bool,
    /// The device can write timestamps at compute pass boundaries (`--profile` times
    /// each dispatch on the GPU rather than from the host).
    pub has_timestamps: bool,
    /// Bytes of storage and uniform buffers created through this `Gpu` (never
    /// decreases: wgpu frees a buffer when its last handle drops, which we do not see).
    /// Benchmarks report it as the memory a model and its context took.
    allocated: AtomicU64,
    /// Shared with the [`Gpu::retuned`] views of the same device.
    pub(super) pipelines: Arc<Mutex<PipelineCache>>,
    errors: Arc<Mutex<Vec<String>>>,
    lost: Arc<Mutex<Option<String>>>,
    /// The injected fault, if any (shared with the retuned views).
    fault: Arc<super::fault::FaultSwitch>,
    /// A 16-byte storage buffer bound where a kernel declares a binding it is told not to
    /// read (a softmax without mask or sinks), made once per device.
    placeholder: Arc<OnceLock<wgpu::Buffer>>,
    /// [`GpuOptions::memory_budget`].
    pub memory_budget: Option<u64>,
}

/// The side of the cooperative matrices the cooperative-matrix matmul would use on
/// `adapter` with device `features` (shader-f16 among them): 16 where the adapter offers
/// 16 x 16 x 16 f16 matrices accumulated in f32 (NVIDIA's Vulkan driver), else 8 for
/// 8 x 8 x 8 (Apple), and only where its subgroups are exactly 32 wide (the kernel's
/// workgroup is one subgroup; AMD's may be 64 wide and Intel's 8-32, so not yet there).
pub fn coop_size(adapter: &wgpu::Adapter, features: wgpu::Features) -> Option<u32> {
    use wgpu::CooperativeScalarType as T;
    let have = adapter.features();
    if !have.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
        || !features.contains(wgpu::Features::SHADER_F16)
    {
        return None;
    }
    let info = adapter.get_info();
    if (info.subgroup_min_size, info.subgroup_max_size) != (32, 32) {
        return None;
    }
    let props = adapter.cooperative_matrix_properties();
    [16, 8].into_iter().find(|&s| {
        props.iter().any(|p| {
            (p.m_size, p.n_size, p.k_size) == (s, s, s)
                && p.ab_type == T::F16
                && p.cr_type == T::F32
        })
    })
}

/// The fault `opts` asks for, or `WGLLM_FAULT` names.
fn fault_of(opts: &GpuOptions) -> Result<Option<super::Fault>, GpuError> {
    match opts.fault {
        Some(f) => Ok(Some(f)),
        None => super::Fault::from_env().map_err(GpuError::BadFault),
    }
}

impl Gpu {
    /// Opens the adapter `opts` asks for and a device with the adapter's own limits
    /// (blocking; native targets).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new(opts: &GpuOptions) -> Result<Arc<Gpu>, GpuError> {
        pollster::block_on(Self::open(opts))
    }

    /// [`Gpu::new`] for callers that can await (the browser).
    pub async fn open(opts: &GpuOptions) -> Result<Arc<Gpu>, GpuError> {
        opts.tuning
            .validate()
            .map_err(|e| GpuError::Validation(format!("kernel tuning: {e}")))?;
        let adapter = pick_adapter(opts).await?;
        Self::open_adapter(&adapter, opts).await
    }

    /// A device that keeps its buffers in host memory and runs no kernel (wgpu's no-op
    /// backend), reporting the limits of our floor devices (128 MiB bindings, 32 KiB of
    /// workgroup memory) and neither shader-f16 nor subgroups. Everything up to a
    /// dispatch runs on it as on a GPU: buffer plans, uploads and their checks, pipeline
    /// creation. Kernels' results are never written, so nothing read back means
    /// anything. The weight loader is fuzzed on it (`fuzz::gguf`): a whole model loads
    /// from untrusted bytes with no GPU on the machine.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn host_only() -> Result<Arc<Gpu>, GpuError> {
        let limits = wgpu::Limits {
            max_storage_buffer_binding_size: 128 << 20,
            max_buffer_size: 1 << 30,
            max_compute_workgroup_storage_size: 32 << 10,
            ..wgpu::Limits::default()
        };
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = wgpu::Backends::NOOP;
        desc.backend_options.noop = wgpu::NoopBackendOptions {
            enable: true,
            limits: Some(limits),
            features: Some(wgpu::Features::empty()),
            device_type: Some(wgpu::DeviceType::Other),
            subgroup_min_size: Some(8),
            subgroup_max_size: Some(8),
        };
        let inst = wgpu::Instance::new(desc);
        let adapter = pollster::block_on(inst.enumerate_adapters(wgpu::Backends::NOOP))
            .into_iter()
            .next()
            .ok_or_else(|| GpuError::NoAdapter {
                backend: "noop".into(),
                available: " (wgpu was built without its no-op backend)".into(),
            })?;
        pollster::block_on(Self::open_adapter(&adapter, &GpuOptions::default()))
    }

    /// Opens a device on `adapter` with its own limits and the features `opts` allow.
    async fn open_adapter(
        adapter: &wgpu::Adapter,
        opts: &GpuOptions,
    ) -> Result<Arc<Gpu>, GpuError> {
        let fault = fault_of(opts)?;
        let features = adapter.features();
        let mut required_features = wgpu::Features::empty();
        if !opts.no_f16 && features.contains(wgpu::Features::SHADER_F16) {
            required_features |= wgpu::Features::SHADER_F16;
        }
        if !opts.no_subgroups && features.contains(wgpu::Features::SUBGROUP) {
            required_features |= wgpu::Features::SUBGROUP;
        }
        // Only profiling uses timestamps; asking costs nothing where the adapter has them.
        if features.contains(wgpu::Features::TIMESTAMP_QUERY) {
            required_features |= wgpu::Features::TIMESTAMP_QUERY;
        }
        // Cooperative matrices where some kernel could use them (`coop_size`); wgpu marks
        // the feature experimental, so it must be asked for with experimental features on.
        let coop = coop_size(adapter, required_features).is_some();
        if coop {
            required_features |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
        }
        // wgpu's defaults cap bindings at 128 MiB even where the adapter allows more.
        let desc = wgpu::DeviceDescriptor {
            label: Some("wgllm"),
            required_features,
            required_limits: adapter.limits(),
            experimental_features: if coop {
                // SAFETY: only the cooperative-matrix feature is used of the experimental
                // ones, by kernels naga validated, and each is checked against the portable
                // kernels on the device before the tuner lets it run (`tune::check`).
                unsafe { wgpu::ExperimentalFeatures::enabled() }
            } else {
                wgpu::ExperimentalFeatures::disabled()
            },
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        };
        let (device, queue) =
            adapter
                .request_device(&desc)
                .await
                .map_err(|e| GpuError::RequestDevice {
                    adapter: adapter.get_info().name,
                    msg: e.to_string(),
                })?;
        let gpu = Self::wrap(adapter, device, queue, opts, fault);
        // Our own device: its uncaptured errors and loss are ours to report.
        let errs = gpu.errors.clone();
        gpu.device
            .on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
                log::error!("wgpu: {e}");
                errs.lock().unwrap().push(e.to_string());
            }));
        let lost = gpu.lost.clone();
        gpu.device.set_device_lost_callback(move |reason, msg| {
            if reason != wgpu::DeviceLostReason::Destroyed {
                *lost.lock().unwrap() = Some(format!("{reason:?}: {msg}"));
            }
        });
        Ok(gpu)
    }

    /// Runs on a device another wgpu user created (a winit/egui window renders with the
    /// same device the model runs on). The device's own features and limits decide what
    /// the kernels use: request SHADER_F16 / SUBGROUP and the adapter's limits when
    /// creating it to get the fast paths and large bindings. The host keeps its
    /// uncaptured-error and device-lost handlers; wgllm checks its own work with error
    /// scopes, so a validation error in inference surfaces through the host's handler.
    pub fn from_device(
        adapter: &wgpu::Adapter,
        device: wgpu::Device,
        queue: wgpu::Queue,
        opts: &GpuOptions,
    ) -> Result<Arc<Gpu>, GpuError> {
        opts.tuning
            .validate()
            .map_err(|e| GpuError::Validation(format!("kernel tuning: {e}")))?;
        let fault = fault_of(opts)?;
        Ok(Self::wrap(adapter, device, queue, opts, fault))
    }

    /// Capabilities of an open device, from what it was created with.
    fn wrap(
        adapter: &wgpu::Adapter,
        device: wgpu::Device,
        queue: wgpu::Queue,
        opts: &GpuOptions,
        fault: Option<super::Fault>,
    ) -> Arc<Gpu> {
        let mut info = summarize(opts.adapter_index.unwrap_or(0), adapter);
        let features = device.features();
        let limits = device.limits();
        info.max_storage_binding = limits.max_storage_buffer_binding_size;
        info.max_buffer = limits.max_buffer_size;
        info.max_workgroup_storage = limits.max_compute_workgroup_storage_size;
        let has_f16 = !opts.no_f16 && features.contains(wgpu::Features::SHADER_F16);
        let has_subgroups = !opts.no_subgroups && features.contains(wgpu::Features::SUBGROUP);
        let coop_size = coop_size(adapter, features)
            .filter(|_| features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX));
        let max_binding = opts
            .max_binding_override
            .unwrap_or(u64::MAX)
            .min(info.max_storage_binding)
            .min(info.max_buffer);
        let is_cpu = info.runs_on_cpu();
        let kernels = match opts.kernels {
            KernelShape::Auto if is_cpu => KernelShape::Cpu,
            KernelShape::Auto => KernelShape::Gpu,
            k => k,
        };
        // DX12 through FXC (no shader model 6 there: neither f16 nor wave intrinsics)
        // unrolls every loop that writes a local array at a varying index, and fails the
        // kernel where the loop around it cannot be unrolled (a matmul's loop over
        // blocks); written out in the source, the short loops index with constants.
        let fxc = info.backend == "Dx12"
            && !features.contains(wgpu::Features::SHADER_F16)
            && !features.contains(wgpu::Features::SUBGROUP);
        let unroll = (opts.tuning.unroll).unwrap_or_else(|| info.keeps_loops() || fxc);
        let params_in_storage = opts
            .tuning
            .params_storage
            .unwrap_or_else(|| info.specializes_on_uniforms());
        log::info!(
            "GPU: {} ({}, {}), max binding {} MiB, f16 {}, subgroups {}, {:?}-shaped kernels{}{}",
            info.name,
            info.backend,
            info.device_type,
            max_binding >> 20,
            has_f16,
            has_subgroups,
            kernels,
            if unroll { ", loops unrolled" } else { "" },
            if params_in_storage {
                ", parameters in storage"
            } else {
                ""
            }
        );
        Arc::new(Gpu {
            device,
            queue,
            info,
            max_binding,
            has_f16,
            has_subgroups,
            coop_size,
            is_cpu,
            kernels,
            unroll,
            params_in_storage,
            tuning: opts.tuning.clone(),
            shader_checks: opts.shader_checks,
            has_timestamps: features.contains(wgpu::Features::TIMESTAMP_QUERY),
            allocated: AtomicU64::new(0),
            pipelines: Default::default(),
            errors: Arc::new(Mutex::new(Vec::new())),
            lost: Arc::new(Mutex::new(None)),
            fault: Arc::new(super::fault::FaultSwitch::new(fault)),
            placeholder: Default::default(),
            memory_budget: opts.memory_budget,
        })
    }

    /// The same device with other kernel choices: the tuner times candidates on one
    /// device this way. Buffers, compiled pipelines and error reporting are shared.
    pub fn retuned(&self, kernels: KernelShape, tuning: KernelTuning) -> Arc<Gpu> {
        let kernels = match kernels {
            KernelShape::Auto => self.kernels,
            k => k,
        };
        Arc::new(Gpu {
            device: self.device.clone(),
            queue: self.queue.clone(),
            info: self.info.clone(),
            max_binding: self.max_binding,
            has_f16: self.has_f16,
            has_subgroups: self.has_subgroups,
            coop_size: self.coop_size,
            is_cpu: self.is_cpu,
            kernels,
            unroll: self.unroll,
            params_in_storage: self.params_in_storage,
            tuning,
            shader_checks: self.shader_checks,
            has_timestamps: self.has_timestamps,
            allocated: AtomicU64::new(self.allocated_bytes()),
            pipelines: self.pipelines.clone(),
            errors: self.errors.clone(),
            lost: self.lost.clone(),
            fault: self.fault.clone(),
            placeholder: self.placeholder.clone(),
            memory_budget: self.memory_budget,
        })
    }

    /// The device's placeholder buffer (see the field): for bindings a kernel's
    /// parameters tell it not to read, so that recording one allocates nothing.
    pub fn placeholder(&self) -> &wgpu::Buffer {
        self.placeholder.get_or_init(|| {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("placeholder"),
                size: 16,
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            })
        })
    }

    /// Bytes of buffers created through this device so far (see the field's note).
    pub fn allocated_bytes(&self) -> u64 {
        self.allocated.load(Ordering::Relaxed)
    }

    /// Bytes of buffers alive on the device now, as wgpu counts them (its `counters`
    /// feature; 0 on backends that do not count): what a long-running server is watched
    /// by for leaks.
    pub fn live_buffer_bytes(&self) -> u64 {
        let live = self.device.get_internal_counters().hal.buffer_memory.read();
        live.max(0) as u64
    }

    /// Whether the device was lost (a driver reset, or an injected fault): nothing on it
    /// works any more; a new device must be opened and the model loaded again.
    pub fn is_lost(&self) -> bool {
        self.lost_reason().is_some()
    }

    /// Why the device was lost, if it was.
    pub fn lost_reason(&self) -> Option<String> {
        self.lost.lock().unwrap().clone()
    }

    /// Starts counting towards the injected fault, if any: the model is loaded.
    pub fn arm_faults(&self) {
        self.fault.arm();
    }

    /// Whether integer-dot matmuls are to compute wrong products (`WGLLM_FAULT=wrong-int-dot`:
    /// a kernel broken on purpose, for the tuner's check on the device).
    pub fn fault_wrong_int_dot(&self) -> bool {
        self.fault.wrong_int_dot()
    }

    /// Whether fast matmuls are to leave the last row of each weight chunk unwritten
    /// (`WGLLM_FAULT=wrong-row`).
    pub fn fault_wrong_row(&self) -> bool {
        self.fault.wrong_row()
    }

    /// Whether tiled matmuls are to leave a partial last tile's tokens unwritten
    /// (`WGLLM_FAULT=wrong-tile-edge`).
    pub fn fault_wrong_tile_edge(&self) -> bool {
        self.fault.wrong_tile_edge()
    }

    /// Whether the GPU flash attention kernels are to leave the last head unwritten
    /// (`WGLLM_FAULT=wrong-head`).
    pub fn fault_wrong_head(&self) -> bool {
        self.fault.wrong_head()
    }

    /// Buffer allocations counted since [`Gpu::arm_faults`], where an out-of-memory fault
    /// is set (`oom@N` with an N never reached counts without failing): tests place a
    /// fault inside a chosen step with it.
    pub fn allocations_since_armed(&self) -> u64 {
        self.fault.allocations()
    }

    /// Fails an allocation the injected fault picked (see [`super::Fault`]).
    pub(super) fn injected_oom(&self, what: &str, bytes: u64) -> Result<(), GpuError> {
        if self.fault.allocation_fails() {
            log::warn!("WGLLM_FAULT: failing the allocation of {what} as out of memory");
            return Err(GpuError::OutOfMemory {
                what: format!("{what} (injected by WGLLM_FAULT)"),
                bytes,
                adapter: self.info.name.clone(),
            });
        }
        Ok(())
    }

    /// Loses the device at the submission the injected fault picked (see
    /// [`super::Fault`]): every later check reports it lost, as after a driver reset.
    pub fn injected_loss(&self) -> Result<(), GpuError> {
        if self.fault.submission_loses_device() {
            log::warn!("WGLLM_FAULT: losing the device at this submission");
            *self.lost.lock().unwrap() = Some("injected by WGLLM_FAULT".into());
        }
        match self.lost.lock().unwrap().clone() {
            Some(reason) => Err(GpuError::DeviceLost { reason }),
            None => Ok(()),
        }
    }

    pub(super) fn count_allocation(&self, bytes: u64) {
        self.allocated.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Takes back the bytes counted since `mark` (an earlier [`Gpu::allocated_bytes`]):
    /// buffers made and dropped since, as the kernel audit's scratch at load, which a
    /// memory budget must not hold against the model's own buffers.
    pub fn uncount_since(&self, mark: u64) {
        let now = self.allocated_bytes();
        self.allocated
            .fetch_sub(now.saturating_sub(mark), Ordering::Relaxed);
    }

    /// Waits for all submitted work, then reports any error the device raised meanwhile
    /// (native targets; in a browser, awaiting a readback is the way to wait).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn sync(&self) -> Result<(), GpuError> {
        let _ = self.device.poll(wgpu::PollType::wait_indefinitely());
        self.check()
    }

    /// Waits for submitted work where the target can block (native), else only reports
    /// errors already captured: queue order keeps later work correct either way.
    pub fn flush(&self) -> Result<(), GpuError> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            self.sync()
        }
        #[cfg(target_arch = "wasm32")]
        {
            self.check()
        }
    }

    /// Reports a captured validation error or device loss, if any.
    pub fn check(&self) -> Result<(), GpuError> {
        if let Some(reason) = self.lost.lock().unwrap().clone() {
            return Err(GpuError::DeviceLost { reason });
        }
        let mut errs = self.errors.lock().unwrap();
        if !errs.is_empty() {
            let all = errs.join("; ");
            errs.clear();
            if all.to_lowercase().contains("out of memory") {
                return Err(GpuError::OutOfMemory {
                    what: "a buffer".into(),
                    bytes: 0,
                    adapter: self.info.name.clone(),
                });
            }
            return Err(GpuError::Validation(all));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amd_compute_chips_are_told_from_radeons() {
        let a = |name: &str, vendor: u32| AdapterSummary {
            index: 0,
            name: name.into(),
            backend: "Vulkan".into(),
            device_type: "DiscreteGpu".into(),
            driver: String::new(),
            max_storage_binding: 0,
            max_buffer: 0,
            max_workgroup_storage: 0,
            shader_f16: true,
            subgroups: true,
            subgroup_size: (64, 64),
            cooperative_matrices: Vec::new(),
            vendor,
        };
        assert!(a("AMD Instinct MI300X (RADV GFX942)", 0x1002).is_amd_cdna());
        assert!(a("AMD Instinct MI210", 0x1002).is_amd_cdna());
        assert!(a("Null hardware (RADV GFX940)", 0x1002).is_amd_cdna());
        assert!(!a("AMD Radeon RX 7900 XTX (RADV NAVI31)", 0x1002).is_amd_cdna());
        assert!(!a("NVIDIA H100 80GB HBM3", 0x10de).is_amd_cdna());
    }
}
