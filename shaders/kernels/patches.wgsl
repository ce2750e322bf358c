// An image cut into square patches, each patch one row: ggml's im2col for a convolution
// whose stride is its kernel (a vision transformer's patch embedding), so that the
// convolution becomes one matmul of these rows by the kernel's [C * P * P] rows.
// img is planar [C][H][W] (x fastest); row r = py * n_px + px holds, for each channel c,
// each patch line ky and column kx, img[c][py * P + ky][px * P + kx] at c * P * P + ky * P + kx:
// the order of a GGUF patch-embedding weight's elements ([P, P, C, n_embd], kx fastest);
// rows are `stride` values apart, zeros after the patch's C * P * P.
// Every output is written by one invocation only.

// `Params` is `PatchesUniform` in src/ops/patches.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> img: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * 65535u + wid.x) * 256u + lid;
    let pp = p.side * p.side;
    let row = p.channels * pp;
    if (i >= p.stride * p.n_px * p.n_py) {
        return;
    }
    let r = i / p.stride;
    let e = i - r * p.stride;
    if (e >= row) {
        dst[i] = 0.0;
        return;
    }
    let c = e / pp;
    let ky = (e - c * pp) / p.side;
    let kx = e - c * pp - ky * p.side;
    let y = (r / p.n_px) * p.side + ky;
    let x = (r % p.n_px) * p.side + kx;
    dst[i] = img[(c * p.height + y) * p.width + x];
}
