//! Which file of a repository `-hf REPO[:QUANT]` means, as llama.cpp chooses it: the
//! first model GGUF (not a projector, imatrix or draft head) whose path holds the quant
//! tag followed by `.` or `-` (any case); without a tag, Q4_K_M, then Q8_0, then the
//! first model GGUF. A split model is named by its first part.

/// `ORG/REPO[:QUANT]`, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct RepoSpec {
    pub repo: String,
    pub tag: Option<String>,
}

impl RepoSpec {
    pub fn parse(s: &str) -> Result<RepoSpec, String> {
        let (repo, tag) = match s.split_once(':') {
            Some((r, t)) => (r, Some(t.rsplit(':').next().unwrap_or(t).to_string())),
            None => (s, None),
        };
        let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
        let parts: Vec<&str> = repo.split('/').collect();
        let valid = parts.len() == 2
            && parts.iter().all(|p| {
                !p.is_empty()
                    && p.chars().all(ok_char)
                    && !p.starts_with(['-', '.'])
                    && !p.ends_with(['-', '.'])
                    && !p.contains("..")
                    && !p.contains("--")
            })
            && repo.len() <= 256;
        if !valid {
            return Err(format!(
                "invalid Hugging Face repository {s:?}: expected ORG/NAME[:QUANT], e.g. ggml-org/gemma-3-270m-GGUF:Q8_0"
            ));
        }
        Ok(RepoSpec {
            repo: repo.to_string(),
            tag: tag.filter(|t| !t.is_empty()),
        })
    }
}

/// The quant tags tried when none is named.
pub const DEFAULT_TAGS: [&str; 2] = ["Q4_K_M", "Q8_0"];

/// A GGUF that holds a model (not a multimodal projector, an importance matrix or a
/// speculative-decoding head).
pub fn is_model_gguf(path: &str) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path).to_ascii_lowercase();
    base.ends_with(".gguf")
        && !["mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-"]
            .iter()
            .any(|w| base.contains(w))
}

/// `NAME-0000K-of-0000N.gguf`: (prefix, K, N).
pub fn split_part(path: &str) -> Option<(&str, u32, u32)> {
    let stem = path.strip_suffix(".gguf").or_else(|| {
        path.len()
            .checked_sub(5)
            .filter(|&n| path[n..].eq_ignore_ascii_case(".gguf"))
            .map(|n| &path[..n])
    })?;
    // "-00001-of-00003" is 15 characters.
    let n = stem.len().checked_sub(15)?;
    let tail = &stem[n..];
    let (a, b) = (tail.get(1..6)?, tail.get(10..15)?);
    let ok = tail.starts_with('-')
        && tail
            .get(6..10)
            .is_some_and(|m| m.eq_ignore_ascii_case("-of-"))
        && a.bytes().all(|c| c.is_ascii_digit())
        && b.bytes().all(|c| c.is_ascii_digit());
    ok.then(|| (&stem[..n], a.parse().unwrap_or(0), b.parse().unwrap_or(0)))
}

/// Whether `path` names quant `tag` (`tag` followed by `.` or `-`, any case).
fn has_tag(path: &str, tag: &str) -> bool {
    let p = path.to_ascii_lowercase();
    let t = tag.to_ascii_lowercase();
    p.match_indices(&t)
        .any(|(i, _)| matches!(p.as_bytes().get(i + t.len()), Some(b'.' | b'-')))
}

/// The model file `spec` selects among `files` (repository paths, in listing order).
pub fn choose<'a>(files: &[&'a str], spec: &RepoSpec) -> Option<&'a str> {
    let candidates: Vec<&str> = (files.iter().copied())
        .filter(|f| is_model_gguf(f))
        .filter(|f| split_part(f).is_none_or(|(_, k, _)| k == 1))
        .collect();
    let tags: Vec<&str> = match &spec.tag {
        Some(t) => vec![t.as_str()],
        None => DEFAULT_TAGS.to_vec(),
    };
    for t in &tags {
        if let Some(f) = candidates.iter().find(|f| has_tag(f, t)) {
            return Some(f);
        }
    }
    if spec.tag.is_none() {
        return candidates.first().copied();
    }
    None
}

/// The bits of a file's quant (its last `-` or `.` part before `.gguf` and any split
/// suffix: Q4_K_M 4, F16 16, BF16 16), 0 without one, as llama.cpp reads them.
fn quant_bits(path: &str) -> u32 {
    let stem = path.strip_suffix(".gguf").unwrap_or(path);
    let stem = split_part(path).map_or(stem, |(prefix, _, _)| prefix);
    let tail = stem.rsplit(['-', '.']).next().unwrap_or("");
    let ok = stem.len() > tail.len() && !tail.is_empty();
    let ok = ok && tail.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_');
    if !ok {
        return 0;
    }
    let digits: String = (tail.chars())
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap_or(0)
}

