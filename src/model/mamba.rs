//! Mamba and Mamba-2: pre-norm residual blocks whose mixer is a state-space layer over
//! the recurrent memory, no attention and no feed-forward.
//!
//! A layer projects the normed input to the scan's input x and its gate z; runs x through
//! the short causal convolution (continuing each sequence's conv state) and SiLU; projects
//! that to dt, B and C (Mamba: from the convolution's output; Mamba-2: dt from the input,
//! B and C convolved with x); scans (continuing each sequence's SSM state), adds D x and
//! gates with SiLU(z) (Mamba-2 then norms the result per group); and projects back.
//! The ubatch's states are gathered from their cells first and stored back after.

use super::{output_head, GraphInput, GraphIo, Model, RsRows as Rows, SsmLayer};
use crate::gpu::GpuError;
use crate::graph::{Graph, GraphBuilder, TensorId};
use crate::memory::{Memory, RsLayer};
use crate::model::hparams::{Arch, Ssm};
use crate::ops::ssm::{ConvShape, ScanShape};

/// The tokens, the output rows, and the state rows.
pub fn inputs() -> Vec<GraphInput> {
    [
        vec![GraphInput::Tokens, GraphInput::OutIds],
        Rows::declare(),
    ]
    .concat()
}

pub fn build(m: &Model, io: &GraphIo, mem: &dyn Memory) -> Result<Graph, GpuError> {
    let (hp, w) = (&m.hp, &m.weights);
    let ssm = hp
        .ssm
        .ok_or_else(|| GpuError::Validation("a state-space model without ssm sizes".into()))?;
    let mut g = super::builder(m, io);
    let rows = Rows::new(&mut g, io)?;
    let tokens = g.input(io.tokens()?, [io.n_tok, 1]);
    let mut x = g.get_rows(&w.tok_embd, tokens);
    for (il, lw) in w.ssm.iter().enumerate() {
        g.layer(il);
        let rs = mem.rs_layer(il).ok_or_else(|| {
            GpuError::Validation(format!("the model's memory holds no state for layer {il}"))
        })?;
        let cur = g.rms_norm(x, &lw.norm, hp.eps);
        let y = match hp.arch {
            Arch::Mamba2 => mamba2_layer(&mut g, lw, &rs, &rows, ssm, hp.eps, cur)?,
            _ => mamba_layer(&mut g, lw, &rs, &rows, ssm, cur)?,
        };
        x = g.add(x, y);
    }
    output_head(g, m, io, x)
}

/// The layer's state buffers as graph tensors, and the ubatch's states gathered from
/// them: ((conv buffer, conv states), (SSM buffer, SSM states)).
type Gathered = ((TensorId, TensorId), (TensorId, TensorId));

fn gather(g: &mut GraphBuilder, rs: &RsLayer, rows: &Rows) -> Result<Gathered, GpuError> {
    let ssm = rs
        .ssm
        .ok_or_else(|| GpuError::Validation("a state-space layer without SSM states".into()))?;
    let per = |v: &crate::ops::View| (v.size / 4 / rs.rows as u64) as u32;
    let conv_all = g.input(rs.conv.clone(), [per(rs.conv), rs.rows]);
    let ssm_all = g.input(ssm.clone(), [per(ssm), rs.rows]);
    let conv = g.select_rows(conv_all, rows.src);
    let state = g.select_rows(ssm_all, rows.src);
    Ok(((conv_all, conv), (ssm_all, state)))
}

/// The convolution (with its bias, through SiLU) of x ([channels, n_tok]) from the
/// gathered conv states, whose new values are stored back to the ubatch's cells.
fn conv_silu(
    g: &mut GraphBuilder,
    lw: &SsmLayer,
    (conv_all, conv): (TensorId, TensorId),
    rows: &Rows,
    s: Ssm,
    x: TensorId,
) -> TensorId {
    let ch = g.ne(x)[0];
    let shape = ConvShape {
        ch,
        k: s.d_conv,
        n_t: rows.n_t,
        n_s: rows.n_s,
        x_stride: ch,
        silu: true,
    };
    let (y, new_conv) = g.ssm_conv(conv, x, &lw.conv, Some(&lw.conv_b), shape);
    g.store_rows(new_conv, rows.dst, conv_all);
    y
}

