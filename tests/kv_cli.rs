//! The `wgllm` binary's KV cache flags: combinations that cannot work are refused, and a
//! full context is reported with its true cause.

mod common;

use common::{smollm2 as model, wgllm_with_stdin as wgllm};

/// A prompt cache is reused by position; Self-Extend's grouped positions are not token
/// indices, so the two together are refused before anything is loaded or written.
#[test]
fn prompt_cache_with_self_extend_is_refused() {
    let m = model();
    let dir = std::env::temp_dir().join(format!("wgllm-kv-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cache = dir.join("prompt.cache");
    let c = cache.to_str().unwrap();
    let args = [
        "run",
        "-m",
        &m,
        "-p",
        "hi",
        "-n",
        "1",
        "--prompt-cache",
        c,
        "--grp-attn-n",
        "2",
        "--grp-attn-w",
        "16",
    ];
    let (code, _, err) = wgllm(&args, "");
    assert_eq!(code, 1, "exit code {code}, stderr: {err}");
    assert!(
        err.contains("--prompt-cache cannot be used with Self-Extend (--grp-attn-n 2 > 1)"),
        "{err}"
    );
    assert!(!cache.exists(), "no cache file is written");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `run` stops at a full context with a warning naming the cause: Self-Extend (which
/// frees no cells) is not "context shift is off".
#[test]
fn run_says_why_the_context_filled() {
    let m = model();
    let base = [
        "run",
        "-m",
        &m,
        "-p",
        "Once upon a time",
        "-c",
        "64",
        "-n",
        "200",
        "--ignore-eos",
        "-s",
        "1",
    ];
    let ga = [&base[..], &["--grp-attn-n", "2"]].concat();
    let (code, _, err) = wgllm(&ga, "");
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("is full and Self-Extend (--grp-attn-n) frees no cells"),
        "{err}"
    );
    assert!(!err.contains("context shift is off"), "{err}");
    let off = [&base[..], &["--no-context-shift"]].concat();
    let (code, _, err) = wgllm(&off, "");
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("is full and context shift is off"), "{err}");
}

/// `chat` ends at a full context with the true cause too (it used to blame context
/// shift even when it was on).
#[test]
fn chat_says_why_the_context_filled() {
    let m = model();
    let args = [
        "chat",
        "-m",
        &m,
        "-c",
        "64",
        "-n",
        "200",
        "--ignore-eos",
        "-s",
        "1",
        "--grp-attn-n",
        "2",
    ];
    let (code, _, err) = wgllm(&args, "Hello\n");
    assert_eq!(code, 1, "exit code {code}, stderr: {err}");
    assert!(
        err.contains("the context is full and Self-Extend (--grp-attn-n) frees no cells"),
        "{err}"
    );
    assert!(!err.contains("context shift is off"), "{err}");
}
