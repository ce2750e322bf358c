//! One conversation or completion on one sequence of the cache: its pending input, its
//! sampler, its position bookkeeping through context shifts, its text stream and timings.
//! The engine advances every session together; a session only holds state.

use super::chat::Conversation;
use super::shift::{SeqShift, ShiftPolicy};
use super::stream::{Timings, Utf8Stream};
use super::EngineError;
use crate::context::FullReason;
use crate::kv::SeqId;
use crate::sample::{Sampler, SamplerParams};
use std::collections::VecDeque;
use std::path::PathBuf;

/// A session's handle: the id of the cache sequence it owns.
pub type SessionId = SeqId;

/// A state file holding a prompt's cache, reused by the next run whose prompt shares a
/// prefix (llama.cpp's `--prompt-cache`).
#[derive(Clone, Debug)]
pub struct PromptCache {
    pub path: PathBuf,
    /// Use the file without updating it (`--prompt-cache-ro`).
    pub read_only: bool,
}

/// How a session samples, how long it generates and what it does when its context fills.
#[derive(Clone, Debug, Default)]
pub struct SessionParams {
    pub sampling: SamplerParams,
    /// Most tokens per generation (each prompt or chat turn); -1: until end of generation.
    pub n_predict: i32,
    pub shift: ShiftPolicy,
    pub prompt_cache: Option<PromptCache>,
    /// Report the probabilities of this many most likely tokens with each generated
    /// token (llama-server's `n_probs`, OpenAI's `top_logprobs`); 0: none.
    pub n_probs: usize,
    /// Report those probabilities after the sampler chain (top-k, top-p, temperature,
    /// ...) instead of the model's own (llama-server's `post_sampling_probs`).
    pub post_sampling_probs: bool,
    /// Draw this session's tokens on the GPU (true) or sample them on the host (false);
    /// None: as the engine's `--sampling` says. A chain the GPU lacks samples on the
    /// host either way (llama-server's per-request `backend_sampling`).
    pub gpu_draws: Option<bool>,
    /// How much the engine's draft model proposes for this session (llama-server's
    /// per-request `speculative.n_max`, `.n_min`, `.p_min`); None: the engine's setting.
    pub speculative: Option<super::SpecParams>,
    /// The LoRA adapters' scales for this session, one per loaded adapter (llama-server's
    /// per-request `lora`); None: the engine's current setting.
    pub lora: Option<crate::model::lora::LoraScales>,
}

impl SessionParams {
    /// Refuses settings that cannot work together, before anything is loaded.
    pub fn validate(&self) -> Result<(), EngineError> {
        self.shift.validate().map_err(EngineError::Options)?;
        self.sampling.validate().map_err(EngineError::Options)?;
        if self.prompt_cache.is_some() && self.shift.ga_n > 1 {
            return Err(EngineError::PromptCache(format!(
                "--prompt-cache cannot be used with Self-Extend (--grp-attn-n {} > 1): a cache is reused by position, and grouped positions no longer match the prompt's tokens",
                self.shift.ga_n
            )));
        }
        Ok(())
    }
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The model produced an end-of-generation token.
    EndOfGeneration,
    /// `n_predict` tokens were generated.
    MaxTokens,
    /// The session's context filled up and no room could be made; the reason says why.
    ContextFull(FullReason),
    /// [`super::Engine::cancel`] stopped it.
    Cancelled,
    /// Its input was decoded and it was asked not to generate ([`super::Engine::feed`]).
    Fed,
}

/// What a step did for a session.
#[derive(Debug)]
pub enum Event {
    /// Prompt tokens decoded so far, of the tokens this input needs decoded.
    PromptProgress {
        session: SessionId,
        done: usize,
        total: usize,
    },
    /// A generated token and the text it completes (whole UTF-8 characters only; may be
    /// empty while a character is incomplete).
    Token {
        session: SessionId,
        token: u32,
        text: String,
        /// With [`SessionParams::n_probs`] > 0: the distribution it was drawn from.
        probs: Option<Box<TokenProbs>>,
    },
    /// A context shift dropped `n_discard` cached tokens after the first `n_keep`.
    ContextShifted {
        session: SessionId,
        n_keep: i32,
        n_discard: i32,
    },
    /// Self-Extend regrouped positions; the session now spans `n_past` positions.
    ContextExtended { session: SessionId, n_past: i32 },
    /// The generation ended; `tail` is text held back by the UTF-8 stream.
    Finished {
        session: SessionId,
        stop: Stop,
        tail: String,
        timings: Timings,
    },
    /// The session's input could not be processed (e.g. its prompt does not fit); the
    /// session is idle again and other sessions go on.
    Error {
        session: SessionId,
        error: EngineError,
    },
}

