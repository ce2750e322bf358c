//! The context's side of sampling on the GPU: the buffers the sampling kernels bind
//! (`crate::ops::sample`), each slot's penalty history and logit bias mirrored there,
//! and the dispatches for a ubatch's rows to draw.
//!
//! A slot's GPU history is current while the stamp it was synced with equals the
//! session sampler's [`crate::sample::Sampler::history_stamp`]; a draw that records its
//! token on the GPU forgets the stamp until the engine has taken the token too.

use crate::gpu::{Gpu, GpuError};
use crate::kv::SeqId;
use crate::ops::sample::{self, SampleBuffers, MAX_K};
use crate::ops::uniforms::SampleRow;
use crate::ops::{Dispatch, View};
use crate::sample::{FLAG_PENALTIES, RING_MAX};

/// One output row the GPU samples instead of returning its logits.
#[derive(Clone, Copy, Debug)]
pub struct GpuDraw {
    /// Index of the batch token whose logits are sampled (its logits flag is set).
    pub index: usize,
    /// The settings ([`crate::sample::gpu_row`]) with the slot and the uniform number
    /// filled in; the logits row is the context's to fill.
    pub row: SampleRow,
}

/// A token drawn on the GPU.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Drawn {
    pub token: u32,
    /// Its probability after the chain.
    pub prob: f32,
    /// The row's first `n_probs` final candidates with probability above 0, best first
    /// (llama-server's post-sampling probabilities).
    pub top: Vec<(u32, f32)>,
}

/// The sampling buffers, made at the first draw.
pub(super) struct SampleState {
    n_vocab: u32,
    /// Rows one ubatch can draw (one per sequence).
    n_rows_max: u32,
    rows: wgpu::Buffer,
    cand: wgpu::Buffer,
    ring: wgpu::Buffer,
    result: wgpu::Buffer,
    probs: wgpu::Buffer,
    /// Per slot and token: counts and bias, made when a session first needs them.
    counts: Option<wgpu::Buffer>,
    bias: Option<wgpu::Buffer>,
    /// Bound where `counts` or `bias` is not made yet (no row reads it).
    empty: wgpu::Buffer,
    /// Per slot: the history stamp the GPU copy matches.
    stamps: Vec<Option<u64>>,
    /// Dispatches for (rows, k stride), rebuilt when a buffer is made.
    cached: Option<((u32, u32), Vec<Dispatch>)>,
}

impl SampleState {
    pub(super) fn new(
        gpu: &Gpu,
        n_vocab: u32,
        n_slots: u32,
        n_rows_max: u32,
    ) -> Result<Self, GpuError> {
        let n_rows_max = n_rows_max.min(n_slots).max(1);
        Ok(SampleState {
            n_vocab,
            n_rows_max,
            rows: gpu.storage(
                "sample rows",
                n_rows_max as u64 * std::mem::size_of::<SampleRow>() as u64,
            )?,
            cand: gpu.storage("sample candidates", sample::cand_bytes(n_vocab, n_rows_max))?,
            ring: gpu.storage("sample history", n_slots as u64 * (RING_MAX as u64 + 2) * 4)?,
            result: gpu.storage("sample result", n_rows_max as u64 * 8)?,
            probs: gpu.storage("sample probabilities", sample::probs_bytes(n_rows_max))?,
            counts: None,
            bias: None,
            empty: gpu.storage("sample (unused)", 16)?,
            stamps: vec![None; n_slots as usize],
            cached: None,
        })
    }

    /// The (token, probability bits) pairs of the last drawing step.
    pub(super) fn result(&self) -> &wgpu::Buffer {
        &self.result
    }

    pub(super) fn n_rows_max(&self) -> u32 {
        self.n_rows_max
    }

    pub(super) fn stamp(&self, slot: SeqId) -> Option<u64> {
        self.stamps.get(slot as usize).copied().flatten()
    }

    pub(super) fn set_stamp(&mut self, slot: SeqId, stamp: Option<u64>) {
        if let Some(s) = self.stamps.get_mut(slot as usize) {
            *s = stamp;
        }
    }

    /// Forgets every slot's copy (after a failed step, whose draws may have recorded).
    pub(super) fn forget_all(&mut self) {
        self.stamps.iter_mut().for_each(|s| *s = None);
    }

