//! The ops of recurrent layers: the short causal convolution (Mamba's conv1d, LFM2's
//! gated short convolution) and the selective scan (Mamba's and Mamba-2's SSM).
//!
//! Both work on a ubatch of `n_s` sequences with `n_t` tokens each (the recurrent
//! memory's equal split: sequence s's tokens are rows `s * n_t ..`), starting from each
//! sequence's state as the graph gathered it from its cell; they leave the new states
//! for the graph to store back.

use super::kernels::{by_shape, kernel_files, shape_suffix, Family, SHAPES};
use super::node::{GraphOp, OpCost, F32_BYTES};
use super::shaders::{compose, ACT};
use super::uniforms::uniform_struct;
use super::{record, Dispatch, KernelKey, View};
use crate::gpu::{Gpu, GpuError, KernelShape};

/// The shape of a convolution: `ch` channels of width `k`, `n_s` sequences of `n_t`
/// tokens, x rows `x_stride` values apart (a slice of a wider projection).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvShape {
    pub ch: u32,
    pub k: u32,
    pub n_t: u32,
    pub n_s: u32,
    pub x_stride: u32,
    /// SiLU on the output (Mamba; LFM2 gates it instead).
    pub silu: bool,
}

impl ConvShape {
    /// Values of one sequence's state: the last k - 1 inputs of each channel.
    pub fn state_len(&self) -> u32 {
        (self.k - 1) * self.ch
    }
}

/// y = act(conv(state ++ x) + bias) per channel (see `ssm_conv.wgsl`); the new states go
/// to `new_state` ([state_len, n_s]).
#[allow(clippy::too_many_arguments)]
pub fn ssm_conv(
    gpu: &Gpu,
    s: &ConvShape,
    state: &View,
    x: &View,
    w: &View,
    bias: Option<&View>,
    y: &View,
    new_state: &View,
) -> Result<Dispatch, GpuError> {
    if s.k < 2 {
        return Err(GpuError::Validation(format!(
            "ssm_conv: a kernel of width {} carries no state",
            s.k
        )));
    }
    let pipeline = gpu.pipeline(KernelKey::Ssm(Kernel::Conv))?;
    let params = SsmConvUniform {
        ch: s.ch,
        k: s.k,
        n_t: s.n_t,
        n_s: s.n_s,
        x_stride: s.x_stride,
        bias: bias.is_some() as u32,
        silu: s.silu as u32,
        ..Default::default()
    };
    record(
        gpu,
        "ssm_conv",
        pipeline,
        bytemuck::bytes_of(&params),
        &[state, x, w, bias.unwrap_or(w), y, new_state],
        [s.ch.div_ceil(64), s.n_t * s.n_s, 1],
    )
}

/// CPU reference of [`ssm_conv`]: (y, new states).
pub fn ssm_conv_ref(
    s: &ConvShape,
    state: &[f32],
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
) -> (Vec<f32>, Vec<f32>) {
    let (ch, k, nt) = (s.ch as usize, s.k as usize, s.n_t as usize);
    let carried = k - 1;
    let mut y = vec![0f32; ch * nt * s.n_s as usize];
    let mut new_state = vec![0f32; carried * ch * s.n_s as usize];
    for seq in 0..s.n_s as usize {
        for c in 0..ch {
            let input = |i: usize| {
                if i < carried {
                    state[(seq * ch + c) * carried + i]
                } else {
                    x[(seq * nt + i - carried) * s.x_stride as usize + c]
                }
            };
            for t in 0..nt {
                let mut sum = 0f32;
                for j in 0..k {
                    sum += input(t + j) * w[c * k + j];
                }
                if let Some(b) = bias {
                    sum += b[c];
                }
                if s.silu {
                    sum = silu(sum);
                }
                y[(seq * nt + t) * ch + c] = sum;
            }
            for j in 0..carried {
                new_state[(seq * ch + c) * carried + j] = input(nt + j);
            }
        }
    }
    (y, new_state)
}

fn silu(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}

fn softplus(v: f32) -> f32 {
    if v > 20.0 {
        v
    } else {
        (1.0 + v.exp()).ln()
    }
}

