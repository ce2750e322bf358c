//! An inference context: the KV cache (cells on the host, K/V on the GPU), the step input
//! buffers, and the graphs built for the shapes seen so far. `decode` runs a batch.

mod defrag;
pub mod state;

use crate::gpu::GpuError;
use crate::graph::{Graph, StepProfile};
use crate::kv::{
    seqs_below, CacheKind, KvCells, KvConfig, KvError, KvType, SeqId, WindowCells, MAX_SEQ,
    N_KV_PAD,
};
use crate::model::{CacheState, GraphInput, GraphIo, KvBuffers, Model, UbatchView};
use crate::ops::hadamard::hadamard;
use crate::ops::rope::rope;
use crate::ops::set_rows::{kv_read, set_rows};
use crate::ops::MAX_GROUPS;
use crate::ops::{run_now, View};
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

impl ContextParams {
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

/// Tokens to decode: for each, its position, its sequences (bit set) and whether its
/// logits are wanted.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    pub tokens: Vec<u32>,
    pub pos: Vec<i32>,
    pub seq: Vec<u64>,
    pub logits: Vec<bool>,
}

impl Batch {
    /// One sequence (id 0) from `start_pos`; logits for the last token only, or for all.
    pub fn simple(tokens: &[u32], start_pos: i32, all_logits: bool) -> Batch {
        let n = tokens.len();
        Batch {
            tokens: tokens.to_vec(),
            pos: (0..n as i32).map(|i| start_pos + i).collect(),
            seq: vec![1; n],
            logits: (0..n).map(|i| all_logits || i + 1 == n).collect(),
        }
    }
}

/// The model's declared graph inputs, one buffer each, and the logits it writes.
struct StepBuffers {
    inputs: Vec<(GraphInput, wgpu::Buffer)>,
    logits: wgpu::Buffer,
}

/// What a graph is built for: (tokens, cells read in the full store, cells read in the
/// window store, logit rows).
type GraphKey = (u32, u32, u32, u32);

/// Most bytes of f32 rows a packed K cache's shift reads back at a time.
const SHIFT_CHUNK_BYTES: u64 = 64 << 20;

/// Graphs kept for reuse (decode steps replay one graph until n_kv crosses a pad boundary).
const GRAPH_CACHE: usize = 3;

pub struct Context {
    pub model: Arc<Model>,
    pub params: ContextParams,
    /// The cells of the whole context (the full store).
    cells: KvCells,
    /// The rolling buffer of the sliding-window layers, if they have their own store.
    window: Option<WindowCells>,
    /// The store each layer's K and V rows live in.
    layer_kind: Vec<CacheKind>,
    kv: KvBuffers,
    step: StepBuffers,
    /// Logit rows one graph can produce (bounded by the storage binding limit).
    n_out_max: u32,
    graphs: VecDeque<(GraphKey, Graph)>,
    /// K and V bytes of each store, by `CacheKind` (for displays and logs).
    kv_bytes: [u64; 2],
    /// Counters for the timing summary.
    pub n_graph_builds: u64,
    /// What the last graph run cost on the host (benchmarks report it).
    pub last_step: StepStats,
    /// Set by [`Context::profile_next_ubatch`]; the profile lands in `last_profile`.
    profile_next: bool,
    pub last_profile: Option<StepProfile>,
}

