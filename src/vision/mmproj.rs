//! An mmproj file: the `clip.*` hyperparameters and the `v.*` / `mm.*` tensors of a vision
//! encoder and its projector, as llama.cpp's `clip.cpp` reads them, uploaded for the
//! encoder's graph. Matrices whose rows are not whole blocks of 32 (SigLIP's patch
//! kernel of 3 x 14 x 14, its feed-forward of 4304) are padded with zeros here, so the
//! matmuls see whole blocks and the padding adds nothing.

use super::VisionError;
use crate::gguf::{GgmlType, GgufFile};
use crate::gpu::Gpu;
use crate::ops::{View, Weight};
use crate::quant;
use std::sync::Arc;

/// The projectors wgllm runs (llama.cpp's `clip.projector_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Projector {
    /// Gemma 3: SigLIP's patch grid averaged by square cells (4 x 4: 256 tokens at 896
    /// pixels), RMS-normed, projected to the language model's width.
    Gemma3,
    /// SmolVLM (Idefics 3): the image cut into tiles of the encoder's square plus a
    /// global view, each tile's patch grid pixel-shuffled (cells of `merge` x `merge`
    /// patches into one token) and projected by one matrix.
    Idefics3,
    /// Qwen2.5-VL (`qwen2.5vl_merger`): the image read at its own size in cells of 2 x 2
    /// patches, RMS norms, SiLU-gated feed-forwards, 2D rotary positions, attention within
    /// windows of cells but every `n_wa_pattern`-th layer, and each cell's four patches
    /// merged by a two-layer MLP into one token.
    Qwen25vl,
}

impl Projector {
    fn by_name(name: &str) -> Option<Self> {
        match name {
            "gemma3" => Some(Projector::Gemma3),
            "idefics3" => Some(Projector::Idefics3),
            "qwen2.5vl_merger" => Some(Projector::Qwen25vl),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Projector::Gemma3 => "gemma3",
            Projector::Idefics3 => "idefics3",
            Projector::Qwen25vl => "qwen2.5vl_merger",
        }
    }

    /// Whether the encoder reads an image at its own size (rounded to whole cells)
    /// rather than fitted into its square.
    pub fn dynamic_size(self) -> bool {
        self == Projector::Qwen25vl
    }
}

/// How an encoder that reads images at their own size bounds them (llama.cpp's
/// `image_min_pixels` / `image_max_pixels` and its window attention).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DynamicSize {
    /// Pixels an image is resized to at least and at most (8 and 4096 tokens of 28 x 28
    /// pixels for Qwen2.5-VL, as llama.cpp sets them whatever the file says; the user's
    /// `--image-min-tokens` / `--image-max-tokens` and the device bound them too).
    pub min_pixels: u32,
    pub max_pixels: u32,
    /// Every `n_wa_pattern`-th layer attends over the whole image, the others within
    /// windows (`clip.vision.n_wa_pattern`; 0: every layer over the whole image).
    pub n_wa_pattern: u32,
    /// A window's side in cells: llama.cpp's 112 pixels in whole cells (4 of 28).
    pub window_cells: u32,
}

/// The vision encoder's shape and preprocessing.
#[derive(Clone, Debug, PartialEq)]
pub struct ClipHparams {
    pub projector: Projector,
    /// The square the image is fitted into, and the patch side.
    pub image_size: u32,
    pub patch_size: u32,
    pub n_embd: u32,
    pub n_ff: u32,
    pub n_layer: u32,
    pub n_head: u32,
    pub head_dim: u32,
    pub eps: f32,
    pub image_mean: [f32; 3],
    pub image_std: [f32; 3],
    /// Side of the projector's pooling or shuffling cell (Gemma 3's 4, SmolVLM's 4).
    pub merge: u32,
    /// The longest side an image is resized to before it is cut into tiles (SmolVLM's
    /// `clip.vision.preproc_image_size`); 0 for a projector that does not tile.
    pub longest_edge: u32,
    /// The bounds of an encoder that reads images at their own size (Qwen2.5-VL).
    pub dynamic: Option<DynamicSize>,
}

