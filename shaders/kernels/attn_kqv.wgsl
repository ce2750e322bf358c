// Attention output: dst[t][h][d] = sum_c probs[h][t][c] * v[c][h / (n_head / n_head_kv)][d].
// dst is [head_dim * n_head, n_tok], the layout the output projection reads.
// One invocation owns four head dimensions (a vec4 of a value row) and TB tokens: each
// value vec4 is loaded once and used TB times, so a cell costs 4·TB multiply-adds per
// TB + 1 loads; cells that all TB tokens give zero weight (the causal mask) are skipped.
// Invocations are laid out dimension-fastest, so neighbours read one value row together.

const TB: u32 = {{TB}}u;

// `Params` is `AttnUniform` in src/ops/attention.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> probs: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<{{V_ELEM}}>;
@group(0) @binding(3) var<storage, read_write> dst: array<vec4<f32>>;

{{V_LOAD}}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let d4 = p.head_dim / 4u;
    let d = gid.x % d4;
    let t0 = (gid.x / d4) * TB;
    let h = gid.z;
    if (t0 >= p.n_tok) {
        return;
    }
    let hk = h / (p.n_head / p.n_head_kv);
    var pbase: array<u32, TB>;
    for (var j = 0u; j < TB; j++) {
        // Tokens past the end re-read the last one; their outputs are not stored.
        pbase[j] = (h * p.n_tok + min(t0 + j, p.n_tok - 1u)) * p.n_kv;
    }
    let row = p.n_head_kv * d4;
    var vo = hk * d4 + d;
    var s: array<vec4<f32>, TB>;
    // The bound is deliberately not a pure function of the uniform. lavapipe (Mesa 22.3)
    // specializes shaders on uniform values that decide loops; with `c < p.n_kv` it kept
    // ~300 KB of host memory per dispatch until the device was dropped (9 MB per SmolLM2
    // token) and decoded 20 % slower. min() with the buffer's length is the same value
    // and keeps the loop out of that path (measured: no growth).
    let n_kv = min(p.n_kv, arrayLength(&probs));
    for (var c = 0u; c < n_kv; c++) {
        var pr: array<f32, TB>;
        var any = false;
        for (var j = 0u; j < TB; j++) {
            pr[j] = probs[pbase[j] + c];
            any = any || pr[j] != 0.0;
        }
        if (any) {
            let x = v_load4(vo);
            for (var j = 0u; j < TB; j++) {
                s[j] += pr[j] * x;
            }
        }
        vo += row;
    }
    for (var j = 0u; j < TB; j++) {
        if (t0 + j < p.n_tok) {
            dst[((t0 + j) * p.n_head + h) * d4 + d] = s[j];
        }
    }
}