/// The last ubatch's graph: its dispatches and the host time to record them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepStats {
    pub n_tok: u32,
    pub dispatches: usize,
    pub record_ns: u64,
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
        let choice = (params.kv)
            .resolve(gpu.has_f16, hp.head_dim, hp.n_embd_kv())
            .map_err(ContextError::Cache)?;
        let row_k = choice.type_k.row_bytes(hp.n_embd_kv() as u64);
        let row_v = choice.type_v.row_bytes(hp.n_embd_kv() as u64);
        let row_bytes = row_k.max(row_v);
        // Sliding-window layers get a rolling buffer of their window unless --swa-full.
        let window = match hp.swa {
            Some(swa) if !params.swa_full => {
                let size = WindowCells::capacity(
                    swa.window,
                    params.swa_keep,
                    params.n_seq_max,
                    ub as u32,
                    params.n_ctx,
                );
                Some(WindowCells::new(size, swa.window, params.swa_keep))
            }
            _ => None,
        };
        let layer_kind: Vec<CacheKind> = (0..hp.n_layer as usize)
            .map(|il| match &window {
                Some(_) if hp.is_swa(il) => CacheKind::Window,
                _ => CacheKind::Full,
            })
            .collect();
        let cells_of = |kind: CacheKind| match (kind, &window) {
            (CacheKind::Window, Some(w)) => w.cells.size() as u64,
            _ => n_ctx,
        };
        // Each layer's K and V are bound whole by the attention kernels.
        let kv_bytes = row_bytes * n_ctx;
        if kv_bytes > gpu.max_binding && layer_kind.contains(&CacheKind::Full) {
            let max_ctx = gpu.max_binding / row_bytes;
            return Err(ContextError::TooLarge(format!(
                "-c {n_ctx}: one layer's K or V cache would be {} MiB, over this adapter's storage binding limit of {} MiB; use -c {max_ctx} or less (or a smaller cache type, -ctk/-ctv)",
                kv_bytes >> 20,
                gpu.max_binding >> 20
            )));
        }
        let mut k = Vec::new();
        let mut v = Vec::new();
        let mut bytes_of = [0u64; 2];
        for (il, &kind) in layer_kind.iter().enumerate() {
            let cells = cells_of(kind);
            bytes_of[kind as usize] += (row_k + row_v) * cells;
            k.push(View::whole(
                &gpu.storage(&format!("k_cache{il}"), row_k * cells)?,
            ));
            v.push(View::whole(
                &gpu.storage(&format!("v_cache{il}"), row_v * cells)?,
            ));
        }
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        let elem = format!(
            "K {}, V {}{}",
            choice.type_k,
            choice.type_v,
            if choice.flash {
                ", flash attention"
            } else {
                ""
            }
        );
        match &window {
            Some(w) => log::info!(
                "context: {n_ctx} cells, KV cache {:.1} MiB ({elem}): global layers {:.1} MiB over {n_ctx} cells, sliding-window layers {:.1} MiB in a rolling buffer of {} cells (window {}, kept prefix {}); ubatch {ub}",
                mib(bytes_of[0] + bytes_of[1]),
                mib(bytes_of[0]),
                mib(bytes_of[1]),
                w.cells.size(),
                w.window,
                w.keep
            ),
            None => log::info!(
                "context: {n_ctx} cells, KV cache {:.1} MiB ({elem}){}, ubatch {ub}",
                mib(bytes_of[0]),
                if hp.swa.is_some() { ", full size for the sliding-window layers too (--swa-full)" } else { "" }
            ),
        }
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
            cells: KvCells::new(n_ctx as usize),
            window,
            layer_kind,
            kv: KvBuffers {
                k,
                v,
                cache: choice,
            },
            step,
            n_out_max,
            graphs: VecDeque::new(),
            kv_bytes: bytes_of,
            n_graph_builds: 0,
            last_step: StepStats::default(),
            profile_next: false,
            last_profile: None,
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

    pub fn cells(&self) -> &KvCells {
        &self.cells
    }

    /// What the cache holds and how attention reads it (`-ctk`, `-ctv`, `-fa` decided).
    pub fn kv_choice(&self) -> crate::kv::KvChoice {
        self.kv.cache
    }

    /// K and V bytes of the store `kind` over all its layers (0 for a store not in use).
    pub fn kv_bytes(&self, kind: CacheKind) -> u64 {
        self.kv_bytes[kind as usize]
    }

    /// The rolling buffer of the sliding-window layers, where they have one.
    pub fn window_cells(&self) -> Option<&WindowCells> {
        self.window.as_ref()
    }

    /// Whether sequence `seq` can be decoded on from position `p` (after cutting it back
    /// there): false where the rolling buffer has dropped cells that window needs.
    pub fn can_resume(&self, seq: SeqId, p: i32) -> bool {
        self.window
            .as_ref()
            .is_none_or(|w| w.check(&self.cells, seq, p).is_ok())
    }

    /// The cells of store `kind` (the full store's where there is no separate window).
    fn store_cells_mut(&mut self, kind: CacheKind) -> &mut KvCells {
        match (kind, self.window.as_mut()) {
            (CacheKind::Window, Some(w)) => &mut w.cells,
            _ => &mut self.cells,
        }
    }

    /// The cells of every store (the full one first): sequence operations apply to all.
    fn stores_mut(&mut self) -> impl Iterator<Item = &mut KvCells> {
        std::iter::once(&mut self.cells).chain(self.window.as_mut().map(|w| &mut w.cells))
    }

    /// Empties the cache.
    pub fn clear(&mut self) {
        self.stores_mut().for_each(|c| c.clear());
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
        for c in self.stores_mut() {
            c.seq_rm(seq, p0, p1)?;
        }
        Ok(())
    }
    /// Makes `dst` share the cells of `src` in [p0, p1) (no K/V copy).
    pub fn seq_cp(&mut self, src: SeqId, dst: SeqId, p0: i32, p1: i32) -> Result<(), ContextError> {
        self.check_seq(src)?;
        self.check_seq(dst)?;
        for c in self.stores_mut() {
            c.seq_cp(src, dst, p0, p1)?;
        }
        Ok(())
    }
    /// Drops every sequence but `seq`.
    pub fn seq_keep(&mut self, seq: SeqId) -> Result<(), ContextError> {
        self.check_seq(seq)?;
        for c in self.stores_mut() {
            c.seq_keep(seq)?;
        }
        Ok(())
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
        for c in self.stores_mut() {
            c.seq_add(seq, p0, p1, delta)?;
        }
        Ok(())
    }
    /// Divides the positions of `seq` in [p0, p1) by `d`; the K-shift follows.
    pub fn seq_div(&mut self, seq: SeqId, p0: i32, p1: i32, d: i32) -> Result<(), ContextError> {
        self.check_seq(seq)?;
        if self.window.is_some() {
            return Err(ContextError::SelfExtendNeedsSwaFull);
        }
        self.cells.seq_div(seq, p0, p1, d)?;
        Ok(())
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
            let cached = self.cells.seq_pos_max(s as SeqId);
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
        for kind in self.store_kinds() {
            let Some(deltas) = self.store_cells_mut(kind).take_shifts() else {
                continue;
            };
            self.shift_layers(kind, &deltas)?;
        }
        Ok(())
    }

    /// Re-rotates the keys of the layers in store `kind` by each cell's delta. f32 and f16
    /// keys rotate in place; packed ones (bf16, the block types) are read back as f32,
    /// rotated and written again, as llama.cpp's shift graph dequantizes, rotates and
    /// requantizes (undoing and redoing the Hadamard rotation around RoPE where keys are
    /// stored rotated), in chunks of cells whose f32 rows fit [`SHIFT_CHUNK_BYTES`].
    fn shift_layers(&self, kind: CacheKind, deltas: &[i32]) -> Result<(), ContextError> {
        let gpu = self.model.gpu.clone();
        let hp = &self.model.hp;
        let ty = self.kv.cache.type_k;
        let n_embd = hp.n_embd_kv();
        let n_cells = deltas.len() as u32;
        let chunk = if ty.is_packed() {
            let row = n_embd as u64 * 4;
            (gpu.max_binding.min(SHIFT_CHUNK_BYTES) / row).clamp(1, MAX_GROUPS as u64) as u32
        } else {
            n_cells
        };
        let tmp = match ty.is_packed() {
            true => Some(gpu.storage(
                "k_shift_rows",
                chunk.min(n_cells) as u64 * n_embd as u64 * 4,
            )?),
            false => None,
        };
        let mut dispatches = Vec::new();
        for c0 in (0..n_cells).step_by(chunk.max(1) as usize) {
            let n = chunk.min(n_cells - c0);
            let positions: Vec<f64> = deltas[c0 as usize..(c0 + n) as usize]
                .iter()
                .map(|&d| d as f64)
                .collect();
            // The cells set_rows writes back (packed keys only).
            let idx = match &tmp {
                Some(_) => {
                    let idx: Vec<u32> = (c0..c0 + n).collect();
                    Some(View::whole(
                        &gpu.upload("k_shift_cells", bytemuck::cast_slice(&idx))?,
                    ))
                }
                None => None,
            };
            // Each layer re-rotates with its own RoPE (Gemma's local and global layers
            // differ); one table per distinct parameter set.
            let mut tables: Vec<(crate::ops::rope::RopeParams, View)> = Vec::new();
            for (il, k) in self.kv.k.iter().enumerate() {
                if self.layer_kind[il] != kind {
                    continue;
                }
                let rp = hp.layer_rope(il);
                let table = match tables.iter().find(|(p, _)| *p == rp) {
                    Some((_, t)) => t.clone(),
                    None => {
                        let t = bytemuck::cast_slice(&rp.table(&positions)).to_vec();
                        let t = View::whole(&gpu.upload("k_shift_table", &t)?);
                        tables.push((rp, t.clone()));
                        t
                    }
                };
                let (Some(tmp), Some(idx)) = (&tmp, &idx) else {
                    let f16 = ty == KvType::F16;
                    dispatches.push(rope(&gpu, &rp, &table, k, hp.n_head_kv, n, f16)?);
                    continue;
                };
                let rows = View::whole(tmp);
                let (first, count) = (c0 * n_embd / 4, n * n_embd / 4);
                dispatches.push(kv_read(&gpu, k, &rows, first, count, ty)?);
                // Keys stored rotated (llama.cpp's attention rotation) are rotated back for
                // RoPE and again after, as llama.cpp's shift graph does.
                let rot = self.kv.cache.rot_k;
                let unrotate =
                    |gpu: &crate::gpu::Gpu| hadamard(gpu, &rows, rot, n * n_embd / rot.max(1));
                if rot > 0 {
                    dispatches.push(unrotate(&gpu)?);
                }
                dispatches.push(rope(&gpu, &rp, &table, &rows, hp.n_head_kv, n, false)?);
                if rot > 0 {
                    dispatches.push(unrotate(&gpu)?);
                }
                dispatches.push(set_rows(&gpu, &rows, idx, k, n_embd, n, ty)?);
            }
        }
        run_now(&gpu, &dispatches)?;
        log::debug!(
            "K-shift applied to {} cells of the {kind:?} store",
            deltas.iter().filter(|&&d| d != 0).count()
        );
        Ok(())
    }

    /// Decodes a batch; returns the logits of the tokens that asked for them, in batch
    /// order, n_vocab floats each (blocking; native targets).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn decode(&mut self, batch: &Batch) -> Result<Vec<f32>, ContextError> {
        pollster::block_on(self.decode_async(batch))
    }

    /// [`Context::decode`], awaiting the logits readback instead of blocking on it.
    pub async fn decode_async(&mut self, batch: &Batch) -> Result<Vec<f32>, ContextError> {
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
        self.check_batch(batch)?;
        self.apply_k_shift()?;
        self.maybe_defrag()?;
        // A failed batch leaves the cache as it was (as llama.cpp restores its cells):
        // ubatches already stored and the cells of a failing one are dropped. Their K/V
        // rows may stay written, harmlessly, in cells that are empty again.
        let saved = (self.cells.clone(), self.window.clone());
        let out = self.decode_ubatches(batch).await;
        if out.is_err() {
            (self.cells, self.window) = saved;
        }
        out
    }

    /// Splits a checked batch into ubatches and decodes them in order.
    async fn decode_ubatches(&mut self, batch: &Batch) -> Result<Vec<f32>, ContextError> {
        let n = batch.tokens.len();
        let ub = self.params.n_ubatch.min(self.params.n_batch) as usize;
        let mut out = Vec::new();
        let mut i = 0;
        while i < n {
            // A ubatch ends at n_ubatch tokens or when its logit rows would overflow.
            let mut end = i;
            let mut n_out = 0;
            while end < n && end - i < ub {
                if batch.logits[end] {
                    if n_out == self.n_out_max as usize {
                        break;
                    }
                    n_out += 1;
                }
                end += 1;
            }
            out.extend(self.decode_ubatch(batch, i..end).await?);
            i = end;
        }
        Ok(out)
    }

    async fn decode_ubatch(
        &mut self,
        b: &Batch,
        r: std::ops::Range<usize>,
    ) -> Result<Vec<f32>, ContextError> {
        let gpu = self.model.gpu.clone();
        let n = r.len();
        let slots = self.cells.find_slot(n)?;
        let pos = &b.pos[r.clone()];
        let seq = &b.seq[r.clone()];
        self.cells.store(&slots, pos, seq)?;
        let n_kv = self.cells.n_kv(N_KV_PAD);
        let window_slots = match self.window.as_mut() {
            Some(w) => {
                w.prepare(&self.cells, &first_positions(pos, seq), n)?;
                let s = w.cells.find_slot(n)?;
                w.cells.store(&s, pos, seq)?;
                Some(s)
            }
            None => None,
        };
        let full = CacheState {
            cells: &self.cells,
            slots: &slots,
            n_kv,
        };
        let window = match (&self.window, &window_slots) {
            (Some(w), Some(s)) => CacheState {
                cells: &w.cells,
                slots: s,
                n_kv: w.cells.n_kv(N_KV_PAD),
            },
            _ => full,
        };
        // Every declared input fills itself from the ubatch and the stores it went to.
        let ubv = UbatchView {
            tokens: &b.tokens[r.clone()],
            pos,
            seq,
            logits: &b.logits[r.clone()],
        };
        for (input, buf) in &self.step.inputs {
            let data = input.fill(&ubv, full, window);
            if !data.is_empty() {
                gpu.write(buf, 0, data.as_bytes());
            }
        }
        let n_out = ubv.logits.iter().filter(|&&l| l).count() as u32;
        let key = (n as u32, n_kv as u32, window.n_kv as u32, n_out);
        let idx = match self.graphs.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                let io = GraphIo {
                    n_tok: key.0,
                    n_kv: key.1,
                    n_kv_window: key.2,
                    n_out,
                    inputs: (self.step.inputs.iter())
                        .map(|(i, buf)| (*i, View::whole(buf)))
                        .collect(),
                    logits: View::whole(&self.step.logits),
                };
                let graph = self.model.build_graph(&io, &self.kv)?;
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
        let bytes = n_out as u64 * self.model.hp.n_vocab as u64 * 4;
        let read = (n_out > 0).then(|| (View::whole(&self.step.logits), bytes));
        let data = graph.run(&gpu, read.as_ref().map(|(v, b)| (v, *b))).await?;
        self.last_step = StepStats {
            n_tok: key.0,
            dispatches: graph.n_dispatches(),
            record_ns: graph.record_ns(),
        };
        if std::mem::take(&mut self.profile_next) {
            let mut p = graph.profile(&gpu).await?;
            (p.n_tok, p.n_kv) = (key.0, key.1);
            self.last_profile = Some(p);
        }
        Ok(data
            .map(|d| bytemuck::pod_collect_to_vec(&d))
            .unwrap_or_default())
    }
}

/// The first position of each sequence in a ubatch (a token may be in several).
fn first_positions(pos: &[i32], seq: &[u64]) -> Vec<(SeqId, i32)> {
    let mut first: Vec<(SeqId, i32)> = Vec::new();
    for (&p, &set) in pos.iter().zip(seq) {
        for s in 0..MAX_SEQ {
            if set & (1u64 << s) == 0 {
                continue;
            }
            match first.iter_mut().find(|f| f.0 == s) {
                Some(f) => f.1 = f.1.min(p),
                None => first.push((s, p)),
            }
        }
    }
    first
}
