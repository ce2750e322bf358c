//! Every chat template that llama.cpp ships (models/templates/*.jinja, fetched by
//! scripts/fetch-llamacpp-tests.sh) renders byte for byte as Python's Jinja2 renders it
//! under Hugging Face's `apply_chat_template`. The Jinja2 renders were recorded once by
//! scripts/record-template-renders.py into tests/data/chat-templates/renders.json, so
//! this test needs no Python. The recorded inputs (conversation, BOS/EOS texts, clock)
//! are read from that file, so the two sides cannot drift apart.

mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use wgllm::tokenizer::{render_chat_template, ChatMessage, TemplateOptions};

/// Templates whose wgllm render is allowed to differ from Jinja2's, each with the reason.
/// Every entry is a real limitation; the test fails if a listed template starts
/// matching, so the list cannot go stale.
const KNOWN_DIFFERENCES: &[(&str, &str)] = &[
    // These three are the tool-calling variants of their models' templates, which loop
    // `{% for tool in tools %}` without checking for tools. transformers passes
    // `tools=None` when given no tools, and Jinja2 raises "'NoneType' object is not
    // iterable" there. minijinja iterates `none` as an empty sequence (hard-wired in
    // its `Value::try_iter`, no setting or hook changes it), so wgllm renders the
    // prompt with an empty tool list instead of failing.
    (
        "CohereForAI-c4ai-command-r-plus-tool_use.jinja",
        "minijinja iterates none as empty; Jinja2 raises TypeError",
    ),
    (
        "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
        "minijinja iterates none as empty; Jinja2 raises TypeError",
    ),
    (
        "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
        "minijinja iterates none as empty; Jinja2 raises TypeError",
    ),
];

#[derive(Deserialize)]
struct Record {
    now: String,
    bos_token: String,
    eos_token: String,
    add_generation_prompt: bool,
    messages: Vec<RecordedMessage>,
    templates: BTreeMap<String, Rendered>,
}

#[derive(Deserialize)]
struct RecordedMessage {
    role: String,
    content: String,
}

#[derive(Deserialize)]
struct Rendered {
    sha256: String,
    text: Option<String>,
    error: Option<String>,
}

/// Where `got` first differs from `want`, with a little of each side around it.
fn first_difference(got: &str, want: &str) -> String {
    let at = got
        .bytes()
        .zip(want.bytes())
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(want.len()));
    let around = |s: &str| {
        let mut lo = at.saturating_sub(40);
        while !s.is_char_boundary(lo.min(s.len())) {
            lo -= 1;
        }
        let mut hi = (at + 40).min(s.len());
        while !s.is_char_boundary(hi) {
            hi += 1;
        }
        format!("{:?}", &s[lo.min(s.len())..hi])
    };
    format!(
        "first difference at byte {at} (lengths {} vs {}):\n      wgllm:  {}\n      jinja2: {}",
        got.len(),
        want.len(),
        around(got),
        around(want)
    )
}

/// llama.cpp's templates folder and the `.jinja` files in it, sorted.
fn shipped_templates() -> (std::path::PathBuf, Vec<String>) {
    let dir = common::llamacpp_tests_dir().join("templates");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".jinja"))
        .collect();
    names.sort();
    assert!(!names.is_empty(), "no templates in {}", dir.display());
    (dir, names)
}

