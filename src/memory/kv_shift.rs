//! What a K/V store does to its rows on the GPU when cells move: the K-shift (keys
//! re-rotated by the positions a sequence operation changed) and defragmentation (the
//! cells' compaction plan applied to every layer's rows with buffer copies).

use super::KvCache;
use super::MemoryError;
use crate::kv::KvType;
use crate::ops::hadamard::hadamard;
use crate::ops::rope::{rope, RopeParams};
use crate::ops::set_rows::{kv_read, set_rows};
use crate::ops::{run_now, View, MAX_GROUPS};

/// Most bytes of f32 rows a packed K cache's shift reads back at a time.
const SHIFT_CHUNK_BYTES: u64 = 64 << 20;

impl KvCache {
    /// Re-rotates the keys of every layer held by each cell's delta. f32 and f16 keys
    /// rotate in place; packed ones (bf16, the block types) are read back as f32, rotated
    /// and written again, as llama.cpp's shift graph dequantizes, rotates and requantizes
    /// (undoing and redoing the Hadamard rotation around RoPE where keys are stored
    /// rotated), in chunks of cells whose f32 rows fit [`SHIFT_CHUNK_BYTES`].
    pub(super) fn shift_keys(&self, deltas: &[i32]) -> Result<(), MemoryError> {
        // Each device shifts the layers it holds.
        for d in 0..self.shape.placement.gpus().len() {
            self.shift_keys_on(d, deltas)?;
        }
        log::debug!(
            "K-shift applied to {} cells of the {:?} store",
            deltas.iter().filter(|&&d| d != 0).count(),
            self.kind
        );
        Ok(())
    }

    /// [`KvCache::shift_keys`] for the layers on device `d` of the placement.
    fn shift_keys_on(&self, d: usize, deltas: &[i32]) -> Result<(), MemoryError> {
        let placement = &self.shape.placement;
        if !self
            .layers
            .iter()
            .any(|&il| placement.layer_device(il) == d)
        {
            return Ok(());
        }
        let gpu = placement.gpus()[d].clone();
        let hp = &*self.shape;
        let ty = self.choice.type_k;
        let n_embd = hp.n_embd_kv();
        let n_cells = deltas.len() as u32;
        let chunk = if ty.is_packed() {
            let row = n_embd as u64 * 4;
            (gpu.max_binding.min(SHIFT_CHUNK_BYTES) / row).clamp(1, MAX_GROUPS as u64) as u32
        } else {
            n_cells
        };
        let tmp = match ty.is_packed() {
            true => Some(gpu.storage(
                "k_shift_rows",
                chunk.min(n_cells) as u64 * n_embd as u64 * 4,
            )?),
            false => None,
        };
        let mut dispatches = Vec::new();
        for c0 in (0..n_cells).step_by(chunk.max(1) as usize) {
            let n = chunk.min(n_cells - c0);
            let positions: Vec<f64> = deltas[c0 as usize..(c0 + n) as usize]
                .iter()
                .map(|&d| d as f64)
                .collect();
            // The cells set_rows writes back (packed keys only).
            let idx = match &tmp {
                Some(_) => {
                    let idx: Vec<u32> = (c0..c0 + n).collect();
                    Some(View::whole(
                        &gpu.upload("k_shift_cells", bytemuck::cast_slice(&idx))?,
                    ))
                }
                None => None,
            };
            // Each layer re-rotates with its own RoPE (Gemma's local and global layers
            // differ); one table per distinct parameter set.
            let mut tables: Vec<(RopeParams, View)> = Vec::new();
            for (&il, k) in self.layers.iter().zip(&self.k) {
                if placement.layer_device(il) != d {
                    continue;
                }
                // A store holds attention layers only, each with its RoPE.
                let Some(rp) = hp.layer_rope(il) else {
                    continue;
                };
                let table = match tables.iter().find(|(p, _)| *p == rp) {
                    Some((_, t)) => t.clone(),
                    None => {
                        let t = bytemuck::cast_slice(&rp.table(&positions)).to_vec();
                        let t = View::whole(&gpu.upload("k_shift_table", &t)?);
                        tables.push((rp, t.clone()));
                        t
                    }
                };
                let (Some(tmp), Some(idx)) = (&tmp, &idx) else {
                    let f16 = ty == KvType::F16;
                    dispatches.push(rope(&gpu, &rp, &table, k, hp.n_head_kv, n, f16)?);
                    continue;
                };
                let rows = View::whole(tmp);
                let (first, count) = (c0 * n_embd / 4, n * n_embd / 4);
                dispatches.push(kv_read(&gpu, k, &rows, first, count, ty)?);
                // Keys stored rotated (llama.cpp's attention rotation) are rotated back for
                // RoPE and again after, as llama.cpp's shift graph does.
                let rot = self.choice.rot_k;
                let unrotate =
                    |gpu: &crate::gpu::Gpu| hadamard(gpu, &rows, rot, n * n_embd / rot.max(1));
                if rot > 0 {
                    dispatches.push(unrotate(&gpu)?);
                }
                dispatches.push(rope(&gpu, &rp, &table, &rows, hp.n_head_kv, n, false)?);
                if rot > 0 {
                    dispatches.push(unrotate(&gpu)?);
                }
                dispatches.push(set_rows(&gpu, &rows, idx, k, n_embd, n, ty)?);
            }
        }
        run_now(&gpu, &dispatches)?;
        Ok(())
    }

    /// Moves every used cell to the front of the store (K/V rows with it), so attention
    /// reads no holes. The outputs are unchanged. Returns the number of cells moved.
    pub(super) fn compact(&mut self) -> Result<usize, MemoryError> {
        let moves = self.cells.compact();
        let Some(end) = moves.iter().map(|m| m.src + m.len).max() else {
            return Ok(0);
        };
        let (tk, tv) = (self.choice.type_k, self.choice.type_v);
        let max_row = self.row_bytes(tk).max(self.row_bytes(tv));
        for (d, gpu) in self.shape.placement.gpus().iter().enumerate() {
            self.apply_moves(gpu, d, &moves, end, max_row)?;
        }
        Ok(moves.iter().map(|m| m.len).sum())
    }

    /// The compaction's row copies for the layers on device `d`.
    fn apply_moves(
        &self,
        gpu: &crate::gpu::Gpu,
        d: usize,
        moves: &[crate::kv::Move],
        end: usize,
        max_row: u64,
    ) -> Result<(), MemoryError> {
        let placement = &self.shape.placement;
        let mine: Vec<(&View, KvType)> = (self.layer_tensors().into_iter())
            .filter(|(il, _, _)| placement.layer_device(*il) == d)
            .map(|(_, t, ty)| (t, ty))
            .collect();
        if mine.is_empty() {
            return Ok(());
        }
        // wgpu forbids copies within one buffer: stage each layer's rows in a scratch buffer.
        let tmp = gpu.storage("defrag rows", end as u64 * max_row)?;
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        for (t, ty) in mine {
            let row = self.row_bytes(ty);
            enc.copy_buffer_to_buffer(&t.buf, t.offset, &tmp, 0, end as u64 * row);
            for m in moves {
                enc.copy_buffer_to_buffer(
                    &tmp,
                    m.src as u64 * row,
                    &t.buf,
                    t.offset + m.dst as u64 * row,
                    m.len as u64 * row,
                );
            }
        }
        gpu.queue.submit([enc.finish()]);
        gpu.flush()?;
        Ok(())
    }
}
