//! Building a graph: tensors are ids; each node names the tensors it reads and writes.

use super::LoraTerms;
use crate::gpu::{Gpu, GpuError, KernelTuning, Placement};
use crate::ops::add_rms_norm::AddRmsNormNode;
use crate::ops::add_scaled::AddScaledNode;
use crate::ops::add_scaled::ScaledRows;
use crate::ops::attention::AttentionNode;
use crate::ops::attention::AttnShape;
use crate::ops::binary::BinaryNode;
use crate::ops::binary::BinaryOp;
use crate::ops::get_rows::{GetRowsNode, SelectRowsNode};
use crate::ops::glu::Activation;
use crate::ops::glu::GluNode;
use crate::ops::layer_norm::LayerNormNode;
use crate::ops::matmul::MatmulOut;
use crate::ops::matmul::{MatmulGluNode, MatmulNode};
use crate::ops::matmul_q8::{self, q8_bytes};
use crate::ops::matmul_q8::{MatmulQ8GluNode, MatmulQ8Node, QuantizeQ8Node};
use crate::ops::moe;
use crate::ops::moe::{MatmulIdNode, MoeAddIdNode, MoeGroupNode, MoeRouteNode, MoeSumNode};
use crate::ops::patches::{PatchGrid, PatchesNode};
use crate::ops::pixel_shuffle::{GridShuffle, PixelShuffleNode};
use crate::ops::pool_grid::{GridPool, PoolGridNode};
use crate::ops::rms_norm::RmsNormNode;
use crate::ops::rope::RopeParams;
use crate::ops::rope_store::RopeStoreNode;
use crate::ops::rope_store::RopeStoreShape;
use crate::ops::set_rows::StoreRowsNode;
use crate::ops::softmax::SoftmaxParams;
use crate::ops::softmax::SoftmaxRowsNode;
use crate::ops::ssm::{ConvShape, ScanShape};
use crate::ops::ssm::{SsmConvNode, SsmScanNode};
use crate::ops::{Experts, Ffn, GateUp};
use crate::ops::{GraphOp, OpCost};
use crate::ops::{View, Weight};
use std::collections::HashMap;
use std::sync::Arc;

pub type TensorId = usize;

pub(super) enum Storage {
    /// A buffer owned elsewhere (weights, KV cache, step inputs, logits).
    External(View),
    /// An intermediate: the planner gives it a buffer.
    Scratch { bytes: u64 },
}

/// Declares [`Op`], one variant per node type of an op file; what the graph asks of a
/// node (its name in profiles, its cost, its dispatches) each op file answers for its
/// own nodes ([`GraphOp`]).
macro_rules! graph_ops {
    ($($variant:ident($node:ty),)*) => {
        /// What a node computes: one call of an op, with its parameters. Reads and writes
        /// are listed in [`Node`] in the order the node type's doc gives them.
        pub enum Op {
            $($variant($node),)*
        }

        impl Op {
            /// The op file's node.
            pub fn as_node(&self) -> &dyn GraphOp {
                match self {
                    $(Op::$variant(n) => n,)*
                }
            }
        }
    };
}

graph_ops! {
    GetRows(GetRowsNode),
    SelectRows(SelectRowsNode),
    Matmul(MatmulNode),
    MatmulGlu(MatmulGluNode),
    QuantizeQ8(QuantizeQ8Node),
    MatmulQ8(MatmulQ8Node),
    MatmulQ8Glu(MatmulQ8GluNode),
    RmsNorm(RmsNormNode),
    AddRmsNorm(AddRmsNormNode),
    LayerNorm(LayerNormNode),
    Binary(BinaryNode),
    Glu(GluNode),
    AddScaled(AddScaledNode),
    MoeRoute(MoeRouteNode),
    MatmulId(MatmulIdNode),
    MoeGroup(MoeGroupNode),
    MoeAddId(MoeAddIdNode),
    MoeSum(MoeSumNode),
    RopeStore(RopeStoreNode),
    Attention(AttentionNode),
    SsmConv(SsmConvNode),
    SsmScan(SsmScanNode),
    StoreRows(StoreRowsNode),
    SoftmaxRows(SoftmaxRowsNode),
    Patches(PatchesNode),
    PoolGrid(PoolGridNode),
    PixelShuffle(PixelShuffleNode),
}

impl Op {
    /// The op's name in profiles (`matmul q4_1`), from its op file.
    pub fn kind(&self) -> String {
        self.as_node().kind()
    }

    /// The cost model ([`OpCost`]), from its op file.
    pub fn cost(&self) -> OpCost {
        self.as_node().cost()
    }
}

pub struct Node {
    pub op: Op,
    pub reads: Vec<TensorId>,
    pub writes: Vec<TensorId>,
}