#[test]
fn llama_cpp_templates_render_as_jinja2() {
    let started = std::time::Instant::now();
    let record_path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/chat-templates/renders.json");
    let record: Record =
        serde_json::from_str(&std::fs::read_to_string(&record_path).unwrap()).unwrap();
    let now = chrono::NaiveDateTime::parse_from_str(&record.now, "%Y-%m-%dT%H:%M:%S").unwrap();
    let messages: Vec<ChatMessage> = record
        .messages
        .iter()
        .map(|m| ChatMessage::new(&m.role, &m.content))
        .collect();
    let opts = TemplateOptions {
        add_generation_prompt: record.add_generation_prompt,
        bos_token: &record.bos_token,
        eos_token: &record.eos_token,
        now: Some(now),
        tools: None,
        context: None,
    };

    let (dir, names) = shipped_templates();

    let mut failures = Vec::new();
    let mut matched = 0;
    let mut known_seen = Vec::new();
    for name in &names {
        let source = std::fs::read(dir.join(name)).unwrap();
        let Some(want) = record.templates.get(name) else {
            failures.push(format!(
                "{name}: not in the record; run scripts/record-template-renders.py"
            ));
            continue;
        };
        let sha = format!("{:x}", Sha256::digest(&source));
        if sha != want.sha256 {
            failures.push(format!(
                "{name}: the template changed since it was recorded (sha256 {sha}, recorded {}); \
                 run scripts/record-template-renders.py",
                want.sha256
            ));
            continue;
        }
        let source = String::from_utf8(source).unwrap();
        let got = render_chat_template(&source, &messages, &opts);
        let problem = match (&got, &want.text, &want.error) {
            (Ok(got), Some(text), _) if got == text => None,
            (Ok(got), Some(text), _) => Some(first_difference(got, text)),
            (Err(e), Some(_), _) => Some(format!("wgllm failed where jinja2 rendered: {e}")),
            (Err(e), None, Some(msg)) if e.to_string().contains(msg.as_str()) => None,
            (Err(e), None, Some(msg)) => Some(format!(
                "both fail, but wgllm's error does not contain jinja2's {msg:?}: {e}"
            )),
            (Ok(got), None, Some(msg)) => Some(format!(
                "jinja2 raised {msg:?}, wgllm rendered {} bytes: {:?}",
                got.len(),
                &got[..got.floor_char_boundary(120)]
            )),
            (_, None, None) => Some("the record has neither text nor error".into()),
        };
        let known = KNOWN_DIFFERENCES.iter().find(|(n, _)| n == name);
        match (problem, known) {
            (None, None) => matched += 1,
            (None, Some(_)) => failures.push(format!(
                "{name}: matches now; take it off KNOWN_DIFFERENCES"
            )),
            (Some(p), None) => failures.push(format!("{name}: {p}")),
            (Some(_), Some((_, why))) => known_seen.push(format!("{name} ({why})")),
        }
    }
    for (name, _) in KNOWN_DIFFERENCES {
        if !names.iter().any(|n| n == name) {
            failures.push(format!(
                "{name}: on KNOWN_DIFFERENCES but not shipped any more"
            ));
        }
    }
    for name in record.templates.keys() {
        if !names.contains(name) {
            failures.push(format!(
                "{name}: recorded but missing from {}",
                dir.display()
            ));
        }
    }
    eprintln!(
        "{matched}/{} templates render as jinja2 does, {} known differences, in {:.2?}",
        names.len(),
        known_seen.len(),
        started.elapsed()
    );
    for k in &known_seen {
        eprintln!("  known difference: {k}");
    }
    if !failures.is_empty() {
        let mut msg = format!("{} template(s) differ from jinja2:\n", failures.len());
        for f in &failures {
            let _ = writeln!(msg, "  - {f}");
        }
        panic!("{msg}");
    }
}

/// Every shipped template that renders the recorded conversation also renders a long
/// one (a system prompt and 200 turns of 2.5 KB) within the bounds a template from a
/// model file runs under: `TEMPLATE_FUEL` and the guards of `tokenizer/jinja_limits.rs`,
/// which charge for list building and check each new value. Some real templates are
/// quadratic in the conversation (they append each message to one string), so this is
/// what keeps those bounds from refusing a long chat.
#[test]
fn long_conversations_render_within_the_template_bounds() {
    let started = std::time::Instant::now();
    let (dir, names) = shipped_templates();
    let short = vec![
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hi"),
    ];
    let mut long = vec![ChatMessage::new("system", "Be brief. ".repeat(250))];
    for turn in 0..200 {
        let role = if turn % 2 == 0 { "user" } else { "assistant" };
        long.push(ChatMessage::new(
            role,
            format!("turn {turn} ") + &"x".repeat(2500),
        ));
    }
    let opts = TemplateOptions {
        add_generation_prompt: true,
        bos_token: "<s>",
        eos_token: "</s>",
        now: chrono::NaiveDate::from_ymd_opt(2026, 1, 2).and_then(|d| d.and_hms_opt(3, 4, 5)),
        tools: None,
        context: None,
    };
    let mut failures = Vec::new();
    let mut rendered = 0;
    for name in &names {
        let source = std::fs::read_to_string(dir.join(name)).unwrap();
        if render_chat_template(&source, &short, &opts).is_err() {
            continue; // a template that wants another shape of conversation
        }
        match render_chat_template(&source, &long, &opts) {
            Ok(text) if text.contains("turn 199 ") => rendered += 1,
            Ok(text) => failures.push(format!(
                "{name}: the last turn is missing ({} bytes)",
                text.len()
            )),
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    eprintln!(
        "{rendered} templates rendered 200 turns in {:.2?}",
        started.elapsed()
    );
    assert!(
        rendered > 50,
        "only {rendered} templates rendered the short conversation"
    );
    assert!(failures.is_empty(), "{failures:#?}");
}
