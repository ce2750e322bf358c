//! An inference context: the model's memory (`crate::memory`: the KV cache), the step
//! input buffers, and the graphs built for the shapes seen so far. `decode` checks a
//! batch, lets the memory place its ubatches and runs one graph per ubatch.

mod sampling;
pub mod state;

pub use crate::batch::Batch;
pub use sampling::{Drawn, GpuDraw};

use crate::gpu::GpuError;
use crate::graph::{Graph, StepProfile};
use crate::kv::{seqs_below, CacheKind, KvCells, KvConfig, KvError, SeqId, MAX_SEQ};
use crate::memory::{Memory, MemoryError, MemoryParams};
use crate::model::{GraphInput, GraphIo, Model, UbatchView};
use crate::ops::uniforms::SampleRow;
use crate::ops::View;
use std::collections::VecDeque;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("invalid batch: {0}")]
    BadBatch(String),
    #[error("{0}")]
    TooLarge(String),
    /// A cache type or flash attention setting this model or adapter cannot serve.
    #[error("{0}")]
    Cache(String),
    #[error("invalid sequence id {seq}: this context has {n_seq_max} sequence(s), ids 0..{n_seq_max} (raise it with -np)")]
    BadSeq { seq: u32, n_seq_max: u32 },
    #[error("invalid batch: sequence {seq} ends at position {last} in the cache, so the batch must continue it at {} (it starts at {first}); positions of a sequence stay consecutive", last + 1)]
    PositionGap { seq: u32, last: i32, first: i32 },
    #[error("invalid batch: the positions of sequence {seq} go backwards ({prev} then {next})")]
    PositionsBackwards { seq: u32, prev: i32, next: i32 },
    #[error(transparent)]
    State(#[from] state::StateError),
    #[error("Self-Extend (--grp-attn-n) divides positions, so a sliding window would span more tokens than the rolling buffer of this model's sliding-window layers keeps; use --swa-full")]
    SelfExtendNeedsSwaFull,
    #[error("the context is full ({n_ctx} tokens) and {reason}; use a larger context (-c)")]
    ContextFull { n_ctx: u32, reason: FullReason },
}

/// Why a full context could not make room, so that every message says the true cause.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FullReason {
    /// Context shift is off (--no-context-shift).
    ShiftOff,
    /// Context shift is on, but the tokens after --keep are too few to discard any.
    KeepTooLarge,
    /// Self-Extend regroups positions but frees no cells.
    SelfExtend,
}

impl std::fmt::Display for FullReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FullReason::ShiftOff => "context shift is off",
            FullReason::KeepTooLarge => "context shift cannot free space (is --keep too large?)",
            FullReason::SelfExtend => "Self-Extend (--grp-attn-n) frees no cells",
        })
    }
}

#[derive(Clone, Copy, Debug)]
pub struct ContextParams {
    /// Cache cells (-c).
    pub n_ctx: u32,
    /// Most tokens one `decode` call accepts (-b).
    pub n_batch: u32,
    /// Most tokens one graph computes (-ub).
    pub n_ubatch: u32,
    /// Distinct sequences the context serves (-np); ids are 0..n_seq_max.
    pub n_seq_max: u32,
    /// Compact the cache when this share of the cells below the used bound are holes
    /// (--defrag-thold; <= 0: never).
    pub defrag_thold: f32,
    /// Sliding-window layers keep a full-size cache (--swa-full) instead of a rolling
    /// buffer of their window.
    pub swa_full: bool,
    /// Positions below this stay in the rolling buffer (a context shift's kept prefix,
    /// --keep plus BOS), since a shift brings them back inside the window.
    pub swa_keep: u32,
    /// What the cache holds and whether attention is flash attention (-ctk, -ctv, -fa).
    pub kv: KvConfig,
}

impl From<MemoryError> for ContextError {
    /// Each of the memory's errors as the context's own of the same name, so callers
    /// match one error type whichever layer refused.
    fn from(e: MemoryError) -> Self {
        match e {
            MemoryError::Kv(e) => ContextError::Kv(e),
            MemoryError::Gpu(e) => ContextError::Gpu(e),
            MemoryError::BadBatch(m) => ContextError::BadBatch(m),
            MemoryError::TooLarge(m) => ContextError::TooLarge(m),
            MemoryError::Cache(m) => ContextError::Cache(m),
            MemoryError::State(e) => ContextError::State(e),
            MemoryError::SelfExtendNeedsSwaFull => ContextError::SelfExtendNeedsSwaFull,
        }
    }
}

