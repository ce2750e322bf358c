//! The compute graph: a list of op nodes over virtual tensors, a planner that maps
//! intermediate tensors onto a few reusable buffers by lifetime, and an executor that
//! replays every dispatch of a ubatch (in a few submits on GPUs, so the device starts
//! before the host has recorded them all).

mod builder;
mod fuse;
pub mod inputs;
mod lora;
mod planner;
mod profile;
mod split;

pub use crate::ops::OpCost;
pub use builder::{AttnBlock, AttnInputs, GraphBuilder, Node, Op, TensorId};
pub use inputs::{CacheKind, CacheState, GraphInput, GraphIo, InputData, UbatchView};
pub use lora::{LoraTerm, LoraTerms};
pub use profile::{log_ops, KernelTime, OpProfile, StepProfile, TimingSource};
pub use split::InputMirrors;

use crate::gpu::{Gpu, GpuError};
use crate::ops::{Dispatch, View};
use std::sync::Arc;

/// Dispatches in the first submit of a run on a GPU, and in each one after it.
const FIRST_SUBMIT: usize = 32;
const SUBMIT_EVERY: usize = 96;

/// A built graph: ready-made dispatches and the scratch buffers they use, in parts that
/// each run on one device (one part, unless the model is split over devices).
pub struct Graph {
    parts: Vec<Part>,
    /// Barriers wgpu records between the dispatches ([`crate::ops::barriers`]).
    barriers: usize,
    /// The bytes each activation crossing between parts held in the last run (a profile
    /// replays the parts with them).
    hops: std::sync::Mutex<Vec<Vec<u8>>>,
    /// Each node's [`Op::kind`] and cost model, for profiles.
    costs: Vec<(String, OpCost)>,
    /// Nanoseconds the last run spent recording (an atomic: `run` takes
    /// `&self`, and graphs are shared with a future awaiting the readback).
    record_ns: std::sync::atomic::AtomicU64,
    /// Nanoseconds the last run spent in submits, and waiting for its readback (the
    /// GPU finishing, then the mapped bytes copied out).
    submit_ns: std::sync::atomic::AtomicU64,
    wait_ns: std::sync::atomic::AtomicU64,
    /// Kept alive for the bind groups; their count shows how well buffers are reused.
    pub scratch: Vec<wgpu::Buffer>,
    pub scratch_bytes: u64,
}

/// The dispatches of a run of nodes on one device, and the activations that cross into
/// it from earlier parts and out of it to later ones (wgpu shares no buffer between
/// devices: each is read back on one device and written on the other).
pub(crate) struct Part {
    gpu: Arc<Gpu>,
    dispatches: Vec<Dispatch>,
    /// The node each dispatch was recorded for (index into `costs`).
    node_of: Vec<u32>,
    /// Written from the host before the part runs: (destination, hop index).
    inbound: Vec<(View, usize)>,
    /// Read back after it: (source, hop index).
    outbound: Vec<(View, usize)>,
}

impl Graph {
    /// `WGLLM_PROFILE=1`: the time per op kind of this graph, logged.
    #[cfg(not(target_arch = "wasm32"))]
    fn log_profile(&self, gpu: &Gpu) -> Result<(), GpuError> {
        let p = pollster::block_on(self.profile(gpu, ("", &[], OpCost::default())))?;
        log_ops(&p);
        Ok(())
    }

    /// Host time the last [`Graph::run`] took to record its dispatches into a command
    /// buffer (not the submit: on GL, submitting executes the commands on the host).
    pub fn record_ns(&self) -> u64 {
        self.record_ns.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Host time the last [`Graph::run`] spent in submits and in waiting for the GPU and
    /// its readback (or the final flush).
    pub fn submit_wait_ns(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.submit_ns.load(Relaxed), self.wait_ns.load(Relaxed))
    }

    /// The dispatches of a graph on one device, in order (they hold their buffers): for
    /// callers that run them on their own, as the tuner does its timed layer.
    pub fn into_dispatches(self) -> Result<Vec<Dispatch>, GpuError> {
        match <[Part; 1]>::try_from(self.parts) {
            Ok([part]) => Ok(part.dispatches),
            Err(parts) => Err(GpuError::Validation(format!(
                "a graph of {} parts has no one list of dispatches",
                parts.len()
            ))),
        }
    }

    pub fn n_dispatches(&self) -> usize {
        self.parts.iter().map(|p| p.dispatches.len()).sum()
    }

    /// The devices the graph's parts run on, in order, and their dispatches (one entry
    /// unless the model is split).
    pub fn parts(&self) -> Vec<(String, usize)> {
        (self.parts.iter())
            .map(|p| (p.gpu.info.name.clone(), p.dispatches.len()))
            .collect()
    }

