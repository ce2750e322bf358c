//! The Hugging Face cache layout that llama.cpp and Python's huggingface_hub share:
//! `models--ORG--NAME/blobs/<sha256 or git oid>` holds each file once,
//! `snapshots/<commit>/<path>` links to it (a relative symlink, a copy where links fail),
//! `refs/main` names the commit. Files either tool downloaded serve the other.

use std::path::{Path, PathBuf};

/// The hub cache directory, from the variables llama.cpp reads, in its order:
/// `LLAMA_CACHE` (as is), `HF_HUB_CACHE`, `HUGGINGFACE_HUB_CACHE`, `$HF_HOME/hub`,
/// `$XDG_CACHE_HOME/huggingface/hub`, `~/.cache/huggingface/hub`.
pub fn hub_dir() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("LLAMA_CACHE")
        .or_else(|| var("HF_HUB_CACHE"))
        .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
        .or_else(|| var("HF_HOME").map(|h| h.join("hub")))
        .or_else(|| var("XDG_CACHE_HOME").map(|h| h.join("huggingface/hub")))
        .or_else(|| var("HOME").map(|h| h.join(".cache/huggingface/hub")))
        .or_else(|| var("USERPROFILE").map(|h| h.join(".cache/huggingface/hub")))
}

/// One repository's folder in the cache.
#[derive(Debug, Clone)]
pub struct RepoDir(pub PathBuf);

impl RepoDir {
    pub fn new(hub: &Path, repo: &str) -> RepoDir {
        RepoDir(hub.join(format!("models--{}", repo.replace('/', "--"))))
    }
    pub fn blob(&self, oid: &str) -> PathBuf {
        self.0.join("blobs").join(oid)
    }
    pub fn snapshot(&self, commit: &str, path: &str) -> PathBuf {
        self.0.join("snapshots").join(commit).join(path)
    }

    /// The commit `refs/main` names, else the first readable ref (40 hex digits).
    pub fn cached_commit(&self) -> Option<String> {
        let refs = self.0.join("refs");
        let read = |p: PathBuf| {
            let s = std::fs::read_to_string(p).ok()?;
            let c = s.lines().next()?.trim().to_string();
            (c.len() == 40 && c.bytes().all(|b| b.is_ascii_hexdigit())).then_some(c)
        };
        read(refs.join("main")).or_else(|| {
            let mut names: Vec<PathBuf> = std::fs::read_dir(&refs)
                .ok()?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .collect();
            names.sort();
            names.into_iter().find_map(read)
        })
    }

    /// Records `commit` as `refs/<branch>` (written through a rename).
    pub fn set_ref(&self, branch: &str, commit: &str) -> std::io::Result<()> {
        let refs = self.0.join("refs");
        std::fs::create_dir_all(&refs)?;
        let tmp = refs.join(format!("{branch}.tmp"));
        std::fs::write(&tmp, commit)?;
        std::fs::rename(tmp, refs.join(branch))
    }

    /// Every file of a snapshot, as repository paths (sorted).
    pub fn snapshot_files(&self, commit: &str) -> Vec<String> {
        let root = self.0.join("snapshots").join(commit);
        let mut out = Vec::new();
        let mut todo = vec![root.clone()];
        while let Some(dir) = todo.pop() {
            let Ok(rd) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in rd.flatten() {
                let p = e.path();
                if p.is_dir() {
                    todo.push(p);
                } else if p.exists() {
                    if let Ok(rel) = p.strip_prefix(&root) {
                        out.push(rel.to_string_lossy().replace('\\', "/"));
                    }
                }
            }
        }
        out.sort();
        out
    }

