//! Saving and loading the KV cache: the cells (position, sequences) and their K/V rows of
//! every layer, the whole cache or one sequence, plus the tokens they came from (what
//! `--prompt-cache` needs to reuse a prompt's prefix).
//!
//! File layout (little endian): magic, version, model shape (layers, K/V width, vocab),
//! what decided the cells besides their tokens (version 5: the model's fingerprint, and
//! per loaded LoRA adapter its fingerprint and the scale the cells were computed with),
//! tokens, then the memory's part (`Memory::state_write`; for the K/V caches: the K and V
//! types, the stores, their cells and rows; for recurrent states: their sizes, cells and
//! rows; a hybrid writes both, K/V first). Version 6 adds each K/V cell's next M-RoPE
//! time. Versions 2 to 5 are read too; 2 and 3 put the types (version 2: one element
//! size, 2 or 4, for both) before the tokens.

use super::{Context, ContextError};
use crate::kv::{KvType, SeqId};
use crate::memory::Reader;
pub use crate::memory::StateError;
use std::path::Path;

const MAGIC: &[u8; 8] = b"WGLLMKV\0";
const VERSION: u32 = 6;

/// What a state file holds besides the K/V rows.
#[derive(Debug)]
pub struct SavedState {
    pub tokens: Vec<u32>,
    pub n_cells: usize,
    /// The LoRA scales the cells were computed with, one per loaded adapter (the file
    /// was checked to name the same adapters); `None`: a file older than version 5,
    /// which does not say.
    pub lora: Option<Vec<f32>>,
}

/// What decided a state's cells besides its tokens: the model's weights and the LoRA
/// adapters applied (each one's fingerprint and scale), as version 5 records them.
#[derive(Clone, Debug, PartialEq)]
pub struct Provenance {
    pub model: u64,
    pub adapters: Vec<(u64, f32)>,
}

impl Provenance {
    // State files are written natively only (a page keeps no files).
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    fn write(&self, out: &mut Vec<u8>) {
        out.extend(self.model.to_le_bytes());
        out.extend((self.adapters.len() as u32).to_le_bytes());
        for (fp, scale) in &self.adapters {
            out.extend(fp.to_le_bytes());
            out.extend(scale.to_le_bytes());
        }
    }

    fn read(r: &mut Reader) -> Result<Provenance, StateError> {
        let model = r.u64()?;
        let n = r.u32()? as usize;
        if n.saturating_mul(12) > r.left() {
            return Err(StateError::Format {
                path: r.path.to_string(),
                what: format!("{n} adapters do not fit in the file"),
            });
        }
        let adapters = (0..n)
            .map(|_| Ok((r.u64()?, f32::from_le_bytes(r.u32()?.to_le_bytes()))))
            .collect::<Result<_, StateError>>()?;
        Ok(Provenance { model, adapters })
    }

    /// The adapters as a sentence: "no LoRA adapter" or "2 LoRA adapters (…: 0.5, …: 1)".
    fn describe_adapters(fps: &[u64], scales: Option<&[f32]>) -> String {
        if fps.is_empty() {
            return "no LoRA adapter".into();
        }
        let each: Vec<String> = (fps.iter().enumerate())
            .map(|(i, fp)| match scales {
                Some(s) => format!("{fp:016x} at scale {}", s[i]),
                None => format!("{fp:016x}"),
            })
            .collect();
        format!(
            "{} LoRA adapter{} ({})",
            fps.len(),
            if fps.len() == 1 { "" } else { "s" },
            each.join(", ")
        )
    }
}

impl Context {
    fn model_shape(&self) -> [u32; 3] {
        let hp = &self.model.hp;
        [hp.n_layer, hp.n_embd_kv(), hp.n_vocab]
    }

    /// The model's and its adapters' fingerprints, with `lora` (one scale per loaded
    /// adapter; missing ones 0) as the setting the cells were computed with.
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    fn provenance(&self, lora: &[f32]) -> Provenance {
        Provenance {
            model: self.model.fingerprint,
            adapters: (self.model.loras.iter().enumerate())
                .map(|(i, a)| (a.fingerprint, lora.get(i).copied().unwrap_or(0.0)))
                .collect(),
        }
    }

