// Gathers rows `ids[t]` of a (possibly quantized) matrix into f32 rows: embeddings, and
// selecting the rows that need logits. The matrix may be one chunk of a split tensor:
// only ids inside [row_begin, row_begin + row_count) are written by this dispatch.

const WB_SLOTS: u32 = 1u;

// `Params` is `GetRowsUniform` in src/ops/get_rows.rs, prepended when the source is built.
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
    dst[t * p.n + j] = deq_elem((r - p.row_begin) * p.row_words, (p.n + QK - 1u) / QK, j);
}
