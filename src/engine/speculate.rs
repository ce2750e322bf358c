//! Speculative decoding, with a draft model as llama.cpp's `draft-simple` or by n-gram
//! lookup as its `ngram-simple` (`ngram.rs`). A draft model (a small model with the same
//! vocabulary) proposes a few tokens after each sampled one, greedily; the
//! target decodes the sampled token and the proposals in one batch, with logits on every
//! row; the session's own sampler then samples row after row and keeps each proposal it
//! samples itself, so the output is what decoding without a draft would give (the same
//! samples from the same distributions), only with fewer target steps. The first
//! proposal it does not sample ends the round: the rejected proposals leave the cache.
//!
//! The draft keeps its own cache, one sequence per session. It holds a copy of what the
//! session's sequence holds, at positions equal to token indices, and is brought up to
//! date before each round by keeping the common prefix with the session's history and
//! decoding the rest.

use super::ngram::{ngram_draft, NgramParams};
use super::{Engine, EngineError, Phase};
use crate::context::{Batch, Context};
use crate::model::Model;
use crate::tokenizer::Tokenizer;
use std::sync::Arc;

/// How much a draft proposes (llama.cpp's `--spec-draft-n-max`, `-n-min`, `-p-min`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpecParams {
    /// Most tokens proposed after each sampled one.
    pub n_max: u32,
    /// Fewer proposals than this are dropped.
    pub n_min: u32,
    /// Proposing stops at a token the draft gives less than this probability (over its
    /// ten likeliest tokens).
    pub p_min: f32,
}

impl Default for SpecParams {
    fn default() -> Self {
        // llama.cpp's defaults.
        SpecParams {
            n_max: 3,
            n_min: 0,
            p_min: 0.0,
        }
    }
}

/// Tokens proposed and kept, counted over a generation or an engine's life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DraftStats {
    pub drafted: u64,
    pub accepted: u64,
}

impl DraftStats {
    /// Kept proposals as a share of all proposals, in percent.
    pub fn acceptance_percent(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            100.0 * self.accepted as f64 / self.drafted as f64
        }
    }
}

/// Where proposals come from.
enum Source {
    /// A draft model (`draft-simple`).
    Model(Box<ModelDraft>),
    /// The sequence's own earlier text (`ngram-simple`).
    Ngram(NgramParams),
}

/// The draft model, its context, and what each of its sequences holds.
struct ModelDraft {
    ctx: Context,
    held: Vec<Vec<u32>>,
    /// Tokens both vocabularies have: proposals and inputs stay below this.
    n_common: u32,
}

/// What proposes tokens, how many, and how many were kept.
pub(super) struct Drafter {
    source: Source,
    pub(super) params: SpecParams,
    pub(super) stats: DraftStats,
    /// Synthetic acceptance: proposal i is kept with probability `synth[i]`, whatever
    /// the target samples.
    pub(super) synth: Option<Vec<f64>>,
}

/// One session's request for proposals.
#[derive(Clone)]
pub(super) struct DraftAsk {
    seq: u32,
    /// The tokens the session's sequence holds, in position order.
    history: Vec<u32>,
    last: u32,
    n_max: usize,
    p_min: f32,
}

/// Proposals are read from this many of the draft's likeliest tokens.
const DRAFT_TOP_K: usize = 10;