impl ContextParams {
    /// What the memory is made for.
    pub fn memory_params(&self) -> MemoryParams {
        MemoryParams {
            n_ctx: self.n_ctx,
            n_ubatch: self.n_ubatch.min(self.n_batch),
            n_seq_max: self.n_seq_max,
            defrag_thold: self.defrag_thold,
            swa_full: self.swa_full,
            swa_keep: self.swa_keep,
            kv: self.kv,
        }
    }

    /// One sequence, no defragmentation: what a single prompt needs.
    pub fn new(n_ctx: u32, n_batch: u32, n_ubatch: u32) -> Self {
        ContextParams {
            n_ctx,
            n_batch,
            n_ubatch,
            n_seq_max: 1,
            defrag_thold: -1.0,
            swa_full: false,
            swa_keep: 0,
            kv: KvConfig::default(),
        }
    }
}

/// The model's declared graph inputs, one buffer each, and the logits it writes.
struct StepBuffers {
    inputs: Vec<(GraphInput, wgpu::Buffer)>,
    logits: wgpu::Buffer,
}

/// What a graph is built for: (tokens, cells read in the full store, cells read in the
/// window store, sequence sets of a recurrent memory's ubatch, logit rows).
type GraphKey = (u32, u32, u32, u32, u32);

/// Graphs kept for reuse (decode steps replay one graph until n_kv crosses a pad boundary).
const GRAPH_CACHE: usize = 3;

pub struct Context {
    pub model: Arc<Model>,
    pub params: ContextParams,
    /// Where past tokens live: the cells and K/V rows of every store.
    memory: Box<dyn Memory>,
    step: StepBuffers,
    /// Logit rows one graph can produce (bounded by the storage binding limit).
    n_out_max: u32,
    graphs: VecDeque<(GraphKey, Graph)>,
    /// Counters for the timing summary.
    pub n_graph_builds: u64,
    /// What the last graph run cost on the host (benchmarks report it).
    pub last_step: StepStats,
    /// Set by [`Context::profile_next_ubatch`]; the profile lands in `last_profile`.
    profile_next: bool,
    pub last_profile: Option<StepProfile>,
    /// Sampling on the GPU: made at the first draw.
    sampling: Option<sampling::SampleState>,
    /// Draws of the last step that drew (their tokens stay in the result buffer until
    /// the next drawing step), for steps fed from them.
    last_draws: usize,
}

/// What a decode returns: the logit rows asked for and not drawn on the GPU, and each
/// draw's token, in the order the draws were given.
#[derive(Clone, Debug, Default)]
pub struct Decoded {
    pub logits: Vec<f32>,
    pub picks: Vec<Drawn>,
}

/// The last ubatch's graph: its dispatches and the host time to record them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepStats {
    pub n_tok: u32,
    pub dispatches: usize,
    pub record_ns: u64,
    /// Bytes read back from the GPU (logit rows, drawn tokens).
    pub read_bytes: u64,
    /// Host nanoseconds in submits, and waiting for the GPU and the readback.
    pub submit_ns: u64,
    pub wait_ns: u64,
}

impl Context {
    pub fn new(model: Arc<Model>, params: ContextParams) -> Result<Context, ContextError> {
        let gpu = model.gpu.clone();
        let hp = &model.hp;
        if params.n_ctx == 0 || params.n_batch == 0 || params.n_ubatch == 0 {
            return Err(ContextError::BadBatch(
                "context, batch and ubatch sizes must be positive".into(),
            ));
        }
        if params.n_seq_max == 0 || params.n_seq_max > MAX_SEQ {
            return Err(ContextError::BadBatch(format!(
                "-np {}: the number of sequences must be in 1..={MAX_SEQ}",
                params.n_seq_max
            )));
        }
        if !hp.fits_context(params.n_ctx, params.n_seq_max) {
            return Err(ContextError::BadBatch(format!(
                "this model's RoPE factors were chosen for another context size than {} cells \
                 for {} sequence(s) (Phi-3 uses its long-context factors beyond {} cells per \
                 sequence); call Hparams::fit_context before sharing the model",
                params.n_ctx,
                params.n_seq_max,
                hp.long_rope.map_or(0, |lr| lr.n_ctx_orig)
            )));
        }
        let ub = params.n_ubatch.min(params.n_batch) as u64;
        let n_ctx = params.n_ctx as u64;
        let memory =
            crate::memory::create(&Arc::new(model.memory_shape()), &params.memory_params())?;
        let n_out_max = (gpu.max_binding / (hp.n_vocab as u64 * 4)).clamp(1, ub) as u32;
        let mut inputs = Vec::new();
        for input in model.inputs() {
            let buf = gpu.storage(&input.label(), input.bytes(ub, n_ctx))?;
            inputs.push((input, buf));
        }
        let step = StepBuffers {
            inputs,
            logits: gpu.storage("logits", n_out_max as u64 * hp.n_vocab as u64 * 4)?,
        };
        Ok(Context {
            model,
            params,
            memory,
            step,
            n_out_max,
            graphs: VecDeque::new(),
            n_graph_builds: 0,
            last_step: StepStats::default(),
            profile_next: false,
            last_profile: None,
            sampling: None,
            last_draws: 0,
        })
    }

