// hadamard_rows.wgsl on GPUs: a workgroup per chunk, its values in workgroup memory, each
// stage's butterflies shared out over the invocations with a barrier between stages. The
// one-invocation kernel keeps the chunk in a private array that a GPU compiler cannot
// hold in registers (it is indexed by loop counters): on AMD's it became 64 KiB of
// scratch memory per wave.

// `Params` is `SetRowsUniform` in src/ops/uniforms.rs (row_len: n, n_rows: the chunk
// count), prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;

var<workgroup> v: array<f32, 256>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    // Chunks run over x and y (y * 65535 + x), one per workgroup.
    let c = wid.y * 65535u + wid.x;
    let n = min(p.row_len, 256u);
    if (c >= p.n_rows) {
        return;
    }
    let base = c * n;
    for (var i = li; i < n; i += 64u) {
        v[i] = x[base + i];
    }
    workgroupBarrier();
    for (var s = 1u; s < n; s *= 2u) {
        // A stage's n / 2 butterflies touch disjoint pairs: no two invocations meet.
        for (var i = li; i < n / 2u; i += 64u) {
            let a = (i / s) * 2u * s + i % s;
            let t = v[a];
            let u = v[a + s];
            v[a] = t + u;
            v[a + s] = t - u;
        }
        workgroupBarrier();
    }
    let sc = inverseSqrt(f32(n));
    for (var i = li; i < n; i += 64u) {
        x[base + i] = v[i] * sc;
    }
}
