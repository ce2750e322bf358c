// Sampling, second pass, CPU-shaped: one invocation per row merges the first pass's
// per-segment lists (each best first) into the row's k best, sorted by larger logit
// first and ties by token id, runs llama.cpp's chain and the draw, and records the token
// in the penalty history — what sample_chain_wg.wgsl does with a workgroup, without
// barriers. The merge keeps a heap of the segments by their next candidate: k steps of
// at most 8 levels. Dispatch: (rows).

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> rows: array<SampleRow>;
@group(0) @binding(2) var<storage, read> cand: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read_write> counts: array<u32>;
@group(0) @binding(4) var<storage, read_write> ring: array<u32>;
@group(0) @binding(5) var<storage, read_write> result: array<vec2<u32>>;
@group(0) @binding(6) var<storage, read_write> probs: array<vec2<u32>>;

var<private> o_key: array<u32, 256>;
var<private> o_id: array<u32, 256>;
var<private> o_v: array<f32, 256>;

var<private> row: SampleRow;
var<private> in_base: u32;

// Segments (at most MAX_SEG) by their next candidate, the best at the root; `next` is
// each segment's position in its list.
var<private> segs: array<u32, 256>;
var<private> next: array<u32, 256>;

fn head(s: u32) -> vec2<u32> {
    if (next[s] >= p.k_stride) {
        return vec2<u32>(0u, 0u);
    }
    return cand[in_base + s * p.k_stride + next[s]];
}

// The segment at place a has a better next candidate than the one at b.
fn heap_above(a: u32, b: u32) -> bool {
    let x = head(segs[a]);
    let y = head(segs[b]);
    return x.x > y.x || (x.x == y.x && x.y < y.y);
}

fn heap_swap(a: u32, b: u32) {
    let t = segs[a];
    segs[a] = segs[b];
    segs[b] = t;
}

@compute @workgroup_size(1)
fn main(@builtin(workgroup_id) wid: vec3<u32>) {
    row = rows[wid.x];
    in_base = wid.x * p.n_seg * p.k_stride;
    let k = min(row.k, p.k_stride);
    var h = 0u;
    for (var s = 0u; s < p.n_seg; s++) {
        next[s] = 0u;
        segs[h] = s;
        if (head(s).x != 0u) {
            sift_up(h);
            h++;
        }
    }
    var n = 0u;
    for (; n < k && h > 0u; n++) {
        let s = segs[0];
        let c = head(s);
        o_key[n] = c.x;
        o_id[n] = c.y;
        next[s]++;
        if (head(s).x == 0u) {
            h--;
            segs[0] = segs[h];
        }
        sift_down(0u, h);
    }
    finish_row(wid.x, n);
}
