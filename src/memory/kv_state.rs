//! The K/V stores' part of a state file (`crate::context::state` writes the header and
//! the tokens): the K and V cache types (ggml type ids), the number of stores (1, or 2
//! where sliding-window layers keep a rolling buffer), then per store its cells (pos i32,
//! sequence set u64, next M-RoPE time i32 (`Cell::rope_next`, version 6 on)) and, per layer of that store, the K rows and the V rows of those
//! cells in cell order, as the cache holds them (`crate::kv::KvType`'s layout).

use super::MemoryError;
use super::{convert, Reader, StateError};
use super::{KvCache, StateLoad};
#[cfg(not(target_arch = "wasm32"))]
use crate::kv::SeqId;
use crate::kv::{seqs_below, KvCells, KvType};
use crate::ops::View;

/// Writes `stores` (the main one first); returns the cells saved from the first.
#[cfg(not(target_arch = "wasm32"))]
pub(super) fn write(
    out: &mut Vec<u8>,
    stores: &[&KvCache],
    seq: Option<SeqId>,
) -> Result<usize, MemoryError> {
    let Some(first) = stores.first() else {
        return Ok(0);
    };
    out.extend(first.choice.type_k.ggml_id().to_le_bytes());
    out.extend(first.choice.type_v.ggml_id().to_le_bytes());
    out.extend((stores.len() as u32).to_le_bytes());
    let mut n_saved = 0;
    for (i, store) in stores.iter().enumerate() {
        let cells = &store.cells;
        let picked: Vec<usize> = (0..cells.size())
            .filter(|&i| {
                let c = cells.cells()[i];
                seq.map_or(!c.is_empty(), |s| c.has_seq(s))
            })
            .collect();
        if i == 0 {
            n_saved = picked.len();
        }
        out.extend((picked.len() as u32).to_le_bytes());
        for &i in &picked {
            let c = cells.cells()[i];
            out.extend(c.pos.to_le_bytes());
            // One sequence is saved as sequence 0, to be loaded into any other.
            let set = if seq.is_some() { 1u64 } else { c.seq };
            out.extend(set.to_le_bytes());
            out.extend(c.rope_next.to_le_bytes());
        }
        let end = picked.last().map_or(0, |&i| i + 1);
        if end == 0 {
            continue;
        }
        for (il, t, ty) in store.layer_tensors() {
            let gpu = store.shape.gpu_of(il);
            let row = store.row_bytes(ty) as usize;
            let rows = gpu.read_bytes(&t.buf, t.offset, (end * row) as u64)?;
            for &i in &picked {
                out.extend(&rows[i * row..(i + 1) * row]);
            }
        }
    }
    Ok(n_saved)
}

/// What loading a state file needs of a K/V store: its types and cells, and a place for
/// the loaded rows. [`KvCache`] writes them to its GPU buffers; [`HostKvStore`] keeps them
/// in memory (the state-file fuzz target loads into two of those, no GPU needed).
pub(crate) trait KvStore {
    /// The cache's K and V types (what saved rows are converted to).
    fn types(&self) -> (KvType, KvType);
    /// The type of each tensor, per layer K then V.
    fn tensor_types(&self) -> Vec<KvType>;
    /// Bytes of one cell's row of a tensor of type `ty`.
    fn row_bytes(&self, ty: KvType) -> u64;
    fn cells(&self) -> &KvCells;
    /// Takes `cells` as the store's cells, with `rows[t]` (tensor `t`'s rows, cell by
    /// cell) written at the cells `slots`.
    fn replace(&mut self, cells: KvCells, slots: &[usize], rows: &[Vec<u8>]);
}

/// Runs of consecutive slots: (index into `slots` where the run starts, where it ends).
fn runs(slots: &[usize]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut a = 0;
    while a < slots.len() {
        let mut b = a + 1;
        while b < slots.len() && slots[b] == slots[b - 1] + 1 {
            b += 1;
        }
        out.push((a, b));
        a = b;
    }
    out
}

