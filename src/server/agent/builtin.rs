//! llama-server's seven built-in agent tools (`--tools`): `read_file`, `file_glob_search`,
//! `grep_search`, `exec_shell_command`, `write_file`, `edit_file` and `get_info`.
//!
//! They are re-implemented from llama-server's behaviour (`tools/server/server-tools.cpp`,
//! summarised in `docs/design/server-mcp-tools.md` §2). What a client sees is kept as
//! llama-server has it: the result objects and their keys, the text layouts and every
//! error message.
//!
//! Everything here blocks (file I/O, child processes); the caller runs it off the async
//! runtime. A tool that fails answers `{"error": MSG}` (HTTP 200, as llama-server does);
//! only a request that llama-server refuses before the tool runs (a required parameter
//! missing or of the wrong type) is a [`BadRequest`].
//!
//! wgllm adds one thing: [`Place::root`], which keeps the file tools inside a directory.
//! llama-server has no confinement at all.

use serde_json::{json, Map, Value};
use std::borrow::Cow;
use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::fs;
use std::io::{self, BufRead, BufReader};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------
// Public API
// ---------------------------------------------------------------------------------------

/// llama-server's built-in tools, in its order.
pub const NAMES: [&str; 7] = [
    "read_file",
    "file_glob_search",
    "grep_search",
    "exec_shell_command",
    "write_file",
    "edit_file",
    "get_info",
];

/// Where a call runs.
#[derive(Clone, Debug)]
pub struct Place {
    /// Relative paths resolve against this (absolute; the x-tool-cwd header or the
    /// server's cwd).
    pub cwd: PathBuf,
    /// wgllm's own `--tools-root`: when set, every path a file tool touches (after `~`
    /// expansion and lexical normalisation, and with symlinks of its existing part
    /// resolved) must lie under this directory (canonical, absolute); otherwise the tool
    /// answers the tool-level error `path is outside the tools root (ROOT): PATH`.
    /// None: llama-server's behaviour (no confinement).
    pub root: Option<PathBuf>,
}

/// A call refused before the tool runs (HTTP 400 with this message), e.g. a missing
/// required parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadRequest(pub String);

/// The tool's definition as llama-server lists it:
/// `{"type":"function","function":{"name","description","parameters"}}`.
pub fn definition(name: &str) -> Option<Value> {
    let def = match name {
        "read_file" => function(
            name,
            "Read the contents of a file. Optionally specify a 1-based line range. \
             If append_loc is true, each line is prefixed with its line number (e.g. \"1\u{2192}...\").",
            json!({
                "type": "object",
                "properties": {
                    "path": prop("string", "Path to the file"),
                    "start_line": prop("integer", "First line to read, 1-based (default: 1)"),
                    "end_line": prop("integer", "Last line to read, 1-based inclusive (default: end of file)"),
                    "append_loc": prop("boolean", "Prefix each line with its line number"),
                },
                "required": ["path"],
            }),
        ),
        "file_glob_search" => function(
            name,
            "Recursively search for files matching a glob pattern under a directory. \
             Automatically skips files ignored by .gitignore (when the directory is inside a git repo) \
             and common junk directories (.git, node_modules, build, dist, etc.) otherwise. \
             A pattern with no '/' (e.g. \"*.cpp\") matches the file's basename at any depth. \
             A pattern containing '/' matches the full relative path; unless already anchored with \
             \"**/\" or a leading '/', it is automatically prefixed with \"**/\". \
             Use type=\"dir\" or \"all\" to also list directories; directory entries are suffixed with '/' in the output. \
             Note: directory listings do not apply .gitignore filtering.",
            json!({
                "type": "object",
                "properties": {
                    "path": prop("string", "Base directory to search in"),
                    "include": prop("string", "Glob pattern for files to include (e.g. \"*.cpp\" or \"src/**/*.cpp\"). Default: **"),
                    "exclude": prop("string", "Glob pattern for files to exclude"),
                    "type": prop("string", "Entry type to return: \"file\" (default), \"dir\" or \"all\""),
                    "max_depth": prop("integer", "Maximum depth to descend into subdirectories (default: 0 = unlimited; 1 = direct children only)"),
                    "limit": prop("integer", &format!(
                        "Maximum number of results to return, capped at {GLOB_MAX_RESULTS} (default {GLOB_MAX_RESULTS})"
                    )),
                },
                "required": ["path"],
            }),
        ),
        "grep_search" => function(
            name,
            "Search for a pattern in files under a path. Returns matching lines with file paths \
             (and, unless searching a single file, paths relative to the given directory). \
             Automatically skips files ignored by .gitignore (when the directory is inside a git repo) \
             and common junk directories (.git, node_modules, build, dist, etc.) otherwise. \
             include/exclude: a pattern with no '/' matches the basename at any depth; a pattern \
             containing '/' matches the full relative path (auto-anchored with \"**/\" unless already anchored).",
            json!({
                "type": "object",
                "properties": {
                    "path": prop("string", "File or directory to search in"),
                    "pattern": prop("string", "Pattern to search for (regular expression unless literal is true)"),
                    "include": prop("string", "Glob pattern to filter files (default: **)"),
                    "exclude": prop("string", "Glob pattern to exclude files"),
                    "return_line_numbers": prop("boolean", "If true, include line numbers in results"),
                    "literal": prop("boolean", "Treat pattern as a literal string instead of a regular expression (default: false)"),
                    "ignore_case": prop("boolean", "Case-insensitive search (default: false)"),
                    "context_lines": prop("integer", "Number of lines of context to show before and after each match (default: 0)"),
                },
                "required": ["path", "pattern"],
            }),
        ),
        "exec_shell_command" => function(
            name,
            "Execute a shell command and return its output (stdout and stderr combined).",
            json!({
                "type": "object",
                "properties": {
                    "command": prop("string", "Shell command to execute"),
                    "timeout": prop("integer", &format!(
                        "Timeout in seconds (default {EXEC_DEFAULT_TIMEOUT}, max {EXEC_MAX_TIMEOUT})"
                    )),
                    "max_output_size": prop("integer", &format!(
                        "Maximum output size in bytes (default {EXEC_MAX_OUTPUT})"
                    )),
                },
                "required": ["command"],
            }),
        ),
        "write_file" => function(
            name,
            "Write content to a file, creating it (including parent directories) if it does not exist. \
             May use with edit_file for more complex edits.",
            json!({
                "type": "object",
                "properties": {
                    "path": prop("string", "Path of the file to write"),
                    "content": prop("string", "Content to write"),
                },
                "required": ["path", "content"],
            }),
        ),
        "edit_file" => function(
            name,
            "Edit a file using exact text replacement. Each edits[].old_text must be unique in the file \
             and is matched against the original content, not incrementally. Merge nearby changes into \
             one edit instead of overlapping edits. Use write_file to replace the whole file.",
            json!({
                "type": "object",
                "properties": {
                    "path": prop("string", "Path to the file to edit"),
                    "edits": {
                        "type": "array",
                        "description": "One or more exact text replacements to apply",
                        "items": {
                            "type": "object",
                            "properties": {
                                "old_text": prop("string", "Exact text to find; must be unique in the file and must not overlap with other edits"),
                                "new_text": prop("string", "Text to replace old_text with"),
                            },
                            "required": ["old_text", "new_text"],
                        },
                    },
                },
                "required": ["path", "edits"],
            }),
        ),
        "get_info" => function(
            name,
            "Returns runtime info: the OS name/version and the current working directory",
            json!({"type": "object", "properties": {}}),
        ),
        _ => return None,
    };
    Some(def)
}

/// llama's `permissions.write` for this tool.
pub fn writes(name: &str) -> bool {
    matches!(name, "exec_shell_command" | "write_file" | "edit_file")
}

/// llama's `uses_cwd` for this tool (all seven resolve paths or run against the cwd).
pub fn uses_cwd(name: &str) -> bool {
    NAMES.contains(&name)
}

/// llama's display name for this tool.
pub fn display_name(name: &str) -> &'static str {
    match name {
        "read_file" => "Read file",
        "file_glob_search" => "File search",
        "grep_search" => "Grep search",
        "exec_shell_command" => "Execute shell command",
        "write_file" => "Write file",
        "edit_file" => "Edit file",
        "get_info" => "Get Runtime Info",
        _ => "",
    }
}

/// Runs a tool (not streamed). Tool-level failures are `Ok({"error": MSG})` with llama's
/// messages. `base64` is the `x-resp-type: base64` header, which only read_file reads.
pub fn call(
    name: &str,
    params: &Map<String, Value>,
    place: &Place,
    base64: bool,
) -> Result<Value, BadRequest> {
    match name {
        "read_file" => read_file(params, place, base64),
        "file_glob_search" => file_glob_search(params, place),
        "grep_search" => grep_search(params, place),
        "exec_shell_command" => exec_shell_command(params, place),
        "write_file" => write_file(params, place),
        "edit_file" => edit_file(params, place),
        "get_info" => Ok(get_info(place)),
        _ => Err(BadRequest(format!("unknown tool \"{name}\""))),
    }
}

/// exec_shell_command streamed: each piece of output, then the `[exit code: N]` tail, goes
/// to `chunk`. `chunk` returning false means the client left: the process group is killed
/// and nothing more is sent. Returns `Ok({})` when done, or `Ok({"error": MSG})`.
pub fn exec_streamed(
    params: &Map<String, Value>,
    place: &Place,
    chunk: &mut dyn FnMut(&str) -> bool,
) -> Result<Value, BadRequest> {
    let req = ShellRequest::parse(params)?;
    if !cfg!(unix) {
        return Ok(tool_error(SHELL_UNSUPPORTED));
    }
    let mut pending = Utf8Carry::default();
    let run = run_shell(&req, place, &mut |bytes: &[u8]| {
        let text = pending.push(bytes);
        // Text held back (half a character) is sent with the next piece; until then the
        // client counts as still there.
        text.is_empty() || chunk(&text)
    });
    if run.client_left {
        return Ok(json!({}));
    }
    let rest = pending.finish();
    if !rest.is_empty() && !chunk(&rest) {
        return Ok(json!({}));
    }
    // llama sends only the exit tail here: the truncation note is for the whole-text reply.
    chunk(&run.exit_tail());
    Ok(json!({}))
}

fn function(name: &str, description: &str, parameters: Value) -> Value {
    json!({
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    })
}

fn prop(kind: &str, description: &str) -> Value {
    json!({"type": kind, "description": description})
}

fn tool_error(message: impl Into<String>) -> Value {
    json!({"error": message.into()})
}

// ---------------------------------------------------------------------------------------
// Parameters, read as llama-server's JSON layer reads them
// ---------------------------------------------------------------------------------------

/// The JSON type names llama's errors use.
fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn missing_key(key: &str) -> BadRequest {
    BadRequest(format!(
        "[json.exception.out_of_range.403] key '{key}' not found"
    ))
}

/// A required string: missing or of another type refuses the request, with the message
/// llama's JSON library gives.
fn required_str<'a>(params: &'a Map<String, Value>, key: &str) -> Result<&'a str, BadRequest> {
    match params.get(key) {
        None => Err(missing_key(key)),
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(BadRequest(format!(
            "[json.exception.type_error.302] type must be string, but is {}",
            type_name(other)
        ))),
    }
}

