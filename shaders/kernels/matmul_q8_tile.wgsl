// dst[t][row] = dot(W[row], x[t]) for prompts by integer dot products, tiled: one
// workgroup of 256 computes BM weight rows x BN tokens, as llama.cpp's mul_mmq does. The
// arithmetic per block is matmul_q8.wgsl's (eight dot4I8Packed into one integer, then
// dm.x * d * sum + dm.y * d * sum(q)); what differs is the reuse: per step of BK blocks the
// workgroup stages the BM rows' weight blocks (codes as bytes, by the type's `load_w`,
// weights/dot_<type>.wgsl) and the BN tokens' 8-bit blocks in workgroup memory, so each weight
// block is read from memory once per BN tokens and each x block once per BM rows. Each
// invocation owns TM x TN outputs (rows tx + 16 i, tokens ty + 16 j) and keeps one
// integer sum per output per block. The next step's blocks are fetched into registers
// while this step's are multiplied. Workgroup memory: 40 bytes x BK x (BM + BN), 10 KiB
// for 64x64 and 15 KiB for 128x64, under WebGPU's default 16 KiB.

const BM: u32 = {{BM}}u;
const BN: u32 = {{BN}}u;
// Blocks per step: each of the first BM * BK invocations fetches one weight block, each of
// the first BN * BK one block of x.
const BK: u32 = 2u;
const TM: u32 = BM / 16u;
const TN: u32 = BN / 16u;

// `Params` is `MatmulQ8Uniform` in src/ops/matmul_q8.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> xq: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

// A block as the kernel multiplies it: 32 codes as bytes, and (scale, offset) for weights
// or (d, d * sum(q)) for x.
struct WBlock {
    q: array<u32, 8>,
    dm: vec2<f32>,
}

// Word i of step block kb of row r at (kb * 8 + i) * BM + r (of token t likewise with BN):
// invocations with consecutive tx (ty) read consecutive words.
var<workgroup> wq: array<u32, 8u * BK * BM>;
var<workgroup> wdm: array<vec2<f32>, BK * BM>;
var<workgroup> xqs: array<u32, 8u * BK * BN>;
var<workgroup> xds: array<vec2<f32>, BK * BN>;

// Weight block b of `row`; zero (adding nothing) past the row's nb blocks.
fn weight_block(row: u32, nb: u32, b: u32) -> WBlock {
    var o: WBlock;
    if (b < nb) {
        o = load_w(row * p.row_words, nb, b);
    }
    return o;
}

// Block b of token `tok`'s quantized x; zero past nb.
fn x_block(tok: u32, nb: u32, b: u32) -> WBlock {
    var o: WBlock;
    if (b < nb) {
        let xb = tok * nb + b;
        for (var i = 0u; i < 8u; i++) {
            o.q[i] = xq[xb * 8u + i];
        }
        o.dm = vec2<f32>(bitcast<f32>(xq[p.ds_off + 2u * xb]), bitcast<f32>(xq[p.ds_off + 2u * xb + 1u]));
    }
    return o;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row0 = (wid.y * p.wg_x + wid.x) * BM;
    let t0 = wid.z * BN;
    let tx = lid % 16u;
    let ty = lid / 16u;
    let nb = p.k / 32u;
    // What this invocation fetches: block lk of each step, of row (token) lr. Rows and
    // tokens past the end re-read the last one; their results are not stored.
    let lr = lid / BK;
    let lk = lid % BK;
    let loads_w = lid < BM * BK;
    let loads_x = lid < BN * BK;
    let wrow = min(row0 + lr, p.n_rows - 1u);
    let xtok = min(t0 + lr, p.n_tok - 1u);
    var wv: WBlock;
    var xv: WBlock;
    if (loads_w) {
        wv = weight_block(wrow, nb, lk);
    }
    if (loads_x) {
        xv = x_block(xtok, nb, lk);
    }
    var acc: array<f32, TM * TN>;
    for (var b0 = 0u; b0 < nb; b0 += BK) {
        if (loads_w) {
            for (var i = 0u; i < 8u; i++) {
                wq[(lk * 8u + i) * BM + lr] = wv.q[i];
            }
            wdm[lk * BM + lr] = wv.dm;
        }
        if (loads_x) {
            for (var i = 0u; i < 8u; i++) {
                xqs[(lk * 8u + i) * BN + lr] = xv.q[i];
            }
            xds[lk * BN + lr] = xv.dm;
        }
        workgroupBarrier();
        if (b0 + BK < nb) {
            if (loads_w) {
                wv = weight_block(wrow, nb, b0 + BK + lk);
            }
            if (loads_x) {
                xv = x_block(xtok, nb, b0 + BK + lk);
            }
        }
        for (var kb = 0u; kb < BK; kb++) {
            var s: array<i32, TM * TN>;
            for (var i = 0u; i < 8u; i++) {
                var a: array<u32, TM>;
                var c: array<u32, TN>;
                for (var m = 0u; m < TM; m++) {
                    a[m] = wq[(kb * 8u + i) * BM + tx + 16u * m];
                }
                for (var n = 0u; n < TN; n++) {
                    c[n] = xqs[(kb * 8u + i) * BN + ty + 16u * n];
                }
                for (var m = 0u; m < TM; m++) {
                    for (var n = 0u; n < TN; n++) {
                        s[m * TN + n] += dot4I8Packed(a[m], c[n]);
                    }
                }
            }
            for (var m = 0u; m < TM; m++) {
                let dm = wdm[kb * BM + tx + 16u * m];
                for (var n = 0u; n < TN; n++) {
                    let ds = xds[kb * BN + ty + 16u * n];
                    acc[m * TN + n] += dm.x * ds.x * f32(s[m * TN + n]) + dm.y * ds.y;
                }
            }
        }
        workgroupBarrier();
    }
    for (var m = 0u; m < TM; m++) {
        let row = row0 + tx + 16u * m;
        for (var n = 0u; n < TN; n++) {
            let t = t0 + ty + 16u * n;
            if (row < p.n_rows && t < p.n_tok) {
                dst[t * p.out_stride + p.out_row_offset + row] = acc[m * TN + n];
            }
        }
    }
}
