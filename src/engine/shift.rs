//! What a sequence does when its share of the cache fills up: llama-completion's context
//! shift (keep the first `n_keep` tokens, drop half of the rest) or Self-Extend (group
//! positions by `ga_n` beyond windows of `ga_w`). One place for the policy's checks and
//! for the cache operations, which are logged as llama.cpp's reference loop records them.

use crate::context::{Context, ContextError, FullReason};
use crate::kv::SeqId;

/// What to do when a sequence's context fills up. With neither context shift nor
/// Self-Extend, a full context ends generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShiftPolicy {
    pub context_shift: bool,
    /// Tokens kept at a shift, counted as the user gave them (`--keep`; -1: the whole
    /// first prompt). Resolved against the first prompt by [`ShiftPolicy::n_keep_for`].
    pub keep: i32,
    /// Self-Extend group factor (1: off).
    pub ga_n: i32,
    /// Self-Extend group width.
    pub ga_w: i32,
}

impl Default for ShiftPolicy {
    fn default() -> Self {
        Self {
            context_shift: true,
            keep: 0,
            ga_n: 1,
            ga_w: 512,
        }
    }
}

impl ShiftPolicy {
    /// Refuses settings that cannot work (the one place these are checked).
    pub fn validate(&self) -> Result<(), String> {
        if self.ga_n < 1 {
            return Err(format!(
                "--grp-attn-n must be at least 1, got {}",
                self.ga_n
            ));
        }
        if self.ga_n > 1 && (self.ga_w <= 0 || self.ga_w % self.ga_n != 0) {
            return Err(format!(
                "--grp-attn-w ({}) must be a positive multiple of --grp-attn-n ({})",
                self.ga_w, self.ga_n
            ));
        }
        Ok(())
    }

    /// The tokens kept at a shift for a first prompt of `n_prompt` tokens, as
    /// llama-completion resolves `--keep`: negative or larger than the prompt keeps the
    /// whole prompt; otherwise the count plus the BOS token the tokenizer adds.
    pub fn n_keep_for(&self, n_prompt: usize, add_bos: bool) -> i32 {
        let n = n_prompt as i32;
        if self.keep < 0 || self.keep > n {
            n
        } else {
            self.keep + add_bos as i32
        }
    }
}

/// A cache operation a shift performed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheOp {
    pub op: &'static str,
    pub p0: i32,
    pub p1: i32,
    pub v: i32,
    pub n_past: i32,
}

/// What making room did, for the session's events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Room {
    /// Nothing had to move.
    Fits,
    /// A context shift dropped `n_discard` tokens after the first `n_keep`.
    Shifted { n_keep: i32, n_discard: i32 },
    /// Self-Extend grouped positions; `n_past` is the sequence's new position count.
    Extended { n_past: i32 },
}

/// One sequence's position bookkeeping: `n_past` as llama-completion counts it, the
/// Self-Extend cursor, and the log of cache operations.
#[derive(Clone, Debug)]
pub struct SeqShift {
    pub policy: ShiftPolicy,
    /// Resolved `n_keep` (see [`ShiftPolicy::n_keep_for`]).
    pub n_keep: i32,
    pub n_past: i32,
    ga_i: i32,
    pub ops: Vec<CacheOp>,
    /// The positions [p0, p1) of the images the sequence holds: a shift keeps or drops
    /// each one whole (a tiled image's span runs from its first tile to its global view).
    pub images: Vec<(i32, i32)>,
    /// Where an image whose later chunks are still to come starts: a shift neither keeps
    /// part of it nor discards into it.
    pub open_image: Option<i32>,
}

impl SeqShift {
    pub fn new(policy: ShiftPolicy) -> Result<Self, ContextError> {
        policy.validate().map_err(ContextError::BadBatch)?;
        Ok(Self {
            policy,
            n_keep: policy.keep.max(0),
            n_past: 0,
            ga_i: 0,
            ops: Vec::new(),
            images: Vec::new(),
            open_image: None,
        })
    }

    /// Records an image chunk at positions [p0, p1): the whole image's span once its
    /// last chunk is in.
    pub fn record_image(&mut self, p0: i32, p1: i32, first: bool, last: bool) {
        if first {
            self.open_image = Some(p0);
        }
        if last {
            let start = self.open_image.take().unwrap_or(p0);
            self.images.push((start, p1));
        }
    }

    /// Whether Self-Extend has grouped positions already (its progress counts in units of
    /// its own `ga_n` and `ga_w`).
    pub fn grouped(&self) -> bool {
        self.ga_i > 0
    }

    /// Takes `other`'s state of the sequence (a fork's copy of its cells): positions,
    /// the kept prefix, Self-Extend's progress, the operations so far and the images;
    /// the policy stays this one's.
    pub fn continue_from(&mut self, other: &SeqShift) {
        self.n_keep = other.n_keep;
        self.n_past = other.n_past;
        self.ga_i = other.ga_i;
        self.ops = other.ops.clone();
        self.images = other.images.clone();
        self.open_image = other.open_image;
    }