/// A required string inside an array element (edit_file's edits).
fn element_str<'a>(item: &'a Value, key: &str) -> Result<&'a str, BadRequest> {
    match item {
        Value::Object(map) => required_str(map, key),
        other => Err(BadRequest(format!(
            "[json.exception.type_error.304] cannot use at() with {}",
            type_name(other)
        ))),
    }
}

// Optional parameters fall back to their default when absent, null or of the wrong
// type (llama logs a warning and goes on).

fn warn_type(key: &str, value: &Value) {
    log::warn!(
        "wrong type supplied for tool parameter '{key}' ({}), using its default",
        type_name(value)
    );
}

fn opt_str<'a>(params: &'a Map<String, Value>, key: &str, default: &'a str) -> &'a str {
    match params.get(key) {
        None | Some(Value::Null) => default,
        Some(Value::String(s)) => s,
        Some(other) => {
            warn_type(key, other);
            default
        }
    }
}

/// An integer; a fractional number is cut toward zero and a boolean reads as 0/1, as in
/// llama's JSON library.
fn opt_int(params: &Map<String, Value>, key: &str, default: i64) -> i64 {
    match params.get(key) {
        None | Some(Value::Null) => default,
        Some(Value::Number(n)) => n
            .as_i64()
            .or_else(|| n.as_u64().map(|_| i64::MAX))
            .or_else(|| n.as_f64().map(|f| f as i64))
            .unwrap_or(default),
        Some(Value::Bool(b)) => i64::from(*b),
        Some(other) => {
            warn_type(key, other);
            default
        }
    }
}

fn opt_bool(params: &Map<String, Value>, key: &str, default: bool) -> bool {
    match params.get(key) {
        None | Some(Value::Null) => default,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            warn_type(key, other);
            default
        }
    }
}

// ---------------------------------------------------------------------------------------
// Paths: resolution and the tools root
// ---------------------------------------------------------------------------------------

/// The absolute path a tool works on: `~` expanded, made absolute against the call's
/// cwd and normalised lexically (`.` and `..` removed before any symlink is looked at, so
/// the checked path is the path used).
fn resolve(place: &Place, raw: &str) -> PathBuf {
    resolve_with_home(&place.cwd, raw, std::env::var_os("HOME"))
}

fn resolve_with_home(cwd: &Path, raw: &str, home: Option<OsString>) -> PathBuf {
    let expanded = expand_home(raw, home);
    let path = Path::new(&expanded);
    if path.is_absolute() {
        normalize(path)
    } else {
        normalize(&cwd.join(path))
    }
}

/// `~` and `~/...` become the home directory; `~user` is left alone.
fn expand_home(raw: &str, home: Option<OsString>) -> OsString {
    let Some(rest) = raw.strip_prefix('~') else {
        return raw.into();
    };
    if !(rest.is_empty() || rest.starts_with('/') || rest.starts_with('\\')) {
        return raw.into();
    }
    match home {
        Some(mut home) if !home.is_empty() => {
            home.push(rest);
            home
        }
        _ => raw.into(),
    }
}

fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::Prefix(_) | Component::RootDir => out.push(part.as_os_str()),
            Component::CurDir => {}
            Component::ParentDir => match out.components().next_back() {
                Some(Component::Normal(_)) => {
                    out.pop();
                }
                // `..` at the root stays at the root.
                Some(Component::RootDir | Component::Prefix(_)) => {}
                _ => out.push(".."),
            },
            Component::Normal(name) => out.push(name),
        }
    }
    out
}

fn display(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// Where `path` really leads: its longest existing part with symlinks resolved, then the
/// part that does not exist yet. None where an existing part cannot be resolved (a
/// dangling or looping link): following it could land anywhere.
fn real_path(path: &Path) -> Option<PathBuf> {
    let mut existing = path;
    let mut missing: Vec<&OsStr> = Vec::new();
    loop {
        if fs::symlink_metadata(existing).is_ok() {
            let mut real = fs::canonicalize(existing).ok()?;
            real.extend(missing.iter().rev().copied());
            return Some(real);
        }
        missing.push(existing.file_name()?);
        existing = existing.parent()?;
    }
}

/// The tools-root check for a path a tool is about to touch (`raw` as the model gave it).
fn confine(place: &Place, raw: &str, full: &Path) -> Result<(), String> {
    let Some(root) = place.root.as_deref() else {
        return Ok(());
    };
    match real_path(full) {
        Some(real) if real.starts_with(root) => Ok(()),
        _ => Err(format!(
            "path is outside the tools root ({}): {raw}",
            root.display()
        )),
    }
}

/// The tools-root check for a path a tool is about to write: inside the root, and not
/// in a `.git` directory (whose config and hooks make git, run there later by anyone,
/// run commands).
fn confine_write(place: &Place, raw: &str, full: &Path) -> Result<(), String> {
    confine(place, raw, full)?;
    let in_git = full.components().any(|c| c.as_os_str() == ".git");
    match &place.root {
        Some(root) if in_git => Err(format!(
            "writing inside a .git directory is refused under the tools root ({}): {raw}",
            root.display()
        )),
        _ => Ok(()),
    }
}

/// Whether a file found by a listing stays inside the tools root once its links are
/// followed (git can list a symlink whose target is elsewhere).
fn within_root(place: &Place, path: &Path) -> bool {
    match place.root.as_deref() {
        None => true,
        Some(root) => real_path(path).is_some_and(|real| real.starts_with(root)),
    }
}

#[cfg(unix)]
fn path_from_bytes(bytes: &[u8]) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    PathBuf::from(OsStr::from_bytes(bytes))
}

#[cfg(not(unix))]
fn path_from_bytes(bytes: &[u8]) -> PathBuf {
    PathBuf::from(String::from_utf8_lossy(bytes).into_owned())
}

/// Creates the parent directories, then writes (llama's write_file and edit_file both
/// do this).
fn write_with_parents(path: &Path, content: &[u8]) -> bool {
    if let Some(parent) = path.parent() {
        if fs::create_dir_all(parent).is_err() {
            return false;
        }
    }
    fs::write(path, content).is_ok()
}

// ---------------------------------------------------------------------------------------
// Globs (llama's `glob_match` and the path anchoring rule of its tools)
// ---------------------------------------------------------------------------------------

/// The longest include or exclude pattern: the matcher recurses about once per pattern
/// byte, and keeps a table of pattern by path length.
const GLOB_MAX_PATTERN: usize = 1024;

/// A tool error for an include or exclude pattern too long to match.
fn pattern_too_long(include: &str, exclude: &str) -> Option<Value> {
    [("include", include), ("exclude", exclude)]
        .into_iter()
        .find(|(_, p)| p.len() > GLOB_MAX_PATTERN)
        .map(|(key, p)| {
            tool_error(format!(
                "{key} pattern too long ({} bytes, max {GLOB_MAX_PATTERN})",
                p.len()
            ))
        })
}

/// `*` matches within one path segment, `**` across segments, `?` one character other
/// than `/`, `[...]` a class (`!` negates, `a-z` ranges, a leading `]` or `-` is literal;
/// an unclosed `[` is a literal `[`). Bytes are compared, not characters.
fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, s) = (pattern.as_bytes(), text.as_bytes());
    let mut glob = Glob {
        p,
        s,
        failed: vec![false; (p.len() + 1) * (s.len() + 1)],
    };
    glob.matches(0, 0)
}

/// The matcher is a backtracking recursion; states already known to fail are remembered
/// so that patterns with many stars stay polynomial.
struct Glob<'a> {
    p: &'a [u8],
    s: &'a [u8],
    failed: Vec<bool>,
}

impl Glob<'_> {
    fn matches(&mut self, pi: usize, si: usize) -> bool {
        let key = pi * (self.s.len() + 1) + si;
        if self.failed[key] {
            return false;
        }
        let ok = self.step(pi, si);
        if !ok {
            self.failed[key] = true;
        }
        ok
    }

    fn step(&mut self, pi: usize, si: usize) -> bool {
        let (p, s) = (self.p, self.s);
        let Some(&pc) = p.get(pi) else {
            return si == s.len();
        };
        let sc = s.get(si).copied();
        match pc {
            b'*' if p.get(pi + 1) == Some(&b'*') => {
                self.matches(pi + 2, si) || (sc.is_some() && self.matches(pi, si + 1))
            }
            b'*' => {
                let mut i = si;
                while i < s.len() && s[i] != b'/' {
                    if self.matches(pi + 1, i) {
                        return true;
                    }
                    i += 1;
                }
                self.matches(pi + 1, i)
            }
            b'?' if sc.is_some_and(|c| c != b'/') => self.matches(pi + 1, si + 1),
            b'[' => {
                let mut end = pi + 1;
                if matches!(p.get(end), Some(b']' | b'-')) {
                    end += 1;
                }
                while end < p.len() && p[end] != b']' {
                    end += 1;
                }
                match sc {
                    // A closed class.
                    Some(c) if end < p.len() => {
                        class_match(c, p, pi + 1, end) && self.matches(end + 1, si + 1)
                    }
                    // An unclosed one is a literal '['.
                    Some(b'[') => self.matches(pi + 1, si + 1),
                    _ => false,
                }
            }
            c => sc == Some(c) && self.matches(pi + 1, si + 1),
        }
    }
}

/// Whether `c` is in the class `p[start..end]` (`p[end]` is its closing `]`).
fn class_match(c: u8, p: &[u8], start: usize, end: usize) -> bool {
    // Reading at `end` yields the closing ']', as the original reads its terminator.
    let at = |i: usize| p.get(i).copied().unwrap_or(0);
    let mut i = start;
    let negated = at(i) == b'!';
    if negated {
        i += 1;
    }
    if matches!(at(i), b']' | b'-') {
        if i < end && at(i) == c {
            return !negated;
        }
        i += 1;
    }
    let mut found = false;
    while i < end {
        if i + 2 < end && at(i + 1) == b'-' && at(i + 2) != b']' {
            if (at(i)..=at(i + 2)).contains(&c) {
                found = true;
                break;
            }
            i += 3;
        } else {
            if at(i) == c {
                found = true;
                break;
            }
            i += 1;
        }
    }
    found != negated
}

/// A pattern without `/` matches the entry's basename at any depth; one with `/` matches
/// the whole relative path and gets `**/` in front unless it starts with `**` or `/`. So
/// `src/*.cpp` needs some parent before `src` (llama's rule, kept as is), and a leading
/// `/` never matches (relative paths have none).
fn path_glob_match(pattern: &str, rel: &str) -> bool {
    if !pattern.contains('/') {
        let base = rel.rsplit('/').next().unwrap_or(rel);
        return glob_match(pattern, base);
    }
    if pattern.starts_with("**") || pattern.starts_with('/') {
        glob_match(pattern, rel)
    } else {
        glob_match(&format!("**/{pattern}"), rel)
    }
}

