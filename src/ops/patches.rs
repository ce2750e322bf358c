//! patches: an image cut into square patches, one row each — the first half of a vision
//! transformer's patch embedding (llama.cpp's `ggml_conv_2d` with stride = kernel is
//! `im2col` then a matmul; this is that `im2col`, and the ordinary matmul does the rest
//! with the patch-embedding weight as a [C * P * P, n_embd] matrix).

use super::kernels::{kernel_files, one_kernel};
use super::node::{GraphOp, OpCost, F32_BYTES};
use super::uniforms::uniform_struct;
use super::{record, split_groups, Dispatch, KernelKey, View};
use crate::gpu::{Gpu, GpuError};

/// A planar image (`channels` planes of `height` rows of `width` values), the side of its
/// square patches, and the length of the rows they are written into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PatchGrid {
    pub channels: u32,
    pub height: u32,
    pub width: u32,
    pub patch: u32,
    /// Values per output row: C * P * P, or more, zeros after the patch (the matmul reads
    /// rows of whole blocks of 32; SigLIP's 3 * 14 * 14 = 588 is not).
    pub stride: u32,
}

impl PatchGrid {
    /// Patches across and down.
    pub fn n_px(&self) -> u32 {
        self.width / self.patch.max(1)
    }
    pub fn n_py(&self) -> u32 {
        self.height / self.patch.max(1)
    }
    /// Values of one patch row: C * P * P.
    pub fn row_len(&self) -> u32 {
        self.channels * self.patch * self.patch
    }
    /// Values of the whole output.
    pub fn out_len(&self) -> u64 {
        self.stride as u64 * self.n_px() as u64 * self.n_py() as u64
    }

    /// Refuses a grid the patches do not tile (an image is resized to whole patches
    /// before it gets here, as llama.cpp's preprocessing does) or one with nothing in it.
    pub fn check(&self) -> Result<(), GpuError> {
        let p = self.patch;
        if p == 0 || self.channels == 0 || self.height == 0 || self.width == 0 {
            return Err(GpuError::Validation(format!(
                "patches: an empty grid {self:?}"
            )));
        }
        if !self.height.is_multiple_of(p) || !self.width.is_multiple_of(p) {
            return Err(GpuError::Validation(format!(
                "patches: a {}x{} image is not whole patches of {p}x{p}; resize it to a multiple of {p} first",
                self.width, self.height
            )));
        }
        if self.stride < self.row_len() {
            return Err(GpuError::Validation(format!(
                "patches: rows of {} values cannot hold patches of {}",
                self.stride,
                self.row_len()
            )));
        }
        Ok(())
    }
}

uniform_struct! {
    /// patches: the grid of [`PatchGrid`], with its patch counts and the dispatch's width.
    PatchesUniform {
        channels: u32,
        height: u32,
        width: u32,
        /// The patch side (`patch` is a reserved word in WGSL).
        side: u32,
        n_px: u32,
        n_py: u32,
        stride: u32,
        _pad0: u32,
    }
}

/// dst ([stride, n_py * n_px] f32, a row per patch, left to right then down, zeros after
/// its C * P * P values) from img ([W, H, C] f32, planar).
pub fn patches(gpu: &Gpu, img: &View, dst: &View, g: PatchGrid) -> Result<Dispatch, GpuError> {
    g.check()?;
    let params = PatchesUniform {
        channels: g.channels,
        height: g.height,
        width: g.width,
        side: g.patch,
        n_px: g.n_px(),
        n_py: g.n_py(),
        stride: g.stride,
        ..Default::default()
    };
    let n = u32::try_from(g.out_len())
        .map_err(|_| GpuError::Validation(format!("patches: {g:?} is too large")))?;
    let (gx, gy) = split_groups(n.div_ceil(256));
    record(
        gpu,
        "patches",
        gpu.pipeline(KernelKey::Patches(Kernel))?,
        bytemuck::bytes_of(&params),
        &[img, dst],
        [gx, gy, 1],
    )
}

/// The CPU reference of [`patches`].
pub fn patches_ref(img: &[f32], g: PatchGrid) -> Vec<f32> {
    let (p, w, h) = (g.patch as usize, g.width as usize, g.height as usize);
    let mut out = Vec::with_capacity(g.out_len() as usize);
    for py in 0..g.n_py() as usize {
        for px in 0..g.n_px() as usize {
            for c in 0..g.channels as usize {
                for ky in 0..p {
                    let y = py * p + ky;
                    let line = (c * h + y) * w + px * p;
                    out.extend_from_slice(&img[line..line + p]);
                }
            }
            out.resize(out.len() + (g.stride - g.row_len()) as usize, 0.0);
        }
    }
    out
}

kernel_files! {
    PATCHES = "kernels/patches.wgsl";
}

one_kernel!("patches", PATCHES, PatchesUniform, 256);

/// The graph's `Op::Patches`: reads [img], writes [dst]: the image cut into patch rows
pub struct PatchesNode {
    pub grid: PatchGrid,
}

impl GraphOp for PatchesNode {
    fn kind(&self) -> String {
        "patches".into()
    }

    fn cost(&self) -> OpCost {
        let g = &self.grid;
        let img = (g.channels * g.height * g.width) as u64;
        OpCost::new((img + g.out_len()) * F32_BYTES, 0)
    }

    fn record(
        &self,
        gpu: &Gpu,
        r: &[View],
        w: &[View],
        dispatches: &mut Vec<Dispatch>,
    ) -> Result<(), GpuError> {
        dispatches.push(patches(gpu, &r[0], &w[0], self.grid)?);
        Ok(())
    }
}