impl ClipHparams {
    /// Patches across (and down) the square.
    pub fn patches_per_side(&self) -> u32 {
        self.image_size / self.patch_size
    }
    /// Image tokens per image the encoder reads (per tile, for a tiling projector; for
    /// one that reads images at their own size, those of an image of its square).
    pub fn n_tokens(&self) -> u32 {
        let side = self.patches_per_side().div_ceil(self.merge.max(1));
        side * side
    }

    /// Reads and checks the keys, with the file's path in every error.
    pub fn read(f: &GgufFile) -> Result<Self, VisionError> {
        let bad = |msg: String| VisionError::Mmproj {
            path: f.path.clone(),
            msg,
        };
        let has_vision = f.get("clip.has_vision_encoder").and_then(|v| v.as_bool());
        if has_vision != Some(true) {
            return Err(bad(
                "has no vision encoder (clip.has_vision_encoder is not true): is this an mmproj file for images?".into(),
            ));
        }
        let name = match f.get_str("clip.projector_type") {
            Ok(s) => s.to_string(),
            Err(_) => f.get_str("clip.vision.projector_type")?.to_string(),
        };
        let projector = Projector::by_name(&name).ok_or_else(|| {
            bad(format!(
                "projector `{name}` is not one wgllm runs yet (it runs: gemma3, idefics3, qwen2.5vl_merger)"
            ))
        })?;
        let u = |k: &str| -> Result<u32, VisionError> {
            let v = f.get_u64(&format!("clip.vision.{k}"))?;
            u32::try_from(v).map_err(|_| bad(format!("clip.vision.{k} = {v} is out of range")))
        };
        let (n_embd, n_head) = (u("embedding_length")?, u("attention.head_count")?);
        let head_dim = match f.get("clip.vision.attention.head_dim") {
            Some(_) => u("attention.head_dim")?,
            None if n_head > 0 => n_embd / n_head,
            None => 0,
        };
        let triple = |k: &str| -> Result<[f32; 3], VisionError> {
            let a = f.get_array(&format!("clip.vision.{k}"))?;
            let v: Vec<f32> = a
                .iter()
                .filter_map(|v| v.as_f64())
                .map(|v| v as f32)
                .collect();
            if v.len() < 3 || v.len() != a.len() {
                return Err(bad(format!("clip.vision.{k} should hold 3 numbers")));
            }
            Ok([v[0], v[1], v[2]])
        };
        let hp = ClipHparams {
            projector,
            image_size: u("image_size")?,
            patch_size: u("patch_size")?,
            n_embd,
            n_ff: u("feed_forward_length")?,
            n_layer: u("block_count")?,
            n_head,
            head_dim,
            eps: f.get_f32("clip.vision.attention.layer_norm_epsilon")?,
            image_mean: triple("image_mean")?,
            image_std: triple("image_std")?,
            merge: match (f.get("clip.vision.projector.scale_factor"), projector) {
                (Some(_), _) => u("projector.scale_factor")?,
                (None, Projector::Gemma3) => 4,
                (None, Projector::Idefics3) => {
                    return Err(bad(
                        "has no clip.vision.projector.scale_factor, which an idefics3 projector needs (llama.cpp's converter writes it)".into(),
                    ))
                }
                (None, Projector::Qwen25vl) => match f.get("clip.vision.spatial_merge_size") {
                    Some(_) => u("spatial_merge_size")?,
                    None => 2,
                },
            },
            longest_edge: match projector {
                Projector::Gemma3 | Projector::Qwen25vl => 0,
                Projector::Idefics3 => match f.get("clip.vision.preproc_image_size") {
                    Some(_) => u("preproc_image_size")?,
                    None => {
                        return Err(bad(
                            "has no clip.vision.preproc_image_size (the longest side images are resized to before tiling), which llama.cpp's converter writes: convert the model again with a recent llama.cpp".into(),
                        ))
                    }
                },
            },
            dynamic: None,
        };
        let flag = |k: &str| f.get(k).and_then(|v| v.as_bool()) == Some(true);
        let hp = match projector {
            Projector::Qwen25vl => {
                // Qwen2.5-VL's converter writes use_silu: its feed-forwards are SiLU-gated.
                if !flag("clip.use_silu") {
                    return Err(bad(
                        "clip.use_silu is not set: a qwen2.5vl_merger encoder's feed-forward is SiLU-gated (llama.cpp's converter writes the key)".into(),
                    ));
                }
                // llama.cpp's window of 112 pixels in whole cells, and its 8 to 4096 tokens
                // (it reads neither from the file for this projector).
                let p = hp.patch_size;
                if p == 0 || p > 56 {
                    return Err(bad(format!(
                        "patches of {p} pixels: a qwen2.5vl_merger encoder's attention windows of 112 pixels need patches of 1 to 56"
                    )));
                }
                let cell = p * 2;
                let n_wa_pattern = match f.get("clip.vision.n_wa_pattern") {
                    Some(_) => u("n_wa_pattern")?,
                    None => {
                        return Err(bad(
                            "has no clip.vision.n_wa_pattern (which layers attend over the whole image), which a qwen2.5vl_merger encoder needs (llama.cpp's converter writes it)".into(),
                        ))
                    }
                };
                ClipHparams {
                    dynamic: Some(DynamicSize {
                        min_pixels: 8 * cell * cell,
                        max_pixels: 4096 * cell * cell,
                        n_wa_pattern,
                        window_cells: 112 / cell,
                    }),
                    ..hp
                }
            }
            // llama.cpp falls back to GELU-quick without `clip.use_gelu`; SigLIP files
            // have it.
            _ if !flag("clip.use_gelu") => {
                return Err(bad(
                    "clip.use_gelu is not set: its encoder would use GELU-quick or SiLU, which wgllm does not run yet".into(),
                ))
            }
            _ => hp,
        };
        hp.check().map_err(bad)?;
        Ok(hp)
    }

