//! An inference context: the model's memory (`crate::memory`: the KV cache), the step
//! input buffers, and the graphs built for the shapes seen so far. `decode` checks a
//! batch, lets the memory place its ubatches and runs one graph per ubatch.

mod checks;
mod run;
mod sampling;
pub mod state;

pub use crate::batch::Batch;
pub use run::InFlight;
pub use sampling::{Drawn, GpuDraw};

use crate::gpu::GpuError;
use crate::graph::GraphInput;
use crate::graph::{Graph, StepProfile};
use crate::kv::{KvCells, KvConfig, KvError, SeqId, MAX_SEQ};
use crate::memory::{Memory, MemoryError, MemoryParams};
use crate::model::Model;
use crate::ops::View;
use std::collections::VecDeque;
use std::sync::Arc;

/// What a context refuses or fails at: its own checks of a batch and its sequences, and
/// what its memory refused ([`MemoryError`], kept whole so that it is matched once).
#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("invalid batch: {0}")]
    BadBatch(String),
    #[error("invalid sequence id {seq}: this context has {n_seq_max} sequence(s), ids 0..{n_seq_max} (raise it with -np)")]
    BadSeq { seq: u32, n_seq_max: u32 },
    #[error("invalid batch: sequence {seq} ends at position {last} in the cache, so the batch must continue it at {} (it starts at {first}); positions of a sequence stay consecutive", last + 1)]
    PositionGap { seq: u32, last: i32, first: i32 },
    #[error("invalid batch: the positions of sequence {seq} go backwards ({prev} then {next})")]
    PositionsBackwards { seq: u32, prev: i32, next: i32 },
    #[error(transparent)]
    State(#[from] state::StateError),
    #[error("the context is full ({n_ctx} tokens) and {reason}; use a larger context (-c)")]
    ContextFull { n_ctx: u32, reason: FullReason },
}

impl ContextError {
    /// The cache error beneath this one, whichever layer reported it (the context's
    /// cells, or a memory's store).
    pub fn kv(&self) -> Option<&KvError> {
        match self {
            ContextError::Memory(MemoryError::Kv(e)) => Some(e),
            _ => None,
        }
    }
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
    /// The model's cached positions cannot be moved (M-RoPE), so no shift makes room.
    CannotShift,
}

impl std::fmt::Display for FullReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FullReason::ShiftOff => "context shift is off",
            FullReason::KeepTooLarge => "context shift cannot free space (is --keep too large?)",
            FullReason::SelfExtend => "Self-Extend (--grp-attn-n) frees no cells",
            FullReason::CannotShift => {
                "this model's positions (M-RoPE) cannot be shifted, as in llama.cpp"
            }
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
    /// Each output row is the token's hidden state after the final norm (n_embd floats,
    /// llama.cpp's embeddings) instead of its logits (`--embeddings`).
    pub embeddings: bool,
    /// Each output row is the classifier head's scores of that token's state (a
    /// reranker's: `--reranking`, llama.cpp's rank pooling); implies `embeddings`.
    pub rank: bool,
}

/// Floats per output row of a context made with `params` for a model of `hp`.
fn out_width(params: &ContextParams, model: &Model) -> u32 {
    let hp = &model.hp;
    if params.rank {
        model.n_rank_out()
    } else if params.embeddings {
        hp.n_embd
    } else {
        hp.n_vocab
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
            rank: false,
            kv: KvConfig::default(),
            embeddings: false,
        }
    }
}

/// The model's declared graph inputs and the logits it writes.
struct StepBuffers {
    /// One set of the inputs, or two for a split model: a ubatch in flight on one
    /// device while the next starts on another reads its own (see `run.rs`).
    sets: Vec<InputSet>,
    logits: wgpu::Buffer,
    /// An embeddings context's mean pooling: where each run of output rows starts (u32,
    /// one more than the runs), and the runs' sums ([`Context::decode_pooled`]).
    pool: Option<(wgpu::Buffer, wgpu::Buffer)>,
}

/// One buffer for each declared graph input.
struct InputSet {
    inputs: Vec<(GraphInput, wgpu::Buffer)>,
    /// A split model's copies of each input on the other devices holding layers
    /// (by device index, none on the main one), filled with the same data.
    mirrors: Vec<Vec<Option<wgpu::Buffer>>>,
    /// The same, as the graph builder finds them.
    mirror_views: Arc<crate::graph::InputMirrors>,
}

