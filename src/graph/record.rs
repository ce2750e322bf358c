//! Recording a node's dispatches: each op's kernel function called with the views of the
//! tensors it reads and writes, on the device the node runs on.

use super::builder::Op;
use crate::gpu::{Gpu, GpuError};
use crate::ops::add_rms_norm::add_rms_norm;
use crate::ops::add_scaled::add_scaled;
use crate::ops::attention::{attention, AttnViews};
use crate::ops::binary::binary_strided;
use crate::ops::get_rows::{get_rows, select_rows};
use crate::ops::glu::{glu, glu_pairs};
use crate::ops::layer_norm::layer_norm;
use crate::ops::matmul::{matmul_at, matmul_glu};
use crate::ops::matmul_q8::{matmul_q8_at, matmul_q8_glu, quantize_q8};
use crate::ops::moe::{matmul_id, moe_add_id, moe_group, moe_route, moe_sum, Pairs};
use crate::ops::rms_norm::rms_norm_rows;
use crate::ops::rope_store::{rope_store, RopeStoreViews};
use crate::ops::set_rows::set_rows;
use crate::ops::softmax::SoftmaxParams;
use crate::ops::ssm::{ssm_conv, ssm_scan, ScanViews};
use crate::ops::{Dispatch, View};

/// Appends the dispatches of one node of `op` over views `r` (its reads) and `w` (its
/// writes) to `dispatches`.
pub(super) fn record(
    gpu: &Gpu,
    op: &Op,
    r: &[View],
    w: &[View],
    dispatches: &mut Vec<Dispatch>,
) -> Result<(), GpuError> {
    match op {
        Op::GetRows { w: m, n_ids } => dispatches.extend(get_rows(gpu, m, &r[0], *n_ids, &w[0])?),
        Op::SelectRows {
            n_cols,
            n_rows,
            n_ids,
        } => dispatches.push(select_rows(
            gpu, &r[0], *n_cols, *n_rows, &r[1], *n_ids, &w[0],
        )?),
        Op::Matmul { w: m, n_tok, out } => {
            dispatches.extend(matmul_at(gpu, m, &r[0], *n_tok, &w[0], *out)?)
        }
        Op::MatmulGlu { w: m, n_tok, act } => {
            dispatches.extend(matmul_glu(gpu, m, &r[0], *n_tok, *act, &w[0], &w[1])?)
        }
        Op::QuantizeQ8 { k, n_tok } => dispatches.push(quantize_q8(gpu, &r[0], *k, *n_tok, &w[0])?),
        Op::MatmulQ8 { w: m, n_tok, out } => {
            dispatches.extend(matmul_q8_at(gpu, m, &r[0], *n_tok, &w[0], *out)?)
        }
        Op::MatmulQ8Glu { w: m, n_tok, act } => {
            dispatches.extend(matmul_q8_glu(gpu, m, &r[0], *n_tok, *act, &w[0], &w[1])?)
        }
        Op::RopeStore { p, shape, norm_eps } => {
            let io = RopeStoreViews {
                table: &r[0],
                qkv: &r[1],
                slots: &r[2],
                q: &w[0],
                k_cache: &w[1],
                v_cache: &w[2],
                norm: norm_eps.map(|eps| (&r[3], &r[4], eps)),
            };
            dispatches.push(rope_store(gpu, p, shape, &io)?)
        }
        Op::RmsNorm {
            n,
            rows,
            w_rows,
            eps,
        } => dispatches.push(rms_norm_rows(
            gpu,
            &r[0],
            &r[1],
            &w[0],
            [*n, *rows, *w_rows],
            *eps,
        )?),
        Op::LayerNorm { n, rows, eps } => dispatches.push(layer_norm(
            gpu,
            [&r[0], &r[1], &r[2]],
            &w[0],
            *n,
            *rows,
            *eps,
        )?),
        Op::AddRmsNorm { n, rows, eps } => dispatches.push(add_rms_norm(
            gpu, &r[0], &r[1], &r[2], &w[0], &w[1], *n, *rows, *eps,
        )?),
        Op::Binary { op, n, nb, div } => dispatches.push(binary_strided(
            gpu, *op, &r[0], &r[1], &w[0], *n, *nb, *div,
        )?),
        Op::Glu { act, n, pairs } => dispatches.push(match pairs {
            true => glu_pairs(gpu, *act, &r[0], &w[0], *n)?,
            false => glu(gpu, *act, &r[0], &r[1], &w[0], *n)?,
        }),
        Op::AddScaled { p } => dispatches.push(add_scaled(gpu, &r[0], &w[0], *p)?),
        Op::MoeRoute { routing, n_tok } => {
            dispatches.push(moe_route(gpu, routing, &r[0], *n_tok, &w[0], &w[1])?)
        }
        Op::MatmulId {
            w: m,
            n_expert,
            n_used,
            n_tok,
            x_per_pair,
            grouped,
        } => {
            let pairs = match grouped {
                true => Pairs::Grouped {
                    offsets: &r[1],
                    order: &r[2],
                },
                false => Pairs::Ids(&r[1]),
            };
            dispatches.extend(matmul_id(
                gpu,
                m,
                *n_expert,
                &r[0],
                *x_per_pair,
                pairs,
                *n_used,
                *n_tok,
                &w[0],
            )?)
        }
        Op::MoeGroup { n_pairs, n_expert } => {
            dispatches.push(moe_group(gpu, &r[0], *n_pairs, *n_expert, &w[0], &w[1])?)
        }
        Op::MoeAddId { rows, n_pairs } => dispatches.push(moe_add_id(
            gpu, &r[0], &r[1], &r[2], *rows, *n_pairs, &w[0],
        )?),
        Op::MoeSum {
            n_out,
            n_used,
            n_tok,
        } => dispatches.push(moe_sum(gpu, &r[0], &r[1], *n_out, *n_used, *n_tok, &w[0])?),
        Op::Attention { shape, sp } => {
            let io = AttnViews {
                q: &r[0],
                k: &r[1],
                v: &r[2],
                mask: &r[3],
                scores: &w[0],
                dst: &w[1],
                partials: &w[2],
                sinks: r.get(4),
            };
            dispatches.extend(attention(gpu, shape, sp, &io)?)
        }
        Op::SsmConv { shape, bias } => dispatches.push(ssm_conv(
            gpu,
            shape,
            &r[0],
            &r[1],
            &r[2],
            bias.then(|| &r[3]),
            &w[0],
            &w[1],
        )?),
        Op::SsmScan { shape } => {
            let v = ScanViews {
                x: &r[0],
                dt: &r[1],
                consts: &r[2],
                bc: &r[3],
                z: &r[4],
                state: &w[0],
                y: &w[1],
            };
            dispatches.push(ssm_scan(gpu, shape, &v)?)
        }
        Op::StoreRows { row_len, n_rows } => dispatches.push(set_rows(
            gpu,
            &r[0],
            &r[1],
            &w[0],
            *row_len,
            *n_rows,
            crate::kv::KvType::F32,
        )?),
        Op::SoftmaxRows { n_cols, rows } => {
            let sp = SoftmaxParams {
                scale: 1.0,
                max_bias: 0.0,
                n_head: 1,
                softcap: 0.0,
            };
            dispatches.push(crate::ops::softmax::softmax(
                gpu, &sp, None, &w[0], *n_cols, *rows,
            )?)
        }
    }
    Ok(())
}
