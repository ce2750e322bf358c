//! The vision encoder as one graph: patches cut from the image and embedded, the
//! transformer's blocks (a norm, attention, a feed-forward, each with its residual), the
//! last norm, then the projector. SigLIP (Gemma 3, SmolVLM) adds position embeddings,
//! uses layer norms, attention over every patch with no rotation (as BERT's) and a GELU
//! feed-forward; Gemma 3 averages square cells, RMS-norms and projects them, SmolVLM
//! folds cells of patches into one token each and projects them. Qwen2.5-VL reads the
//! image at its own size, rotates Q and K by each patch's row and column, attends within
//! windows of cells in most layers (a mask), uses RMS norms and SiLU-gated feed-forwards,
//! and merges each cell's 2 x 2 patches through a two-layer MLP.
//! The attention goes through the same blocks as a language model's, over a K/V store of
//! the image's patches that every layer reuses.

use super::image::RgbImage;
use super::mmproj::{ClipHparams, DynamicSize, Projector, VisionWeights};
use super::preprocess::{
    fit_to_cells, letterbox, letterbox_to, normalize_planar, tile_grid, tile_image, Filter,
};
use super::prompt::TileTokens;
use super::VisionError;
use crate::gguf::GgufFile;
use crate::gpu::Gpu;
use crate::graph::{AttnBlock, AttnInputs, GraphBuilder};
use crate::ops::attention::AttnShape;
use crate::ops::binary::BinaryOp;
use crate::ops::glu::Activation;
use crate::ops::patches::PatchGrid;
use crate::ops::rope::RopeParams;
use crate::ops::softmax::SoftmaxParams;
use crate::ops::View;
use crate::quant::cache::KvType;
use std::sync::Arc;

/// An mmproj file's encoder on one device.
pub struct VisionEncoder {
    pub hp: ClipHparams,
    pub weights: VisionWeights,
    /// What preparing an image for this encoder needs, without the device.
    pub prep: Arc<ImagePrep>,
    gpu: Arc<Gpu>,
    path: String,
    /// The K/V store, slots and mask of the image's patches, kept from one image to the
    /// next (the same size for every image of a fixed-size encoder; one that reads images
    /// at their own size makes its own per image).
    scratch: std::sync::Mutex<Option<Scratch>>,
}

/// Buffers every image's graph reads the same way.
#[derive(Clone)]
struct Scratch {
    slots: View,
    mask: View,
    table: View,
    k: View,
    v: View,
}

/// An encoder's preprocessing and the place of its images in a prompt: everything a
/// front end needs to turn image files into an engine's input on its own thread.
#[derive(Clone, Debug)]
pub struct ImagePrep {
    pub projector: Projector,
    /// The square the image is fitted into.
    pub image_size: u32,
    pub mean: [f32; 3],
    pub std: [f32; 3],
    /// The prepared input is rounded to f16 (the patch kernel is f16).
    pub patch_f16: bool,
    /// Image tokens per encoder input (per tile, for a tiling projector); for an encoder
    /// that reads images at their own size, those of its square only: an image's own come
    /// from [`ImagePrep::tokens_for_input`].
    pub n_tokens: u32,
    /// The longest side an image is resized to before tiling (0: not tiled).
    pub longest_edge: u32,
    /// Identifies the encoder (its shape and file), mixed into image hashes: the same
    /// pixels through another mmproj are another image.
    pub fingerprint: u64,
    /// The language model's tokens around tiles, once bound to its vocabulary
    /// ([`ImagePrep::bind_vocab`]); `None` for a projector that does not tile.
    pub tile_tokens: Option<TileTokens>,
    /// The side of the square of pixels one image token reads (patch x merge).
    pub cell: u32,
    /// The bounds of an encoder that reads images at their own size (Qwen2.5-VL).
    pub dynamic: Option<DynamicSize>,
    /// The most cells (tokens) of one encoder input this device holds (the attention
    /// masks of its patches in one binding each); refused beyond, when prepared.
    pub max_cells: u32,
}

/// The encoder's input for one image or tile: planes R, G, B of `width` x `height`
/// normalised values ([`ImagePrep::preprocess`]).
#[derive(Clone, Debug, PartialEq)]
pub struct EncoderInput {
    pub pixels: Vec<f32>,
    pub width: u32,
    pub height: u32,
}

