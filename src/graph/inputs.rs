//! Graph inputs: what a model's forward graph reads per ubatch besides weights and the
//! K/V cache. Each architecture declares the inputs it needs (`model::Model::inputs`);
//! the context gives each one a buffer sized for the largest ubatch and, before every
//! ubatch, lets it fill itself from the ubatch and the cache cells. The graph builder then
//! looks its inputs up by what they are ([`GraphIo::mask`], [`GraphIo::rope`], ...), so an
//! architecture with two masks or two RoPE tables says so in its own file only.

use crate::gpu::GpuError;
pub use crate::kv::CacheKind;
use crate::kv::{build_mask, KvCells, MaskKind};
use crate::ops::rope::RopeParams;
use crate::ops::View;

/// A K/V store as a ubatch sees it: its cells (the ubatch already stored), the cell of
/// each ubatch token, and how many cells attention reads.
#[derive(Clone, Copy, Debug)]
pub struct CacheState<'a> {
    pub cells: &'a KvCells,
    pub slots: &'a [usize],
    pub n_kv: usize,
}

impl CacheState<'_> {
    /// The slot and mask inputs over this store (None for other inputs). A store serves
    /// whichever kind it is asked for: a lone store fills the sliding-window layers'
    /// inputs too.
    pub fn fill(&self, input: &GraphInput, ub: &UbatchView) -> Option<InputData> {
        match input {
            GraphInput::KvSlots(_) => Some(InputData::U32(
                self.slots.iter().map(|&c| c as u32).collect(),
            )),
            GraphInput::KqMask(kind) => Some(InputData::F32(build_mask(
                self.cells.cells(),
                self.n_kv,
                ub.pos,
                ub.seq,
                *kind,
            ))),
            _ => None,
        }
    }
}

/// One per-ubatch input of the forward graph.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GraphInput {
    /// The ubatch's token ids (u32 each), for the embedding lookup.
    Tokens,
    /// The ubatch's input rows where it brings them in place of token ids ([n_embd,
    /// n_tok] f32: an image's embeddings); declared by the models that take them.
    Embd(u32),
    /// The ubatch's positions (u32 each), for a learned position embedding's lookup.
    Positions,
    /// The cell of this store each token's K and V rows are written to (u32 each).
    KvSlots(CacheKind),
    /// The rows of the ubatch whose logits are wanted (u32 each, ascending).
    OutIds,
    /// A KQ mask [n_kv, n_tok] of f32 (0 or an ALiBi distance where a token sees a cell,
    /// -inf elsewhere); models with local and global layers declare one per kind. A
    /// sliding-window mask is over the cells of the window store, any other over the full.
    KqMask(MaskKind),
    /// A (cos, sin) table [n_dims / 2, n_tok] of f32 pairs for these RoPE parameters;
    /// models whose layers rotate with different bases declare one per parameter set.
    Rope(RopeParams),
    /// Per sequence set of the ubatch (the recurrent memory's equal split), the row of the
    /// recurrent state buffers its state is gathered from (the zero row for a new one).
    RsSrc,
    /// Per sequence set of the ubatch, the row its new state is stored to.
    RsDst,
}

/// The ubatch an input fills itself from: the tokens of one graph run and where they go.
#[derive(Clone, Copy, Debug)]
pub struct UbatchView<'a> {
    pub tokens: &'a [u32],
    pub pos: &'a [i32],
    /// Sequence set of each token (bit s: sequence s).
    pub seq: &'a [u64],
    /// Whether each token's logits are wanted.
    pub logits: &'a [bool],
    /// The input rows in place of token embeddings (see `Batch::embd`), or empty.
    pub embd: &'a [f32],
    /// Every token sees all its sequences' cells (see `Batch::non_causal`).
    pub non_causal: bool,
    /// Each token's M-RoPE position (see `Batch::mrope`), or empty: RoPE by `pos`.
    pub mrope: &'a [crate::batch::MropePos],
}

/// The filled contents of an input, kept in the element type they were computed in so a
/// large mask goes to the GPU from its own vector, without a copy into bytes.
#[derive(Clone, Debug, PartialEq)]
pub enum InputData {
    U32(Vec<u32>),
    F32(Vec<f32>),
}