// ---------------------------------------------------------------------------------------
// Directory listing (shared by file_glob_search and grep_search)
// ---------------------------------------------------------------------------------------

/// One listing's time budget, shared by git and the walk.
const LIST_BUDGET: Duration = Duration::from_secs(15);
/// How much of `git ls-files` is read.
const GIT_MAX_OUTPUT: usize = 8 * 1024 * 1024;

/// Directories that are listed but never walked into: they can be enormous.
const JUNK_DIRS: [&str; 13] = [
    ".git",
    ".svn",
    ".hg",
    "node_modules",
    "__pycache__",
    ".venv",
    "venv",
    "dist",
    "build",
    "target",
    ".cache",
    ".idea",
    ".vscode",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Files,
    Dirs,
    All,
}

impl Kind {
    fn parse(name: &str) -> Option<Self> {
        match name {
            "file" => Some(Kind::Files),
            "dir" => Some(Kind::Dirs),
            "all" => Some(Kind::All),
            _ => None,
        }
    }

    fn files(self) -> bool {
        matches!(self, Kind::Files | Kind::All)
    }

    fn dirs(self) -> bool {
        matches!(self, Kind::Dirs | Kind::All)
    }
}

struct Entry {
    /// `/`-separated, relative to the listing's base.
    rel: String,
    path: PathBuf,
    is_dir: bool,
}

struct Listing {
    entries: Vec<Entry>,
    /// The walk ran out of time or met a directory it could not read.
    truncated: bool,
}

/// Entries under `base` (`max_depth` 0: any depth; 1: direct children only). None when
/// `base` is not a directory. Files alone come from `git ls-files` when git accepts the
/// directory (so .gitignore applies); otherwise, and for directories, a walk that never
/// follows a link and never enters a junk directory.
/// `git` is asked first (files only) unless the tools are confined: a repository's own
/// config can make git run commands, and a confined tool may have written that config.
fn list_entries(base: &Path, max_depth: usize, kind: Kind, place: &Place) -> Option<Listing> {
    if !base.is_dir() {
        return None;
    }
    let deadline = Instant::now() + LIST_BUDGET;
    if kind == Kind::Files && place.root.is_none() {
        if let Some(entries) = git_files(base, max_depth) {
            return Some(Listing {
                entries,
                truncated: false,
            });
        }
    }
    let mut truncated = false;
    let entries = walk(base, max_depth, kind, deadline, &mut truncated);
    Some(Listing { entries, truncated })
}

/// Tracked and untracked-but-not-ignored files, or None where git fails (not a
/// repository, no git, too slow).
fn git_files(base: &Path, max_depth: usize) -> Option<Vec<Entry>> {
    let args = [
        // Never the repository's file-system monitor command.
        OsStr::new("-c"),
        OsStr::new("core.fsmonitor=false"),
        OsStr::new("-C"),
        base.as_os_str(),
        OsStr::new("ls-files"),
        OsStr::new("--cached"),
        OsStr::new("--others"),
        OsStr::new("--exclude-standard"),
        // NUL-separated: names git would otherwise quote come through as they are.
        OsStr::new("-z"),
    ];
    let run = run_command(
        OsStr::new("git"),
        &args,
        None,
        false,
        GIT_MAX_OUTPUT,
        LIST_BUDGET,
        &mut |_| true,
    );
    if run.exit_code != 0 || run.timed_out {
        log::debug!(
            "git ls-files gave exit code {} in {}: walking the directory instead",
            run.exit_code,
            base.display()
        );
        return None;
    }
    let entries = run
        .output
        .split(|&b| b == 0)
        .filter(|line| !line.is_empty())
        .filter(|line| {
            // An entry's depth is its number of '/' plus one.
            max_depth == 0 || line.iter().filter(|&&b| b == b'/').count() < max_depth
        })
        .filter_map(|line| {
            let path = base.join(path_from_bytes(line));
            path.is_file().then(|| Entry {
                rel: String::from_utf8_lossy(line).into_owned(),
                path,
                is_dir: false,
            })
        })
        .collect();
    Some(entries)
}

/// Depth-first walk. Each directory's entries are listed in name order before any of its
/// subdirectories is entered (llama lists in whatever order the OS gives).
fn walk(
    base: &Path,
    max_depth: usize,
    kind: Kind,
    deadline: Instant,
    truncated: &mut bool,
) -> Vec<Entry> {
    let mut found = Vec::new();
    let mut stack: Vec<(PathBuf, String, usize)> = vec![(base.to_path_buf(), String::new(), 0)];
    while let Some((dir, rel_dir, depth)) = stack.pop() {
        if Instant::now() >= deadline {
            *truncated = true;
            break;
        }
        let reader = match fs::read_dir(&dir) {
            Ok(reader) => reader,
            // An unreadable directory is skipped quietly, as llama's walk does.
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => continue,
            Err(_) => {
                *truncated = true;
                continue;
            }
        };
        let mut children = Vec::new();
        for item in reader {
            match item {
                Ok(entry) => children.push((entry.file_name(), entry)),
                Err(_) => {
                    *truncated = true;
                    break;
                }
            }
        }
        children.sort_by(|a, b| a.0.cmp(&b.0));

        let mut subdirs = Vec::new();
        for (name, entry) in children {
            if Instant::now() >= deadline {
                *truncated = true;
                return found;
            }
            let Some((is_dir, is_file, is_link)) = classify(&entry) else {
                continue;
            };
            let name = name.to_string_lossy();
            let rel = if rel_dir.is_empty() {
                (*name).to_owned()
            } else {
                format!("{rel_dir}/{name}")
            };
            if is_dir {
                let descend = !JUNK_DIRS.contains(&&*name)
                    && !is_link
                    && (max_depth == 0 || depth + 1 < max_depth);
                if descend {
                    subdirs.push((entry.path(), rel.clone(), depth + 1));
                }
                if kind.dirs() {
                    found.push(Entry {
                        rel,
                        path: entry.path(),
                        is_dir: true,
                    });
                }
            } else if is_file && kind.files() {
                found.push(Entry {
                    rel,
                    path: entry.path(),
                    is_dir: false,
                });
            }
        }
        // Reversed, so that they are popped in name order.
        stack.extend(subdirs.into_iter().rev());
    }
    found
}

/// (is a directory, is a regular file, is a link). A link is classified by what it
/// points at (so it can be listed) but is never walked: it could loop or lead anywhere.
/// None for entries that cannot be examined, dangling links among them.
fn classify(entry: &fs::DirEntry) -> Option<(bool, bool, bool)> {
    let kind = entry.file_type().ok()?;
    if kind.is_symlink() {
        let meta = fs::metadata(entry.path()).ok()?;
        Some((meta.is_dir(), meta.is_file(), true))
    } else {
        Some((kind.is_dir(), kind.is_file(), false))
    }
}

// ---------------------------------------------------------------------------------------
// Child processes
// ---------------------------------------------------------------------------------------

/// What running a command gave.
struct RunOutcome {
    /// At most the output cap; the rest was read and dropped.
    output: Vec<u8>,
    truncated: bool,
    /// The exit status; 1 for a process ended by a signal, -1 where it never ran or
    /// could not be waited for (llama's numbers).
    exit_code: i32,
    timed_out: bool,
    /// The output callback asked to stop.
    client_left: bool,
}

impl RunOutcome {
    fn spawn_failed() -> Self {
        RunOutcome {
            output: b"failed to spawn process".to_vec(),
            truncated: false,
            exit_code: -1,
            timed_out: false,
            client_left: false,
        }
    }

    /// The output as llama's tools report it, with the truncation note.
    fn text(&self) -> String {
        let mut text = String::from_utf8_lossy(&self.output).into_owned();
        if self.truncated {
            text.push_str("\n[output truncated]");
        }
        text
    }

    fn exit_tail(&self) -> String {
        let mut tail = format!("\n[exit code: {}]", self.exit_code);
        if self.timed_out {
            tail.push_str(" [exit due to timed out]");
        }
        tail
    }
}

/// After a timeout kill, how long to wait for the output to close: a process that left
/// the group can hold it open forever.
#[cfg(unix)]
const KILL_GRACE: Duration = Duration::from_secs(2);

/// Runs `program args` in its own process group, stdin empty, stdout (with stderr when
/// `merge_stderr`) read as it comes. Each piece that fits under `max_output` goes to
/// `on_chunk` (and the piece that crosses it, cut, though its answer is not heeded);
/// the output keeps being drained past the cap so the child never blocks. At the
/// deadline, or when `on_chunk` answers false, the whole group is killed.
#[cfg(unix)]
fn run_command(
    program: &OsStr,
    args: &[&OsStr],
    cwd: Option<&Path>,
    merge_stderr: bool,
    max_output: usize,
    timeout: Duration,
    on_chunk: &mut dyn FnMut(&[u8]) -> bool,
) -> RunOutcome {
    use std::io::Read;
    use std::os::fd::{AsFd, AsRawFd};
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};

    let deadline = Instant::now() + timeout;
    let Ok((mut reader, writer)) = io::pipe() else {
        return RunOutcome::spawn_failed();
    };
    let stderr = if merge_stderr {
        match writer.try_clone() {
            Ok(copy) => Stdio::from(copy),
            Err(_) => return RunOutcome::spawn_failed(),
        }
    } else {
        Stdio::null()
    };
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(writer))
        .stderr(stderr)
        .process_group(0);
    if let Some(dir) = cwd {
        command.current_dir(dir);
    }
    let spawned = command.spawn();
    // The command still holds the pipe's write ends: without dropping them the output
    // would never reach its end.
    drop(command);
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            log::debug!("cannot run {}: {e}", program.to_string_lossy());
            return RunOutcome::spawn_failed();
        }
    };

    let fd = reader.as_fd().as_raw_fd();
    let mut output = Vec::new();
    let mut truncated = false;
    let mut timed_out = false;
    let mut client_left = false;
    let mut killed_at: Option<Instant> = None;
    let mut buf = [0u8; 4096];
    loop {
        let now = Instant::now();
        match killed_at {
            None if now >= deadline => {
                timed_out = true;
                kill_group(&mut child);
                killed_at = Some(now);
            }
            Some(at) if now >= at + KILL_GRACE => break,
            _ => {}
        }
        let wait = match killed_at {
            Some(_) => Duration::from_millis(100),
            None => deadline
                .saturating_duration_since(now)
                .min(Duration::from_millis(100)),
        };
        let wait_ms = libc::c_int::try_from(wait.as_millis())
            .unwrap_or(100)
            .max(1);
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `pfd` is one valid pollfd for the call's duration and `fd` stays open
        // (owned by `reader`) until after the loop.
        let ready = unsafe { libc::poll(&mut pfd, 1, wait_ms) };
        if ready < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        if ready == 0 {
            continue;
        }
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        if truncated {
            continue;
        }
        if output.len() + n <= max_output {
            output.extend_from_slice(&buf[..n]);
            if !on_chunk(&buf[..n]) {
                client_left = true;
                kill_group(&mut child);
                killed_at = Some(Instant::now());
                break;
            }
        } else {
            let room = max_output - output.len();
            output.extend_from_slice(&buf[..room]);
            if room > 0 {
                on_chunk(&buf[..room]);
            }
            truncated = true;
        }
    }
    drop(reader);

    // The output has ended; the process may still be running (it closed its output, or
    // its group was just killed). The deadline still holds while waiting.
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if killed_at.is_some() => break child.wait().ok(),
            Ok(None) => {
                if Instant::now() >= deadline {
                    timed_out = true;
                    kill_group(&mut child);
                    killed_at = Some(Instant::now());
                } else {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            Err(_) => break None,
        }
    };
    let exit_code = match status {
        Some(status) => status.code().unwrap_or(1),
        None => -1,
    };
    RunOutcome {
        output,
        truncated,
        exit_code,
        timed_out,
        client_left,
    }
}