/// What the encoder reads of one image: the image itself, or its tiles and global view.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageSplit {
    /// Tiles across and down; `None` for an image read whole.
    pub grid: Option<(u32, u32)>,
    /// The encoder's inputs in prompt order (tiles row by row, then the global view).
    pub parts: Vec<RgbImage>,
}

impl ImagePrep {
    /// This preparation with the tokens a tiled image needs looked up in `tok`'s
    /// vocabulary (refused where it has none of them).
    pub fn bind_vocab(&self, tok: &crate::tokenizer::Tokenizer) -> Result<Self, VisionError> {
        Ok(ImagePrep {
            tile_tokens: TileTokens::lookup(tok, self.projector)?,
            ..self.clone()
        })
    }

    /// The encoder passes (chunks) a `width` x `height` image takes: one, or its tiles
    /// and the global view; an error where it cannot be tiled.
    pub fn chunks_for(&self, width: u32, height: u32) -> Result<u32, VisionError> {
        if !self.projector.tiles() {
            return Ok(1);
        }
        let [_, _, cols, rows] = tile_grid(width, height, self.image_size, self.longest_edge)
            .map_err(|msg| VisionError::Image {
                what: format!("{width}x{height}"),
                msg,
            })?;
        Ok(cols * rows + 1)
    }

    /// Refuses an image whose input would hold more cells than the device's encoder
    /// (a long thin one, whose short side is kept at one cell, can pass the most pixels).
    fn check_fits(&self, width: u32, height: u32) -> Result<(), VisionError> {
        let (w, h) = self.input_size(width, height);
        let cells = (w / self.cell) as u64 * (h / self.cell) as u64;
        if self.dynamic.is_some() && cells > self.max_cells as u64 {
            return Err(VisionError::Image {
                what: format!("{width}x{height}"),
                msg: format!(
                    "resized to {w}x{h} it takes {cells} tokens, more than the {} this device's encoder holds: send a smaller image, or lower --image-max-tokens",
                    self.max_cells
                ),
            });
        }
        Ok(())
    }

    /// The image tokens of a `width` x `height` image in all its chunks, and the f32
    /// values of its prepared inputs; an error where it cannot be tiled or does not fit.
    pub fn tokens_and_values_for(
        &self,
        width: u32,
        height: u32,
    ) -> Result<(u32, u64), VisionError> {
        self.check_fits(width, height)?;
        let chunks = self.chunks_for(width, height)?;
        let (w, h) = self.input_size(width, height);
        Ok((
            chunks * self.tokens_for_input(w, h),
            chunks as u64 * 3 * w as u64 * h as u64,
        ))
    }

    /// The fewest image tokens any image takes: the fewest chunks' (see
    /// [`ImagePrep::min_chunks`]), or an image of the fewest pixels' for an encoder that
    /// reads images at their own size.
    pub fn min_tokens(&self) -> u32 {
        match self.dynamic {
            Some(d) => d.min_pixels.div_ceil(self.cell * self.cell),
            None => self.min_chunks() * self.n_tokens,
        }
    }

    /// The fewest chunks any image takes (a tiled image's long side alone makes
    /// `longest_edge / image_size` tiles, and the global view one more).
    pub fn min_chunks(&self) -> u32 {
        match self.projector.tiles() {
            false => 1,
            true => self.longest_edge.div_ceil(self.image_size) + 1,
        }
    }

    /// `img` as the encoder reads it: whole, or in tiles (see [`tile_image`]).
    pub fn split(&self, img: &RgbImage) -> Result<ImageSplit, VisionError> {
        self.check_fits(img.width, img.height)?;
        if !self.projector.tiles() {
            return Ok(ImageSplit {
                grid: None,
                parts: vec![img.clone()],
            });
        }
        let t = tile_image(img, self.image_size, self.longest_edge).map_err(|msg| {
            VisionError::Image {
                what: format!("{}x{}", img.width, img.height),
                msg,
            }
        })?;
        Ok(ImageSplit {
            grid: Some((t.cols, t.rows)),
            parts: t.tiles,
        })
    }

