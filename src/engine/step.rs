//! One step of every session: tokens sampled (on the host or the GPU), a batch planned
//! from the generating and waiting sessions, decoded, and its results handed back.

use super::media::is_image_token;
use super::{
    rewind, schedule, Engine, EngineError, Event, Part, Phase, Room, Session, SessionId, Stop,
    TokenProbs,
};
use crate::context::{Batch, ContextError};
use crate::grammar::GrammarError;
use crate::tokenizer::Tokenizer;
use web_time::{Duration, Instant};

impl Engine {
    /// One step, blocking on the GPU (native targets): see [`Engine::step_async`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn step(&mut self) -> Result<Vec<Event>, EngineError> {
        pollster::block_on(self.step_async())
    }

    /// One step of every session: each generating session samples a token; then one
    /// batch of at most n_batch tokens — one per generating session, then chunks of
    /// waiting prompts in session order — is decoded. Returns what happened; an `Err` is
    /// a failure of the whole step (the GPU), after which the cache is as before it.
    pub async fn step_async(&mut self) -> Result<Vec<Event>, EngineError> {
        if let Some(p) = self.pending.take() {
            return self.step_ahead(p).await;
        }
        let mut events = Vec::new();
        self.sample_all(&mut events)?;
        self.draft_all().await?;
        let (mut batch, mut parts) = self.plan_batch(&mut events)?;
        self.last_batch = (0, 0);
        if batch.tokens.is_empty() {
            return Ok(events);
        }
        if is_image_token(batch.tokens[0]) {
            match self.image_rows(&parts, batch.tokens.len()).await {
                Ok(rows) => batch.embd = rows,
                // An image is alone in its step: its session fails, the others go on
                // in the next step. Nothing of the image was decoded; a shift made to
                // make room for it stays (its events were sent).
                Err(error) => {
                    let id = parts[0].id;
                    if let Some(s) = self.sessions[id as usize].as_mut() {
                        s.finish(Stop::Cancelled);
                    }
                    events.push(Event::Error { session: id, error });
                    return Ok(events);
                }
            }
        }
        let draws = self.plan_draws(&batch, &mut parts);
        if self.can_go_ahead(&batch, &parts) {
            self.submit_ahead(batch, parts, &draws)?;
            return Ok(events);
        }
        let start = Instant::now();
        let out = self.ctx.decode_drawing_async(&batch, &draws).await?;
        let dt = start.elapsed();
        self.n_steps += 1;
        // A generating part's proposals count as generated tokens too.
        let n_gen = parts.iter().filter(|p| p.generating).map(|p| p.len).sum();
        self.last_batch = (batch.tokens.len() - n_gen, n_gen);
        self.take_results(&batch, &parts, &out, dt, &mut events)?;
        Ok(events)
    }

    /// Cancellations, then a sampled token for each generating session (several where a
    /// draft's proposals were decoded: each kept while the session samples it itself).
    pub(super) fn sample_all(&mut self, events: &mut Vec<Event>) -> Result<(), EngineError> {
        let tok = &self.tokenizer;
        for s in self.sessions.iter_mut().flatten() {
            if let Some(rows) = s.spec_rows.take() {
                let synth = self.drafter.as_ref().and_then(|d| d.synth.as_deref());
                let (kept, sampled) = verify_draft(tok, s, &rows, synth, events);
                self.n_host_samples += sampled;
                let rejected = s.draft.len() - kept;
                if let Some(d) = self.drafter.as_mut() {
                    d.stats.accepted += kept as u64;
                }
                s.draft.clear();
                if rejected > 0 {
                    // The proposals after the last kept one leave the cache.
                    let p0 = self.ctx.memory().seq_pos_max(s.id) + 1 - rejected as i32;
                    self.ctx.seq_rm(Some(s.id), p0, -1)?;
                    s.history.truncate(s.history.len() - rejected);
                    s.shift.n_past -= rejected as i32;
                }
                continue;
            }
            if !ready_to_sample(tok, s, events) {
                continue;
            }
            let (t, probs, accepted) = if let Some(d) = s.drawn.take() {
                // Drawn on the GPU with the stream's next number; the GPU also recorded
                // it in its copy of the penalty history.
                let accepted = s.sampler.accept_gpu_pick(d.token);
                self.ctx.set_sampler_stamp(s.id, s.sampler.history_stamp());
                self.n_gpu_draws += 1;
                // Only post-sampling probabilities are drawn on the GPU (draw.rs).
                let probs = (s.params.n_probs > 0).then(|| {
                    Box::new(TokenProbs {
                        prob: d.prob,
                        top: d.top,
                    })
                });
                (d.token, probs, accepted)
            } else if let Some(logits) = s.logits.take() {
                let picked = Self::sample_logits(s, &logits);
                s.logits = Some(logits);
                self.n_host_samples += 1;
                picked
            } else {
                continue;
            };
            take_sampled(tok, s, t, probs, accepted, events);
        }
        Ok(())
    }

    /// Samples a token from logits read back to the host (with its probabilities where
    /// asked for) and accepts it.
    pub(super) fn sample_logits(
        s: &mut Session,
        logits: &[f32],
    ) -> (u32, Option<Box<TokenProbs>>, Result<(), GrammarError>) {
        let (t, probs) = if s.params.n_probs == 0 {
            (s.sampler.sample(logits), None)
        } else if s.params.post_sampling_probs {
            let (t, prob, top) = s.sampler.sample_with_probs(logits, s.params.n_probs);
            (t, Some(Box::new(TokenProbs { prob, top })))
        } else {
            let t = s.sampler.sample(logits);
            let p = TokenProbs::from_logits(logits, t, s.params.n_probs);
            (t, Some(Box::new(p)))
        };
        let accepted = s.sampler.accept_generated(t);
        (t, probs, accepted)
    }

    /// The sessions of `generating` and `prompts` that share the first one's LoRA
    /// scales, which the context is set to. The others wait until no session of that
    /// setting comes first (llama-server's rule: the first slot's adapters decide).
    fn one_lora_setting(
        &mut self,
        generating: Vec<SessionId>,
        prompts: Vec<(SessionId, usize)>,
    ) -> (Vec<SessionId>, Vec<(SessionId, usize)>) {
        if self.model.loras.is_empty() {
            return (generating, prompts);
        }
        let first = generating.first().copied().or(prompts.first().map(|p| p.0));
        let Some(want) = first.and_then(|id| self.sessions[id as usize].as_ref()) else {
            return (generating, prompts);
        };
        let want = want.lora.clone();
        let same =
            |id: SessionId| (self.sessions[id as usize].as_ref()).is_some_and(|s| s.lora == want);
        let generating: Vec<SessionId> = generating.into_iter().filter(|&id| same(id)).collect();
        let prompts: Vec<(SessionId, usize)> = prompts.into_iter().filter(|p| same(p.0)).collect();
        self.ctx.set_lora(&want);
        (generating, prompts)
    }

    /// Makes room for each session's share of the batch and lays the batch out.
    pub(super) fn plan_batch(
        &mut self,
        events: &mut Vec<Event>,
    ) -> Result<(Batch, Vec<Part>), EngineError> {
        let n_batch = self.ctx.params.n_batch as usize;
        let n_ctx_seq = self.n_ctx_seq() as i32;
        let mut batch = Batch::default();
        let mut parts = Vec::new();
        // Generating sessions first (one token each), then the waiting prompts, which
        // share the rest of the batch equally (starting from a different one each step,
        // so the remainder rotates): a short prompt is not held behind a long one.
        let generating: Vec<SessionId> = self
            .sessions()
            .filter(|s| s.phase == Phase::Generate && s.next.is_some())
            .map(|s| s.id)
            .collect();
        let mut prompts: Vec<(SessionId, usize)> = self
            .sessions()
            .filter(|s| s.phase == Phase::Prompt)
            .map(|s| (s.id, s.pending.len()))
            .collect();
        if !prompts.is_empty() {
            let k = self.n_steps as usize % prompts.len();
            prompts.rotate_left(k);
        }
        // One graph applies one setting of the LoRA scales: the batch takes the sessions
        // of the first one's setting, the others wait (llama-server batches only slots
        // whose adapters are equal).
        let (generating, prompts) = self.one_lora_setting(generating, prompts);
        // An image is decoded in a step of its own: a batch is of token ids or of
        // embeddings, never both (llama.cpp's mtmd helper decodes it alone too).
        let image_next = |id: &SessionId| {
            let s = self.sessions[*id as usize].as_ref();
            s.and_then(|s| s.pending.front())
                .is_some_and(|&t| is_image_token(t))
        };
        if let Some(&(id, _)) = prompts.iter().find(|p| image_next(&p.0)) {
            return self.plan_image(id, events);
        }
        let room = n_batch.saturating_sub(generating.len());
        let needs: Vec<usize> = prompts.iter().map(|p| p.1).collect();
        let shares = schedule::fair_shares(&needs, room);
        let order: Vec<(SessionId, bool, usize)> = (generating.iter().map(|&id| (id, true, 1)))
            .chain(
                prompts
                    .iter()
                    .zip(shares)
                    .filter(|(_, n)| *n > 0)
                    .map(|(p, n)| (p.0, false, n)),
            )
            .collect();
        for &(id, generating, share) in &order {
            let room_left = n_batch - batch.tokens.len();
            if room_left == 0 {
                break;
            }
            let s = self.sessions[id as usize].as_mut().unwrap();
            let tokens: Vec<u32> = if generating {
                // The sampled token, then the draft's proposals after it (never an
                // image's placeholder: a token batch takes ids).
                let text = s.draft.iter().position(|&t| is_image_token(t));
                s.draft
                    .truncate((room_left - 1).min(text.unwrap_or(usize::MAX)));
                let mut t = vec![s.next.unwrap()];
                t.extend_from_slice(&s.draft);
                t
            } else {
                // Text up to the next image.
                s.pending
                    .iter()
                    .take(share.min(room_left))
                    .take_while(|&&t| !is_image_token(t))
                    .copied()
                    .collect()
            };
            let n = tokens.len() as i32;
            match s.shift.make_room(&mut self.ctx, id, n, n_ctx_seq) {
                Ok(Room::Fits) => {}
                Ok(Room::Shifted { n_keep, n_discard }) => events.push(Event::ContextShifted {
                    session: id,
                    n_keep,
                    n_discard,
                }),
                Ok(Room::Extended { n_past }) => events.push(Event::ContextExtended {
                    session: id,
                    n_past,
                }),
                Err(ContextError::ContextFull { n_ctx, reason }) => {
                    let s = self.sessions[id as usize].as_mut().unwrap();
                    if generating {
                        events.push(s.finish(Stop::ContextFull(reason)));
                        record_reply(&self.tokenizer, s);
                    } else {
                        s.finish(Stop::ContextFull(reason));
                        events.push(Event::Error {
                            session: id,
                            error: if s.then_generate {
                                EngineError::PromptFull { n_ctx, reason }
                            } else {
                                EngineError::Context(ContextError::ContextFull { n_ctx, reason })
                            },
                        });
                    }
                    continue;
                }
                Err(e) => return Err(e.into()),
            }
            let s = self.sessions[id as usize].as_ref().unwrap();
            // Positions continue from the sequence's largest one, as llama.cpp assigns
            // them to a batch without positions (after Self-Extend, below n_past).
            let pos0 = self.ctx.memory().seq_pos_max(id) + 1;
            let last_of_input = generating || tokens.len() == s.pending.len();
            // Proposals are checked row by row; `feed_all` keeps every row.
            let every_row =
                (generating && tokens.len() > 1) || (!generating && s.fed_logits.is_some());
            for (i, &t) in tokens.iter().enumerate() {
                batch.tokens.push(t);
                batch.pos.push(pos0 + i as i32);
                batch.seq.push(1u64 << id);
                batch
                    .logits
                    .push(every_row || (last_of_input && i + 1 == tokens.len()));
            }
            parts.push(Part {
                id,
                len: tokens.len(),
                drawn: None,
                generating,
                logits: last_of_input,
                rows: if every_row {
                    tokens.len()
                } else {
                    last_of_input as usize
                },
            });
        }
        Ok((batch, parts))
    }

    /// A batch of the image at the front of session `id`'s input, after room is made
    /// for all of it (its embeddings are encoded by the step).
    fn plan_image(
        &mut self,
        id: SessionId,
        events: &mut Vec<Event>,
    ) -> Result<(Batch, Vec<Part>), EngineError> {
        let n_ctx_seq = self.n_ctx_seq() as i32;
        let s = self.sessions[id as usize].as_mut().unwrap();
        let Some(img) = s.images.front().cloned() else {
            return Err(EngineError::Options(format!(
                "session {id}: an image's tokens are queued without the image"
            )));
        };
        // The image's tokens not decoded yet: all of them, or (a causal image longer
        // than a batch) the next batch of them.
        let done = s.image_done;
        let left = img.n_tokens.saturating_sub(done) as usize;
        let n = match img.non_causal {
            true => left,
            false => left.min(self.ctx.params.n_batch as usize),
        };
        let tokens: Vec<u32> = s.pending.iter().take(n).copied().collect();
        // A shift drops half of what the sequence holds; an image may need several.
        loop {
            let s = self.sessions[id as usize].as_mut().unwrap();
            let room = s.shift.make_room(&mut self.ctx, id, n as i32, n_ctx_seq);
            match room {
                Ok(Room::Fits) => break,
                Ok(Room::Shifted { n_keep, n_discard }) => events.push(Event::ContextShifted {
                    session: id,
                    n_keep,
                    n_discard,
                }),
                Ok(Room::Extended { n_past }) => {
                    events.push(Event::ContextExtended {
                        session: id,
                        n_past,
                    });
                    break;
                }
                Err(ContextError::ContextFull { n_ctx, reason }) => {
                    s.finish(Stop::ContextFull(reason));
                    events.push(Event::Error {
                        session: id,
                        error: EngineError::PromptFull { n_ctx, reason },
                    });
                    return Ok((Batch::default(), Vec::new()));
                }
                Err(e) => return Err(e.into()),
            }
        }
        let s = self.sessions[id as usize].as_ref().unwrap();
        let pos0 = self.ctx.memory().seq_pos_max(id) + 1;
        let last_of_input = n == s.pending.len();
        let batch = Batch {
            tokens: tokens.clone(),
            pos: (0..n as i32).map(|i| pos0 + i).collect(),
            seq: vec![1u64 << id; n],
            logits: (0..n).map(|i| last_of_input && i + 1 == n).collect(),
            embd: Vec::new(),
            non_causal: img.non_causal,
            image: img.grid.map(|(nx, ny)| crate::batch::ImagePiece {
                nx,
                ny,
                first: done,
            }),
            mrope: Vec::new(),
        };
        let part = Part {
            id,
            len: n,
            drawn: None,
            generating: false,
            logits: last_of_input,
            rows: last_of_input as usize,
        };
        Ok((batch, vec![part]))
    }

    /// The embeddings of the `n` image tokens a step's one part decodes: the front
    /// image's, from the first not decoded yet (the image is encoded on its first piece
    /// and kept until its last).
    async fn image_rows(&mut self, parts: &[Part], n: usize) -> Result<Vec<f32>, EngineError> {
        let id = parts[0].id;
        let s = self.session(id)?;
        let img = s.images.front().cloned();
        let (Some(img), Some(enc)) = (img, self.vision.clone()) else {
            return Err(EngineError::NoVision);
        };
        let (kept, done) = (s.image_rows.clone(), s.image_done as usize);
        let rows = match kept {
            Some(rows) => rows,
            None => {
                let start = Instant::now();
                let rows = std::sync::Arc::new(enc.encode_pixels(&img.pixels).await?);
                log::debug!(
                    "image of {} tokens encoded in {:.1} ms",
                    img.n_tokens,
                    start.elapsed().as_secs_f64() * 1e3
                );
                if let Some(s) = self.sessions[id as usize].as_mut() {
                    s.image_rows = Some(rows.clone());
                }
                rows
            }
        };
        let w = rows.len() / (img.n_tokens as usize).max(1);
        Ok(rows[done * w..(done + n) * w].to_vec())
    }

    /// Hands each session its decoded tokens and logits.
    pub(super) fn take_results(
        &mut self,
        batch: &Batch,
        parts: &[Part],
        out: &crate::context::Decoded,
        dt: Duration,
        events: &mut Vec<Event>,
    ) -> Result<(), EngineError> {
        let n_vocab = self.model.hp.n_vocab as usize;
        let mut rows = out.logits.chunks(n_vocab.max(1));
        let mut at = 0;
        for p in parts {
            let toks = &batch.tokens[at..at + p.len];
            at += p.len;
            let part_rows: Vec<&[f32]> = rows.by_ref().take(p.rows).collect();
            let row = if p.logits {
                part_rows.last().copied()
            } else {
                None
            };
            let s = self.sessions[p.id as usize].as_mut().unwrap();
            if let Some(all) = s.fed_logits.as_mut().filter(|_| !p.generating) {
                all.extend(part_rows.iter().map(|r| r.to_vec()));
            }
            s.shift.n_past += p.len as i32;
            s.history.extend_from_slice(toks);
            if p.generating && p.len > 1 {
                s.spec_rows = Some(part_rows.iter().map(|r| r.to_vec()).collect());
            } else if let Some(r) = row {
                s.logits = Some(r.to_vec());
            }
            if let Some(j) = p.drawn {
                s.drawn = Some(out.picks[j].clone());
                s.logits = None;
            }
            if p.generating {
                s.next = None;
                s.timings.eval += dt;
                s.timings.eval_tokens += 1;
                continue;
            }
            if is_image_token(toks[0]) {
                if let Some(img) = s.images.front().cloned() {
                    // A piece of the image: its span opens at the first piece of its first
                    // chunk and closes at the last piece of its last.
                    let p0 = batch.pos[at - p.len];
                    let (first, done) = (s.image_done == 0, s.image_done + p.len as u32);
                    let last = done >= img.n_tokens;
                    let (opens, closes) = (img.first && first, img.last && last);
                    (s.shift).record_image(p0, p0 + p.len as i32, opens, closes);
                    s.image_done = done;
                    if last {
                        s.images.pop_front();
                        s.image_rows = None;
                        s.image_done = 0;
                    }
                }
            }
            s.pending.drain(..p.len);
            s.input_done += p.len;
            s.timings.prompt += dt;
            s.timings.prompt_tokens += p.len;
            events.push(Event::PromptProgress {
                session: p.id,
                done: s.input_done,
                total: s.input_total,
            });
            if !s.pending.is_empty() {
                continue;
            }
            if std::mem::take(&mut s.save_cache_after_input) {
                let path = s.params.prompt_cache.as_ref().unwrap().path.clone();
                let history = s.history.clone();
                self.save_prompt_cache(p.id, &path, &history)?;
            }
            let pos = self.ctx.memory().seq_pos_max(p.id) + 1;
            let s = self.sessions[p.id as usize].as_mut().unwrap();
            if s.then_generate {
                s.reply_mark = Some(rewind::ReplyMark::take(s, pos));
                s.phase = Phase::Generate;
            } else {
                events.push(s.finish(Stop::Fed));
            }
        }
        Ok(())
    }

    #[cfg(not(target_arch = "wasm32"))]
    pub(super) fn save_prompt_cache(
        &mut self,
        id: SessionId,
        path: &std::path::Path,
        tokens: &[u32],
    ) -> Result<(), EngineError> {
        let lora = self.session(id)?.lora.clone();
        self.ctx.state_save(path, tokens, Some(id), &lora)?;
        Ok(())
    }

    #[cfg(target_arch = "wasm32")]
    pub(super) fn save_prompt_cache(
        &mut self,
        _: SessionId,
        path: &std::path::Path,
        _: &[u32],
    ) -> Result<(), EngineError> {
        Err(EngineError::PromptCache(format!(
            "{}: prompt-cache files need a file system",
            path.display()
        )))
    }
}