impl KvStore for KvCache {
    fn types(&self) -> (KvType, KvType) {
        (self.choice.type_k, self.choice.type_v)
    }
    fn tensor_types(&self) -> Vec<KvType> {
        self.tensors().into_iter().map(|(_, ty)| ty).collect()
    }
    fn row_bytes(&self, ty: KvType) -> u64 {
        KvCache::row_bytes(self, ty)
    }
    fn cells(&self) -> &KvCells {
        &self.cells
    }
    fn replace(&mut self, cells: KvCells, slots: &[usize], rows: &[Vec<u8>]) {
        let tensors: Vec<(usize, View, KvType)> = (self.layer_tensors().into_iter())
            .map(|(il, t, ty)| (il, t.clone(), ty))
            .collect();
        for ((il, t, ty), rows) in tensors.iter().zip(rows) {
            let gpu = self.shape.gpu_of(*il).clone();
            let row = KvCache::row_bytes(self, *ty) as usize;
            // One write per run of consecutive cells (the slots may be scattered).
            for (a, b) in runs(slots) {
                let at = t.offset + (slots[a] * row) as u64;
                gpu.write(&t.buf, at, &rows[a * row..b * row]);
            }
        }
        self.cells = cells;
    }
}

/// A K/V store kept in host memory: cells and each tensor's rows, as a state file loads
/// them. For loading files without a device (the fuzz target, tests).
#[derive(Debug, Clone)]
pub struct HostKvStore {
    pub cells: KvCells,
    pub type_k: KvType,
    pub type_v: KvType,
    pub n_layer: usize,
    /// Values per cell in a row (the model's K/V width).
    pub n_embd_kv: u64,
    /// Each tensor's rows, cell by cell (per layer K then V).
    pub rows: Vec<Vec<u8>>,
}

impl HostKvStore {
    pub fn new(
        size: usize,
        type_k: KvType,
        type_v: KvType,
        n_layer: usize,
        n_embd_kv: u64,
    ) -> Self {
        let mut s = HostKvStore {
            cells: KvCells::new(size),
            type_k,
            type_v,
            n_layer,
            n_embd_kv,
            rows: Vec::new(),
        };
        s.rows = (s.tensor_types().into_iter())
            .map(|ty| vec![0; size * s.row_bytes(ty) as usize])
            .collect();
        s
    }
}

impl KvStore for HostKvStore {
    fn types(&self) -> (KvType, KvType) {
        (self.type_k, self.type_v)
    }
    fn tensor_types(&self) -> Vec<KvType> {
        (0..self.n_layer)
            .flat_map(|_| [self.type_k, self.type_v])
            .collect()
    }
    fn row_bytes(&self, ty: KvType) -> u64 {
        ty.row_bytes(self.n_embd_kv)
    }
    fn cells(&self) -> &KvCells {
        &self.cells
    }
    fn replace(&mut self, cells: KvCells, slots: &[usize], rows: &[Vec<u8>]) {
        for (t, (held, new)) in self.rows.iter_mut().zip(rows).enumerate() {
            let ty = if t % 2 == 0 { self.type_k } else { self.type_v };
            let row = ty.row_bytes(self.n_embd_kv) as usize;
            for (i, &slot) in slots.iter().enumerate() {
                held[slot * row..(slot + 1) * row].copy_from_slice(&new[i * row..(i + 1) * row]);
            }
        }
        self.cells = cells;
    }
}

/// One store's part of a file, read and checked before anything changes.
struct StoreData {
    pos: Vec<i32>,
    sets: Vec<u64>,
    rope_next: Vec<i32>,
    /// K then V rows of each layer of the store, converted to this cache's types.
    layers: Vec<Vec<u8>>,
}

