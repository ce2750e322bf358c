//! Buffer creation with out-of-memory checks and uploads.

use super::{Gpu, GpuError};

/// Storage buffers are also copy source/destination so they can be uploaded and read back.
const STORAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_DST)
    .union(wgpu::BufferUsages::COPY_SRC);

impl Gpu {
    /// A zero-initialised storage buffer of at least `bytes` (rounded up to 16).
    pub fn storage(&self, label: &str, bytes: u64) -> Result<wgpu::Buffer, GpuError> {
        let size = bytes.max(16).div_ceil(16) * 16;
        self.injected_oom(label, size)?;
        if let Some(budget) = self.memory_budget {
            if self.allocated_bytes() + size > budget {
                return Err(GpuError::OutOfMemory {
                    what: format!(
                        "{label} (past the device's memory budget of {} MiB)",
                        budget >> 20
                    ),
                    bytes: size,
                    adapter: self.info.name.clone(),
                });
            }
        }
        if size > self.info.max_buffer {
            return Err(GpuError::OutOfMemory {
                what: format!(
                    "{label} (larger than the adapter's max buffer size {})",
                    self.info.max_buffer
                ),
                bytes: size,
                adapter: self.info.name.clone(),
            });
        }
        let scope = super::push_scope(&self.device, wgpu::ErrorFilter::OutOfMemory);
        let buf = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: STORAGE,
            mapped_at_creation: false,
        });
        if super::scope_failed(scope) {
            return Err(GpuError::OutOfMemory {
                what: label.to_string(),
                bytes: size,
                adapter: self.info.name.clone(),
            });
        }
        self.count_allocation(size);
        Ok(buf)
    }

    /// A storage buffer holding `data`.
    pub fn upload(&self, label: &str, data: &[u8]) -> Result<wgpu::Buffer, GpuError> {
        let buf = self.storage(label, data.len() as u64)?;
        self.write(&buf, 0, data);
        Ok(buf)
    }

    /// Queues a write of `data` (padded to 4 bytes) at `offset`.
    pub fn write(&self, buf: &wgpu::Buffer, offset: u64, data: &[u8]) {
        if data.len().is_multiple_of(4) {
            self.queue.write_buffer(buf, offset, data);
        } else {
            let mut padded = data.to_vec();
            padded.resize(data.len().div_ceil(4) * 4, 0);
            self.queue.write_buffer(buf, offset, &padded);
        }
    }

    /// A buffer with a kernel's parameters `data`: uniform, or storage where the kernels
    /// read them from storage ([`Gpu::params_in_storage`]).
    pub fn uniform(&self, label: &str, data: &[u8]) -> wgpu::Buffer {
        let size = (data.len() as u64).max(16).div_ceil(16) * 16;
        let binding = if self.params_in_storage {
            wgpu::BufferUsages::STORAGE
        } else {
            wgpu::BufferUsages::UNIFORM
        };
        let buf = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: binding | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.write(&buf, 0, data);
        self.count_allocation(size);
        buf
    }
}
