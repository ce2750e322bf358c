// The selective scan on GPUs: a workgroup of 256 holds 256 / DS channels of a sequence,
// one state value per invocation; each token's output is the sum over the channel's DS
// invocations, reduced in workgroup memory. DS is d_state rounded up to a power of two
// (the extra invocations hold zeros). ssm_scan_common.wgsl is prepended.

const PER: u32 = 256u / DS;

var<workgroup> red: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let d_inner = p.n_head * p.head_dim;
    let n = lid % DS;
    let lane0 = lid - n;
    let ii_raw = wid.x * PER + lid / DS;
    let s = wid.y;
    let valid = ii_raw < d_inner && n < p.d_state;
    // Invocations past the end compute on channel 0 and write nothing.
    let ii = select(0u, ii_raw, ii_raw < d_inner);
    let h = ii / p.head_dim;
    let g = h / (p.n_head / p.n_group);
    let nn = min(n, p.d_state - 1u);
    let at = (s * d_inner + ii) * p.d_state + nn;
    var st = select(0.0, state[at], valid);
    for (var t = 0u; t < p.n_t; t++) {
        let tg = s * p.n_t + t;
        let step = head_step(h, tg);
        let xv = x[tg * p.x_stride + ii];
        let row = tg * p.bc_stride + g * p.d_state + nn;
        st = st * decay(h, nn, step) + bc[row + p.b_off] * (xv * step.x);
        red[lid] = select(0.0, st * bc[row + p.c_off], valid);
        workgroupBarrier();
        for (var stride = DS / 2u; stride > 0u; stride >>= 1u) {
            if (n < stride) {
                red[lid] += red[lid + stride];
            }
            workgroupBarrier();
        }
        if (n == 0u && ii_raw < d_inner) {
            y[tg * d_inner + ii] = out_value(ii, h, tg, red[lane0], xv);
        }
        workgroupBarrier();
    }
    if (valid) {
        state[at] = st;
    }
}
