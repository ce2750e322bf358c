//! Saving and loading the KV cache: the cells (position, sequences) and their K/V rows of
//! every layer, the whole cache or one sequence, plus the tokens they came from (what
//! `--prompt-cache` needs to reuse a prompt's prefix).
//!
//! File layout (little endian): magic, version, model shape (layers, K/V width, vocab),
//! the K and V cache types (ggml type ids; version 2 had one element size, 2 or 4, for
//! both), tokens, the number of K/V stores (1, or 2 where sliding-window layers
//! keep a rolling buffer), then per store: its cells (pos i32, sequence set u64), then per
//! layer of that store the K rows and the V rows of those cells, in cell order, as the
//! cache holds them (`crate::kv::KvType`'s layout).

use super::{Context, ContextError};
use crate::kv::{seqs_below, CacheKind, KvCells, KvType, SeqId};
use half::f16;
use std::path::Path;

const MAGIC: &[u8; 8] = b"WGLLMKV\0";
const VERSION: u32 = 3;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not a wgllm cache state file, or a damaged one ({what})")]
    Format { path: String, what: String },
    #[error(
        "{path}: the cache was saved for another model ({what}); delete the file to start afresh"
    )]
    OtherModel { path: String, what: String },
    #[error("{path}: the cache was saved {saved} a separate sliding-window buffer and this context has {}; load it with the same --swa-full setting", if *saved == "with" { "none" } else { "one" })]
    OtherLayout { path: String, saved: &'static str },
    #[error("{path}: the cache was saved with K {saved_k} and V {saved_v}, and this context holds K {k} and V {v}; load it with the same -ctk/-ctv (only f16 and f32 convert into each other)")]
    OtherTypes {
        path: String,
        saved_k: KvType,
        saved_v: KvType,
        k: KvType,
        v: KvType,
    },
    #[error("{path}: the saved cache has {cells} cells, more than fit in this context ({free} free); use a larger -c")]
    TooBig {
        path: String,
        cells: usize,
        free: usize,
    },
}

/// What a state file holds besides the K/V rows.
#[derive(Debug)]
pub struct SavedState {
    pub tokens: Vec<u32>,
    pub n_cells: usize,
}

struct Reader<'a> {
    data: &'a [u8],
    at: usize,
    path: &'a str,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], StateError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.data.len());
        let Some(end) = end else {
            return Err(StateError::Format {
                path: self.path.into(),
                what: format!("truncated at byte {}", self.at),
            });
        };
        let s = &self.data[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32, StateError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, StateError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
}

/// K/V rows saved as `from` for a cache of `to`: the same bytes, or f16 and f32 converted
/// into each other; None for any other pair.
fn convert(rows: &[u8], from: KvType, to: KvType) -> Option<Vec<u8>> {
    Some(match (from, to) {
        (KvType::F16, KvType::F32) => rows
            .chunks_exact(2)
            .flat_map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32().to_le_bytes())
            .collect(),
        (KvType::F32, KvType::F16) => rows
            .chunks_exact(4)
            .flat_map(|b| f16::from_f32(f32::from_le_bytes(b.try_into().unwrap())).to_le_bytes())
            .collect(),
        _ if from == to => rows.to_vec(),
        _ => return None,
    })
}

/// One store's part of a file, read and checked before anything changes.
struct StoreData {
    pos: Vec<i32>,
    sets: Vec<u64>,
    /// K then V rows of each layer of the store, converted to this context's element size.
    layers: Vec<Vec<u8>>,
}

impl Context {
    fn model_shape(&self) -> [u32; 3] {
        let hp = &self.model.hp;
        [hp.n_layer, hp.n_embd_kv(), hp.n_vocab]
    }

    /// The stores of this context, the full one first.
    pub(super) fn store_kinds(&self) -> Vec<CacheKind> {
        let mut kinds = vec![CacheKind::Full];
        if self.window.is_some() {
            kinds.push(CacheKind::Window);
        }
        kinds
    }

    fn store_cells(&self, kind: CacheKind) -> &KvCells {
        match (kind, &self.window) {
            (CacheKind::Window, Some(w)) => &w.cells,
            _ => &self.cells,
        }
    }

    /// The K and V views of the layers in store `kind`, K then V per layer, with their
    /// cache types.
    fn store_layers(&self, kind: CacheKind) -> Vec<(&crate::ops::View, KvType)> {
        let (tk, tv) = (self.kv.cache.type_k, self.kv.cache.type_v);
        (self.kv.k.iter().zip(&self.kv.v).enumerate())
            .filter(|(il, _)| self.layer_kind[*il] == kind)
            .flat_map(|(_, (k, v))| [(k, tk), (v, tv)])
            .collect()
    }

