//! Uploading the weights: matrices stay quantized (re-laid out per block); norm vectors
//! become f32.

use super::{Arch, Hparams, ModelError};
use crate::gguf::{GgmlType, GgufFile, TensorInfo};
use crate::gpu::{Gpu, Placement};
use crate::ops::{View, Weight};
use crate::quant;
use std::sync::Arc;

pub use crate::ops::{ExpertBiases, Experts, Ffn, GateUp, SharedExpert};

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
    pub ffn: Ffn,
    /// Gemma, Qwen3: RMS norms of each Q and K head ([head_dim]). Gemma: norms of the
    /// attention and feed-forward outputs before their residual adds.
    pub attn_q_norm: Option<View>,
    pub attn_k_norm: Option<View>,
    pub attn_post_norm: Option<View>,
    pub ffn_post_norm: Option<View>,
    /// gpt-oss: one sink logit per head ([n_head]) and the output projection's bias.
    pub attn_sinks: Option<View>,
    pub wo_bias: Option<View>,
}

/// A state-space layer (Mamba, Mamba-2). The input projection is uploaded as its parts,
/// split by rows (x, z and Mamba-2's dt), and so is Mamba's x projection (dt's input, then
/// B and C), so that every matmul writes a whole tensor the next op reads.
pub struct SsmLayer {
    pub norm: View,
    /// Mamba: x; Mamba-2: x, B and C (the convolution's channels).
    pub in_x: Arc<Weight>,
    pub in_z: Arc<Weight>,
    /// Mamba-2: dt per head.
    pub in_dt: Option<Arc<Weight>>,
    /// The convolution's weights [d_conv, channels] and bias.
    pub conv: View,
    pub conv_b: View,
    /// Mamba: the projections of the convolution's output to dt's input and to B and C,
    /// and dt's own projection.
    pub x_dt: Option<Arc<Weight>>,
    pub x_bc: Option<Arc<Weight>>,
    pub dt: Option<Arc<Weight>>,
    /// A, D and the dt bias in one buffer (the scan's constants): A first (d_state per
    /// channel for Mamba, one per head for Mamba-2), then D and the bias (one per head).
    pub consts: View,
    /// Mamba-2: the gated output's norm weights, one group after another [d_inner].
    pub out_norm: Option<View>,
    pub out: Arc<Weight>,
}

/// An LFM2 layer: a norm, its mixer (attention or the gated short convolution), and a
/// SwiGLU feed-forward after its own norm.
pub struct Lfm2Layer {
    pub attn_norm: View,
    pub mixer: Lfm2Mixer,
    pub ffn_norm: View,
    pub gate_up: GateUp,
    pub down: Arc<Weight>,
}

pub enum Lfm2Mixer {
    /// Q, K, V stacked (see `LayerWeights::qkv`), the output projection, and per-head Q
    /// and K norms.
    Attention {
        qkv: Vec<Arc<Weight>>,
        wo: Arc<Weight>,
        q_norm: View,
        k_norm: View,
    },
    /// The input projection's three parts (the gate B, the output gate C and x), the
    /// convolution's weights [width, n_embd] and the output projection.
    Conv {
        in_b: Arc<Weight>,
        in_c: Arc<Weight>,
        in_x: Arc<Weight>,
        conv: View,
        out: Arc<Weight>,
    },
}

/// A BERT encoder's weights besides the token embeddings.
pub struct BertWeights {
    /// Learned absolute positions, a row per position up to the trained context.
    pub pos_embd: Arc<Weight>,
    /// Row 0 of the token-type embeddings, which llama.cpp adds to every token.
    pub type_embd: Option<View>,
    /// The embeddings' layer norm (weight, bias).
    pub embd_norm: (View, View),
    pub layers: Vec<BertLayer>,
    /// A reranker's classifier head over the first token's state (llama.cpp's `cls`
    /// (dense, then tanh) and `cls.output`, either optional), if the file has one.
    pub classifier: Option<Classifier>,
}

/// A classifier head: an optional dense layer with tanh, then an optional projection to
/// the scores; each a matrix and its bias.
pub struct Classifier {
    pub dense: Option<(Arc<Weight>, View)>,
    pub out: Option<(Arc<Weight>, View)>,
}

