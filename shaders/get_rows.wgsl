// Gathers rows `ids[t]` of a (possibly quantized) matrix into f32 rows: embeddings, and
// selecting the rows that need logits. The matrix may be one chunk of a split tensor:
// only ids inside [row_begin, row_begin + row_count) are written by this dispatch.
struct Params {
    n: u32,          // elements per row
    row_words: u32,  // words per row in the GPU layout
    row_begin: u32,
    row_count: u32,
    n_ids: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

const WB_SLOTS: u32 = 1u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = gid.x;
    let t = gid.y;
    if (j >= p.n || t >= p.n_ids) {
        return;
    }
    let r = ids[t];
    if (r < p.row_begin || r >= p.row_begin + p.row_count) {
        return;
    }
    dst[t * p.n + j] = deq_elem((r - p.row_begin) * p.row_words, j);
}
