//! Regenerating a reply: the cache is cut back to where the reply began, and the
//! session samples again from the logits it had there, with its random stream going on
//! (so a sampled reply differs; a greedy one repeats).

use super::shift::SeqShift;
use super::{Conversation, Engine, EngineError, Phase, SessionId, Utf8Stream};

/// Where a session's last generation began, taken when its input was decoded.
#[derive(Clone, Debug)]
pub(super) struct ReplyMark {
    /// First position the reply's tokens took.
    pos: i32,
    history_len: usize,
    logits: Option<Vec<f32>>,
    shift: SeqShift,
    conversation: Option<Conversation>,
}

impl ReplyMark {
    pub(super) fn take(s: &super::Session, pos: i32) -> Self {
        ReplyMark {
            pos,
            history_len: s.history.len(),
            logits: s.logits.clone(),
            shift: s.shift.clone(),
            conversation: s.conversation.clone(),
        }
    }
}

impl Engine {
    /// Drops session `id`'s last reply from the cache (and its conversation) and
    /// generates a new one from the same input. Refused while the session is busy, before
    /// any reply, and after a context shift or Self-Extend moved the cells the reply
    /// started from (the logits kept for it no longer match the cache).
    pub fn regenerate(&mut self, id: SessionId) -> Result<(), EngineError> {
        let s = self.session(id)?;
        if s.phase != Phase::Idle {
            return Err(EngineError::Busy(id));
        }
        let Some(mark) = s.reply_mark.clone() else {
            return Err(EngineError::Options(format!(
                "session {id} has no reply to regenerate yet"
            )));
        };
        if mark.shift.ops.len() != s.shift.ops.len() || mark.logits.is_none() {
            return Err(EngineError::Options(format!(
                "session {id}: the context shifted during the last reply, so the cache no longer holds the point it started from; send the message again instead"
            )));
        }
        self.context_mut().seq_rm(Some(id), mark.pos, -1)?;
        let s = self.session_mut(id)?;
        s.history.truncate(mark.history_len);
        s.sampler.reset();
        s.refill_penalty_history();
        s.logits = mark.logits;
        s.shift = mark.shift;
        s.conversation = mark.conversation;
        s.pending.clear();
        s.input_total = 0;
        s.input_done = 0;
        s.then_generate = true;
        s.next = None;
        s.generated.clear();
        s.synth_rng = None;
        s.reply.clear();
        s.stream = Utf8Stream::default();
        s.phase = Phase::Generate;
        Ok(())
    }
}
