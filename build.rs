//! Records the git commit the binary was built from (`wgllm bench`'s `build_commit`, as
//! llama-bench reports its own); "unknown" outside a git checkout.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The path to watch for `p`: itself where it exists, else (for a branch that lives only
/// in packed refs) its folder, which changes when a commit writes the branch's own file.
/// Cargo treats a watched path that does not exist as always changed, so naming one
/// rebuilds the crate on every `cargo build` (a checkout without `.git/packed-refs`).
fn watchable(p: &Path, or_folder: bool) -> Option<PathBuf> {
    if p.exists() {
        return Some(p.to_path_buf());
    }
    let folder = p.parent().filter(|f| or_folder && f.is_dir())?;
    Some(folder.to_path_buf())
}

fn main() {
    let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=WGLLM_BUILD_COMMIT={commit}");
    // Rebuild when HEAD moves: the HEAD file, the branch it names, and packed refs.
    let mut watch = vec![
        ("HEAD".to_string(), false),
        ("packed-refs".to_string(), false),
    ];
    if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch.push((r, true));
    }
    let mut seen = Vec::new();
    for (w, or_folder) in watch {
        let Some(p) = git(&["rev-parse", "--git-path", &w]) else {
            continue;
        };
        if let Some(p) = watchable(Path::new(&p), or_folder).filter(|p| !seen.contains(p)) {
            println!("cargo:rerun-if-changed={}", p.display());
            seen.push(p);
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
