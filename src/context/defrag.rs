//! Defragmentation on the GPU: the cells' compaction plan (kv::KvCells::compact) applied
//! to every layer's K and V rows with buffer copies.

use super::{Context, ContextError};
use crate::kv::{CacheKind, KvType};

impl Context {
    /// Bytes of one cell's row in one layer of a cache of type `ty` (K or V).
    pub(super) fn kv_row_bytes(&self, ty: KvType) -> u64 {
        ty.row_bytes(self.model.hp.n_embd_kv() as u64)
    }

    /// Defragments when the share of holes exceeds `--defrag-thold`.
    pub(super) fn maybe_defrag(&mut self) -> Result<(), ContextError> {
        let thold = self.params.defrag_thold;
        if thold > 0.0 && self.cells.fragmentation() > thold {
            let moved = self.defrag()?;
            log::debug!("defragmented the KV cache: {moved} cells moved");
        }
        Ok(())
    }

    /// Moves every used cell to the front of the cache (K/V rows with it), so attention
    /// reads no holes. The outputs are unchanged. Returns the number of cells moved.
    pub fn defrag(&mut self) -> Result<usize, ContextError> {
        let moves = self.cells.compact();
        let Some(end) = moves.iter().map(|m| m.src + m.len).max() else {
            return Ok(0);
        };
        let gpu = self.model.gpu.clone();
        let (tk, tv) = (self.kv.cache.type_k, self.kv.cache.type_v);
        let max_row = self.kv_row_bytes(tk).max(self.kv_row_bytes(tv));
        // wgpu forbids copies within one buffer: stage each layer's rows in a scratch buffer.
        let tmp = gpu.storage("defrag rows", end as u64 * max_row)?;
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        // Only the full store's layers: a rolling buffer is small and never compacted.
        let full = (self.kv.k.iter().zip(&self.kv.v).enumerate())
            .filter(|(il, _)| self.layer_kind[*il] == CacheKind::Full)
            .flat_map(|(_, (k, v))| [(k, tk), (v, tv)]);
        for (t, ty) in full {
            let row = self.kv_row_bytes(ty);
            enc.copy_buffer_to_buffer(&t.buf, t.offset, &tmp, 0, end as u64 * row);
            for m in &moves {
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
        Ok(moves.iter().map(|m| m.len).sum())
    }
}