impl InputSet {
    fn new(model: &Model, ub: u64, n_ctx: u64) -> Result<InputSet, ContextError> {
        let gpu = &model.gpu;
        let mut inputs = Vec::new();
        let mut mirrors = Vec::new();
        let mut mirror_views = crate::graph::InputMirrors::default();
        let placement = model.placement.clone();
        let holds_layers =
            |d: usize| (0..placement.n_layer()).any(|il| placement.layer_device(il) == d);
        for input in model.inputs() {
            let bytes = input.bytes(ub, n_ctx);
            let buf = gpu.storage(&input.label(), bytes)?;
            let mut copies = Vec::new();
            for (d, g) in placement.gpus().iter().enumerate() {
                copies.push(match d != placement.main_index() && holds_layers(d) {
                    true => Some(g.storage(&input.label(), bytes)?),
                    false => None,
                });
            }
            if copies.iter().any(|c| c.is_some()) {
                let views = copies.iter().map(|c| c.as_ref().map(View::whole)).collect();
                mirror_views.insert(buf.clone(), views);
            }
            mirrors.push(copies);
            inputs.push((input, buf));
        }
        Ok(InputSet {
            inputs,
            mirrors,
            mirror_views: Arc::new(mirror_views),
        })
    }
}

/// What a graph is built for: (tokens, cells read in the full store, cells read in the
/// window store, sequence sets of a recurrent memory's ubatch, logit rows, the setting of
/// the LoRA scales it was built with, the input set it reads).
type GraphKey = (u32, u32, u32, u32, u32, u32, u32, u32);

/// Graphs kept for reuse per input set (decode steps replay one graph until n_kv crosses
/// a pad boundary).
const GRAPH_CACHE: usize = 3;

pub struct Context {
    pub model: Arc<Model>,
    pub params: ContextParams,
    /// Where past tokens live: the cells and K/V rows of every store.
    memory: Box<dyn Memory>,
    step: StepBuffers,
    /// Logit rows one graph can produce (bounded by the storage binding limit).
    n_out_max: u32,
    graphs: VecDeque<(GraphKey, Arc<Graph>)>,
    /// The input set the next pipelined ubatch fills (a split model's two take turns).
    next_set: usize,
    /// A split model's ubatches of one batch overlap on its devices
    /// ([`Context::set_pipelined`]).
    pipelined: bool,
    /// Counters for the timing summary.
    pub n_graph_builds: u64,
    /// Ubatches of a split model started while the one before was still in flight.
    pub n_overlapped: u64,
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
    /// The LoRA adapters' scales the next graphs apply ([`Context::set_lora`]).
    lora: LoraSetting,
}

/// The adapters' scales a context applies, the corrections they make, and a count of
/// changes that keys the graphs built with them.
#[derive(Default)]
struct LoraSetting {
    scales: crate::model::lora::LoraScales,
    terms: Option<Arc<crate::graph::LoraTerms>>,
    generation: u32,
}