    /// After the next ubatch runs, time each of its dispatches again alone
    /// ([`Graph::profile`]) and keep the result in `last_profile` (benchmarks' `--profile`).
    pub fn profile_next_ubatch(&mut self) {
        self.profile_next = true;
        self.last_profile = None;
    }

    pub fn n_ctx(&self) -> u32 {
        self.params.n_ctx
    }

    /// The model's memory: sequence positions, the stores' maps, the cache types.
    pub fn memory(&self) -> &dyn Memory {
        &*self.memory
    }

    /// The cells of the memory's main store.
    pub fn cells(&self) -> &KvCells {
        self.memory.cells()
    }

    /// What the cache holds and how attention reads it (`-ctk`, `-ctv`, `-fa` decided).
    pub fn kv_choice(&self) -> crate::kv::KvChoice {
        self.memory.choice()
    }

    /// Whether sequence `seq` can be decoded on from position `p` (after cutting it back
    /// there): false where the rolling buffer has dropped cells that window needs.
    pub fn can_resume(&self, seq: SeqId, p: i32) -> bool {
        self.memory.can_resume(seq, p)
    }

    /// Empties the cache.
    pub fn clear(&mut self) {
        self.memory.clear();
    }

    fn check_seq(&self, seq: SeqId) -> Result<(), ContextError> {
        if seq < self.params.n_seq_max {
            Ok(())
        } else {
            Err(ContextError::BadSeq {
                seq,
                n_seq_max: self.params.n_seq_max,
            })
        }
    }

    /// Removes `seq` (None: all sequences) from positions [p0, p1) (negative: open).
    pub fn seq_rm(&mut self, seq: Option<SeqId>, p0: i32, p1: i32) -> Result<(), ContextError> {
        if let Some(s) = seq {
            self.check_seq(s)?;
        }
        self.memory.seq_rm(seq, p0, p1).map_err(ContextError::from)
    }
    /// Makes `dst` share the cells of `src` in [p0, p1) (no K/V copy).
    pub fn seq_cp(&mut self, src: SeqId, dst: SeqId, p0: i32, p1: i32) -> Result<(), ContextError> {
        self.check_seq(src)?;
        self.check_seq(dst)?;
        self.memory
            .seq_cp(src, dst, p0, p1)
            .map_err(ContextError::from)
    }
    /// Drops every sequence but `seq`.
    pub fn seq_keep(&mut self, seq: SeqId) -> Result<(), ContextError> {
        self.check_seq(seq)?;
        self.memory.seq_keep(seq).map_err(ContextError::from)
    }
    /// Adds `delta` to the positions of `seq` in [p0, p1); the K-shift follows.
    pub fn seq_add(
        &mut self,
        seq: SeqId,
        p0: i32,
        p1: i32,
        delta: i32,
    ) -> Result<(), ContextError> {
        self.check_seq(seq)?;
        self.memory
            .seq_add(seq, p0, p1, delta)
            .map_err(ContextError::from)
    }
    /// Divides the positions of `seq` in [p0, p1) by `d`; the K-shift follows.
    pub fn seq_div(&mut self, seq: SeqId, p0: i32, p1: i32, d: i32) -> Result<(), ContextError> {
        self.check_seq(seq)?;
        self.memory
            .seq_div(seq, p0, p1, d)
            .map_err(ContextError::from)
    }

    /// Checks a batch as llama.cpp does before splitting it: sequence ids in range, each
    /// sequence continuing at its last cached position + 1, positions without gaps, and
    /// (stricter than llama.cpp) never decreasing within a sequence.
    fn check_batch(&self, b: &Batch) -> Result<(), ContextError> {
        let n_seq = self.params.n_seq_max;
        let mut first = vec![None::<(i32, i32, usize)>; n_seq as usize]; // (min, max, count)
        let mut last = vec![None::<i32>; n_seq as usize];
        for (&set, &p) in b.seq.iter().zip(&b.pos) {
            if set & !seqs_below(n_seq) != 0 {
                let seq = 63 - set.leading_zeros();
                return Err(ContextError::BadSeq {
                    seq,
                    n_seq_max: n_seq,
                });
            }
            for s in 0..n_seq {
                if set & (1u64 << s) == 0 {
                    continue;
                }
                let su = s as usize;
                if let Some(prev) = last[su] {
                    if p < prev {
                        return Err(ContextError::PositionsBackwards {
                            seq: s,
                            prev,
                            next: p,
                        });
                    }
                }
                last[su] = Some(p);
                first[su] = Some(match first[su] {
                    None => (p, p, 1),
                    Some((lo, hi, n)) => (lo.min(p), hi.max(p), n + 1),
                });
            }
        }
        for (s, f) in first.iter().enumerate() {
            let Some((lo, hi, n)) = *f else { continue };
            let cached = self.memory.seq_pos_max(s as SeqId);
            if cached >= 0 && lo != cached + 1 {
                return Err(ContextError::PositionGap {
                    seq: s as u32,
                    last: cached,
                    first: lo,
                });
            }
            if (hi - lo + 1) as usize > n {
                return Err(ContextError::BadBatch(format!(
                    "the positions of sequence {s} in the batch are not continuous ({lo}..={hi} with {n} tokens)"
                )));
            }
        }
        Ok(())
    }