    /// Barriers between the dispatches, by wgpu's rule ([`crate::ops::barriers`]).
    pub fn n_barriers(&self) -> usize {
        self.barriers
    }

    /// Records the dispatches (in chunks, each submitted as it is recorded, on GPUs) and
    /// `extra` after them (sampling), then copies each of `reads` (buffer, offset, bytes;
    /// 4-byte aligned) to one mappable buffer in the last submit; returns those bytes,
    /// one region after another, once the GPU is done.
    pub async fn run(
        &self,
        gpu: &Gpu,
        extra: &[Dispatch],
        reads: &[(&wgpu::Buffer, u64, u64)],
    ) -> Result<Option<Vec<u8>>, GpuError> {
        let submitted = self.submit(gpu, &[], extra, reads)?;
        let (out, wait_ns) = submitted.wait(gpu).await?;
        self.wait_ns
            .store(wait_ns, std::sync::atomic::Ordering::Relaxed);
        Ok(out)
    }

    /// [`Graph::run`] up to the last submit, without waiting: `pre` copies (source,
    /// offset, destination, offset, bytes) are recorded before the first dispatch (a
    /// token drawn by the step before, into this step's token input). On a split model
    /// the parts before the last run to their readback here (each hop waits for its
    /// device), and the last part, on `gpu` (the main device), is submitted.
    pub fn submit(
        &self,
        gpu: &Gpu,
        pre: &[CopyRegion],
        extra: &[Dispatch],
        reads: &[(&wgpu::Buffer, u64, u64)],
    ) -> Result<Submitted, GpuError> {
        let (last, before) = self.parts.split_last().expect("a graph has a part");
        let mut record_ns = 0u64;
        let mut submit_ns = 0u64;
        let mut hops: Vec<Vec<u8>> = Vec::new();
        for (i, part) in before.iter().enumerate() {
            let pre = if i == 0 { pre } else { &[] };
            Self::write_inbound(part, &hops)?;
            let out = part.outbound_reads();
            let out: Vec<(&wgpu::Buffer, u64, u64)> =
                out.iter().map(|(b, o, n)| (b, *o, *n)).collect();
            let (sub, rec, sn) = self.submit_part(part, pre, &[], &out)?;
            record_ns += rec;
            submit_ns += sn;
            let bytes = wait_blocking(sub, &part.gpu)?;
            part.keep_hops(&bytes, &mut hops);
        }
        Self::write_inbound(last, &hops)?;
        let pre = if before.is_empty() { pre } else { &[] };
        // The draws and readbacks are the main device's: the last part must be there
        // (a graph with no output rows may end on another device, and then has none).
        if (!extra.is_empty() || !reads.is_empty()) && !std::ptr::eq(gpu, &*last.gpu) {
            return Err(GpuError::Validation(
                "a split graph's last part is not on the main device, which holds its outputs"
                    .into(),
            ));
        }
        let (sub, rec, sn) = self.submit_part(last, pre, extra, reads)?;
        self.store_run(record_ns + rec, submit_ns + sn, hops);
        Ok(sub)
    }

    /// Keeps a finished run's host times and its hops (for a profile's replay).
    fn store_run(&self, record_ns: u64, submit_ns: u64, hops: Vec<Vec<u8>>) {
        use std::sync::atomic::Ordering::Relaxed;
        self.record_ns.store(record_ns, Relaxed);
        self.submit_ns.store(submit_ns, Relaxed);
        if !hops.is_empty() {
            *self.hops.lock().unwrap() = hops;
        }
    }

    /// Whether the graph runs in several parts (a split model).
    pub fn is_split(&self) -> bool {
        self.parts.len() > 1
    }

    /// Starts a run part by part ([`Staged`]): submits the first part, which reads back
    /// its hops (or, for a graph of one part, `reads`) without waiting. Several runs may
    /// be in flight on a split model, each with its part on another device: the parts
    /// of one device run in the order submitted, and a part's hops are read back in its
    /// own submission, so a later run's part cannot overwrite them first.
    pub fn start(
        self: &Arc<Self>,
        reads: Vec<(wgpu::Buffer, u64, u64)>,
    ) -> Result<Staged, GpuError> {
        let mut run = Staged {
            graph: self.clone(),
            part: 0,
            sub: None,
            hops: Vec::new(),
            reads,
            record_ns: 0,
            submit_ns: 0,
        };
        run.submit_current()?;
        Ok(run)
    }