    /// The size the encoder reads a `width` x `height` image at: its square, or (for an
    /// encoder that reads images at their own size) the image resized to whole cells
    /// within the file's bounds ([`fit_to_cells`]).
    pub fn input_size(&self, width: u32, height: u32) -> (u32, u32) {
        match self.dynamic {
            Some(d) => fit_to_cells(width, height, self.cell, d.min_pixels, d.max_pixels),
            None => (self.image_size, self.image_size),
        }
    }

    /// Image tokens of an encoder input of `width` x `height` pixels.
    pub fn tokens_for_input(&self, width: u32, height: u32) -> u32 {
        match self.dynamic {
            Some(_) => (width / self.cell) * (height / self.cell),
            None => self.n_tokens,
        }
    }

    /// The encoder's input for `img`: fitted into the square (bilinear, letterboxed), or
    /// resized to [`ImagePrep::input_size`] (bicubic, letterboxed as llama.cpp's mtmd
    /// does, which keeps the aspect ratio exactly); normalised, planar; rounded to f16
    /// where the patch kernel is (llama.cpp's convolution reads f16 patches then).
    pub fn preprocess(&self, img: &RgbImage) -> EncoderInput {
        let (width, height) = self.input_size(img.width, img.height);
        let fitted = match self.dynamic {
            Some(_) => letterbox_to(img, width, height, Filter::Bicubic),
            None => letterbox(img, self.image_size),
        };
        let mut pixels = normalize_planar(&fitted, self.mean, self.std);
        if self.patch_f16 {
            pixels
                .iter_mut()
                .for_each(|x| *x = half::f16::from_f32(*x).to_f32());
        }
        EncoderInput {
            pixels,
            width,
            height,
        }
    }

    /// A 64-bit hash of `img`'s size and pixels under this encoder, keyed by a secret
    /// this process draws (SipHash): cells are reused for an image whose hash matches,
    /// so no client may be able to make another image with the same hash. A cache saved
    /// by another process matches no image here (its images are decoded again).
    pub fn image_hash(&self, img: &RgbImage) -> u64 {
        use std::hash::{BuildHasher, Hasher};
        static KEY: std::sync::OnceLock<std::collections::hash_map::RandomState> =
            std::sync::OnceLock::new();
        let mut h = KEY.get_or_init(Default::default).build_hasher();
        h.write_u64(self.fingerprint);
        h.write_u32(img.width);
        h.write_u32(img.height);
        h.write(&img.pixels);
        h.finish()
    }
}

/// FNV-1a, 64 bits.
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

impl VisionEncoder {
    /// Reads `path` and uploads its weights to `gpu`.
    pub fn load(gpu: Arc<Gpu>, path: &str) -> Result<Self, VisionError> {
        Self::load_with(gpu, path, ImageTokens::default())
    }

    /// [`VisionEncoder::load`] with the tokens an image may take set by the user
    /// (llama.cpp's `--image-min-tokens` / `--image-max-tokens`, for an encoder that reads
    /// images at their own size; ignored by the others). The most is also bounded by the
    /// device: an image's attention masks (patches² f32) must each fit one binding.
    pub fn load_with(gpu: Arc<Gpu>, path: &str, limits: ImageTokens) -> Result<Self, VisionError> {
        let f = GgufFile::open(path)?;
        let len = std::fs::metadata(path).map_or(0, |m| m.len());
        Self::load_file(gpu, &f, len, limits)
    }

    /// [`VisionEncoder::load_with`] from a file already read (a page's download).
    pub fn load_bytes(
        gpu: Arc<Gpu>,
        name: &str,
        bytes: Vec<u8>,
        limits: ImageTokens,
    ) -> Result<Self, VisionError> {
        let len = bytes.len() as u64;
        let f = GgufFile::from_bytes(name, bytes)?;
        Self::load_file(gpu, &f, len, limits)
    }

