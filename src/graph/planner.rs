//! Lifetime-based buffer reuse: an intermediate lives from the node that first writes it
//! to the last node that touches it; afterwards its buffer serves later intermediates.

use super::builder::Storage;

pub(super) struct Plan {
    /// For each tensor: the scratch buffer it uses (None for external tensors).
    pub assignment: Vec<Option<usize>>,
    pub buffer_sizes: Vec<u64>,
}

#[cfg(test)]
pub(super) fn plan(tensors: &[Storage], nodes: &[super::builder::Node]) -> Plan {
    let uses: Vec<Vec<usize>> = nodes
        .iter()
        .map(|n| n.reads.iter().chain(&n.writes).copied().collect())
        .collect();
    plan_uses(tensors, &uses)
}

/// [`plan`] over each node's operands in order (`uses[i]`: what node i touches). A
/// caller extends a tensor's life by listing it at more nodes: a split graph lists a
/// tensor the host writes before a part at the part's first node, and one read back
/// after a part at its last.
pub(super) fn plan_uses(tensors: &[Storage], uses: &[Vec<usize>]) -> Plan {
    let n = tensors.len();
    let mut first = vec![usize::MAX; n];
    let mut last = vec![0usize; n];
    for (i, ops) in uses.iter().enumerate() {
        for &t in ops {
            first[t] = first[t].min(i);
            last[t] = last[t].max(i);
        }
    }
    let mut assignment = vec![None; n];
    let mut sizes: Vec<u64> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    for (i, ops) in uses.iter().enumerate() {
        // Allocate what this node starts using. Inputs are still live during the node,
        // so nothing released *by* this node can be handed to its own outputs.
        for &t in ops {
            let Storage::Scratch { bytes } = tensors[t] else {
                continue;
            };
            if assignment[t].is_some() {
                continue;
            }
            // Best fit among free buffers; grow the largest free one if none fits.
            let fit = free
                .iter()
                .enumerate()
                .filter(|(_, &b)| sizes[b] >= bytes)
                .min_by_key(|(_, &b)| sizes[b])
                .map(|(k, _)| k);
            let b = match fit {
                Some(k) => free.swap_remove(k),
                None => match free.iter().enumerate().max_by_key(|(_, &b)| sizes[b]) {
                    Some((k, _)) => {
                        let b = free.swap_remove(k);
                        sizes[b] = bytes;
                        b
                    }
                    None => {
                        sizes.push(bytes);
                        sizes.len() - 1
                    }
                },
            };
            assignment[t] = Some(b);
        }
        for &t in ops {
            if last[t] == i && matches!(tensors[t], Storage::Scratch { .. }) {
                if let Some(b) = assignment[t] {
                    if !free.contains(&b) {
                        free.push(b);
                    }
                }
            }
        }
    }
    Plan {
        assignment,
        buffer_sizes: sizes,
    }
}

#[cfg(test)]
mod tests {
    use super::super::builder::{Node, Op, Storage};
    use super::*;
    use crate::ops::glu::{Activation, GluNode};

    fn node(reads: &[usize], writes: &[usize]) -> Node {
        Node {
            op: Op::Glu(GluNode {
                act: Activation::Silu,
                n: 1,
                pairs: false,
            }),
            reads: reads.to_vec(),
            writes: writes.to_vec(),
        }
    }

    #[test]
    fn a_chain_reuses_two_buffers_and_never_aliases_live_tensors() {
        // t0 -> t1 -> t2 -> t3 -> t4, each node reading the previous and writing the next.
        let tensors: Vec<Storage> = (0..5)
            .map(|i| Storage::Scratch { bytes: 100 + i })
            .collect();
        let nodes: Vec<Node> = (0..4).map(|i| node(&[i], &[i + 1])).collect();
        let p = plan(&tensors, &nodes);
        assert_eq!(p.buffer_sizes.len(), 2, "{:?}", p.assignment);
        for (i, n) in nodes.iter().enumerate() {
            assert_ne!(
                p.assignment[n.reads[0]], p.assignment[n.writes[0]],
                "node {i} aliases"
            );
        }
        for (t, a) in p.assignment.iter().enumerate() {
            assert!(p.buffer_sizes[a.unwrap()] >= 100 + t as u64);
        }
    }

    #[test]
    fn a_tensor_used_later_keeps_its_buffer() {
        // t0 is read again by the last node: nothing may take its buffer before that.
        let tensors: Vec<Storage> = (0..4).map(|_| Storage::Scratch { bytes: 64 }).collect();
        let nodes = vec![node(&[0], &[1]), node(&[1], &[2]), node(&[2, 0], &[3])];
        let p = plan(&tensors, &nodes);
        let a0 = p.assignment[0];
        assert!(p.assignment[1..].iter().all(|&a| a != a0));
    }
}
