//! Where a step's time goes: every dispatch of a graph timed, summed per op kind, and set
//! against the cost model of its nodes ([`super::OpCost`]) as achieved GB/s and GFLOP/s.
//! With `TIMESTAMP_QUERY` each dispatch runs in its own compute pass with timestamps at
//! both ends (the GPU's own clock, no host overhead); without it each dispatch is
//! submitted alone and timed from the host, which adds a submit and a wait to every one
//! (fine for finding hot spots, not for absolute numbers).

use super::Graph;
use crate::gpu::{Gpu, GpuError};
use crate::ops::Dispatch;
use crate::ops::OpCost;

/// Logs a profile's time per op kind (`WGLLM_PROFILE=1`), one line each.
pub fn log_ops(p: &StepProfile) {
    for op in &p.ops {
        log::info!(
            "profile: {:<16} {:4} dispatches {:9.2} ms ({:.1} %)",
            op.kind,
            op.dispatches,
            op.ns / 1e6,
            100.0 * p.share(op)
        );
    }
}

/// How the dispatches of a profile were timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimingSource {
    /// GPU timestamps at the start and end of a compute pass per dispatch.
    GpuTimestamps,
    /// Host time around a submit-and-wait of each dispatch alone (no timestamp queries).
    Host,
}

impl TimingSource {
    /// The sentence a report prints with the numbers.
    pub fn note(self) -> &'static str {
        match self {
            TimingSource::GpuTimestamps => {
                "GPU timestamps, one compute pass per dispatch"
            }
            TimingSource::Host => {
                "host timing of each dispatch submitted alone (the adapter has no timestamp queries): includes submit and wait overhead per dispatch"
            }
        }
    }
}

/// One op kind's share of a step.
#[derive(Clone, Debug, PartialEq)]
pub struct OpProfile {
    /// [`super::Op::kind`]: `matmul q4_1`, `attention`, ...
    pub kind: String,
    pub nodes: usize,
    pub dispatches: usize,
    pub ns: f64,
    /// The cost model's bytes and flops of those nodes.
    pub bytes: u64,
    pub flops: u64,
}

impl OpProfile {
    pub fn gb_per_s(&self) -> f64 {
        if self.ns > 0.0 {
            self.bytes as f64 / self.ns
        } else {
            0.0
        }
    }
    pub fn gflop_per_s(&self) -> f64 {
        if self.ns > 0.0 {
            self.flops as f64 / self.ns
        } else {
            0.0
        }
    }
}

/// One kernel's share of a step (dispatches by their label: an op of several kernels,
/// such as attention's scores, softmax, output and join, shows each).
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTime {
    pub label: &'static str,
    pub dispatches: usize,
    pub ns: f64,
}

/// One step's profile: op kinds sorted by time, slowest first.
#[derive(Clone, Debug, PartialEq)]
pub struct StepProfile {
    pub source: TimingSource,
    /// Tokens of the step and cache cells its attention read.
    pub n_tok: u32,
    pub n_kv: u32,
    pub ops: Vec<OpProfile>,
    /// The same time by kernel, slowest first.
    pub kernels: Vec<KernelTime>,
    /// The step's dispatches, and those wgpu records a barrier before
    /// ([`crate::ops::barriers`]).
    pub dispatches: usize,
    pub barriers: usize,
}

impl StepProfile {
    /// Sum of the dispatch times.
    pub fn total_ns(&self) -> f64 {
        self.ops.iter().map(|o| o.ns).sum()
    }
    /// An op kind's fraction of the step, 0..1.
    pub fn share(&self, op: &OpProfile) -> f64 {
        let t = self.total_ns();
        if t > 0.0 {
            op.ns / t
        } else {
            0.0
        }
    }
}

/// Most dispatches timed with one query set (two timestamps each).
const QUERY_CHUNK: usize = wgpu::QUERY_SET_MAX_QUERIES as usize / 2;