    /// Shapes the graph can be built for.
    fn check(&self) -> Result<(), String> {
        let (p, side) = (self.patch_size, self.image_size);
        if p == 0 || side == 0 || side > 8192 || !side.is_multiple_of(p) {
            return Err(format!(
                "an image of {side} pixels is not whole patches of {p}"
            ));
        }
        if self.n_head == 0
            || self.head_dim * self.n_head != self.n_embd
            || !self.head_dim.is_multiple_of(4)
        {
            return Err(format!(
                "{} heads of {} do not make the width {} in heads of a multiple of 4",
                self.n_head, self.head_dim, self.n_embd
            ));
        }
        if !self.n_embd.is_multiple_of(32) {
            return Err(format!("width {} is not a multiple of 32", self.n_embd));
        }
        match self.projector {
            Projector::Gemma3 => {
                if self.merge == 0 || !self.patches_per_side().is_multiple_of(self.merge) {
                    return Err(format!(
                        "{} patches a side do not pool by {}",
                        self.patches_per_side(),
                        self.merge
                    ));
                }
            }
            Projector::Idefics3 => {
                if !(2..=16).contains(&self.merge) {
                    return Err(format!(
                        "a pixel shuffle by {} (llama.cpp takes 2 or more)",
                        self.merge
                    ));
                }
                if self.longest_edge < side || self.longest_edge > 8192 {
                    return Err(format!(
                        "images resized to {} pixels, not between the tile's {side} and 8192",
                        self.longest_edge
                    ));
                }
                // SmolVLM's files cut at most 4 tiles a side; a bound keeps one image's
                // tiles (and its preprocessing) small whatever the file says.
                if self.longest_edge.div_ceil(side) > 16 {
                    return Err(format!(
                        "images resized to {} pixels make more than 16 tiles of {side} a side",
                        self.longest_edge
                    ));
                }
            }
            Projector::Qwen25vl => {
                // llama.cpp's graph merges by 2 whatever the file says.
                if self.merge != 2 {
                    return Err(format!(
                        "a spatial merge of {} (the qwen2.5vl_merger graph merges cells of 2 x 2 patches)",
                        self.merge
                    ));
                }
                if !self.head_dim.is_multiple_of(4) {
                    return Err(format!(
                        "heads of {} do not split into 4 rotary sections",
                        self.head_dim
                    ));
                }
            }
        }
        if self.n_layer == 0 || self.n_ff == 0 {
            return Err("no layers".into());
        }
        if self.image_std.contains(&0.0) {
            return Err("an image_std of 0".into());
        }
        Ok(())
    }
}

