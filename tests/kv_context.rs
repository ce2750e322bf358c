//! The KV cache through a real context on a tiny random llama: random sequence operations
//! against recomputation, defragmentation, state save/load, and batch errors.
mod common;

use common::{nmse, tiny_model, wide_model, Rng};
use std::sync::Arc;
use wgllm::context::{Batch, Context, ContextError, ContextParams, FullReason};
use wgllm::engine::{Engine, EngineError, EngineOptions, SessionParams, ShiftPolicy};
use wgllm::gguf::GgmlType;
use wgllm::gpu::{Gpu, GpuOptions};
use wgllm::kv::{FlashAttn, KvConfig, KvError, KvType};
use wgllm::model::Model;

/// f32 K/V cache (no shader-f16), so that recomputation agrees to float rounding.
fn model() -> Arc<Model> {
    let gpu = Gpu::new(&GpuOptions {
        no_f16: true,
        ..Default::default()
    })
    .unwrap();
    tiny_model(gpu, GgmlType::Q8_0)
}

fn context(model: &Arc<Model>, n_ctx: u32, n_seq: u32) -> Context {
    let mut p = ContextParams::new(n_ctx, n_ctx.min(128), 64);
    p.n_seq_max = n_seq;
    Context::new(model.clone(), p).unwrap()
}

/// A batch of tokens of one sequence at consecutive positions, logits for the last.
fn seq_batch(tokens: &[u32], pos0: i32, seq: u32) -> Batch {
    let mut b = Batch::simple(tokens, pos0, false);
    b.seq = vec![1u64 << seq; tokens.len()];
    b
}

/// The reference: what each cell holds (token, position, sequence set), kept without a
/// GPU. A sequence's history is its cells in position order.
#[derive(Clone, Debug)]
struct RefCell {
    token: u32,
    pos: i32,
    seq: u64,
}

fn history(cells: &[RefCell], s: u32) -> Vec<(u32, i32)> {
    let mut h: Vec<(u32, i32)> = cells
        .iter()
        .filter(|c| c.seq & (1 << s) != 0)
        .map(|c| (c.token, c.pos))
        .collect();
    h.sort_by_key(|&(_, p)| p);
    h
}

/// Logits of `probe` appended to sequence `s` in `ctx`; the probe is removed afterwards.
fn probe_logits(ctx: &mut Context, s: u32, probe: u32) -> Vec<f32> {
    let pos = ctx.cells().seq_pos_max(s) + 1;
    let logits = ctx.decode(&seq_batch(&[probe], pos, s)).unwrap();
    ctx.seq_rm(Some(s), pos, -1).unwrap();
    logits
}

/// The same probe after recomputing the sequence from scratch at its current positions.
fn recomputed_logits(fresh: &mut Context, h: &[(u32, i32)], probe: u32) -> Vec<f32> {
    fresh.clear();
    let mut tokens: Vec<u32> = h.iter().map(|&(t, _)| t).collect();
    tokens.push(probe);
    let pos0 = h.first().map_or(0, |&(_, p)| p);
    fresh.decode(&seq_batch(&tokens, pos0, 0)).unwrap()
}

