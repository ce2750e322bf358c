// The short causal convolution of Mamba's and LFM2's recurrent layers: each channel c
// of token t is the dot product of the channel's K weights with the last K values of
// that channel (the K - 1 values carried in the sequence's state, then the ubatch's
// tokens), plus the bias and through SiLU where asked. One invocation per (channel,
// token): the outputs do not depend on each other. The invocation of a sequence's last
// token also writes the sequence's new state (its last K - 1 values per channel) to
// `new_state`, which the graph then stores in the sequence's cell.
//
// Layouts: state and new_state [(K - 1) per channel, ch, n_s]; x [x_stride, n_t * n_s]
// (sequence s's tokens are rows s * n_t ..); w [K, ch]; y [ch, n_t * n_s].
// act.wgsl (silu) is prepended.

// `Params` is `SsmConvUniform` in src/ops/ssm.rs, prepended when the source is built.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> state: array<f32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<f32>;
@group(0) @binding(4) var<storage, read> b: array<f32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;
@group(0) @binding(6) var<storage, read_write> new_state: array<f32>;

// Value i of channel c's input of sequence s: the state's K - 1 values, then the tokens.
fn input(c: u32, s: u32, i: u32) -> f32 {
    let carried = p.k - 1u;
    if (i < carried) {
        return state[(s * p.ch + c) * carried + i];
    }
    return x[(s * p.n_t + i - carried) * p.x_stride + c];
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    let tg = gid.y;
    if (c >= p.ch || tg >= p.n_t * p.n_s) {
        return;
    }
    let s = tg / p.n_t;
    let t = tg % p.n_t;
    var sum = 0.0;
    for (var j = 0u; j < p.k; j++) {
        sum += input(c, s, t + j) * w[c * p.k + j];
    }
    if (p.bias != 0u) {
        sum += b[c];
    }
    if (p.silu != 0u) {
        sum = silu(sum);
    }
    y[tg * p.ch + c] = sum;
    if (t + 1u == p.n_t) {
        let carried = p.k - 1u;
        for (var j = 0u; j < carried; j++) {
            new_state[(s * p.ch + c) * carried + j] = input(c, s, p.n_t + j);
        }
    }
}