/// One block of the vision transformer.
pub struct VitLayer {
    pub ln1: (View, View),
    /// Q, K and V stacked by rows, with their biases.
    pub qkv: Vec<Arc<Weight>>,
    pub qkv_bias: View,
    pub wo: Arc<Weight>,
    pub wo_bias: View,
    pub ln2: (View, View),
    /// The feed-forward's input projection, its rows (and bias) padded with zeros to a
    /// multiple of 32, and the output projection, its columns padded to match.
    pub up: Arc<Weight>,
    pub up_bias: View,
    pub down: Arc<Weight>,
    pub down_bias: View,
    /// The feed-forward's gate and its bias, padded as `up` (Qwen2.5-VL's SiLU-gated
    /// feed-forward; `None` for GELU on `up` alone).
    pub gate: Option<(Arc<Weight>, View)>,
}

/// The encoder's and projector's weights on the device.
pub struct VisionWeights {
    /// The patch kernel as [C * P * P (padded), n_embd]: f16 unless the file's is bf16,
    /// as llama.cpp's convolution multiplies f16 pixel patches by an f16 kernel.
    pub patch_embd: Arc<Weight>,
    pub patch_f16: bool,
    pub patch_bias: View,
    /// [n_embd, n_patches]; `None` where positions rotate instead (Qwen2.5-VL).
    pub pos_embd: Option<View>,
    pub layers: Vec<VitLayer>,
    pub post_ln: Option<(View, View)>,
    /// Gemma 3: the RMS norm's weight (ones for other projectors).
    pub soft_emb_norm: View,
    /// The projection to the language model's width: [n_embd] -> [n_out] (Gemma 3), or
    /// [n_embd * merge²] -> [n_out] after the pixel shuffle (SmolVLM).
    pub projection: Arc<Weight>,
    /// Qwen2.5-VL's merger: its first layer ([4 n_embd] -> [4 n_embd]) and bias, before
    /// the GELU and `projection`.
    pub merger: Option<(Arc<Weight>, View)>,
    /// The projection's bias (Qwen2.5-VL's merger).
    pub projection_bias: Option<View>,
    /// The language model's width the embeddings have.
    pub n_out: u32,
}

/// Multiple of 32 at or above `n`.
fn pad32(n: u32) -> u32 {
    n.div_ceil(32) * 32
}

struct Loader<'a> {
    gpu: &'a Gpu,
    f: &'a GgufFile,
    gpu_bytes: u64,
}