/// One BERT block: biased attention, then a GELU feed-forward, each closed by a residual
/// add and a layer norm (post-norm).
pub struct BertLayer {
    pub qkv: Vec<Arc<Weight>>,
    /// Q, K and V biases, stacked as the Q/K/V rows.
    pub qkv_bias: View,
    pub wo: Arc<Weight>,
    pub wo_bias: View,
    pub attn_out_norm: (View, View),
    pub up: Arc<Weight>,
    pub up_bias: View,
    pub down: Arc<Weight>,
    pub down_bias: View,
    pub out_norm: (View, View),
}

pub struct ModelWeights {
    pub tok_embd: Arc<Weight>,
    /// The final norm before the output head (none in an encoder, which has no head).
    pub output_norm: Option<View>,
    /// The output projection; the embedding itself when the model ties them.
    pub output: Arc<Weight>,
    pub layers: Vec<LayerWeights>,
    /// The state-space layers of a Mamba or Mamba-2 model (empty otherwise).
    pub ssm: Vec<SsmLayer>,
    /// The layers of an LFM2 model (empty otherwise).
    pub lfm2: Vec<Lfm2Layer>,
    /// A BERT encoder's positions, norms and layers.
    pub bert: Option<BertWeights>,
    /// A decoder reranker's head (Qwen3-Reranker as llama.cpp's converter writes it: the
    /// output rows of its label tokens, `cls.output`), over the final norm's output.
    pub cls_out: Option<Arc<Weight>>,
    /// One f32 the embeddings are multiplied by (Gemma), broadcast by the graph.
    pub embd_scale: Option<View>,
    /// One f32 the output logits are soft-capped at (Gemma 2).
    pub logit_softcap: Option<View>,
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
        if quant::format(t.ty).is_none() {
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
        let gemma = matches!(hp.arch, Arch::Gemma2 | Arch::Gemma3);
        let qk_norms = matches!(hp.arch, Arch::Gemma3 | Arch::Qwen3);
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
        let gpt_oss = hp.arch == Arch::GptOss;
        let (attn_sinks, wo_bias) = match gpt_oss {
            true => (
                Some(self.vector(&n("attn_sinks"), hp.n_head)?),
                Some(self.vector(&b("attn_output"), e)?),
            ),
            false => (None, None),
        };
        // gpt-oss's converter names the feed-forward's norm `post_attention_norm`.
        let ffn_norm = match gpt_oss {
            true => self.vector(&n("post_attention_norm"), e)?,
            false => self.vector(&n("ffn_norm"), e)?,
        };
        let ffn = if let Some(moe) = hp.moe {
            let (ne, ff) = (moe.routing.n_expert, moe.n_ff_exp);
            Ffn::Experts(Box::new(Experts {
                routing: moe.routing,
                gate_inp: self.matrix(&n("ffn_gate_inp"), e, ne)?,
                gate: self.experts(&n("ffn_gate_exps"), e, ff, ne)?,
                up: self.experts(&n("ffn_up_exps"), e, ff, ne)?,
                down: self.experts(&n("ffn_down_exps"), ff, e, ne)?,
                shared: match moe.n_ff_shexp {
                    0 => None,
                    sf => Some(SharedExpert {
                        gate_inp: self.vector_weight(&n("ffn_gate_inp_shexp"), e)?,
                        gate_up: self.gate_up(&n("ffn_gate_shexp"), &n("ffn_up_shexp"), e, sf)?,
                        down: self.matrix(&n("ffn_down_shexp"), sf, e)?,
                    }),
                },
                bias: match self.f.tensor(&b("ffn_gate_inp")) {
                    None => None,
                    Some(_) => Some(ExpertBiases {
                        gate_inp: self.vector(&b("ffn_gate_inp"), ne)?,
                        gate: self.expert_vectors(&b("ffn_gate_exps"), ff, ne)?,
                        up: self.expert_vectors(&b("ffn_up_exps"), ff, ne)?,
                        down: self.expert_vectors(&b("ffn_down_exps"), e, ne)?,
                    }),
                },
            }))
        } else {
            let gate_up = if self.f.tensor(&n("ffn_gate")).is_none() && hp.arch == Arch::Phi3 {
                self.fused_gate_up(&n("ffn_up"), e, ff)?
            } else {
                self.gate_up(&n("ffn_gate"), &n("ffn_up"), e, ff)?
            };
            Ffn::Dense {
                gate_up,
                down: self.matrix(&n("ffn_down"), ff, e)?,
            }
        };
        Ok(LayerWeights {
            attn_q_norm,
            attn_k_norm,
            attn_post_norm,
            ffn_post_norm,
            attn_sinks,
            wo_bias,
            attn_norm,
            qkv,
            qkv_bias,
            wo,
            ffn_norm,
            ffn,
        })
    }

