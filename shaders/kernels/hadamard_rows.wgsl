// In place, every chunk of n values of x times the orthonormal Walsh-Hadamard matrix of
// size n (Sylvester's order: H_2n = [[H_n, H_n], [H_n, -H_n]] / sqrt 2; n a power of two
// up to 256): llama.cpp's attention rotation of a quantized cache, undone on attention's
// output and around the K-shift's RoPE (the matrix is its own inverse). One invocation
// per chunk, butterflies in a private array; the index runs over x and y
// (y * 65535 * 64 + x).

// `Params` is `SetRowsUniform` in src/ops/uniforms.rs (row_len: n, n_rows: the chunk
// count), prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.y * 65535u * 64u + gid.x;
    let n = min(p.row_len, 256u);
    if (c >= p.n_rows) {
        return;
    }
    let base = c * n;
    var v: array<f32, 256>;
    for (var i = 0u; i < n; i++) {
        v[i] = x[base + i];
    }
    for (var s = 1u; s < n; s *= 2u) {
        for (var i = 0u; i < n / 2u; i++) {
            let a = (i / s) * 2u * s + i % s;
            let t = v[a];
            v[a] = t + v[a + s];
            v[a + s] = t - v[a + s];
        }
    }
    let sc = inverseSqrt(f32(n));
    for (var i = 0u; i < n; i++) {
        x[base + i] = v[i] * sc;
    }
}
