// Average pooling of a grid of token rows by square cells (a vision projector's
// reduction of its patch grid: ggml's pool_2d, stride = kernel, no padding). src holds
// nx * ny rows of n values, row y * nx + x; dst holds ox * oy rows, row cy * ox + cx the
// mean of the k * k rows of its cell. An invocation per output value, summing the cell's
// rows in order (ky, then kx) as the CPU reference does.

// `Params` is `PoolGridUniform` in src/ops/pool_grid.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * 65535u + wid.x) * 256u + lid;
    if (i >= p.n * p.ox * p.oy) {
        return;
    }
    let cell = i / p.n;
    let e = i - cell * p.n;
    let x0 = (cell % p.ox) * p.k;
    let y0 = (cell / p.ox) * p.k;
    var sum = 0.0;
    for (var ky = 0u; ky < p.k; ky++) {
        for (var kx = 0u; kx < p.k; kx++) {
            sum += src[((y0 + ky) * p.nx + x0 + kx) * p.n + e];
        }
    }
    dst[i] = sum / f32(p.k * p.k);
}