/// Where the scan's operands sit: x, dt, B/C and z rows (in f32) and the offsets of B
/// and C in theirs, and of A, D and the dt bias in the constants buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScanShape {
    pub d_state: u32,
    pub head_dim: u32,
    pub n_head: u32,
    pub n_group: u32,
    pub n_t: u32,
    pub n_s: u32,
    pub x_stride: u32,
    pub dt_stride: u32,
    pub bc_stride: u32,
    pub b_off: u32,
    pub c_off: u32,
    pub z_stride: u32,
    /// A has one value per state value of each head (Mamba), else one per head (Mamba-2).
    pub a_per_state: bool,
    pub a_off: u32,
    pub d_off: u32,
    pub dtb_off: u32,
}

impl ScanShape {
    pub fn d_inner(&self) -> u32 {
        self.n_head * self.head_dim
    }
    /// Values of one sequence's state.
    pub fn state_len(&self) -> u32 {
        self.d_inner() * self.d_state
    }
    /// The state-size variant that holds d_state values.
    fn ds(&self) -> Option<u32> {
        SSM_DS.iter().copied().find(|&ds| ds >= self.d_state)
    }
}

/// The largest d_state the scan holds.
pub fn max_d_state() -> u32 {
    SSM_DS.iter().copied().max().unwrap_or(0)
}

/// The views the scan reads and writes.
pub struct ScanViews<'a> {
    /// [state_len, n_s], read and overwritten with the final states.
    pub state: &'a View,
    pub x: &'a View,
    pub dt: &'a View,
    /// A, D and the dt bias (see [`ScanShape`]).
    pub consts: &'a View,
    pub bc: &'a View,
    pub z: &'a View,
    /// [d_inner, n_t * n_s].
    pub y: &'a View,
}

/// The selective scan (see `ssm_scan_common.wgsl`): one invocation per channel on
/// CPU-shaped adapters, a workgroup per 256 / DS channels on GPUs.
pub fn ssm_scan(gpu: &Gpu, s: &ScanShape, v: &ScanViews) -> Result<Dispatch, GpuError> {
    let ds = s.ds().ok_or_else(|| {
        GpuError::Validation(format!(
            "ssm_scan: states of {} values are more than the kernels hold ({})",
            s.d_state,
            max_d_state()
        ))
    })?;
    if s.n_group == 0 || !s.n_head.is_multiple_of(s.n_group) || s.d_state == 0 {
        return Err(GpuError::Validation(format!(
            "ssm_scan: {} heads do not split into {} groups",
            s.n_head, s.n_group
        )));
    }
    let shape = gpu.kernels;
    let wg = shape == KernelShape::Gpu;
    let pipeline = gpu.pipeline(KernelKey::Ssm(Kernel::Scan { ds, shape }))?;
    let params = SsmScanUniform {
        d_state: s.d_state,
        head_dim: s.head_dim,
        n_head: s.n_head,
        n_group: s.n_group,
        n_t: s.n_t,
        n_s: s.n_s,
        x_stride: s.x_stride,
        dt_stride: s.dt_stride,
        bc_stride: s.bc_stride,
        b_off: s.b_off,
        c_off: s.c_off,
        z_stride: s.z_stride,
        a_per_state: s.a_per_state as u32,
        a_off: s.a_off,
        d_off: s.d_off,
        dtb_off: s.dtb_off,
    };
    let per_group = if wg { 256 / ds } else { 64 };
    record(
        gpu,
        "ssm_scan",
        pipeline,
        bytemuck::bytes_of(&params),
        &[v.state, v.x, v.dt, v.consts, v.bc, v.z, v.y],
        [s.d_inner().div_ceil(per_group), s.n_s, 1],
    )
}

