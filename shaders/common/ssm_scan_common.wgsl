// Shared by the two shapes of the selective scan (ssm_scan_rows.wgsl, ssm_scan_wg.wgsl).
//
// For each sequence, head h, channel i of the head and state value n, over the tokens t:
//   dt'  = softplus(dt[h, t] + dt_bias[h])
//   s[n] = s[n] * exp(dt' * A[h(, n)]) + B[g, n, t] * x[h, i, t] * dt'
//   y    = (sum_n s[n] * C[g, n, t] + x[h, i, t] * D[h]) * silu(z[h, i, t])
// with g the group of head h. Mamba: one channel per head, A per state value; Mamba-2:
// channels of a head share dt and one A. The state starts from `state` (the sequence's
// state, gathered from its cell) and ends there, for the graph to store back.
// act.wgsl (silu) is prepended.

// `Params` is `SsmScanUniform` in src/ops/ssm.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> state: array<f32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> dt: array<f32>;
@group(0) @binding(4) var<storage, read> consts: array<f32>;
@group(0) @binding(5) var<storage, read> bc: array<f32>;
@group(0) @binding(6) var<storage, read> z: array<f32>;
@group(0) @binding(7) var<storage, read_write> y: array<f32>;

// ggml's softplus: log(1 + e^v), v itself above 20.
fn softplus(v: f32) -> f32 {
    return select(log(1.0 + exp(v)), v, v > 20.0);
}

// The step of head h at global token tg: (dt', the decay exp(dt' * A) for per-head A).
fn head_step(h: u32, tg: u32) -> vec2<f32> {
    let d = softplus(dt[tg * p.dt_stride + h] + consts[p.dtb_off + h]);
    return vec2<f32>(d, exp(d * consts[p.a_off + h]));
}

// The decay of state value n of head h for step dt' (per state value: Mamba).
fn decay(h: u32, n: u32, step: vec2<f32>) -> f32 {
    if (p.a_per_state != 0u) {
        return exp(step.x * consts[p.a_off + h * p.d_state + n]);
    }
    return step.y;
}

// The output of channel ii (head h) at global token tg from the state's dot product.
fn out_value(ii: u32, h: u32, tg: u32, dot: f32, xv: f32) -> f32 {
    let yv = dot + xv * consts[p.d_off + h];
    return yv * silu(z[tg * p.z_stride + ii]);
}
