//! The vision encoder as one graph: patches cut from the image and embedded, position
//! embeddings added, the transformer's blocks (layer norm, attention over every patch,
//! GELU feed-forward, each with its residual), the last layer norm, then the projector
//! (Gemma 3: square cells averaged, RMS-normed, projected to the language model's width;
//! SmolVLM: cells of patches folded into one token each, projected).
//! The attention goes through the same blocks as a language model's, over a K/V store of
//! the image's patches that every layer reuses; no position rotates (as BERT's).

use super::image::RgbImage;
use super::mmproj::{ClipHparams, Projector, VisionWeights};
use super::preprocess::{letterbox, normalize_planar, tile_grid, tile_image};
use super::prompt::TileTokens;
use super::VisionError;
use crate::gguf::GgufFile;
use crate::gpu::Gpu;
use crate::graph::{AttnBlock, AttnInputs, GraphBuilder};
use crate::ops::attention::AttnShape;
use crate::ops::binary::BinaryOp;
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
    /// next (the same size for every image).
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
    /// Image tokens per image the encoder reads (per tile, for a tiling projector).
    pub n_tokens: u32,
    /// The longest side an image is resized to before tiling (0: not tiled).
    pub longest_edge: u32,
    /// Identifies the encoder (its shape and file), mixed into image hashes: the same
    /// pixels through another mmproj are another image.
    pub fingerprint: u64,
    /// The language model's tokens around tiles, once bound to its vocabulary
    /// ([`ImagePrep::bind_vocab`]); `None` for a projector that does not tile.
    pub tile_tokens: Option<TileTokens>,
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

    /// The encoder's input for `img`: fitted into the square, normalised, planar; rounded
    /// to f16 where the patch kernel is (llama.cpp's convolution reads f16 patches).
    pub fn preprocess(&self, img: &RgbImage) -> Vec<f32> {
        let square = letterbox(img, self.image_size);
        let mut v = normalize_planar(&square, self.mean, self.std);
        if self.patch_f16 {
            v.iter_mut()
                .for_each(|x| *x = half::f16::from_f32(*x).to_f32());
        }
        v
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
        let f = GgufFile::open(path)?;
        let hp = ClipHparams::read(&f)?;
        let weights = VisionWeights::load(&gpu, &f, &hp)?;
        let mut fp = Fnv::new();
        fp.write(format!("{hp:?} {} {}", weights.n_out, weights.patch_f16).as_bytes());
        fp.write(&std::fs::metadata(path).map_or(0, |m| m.len()).to_le_bytes());
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

    /// Image tokens per image.
    pub fn n_tokens(&self) -> u32 {
        self.hp.n_tokens()
    }

    /// The encoder's input for `img` (see [`ImagePrep::preprocess`]).
    pub fn preprocess(&self, img: &RgbImage) -> Vec<f32> {
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

    /// The buffers every image reads alike, made on the first image.
    fn scratch(&self) -> Result<Scratch, VisionError> {
        let mut guard = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            let (hp, gpu) = (&self.hp, &self.gpu);
            let per_side = hp.patches_per_side();
            let n = per_side * per_side;
            let slots: Vec<u32> = (0..n).collect();
            let store = |label: &str| -> Result<View, VisionError> {
                Ok(View::whole(
                    &gpu.storage(label, hp.n_embd as u64 * n as u64 * 4)?,
                ))
            };
            *guard = Some(Scratch {
                slots: View::whole(&gpu.upload("image slots", bytemuck::cast_slice(&slots))?),
                // Every patch sees every patch: a mask of zeros (storage starts zeroed).
                mask: View::whole(&gpu.storage("image mask", n as u64 * n as u64 * 4)?),
                // Nothing rotates (n_dims 0); the table is never read.
                table: View::whole(&gpu.storage("image rope", 16)?),
                k: store("image K")?,
                v: store("image V")?,
            });
        }
        Ok(guard.clone().expect("made above"))
    }

    /// The embeddings of an already prepared input (planes of image_size² values, from
    /// [`ImagePrep::preprocess`]): [n_embd_out, n_tokens] f32.
    pub async fn encode_pixels(&self, pixels: &[f32]) -> Result<Vec<f32>, VisionError> {
        let (hp, w, gpu) = (&self.hp, &self.weights, &self.gpu);
        let side = hp.image_size;
        if pixels.len() != 3 * side as usize * side as usize {
            return Err(VisionError::Image {
                what: "input".into(),
                msg: format!(
                    "{} values for a {side}x{side} image of 3 planes",
                    pixels.len()
                ),
            });
        }
        let per_side = hp.patches_per_side();
        let n = per_side * per_side;
        let e = hp.n_embd;
        let img = View::whole(&gpu.upload("image", bytemuck::cast_slice(pixels))?);
        let sc = self.scratch()?;
        let (k_store, v_store) = (sc.k.clone(), sc.v.clone());
        let out_bytes = w.n_out as u64 * hp.n_tokens() as u64 * 4;
        let out = gpu.storage("image embeddings", out_bytes)?;

        let mut g = GraphBuilder::new_on(gpu.clone());
        let img = g.input(img, [3 * side * side, 1]);
        let grid = PatchGrid {
            channels: 3,
            height: side,
            width: side,
            patch: hp.patch_size,
            stride: w.patch_embd.n_cols,
        };
        let patches = g.patches(img, grid);
        let x = g.matmul(&w.patch_embd, patches);
        let bias = g.input(w.patch_bias.clone(), [e, 1]);
        let x = g.add(x, bias);
        let pos = g.input(w.pos_embd.clone(), [e, n]);
        let mut x = g.add(x, pos);
        let inp = AttnInputs {
            slots: g.input(sc.slots.clone(), [n, 1]),
            mask: g.input(sc.mask.clone(), [n, n]),
            rope: g.input(sc.table.clone(), [0, n]),
            rope_p: RopeParams::new(hp.head_dim, 0, false, 10_000.0, 1.0),
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
        for lw in &w.layers {
            let h = g.layer_norm(x, (&lw.ln1.0, &lw.ln1.1), hp.eps);
            let attn = AttnBlock {
                qkv_bias: Some(&lw.qkv_bias),
                wo_bias: Some(&lw.wo_bias),
                ..AttnBlock::new(&lw.qkv, &lw.wo, (&k_store, &v_store), inp)
            };
            let a = g.attn_block(h, &attn)?;
            x = g.add(a, x);
            let h = g.layer_norm(x, (&lw.ln2.0, &lw.ln2.1), hp.eps);
            let up = g.matmul(&lw.up, h);
            let up = g.add_act(BinaryOp::AddGelu, up, &lw.up_bias);
            let down = g.matmul(&lw.down, up);
            let bias = g.input(lw.down_bias.clone(), [e, 1]);
            let down = g.add(down, bias);
            x = g.add(down, x);
        }
        if let Some((lw, lb)) = &w.post_ln {
            x = g.layer_norm(x, (lw, lb), hp.eps);
        }
        match hp.projector {
            Projector::Gemma3 => {
                let pooled = g.pool_grid(x, per_side, per_side, hp.merge);
                let normed = g.rms_norm(pooled, &w.soft_emb_norm, hp.eps);
                let dst = g.input(View::whole(&out), [w.n_out, hp.n_tokens()]);
                g.matmul_into(&w.projection, normed, dst);
            }
            Projector::Idefics3 => {
                let folded = g.pixel_shuffle(x, per_side, per_side, hp.merge);
                let dst = g.input(View::whole(&out), [w.n_out, hp.n_tokens()]);
                g.matmul_into(&w.projection, folded, dst);
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
}