pub struct GraphBuilder {
    pub(super) tensors: Vec<Storage>,
    /// [ne0, ne1] (row length, rows) of each tensor in elements, so that the helpers
    /// below size their outputs and ops from their operands, as ggml tensors do.
    shapes: Vec<[u32; 2]>,
    pub(super) nodes: Vec<Node>,
    /// The device each node runs on (an index into the placement's devices).
    pub(super) node_device: Vec<usize>,
    /// The device current when each tensor was made: a graph input is made on the
    /// main device, a layer's weights and cache on the layer's.
    pub(super) made_on: Vec<usize>,
    /// The devices and each layer's ([`GraphBuilder::layer`] switches to a layer's).
    pub(super) placement: Arc<Placement>,
    /// The device nodes are recorded for now.
    device: usize,
    /// Graph inputs' copies on the other devices of a split model, found by the main
    /// device's buffer (the context fills each copy with the same data).
    pub(super) mirrors: Arc<super::InputMirrors>,
    /// Each activation quantized so far, and its 8-bit blocks (Q, K and V, or gate and
    /// up, read one quantization); forgotten when a node writes either.
    quantized: HashMap<TensorId, TensorId>,
    /// LoRA corrections added after the matmuls (and the embedding rows) of the weights
    /// they adapt.
    lora: Option<Arc<LoraTerms>>,
}

/// What a layer's attention reads besides its weights and cache: graph inputs its model
/// declares once per ubatch (cells, mask, RoPE table) and the shape and softmax they imply.
#[derive(Clone, Copy)]
pub struct AttnInputs {
    /// [n_tok] cells the ubatch's K and V rows are stored in.
    pub slots: TensorId,
    /// [n_kv, n_tok] KQ mask.
    pub mask: TensorId,
    /// The (cos, sin) table and the parameters it was made with.
    pub rope: TensorId,
    pub rope_p: RopeParams,
    pub shape: AttnShape,
    pub sp: SoftmaxParams,
}

/// One layer's attention block: the projections, and which cache, mask and RoPE table
/// the layer uses (a model with local and global layers picks them per layer).
#[derive(Clone, Copy)]
pub struct AttnBlock<'a> {
    /// The Q, K and V projections stacked by rows (see `LayerWeights::qkv`).
    pub qkv: &'a [Arc<Weight>],
    /// Biases added to the stacked Q/K/V rows (Qwen2), [n_embd_q + 2 n_embd_kv].
    pub qkv_bias: Option<&'a View>,
    pub wo: &'a Arc<Weight>,
    /// The layer's K and V cache, [n_embd_kv, cells] each.
    pub k_cache: &'a View,
    pub v_cache: &'a View,
    /// The layer's cells, mask and RoPE table, its shape and softmax.
    pub inp: AttnInputs,
    /// RMS norms of each Q and K head before RoPE (Gemma), with their epsilon.
    pub qk_norm: Option<(&'a View, &'a View, f32)>,
    /// gpt-oss: one sink logit per head joining the softmax, [n_head].
    pub sinks: Option<&'a View>,
    /// gpt-oss: the output projection's bias, [n_embd].
    pub wo_bias: Option<&'a View>,
}

impl<'a> AttnBlock<'a> {
    /// The stacked Q/K/V projection `qkv` and output projection `wo` over the cache
    /// `(k, v)`, reading `inp`; no biases, per-head norms or sinks (set those fields on the
    /// result where a model has them).
    pub fn new(
        qkv: &'a [Arc<Weight>],
        wo: &'a Arc<Weight>,
        (k_cache, v_cache): (&'a View, &'a View),
        inp: AttnInputs,
    ) -> Self {
        AttnBlock {
            qkv,
            qkv_bias: None,
            wo,
            k_cache,
            v_cache,
            inp,
            qk_norm: None,
            sinks: None,
            wo_bias: None,
        }
    }
}

impl GraphBuilder {
    /// A builder recording nodes on the main device of `placement` until told a layer
    /// ([`GraphBuilder::layer`]); each node's matmuls take the kernels its device's
    /// tuning asks for where the choice changes the graph (the integer-dot matmuls add a
    /// quantization node).
    pub fn new(placement: Arc<Placement>) -> Self {
        Self {
            tensors: Vec::new(),
            shapes: Vec::new(),
            nodes: Vec::new(),
            node_device: Vec::new(),
            made_on: Vec::new(),
            device: placement.main_index(),
            placement,
            mirrors: Default::default(),
            quantized: HashMap::new(),
            lora: None,
        }
    }

    /// A builder for one device.
    pub fn new_on(gpu: Arc<Gpu>) -> Self {
        Self::new(Arc::new(Placement::single(gpu, 0)))
    }

    /// The same builder reading the graph inputs' copies `mirrors` on the devices other
    /// than the main one.
    pub fn with_mirrors(mut self, mirrors: Arc<super::InputMirrors>) -> Self {
        self.mirrors = mirrors;
        self
    }

    /// The nodes from here on run on layer `il`'s device.
    pub fn layer(&mut self, il: usize) {
        self.set_device(self.placement.layer_device(il));
    }

    /// The nodes from here on run on the main device (the output head).
    pub fn main(&mut self) {
        self.set_device(self.placement.main_index());
    }