/// Why a draft model cannot propose for a target, in llama.cpp's terms, or None.
pub fn draft_incompatible(target: &Tokenizer, draft: &Tokenizer) -> Option<String> {
    if target.model() != draft.model() {
        return Some(format!(
            "the draft's vocabulary is of another kind ({} against the target's {})",
            draft.model(),
            target.model()
        ));
    }
    if target.add_bos() != draft.add_bos() || (target.add_bos() && target.bos() != draft.bos()) {
        return Some("the draft's beginning-of-sequence token differs from the target's".into());
    }
    if target.add_eos() != draft.add_eos() || (target.add_eos() && target.eos() != draft.eos()) {
        return Some("the draft's end-of-sequence token differs from the target's".into());
    }
    let (nt, nd) = (target.n_vocab(), draft.n_vocab());
    if nt.abs_diff(nd) > 128 {
        return Some(format!(
            "the vocabularies differ in size by {} tokens ({nt} and {nd}; at most 128)",
            nt.abs_diff(nd)
        ));
    }
    // llama.cpp compares the texts from id 5 on (the first ids are often control tokens
    // that differ harmlessly).
    for id in 5..nt.min(nd) as u32 {
        if target.token_text(id) != draft.token_text(id) {
            return Some(format!(
                "token {id} is {:?} in the target and {:?} in the draft",
                target.token_text(id).unwrap_or(""),
                draft.token_text(id).unwrap_or("")
            ));
        }
    }
    None
}

impl Drafter {
    fn new(source: Source, params: SpecParams) -> Self {
        Drafter {
            source,
            params,
            stats: DraftStats::default(),
            synth: None,
        }
    }

    /// Proposals for each ask, in order.
    async fn propose(&mut self, asks: &[DraftAsk]) -> Result<Vec<Vec<u32>>, EngineError> {
        match &mut self.source {
            Source::Model(m) => {
                // A session holding a token the draft does not know (a client's raw ids,
                // an image's placeholders) gets no proposals; the others still do.
                let n = m.n_common;
                let known: Vec<usize> = (0..asks.len())
                    .filter(|&i| asks[i].last < n && asks[i].history.iter().all(|&t| t < n))
                    .collect();
                if known.is_empty() {
                    return Ok(vec![Vec::new(); asks.len()]);
                }
                let sub: Vec<DraftAsk> = known.iter().map(|&i| asks[i].clone()).collect();
                match m.propose(&sub).await {
                    Ok(d) => {
                        let mut out = vec![Vec::new(); asks.len()];
                        for (i, d) in known.into_iter().zip(d) {
                            out[i] = d;
                        }
                        Ok(out)
                    }
                    // The draft's cache out of room (a unified cache shared with
                    // sequences it still holds), or any other failure of the draft
                    // alone: no proposals this step, and its cache starts afresh.
                    Err(e) => {
                        log::debug!("draft model: {e}; proposing nothing this step");
                        m.reset();
                        Ok(vec![Vec::new(); asks.len()])
                    }
                }
            }
            Source::Ngram(p) => Ok(asks
                .iter()
                .map(|a| {
                    let mut d = ngram_draft(*p, &a.history, a.last);
                    // What followed the match may be an image's placeholders, which no
                    // token batch takes: the proposal ends before them.
                    let text = d.iter().position(|&t| super::media::is_image_token(t));
                    d.truncate(a.n_max.min(text.unwrap_or(d.len())));
                    d
                })
                .collect()),
        }
    }
}

impl ModelDraft {
    fn new(model: Arc<Model>, target: &Context) -> Result<Self, EngineError> {
        let n_common = model.hp.n_vocab.min(target.model.hp.n_vocab);
        // The whole window kept: proposals are cut back, and a rolling buffer could
        // have dropped what the cut-back positions attend to.
        let params = crate::context::ContextParams {
            swa_full: true,
            ..target.params
        };
        let ctx = Context::new(model, params)?;
        let n = target.params.n_seq_max as usize;
        Ok(ModelDraft {
            ctx,
            held: vec![Vec::new(); n],
            n_common,
        })
    }

    /// Forgets what every sequence holds: after a failed decode, the cache and `held`
    /// may disagree.
    fn reset(&mut self) {
        self.ctx.clear();
        for h in &mut self.held {
            h.clear();
        }
    }

