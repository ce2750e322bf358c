//! Fusions the graph makes by itself, so that architecture files write the plain ops.
//!
//! A residual add whose sum an RMS norm reads next becomes one `AddRmsNorm` node: the add
//! writes the sum and its norm in one pass over the row (llama.cpp's Vulkan backend fuses
//! the same pair). Every layer of a pre-norm transformer ends in one (the residual add, then
//! the next layer's attention norm or the output norm) and has one inside (the attention's
//! residual, then the feed-forward norm).

use super::builder::{Node, Op, TensorId};
use crate::ops::add_rms_norm::AddRmsNormNode;
use crate::ops::binary::{BinaryNode, BinaryOp};
use crate::ops::rms_norm::RmsNormNode;

/// Fuses each add of two tensors of one shape with the first RMS norm (one weight row) of
/// its sum on the same device, where no node between them writes the sum: the fused node
/// takes the add's place, and the norm's node goes.
pub(super) fn add_rms_norm(nodes: &mut Vec<Node>, devices: &mut Vec<usize>) {
    let mut i = 0;
    while i < nodes.len() {
        if let Some(j) = norm_of_sum(nodes, devices, i) {
            let norm = nodes.remove(j);
            devices.remove(j);
            if let Op::RmsNorm(RmsNormNode { n, rows, eps, .. }) = norm.op {
                let add = &mut nodes[i];
                add.op = Op::AddRmsNorm(AddRmsNormNode { n, rows, eps });
                add.reads = vec![add.reads[0], add.reads[1], norm.reads[1]];
                add.writes = vec![add.writes[0], norm.writes[0]];
            }
        }
        i += 1;
    }
}

/// The node after `i` that RMS-norms the sum node `i` writes, if `i` is such an add and
/// the norm can move up to it.
fn norm_of_sum(nodes: &[Node], devices: &[usize], i: usize) -> Option<usize> {
    let Op::Binary(BinaryNode {
        op: BinaryOp::Add,
        n,
        nb,
        div: 1,
    }) = nodes[i].op
    else {
        return None;
    };
    let sum: TensorId = *nodes[i].writes.first()?;
    if nb != n || nodes[i].writes.len() != 1 {
        return None;
    }
    for (j, node) in nodes.iter().enumerate().skip(i + 1) {
        if let Op::RmsNorm(RmsNormNode {
            n: row,
            rows,
            w_rows: 1,
            ..
        }) = node.op
        {
            if node.reads[0] == sum && row * rows == n && devices[j] == devices[i] {
                return Some(j);
            }
        }
        // The norm would read the sum before this write.
        if node.writes.contains(&sum) {
            return None;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::get_rows::SelectRowsNode;

    fn add(a: TensorId, b: TensorId, sum: TensorId, n: u32, nb: u32) -> Node {
        let op = Op::Binary(BinaryNode {
            op: BinaryOp::Add,
            n,
            nb,
            div: 1,
        });
        Node {
            op,
            reads: vec![a, b],
            writes: vec![sum],
        }
    }

    fn norm(x: TensorId, w: TensorId, dst: TensorId) -> Node {
        let op = Op::RmsNorm(RmsNormNode {
            n: 8,
            rows: 2,
            w_rows: 1,
            eps: 1e-6,
        });
        Node {
            op,
            reads: vec![x, w],
            writes: vec![dst],
        }
    }

    fn other(reads: &[TensorId], writes: &[TensorId]) -> Node {
        let op = Op::SelectRows(SelectRowsNode {
            n_cols: 8,
            n_rows: 2,
            n_ids: 2,
        });
        Node {
            op,
            reads: reads.to_vec(),
            writes: writes.to_vec(),
        }
    }

    /// A residual add and the next norm of its sum, with a node between that reads the
    /// sum: one fused node in the add's place, then the node between.
    #[test]
    fn an_add_and_the_norm_of_its_sum_fuse() {
        let mut nodes = vec![add(0, 1, 2, 16, 16), other(&[2], &[3]), norm(2, 4, 5)];
        let mut devices = vec![0, 0, 0];
        add_rms_norm(&mut nodes, &mut devices);
        assert_eq!(nodes.len(), 2);
        assert_eq!(devices, vec![0, 0]);
        assert!(matches!(
            nodes[0].op,
            Op::AddRmsNorm(AddRmsNormNode { n: 8, rows: 2, .. })
        ));
        assert_eq!(nodes[0].reads, vec![0, 1, 4]);
        assert_eq!(nodes[0].writes, vec![2, 5]);
        assert!(matches!(nodes[1].op, Op::SelectRows(SelectRowsNode { .. })));
    }

    /// Left alone: the norm on another device (a layer split), a write to the sum between
    /// (the norm would read it early), an add that broadcasts b over rows (a bias), a norm
    /// with a weight row per group.
    #[test]
    fn what_cannot_move_stays() {
        let cases: Vec<(Vec<Node>, Vec<usize>)> = vec![
            (vec![add(0, 1, 2, 16, 16), norm(2, 4, 5)], vec![0, 1]),
            (
                vec![add(0, 1, 2, 16, 16), other(&[3], &[2]), norm(2, 4, 5)],
                vec![0, 0, 0],
            ),
            (vec![add(0, 1, 2, 16, 8), norm(2, 4, 5)], vec![0, 0]),
            (
                vec![add(0, 1, 2, 16, 16), {
                    let mut n = norm(2, 4, 5);
                    n.op = Op::RmsNorm(RmsNormNode {
                        n: 4,
                        rows: 4,
                        w_rows: 2,
                        eps: 1e-6,
                    });
                    n
                }],
                vec![0, 0],
            ),
        ];
        for (i, (mut nodes, mut devices)) in cases.into_iter().enumerate() {
            let before = nodes.len();
            add_rms_norm(&mut nodes, &mut devices);
            assert_eq!(nodes.len(), before, "case {i}");
            assert!(
                !nodes
                    .iter()
                    .any(|n| matches!(n.op, Op::AddRmsNorm(AddRmsNormNode { .. }))),
                "case {i}"
            );
        }
    }
}
