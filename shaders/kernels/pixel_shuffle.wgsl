// A grid of token rows folded by square cells into fewer, wider rows (a vision
// projector's pixel shuffle: SmolVLM's connector). src holds nx * ny rows of n values,
// row y * nx + x; dst holds ox * oy rows of n * s * s values, row cy * ox + cx holding
// its cell's s * s rows side by side (dy, then dx), zeros where the cell passes the
// grid's edge. An invocation per output value; nothing is summed.

// `Params` is `PixelShuffleUniform` in src/ops/pixel_shuffle.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * 65535u + wid.x) * 256u + lid;
    let width = p.n * p.s * p.s;
    if (i >= width * p.ox * p.oy) {
        return;
    }
    let cell = i / width;
    let c = i - cell * width;
    let dy = c / (p.n * p.s);
    let r = c - dy * p.n * p.s;
    let dx = r / p.n;
    let e = r - dx * p.n;
    let x = (cell % p.ox) * p.s + dx;
    let y = (cell / p.ox) * p.s + dy;
    var v = 0.0;
    if (x < p.nx && y < p.ny) {
        v = src[(y * p.nx + x) * p.n + e];
    }
    dst[i] = v;
}