/// The vision encoder (mmproj) llama.cpp fetches with `model` from `files`: a GGUF whose
/// path holds "mmproj", in the model's folder or one above it (the deepest such folder
/// first), then the one whose quant's bits are closest to the model's; the first listed
/// wins a tie.
pub fn best_mmproj<'a>(files: &[&'a str], model: &str) -> Option<&'a str> {
    let model_dir: Vec<&str> = model.split('/').collect();
    let model_dir = &model_dir[..model_dir.len() - 1];
    let model_bits = quant_bits(model) as i64;
    let mut best: Option<(&str, usize, i64)> = None;
    for &f in files {
        if !f.ends_with(".gguf") || !f.contains("mmproj") {
            continue;
        }
        let parts: Vec<&str> = f.split('/').collect();
        let dir = &parts[..parts.len() - 1];
        // The sibling's folder must be the model's or one above it.
        if dir.len() > model_dir.len() || model_dir[..dir.len()] != *dir {
            continue;
        }
        let depth = dir.len();
        let diff = (quant_bits(f) as i64 - model_bits).abs();
        let better = match best {
            None => true,
            Some((_, d, df)) => depth > d || (depth == d && diff < df),
        };
        if better {
            best = Some((f, depth, diff));
        }
    }
    best.map(|b| b.0)
}

/// Every part of the split model whose first part is `first` (just `first` if it is
/// not split), in order.
pub fn parts_of<'a>(files: &[&'a str], first: &'a str) -> Vec<&'a str> {
    let Some((prefix, _, n)) = split_part(first) else {
        return vec![first];
    };
    let mut parts: Vec<(u32, &str)> = (files.iter().copied())
        .filter_map(|f| {
            split_part(f)
                .filter(|&(p, _, m)| p == prefix && m == n)
                .map(|(_, k, _)| (k, f))
        })
        .collect();
    parts.sort();
    parts.into_iter().map(|(_, f)| f).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs() {
        let s = RepoSpec::parse("ggml-org/gemma-3-270m-GGUF:Q8_0").unwrap();
        assert_eq!(s.repo, "ggml-org/gemma-3-270m-GGUF");
        assert_eq!(s.tag.as_deref(), Some("Q8_0"));
        assert_eq!(RepoSpec::parse("a/b").unwrap().tag, None);
        for bad in [
            "gemma", "a/b/c", "/b", "a/", "a/.b", "a//b", "a/b c", "a--x/b",
        ] {
            assert!(RepoSpec::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn quant_choice_follows_llama_cpp() {
        let files = [
            "README.md",
            "model-f16.gguf",
            "mmproj-model-Q4_K_M.gguf",
            "model-Q8_0.gguf",
            "sub/model-q4_k_m.gguf",
            "model-Q4_K_M-imatrix.gguf",
            "big-Q2_K-00002-of-00002.gguf",
            "big-Q2_K-00001-of-00002.gguf",
        ];
        let pick = |s: &str| choose(&files, &RepoSpec::parse(s).unwrap());
        assert_eq!(
            pick("a/b"),
            Some("sub/model-q4_k_m.gguf"),
            "Q4_K_M first, any case"
        );
        assert_eq!(pick("a/b:Q8_0"), Some("model-Q8_0.gguf"));
        assert_eq!(pick("a/b:f16"), Some("model-f16.gguf"));
        assert_eq!(pick("a/b:q2_k"), Some("big-Q2_K-00001-of-00002.gguf"));
        assert_eq!(pick("a/b:Q5_K_M"), None, "a named quant that is missing");
        assert_eq!(
            choose(&["x.gguf", "y-f16.gguf"], &RepoSpec::parse("a/b").unwrap()),
            Some("x.gguf")
        );
        assert_eq!(
            parts_of(&files, "big-Q2_K-00001-of-00002.gguf"),
            [
                "big-Q2_K-00001-of-00002.gguf",
                "big-Q2_K-00002-of-00002.gguf"
            ]
        );
        assert_eq!(parts_of(&files, "model-Q8_0.gguf"), ["model-Q8_0.gguf"]);
    }

    #[test]
    fn the_mmproj_is_llama_cpps_choice() {
        assert_eq!(quant_bits("m-Q4_K_M.gguf"), 4);
        assert_eq!(quant_bits("mmproj-model-f16.gguf"), 16);
        assert_eq!(quant_bits("x/m-BF16-00001-of-00002.gguf"), 16);
        assert_eq!(quant_bits("model.gguf"), 0);
        let files = [
            "mmproj-model-f16.gguf",
            "mmproj-model-Q8_0.gguf",
            "sub/mmproj-F32.gguf",
            "gemma-3-4b-it-Q4_K_M.gguf",
            "sub/model-Q4_K_M.gguf",
            "README.md",
        ];
        // Closest bits: Q8_0 for a 4-bit model, f16 for a bf16 one.
        assert_eq!(
            best_mmproj(&files, "gemma-3-4b-it-Q4_K_M.gguf"),
            Some("mmproj-model-Q8_0.gguf")
        );
        assert_eq!(
            best_mmproj(&files, "gemma-3-4b-it-BF16.gguf"),
            Some("mmproj-model-f16.gguf")
        );
        // The model's own folder before the one above it.
        assert_eq!(
            best_mmproj(&files, "sub/model-Q4_K_M.gguf"),
            Some("sub/mmproj-F32.gguf")
        );
        assert_eq!(best_mmproj(&files[3..], "gemma-3-4b-it-Q4_K_M.gguf"), None);
    }
}
