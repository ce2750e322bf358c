//! The crate's top-level modules form layers: each may use only those below it, so that
//! any one can be read, tested and changed with only the ones beneath it in mind. This
//! reads every `crate::NAME` reference in `src/` outside tests and comments, draws the
//! graph of top-level modules, and fails on a cycle, printing its modules and the files
//! whose references close it.
//!
//! One level down, the files and subfolders inside each folder must form layers too
//! (`each_folders_children_form_layers`), read from `crate::FOLDER::X` and `super::X`.
//!
//! Test code is left out: files declared `#[cfg(test)] mod NAME;` (and `tests.rs`), and
//! an inline `#[cfg(test)] mod NAME { ... }` from where it starts to the end of its
//! file (clippy's `items_after_test_module` keeps test modules last).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// `text` without `//` comments (doc comments included), and without an inline test
/// module and all after it; also the names of test modules declared in other files.
fn code_of(text: &str) -> (String, Vec<String>) {
    let mut code = String::new();
    let mut test_files = Vec::new();
    let mut cfg_test = false;
    for line in text.lines() {
        let t = line.trim_start();
        if cfg_test {
            if let Some(rest) = t
                .strip_prefix("mod ")
                .or_else(|| t.strip_prefix("pub mod "))
            {
                let rest = rest.trim_end();
                if let Some(name) = rest.strip_suffix(';') {
                    test_files.push(name.trim().to_string());
                    cfg_test = false;
                    continue;
                }
                // An inline test module: it and everything after it is test code.
                break;
            }
            if !t.starts_with("#[") {
                cfg_test = false;
            }
        }
        if t.starts_with("#[cfg(test)]") {
            cfg_test = true;
            continue;
        }
        let line = match line.find("//") {
            // Not inside a string: the text before has an even number of quotes.
            Some(i) if line[..i].matches('"').count() % 2 == 0 => &line[..i],
            _ => line,
        };
        code.push_str(line);
        code.push('\n');
    }
    (code, test_files)
}

/// The top-level modules each one refers to, with the files that do.
type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

/// Every non-test file of `src/` with its code (see [`code_of`]), by path under `src/`.
fn code_files() -> Vec<(PathBuf, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut texts: HashMap<PathBuf, (String, Vec<String>)> = HashMap::new();
    let mut test_only: HashSet<PathBuf> = HashSet::new();
    for f in &files {
        let (code, tests) = code_of(&std::fs::read_to_string(f).unwrap());
        // `mod NAME;` in `dir/mod.rs` or `dir.rs`... here only `mod.rs`/`lib.rs` style
        // declarations occur: NAME.rs or NAME/mod.rs beside the declaring file, or in
        // the folder named after it.
        let dir = if f
            .file_name()
            .is_some_and(|n| n == "mod.rs" || n == "lib.rs")
        {
            f.parent().unwrap().to_path_buf()
        } else {
            f.with_extension("")
        };
        for name in &tests {
            test_only.insert(dir.join(format!("{name}.rs")));
            test_only.insert(dir.join(name).join("mod.rs"));
        }
        texts.insert(f.clone(), (code, tests));
    }
    let mut out = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let name = rel.file_name().unwrap().to_str().unwrap();
        if test_only.contains(f) || name == "tests.rs" {
            continue;
        }
        out.push((rel.to_path_buf(), texts[f].0.clone()));
    }
    out
}

fn module_graph() -> Graph {
    let mut graph = Graph::new();
    for (rel, code) in &code_files() {
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_str()
            .unwrap();
        let module = first.strip_suffix(".rs").unwrap_or(first).to_string();
        if module == "lib" || module == "main" {
            continue;
        }
        let uses = graph.entry(module.clone()).or_default();
        let mut rest = code.as_str();
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            let target = &rest[..end];
            if !target.is_empty() && target != module {
                uses.entry(target.to_string())
                    .or_default()
                    .insert(rel.display().to_string());
            }
        }
    }
    graph
}