    /// The encoder of the opened mmproj `f` (`len` bytes long, for its fingerprint).
    fn load_file(
        gpu: Arc<Gpu>,
        f: &GgufFile,
        len: u64,
        limits: ImageTokens,
    ) -> Result<Self, VisionError> {
        let path = f.path.as_str();
        let mut hp = ClipHparams::read(f)?;
        let bad = |msg: String| VisionError::Mmproj {
            path: path.to_string(),
            msg,
        };
        let mut max_cells = u32::MAX;
        if let Some(d) = hp.dynamic.as_mut() {
            let area = hp.patch_size * hp.merge * hp.patch_size * hp.merge;
            if let Some(n) = limits.min {
                d.min_pixels = n.saturating_mul(area);
            }
            if let Some(n) = limits.max {
                d.max_pixels = n.saturating_mul(area);
            }
            let (lo, hi) = (d.min_pixels / area, d.max_pixels / area);
            let given = limits.min.is_some() || limits.max.is_some();
            if given && (lo == 0 || lo > hi || hi > 16384) {
                return Err(bad(format!(
                    "images of {lo} to {hi} tokens: give at least 1, at most 16384, and no more at least than at most (--image-min-tokens, --image-max-tokens)"
                )));
            }
            // Patches (4 per token) whose N x N mask fits one binding.
            let patches = ((gpu.max_binding / 4) as f64).sqrt() as u64;
            let fits = (patches / 4).min(16384) as u32;
            max_cells = fits;
            if hi > fits {
                log::info!(
                    "{path}: images take at most {fits} tokens on this device (the file allows {hi}): larger ones are scaled down to fit"
                );
                d.max_pixels = fits * area;
                d.min_pixels = d.min_pixels.min(d.max_pixels);
            }
        } else if limits.min.is_some() || limits.max.is_some() {
            log::info!(
                "{path}: --image-min-tokens / --image-max-tokens apply to encoders that read images at their own size; a {} encoder's images take a fixed number",
                hp.projector.name()
            );
        }
        let weights = VisionWeights::load(&gpu, f, &hp)?;
        let mut fp = Fnv::new();
        fp.write(format!("{hp:?} {} {}", weights.n_out, weights.patch_f16).as_bytes());
        fp.write(&len.to_le_bytes());
        let prep = Arc::new(ImagePrep {
            projector: hp.projector,
            image_size: hp.image_size,
            mean: hp.image_mean,
            std: hp.image_std,
            patch_f16: weights.patch_f16,
            n_tokens: hp.n_tokens(),
            longest_edge: hp.longest_edge,
            fingerprint: fp.0,
            tile_tokens: None,
            cell: hp.patch_size * hp.merge,
            dynamic: hp.dynamic,
            max_cells,
        });
        Ok(VisionEncoder {
            hp,
            weights,
            prep,
            gpu,
            path: path.to_string(),
            scratch: std::sync::Mutex::new(None),
        })
    }

    /// The language model's width the embeddings have.
    pub fn n_embd_out(&self) -> u32 {
        self.weights.n_out
    }

    /// Image tokens per encoder input of a fixed-size encoder (see [`ImagePrep::n_tokens`]).
    pub fn n_tokens(&self) -> u32 {
        self.hp.n_tokens()
    }

    /// The encoder's input for `img` (see [`ImagePrep::preprocess`]).
    pub fn preprocess(&self, img: &RgbImage) -> EncoderInput {
        self.prep.preprocess(img)
    }

