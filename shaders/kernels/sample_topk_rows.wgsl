// Sampling, first pass, CPU-shaped: one invocation per segment of one row's logits
// applies the row's logit bias and repetition penalties and writes the segment's k
// largest as (key, token id), best first (larger key, then smaller id), padded with
// empty (0) entries to k_stride. A heap of the k best so far replaces the GPU shape's
// radix select: CPU drivers run each barrier as a switch of every invocation of the
// workgroup. Loop trips stay under lavapipe's 65535 per invocation (at most 4096 items,
// each at most 8 heap levels, then a heapsort of 256). Dispatch: (segments, rows).

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> rows: array<SampleRow>;
@group(0) @binding(3) var<storage, read> counts: array<u32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read_write> cand: array<vec2<u32>>;

var<private> row: SampleRow;

// The k best so far as (key, id), the worst at the root.
var<private> h_key: array<u32, 256>;
var<private> h_id: array<u32, 256>;

// The worst at the root: larger keys, then smaller ids, go down.
fn heap_above(a: u32, b: u32) -> bool {
    return h_key[a] < h_key[b] || (h_key[a] == h_key[b] && h_id[a] > h_id[b]);
}

fn heap_swap(a: u32, b: u32) {
    let k = h_key[a];
    let i = h_id[a];
    h_key[a] = h_key[b];
    h_id[a] = h_id[b];
    h_key[b] = k;
    h_id[b] = i;
}

@compute @workgroup_size(1)
fn main(@builtin(workgroup_id) wid: vec3<u32>) {
    row = rows[wid.y];
    let start = wid.x * p.seg_len;
    let end = min(start + p.seg_len, p.n_vocab);
    let out_base = (wid.y * p.n_seg + wid.x) * p.k_stride;
    let k = min(row.k, p.k_stride);
    var n = 0u;
    if (k > 0u) {
        for (var i = start; i < end; i++) {
            let key = logit_key(i);
            if (key == 0u) {
                continue;
            }
            // Items come in id order: an equal key is never better than one kept.
            if (n < k) {
                h_key[n] = key;
                h_id[n] = i;
                sift_up(n);
                n++;
            } else if (key > h_key[0]) {
                h_key[0] = key;
                h_id[0] = i;
                sift_down(0u, n);
            }
        }
    }
    // Heapsort: the worst goes to the end, so the best ends first.
    for (var m = n; m > 1u; m--) {
        heap_swap(0u, m - 1u);
        sift_down(0u, m - 1u);
    }
    for (var j = 0u; j < n; j++) {
        cand[out_base + j] = vec2<u32>(h_key[j], h_id[j]);
    }
    for (var j = n; j < p.k_stride; j++) {
        cand[out_base + j] = vec2<u32>(0u, 0u);
    }
}