    /// Proposals for each ask, in order: the draft's cache is brought up to each
    /// history, then its likeliest tokens are taken one position at a time, for every
    /// session at once.
    async fn propose(&mut self, asks: &[DraftAsk]) -> Result<Vec<Vec<u32>>, EngineError> {
        let n_vocab = self.ctx.out_width() as usize;
        let n_batch = self.ctx.params.n_batch as usize;
        let mut out: Vec<Vec<u32>> = vec![Vec::new(); asks.len()];
        // What each ask still has to decode before its first proposal.
        let mut feed: Vec<Vec<u32>> = Vec::with_capacity(asks.len());
        for a in asks {
            let held = &mut self.held[a.seq as usize];
            let common = held
                .iter()
                .zip(&a.history)
                .take_while(|(x, y)| x == y)
                .count();
            if common < held.len() {
                self.ctx.seq_rm(Some(a.seq), common as i32, -1)?;
                held.truncate(common);
            }
            let mut f = a.history[common..].to_vec();
            f.push(a.last);
            feed.push(f);
        }
        // The catch-up, in batches of at most n_batch tokens; each ask's last token
        // gives the logits of its first proposal.
        let mut rows: Vec<Option<Vec<f32>>> = vec![None; asks.len()];
        let mut batch = Batch::default();
        let mut owners = Vec::new();
        for (i, a) in asks.iter().enumerate() {
            for (j, &t) in feed[i].iter().enumerate() {
                let held = &mut self.held[a.seq as usize];
                let last = j + 1 == feed[i].len();
                batch.tokens.push(t);
                batch.pos.push(held.len() as i32);
                batch.seq.push(1u64 << a.seq);
                batch.logits.push(last);
                held.push(t);
                if last {
                    owners.push(i);
                }
                if batch.tokens.len() == n_batch {
                    self.decode_into(&mut batch, &mut owners, &mut rows, n_vocab)
                        .await?;
                }
            }
        }
        self.decode_into(&mut batch, &mut owners, &mut rows, n_vocab)
            .await?;
        // One position at a time for every ask still proposing.
        let mut active: Vec<usize> = (0..asks.len()).filter(|&i| asks[i].n_max > 0).collect();
        while !active.is_empty() {
            let mut next = Vec::new();
            for &i in &active {
                let Some(row) = rows[i].take() else { continue };
                let (t, p) = top_token(&row[..(self.n_common as usize).min(row.len())]);
                if p < asks[i].p_min {
                    continue;
                }
                out[i].push(t);
                if out[i].len() >= asks[i].n_max {
                    continue;
                }
                let held = &mut self.held[asks[i].seq as usize];
                batch.tokens.push(t);
                batch.pos.push(held.len() as i32);
                batch.seq.push(1u64 << asks[i].seq);
                batch.logits.push(true);
                held.push(t);
                owners.push(i);
                next.push(i);
            }
            self.decode_into(&mut batch, &mut owners, &mut rows, n_vocab)
                .await?;
            active = next;
        }
        Ok(out)
    }

    /// Decodes `batch` (if not empty) and hands each logits row to its owner.
    async fn decode_into(
        &mut self,
        batch: &mut Batch,
        owners: &mut Vec<usize>,
        rows: &mut [Option<Vec<f32>>],
        n_vocab: usize,
    ) -> Result<(), EngineError> {
        if batch.tokens.is_empty() {
            return Ok(());
        }
        let logits = self.ctx.decode_async(batch).await?;
        for (&i, row) in owners.iter().zip(logits.chunks(n_vocab.max(1))) {
            rows[i] = Some(row.to_vec());
        }
        *batch = Batch::default();
        owners.clear();
        Ok(())
    }
}

/// The likeliest token and its probability among the ten likeliest.
fn top_token(logits: &[f32]) -> (u32, f32) {
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(DRAFT_TOP_K + 1);
    for (i, &l) in logits.iter().enumerate() {
        if top.len() < DRAFT_TOP_K || l > top[top.len() - 1].1 {
            let at = top.partition_point(|&(_, x)| x >= l);
            top.insert(at, (i as u32, l));
            top.truncate(DRAFT_TOP_K);
        }
    }
    let Some(&(best, max)) = top.first() else {
        return (0, 0.0);
    };
    let sum: f32 = top.iter().map(|&(_, l)| (l - max).exp()).sum();
    (best, 1.0 / sum)
}