impl InputData {
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            InputData::U32(v) => bytemuck::cast_slice(v),
            InputData::F32(v) => bytemuck::cast_slice(v),
        }
    }
    pub fn is_empty(&self) -> bool {
        match self {
            InputData::U32(v) => v.is_empty(),
            InputData::F32(v) => v.is_empty(),
        }
    }
}

impl GraphInput {
    /// Buffer bytes for the largest ubatch (`n_ubatch` tokens over `n_ctx` cells).
    pub fn bytes(&self, n_ubatch: u64, n_ctx: u64) -> u64 {
        match self {
            GraphInput::Tokens
            | GraphInput::Positions
            | GraphInput::KvSlots(_)
            | GraphInput::OutIds
            | GraphInput::RsSrc
            | GraphInput::RsDst => n_ubatch * 4,
            GraphInput::KqMask(_) => n_ubatch * n_ctx * 4,
            GraphInput::Embd(n_embd) => n_ubatch * *n_embd as u64 * 4,
            GraphInput::Rope(p) => n_ubatch * p.n_dims as u64 * 4,
        }
    }

    /// The contents of an input that depends on the ubatch alone (None for the others).
    pub fn fill_from_ubatch(&self, ub: &UbatchView) -> Option<InputData> {
        Some(match self {
            GraphInput::Tokens => InputData::U32(ub.tokens.to_vec()),
            // Empty (nothing written) for a ubatch of token ids.
            GraphInput::Embd(_) => InputData::F32(ub.embd.to_vec()),
            // Positions are never negative in a checked batch.
            GraphInput::Positions => {
                InputData::U32(ub.pos.iter().map(|&p| p.max(0) as u32).collect())
            }
            GraphInput::OutIds => InputData::U32(
                (0..ub.logits.len() as u32)
                    .filter(|&j| ub.logits[j as usize])
                    .collect(),
            ),
            GraphInput::Rope(p) if p.mrope.is_some() && !ub.mrope.is_empty() => {
                let positions: Vec<[i32; 3]> =
                    ub.mrope.iter().map(|m| [m.t, m.row, m.col]).collect();
                InputData::F32(bytemuck::cast_slice(&p.table_mrope(&positions)).to_vec())
            }
            GraphInput::Rope(p) => {
                let positions: Vec<f64> = ub.pos.iter().map(|&p| p as f64).collect();
                InputData::F32(bytemuck::cast_slice(&p.table(&positions)).to_vec())
            }
            GraphInput::KvSlots(_)
            | GraphInput::KqMask(_)
            | GraphInput::RsSrc
            | GraphInput::RsDst => return None,
        })
    }

    /// A buffer label that tells inputs of the same kind apart in GPU captures.
    pub fn label(&self) -> String {
        match self {
            GraphInput::Tokens => "tokens".into(),
            GraphInput::Embd(_) => "embd".into(),
            GraphInput::Positions => "positions".into(),
            GraphInput::KvSlots(CacheKind::Full) => "kv_slots".into(),
            GraphInput::KvSlots(CacheKind::Window) => "kv_slots_window".into(),
            GraphInput::OutIds => "out_ids".into(),
            GraphInput::KqMask(k) => {
                let mut s = String::from("kq_mask");
                if let Some(w) = k.swa {
                    s.push_str(&format!("_swa{w}"));
                }
                if k.alibi {
                    s.push_str("_alibi");
                }
                if k.non_causal {
                    s.push_str("_non_causal");
                }
                s
            }
            GraphInput::Rope(p) => format!("rope_table_{}", p.freq_base),
            GraphInput::RsSrc => "rs_src".into(),
            GraphInput::RsDst => "rs_dst".into(),
        }
    }
}