    /// The device the encoder runs on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// The embeddings of `img`: [n_embd_out, n_tokens] f32, a row per image token (of
    /// every tile in prompt order, for a tiling projector).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn encode(&self, img: &RgbImage) -> Result<Vec<f32>, VisionError> {
        let mut out = Vec::new();
        for part in self.prep.split(img)?.parts {
            out.extend(pollster::block_on(
                self.encode_pixels(&self.preprocess(&part)),
            )?);
        }
        Ok(out)
    }

    /// The buffers every image reads alike, made on the first image (an encoder that
    /// reads images at their own size makes its own for each image).
    fn scratch(&self) -> Result<Scratch, VisionError> {
        let mut guard = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            let per_side = self.hp.patches_per_side();
            *guard = Some(self.make_scratch(per_side, per_side)?);
        }
        Ok(guard.clone().expect("made above"))
    }

    /// Slots, an all-seeing mask, no rotation, and K/V stores for `pw` x `ph` patches.
    fn make_scratch(&self, pw: u32, ph: u32) -> Result<Scratch, VisionError> {
        let (hp, gpu) = (&self.hp, &self.gpu);
        let n = pw * ph;
        let slots: Vec<u32> = (0..n).collect();
        let store = |label: &str| -> Result<View, VisionError> {
            Ok(View::whole(
                &gpu.storage(label, hp.n_embd as u64 * n as u64 * 4)?,
            ))
        };
        Ok(Scratch {
            slots: View::whole(&gpu.upload("image slots", bytemuck::cast_slice(&slots))?),
            // Every patch sees every patch: a mask of zeros (storage starts zeroed).
            mask: View::whole(&gpu.storage("image mask", n as u64 * n as u64 * 4)?),
            // Nothing rotates (n_dims 0) unless a rotary encoder uploads its own.
            table: View::whole(&gpu.storage("image rope", 16)?),
            k: store("image K")?,
            v: store("image V")?,
        })
    }

    /// Checks an input against what this encoder reads: its square, or whole cells
    /// within the file's bounds for an encoder that reads images at their own size.
    fn check_input(&self, input: &EncoderInput) -> Result<(), VisionError> {
        let (w, h) = (input.width, input.height);
        let bad = |msg: String| VisionError::Image {
            what: "input".into(),
            msg,
        };
        match self.hp.dynamic {
            None if (w, h) != (self.hp.image_size, self.hp.image_size) => {
                return Err(bad(format!(
                    "{w}x{h} pixels for an encoder of {0}x{0}",
                    self.hp.image_size
                )))
            }
            Some(_) => {
                let cell = self.prep.cell;
                let cells = (w / cell) as u64 * (h / cell) as u64;
                if w == 0
                    || h == 0
                    || !w.is_multiple_of(cell)
                    || !h.is_multiple_of(cell)
                    || cells > self.prep.max_cells as u64
                {
                    return Err(bad(format!(
                        "{w}x{h} pixels: not whole cells of {cell}, at most {} of them",
                        self.prep.max_cells
                    )));
                }
            }
            None => {}
        }
        if input.pixels.len() != 3 * w as usize * h as usize {
            return Err(bad(format!(
                "{} values for a {w}x{h} image of 3 planes",
                input.pixels.len()
            )));
        }
        Ok(())
    }

    /// The embeddings of an already prepared input ([`ImagePrep::preprocess`]):
    /// [n_embd_out, n_tokens] f32.
    pub async fn encode_pixels(&self, input: &EncoderInput) -> Result<Vec<f32>, VisionError> {
        self.check_input(input)?;
        let (hp, w, gpu) = (&self.hp, &self.weights, &self.gpu);
        let (pw, ph) = (input.width / hp.patch_size, input.height / hp.patch_size);
        let n = pw * ph;
        let e = hp.n_embd;
        let n_tokens = self.prep.tokens_for_input(input.width, input.height);
        let img = View::whole(&gpu.upload("image", bytemuck::cast_slice(&input.pixels))?);
        let rotary = hp
            .dynamic
            .map(|d| self.rotary_inputs(d, pw, ph))
            .transpose()?;
        let sc = match &rotary {
            Some(r) => r.scratch.clone(),
            None => self.scratch()?,
        };
        let (k_store, v_store) = (sc.k.clone(), sc.v.clone());
        let out_bytes = w.n_out as u64 * n_tokens as u64 * 4;
        let out = gpu.storage("image embeddings", out_bytes)?;

        let mut g = GraphBuilder::new_on(gpu.clone());
        let img = g.input(img, [3 * input.width * input.height, 1]);
        let grid = PatchGrid {
            channels: 3,
            height: input.height,
            width: input.width,
            patch: hp.patch_size,
            stride: w.patch_embd.n_cols,
        };
        let patches = g.patches(img, grid);
        let mut x = g.matmul(&w.patch_embd, patches);
        if let Some(pos) = &w.pos_embd {
            let bias = g.input(w.patch_bias.clone(), [e, 1]);
            x = g.add(x, bias);
            let pos = g.input(pos.clone(), [e, n]);
            x = g.add(x, pos);
        }
        let (rope_p, n_rot) = match rotary {
            // Every dimension of a head rotates, in NeoX's halves.
            Some(_) => (
                RopeParams::new(hp.head_dim, hp.head_dim, true, 10_000.0, 1.0),
                hp.head_dim,
            ),
            None => (RopeParams::new(hp.head_dim, 0, false, 10_000.0, 1.0), 0),
        };
        let inp = AttnInputs {
            slots: g.input(sc.slots.clone(), [n, 1]),
            mask: g.input(sc.mask.clone(), [n, n]),
            rope: g.input(sc.table.clone(), [n_rot, n]),
            rope_p,
            shape: AttnShape {
                head_dim: hp.head_dim,
                n_head: hp.n_head,
                n_head_kv: hp.n_head,
                n_tok: n,
                n_kv: n,
                k_type: KvType::F32,
                v_type: KvType::F32,
                flash: false,
                rot_k: 0,
                rot_v: 0,
            },
            sp: SoftmaxParams {
                scale: 1.0 / (hp.head_dim as f32).sqrt(),
                max_bias: 0.0,
                n_head: hp.n_head,
                softcap: 0.0,
            },
        };
        // Qwen2.5-VL's layers attend within windows but every n_wa_pattern-th.
        let windowed = rotary.as_ref().map(|r| AttnInputs {
            mask: g.input(r.window_mask.clone(), [n, n]),
            ..inp
        });
        let rms = hp.projector == Projector::Qwen25vl;
        for (il, lw) in w.layers.iter().enumerate() {
            let norm = |g: &mut GraphBuilder, x, (w, b): &(View, View)| match rms {
                true => g.rms_norm(x, w, hp.eps),
                false => g.layer_norm(x, (w, b), hp.eps),
            };
            let h = norm(&mut g, x, &lw.ln1);
            let full = hp.dynamic.is_none_or(|d| {
                d.n_wa_pattern == 0 || (il as u32 + 1).is_multiple_of(d.n_wa_pattern)
            });
            let attn = AttnBlock {
                qkv_bias: Some(&lw.qkv_bias),
                wo_bias: Some(&lw.wo_bias),
                ..AttnBlock::new(
                    &lw.qkv,
                    &lw.wo,
                    (&k_store, &v_store),
                    match (full, windowed) {
                        (false, Some(win)) => win,
                        _ => inp,
                    },
                )
            };
            let a = g.attn_block(h, &attn)?;
            x = g.add(a, x);
            let h = norm(&mut g, x, &lw.ln2);
            let up = g.matmul(&lw.up, h);
            let act = match &lw.gate {
                Some((gate, gate_bias)) => {
                    let up_bias = g.input(lw.up_bias.clone(), [lw.up.n_rows, 1]);
                    let up = g.add(up, up_bias);
                    let gt = g.matmul(gate, h);
                    let gate_bias = g.input(gate_bias.clone(), [gate.n_rows, 1]);
                    let gt = g.add(gt, gate_bias);
                    g.glu(Activation::Silu, gt, up)
                }
                None => g.add_act(BinaryOp::AddGelu, up, &lw.up_bias),
            };
            let down = g.matmul(&lw.down, act);
            let bias = g.input(lw.down_bias.clone(), [e, 1]);
            let down = g.add(down, bias);
            x = g.add(down, x);
        }
        if let Some((lw, lb)) = &w.post_ln {
            x = match rms {
                true => g.rms_norm(x, lw, hp.eps),
                false => g.layer_norm(x, (lw, lb), hp.eps),
            };
        }
        let dst = g.input(View::whole(&out), [w.n_out, n_tokens]);
        match hp.projector {
            Projector::Gemma3 => {
                let pooled = g.pool_grid(x, pw, ph, hp.merge);
                let normed = g.rms_norm(pooled, &w.soft_emb_norm, hp.eps);
                g.matmul_into(&w.projection, normed, dst);
            }
            Projector::Idefics3 => {
                let folded = g.pixel_shuffle(x, pw, ph, hp.merge);
                g.matmul_into(&w.projection, folded, dst);
            }
            Projector::Qwen25vl => {
                // Each cell's 2 x 2 patches side by side (row by row), as llama.cpp's
                // merger reads them; cells in raster order.
                let folded = g.pixel_shuffle(x, pw, ph, 2);
                let (fc, fc_bias) = w.merger.as_ref().expect("loaded with the projector");
                let m = g.matmul(fc, folded);
                let m = g.add_act(BinaryOp::AddGelu, m, fc_bias);
                let y = g.matmul(&w.projection, m);
                let bias = w
                    .projection_bias
                    .as_ref()
                    .expect("loaded with the projector");
                g.add_act_into(BinaryOp::Add, y, bias, dst);
            }
        }
        let graph = g.build()?;
        let bytes = graph
            .run(gpu, &[], &[(&out, 0, out_bytes)])
            .await?
            .ok_or_else(|| VisionError::Mmproj {
                path: self.path.clone(),
                msg: "the encoder's graph read nothing back".into(),
            })?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// A rotary encoder's per-image inputs for `pw` x `ph` patches in raster order: the
    /// stores and the all-seeing mask, the rotation table (each head's first quarter of
    /// pairs turned by the patch's row, the second by its column, each quarter from the
    /// first frequency, as ggml's vision RoPE), and the window mask (a patch sees the
    /// patches whose cells share its window of `window` pixels).
    fn rotary_inputs(&self, d: DynamicSize, pw: u32, ph: u32) -> Result<Rotary, VisionError> {
        let gpu = &self.gpu;
        let scratch = self.make_scratch(pw, ph)?;
        let table = rotary_table(self.hp.head_dim, pw, ph);
        let scratch = Scratch {
            table: View::whole(&gpu.upload("image rope", bytemuck::cast_slice(&table))?),
            ..scratch
        };
        let mask = window_mask(pw, ph, d.window_cells);
        let window_mask =
            View::whole(&gpu.upload("image window mask", bytemuck::cast_slice(&mask))?);
        Ok(Rotary {
            scratch,
            window_mask,
        })
    }
}