impl Engine {
    /// Attaches a draft model (already loaded, ideally on the target's GPU) for
    /// speculative decoding: every generating session gets proposals from it.
    pub fn attach_draft(
        &mut self,
        model: Arc<Model>,
        tokenizer: &Tokenizer,
        params: SpecParams,
    ) -> Result<(), EngineError> {
        if let Some(why) = draft_incompatible(&self.tokenizer, tokenizer) {
            return Err(EngineError::Options(format!(
                "the draft model cannot propose tokens for this model: {why}"
            )));
        }
        if self.model.hp.recurrent.iter().any(|&r| r) || model.hp.recurrent.iter().any(|&r| r) {
            return Err(EngineError::Options(
                "speculative decoding needs to take rejected tokens back out of the cache, which a recurrent model's state cannot do".into(),
            ));
        }
        if params.n_max == 0 {
            return Err(EngineError::Options(
                "--spec-draft-n-max is 0: a draft would propose nothing".into(),
            ));
        }
        let draft = ModelDraft::new(model, &self.ctx)?;
        self.set_drafter(Drafter::new(Source::Model(Box::new(draft)), params));
        Ok(())
    }

    /// Speculates by n-gram lookup in each session's own tokens (llama.cpp's
    /// `ngram-simple`): no draft model; `params.n_max` does not apply (`ngram.size_m`
    /// bounds a proposal).
    pub fn attach_ngram_lookup(
        &mut self,
        ngram: NgramParams,
        params: SpecParams,
    ) -> Result<(), EngineError> {
        if self.model.hp.recurrent.iter().any(|&r| r) {
            return Err(EngineError::Options(
                "speculative decoding needs to take rejected tokens back out of the cache, which a recurrent model's state cannot do".into(),
            ));
        }
        if ngram.size_n == 0 || ngram.size_m == 0 {
            return Err(EngineError::Options(
                "n-gram lookup needs n-grams and proposals of at least one token".into(),
            ));
        }
        let params = SpecParams {
            n_max: ngram.size_m as u32,
            ..params
        };
        self.set_drafter(Drafter::new(Source::Ngram(ngram), params));
        Ok(())
    }

    fn set_drafter(&mut self, d: Drafter) {
        self.drafter = Some(d);
        // Proposals are checked on the host from every row: no step goes ahead.
        self.decode_ahead = false;
    }

