//! Which generating sessions have their next token drawn on the GPU in this step's
//! decode (`Context::decode_drawing_async`), so that only the token is read back.
//!
//! A draw uses the number the session's random stream would give next without using it
//! up ([`crate::sample::Sampler::peek_uniform`]); the next step takes the token and moves
//! the stream on, so either path leaves the stream where llama.cpp's sampler leaves it.
//! A session is drawn for only when its next step will sample (not past `-n`), its
//! chain is one the GPU runs ([`crate::sample::gpu_row`]) and no token probabilities are
//! asked for; its penalty history and bias are copied to the GPU when they changed.

use super::{Engine, Part};
use crate::context::{Batch, GpuDraw};
use crate::sample::{dense_bias, gpu_row, FLAG_BIAS};

impl Engine {
    /// The draws for `parts` of `batch`; drawn parts get no logit rows.
    pub(super) fn plan_draws(&mut self, batch: &Batch, parts: &mut [Part]) -> Vec<GpuDraw> {
        let mut draws = Vec::new();
        if !self.gpu_sampling {
            return draws;
        }
        let n_vocab = self.model.hp.n_vocab as usize;
        let mut at = 0;
        for p in parts.iter_mut() {
            let index = at + p.len - 1;
            at += p.len;
            if !p.generating || !batch.logits[index] {
                continue;
            }
            let Some(s) = self.sessions[p.id as usize].as_mut() else {
                continue;
            };
            let n_predict = s.params.n_predict;
            let samples_next = n_predict < 0 || s.generated.len() < n_predict as usize;
            if !samples_next || s.cancel || s.params.n_probs > 0 || s.fed_logits.is_some() {
                continue;
            }
            let mut row = match gpu_row(s.sampler.params(), n_vocab) {
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
