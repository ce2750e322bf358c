//! Decoding ahead: a step whose every token is a generating session's GPU draw is
//! submitted without waiting (`Context::submit_step`), and at the next call the step
//! after it goes in — its tokens copied on the GPU from that step's draws — before the
//! first one's tokens are read. So the GPU always has the next step queued while the host
//! reads a token, checks it and reports it.
//!
//! A session's next step is submitted ahead only where the normal step would decode the
//! token anyway: it is generating, not cancelled, samples again after that token (not at
//! `-n`), and the token fits its share of the cache without a context shift or
//! Self-Extend. Anything else — a prompt waiting, a shift due, a session on the host's
//! sampler — lets the pipeline drain and the step runs as usual. When the token read
//! turns out to end a session (end of generation, a cancel), the step already submitted
//! with it is finished at once and its cell cut back, so the cache holds exactly the
//! prompt and the reply. A session closed while its step is in flight is only marked
//! (its cells are gone already): nothing waits on the GPU outside a step, so the same
//! loop runs on a page, where nothing may block.

use super::{Engine, EngineError, Event, Part, Phase};
use crate::context::{Batch, GpuDraw, InFlight};
use crate::kv::SeqId;
use web_time::Instant;

/// The step planned after one in flight: its batch (fed tokens as placeholders), parts,
/// draws and (batch index, draw of the step before) feeds.
struct Planned {
    batch: Batch,
    parts: Vec<Part>,
    draws: Vec<GpuDraw>,
    feed: Vec<(usize, usize)>,
}

/// A fed token not read yet.
const UNKNOWN: u32 = u32::MAX;

/// A step submitted and not yet read.
pub(super) struct Ahead {
    step: InFlight,
    /// Its batch; tokens fed from the step before hold placeholders until read.
    batch: Batch,
    parts: Vec<Part>,
    /// (batch index, session) of the tokens fed from the step before.
    fed: Vec<(usize, SeqId)>,
    /// Parts whose session was closed after the step went in (their cells went with it).
    closed: Vec<bool>,
    /// When it was submitted: it runs from then or from the last read, the later.
    start: Instant,
}

impl Ahead {
    fn new(
        step: InFlight,
        batch: Batch,
        parts: Vec<Part>,
        fed: Vec<(usize, SeqId)>,
        start: Instant,
    ) -> Self {
        Ahead {
            step,
            batch,
            closed: vec![false; parts.len()],
            parts,
            fed,
            start,
        }
    }

    /// Session `id` was closed: its part is dropped when the step is read. The slot may
    /// hold a new session by then, so the part must not be looked up by id again.
    pub(super) fn close(&mut self, id: SeqId) {
        for (part, closed) in self.parts.iter().zip(&mut self.closed) {
            *closed |= part.id == id;
        }
    }
}

impl Engine {
    /// Whether this step's batch can go ahead of its readback: every part a generating
    /// session drawn on the GPU, one ubatch, a memory that can cut back one position.
    pub(super) fn can_go_ahead(&self, batch: &Batch, parts: &[Part]) -> bool {
        self.decode_ahead
            && !parts.is_empty()
            && parts.iter().all(|p| p.generating && p.drawn.is_some())
            && batch.tokens.len() <= self.ctx.params.n_ubatch.min(self.ctx.params.n_batch) as usize
    }

    /// Submits `batch` without waiting; the next call reads it.
    pub(super) fn submit_ahead(
        &mut self,
        batch: Batch,
        parts: Vec<Part>,
        draws: &[GpuDraw],
    ) -> Result<(), EngineError> {
        let start = Instant::now();
        let step = self.ctx.submit_step(&batch, draws, &[])?;
        self.pending = Some(Ahead::new(step, batch, parts, Vec::new(), start));
        Ok(())
    }

    /// The step after `p` for every session of `p` that goes on, or None.
    fn plan_after(&mut self, p: &Ahead) -> Option<Planned> {
        // A session waiting with a prompt, or generating outside `p`, joins a normal step.
        let in_p = |id: SeqId| p.parts.iter().any(|q| q.id == id);
        if p.closed.iter().any(|&c| c)
            || self
                .sessions()
                .any(|s| s.phase == Phase::Prompt || (s.phase == Phase::Generate && !in_p(s.id)))
        {
            return None;
        }
        let n_ctx_seq = self.n_ctx_seq() as i32;
        let n_vocab = self.model.hp.n_vocab as usize;
        let (mut batch, mut parts, mut draws, mut feed) =
            (Batch::default(), Vec::new(), Vec::new(), Vec::new());
        for q in &p.parts {
            let s = self.sessions[q.id as usize].as_ref()?;
            let n_predict = s.params.n_predict;
            // The token `p` draws is generated number g + 1; decoding it is ahead of
            // time only if the session samples after it too.
            let g = s.generated.len() + 1;
            let again = n_predict < 0 || g < n_predict as usize;
            // p's token and this one, in the session's share without a shift.
            let fits = s.shift.policy.ga_n == 1 && s.shift.n_past + 2 < n_ctx_seq;
            if s.phase != Phase::Generate || s.cancel || !again || !fits {
                return None;
            }
            let mut row = super::draw::draw_row(s, n_vocab).ok()?;
            row.slot = q.id;
            let index = batch.tokens.len();
            batch.tokens.push(0);
            batch.pos.push(self.ctx.memory().seq_pos_max(q.id) + 1);
            batch.seq.push(1u64 << q.id);
            batch.logits.push(true);
            feed.push((index, q.drawn?));
            parts.push(Part {
                id: q.id,
                len: 1,
                drawn: Some(draws.len()),
                generating: true,
                logits: true,
                rows: 0,
            });
            // p's draw still holds the stream's next number.
            draws.push(GpuDraw {
                index,
                row: row.with_uniform(s.sampler.peek_uniform_at(1)),
            });
        }
        Some(Planned {
            batch,
            parts,
            draws,
            feed,
        })
    }