/// CPU reference of [`ssm_scan`], in ggml's order of operations: (y, final states).
#[allow(clippy::too_many_arguments)]
pub fn ssm_scan_ref(
    s: &ScanShape,
    state: &[f32],
    x: &[f32],
    dt: &[f32],
    consts: &[f32],
    bc: &[f32],
    z: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let (ds, nr, nh) = (s.d_state as usize, s.head_dim as usize, s.n_head as usize);
    let d_inner = nr * nh;
    let nt = s.n_t as usize;
    let heads_per_group = nh / s.n_group as usize;
    let mut st = state.to_vec();
    let mut y = vec![0f32; d_inner * nt * s.n_s as usize];
    let c = |i: u32| consts[i as usize];
    for seq in 0..s.n_s as usize {
        for t in 0..nt {
            let tg = seq * nt + t;
            for h in 0..nh {
                let dsp = softplus(dt[tg * s.dt_stride as usize + h] + c(s.dtb_off + h as u32));
                let g = h / heads_per_group;
                for i1 in 0..nr {
                    let ii = h * nr + i1;
                    let xv = x[tg * s.x_stride as usize + ii];
                    let x_dt = xv * dsp;
                    let row = tg * s.bc_stride as usize + g * ds;
                    let mut sum = 0f32;
                    for n in 0..ds {
                        let a = if s.a_per_state {
                            c(s.a_off + (h * ds + n) as u32)
                        } else {
                            c(s.a_off + h as u32)
                        };
                        let at = (seq * d_inner + ii) * ds + n;
                        let v = st[at] * (dsp * a).exp() + bc[row + s.b_off as usize + n] * x_dt;
                        sum += v * bc[row + s.c_off as usize + n];
                        st[at] = v;
                    }
                    let yv = sum + xv * c(s.d_off + h as u32);
                    y[tg * d_inner + ii] = yv * silu(z[tg * s.z_stride as usize + ii]);
                }
            }
        }
    }
    (y, st)
}

/// State sizes (d_state, rounded up to one of these) the selective scan has variants for.
pub const SSM_DS: &[u32] = &[16, 32, 64, 128, 256];

uniform_struct! {
    /// ssm_conv: a causal depthwise convolution of width `k` over `ch` channels, for
    /// `n_s` sequences of `n_t` tokens each; x rows are `x_stride` values apart.
    SsmConvUniform {
        ch: u32,
        k: u32,
        n_t: u32,
        n_s: u32,
        x_stride: u32,
        /// 1: add the bias (binding 4) before the activation.
        bias: u32,
        /// 1: SiLU on the output.
        silu: u32,
        _pad0: u32,
    }
}

uniform_struct! {
    /// ssm_scan: the selective scan over `n_s` sequences of `n_t` tokens, `n_head` heads
    /// of `head_dim` channels, states of `d_state` values; B and C in `n_group` groups.
    /// Row strides and offsets (in f32) say where x, dt, B, C and z sit in their tensors;
    /// A (`a_per_state`: one per state value, Mamba; else one per head, Mamba-2), D and
    /// the dt bias sit in one constants buffer at `a_off`, `d_off`, `dtb_off`.
    SsmScanUniform {
        d_state: u32,
        head_dim: u32,
        n_head: u32,
        n_group: u32,
        n_t: u32,
        n_s: u32,
        x_stride: u32,
        dt_stride: u32,
        bc_stride: u32,
        b_off: u32,
        c_off: u32,
        z_stride: u32,
        a_per_state: u32,
        a_off: u32,
        d_off: u32,
        dtb_off: u32,
    }
}

kernel_files! {
    SSM_CONV = "kernels/ssm_conv.wgsl";
    SSM_SCAN_COMMON = "common/ssm_scan_common.wgsl";
    SSM_SCAN_ROWS = "kernels/ssm_scan_rows.wgsl";
    SSM_SCAN_WG = "kernels/ssm_scan_wg.wgsl";
}

/// The recurrent layers' kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// The short causal convolution (Mamba, LFM2).
    Conv,
    /// The selective scan with states of up to `ds` values: an invocation per channel
    /// (CPU-shaped) or a workgroup per 256 / `ds` channels (GPU-shaped).
    Scan { ds: u32, shape: KernelShape },
}

