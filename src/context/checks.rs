//! The checks a batch passes before the context touches the cache: sequence ids in
//! range, positions that continue each sequence, token ids in the vocabulary (or input
//! rows a model takes, of its width), and draws that ask for rows the batch produces.

use super::{Batch, Context, ContextError, GpuDraw};
use crate::graph::GraphInput;
use crate::kv::{seqs_below, SeqId};

impl Context {
    pub(super) fn check_seq(&self, seq: SeqId) -> Result<(), ContextError> {
        if seq < self.params.n_seq_max {
            Ok(())
        } else {
            Err(ContextError::BadSeq {
                seq,
                n_seq_max: self.params.n_seq_max,
            })
        }
    }

    /// Checks a batch as llama.cpp does before splitting it: sequence ids in range, each
    /// sequence continuing at its last cached position + 1, positions without gaps, and
    /// (stricter than llama.cpp) never decreasing within a sequence.
    pub(super) fn check_batch(&self, b: &Batch) -> Result<(), ContextError> {
        let n_seq = self.params.n_seq_max;
        let mut first = vec![None::<(i32, i32, usize)>; n_seq as usize]; // (min, max, count)
        let mut last = vec![None::<i32>; n_seq as usize];
        for (&set, &p) in b.seq.iter().zip(&b.pos) {
            if set & !seqs_below(n_seq) != 0 {
                let seq = 63 - set.leading_zeros();
                return Err(ContextError::BadSeq {
                    seq,
                    n_seq_max: n_seq,
                });
            }
            for s in 0..n_seq {
                if set & (1u64 << s) == 0 {
                    continue;
                }
                let su = s as usize;
                if let Some(prev) = last[su] {
                    if p < prev {
                        return Err(ContextError::PositionsBackwards {
                            seq: s,
                            prev,
                            next: p,
                        });
                    }
                }
                last[su] = Some(p);
                first[su] = Some(match first[su] {
                    None => (p, p, 1),
                    Some((lo, hi, n)) => (lo.min(p), hi.max(p), n + 1),
                });
            }
        }
        for (s, f) in first.iter().enumerate() {
            let Some((lo, hi, n)) = *f else { continue };
            let cached = self.memory.seq_pos_max(s as SeqId);
            if cached >= 0 && lo != cached + 1 {
                return Err(ContextError::PositionGap {
                    seq: s as u32,
                    last: cached,
                    first: lo,
                });
            }
            if (hi - lo + 1) as usize > n {
                return Err(ContextError::BadBatch(format!(
                    "the positions of sequence {s} in the batch are not continuous ({lo}..={hi} with {n} tokens)"
                )));
            }
        }
        Ok(())
    }