/// Strongly connected components with more than one module (Tarjan's, iteratively).
fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    let nodes: Vec<&String> = graph.keys().collect();
    let id: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    let succ: Vec<Vec<usize>> = nodes
        .iter()
        .map(|n| {
            graph[*n]
                .keys()
                .filter_map(|t| id.get(t.as_str()).copied())
                .collect()
        })
        .collect();
    let n = nodes.len();
    let (mut index, mut low) = (vec![usize::MAX; n], vec![0; n]);
    let mut on_stack = vec![false; n];
    let (mut stack, mut out) = (Vec::new(), Vec::new());
    let mut next = 0;
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        let mut work = vec![(root, 0usize)];
        while let Some(&mut (v, ref mut k)) = work.last_mut() {
            if *k == 0 && index[v] == usize::MAX {
                index[v] = next;
                low[v] = next;
                next += 1;
                stack.push(v);
                on_stack[v] = true;
            }
            if let Some(&w) = succ[v].get(*k) {
                *k += 1;
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(u, _)) = work.last() {
                low[u] = low[u].min(low[v]);
            }
            if low[v] == index[v] {
                let mut comp = Vec::new();
                loop {
                    let w = stack.pop().unwrap();
                    on_stack[w] = false;
                    comp.push(nodes[w].clone());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    out.push(comp);
                }
            }
        }
    }
    out
}

/// Each cycle of `graph` (after `place`), its members and the files whose references
/// close it; empty where there is none.
fn cycle_report(graph: &Graph, place: &str) -> String {
    let mut report = String::new();
    for comp in cycles(graph) {
        report.push_str(&format!("{place}a cycle among {}:\n", comp.join(", ")));
        for a in &comp {
            for (b, files) in &graph[a] {
                if comp.contains(b) {
                    let files: Vec<_> = files.iter().cloned().collect();
                    report.push_str(&format!("  {a} -> {b}: {}\n", files.join(", ")));
                }
            }
        }
    }
    report
}

#[test]
fn top_level_modules_form_layers() {
    let graph = module_graph();
    for (m, uses) in &graph {
        println!(
            "{m} -> {}",
            uses.keys().cloned().collect::<Vec<_>>().join(", ")
        );
    }
    let report = cycle_report(&graph, "");
    assert!(
        report.is_empty(),
        "the top-level modules of src/ must form layers, each using only those below it;\n{report}"
    );
    // The graph holds every top-level module, so a renamed one cannot slip out.
    for m in [
        "gguf", "gpu", "ops", "graph", "kv", "memory", "model", "context", "engine",
    ] {
        assert!(graph.contains_key(m), "no module {m} read from src/");
    }
}