/// The tokens an image may take, where the user bounds them (`None`: the file's, or
/// llama.cpp's defaults).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ImageTokens {
    pub min: Option<u32>,
    pub max: Option<u32>,
}

/// A rotary encoder's buffers for one image.
struct Rotary {
    scratch: Scratch,
    window_mask: View,
}

/// (cos, sin) for every patch of a `pw` x `ph` grid (raster order) and each of a head's
/// `head_dim / 2` rotated pairs: pair k < head_dim / 4 turns by row · θ^k, the others by
/// column · θ^(k - head_dim / 4), θ = 10000^(-4 / head_dim) (ggml's vision mode of
/// `rope_multi` over head_dim / 2 dimensions in four equal sections).
pub fn rotary_table(head_dim: u32, pw: u32, ph: u32) -> Vec<[f32; 2]> {
    let (half, quarter) = (head_dim as usize / 2, head_dim as usize / 4);
    let theta = 10_000f64.powf(-2.0 / half as f64);
    let mut out = Vec::with_capacity((pw * ph) as usize * half);
    for y in 0..ph {
        for x in 0..pw {
            for k in 0..half {
                let (p, i) = match k < quarter {
                    true => (y as f64, k),
                    false => (x as f64, k - quarter),
                };
                let a = p * theta.powi(i as i32);
                out.push([a.cos() as f32, a.sin() as f32]);
            }
        }
    }
    out
}

/// The mask of attention within windows for a `pw` x `ph` grid of patches (raster
/// order): 0 where the two patches' cells of 2 x 2 lie in the same window of
/// `window_cells` x `window_cells` cells (windows from the top left, cut at the right and
/// bottom edges), masked elsewhere. Row = query.
pub fn window_mask(pw: u32, ph: u32, window_cells: u32) -> Vec<f32> {
    let n = (pw * ph) as usize;
    let win = |i: usize| {
        let (x, y) = (i as u32 % pw, i as u32 / pw);
        (x / 2 / window_cells, y / 2 / window_cells)
    };
    let wins: Vec<(u32, u32)> = (0..n).map(win).collect();
    let mut m = vec![f32::NEG_INFINITY; n * n];
    for (q, wq) in wins.iter().enumerate() {
        for (k, wk) in wins.iter().enumerate() {
            if wq == wk {
                m[q * n + k] = 0.0;
            }
        }
    }
    m
}