    /// A mixture-of-experts tensor [n_cols, rows, n_expert], the experts stacked (see
    /// [`Weight::upload_experts`]).
    fn experts(
        &mut self,
        name: &str,
        n_cols: u32,
        rows: u32,
        n_expert: u32,
    ) -> Result<Arc<Weight>, ModelError> {
        let t = self
            .info(name, &[n_cols as u64, rows as u64, n_expert as u64])?
            .clone();
        if quant::format(t.ty).is_none() {
            return Err(ModelError::UnsupportedType {
                path: self.f.path.clone(),
                tensor: name.into(),
                ty: t.ty,
            });
        }
        let w = Weight::upload_experts(
            self.gpu,
            name,
            t.ty,
            n_cols as usize,
            rows as usize,
            n_expert as usize,
            self.f.tensor_data(&t),
        )?;
        self.gpu_bytes += w.gpu_bytes();
        self.advance(&t);
        Ok(Arc::new(w))
    }

    /// Rows `rows` of a matrix [n_cols, n_rows] as a weight of their own.
    fn matrix_rows(
        &mut self,
        name: &str,
        n_cols: u32,
        n_rows: u32,
        rows: std::ops::Range<u32>,
    ) -> Result<Arc<Weight>, ModelError> {
        self.matrix_rows_padded(name, n_cols, n_rows, rows.clone(), rows.len() as u32)
    }

    /// [`Self::matrix_rows`] with zero rows after them up to `out_rows` (all-zero bytes
    /// are zeros in every format).
    fn matrix_rows_padded(
        &mut self,
        name: &str,
        n_cols: u32,
        n_rows: u32,
        rows: std::ops::Range<u32>,
        out_rows: u32,
    ) -> Result<Arc<Weight>, ModelError> {
        let t = self.matrix_info(name, n_cols, n_rows)?;
        let row = t.ty.row_bytes(n_cols as u64).unwrap_or(0) as usize;
        let mut data =
            self.f.tensor_data(&t)[rows.start as usize * row..rows.end as usize * row].to_vec();
        data.resize(out_rows as usize * row, 0);
        let part = format!("{name}[{}..{}]", rows.start, rows.end);
        let w = Weight::upload(
            self.gpu,
            &part,
            t.ty,
            n_cols as usize,
            out_rows as usize,
            &data,
        )?;
        self.gpu_bytes += w.gpu_bytes();
        if rows.end == n_rows {
            self.advance(&t);
        }
        Ok(Arc::new(w))
    }

    /// A matrix [n_cols, n_rows] as an f32 weight with zero columns up to `out_cols`
    /// (any type the loader dequantizes).
    fn matrix_padded_cols(
        &mut self,
        name: &str,
        n_cols: u32,
        n_rows: u32,
        out_cols: u32,
    ) -> Result<Arc<Weight>, ModelError> {
        if n_cols == out_cols {
            return self.matrix(name, n_cols, n_rows);
        }
        let v = self.values(name, &[n_cols as u64, n_rows as u64])?;
        let mut padded = vec![0f32; out_cols as usize * n_rows as usize];
        for (dst, src) in padded
            .chunks_mut(out_cols as usize)
            .zip(v.chunks(n_cols as usize))
        {
            dst[..n_cols as usize].copy_from_slice(src);
        }
        let data: &[u8] = bytemuck::cast_slice(&padded);
        let w = Weight::upload(
            self.gpu,
            name,
            GgmlType::F32,
            out_cols as usize,
            n_rows as usize,
            data,
        )?;
        self.gpu_bytes += w.gpu_bytes();
        Ok(Arc::new(w))
    }

    /// A tensor of any shape `dims` as f32 values (counted as loaded).
    fn values(&mut self, name: &str, dims: &[u64]) -> Result<Vec<f32>, ModelError> {
        let t = self.info(name, dims)?.clone();
        if !matches!(t.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16) {
            return Err(ModelError::UnsupportedType {
                path: self.f.path.clone(),
                tensor: name.into(),
                ty: t.ty,
            });
        }
        let mut v = vec![0f32; dims.iter().product::<u64>() as usize];
        quant::dequantize_row(t.ty, self.f.tensor_data(&t), &mut v);
        self.advance(&t);
        Ok(v)
    }

    fn upload_values(&mut self, name: &str, v: &[f32]) -> Result<View, ModelError> {
        let buf = self.gpu.upload(name, bytemuck::cast_slice(v))?;
        self.gpu_bytes += buf.size();
        Ok(View::whole(&buf))
    }