    fn log(&mut self, op: &'static str, p0: i32, p1: i32, v: i32) {
        log::debug!("cache: {op}({p0}, {p1}, {v}) at n_past {}", self.n_past);
        self.ops.push(CacheOp {
            op,
            p0,
            p1,
            v,
            n_past: self.n_past,
        });
    }

    /// Makes room for `n` more tokens of `seq` within `n_ctx` cells (the sequence's share
    /// of the cache): a context shift, or Self-Extend's regrouping.
    pub fn make_room(
        &mut self,
        ctx: &mut Context,
        seq: SeqId,
        n: i32,
        n_ctx: i32,
    ) -> Result<Room, ContextError> {
        let p = self.policy;
        // A recurrent memory alone has no window: its states go on at any position.
        if !ctx.memory().bounded() {
            return Ok(Room::Fits);
        }
        if p.ga_n == 1 {
            if self.n_past + n < n_ctx {
                return Ok(Room::Fits);
            }
            // Neither end of the cut falls inside an image: one the kept prefix reaches
            // into is kept whole, one the discarded half reaches into goes whole.
            let cut = |at: i32| self.images.iter().find(|&&(a, b)| a < at && at < b);
            let mut keep = cut(self.n_keep).map_or(self.n_keep, |&(_, b)| b);
            // An image still being decoded is kept whole with what follows it: a kept
            // prefix reaching into it keeps everything (nothing to discard), and the
            // discarded half stops at its start.
            if self.open_image.is_some_and(|s| s < keep) {
                keep = self.n_past;
            }
            let mut n_discard = (self.n_past - keep) / 2;
            if n_discard > 0 {
                n_discard = cut(keep + n_discard).map_or(n_discard, |&(_, b)| b - keep);
                if let Some(s) = self.open_image {
                    n_discard = n_discard.min(s - keep);
                }
            }
            if !p.context_shift || !ctx.can_shift() || n_discard <= 0 {
                return Err(ContextError::ContextFull {
                    n_ctx: n_ctx as u32,
                    reason: if !p.context_shift {
                        FullReason::ShiftOff
                    } else if !ctx.can_shift() {
                        FullReason::CannotShift
                    } else {
                        FullReason::KeepTooLarge
                    },
                });
            }
            let past = self.n_past;
            ctx.seq_rm(Some(seq), keep, keep + n_discard)?;
            self.log("seq_rm", keep, keep + n_discard, 0);
            ctx.seq_add(seq, keep + n_discard, past, -n_discard)?;
            self.log("seq_add", keep + n_discard, past, -n_discard);
            self.n_past -= n_discard;
            let end = keep + n_discard;
            self.images.retain(|&(a, _)| a < keep || a >= end);
            for span in self.images.iter_mut().filter(|s| s.0 >= end) {
                *span = (span.0 - n_discard, span.1 - n_discard);
            }
            if let Some(s) = self.open_image.as_mut().filter(|s| **s >= end) {
                *s -= n_discard;
            }
            return Ok(Room::Shifted {
                n_keep: keep,
                n_discard,
            });
        }
        let (ga_n, ga_w) = (p.ga_n, p.ga_w);
        let mut extended = false;
        while self.n_past >= self.ga_i + ga_w {
            let ib = (ga_n * self.ga_i) / ga_w;
            let bd = (ga_w / ga_n) * (ga_n - 1);
            let dd = (ga_w / ga_n) - ib * bd - ga_w;
            let (gi, past) = (self.ga_i, self.n_past);
            ctx.seq_add(seq, gi, past, ib * bd)?;
            self.log("seq_add", gi, past, ib * bd);
            ctx.seq_div(seq, gi + ib * bd, gi + ib * bd + ga_w, ga_n)?;
            self.log("seq_div", gi + ib * bd, gi + ib * bd + ga_w, ga_n);
            ctx.seq_add(seq, gi + ib * bd + ga_w, past + ib * bd, dd)?;
            self.log("seq_add", gi + ib * bd + ga_w, past + ib * bd, dd);
            self.n_past -= bd;
            self.ga_i += ga_w / ga_n;
            extended = true;
        }
        // Grouping lowers n_past but frees no cell: the cells in use fill up first.
        let used = ctx.memory().used() as i32;
        let total = ctx.n_ctx() as i32;
        if self.n_past + n > n_ctx || used + n > total {
            return Err(ContextError::ContextFull {
                n_ctx: n_ctx as u32,
                reason: FullReason::SelfExtend,
            });
        }
        Ok(if extended {
            Room::Extended {
                n_past: self.n_past,
            }
        } else {
            Room::Fits
        })
    }
}
