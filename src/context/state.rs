//! Saving and loading the KV cache: the cells (position, sequences) and their K/V rows of
//! every layer, the whole cache or one sequence, plus the tokens they came from (what
//! `--prompt-cache` needs to reuse a prompt's prefix).
//!
//! File layout (little endian): magic, version, model shape (layers, K/V width, vocab),
//! tokens, then the memory's part (`Memory::state_write`; for the K/V caches: the K and V
//! types, the stores, their cells and rows; for recurrent states: their sizes, cells and
//! rows; a hybrid writes both, K/V first). Versions 2 and 3 are read too: they put the
//! types (version 2: one element size, 2 or 4, for both) before the tokens.

use super::{Context, ContextError};
use crate::kv::{KvType, SeqId};
use crate::memory::Reader;
pub use crate::memory::StateError;
use std::path::Path;

const MAGIC: &[u8; 8] = b"WGLLMKV\0";
const VERSION: u32 = 4;

/// What a state file holds besides the K/V rows.
#[derive(Debug)]
pub struct SavedState {
    pub tokens: Vec<u32>,
    pub n_cells: usize,
}

impl Context {
    fn model_shape(&self) -> [u32; 3] {
        let hp = &self.model.hp;
        [hp.n_layer, hp.n_embd_kv(), hp.n_vocab]
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
        self.memory.update(false)?; // pending deltas are not part of the format
        let mut out = Vec::new();
        out.extend(MAGIC);
        out.extend(VERSION.to_le_bytes());
        self.model_shape()
            .iter()
            .for_each(|v| out.extend(v.to_le_bytes()));
        out.extend((tokens.len() as u32).to_le_bytes());
        tokens.iter().for_each(|t| out.extend(t.to_le_bytes()));
        let n_saved = self.memory.state_write(&mut out, seq)?;
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
        let mut r = Reader::new(data, p);
        let (types, tokens) = read_header(&mut r, self.model_shape())?;
        let n_tok = tokens.len();
        if let Some(s) = dst {
            self.check_seq(s)?;
        }
        let load = crate::memory::StateLoad {
            dst,
            types,
            n_seq_max: self.params.n_seq_max,
            more: false,
        };
        let n_cells = self.memory.state_read(&mut r, &load)?;
        log::info!("loaded {n_cells} cells and {n_tok} tokens from {p}");
        Ok(SavedState { tokens, n_cells })
    }
}

/// Saved cache types (versions 2 and 3 name them here) and tokens: the header of a state
/// file, checked against the model's shape [layers, K/V width, vocabulary].
type Header = (Option<(KvType, KvType)>, Vec<u32>);

fn read_header(r: &mut Reader, model_shape: [u32; 3]) -> Result<Header, ContextError> {
    let p = r.path.to_string();
    let format = |what: &str| StateError::Format {
        path: p.clone(),
        what: what.into(),
    };
    if r.take(8)? != MAGIC {
        return Err(format("bad magic").into());
    }
    let version = r.u32()?;
    if !(2..=VERSION).contains(&version) {
        return Err(format(&format!("version {version}, expected {VERSION}")).into());
    }
    let shape = [r.u32()?, r.u32()?, r.u32()?];
    if shape != model_shape {
        return Err(StateError::OtherModel {
            path: r.path.to_string(),
            what: format!(
                "layers, K/V width, vocabulary {:?}; this model has {:?}",
                shape, model_shape
            ),
        }
        .into());
    }
    // Versions 2 and 3 put the cache types before the tokens.
    let types = match version {
        2 => match r.u32()? {
            2 => Some((KvType::F16, KvType::F16)),
            4 => Some((KvType::F32, KvType::F32)),
            elem => return Err(format(&format!("K/V element size {elem}")).into()),
        },
        3 => {
            let mut ty = || -> Result<KvType, StateError> {
                let id = r.u32()?;
                KvType::from_ggml_id(id).ok_or_else(|| format(&format!("cache type id {id}")))
            };
            Some((ty()?, ty()?))
        }
        _ => None,
    };
    let n_tok = r.u32()? as usize;
    if n_tok.saturating_mul(4) > r.left() {
        return Err(format(&format!("{n_tok} tokens do not fit in the file")).into());
    }
    let tokens: Vec<u32> = (0..n_tok).map(|_| r.u32()).collect::<Result<_, _>>()?;
    if let Some(t) = tokens.iter().find(|&&t| t >= model_shape[2]) {
        return Err(format(&format!(
            "token {t} is outside the vocabulary of {}",
            model_shape[2]
        ))
        .into());
    }
    Ok((types, tokens))
}

/// Loads a state file into K/V stores kept in host memory (one, or a sliding-window
/// model's two) of a model of `model_shape`, as [`Context::state_from_bytes`] loads it
/// into the GPU's: for reading files without a device (the fuzz target, tests).
pub fn state_into_host(
    data: &[u8],
    model_shape: [u32; 3],
    stores: &mut [crate::memory::HostKvStore],
    dst: Option<SeqId>,
    n_seq_max: u32,
) -> Result<SavedState, ContextError> {
    let mut r = Reader::new(data, "state");
    let (types, tokens) = read_header(&mut r, model_shape)?;
    let load = crate::memory::StateLoad {
        dst,
        types,
        n_seq_max,
        more: false,
    };
    let mut stores: Vec<&mut dyn crate::memory::KvStore> = (stores.iter_mut())
        .map(|s| s as &mut dyn crate::memory::KvStore)
        .collect();
    let n_cells = crate::memory::read_kv_state(&mut r, &mut stores, &load)?;
    Ok(SavedState { tokens, n_cells })
}
