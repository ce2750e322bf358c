//! The compute graph: a list of op nodes over virtual tensors, a planner that maps
//! intermediate tensors onto a few reusable buffers by lifetime, and an executor that
//! replays every dispatch of a ubatch in one compute pass and one submit.

mod builder;
mod planner;

pub use builder::{AttnBlock, GraphBuilder, Node, Op, TensorId};

use crate::gpu::{Gpu, GpuError};
use crate::ops::{Dispatch, View};

/// A built graph: ready-made dispatches and the scratch buffers they use.
pub struct Graph {
    dispatches: Vec<Dispatch>,
    /// Kept alive for the bind groups; their count shows how well buffers are reused.
    pub scratch: Vec<wgpu::Buffer>,
    pub scratch_bytes: u64,
}

impl Graph {
    #[cfg(not(target_arch = "wasm32"))]
    fn profile(&self, gpu: &Gpu) -> Result<(), GpuError> {
        let mut per_op: std::collections::BTreeMap<&str, (f64, usize)> = Default::default();
        for d in &self.dispatches {
            let t0 = std::time::Instant::now();
            crate::ops::run_now(gpu, std::slice::from_ref(d))?;
            let e = per_op.entry(d.label).or_default();
            e.0 += t0.elapsed().as_secs_f64() * 1e3;
            e.1 += 1;
        }
        let total: f64 = per_op.values().map(|v| v.0).sum();
        for (op, (ms, n)) in per_op {
            log::info!(
                "profile: {op:<12} {n:4} dispatches {ms:9.2} ms ({:.1} %)",
                100.0 * ms / total
            );
        }
        Ok(())
    }

    pub fn n_dispatches(&self) -> usize {
        self.dispatches.len()
    }

    /// Records all dispatches in one pass, then (optionally) copies `read` to a mappable
    /// buffer in the same submit; returns the bytes read once the GPU is done.
    pub async fn run(
        &self,
        gpu: &Gpu,
        read: Option<(&View, u64)>,
    ) -> Result<Option<Vec<u8>>, GpuError> {
        // `gpu.tuning.profile` (`WGLLM_PROFILE=1`): before each run, time every dispatch
        // alone and log the totals per op (slow; for finding where the time goes).
        #[cfg(not(target_arch = "wasm32"))]
        if gpu.tuning.profile {
            self.profile(gpu)?;
        }
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for d in &self.dispatches {
                pass.set_pipeline(&d.pipeline);
                pass.set_bind_group(0, &d.bind_group, &[]);
                pass.dispatch_workgroups(d.groups[0], d.groups[1], d.groups[2]);
            }
        }
        let Some((view, bytes)) = read else {
            gpu.queue.submit([enc.finish()]);
            gpu.flush()?;
            return Ok(None);
        };
        let size = bytes.div_ceil(4) * 4;
        let staging = gpu.staging("logits readback", size);
        enc.copy_buffer_to_buffer(&view.buf, view.offset, &staging, 0, size);
        gpu.queue.submit([enc.finish()]);
        Ok(Some(gpu.map_read(&staging, bytes).await?))
    }
}