    /// The checks every decode makes before touching the cache: sizes, token ids,
    /// sequences, positions ([`Context::check_batch`]).
    pub(super) fn check_decode(&self, batch: &Batch) -> Result<(), ContextError> {
        let n = batch.tokens.len();
        if n == 0 {
            return Err(ContextError::BadBatch("the batch is empty".into()));
        }
        if batch.pos.len() != n || batch.seq.len() != n || batch.logits.len() != n {
            return Err(ContextError::BadBatch(
                "tokens, positions, sequences and logits flags differ in length".into(),
            ));
        }
        if n > self.params.n_batch as usize {
            return Err(ContextError::BadBatch(format!(
                "{n} tokens exceed the batch size {} (-b)",
                self.params.n_batch
            )));
        }
        if !batch.mrope.is_empty() && batch.mrope.len() != n {
            return Err(ContextError::BadBatch(format!(
                "{} M-RoPE positions for {n} tokens",
                batch.mrope.len()
            )));
        }
        if let Some(piece) = batch.image {
            let cells = piece.nx as u64 * piece.ny as u64;
            if piece.first as u64 + n as u64 > cells
                || batch.seq.iter().any(|&s| s != batch.seq[0])
                || batch.seq[0].count_ones() != 1
            {
                return Err(ContextError::BadBatch(format!(
                    "an image piece of {n} tokens from token {} of a {}x{} image, or of several sequences",
                    piece.first, piece.nx, piece.ny
                )));
            }
        }
        // Without causality a token sees tokens after it: they must be in its ubatch.
        let n_ubatch = self.params.n_ubatch.min(self.params.n_batch) as usize;
        if !self.model.hp.causal && n > n_ubatch {
            return Err(ContextError::BadBatch(format!(
                "this model attends both ways (non-causal): a batch must fit one ubatch, and {n} tokens exceed -ub {n_ubatch}; raise -ub (and -b)"
            )));
        }
        if let Some(max) = self.model.max_positions() {
            if let Some(&p) = batch.pos.iter().find(|&&p| p < 0 || p as u32 >= max) {
                return Err(ContextError::BadBatch(format!(
                    "position {p} is past the {max} positions this model learned (its context_length)"
                )));
            }
        }
        if batch.non_causal && n > n_ubatch {
            return Err(ContextError::BadBatch(format!(
                "the batch's tokens attend to each other (an image's): all {n} must fit one ubatch, and -ub is {n_ubatch}; raise -ub (and -b)"
            )));
        }
        let n_embd = self.model.hp.n_embd;
        if !batch.embd.is_empty() {
            if !self.model.inputs().contains(&GraphInput::Embd(n_embd)) {
                return Err(ContextError::BadBatch(format!(
                    "a {:?} model takes token ids only, not embeddings (images)",
                    self.model.hp.arch
                )));
            }
            if batch.embd.len() != n * n_embd as usize {
                return Err(ContextError::BadBatch(format!(
                    "{} embedding values for {n} tokens of width {n_embd}",
                    batch.embd.len()
                )));
            }
            if batch.embd.iter().any(|v| !v.is_finite()) {
                return Err(ContextError::BadBatch(
                    "the batch's embeddings hold a NaN or an infinity".into(),
                ));
            }
        }
        let n_vocab = self.model.hp.n_vocab;
        // A batch of input rows has no ids to check.
        let ids: &[u32] = if batch.embd.is_empty() {
            &batch.tokens
        } else {
            &[]
        };
        if let Some(&bad) = ids.iter().find(|&&t| t >= n_vocab) {
            return Err(ContextError::BadBatch(format!(
                "token id {bad} is out of the vocabulary (0..{n_vocab})"
            )));
        }
        if batch.seq.contains(&0) {
            return Err(ContextError::BadBatch(
                "a token belongs to no sequence".into(),
            ));
        }
        self.check_batch(batch)
    }

    /// Each draw names a token that wants logits, once, on a slot synced for sampling.
    pub(super) fn check_draws(&self, batch: &Batch, draws: &[GpuDraw]) -> Result<(), ContextError> {
        if draws.is_empty() {
            return Ok(());
        }
        let Some(st) = self.sampling.as_ref() else {
            return Err(ContextError::BadBatch(
                "a draw before any slot was synced for sampling (Context::sync_sampler)".into(),
            ));
        };
        let mut seen = std::collections::HashSet::new();
        for d in draws {
            if !batch.logits.get(d.index).copied().unwrap_or(false) {
                return Err(ContextError::BadBatch(format!(
                    "a draw names token {} of the batch, which does not ask for logits",
                    d.index
                )));
            }
            if !seen.insert(d.index) || (d.row.slot as usize) >= self.params.n_seq_max as usize {
                return Err(ContextError::BadBatch(format!(
                    "draw for token {}: repeated, or slot {} out of range",
                    d.index, d.row.slot
                )));
            }
        }
        if draws.len() > st.n_rows_max() as usize {
            return Err(ContextError::BadBatch(format!(
                "{} draws in one batch; at most {} (one per sequence)",
                draws.len(),
                st.n_rows_max()
            )));
        }
        Ok(())
    }
}