/// Random decodes, seq_rm of suffixes, seq_cp into emptied sequences, seq_keep and
/// seq_add of whole unshared sequences, on four sequences. After every step, each
/// sequence's next-token logits equal those of recomputing it alone from scratch.
/// (seq_div and removals from the middle change what the remaining cells attended to when
/// they were computed, so nothing recomputed equals them: the llama.cpp replays in
/// smollm2_kv.rs cover those.)
#[test]
fn random_sequence_ops_match_recomputation() {
    let model = model();
    let mut ctx = context(&model, 256, 4);
    let mut fresh = context(&model, 160, 1);
    let mut rng = Rng(0x5eed);
    let mut cells: Vec<RefCell> = Vec::new();
    let mut checks = 0;
    for step in 0..70 {
        let s = rng.below(4);
        let h = history(&cells, s);
        let what = rng.below(10);
        match what {
            0..=4 => {
                // Decode 1..6 tokens on s (and, sometimes, one more sequence alongside).
                let n = 1 + rng.below(6) as usize;
                if ctx.cells().used() + n + 1 > 120 {
                    continue;
                }
                let pos0 = h.last().map_or(rng.below(5) as i32, |&(_, p)| p + 1);
                let toks: Vec<u32> = (0..n).map(|_| rng.below(256)).collect();
                let mut b = seq_batch(&toks, pos0, s);
                let t = (s + 1) % 4;
                let ht = history(&cells, t);
                let other = rng.below(2) == 0;
                if other {
                    let pt = ht.last().map_or(0, |&(_, p)| p + 1);
                    let tok = rng.below(256);
                    b.tokens.push(tok);
                    b.pos.push(pt);
                    b.seq.push(1 << t);
                    b.logits.push(true);
                    cells.push(RefCell {
                        token: tok,
                        pos: pt,
                        seq: 1 << t,
                    });
                }
                ctx.decode(&b).unwrap();
                for (i, &tok) in toks.iter().enumerate() {
                    cells.push(RefCell {
                        token: tok,
                        pos: pos0 + i as i32,
                        seq: 1 << s,
                    });
                }
            }
            5 => {
                // Remove a suffix of s.
                let Some(&(_, p)) = h.get(rng.below(h.len().max(1) as u32) as usize) else {
                    continue;
                };
                ctx.seq_rm(Some(s), p, -1).unwrap();
                for c in &mut cells {
                    if c.pos >= p {
                        c.seq &= !(1 << s);
                    }
                }
            }
            6 | 7 => {
                // Copy a prefix of s into another sequence, emptied first.
                let d = (s + 1 + rng.below(3)) % 4;
                let p1 = h
                    .get(rng.below(h.len().max(1) as u32) as usize)
                    .map_or(-1, |&(_, p)| p + 1);
                ctx.seq_rm(Some(d), -1, -1).unwrap();
                ctx.seq_cp(s, d, -1, p1).unwrap();
                for c in &mut cells {
                    c.seq &= !(1 << d);
                    if c.seq & (1 << s) != 0 && (p1 < 0 || c.pos < p1) {
                        c.seq |= 1 << d;
                    }
                }
            }
            8 => {
                // Shift all of s, if no other sequence shares its cells.
                let shared = cells
                    .iter()
                    .any(|c| c.seq & (1 << s) != 0 && c.seq != 1 << s);
                let Some(&(_, lo)) = h.first() else { continue };
                if shared {
                    continue;
                }
                let delta = rng.below(40) as i32 - lo.min(20);
                ctx.seq_add(s, -1, -1, delta).unwrap();
                for c in &mut cells {
                    if c.seq == 1 << s {
                        c.pos += delta;
                    }
                }
            }
            _ => {
                if rng.below(4) != 0 {
                    continue;
                }
                ctx.seq_keep(s).unwrap();
                for c in &mut cells {
                    c.seq &= 1 << s;
                }
            }
        }
        cells.retain(|c| c.seq != 0);
        assert_eq!(ctx.cells().used(), cells.len(), "step {step}: cells in use");
        for q in 0..4 {
            let hq = history(&cells, q);
            assert_eq!(
                ctx.cells().seq_pos_max(q),
                hq.last().map_or(-1, |&(_, p)| p),
                "step {step}: seq {q} max position"
            );
            if hq.is_empty() {
                continue;
            }
            let probe = rng.below(256);
            let got = probe_logits(&mut ctx, q, probe);
            let want = recomputed_logits(&mut fresh, &hq, probe);
            let e = nmse(&got, &want);
            assert!(e < 1e-4, "step {step} (op {what}): seq {q} nmse {e}");
            checks += 1;
        }
    }
    assert!(checks > 100, "only {checks} comparisons were made");
}

/// Holes from a context shift; compacting the cache leaves every output as it was.
#[test]
fn defrag_keeps_outputs_and_closes_holes() {
    let model = model();
    let mut ctx = context(&model, 128, 1);
    let mut rng = Rng(7);
    let toks: Vec<u32> = (0..100).map(|_| rng.below(256)).collect();
    ctx.decode(&seq_batch(&toks, 0, 0)).unwrap();
    ctx.seq_rm(Some(0), 10, 50).unwrap();
    ctx.seq_add(0, 50, -1, -40).unwrap();
    let probe = rng.below(256);
    let mut undefragged = context(&model, 128, 1);
    // The same state in a second context, left fragmented.
    undefragged.decode(&seq_batch(&toks, 0, 0)).unwrap();
    undefragged.seq_rm(Some(0), 10, 50).unwrap();
    undefragged.seq_add(0, 50, -1, -40).unwrap();
    let moved = ctx.defrag().unwrap();
    assert_eq!(moved, 50, "cells 50..100 move to 10..60");
    assert_eq!(ctx.cells().fragmentation(), 0.0);
    let a = probe_logits(&mut ctx, 0, probe);
    let b = probe_logits(&mut undefragged, 0, probe);
    let e = nmse(&a, &b);
    assert!(e < 1e-10, "defrag changed the logits: nmse {e}");
    // And the automatic trigger (--defrag-thold) compacts before a decode.
    let mut p = ContextParams::new(128, 64, 64);
    p.defrag_thold = 0.1;
    let mut auto = Context::new(model.clone(), p).unwrap();
    auto.decode(&seq_batch(&toks[..60], 0, 0)).unwrap();
    auto.seq_rm(Some(0), 0, 20).unwrap();
    assert!(auto.cells().fragmentation() > 0.3);
    auto.decode(&seq_batch(&[1], 60, 0)).unwrap();
    assert_eq!(auto.cells().fragmentation(), 0.0);
    assert_eq!(auto.cells().used(), 41);
}

