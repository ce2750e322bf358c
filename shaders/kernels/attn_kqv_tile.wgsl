// Attention output for prompts on GPUs as a tiled matrix product over the softmax's
// probabilities: out[t][h] = sum_c probs[h][t][c] * v[c][h / (n_head / n_head_kv)], one
// workgroup of 256 per BT = 16 TM tokens of one head and one chunk of cells (workgroup
// z). The chunk is walked in slices of SC cells: the slice's probabilities and value rows
// are staged in workgroup memory, and each invocation owns TM tokens (ty + 16 j) x NI
// vec4s of the head (tx + 16 i), so a cell costs it NI vec4 and TM scalar loads for
// 4 TM NI multiply-adds. A slice whose probabilities are all zero (cells the mask hides
// from every token of the tile) loads no values and adds nothing. With one chunk `out` is
// the output itself, [head_dim / 4, n_head, n_tok] vec4s; with more, the chunks' sums
// go to partials [chunk][token][head] and attn_kqv_join.wgsl adds them up.

const TM: u32 = {{TM}}u;
const NI: u32 = {{NI}}u;
const BT: u32 = 16u * TM;
const BD: u32 = 16u * NI;
const SC: u32 = 16u;

// `Params` is `AttnSplitUniform` in src/ops/attention.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> probs: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<{{V_ELEM}}>;
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;

{{V_LOAD}}

// [cell][token] and [cell][vec4 of the head].
var<workgroup> ps: array<f32, SC * BT>;
var<workgroup> vs: array<vec4<f32>, SC * BD>;
// The latest slice (its first cell + 1) with a nonzero probability.
var<workgroup> nonzero_any: atomic<u32>;
var<workgroup> nonzero: u32;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t0 = wid.x * BT;
    let h = wid.y;
    let tx = lid % 16u;
    let ty = lid / 16u;
    let hk = h / (p.n_head / p.n_head_kv);
    let d4 = p.head_dim / 4u;
    let c_begin = wid.z * p.chunk;
    let c_end = min(c_begin + p.chunk, p.n_kv);

    var acc: array<vec4<f32>, TM * NI>;
    for (var cs = c_begin; cs < c_end; cs += SC) {
        // Probabilities: SC * BT of them, TM per invocation, consecutive invocations
        // reading consecutive cells of a token's row.
        var any = false;
        for (var r = 0u; r < TM; r++) {
            let e = lid + 256u * r;
            let t = t0 + e / SC;
            let c = cs + e % SC;
            var pr = 0.0;
            if (t < p.n_tok && c < c_end) {
                pr = probs[(h * p.n_tok + t) * p.n_kv + c];
            }
            any = any || pr != 0.0;
            ps[(e % SC) * BT + e / SC] = pr;
        }
        if (any) {
            atomicMax(&nonzero_any, cs + 1u);
        }
        workgroupBarrier();
        if (lid == 0u) {
            nonzero = atomicLoad(&nonzero_any);
        }
        if (workgroupUniformLoad(&nonzero) == cs + 1u) {
            // Value rows: SC * BD vec4s, NI per invocation (zeros past the cells or the head).
            for (var r = 0u; r < NI; r++) {
                let e = lid + 256u * r;
                let c = cs + e / BD;
                let d = e % BD;
                var x = vec4<f32>(0.0);
                if (c < c_end && d < d4) {
                    x = v_load4((c * p.n_head_kv + hk) * d4 + d);
                }
                vs[e] = x;
            }
            workgroupBarrier();
            for (var cc = 0u; cc < SC; cc++) {
                var x: array<vec4<f32>, NI>;
                for (var i = 0u; i < NI; i++) {
                    x[i] = vs[cc * BD + tx + 16u * i];
                }
                for (var j = 0u; j < TM; j++) {
                    let pr = ps[cc * BT + ty + 16u * j];
                    for (var i = 0u; i < NI; i++) {
                        acc[j * NI + i] += pr * x[i];
                    }
                }
            }
        }
        workgroupBarrier();
    }
    for (var j = 0u; j < TM; j++) {
        let t = t0 + ty + 16u * j;
        if (t < p.n_tok) {
            let row = (wid.z * p.n_tok + t) * p.n_head + h;
            for (var i = 0u; i < NI; i++) {
                let d = tx + 16u * i;
                if (d < d4) {
                    out[row * d4 + d] = acc[j * NI + i];
                }
            }
        }
    }
}