    /// Writes the activations `part` takes from earlier parts (`hops`, by index).
    fn write_inbound(part: &Part, hops: &[Vec<u8>]) -> Result<(), GpuError> {
        for (v, hop) in &part.inbound {
            let data = hops.get(*hop).ok_or_else(|| {
                GpuError::Validation(format!("a split graph's hop {hop} was not read back"))
            })?;
            part.gpu.write(&v.buf, v.offset, data);
        }
        Ok(())
    }

    /// Records and submits one part's dispatches (in chunks, each submitted as it is
    /// recorded, on GPUs) and `extra` after them, with `reads` copied to one mappable
    /// buffer in the last submit; returns the run and its host nanoseconds recording
    /// and submitting.
    fn submit_part(
        &self,
        part: &Part,
        pre: &[CopyRegion],
        extra: &[Dispatch],
        reads: &[(&wgpu::Buffer, u64, u64)],
    ) -> Result<(Submitted, u64, u64), GpuError> {
        let gpu = &*part.gpu;
        // A lost device takes no more work (and a fault test may lose it here).
        gpu.injected_loss()?;
        // `gpu.tuning.profile` (`WGLLM_PROFILE=1`): before each run, time every dispatch
        // alone and log the totals per op (slow; for finding where the time goes).
        #[cfg(not(target_arch = "wasm32"))]
        if gpu.tuning.profile && self.parts.len() == 1 {
            self.log_profile(gpu)?;
        }
        // On GPUs the dispatches go in several submits, the first small, so the device
        // starts on the first layers while the host records the rest (llama.cpp's Vulkan
        // backend submits every ~100 nodes for the same reason); a CPU adapter (lavapipe)
        // gets one.
        let dispatches = &part.dispatches[..];
        let chunks: Vec<&[Dispatch]> = if gpu.kernels == crate::gpu::KernelShape::Gpu {
            let first = FIRST_SUBMIT.min(dispatches.len());
            let (head, rest) = dispatches.split_at(first);
            std::iter::once(head)
                .chain(rest.chunks(SUBMIT_EVERY))
                .collect()
        } else {
            vec![dispatches]
        };
        // Records one chunk into a fresh encoder; the host time goes to `record_ns`.
        let mut record_ns = 0u64;
        let mut encode = |chunk: &[Dispatch], pre: &[CopyRegion], extra: &[Dispatch]| {
            let t0 = web_time::Instant::now();
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            for c in pre {
                enc.copy_buffer_to_buffer(c.src, c.src_offset, c.dst, c.dst_offset, c.bytes);
            }
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                for d in chunk.iter().chain(extra) {
                    pass.set_pipeline(&d.pipeline);
                    pass.set_bind_group(0, &d.bind_group, &[]);
                    pass.dispatch_workgroups(d.groups[0], d.groups[1], d.groups[2]);
                }
            }
            record_ns += t0.elapsed().as_nanos() as u64;
            enc
        };
        let n_chunks = chunks.len();
        let (last, before) = chunks.split_last().expect("chunks start with the head");
        let mut submit_ns = 0u64;
        for chunk in before {
            let cmd = encode(chunk, pre, &[]).finish();
            let t = web_time::Instant::now();
            gpu.queue.submit([cmd]);
            submit_ns += t.elapsed().as_nanos() as u64;
        }
        let mut enc = encode(last, if n_chunks == 1 { pre } else { &[] }, extra);
        let t0 = web_time::Instant::now();
        let total: u64 = reads.iter().map(|r| r.2.div_ceil(4) * 4).sum();
        let staging = (!reads.is_empty()).then(|| {
            let staging = gpu.staging("readback", total);
            let mut at = 0;
            for &(buf, offset, bytes) in reads {
                let size = bytes.div_ceil(4) * 4;
                enc.copy_buffer_to_buffer(buf, offset, &staging, at, size);
                at += size;
            }
            (staging, total)
        });
        let cmd = enc.finish();
        record_ns += t0.elapsed().as_nanos() as u64;
        let t = web_time::Instant::now();
        let index = gpu.queue.submit([cmd]);
        submit_ns += t.elapsed().as_nanos() as u64;
        let gpu = part.gpu.clone();
        Ok((
            Submitted {
                staging,
                index,
                gpu,
            },
            record_ns,
            submit_ns,
        ))
    }
}

impl Part {
    /// What the part reads back for later parts: (buffer, offset, bytes).
    fn outbound_reads(&self) -> Vec<(wgpu::Buffer, u64, u64)> {
        (self.outbound.iter())
            .map(|(v, _)| (v.buf.clone(), v.offset, v.size))
            .collect()
    }

