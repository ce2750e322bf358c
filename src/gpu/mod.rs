//! The wgpu adapter and device, what they can do, and the shared caches on top of them.
//!
//! Nothing here requires shader-f16 or subgroups: they are recorded as capabilities and
//! kernels pick variants from them. Validation errors and device loss are captured
//! instead of panicking, so callers can turn them into clear errors.

mod buffers;
mod context;
mod readback;

pub use crate::ops::{KernelKey, KernelTuning};
#[cfg(not(target_arch = "wasm32"))]
pub use context::{adapter_summary, list_adapters};
pub use context::{AdapterSummary, Backend, Gpu, GpuOptions, KernelShape};

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
    #[error("out of GPU memory while allocating {what} ({bytes} bytes) on {adapter}; try a smaller context (-c) or batch (-b/-ub), or a smaller model")]
    OutOfMemory {
        what: String,
        bytes: u64,
        adapter: String,
    },
    #[error("the GPU device was lost ({reason}); the driver reset or crashed — rerun, and report it if it repeats")]
    DeviceLost { reason: String },
    #[error("GPU validation error: {0}")]
    Validation(String),
    #[error("shader `{name}` failed to compile: {msg}")]
    Shader { name: String, msg: String },
}

/// Whether an error scope caught an error. Native targets wait for the answer; a browser
/// cannot block, so there the scope is closed without waiting and an error reaches the
/// device's uncaptured-error handler instead.
pub(crate) fn scope_failed(scope: wgpu::ErrorScopeGuard) -> bool {
    scope_error(scope).is_some()
}

/// The error an error scope caught, where the target can wait for it.
pub(crate) fn scope_error(scope: wgpu::ErrorScopeGuard) -> Option<wgpu::Error> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        pollster::block_on(scope.pop())
    }
    #[cfg(target_arch = "wasm32")]
    {
        drop(scope.pop());
        None
    }
}