/// Mamba: x and z from the input; conv + SiLU; dt's input, B and C from the convolved x;
/// dt = its projection; the scan with per-state A.
fn mamba_layer(
    g: &mut GraphBuilder,
    lw: &SsmLayer,
    rs: &RsLayer,
    rows: &Rows,
    s: Ssm,
    cur: TensorId,
) -> Result<TensorId, GpuError> {
    let missing =
        || GpuError::Validation("a Mamba layer without its dt and B/C projections".into());
    let ((conv_all, conv), (ssm_all, state)) = gather(g, rs, rows)?;
    let di = s.d_inner;
    let xi = g.matmul(&lw.in_x, cur);
    let z = g.matmul(&lw.in_z, cur);
    let xc = conv_silu(g, lw, (conv_all, conv), rows, s, xi);
    let dt_in = g.matmul(lw.x_dt.as_ref().ok_or_else(missing)?, xc);
    let bc = g.matmul(lw.x_bc.as_ref().ok_or_else(missing)?, xc);
    let dt = g.matmul(lw.dt.as_ref().ok_or_else(missing)?, dt_in);
    let ds = s.d_state;
    let scan = ScanShape {
        d_state: ds,
        head_dim: 1,
        n_head: di,
        n_group: 1,
        n_t: rows.n_t,
        n_s: rows.n_s,
        x_stride: di,
        dt_stride: di,
        bc_stride: 2 * ds,
        b_off: 0,
        c_off: ds,
        z_stride: di,
        a_per_state: true,
        a_off: 0,
        d_off: ds * di,
        dtb_off: ds * di + di,
    };
    let y = g.ssm_scan(state, [xc, dt, bc, z], &lw.consts, scan);
    g.store_rows(state, rows.dst, ssm_all);
    Ok(g.matmul(&lw.out, y))
}

/// Mamba-2: z, x B C and dt from the input; conv + SiLU over x B C; the scan with one A
/// per head and B, C per group; the gated output normed per group.
fn mamba2_layer(
    g: &mut GraphBuilder,
    lw: &SsmLayer,
    rs: &RsLayer,
    rows: &Rows,
    s: Ssm,
    eps: f32,
    cur: TensorId,
) -> Result<TensorId, GpuError> {
    let missing =
        || GpuError::Validation("a Mamba-2 layer without its dt projection or norm".into());
    let ((conv_all, conv), (ssm_all, state)) = gather(g, rs, rows)?;
    let (di, ds, nh, ng) = (s.d_inner, s.d_state, s.dt_rank, s.n_group);
    let ch = s.conv_channels(Arch::Mamba2);
    let z = g.matmul(&lw.in_z, cur);
    let xbc = g.matmul(&lw.in_x, cur);
    let dt = g.matmul(lw.in_dt.as_ref().ok_or_else(missing)?, cur);
    let xc = conv_silu(g, lw, (conv_all, conv), rows, s, xbc);
    let scan = ScanShape {
        d_state: ds,
        head_dim: di / nh,
        n_head: nh,
        n_group: ng,
        n_t: rows.n_t,
        n_s: rows.n_s,
        x_stride: ch,
        dt_stride: nh,
        bc_stride: ch,
        b_off: di,
        c_off: di + ng * ds,
        z_stride: di,
        a_per_state: false,
        a_off: 0,
        d_off: nh,
        dtb_off: 2 * nh,
    };
    let y = g.ssm_scan(state, [xc, dt, xc, z], &lw.consts, scan);
    g.store_rows(state, rows.dst, ssm_all);
    let y = g.rms_norm_groups(y, lw.out_norm.as_ref().ok_or_else(missing)?, ng, eps);
    Ok(g.matmul(&lw.out, y))
}
