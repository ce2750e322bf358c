//! The models a router serves, from llama-server's three sources, merged in its order:
//! the Hugging Face cache (`ORG/NAME:QUANT`, one entry per quant of each cached
//! repository), `--models-dir` (each `*.gguf` at the top by its name without `.gguf`;
//! each subdirectory by its name, with its `*mmproj*` file as the projector and the first
//! part of a split model), and `--models-preset` (an INI file: `[name]` sections of
//! llama-server flags by their long names, a `[*]` section for every model). A preset
//! of an existing name adds its keys to that entry. Each entry is the flags its server
//! is started with.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where an entry came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Cache,
    ModelsDir,
    Preset,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Cache => "cache",
            Source::ModelsDir => "models_dir",
            Source::Preset => "preset",
        }
    }
}

/// One model: its name and the flags (long names without `--`, values) its server takes.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub name: String,
    pub aliases: Vec<String>,
    pub tags: Vec<String>,
    pub source: Source,
    /// Flags in order (`("model", "/x.gguf")`, `("ctx-size", "2048")`, `("jinja", "true")`).
    pub flags: Vec<(String, String)>,
    /// The preset's text for this model, as listed.
    pub preset: Option<String>,
    /// Loaded when the router starts (`load-on-startup`).
    pub load_on_startup: bool,
    /// Seconds an unload waits for requests in flight (`stop-timeout`, default 10).
    pub stop_timeout_s: u64,
    /// Listing hidden: a preset of the same files exists (`dedup-cache-models`).
    pub hidden: bool,
}

impl Entry {
    /// The bytes of its model and projector files (0 where none is known yet, as for a
    /// model still to be downloaded).
    pub fn file_bytes(&self) -> u64 {
        (self.flags.iter())
            .filter(|(k, _)| matches!(k.as_str(), "model" | "m" | "mmproj"))
            .filter_map(|(_, v)| std::fs::metadata(v).ok())
            .map(|m| m.len())
            .sum()
    }

    fn new(name: String, source: Source, flags: Vec<(String, String)>) -> Entry {
        Entry {
            name,
            aliases: Vec::new(),
            tags: Vec::new(),
            source,
            flags,
            preset: None,
            load_on_startup: false,
            stop_timeout_s: 10,
            hidden: false,
        }
    }

    /// The value of a flag, by any of its names.
    pub fn flag(&self, names: &[&str]) -> Option<&str> {
        (self.flags.iter().rev())
            .find(|(k, _)| names.contains(&k.as_str()))
            .map(|(_, v)| v.as_str())
    }
}

/// Where to look.
#[derive(Clone, Debug, Default)]
pub struct Sources {
    /// The Hugging Face cache directory (none: not listed).
    pub hub_cache: Option<PathBuf>,
    pub models_dir: Option<PathBuf>,
    pub preset: Option<PathBuf>,
}

/// Flags only the router reads from a preset (never passed to a model's server).
const ROUTER_KEYS: &[&str] = &[
    "load-on-startup",
    "stop-timeout",
    "dedup-cache-models",
    "alias",
    "tags",
    "version",
];

/// The `ORG/NAME:QUANT` names of the Hugging Face cache's models (the quant read from
/// each file's name as llama.cpp reads it: the last `-` or `.` separated word).
fn from_cache(hub: &Path) -> Vec<Entry> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(hub) else {
        return out;
    };
    let mut dirs: Vec<_> = rd.flatten().map(|e| e.path()).collect();
    dirs.sort();
    for dir in dirs {
        let Some(folder) = dir.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(repo) = folder.strip_prefix("models--") else {
            continue;
        };
        let repo = repo.replacen("--", "/", 1);
        let rd = crate::hub::cache::RepoDir(dir.clone());
        let Some(commit) = rd.cached_commit() else {
            continue;
        };
        for f in rd.snapshot_files(&commit) {
            if !crate::hub::select::is_model_gguf(&f) {
                continue;
            }
            let Some(tag) = quant_tag(&f) else { continue };
            let name = format!("{repo}:{tag}");
            if out.iter().any(|e: &Entry| e.name == name) {
                continue;
            }
            out.push(Entry::new(
                name.clone(),
                Source::Cache,
                vec![("hf-repo".into(), name)],
            ));
        }
    }
    out
}

/// A GGUF file's quant tag (upper case), for its first part only.
fn quant_tag(path: &str) -> Option<String> {
    let base = path.rsplit('/').next().unwrap_or(path);
    let stem = base.strip_suffix(".gguf")?;
    let stem = match crate::hub::select::split_part(base) {
        Some((prefix, 1, _)) => prefix,
        Some(_) => return None,
        None => stem,
    };
    let tag: String = stem
        .chars()
        .rev()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let sep = stem[..stem.len() - tag.len()].chars().next_back();
    (!tag.is_empty() && matches!(sep, Some('-' | '.'))).then(|| tag.to_ascii_uppercase())
}

