//! A state file's bytes as the stores read them (`kv_state.rs`, `recurrent/state.rs`), and what
//! can be wrong with one. The file's header (magic, version, model shape, tokens) is the
//! context's (`context::state`), which hands the rest to the memory.

use crate::kv::KvType;
use half::f16;

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
    #[error("{path}: the cache was computed with {saved}, and this server has {now}; load it where the same adapters are loaded (--lora, in the same order), or save it again here")]
    OtherAdapters {
        path: String,
        saved: String,
        now: String,
    },
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

/// A state file's bytes, read front to back; `path` names them in errors.
pub struct Reader<'a> {
    data: &'a [u8],
    at: usize,
    pub(crate) path: &'a str,
}

impl<'a> Reader<'a> {
    /// Reads `data` from its start.
    pub(crate) fn new(data: &'a [u8], path: &'a str) -> Reader<'a> {
        Reader { data, at: 0, path }
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&[u8], StateError> {
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
    /// Bytes not read yet.
    pub(crate) fn left(&self) -> usize {
        self.data.len() - self.at
    }
    pub(crate) fn u32(&mut self) -> Result<u32, StateError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, StateError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
}

/// K/V rows saved as `from` for a cache of `to`: the same bytes, or f16 and f32 converted
/// into each other; None for any other pair.
pub(crate) fn convert(rows: &[u8], from: KvType, to: KvType) -> Option<Vec<u8>> {
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