    /// A call with step `p` in flight: the next step goes in first where it can, then
    /// `p` is read and its tokens taken.
    pub(super) async fn step_ahead(&mut self, p: Ahead) -> Result<Vec<Event>, EngineError> {
        let mut events = Vec::new();
        let next = match self.plan_after(&p) {
            Some(Planned {
                batch,
                parts,
                draws,
                feed,
            }) => {
                let start = Instant::now();
                // If it cannot go in, `p` is still read: the step then ends as a step
                // waited for would (a GPU failure shows again there).
                let step = match self.ctx.submit_step(&batch, &draws, &feed) {
                    Ok(step) => step,
                    Err(e) => {
                        log::debug!("the step after could not be submitted ahead: {e}");
                        self.read_ahead(p, &mut events).await?;
                        return Ok(events);
                    }
                };
                self.n_ahead += 1;
                let fed: Vec<(usize, SeqId)> =
                    feed.iter().map(|&(i, _)| (i, parts[i].id)).collect();
                // Not known until the step before is read.
                let mut batch = batch;
                for &(i, _) in &fed {
                    batch.tokens[i] = UNKNOWN;
                }
                Some(Ahead::new(step, batch, parts, fed, start))
            }
            None => None,
        };
        self.read_ahead(p, &mut events).await?;
        // The tokens just taken are what `next` decodes: its batch gets them, and their
        // sessions have nothing left to decode. A session that ended has a step too many.
        if let Some(mut n) = next {
            let mut ended = false;
            for &(i, id) in &n.fed {
                let s = self.sessions[id as usize]
                    .as_mut()
                    .expect("sessions in flight stay open");
                match s.next.take() {
                    Some(t) => n.batch.tokens[i] = t,
                    None => ended = true,
                }
            }
            if ended {
                self.read_ahead(n, &mut events).await?;
            } else {
                self.pending = Some(n);
            }
        }
        Ok(events)
    }

    /// Reads step `p`, hands its sessions their results and takes their drawn tokens;
    /// a part whose session ended before its token was decoded is cut back instead.
    async fn read_ahead(&mut self, p: Ahead, events: &mut Vec<Event>) -> Result<(), EngineError> {
        let out = self.ctx.finish_step(p.step).await?;
        // Steps overlap: a step's time starts when the one before it was read, not when
        // it was queued behind it.
        let now = Instant::now();
        let dt = now - self.last_read.map_or(p.start, |r| r.max(p.start));
        self.last_read = Some(now);
        self.n_steps += 1;
        self.last_batch = (0, p.parts.len());
        let mut live_batch = Batch::default();
        let (mut live, mut picks) = (Vec::new(), Vec::new());
        for (i, part) in p.parts.iter().enumerate() {
            if p.closed[i] {
                continue;
            }
            let s = self.sessions[part.id as usize]
                .as_ref()
                .expect("sessions in flight stay open");
            if s.phase != Phase::Generate || p.batch.tokens[i] == UNKNOWN {
                // Ended (or cancelled) after this step went in: its cell goes, and the
                // token its draw recorded on the GPU makes the slot's history stale.
                let pos = p.batch.pos[i];
                self.ctx.seq_rm(Some(part.id), pos, -1)?;
                self.ctx.forget_sampler_stamp(part.id);
                continue;
            }
            live_batch.tokens.push(p.batch.tokens[i]);
            live_batch.pos.push(p.batch.pos[i]);
            live_batch.seq.push(p.batch.seq[i]);
            live_batch.logits.push(true);
            let mut q = part.clone();
            q.drawn = Some(picks.len());
            picks.push(out.picks[part.drawn.expect("every part ahead is drawn")].clone());
            live.push(q);
        }
        let out = crate::context::Decoded {
            logits: Vec::new(),
            picks,
        };
        self.take_results(&live_batch, &live, &out, dt, events)?;
        self.sample_all(events)
    }
}
