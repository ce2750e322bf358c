// The bindings of the attention score kernels (attn_kq.wgsl, attn_kq_lanes.wgsl,
// attn_kq_tile.wgsl, which follow this file): q is [head_dim, n_head, n_tok], k the
// cache, [head_dim, n_head_kv, cells], read through k_load4 (any cache type,
// src/ops/shaders.rs), kq the scores, [n_head, n_tok, n_kv].

// `Params` is `AttnUniform` in src/ops/attention.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> k: array<{{K_ELEM}}>;
@group(0) @binding(3) var<storage, read_write> kq: array<f32>;
// [n_kv, n_tok]: -1e30 (or less) where a token may not see a cell.
@group(0) @binding(4) var<storage, read> mask: array<f32>;

{{K_LOAD}}