    fn set_device(&mut self, d: usize) {
        if d != self.device {
            // An activation's 8-bit blocks stay on the device that made them.
            self.quantized.clear();
            self.device = d;
        }
    }

    /// The device nodes are recorded for now.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.placement.gpus()[self.device]
    }

    fn tuning(&self) -> &KernelTuning {
        &self.gpu().tuning
    }

    /// The same builder adding `lora`'s corrections to every matmul and embedding lookup
    /// of a weight they adapt (llama.cpp's `build_lora_mm`).
    pub fn with_lora(mut self, lora: Option<Arc<LoraTerms>>) -> Self {
        self.lora = lora.filter(|l| !l.is_empty());
        self
    }

    /// Whether any adapter corrects `w`.
    fn adapted(&self, w: &Arc<Weight>) -> bool {
        self.lora.as_ref().is_some_and(|l| !l.of(w).is_empty())
    }

    /// Adds each adapter's `scale · B (A x)` for `w` into dst, whose rows hold w's output
    /// from `row_offset` on (`a_rows`: A is read by rows at `x`'s ids, an embedding's
    /// correction, instead of multiplied).
    fn add_lora(
        &mut self,
        w: &Arc<Weight>,
        x: TensorId,
        dst: TensorId,
        row_offset: u32,
        a_rows: bool,
    ) {
        let Some(lora) = self.lora.clone() else {
            return;
        };
        for term in lora.of(w) {
            let ax = match a_rows {
                true => self.get_rows(&term.a, x),
                false => self.matmul(&term.a, x),
            };
            let bax = self.matmul(&term.b, ax);
            let [n, n_tok] = self.ne(bax);
            let p = ScaledRows {
                n,
                n_tok,
                stride: self.ne(dst)[0],
                offset: row_offset + term.offset,
                step: term.step,
                scale: term.scale,
            };
            self.node(Op::AddScaled(AddScaledNode { p }), &[bax], &[dst]);
        }
    }

    /// Whether a matmul of `n_tok` tokens through `w` takes the integer-dot kernel: the
    /// device's choice for that size (`WGLLM_INT_DOT`, or the tuner's), and a weight it
    /// can multiply.
    fn int_dot_for(&self, w: &Weight, n_tok: u32) -> bool {
        matmul_q8::chosen(self.tuning(), w, n_tok)
    }

    fn push(&mut self, s: Storage, ne: [u32; 2]) -> TensorId {
        self.tensors.push(s);
        self.shapes.push(ne);
        self.made_on.push(self.device);
        self.tensors.len() - 1
    }

    /// A buffer owned elsewhere, seen as one row of f32-sized elements.
    pub fn external(&mut self, v: View) -> TensorId {
        let ne = [(v.size / 4).min(u32::MAX as u64) as u32, 1];
        self.push(Storage::External(v), ne)
    }

    /// A buffer owned elsewhere (a step input, the logits) read as [ne0, ne1] elements.
    pub fn input(&mut self, v: View, ne: [u32; 2]) -> TensorId {
        self.push(Storage::External(v), ne)
    }

    /// A new intermediate of `n` f32 elements.
    pub fn scratch(&mut self, n: u64) -> TensorId {
        let ne = [n.min(u32::MAX as u64) as u32, 1];
        self.push(Storage::Scratch { bytes: n * 4 }, ne)
    }

    /// A new f32 intermediate of [ne0, ne1] elements.
    pub fn tensor(&mut self, ne: [u32; 2]) -> TensorId {
        self.push(
            Storage::Scratch {
                bytes: ne[0] as u64 * ne[1] as u64 * 4,
            },
            ne,
        )
    }

    /// [ne0, ne1] of a tensor.
    pub fn ne(&self, t: TensorId) -> [u32; 2] {
        self.shapes[t]
    }

    pub fn node(&mut self, op: Op, reads: &[TensorId], writes: &[TensorId]) {
        if !self.quantized.is_empty() {
            self.quantized
                .retain(|x, q| !writes.contains(x) && !writes.contains(q));
        }
        self.nodes.push(Node {
            op,
            reads: reads.to_vec(),
            writes: writes.to_vec(),
        });
        self.node_device.push(self.device);
    }

    // Helpers, outputs sized from the operands. An architecture file chains them
    // top-down; an op helper records exactly the node it names and a block the nodes it
    // lists, so a graph written with them dispatches the same kernels as one written
    // node by node; then `build` fuses each residual add with the norm of its sum
    // (`fuse.rs`).

    /// Rows `ids` ([n_ids]) of a (quantized) matrix as f32: [w.n_cols, n_ids].
    pub fn get_rows(&mut self, w: &Arc<Weight>, ids: TensorId) -> TensorId {
        let n_ids = self.ne(ids)[0];
        let dst = self.tensor([w.n_cols, n_ids]);
        let op = Op::GetRows(GetRowsNode {
            w: w.clone(),
            n_ids,
        });
        self.node(op, &[ids], &[dst]);
        self.add_lora(w, ids, dst, 0, true);
        dst
    }

    /// Rows `ids` ([n_ids]) of an f32 activation x: [ne0(x), n_ids].
    pub fn select_rows(&mut self, x: TensorId, ids: TensorId) -> TensorId {
        let ([n_cols, n_rows], n_ids) = (self.ne(x), self.ne(ids)[0]);
        let dst = self.tensor([n_cols, n_ids]);
        let op = Op::SelectRows(SelectRowsNode {
            n_cols,
            n_rows,
            n_ids,
        });
        self.node(op, &[x, ids], &[dst]);
        dst
    }

    /// w · x for x [w.n_cols, n_tok]: [w.n_rows, n_tok].
    pub fn matmul(&mut self, w: &Arc<Weight>, x: TensorId) -> TensorId {
        let dst = self.tensor([w.n_rows, self.ne(x)[1]]);
        self.matmul_into(w, x, dst);
        dst
    }

    /// w · x written to an existing tensor (the logits buffer).
    pub fn matmul_into(&mut self, w: &Arc<Weight>, x: TensorId, dst: TensorId) {
        self.matmul_rows_into(w, x, dst, 0);
    }

    /// w · x written to rows `row_offset..` of dst, whose rows are ne0(dst) long.
    pub fn matmul_rows_into(
        &mut self,
        w: &Arc<Weight>,
        x: TensorId,
        dst: TensorId,
        row_offset: u32,
    ) {
        let n_tok = self.ne(x)[1];
        let out = MatmulOut {
            row_offset,
            stride: self.ne(dst)[0],
        };
        if self.int_dot_for(w, n_tok) {
            let xq = self.quantized(x);
            let op = Op::MatmulQ8(MatmulQ8Node {
                w: w.clone(),
                n_tok,
                out,
            });
            self.node(op, &[xq], &[dst]);
        } else {
            let op = Op::Matmul(MatmulNode {
                w: w.clone(),
                n_tok,
                out,
            });
            self.node(op, &[x], &[dst]);
        }
        self.add_lora(w, x, dst, row_offset, false);
    }

    /// x's 8-bit blocks for the integer-dot matmuls, quantized once per value of x.
    fn quantized(&mut self, x: TensorId) -> TensorId {
        if let Some(&xq) = self.quantized.get(&x) {
            return xq;
        }
        let [k, n_tok] = self.ne(x);
        let words = q8_bytes(k, n_tok) / 4;
        let xq = self.tensor([(words / n_tok.max(1) as u64) as u32, n_tok]);
        self.node(Op::QuantizeQ8(QuantizeQ8Node { k, n_tok }), &[x], &[xq]);
        self.quantized.insert(x, xq);
        xq
    }

    /// act(gate · x) * (up · x) through one weight of interleaved (gate, up) rows:
    /// [w.n_rows / 2, n_tok].
    pub fn matmul_glu(&mut self, w: &Arc<Weight>, x: TensorId, act: Activation) -> TensorId {
        if self.adapted(w) {
            // The corrections go into the gate and up rows before the activation, so the
            // products are written out whole and the GLU runs after them.
            let pairs = self.matmul(w, x);
            return self.glu_pairs(act, pairs);
        }
        let dst = self.tensor([w.n_rows / 2, self.ne(x)[1]]);
        self.fused_glu_into(w, x, act, dst);
        dst
    }

    /// act(gate · x) * (up · x) of a weight without LoRA terms, the GLU in the matmul's
    /// epilogue, written to an existing tensor ([w.n_rows / 2, n_tok]): the tuner's
    /// layer, whose outputs it reads back.
    pub fn matmul_glu_into(
        &mut self,
        w: &Arc<Weight>,
        x: TensorId,
        act: Activation,
        dst: TensorId,
    ) -> Result<(), GpuError> {
        if self.adapted(w) {
            return Err(GpuError::Validation(format!(
                "matmul_glu_into {}: a weight with LoRA terms needs its GLU after them",
                w.name
            )));
        }
        self.fused_glu_into(w, x, act, dst);
        Ok(())
    }

    fn fused_glu_into(&mut self, w: &Arc<Weight>, x: TensorId, act: Activation, dst: TensorId) {
        let n_tok = self.ne(x)[1];
        let pairs = self.tensor([w.n_rows, n_tok]);
        if self.int_dot_for(w, n_tok) {
            let xq = self.quantized(x);
            let op = Op::MatmulQ8Glu(MatmulQ8GluNode {
                w: w.clone(),
                n_tok,
                act,
            });
            self.node(op, &[xq], &[dst, pairs]);
            return;
        }
        let op = Op::MatmulGlu(MatmulGluNode {
            w: w.clone(),
            n_tok,
            act,
        });
        self.node(op, &[x], &[dst, pairs]);
    }

    /// Each row of x RMS-normed and scaled by the vector `w`.
    pub fn rms_norm(&mut self, x: TensorId, w: &View, eps: f32) -> TensorId {
        let dst = self.tensor(self.ne(x));
        self.rms_norm_into(x, w, eps, dst);
        dst
    }

    /// [`Self::rms_norm`] into `dst` (an output buffer).
    pub fn rms_norm_into(&mut self, x: TensorId, w: &View, eps: f32, dst: TensorId) {
        let [n, rows] = self.ne(x);
        let w = self.external(w.clone());
        let op = Op::RmsNorm(RmsNormNode {
            n,
            rows,
            w_rows: 1,
            eps,
        });
        self.node(op, &[x, w], &[dst]);
    }

    /// Each row of x [n_group * g, n_tok] RMS-normed in `n_group` groups of g values,
    /// group i scaled by values [i * g, (i + 1) * g) of `w` (Mamba-2's gated norm).
    pub fn rms_norm_groups(&mut self, x: TensorId, w: &View, n_group: u32, eps: f32) -> TensorId {
        let [n, rows] = self.ne(x);
        let w = self.external(w.clone());
        let dst = self.tensor([n, rows]);
        let op = Op::RmsNorm(RmsNormNode {
            n: n / n_group,
            rows: rows * n_group,
            w_rows: n_group,
            eps,
        });
        self.node(op, &[x, w], &[dst]);
        dst
    }

    /// The short convolution of a recurrent layer over x ([x_stride, n_tok], its first
    /// `shape.ch` values per token), starting from `state` ([state_len, n_s], the
    /// ubatch's gathered states): (y [ch, n_tok], the new states [state_len, n_s]).
    pub fn ssm_conv(
        &mut self,
        state: TensorId,
        x: TensorId,
        w: &View,
        bias: Option<&View>,
        shape: ConvShape,
    ) -> (TensorId, TensorId) {
        let n_tok = shape.n_t * shape.n_s;
        let w = self.external(w.clone());
        let mut reads = vec![state, x, w];
        if let Some(b) = bias {
            reads.push(self.external(b.clone()));
        }
        let y = self.tensor([shape.ch, n_tok]);
        let new_state = self.tensor([shape.state_len(), shape.n_s]);
        let op = Op::SsmConv(SsmConvNode {
            shape,
            bias: bias.is_some(),
        });
        self.node(op, &reads, &[y, new_state]);
        (y, new_state)
    }

    /// The selective scan from the gathered states `state` ([state_len, n_s], left
    /// holding the final states): y [d_inner, n_tok].
    pub fn ssm_scan(
        &mut self,
        state: TensorId,
        [x, dt, bc, z]: [TensorId; 4],
        consts: &View,
        shape: ScanShape,
    ) -> TensorId {
        let consts = self.external(consts.clone());
        let y = self.tensor([shape.d_inner(), shape.n_t * shape.n_s]);
        self.node(
            Op::SsmScan(SsmScanNode { shape }),
            &[x, dt, consts, bc, z, state],
            &[state, y],
        );
        y
    }

    /// Rows of src ([row_len, n_rows]) into rows `idx` ([n_rows] u32) of dst.
    pub fn store_rows(&mut self, src: TensorId, idx: TensorId, dst: TensorId) {
        let [row_len, n_rows] = self.ne(src);
        self.node(
            Op::StoreRows(StoreRowsNode { row_len, n_rows }),
            &[src, idx],
            &[dst],
        );
    }

    /// Each row of x layer-normed, scaled by `w` and shifted by `b` (vectors of a row's
    /// length).
    pub fn layer_norm(&mut self, x: TensorId, (w, b): (&View, &View), eps: f32) -> TensorId {
        let dst = self.tensor(self.ne(x));
        self.layer_norm_into(x, (w, b), eps, dst);
        dst
    }

    /// [`Self::layer_norm`] into `dst` (an output buffer).
    pub fn layer_norm_into(
        &mut self,
        x: TensorId,
        (w, b): (&View, &View),
        eps: f32,
        dst: TensorId,
    ) {
        let [n, rows] = self.ne(x);
        let w = self.external(w.clone());
        let b = self.external(b.clone());
        self.node(
            Op::LayerNorm(LayerNormNode { n, rows, eps }),
            &[x, w, b],
            &[dst],
        );
    }

    /// An image ([W, H, C] f32, planar) cut into patch rows: [grid.stride, n_patches].
    pub fn patches(&mut self, img: TensorId, grid: PatchGrid) -> TensorId {
        let dst = self.tensor([grid.stride, grid.n_px() * grid.n_py()]);
        self.node(Op::Patches(PatchesNode { grid }), &[img], &[dst]);
        dst
    }

    /// The rows of x, a grid of `nx` x `ny` tokens, averaged over cells of k x k:
    /// [n, (nx / k) * (ny / k)].
    pub fn pool_grid(&mut self, x: TensorId, nx: u32, ny: u32, k: u32) -> TensorId {
        let n = self.ne(x)[0];
        let grid = GridPool { n, nx, ny, k };
        let dst = self.tensor([n, grid.out_rows()]);
        self.node(Op::PoolGrid(PoolGridNode { grid }), &[x], &[dst]);
        dst
    }

    /// The rows of x, a grid of `nx` x `ny` tokens, folded by cells of s x s into rows
    /// of n * s * s (the grid padded with zeros to whole cells):
    /// [n * s * s, ceil(nx / s) * ceil(ny / s)].
    pub fn pixel_shuffle(&mut self, x: TensorId, nx: u32, ny: u32, s: u32) -> TensorId {
        let n = self.ne(x)[0];
        let grid = GridShuffle { n, nx, ny, s };
        let dst = self.tensor([grid.out_width(), grid.out_rows()]);
        self.node(Op::PixelShuffle(PixelShuffleNode { grid }), &[x], &[dst]);
        dst
    }

    /// `op` (an add and an activation, [`BinaryOp::AddGelu`], [`BinaryOp::AddTanh`]) of
    /// x [n, rows] and a bias vector of n repeated along the rows.
    pub fn add_act(&mut self, op: BinaryOp, x: TensorId, bias: &View) -> TensorId {
        let dst = self.tensor(self.ne(x));
        self.add_act_into(op, x, bias, dst);
        dst
    }

    /// [`Self::add_act`] into `dst` (an output buffer); [`BinaryOp::Add`] adds the bias
    /// alone.
    pub fn add_act_into(&mut self, op: BinaryOp, x: TensorId, bias: &View, dst: TensorId) {
        let n = self.ne(x)[0];
        let b = self.input(bias.clone(), [n, 1]);
        self.binary_into(op, [x, b], dst, n, 1);
    }

    /// Each row of x softmaxed, in place.
    pub fn softmax_rows_in_place(&mut self, x: TensorId) {
        let [n_cols, rows] = self.ne(x);
        self.node(Op::SoftmaxRows(SoftmaxRowsNode { n_cols, rows }), &[], &[x]);
    }

    /// a + b, b broadcast over a when it is smaller.
    pub fn add(&mut self, a: TensorId, b: TensorId) -> TensorId {
        self.binary(BinaryOp::Add, a, b)
    }

    /// a * b, b broadcast over a when it is smaller (a one-element b scales a).
    pub fn mul(&mut self, a: TensorId, b: TensorId) -> TensorId {
        self.binary(BinaryOp::Mul, a, b)
    }

    fn binary(&mut self, op: BinaryOp, a: TensorId, b: TensorId) -> TensorId {
        let [b0, b1] = self.ne(b);
        let dst = self.tensor(self.ne(a));
        self.binary_into(op, [a, b], dst, b0 * b1, 1);
        dst
    }

    /// a [n, rows] times sigmoid(b [1, rows]): each row gated by its own value.
    pub fn mul_sigmoid_rows(&mut self, a: TensorId, b: TensorId) -> TensorId {
        let [n0, n1] = self.ne(a);
        let dst = self.tensor([n0, n1]);
        self.binary_into(BinaryOp::MulSigmoid, [a, b], dst, n1, n0);
        dst
    }

    /// cap tanh(a / cap) into `dst`, `cap` a one-value tensor.
    pub fn softcap_into(&mut self, a: TensorId, cap: TensorId, dst: TensorId) {
        self.binary_into(BinaryOp::Softcap, [a, cap], dst, 1, 1);
    }

    /// dst[i] = a[i] op b[(i / div) % nb] over all of a.
    fn binary_into(
        &mut self,
        op: BinaryOp,
        [a, b]: [TensorId; 2],
        dst: TensorId,
        nb: u32,
        div: u32,
    ) {
        let [n0, n1] = self.ne(a);
        let op = Op::Binary(BinaryNode {
            op,
            n: n0 * n1,
            nb,
            div,
        });
        self.node(op, &[a, b], &[dst]);
    }

    /// act(gate) * up.
    pub fn glu(&mut self, act: Activation, gate: TensorId, up: TensorId) -> TensorId {
        let [n0, n1] = self.ne(gate);
        let dst = self.tensor([n0, n1]);
        let op = Op::Glu(GluNode {
            act,
            n: n0 * n1,
            pairs: false,
        });
        self.node(op, &[gate, up], &[dst]);
        dst
    }

    /// act(gate) * up of interleaved (gate, up) rows ([2 n, n_tok]): [n, n_tok].
    pub fn glu_pairs(&mut self, act: Activation, pairs: TensorId) -> TensorId {
        let [n0, n1] = self.ne(pairs);
        let dst = self.tensor([n0 / 2, n1]);
        let op = Op::Glu(GluNode {
            act,
            n: n0 / 2 * n1,
            pairs: true,
        });
        self.node(op, &[pairs, pairs], &[dst]);
        dst
    }

    /// From a Q/K/V projection qkv ([row_len, n_tok]): the rotated Q ([head_dim *
    /// n_head, n_tok]), with rotated K and plain V rows stored at `slots` in the caches;
    /// Q and K heads RMS-normed first with `norm` (weights and epsilon).
    #[allow(clippy::too_many_arguments)]
    pub fn rope_store(
        &mut self,
        qkv: TensorId,
        table: TensorId,
        p: RopeParams,
        slots: TensorId,
        [k_cache, v_cache]: [TensorId; 2],
        shape: RopeStoreShape,
        norm: Option<(&View, &View, f32)>,
    ) -> TensorId {
        let q = self.tensor([p.head_dim * shape.n_head, shape.n_tok]);
        let mut reads = vec![table, qkv, slots];
        if let Some((qn, kn, _)) = norm {
            reads.push(self.external(qn.clone()));
            reads.push(self.external(kn.clone()));
        }
        let op = Op::RopeStore(RopeStoreNode {
            p,
            shape,
            norm_eps: norm.map(|n| n.2),
        });
        self.node(op, &reads, &[q, k_cache, v_cache]);
        q
    }

    /// softmax(mask + scale · K q) V over the cache for q [head_dim * n_head, n_tok]:
    /// [head_dim * n_head, n_tok].
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &mut self,
        q: TensorId,
        kv: [TensorId; 2],
        mask: TensorId,
        sinks: Option<TensorId>,
        shape: AttnShape,
        sp: SoftmaxParams,
    ) -> Result<TensorId, GpuError> {
        let gpu = self.gpu().clone();
        let scores = self.scratch(shape.scores_len(&gpu)?);
        let dst = self.tensor(self.ne(q));
        let partials = self.scratch(shape.partials_len(&gpu));
        let op = Op::Attention(AttentionNode { shape, sp });
        let mut reads = vec![q, kv[0], kv[1], mask];
        reads.extend(sinks);
        self.node(op, &reads, &[scores, dst, partials]);
        Ok(dst)
    }

    /// Self-attention of a normed x [n_embd, n_tok]: the Q, K, V projections into one
    /// tensor (one matmul per weight of `a.qkv`), then one rope_store: (per-head Q and K
    /// norms,) RoPE on Q and K, K and V rows stored in the cache at the ubatch's slots;
    /// attention over the cache with the layer's mask, output projection.
    pub fn attn_block(&mut self, x: TensorId, a: &AttnBlock) -> Result<TensorId, GpuError> {
        let n_tok = self.ne(x)[1];
        let shape = RopeStoreShape {
            n_head: a.inp.shape.n_head,
            n_head_kv: a.inp.shape.n_head_kv,
            n_tok,
            k_type: a.inp.shape.k_type,
            v_type: a.inp.shape.v_type,
            rot_k: a.inp.shape.rot_k,
            rot_v: a.inp.shape.rot_v,
        };
        let row = shape.row_len(a.inp.shape.head_dim);
        let stacked: u32 = a.qkv.iter().map(|w| w.n_rows).sum();
        if stacked != row {
            return Err(GpuError::Validation(format!(
                "attention block: the Q/K/V weights have {stacked} rows, the heads need {row}"
            )));
        }
        let qkv = match a.qkv {
            [w] => self.matmul(w, x),
            parts => {
                let qkv = self.tensor([row, n_tok]);
                let mut at = 0;
                for w in parts {
                    self.matmul_rows_into(w, x, qkv, at);
                    at += w.n_rows;
                }
                qkv
            }
        };
        let qkv = match a.qkv_bias {
            Some(bias) => {
                let bias = self.input(bias.clone(), [row, 1]);
                self.add(qkv, bias)
            }
            None => qkv,
        };
        let kc = self.external(a.k_cache.clone());
        let vc = self.external(a.v_cache.clone());
        let q = self.rope_store(
            qkv,
            a.inp.rope,
            a.inp.rope_p,
            a.inp.slots,
            [kc, vc],
            shape,
            a.qk_norm,
        );
        let sinks = a
            .sinks
            .map(|v| self.input(v.clone(), [a.inp.shape.n_head, 1]));
        let attn = self.attention(q, [kc, vc], a.inp.mask, sinks, a.inp.shape, a.inp.sp)?;
        let out = self.matmul(a.wo, attn);
        Ok(match a.wo_bias {
            Some(b) => {
                let b = self.input(b.clone(), [a.wo.n_rows, 1]);
                self.add(out, b)
            }
            None => out,
        })
    }

    /// Gated feed-forward of a normed x: down · (act(gate · x) * (up · x)), the gate and
    /// up projections in one matmul with the GLU fused where their weights are one.
    pub fn ffn_block(
        &mut self,
        x: TensorId,
        gate_up: &GateUp,
        down: &Arc<Weight>,
        act: Activation,
    ) -> TensorId {
        let h = match gate_up {
            GateUp::Interleaved(w) => self.matmul_glu(w, x, act),
            GateUp::Split { gate, up } => {
                let g = self.matmul(gate, x);
                let u = self.matmul(up, x);
                self.glu(act, g, u)
            }
        };
        self.matmul(down, h)
    }

    /// A mixture-of-experts feed-forward of a normed x ([n_embd, n_tok]): the router's
    /// logits, each token's experts and weights, the chosen experts' gate and up products,
    /// act(gate) * up, their down products, and each token's weighted sum.
    pub fn moe_block(&mut self, x: TensorId, e: &Experts, act: Activation) -> TensorId {
        let n_tok = self.ne(x)[1];
        let r = e.routing;
        let logits = self.matmul(&e.gate_inp, x);
        let logits = match &e.bias {
            Some(b) => {
                let b = self.input(b.gate_inp.clone(), [r.n_expert, 1]);
                self.add(logits, b)
            }
            None => logits,
        };
        let ids = self.tensor([r.n_used, n_tok]);
        let weights = self.tensor([r.n_used, n_tok]);
        let route = Op::MoeRoute(MoeRouteNode { routing: r, n_tok });
        self.node(route, &[logits], &[ids, weights]);
        // Prompts group the pairs by expert once for the three products, which the dense
        // prompt kernels then multiply a tile of an expert's pairs at a time.
        let n_pairs = r.n_used * n_tok;
        let grouping = moe::grouped(n_tok).then(|| {
            let offsets = self.tensor([r.n_expert + 1, 1]);
            let order = self.tensor([n_pairs, 1]);
            let op = Op::MoeGroup(MoeGroupNode {
                n_pairs,
                n_expert: r.n_expert,
            });
            self.node(op, &[ids], &[offsets, order]);
            [offsets, order]
        });
        let experts = |g: &mut Self, w: &Arc<Weight>, x: TensorId, x_per_pair: bool| {
            let dst = g.tensor([w.n_rows / r.n_expert, n_pairs]);
            let op = Op::MatmulId(MatmulIdNode {
                w: w.clone(),
                n_expert: r.n_expert,
                n_used: r.n_used,
                n_tok,
                x_per_pair,
                grouped: grouping.is_some(),
            });
            match grouping {
                Some([offsets, order]) => g.node(op, &[x, offsets, order], &[dst]),
                None => g.node(op, &[x, ids], &[dst]),
            }
            dst
        };
        // gpt-oss: each pair's products plus its expert's bias.
        let biased = |g: &mut Self, y: TensorId, bias: Option<&View>| match bias {
            Some(b) => {
                let rows = g.ne(y)[0];
                let b = g.input(b.clone(), [rows, r.n_expert]);
                let dst = g.tensor([rows, n_pairs]);
                g.node(
                    Op::MoeAddId(MoeAddIdNode { rows, n_pairs }),
                    &[y, b, ids],
                    &[dst],
                );
                dst
            }
            None => y,
        };
        let b = e.bias.as_ref();
        let gate = experts(self, &e.gate, x, false);
        let gate = biased(self, gate, b.map(|b| &b.gate));
        let up = experts(self, &e.up, x, false);
        let up = biased(self, up, b.map(|b| &b.up));
        let h = self.glu(act, gate, up);
        let y = experts(self, &e.down, h, true);
        let y = biased(self, y, b.map(|b| &b.down));
        let n_out = self.ne(y)[0];
        let dst = self.tensor([n_out, n_tok]);
        let sum = Op::MoeSum(MoeSumNode {
            n_out,
            n_used: r.n_used,
            n_tok,
        });
        self.node(sum, &[y, weights], &[dst]);
        match &e.shared {
            Some(sh) => {
                let gate = self.matmul(&sh.gate_inp, x);
                let out = self.ffn_block(x, &sh.gate_up, &sh.down, act);
                let out = self.mul_sigmoid_rows(out, gate);
                self.add(dst, out)
            }
            None => dst,
        }
    }

    /// A layer's feed-forward of a normed x, dense or a mixture of experts.
    pub fn ffn(&mut self, x: TensorId, ffn: &Ffn, act: Activation) -> TensorId {
        match ffn {
            Ffn::Dense { gate_up, down } => self.ffn_block(x, gate_up, down, act),
            Ffn::Experts(e) => self.moe_block(x, e, act),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_model() {
        let c = Op::RmsNorm(RmsNormNode {
            n: 576,
            rows: 2,
            w_rows: 1,
            eps: 1e-5,
        })
        .cost();
        assert_eq!(c.bytes, (2 * 576 * 2 + 576) * 4);
        let shape = AttnShape {
            head_dim: 64,
            n_head: 9,
            n_head_kv: 3,
            n_tok: 4,
            n_kv: 256,
            k_type: crate::kv::KvType::F16,
            v_type: crate::kv::KvType::F16,
            flash: false,
            rot_k: 0,
            rot_v: 0,
        };
        let sp = SoftmaxParams {
            scale: 0.125,
            max_bias: 0.0,
            n_head: 9,
            softcap: 0.0,
        };
        let a = Op::Attention(AttentionNode { shape, sp });
        assert_eq!(a.kind(), "attention");
        let c = a.cost();
        assert_eq!(c.flops, 4 * 9 * 64 * 256 * 4 + 5 * 9 * 4 * 256);
        // At least K and V of every cell once, in f16.
        assert!(c.bytes > 2 * 256 * 3 * 64 * 2);
    }
}