/// SIGKILL to the child's process group (it leads one: `process_group(0)`), so what it
/// started in the background goes too.
#[cfg(unix)]
fn kill_group(child: &mut std::process::Child) {
    match libc::pid_t::try_from(child.id()) {
        Ok(pid) => {
            // SAFETY: kill(2) with a negative pid signals that process group only; the
            // child is not reaped yet, so its id still names its own group.
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
            }
        }
        Err(_) => {
            let _ = child.kill();
        }
    }
}

#[cfg(not(unix))]
fn run_command(
    _program: &OsStr,
    _args: &[&OsStr],
    _cwd: Option<&Path>,
    _merge_stderr: bool,
    _max_output: usize,
    _timeout: Duration,
    _on_chunk: &mut dyn FnMut(&[u8]) -> bool,
) -> RunOutcome {
    RunOutcome::spawn_failed()
}

/// Streamed output split at any byte: a character cut in two is held back until its
/// end arrives, so each piece is whole UTF-8.
#[derive(Default)]
struct Utf8Carry {
    pending: Vec<u8>,
}

impl Utf8Carry {
    fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let keep = incomplete_tail(&self.pending);
        let ready = self.pending.len() - keep;
        let held = self.pending.split_off(ready);
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending = held;
        text
    }

    fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

/// The length of a UTF-8 sequence begun at the end of `bytes` but not finished.
fn incomplete_tail(bytes: &[u8]) -> usize {
    for back in 1..=bytes.len().min(3) {
        let b = bytes[bytes.len() - back];
        if b & 0xC0 == 0x80 {
            continue;
        }
        let needed = match b {
            0xF0..=0xFF => 4,
            0xE0..=0xEF => 3,
            0xC0..=0xDF => 2,
            _ => 1,
        };
        return if needed > back { back } else { 0 };
    }
    0
}

// ---------------------------------------------------------------------------------------
// read_file
// ---------------------------------------------------------------------------------------

const READ_MAX: usize = 16 * 1024;
const READ_MAX_BASE64: u64 = 32 * 1024 * 1024;

fn read_file(
    params: &Map<String, Value>,
    place: &Place,
    as_base64: bool,
) -> Result<Value, BadRequest> {
    let path = required_str(params, "path")?;
    let start_line = opt_int(params, "start_line", 1);
    // -1: to the end of the file.
    let end_line = opt_int(params, "end_line", -1);
    let append_loc = opt_bool(params, "append_loc", false);

    let full = resolve(place, path);
    if let Err(msg) = confine(place, path, &full) {
        return Ok(tool_error(msg));
    }
    // Only regular files have a size (a directory or a FIFO is refused here).
    let size = match fs::metadata(&full) {
        Ok(meta) if meta.is_file() => meta.len(),
        _ => return Ok(tool_error(format!("cannot stat file: {path}"))),
    };

    if as_base64 {
        if size > READ_MAX_BASE64 {
            return Ok(tool_error(format!(
                "file too large ({size} bytes, max {READ_MAX_BASE64})"
            )));
        }
        let Ok(content) = fs::read(&full) else {
            return Ok(tool_error(format!("failed to open file: {path}")));
        };
        use base64::Engine as _;
        return Ok(json!({
            "base64": base64::engine::general_purpose::STANDARD.encode(&content),
            "size_bytes": content.len(),
        }));
    }

    if size > READ_MAX as u64 && end_line == -1 {
        return Ok(tool_error(format!(
            "file too large ({size} bytes, max {READ_MAX}). Use start_line/end_line to read a portion."
        )));
    }
    let Ok(file) = fs::File::open(&full) else {
        return Ok(tool_error(format!("failed to open file: {path}")));
    };

    // Read line by line: with an end_line the file can be far larger than what is kept.
    let mut reader = BufReader::new(file);
    let mut out: Vec<u8> = Vec::new();
    let mut line = Vec::new();
    let mut lineno: i64 = 0;
    loop {
        line.clear();
        if lineno + 1 < start_line {
            // Not kept: skipped without holding it, however long.
            match reader.skip_until(b'\n') {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            lineno += 1;
            continue;
        }
        // One more byte than fits: a longer line ends the reply as truncated.
        match std::io::Read::take(&mut reader, READ_MAX as u64 + 1).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if line.last() == Some(&b'\n') {
            line.pop();
        }
        lineno += 1;
        if end_line != -1 && lineno > end_line {
            break;
        }
        let prefix = if append_loc {
            format!("{lineno}\u{2192}")
        } else {
            String::new()
        };
        if out.len() + prefix.len() + line.len() + 1 > READ_MAX {
            out.extend_from_slice(b"[output truncated]");
            break;
        }
        out.extend_from_slice(prefix.as_bytes());
        out.extend_from_slice(&line);
        out.push(b'\n');
    }
    Ok(json!({"plain_text_response": String::from_utf8_lossy(&out)}))
}

// ---------------------------------------------------------------------------------------
// file_glob_search
// ---------------------------------------------------------------------------------------

const GLOB_MAX_RESULTS: i64 = 100;

fn file_glob_search(params: &Map<String, Value>, place: &Place) -> Result<Value, BadRequest> {
    let path = required_str(params, "path")?;
    let base = resolve(place, path);
    let include = opt_str(params, "include", "**");
    let exclude = opt_str(params, "exclude", "");
    let entry_type = opt_str(params, "type", "file");
    if let Some(e) = pattern_too_long(include, exclude) {
        return Ok(e);
    }
    let max_depth = usize::try_from(opt_int(params, "max_depth", 0)).unwrap_or(0);
    let limit = opt_int(params, "limit", GLOB_MAX_RESULTS);
    if limit < 1 {
        return Ok(tool_error(format!(
            "invalid limit: {limit} (expected 1 or more)"
        )));
    }
    let limit = usize::try_from(limit.min(GLOB_MAX_RESULTS)).unwrap_or(1);
    let Some(kind) = Kind::parse(entry_type) else {
        return Ok(tool_error(format!(
            "invalid type: {entry_type} (expected \"file\", \"dir\" or \"all\")"
        )));
    };
    if let Err(msg) = confine(place, path, &base) {
        return Ok(tool_error(msg));
    }
    let Some(listing) = list_entries(&base, max_depth, kind, place) else {
        return Ok(tool_error(format!(
            "path does not exist or is not a directory: {path}"
        )));
    };

    let matches: Vec<&Entry> = listing
        .entries
        .iter()
        .filter(|e| path_glob_match(include, &e.rel))
        .filter(|e| exclude.is_empty() || !path_glob_match(exclude, &e.rel))
        .filter(|e| within_root(place, &e.path))
        .collect();
    let total = matches.len();
    let shown = total.min(limit);

    let mut text = String::new();
    let mut entries = Vec::with_capacity(shown);
    for entry in &matches[..shown] {
        text.push_str(&entry.rel);
        if entry.is_dir {
            text.push('/');
        }
        text.push('\n');
        entries.push(json!({
            "path": entry.rel,
            "type": if entry.is_dir { "dir" } else { "file" },
        }));
    }
    let _ = write!(text, "\n---\nTotal matches: {total}\n");
    if total > shown {
        let _ = writeln!(
            text,
            "[{shown} results limit reached ({total} total matches). Refine the glob pattern to narrow the search.]"
        );
    }
    if listing.truncated {
        text.push_str("[results truncated: time budget or unreadable directory]\n");
    }
    // `base` is absolute so that a client (the web UI's picker) can join the entries to it.
    Ok(json!({
        "plain_text_response": text,
        "entries": entries,
        "base": display(&base),
    }))
}

// ---------------------------------------------------------------------------------------
// grep_search
// ---------------------------------------------------------------------------------------

const GREP_MAX_MATCHES: usize = 100;
/// The most context lines around a match.
const GREP_MAX_CONTEXT: usize = 100;
/// Larger files are not searched (model weights, disk images: read whole, they would
/// take the server's memory).
const GREP_MAX_FILE: u64 = 32 << 20;

/// The characters a literal pattern has escaped (ECMAScript's syntax characters).
const REGEX_SPECIALS: &str = "\\^$.|?*+()[]{}";

fn grep_search(params: &Map<String, Value>, place: &Place) -> Result<Value, BadRequest> {
    let path = required_str(params, "path")?;
    let pattern = required_str(params, "pattern")?;
    let include = opt_str(params, "include", "**");
    let exclude = opt_str(params, "exclude", "");
    let show_lineno = opt_bool(params, "return_line_numbers", false);
    let literal = opt_bool(params, "literal", false);
    let ignore_case = opt_bool(params, "ignore_case", false);
    // Bounded so that 100 matches cannot ask for the whole file 100 times over.
    let context = usize::try_from(opt_int(params, "context_lines", 0))
        .unwrap_or(0)
        .min(GREP_MAX_CONTEXT);
    if let Some(e) = pattern_too_long(include, exclude) {
        return Ok(e);
    }

    let source: Cow<str> = if literal {
        let mut escaped = String::with_capacity(pattern.len() * 2);
        for c in pattern.chars() {
            if REGEX_SPECIALS.contains(c) {
                escaped.push('\\');
            }
            escaped.push(c);
        }
        Cow::Owned(escaped)
    } else {
        Cow::Borrowed(pattern)
    };
    let regex = match fancy_regex::RegexBuilder::new(&source)
        .case_insensitive(ignore_case)
        .build()
    {
        Ok(regex) => regex,
        Err(e) => return Ok(tool_error(format!("invalid regex: {e}"))),
    };

    let full = resolve(place, path);
    if let Err(msg) = confine(place, path, &full) {
        return Ok(tool_error(msg));
    }
    // (file to read, name shown): a single file shows the path as given.
    let files: Vec<(PathBuf, String)> = if full.is_file() {
        vec![(full, path.to_owned())]
    } else if full.is_dir() {
        let Some(listing) = list_entries(&full, 0, Kind::Files, place) else {
            return Ok(tool_error(format!(
                "path does not exist or is not a directory: {path}"
            )));
        };
        listing
            .entries
            .into_iter()
            .filter(|e| path_glob_match(include, &e.rel))
            .filter(|e| exclude.is_empty() || !path_glob_match(exclude, &e.rel))
            .filter(|e| within_root(place, &e.path))
            .map(|e| (e.path, e.rel))
            .collect()
    } else {
        return Ok(tool_error(format!("path does not exist: {path}")));
    };

    let numbered = show_lineno || context > 0;
    let mut text = String::new();
    let mut total = 0usize;
    let mut limit_reached = false;
    'files: for (file, shown) in &files {
        if fs::metadata(file).map_or(true, |m| m.len() > GREP_MAX_FILE) {
            log::debug!(
                "grep_search: {} skipped (unreadable or over {GREP_MAX_FILE} bytes)",
                file.display()
            );
            continue;
        }
        let Ok(content) = fs::read(file) else {
            continue;
        };
        let lines: Vec<Cow<str>> = split_lines(&content)
            .into_iter()
            .map(String::from_utf8_lossy)
            .collect();
        for (i, line) in lines.iter().enumerate() {
            // As llama does: the cap is noticed at the next line looked at.
            if total >= GREP_MAX_MATCHES {
                limit_reached = true;
                break 'files;
            }
            // A match that exceeds the backtracking limit counts as no match.
            if !regex.is_match(&**line).unwrap_or(false) {
                continue;
            }
            let first = i.saturating_sub(context);
            let last = i.saturating_add(context).min(lines.len() - 1);
            for (j, ctx_line) in lines.iter().enumerate().take(last + 1).skip(first) {
                let sep = if j == i { ':' } else { '-' };
                text.push_str(shown);
                text.push(sep);
                if numbered {
                    let _ = write!(text, "{}{sep}", j + 1);
                }
                text.push_str(ctx_line);
                text.push('\n');
            }
            if context > 0 {
                text.push_str("--\n");
            }
            total += 1;
        }
    }

    let _ = write!(text, "\n---\nTotal matches: {total}\n");
    if limit_reached {
        let _ = writeln!(
            text,
            "[{GREP_MAX_MATCHES} matches limit reached. Narrow the path/pattern/include to see more.]"
        );
    }
    Ok(json!({"plain_text_response": text}))
}