/// Records a finished chat reply in the session's conversation.
pub(super) fn record_reply(tok: &Tokenizer, s: &mut Session) {
    let reply = s.reply.clone();
    if let Some(conv) = s.conversation.as_mut() {
        if let Err(e) = conv.assistant_reply(tok, &reply) {
            log::warn!("chat template while recording the reply: {e}");
        }
    }
}

/// Before a session samples: a cancellation, its `n_predict` reached or its grammar
/// complete end the generation (false); true if it samples.
fn ready_to_sample(tok: &Tokenizer, s: &mut Session, events: &mut Vec<Event>) -> bool {
    if std::mem::take(&mut s.cancel) {
        if s.phase != Phase::Idle {
            events.push(s.finish(Stop::Cancelled));
            record_reply(tok, s);
        }
        return false;
    }
    // A token sampled earlier that did not fit the last batch is still to decode.
    if s.phase != Phase::Generate || s.next.is_some() {
        return false;
    }
    let n_predict = s.params.n_predict;
    if n_predict >= 0 && s.generated.len() >= n_predict as usize {
        events.push(s.finish(Stop::MaxTokens));
        record_reply(tok, s);
        return false;
    }
    // A grammar that allows nothing more ends the generation, as its end-of-generation
    // token would (also where --ignore-eos bans that token).
    if s.sampler.grammar_complete() {
        events.push(s.finish(Stop::EndOfGeneration));
        record_reply(tok, s);
        return false;
    }
    true
}

