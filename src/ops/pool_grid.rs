//! pool_grid: average pooling over a square-cell grid of token rows — a vision projector's
//! reduction of a patch grid (Gemma 3's 4 x 4 pooling of SigLIP's 64 x 64 patches to 256
//! image tokens, ggml's `pool_2d` with stride = kernel and no padding).

use super::kernels::{kernel_files, one_kernel};
use super::node::{GraphOp, OpCost, F32_BYTES};
use super::uniforms::uniform_struct;
use super::{record, split_groups, Dispatch, KernelKey, View};
use crate::gpu::{Gpu, GpuError};

/// A grid of `nx` x `ny` rows of `n` values (row y * nx + x), pooled by `k` x `k` cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GridPool {
    pub n: u32,
    pub nx: u32,
    pub ny: u32,
    pub k: u32,
}

impl GridPool {
    /// Cells across and down: the output grid.
    pub fn out_grid(&self) -> (u32, u32) {
        (self.nx / self.k.max(1), self.ny / self.k.max(1))
    }
    /// Output rows.
    pub fn out_rows(&self) -> u32 {
        let (ox, oy) = self.out_grid();
        ox * oy
    }

    /// Refuses a grid the cells do not tile (ggml would drop the rest; the projectors
    /// size their grids to whole cells, so a remainder is a bug upstream) or an empty one.
    pub fn check(&self) -> Result<(), GpuError> {
        let Self { n, nx, ny, k } = *self;
        if n == 0 || nx == 0 || ny == 0 || k == 0 {
            return Err(GpuError::Validation(format!(
                "pool_grid: an empty grid {self:?}"
            )));
        }
        if !nx.is_multiple_of(k) || !ny.is_multiple_of(k) {
            return Err(GpuError::Validation(format!(
                "pool_grid: a {nx}x{ny} grid is not whole cells of {k}x{k}"
            )));
        }
        Ok(())
    }
}

uniform_struct! {
    /// pool_grid: the grid of [`GridPool`] and its output grid.
    PoolGridUniform {
        n: u32,
        nx: u32,
        ny: u32,
        k: u32,
        ox: u32,
        oy: u32,
        _pad0: u32,
        _pad1: u32,
    }
}

/// dst ([n, ox * oy] f32, cell rows left to right then down) = the mean of each cell's
/// k * k rows of src ([n, nx * ny] f32).
pub fn pool_grid(gpu: &Gpu, src: &View, dst: &View, g: GridPool) -> Result<Dispatch, GpuError> {
    g.check()?;
    let (ox, oy) = g.out_grid();
    let params = PoolGridUniform {
        n: g.n,
        nx: g.nx,
        ny: g.ny,
        k: g.k,
        ox,
        oy,
        ..Default::default()
    };
    let total = g.n as u64 * g.out_rows() as u64;
    let total = u32::try_from(total)
        .map_err(|_| GpuError::Validation(format!("pool_grid: {g:?} is too large")))?;
    let (gx, gy) = split_groups(total.div_ceil(256));
    record(
        gpu,
        "pool_grid",
        gpu.pipeline(KernelKey::PoolGrid(Kernel))?,
        bytemuck::bytes_of(&params),
        &[src, dst],
        [gx, gy, 1],
    )
}

/// The CPU reference of [`pool_grid`] (each cell summed row by row, then divided).
pub fn pool_grid_ref(src: &[f32], g: GridPool) -> Vec<f32> {
    let (ox, oy) = g.out_grid();
    let (n, k, nx) = (g.n as usize, g.k as usize, g.nx as usize);
    let mut out = vec![0f32; n * (ox * oy) as usize];
    for cy in 0..oy as usize {
        for cx in 0..ox as usize {
            let dst = &mut out[(cy * ox as usize + cx) * n..][..n];
            for ky in 0..k {
                for kx in 0..k {
                    let row = (cy * k + ky) * nx + cx * k + kx;
                    for (d, s) in dst.iter_mut().zip(&src[row * n..(row + 1) * n]) {
                        *d += s;
                    }
                }
            }
            dst.iter_mut().for_each(|d| *d /= (k * k) as f32);
        }
    }
    out
}

kernel_files! {
    POOL_GRID = "kernels/pool_grid.wgsl";
}

one_kernel!("pool_grid", POOL_GRID, PoolGridUniform, 256);

/// The graph's `Op::PoolGrid`: reads [src], writes [dst]: cells of a token grid averaged
pub struct PoolGridNode {
    pub grid: GridPool,
}

impl GraphOp for PoolGridNode {
    fn kind(&self) -> String {
        "pool_grid".into()
    }

    fn cost(&self) -> OpCost {
        let g = &self.grid;
        let (src, out) = (
            g.n as u64 * g.nx as u64 * g.ny as u64,
            g.n as u64 * g.out_rows() as u64,
        );
        OpCost::new((src + out) * F32_BYTES, src + out)
    }

    fn record(
        &self,
        gpu: &Gpu,
        r: &[View],
        w: &[View],
        dispatches: &mut Vec<Dispatch>,
    ) -> Result<(), GpuError> {
        dispatches.push(pool_grid(gpu, &r[0], &w[0], self.grid)?);
        Ok(())
    }
}
