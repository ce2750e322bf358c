//! The low-rank corrections a graph adds to its matmuls (LoRA adapters), looked up by the
//! base weight they correct. The model layer resolves an adapter's tensor names to the
//! weights it uploaded and where each one's output lands; the builder only asks, for each
//! matmul it records, which terms that weight has.

use crate::ops::Weight;
use std::collections::HashMap;
use std::sync::Arc;

/// One adapter's correction of one base weight: `scale · B (A x)` added to the rows that
/// weight's part of the output occupies.
#[derive(Clone)]
pub struct LoraTerm {
    /// [n_in, r] as a weight of r rows, r padded with zero rows to whole blocks of 32
    /// (an embedding's: [r, n_vocab], read by rows).
    pub a: Arc<Weight>,
    /// [r, n_out]: n_out rows of r.
    pub b: Arc<Weight>,
    /// The user's scale times alpha / rank (llama.cpp's `get_scale`).
    pub scale: f32,
    /// Where output j of B lands in the base weight's output rows: `offset + j * step`
    /// (Q, K, V stacked: step 1 at their offsets; gate and up interleaved: step 2).
    pub offset: u32,
    pub step: u32,
}

/// The terms of every adapted weight, for one setting of the adapters' scales.
#[derive(Clone, Default)]
pub struct LoraTerms {
    /// Keyed by the base weight's address: the model that owns the weights outlives
    /// every graph built from these terms (a context holds it).
    by_weight: HashMap<usize, Vec<LoraTerm>>,
}

impl LoraTerms {
    fn key(w: &Arc<Weight>) -> usize {
        Arc::as_ptr(w) as usize
    }

    pub fn add(&mut self, base: &Arc<Weight>, term: LoraTerm) {
        self.by_weight
            .entry(Self::key(base))
            .or_default()
            .push(term);
    }

    /// The terms correcting `w` (none for a weight no adapter touches).
    pub fn of(&self, w: &Arc<Weight>) -> &[LoraTerm] {
        self.by_weight.get(&Self::key(w)).map_or(&[], |v| v)
    }

    pub fn is_empty(&self) -> bool {
        self.by_weight.is_empty()
    }

    /// Adapted weights.
    pub fn len(&self) -> usize {
        self.by_weight.len()
    }
}
