//! Which generating sessions have their next token drawn on the GPU in this step's
//! decode (`Context::decode_drawing_async`), so that only the token is read back.
//!
//! A draw uses the number the session's random stream would give next without using it
//! up ([`crate::sample::Sampler::peek_uniform`]); the next step takes the token and moves
//! the stream on, so either path leaves the stream where llama.cpp's sampler leaves it.
//! A session is drawn for only when it samples on the GPU (its `gpu_draws`, else the
//! engine's `--sampling`), its next step will sample (not past `-n`), its chain is one
//! the GPU runs ([`crate::sample::gpu_row`]) and it asks for no probabilities other than
//! post-sampling ones (the chain's final candidates, which the GPU writes beside the
//! token) and keeps no thinking budget; its penalty history and bias are copied to the GPU
//! when they changed.

use super::session::Session;
use super::{Engine, Part};
use crate::context::{Batch, GpuDraw};
use crate::ops::uniforms::SampleRow;
use crate::sample::{dense_bias, gpu_row, FLAG_BIAS};

/// The GPU chain's settings for session `s` (slot and uniform number to fill in), or why
/// its chain stays on the host.
pub(super) fn draw_row(s: &Session, n_vocab: usize) -> Result<SampleRow, String> {
    let mut row = gpu_row(s.sampler.params(), n_vocab)?;
    // Post-sampling probabilities: the host's list holds at most the chain's candidates.
    if s.params.post_sampling_probs {
        row.n_probs = s.params.n_probs.min(row.k as usize) as u32;
    }
    Ok(row)
}

impl Engine {
    /// The draws for `parts` of `batch`; drawn parts get no logit rows.
    pub(super) fn plan_draws(&mut self, batch: &Batch, parts: &mut [Part]) -> Vec<GpuDraw> {
        let mut draws = Vec::new();
        if !self.can_draw {
            return draws;
        }
        let n_vocab = self.model.hp.n_vocab as usize;
        let mut at = 0;
        for p in parts.iter_mut() {
            let index = at + p.len - 1;
            at += p.len;
            // A session checking a draft's proposals samples every row on the host.
            if !p.generating || p.len > 1 || !batch.logits[index] {
                continue;
            }
            let Some(s) = self.sessions[p.id as usize].as_mut() else {
                continue;
            };
            if !s.params.gpu_draws.unwrap_or(self.gpu_sampling) {
                continue;
            }
            let n_predict = s.params.n_predict;
            let samples_next = n_predict < 0 || s.generated.len() < n_predict as usize;
            // The model's own probabilities need the whole logits row.
            let full_probs = s.params.n_probs > 0 && !s.params.post_sampling_probs;
            // A thinking budget decides tokens on the host (a draw made ahead could
            // miss the moment it forces one).
            let budget = s.sampler.params().thinking_budget.is_some();
            if !samples_next || s.cancel || full_probs || budget || s.fed_logits.is_some() {
                continue;
            }
            let mut row = match draw_row(s, n_vocab) {
                Ok(row) => row,
                Err(why) => {
                    if !std::mem::replace(&mut s.host_reason_logged, true) {
                        log::info!("session {}: sampling on the host: {why}", s.id);
                    }
                    continue;
                }
            };
            row.slot = p.id;
            let stamp = s.sampler.history_stamp();
            if self.ctx.sampler_stamp(p.id) != Some(stamp) {
                let history: Vec<u32> = s.sampler.penalty_history().iter().copied().collect();
                let bias =
                    (row.flags & FLAG_BIAS != 0).then(|| dense_bias(s.sampler.params(), n_vocab));
                if let Err(why) =
                    self.ctx
                        .sync_sampler(p.id, stamp, &row, &history, bias.as_deref())
                {
                    if !std::mem::replace(&mut s.host_reason_logged, true) {
                        log::info!("session {}: sampling on the host: {why}", s.id);
                    }
                    continue;
                }
            }
            p.drawn = Some(draws.len());
            p.rows = 0;
            draws.push(GpuDraw {
                index,
                row: row.with_uniform(s.sampler.peek_uniform()),
            });
        }
        draws
    }
}