fn from_dir(dir: &Path) -> Result<Vec<Entry>, String> {
    let rd = std::fs::read_dir(dir).map_err(|e| format!("--models-dir {}: {e}", dir.display()))?;
    let mut paths: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
    paths.sort();
    let gguf = |p: &Path| p.extension().is_some_and(|x| x == "gguf");
    let companion = |n: &str| {
        n.contains("mmproj")
            || n.starts_with("mtp-")
            || n.starts_with("dflash-")
            || n.starts_with("dspark-")
    };
    let mut out = Vec::new();
    for p in paths {
        let Some(name) = p.file_name().and_then(|n| n.to_str()).map(String::from) else {
            continue;
        };
        if p.is_dir() {
            let Ok(rd) = std::fs::read_dir(&p) else {
                continue;
            };
            let mut files: Vec<PathBuf> = rd
                .flatten()
                .map(|e| e.path())
                .filter(|f| f.is_file() && gguf(f))
                .collect();
            files.sort();
            let fname = |f: &PathBuf| {
                f.file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or("")
                    .to_string()
            };
            let mmproj = files.iter().find(|f| fname(f).contains("mmproj"));
            let models: Vec<&PathBuf> = files.iter().filter(|f| !companion(&fname(f))).collect();
            let model = (models.iter().find(|f| fname(f).contains("-00001-of-")))
                .or_else(|| models.iter().find(|f| !fname(f).contains("-of-")))
                .copied();
            if let Some(m) = model {
                let mut flags = vec![("model".to_string(), m.display().to_string())];
                if let Some(mp) = mmproj {
                    flags.push(("mmproj".into(), mp.display().to_string()));
                }
                out.push(Entry::new(name, Source::ModelsDir, flags));
            }
        } else if gguf(&p) && !companion(&name) {
            let stem = name.trim_end_matches(".gguf").to_string();
            out.push(Entry::new(
                stem,
                Source::ModelsDir,
                vec![("model".into(), p.display().to_string())],
            ));
        }
    }
    Ok(out)
}

/// An INI file's sections, in order: (name, [(key, value)], its text).
type Sections = Vec<(String, Vec<(String, String)>, String)>;

/// Reads a preset file: `[name]` headers, `key = value` lines, `;` or `#` comments.
pub fn parse_ini(text: &str, file: &str) -> Result<Sections, String> {
    let mut out: Sections = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[') {
            let name = name
                .strip_suffix(']')
                .ok_or_else(|| format!("{file}:{}: a section header is [name]", i + 1))?;
            let name = name.trim();
            if name.is_empty() {
                return Err(format!("{file}:{}: a section needs a name", i + 1));
            }
            out.push((name.to_string(), Vec::new(), format!("[{name}]\n")));
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(format!(
                "{file}:{}: expected `key = value`, found {line:?}",
                i + 1
            ));
        };
        let Some(last) = out.last_mut() else {
            return Err(format!(
                "{file}:{}: `{}` comes before any [section]",
                i + 1,
                k.trim()
            ));
        };
        let k = k.trim().trim_start_matches('-').to_string();
        let v = v.trim().trim_matches('"').to_string();
        last.2.push_str(&format!("{k} = {v}\n"));
        last.1.push((k, v));
    }
    Ok(out)
}

/// A preset's yes: `1`, `true`, `on` or `yes` (any case).
pub fn truthy(v: &str) -> bool {
    matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "on" | "yes")
}

