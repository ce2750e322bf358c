// The (token, expert) pairs of a ubatch grouped by expert, on the GPU (no host round trip),
// for the grouped expert products: offsets[e]..offsets[e + 1] index the pairs in `order`
// whose expert is e. One workgroup: each pair counted into its expert, the counts summed
// into offsets, then each pair placed in its expert's run. The order within a run is
// whatever the atomics give: each output is computed from its own pair alone, so it does
// not change a result.

const MAX_EXPERTS: u32 = 512u;

// `Params` is `MoeGroupUniform` in src/ops/moe.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> offsets: array<u32>;
@group(0) @binding(3) var<storage, read_write> order: array<u32>;

var<workgroup> counts: array<atomic<u32>, MAX_EXPERTS>;
var<workgroup> fill: array<atomic<u32>, MAX_EXPERTS>;
var<workgroup> base: array<u32, MAX_EXPERTS>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32) {
    for (var e = lid; e < p.n_expert; e += 256u) {
        atomicStore(&counts[e], 0u);
        atomicStore(&fill[e], 0u);
    }
    workgroupBarrier();
    for (var i = lid; i < p.n_pairs; i += 256u) {
        atomicAdd(&counts[min(ids[i], p.n_expert - 1u)], 1u);
    }
    workgroupBarrier();
    if (lid == 0u) {
        var sum = 0u;
        for (var e = 0u; e < p.n_expert; e++) {
            base[e] = sum;
            offsets[e] = sum;
            sum += atomicLoad(&counts[e]);
        }
        offsets[p.n_expert] = sum;
    }
    workgroupBarrier();
    for (var i = lid; i < p.n_pairs; i += 256u) {
        let e = min(ids[i], p.n_expert - 1u);
        order[base[e] + atomicAdd(&fill[e], 1u)] = i;
    }
}
