//! A session's input: the checks on its first tokens, `--keep`, and the reuse of
//! cached prefixes (cells the sequence still holds, or a prompt-cache file).

use super::media::{image_runs, image_token, is_image_token, whole_images};
use super::{Engine, EngineError, ImageChunk, Phase, SessionId, SessionParams, Utf8Stream};
use std::sync::Arc;

impl Engine {
    /// Queues input for a session: checks, `--keep` resolution and prompt-cache reuse on
    /// the first input, sampler history.
    pub(super) fn input(
        &mut self,
        id: SessionId,
        tokens: &[u32],
        generate: bool,
    ) -> Result<(), EngineError> {
        self.input_reusing(id, tokens, &[], generate, None)
    }

    /// [`Engine::input`] of a prompt with images (their placeholders in `tokens`).
    pub(super) fn input_media(
        &mut self,
        id: SessionId,
        tokens: &[u32],
        images: &[Arc<ImageChunk>],
        generate: bool,
    ) -> Result<(), EngineError> {
        self.input_reusing(id, tokens, images, generate, None)
    }

    /// Starts a request on idle session `id`: a fresh session with `params` whose input
    /// is the whole prompt `tokens`. With `cache_prompt`, the cells of the longest prefix
    /// the prompt shares with what the sequence holds are kept (never the last token:
    /// its logits are needed); the rest of the sequence is dropped. Returns the tokens
    /// reused. A sequence that was shifted or extended keeps nothing (its cells no longer
    /// sit at the positions of its tokens).
    pub fn start_request(
        &mut self,
        id: SessionId,
        params: SessionParams,
        tokens: &[u32],
        cache_prompt: bool,
    ) -> Result<usize, EngineError> {
        self.start_request_media(id, params, tokens, &[], cache_prompt)
    }

    /// [`Engine::start_request`] of a prompt with images: `tokens` holds their
    /// placeholders (see [`super::MediaPrompt`]), `images` the images in order. A prefix
    /// reused from the cache ends before any image it would cut, and takes an image only
    /// where the same image (by hash) sits at the same place.
    pub fn start_request_media(
        &mut self,
        id: SessionId,
        params: SessionParams,
        tokens: &[u32],
        images: &[Arc<ImageChunk>],
        cache_prompt: bool,
    ) -> Result<usize, EngineError> {
        let s = self.session(id)?;
        if s.phase != Phase::Idle {
            return Err(EngineError::Busy(id));
        }
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        params.validate()?;
        self.check_shift_policy(&params)?;
        let kept = if cache_prompt && s.shift.ops.is_empty() {
            s.history.clone()
        } else {
            Vec::new()
        };
        let old_lora = s.lora.clone();
        let session = self.new_session(id, params)?;
        // Cells decoded under other adapter scales are not this request's (llama-server
        // clears a slot whose LoRA setting changes).
        let kept = match session.lora == old_lora {
            true => kept,
            false => Vec::new(),
        };
        self.sessions[id as usize] = Some(session);
        self.input_reusing(id, tokens, images, true, Some(&kept))?;
        Ok(self.session(id)?.history.len())
    }

    /// [`Engine::input`]; on a session's first input, `kept` (the tokens its sequence
    /// still holds from an earlier request) gives the prefix to reuse.
    pub(super) fn input_reusing(
        &mut self,
        id: SessionId,
        tokens: &[u32],
        images: &[Arc<ImageChunk>],
        generate: bool,
        kept: Option<&[u32]>,
    ) -> Result<(), EngineError> {
        let n_ctx_seq = self.n_ctx_seq() as usize;
        let add_bos = self.tokenizer.add_bos();
        let s = self.session(id)?;
        if s.phase != Phase::Idle {
            return Err(EngineError::Busy(id));
        }
        if tokens.is_empty() && (s.logits.is_none() || !generate) {
            return Err(EngineError::EmptyPrompt);
        }
        let n_vocab = self.model.hp.n_vocab;
        let bad = |&&t: &&u32| t >= n_vocab && !is_image_token(t);
        if let Some(&bad) = tokens.iter().find(bad) {
            return Err(EngineError::Options(format!(
                "token id {bad} is out of the vocabulary (0..{n_vocab})"
            )));
        }
        let runs = image_runs(tokens);
        self.check_images(tokens, &runs, images)?;
        let s = self.session(id)?;
        let first = s.history.is_empty();
        let mut reuse = 0;
        if first {
            // llama-completion refuses a first prompt that leaves fewer than 4 cells (a
            // recurrent model alone has no cells to run out of).
            let bounded = self.ctx.memory().bounded();
            if bounded && s.params.shift.ga_n == 1 && tokens.len() > n_ctx_seq.saturating_sub(4) {
                return Err(EngineError::PromptTooLong {
                    n: tokens.len(),
                    max: n_ctx_seq.saturating_sub(4),
                });
            }
            if let Some(pc) = s.params.prompt_cache.clone() {
                reuse = self.reuse_prompt_cache(id, &pc.path, tokens)?;
            } else if let Some(kept) = kept {
                reuse = self.reuse_cells(id, kept, tokens)?;
            }
        }
        let s = self.session_mut(id)?;
        if first {
            s.shift.n_keep = s.params.shift.n_keep_for(tokens.len(), add_bos);
            s.save_cache_after_input = s
                .params
                .prompt_cache
                .as_ref()
                .is_some_and(|pc| !pc.read_only);
        }
        for &t in tokens {
            s.sampler.accept(t);
        }
        s.history.extend_from_slice(&tokens[..reuse]);
        s.shift.n_past += reuse as i32;
        s.pending = tokens[reuse..].iter().copied().collect();
        // The images the reused prefix holds are in the cache already (whole: the prefix
        // never ends inside one); the span of each is recorded for context shifts.
        s.images.clear();
        s.image_rows = None;
        s.image_done = 0;
        s.shift.open_image = None;
        let base = s.shift.n_past as usize - reuse;
        for (&(start, n), img) in runs.iter().zip(images) {
            if start < reuse {
                let p0 = (base + start) as i32;
                (s.shift).record_image(p0, p0 + n as i32, img.first, img.last);
            } else {
                s.images.push_back(img.clone());
            }
        }
        s.input_total = s.pending.len();
        s.input_done = 0;
        s.then_generate = generate;
        s.generated.clear();
        s.synth_rng = None;
        s.reply.clear();
        s.stream = Utf8Stream::default();
        s.phase = if s.pending.is_empty() {
            Phase::Generate
        } else {
            Phase::Prompt
        };
        Ok(())
    }

