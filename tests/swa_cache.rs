//! The rolling buffer of the sliding-window layers against a full cache with the
//! sliding-window mask (`--swa-full`), on a tiny random gemma3 (window 8, five of six
//! layers local): chunked prefill, decoding, context shifts with a kept prefix, several
//! sequences, state files. The logits must agree at every step; what the buffer cannot
//! reproduce must be refused with an error naming --swa-full.

mod common;

use std::sync::Arc;
use wgllm::context::{Batch, Context, ContextError, ContextParams};
use wgllm::gpu::{Gpu, GpuOptions};
use wgllm::memory::MemoryError;
use wgllm::model::Model;

const WINDOW: u32 = 8;

fn model() -> Arc<Model> {
    let gpu = Gpu::new(&GpuOptions {
        no_f16: true, // f32 cache: the two layouts must agree to rounding
        ..Default::default()
    })
    .unwrap();
    common::tiny_gemma3(gpu, WINDOW)
}

fn ctx(m: &Arc<Model>, swa_full: bool, n_ubatch: u32, n_seq: u32, keep: u32) -> Context {
    let p = ContextParams {
        n_seq_max: n_seq,
        swa_full,
        swa_keep: keep,
        ..ContextParams::new(128, 64, n_ubatch)
    };
    Context::new(m.clone(), p).unwrap()
}

fn tokens(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2654435761) ^ seed.wrapping_mul(40503)) % 256)
        .collect()
}

/// Decodes `toks` of sequence `seq` from `pos` in batches of `chunk`, logits for all.
fn feed(c: &mut Context, toks: &[u32], pos: i32, seq: u32, chunk: usize) -> Vec<f32> {
    let mut out = Vec::new();
    for (i, ch) in toks.chunks(chunk).enumerate() {
        let mut b = Batch::simple(ch, pos + (i * chunk) as i32, true);
        b.seq = vec![1u64 << seq; ch.len()];
        out.extend(c.decode(&b).unwrap());
    }
    out
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    let e = common::nmse(got, want);
    assert!(e < 1e-8, "{what}: nmse {e}");
}

#[test]
fn chunked_prefill_and_decoding_equal_the_full_cache() {
    let m = model();
    let toks = tokens(60, 1);
    let mut full = ctx(&m, true, 64, 1, 0);
    let want = feed(&mut full, &toks, 0, 0, 64);
    // Chunks of 4 (the ubatch) then single tokens: the buffer holds window - 1 + 4 cells.
    let mut roll = ctx(&m, false, 4, 1, 0);
    let w = roll.memory().maps()[1].cells.len();
    assert_eq!(w, (WINDOW - 1 + 4) as usize);
    let mut got = feed(&mut roll, &toks[..40], 0, 0, 4);
    got.extend(feed(&mut roll, &toks[40..], 40, 0, 1));
    assert_close(&got, &want, "60 tokens");
    assert!(roll.memory().maps()[1].used <= w);
}

/// llama-completion's context shift with --keep 3 (positions [0, 3) pinned): after it
/// the kept prefix is back inside the window, and the buffer still has it.
#[test]
fn a_context_shift_keeps_what_comes_back_into_the_window() {
    let m = model();
    // 30 tokens, then a shift of 24 leaves positions 0..6: the next queries (6, 7, ..)
    // see the prefix again until the window slides past it.
    let (keep, discard) = (3, 24);
    let toks = tokens(60, 2);
    let run = |c: &mut Context, chunk: usize| {
        let mut out = feed(c, &toks[..30], 0, 0, chunk);
        c.seq_rm(Some(0), keep, keep + discard).unwrap();
        c.seq_add(0, keep + discard, -1, -discard).unwrap();
        out.extend(feed(c, &toks[30..], 30 - discard, 0, chunk));
        out
    };
    let want = run(&mut ctx(&m, true, 64, 1, 0), 8);
    let got = run(&mut ctx(&m, false, 4, 1, keep as u32), 4);
    assert_close(&got, &want, "through a shift");
    // Without the pinned prefix the buffer has dropped positions 0..3 and says so.
    let mut c = ctx(&m, false, 4, 1, 0);
    feed(&mut c, &toks[..30], 0, 0, 4);
    c.seq_rm(Some(0), keep, keep + discard).unwrap();
    c.seq_add(0, keep + discard, -1, -discard).unwrap();
    let e = c
        .decode(&Batch::simple(&toks[30..31], 6, true))
        .unwrap_err();
    assert!(e.to_string().contains("--swa-full"), "{e}");
}