/// Per-ubatch inputs and outputs of the forward graph, and its shape.
pub struct GraphIo {
    pub n_tok: u32,
    /// Cells attention reads in the full store and in the window store.
    pub n_kv: u32,
    pub n_kv_window: u32,
    /// Sequence sets in the ubatch (the recurrent memory's equal split: each has
    /// n_tok / n_rs tokens); 0 without a recurrent memory.
    pub n_rs: u32,
    pub n_out: u32,
    /// The declared inputs and their buffers, in declaration order.
    pub inputs: Vec<(GraphInput, View)>,
    /// [n_vocab, n_out] f32, owned by the context, which reads it back ([n_embd,
    /// n_out] with `embeddings`).
    pub logits: View,
    /// The outputs are the hidden states after the final norm, not logits.
    pub embeddings: bool,
    /// The outputs are a classifier head's scores of the hidden states ([n_cls_out,
    /// n_out]).
    pub rank: bool,
    /// The ubatch brings its input rows ([`GraphInput::Embd`]) instead of token ids.
    pub embd_input: bool,
    /// The LoRA corrections the graph adds to its matmuls (none without adapters).
    pub lora: Option<std::sync::Arc<super::LoraTerms>>,
    /// The inputs' copies on a split model's other devices (empty on one device).
    pub mirrors: std::sync::Arc<super::InputMirrors>,
}

impl GraphIo {
    /// The buffer of a declared input. A lookup of an undeclared one is an error of the
    /// architecture file (its build asks for more than its declaration gave), reported
    /// rather than panicking.
    pub fn input(&self, want: GraphInput) -> Result<View, GpuError> {
        self.inputs
            .iter()
            .find(|(i, _)| *i == want)
            .map(|(_, v)| v.clone())
            .ok_or_else(|| {
                GpuError::Validation(format!(
                    "the model's graph reads input {want:?}, which it did not declare"
                ))
            })
    }
    pub fn tokens(&self) -> Result<View, GpuError> {
        self.input(GraphInput::Tokens)
    }
    pub fn embd(&self, n_embd: u32) -> Result<View, GpuError> {
        self.input(GraphInput::Embd(n_embd))
    }
    pub fn positions(&self) -> Result<View, GpuError> {
        self.input(GraphInput::Positions)
    }
    pub fn kv_slots(&self, kind: CacheKind) -> Result<View, GpuError> {
        self.input(GraphInput::KvSlots(kind))
    }
    /// Cells attention reads in the store of `kind`.
    pub fn n_kv_of(&self, kind: CacheKind) -> u32 {
        match kind {
            CacheKind::Full => self.n_kv,
            CacheKind::Window => self.n_kv_window,
        }
    }
    pub fn out_ids(&self) -> Result<View, GpuError> {
        self.input(GraphInput::OutIds)
    }
    pub fn mask(&self, kind: MaskKind) -> Result<View, GpuError> {
        self.input(GraphInput::KqMask(kind))
    }
    pub fn rope(&self, p: RopeParams) -> Result<View, GpuError> {
        self.input(GraphInput::Rope(p))
    }
}

