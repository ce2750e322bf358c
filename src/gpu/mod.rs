//! The wgpu adapter and device, what they can do, and the shared caches on top of them.
//!
//! Nothing here requires shader-f16 or subgroups: they are recorded as capabilities and
//! kernels pick variants from them. Validation errors and device loss are captured
//! instead of panicking, so callers can turn them into clear errors.

mod buffers;
mod context;
mod fault;
mod pipeline;
mod placement;
mod readback;
pub mod spirv;
mod tuning;
pub mod unroll;

#[cfg(not(target_arch = "wasm32"))]
pub use context::{adapter_summary, list_adapters};
pub use context::{AdapterSummary, Backend, Gpu, GpuOptions, KernelShape};
pub use fault::Fault;
pub use pipeline::{
    add_compile_secs, compile_secs, params_in_storage, prepare, Kernel, Prepared, Rewrites,
    PARAMS_DECL,
};
pub use placement::{layers_by_shares, runs_text, Placement};
pub use tuning::{KernelTuning, INT_DOT_DECODE_TOKENS};

/// Errors from the GPU layer.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("no GPU adapter found for backend `{backend}`{available}\n  hint: try `--backend auto`, run `wgllm devices` to list adapters, or install a driver (on Linux without a GPU: the `mesa-vulkan-drivers` package gives software Vulkan)")]
    NoAdapter { backend: String, available: String },
    #[error(
        "adapter index {index} is out of range: {count} adapter(s) found (see `wgllm devices`)"
    )]
    BadAdapterIndex { index: usize, count: usize },
    #[error("could not open the GPU device on {adapter}: {msg}")]
    RequestDevice { adapter: String, msg: String },
    #[error("out of GPU memory while allocating {what} ({bytes} bytes) on {adapter}; try a smaller context (-c), fewer slots (-np), a smaller batch (-b/-ub), a quantized cache (-ctk/-ctv q8_0), or a smaller model")]
    OutOfMemory {
        what: String,
        bytes: u64,
        adapter: String,
    },
    #[error("the GPU device was lost ({reason}); the driver reset or crashed — rerun, and report it if it repeats")]
    DeviceLost { reason: String },
    #[error("GPU validation error: {0}")]
    Validation(String),
    #[error("{0}")]
    BadFault(String),
    #[error("shader `{name}` failed to compile: {msg}")]
    Shader { name: String, msg: String },
}

/// An error scope around one creation, on targets that can wait for its answer. In a
/// browser none is pushed: a scope whose answer is not awaited would swallow its error,
/// so errors reach the enclosing scope of [`Gpu::scoped`] instead.
pub(crate) fn push_scope(
    device: &wgpu::Device,
    filter: wgpu::ErrorFilter,
) -> Option<wgpu::ErrorScopeGuard> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        Some(device.push_error_scope(filter))
    }
    #[cfg(target_arch = "wasm32")]
    {
        let _ = (device, filter);
        None
    }
}

/// Whether a scope of [`push_scope`] caught an error.
pub(crate) fn scope_failed(scope: Option<wgpu::ErrorScopeGuard>) -> bool {
    scope_error(scope).is_some()
}

/// The error a scope of [`push_scope`] caught (native targets wait for the answer).
pub(crate) fn scope_error(scope: Option<wgpu::ErrorScopeGuard>) -> Option<wgpu::Error> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        scope.and_then(|s| pollster::block_on(s.pop()))
    }
    #[cfg(target_arch = "wasm32")]
    {
        debug_assert!(scope.is_none());
        None
    }
}

impl Gpu {
    /// Runs `work` inside out-of-memory and validation error scopes and awaits their
    /// answers: the way a browser reports what went wrong on the GPU (natively the
    /// checks inside `work` have caught it already). An error the scopes caught fails
    /// the work, whatever it returned. In a page the window draws on the same device
    /// while `work` awaits its readbacks, so an error of the window's own would be
    /// reported here too (the window makes none in normal operation).
    pub async fn scoped<T, E: From<GpuError>>(
        &self,
        work: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let invalid = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let r = work.await;
        // Both answers asked for at once: in a page the scope stack is shared with the
        // window's drawing, which runs whenever this task awaits.
        let (invalid, oom) = (invalid.pop(), oom.pop());
        let (invalid, oom) = (invalid.await, oom.await);
        if oom.is_some() {
            return Err(GpuError::OutOfMemory {
                what: "buffers".into(),
                bytes: self.allocated_bytes(),
                adapter: self.info.name.clone(),
            }
            .into());
        }
        if let Some(e) = invalid {
            return Err(GpuError::Validation(e.to_string()).into());
        }
        r
    }
}
