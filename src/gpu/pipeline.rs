//! Compute pipelines: a kernel's WGSL rewritten as this device asks (loops written out,
//! parameters bound as storage), validated by naga, compiled once per device and cached.
//! The kernels themselves are named by the layer above through [`Kernel`]: this layer
//! knows how to make a pipeline on a device, not which kernels exist.

use super::{Gpu, GpuError};
use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

/// A kernel variant as the layer above names it: its source and what it needs of the
/// device. Each value must stand for one source (the cache keys on it).
pub trait Kernel: Clone + Eq + Hash + std::fmt::Display + Send + Sync + 'static {
    /// The WGSL, with its parameter block declared as [`PARAMS_DECL`]; or why there is none.
    fn source(&self) -> Result<String, String>;
    /// Device features the kernel uses (shader-f16, subgroups).
    fn features(&self) -> wgpu::Features;
    /// What naga must allow when it validates the source.
    fn naga_capabilities(&self) -> naga::valid::Capabilities;
    /// Whether this is one of the variants the offline check covers.
    fn is_known(&self) -> bool;
    /// Whether the kernel may read workgroup memory it did not write first, so that the
    /// pipeline must zero it at every workgroup's start (wgpu's default). A kernel that
    /// writes every element before a barrier and reads only after says false: the fill
    /// is then a store per element and a barrier per workgroup for nothing.
    fn reads_unwritten_workgroup_memory(&self) -> bool {
        true
    }
}

/// Compiled pipelines, by kernel type and then by key: generic over whatever key types
/// the layers above use.
#[derive(Default)]
pub(super) struct PipelineCache(
    HashMap<TypeId, Box<dyn Any + Send>>,
    /// Each pipeline's bindings (group 0, by binding number) that the kernel may write:
    /// storage declared `read_write`.
    HashMap<wgpu::ComputePipeline, Arc<[bool]>>,
);

impl PipelineCache {
    fn get<K: Kernel>(&self, key: &K) -> Option<Arc<wgpu::ComputePipeline>> {
        let by_key = self.0.get(&TypeId::of::<K>())?;
        let by_key = by_key.downcast_ref::<HashMap<K, Arc<wgpu::ComputePipeline>>>()?;
        by_key.get(key).cloned()
    }

    fn insert<K: Kernel>(&mut self, key: K, p: Arc<wgpu::ComputePipeline>) {
        let by_key = (self.0.entry(TypeId::of::<K>()))
            .or_insert_with(|| Box::new(HashMap::<K, Arc<wgpu::ComputePipeline>>::new()));
        if let Some(by_key) = by_key.downcast_mut::<HashMap<K, Arc<wgpu::ComputePipeline>>>() {
            by_key.insert(key, p);
        }
    }
}

/// Which bindings of group 0 a kernel may write (storage declared `read_write`), by
/// binding number.
fn binding_writes(module: &naga::Module) -> Arc<[bool]> {
    let mut writes = Vec::new();
    for (_, var) in module.global_variables.iter() {
        let (Some(b), naga::AddressSpace::Storage { access }) = (&var.binding, var.space) else {
            continue;
        };
        if b.group != 0 {
            continue;
        }
        let i = b.binding as usize;
        if writes.len() <= i {
            writes.resize(i + 1, false);
        }
        writes[i] = access.contains(naga::StorageAccess::STORE);
    }
    writes.into()
}

/// How every kernel declares its parameter block: binding 0, named `p`.
pub const PARAMS_DECL: &str = "@group(0) @binding(0) var<uniform> p: Params;";

/// `src` with its parameter block bound as read-only storage instead of a uniform buffer:
/// the same bytes in the same layout (the fields are 4-byte scalars, laid out alike in
/// both address spaces). For drivers that compile a kernel anew for each value its
/// uniforms take in branches and loop bounds
/// ([`super::AdapterSummary::specializes_on_uniforms`]). `None` where `src` does not
/// declare its parameters as [`PARAMS_DECL`].
pub fn params_in_storage(src: &str) -> Option<String> {
    (src.matches(PARAMS_DECL).count() == 1).then(|| {
        src.replacen(
            PARAMS_DECL,
            "@group(0) @binding(0) var<storage, read> p: Params;",
            1,
        )
    })
}

/// The rewrites of a kernel's WGSL some devices need before they compile it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rewrites {
    /// Short loops written out ([`super::unroll`]): for compilers that keep them.
    pub unroll: bool,
    /// Parameters read from storage ([`params_in_storage`]): for drivers that specialize
    /// on uniforms.
    pub params_in_storage: bool,
}

/// A kernel's WGSL as a device compiles it, parsed and validated by naga.
pub struct Prepared {
    pub src: String,
    pub module: naga::Module,
    pub info: naga::valid::ModuleInfo,
}