impl Family for Kernel {
    const FILES: &'static [(&'static str, &'static str)] = FILES;
    fn variants() -> Vec<Self> {
        let scans = SSM_DS
            .iter()
            .flat_map(|&ds| SHAPES.map(|shape| Kernel::Scan { ds, shape }));
        std::iter::once(Kernel::Conv).chain(scans).collect()
    }
    fn body(&self) -> Result<String, String> {
        Ok(match *self {
            Kernel::Conv => compose(&[ACT, SSM_CONV], &[]),
            Kernel::Scan { ds, shape } => compose(
                &[
                    &format!("const DS: u32 = {ds}u;"),
                    ACT,
                    SSM_SCAN_COMMON,
                    by_shape(shape, SSM_SCAN_ROWS, SSM_SCAN_WG),
                ],
                &[],
            ),
        })
    }
    fn uniform_wgsl(&self) -> &'static str {
        match self {
            Kernel::Conv => SsmConvUniform::WGSL,
            Kernel::Scan { .. } => SsmScanUniform::WGSL,
        }
    }
    fn workgroup_size(&self) -> u32 {
        match *self {
            Kernel::Scan { shape, .. } => by_shape(shape, 64, 256),
            Kernel::Conv => 64,
        }
    }
    fn cpu_shaped(&self) -> bool {
        matches!(
            self,
            Kernel::Scan {
                shape: KernelShape::Cpu,
                ..
            }
        )
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Kernel::Conv => write!(f, "ssm_conv"),
            Kernel::Scan { ds, shape } => {
                write!(f, "ssm_scan_ds{ds}{}", shape_suffix(shape))
            }
        }
    }
}

/// The graph's `Op::SsmConv`: reads [state, x, w(, bias)], writes [y, new_state]
pub struct SsmConvNode {
    pub shape: ConvShape,
    pub bias: bool,
}

impl GraphOp for SsmConvNode {
    fn kind(&self) -> String {
        "ssm_conv".into()
    }

    fn cost(&self) -> OpCost {
        let Self { shape: s, .. } = self;
        let n = s.ch as u64 * s.n_t as u64 * s.n_s as u64;
        let state = 2 * s.state_len() as u64 * s.n_s as u64;
        OpCost::new(
            (2 * n + state + s.ch as u64 * s.k as u64) * F32_BYTES,
            2 * n * s.k as u64,
        )
    }

    fn record(
        &self,
        gpu: &Gpu,
        r: &[View],
        w: &[View],
        dispatches: &mut Vec<Dispatch>,
    ) -> Result<(), GpuError> {
        let Self { shape, bias } = self;
        dispatches.push(ssm_conv(
            gpu,
            shape,
            &r[0],
            &r[1],
            &r[2],
            bias.then(|| &r[3]),
            &w[0],
            &w[1],
        )?);
        Ok(())
    }
}

/// The graph's `Op::SsmScan`: reads [x, dt, consts, bc, z], writes [state, y] (the state is
/// read too)
pub struct SsmScanNode {
    pub shape: ScanShape,
}

impl GraphOp for SsmScanNode {
    fn kind(&self) -> String {
        "ssm_scan".into()
    }

    fn cost(&self) -> OpCost {
        let Self { shape: s } = self;
        let tok = s.n_t as u64 * s.n_s as u64;
        let d = s.d_inner() as u64;
        let state = 2 * s.state_len() as u64 * s.n_s as u64;
        let bc = 2 * (s.n_group * s.d_state) as u64;
        // x, z in and y out per channel, dt per head, B and C per token; per
        // state value an exp, the update and the dot product.
        let bytes = (state + tok * (3 * d + s.n_head as u64 + bc)) * F32_BYTES;
        OpCost::new(bytes, tok * d * s.d_state as u64 * 6)
    }

    fn record(
        &self,
        gpu: &Gpu,
        r: &[View],
        w: &[View],
        dispatches: &mut Vec<Dispatch>,
    ) -> Result<(), GpuError> {
        let Self { shape } = self;
        let v = ScanViews {
            x: &r[0],
            dt: &r[1],
            consts: &r[2],
            bc: &r[3],
            z: &r[4],
            state: &w[0],
            y: &w[1],
        };
        dispatches.push(ssm_scan(gpu, shape, &v)?);
        Ok(())
    }
}
