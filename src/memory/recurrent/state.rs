//! The recurrent states' part of a state file (after the K/V part for a hybrid): the
//! state sizes and the number of recurrent layers (checked on load), the cells (pos i32,
//! sequence set u64) and, per recurrent layer, the conv rows then the SSM rows of those
//! cells, f32.

use super::RecurrentMemory;
#[cfg(not(target_arch = "wasm32"))]
use crate::kv::SeqId;
use crate::kv::{seqs_below, KvCells};
use crate::memory::{MemoryError, Reader, StateError, StateLoad};

/// Appends `mem`'s part: every state, or only `seq`'s (saved as sequence 0).
#[cfg(not(target_arch = "wasm32"))]
pub(super) fn write(
    out: &mut Vec<u8>,
    mem: &RecurrentMemory,
    seq: Option<SeqId>,
) -> Result<usize, MemoryError> {
    let hp = &*mem.shape;
    let cells = &mem.cells;
    let picked: Vec<usize> = match seq {
        Some(s) => cells.tail(s).into_iter().collect(),
        None => (0..cells.size())
            .filter(|&i| !cells.cell(i).is_empty())
            .collect(),
    };
    let layers = mem.state_buffers();
    for v in [
        hp.n_embd_r,
        hp.n_embd_s,
        layers.len() as u32,
        picked.len() as u32,
    ] {
        out.extend(v.to_le_bytes());
    }
    for &i in &picked {
        let c = cells.cell(i);
        out.extend(c.pos.to_le_bytes());
        out.extend(if seq.is_some() { 1u64 } else { c.seq }.to_le_bytes());
    }
    for (buf, row, il) in layers {
        let gpu = mem.shape.gpu_of(il);
        for &i in &picked {
            let at = buf.offset + (i as u64 * row);
            out.extend(gpu.read_bytes(&buf.buf, at, row)?);
        }
    }
    Ok(picked.len())
}

/// Reads what [`write`] wrote into `mem` (all of it, or the saved sequence into
/// `load.dst`), checking everything before a state changes.
pub(super) fn read(
    r: &mut Reader,
    mem: &mut RecurrentMemory,
    load: &StateLoad,
) -> Result<usize, MemoryError> {
    let p = r.path.to_string();
    let format = |what: String| StateError::Format {
        path: p.clone(),
        what,
    };
    let hp = &*mem.shape;
    let layers = mem.state_buffers();
    let want = [hp.n_embd_r, hp.n_embd_s, layers.len() as u32];
    let got = [r.u32()?, r.u32()?, r.u32()?];
    if got != want {
        return Err(StateError::OtherModel {
            path: p,
            what: format!("recurrent state sizes and layers {got:?}; this model has {want:?}"),
        }
        .into());
    }
    let n = r.u32()? as usize;
    if n > mem.cells.size() {
        return Err(StateError::TooBig {
            path: p,
            cells: n,
            free: mem.cells.size(),
        }
        .into());
    }
    let mut saved = Vec::with_capacity(n);
    for i in 0..n {
        let pos = r.u32()? as i32;
        if !(0..=crate::memory::MAX_SAVED_POS).contains(&pos) {
            return Err(format(format!(
                "recurrent state {i} has the position {pos}, outside 0..={}",
                crate::memory::MAX_SAVED_POS
            ))
            .into());
        }
        let set = r.u64()?;
        if set == 0 || set & !seqs_below(load.n_seq_max) != 0 {
            return Err(format(format!(
                "recurrent state {i} belongs to sequences {set:#x}, none or outside this context's -np {}",
                load.n_seq_max
            ))
            .into());
        }
        saved.push((pos, set));
    }
    let mut rows = Vec::with_capacity(layers.len());
    for (_, row, _) in &layers {
        let len = (n.checked_mul(*row as usize))
            .ok_or_else(|| format(format!("{n} states' rows overflow a size")))?;
        rows.push(r.take(len)?.to_vec());
    }
    if !load.more && r.left() != 0 {
        return Err(format("trailing bytes".into()).into());
    }
    let mut cells = mem.cells.clone();
    match load.dst {
        None => cells.clear(),
        Some(s) => {
            cells.seq_rm(Some(s), -1, -1)?;
            let bit = KvCells::seq_bit(s)?;
            saved.iter_mut().for_each(|c| c.1 = bit);
        }
    }
    let placed = cells.restore(&saved)?;
    for ((buf, row, il), data) in layers.iter().zip(&rows) {
        let gpu = mem.shape.gpu_of(*il).clone();
        for (k, &i) in placed.iter().enumerate() {
            let r = *row as usize;
            gpu.write(
                &buf.buf,
                buf.offset + i as u64 * row,
                &data[k * r..(k + 1) * r],
            );
        }
    }
    mem.cells = cells;
    Ok(n)
}
