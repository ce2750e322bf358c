// Sampling, first pass: each workgroup takes one segment of one row's logits, applies
// the row's logit bias and repetition penalties (a token's count in the session's recent
// history), and writes its k largest candidates as (key, token id) in id order, padded
// with empty (0) entries to k_stride. Dispatch: (segments, rows).

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> rows: array<SampleRow>;
@group(0) @binding(3) var<storage, read> counts: array<u32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read_write> cand: array<vec2<u32>>;

var<private> row: SampleRow;
var<private> out_base: u32;
var<private> seg_start: u32;

// The segment's keys, computed once (a segment is at most 4096 logits).
var<workgroup> seg_keys: array<u32, 4096>;

fn item_key(i: u32) -> u32 {
    return seg_keys[i - seg_start];
}

fn item_out(pos: u32, key: u32, i: u32) {
    cand[out_base + pos] = vec2<u32>(key, i);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    row = rows[wid.y];
    let start = wid.x * p.seg_len;
    let end = min(start + p.seg_len, p.n_vocab);
    let per = (p.seg_len + 255u) / 256u;
    let lo = min(start + lid * per, end);
    let hi = min(lo + per, end);
    out_base = (wid.y * p.n_seg + wid.x) * p.k_stride;
    seg_start = start;
    for (var i = lo; i < hi; i++) {
        seg_keys[i - start] = logit_key(i);
    }
    workgroupBarrier();
    let n = select_top(lid, lo, hi, min(row.k, p.k_stride));
    for (var j = n + lid; j < p.k_stride; j += 256u) {
        cand[out_base + j] = vec2<u32>(0u, 0u);
    }
}