    /// Refuses images that do not match their placeholders in `tokens` (`runs`), an
    /// engine without an encoder, and images a batch cannot hold whole.
    fn check_images(
        &self,
        tokens: &[u32],
        runs: &[(usize, usize)],
        images: &[Arc<ImageChunk>],
    ) -> Result<(), EngineError> {
        if runs.is_empty() && images.is_empty() {
            return Ok(());
        }
        let Some(prep) = self.image_prep() else {
            return Err(EngineError::NoVision);
        };
        let matches = runs.len() == images.len()
            && runs.iter().zip(images).all(|(&(start, n), img)| {
                n == img.n_tokens as usize && tokens[start] == image_token(img.hash, 0)
            });
        if !matches {
            return Err(EngineError::Options(format!(
                "the prompt holds {} image chunk(s) and {} were given, or their places do not match them (build prompts with images through MediaPrompt)",
                runs.len(),
                images.len()
            )));
        }
        let p = &self.ctx.params;
        let n = images.iter().map(|i| i.n_tokens).max().unwrap_or(0);
        // An image whose tokens see each other is decoded in one ubatch; a causal one in
        // pieces of a batch where it is longer.
        let limit = match prep.projector.non_causal() {
            true => p.n_batch.min(p.n_ubatch),
            false => u32::MAX,
        };
        if n > limit {
            return Err(EngineError::Options(format!(
                "an image takes {n} tokens, more than a batch holds (-b {}, -ub {}): raise -b and -ub to at least {n}",
                p.n_batch, p.n_ubatch
            )));
        }
        Ok(())
    }

    /// Keeps the cells of the prefix `prompt` shares with `kept` (what sequence `id`
    /// holds) and drops the rest; returns how many prompt tokens need no decoding.
    pub(super) fn reuse_cells(
        &mut self,
        id: SessionId,
        kept: &[u32],
        prompt: &[u32],
    ) -> Result<usize, EngineError> {
        let same = kept.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        let mut reuse = whole_images(prompt, same.min(prompt.len() - 1));
        if reuse > 0 && !self.ctx.can_resume(id, reuse as i32) {
            log::debug!("session {id}: the cache no longer holds the state at token {reuse} (a sliding window dropped its start, or a recurrent state holds only its end); reprocessing the prompt");
            reuse = 0;
        }
        self.ctx.seq_rm(Some(id), reuse as i32, -1)?;
        Ok(reuse)
    }

    /// Loads the prompt-cache file (if it exists) into `id`'s sequence and keeps the
    /// cells of the longest prefix its tokens share with `prompt`; returns how many
    /// prompt tokens need no decoding (never the last one: its logits are needed).
    pub(super) fn reuse_prompt_cache(
        &mut self,
        id: SessionId,
        path: &std::path::Path,
        prompt: &[u32],
    ) -> Result<usize, EngineError> {
        if !path.exists() {
            log::info!(
                "prompt cache {} does not exist yet; it will be created",
                path.display()
            );
            return Ok(0);
        }
        let saved = self.ctx.state_load(path, Some(id))?;
        let same = saved
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        let mut reuse = whole_images(prompt, same.min(prompt.len() - 1));
        let lora = &self.session(id)?.lora;
        if saved.lora.as_ref().is_some_and(|saved| saved != lora) {
            log::info!(
                "prompt cache {}: its cells were computed with other LoRA scales ({:?}, this run's {:?}); reprocessing the prompt",
                path.display(),
                saved.lora.as_deref().unwrap_or_default(),
                lora
            );
            reuse = 0;
        } else if !self.ctx.can_resume(id, reuse as i32) {
            // As llama.cpp does without --swa-full, but only when it must: the rolling
            // buffer no longer has the window before the shared prefix ends. A recurrent
            // state holds only the end of what was saved, so only an exact continuation
            // reuses it.
            let why = if self.ctx.memory().bounded() {
                "the sliding-window buffer no longer holds the window before token {reuse} (--swa-full keeps it)"
            } else {
                "a recurrent state holds only the end of the saved tokens, not token {reuse}"
            };
            log::info!(
                "prompt cache {}: {}; reprocessing the prompt",
                path.display(),
                why.replace("{reuse}", &reuse.to_string())
            );
            reuse = 0;
        }
        self.ctx.seq_rm(Some(id), reuse as i32, -1)?;
        log::info!(
            "prompt cache {}: {reuse} of {} prompt tokens reused",
            path.display(),
            prompt.len()
        );
        Ok(reuse)
    }
}
