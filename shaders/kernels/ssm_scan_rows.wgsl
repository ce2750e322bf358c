// The selective scan on CPU-shaped adapters: one invocation per (channel, sequence)
// keeps the channel's DS state values in its own array and walks the tokens in order.
// ssm_scan_common.wgsl (bindings, the step) is prepended.

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let d_inner = p.n_head * p.head_dim;
    let ii = gid.x;
    let s = gid.y;
    if (ii >= d_inner || s >= p.n_s) {
        return;
    }
    let h = ii / p.head_dim;
    let g = h / (p.n_head / p.n_group);
    let base = (s * d_inner + ii) * p.d_state;
    var st: array<f32, DS>;
    for (var n = 0u; n < p.d_state; n++) {
        st[n] = state[base + n];
    }
    for (var t = 0u; t < p.n_t; t++) {
        let tg = s * p.n_t + t;
        let step = head_step(h, tg);
        let xv = x[tg * p.x_stride + ii];
        let x_dt = xv * step.x;
        let bb = tg * p.bc_stride + p.b_off + g * p.d_state;
        let cc = tg * p.bc_stride + p.c_off + g * p.d_state;
        var dot = 0.0;
        for (var n = 0u; n < p.d_state; n++) {
            st[n] = st[n] * decay(h, n, step) + bc[bb + n] * x_dt;
            dot += st[n] * bc[cc + n];
        }
        y[tg * d_inner + ii] = out_value(ii, h, tg, dot, xv);
    }
    for (var n = 0u; n < p.d_state; n++) {
        state[base + n] = st[n];
    }
}