impl Graph {
    /// Times every dispatch (GPU timestamps where the device has them, else the host) and
    /// sums the times and costs per op kind. Replays the whole graph in order, so the
    /// buffers end as a normal run leaves them. `extra` are dispatches recorded after the
    /// graph in the same step (sampling on the GPU), timed after it as one op of kind
    /// `extra.0` with cost `extra.1`.
    pub async fn profile(
        &self,
        gpu: &Gpu,
        extra: (&str, &[Dispatch], OpCost),
    ) -> Result<StepProfile, GpuError> {
        // Each part on its device, with the activations it took in the last run; the
        // extra dispatches after the last part, on the main device.
        let stamps = gpu.has_timestamps && self.parts.iter().all(|p| p.gpu.has_timestamps);
        let source = match stamps {
            true => TimingSource::GpuTimestamps,
            false => TimingSource::Host,
        };
        let hops = self.hops.lock().unwrap().clone();
        let mut all: Vec<&Dispatch> = Vec::new();
        let mut node_of: Vec<u32> = Vec::new();
        let mut ns = Vec::new();
        let n_parts = self.parts.len();
        for (i, part) in self.parts.iter().enumerate() {
            Self::write_inbound(part, &hops)?;
            let mut ds: Vec<&Dispatch> = part.dispatches.iter().collect();
            if i + 1 == n_parts {
                ds.extend(extra.1);
            }
            ns.extend(match stamps {
                true => time_gpu(&part.gpu, &ds).await?,
                false => time_host(&part.gpu, &ds)?,
            });
            all.extend(ds);
            node_of.extend(&part.node_of);
        }
        let extra_kind = (extra.0.to_string(), extra.2);
        let mut ops: Vec<OpProfile> = Vec::new();
        let mut kernels: Vec<KernelTime> = Vec::new();
        let mut last_node = u32::MAX;
        for (i, &t) in ns.iter().enumerate() {
            let label = all[i].label;
            match kernels.iter_mut().find(|k| k.label == label) {
                Some(k) => {
                    k.dispatches += 1;
                    k.ns += t;
                }
                None => kernels.push(KernelTime {
                    label,
                    dispatches: 1,
                    ns: t,
                }),
            }
            // The extra dispatches count as one more node after the graph's.
            let (node, (kind, cost)) = match node_of.get(i) {
                Some(&n) => (n, &self.costs[n as usize]),
                None => (u32::MAX - 1, &extra_kind),
            };
            let idx = match ops.iter().position(|o| &o.kind == kind) {
                Some(j) => j,
                None => {
                    ops.push(OpProfile {
                        kind: kind.clone(),
                        nodes: 0,
                        dispatches: 0,
                        ns: 0.0,
                        bytes: 0,
                        flops: 0,
                    });
                    ops.len() - 1
                }
            };
            let o = &mut ops[idx];
            o.dispatches += 1;
            o.ns += t;
            if node != last_node {
                o.nodes += 1;
                o.bytes += cost.bytes;
                o.flops += cost.flops;
                last_node = node;
            }
        }
        ops.sort_by(|a, b| b.ns.total_cmp(&a.ns));
        kernels.sort_by(|a, b| b.ns.total_cmp(&a.ns));
        Ok(StepProfile {
            source,
            n_tok: 0,
            n_kv: 0,
            ops,
            kernels,
            dispatches: all.len(),
            barriers: self.barriers + crate::ops::barriers(extra.1),
        })
    }
}

async fn time_gpu(gpu: &Gpu, dispatches: &[&Dispatch]) -> Result<Vec<f64>, GpuError> {
    let period = gpu.queue.get_timestamp_period() as f64;
    let mut out = Vec::with_capacity(dispatches.len());
    for chunk in dispatches.chunks(QUERY_CHUNK) {
        let n = 2 * chunk.len() as u32;
        let set = gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("profile timestamps"),
            ty: wgpu::QueryType::Timestamp,
            count: n,
        });
        let bytes = n as u64 * 8;
        let resolve = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("profile resolve"),
            size: bytes,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        for (i, d) in chunk.iter().enumerate() {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(d.label),
                timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                    query_set: &set,
                    beginning_of_pass_write_index: Some(2 * i as u32),
                    end_of_pass_write_index: Some(2 * i as u32 + 1),
                }),
            });
            pass.set_pipeline(&d.pipeline);
            pass.set_bind_group(0, &d.bind_group, &[]);
            pass.dispatch_workgroups(d.groups[0], d.groups[1], d.groups[2]);
        }
        enc.resolve_query_set(&set, 0..n, &resolve, 0);
        let staging = gpu.staging("profile readback", bytes);
        enc.copy_buffer_to_buffer(&resolve, 0, &staging, 0, bytes);
        gpu.queue.submit([enc.finish()]);
        let data = gpu.map_read(&staging, bytes).await?;
        let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(&data);
        for pair in ticks.chunks_exact(2) {
            out.push(pair[1].saturating_sub(pair[0]) as f64 * period);
        }
    }
    gpu.check()?;
    Ok(out)
}

#[cfg(not(target_arch = "wasm32"))]
fn time_host(gpu: &Gpu, dispatches: &[&Dispatch]) -> Result<Vec<f64>, GpuError> {
    let mut out = Vec::with_capacity(dispatches.len());
    for &d in dispatches {
        let t0 = std::time::Instant::now();
        crate::ops::run_now(gpu, std::slice::from_ref(d))?;
        out.push(t0.elapsed().as_secs_f64() * 1e9);
    }
    Ok(out)
}

#[cfg(target_arch = "wasm32")]
fn time_host(_gpu: &Gpu, _dispatches: &[&Dispatch]) -> Result<Vec<f64>, GpuError> {
    Err(GpuError::Validation(
        "profiling needs timestamp queries in a browser (the host cannot wait on the GPU)".into(),
    ))
}