impl Event {
    pub fn session(&self) -> SessionId {
        match self {
            Event::PromptProgress { session, .. }
            | Event::Token { session, .. }
            | Event::ContextShifted { session, .. }
            | Event::ContextExtended { session, .. }
            | Event::Finished { session, .. }
            | Event::Error { session, .. } => *session,
        }
    }
}

/// The distribution a token was sampled from: softmax of the model's logits (before the
/// sampler chain), as llama-server reports `completion_probabilities` by default.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenProbs {
    /// Probability of the token that was picked.
    pub prob: f32,
    /// The most likely tokens, most likely first (ties: lower id first).
    pub top: Vec<(u32, f32)>,
}

impl TokenProbs {
    /// The top `n` of `logits` and the probability of `token`.
    pub fn from_logits(logits: &[f32], token: u32, n: usize) -> TokenProbs {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
        let p = |l: f32| (((l - max) as f64).exp() / sum) as f32;
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let n = n.min(idx.len());
        let cmp = |a: &u32, b: &u32| {
            logits[*b as usize]
                .total_cmp(&logits[*a as usize])
                .then(a.cmp(b))
        };
        if n > 0 && n < idx.len() {
            idx.select_nth_unstable_by(n - 1, cmp);
        }
        idx.truncate(n);
        idx.sort_by(cmp);
        TokenProbs {
            prob: logits.get(token as usize).map_or(0.0, |&l| p(l)),
            top: idx
                .into_iter()
                .map(|i| (i, p(logits[i as usize])))
                .collect(),
        }
    }
}

/// Where a session is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Nothing to do until new input arrives.
    Idle,
    /// Input tokens wait to be decoded.
    Prompt,
    /// Sampling one token per step.
    Generate,
}

pub struct Session {
    pub(super) id: SessionId,
    pub(super) params: SessionParams,
    pub(super) sampler: Sampler,
    pub(super) shift: SeqShift,
    pub(super) phase: Phase,
    /// Tokens waiting to be decoded (an image's placeholders among them, see `media.rs`).
    pub(super) pending: VecDeque<u32>,
    /// The images of `pending`, in order.
    pub(super) images: VecDeque<std::sync::Arc<super::ImageChunk>>,
    /// The front image's embeddings once encoded, and its tokens decoded so far (a
    /// causal image longer than a batch is decoded in pieces).
    pub(super) image_rows: Option<std::sync::Arc<Vec<f32>>>,
    pub(super) image_done: u32,
    /// Progress of the current input (for events).
    pub(super) input_total: usize,
    pub(super) input_done: usize,
    /// Generate after the input is decoded (false: only decode, as for teacher forcing).
    pub(super) then_generate: bool,
    /// Logits after the last decoded token.
    pub(super) logits: Option<Vec<f32>>,
    /// The token sampled this step, to be decoded in the step's batch.
    pub(super) next: Option<u32>,
    /// The token the GPU drew from the last decoded token's logits, taken at the next
    /// step instead of sampling on the host.
    pub(super) drawn: Option<crate::context::Drawn>,
    /// Why this session's chain stays on the host, once logged.
    pub(super) host_reason_logged: bool,
    pub(super) generated: Vec<u32>,
    pub(super) reply: String,
    pub(super) stream: Utf8Stream,
    pub(super) timings: Timings,
    /// Every token this sequence holds, in order (for prompt-cache files).
    pub(super) history: Vec<u32>,
    pub(super) conversation: Option<Conversation>,
    pub(super) cancel: bool,
    /// The prompt-cache file still has to be written after the first input.
    pub(super) save_cache_after_input: bool,
    /// Every logits row of the input being fed ([`super::Engine::feed_all`]).
    pub(super) fed_logits: Option<Vec<Vec<f32>>>,
    /// Where the last generation began, for [`super::Engine::regenerate`].
    pub(super) reply_mark: Option<super::rewind::ReplyMark>,
    /// Tokens the draft model proposed after `next`, decoded with it this step.
    pub(super) draft: Vec<u32>,
    /// The logits rows of `next` and each proposal, to be sampled in turn.
    pub(super) spec_rows: Option<Vec<Vec<f32>>>,
    /// Draws for synthetic acceptance ([`super::Engine::set_synthetic_acceptance`]),
    /// seeded with the sampler's seed when a generation first needs one.
    pub(super) synth_rng: Option<crate::sample::rng::Mt19937>,
    /// The LoRA scales its tokens are decoded with (resolved when it was made: its
    /// params' or the engine's setting then); a batch holds sessions of one setting.
    pub(super) lora: crate::model::lora::LoraScales,
}