    /// Makes `snapshots/<commit>/<path>` point at `blob`: a relative symlink, or (where
    /// links cannot be made) the blob moved there.
    pub fn link(&self, commit: &str, path: &str, blob: &Path) -> std::io::Result<PathBuf> {
        let dst = self.snapshot(commit, path);
        if dst.exists() {
            return Ok(dst);
        }
        let parent = dst.parent().expect("a snapshot path has a parent");
        std::fs::create_dir_all(parent)?;
        // From snapshots/<commit>/<dirs...>/ up to the repository folder.
        let depth = 2 + path.matches('/').count();
        let mut rel = PathBuf::new();
        for _ in 0..depth {
            rel.push("..");
        }
        let rel = rel.join(blob.strip_prefix(&self.0).unwrap_or(blob));
        #[cfg(unix)]
        if std::os::unix::fs::symlink(&rel, &dst).is_ok() {
            return Ok(dst);
        }
        let _ = rel;
        if std::fs::rename(blob, &dst).is_err() {
            std::fs::copy(blob, &dst)?;
        }
        Ok(dst)
    }
}

/// Removes one quant of a cached repository (`tag`, any case: its model GGUFs, every part
/// of a split one, and the blobs they link to), or with `tag` None the whole repository;
/// a repository left without a model GGUF goes whole. Returns the files removed (none:
/// nothing of that name is cached).
pub fn remove(hub: &Path, repo: &str, tag: Option<&str>) -> std::io::Result<Vec<String>> {
    let dir = RepoDir::new(hub, repo);
    let Some(commit) = dir.cached_commit() else {
        return Ok(Vec::new());
    };
    let files = dir.snapshot_files(&commit);
    let Some(tag) = tag else {
        std::fs::remove_dir_all(&dir.0)?;
        return Ok(files);
    };
    let tag = tag.to_ascii_uppercase();
    let of_tag = |f: &str| {
        let base = f.rsplit('/').next().unwrap_or(f);
        let stem = base.strip_suffix(".gguf").unwrap_or(base);
        let stem = super::select::split_part(base).map_or(stem, |(p, _, _)| p);
        let up = stem.to_ascii_uppercase();
        super::select::is_model_gguf(f)
            && up.ends_with(&tag)
            && matches!(
                up[..up.len() - tag.len()].chars().next_back(),
                Some('-' | '.')
            )
    };
    let gone: Vec<String> = files.iter().filter(|f| of_tag(f)).cloned().collect();
    // Only blobs of this repository's own folder go: a snapshot may link elsewhere. And
    // only links that really sit in the snapshot's folder: a path through a symlinked
    // directory would reach outside the cache.
    let blobs = std::fs::canonicalize(dir.0.join("blobs")).ok();
    let snap = std::fs::canonicalize(dir.0.join("snapshots").join(&commit))?;
    let gone: Vec<String> = (gone.into_iter())
        .filter(|f| {
            let link = dir.snapshot(&commit, f);
            (link.parent().and_then(|p| std::fs::canonicalize(p).ok()))
                .is_some_and(|p| p.starts_with(&snap))
        })
        .collect();
    for f in &gone {
        let link = dir.snapshot(&commit, f);
        let target = std::fs::canonicalize(&link).ok();
        if let (Some(t), Some(b)) = (&target, &blobs) {
            if t.starts_with(b) {
                let _ = std::fs::remove_file(t);
            }
        }
        std::fs::remove_file(&link)?;
    }
    let left = dir.snapshot_files(&commit);
    if !left.iter().any(|f| super::select::is_model_gguf(f)) {
        std::fs::remove_dir_all(&dir.0)?;
    }
    Ok(gone)
}

/// The model GGUFs in the cache: each repository's files at the commit its ref names
/// (what the app's model picker lists beside its own folders).
pub fn cached_models(hub: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(hub) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name();
        if !name.to_string_lossy().starts_with("models--") {
            continue;
        }
        let repo = RepoDir(e.path());
        let Some(commit) = repo.cached_commit() else {
            continue;
        };
        for f in repo.snapshot_files(&commit) {
            if super::select::is_model_gguf(&f)
                && super::select::split_part(&f).is_none_or(|(_, k, _)| k == 1)
            {
                out.push(repo.snapshot(&commit, &f));
            }
        }
    }
    out.sort();
    out
}
