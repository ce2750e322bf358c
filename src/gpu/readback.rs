//! Reading GPU buffers back without blocking: a copy into a mappable staging buffer whose
//! `map_async` completion is awaited. A browser resolves the mapping from its own event
//! loop, so nothing here may wait on the GPU itself; on native targets the device is
//! polled first, which runs the callback before the future is awaited.

use super::{Gpu, GpuError};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

/// The outcome of one `map_async`, shared between its callback and the awaiting task.
#[derive(Default)]
struct Slot {
    result: Option<Result<(), wgpu::BufferAsyncError>>,
    waker: Option<Waker>,
}

/// Resolves when the mapping callback has run.
struct MapFuture(Arc<Mutex<Slot>>);

impl Future for MapFuture {
    type Output = Result<(), wgpu::BufferAsyncError>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut slot = self.0.lock().unwrap();
        match slot.result.take() {
            Some(r) => Poll::Ready(r),
            None => {
                slot.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl Gpu {
    /// A mappable buffer to copy `size` bytes into for reading.
    pub(crate) fn staging(&self, label: &str, size: u64) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: size.max(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// Maps `staging` (already holding a submitted copy) and returns its first `bytes`.
    pub(crate) async fn map_read(
        &self,
        staging: &wgpu::Buffer,
        bytes: u64,
    ) -> Result<Vec<u8>, GpuError> {
        self.map_read_after(staging, bytes, None).await
    }

    /// [`Gpu::map_read`] of a copy made by submission `after`: natively, only the work up
    /// to that submission is waited for (later submits keep the device busy meanwhile).
    pub(crate) async fn map_read_after(
        &self,
        staging: &wgpu::Buffer,
        bytes: u64,
        after: Option<wgpu::SubmissionIndex>,
    ) -> Result<Vec<u8>, GpuError> {
        let size = staging.size();
        let slice = staging.slice(..size);
        let slot = Arc::new(Mutex::new(Slot::default()));
        let cb_slot = slot.clone();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let mut s = cb_slot.lock().unwrap();
            s.result = Some(r);
            if let Some(w) = s.waker.take() {
                w.wake();
            }
        });
        #[cfg(not(target_arch = "wasm32"))]
        let _ = self.device.poll(wgpu::PollType::Wait {
            submission_index: after,
            timeout: None,
        });
        #[cfg(target_arch = "wasm32")]
        let _ = after;
        let mapped = MapFuture(slot).await;
        self.check()?;
        if let Err(e) = mapped {
            return Err(GpuError::DeviceLost {
                reason: format!("a readback did not complete: {e}"),
            });
        }
        let data = slice
            .get_mapped_range()
            .map_err(|e| GpuError::Validation(format!("readback mapping: {e:?}")))?
            [..bytes as usize]
            .to_vec();
        staging.unmap();
        Ok(data)
    }

    /// Copies `bytes` from `buf` at `offset` to the host once queued work is done.
    pub async fn read_bytes_async(
        &self,
        buf: &wgpu::Buffer,
        offset: u64,
        bytes: u64,
    ) -> Result<Vec<u8>, GpuError> {
        let size = bytes.div_ceil(4) * 4;
        let staging = self.staging("readback", size);
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(buf, offset, &staging, 0, size);
        self.queue.submit([enc.finish()]);
        self.map_read(&staging, bytes).await
    }

    /// [`Gpu::read_bytes_async`], blocking (native targets only).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_bytes(
        &self,
        buf: &wgpu::Buffer,
        offset: u64,
        bytes: u64,
    ) -> Result<Vec<u8>, GpuError> {
        pollster::block_on(self.read_bytes_async(buf, offset, bytes))
    }

    /// `count` f32 values from `buf` at element `offset_elems` (native targets only).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_f32(
        &self,
        buf: &wgpu::Buffer,
        offset_elems: u64,
        count: usize,
    ) -> Result<Vec<f32>, GpuError> {
        let bytes = self.read_bytes(buf, offset_elems * 4, count as u64 * 4)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }
}