/// A kernel's source with `rewrites` applied, parsed and validated with only the
/// capabilities the kernel declares: what [`Gpu::pipeline`] hands wgpu, and what the
/// offline translations ([`super::spirv`]) start from. Errors name the line.
pub fn prepare<K: Kernel>(key: &K, rewrites: Rewrites) -> Result<Prepared, String> {
    let mut src = key.source()?;
    if rewrites.unroll {
        src = super::unroll::unroll(&src, super::unroll::MAX_TRIPS);
    }
    if rewrites.params_in_storage {
        src = params_in_storage(&src)
            .ok_or("its parameters are not declared as every kernel's are")?;
    }
    let module = naga::front::wgsl::parse_str(&src).map_err(|e| e.emit_to_string(&src))?;
    let info =
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), key.naga_capabilities())
            .validate(&module)
            .map_err(|e| e.emit_to_string(&src))?;
    Ok(Prepared { src, module, info })
}

/// Nanoseconds this process has spent compiling kernels (naga's validation and the
/// driver's pipeline creation), on every device.
static COMPILE_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Seconds this process has spent compiling kernels so far: what a load's breakdown
/// reports (on a slow device with cold driver caches it is most of a first load).
pub fn compile_secs() -> f64 {
    COMPILE_NS.load(std::sync::atomic::Ordering::Relaxed) as f64 * 1e-9
}

/// Counts `secs` of compiling that happened elsewhere than in [`Gpu::pipeline`] (a
/// driver compiling at a pipeline's first dispatch, as a caller timed it).
pub fn add_compile_secs(secs: f64) {
    if secs > 0.0 {
        COMPILE_NS.fetch_add((secs * 1e9) as u64, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Gpu {
    /// Which bindings of a pipeline this device compiled the kernel may write, by binding
    /// number (empty for a pipeline it does not know).
    pub fn binding_writes(&self, p: &wgpu::ComputePipeline) -> Arc<[bool]> {
        let cache = self.pipelines.lock().unwrap();
        cache
            .1
            .get(p)
            .cloned()
            .unwrap_or_else(|| Arc::from(Vec::new()))
    }

    /// The compute pipeline of a kernel variant (entry point `main`), compiled once.
    /// Keys the kernel type does not know ([`Kernel::is_known`]) are refused: only those
    /// are checked offline (naga validation, MSL and HLSL translation), so a selection
    /// bug fails here, loudly, rather than on some other backend's driver.
    pub fn pipeline<K: Kernel>(&self, key: K) -> Result<Arc<wgpu::ComputePipeline>, GpuError> {
        if let Some(p) = self.pipelines.lock().unwrap().get(&key) {
            return Ok(p);
        }
        let name = key.to_string();
        let shader_err = |msg: String| GpuError::Shader {
            name: name.clone(),
            msg,
        };
        if !key.is_known() {
            return Err(shader_err(format!(
                "not one of the kernel variants {}::all() lists (and the offline check covers)",
                std::any::type_name::<K>()
            )));
        }
        let missing = key.features() - self.device.features();
        if !missing.is_empty() {
            return Err(shader_err(format!(
                "needs device features {missing:?}, which this device was opened without"
            )));
        }
        let compiling = web_time::Instant::now();
        let rewrites = Rewrites {
            unroll: self.unroll,
            params_in_storage: self.params_in_storage,
        };
        let Prepared { src, module, .. } = prepare(&key, rewrites).map_err(&shader_err)?;
        let writes = binding_writes(&module);
        // A shader compiler's own failure (DX12's FXC or DXC, a driver's) is an internal
        // error, not a validation one: both scopes, so that either fails this kernel here
        // instead of every later submit that uses it.
        let internal = super::push_scope(&self.device, wgpu::ErrorFilter::Internal);
        let scope = super::push_scope(&self.device, wgpu::ErrorFilter::Validation);
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(&name),
            source: wgpu::ShaderSource::Wgsl(src.into()),
        };
        // Our kernels skip the checks wgpu would inject on Vulkan/Metal/DX12 (index
        // clamping, loop counters, guarded integer division): they cost lavapipe 33 % of
        // its prompt speed and made the Vulkan path slower than GL, whose GLSL never had
        // them. See `GpuOptions::shader_checks` for why that is sound.
        let checks = if self.shader_checks {
            wgpu::ShaderRuntimeChecks::checked()
        } else {
            wgpu::ShaderRuntimeChecks::unchecked()
        };
        // SAFETY: every variant is one the offline check covers, validated by naga above; its
        // loops are bounded by constants or uniforms, local arrays are indexed by counters
        // of constant-bounded loops, and the ops check the uniforms they divide by and the
        // sizes they index before recording (`GpuOptions::shader_checks`).
        let sm = unsafe { self.device.create_shader_module_trusted(desc, checks) };
        let p = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&name),
                layout: None,
                module: &sm,
                entry_point: Some("main"),
                compilation_options: wgpu::PipelineCompilationOptions {
                    zero_initialize_workgroup_memory: key.reads_unwritten_workgroup_memory(),
                    ..Default::default()
                },
                cache: None,
            });
        let ns = compiling.elapsed().as_nanos() as u64;
        COMPILE_NS.fetch_add(ns, std::sync::atomic::Ordering::Relaxed);
        let invalid = super::scope_error(scope);
        if let Some(e) = super::scope_error(internal).or(invalid) {
            return Err(shader_err(e.to_string()));
        }
        let p = Arc::new(p);
        let mut cache = self.pipelines.lock().unwrap();
        cache.1.insert((*p).clone(), writes);
        cache.insert(key, p.clone());
        Ok(p)
    }
}
