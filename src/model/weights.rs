//! Uploading the weights: matrices stay quantized (re-laid out per block); norm vectors
//! become f32.

use super::{Arch, Hparams, ModelError};
use crate::gguf::{quant, GgmlType, GgufFile, TensorInfo};
use crate::gpu::Gpu;
use crate::ops::{View, Weight};
use std::sync::Arc;

/// The gate and up projections of a gated feed-forward.
pub enum GateUp {
    /// One weight of interleaved (gate, up) rows: one matmul with the GLU in its
    /// epilogue.
    Interleaved(Arc<Weight>),
    /// Two weights (their types differ): two matmuls and a GLU.
    Split { gate: Arc<Weight>, up: Arc<Weight> },
}

pub struct LayerWeights {
    pub attn_norm: View,
    /// The Q, K and V projections stacked by rows in that order, one weight per run of
    /// same-typed ones: one matmul for a typical file (Gemma's Q4_K_M, whose V is Q8_0
    /// beside Q5_0 Q and K: two).
    pub qkv: Vec<Arc<Weight>>,
    pub wo: Arc<Weight>,
    pub ffn_norm: View,
    pub gate_up: GateUp,
    pub down: Arc<Weight>,
    /// Gemma: RMS norms of each Q and K head ([head_dim]), and norms of the attention and
    /// feed-forward outputs before their residual adds.
    pub attn_q_norm: Option<View>,
    pub attn_k_norm: Option<View>,
    pub attn_post_norm: Option<View>,
    pub ffn_post_norm: Option<View>,
}

pub struct ModelWeights {
    pub tok_embd: Arc<Weight>,
    pub output_norm: View,
    /// The output projection; the embedding itself when the model ties them.
    pub output: Arc<Weight>,
    pub layers: Vec<LayerWeights>,
    /// One f32 the embeddings are multiplied by (Gemma), broadcast by the graph.
    pub embd_scale: Option<View>,
    pub gpu_bytes: u64,
}

struct Loader<'a> {
    gpu: &'a Gpu,
    f: &'a GgufFile,
    done: u64,
    total: u64,
    progress: &'a mut dyn FnMut(u64, u64),
    gpu_bytes: u64,
}

