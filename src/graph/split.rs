//! Turning built nodes into a [`Graph`]: runs of consecutive nodes on one device become
//! parts, each device plans its own scratch buffers, and every intermediate a part reads
//! from another device gets a copy there, filled between the parts from the host (read
//! back at the end of the part that made it). Graph inputs read on a device other than
//! the main one are read from their mirrors, which the context fills with the same data.

use super::builder::{GraphBuilder, Storage, TensorId};
use super::{planner, Graph, Part};
use crate::gpu::GpuError;
use crate::ops::View;
use std::collections::HashMap;

/// The graph inputs' copies on the devices of a split model: by the main device's buffer,
/// each device's copy (none on the main device itself).
#[derive(Default)]
pub struct InputMirrors {
    copies: HashMap<wgpu::Buffer, Vec<Option<View>>>,
}

impl InputMirrors {
    /// Records `copies` (one per device, by index) of the input in `main`.
    pub fn insert(&mut self, main: wgpu::Buffer, copies: Vec<Option<View>>) {
        self.copies.insert(main, copies);
    }

    /// The copy on device `d` of the input whose main buffer `v` views.
    fn on(&self, v: &View, d: usize) -> Option<View> {
        let c = self.copies.get(&v.buf)?.get(d)?.as_ref()?;
        Some(View {
            buf: c.buf.clone(),
            offset: c.offset + v.offset,
            size: v.size,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.copies.is_empty()
    }
}

/// An activation crossing devices: made by part `src` in `from`, read by part `dst`
/// through its copy `to`.
struct Hop {
    src: usize,
    dst: usize,
    from: TensorId,
    to: TensorId,
}

impl GraphBuilder {
    /// Plans each device's scratch buffers and records every dispatch.
    pub fn build(mut self) -> Result<Graph, GpuError> {
        super::fuse::add_rms_norm(&mut self.nodes, &mut self.node_device);
        let main = self.placement.main_index();
        // Parts: runs of nodes on one device.
        let mut parts: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
        for (i, &d) in self.node_device.iter().enumerate() {
            match parts.last_mut() {
                Some((pd, r)) if *pd == d => r.end = i + 1,
                _ => parts.push((d, i..i + 1)),
            }
        }
        if parts.is_empty() {
            parts.push((main, 0..0));
        }
        // Each scratch tensor belongs to the device that first writes it; another
        // device reading it reads its own copy, brought over once per value.
        let n = self.tensors.len();
        let mut home: Vec<Option<usize>> = vec![None; n];
        let mut made_in: Vec<usize> = vec![0; n];
        let mut copies: HashMap<(TensorId, usize), TensorId> = HashMap::new();
        let mut fresh: HashMap<(TensorId, usize), bool> = HashMap::new();
        let mut mirrored: HashMap<(TensorId, usize), TensorId> = HashMap::new();
        let mut hops: Vec<Hop> = Vec::new();
        for (p, (d, range)) in parts.iter().enumerate() {
            let d = *d;
            for i in range.clone() {
                let reads = self.nodes[i].reads.clone();
                let mut new_reads = Vec::with_capacity(reads.len());
                for t in reads {
                    let storage = match &self.tensors[t] {
                        Storage::External(v) => Err(v.clone()),
                        Storage::Scratch { bytes } => Ok(*bytes),
                    };
                    new_reads.push(match storage {
                        // Only what was made on the main device can be one of its
                        // inputs: buffers of different wgpu instances may compare equal.
                        Err(v) if d != main && self.made_on[t] == main => {
                            match mirrored.get(&(t, d)) {
                                Some(&m) => m,
                                None => match self.mirrors.on(&v, d) {
                                    Some(mv) => {
                                        let ne = self.ne(t);
                                        let m = self.input(mv, ne);
                                        mirrored.insert((t, d), m);
                                        m
                                    }
                                    None => t,
                                },
                            }
                        }
                        Err(_) => t,
                        Ok(bytes) => {
                            let h = *home[t].get_or_insert(d);
                            if h == d {
                                t
                            } else {
                                let c = match copies.get(&(t, d)) {
                                    Some(&c) => c,
                                    None => {
                                        let ne = self.ne(t);
                                        let c = self.tensor(ne);
                                        if let Storage::Scratch { bytes: b } = &mut self.tensors[c]
                                        {
                                            *b = bytes;
                                        }
                                        copies.insert((t, d), c);
                                        c
                                    }
                                };
                                if !fresh.get(&(t, d)).copied().unwrap_or(false) {
                                    hops.push(Hop {
                                        src: made_in[t],
                                        dst: p,
                                        from: t,
                                        to: c,
                                    });
                                    fresh.insert((t, d), true);
                                }
                                c
                            }
                        }
                    });
                }
                self.nodes[i].reads = new_reads;
                for &t in &self.nodes[i].writes {
                    match &self.tensors[t] {
                        Storage::Scratch { .. } => {
                            let h = *home[t].get_or_insert(d);
                            if h != d {
                                return Err(GpuError::Validation(format!(
                                    "a split graph writes one intermediate on devices {h} and {d}"
                                )));
                            }
                            made_in[t] = p;
                            fresh.retain(|(x, _), _| *x != t);
                        }
                        Storage::External(v)
                            if d != main
                                && self.made_on[t] == main
                                && self.mirrors.on(v, d).is_some() =>
                        {
                            return Err(GpuError::Validation(format!(
                                "a split graph writes a graph input off the main device ({})",
                                self.nodes[i].op.kind()
                            )));
                        }
                        Storage::External(_) => {}
                    }
                }
            }
        }
        // Each device plans the nodes it runs; a hop's source lives to the end of the
        // part that reads it back, its copy from the start of the part it enters.
        let n_dev = self.placement.gpus().len();
        let mut part_dispatches: Vec<(Vec<crate::ops::Dispatch>, Vec<u32>)> =
            (0..parts.len()).map(|_| Default::default()).collect();
        let mut views: HashMap<TensorId, View> = HashMap::new();
        let mut scratch = Vec::new();
        let costs: Vec<(String, super::OpCost)> = (self.nodes.iter())
            .map(|nd| (nd.op.kind(), nd.op.cost()))
            .collect();
        for dev in 0..n_dev {
            let mine: Vec<usize> = (0..parts.len()).filter(|&p| parts[p].0 == dev).collect();
            if mine.is_empty() {
                continue;
            }
            let gpu = self.placement.gpus()[dev].clone();
            let mut uses: Vec<Vec<TensorId>> = Vec::new();
            let mut local_nodes: Vec<usize> = Vec::new();
            for &p in &mine {
                let range = parts[p].1.clone();
                let start = uses.len();
                for i in range {
                    let nd = &self.nodes[i];
                    uses.push(nd.reads.iter().chain(&nd.writes).copied().collect());
                    local_nodes.push(i);
                }
                if uses.len() == start {
                    continue;
                }
                let end = uses.len() - 1;
                for h in hops.iter().filter(|h| h.dst == p) {
                    uses[start].insert(0, h.to);
                }
                for h in hops.iter().filter(|h| h.src == p) {
                    uses[end].push(h.from);
                }
            }
            let plan = planner::plan_uses(&self.tensors, &uses);
            let mut bufs = Vec::with_capacity(plan.buffer_sizes.len());
            for (i, &bytes) in plan.buffer_sizes.iter().enumerate() {
                bufs.push(gpu.storage(&format!("scratch{i}"), bytes)?);
            }
            let view = |t: TensorId| -> View {
                match &self.tensors[t] {
                    Storage::External(v) => v.clone(),
                    Storage::Scratch { bytes } => View {
                        buf: bufs[plan.assignment[t].expect("planned")].clone(),
                        offset: 0,
                        size: bytes.div_ceil(16) * 16,
                    },
                }
            };
            for h in &hops {
                if parts[h.src].0 == dev {
                    views.insert(h.from, view(h.from));
                }
                if parts[h.dst].0 == dev {
                    views.insert(h.to, view(h.to));
                }
            }
            for &p in &mine {
                let (ds, node_of) = &mut part_dispatches[p];
                for i in parts[p].1.clone() {
                    let nd = &self.nodes[i];
                    let r: Vec<View> = nd.reads.iter().map(|&t| view(t)).collect();
                    let w: Vec<View> = nd.writes.iter().map(|&t| view(t)).collect();
                    nd.op.as_node().record(&gpu, &r, &w, ds)?;
                    // Every dispatch this node recorded belongs to it.
                    node_of.resize(ds.len(), i as u32);
                }
            }
            gpu.check()?;
            scratch.extend(bufs);
        }
        let mut out = Vec::with_capacity(parts.len());
        for (p, ((dev, _), (dispatches, node_of))) in parts.iter().zip(part_dispatches).enumerate()
        {
            // A hop moves the tensor's bytes (its view is padded to 16).
            let sized = |t: TensorId| {
                let mut v = views[&t].clone();
                if let Storage::Scratch { bytes } = self.tensors[t] {
                    v.size = bytes.div_ceil(4) * 4;
                }
                v
            };
            out.push(Part {
                gpu: self.placement.gpus()[*dev].clone(),
                dispatches,
                node_of,
                inbound: (hops.iter().enumerate())
                    .filter(|(_, h)| h.dst == p)
                    .map(|(k, h)| (sized(h.to), k))
                    .collect(),
                outbound: (hops.iter().enumerate())
                    .filter(|(_, h)| h.src == p)
                    .map(|(k, h)| (sized(h.from), k))
                    .collect(),
            });
        }
        if log::log_enabled!(log::Level::Debug) {
            let mut per_op: std::collections::BTreeMap<&str, usize> = Default::default();
            for d in out.iter().flat_map(|p| &p.dispatches) {
                *per_op.entry(d.label).or_default() += 1;
            }
            let counts: Vec<String> = per_op.iter().map(|(k, v)| format!("{k} {v}")).collect();
            log::debug!(
                "graph: {} dispatches per step in {} part(s), {} hop(s) ({})",
                out.iter().map(|p| p.dispatches.len()).sum::<usize>(),
                out.len(),
                hops.len(),
                counts.join(", ")
            );
        }
        let scratch_bytes = scratch.iter().map(|b| b.size()).sum();
        let barriers = out
            .iter()
            .map(|p| crate::ops::barriers(&p.dispatches))
            .sum();
        Ok(Graph {
            parts: out,
            barriers,
            hops: Default::default(),
            costs,
            scratch,
            scratch_bytes,
            record_ns: Default::default(),
            submit_ns: Default::default(),
            wait_ns: Default::default(),
        })
    }
}