    /// Saves the cache (or only `seq`'s cells) and `tokens` to `path` (native targets:
    /// it waits for the K/V readback and writes a file).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn state_save(
        &mut self,
        path: &Path,
        tokens: &[u32],
        seq: Option<SeqId>,
    ) -> Result<(), ContextError> {
        let (out, n_saved) = self.state_bytes(tokens, seq)?;
        std::fs::write(path, out).map_err(|source| StateError::Io {
            path: path.display().to_string(),
            source,
        })?;
        log::info!(
            "saved {n_saved} cells and {} tokens to {}",
            tokens.len(),
            path.display()
        );
        Ok(())
    }

    /// The state format's bytes of the cache (or only `seq`'s cells) and `tokens`, and
    /// how many cells they hold (native targets: it waits for the K/V readback).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn state_bytes(
        &mut self,
        tokens: &[u32],
        seq: Option<SeqId>,
    ) -> Result<(Vec<u8>, usize), ContextError> {
        if let Some(s) = seq {
            self.check_seq(s)?;
        }
        self.apply_k_shift()?; // pending deltas are not part of the format
        let mut out = Vec::new();
        out.extend(MAGIC);
        out.extend(VERSION.to_le_bytes());
        self.model_shape()
            .iter()
            .for_each(|v| out.extend(v.to_le_bytes()));
        out.extend(self.kv.cache.type_k.ggml_id().to_le_bytes());
        out.extend(self.kv.cache.type_v.ggml_id().to_le_bytes());
        out.extend((tokens.len() as u32).to_le_bytes());
        tokens.iter().for_each(|t| out.extend(t.to_le_bytes()));
        let kinds = self.store_kinds();
        out.extend((kinds.len() as u32).to_le_bytes());
        let gpu = self.model.gpu.clone();
        let mut n_saved = 0;
        for kind in kinds {
            let cells = self.store_cells(kind);
            let picked: Vec<usize> = (0..cells.size())
                .filter(|&i| {
                    let c = cells.cells()[i];
                    seq.map_or(!c.is_empty(), |s| c.has_seq(s))
                })
                .collect();
            if kind == CacheKind::Full {
                n_saved = picked.len();
            }
            out.extend((picked.len() as u32).to_le_bytes());
            for &i in &picked {
                let c = cells.cells()[i];
                out.extend(c.pos.to_le_bytes());
                // One sequence is saved as sequence 0, to be loaded into any other.
                let set = if seq.is_some() { 1u64 } else { c.seq };
                out.extend(set.to_le_bytes());
            }
            let end = picked.last().map_or(0, |&i| i + 1);
            if end == 0 {
                continue;
            }
            for (t, ty) in self.store_layers(kind) {
                let row = self.kv_row_bytes(ty) as usize;
                let rows = gpu.read_bytes(&t.buf, t.offset, (end * row) as u64)?;
                for &i in &picked {
                    out.extend(&rows[i * row..(i + 1) * row]);
                }
            }
        }
        Ok((out, n_saved))
    }

    /// Loads a state file: the whole cache (replacing it) or, with `dst`, one saved
    /// sequence into sequence `dst` (replacing that sequence). Returns the saved tokens.
    pub fn state_load(
        &mut self,
        path: &Path,
        dst: Option<SeqId>,
    ) -> Result<SavedState, ContextError> {
        let p = path.display().to_string();
        let data = std::fs::read(path).map_err(|source| StateError::Io {
            path: p.clone(),
            source,
        })?;
        self.state_from_bytes(&data, &p, dst)
    }

    /// [`Self::state_load`] from the format's bytes; `p` names them in errors and logs.
    pub fn state_from_bytes(
        &mut self,
        data: &[u8],
        p: &str,
        dst: Option<SeqId>,
    ) -> Result<SavedState, ContextError> {
        let p = p.to_string();
        let mut r = Reader {
            data,
            at: 0,
            path: &p,
        };
        let format = |what: &str| StateError::Format {
            path: p.clone(),
            what: what.into(),
        };
        if r.take(8)? != MAGIC {
            return Err(format("bad magic").into());
        }
        let version = r.u32()?;
        if version != VERSION && version != 2 {
            return Err(format(&format!("version {version}, expected {VERSION}")).into());
        }
        let shape = [r.u32()?, r.u32()?, r.u32()?];
        if shape != self.model_shape() {
            return Err(StateError::OtherModel {
                path: p.clone(),
                what: format!(
                    "layers, K/V width, vocabulary {:?}; this model has {:?}",
                    shape,
                    self.model_shape()
                ),
            }
            .into());
        }
        let (saved_k, saved_v) = if version == 2 {
            match r.u32()? {
                2 => (KvType::F16, KvType::F16),
                4 => (KvType::F32, KvType::F32),
                elem => return Err(format(&format!("K/V element size {elem}")).into()),
            }
        } else {
            let mut ty = || -> Result<KvType, StateError> {
                let id = r.u32()?;
                KvType::from_ggml_id(id).ok_or_else(|| format(&format!("cache type id {id}")))
            };
            (ty()?, ty()?)
        };
        let (k, v) = (self.kv.cache.type_k, self.kv.cache.type_v);
        if convert(&[], saved_k, k).is_none() || convert(&[], saved_v, v).is_none() {
            return Err(StateError::OtherTypes {
                path: p.clone(),
                saved_k,
                saved_v,
                k,
                v,
            }
            .into());
        }
        let n_tok = r.u32()? as usize;
        let tokens: Vec<u32> = (0..n_tok).map(|_| r.u32()).collect::<Result<_, _>>()?;
        let kinds = self.store_kinds();
        let n_stores = r.u32()? as usize;
        if n_stores != kinds.len() {
            if n_stores != 1 && n_stores != 2 {
                return Err(format(&format!("{n_stores} K/V stores")).into());
            }
            let saved = if n_stores == 2 { "with" } else { "without" };
            return Err(StateError::OtherLayout {
                path: p.clone(),
                saved,
            }
            .into());
        }
        let n_seq = self.params.n_seq_max;
        // Read (and check) everything before touching the cache.
        let mut stores = Vec::with_capacity(kinds.len());
        for &kind in &kinds {
            let n_cells = r.u32()? as usize;
            // 12 bytes per cell: a damaged count fails here, not in an allocation.
            if n_cells.saturating_mul(12) > r.data.len() - r.at {
                return Err(format(&format!("{n_cells} cells do not fit in the file")).into());
            }
            let mut pos = Vec::with_capacity(n_cells);
            let mut sets = Vec::with_capacity(n_cells);
            for i in 0..n_cells {
                let p = r.u32()? as i32;
                if p < 0 {
                    return Err(format(&format!("cell {i} has the negative position {p}")).into());
                }
                pos.push(p);
                let set = r.u64()?;
                if set == 0 {
                    return Err(format(&format!("cell {i} belongs to no sequence")).into());
                }
                if set & !seqs_below(n_seq) != 0 {
                    let bad = 63 - (set & !seqs_below(n_seq)).leading_zeros();
                    return Err(format(&format!(
                        "cell {i} belongs to sequence {bad}, beyond this context's ids 0..{n_seq} (-np {n_seq})"
                    ))
                    .into());
                }
                sets.push(set);
            }
            let store = self.store_layers(kind);
            let mut layers = Vec::with_capacity(store.len());
            for (i, &(_, ty)) in store.iter().enumerate() {
                let saved = if i % 2 == 0 { saved_k } else { saved_v };
                let saved_row = self.kv_row_bytes(saved) as usize;
                let rows = r.take(n_cells * saved_row)?;
                layers.push(convert(rows, saved, ty).expect("checked above"));
            }
            stores.push(StoreData { pos, sets, layers });
        }
        if r.at != data.len() {
            return Err(format("trailing bytes").into());
        }
        if let Some(s) = dst {
            self.check_seq(s)?;
        }
        // The new cells are laid out on copies, which replace the stores only once they
        // all fit: a file that does not fit leaves the cache (and `dst`) as it was.
        let mut placed = Vec::with_capacity(kinds.len());
        for (&kind, st) in kinds.iter().zip(&mut stores) {
            let mut cells = self.store_cells(kind).clone();
            match dst {
                None => cells.clear(),
                Some(s) => {
                    cells.seq_rm(Some(s), -1, -1)?;
                    let bit = KvCells::seq_bit(s)?;
                    st.sets.iter_mut().for_each(|v| *v = bit);
                }
            }
            let n_cells = st.pos.len();
            let slots = if n_cells == 0 {
                Vec::new()
            } else {
                cells.find_slot(n_cells).map_err(|_| StateError::TooBig {
                    path: p.clone(),
                    cells: n_cells,
                    free: cells.size() - cells.used(),
                })?
            };
            cells.store(&slots, &st.pos, &st.sets)?;
            placed.push((cells, slots));
        }
        let gpu = self.model.gpu.clone();
        for ((&kind, st), (cells, slots)) in kinds.iter().zip(&stores).zip(placed) {
            for ((t, ty), rows) in self.store_layers(kind).into_iter().zip(&st.layers) {
                let row = self.kv_row_bytes(ty);
                // One write per run of consecutive cells (the slots may be scattered).
                let mut a = 0;
                while a < slots.len() {
                    let mut b = a + 1;
                    while b < slots.len() && slots[b] == slots[b - 1] + 1 {
                        b += 1;
                    }
                    let bytes = &rows[a * row as usize..b * row as usize];
                    gpu.write(&t.buf, t.offset + slots[a] as u64 * row, bytes);
                    a = b;
                }
            }
            *self.store_cells_mut(kind) = cells;
        }
        let n_cells = stores[0].pos.len();
        log::info!("loaded {n_cells} cells and {n_tok} tokens from {p}");
        Ok(SavedState { tokens, n_cells })
    }
}