/// Lines as `std::getline` yields them: split at `\n`, no empty line after a final `\n`.
fn split_lines(content: &[u8]) -> Vec<&[u8]> {
    let mut lines: Vec<&[u8]> = content.split(|&b| b == b'\n').collect();
    if lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    lines
}

// ---------------------------------------------------------------------------------------
// exec_shell_command
// ---------------------------------------------------------------------------------------

const EXEC_DEFAULT_TIMEOUT: i64 = 10;
const EXEC_MAX_TIMEOUT: i64 = 60;
const EXEC_MAX_OUTPUT: usize = 16 * 1024;
const SHELL_UNSUPPORTED: &str = "exec_shell_command is only supported on unix hosts";

struct ShellRequest<'a> {
    command: &'a str,
    timeout: Duration,
    max_output: usize,
}

impl<'a> ShellRequest<'a> {
    fn parse(params: &'a Map<String, Value>) -> Result<Self, BadRequest> {
        let command = required_str(params, "command")?;
        let timeout = opt_int(params, "timeout", EXEC_DEFAULT_TIMEOUT).min(EXEC_MAX_TIMEOUT);
        // A negative size wraps to huge in llama, so it ends at the cap too.
        let max_output =
            usize::try_from(opt_int(params, "max_output_size", EXEC_MAX_OUTPUT as i64))
                .map_or(EXEC_MAX_OUTPUT, |n| n.min(EXEC_MAX_OUTPUT));
        Ok(ShellRequest {
            command,
            // Zero or less: the deadline has already passed.
            timeout: Duration::from_secs(timeout.max(0).unsigned_abs()),
            max_output,
        })
    }
}

/// `sh -c COMMAND` in the call's cwd, stderr merged into stdout.
fn run_shell(
    req: &ShellRequest,
    place: &Place,
    on_chunk: &mut dyn FnMut(&[u8]) -> bool,
) -> RunOutcome {
    run_command(
        OsStr::new("sh"),
        &[OsStr::new("-c"), OsStr::new(req.command)],
        Some(&place.cwd),
        true,
        req.max_output,
        req.timeout,
        on_chunk,
    )
}

fn exec_shell_command(params: &Map<String, Value>, place: &Place) -> Result<Value, BadRequest> {
    let req = ShellRequest::parse(params)?;
    if !cfg!(unix) {
        return Ok(tool_error(SHELL_UNSUPPORTED));
    }
    let run = run_shell(&req, place, &mut |_| true);
    let mut text = run.text();
    text.push_str(&run.exit_tail());
    Ok(json!({"plain_text_response": text}))
}

// ---------------------------------------------------------------------------------------
// write_file
// ---------------------------------------------------------------------------------------

fn write_file(params: &Map<String, Value>, place: &Place) -> Result<Value, BadRequest> {
    let path = required_str(params, "path")?;
    let content = required_str(params, "content")?;
    let full = resolve(place, path);
    if let Err(msg) = confine_write(place, path, &full) {
        return Ok(tool_error(msg));
    }
    if !write_with_parents(&full, content.as_bytes()) {
        return Ok(tool_error(format!("failed to write file: {path}")));
    }
    Ok(json!({
        "result": "file written successfully",
        "path": path,
        "bytes": content.len(),
    }))
}

// ---------------------------------------------------------------------------------------
// edit_file
// ---------------------------------------------------------------------------------------

/// One edit located in the base text (the file, or its fuzzy form).
struct Replacement<'a> {
    edit: usize,
    at: usize,
    len: usize,
    text: &'a [u8],
}

/// Every old_text is looked for in the original content (not after earlier edits). When
/// one has no exact match, all of them are matched in the fuzzy form of the text
/// (trailing blanks dropped, typographic quotes, dashes and spaces made ASCII); the lines
/// no edit touches are then kept exactly as they were.
fn edit_file(params: &Map<String, Value>, place: &Place) -> Result<Value, BadRequest> {
    let path = required_str(params, "path")?;
    let items = match params.get("edits") {
        None => return Err(missing_key("edits")),
        Some(Value::Array(items)) if !items.is_empty() => items,
        Some(_) => return Ok(tool_error("\"edits\" must be a non-empty array")),
    };
    let mut edits: Vec<(&str, &str)> = Vec::with_capacity(items.len());
    for item in items {
        let old_text = element_str(item, "old_text")?;
        let new_text = element_str(item, "new_text")?;
        if old_text.is_empty() {
            return Ok(tool_error(format!(
                "edits[{}].old_text must not be empty",
                edits.len()
            )));
        }
        edits.push((old_text, new_text));
    }

    let full = resolve(place, path);
    if let Err(msg) = confine_write(place, path, &full) {
        return Ok(tool_error(msg));
    }
    if let Ok(meta) = fs::metadata(&full) {
        if meta.len() > EDIT_MAX_FILE {
            return Ok(tool_error(format!(
                "file too large to edit ({} bytes, max {EDIT_MAX_FILE})",
                meta.len()
            )));
        }
    }
    let Ok(original) = fs::read(&full) else {
        return Ok(tool_error(format!("failed to open file: {path}")));
    };
    let not_found = |i: usize| {
        tool_error(format!(
            "could not find edits[{i}].old_text in {path}, it must match the file's current content exactly"
        ))
    };

    let fuzzy_original = normalize_fuzzy(&original);
    let fuzzy_olds: Vec<Vec<u8>> = edits
        .iter()
        .map(|(old, _)| normalize_fuzzy(old.as_bytes()))
        .collect();
    let mut any_fuzzy = false;
    for (i, (old, _)) in edits.iter().enumerate() {
        if find_bytes(&original, old.as_bytes()).is_some() {
            continue;
        }
        if find_bytes(&fuzzy_original, &fuzzy_olds[i]).is_none() {
            return Ok(not_found(i));
        }
        any_fuzzy = true;
    }
    let base: &[u8] = if any_fuzzy {
        &fuzzy_original
    } else {
        &original
    };

    let mut matched = Vec::with_capacity(edits.len());
    for (i, (old, new)) in edits.iter().enumerate() {
        // Uniqueness is judged on the fuzzy forms, so a copy that differs only in
        // trailing blanks or quote style still counts.
        let occurrences = count_occurrences(&fuzzy_original, &fuzzy_olds[i]);
        if occurrences > 1 {
            return Ok(tool_error(format!(
                "found {occurrences} occurrences of edits[{i}].old_text in {path}, it must be unique"
            )));
        }
        let needle: &[u8] = if any_fuzzy {
            &fuzzy_olds[i]
        } else {
            old.as_bytes()
        };
        let Some(at) = find_bytes(base, needle) else {
            return Ok(not_found(i));
        };
        matched.push(Replacement {
            edit: i,
            at,
            len: needle.len(),
            text: new.as_bytes(),
        });
    }
    matched.sort_by_key(|r| r.at);
    for pair in matched.windows(2) {
        if pair[0].at + pair[0].len > pair[1].at {
            return Ok(tool_error(format!(
                "edits[{}] and edits[{}] overlap in {path}; merge them into one edit or target disjoint regions",
                pair[0].edit, pair[1].edit
            )));
        }
    }

    let edited = if any_fuzzy {
        splice_keeping_lines(&original, base, &matched)
    } else {
        splice(base, &matched, 0)
    };
    if edited == original {
        return Ok(tool_error(
            "no changes made: the replacement(s) produced identical content",
        ));
    }
    if !write_with_parents(&full, &edited) {
        return Ok(tool_error(format!("failed to write file: {path}")));
    }
    Ok(json!({
        "result": "file edited successfully",
        "path": path,
        "edits_applied": matched.len(),
    }))
}

/// The largest file edit_file reads.
const EDIT_MAX_FILE: u64 = 64 << 20;

/// Linear time whatever the input (a naive search is quadratic on `aaa…ab`).
fn find_bytes(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(haystack, needle)
}

/// Non-overlapping occurrences; an empty needle counts none.
fn count_occurrences(haystack: &[u8], needle: &[u8]) -> usize {
    if needle.is_empty() {
        return 0;
    }
    let mut count = 0;
    let mut from = 0;
    while let Some(at) = haystack
        .get(from..)
        .and_then(|rest| find_bytes(rest, needle))
    {
        count += 1;
        from += at + needle.len();
    }
    count
}

/// The fuzzy form, line by line (the number of lines is kept).
fn normalize_fuzzy(content: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(content.len());
    for (i, line) in content.split(|&b| b == b'\n').enumerate() {
        if i > 0 {
            out.push(b'\n');
        }
        normalize_fuzzy_line(line, &mut out);
    }
    out
}

/// Trailing spaces, tabs and CRs dropped, then typographic characters made ASCII.
fn normalize_fuzzy_line(line: &[u8], out: &mut Vec<u8>) {
    let end = line
        .iter()
        .rposition(|&b| !matches!(b, b' ' | b'\t' | b'\r'))
        .map_or(0, |i| i + 1);
    let mut rest = &line[..end];
    while let Some((&first, tail)) = rest.split_first() {
        match fuzzy_ascii(rest) {
            Some((len, ascii)) => {
                out.push(ascii);
                rest = &rest[len..];
            }
            None => {
                out.push(first);
                rest = tail;
            }
        }
    }
}