    /// State-space layer `il` (Mamba or Mamba-2; tensor shapes as llama.cpp loads them).
    fn ssm_layer(&mut self, hp: &Hparams, il: u32) -> Result<SsmLayer, ModelError> {
        let s = hp.ssm.expect("a state-space model has its sizes");
        let (e, di, ds, r) = (hp.n_embd, s.d_inner, s.d_state, s.dt_rank);
        let ch = s.conv_channels(hp.arch);
        let (dc, ec) = (s.d_conv as u64, ch as u64);
        let n = |t: &str| format!("blk.{il}.{t}.weight");
        let b = |t: &str| format!("blk.{il}.{t}.bias");
        let norm = self.vector(&n("attn_norm"), e)?;
        let conv = self.values(&n("ssm_conv1d"), &[dc, ec])?;
        let conv = self.upload_values(&n("ssm_conv1d"), &conv)?;
        let conv_b = self.vector(&b("ssm_conv1d"), ch)?;
        let a_name = format!("blk.{il}.ssm_a");
        let d_name = format!("blk.{il}.ssm_d");
        let mamba2 = hp.arch == Arch::Mamba2;
        let layer = if mamba2 {
            // z, then x B C, then dt per head.
            let rows = 2 * di + 2 * s.n_group * ds + r;
            let name = n("ssm_in");
            let in_z = self.matrix_rows(&name, e, rows, 0..di)?;
            let in_x = self.matrix_rows(&name, e, rows, di..di + ch)?;
            let in_dt = Some(self.matrix_rows(&name, e, rows, di + ch..rows)?);
            let mut consts = self.values(&a_name, &[1, r as u64])?;
            consts.extend(self.values(&d_name, &[1, r as u64])?);
            consts.extend(self.vector_data(&b("ssm_dt"), r)?);
            let g = di / s.n_group;
            let on = self.values(&n("ssm_norm"), &[g as u64, s.n_group as u64])?;
            SsmLayer {
                norm,
                in_x,
                in_z,
                in_dt,
                conv,
                conv_b,
                x_dt: None,
                x_bc: None,
                dt: None,
                consts: self.upload_values(&a_name, &consts)?,
                out_norm: Some(self.upload_values(&n("ssm_norm"), &on)?),
                out: self.matrix(&n("ssm_out"), di, e)?,
            }
        } else {
            let name = n("ssm_in");
            let in_x = self.matrix_rows(&name, e, 2 * di, 0..di)?;
            let in_z = self.matrix_rows(&name, e, 2 * di, di..2 * di)?;
            // dt's rank (ceil(n_embd / 16): 48 for Mamba-130M) is rarely whole blocks of
            // 32 for the matmul; its input gets zero rows and its projection zero columns
            // up to the next multiple (adding exact zeros to each dot product).
            let rp = r.next_multiple_of(32);
            let xn = n("ssm_x");
            let x_dt = Some(self.matrix_rows_padded(&xn, di, r + 2 * ds, 0..r, rp)?);
            let x_bc = Some(self.matrix_rows(&xn, di, r + 2 * ds, r..r + 2 * ds)?);
            let mut consts = self.values(&a_name, &[ds as u64, di as u64])?;
            consts.extend(self.vector_data(&d_name, di)?);
            consts.extend(self.vector_data(&b("ssm_dt"), di)?);
            SsmLayer {
                norm,
                in_x,
                in_z,
                in_dt: None,
                conv,
                conv_b,
                x_dt,
                x_bc,
                dt: Some(self.matrix_padded_cols(&n("ssm_dt"), r, di, rp)?),
                consts: self.upload_values(&a_name, &consts)?,
                out_norm: None,
                out: self.matrix(&n("ssm_out"), di, e)?,
            }
        };
        Ok(layer)
    }