impl Loader<'_> {
    fn info(&self, name: &str, want: &[u64]) -> Result<&TensorInfo, ModelError> {
        let t = self
            .f
            .tensor(name)
            .ok_or_else(|| ModelError::MissingTensor {
                path: self.f.path.clone(),
                tensor: name.into(),
            })?;
        if t.dims != want {
            return Err(ModelError::BadShape {
                path: self.f.path.clone(),
                tensor: name.into(),
                got: t.dims.clone(),
                want: want.to_vec(),
            });
        }
        Ok(t)
    }

    fn advance(&mut self, t: &TensorInfo) {
        self.done += t.n_bytes;
        (self.progress)(self.done, self.total);
    }

    /// A matrix's tensor, checked: [n_cols, n_rows] of a type the kernels read.
    fn matrix_info(&self, name: &str, n_cols: u32, n_rows: u32) -> Result<TensorInfo, ModelError> {
        let t = self.info(name, &[n_cols as u64, n_rows as u64])?.clone();
        if !t.ty.is_supported_weight() {
            return Err(ModelError::UnsupportedType {
                path: self.f.path.clone(),
                tensor: name.into(),
                ty: t.ty,
            });
        }
        Ok(t)
    }

    /// Same-typed matrices [n_cols, rows] uploaded as one weight (see
    /// [`Weight::upload_fused`]), named after its parts.
    fn fused(
        &mut self,
        parts: &[TensorInfo],
        n_cols: u32,
        interleave: bool,
    ) -> Result<Arc<Weight>, ModelError> {
        if let [t] = parts {
            return self.matrix(&t.name, n_cols, t.dims[1] as u32);
        }
        let name: Vec<&str> = parts.iter().map(|t| t.name.as_str()).collect();
        let data: Vec<&[u8]> = parts.iter().map(|t| self.f.tensor_data(t)).collect();
        let w = Weight::upload_fused(
            self.gpu,
            &name.join("+"),
            parts[0].ty,
            n_cols as usize,
            &data,
            interleave,
        )?;
        self.gpu_bytes += w.gpu_bytes();
        for t in parts {
            self.advance(t);
        }
        Ok(Arc::new(w))
    }

    /// Matrices [n_cols, rows_i] whose rows stack in order, one weight per run of
    /// same-typed ones.
    fn stacked(
        &mut self,
        names: &[(String, u32)],
        n_cols: u32,
    ) -> Result<Vec<Arc<Weight>>, ModelError> {
        let infos = names
            .iter()
            .map(|(n, rows)| self.matrix_info(n, n_cols, *rows))
            .collect::<Result<Vec<_>, _>>()?;
        infos
            .chunk_by(|a, b| a.ty == b.ty)
            .map(|run| self.fused(run, n_cols, false))
            .collect()
    }

    /// Gate and up [n_cols, n_rows] interleaved where their types agree.
    fn gate_up(
        &mut self,
        gate: &str,
        up: &str,
        n_cols: u32,
        n_rows: u32,
    ) -> Result<GateUp, ModelError> {
        let g = self.matrix_info(gate, n_cols, n_rows)?;
        let u = self.matrix_info(up, n_cols, n_rows)?;
        if g.ty == u.ty {
            return Ok(GateUp::Interleaved(self.fused(&[g, u], n_cols, true)?));
        }
        Ok(GateUp::Split {
            gate: self.matrix(gate, n_cols, n_rows)?,
            up: self.matrix(up, n_cols, n_rows)?,
        })
    }

    /// A matrix [n_cols, n_rows], kept in its quantized type.
    fn matrix(&mut self, name: &str, n_cols: u32, n_rows: u32) -> Result<Arc<Weight>, ModelError> {
        let t = self.matrix_info(name, n_cols, n_rows)?;
        let w = Weight::upload(
            self.gpu,
            name,
            t.ty,
            n_cols as usize,
            n_rows as usize,
            self.f.tensor_data(&t),
        )?;
        self.gpu_bytes += w.gpu_bytes();
        self.advance(&t);
        Ok(Arc::new(w))
    }

    /// Layer `il`'s weights.
    fn layer(&mut self, hp: &Hparams, il: u32) -> Result<LayerWeights, ModelError> {
        let (e, q, kv, ff) = (hp.n_embd, hp.n_embd_q(), hp.n_embd_kv(), hp.n_ff);
        let gemma = hp.arch == Arch::Gemma3;
        let n = |s: &str| format!("blk.{il}.{s}.weight");
        let mut opt = |want: bool, name: &str, len: u32| -> Result<_, ModelError> {
            want.then(|| self.vector(&n(name), len)).transpose()
        };
        let attn_q_norm = opt(gemma, "attn_q_norm", hp.head_dim)?;
        let attn_k_norm = opt(gemma, "attn_k_norm", hp.head_dim)?;
        let attn_post_norm = opt(gemma, "post_attention_norm", e)?;
        let ffn_post_norm = opt(gemma, "post_ffw_norm", e)?;
        Ok(LayerWeights {
            attn_q_norm,
            attn_k_norm,
            attn_post_norm,
            ffn_post_norm,
            attn_norm: self.vector(&n("attn_norm"), e)?,
            qkv: self.stacked(&[(n("attn_q"), q), (n("attn_k"), kv), (n("attn_v"), kv)], e)?,
            wo: self.matrix(&n("attn_output"), q, e)?,
            ffn_norm: self.vector(&n("ffn_norm"), e)?,
            gate_up: self.gate_up(&n("ffn_gate"), &n("ffn_up"), e, ff)?,
            down: self.matrix(&n("ffn_down"), ff, e)?,
        })
    }

    /// A vector, as f32.
    fn vector(&mut self, name: &str, n: u32) -> Result<View, ModelError> {
        let t = self.info(name, &[n as u64])?.clone();
        if !matches!(t.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16) {
            return Err(ModelError::UnsupportedType {
                path: self.f.path.clone(),
                tensor: name.into(),
                ty: t.ty,
            });
        }
        let mut v = vec![0f32; n as usize];
        quant::dequantize_row(t.ty, self.f.tensor_data(&t), &mut v);
        let buf = self.gpu.upload(name, bytemuck::cast_slice(&v))?;
        self.gpu_bytes += buf.size();
        self.advance(&t);
        Ok(View::whole(&buf))
    }
}

impl LayerWeights {
    /// One layer's weights alone (the tuner times kernels on them).
    pub fn load(gpu: &Gpu, f: &GgufFile, hp: &Hparams, il: u32) -> Result<Self, ModelError> {
        let mut l = Loader {
            gpu,
            f,
            done: 0,
            total: 0,
            progress: &mut |_, _| {},
            gpu_bytes: 0,
        };
        let layer = l.layer(hp, il)?;
        gpu.flush()?;
        Ok(layer)
    }
}

impl ModelWeights {
    pub fn load(
        gpu: &Gpu,
        f: &GgufFile,
        hp: &Hparams,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self, ModelError> {
        let total = f.tensors.iter().map(|t| t.n_bytes).sum();
        let mut l = Loader {
            gpu,
            f,
            done: 0,
            total,
            progress,
            gpu_bytes: 0,
        };
        let e = hp.n_embd;
        let tok_embd = l.matrix("token_embd.weight", e, hp.n_vocab)?;
        let output_norm = l.vector("output_norm.weight", e)?;
        let output = if f.tensor("output.weight").is_some() {
            l.matrix("output.weight", e, hp.n_vocab)?
        } else {
            tok_embd.clone()
        };
        let layers = (0..hp.n_layer)
            .map(|il| l.layer(hp, il))
            .collect::<Result<Vec<_>, _>>()?;
        let embd_scale = match hp.embd_scale {
            Some(s) => Some(View::whole(
                &gpu.upload("embd_scale", bytemuck::bytes_of(&s))?,
            )),
            None => None,
        };
        gpu.flush()?;
        Ok(ModelWeights {
            tok_embd,
            output_norm,
            output,
            layers,
            embd_scale,
            gpu_bytes: l.gpu_bytes,
        })
    }
}