/// The ASCII stand-in for a typographic character at the start of `bytes`, with the
/// character's length in bytes.
fn fuzzy_ascii(bytes: &[u8]) -> Option<(usize, u8)> {
    match bytes {
        // ‘ ’ ‚ ‛
        [0xE2, 0x80, 0x98..=0x9B, ..] => Some((3, b'\'')),
        // “ ” „ ‟
        [0xE2, 0x80, 0x9C..=0x9F, ..] => Some((3, b'"')),
        // hyphens and dashes (U+2010..2015), minus sign
        [0xE2, 0x80, 0x90..=0x95, ..] | [0xE2, 0x88, 0x92, ..] => Some((3, b'-')),
        // no-break space
        [0xC2, 0xA0, ..] => Some((2, b' ')),
        // en quad..hair space, narrow no-break, medium mathematical, ideographic spaces
        [0xE2, 0x80, 0x82..=0x8A | 0xAF, ..] | [0xE2, 0x81, 0x9F, ..] | [0xE3, 0x80, 0x80, ..] => {
            Some((3, b' '))
        }
        _ => None,
    }
}

/// `content` (which starts at `offset` of the base text) with the replacements made;
/// they are sorted and disjoint.
fn splice(content: &[u8], reps: &[Replacement], offset: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(content.len());
    let mut pos = 0;
    for rep in reps {
        let at = rep.at.saturating_sub(offset).clamp(pos, content.len());
        out.extend_from_slice(&content[pos..at]);
        out.extend_from_slice(rep.text);
        pos = (at + rep.len).min(content.len());
    }
    out.extend_from_slice(&content[pos..]);
    out
}

/// Fuzzy edits: the lines an edit touches come from the fuzzy text with the
/// replacement made; every other line is copied from the original unchanged.
fn splice_keeping_lines(original: &[u8], base: &[u8], reps: &[Replacement]) -> Vec<u8> {
    let original_lines: Vec<&[u8]> = original.split_inclusive(|&b| b == b'\n').collect();
    let mut spans = Vec::new();
    let mut offset = 0;
    for line in base.split_inclusive(|&b| b == b'\n') {
        spans.push((offset, offset + line.len()));
        offset += line.len();
    }

    // Replacements whose line ranges meet are applied together.
    struct Group {
        first_line: usize,
        end_line: usize,
        reps: std::ops::Range<usize>,
    }
    let mut groups: Vec<Group> = Vec::new();
    for (k, rep) in reps.iter().enumerate() {
        // A match at the very end of the text lies on no line: it goes after the last.
        let (first_line, end_line) =
            line_range(&spans, rep.at, rep.len).unwrap_or((spans.len(), spans.len()));
        match groups.last_mut() {
            Some(group) if first_line < group.end_line => {
                group.end_line = group.end_line.max(end_line);
                group.reps.end = k + 1;
            }
            _ => groups.push(Group {
                first_line,
                end_line,
                reps: k..k + 1,
            }),
        }
    }

    let mut out = Vec::with_capacity(original.len());
    let mut next_line = 0;
    for group in &groups {
        for line in original_lines
            .get(next_line..group.first_line)
            .unwrap_or_default()
        {
            out.extend_from_slice(line);
        }
        let from = spans.get(group.first_line).map_or(base.len(), |s| s.0);
        let to = match group.end_line.checked_sub(1).and_then(|i| spans.get(i)) {
            Some(span) if group.end_line > group.first_line => span.1,
            _ => from,
        };
        let slice = base.get(from..to).unwrap_or_default();
        out.extend_from_slice(&splice(slice, &reps[group.reps.clone()], from));
        next_line = group.end_line;
    }
    for line in original_lines.get(next_line..).unwrap_or_default() {
        out.extend_from_slice(line);
    }
    out
}

/// The lines (first, one past the last) that the byte range `at..at + len` touches.
fn line_range(spans: &[(usize, usize)], at: usize, len: usize) -> Option<(usize, usize)> {
    let first = spans.iter().position(|&(s, e)| s <= at && at < e)?;
    let mut last = first;
    while last < spans.len() && spans[last].1 < at + len {
        last += 1;
    }
    (last < spans.len()).then_some((first, last + 1))
}

// ---------------------------------------------------------------------------------------
// get_info
// ---------------------------------------------------------------------------------------

const INFO_MAX_OUTPUT: usize = 4096;
const INFO_TIMEOUT: Duration = Duration::from_secs(5);