    /// Loads a draft model from a file onto this engine's GPU and attaches it
    /// ([`Engine::attach_draft`]).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load_draft(
        &mut self,
        path: &std::path::Path,
        params: SpecParams,
    ) -> Result<(), EngineError> {
        let (f, tokenizer) = Self::open_file(path)?;
        let model = Model::load(self.model.gpu.clone(), &f, &mut |_, _| {})?;
        log::info!(
            "draft model {} ({} layers, {:.1} MiB)",
            model.name,
            model.hp.n_layer,
            model.weights.gpu_bytes as f64 / (1 << 20) as f64
        );
        self.attach_draft(Arc::new(model), &tokenizer, params)
    }

    /// llama.cpp's synthetic acceptance (`--spec-synth-rates`), a benchmark of the
    /// verify loop: proposal i is kept with probability `rates[i]` (drawn from a stream
    /// seeded with the session's sampler seed) instead of when the target samples it,
    /// so the output is no longer the target's. A kept end-of-generation proposal is
    /// still refused, and kept proposals do not advance a grammar.
    pub fn set_synthetic_acceptance(&mut self, rates: Vec<f64>) -> Result<(), EngineError> {
        let Some(d) = self.drafter.as_mut() else {
            return Err(EngineError::Options(
                "synthetic acceptance needs a draft model to propose tokens".into(),
            ));
        };
        if rates.iter().any(|r| !(0.0..=1.0).contains(r)) {
            return Err(EngineError::Options(
                "synthetic acceptance rates are probabilities, from 0 to 1".into(),
            ));
        }
        d.synth = Some(rates);
        Ok(())
    }

    /// The proposals and acceptances since the engine was made (None: no draft).
    pub fn draft_stats(&self) -> Option<DraftStats> {
        self.drafter.as_ref().map(|d| d.stats)
    }

    /// Proposals for every session that has just sampled a token: set as the
    /// session's `draft`, bounded by its context, its `n_predict` and the batch.
    pub(super) async fn draft_all(&mut self) -> Result<(), EngineError> {
        let n_ctx_seq = self.n_ctx_seq();
        let Some(drafter) = self.drafter.as_mut() else {
            return Ok(());
        };
        let generating = self
            .sessions
            .iter()
            .flatten()
            .filter(|s| s.phase == Phase::Generate && s.next.is_some())
            .count();
        let mut room = (self.ctx.params.n_batch as usize).saturating_sub(generating);
        // Waiting prompts keep at least half of the room.
        if self
            .sessions
            .iter()
            .flatten()
            .any(|s| s.phase == Phase::Prompt)
        {
            room /= 2;
        }
        let mut asks = Vec::new();
        for s in self.sessions.iter().flatten() {
            if s.phase != Phase::Generate || s.fed_logits.is_some() || s.cancel {
                continue;
            }
            let Some(last) = s.next else { continue };
            // What the sequence holds; Self-Extend's grouped positions would not fit the
            // draft's cache (it holds tokens at their indices), so no proposals there.
            let Some(history) = held_tokens(s) else {
                continue;
            };
            let params = s.params.speculative.unwrap_or(drafter.params);
            // Room for the sampled token and the proposals without a context shift.
            let fits = (n_ctx_seq as i64 - s.shift.n_past as i64 - 2).max(0) as usize;
            let mut n_max = (params.n_max as usize).min(fits).min(room);
            if s.params.n_predict >= 0 {
                let left = (s.params.n_predict as usize).saturating_sub(s.generated.len());
                n_max = n_max.min(left.saturating_sub(1));
            }
            if n_max == 0 || n_max < params.n_min as usize {
                continue;
            }
            room -= n_max;
            log::trace!(
                "session {}: n_past {}, history {}, drafting up to {n_max}",
                s.id,
                s.shift.n_past,
                s.history.len()
            );
            asks.push(DraftAsk {
                seq: s.id,
                history,
                last,
                n_max,
                p_min: params.p_min,
            });
        }
        if asks.is_empty() {
            return Ok(());
        }
        let ids: Vec<u32> = asks.iter().map(|a| a.seq).collect();
        let start = web_time::Instant::now();
        let drafts = drafter.propose(&asks).await?;
        drop(asks);
        // The draft's time is generation time of the sessions it drafted for.
        let dt = start.elapsed();
        for (id, d) in ids.into_iter().zip(drafts) {
            let s = self.sessions[id as usize].as_mut().unwrap();
            s.timings.eval += dt;
            let params = s.params.speculative.unwrap_or(drafter.params);
            if d.len() < params.n_min as usize {
                continue;
            }
            drafter.stats.drafted += d.len() as u64;
            s.timings.draft_n += d.len();
            s.draft = d;
        }
        Ok(())
    }
}

/// The tokens a session's sequence holds, in position order: its history with what
/// each context shift dropped taken out (the shift log says where, and how many tokens
/// the sequence held then). None under Self-Extend, or if the log and the history
/// disagree.
fn held_tokens(s: &super::Session) -> Option<Vec<u32>> {
    if s.params.shift.ga_n > 1 {
        return None;
    }
    let mut held: Vec<u32> = Vec::with_capacity(s.shift.n_past.max(0) as usize);
    let mut next = 0;
    for op in s.shift.ops.iter().filter(|o| o.op == "seq_rm") {
        let (past, p0, p1) = (op.n_past as usize, op.p0 as usize, op.p1 as usize);
        let more = past.checked_sub(held.len())?;
        held.extend_from_slice(s.history.get(next..next + more)?);
        next += more;
        if p0 > p1 || p1 > held.len() {
            return None;
        }
        held.drain(p0..p1);
    }
    held.extend_from_slice(s.history.get(next..)?);
    (held.len() == s.shift.n_past as usize).then_some(held)
}