/// Every model of `src`, merged as llama-server merges them; names and aliases must be
/// unique.
pub fn load(src: &Sources) -> Result<Vec<Entry>, String> {
    let mut out: Vec<Entry> = Vec::new();
    if let Some(hub) = &src.hub_cache {
        out.extend(from_cache(hub));
    }
    if let Some(dir) = &src.models_dir {
        for e in from_dir(dir)? {
            out.retain(|x| x.name != e.name);
            out.push(e);
        }
    }
    let mut global: Vec<(String, String)> = Vec::new();
    if let Some(p) = &src.preset {
        let file = p.display().to_string();
        let text =
            std::fs::read_to_string(p).map_err(|e| format!("--models-preset {file}: {e}"))?;
        for (name, keys, text) in parse_ini(&text, &file)? {
            if name == "*" {
                global.extend(keys);
                continue;
            }
            let i = match out.iter().position(|e| e.name == name) {
                Some(i) => i,
                None => {
                    out.push(Entry::new(name.clone(), Source::Preset, Vec::new()));
                    out.len() - 1
                }
            };
            let e = &mut out[i];
            e.source = Source::Preset;
            e.preset = Some(text);
            e.flags.extend(keys);
        }
    }
    // The global section under every entry's own keys; then the router's own keys read.
    for e in &mut out {
        let mut flags = global.clone();
        flags.append(&mut e.flags);
        e.flags = flags;
        for (k, v) in &e.flags {
            match k.as_str() {
                "load-on-startup" => e.load_on_startup = truthy(v),
                "stop-timeout" => {
                    e.stop_timeout_s = v.parse().map_err(|_| {
                        format!(
                            "model {}: stop-timeout = {v}: not a number of seconds",
                            e.name
                        )
                    })?
                }
                "alias" => e.aliases = split_list(v),
                "tags" => e.tags = split_list(v),
                _ => {}
            }
        }
    }
    // dedup-cache-models: a preset's files hide the cache entries they come from.
    let mut hide: Vec<String> = Vec::new();
    for e in out.iter().filter(|e| e.source == Source::Preset) {
        if e.flag(&["dedup-cache-models"]).is_some_and(truthy) {
            for repo in [
                e.flag(&["hf-repo", "hf", "hfr"]),
                e.flag(&["spec-draft-hf", "hf-repo-draft", "hfd"]),
            ]
            .into_iter()
            .flatten()
            {
                hide.push(repo.split(':').next().unwrap_or(repo).to_string());
            }
        }
    }
    for e in out.iter_mut().filter(|e| e.source == Source::Cache) {
        let repo = e.name.split(':').next().unwrap_or(&e.name);
        e.hidden = hide.iter().any(|h| h == repo);
    }
    for e in &mut out {
        e.flags.retain(|(k, _)| !ROUTER_KEYS.contains(&k.as_str()));
    }
    let mut seen = std::collections::HashSet::new();
    for e in &out {
        for n in std::iter::once(&e.name).chain(&e.aliases) {
            if !seen.insert(n.clone()) {
                return Err(format!(
                    "the model name or alias {n:?} is used twice: names and aliases must be unique"
                ));
            }
        }
    }
    Ok(out)
}

fn split_list(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// The preset's names, by name (for answering which models a reload removed).
pub fn by_name(list: &[Entry]) -> BTreeMap<&str, &Entry> {
    list.iter().map(|e| (e.name.as_str(), e)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quant_tags_as_llama_cpp_reads_them() {
        assert_eq!(quant_tag("tinygemma3-Q8_0.gguf").as_deref(), Some("Q8_0"));
        assert_eq!(
            quant_tag("sub/stories260K-f32.gguf").as_deref(),
            Some("F32")
        );
        assert_eq!(quant_tag("m.Q4_K_M.gguf").as_deref(), Some("Q4_K_M"));
        assert_eq!(
            quant_tag("m-Q4_0-00001-of-00002.gguf").as_deref(),
            Some("Q4_0")
        );
        assert_eq!(quant_tag("m-Q4_0-00002-of-00002.gguf"), None);
        assert_eq!(quant_tag("model.gguf"), None);
    }

    #[test]
    fn presets_merge_over_the_global_section() {
        let dir = std::env::temp_dir().join(format!("wgllm-catalog-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("p.ini");
        std::fs::write(
            &p,
            "; models\n[*]\nctx-size = 512\n\n[a]\nmodel = /x.gguf\nalias = x1, x2\nload-on-startup = true\n[b]\nhf-repo = o/r:Q8_0\nctx-size = 64\n",
        )
        .unwrap();
        let list = load(&Sources {
            preset: Some(p.clone()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].aliases, ["x1", "x2"]);
        assert!(list[0].load_on_startup);
        assert_eq!(list[0].flag(&["ctx-size"]), Some("512"));
        assert_eq!(list[1].flag(&["ctx-size"]), Some("64"), "its own key wins");
        assert!(list[0]
            .flags
            .iter()
            .all(|(k, _)| k != "alias" && k != "load-on-startup"));
        std::fs::write(&p, "[a]\nmodel = /x\n[b]\nalias = a\n").unwrap();
        assert!(load(&Sources {
            preset: Some(p.clone()),
            ..Default::default()
        })
        .unwrap_err()
        .contains("used twice"));
        std::fs::write(&p, "model = /x\n").unwrap();
        assert!(load(&Sources {
            preset: Some(p),
            ..Default::default()
        })
        .unwrap_err()
        .contains("before any [section]"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
