//! pixel_shuffle: a token grid folded into fewer, wider tokens — a vision projector's
//! reduction of its patch grid by moving each s x s cell of patches into one token's
//! features (SmolVLM's and Idefics 3's connector; ggml builds it from reshapes and
//! permutes, `build_patch_merge_permute`). Nothing is summed: each output value is one
//! input value or a zero of the padding.

use super::kernels::{kernel_files, one_kernel};
use super::node::{GraphOp, OpCost, F32_BYTES};
use super::uniforms::uniform_struct;
use super::{record, split_groups, Dispatch, KernelKey, View};
use crate::gpu::{Gpu, GpuError};

/// A grid of `nx` x `ny` rows of `n` values (row y * nx + x), folded by `s` x `s` cells;
/// a grid that is not whole cells is padded with zero rows on the right and bottom (as
/// ggml pads it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GridShuffle {
    pub n: u32,
    pub nx: u32,
    pub ny: u32,
    pub s: u32,
}

impl GridShuffle {
    /// Cells across and down: the output grid.
    pub fn out_grid(&self) -> (u32, u32) {
        (
            self.nx.div_ceil(self.s.max(1)),
            self.ny.div_ceil(self.s.max(1)),
        )
    }
    /// Output rows.
    pub fn out_rows(&self) -> u32 {
        let (ox, oy) = self.out_grid();
        ox * oy
    }
    /// Values in an output row: a cell's s * s rows side by side.
    pub fn out_width(&self) -> u32 {
        self.n * self.s * self.s
    }

    /// Refuses an empty grid or cell.
    pub fn check(&self) -> Result<(), GpuError> {
        let Self { n, nx, ny, s } = *self;
        if n == 0 || nx == 0 || ny == 0 || s == 0 {
            return Err(GpuError::Validation(format!(
                "pixel_shuffle: an empty grid {self:?}"
            )));
        }
        Ok(())
    }
}

uniform_struct! {
    /// pixel_shuffle: the grid of [`GridShuffle`] and its output grid.
    PixelShuffleUniform {
        n: u32,
        nx: u32,
        ny: u32,
        s: u32,
        ox: u32,
        oy: u32,
        _pad0: u32,
        _pad1: u32,
    }
}

/// dst ([n * s * s, ox * oy] f32, cell rows left to right then down) = each cell's rows
/// of src ([n, nx * ny] f32) side by side, row by row of the cell (dy, then dx): value
/// e + n * (dx + s * dy) of cell (X, Y) is value e of row (Y * s + dy) * nx + X * s + dx.
pub fn pixel_shuffle(
    gpu: &Gpu,
    src: &View,
    dst: &View,
    g: GridShuffle,
) -> Result<Dispatch, GpuError> {
    g.check()?;
    let (ox, oy) = g.out_grid();
    let params = PixelShuffleUniform {
        n: g.n,
        nx: g.nx,
        ny: g.ny,
        s: g.s,
        ox,
        oy,
        ..Default::default()
    };
    let total = g.out_width() as u64 * g.out_rows() as u64;
    let total = u32::try_from(total)
        .map_err(|_| GpuError::Validation(format!("pixel_shuffle: {g:?} is too large")))?;
    let (gx, gy) = split_groups(total.div_ceil(256));
    record(
        gpu,
        "pixel_shuffle",
        gpu.pipeline(KernelKey::PixelShuffle(Kernel))?,
        bytemuck::bytes_of(&params),
        &[src, dst],
        [gx, gy, 1],
    )
}

/// The CPU reference of [`pixel_shuffle`].
pub fn pixel_shuffle_ref(src: &[f32], g: GridShuffle) -> Vec<f32> {
    let (ox, oy) = g.out_grid();
    let (n, s, nx, ny) = (g.n as usize, g.s as usize, g.nx as usize, g.ny as usize);
    let mut out = Vec::with_capacity(g.out_width() as usize * g.out_rows() as usize);
    for cy in 0..oy as usize {
        for cx in 0..ox as usize {
            for dy in 0..s {
                for dx in 0..s {
                    let (x, y) = (cx * s + dx, cy * s + dy);
                    if x < nx && y < ny {
                        out.extend_from_slice(&src[(y * nx + x) * n..][..n]);
                    } else {
                        out.extend(std::iter::repeat_n(0.0, n));
                    }
                }
            }
        }
    }
    out
}

kernel_files! {
    PIXEL_SHUFFLE = "kernels/pixel_shuffle.wgsl";
}

one_kernel!("pixel_shuffle", PIXEL_SHUFFLE, PixelShuffleUniform, 256);

/// The graph's `Op::PixelShuffle`: reads [src], writes [dst]: cells of a token grid
/// folded into single rows.
pub struct PixelShuffleNode {
    pub grid: GridShuffle,
}

impl GraphOp for PixelShuffleNode {
    fn kind(&self) -> String {
        "pixel_shuffle".into()
    }

    fn cost(&self) -> OpCost {
        let g = &self.grid;
        let out = g.out_width() as u64 * g.out_rows() as u64;
        OpCost::new(2 * out * F32_BYTES, 0)
    }

    fn record(
        &self,
        gpu: &Gpu,
        r: &[View],
        w: &[View],
        dispatches: &mut Vec<Dispatch>,
    ) -> Result<(), GpuError> {
        dispatches.push(pixel_shuffle(gpu, &r[0], &w[0], self.grid)?);
        Ok(())
    }
}