/// A sampled and accepted token: the generation ends at an end-of-generation token or a
/// grammar the request made too complex (false); else the token is generated, streamed
/// and becomes the session's `next` (true).
fn take_sampled(
    tok: &Tokenizer,
    s: &mut Session,
    t: u32,
    probs: Option<Box<TokenProbs>>,
    accepted: Result<(), GrammarError>,
    events: &mut Vec<Event>,
) -> bool {
    match accepted {
        Ok(()) => {}
        Err(error @ GrammarError::TooComplex) => {
            // The request's grammar needs more than the matcher may spend on a token:
            // the client hears why, rather than a plain end.
            s.finish(Stop::EndOfGeneration);
            events.push(Event::Error {
                session: s.id,
                error: error.into(),
            });
            return false;
        }
        // Sampling only picks tokens the grammar allows; this is a bug if seen.
        Err(e) => log::error!("session {}: {e}", s.id),
    }
    if tok.is_eog(t) {
        events.push(s.finish(Stop::EndOfGeneration));
        record_reply(tok, s);
        return false;
    }
    s.generated.push(t);
    let text = s.stream.push(&tok.token_to_piece(t, false));
    s.reply.push_str(&text);
    s.next = Some(t);
    events.push(Event::Token {
        session: s.id,
        token: t,
        text,
        probs,
    });
    true
}