fn get_info(place: &Place) -> Value {
    let run = run_command(
        OsStr::new("uname"),
        &[OsStr::new("-a")],
        Some(&place.cwd),
        true,
        INFO_MAX_OUTPUT,
        INFO_TIMEOUT,
        &mut |_| true,
    );
    // A failed run leaves a diagnostic in the output, which is no OS name.
    let os = if run.exit_code == 0 && !run.timed_out {
        run.text().trim().to_owned()
    } else {
        "unknown".to_owned()
    };
    json!({"os": os, "cwd": display(&place.cwd)})
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A fresh directory under the system temp dir, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new() -> Self {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir()
                .join(format!("wgllm-builtin-tools-{}-{n}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).expect("create scratch dir");
            Scratch(fs::canonicalize(&dir).expect("canonical scratch dir"))
        }

        fn path(&self) -> &Path {
            &self.0
        }

        fn write(&self, rel: &str, content: &str) {
            let path = self.0.join(rel);
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent).expect("create parent");
            }
            fs::write(path, content).expect("write file");
        }

        fn mkdir(&self, rel: &str) {
            fs::create_dir_all(self.0.join(rel)).expect("create dir");
        }

        fn read(&self, rel: &str) -> String {
            fs::read_to_string(self.0.join(rel)).expect("read file")
        }

        fn place(&self) -> Place {
            Place {
                cwd: self.0.clone(),
                root: None,
            }
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn params(args: Value) -> Map<String, Value> {
        match args {
            Value::Object(map) => map,
            other => panic!("params must be an object, got {other}"),
        }
    }

    fn run(name: &str, args: Value, place: &Place) -> Value {
        call(name, &params(args), place, false).expect("not a bad request")
    }

    fn text(result: &Value) -> &str {
        result["plain_text_response"]
            .as_str()
            .unwrap_or_else(|| panic!("no text in {result}"))
    }

    fn error(result: &Value) -> &str {
        result["error"]
            .as_str()
            .unwrap_or_else(|| panic!("no error in {result}"))
    }

    fn entry_paths(result: &Value) -> Vec<&str> {
        result["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .map(|e| e["path"].as_str().expect("path"))
            .collect()
    }

    // --- API surface ---

    #[test]
    fn definitions_and_flags() {
        for name in NAMES {
            let def = definition(name).expect("definition");
            assert_eq!(def["type"], "function");
            assert_eq!(def["function"]["name"], name);
            assert_eq!(def["function"]["parameters"]["type"], "object");
            assert!(uses_cwd(name));
            assert!(!display_name(name).is_empty());
        }
        assert!(definition("nope").is_none());
        assert_eq!(
            NAMES.iter().filter(|n| writes(n)).collect::<Vec<_>>(),
            [&"exec_shell_command", &"write_file", &"edit_file"]
        );
        assert_eq!(display_name("get_info"), "Get Runtime Info");
        let glob = definition("file_glob_search").expect("definition");
        assert_eq!(
            glob["function"]["parameters"]["properties"]["limit"]["description"],
            "Maximum number of results to return, capped at 100 (default 100)"
        );
        assert_eq!(
            definition("edit_file").expect("definition")["function"]["parameters"]["required"],
            json!(["path", "edits"])
        );
    }

    #[test]
    fn missing_or_mistyped_required_params_are_bad_requests() {
        let dir = Scratch::new();
        let place = dir.place();
        assert_eq!(
            call("read_file", &params(json!({})), &place, false).err(),
            Some(BadRequest(
                "[json.exception.out_of_range.403] key 'path' not found".into()
            ))
        );
        assert_eq!(
            call(
                "grep_search",
                &params(json!({"path": ".", "pattern": 3})),
                &place,
                false
            )
            .err(),
            Some(BadRequest(
                "[json.exception.type_error.302] type must be string, but is number".into()
            ))
        );
        let edits = json!({"path": "x", "edits": [{"old_text": "a"}]});
        assert_eq!(
            call("edit_file", &params(edits), &place, false).err(),
            Some(BadRequest(
                "[json.exception.out_of_range.403] key 'new_text' not found".into()
            ))
        );
        assert!(call("nope", &Map::new(), &place, false).is_err());
    }

    // --- globs ---

    #[test]
    fn glob_matcher() {
        assert!(glob_match("*.cpp", "main.cpp"));
        assert!(!glob_match("*.cpp", "src/main.cpp"));
        assert!(glob_match("**.cpp", "src/main.cpp"));
        assert!(glob_match("src/**/*.cpp", "src/a/b/main.cpp"));
        // `**/` needs a '/' to meet: it never matches an empty run of directories.
        assert!(!glob_match("src/**/*.cpp", "src/main.cpp"));
        assert!(glob_match("**", "a/b/c"));
        assert!(glob_match("ma?n.cpp", "main.cpp"));
        assert!(!glob_match("a?b", "a/b"));
        assert!(glob_match("[abc]x", "bx"));
        assert!(!glob_match("[abc]x", "dx"));
        assert!(glob_match("[!abc]x", "dx"));
        assert!(!glob_match("[!abc]x", "ax"));
        assert!(glob_match("[a-c]x", "bx"));
        assert!(!glob_match("[a-c]x", "dx"));
        assert!(glob_match("[]]", "]"));
        assert!(glob_match("[-a]", "-"));
        // An unclosed class is a literal '['.
        assert!(glob_match("a[b", "a[b"));
        assert!(!glob_match("a[b", "ab"));
        assert!(glob_match("", ""));
        assert!(!glob_match("", "a"));
        // Many stars stay fast.
        assert!(!glob_match("*a*a*a*a*a*a*a*a*a*a*a*b", &"a".repeat(200)));
    }

    #[test]
    fn path_glob_anchoring() {
        // No '/': the basename, at any depth.
        assert!(path_glob_match("*.cpp", "src/main.cpp"));
        assert!(path_glob_match("**", "a/b"));
        // With '/': `**/` is put in front, so a top-level `src/` does not match.
        assert!(!path_glob_match("src/*.cpp", "src/main.cpp"));
        assert!(path_glob_match("src/*.cpp", "lib/src/main.cpp"));
        assert!(!path_glob_match("src/*.cpp", "lib/src/x/main.cpp"));
        assert!(path_glob_match("**/src/*.cpp", "a/src/x.cpp"));
        assert!(!path_glob_match("**/*.cpp", "main.cpp"));
        // A leading '/' is kept, and relative paths never start with one.
        assert!(!path_glob_match("/src/*.cpp", "src/main.cpp"));
    }

    // --- paths ---

    #[test]
    fn resolution_and_normalisation() {
        let cwd = Path::new("/work/here");
        assert_eq!(
            resolve_with_home(cwd, "a/./b/../c", None),
            PathBuf::from("/work/here/a/c")
        );
        assert_eq!(
            resolve_with_home(cwd, "../../../x", None),
            PathBuf::from("/x")
        );
        assert_eq!(resolve_with_home(cwd, "/abs/", None), PathBuf::from("/abs"));
        assert_eq!(
            resolve_with_home(cwd, "", None),
            PathBuf::from("/work/here")
        );
        let home = Some(OsString::from("/home/me"));
        assert_eq!(
            resolve_with_home(cwd, "~/notes.txt", home.clone()),
            PathBuf::from("/home/me/notes.txt")
        );
        assert_eq!(
            resolve_with_home(cwd, "~", home.clone()),
            PathBuf::from("/home/me")
        );
        assert_eq!(
            resolve_with_home(cwd, "~other/x", home),
            PathBuf::from("/work/here/~other/x")
        );
    }

    // --- read_file ---

    #[test]
    fn read_file_ranges_and_locations() {
        let dir = Scratch::new();
        let place = dir.place();
        dir.write("f.txt", "l1\nl2\nl3\n");
        let all = run("read_file", json!({"path": "f.txt"}), &place);
        assert_eq!(text(&all), "l1\nl2\nl3\n");
        let part = run(
            "read_file",
            json!({"path": "f.txt", "start_line": 2, "end_line": 3, "append_loc": true}),
            &place,
        );
        assert_eq!(text(&part), "2\u{2192}l2\n3\u{2192}l3\n");
        let tail = run(
            "read_file",
            json!({"path": "f.txt", "start_line": 3}),
            &place,
        );
        assert_eq!(text(&tail), "l3\n");
        // No final newline: the last line still ends with one in the output.
        dir.write("g.txt", "a\n\nb");
        let g = run("read_file", json!({"path": "g.txt"}), &place);
        assert_eq!(text(&g), "a\n\nb\n");
    }

    #[test]
    fn read_file_limits_and_errors() {
        let dir = Scratch::new();
        let place = dir.place();
        let big = "0123456789\n".repeat(2000);
        dir.write("big.txt", &big);
        let err = run("read_file", json!({"path": "big.txt"}), &place);
        assert_eq!(
            error(&err),
            "file too large (22000 bytes, max 16384). Use start_line/end_line to read a portion."
        );
        let head = run(
            "read_file",
            json!({"path": "big.txt", "end_line": 2}),
            &place,
        );
        assert_eq!(text(&head), "0123456789\n0123456789\n");
        let cut = run(
            "read_file",
            json!({"path": "big.txt", "end_line": 5000}),
            &place,
        );
        let cut = text(&cut);
        assert!(cut.ends_with("0123456789\n[output truncated]"));
        assert_eq!(cut.len(), 1489 * 11 + "[output truncated]".len());

        let missing = run("read_file", json!({"path": "missing.txt"}), &place);
        assert_eq!(error(&missing), "cannot stat file: missing.txt");
        dir.mkdir("sub");
        let directory = run("read_file", json!({"path": "sub"}), &place);
        assert_eq!(error(&directory), "cannot stat file: sub");

        let encoded = call(
            "read_file",
            &params(json!({"path": "big.txt"})),
            &place,
            true,
        )
        .expect("not a bad request");
        use base64::Engine as _;
        assert_eq!(
            encoded["base64"],
            base64::engine::general_purpose::STANDARD.encode(big.as_bytes())
        );
        assert_eq!(encoded["size_bytes"], 22000);
    }

    // --- file_glob_search (mirrors llama's tests 13-15) ---

    #[test]
    fn glob_search_type_dir() {
        let dir = Scratch::new();
        let place = dir.place();
        dir.write("project-alpha/README.md", "alpha");
        dir.write("project-alpha/src/main.cpp", "int main() {}");
        dir.write("project-beta/notes.txt", "beta");
        let base = display(dir.path());

        let res = run(
            "file_glob_search",
            json!({"path": base, "type": "dir"}),
            &place,
        );
        let listing = text(&res);
        assert!(listing.contains("project-alpha/\n"));
        assert!(listing.contains("project-beta/\n"));
        assert!(listing.contains("project-alpha/src/\n"));
        assert!(!listing.contains("README.md"));
        let types: Vec<(&str, &str)> = res["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .map(|e| {
                (
                    e["path"].as_str().unwrap_or(""),
                    e["type"].as_str().unwrap_or(""),
                )
            })
            .collect();
        assert!(types.contains(&("project-alpha", "dir")));
        assert!(types.contains(&("project-alpha/src", "dir")));
        assert_eq!(res["base"], base.as_str());

        let all = run(
            "file_glob_search",
            json!({"path": base, "type": "all", "include": "*proj*"}),
            &place,
        );
        let paths = entry_paths(&all);
        assert!(paths.contains(&"project-alpha"));
        assert!(paths.contains(&"project-beta"));
    }

    #[test]
    fn glob_search_max_depth_and_limit() {
        let dir = Scratch::new();
        let place = dir.place();
        dir.mkdir("a/b/c");
        dir.write("top.txt", "top");
        dir.write("a/mid.txt", "mid");
        dir.write("a/b/deep.txt", "deep");

        let one = run(
            "file_glob_search",
            json!({"path": ".", "max_depth": 1}),
            &place,
        );
        assert!(text(&one).contains("top.txt"));
        assert!(!text(&one).contains("mid.txt"));
        let two = run(
            "file_glob_search",
            json!({"path": ".", "max_depth": 2}),
            &place,
        );
        assert!(text(&two).contains("mid.txt"));
        assert!(!text(&two).contains("deep.txt"));

        let limited = run("file_glob_search", json!({"path": ".", "limit": 1}), &place);
        assert_eq!(entry_paths(&limited).len(), 1);
        assert!(text(&limited).contains("\n---\nTotal matches: 3\n"));
        assert!(text(&limited).ends_with(
            "[1 results limit reached (3 total matches). Refine the glob pattern to narrow the search.]\n"
        ));

        let all = run("file_glob_search", json!({"path": "."}), &place);
        assert_eq!(
            text(&all),
            "top.txt\na/mid.txt\na/b/deep.txt\n\n---\nTotal matches: 3\n"
        );
        let txt = run(
            "file_glob_search",
            json!({"path": ".", "include": "*.txt", "exclude": "deep*"}),
            &place,
        );
        assert_eq!(entry_paths(&txt), ["top.txt", "a/mid.txt"]);
    }

    #[test]
    fn glob_search_junk_dirs() {
        let dir = Scratch::new();
        let place = dir.place();
        dir.mkdir("build/nested");
        dir.write("build/artifact.txt", "built");
        dir.write("src/main.cpp", "int main() {}");

        let dirs = run(
            "file_glob_search",
            json!({"path": ".", "type": "dir", "max_depth": 1}),
            &place,
        );
        assert!(entry_paths(&dirs).contains(&"build"));

        let all = run(
            "file_glob_search",
            json!({"path": ".", "type": "all"}),
            &place,
        );
        let paths = entry_paths(&all);
        assert!(paths.contains(&"src/main.cpp"));
        assert!(!paths.contains(&"build/artifact.txt"));
        assert!(!paths.contains(&"build/nested"));
    }

    #[test]
    fn glob_search_errors() {
        let dir = Scratch::new();
        let place = dir.place();
        let bogus = run(
            "file_glob_search",
            json!({"path": ".", "type": "bogus"}),
            &place,
        );
        assert_eq!(
            error(&bogus),
            "invalid type: bogus (expected \"file\", \"dir\" or \"all\")"
        );
        let zero = run("file_glob_search", json!({"path": ".", "limit": 0}), &place);
        assert_eq!(error(&zero), "invalid limit: 0 (expected 1 or more)");
        let missing = run("file_glob_search", json!({"path": "nope"}), &place);
        assert_eq!(
            error(&missing),
            "path does not exist or is not a directory: nope"
        );
    }

    #[test]
    fn glob_search_files_come_from_git_when_it_answers() {
        let dir = Scratch::new();
        let place = dir.place();
        let git = std::process::Command::new("git")
            .args(["init", "-q"])
            .current_dir(dir.path())
            .status();
        if !git.is_ok_and(|status| status.success()) {
            return; // no git here: the walk is covered elsewhere
        }
        dir.write(".gitignore", "ignored.txt\n");
        dir.write("keep.txt", "k");
        dir.write("ignored.txt", "i");
        let files = run("file_glob_search", json!({"path": "."}), &place);
        let paths = entry_paths(&files);
        assert!(paths.contains(&"keep.txt"));
        assert!(paths.contains(&".gitignore"));
        assert!(!paths.contains(&"ignored.txt"));
        // Directories always come from the walk, which knows nothing of .gitignore.
        let all = run(
            "file_glob_search",
            json!({"path": ".", "type": "all"}),
            &place,
        );
        assert!(entry_paths(&all).contains(&"ignored.txt"));
        assert!(entry_paths(&all).contains(&".git"));
    }

    #[test]
    fn glob_search_does_not_walk_links() {
        let dir = Scratch::new();
        let place = dir.place();
        dir.write("real/inner.txt", "x");
        std::os::unix::fs::symlink(dir.path().join("real"), dir.path().join("link"))
            .expect("symlink");
        let all = run(
            "file_glob_search",
            json!({"path": ".", "type": "all"}),
            &place,
        );
        let paths = entry_paths(&all);
        assert!(paths.contains(&"link"));
        assert!(paths.contains(&"real/inner.txt"));
        assert!(!paths.contains(&"link/inner.txt"));
    }

    // --- grep_search ---

    #[test]
    fn grep_lines_context_and_numbers() {
        let dir = Scratch::new();
        let place = dir.place();
        dir.write("a.txt", "one\ntwo\nthree\nfour\n");
        dir.write("b.md", "two\n");

        let plain = run(
            "grep_search",
            json!({"path": ".", "pattern": "two"}),
            &place,
        );
        assert_eq!(
            text(&plain),
            "a.txt:two\nb.md:two\n\n---\nTotal matches: 2\n"
        );

        let numbered = run(
            "grep_search",
            json!({"path": ".", "pattern": "t.o", "include": "*.txt", "return_line_numbers": true}),
            &place,
        );
        assert_eq!(text(&numbered), "a.txt:2:two\n\n---\nTotal matches: 1\n");

        let context = run(
            "grep_search",
            json!({"path": "a.txt", "pattern": "^two$", "context_lines": 1}),
            &place,
        );
        assert_eq!(
            text(&context),
            "a.txt-1-one\na.txt:2:two\na.txt-3-three\n--\n\n---\nTotal matches: 1\n"
        );

        let literal = run(
            "grep_search",
            json!({"path": ".", "pattern": "t.o", "literal": true}),
            &place,
        );
        assert_eq!(text(&literal), "\n---\nTotal matches: 0\n");

        let folded = run(
            "grep_search",
            json!({"path": "a.txt", "pattern": "FOUR", "ignore_case": true}),
            &place,
        );
        assert_eq!(text(&folded), "a.txt:four\n\n---\nTotal matches: 1\n");
    }

    #[test]
    fn grep_limit_and_errors() {
        let dir = Scratch::new();
        let place = dir.place();
        dir.write("many.txt", &"x\n".repeat(150));
        let capped = run(
            "grep_search",
            json!({"path": "many.txt", "pattern": "x"}),
            &place,
        );
        assert!(text(&capped).ends_with(
            "\n---\nTotal matches: 100\n[100 matches limit reached. Narrow the path/pattern/include to see more.]\n"
        ));

        let bad = run("grep_search", json!({"path": ".", "pattern": "("}), &place);
        assert!(error(&bad).starts_with("invalid regex: "));
        let missing = run(
            "grep_search",
            json!({"path": "nope", "pattern": "x"}),
            &place,
        );
        assert_eq!(error(&missing), "path does not exist: nope");
    }

    // --- exec_shell_command ---

    #[test]
    fn exec_output_and_exit_code() {
        let dir = Scratch::new();
        let place = dir.place();
        let res = run(
            "exec_shell_command",
            json!({"command": "echo hello; echo oops 1>&2; exit 3"}),
            &place,
        );
        assert_eq!(text(&res), "hello\noops\n\n[exit code: 3]");

        let pwd = run("exec_shell_command", json!({"command": "pwd"}), &place);
        assert_eq!(
            text(&pwd),
            format!("{}\n\n[exit code: 0]", dir.path().display())
        );

        let cut = run(
            "exec_shell_command",
            json!({"command": "printf 0123456789abcdef", "max_output_size": 10}),
            &place,
        );
        assert_eq!(text(&cut), "0123456789\n[output truncated]\n[exit code: 0]");
    }

    #[test]
    fn exec_timeout_kills_the_group() {
        let dir = Scratch::new();
        let place = dir.place();
        let started = Instant::now();
        let res = run(
            "exec_shell_command",
            json!({"command": "sleep 5", "timeout": 1}),
            &place,
        );
        assert_eq!(text(&res), "\n[exit code: 1] [exit due to timed out]");
        assert!(started.elapsed() < Duration::from_secs(4));

        // A background child holding the output open goes with its group.
        let started = Instant::now();
        let res = run(
            "exec_shell_command",
            json!({"command": "sleep 30 & echo started", "timeout": 1}),
            &place,
        );
        assert!(text(&res).starts_with("started\n"));
        assert!(text(&res).ends_with(" [exit due to timed out]"));
        assert!(started.elapsed() < Duration::from_secs(5));

        // Endless output: capped, drained, and stopped at the deadline.
        let res = run(
            "exec_shell_command",
            json!({"command": "yes", "timeout": 1}),
            &place,
        );
        let out = text(&res);
        assert!(out.starts_with("y\ny\n"));
        assert!(out.ends_with("\n[output truncated]\n[exit code: 1] [exit due to timed out]"));
        assert_eq!(
            out.len(),
            EXEC_MAX_OUTPUT + "\n[output truncated]\n[exit code: 1] [exit due to timed out]".len()
        );
    }

    #[test]
    fn exec_streamed_chunks_and_client_leaving() {
        let dir = Scratch::new();
        let place = dir.place();
        let mut pieces = Vec::new();
        let done = exec_streamed(
            &params(json!({"command": "echo hello"})),
            &place,
            &mut |piece| {
                pieces.push(piece.to_owned());
                true
            },
        )
        .expect("not a bad request");
        assert_eq!(done, json!({}));
        assert_eq!(pieces.concat(), "hello\n\n[exit code: 0]");
        assert_eq!(pieces.last().map(String::as_str), Some("\n[exit code: 0]"));

        let started = Instant::now();
        let mut calls = 0;
        let done = exec_streamed(
            &params(json!({"command": "yes", "timeout": 30})),
            &place,
            &mut |_| {
                calls += 1;
                false
            },
        )
        .expect("not a bad request");
        assert_eq!(done, json!({}));
        assert_eq!(calls, 1);
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn utf8_pieces_are_whole() {
        let mut carry = Utf8Carry::default();
        let bytes = "é→x".as_bytes();
        assert_eq!(carry.push(&bytes[..1]), "");
        assert_eq!(carry.push(&bytes[1..3]), "é");
        assert_eq!(carry.push(&bytes[3..]), "→x");
        assert_eq!(carry.finish(), "");
    }

    // --- write_file and edit_file ---

    #[test]
    fn write_then_edit() {
        let dir = Scratch::new();
        let place = dir.place();
        let written = run(
            "write_file",
            json!({"path": "logs/test.log", "content": "line1\nline2\nline3\n"}),
            &place,
        );
        assert_eq!(
            written,
            json!({"result": "file written successfully", "path": "logs/test.log", "bytes": 18})
        );
        let edited = run(
            "edit_file",
            json!({"path": "logs/test.log", "edits": [
                {"old_text": "line2", "new_text": "line2-edited"},
                {"old_text": "line3\n", "new_text": "line3\nline4\n"},
            ]}),
            &place,
        );
        assert_eq!(
            edited,
            json!({"result": "file edited successfully", "path": "logs/test.log", "edits_applied": 2})
        );
        assert_eq!(
            dir.read("logs/test.log"),
            "line1\nline2-edited\nline3\nline4\n"
        );
    }

    #[test]
    fn edit_errors() {
        let dir = Scratch::new();
        let place = dir.place();
        dir.write("dup.log", "dup\ndup\n");
        let dup = run(
            "edit_file",
            json!({"path": "dup.log", "edits": [{"old_text": "dup", "new_text": "x"}]}),
            &place,
        );
        assert_eq!(
            error(&dup),
            "found 2 occurrences of edits[0].old_text in dup.log, it must be unique"
        );

        dir.write("o.log", "line1\nline2\n");
        let overlap = run(
            "edit_file",
            json!({"path": "o.log", "edits": [
                {"old_text": "line1\nline2", "new_text": "a"},
                {"old_text": "line2", "new_text": "b"},
            ]}),
            &place,
        );
        assert_eq!(
            error(&overlap),
            "edits[0] and edits[1] overlap in o.log; merge them into one edit or target disjoint regions"
        );

        let missing = run(
            "edit_file",
            json!({"path": "o.log", "edits": [{"old_text": "zzz", "new_text": "b"}]}),
            &place,
        );
        assert_eq!(
            error(&missing),
            "could not find edits[0].old_text in o.log, it must match the file's current content exactly"
        );
        let empty = run(
            "edit_file",
            json!({"path": "o.log", "edits": [{"old_text": "line1", "new_text": "x"}, {"old_text": "", "new_text": "b"}]}),
            &place,
        );
        assert_eq!(error(&empty), "edits[1].old_text must not be empty");
        let same = run(
            "edit_file",
            json!({"path": "o.log", "edits": [{"old_text": "line1", "new_text": "line1"}]}),
            &place,
        );
        assert_eq!(
            error(&same),
            "no changes made: the replacement(s) produced identical content"
        );
        let none = run("edit_file", json!({"path": "o.log", "edits": []}), &place);
        assert_eq!(error(&none), "\"edits\" must be a non-empty array");
        let absent = run(
            "edit_file",
            json!({"path": "absent.log", "edits": [{"old_text": "a", "new_text": "b"}]}),
            &place,
        );
        assert_eq!(error(&absent), "failed to open file: absent.log");
        assert_eq!(dir.read("o.log"), "line1\nline2\n");
    }

    #[test]
    fn edit_fuzzy_keeps_untouched_lines() {
        let dir = Scratch::new();
        let place = dir.place();
        dir.write(
            "q.txt",
            "say \u{201C}hi\u{201D}  \nkeep \u{2018}this\u{2019}\t\nend\n",
        );
        let res = run(
            "edit_file",
            json!({"path": "q.txt", "edits": [{"old_text": "say \"hi\"", "new_text": "say \"bye\""}]}),
            &place,
        );
        assert_eq!(res["edits_applied"], 1);
        assert_eq!(
            dir.read("q.txt"),
            "say \"bye\"\nkeep \u{2018}this\u{2019}\t\nend\n"
        );
    }

    // --- get_info ---

    #[test]
    fn get_info_reports_os_and_cwd() {
        let dir = Scratch::new();
        let place = dir.place();
        let info = run("get_info", json!({}), &place);
        assert!(!info["os"].as_str().expect("os").is_empty());
        assert_eq!(info["cwd"], display(dir.path()).as_str());
    }

    // --- the tools root ---

    #[test]
    fn root_confines_file_tools() {
        let dir = Scratch::new();
        dir.write("root/inside.txt", "inside\n");
        dir.write("out/secret.txt", "SECRET\n");
        let root = dir.path().join("root");
        let place = Place {
            cwd: root.clone(),
            root: Some(root.clone()),
        };
        let outside = |path: &str| {
            format!(
                "path is outside the tools root ({}): {path}",
                root.display()
            )
        };

        let ok = run("read_file", json!({"path": "inside.txt"}), &place);
        assert_eq!(text(&ok), "inside\n");

        let secret = display(&dir.path().join("out/secret.txt"));
        let abs = run("read_file", json!({"path": secret}), &place);
        assert_eq!(error(&abs), outside(&secret));
        let up = run("read_file", json!({"path": "../out/secret.txt"}), &place);
        assert_eq!(error(&up), outside("../out/secret.txt"));

        std::os::unix::fs::symlink(dir.path().join("out"), root.join("link")).expect("symlink");
        let via_link = run("read_file", json!({"path": "link/secret.txt"}), &place);
        assert_eq!(error(&via_link), outside("link/secret.txt"));
        let write_via_link = run(
            "write_file",
            json!({"path": "link/new.txt", "content": "x"}),
            &place,
        );
        assert_eq!(error(&write_via_link), outside("link/new.txt"));
        assert!(!dir.path().join("out/new.txt").exists());

        // A dangling link could create its target anywhere.
        std::os::unix::fs::symlink(dir.path().join("out/made.txt"), root.join("dangle"))
            .expect("symlink");
        let dangling = run(
            "write_file",
            json!({"path": "dangle", "content": "x"}),
            &place,
        );
        assert_eq!(error(&dangling), outside("dangle"));
        assert!(!dir.path().join("out/made.txt").exists());

        let inside = run(
            "write_file",
            json!({"path": "sub/dir/new.txt", "content": "fresh"}),
            &place,
        );
        assert_eq!(inside["result"], "file written successfully");
        assert_eq!(dir.read("root/sub/dir/new.txt"), "fresh");

        let glob_up = run("file_glob_search", json!({"path": ".."}), &place);
        assert_eq!(error(&glob_up), outside(".."));

        // A listed link to a file outside is not read.
        std::os::unix::fs::symlink(dir.path().join("out/secret.txt"), root.join("leak.txt"))
            .expect("symlink");
        let grep = run(
            "grep_search",
            json!({"path": ".", "pattern": "SECRET"}),
            &place,
        );
        assert_eq!(text(&grep), "\n---\nTotal matches: 0\n");
        let grep_inside = run(
            "grep_search",
            json!({"path": ".", "pattern": "inside"}),
            &place,
        );
        assert_eq!(
            text(&grep_inside),
            "inside.txt:inside\n\n---\nTotal matches: 1\n"
        );
    }
}