    /// LFM2 layer `il`: attention where the file gives it KV heads, else the gated short
    /// convolution.
    fn lfm2_layer(&mut self, hp: &Hparams, il: u32) -> Result<Lfm2Layer, ModelError> {
        let (e, q, kv, ff) = (hp.n_embd, hp.n_embd_q(), hp.n_embd_kv(), hp.n_ff);
        let n = |s: &str| format!("blk.{il}.{s}.weight");
        let attn_norm = self.vector(&n("attn_norm"), e)?;
        let mixer = if hp.is_recurrent(il as usize) {
            let name = n("shortconv.in_proj");
            let l = hp.shortconv_l_cache;
            let conv = self.values(&n("shortconv.conv"), &[l as u64, e as u64])?;
            Lfm2Mixer::Conv {
                in_b: self.matrix_rows(&name, e, 3 * e, 0..e)?,
                in_c: self.matrix_rows(&name, e, 3 * e, e..2 * e)?,
                in_x: self.matrix_rows(&name, e, 3 * e, 2 * e..3 * e)?,
                conv: self.upload_values(&n("shortconv.conv"), &conv)?,
                out: self.matrix(&n("shortconv.out_proj"), e, e)?,
            }
        } else {
            let qkv = if self.f.tensor(&n("attn_qkv")).is_some() {
                vec![self.matrix(&n("attn_qkv"), e, q + 2 * kv)?]
            } else {
                self.stacked(&[(n("attn_q"), q), (n("attn_k"), kv), (n("attn_v"), kv)], e)?
            };
            Lfm2Mixer::Attention {
                qkv,
                wo: self.matrix(&n("attn_output"), q, e)?,
                q_norm: self.vector(&n("attn_q_norm"), hp.head_dim)?,
                k_norm: self.vector(&n("attn_k_norm"), hp.head_dim)?,
            }
        };
        Ok(Lfm2Layer {
            attn_norm,
            mixer,
            ffn_norm: self.vector(&n("ffn_norm"), e)?,
            gate_up: self.gate_up(&n("ffn_gate"), &n("ffn_up"), e, ff)?,
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

    /// Per-expert vectors [n, n_expert] (gpt-oss's expert biases), as f32 on the GPU.
    fn expert_vectors(&mut self, name: &str, n: u32, n_expert: u32) -> Result<View, ModelError> {
        let v = self.values(name, &[n as u64, n_expert as u64])?;
        self.upload_values(name, &v)
    }

    /// A vector [n] as an f32 weight of one row (a projection to one value per token).
    fn vector_weight(&mut self, name: &str, n: u32) -> Result<Arc<Weight>, ModelError> {
        let v = self.vector_data(name, n)?;
        let w = Weight::upload(
            self.gpu,
            name,
            GgmlType::F32,
            n as usize,
            1,
            bytemuck::cast_slice(&v),
        )?;
        self.gpu_bytes += w.gpu_bytes();
        Ok(Arc::new(w))
    }

    /// A BERT encoder's weights (tensor names as llama.cpp's converter writes them).
    fn bert(&mut self, hp: &Hparams) -> Result<BertWeights, ModelError> {
        let e = hp.n_embd;
        let pos_embd = self.matrix("position_embd.weight", e, hp.n_ctx_train)?;
        let type_embd = match self.f.tensor("token_types.weight") {
            None => None,
            Some(t) => {
                let n_types = t.dims.get(1).copied().unwrap_or(0);
                let v = self.values("token_types.weight", &[e as u64, n_types])?;
                match v.get(..e as usize) {
                    Some(row) => Some(self.upload_values("token_types.weight[0]", row)?),
                    None => {
                        return Err(ModelError::BadShape {
                            path: self.f.path.clone(),
                            tensor: "token_types.weight".into(),
                            got: t.dims.clone(),
                            want: vec![e as u64, 1],
                        })
                    }
                }
            }
        };
        let norm = |l: &mut Self, name: &str| -> Result<(View, View), ModelError> {
            Ok((
                l.vector(&format!("{name}.weight"), e)?,
                l.vector(&format!("{name}.bias"), e)?,
            ))
        };
        let embd_norm = norm(self, "token_embd_norm")?;
        let mut layers = Vec::with_capacity(hp.n_layer as usize);
        for il in 0..hp.n_layer {
            let (q, kv, ff) = (hp.n_embd_q(), hp.n_embd_kv(), hp.n_ff);
            let n = |s: &str| format!("blk.{il}.{s}.weight");
            let b = |s: &str| format!("blk.{il}.{s}.bias");
            let qkv = if self.f.tensor(&n("attn_qkv")).is_some() {
                vec![self.matrix(&n("attn_qkv"), e, q + 2 * kv)?]
            } else {
                self.stacked(&[(n("attn_q"), q), (n("attn_k"), kv), (n("attn_v"), kv)], e)?
            };
            let qkv_bias = if self.f.tensor(&b("attn_qkv")).is_some() {
                self.vector(&b("attn_qkv"), q + 2 * kv)?
            } else {
                let names = [(b("attn_q"), q), (b("attn_k"), kv), (b("attn_v"), kv)];
                match self.stacked_vectors(&names)? {
                    Some(v) => v,
                    None => {
                        return Err(ModelError::MissingTensor {
                            path: self.f.path.clone(),
                            tensor: b("attn_q"),
                        })
                    }
                }
            };
            layers.push(BertLayer {
                qkv,
                qkv_bias,
                wo: self.matrix(&n("attn_output"), q, e)?,
                wo_bias: self.vector(&b("attn_output"), e)?,
                attn_out_norm: norm(self, &format!("blk.{il}.attn_output_norm"))?,
                up: self.matrix(&n("ffn_up"), e, ff)?,
                up_bias: self.vector(&b("ffn_up"), ff)?,
                down: self.matrix(&n("ffn_down"), ff, e)?,
                down_bias: self.vector(&b("ffn_down"), e)?,
                out_norm: norm(self, &format!("blk.{il}.layer_output_norm"))?,
            });
        }
        let part = |l: &mut Self, name: &str, rows: u32| -> Result<_, ModelError> {
            if l.f.tensor(&format!("{name}.weight")).is_none() {
                return Ok(None);
            }
            Ok(Some((
                l.matrix(&format!("{name}.weight"), e, rows)?,
                l.vector(&format!("{name}.bias"), rows)?,
            )))
        };
        let dense = part(self, "cls", e)?;
        let out = part(self, "cls.output", hp.n_cls_out)?;
        let classifier = (dense.is_some() || out.is_some()).then_some(Classifier { dense, out });
        Ok(BertWeights {
            pos_embd,
            type_embd,
            embd_norm,
            layers,
            classifier,
        })
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

impl<'a> ModelWeights {
    /// Uploads every weight: each layer's to its device in `placement`, the embeddings,
    /// final norm and output head to the main device.
    pub fn load(
        placement: &'a Placement,
        f: &GgufFile,
        hp: &Hparams,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self, ModelError> {
        let gpu = &**placement.main();
        let total = (f.tensors.iter()).fold(0u64, |a, t| a.saturating_add(t.n_bytes));
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
        // LFM2's converter names the final norm `token_embd_norm`; BERT has none.
        let output_norm = match hp.arch {
            Arch::Lfm2 => Some(l.vector("token_embd_norm.weight", e)?),
            Arch::Bert => None,
            _ => Some(l.vector("output_norm.weight", e)?),
        };
        let output = if f.tensor("output.weight").is_some() {
            l.matrix("output.weight", e, hp.n_vocab)?
        } else {
            tok_embd.clone()
        };
        // llama.cpp loads this head for Qwen3 only.
        let cls_out = match (hp.arch, f.tensor("cls.output.weight")) {
            (Arch::Qwen3, Some(_)) => Some(l.matrix("cls.output.weight", e, hp.n_cls_out)?),
            _ => None,
        };
        let ssm_model = matches!(hp.arch, Arch::Mamba | Arch::Mamba2);
        let lfm2_model = hp.arch == Arch::Lfm2;
        let bert = match hp.arch {
            Arch::Bert => Some(l.bert(hp)?),
            _ => None,
        };
        // Each layer on its device.
        let lfm2 = (0..hp.n_layer)
            .filter(|_| lfm2_model)
            .map(|il| {
                l.gpu = placement.layer(il as usize);
                l.lfm2_layer(hp, il)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let layers = (0..hp.n_layer)
            .filter(|_| !ssm_model && !lfm2_model && bert.is_none())
            .map(|il| {
                l.gpu = placement.layer(il as usize);
                l.layer(hp, il)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let ssm = (0..hp.n_layer)
            .filter(|_| ssm_model)
            .map(|il| {
                l.gpu = placement.layer(il as usize);
                l.ssm_layer(hp, il)
            })
            .collect::<Result<Vec<_>, _>>()?;
        l.gpu = gpu;
        let embd_scale = match hp.embd_scale {
            Some(s) => Some(View::whole(
                &gpu.upload("embd_scale", bytemuck::bytes_of(&s))?,
            )),
            None => None,
        };
        let logit_softcap = match hp.final_softcap {
            c if c > 0.0 => Some(View::whole(
                &gpu.upload("logit_softcap", bytemuck::bytes_of(&c))?,
            )),
            _ => None,
        };
        for g in placement.gpus() {
            g.flush()?;
        }
        Ok(ModelWeights {
            tok_embd,
            output_norm,
            output,
            layers,
            ssm,
            lfm2,
            bert,
            cls_out,
            embd_scale,
            logit_softcap,
            gpu_bytes: l.gpu_bytes,
        })
    }
}