    /// Re-applies RoPE to every cached key whose cell position changed (seq_add /
    /// seq_div), in place, by the cell's accumulated delta; then the deltas are zero.
    pub fn apply_k_shift(&mut self) -> Result<(), ContextError> {
        self.memory.update(false).map_err(ContextError::from)
    }

    /// Moves every used cell to the front of the cache (K/V rows with it), so attention
    /// reads no holes. The outputs are unchanged. Returns the number of cells moved.
    pub fn defrag(&mut self) -> Result<usize, ContextError> {
        self.memory.defrag().map_err(ContextError::from)
    }

    /// Decodes a batch; returns the logits of the tokens that asked for them, in batch
    /// order, n_vocab floats each (blocking; native targets).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn decode(&mut self, batch: &Batch) -> Result<Vec<f32>, ContextError> {
        pollster::block_on(self.decode_async(batch))
    }

    /// [`Context::decode`], awaiting the logits readback instead of blocking on it.
    pub async fn decode_async(&mut self, batch: &Batch) -> Result<Vec<f32>, ContextError> {
        Ok(self.decode_drawing_async(batch, &[]).await?.logits)
    }

    /// [`Context::decode_drawing_async`], blocking (native targets).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn decode_drawing(
        &mut self,
        batch: &Batch,
        draws: &[GpuDraw],
    ) -> Result<Decoded, ContextError> {
        pollster::block_on(self.decode_drawing_async(batch, draws))
    }

    /// The history stamp slot `slot`'s GPU copy matches ([`Context::sync_sampler`]).
    pub fn sampler_stamp(&self, slot: SeqId) -> Option<u64> {
        self.sampling.as_ref().and_then(|s| s.stamp(slot))
    }

    /// Records that slot `slot`'s GPU copy matches the history stamped `stamp` (the
    /// engine took the token a draw recorded there).
    pub fn set_sampler_stamp(&mut self, slot: SeqId, stamp: u64) {
        if let Some(s) = self.sampling.as_mut() {
            s.set_stamp(slot, Some(stamp));
        }
    }

    /// Forgets slot `slot`'s GPU copy of its history (its next draw copies it again).
    pub fn forget_sampler_stamp(&mut self, slot: SeqId) {
        if let Some(s) = self.sampling.as_mut() {
            s.set_stamp(slot, None);
        }
    }

    /// Copies a session's penalty history and logit bias to the GPU for draws on slot
    /// `slot` with settings `row`; `Err` says why it cannot draw there.
    pub fn sync_sampler(
        &mut self,
        slot: SeqId,
        stamp: u64,
        row: &crate::ops::uniforms::SampleRow,
        history: &[u32],
        bias: Option<&[f32]>,
    ) -> Result<(), String> {
        self.check_seq(slot).map_err(|e| e.to_string())?;
        let gpu = self.model.gpu.clone();
        if self.sampling.is_none() {
            let st = sampling::SampleState::new(
                &gpu,
                self.model.hp.n_vocab,
                self.params.n_seq_max,
                self.n_out_max,
            )
            .map_err(|e| e.to_string())?;
            self.sampling = Some(st);
        }
        self.sampling
            .as_mut()
            .unwrap()
            .sync(&gpu, slot, stamp, row, history, bias)
    }

    /// Decodes a batch as [`Context::decode_async`] does, except that the rows of
    /// `draws` are sampled on the GPU (their slots synced first) and only their tokens
    /// come back.
    pub async fn decode_drawing_async(
        &mut self,
        batch: &Batch,
        draws: &[GpuDraw],
    ) -> Result<Decoded, ContextError> {
        self.check_decode(batch)?;
        self.memory.update(true)?;
        // A failed batch leaves the cache as it was (as llama.cpp restores its cells):
        // ubatches already stored and the cells of a failing one are dropped.
        self.check_draws(batch, draws)?;
        let saved = self.memory.checkpoint();
        let out = self.decode_ubatches(batch, draws).await;
        if out.is_err() {
            self.memory.rollback(saved);
            if let Some(s) = self.sampling.as_mut() {
                s.forget_all();
            }
        }
        out
    }

    /// The checks every decode makes before touching the cache: sizes, token ids,
    /// sequences, positions ([`Context::check_batch`]).
    fn check_decode(&self, batch: &Batch) -> Result<(), ContextError> {
        let n = batch.tokens.len();
        if n == 0 {
            return Err(ContextError::BadBatch("the batch is empty".into()));
        }
        if batch.pos.len() != n || batch.seq.len() != n || batch.logits.len() != n {
            return Err(ContextError::BadBatch(
                "tokens, positions, sequences and logits flags differ in length".into(),
            ));
        }
        if n > self.params.n_batch as usize {
            return Err(ContextError::BadBatch(format!(
                "{n} tokens exceed the batch size {} (-b)",
                self.params.n_batch
            )));
        }
        let n_vocab = self.model.hp.n_vocab;
        if let Some(&bad) = batch.tokens.iter().find(|&&t| t >= n_vocab) {
            return Err(ContextError::BadBatch(format!(
                "token id {bad} is out of the vocabulary (0..{n_vocab})"
            )));
        }
        if batch.seq.contains(&0) {
            return Err(ContextError::BadBatch(
                "a token belongs to no sequence".into(),
            ));
        }
        self.check_batch(batch)
    }

    /// Each draw names a token that wants logits, once, on a slot synced for sampling.
    fn check_draws(&self, batch: &Batch, draws: &[GpuDraw]) -> Result<(), ContextError> {
        if draws.is_empty() {
            return Ok(());
        }
        let Some(st) = self.sampling.as_ref() else {
            return Err(ContextError::BadBatch(
                "a draw before any slot was synced for sampling (Context::sync_sampler)".into(),
            ));
        };
        let mut seen = std::collections::HashSet::new();
        for d in draws {
            if !batch.logits.get(d.index).copied().unwrap_or(false) {
                return Err(ContextError::BadBatch(format!(
                    "a draw names token {} of the batch, which does not ask for logits",
                    d.index
                )));
            }
            if !seen.insert(d.index) || (d.row.slot as usize) >= self.params.n_seq_max as usize {
                return Err(ContextError::BadBatch(format!(
                    "draw for token {}: repeated, or slot {} out of range",
                    d.index, d.row.slot
                )));
            }
        }
        if draws.len() > st.n_rows_max() as usize {
            return Err(ContextError::BadBatch(format!(
                "{} draws in one batch; at most {} (one per sequence)",
                draws.len(),
                st.n_rows_max()
            )));
        }
        Ok(())
    }

    /// Splits a checked batch into ubatches as the memory asks and decodes them in order;
    /// the logit rows (and draws) come back in batch order whatever order the split took.
    async fn decode_ubatches(
        &mut self,
        batch: &Batch,
        draws: &[GpuDraw],
    ) -> Result<Decoded, ContextError> {
        let ub = self.params.n_ubatch.min(self.params.n_batch) as usize;
        let n_vocab = self.model.hp.n_vocab as usize;
        let draw_of = draw_index(draws);
        let mut rows: Vec<(usize, Vec<f32>)> = Vec::new();
        let mut picks = vec![Drawn::default(); draws.len()];
        let mut read_bytes = 0;
        for idx in self.memory.split(batch, ub, self.n_out_max as usize)? {
            let u = sub_batch(batch, &idx);
            let (read, drawn, which) = output_rows(batch, &idx, draws, &draw_of);
            let rs: Vec<u32> = read.iter().map(|x| x.1).collect();
            let (out, got) = self.decode_ubatch(&u, &rs, &drawn).await?;
            if !drawn.is_empty() {
                self.last_draws = drawn.len();
            }
            read_bytes += self.last_step.read_bytes;
            for ((i, _), row) in read.iter().zip(out.chunks(n_vocab.max(1))) {
                rows.push((*i, row.to_vec()));
            }
            for (j, p) in which.into_iter().zip(got) {
                picks[j] = p;
            }
        }
        self.last_step.read_bytes = read_bytes;
        rows.sort_by_key(|(i, _)| *i);
        Ok(Decoded {
            logits: rows.into_iter().flat_map(|(_, r)| r).collect(),
            picks,
        })
    }

    /// Runs one ubatch's graph; returns the logit rows `read` (output row indices, in
    /// order) and the tokens of the rows `drawn`.
    async fn decode_ubatch(
        &mut self,
        u: &Batch,
        read: &[u32],
        drawn: &[crate::ops::uniforms::SampleRow],
    ) -> Result<(Vec<f32>, Vec<Drawn>), ContextError> {
        let run = self.submit_ubatch(u, read, drawn, &[])?;
        let key = run.key;
        let out = self.finish_ubatch(run).await?;
        // `WGLLM_PROFILE=1` on a page, which cannot block where a native graph run
        // profiles itself (`Graph::submit`): every step read back is timed and logged.
        let logged = cfg!(target_arch = "wasm32") && self.model.gpu.tuning.profile;
        if std::mem::take(&mut self.profile_next) || logged {
            let gpu = self.model.gpu.clone();
            if let Some((_, graph)) = self.graphs.iter().find(|(k, _)| *k == key) {
                // The draws' dispatches (recorded for these rows) are timed after it.
                let draws = match (&self.sampling, drawn.is_empty()) {
                    (Some(s), false) => s.dispatches(),
                    _ => &[],
                };
                let cost = crate::graph::OpCost {
                    bytes: drawn.len() as u64 * self.model.hp.n_vocab as u64 * 4,
                    flops: 0,
                };
                let mut p = graph.profile(&gpu, ("sampling", draws, cost)).await?;
                // Replayed draws recorded their tokens again in the penalty history.
                for r in drawn {
                    self.forget_sampler_stamp(r.slot);
                }
                (p.n_tok, p.n_kv) = (key.0, key.1);
                if logged {
                    crate::graph::log_ops(&p);
                }
                self.last_profile = Some(p);
            }
        }
        Ok(out)
    }

    /// The first half of [`Context::decode_ubatch`]: places the ubatch, fills its inputs,
    /// records and submits its graph (and draws), without waiting. `feed` lists (ubatch
    /// position, draw) pairs: that token's id is copied on the GPU from the draw of the
    /// step submitted before.
    fn submit_ubatch(
        &mut self,
        u: &Batch,
        read: &[u32],
        drawn: &[crate::ops::uniforms::SampleRow],
        feed: &[(usize, usize)],
    ) -> Result<UbatchRun, ContextError> {
        let gpu = self.model.gpu.clone();
        let ubv = UbatchView {
            tokens: &u.tokens,
            pos: &u.pos,
            seq: &u.seq,
            logits: &u.logits,
        };
        self.memory.place(&ubv)?;
        // Every declared input fills itself from the ubatch and the memory it went to.
        for (input, buf) in &self.step.inputs {
            let data = crate::memory::fill_input(&*self.memory, input, &ubv)?;
            if !data.is_empty() {
                gpu.write(buf, 0, data.as_bytes());
            }
        }
        let n_out = ubv.logits.iter().filter(|&&l| l).count() as u32;
        let (n_kv, n_kv_window) = (
            self.memory.n_kv(CacheKind::Full),
            self.memory.n_kv(CacheKind::Window),
        );
        let key = (
            u.tokens.len() as u32,
            n_kv,
            n_kv_window,
            self.memory.n_rs(),
            n_out,
        );
        let idx = match self.graphs.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                let io = GraphIo {
                    n_tok: key.0,
                    n_kv: key.1,
                    n_kv_window: key.2,
                    n_rs: key.3,
                    n_out,
                    inputs: (self.step.inputs.iter())
                        .map(|(i, buf)| (*i, View::whole(buf)))
                        .collect(),
                    logits: View::whole(&self.step.logits),
                };
                let graph = self.model.build_graph(&io, &*self.memory)?;
                self.n_graph_builds += 1;
                log::debug!(
                    "graph for {key:?}: {} dispatches, {} scratch buffers ({:.1} MiB)",
                    graph.n_dispatches(),
                    graph.scratch.len(),
                    graph.scratch_bytes as f64 / (1 << 20) as f64
                );
                if self.graphs.len() == GRAPH_CACHE {
                    self.graphs.pop_front();
                }
                self.graphs.push_back((key, graph));
                self.graphs.len() - 1
            }
        };
        let graph = &self.graphs[idx].1;
        // Logit rows to read, as runs of consecutive rows; then the drawn tokens.
        let row_bytes = self.model.hp.n_vocab as u64 * 4;
        let mut regions: Vec<(&wgpu::Buffer, u64, u64)> = Vec::new();
        for &r in read {
            match regions.last_mut() {
                Some(last) if last.1 + last.2 == r as u64 * row_bytes => last.2 += row_bytes,
                _ => regions.push((&self.step.logits, r as u64 * row_bytes, row_bytes)),
            }
        }
        let logit_bytes: u64 = regions.iter().map(|r| r.2).sum();
        // Tokens drawn by the step before, copied into this step's token input before
        // the result buffer is drawn into again.
        let fed_from = if feed.is_empty() {
            None
        } else {
            let tokens_in = (self.step.inputs.iter())
                .find(|(i, _)| *i == GraphInput::Tokens)
                .map(|(_, b)| b.clone());
            match (self.sampling.as_ref(), tokens_in) {
                (Some(st), Some(t)) => Some((st.result().clone(), t)),
                _ => {
                    return Err(ContextError::BadBatch(
                        "a token fed from a draw, but nothing was drawn".into(),
                    ))
                }
            }
        };
        let pre: Vec<crate::graph::CopyRegion> = match &fed_from {
            None => Vec::new(),
            Some((result, tokens_in)) => (feed.iter())
                .map(|&(pos, j)| crate::graph::CopyRegion {
                    src: result,
                    src_offset: j as u64 * 8,
                    dst: tokens_in,
                    dst_offset: pos as u64 * 4,
                    bytes: 4,
                })
                .collect(),
        };
        let extra: &[crate::ops::Dispatch] = if drawn.is_empty() {
            &[]
        } else {
            let st = self
                .sampling
                .as_mut()
                .expect("draws are checked against a synced state");
            let (d, result, probs) = st.record(&gpu, &self.step.logits, drawn)?;
            regions.push((result, 0, drawn.len() as u64 * 8));
            // Then each row's final candidates, where it asks for them.
            for (j, r) in drawn.iter().enumerate() {
                if r.n_probs > 0 {
                    let at = crate::ops::sample::probs_bytes(j as u32);
                    regions.push((probs, at, r.n_probs as u64 * 8));
                }
            }
            d
        };
        let read_bytes: u64 = regions.iter().map(|r| r.2).sum();
        let sub = graph.submit(&gpu, &pre, extra, &regions)?;
        let (submit_ns, _) = graph.submit_wait_ns();
        self.last_step = StepStats {
            n_tok: key.0,
            dispatches: graph.n_dispatches() + extra.len(),
            record_ns: graph.record_ns(),
            read_bytes,
            submit_ns,
            wait_ns: 0,
        };
        Ok(UbatchRun {
            sub,
            key,
            logit_bytes,
            n_probs: drawn.iter().map(|r| r.n_probs as usize).collect(),
        })
    }

    /// The second half: waits for the ubatch's readback and splits it into logit rows
    /// and drawn tokens.
    async fn finish_ubatch(
        &mut self,
        run: UbatchRun,
    ) -> Result<(Vec<f32>, Vec<Drawn>), ContextError> {
        let gpu = self.model.gpu.clone();
        let (data, wait_ns) = run.sub.wait(&gpu).await?;
        self.last_step.wait_ns = wait_ns;
        let data = data.unwrap_or_default();
        let (logits, rest) = data.split_at((run.logit_bytes as usize).min(data.len()));
        let (tokens, mut probs) = rest.split_at((run.n_probs.len() * 8).min(rest.len()));
        let pair = |c: &[u8]| {
            let t = u32::from_le_bytes(c[..4].try_into().unwrap());
            (t, f32::from_le_bytes(c[4..8].try_into().unwrap()))
        };
        let picks = (tokens.chunks_exact(8).zip(&run.n_probs))
            .map(|(c, &n)| {
                let (token, prob) = pair(c);
                let (mine, after) = probs.split_at((n * 8).min(probs.len()));
                probs = after;
                // Places past the chain's last candidate (and underflowed weights) hold
                // probability 0, which the host's list leaves out too.
                let top = (mine.chunks_exact(8).map(pair))
                    .filter(|&(_, p)| p > 0.0)
                    .collect();
                Drawn { token, prob, top }
            })
            .collect();
        Ok((bytemuck::pod_collect_to_vec(logits), picks))
    }

    /// Submits a decode step without waiting for it: the batch must fit one ubatch, and
    /// the tokens `feed` names (batch index, index of a draw of the step submitted just
    /// before) take the token that draw picks, copied on the GPU — their ids in `batch`
    /// are placeholders. So step N+1 is on its way before token N is read: finish each
    /// step with [`Context::finish_step`], in the order submitted. The cells of a step
    /// are placed when it is submitted; cutting one back (a stop found when its token
    /// arrives) is `seq_rm` after it finishes. A failure while steps are in flight
    /// leaves the cache holding them.
    pub fn submit_step(
        &mut self,
        batch: &Batch,
        draws: &[GpuDraw],
        feed: &[(usize, usize)],
    ) -> Result<InFlight, ContextError> {
        self.check_decode(batch)?;
        self.check_draws(batch, draws)?;
        if let Some(&(i, j)) = feed
            .iter()
            .find(|&&(i, j)| i >= batch.tokens.len() || j >= self.last_draws)
        {
            return Err(ContextError::BadBatch(format!(
                "token {i} fed from draw {j}, but the step before drew {}",
                self.last_draws
            )));
        }
        self.memory.update(true)?;
        let saved = self.memory.checkpoint();
        let out = self.submit_one(batch, draws, feed);
        if out.is_err() {
            self.memory.rollback(saved);
            if let Some(s) = self.sampling.as_mut() {
                s.forget_all();
            }
        }
        out
    }

    fn submit_one(
        &mut self,
        batch: &Batch,
        draws: &[GpuDraw],
        feed: &[(usize, usize)],
    ) -> Result<InFlight, ContextError> {
        let ub = self.params.n_ubatch.min(self.params.n_batch) as usize;
        let split = self.memory.split(batch, ub, self.n_out_max as usize)?;
        let [idx] = &split[..] else {
            return Err(ContextError::BadBatch(format!(
                "a step submitted ahead must fit one ubatch; this one takes {}",
                split.len()
            )));
        };
        let u = sub_batch(batch, idx);
        let draw_of = draw_index(draws);
        let (read_rows, drawn, which) = output_rows(batch, idx, draws, &draw_of);
        let pos_of: std::collections::HashMap<usize, usize> =
            idx.iter().enumerate().map(|(p, &i)| (i, p)).collect();
        let feed_u: Vec<(usize, usize)> = feed.iter().map(|&(i, j)| (pos_of[&i], j)).collect();
        let rs: Vec<u32> = read_rows.iter().map(|x| x.1).collect();
        let run = self.submit_ubatch(&u, &rs, &drawn, &feed_u)?;
        if !drawn.is_empty() {
            self.last_draws = drawn.len();
        }
        Ok(InFlight { run, which })
    }

    /// Waits for a step submitted by [`Context::submit_step`] and returns its logit rows
    /// (in the order of its ubatch: the batch's, for a KV cache) and drawn tokens, as
    /// [`Context::decode_drawing_async`] does.
    pub async fn finish_step(&mut self, step: InFlight) -> Result<Decoded, ContextError> {
        let out = self.finish_ubatch(step.run).await;
        let (logits, got) = match out {
            Ok(x) => x,
            Err(e) => {
                if let Some(s) = self.sampling.as_mut() {
                    s.forget_all();
                }
                return Err(e);
            }
        };
        let mut picks = vec![Drawn::default(); step.which.len()];
        for (j, p) in step.which.into_iter().zip(got) {
            picks[j] = p;
        }
        Ok(Decoded { logits, picks })
    }

    /// [`Context::finish_step`], blocking (native targets).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn finish_step_blocking(&mut self, step: InFlight) -> Result<Decoded, ContextError> {
        pollster::block_on(self.finish_step(step))
    }
}