/// What a decode returns: the logit rows asked for and not drawn on the GPU, and each
/// draw's token, in the order the draws were given.
/// A run of consecutive tokens of one sequence set in a ubatch of
/// [`Context::decode_pooled`]: the set, the sum of the run's output rows, its length.
#[derive(Clone, Debug, PartialEq)]
pub struct PooledRun {
    pub seq: u64,
    pub sum: Vec<f32>,
    pub n: usize,
}

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
    /// Of them, those wgpu records a barrier before (an estimate by its rule:
    /// [`crate::ops::barriers`]; the graph's and the draws' counted apart).
    pub barriers: usize,
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
        if params.rank && !(params.embeddings && model.has_classifier()) {
            return Err(ContextError::BadBatch(
                "reranking needs an embeddings context and a model with a classifier head (cls / cls.output tensors: a reranker); this model has none".into(),
            ));
        }
        if !model.has_output_head() && !params.embeddings {
            return Err(ContextError::BadBatch(format!(
                "this {:?} model is an encoder with no output head: it computes embeddings only (--embeddings; `wgllm embed`)",
                hp.arch
            )));
        }
        let ub = params.n_ubatch.min(params.n_batch) as u64;
        let n_ctx = params.n_ctx as u64;
        let memory =
            crate::memory::create(&Arc::new(model.memory_shape()), &params.memory_params())?;
        let width = out_width(&params, &model) as u64;
        let n_out_max = (gpu.max_binding / (width.max(1) * 4)).clamp(1, ub) as u32;
        let mut sets = vec![InputSet::new(&model, ub, n_ctx)?];
        if model.placement.is_split() {
            sets.push(InputSet::new(&model, ub, n_ctx)?);
        }
        let pool = match params.embeddings && !params.rank {
            true => Some((
                gpu.storage("pool_starts", (ub + 1) * 4)?,
                gpu.storage("pool_sums", n_out_max as u64 * width * 4)?,
            )),
            false => None,
        };
        let step = StepBuffers {
            sets,
            logits: gpu.storage("logits", n_out_max as u64 * width * 4)?,
            pool,
        };
        Ok(Context {
            model,
            params,
            memory,
            step,
            n_out_max,
            graphs: VecDeque::new(),
            next_set: 0,
            pipelined: true,
            n_graph_builds: 0,
            n_overlapped: 0,
            last_step: StepStats::default(),
            profile_next: false,
            last_profile: None,
            sampling: None,
            last_draws: 0,
            lora: LoraSetting::default(),
        })
    }

    /// Applies the model's LoRA adapters at `scales` (one per adapter in
    /// `model.loras`, missing ones 0; an adapter at 0 is left out) to the ubatches decoded
    /// from now on. The cache is not touched: tokens already decoded keep what the
    /// adapters then in force made of them (a server clears a slot whose setting changes,
    /// as llama-server does).
    pub fn set_lora(&mut self, scales: &[f32]) {
        let n = self.model.loras.len();
        let mut want: Vec<f32> = scales.iter().copied().take(n).collect();
        want.resize(n, 0.0);
        if want == self.lora.scales {
            return;
        }
        let terms = crate::model::lora::terms(&self.model.loras, &want);
        self.lora = LoraSetting {
            scales: want,
            terms: (!terms.is_empty()).then(|| Arc::new(terms)),
            generation: self.lora.generation.wrapping_add(1),
        };
    }

    /// Whether a split model's ubatches of one batch overlap on its devices (the next
    /// one's first part starting while the one before runs on another device): on by
    /// default; off runs each ubatch through every device before the next (benchmarks
    /// compare the two).
    pub fn set_pipelined(&mut self, on: bool) {
        self.pipelined = on;
    }

    /// The scales [`Context::set_lora`] last set (one per loaded adapter).
    pub fn lora_scales(&self) -> &[f32] {
        &self.lora.scales
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
    /// Whether cached positions can be moved (`seq_add`, `seq_div`): not where a
    /// position has several components (M-RoPE), as llama.cpp's `llama_memory_can_shift`.
    pub fn can_shift(&self) -> bool {
        self.model.hp.mrope.is_none()
    }

    fn check_shift(&self, op: &str) -> Result<(), ContextError> {
        match self.can_shift() {
            true => Ok(()),
            false => Err(ContextError::BadBatch(format!(
                "{op}: this model's positions (M-RoPE) cannot be moved"
            ))),
        }
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
        self.check_shift("seq_add")?;
        self.memory
            .seq_add(seq, p0, p1, delta)
            .map_err(ContextError::from)
    }
    /// Divides the positions of `seq` in [p0, p1) by `d`; the K-shift follows.
    pub fn seq_div(&mut self, seq: SeqId, p0: i32, p1: i32, d: i32) -> Result<(), ContextError> {
        self.check_seq(seq)?;
        self.check_shift("seq_div")?;
        self.memory
            .seq_div(seq, p0, p1, d)
            .map_err(ContextError::from)
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

    /// Floats per output row: n_vocab logits, n_embd in an embeddings context, the
    /// classifier's outputs in a reranking one.
    pub fn out_width(&self) -> u32 {
        out_width(&self.params, &self.model)
    }

    /// Decodes a batch; returns the logits of the tokens that asked for them, in batch
    /// order, n_vocab floats each (n_embd of hidden state in an embeddings context;
    /// blocking; native targets).
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

    /// Decodes a batch of an embeddings context whose every token asks for its output;
    /// returns, per run of consecutive tokens of one sequence set in each ubatch (in
    /// batch order), that set, the sum of the run's output rows and the run's length:
    /// mean pooling's numerators, summed on the GPU so that a row per run is read back
    /// instead of a row per token (blocking; native targets).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn decode_pooled(&mut self, batch: &Batch) -> Result<Vec<PooledRun>, ContextError> {
        if self.step.pool.is_none() {
            return Err(ContextError::BadBatch(
                "pooled outputs need an embeddings context".into(),
            ));
        }
        if batch.logits.contains(&false) {
            return Err(ContextError::BadBatch(
                "a pooled batch wants every token's output".into(),
            ));
        }
        self.check_decode(batch)?;
        self.memory.update(true)?;
        let saved = self.memory.checkpoint();
        let out = pollster::block_on(self.decode_pooled_ubatches(batch));
        if out.is_err() {
            self.memory.rollback(saved);
        }
        out
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
}