/// Saving, loading into a fresh context and continuing equals never stopping; one
/// sequence can be moved into another sequence of another context; and an f16 cache
/// loads into an f32 one.
#[test]
fn state_round_trip_equals_never_stopping() {
    let model = model();
    let dir = std::env::temp_dir();
    let path = dir.join(format!("wgllm-state-{}.bin", std::process::id()));
    let mut rng = Rng(11);
    let a: Vec<u32> = (0..40).map(|_| rng.below(256)).collect();
    let b: Vec<u32> = (0..9).map(|_| rng.below(256)).collect();

    let mut whole = context(&model, 96, 2);
    whole.decode(&seq_batch(&a, 0, 0)).unwrap();
    whole.decode(&seq_batch(&a[..7], 0, 1)).unwrap();
    whole.seq_add(0, -1, -1, 3).unwrap(); // a pending shift is applied before saving
    whole.state_save(&path, &a, None, &[]).unwrap();
    let want = whole.decode(&seq_batch(&b, 43, 0)).unwrap();

    let mut loaded = context(&model, 96, 2);
    let saved = loaded.state_load(&path, None).unwrap();
    assert_eq!(saved.tokens, a);
    assert_eq!(saved.n_cells, 47);
    assert_eq!(loaded.cells().seq_pos_max(0), 42);
    assert_eq!(loaded.cells().seq_pos_max(1), 6);
    let got = loaded.decode(&seq_batch(&b, 43, 0)).unwrap();
    assert_eq!(
        got, want,
        "loading then continuing must equal never stopping"
    );

    // Version 5 on records the model's fingerprint and no adapter (12 bytes after the
    // shape); a file of other weights of the same shape is refused, naming both.
    let v5 = std::fs::read(&path).unwrap();
    assert_eq!(v5[8..12], 6u32.to_le_bytes());
    assert_eq!(v5[24..32], model.fingerprint.to_le_bytes());
    assert_eq!(v5[32..36], 0u32.to_le_bytes());
    let mut foreign = v5.clone();
    foreign[24] ^= 1;
    let mut other = context(&model, 96, 2);
    let e = (other.state_from_bytes(&foreign, "foreign", None))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("another model") && e.contains("fingerprint"),
        "{e}"
    );
    assert_eq!(
        other.cells().seq_pos_max(0),
        -1,
        "a refused file loads nothing"
    );

    // Versions 4 (no record) and 3 (the K/V types before the tokens) still load where no
    // adapter is loaded: the same cells. Before version 6 a cell is 12 bytes (no next
    // M-RoPE time).
    let (head, prov_end) = (24, 36);
    let tok_end = prov_end + 4 + 4 * a.len();
    let v5 = cells_of_twelve_bytes(&v5, tok_end);
    let mut v4 = v5[..head].to_vec();
    v4[8..12].copy_from_slice(&4u32.to_le_bytes());
    v4.extend(&v5[prov_end..]);
    let mut old = context(&model, 96, 2);
    let saved = old.state_from_bytes(&v4, "a version-4 file", None).unwrap();
    assert_eq!((saved.tokens, saved.n_cells), (a.clone(), 47));
    assert_eq!(old.decode(&seq_batch(&b, 43, 0)).unwrap(), want);
    let mut v3 = v5[..head].to_vec();
    v3[8..12].copy_from_slice(&3u32.to_le_bytes());
    v3.extend(&v5[tok_end..tok_end + 8]); // K and V type ids
    v3.extend(&v5[prov_end..tok_end]); // tokens
    v3.extend(&v5[tok_end + 8..]);
    let mut old = context(&model, 96, 2);
    let saved = old.state_from_bytes(&v3, "a version-3 file", None).unwrap();
    assert_eq!((saved.tokens, saved.n_cells), (a.clone(), 47));
    assert_eq!(old.cells().seq_pos_max(0), 42);
    assert_eq!(old.decode(&seq_batch(&b, 43, 0)).unwrap(), want);

    // One sequence (1) into sequence 2 of a context that already holds other cells.
    whole.state_save(&path, &a[..7], Some(1), &[]).unwrap();
    let mut other = context(&model, 96, 3);
    other.decode(&seq_batch(&b, 0, 0)).unwrap();
    other.state_load(&path, Some(2)).unwrap();
    assert_eq!(other.cells().seq_pos_max(2), 6);
    let got = probe_logits(&mut other, 2, 5);
    let want = probe_logits(&mut whole, 1, 5);
    assert!(nmse(&got, &want) < 1e-12);

    // A cache saved as f16 loads into an f32 context (values are converted exactly).
    let gpu16 = Gpu::new(&GpuOptions::default()).unwrap();
    if gpu16.has_f16 {
        let m16 = tiny_model(gpu16, GgmlType::Q8_0);
        let mut c16 = context(&m16, 96, 1);
        c16.decode(&seq_batch(&a, 0, 0)).unwrap();
        c16.state_save(&path, &[], None, &[]).unwrap();
        let want = probe_logits(&mut c16, 0, 9);
        let mut c32 = context(&model, 96, 1);
        c32.state_load(&path, None).unwrap();
        let got = probe_logits(&mut c32, 0, 9);
        assert!(nmse(&got, &want) < 1e-6, "nmse {}", nmse(&got, &want));
    }

    // Damaged and foreign files are refused with a clear error, the cache untouched.
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
    let e = loaded.state_load(&path, None).unwrap_err().to_string();
    assert!(e.contains("truncated"), "{e}");
    assert_eq!(loaded.cells().seq_pos_max(0), 42 + 9);
    std::fs::write(&path, b"not a state file at all").unwrap();
    let e = loaded.state_load(&path, None).unwrap_err().to_string();
    assert!(e.contains("not a wgllm cache state file"), "{e}");
    let _ = std::fs::remove_file(&path);
}