impl Loader<'_> {
    fn bad(&self, msg: String) -> VisionError {
        VisionError::Mmproj {
            path: self.f.path.clone(),
            msg,
        }
    }

    /// A tensor's f32 values, checked against `dims`.
    fn values(&self, name: &str, dims: &[u64]) -> Result<Vec<f32>, VisionError> {
        let t = self
            .f
            .tensor(name)
            .ok_or_else(|| self.bad(format!("tensor {name} is missing")))?;
        if t.dims != dims {
            return Err(self.bad(format!(
                "tensor {name} has shape {:?}, expected {dims:?}",
                t.dims
            )));
        }
        if quant::format(t.ty).is_none() {
            return Err(self.bad(format!(
                "tensor {name} has type {}, which wgllm does not read",
                t.ty
            )));
        }
        let mut v = vec![0f32; dims.iter().product::<u64>() as usize];
        quant::dequantize_row(t.ty, self.f.tensor_data(t), &mut v);
        Ok(v)
    }

    /// A weight of `n_rows` rows of `cols` values of `ty`, row r filled by `fill(r, row)`
    /// (the row starts as zeros: padding stays zero).
    fn rows(
        &mut self,
        name: &str,
        ty: GgmlType,
        (cols, n_rows): (u32, u32),
        mut fill: impl FnMut(usize, &mut [f32]),
    ) -> Result<Arc<Weight>, VisionError> {
        let mut data = Vec::new();
        let mut row = vec![0f32; cols as usize];
        for r in 0..n_rows as usize {
            row.fill(0.0);
            fill(r, &mut row);
            data.extend(quant::quantize_row(ty, &row));
        }
        let w = Weight::upload(self.gpu, name, ty, cols as usize, n_rows as usize, &data)?;
        self.gpu_bytes += w.gpu_bytes();
        Ok(Arc::new(w))
    }

    fn upload_f32(&mut self, name: &str, v: &[f32]) -> Result<View, VisionError> {
        let buf = self.gpu.upload(name, bytemuck::cast_slice(v))?;
        self.gpu_bytes += buf.size();
        Ok(View::whole(&buf))
    }

    /// A vector of `n` values padded with zeros to `len`; zeros where the file has none
    /// (llama.cpp treats every bias as optional).
    fn vector(&mut self, name: &str, n: u32, len: u32, missing: f32) -> Result<View, VisionError> {
        let mut v = match self.f.tensor(name) {
            Some(_) => self.values(name, &[n as u64])?,
            None => vec![missing; n as usize],
        };
        v.resize(len as usize, 0.0);
        self.upload_f32(name, &v)
    }

    /// A layer norm's weight and bias (ones and zeros where absent).
    fn norm(&mut self, prefix: &str, n: u32) -> Result<(View, View), VisionError> {
        Ok((
            self.vector(&format!("{prefix}.weight"), n, n, 1.0)?,
            self.vector(&format!("{prefix}.bias"), n, n, 0.0)?,
        ))
    }

    /// A matrix [n_cols, n_rows] as a weight of `out_cols` x `out_rows` (zeros added),
    /// kept in its type where no column is added, else in f32 (or `force`).
    fn matrix(
        &mut self,
        name: &str,
        (n_cols, n_rows): (u32, u32),
        (out_cols, out_rows): (u32, u32),
        force: Option<GgmlType>,
    ) -> Result<Arc<Weight>, VisionError> {
        let t = self
            .f
            .tensor(name)
            .ok_or_else(|| self.bad(format!("tensor {name} is missing")))?
            .clone();
        if t.dims != [n_cols as u64, n_rows as u64] {
            return Err(self.bad(format!(
                "tensor {name} has shape {:?}, expected [{n_cols}, {n_rows}]",
                t.dims
            )));
        }
        let same = out_cols == n_cols && force.is_none_or(|f| f == t.ty);
        if !same || quant::format(t.ty).is_none() {
            let v = self.values(name, &[n_cols as u64, n_rows as u64])?;
            let n = n_cols as usize;
            return self.rows(
                name,
                force.unwrap_or(GgmlType::F32),
                (out_cols, out_rows),
                |r, row| {
                    if let Some(src) = v.get(r * n..(r + 1) * n) {
                        row[..n].copy_from_slice(src);
                    }
                },
            );
        }
        let row = t.ty.row_bytes(n_cols as u64).unwrap_or(0) as usize;
        let mut data = self.f.tensor_data(&t).to_vec();
        data.resize(row * out_rows as usize, 0);
        let w = Weight::upload(
            self.gpu,
            name,
            t.ty,
            n_cols as usize,
            out_rows as usize,
            &data,
        )?;
        self.gpu_bytes += w.gpu_bytes();
        Ok(Arc::new(w))
    }

    /// Gemma 3's projection: [n_out, n_embd] in the file (a row of n_out per input
    /// value), transposed into a weight of n_out rows of n_embd, in its type (f16 or f32).
    fn gemma3_projection(&mut self, e: u32) -> Result<(Arc<Weight>, u32), VisionError> {
        let name = "mm.input_projection.weight";
        let proj = self
            .f
            .tensor(name)
            .ok_or_else(|| self.bad(format!("tensor {name} is missing")))?;
        if proj.dims.len() != 2 || proj.dims[1] != e as u64 {
            return Err(self.bad(format!(
                "{name} has shape {:?}, expected [n_embd of the language model, {e}]",
                proj.dims
            )));
        }
        let n_out = proj.dims[0] as u32;
        let ty = match proj.ty {
            GgmlType::F16 => GgmlType::F16,
            _ => GgmlType::F32,
        };
        let v = self.values(name, &[n_out as u64, e as u64])?;
        let w = self.rows(name, ty, (e, n_out), |o, row| {
            for (i, r) in row.iter_mut().enumerate() {
                *r = v[i * n_out as usize + o];
            }
        })?;
        Ok((w, n_out))
    }

    /// The projection to the language model's width: `name` of shape [n_in, n_out] (a
    /// row of `n_in`, `what` it holds, per output value), n_out read from the file.
    fn projection(
        &mut self,
        name: &str,
        n_in: u32,
        what: &str,
    ) -> Result<(Arc<Weight>, u32), VisionError> {
        let t = self
            .f
            .tensor(name)
            .ok_or_else(|| self.bad(format!("tensor {name} is missing")))?;
        let n_out = match t.dims[..] {
            [c, r] if c == n_in as u64 && r > 0 && r <= 1 << 20 => r as u32,
            _ => {
                return Err(self.bad(format!(
                "{name} has shape {:?}, expected [{n_in} ({what}), n_embd of the language model]",
                t.dims
            )))
            }
        };
        Ok((
            self.matrix(name, (n_in, n_out), (n_in, n_out), None)?,
            n_out,
        ))
    }

    fn layer(&mut self, hp: &ClipHparams, il: u32) -> Result<VitLayer, VisionError> {
        let (e, ff) = (hp.n_embd, hp.n_ff);
        let ffp = pad32(ff);
        let n = |s: &str| format!("v.blk.{il}.{s}");
        let mut qkv_bias = Vec::new();
        for p in ["attn_q", "attn_k", "attn_v"] {
            match self.f.tensor(&n(&format!("{p}.bias"))) {
                Some(_) => qkv_bias.extend(self.values(&n(&format!("{p}.bias")), &[e as u64])?),
                None => qkv_bias.extend(vec![0f32; e as usize]),
            }
        }
        // SigLIP's converter names fc1 ffn_up; files from before it named fc1 ffn_down
        // (llama.cpp swaps them back by their shape).
        let (up, down) = match self.f.tensor(&n("ffn_down.weight")) {
            Some(t) if t.dims.first() == Some(&(e as u64)) && e != ff => ("ffn_down", "ffn_up"),
            _ => ("ffn_up", "ffn_down"),
        };
        Ok(VitLayer {
            ln1: self.norm(&n("ln1"), e)?,
            qkv: vec![
                self.matrix(&n("attn_q.weight"), (e, e), (e, e), None)?,
                self.matrix(&n("attn_k.weight"), (e, e), (e, e), None)?,
                self.matrix(&n("attn_v.weight"), (e, e), (e, e), None)?,
            ],
            qkv_bias: self.upload_f32(&n("attn_qkv.bias"), &qkv_bias)?,
            wo: self.matrix(&n("attn_out.weight"), (e, e), (e, e), None)?,
            wo_bias: self.vector(&n("attn_out.bias"), e, e, 0.0)?,
            ln2: self.norm(&n("ln2"), e)?,
            up: self.matrix(&n(&format!("{up}.weight")), (e, ff), (e, ffp), None)?,
            up_bias: self.vector(&n(&format!("{up}.bias")), ff, ffp, 0.0)?,
            down: self.matrix(&n(&format!("{down}.weight")), (ff, e), (ffp, e), None)?,
            down_bias: self.vector(&n(&format!("{down}.bias")), e, e, 0.0)?,
            gate: match hp.projector {
                Projector::Qwen25vl => Some((
                    self.matrix(&n("ffn_gate.weight"), (e, ff), (e, ffp), None)?,
                    self.vector(&n("ffn_gate.bias"), ff, ffp, 0.0)?,
                )),
                _ => None,
            },
        })
    }
}