impl Session {
    pub(super) fn new(
        id: SessionId,
        params: SessionParams,
        sampler: Sampler,
    ) -> Result<Self, EngineError> {
        let shift = SeqShift::new(params.shift)?;
        Ok(Session {
            id,
            params,
            sampler,
            shift,
            phase: Phase::Idle,
            pending: VecDeque::new(),
            images: VecDeque::new(),
            image_rows: None,
            image_done: 0,
            input_total: 0,
            input_done: 0,
            then_generate: true,
            logits: None,
            next: None,
            drawn: None,
            host_reason_logged: false,
            generated: Vec::new(),
            reply: String::new(),
            stream: Utf8Stream::default(),
            timings: Timings::default(),
            history: Vec::new(),
            conversation: None,
            cancel: false,
            save_cache_after_input: false,
            fed_logits: None,
            reply_mark: None,
            draft: Vec::new(),
            spec_rows: None,
            synth_rng: None,
            lora: Vec::new(),
        })
    }

    pub fn id(&self) -> SessionId {
        self.id
    }
    pub fn phase(&self) -> Phase {
        self.phase
    }
    pub fn params(&self) -> &SessionParams {
        &self.params
    }
    /// Logits after the last decoded token (n_vocab floats).
    pub fn logits(&self) -> Option<&[f32]> {
        self.logits.as_deref()
    }
    /// Tokens of the current (or last) generation.
    pub fn generated(&self) -> &[u32] {
        &self.generated
    }
    /// Text of the current (or last) generation.
    pub fn reply(&self) -> &str {
        &self.reply
    }
    pub fn timings(&self) -> &Timings {
        &self.timings
    }
    /// Positions, resolved `n_keep` and the log of cache operations of context shifts.
    pub fn shift(&self) -> &SeqShift {
        &self.shift
    }
    /// Every token this session's sequence holds, in order.
    pub fn history(&self) -> &[u32] {
        &self.history
    }
    pub fn sampler_seed(&self) -> u64 {
        self.sampler.seed()
    }
    pub fn conversation(&self) -> Option<&Conversation> {
        self.conversation.as_ref()
    }
    /// True while the session has work for the next step.
    pub fn is_busy(&self) -> bool {
        self.phase != Phase::Idle || self.cancel
    }

    /// Gives an emptied sampler the penalty history of the tokens the sequence holds.
    pub(super) fn refill_penalty_history(&mut self) {
        let from = self
            .history
            .len()
            .saturating_sub(self.sampler.params().repeat_last_n);
        for &t in &self.history[from..] {
            self.sampler.accept(t);
        }
    }

    /// Ends the current generation: the stream's tail, the chat reply, the event.
    pub(super) fn finish(&mut self, stop: Stop) -> Event {
        let tail = self.stream.finish();
        self.reply.push_str(&tail);
        self.phase = Phase::Idle;
        self.pending.clear();
        self.images.clear();
        self.image_rows = None;
        self.image_done = 0;
        self.next = None;
        self.drawn = None;
        self.draft.clear();
        self.spec_rows = None;
        Event::Finished {
            session: self.id,
            stop,
            tail,
            timings: self.timings.clone(),
        }
    }
}