    /// A per-slot, per-token buffer, made on first use.
    fn per_token(
        gpu: &Gpu,
        have: &mut Option<wgpu::Buffer>,
        label: &str,
        n_slots: usize,
        n_vocab: u32,
    ) -> Result<wgpu::Buffer, String> {
        if let Some(b) = have {
            return Ok(b.clone());
        }
        let bytes = n_slots as u64 * n_vocab as u64 * 4;
        if bytes > gpu.max_binding {
            return Err(format!(
                "the {label} of {n_slots} sequence(s) over {n_vocab} tokens ({bytes} bytes) exceed the adapter's storage binding limit ({})",
                gpu.max_binding
            ));
        }
        let b = gpu.storage(label, bytes).map_err(|e| e.to_string())?;
        *have = Some(b.clone());
        Ok(b)
    }

    /// Copies a slot's penalty history (oldest first, at most `cap` tokens) and dense
    /// logit bias to the GPU and remembers `stamp`. An `Err` says why this session
    /// cannot sample on the GPU.
    pub(super) fn sync(
        &mut self,
        gpu: &Gpu,
        slot: SeqId,
        stamp: u64,
        row: &SampleRow,
        history: &[u32],
        bias: Option<&[f32]>,
    ) -> Result<(), String> {
        let n_slots = self.stamps.len();
        let v = self.n_vocab as usize;
        let slot_off = slot as u64 * v as u64 * 4;
        if row.flags & FLAG_PENALTIES != 0 {
            let made = self.counts.is_none();
            let counts = Self::per_token(
                gpu,
                &mut self.counts,
                "sample counts",
                n_slots,
                self.n_vocab,
            )?;
            if made {
                self.cached = None;
            }
            let mut dense = vec![0u32; v];
            let cap = row.ring_cap.min(RING_MAX) as usize;
            let recent = &history[history.len().saturating_sub(cap)..];
            for &t in recent {
                if let Some(c) = dense.get_mut(t as usize) {
                    *c += 1;
                }
            }
            gpu.write(&counts, slot_off, bytemuck::cast_slice(&dense));
            let mut ring = vec![0u32, recent.len() as u32];
            ring.extend_from_slice(recent);
            gpu.write(
                &self.ring,
                slot as u64 * (RING_MAX as u64 + 2) * 4,
                bytemuck::cast_slice(&ring),
            );
        }
        if let Some(bias) = bias {
            let made = self.bias.is_none();
            let buf = Self::per_token(gpu, &mut self.bias, "sample bias", n_slots, self.n_vocab)?;
            if made {
                self.cached = None;
            }
            gpu.write(&buf, slot_off, bytemuck::cast_slice(bias));
        }
        self.set_stamp(slot, Some(stamp));
        Ok(())
    }

    /// The dispatches of the last [`SampleState::record`] (for profiles).
    pub(super) fn dispatches(&self) -> &[Dispatch] {
        self.cached.as_ref().map_or(&[], |c| &c.1)
    }

    /// Writes the rows and returns the dispatches drawing them from `logits`, the result
    /// buffer (a (token, probability bits) pair per row) and the probabilities buffer
    /// (the final candidates of rows that ask, [`sample::probs_bytes`] apart).
    pub(super) fn record(
        &mut self,
        gpu: &Gpu,
        logits: &wgpu::Buffer,
        rows: &[SampleRow],
    ) -> Result<(&[Dispatch], &wgpu::Buffer, &wgpu::Buffer), GpuError> {
        let n = rows.len() as u32;
        let k_stride = rows.iter().map(|r| r.k).max().unwrap_or(1).clamp(1, MAX_K);
        for r in rows {
            if r.flags & FLAG_PENALTIES != 0 {
                // Recorded on the GPU before the engine takes it: not a copy of the
                // sampler's history until then.
                self.set_stamp(r.slot, None);
            }
        }
        gpu.write(&self.rows, 0, bytemuck::cast_slice(rows));
        let key = (n, k_stride);
        if self.cached.as_ref().map(|c| c.0) != Some(key) {
            let view = |b: &Option<wgpu::Buffer>| View::whole(b.as_ref().unwrap_or(&self.empty));
            let b = SampleBuffers {
                logits: &View::whole(logits),
                rows: &View::whole(&self.rows),
                counts: &view(&self.counts),
                bias: &view(&self.bias),
                cand: &View::whole(&self.cand),
                ring: &View::whole(&self.ring),
                result: &View::whole(&self.result),
                probs: &View::whole(&self.probs),
            };
            let d = sample::sample(gpu, &b, self.n_vocab, n, k_stride, RING_MAX)?;
            self.cached = Some((key, d));
        }
        Ok((&self.cached.as_ref().unwrap().1, &self.result, &self.probs))
    }
}
