// dst[t][row] = dot(W[row], x[t]) for a weight matrix W in a GPU block layout (the
// quant_*.wgsl snippet in front of this file defines QK, HW, BW and load_block).
// One invocation owns R consecutive weight rows and TB tokens: each weight block is
// dequantized once and used TB times, each block of x is loaded once and used R times.
// This "rows per invocation, no barriers" shape is what CPU-like adapters run fastest.
// A block's body comes in whole vec4 loads (its head through a second binding of the same
// buffer, as words): lavapipe (Mesa's llvmpipe) runs every storage load as a loop over
// the SIMD lanes, so the number of loads, not their width, is what a row costs there
// (Q8_0: 3 loads a block instead of 9; Gemma-3's Q8_0 matmuls took 37 ms a token, not 59).
// XLOAD reads x's block at `xo` (in vec4s) into `xv`: as one 128-byte `XBlock` per
// invocation (x's element type X_ELEM), so a bounds-checked backend (a browser's WebGPU)
// clamps one index instead of eight; or, for batches where the adapter has subgroups (of 8
// or more), one vec4 per lane, shared with subgroupBroadcast: all lanes read the same
// block, and those loads are per-lane loops too (Gemma-3 pp128 on lavapipe: 145 t/s
// against 91). EXIT stops invocations past the
// last row, except where the lanes share x's loads and so must all take part.
// STORE writes the accumulators: plainly, or through the fused GLU epilogue, where the
// weight's rows are interleaved (gate, up) pairs and act(gate) * up is written (R even).
// TOKENS says which tokens a workgroup multiplies and by which rows: consecutive tokens of
// x through the whole matrix, or (mixture-of-experts prompts, `Tokens::Grouped` in
// src/ops/shaders.rs) a run of one expert's (token, expert) pairs through that expert's
// rows; it defines row0, ntb (tokens here), wrow (the matrix's first row in w) and the
// x row X_ROW and output offset of the workgroup's token t.

const TB: u32 = {{TB}}u;
const R: u32 = {{R}}u;
const WB_SLOTS: u32 = R;

// One GPU block (32 values) of x.
struct XBlock {
    v: array<vec4<f32>, 8>,
}

// `Params` is `MatmulUniform` in src/ops/matmul.rs (`MatmulIdUniform`, src/ops/moe.rs, for grouped
// pairs), prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> wq: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> x: array<{{X_ELEM}}>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;
{{TOKEN_BINDINGS}}
// The weight buffer again, as words, for the block heads (bound only for types with heads:
// an unused binding would not be in the pipeline's layout), after any bindings above.
@group(0) @binding({{HEAD_BINDING}}) var<storage, read> w: array<u32>;

// The body of the block being dequantized, loaded whole in vec4s and kept as words (the
// snippet's `deq_elem` and `load_quarter`, which read bodies anywhere, are not used here).
// Words, not vec4s, read by constant indices: compiled by a browser (Tint, then
// SwiftShader's optimizer), a word of a vec4 variable stayed a load from memory.
var<private> bv: array<u32, BW>;

fn hw(i: u32) -> u32 {
    return w[i];
}

// The snippet's body reads `bw(b, i)` are written out in place as `bv[i]` when the source
// is built (`shaders::matmul_source`).

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32{{SG_ARGS}}) {
{{TOKENS}}
{{EXIT}}
    let k4 = p.k / 4u;
    var acc: array<f32, TB * R>;
    var rbase: array<u32, R>;
    for (var r = 0u; r < R; r++) {
        // Rows past the end re-read the last row; their results are not stored.
        rbase[r] = (wrow + min(row0 + r, p.n_rows - 1u)) * p.row_words;
    }
    let nb = p.k / QK;
    // Each half block's values are code * scale + offset (`load_block` returns (scale,
    // offset) of the first and second 16): the codes' dot with x is scaled once per half,
    // and the offsets multiply x's sum, so no value is scaled one by one.
    var sc: array<vec4<f32>, R>;
    for (var b = 0u; b < nb; b++) {
        for (var r = 0u; r < R; r++) {
            let blk_r = blk(rbase[r], nb, b);
            for (var v = 0u; v < BW / 4u; v++) {
                let q = wq[(blk_r.b >> 2u) + v];
                bv[4u * v] = q.x;
                bv[4u * v + 1u] = q.y;
                bv[4u * v + 2u] = q.z;
                bv[4u * v + 3u] = q.w;
            }
            sc[r] = load_block(blk_r, r);
        }
        for (var t = 0u; t < TB; t++) {
            if (t < ntb) {
                let xo = ({{X_ROW}}) * k4 + b * 8u;
                var xv: array<vec4<f32>, 8>;
{{XLOAD}}
                var xsum = vec2<f32>(0.0);
                for (var i = 0u; i < 4u; i++) {
                    xsum += vec2<f32>(dot(xv[i], vec4<f32>(1.0)), dot(xv[i + 4u], vec4<f32>(1.0)));
                }
                // Read whole: Tint reads `.x` of a variable through a pointer, which
                // kept it in memory after SwiftShader's optimizer.
                let xs = xsum;
                for (var r = 0u; r < R; r++) {
                    var lo = 0.0;
                    var hi = 0.0;
                    for (var i = 0u; i < 4u; i++) {
                        lo += dot(wb[r * 8u + i], xv[i]);
                        hi += dot(wb[r * 8u + i + 4u], xv[i + 4u]);
                    }
                    let c = sc[r];
                    acc[t * R + r] += c.x * lo + c.y * xs.x + c.z * hi + c.w * xs.y;
                }
            }
        }
    }
{{STORE}}
}