/// The module names `code` reaches through `prefix` (`crate::ops::`, `super::`): the
/// first name after it, or each name of a `{...}` group after it.
fn names_after(code: &str, prefix: &str) -> Vec<String> {
    let word = |t: &str| -> String {
        t.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = code[from..].find(prefix).map(|i| i + from) {
        from = i + prefix.len();
        // Not the tail of a longer path, nor its head (`super::super::` is another level).
        let before = code[..i].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
            || code[from..].starts_with("super::")
        {
            continue;
        }
        let rest = &code[from..];
        match rest.strip_prefix('{') {
            Some(group) => {
                let end = group.find('}').unwrap_or(group.len());
                out.extend(group[..end].split(',').map(word));
            }
            None => out.push(word(rest)),
        }
    }
    out.retain(|n| !n.is_empty() && n.chars().next().is_some_and(|c| c.is_lowercase()));
    out
}

/// For each folder of `src/`, the graph among its children (files and subfolders, its
/// `mod.rs` aside: the folder's face, which declares and re-exports them): child C uses
/// child X where a file of C names `crate::FOLDER::X`, or `super::X` from C's own level.
/// Names re-exported by `mod.rs` (`super::Item`) are not followed.
fn folder_graphs() -> BTreeMap<String, Graph> {
    let files = code_files();
    let mut folders: BTreeMap<String, Graph> = BTreeMap::new();
    for (rel, _) in &files {
        let parts: Vec<String> = rel
            .with_extension("")
            .components()
            .map(|c| c.as_os_str().to_str().unwrap().to_string())
            .collect();
        for depth in 1..parts.len() {
            let folder = parts[..depth].join("/");
            let children: BTreeSet<String> = files
                .iter()
                .filter_map(|(r, _)| {
                    let p: Vec<String> = r
                        .with_extension("")
                        .components()
                        .map(|c| c.as_os_str().to_str().unwrap().to_string())
                        .collect();
                    (p.len() > depth && p[..depth].join("/") == folder && p[depth] != "mod")
                        .then(|| p[depth].clone())
                })
                .collect();
            folders.entry(folder).or_default().extend(
                children
                    .into_iter()
                    .map(|c| (c, BTreeMap::<String, BTreeSet<String>>::new())),
            );
        }
    }
    for (rel, code) in &files {
        let parts: Vec<String> = rel
            .with_extension("")
            .components()
            .map(|c| c.as_os_str().to_str().unwrap().to_string())
            .collect();
        for depth in 1..parts.len() {
            let child = &parts[depth];
            if child == "mod" {
                continue;
            }
            let folder = parts[..depth].join("/");
            // `super` from the child's own level: a file directly in the folder, or the
            // child folder's mod.rs; one level deeper takes `super::super::`.
            let below = parts.len() - depth - 1 - (parts.last().unwrap() == "mod") as usize;
            let supers = "super::".repeat(below + 1);
            let mut names = names_after(code, &format!("crate::{}::", folder.replace('/', "::")));
            names.extend(names_after(code, &supers));
            let graph = folders.get_mut(&folder).unwrap();
            let known: BTreeSet<String> = graph.keys().cloned().collect();
            for n in names {
                if n != *child && known.contains(&n) {
                    graph
                        .get_mut(child)
                        .unwrap()
                        .entry(n)
                        .or_default()
                        .insert(rel.display().to_string());
                }
            }
        }
    }
    folders
}

/// One level down: inside each folder, its files and subfolders form layers too.
#[test]
fn each_folders_children_form_layers() {
    let report: String = (folder_graphs().iter())
        .map(|(folder, graph)| cycle_report(graph, &format!("in src/{folder}/, ")))
        .collect();
    assert!(
        report.is_empty(),
        "the files inside each folder of src/ must form layers too;\n{report}"
    );
}

#[test]
fn a_cycle_is_found_and_named() {
    let mut g = Graph::new();
    let edge = |g: &mut Graph, a: &str, b: &str| {
        g.entry(a.into())
            .or_default()
            .entry(b.into())
            .or_default()
            .insert(format!("{a}/x.rs"));
        g.entry(b.into()).or_default();
    };
    edge(&mut g, "a", "b");
    edge(&mut g, "b", "c");
    edge(&mut g, "c", "a");
    edge(&mut g, "c", "d");
    edge(&mut g, "e", "d");
    assert_eq!(
        cycles(&g),
        vec![vec!["a".to_string(), "b".into(), "c".into()]]
    );
    let (code, tests) = code_of(
        "use crate::a; // crate::b\n/// crate::c\n#[cfg(test)]\nmod fixture;\nfn f() {}\n#[cfg(test)]\nmod tests {\n use crate::d;\n}\n",
    );
    assert!(code.contains("crate::a") && !code.contains("crate::b"));
    assert!(!code.contains("crate::c") && !code.contains("crate::d"));
    assert_eq!(tests, vec!["fixture".to_string()]);
    // Module names after a prefix: a group's too; items (capitals) and the tail of a
    // longer path are not.
    let names = names_after(
        "use super::{a, B, c::d};\nlet x = super::super::e::f; super::g::h();",
        "super::",
    );
    assert_eq!(names, vec!["a".to_string(), "c".into(), "g".into()]);
    assert_eq!(
        names_after("super::super::e::f", "super::super::"),
        vec!["e".to_string()]
    );
}
