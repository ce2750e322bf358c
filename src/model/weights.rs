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
    /// Qwen2: the Q, K and V biases stacked the same way ([n_embd_q + 2 n_embd_kv]).
    pub qkv_bias: Option<View>,
    pub wo: Arc<Weight>,
    pub ffn_norm: View,
    pub gate_up: GateUp,
    pub down: Arc<Weight>,
    /// Gemma, Qwen3: RMS norms of each Q and K head ([head_dim]). Gemma: norms of the
    /// attention and feed-forward outputs before their residual adds.
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

    /// Phi-3's fused feed-forward input: one [n_cols, 2 n_rows] tensor whose first half of
    /// rows is the gate and second half the up projection, re-laid out interleaved.
    fn fused_gate_up(
        &mut self,
        name: &str,
        n_cols: u32,
        n_rows: u32,
    ) -> Result<GateUp, ModelError> {
        let t = self.matrix_info(name, n_cols, 2 * n_rows)?;
        let data = self.f.tensor_data(&t);
        let (gate, up) = data.split_at(data.len() / 2);
        let w = Weight::upload_fused(self.gpu, name, t.ty, n_cols as usize, &[gate, up], true)?;
        self.gpu_bytes += w.gpu_bytes();
        self.advance(&t);
        Ok(GateUp::Interleaved(Arc::new(w)))
    }

    /// Vectors stacked into one f32 buffer (Qwen2's Q, K, V biases), if the file has the
    /// first; then it must have all.
    fn stacked_vectors(&mut self, names: &[(String, u32)]) -> Result<Option<View>, ModelError> {
        if self.f.tensor(&names[0].0).is_none() {
            return Ok(None);
        }
        let mut all = Vec::new();
        for (name, n) in names {
            all.extend(self.vector_data(name, *n)?);
        }
        let buf = self.gpu.upload(&names[0].0, bytemuck::cast_slice(&all))?;
        self.gpu_bytes += buf.size();
        Ok(Some(View::whole(&buf)))
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
        let qk_norms = gemma || hp.arch == Arch::Qwen3;
        let n = |s: &str| format!("blk.{il}.{s}.weight");
        let b = |s: &str| format!("blk.{il}.{s}.bias");
        let mut opt = |want: bool, name: &str, len: u32| -> Result<_, ModelError> {
            want.then(|| self.vector(&n(name), len)).transpose()
        };
        let attn_q_norm = opt(qk_norms, "attn_q_norm", hp.head_dim)?;
        let attn_k_norm = opt(qk_norms, "attn_k_norm", hp.head_dim)?;
        let attn_post_norm = opt(gemma, "post_attention_norm", e)?;
        let ffn_post_norm = opt(gemma, "post_ffw_norm", e)?;
        let attn_norm = self.vector(&n("attn_norm"), e)?;
        // Phi-3 (and some converted files) store Q, K, V as one tensor, already stacked.
        let qkv = if self.f.tensor(&n("attn_qkv")).is_some() {
            vec![self.matrix(&n("attn_qkv"), e, q + 2 * kv)?]
        } else {
            self.stacked(&[(n("attn_q"), q), (n("attn_k"), kv), (n("attn_v"), kv)], e)?
        };
        let qkv_bias =
            self.stacked_vectors(&[(b("attn_q"), q), (b("attn_k"), kv), (b("attn_v"), kv)])?;
        let wo = self.matrix(&n("attn_output"), q, e)?;
        let ffn_norm = self.vector(&n("ffn_norm"), e)?;
        let gate_up = if self.f.tensor(&n("ffn_gate")).is_none() && hp.arch == Arch::Phi3 {
            self.fused_gate_up(&n("ffn_up"), e, ff)?
        } else {
            self.gate_up(&n("ffn_gate"), &n("ffn_up"), e, ff)?
        };
        Ok(LayerWeights {
            attn_q_norm,
            attn_k_norm,
            attn_post_norm,
            ffn_post_norm,
            attn_norm,
            qkv,
            qkv_bias,
            wo,
            ffn_norm,
            gate_up,
            down: self.matrix(&n("ffn_down"), ff, e)?,
        })
    }

    /// A vector's values, as f32 (counted as loaded).
    fn vector_data(&mut self, name: &str, n: u32) -> Result<Vec<f32>, ModelError> {
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
        self.advance(&t);
        Ok(v)
    }

    /// A vector, as f32 on the GPU.
    fn vector(&mut self, name: &str, n: u32) -> Result<View, ModelError> {
        let v = self.vector_data(name, n)?;
        let buf = self.gpu.upload(name, bytemuck::cast_slice(&v))?;
        self.gpu_bytes += buf.size();
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