/// Samples a session's rows after a step that decoded its sampled token and the draft's
/// proposals: row i gives the token after proposal i; a proposal is kept when the
/// session samples that very token, and the first one it does not sample ends the
/// round with the sampled token as `next`. Returns the proposals kept (whose tokens are
/// generated and stay in the cache) and the tokens sampled.
fn verify_draft(
    tok: &Tokenizer,
    s: &mut Session,
    rows: &[Vec<f32>],
    synth: Option<&[f64]>,
    events: &mut Vec<Event>,
) -> (usize, u64) {
    let draft = std::mem::take(&mut s.draft);
    let (mut kept, mut sampled) = (0, 0);
    for (i, row) in rows.iter().enumerate() {
        if !ready_to_sample(tok, s, events) {
            break;
        }
        if let (Some(rates), Some(&d)) = (synth, draft.get(i)) {
            let seed = s.sampler.seed() as u32;
            let rng = s
                .synth_rng
                .get_or_insert_with(|| crate::sample::rng::Mt19937::new(seed));
            // The target's sample is drawn (its random number spent) either way.
            let t = s.sampler.sample(row);
            sampled += 1;
            let keep = rng.uniform_f64() < rates.get(i).copied().unwrap_or(0.0);
            if keep && !tok.is_eog(d) {
                s.sampler.accept(d);
                take_sampled(tok, s, d, None, Ok(()), events);
                s.next = None;
                kept += 1;
                count_kept(s);
                continue;
            }
            let accepted = s.sampler.accept_generated(t);
            take_sampled(tok, s, t, None, accepted, events);
            break;
        }
        let (t, probs, accepted) = Engine::sample_logits(s, row);
        sampled += 1;
        if !take_sampled(tok, s, t, probs, accepted, events) {
            break;
        }
        if draft.get(i) != Some(&t) {
            break;
        }
        // The proposal is the token sampled, already decoded: the next row follows it.
        s.next = None;
        kept += 1;
        count_kept(s);
    }
    s.draft = draft;
    (kept, sampled)
}

/// A kept proposal in the session's timings, at once: a generation that ends later in
/// the same round reports its timings before the round's count is known.
fn count_kept(s: &mut Session) {
    s.timings.draft_accepted += 1;
    s.timings.eval_tokens += 1;
}
