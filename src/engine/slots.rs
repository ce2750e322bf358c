//! A session's cells as a file (llama-server's `/slots/{id}?action=save|restore|erase`):
//! the sequence and the tokens it holds are written with the context's state format and
//! read back into an idle session, which then continues from them.

use super::{Engine, EngineError, Phase, Session, SessionId};
use std::path::Path;

/// A session's tokens and its cells in the state format, held in memory.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub tokens: Vec<u32>,
    pub state: Vec<u8>,
}

impl Engine {
    /// Writes idle session `id`'s cells and tokens to `path`; returns the tokens saved.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn save_session(&mut self, id: SessionId, path: &Path) -> Result<usize, EngineError> {
        let s = self.idle(id)?;
        let (history, lora) = (s.history.clone(), s.lora.clone());
        self.context_mut()
            .state_save(path, &history, Some(id), &lora)?;
        Ok(history.len())
    }

    /// Replaces idle session `id`'s cells with those saved in `path` (by
    /// [`Engine::save_session`] or a one-sequence state file); the session's next
    /// request reuses them as a cached prefix. Returns the tokens restored.
    pub fn restore_session(&mut self, id: SessionId, path: &Path) -> Result<usize, EngineError> {
        let params = self.idle(id)?.params.clone();
        let saved = self.context_mut().state_load(path, Some(id))?;
        self.resume_from(id, params, saved)
    }

    /// Idle session `id`'s tokens and cells in the state format, held in memory (the
    /// server's prompt cache); `None` when it holds no tokens.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn snapshot_session(&mut self, id: SessionId) -> Result<Option<Snapshot>, EngineError> {
        let s = self.idle(id)?;
        let (history, lora) = (s.history.clone(), s.lora.clone());
        if history.is_empty() {
            return Ok(None);
        }
        let (state, _) = self.context_mut().state_bytes(&history, Some(id), &lora)?;
        Ok(Some(Snapshot {
            tokens: history,
            state,
        }))
    }

    /// Replaces idle session `id`'s cells with a [`Snapshot`]'s; returns its tokens.
    pub fn restore_snapshot(
        &mut self,
        id: SessionId,
        snap: &Snapshot,
    ) -> Result<usize, EngineError> {
        let params = self.idle(id)?.params.clone();
        let saved =
            (self.context_mut()).state_from_bytes(&snap.state, "the prompt cache", Some(id))?;
        self.resume_from(id, params, saved)
    }

    /// A fresh idle session `id` that continues from restored cells and tokens, with the
    /// LoRA scales they were computed with (a request under another setting then reuses
    /// none of them).
    fn resume_from(
        &mut self,
        id: SessionId,
        params: super::SessionParams,
        saved: crate::context::state::SavedState,
    ) -> Result<usize, EngineError> {
        let mut s = self.new_session(id, params)?;
        if let Some(lora) = saved.lora {
            s.lora = lora;
        }
        s.shift.n_past = saved.tokens.len() as i32;
        s.history = saved.tokens;
        let n = s.history.len();
        self.sessions[id as usize] = Some(s);
        Ok(n)
    }

    /// Drops idle session `id`'s cells and tokens; returns how many tokens it held.
    pub fn erase_session(&mut self, id: SessionId) -> Result<usize, EngineError> {
        let s = self.idle(id)?;
        let (n, params) = (s.history.len(), s.params.clone());
        self.context_mut().seq_rm(Some(id), -1, -1)?;
        self.sessions[id as usize] = Some(self.new_session(id, params)?);
        Ok(n)
    }

    fn idle(&self, id: SessionId) -> Result<&Session, EngineError> {
        let s = self.session(id)?;
        if s.phase != Phase::Idle {
            return Err(EngineError::Busy(id));
        }
        Ok(s)
    }
}