impl VisionWeights {
    /// Uploads the weights `hp` describes (the file must be the one `hp` was read from).
    pub fn load(gpu: &Gpu, f: &GgufFile, hp: &ClipHparams) -> Result<Self, VisionError> {
        let mut l = Loader {
            gpu,
            f,
            gpu_bytes: 0,
        };
        let (e, p) = (hp.n_embd, hp.patch_size);
        let n_patch = hp.patches_per_side() * hp.patches_per_side();
        let patch_cols = 3 * p * p;
        let kernel_ty = f.tensor("v.patch_embd.weight").map(|t| t.ty);
        let dims = [p as u64, p as u64, 3, e as u64];
        // [P, P, 3, E]: E rows of 3 * P * P, padded to whole blocks of 32.
        let mut kernel = l.values("v.patch_embd.weight", &dims)?;
        let (patch_f16, ty) = match hp.projector {
            // Qwen2.5-VL's two temporal kernels, both applied to a still image
            // (llama.cpp adds the two convolutions): one kernel of their sum, each
            // rounded to f16 first as ggml's convolution multiplies them (unless bf16).
            Projector::Qwen25vl => {
                let second = l.values("v.patch_embd.weight.1", &dims)?;
                let f16 = kernel_ty != Some(GgmlType::Bf16);
                let round = |v: f32| match f16 {
                    true => half::f16::from_f32(v).to_f32(),
                    false => v,
                };
                kernel
                    .iter_mut()
                    .zip(&second)
                    .for_each(|(a, b)| *a = round(*a) + round(*b));
                (f16, GgmlType::F32)
            }
            _ => match kernel_ty != Some(GgmlType::Bf16) {
                true => (true, GgmlType::F16),
                false => (false, GgmlType::F32),
            },
        };
        let n = patch_cols as usize;
        let patch_embd = l.rows(
            "v.patch_embd.weight",
            ty,
            (pad32(patch_cols), e),
            |r, row| {
                row[..n].copy_from_slice(&kernel[r * n..(r + 1) * n]);
            },
        )?;
        let patch_bias = l.vector("v.patch_embd.bias", e, e, 0.0)?;
        let pos_embd = match hp.projector {
            Projector::Qwen25vl => None,
            _ => {
                let pos = l.values("v.position_embd.weight", &[e as u64, n_patch as u64])?;
                Some(l.upload_f32("v.position_embd.weight", &pos)?)
            }
        };
        let layers = (0..hp.n_layer)
            .map(|il| l.layer(hp, il))
            .collect::<Result<Vec<_>, _>>()?;
        let post_ln = match f.tensor("v.post_ln.weight") {
            Some(_) => Some(l.norm("v.post_ln", e)?),
            None => None,
        };
        let rotary: &[&str] = match hp.projector {
            // llama.cpp's Qwen2.5-VL graph asserts these away.
            Projector::Qwen25vl => &["v.patch_embd.bias", "v.position_embd.weight"],
            _ => &[],
        };
        for &absent in [
            "v.pre_ln.weight",
            "v.class_embd",
            "v.blk.0.attn_q_norm.weight",
        ]
        .iter()
        .chain(rotary)
        {
            if f.tensor(absent).is_some() {
                return Err(l.bad(format!(
                    "has {absent}, which a {} encoder does not; this file's encoder is not one wgllm runs",
                    hp.projector.name()
                )));
            }
        }
        let soft_emb_norm = l.vector("mm.soft_emb_norm.weight", e, e, 1.0)?;
        let (mut merger, mut projection_bias) = (None, None);
        let (projection, n_out) = match hp.projector {
            Projector::Gemma3 => l.gemma3_projection(e)?,
            Projector::Idefics3 => {
                // [n_embd * merge², n_out]: a row of the shuffled width per output value.
                let n_in = e * hp.merge * hp.merge;
                let what = format!("the width {e} shuffled by {}", hp.merge);
                l.projection("mm.model.fc.weight", n_in, &what)?
            }
            Projector::Qwen25vl => {
                let n_in = e * 4;
                merger = Some((
                    l.matrix("mm.0.weight", (n_in, n_in), (n_in, n_in), None)?,
                    l.vector("mm.0.bias", n_in, n_in, 0.0)?,
                ));
                let (w, n_out) = l.projection("mm.2.weight", n_in, &format!("4 patches of {e}"))?;
                projection_bias = Some(l.vector("mm.2.bias", n_out, n_out, 0.0)?);
                (w, n_out)
            }
        };
        log::info!(
            "mmproj {}: {} encoder, {} layers of {e}, {} image tokens of {n_out}, {:.1} MiB on the device",
            f.path,
            hp.projector.name(),
            hp.n_layer,
            hp.n_tokens(),
            l.gpu_bytes as f64 / (1 << 20) as f64
        );
        Ok(VisionWeights {
            patch_embd,
            patch_f16,
            patch_bias,
            pos_embd,
            layers,
            post_ln,
            soft_emb_norm,
            projection,
            merger,
            projection_bias,
            n_out,
        })
    }
}