/// The tokens `idx` of `batch`, in that order.
fn sub_batch(batch: &Batch, idx: &[usize]) -> Batch {
    Batch {
        tokens: idx.iter().map(|&i| batch.tokens[i]).collect(),
        pos: idx.iter().map(|&i| batch.pos[i]).collect(),
        seq: idx.iter().map(|&i| batch.seq[i]).collect(),
        logits: idx.iter().map(|&i| batch.logits[i]).collect(),
    }
}

/// Each draw's position in `draws`, by the batch index it samples.
fn draw_index(draws: &[GpuDraw]) -> std::collections::HashMap<usize, usize> {
    draws
        .iter()
        .enumerate()
        .map(|(j, d)| (d.index, j))
        .collect()
}

/// The output rows of ubatch `idx` in its order: those read back as (batch index, row),
/// and those drawn on the GPU (their settings with the row filled in, and which draw).
type OutputRows = (Vec<(usize, u32)>, Vec<SampleRow>, Vec<usize>);

fn output_rows(
    batch: &Batch,
    idx: &[usize],
    draws: &[GpuDraw],
    draw_of: &std::collections::HashMap<usize, usize>,
) -> OutputRows {
    let (mut read, mut drawn, mut which) = (Vec::new(), Vec::new(), Vec::new());
    for (r, &i) in idx.iter().filter(|&&i| batch.logits[i]).enumerate() {
        match draw_of.get(&i) {
            Some(&j) => {
                let mut row = draws[j].row;
                row.row = r as u32;
                drawn.push(row);
                which.push(j);
            }
            None => read.push((i, r as u32)),
        }
    }
    (read, drawn, which)
}

/// One ubatch submitted, its readback still to come.
struct UbatchRun {
    sub: crate::graph::Submitted,
    key: GraphKey,
    logit_bytes: u64,
    /// Per drawn row, in row order: the final candidates read back after the tokens.
    n_probs: Vec<usize>,
}

/// A step submitted ahead ([`Context::submit_step`]), to finish in order.
pub struct InFlight {
    run: UbatchRun,
    /// The draw each drawn row answers, in row order.
    which: Vec<usize>,
}
