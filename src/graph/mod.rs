//! The compute graph: a list of op nodes over virtual tensors, a planner that maps
//! intermediate tensors onto a few reusable buffers by lifetime, and an executor that
//! replays every dispatch of a ubatch in one compute pass and one submit.

mod builder;
mod planner;
mod profile;

pub use builder::{AttnBlock, GraphBuilder, Node, Op, OpCost, TensorId};
pub use profile::{OpProfile, StepProfile, TimingSource};

use crate::gpu::{Gpu, GpuError};
use crate::ops::{Dispatch, View};

/// A built graph: ready-made dispatches and the scratch buffers they use.
pub struct Graph {
    dispatches: Vec<Dispatch>,
    /// The node each dispatch was recorded for (index into `costs`).
    node_of: Vec<u32>,
    /// Each node's [`Op::kind`] and cost model, for profiles.
    costs: Vec<(String, OpCost)>,
    /// Nanoseconds the last run spent recording (an atomic: `run` takes
    /// `&self`, and graphs are shared with a future awaiting the readback).
    record_ns: std::sync::atomic::AtomicU64,
    /// Kept alive for the bind groups; their count shows how well buffers are reused.
    pub scratch: Vec<wgpu::Buffer>,
    pub scratch_bytes: u64,
}

impl Graph {
    /// `WGLLM_PROFILE=1`: the time per op kind of this graph, logged.
    #[cfg(not(target_arch = "wasm32"))]
    fn log_profile(&self, gpu: &Gpu) -> Result<(), GpuError> {
        let p = pollster::block_on(self.profile(gpu))?;
        for op in &p.ops {
            log::info!(
                "profile: {:<16} {:4} dispatches {:9.2} ms ({:.1} %)",
                op.kind,
                op.dispatches,
                op.ns / 1e6,
                100.0 * p.share(op)
            );
        }
        Ok(())
    }

    /// Host time the last [`Graph::run`] took to record its dispatches into a command
    /// buffer (not the submit: on GL, submitting executes the commands on the host).
    pub fn record_ns(&self) -> u64 {
        self.record_ns.load(std::sync::atomic::Ordering::Relaxed)
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
            self.log_profile(gpu)?;
        }
        let t0 = web_time::Instant::now();
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for d in &self.dispatches {
                pass.set_pipeline(&d.pipeline);
                pass.set_bind_group(0, &d.bind_group, &[]);
                pass.dispatch_workgroups(d.groups[0], d.groups[1], d.groups[2]);
            }
        }
        let record = |t0: web_time::Instant| {
            let ns = t0.elapsed().as_nanos() as u64;
            self.record_ns
                .store(ns, std::sync::atomic::Ordering::Relaxed);
        };
        let Some((view, bytes)) = read else {
            let cmd = enc.finish();
            record(t0);
            gpu.queue.submit([cmd]);
            gpu.flush()?;
            return Ok(None);
        };
        let size = bytes.div_ceil(4) * 4;
        let staging = gpu.staging("logits readback", size);
        enc.copy_buffer_to_buffer(&view.buf, view.offset, &staging, 0, size);
        let cmd = enc.finish();
        record(t0);
        gpu.queue.submit([cmd]);
        Ok(Some(gpu.map_read(&staging, bytes).await?))
    }
}
