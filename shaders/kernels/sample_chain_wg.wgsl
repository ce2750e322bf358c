// Sampling, second pass: one workgroup per row takes the k best of the first pass's
// candidates, sorts them (larger logit first, ties by token id), then one invocation
// runs llama.cpp's chain on them in its order and arithmetic — top-p, min-p,
// temperature, the draw with the host's uniform number u — writes (token, its
// probability), and records the token in the session's penalty history (ring and
// per-token counts). Sums of the draw are kept as float pairs (WGSL has no f64).

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> rows: array<SampleRow>;
@group(0) @binding(2) var<storage, read> cand: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read_write> counts: array<u32>;
@group(0) @binding(4) var<storage, read_write> ring: array<u32>;
@group(0) @binding(5) var<storage, read_write> result: array<vec2<u32>>;
@group(0) @binding(6) var<storage, read_write> probs: array<vec2<u32>>;

var<workgroup> s_key: array<u32, 256>;
var<workgroup> s_id: array<u32, 256>;
var<workgroup> o_key: array<u32, 256>;
var<workgroup> o_id: array<u32, 256>;
var<workgroup> o_v: array<f32, 256>;

var<private> row: SampleRow;
var<private> in_base: u32;

fn item_key(i: u32) -> u32 {
    return cand[in_base + i].x;
}

fn item_out(pos: u32, key: u32, i: u32) {
    s_key[pos] = key;
    s_id[pos] = cand[in_base + i].y;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    row = rows[wid.x];
    let n_items = p.n_seg * p.k_stride;
    in_base = wid.x * n_items;
    let per = (n_items + 255u) / 256u;
    let lo = min(lid * per, n_items);
    let hi = min(lo + per, n_items);
    let n = select_top(lid, lo, hi, min(row.k, p.k_stride));
    workgroupBarrier();
    if (lid < n) {
        let kt = s_key[lid];
        let it = s_id[lid];
        var r = 0u;
        for (var j = 0u; j < n; j++) {
            let kj = s_key[j];
            if (kj > kt || (kj == kt && s_id[j] < it)) {
                r++;
            }
        }
        o_key[r] = kt;
        o_id[r] = it;
    }
    workgroupBarrier();
    if (lid == 0u) {
        finish_row(wid.x, n);
    }
}