/// Three sequences in shared ubatches, each with its own window.
#[test]
fn sequences_keep_their_own_windows() {
    let m = model();
    let toks: Vec<Vec<u32>> = (0..3).map(|s| tokens(30, 10 + s)).collect();
    let run = |c: &mut Context| {
        let mut out = Vec::new();
        for step in 0..10 {
            // Three tokens of each sequence per batch, interleaved.
            let mut b = Batch::default();
            for (s, t) in toks.iter().enumerate() {
                for j in 0..3 {
                    b.tokens.push(t[step * 3 + j]);
                    b.pos.push((step * 3 + j) as i32);
                    b.seq.push(1 << s);
                    b.logits.push(true);
                }
            }
            out.extend(c.decode(&b).unwrap());
        }
        out
    };
    let want = run(&mut ctx(&m, true, 64, 3, 0));
    let mut roll = ctx(&m, false, 9, 3, 0);
    let got = run(&mut roll);
    assert_close(&got, &want, "three sequences");
    let size = roll.memory().maps()[1].cells.len();
    assert_eq!(size, 3 * (WINDOW as usize - 1) + 9);
}

#[test]
fn state_files_round_trip_the_rolling_buffer() {
    let m = model();
    let toks = tokens(50, 3);
    let mut a = ctx(&m, false, 4, 1, 0);
    feed(&mut a, &toks[..30], 0, 0, 4);
    let path = std::env::temp_dir().join(format!("wgllm-swa-state-{}", std::process::id()));
    a.state_save(&path, &toks[..30], None, &[]).unwrap();
    let want = feed(&mut a, &toks[30..], 30, 0, 1);
    let mut b = ctx(&m, false, 4, 1, 0);
    let saved = b.state_load(&path, None).unwrap();
    assert_eq!(saved.tokens, &toks[..30]);
    let got = feed(&mut b, &toks[30..], 30, 0, 1);
    assert_close(&got, &want, "after loading");
    // A context with a full-size window cache has another layout: refused, not misread.
    let mut c = ctx(&m, true, 4, 1, 0);
    let e = c.state_load(&path, None).unwrap_err();
    assert!(e.to_string().contains("--swa-full"), "{e}");
    let _ = std::fs::remove_file(&path);
}

#[test]
fn what_the_buffer_cannot_do_is_refused_with_the_flag_that_can() {
    let m = model();
    let toks = tokens(40, 4);
    let mut c = ctx(&m, false, 4, 1, 0);
    feed(&mut c, &toks, 0, 0, 4);
    // Self-Extend.
    let e = c.seq_div(0, 0, 32, 2).unwrap_err();
    assert!(
        matches!(e, ContextError::Memory(MemoryError::SelfExtendNeedsSwaFull)),
        "{e}"
    );
    assert!(e.to_string().contains("--swa-full"));
    // Cutting back far past the buffer and decoding from there.
    c.seq_rm(Some(0), 10, -1).unwrap();
    let e = c
        .decode(&Batch::simple(&toks[10..11], 10, true))
        .unwrap_err();
    assert!(e.to_string().contains("--swa-full"), "{e}");
    // A cut within the buffer's slack decodes, and equals the full cache.
    let mut full = ctx(&m, true, 64, 1, 0);
    let mut roll = ctx(&m, false, 4, 1, 0);
    feed(&mut full, &toks, 0, 0, 4);
    feed(&mut roll, &toks, 0, 0, 4);
    for x in [&mut full, &mut roll] {
        x.seq_rm(Some(0), 38, -1).unwrap();
    }
    let want = feed(&mut full, &toks[..4], 38, 0, 1);
    let got = feed(&mut roll, &toks[..4], 38, 0, 1);
    assert_close(&got, &want, "after a short cut");
}