/// `inputs` without repeats, in first-declaration order: a model that asks twice for the
/// same mask or table gets one buffer, filled once.
pub fn dedup(inputs: Vec<GraphInput>) -> Vec<GraphInput> {
    let mut out: Vec<GraphInput> = Vec::with_capacity(inputs.len());
    for i in inputs {
        if !out.contains(&i) {
            out.push(i);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::MASKED;

    fn bytes<T: bytemuck::Pod>(v: &[T]) -> &[u8] {
        bytemuck::cast_slice(v)
    }

    fn rope(base: f32) -> RopeParams {
        RopeParams::new(8, 8, true, base, 1.0)
    }

    /// A Gemma-3-like declaration: a global causal mask and a sliding window one, and a
    /// RoPE table per base, each filled from one ubatch of two sequences.
    #[test]
    fn two_masks_and_two_rope_tables_fill_from_a_ubatch() {
        let causal = MaskKind::default();
        let window = MaskKind {
            swa: Some(3),
            alibi: false,
            non_causal: false,
        };
        let (local, global) = (rope(10_000.0), rope(1_000_000.0));
        let declared = dedup(vec![
            GraphInput::Tokens,
            GraphInput::KvSlots(CacheKind::Full),
            GraphInput::OutIds,
            GraphInput::KqMask(causal),
            GraphInput::KqMask(window),
            GraphInput::Rope(local),
            GraphInput::Rope(global),
            GraphInput::KqMask(causal),
        ]);
        assert_eq!(declared.len(), 7, "a repeated declaration shares one input");

        // Sequence 0 holds positions 0..5 in cells 0..5; sequence 1 holds 0..2 in 5..7.
        let mut cells = KvCells::new(16);
        let pos0: Vec<i32> = (0..5).collect();
        cells.store(&[0, 1, 2, 3, 4], &pos0, &[1; 5]).unwrap();
        cells.store(&[5, 6], &[0, 1], &[2, 2]).unwrap();
        // The ubatch: two more tokens of sequence 0, one of sequence 1.
        let tokens = [7u32, 8, 9];
        let pos = [5, 6, 2];
        let seq = [1u64, 1, 2];
        let logits = [false, true, true];
        let slots = cells.find_slot(3).unwrap();
        cells.store(&slots, &pos, &seq).unwrap();
        let ub = UbatchView {
            tokens: &tokens,
            pos: &pos,
            seq: &seq,
            logits: &logits,
            embd: &[],
            non_causal: false,
            mrope: &[],
        };
        let n_kv = 16;
        let store = CacheState {
            cells: &cells,
            slots: &slots,
            n_kv,
        };
        let fill = |i: GraphInput| {
            (i.fill_from_ubatch(&ub))
                .or_else(|| store.fill(&i, &ub))
                .unwrap()
        };

        assert_eq!(fill(GraphInput::Tokens), InputData::U32(vec![7, 8, 9]));
        assert_eq!(
            fill(GraphInput::KvSlots(CacheKind::Full)),
            InputData::U32(vec![7, 8, 9])
        );
        assert_eq!(fill(GraphInput::OutIds), InputData::U32(vec![1, 2]));

        let m_causal = fill(GraphInput::KqMask(causal));
        let m_window = fill(GraphInput::KqMask(window));
        let want_causal = build_mask(cells.cells(), n_kv, &pos, &seq, causal);
        let want_window = build_mask(cells.cells(), n_kv, &pos, &seq, window);
        assert_eq!(m_causal.as_bytes(), bytes(&want_causal));
        assert_eq!(m_window.as_bytes(), bytes(&want_window));
        // Token 1 (sequence 0, position 6) sees cells 0..=4, 7 and 8 causally, but only
        // positions 4..=6 (cells 4, 7, 8) within the window of 3.
        let row = |m: &[f32]| m[n_kv..2 * n_kv].to_vec();
        let visible = |m: &[f32]| -> Vec<usize> {
            row(m)
                .iter()
                .enumerate()
                .filter(|(_, &v)| v != MASKED)
                .map(|(c, _)| c)
                .collect()
        };
        assert_eq!(visible(&want_causal), vec![0, 1, 2, 3, 4, 7, 8]);
        assert_eq!(visible(&want_window), vec![4, 7, 8]);

        let t_local = fill(GraphInput::Rope(local));
        let t_global = fill(GraphInput::Rope(global));
        let p64: Vec<f64> = pos.iter().map(|&p| p as f64).collect();
        assert_eq!(t_local.as_bytes(), bytes(&local.table(&p64)));
        assert_eq!(t_global.as_bytes(), bytes(&global.table(&p64)));
        assert_ne!(t_local, t_global);

        // Each buffer holds its input for the largest ubatch.
        for i in &declared {
            let filled = fill(*i).as_bytes().len() as u64;
            assert!(filled <= i.bytes(3, 16), "{i:?}: {filled} bytes");
        }
        assert_eq!(GraphInput::KqMask(window).bytes(3, 16), 3 * 16 * 4);
        assert_eq!(GraphInput::Rope(local).bytes(3, 16), 3 * 4 * 8);
    }

    #[test]
    fn labels_tell_inputs_apart() {
        let window = GraphInput::KqMask(MaskKind {
            swa: Some(512),
            alibi: false,
            non_causal: false,
        });
        assert_eq!(window.label(), "kq_mask_swa512");
        assert_eq!(GraphInput::KqMask(MaskKind::default()).label(), "kq_mask");
        assert_ne!(
            GraphInput::Rope(rope(10_000.0)).label(),
            GraphInput::Rope(rope(1_000_000.0)).label()
        );
    }
}
