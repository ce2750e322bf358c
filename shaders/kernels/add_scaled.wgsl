// A low-rank adapter's correction added into a matmul's output, in place:
// dst[t * p.stride + p.offset + j * p.step] += p.scale * src[t * p.n + j]
// for each of p.n_tok rows t of src and each of its p.n values j. The offset and step place
// the correction among stacked (Q, K, V: step 1) or interleaved (gate, up: step 2) rows.
// Every output is written by one invocation only, so no two invocations race.

// `Params` is `AddScaledUniform` in src/ops/add_scaled.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * 65535u + wid.x) * 256u + lid;
    if (i >= p.n * p.n_tok) {
        return;
    }
    let t = i / p.n;
    let j = i - t * p.n;
    let o = t * p.stride + p.offset + j * p.step;
    dst[o] = dst[o] + p.scale * src[i];
}