#[test]
fn bad_batches_are_refused_with_clear_errors() {
    let model = model();
    let mut ctx = context(&model, 64, 2);
    ctx.decode(&seq_batch(&[1, 2, 3], 0, 0)).unwrap();
    let e = ctx.decode(&seq_batch(&[4], 0, 2)).unwrap_err();
    assert!(
        matches!(
            e,
            ContextError::BadSeq {
                seq: 2,
                n_seq_max: 2
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("-np"));
    assert!(ctx.seq_cp(0, 5, -1, -1).is_err());
    let e = ctx.decode(&seq_batch(&[4], 7, 0)).unwrap_err();
    assert!(
        matches!(
            e,
            ContextError::PositionGap {
                seq: 0,
                last: 2,
                first: 7
            }
        ),
        "{e}"
    );
    let mut back = seq_batch(&[4, 5], 3, 0);
    back.pos = vec![4, 3];
    let e = ctx.decode(&back).unwrap_err();
    assert!(
        matches!(e, ContextError::PositionsBackwards { seq: 0, .. }),
        "{e}"
    );
    let mut gap = seq_batch(&[4, 5], 3, 1);
    gap.pos = vec![3, 5];
    assert!(ctx
        .decode(&gap)
        .unwrap_err()
        .to_string()
        .contains("not continuous"));
    let full = vec![1u32; 64];
    let e = ctx.decode(&seq_batch(&full, 3, 0)).unwrap_err();
    assert!(e.to_string().contains("KV cache is full"), "{e}");
    // Nothing of the refused batches was stored.
    assert_eq!(ctx.cells().used(), 3);
    assert!(ctx.seq_div(0, 0, 3, 0).is_err());
}

/// `-np 64` is allowed, so sequence 63 works everywhere: decoding, the seq operations,
/// and state files (whole cache and one sequence). Its outputs equal sequence 0's.
#[test]
fn sixty_four_sequences_and_id_63_work() {
    let model = model();
    let mut ctx = context(&model, 64, 64);
    let mut rng = Rng(63);
    let toks: Vec<u32> = (0..12).map(|_| rng.below(256)).collect();
    let got = ctx.decode(&seq_batch(&toks, 0, 63)).unwrap();
    assert_eq!(ctx.cells().seq_pos_max(63), 11);
    let mut one = context(&model, 64, 1);
    let want = one.decode(&seq_batch(&toks, 0, 0)).unwrap();
    assert!(nmse(&got, &want) < 1e-12);
    // A token shared by sequences 0 and 63 in one batch.
    let mut b = seq_batch(&[7], 0, 0);
    b.seq = vec![1 | 1 << 63];
    let e = ctx.decode(&b).unwrap_err();
    assert!(
        matches!(e, ContextError::PositionGap { seq: 63, .. }),
        "{e}"
    );
    ctx.seq_cp(63, 0, -1, -1).unwrap();
    ctx.seq_rm(Some(63), 6, -1).unwrap();
    assert_eq!(ctx.cells().seq_pos_max(63), 5);
    assert_eq!(ctx.cells().seq_pos_max(0), 11);
    ctx.seq_rm(Some(0), -1, -1).unwrap();
    ctx.decode(&seq_batch(&toks[6..], 6, 63)).unwrap();

    let path = std::env::temp_dir().join(format!("wgllm-np64-{}.bin", std::process::id()));
    ctx.state_save(&path, &toks, None, &[]).unwrap();
    let mut whole = context(&model, 64, 64);
    whole.state_load(&path, None).unwrap();
    assert_eq!(whole.cells().seq_pos_max(63), 11);
    ctx.state_save(&path, &toks, Some(63), &[]).unwrap();
    let mut moved = context(&model, 64, 64);
    moved.state_load(&path, Some(63)).unwrap();
    assert_eq!(moved.cells().seq_pos_max(63), 11);
    let a = probe_logits(&mut moved, 63, 3);
    let b = probe_logits(&mut one, 0, 3);
    assert!(nmse(&a, &b) < 1e-12);
    let _ = std::fs::remove_file(&path);
}

/// A batch of several ubatches whose second finds no free cells fails as a whole: the
/// first ubatch's cells are dropped again, and the next decode continues as if the
/// failed batch had never been tried.
#[test]
fn a_failed_batch_leaves_the_cache_as_it_was() {
    let model = model();
    let mut ctx = Context::new(model.clone(), ContextParams::new(64, 64, 16)).unwrap();
    let mut rng = Rng(2);
    let toks: Vec<u32> = (0..72).map(|_| rng.below(256)).collect();
    ctx.decode(&seq_batch(&toks[..40], 0, 0)).unwrap();
    let view = ctx.cells().view();
    // 32 tokens in two ubatches of 16: the first fits (56 used), the second does not.
    let e = ctx.decode(&seq_batch(&toks[40..72], 40, 0)).unwrap_err();
    assert!(
        matches!(e.kv(), Some(KvError::NoSlot { needed: 16, .. })),
        "{e}"
    );
    assert_eq!(ctx.cells().used(), 40);
    assert_eq!(ctx.cells().seq_pos_max(0), 39);
    assert_eq!(ctx.cells().view(), view, "cells and head as before");
    let got = ctx.decode(&seq_batch(&toks[40..48], 40, 0)).unwrap();
    let mut fresh = Context::new(model.clone(), ContextParams::new(64, 64, 16)).unwrap();
    fresh.decode(&seq_batch(&toks[..40], 0, 0)).unwrap();
    let want = fresh.decode(&seq_batch(&toks[40..48], 40, 0)).unwrap();
    assert!(nmse(&got, &want) < 1e-12, "nmse {}", nmse(&got, &want));
    assert_eq!(ctx.cells().used(), 48);
}

/// Decodes that straddle holes: after removals in the middle, a ubatch larger than any
/// hole still fits (cells need not be contiguous, as in today's llama.cpp), and its
/// outputs equal those of a cache without holes holding the same tokens.
#[test]
fn a_ubatch_fills_scattered_holes() {
    let model = model();
    let mut ctx = context(&model, 32, 2);
    let mut rng = Rng(4);
    let a: Vec<u32> = (0..8).map(|_| rng.below(256)).collect();
    let b: Vec<u32> = (0..28).map(|_| rng.below(256)).collect();
    // Sequences 0 and 1 interleaved one token at a time, then 0 removed: 8 holes of one
    // cell in 0..16, and 16..32 free.
    for i in 0..8 {
        let mut batch = seq_batch(&[a[i]], i as i32, 0);
        batch.tokens.push(b[i]);
        batch.pos.push(i as i32);
        batch.seq.push(2);
        batch.logits.push(true);
        ctx.decode(&batch).unwrap();
    }
    ctx.seq_rm(Some(0), -1, -1).unwrap();
    assert_eq!(ctx.cells().largest_empty_run(), (16, 16));
    // 20 tokens: more than the largest hole, fewer than the 24 free cells.
    let got = ctx.decode(&seq_batch(&b[8..28], 8, 1)).unwrap();
    assert_eq!(ctx.cells().used(), 28);
    let mut fresh = context(&model, 32, 1);
    let want = fresh.decode(&seq_batch(&b, 0, 0)).unwrap();
    assert!(nmse(&got, &want) < 1e-5, "nmse {}", nmse(&got, &want));
    // 8 holes of one cell and 4 free at the end: 13 tokens do not fit, 12 do.
    ctx.seq_rm(Some(1), 0, 8).unwrap();
    assert_eq!(ctx.cells().used(), 20);
    let e = ctx.decode(&seq_batch(&b[..13], 0, 0)).unwrap_err();
    assert!(e.to_string().contains("KV cache is full"), "{e}");
    assert_eq!(ctx.cells().used(), 20);
    ctx.decode(&seq_batch(&b[..12], 0, 0)).unwrap();
    assert_eq!(ctx.cells().used(), 32);
}

/// Loading one sequence that does not fit leaves the sequence it would replace in place;
/// files with negative positions or sequence ids beyond -np are refused with a clear
/// error before the cache is touched.
#[test]
fn state_loading_is_all_or_nothing_and_checks_cells() {
    let model = model();
    let path = std::env::temp_dir().join(format!("wgllm-aon-{}.bin", std::process::id()));
    let mut rng = Rng(5);
    let a: Vec<u32> = (0..40).map(|_| rng.below(256)).collect();
    let mut ctx = context(&model, 64, 2);
    ctx.decode(&seq_batch(&a, 0, 0)).unwrap();
    ctx.decode(&seq_batch(&a[..10], 0, 1)).unwrap();
    let mut src = context(&model, 64, 1);
    src.decode(&seq_batch(&a[..30], 0, 0)).unwrap();
    src.state_save(&path, &a[..30], Some(0), &[]).unwrap();
    let before = probe_logits(&mut ctx, 1, 9);
    // 30 cells into sequence 1: with its 10 cells freed, 24 are free.
    let e = ctx.state_load(&path, Some(1)).unwrap_err().to_string();
    assert!(e.contains("more than fit") && e.contains("24 free"), "{e}");
    assert_eq!(ctx.cells().used(), 50);
    assert_eq!(ctx.cells().seq_pos_max(1), 9);
    assert_eq!(probe_logits(&mut ctx, 1, 9), before, "sequence 1 is intact");

    // Cell 0 of a file without tokens (one K/V store, the model's fingerprint and no
    // adapter before the tokens): position at byte 56, sequence set at byte 60.
    src.state_save(&path, &[], None, &[]).unwrap();
    let good = std::fs::read(&path).unwrap();
    let patched = |at: usize, bytes: &[u8]| {
        let mut f = good.clone();
        f[at..at + bytes.len()].copy_from_slice(bytes);
        std::fs::write(&path, f).unwrap();
    };
    let cases: [(usize, Vec<u8>, &str); 4] = [
        (56, (-3i32).to_le_bytes().to_vec(), "negative position -3"),
        (60, 0u64.to_le_bytes().to_vec(), "belongs to no sequence"),
        (60, (1u64 << 5).to_le_bytes().to_vec(), "sequence 5"),
        (60, (1u64 << 63).to_le_bytes().to_vec(), "sequence 63"),
    ];
    for (at, bytes, needle) in cases {
        patched(at, &bytes);
        for dst in [None, Some(1)] {
            let e = ctx.state_load(&path, dst).unwrap_err().to_string();
            assert!(e.contains(needle), "{dst:?}: {e}");
            assert_eq!(ctx.cells().used(), 50);
        }
    }
    // The same id is fine where -np allows it.
    patched(60, &(1u64 << 63).to_le_bytes());
    let mut np64 = context(&model, 64, 64);
    np64.state_load(&path, None).unwrap();
    assert_eq!(np64.cells().seq_pos_max(63), 0);
    let _ = std::fs::remove_file(&path);
}

/// Every way the context fills up reports its own reason.
#[test]
fn a_full_context_says_why() {
    let gpu = Gpu::new(&GpuOptions {
        no_f16: true,
        ..Default::default()
    })
    .unwrap();
    let (model, tok) = common::tiny_parts(gpu, GgmlType::Q8_0);
    let toks: Vec<u32> = (0..40).collect();
    // Feeds a first input of `first` tokens, then a chunk of 4, then one token at a
    // time, until the session's context is full.
    let full = |policy: ShiftPolicy, first: usize| -> ContextError {
        let opts = EngineOptions {
            n_ctx: 32,
            ..Default::default()
        };
        let mut e = Engine::new(model.clone(), tok.clone(), &opts).unwrap();
        let id = e
            .open_session(SessionParams {
                shift: policy,
                ..Default::default()
            })
            .unwrap();
        e.feed(id, &toks[..first]).unwrap();
        let mut at = first;
        let mut chunk = 4;
        while at < toks.len() {
            if let Err(err) = e.feed(id, &toks[at..at + chunk]) {
                match err {
                    EngineError::Context(c) => return c,
                    other => panic!("not a context error: {other}"),
                }
            }
            at += chunk;
            chunk = 1;
        }
        panic!("the context never filled")
    };
    let off = ShiftPolicy {
        context_shift: false,
        ..Default::default()
    };
    let e = full(off, 1);
    assert!(
        matches!(
            e,
            ContextError::ContextFull {
                n_ctx: 32,
                reason: FullReason::ShiftOff
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("context shift is off"), "{e}");
    // The whole 28-token first prompt kept: a 4-token chunk then leaves nothing to drop.
    let keep = ShiftPolicy {
        keep: -1,
        ..Default::default()
    };
    let e = full(keep, 28);
    assert!(
        matches!(
            e,
            ContextError::ContextFull {
                reason: FullReason::KeepTooLarge,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("is --keep too large?"), "{e}");
    // Self-Extend with windows wider than the context, and with narrow windows: grouping
    // lowers n_past but the cells stay used, so the cells fill first.
    for ga_w in [512, 8] {
        let ga = ShiftPolicy {
            ga_n: 2,
            ga_w,
            ..Default::default()
        };
        let e = full(ga, 1);
        assert!(
            matches!(
                e,
                ContextError::ContextFull {
                    reason: FullReason::SelfExtend,
                    ..
                }
            ),
            "ga_w {ga_w}: {e}"
        );
        assert!(e.to_string().contains("Self-Extend"), "{e}");
        assert!(!e.to_string().contains("context shift is off"), "{e}");
    }
}

/// A ubatch whose attention scores exceed a storage binding (64 KiB here: 4 heads × 256
/// cells × 4 bytes is 4 KiB a token, so 64 tokens take 4 passes) gives the logits of the
/// same model on an adapter where one pass holds them all.
#[test]
fn attention_in_passes_gives_the_same_logits() {
    let small = Gpu::new(&GpuOptions {
        no_f16: true,
        max_binding_override: Some(65536),
        ..Default::default()
    })
    .unwrap();
    let split = tiny_model(small, GgmlType::Q8_0);
    let whole = model();
    let mut rng = Rng(77);
    let tokens: Vec<u32> = (0..64).map(|_| rng.below(256)).collect();
    let logits = |m: &Arc<Model>| {
        let mut ctx = Context::new(m.clone(), ContextParams::new(256, 64, 64)).unwrap();
        ctx.decode(&Batch::simple(&tokens[..8], 0, false)).unwrap();
        // 56 more tokens, scores over 256 cells: more than one pass on the small binding.
        ctx.decode(&Batch::simple(&tokens[8..], 8, true)).unwrap()
    };
    let (a, b) = (logits(&split), logits(&whole));
    assert_eq!(a.len(), 56 * 256);
    let e = nmse(&a, &b);
    assert!(e < 1e-12, "nmse {e:e}");
}

/// `wide_model` (heads of 64) on an adapter without shader-f16 (f32 is the plain cache).
fn wide_f32_model() -> Arc<Model> {
    let gpu = Gpu::new(&GpuOptions {
        no_f16: true,
        ..Default::default()
    });
    wide_model(gpu.unwrap(), GgmlType::Q8_0)
}

/// A context of `wide_model` with K and V caches of types `k` and `v`.
fn typed_context(model: &Arc<Model>, k: KvType, v: KvType) -> Context {
    let mut p = ContextParams::new(128, 64, 64);
    p.kv = KvConfig {
        type_k: Some(k),
        type_v: Some(v),
        flash_attn: FlashAttn::Auto,
    };
    Context::new(model.clone(), p).unwrap()
}

/// Quantized caches through everything that moves cache rows: after a context shift
/// (cells removed, then the K-shift, which rotates packed keys by dequantizing, rotating
/// and requantizing), the logits are as close to an f32 cache's after the same shift as
/// the quantized cache is to f32 when the shifted prompt is computed afresh (a missing
/// or wrong rotation is 100x off); defragmentation moves K and V rows of different sizes
/// without changing the logits; a state file loads back into the same types and is
/// refused by other types with the reason.
#[test]
fn quantized_caches_shift_defragment_and_save() {
    use KvType::*;
    let model = wide_f32_model();
    let mut rng = Rng(61);
    let toks: Vec<u32> = (0..40).map(|_| rng.below(256)).collect();
    let cut: Vec<u32> = toks[..4].iter().chain(&toks[12..]).copied().collect();
    let path = std::env::temp_dir().join(format!("wgllm-qkv-{}.bin", std::process::id()));
    let shifted = |ctx: &mut Context| {
        ctx.decode(&seq_batch(&toks, 0, 0)).unwrap();
        ctx.seq_rm(Some(0), 4, 12).unwrap();
        ctx.seq_add(0, 12, -1, -8).unwrap();
        probe_logits(ctx, 0, 7)
    };
    let afresh = |ctx: &mut Context| {
        ctx.decode(&seq_batch(&cut, 0, 0)).unwrap();
        probe_logits(ctx, 0, 7)
    };
    let want = shifted(&mut typed_context(&model, F32, F32));
    let want_afresh = afresh(&mut typed_context(&model, F32, F32));
    for (k, v) in [(Q8_0, Q8_0), (Bf16, Q5_0), (Q8_0, Q4_1)] {
        let mut ctx = typed_context(&model, k, v);
        let e = nmse(&shifted(&mut ctx), &want);
        let base = nmse(&afresh(&mut typed_context(&model, k, v)), &want_afresh);
        assert!(
            e < 2.0 * base.max(1e-6),
            "K {k} V {v}: nmse {e:e} against the f32 cache after a shift, {base:e} computed afresh"
        );
        let before = probe_logits(&mut ctx, 0, 9);
        assert!(ctx.defrag().unwrap() > 0, "the removed cells left holes");
        let e = nmse(&probe_logits(&mut ctx, 0, 9), &before);
        assert!(
            e < 1e-10,
            "K {k} V {v}: defrag changed the logits: nmse {e:e}"
        );
        ctx.state_save(&path, &toks, None, &[]).unwrap();
        let mut back = typed_context(&model, k, v);
        back.state_load(&path, None).unwrap();
        let e = nmse(&probe_logits(&mut back, 0, 9), &before);
        assert!(
            e < 1e-10,
            "K {k} V {v}: the state file's logits: nmse {e:e}"
        );
        let e = typed_context(&model, F32, F32)
            .state_load(&path, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("saved with K {k} and V {v}")) && e.contains("-ctk"),
            "{e}"
        );
    }
    std::fs::remove_file(&path).ok();
}

/// A version-6 state file of one K/V store with its cells cut to 12 bytes each (position
/// and set: the layout before version 6); the memory's part starts at `body`.
fn cells_of_twelve_bytes(v6: &[u8], body: usize) -> Vec<u8> {
    let word = |at: usize| u32::from_le_bytes(v6[at..at + 4].try_into().unwrap()) as usize;
    assert_eq!(word(body + 8), 1, "one store");
    let n = word(body + 12);
    let cells = body + 16;
    let mut out = v6[..cells].to_vec();
    for c in 0..n {
        out.extend(&v6[cells + 16 * c..cells + 16 * c + 12]);
    }
    out.extend(&v6[cells + 16 * n..]);
    out
}

/// Layer 0's K rows of the cells a state file holds (one store, no tokens saved), as the
/// cache's words.
fn layer0_keys(ctx: &mut Context, ty: KvType) -> Vec<u32> {
    let (bytes, n) = ctx.state_bytes(&[], None, &[]).unwrap();
    // Magic, version, shape (3), the model's fingerprint and no adapter, K and V types,
    // no tokens, one store, its cell count.
    // Each cell: position, sequence set, next M-RoPE time.
    let at = 8 + 4 + 12 + 12 + 8 + 4 + 4 + 4 + 16 * n;
    let row = ty.row_bytes(ctx.model.hp.n_embd_kv() as u64) as usize;
    bytemuck::pod_collect_to_vec(&bytes[at..at + n * row])
}

/// The K-shift of a packed K cache, cell by cell: each cached key, as the cache held it,
/// rotated by its cell's delta on the CPU (between the Hadamard rotations that quantized
/// keys are stored in) and encoded again, is what the cache holds after the shift (nearly
/// every word equal, the values close) for every packed type.
#[test]
fn k_shift_requantizes_packed_keys_as_the_cpu_does() {
    use wgllm::ops::hadamard::hadamard_ref;
    use wgllm::ops::rope::rope_ref;
    let model = wide_f32_model();
    let hp = model.hp.clone();
    let mut rng = Rng(62);
    let toks: Vec<u32> = (0..24).map(|_| rng.below(256)).collect();
    for k in KvType::ALL.into_iter().filter(|t| t.is_packed()) {
        let mut ctx = typed_context(&model, k, KvType::F32);
        ctx.decode(&seq_batch(&toks, 0, 0)).unwrap();
        let before = layer0_keys(&mut ctx, k);
        // Cells 10.. move back by 7 (as a context shift does), cells 0..10 stay.
        ctx.seq_add(0, 10, -1, -7).unwrap();
        let after = layer0_keys(&mut ctx, k);
        let n_embd = hp.n_embd_kv() as usize;
        let words = k.row_bytes(n_embd as u64) as usize / 4;
        let rp = hp.layer_rope(0);
        let mut same = 0;
        for c in 0..toks.len() {
            let delta = if c >= 10 { -7.0 } else { 0.0 };
            let mut x = k.decode(&before[c * words..(c + 1) * words]);
            let rot = (KvConfig {
                type_k: Some(k),
                ..KvConfig::default()
            })
            .resolve(true, hp.head_dim, n_embd as u32, false)
            .unwrap()
            .rot_k as usize;
            hadamard_ref(&mut x, rot);
            let mut y = rope_ref(&rp, &x, hp.n_head_kv as usize, &[delta]);
            hadamard_ref(&mut y, rot);
            let want = k.encode(&y);
            let got = &after[c * words..(c + 1) * words];
            same += want.iter().zip(got).filter(|(a, b)| a == b).count();
            let e = nmse(&k.decode(got), &k.decode(&want));
            assert!(e < 1e-4, "{k}: cell {c} (delta {delta}): nmse {e:e}");
        }
        let total = toks.len() * words;
        assert!(
            same * 100 >= total * 95,
            "{k}: {same} of {total} words as the CPU's"
        );
    }
}
