//! A runtime directory for the GL probe. Finding adapters also asks Mesa's EGL for GL
//! ones, and with `XDG_RUNTIME_DIR` unset (a fresh shell over ssh, a container, CI) its
//! Wayland platform check prints "error: XDG_RUNTIME_DIR is invalid or not set in the
//! environment." two to ten times into every run, successful or not. Before anything
//! else runs (no threads yet), an unset or missing directory is replaced by a private
//! one under the temporary directory; a valid one is left alone.

use std::path::{Path, PathBuf};

pub fn ensure() {
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR") {
        if Path::new(&dir).is_dir() {
            return;
        }
    }
    if let Some(dir) = private_dir() {
        // Single-threaded here (called first thing in `main`), so setting is sound.
        std::env::set_var("XDG_RUNTIME_DIR", dir);
    }
}

/// `$TMPDIR/wgllm-runtime-<uid>`, created with mode 0700 (as the variable's owner
/// expects); None if it cannot be made or belongs to someone else.
#[cfg(unix)]
fn private_dir() -> Option<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let uid = std::fs::metadata("/proc/self").map(|m| m.uid()).ok()?;
    let dir = std::env::temp_dir().join(format!("wgllm-runtime-{uid}"));
    let made = std::fs::DirBuilder::new().mode(0o700).create(&dir);
    if made.is_err() && !dir.is_dir() {
        return None;
    }
    let m = std::fs::symlink_metadata(&dir).ok()?;
    (m.is_dir() && m.uid() == uid).then_some(dir)
}

#[cfg(not(unix))]
fn private_dir() -> Option<PathBuf> {
    None
}