    /// Splits the part's readback `bytes` into its hops, by hop index.
    fn keep_hops(&self, bytes: &[u8], hops: &mut Vec<Vec<u8>>) {
        let mut at = 0usize;
        for (v, hop) in &self.outbound {
            let n = v.size as usize;
            if hops.len() <= *hop {
                hops.resize(*hop + 1, Vec::new());
            }
            hops[*hop] = bytes[at..at + n].to_vec();
            at += n.div_ceil(4) * 4;
        }
    }
}

/// A graph's run in flight part by part ([`Graph::start`]): the part submitted last and
/// the hops read back so far. [`Staged::advance`] waits for the part, hands its hops to
/// the next and submits that; once [`Staged::done`], [`Staged::finish`] gives the last
/// part's readback to wait for.
pub struct Staged {
    graph: Arc<Graph>,
    part: usize,
    sub: Option<Submitted>,
    hops: Vec<Vec<u8>>,
    /// What the last part reads back (logit rows).
    reads: Vec<(wgpu::Buffer, u64, u64)>,
    record_ns: u64,
    submit_ns: u64,
}

impl Staged {
    /// The part submitted last.
    pub fn part(&self) -> usize {
        self.part
    }

    /// Whether the last part is submitted.
    pub fn done(&self) -> bool {
        self.part + 1 == self.graph.parts.len()
    }

    fn submit_current(&mut self) -> Result<(), GpuError> {
        let g = self.graph.clone();
        let part = &g.parts[self.part];
        Graph::write_inbound(part, &self.hops)?;
        let reads = match self.part + 1 == g.parts.len() {
            true => self.reads.clone(),
            false => part.outbound_reads(),
        };
        let reads: Vec<(&wgpu::Buffer, u64, u64)> =
            reads.iter().map(|(b, o, n)| (b, *o, *n)).collect();
        let (sub, rec, sn) = g.submit_part(part, &[], &[], &reads)?;
        self.record_ns += rec;
        self.submit_ns += sn;
        self.sub = Some(sub);
        Ok(())
    }

    /// Waits for the part submitted last, writes its hops into the next part and
    /// submits that (nothing once done).
    pub fn advance(&mut self) -> Result<(), GpuError> {
        if self.done() {
            return Ok(());
        }
        let g = self.graph.clone();
        let part = &g.parts[self.part];
        let sub = self
            .sub
            .take()
            .expect("a started run has its part submitted");
        let bytes = wait_blocking(sub, &part.gpu)?;
        part.keep_hops(&bytes, &mut self.hops);
        self.part += 1;
        self.submit_current()
    }

    /// The last part's run, its readback still to come (every part submitted first).
    pub fn finish(mut self) -> Result<Submitted, GpuError> {
        while !self.done() {
            self.advance()?;
        }
        let g = self.graph.clone();
        g.store_run(
            self.record_ns,
            self.submit_ns,
            std::mem::take(&mut self.hops),
        );
        Ok(self.sub.take().expect("the last part is submitted"))
    }
}

/// The bytes a part's run read back, waiting for them (a split graph's hops; native
/// targets: a browser reaches one adapter, so its models are never split).
fn wait_blocking(sub: Submitted, gpu: &Gpu) -> Result<Vec<u8>, GpuError> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        Ok(pollster::block_on(sub.wait(gpu))?.0.unwrap_or_default())
    }
    #[cfg(target_arch = "wasm32")]
    {
        let _ = (sub, gpu);
        Err(GpuError::Validation(
            "a model split over devices cannot run in a browser".into(),
        ))
    }
}

/// A buffer copy recorded before a run's dispatches.
pub struct CopyRegion<'a> {
    pub src: &'a wgpu::Buffer,
    pub src_offset: u64,
    pub dst: &'a wgpu::Buffer,
    pub dst_offset: u64,
    pub bytes: u64,
}

/// A run whose commands are submitted and whose readback is still to come.
pub struct Submitted {
    /// The device of the part submitted last, whose queue the readback waits on.
    gpu: Arc<Gpu>,
    staging: Option<(wgpu::Buffer, u64)>,
    index: wgpu::SubmissionIndex,
}

impl Submitted {
    /// The bytes read back, once this run's last submit is done (later submits may still
    /// run), and the nanoseconds spent waiting for them. The wait is on the device of
    /// the run's last part (of a split graph without outputs, maybe not `_main`).
    pub async fn wait(self, _main: &Gpu) -> Result<(Option<Vec<u8>>, u64), GpuError> {
        let gpu = &*self.gpu;
        let t = web_time::Instant::now();
        let out = match self.staging {
            Some((staging, bytes)) => Some(
                gpu.map_read_after(&staging, bytes, Some(self.index))
                    .await?,
            ),
            None => {
                gpu.flush()?;
                None
            }
        };
        Ok((out, t.elapsed().as_nanos() as u64))
    }
}