    /// Checks a file's provenance against this model and its adapters; returns the
    /// scales its cells were computed with.
    fn check_provenance(
        &self,
        p: &str,
        saved: Option<Provenance>,
    ) -> Result<Option<Vec<f32>>, StateError> {
        let now: Vec<u64> = self.model.loras.iter().map(|a| a.fingerprint).collect();
        let Some(saved) = saved else {
            // Older files do not say which adapters applied: with none loaded there is
            // nothing to tell apart.
            if now.is_empty() {
                return Ok(Some(Vec::new()));
            }
            return Err(StateError::OtherAdapters {
                path: p.into(),
                saved: "a LoRA setting the file does not record (it predates version 5)".into(),
                now: Provenance::describe_adapters(&now, None),
            });
        };
        if saved.model != self.model.fingerprint {
            return Err(StateError::OtherModel {
                path: p.into(),
                what: format!(
                    "weights of fingerprint {:016x}; this model's are {:016x}: another file of the same shape",
                    saved.model, self.model.fingerprint
                ),
            });
        }
        let fps: Vec<u64> = saved.adapters.iter().map(|a| a.0).collect();
        let scales: Vec<f32> = saved.adapters.iter().map(|a| a.1).collect();
        if fps != now {
            return Err(StateError::OtherAdapters {
                path: p.into(),
                saved: Provenance::describe_adapters(&fps, Some(&scales)),
                now: Provenance::describe_adapters(&now, None),
            });
        }
        if let Some(bad) = scales.iter().find(|s| !s.is_finite()) {
            return Err(StateError::Format {
                path: p.into(),
                what: format!("LoRA scale {bad}"),
            });
        }
        Ok(Some(scales))
    }

    /// Saves the cache (or only `seq`'s cells) and `tokens` to `path` (native targets:
    /// it waits for the K/V readback and writes a file).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn state_save(
        &mut self,
        path: &Path,
        tokens: &[u32],
        seq: Option<SeqId>,
        lora: &[f32],
    ) -> Result<(), ContextError> {
        let (out, n_saved) = self.state_bytes(tokens, seq, lora)?;
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
    /// how many cells they hold (native targets: it waits for the K/V readback). `lora`:
    /// the adapters' scales the cells were computed with (recorded, and checked when the
    /// file is loaded).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn state_bytes(
        &mut self,
        tokens: &[u32],
        seq: Option<SeqId>,
        lora: &[f32],
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
        self.provenance(lora).write(&mut out);
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
        let (version, types, provenance, tokens) = read_header(&mut r, self.model_shape())?;
        let lora = self.check_provenance(p, provenance)?;
        let n_tok = tokens.len();
        if let Some(s) = dst {
            self.check_seq(s)?;
        }
        let load = crate::memory::StateLoad {
            dst,
            types,
            n_seq_max: self.params.n_seq_max,
            more: false,
            rope_next: version >= 6,
        };
        let n_cells = self.memory.state_read(&mut r, &load)?;
        log::info!("loaded {n_cells} cells and {n_tok} tokens from {p}");
        Ok(SavedState {
            tokens,
            n_cells,
            lora,
        })
    }
}

/// The file's version, saved cache types (versions 2 and 3 name them here), what decided
/// the cells (version 5) and tokens: the header of a state file, checked against the
/// model's shape [layers, K/V width, vocabulary].
type Header = (u32, Option<(KvType, KvType)>, Option<Provenance>, Vec<u32>);

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
    let provenance = match version {
        5.. => Some(Provenance::read(r)?),
        _ => None,
    };
    let n_tok = r.u32()? as usize;
    if n_tok.saturating_mul(4) > r.left() {
        return Err(format(&format!("{n_tok} tokens do not fit in the file")).into());
    }
    let tokens: Vec<u32> = (0..n_tok).map(|_| r.u32()).collect::<Result<_, _>>()?;
    let bad = |&&t: &&u32| t >= model_shape[2] && t & crate::batch::ROW_ID_BIT == 0;
    if let Some(t) = tokens.iter().find(bad) {
        return Err(format(&format!(
            "token {t} is outside the vocabulary of {}",
            model_shape[2]
        ))
        .into());
    }
    Ok((version, types, provenance, tokens))
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
    // No model behind: what decided the cells is read (a damaged record is refused)
    // and not compared.
    let (version, types, provenance, tokens) = read_header(&mut r, model_shape)?;
    let lora = provenance.map(|p| p.adapters.iter().map(|a| a.1).collect());
    let load = crate::memory::StateLoad {
        dst,
        types,
        n_seq_max,
        more: false,
        rope_next: version >= 6,
    };
    let mut stores: Vec<&mut dyn crate::memory::KvStore> = (stores.iter_mut())
        .map(|s| s as &mut dyn crate::memory::KvStore)
        .collect();
    let n_cells = crate::memory::read_kv_state(&mut r, &mut stores, &load)?;
    Ok(SavedState {
        tokens,
        n_cells,
        lora,
    })
}