/// Reads what [`write`] wrote into `stores`: the whole memory, or one saved sequence into
/// sequence `load.dst` (replacing that sequence). Returns the cells loaded into the first
/// store.
pub(crate) fn read(
    r: &mut Reader,
    stores: &mut [&mut dyn KvStore],
    load: &StateLoad,
) -> Result<usize, MemoryError> {
    let (dst, n_seq) = (load.dst, load.n_seq_max);
    let p = r.path.to_string();
    let format = |what: &str| StateError::Format {
        path: p.clone(),
        what: what.into(),
    };
    let Some(first) = stores.first() else {
        return Ok(0);
    };
    let (saved_k, saved_v) = match load.types {
        Some(t) => t,
        None => {
            let mut ty = || -> Result<KvType, StateError> {
                let id = r.u32()?;
                KvType::from_ggml_id(id).ok_or_else(|| format(&format!("cache type id {id}")))
            };
            (ty()?, ty()?)
        }
    };
    let (k, v) = first.types();
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
    let n_stores = r.u32()? as usize;
    if n_stores != stores.len() {
        if n_stores != 1 && n_stores != 2 {
            return Err(format(&format!("{n_stores} K/V stores")).into());
        }
        let saved = if n_stores == 2 { "with" } else { "without" };
        return Err(StateError::OtherLayout { path: p, saved }.into());
    }
    // Read (and check) everything before touching the cache.
    let mut data = Vec::with_capacity(stores.len());
    for store in stores.iter() {
        let n_cells = r.u32()? as usize;
        // 12 or 16 bytes per cell: a damaged count fails here, not in an allocation.
        let cell_bytes = if load.rope_next { 16 } else { 12 };
        if n_cells.saturating_mul(cell_bytes) > r.left() {
            return Err(format(&format!("{n_cells} cells do not fit in the file")).into());
        }
        let mut pos = Vec::with_capacity(n_cells);
        let mut sets = Vec::with_capacity(n_cells);
        let mut rope_next = Vec::with_capacity(n_cells);
        for i in 0..n_cells {
            let p = r.u32()? as i32;
            if p < 0 {
                return Err(format(&format!("cell {i} has the negative position {p}")).into());
            }
            if p > super::MAX_SAVED_POS {
                return Err(format(&format!(
                    "cell {i} has the position {p}, past any context (at most {})",
                    super::MAX_SAVED_POS
                ))
                .into());
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
            if load.rope_next {
                let next = r.u32()? as i32;
                if !(0..=super::MAX_SAVED_POS + 1).contains(&next) {
                    return Err(format(&format!(
                        "cell {i} has the next M-RoPE time {next}, outside 0..={}",
                        super::MAX_SAVED_POS + 1
                    ))
                    .into());
                }
                rope_next.push(next);
            }
        }
        let mut layers = Vec::new();
        for (i, ty) in store.tensor_types().into_iter().enumerate() {
            let saved = if i % 2 == 0 { saved_k } else { saved_v };
            let len = (n_cells.checked_mul(store.row_bytes(saved) as usize))
                .ok_or_else(|| format(&format!("{n_cells} cells' rows overflow a size")))?;
            let rows = r.take(len)?;
            layers.push(convert(rows, saved, ty).expect("checked above"));
        }
        data.push(StoreData {
            pos,
            sets,
            rope_next,
            layers,
        });
    }
    if !load.more && r.left() != 0 {
        return Err(format("trailing bytes").into());
    }
    // The new cells are laid out on copies, which replace the stores only once they all
    // fit: a file that does not fit leaves the cache (and `dst`) as it was.
    let mut placed = Vec::with_capacity(stores.len());
    for (store, st) in stores.iter().zip(&mut data) {
        let mut cells = store.cells().clone();
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
        cells.set_rope_next(&slots, &st.rope_next);
        placed.push((cells, slots));
    }
    for ((store, st), (cells, slots)) in stores.iter_mut().zip(&data).zip(placed) {
        store.replace(cells, &slots, &st.layers);
    }
    Ok(data[0].pos.len())
}
