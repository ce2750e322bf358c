//! Choosing an adapter and opening a device with the adapter's own limits.

use super::GpuError;
use crate::ops::{KernelKey, KernelTuning};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

/// Which wgpu backend to use (`--backend`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum Backend {
    #[default]
    Auto,
    Vulkan,
    Metal,
    Dx12,
    Gl,
}

impl Backend {
    fn backends(self) -> wgpu::Backends {
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum KernelShape {
    #[default]
    Auto,
    Cpu,
    Gpu,
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
}

fn instance(backend: Backend) -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    desc.backends = backend.backends();
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
    }
}

/// Every adapter the backend choice reaches, in the order `--device` indexes them.
pub fn list_adapters(backend: Backend) -> Vec<AdapterSummary> {
    let inst = instance(backend);
    let adapters = pollster::block_on(inst.enumerate_adapters(backend.backends()));
    adapters
        .iter()
        .enumerate()
        .map(|(i, a)| summarize(i, a))
        .collect()
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
    pub is_cpu: bool,
    /// Resolved kernel shape (never `Auto`).
    pub kernels: KernelShape,
    /// The kernel overrides the ops apply (a copy of [`GpuOptions::tuning`]).
    pub tuning: KernelTuning,
    pipelines: Mutex<HashMap<KernelKey, Arc<wgpu::ComputePipeline>>>,
    errors: Arc<Mutex<Vec<String>>>,
    lost: Arc<Mutex<Option<String>>>,
}

impl Gpu {
    pub fn new(opts: &GpuOptions) -> Result<Arc<Gpu>, GpuError> {
        opts.tuning
            .validate()
            .map_err(|e| GpuError::Validation(format!("kernel tuning: {e}")))?;
        let inst = instance(opts.backend);
        let adapters = pollster::block_on(inst.enumerate_adapters(opts.backend.backends()));
        let adapter = match opts.adapter_index {
            Some(index) => adapters
                .into_iter()
                .nth(index)
                .ok_or(GpuError::BadAdapterIndex {
                    index,
                    count: list_adapters(opts.backend).len(),
                })?,
            None => {
                let req = wgpu::RequestAdapterOptions {
                    power_preference: wgpu::PowerPreference::HighPerformance,
                    force_fallback_adapter: false,
                    compatible_surface: None,
                    apply_limit_buckets: false,
                };
                match pollster::block_on(inst.request_adapter(&req)) {
                    Ok(a) => a,
                    Err(_) => {
                        let others = list_adapters(Backend::Auto);
                        let available = if others.is_empty() {
                            " (no adapters on any backend)".to_string()
                        } else {
                            let names: Vec<String> = others
                                .iter()
                                .map(|a| format!("{} on {}", a.name, a.backend))
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
        };
        let info = summarize(opts.adapter_index.unwrap_or(0), &adapter);
        let features = adapter.features();
        let has_f16 = !opts.no_f16 && features.contains(wgpu::Features::SHADER_F16);
        let has_subgroups = !opts.no_subgroups && features.contains(wgpu::Features::SUBGROUP);
        let mut required_features = wgpu::Features::empty();
        if has_f16 {
            required_features |= wgpu::Features::SHADER_F16;
        }
        if has_subgroups {
            required_features |= wgpu::Features::SUBGROUP;
        }
        // wgpu's defaults cap bindings at 128 MiB even where the adapter allows more.
        let required_limits = adapter.limits();
        let desc = wgpu::DeviceDescriptor {
            label: Some("wgllm"),
            required_features,
            required_limits,
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&desc)).map_err(|e| {
            GpuError::RequestDevice {
                adapter: info.name.clone(),
                msg: e.to_string(),
            }
        })?;
        let errors = Arc::new(Mutex::new(Vec::new()));
        let errs = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            log::error!("wgpu: {e}");
            errs.lock().unwrap().push(e.to_string());
        }));
        let lost = Arc::new(Mutex::new(None));
        let lost2 = lost.clone();
        device.set_device_lost_callback(move |reason, msg| {
            if reason != wgpu::DeviceLostReason::Destroyed {
                *lost2.lock().unwrap() = Some(format!("{reason:?}: {msg}"));
            }
        });
        let max_binding = opts
            .max_binding_override
            .unwrap_or(u64::MAX)
            .min(info.max_storage_binding)
            .min(info.max_buffer);
        let is_cpu = matches!(adapter.get_info().device_type, wgpu::DeviceType::Cpu)
            || info.name.contains("llvmpipe");
        let kernels = match opts.kernels {
            KernelShape::Auto if is_cpu => KernelShape::Cpu,
            KernelShape::Auto => KernelShape::Gpu,
            k => k,
        };
        log::info!(
            "GPU: {} ({}, {}), max binding {} MiB, f16 {}, subgroups {}, {:?}-shaped kernels",
            info.name,
            info.backend,
            info.device_type,
            max_binding >> 20,
            has_f16,
            has_subgroups,
            kernels
        );
        Ok(Arc::new(Gpu {
            device,
            queue,
            info,
            max_binding,
            has_f16,
            has_subgroups,
            is_cpu,
            kernels,
            tuning: opts.tuning.clone(),
            pipelines: Mutex::new(HashMap::new()),
            errors,
            lost,
        }))
    }

    /// The compute pipeline of a kernel variant (entry point `main`), compiled once.
    /// Keys outside [`KernelKey::all`] are refused: only those are checked offline
    /// (naga validation, MSL and HLSL translation), so a selection bug fails here, loudly,
    /// rather than on some other backend's driver.
    pub fn pipeline(&self, key: KernelKey) -> Result<Arc<wgpu::ComputePipeline>, GpuError> {
        if let Some(p) = self.pipelines.lock().unwrap().get(&key) {
            return Ok(p.clone());
        }
        let name = key.to_string();
        let shader_err = |msg: String| GpuError::Shader {
            name: name.clone(),
            msg,
        };
        if !key.is_known() {
            return Err(shader_err(
                "not one of the kernel variants KernelKey::all() lists (and the offline check covers)"
                    .into(),
            ));
        }
        let missing = key.features() - self.device.features();
        if !missing.is_empty() {
            return Err(shader_err(format!(
                "needs device features {missing:?}, which this device was opened without"
            )));
        }
        let src = key.source().map_err(&shader_err)?;
        // Validate with naga first, with only the capabilities the key declares: its
        // messages name the line, and a bad shader must not reach the driver.
        let module =
            naga::front::wgsl::parse_str(&src).map_err(|e| shader_err(e.emit_to_string(&src)))?;
        let mut validator = naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            key.naga_capabilities(),
        );
        validator
            .validate(&module)
            .map_err(|e| shader_err(e.emit_to_string(&src)))?;
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let sm = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(&name),
                source: wgpu::ShaderSource::Wgsl(src.into()),
            });
        let p = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&name),
                layout: None,
                module: &sm,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(shader_err(e.to_string()));
        }
        let p = Arc::new(p);
        self.pipelines.lock().unwrap().insert(key, p.clone());
        Ok(p)
    }

    /// Waits for all submitted work, then reports any error the device raised meanwhile.
    pub fn sync(&self) -> Result<(), GpuError> {
        let _ = self.device.poll(wgpu::PollType::wait_indefinitely());
        self.check()
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
