//! `wgllm run` with a grammar or a JSON schema (`--grammar`, `-j`) on SmolLM2 against
//! llama.cpp's greedy generations under the same constraints
//! (tests/data/grammar, recorded by scripts/record-grammar-ref.sh).

mod common;

use std::path::PathBuf;

fn data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/grammar")
}

struct Case {
    name: String,
    prompt: String,
    flag: String,
    value: String,
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(data().join("cases.txt")).unwrap();
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let mut parts = l.splitn(3, '|').map(str::trim);
            let (name, prompt, constraint) = (
                parts.next().unwrap(),
                parts.next().unwrap(),
                parts.next().unwrap(),
            );
            let (flag, value) = constraint.split_once(' ').unwrap();
            Case {
                name: name.into(),
                prompt: prompt.into(),
                flag: flag.into(),
                value: value.into(),
            }
        })
        .collect()
}

/// Every case's greedy text equals llama.cpp's, and the JSON ones parse.
#[test]
fn constrained_greedy_text_matches_llama_cpp() {
    let model = common::smollm2();
    let cases = cases();
    assert!(cases.len() >= 8);
    let mut failures = Vec::new();
    for c in &cases {
        let want = std::fs::read_to_string(data().join(format!("{}.txt", c.name))).unwrap();
        let want = want.trim_end_matches('\n');
        let (code, out, err) = common::wgllm(&[
            "run",
            "-m",
            &model,
            "-p",
            &c.prompt,
            "-n",
            "64",
            "--temp",
            "0",
            "--no-display-prompt",
            &c.flag,
            &c.value,
        ]);
        assert_eq!(code, 0, "{}: {err}", c.name);
        let got = out.trim_end_matches('\n');
        if got != want {
            failures.push(format!("{}: got {got:?}\n want {want:?}", c.name));
        }
        // A schema's output that ended on its own is a JSON text.
        if c.flag == "-j" && err.contains("[end of text]") {
            serde_json::from_str::<serde_json::Value>(got)
                .unwrap_or_else(|e| panic!("{}: {got:?} is not JSON: {e}", c.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Bad grammars and schemas are refused with the reason and a non-zero exit.
#[test]
fn bad_constraints_are_refused() {
    let model = common::smollm2();
    for (flag, value, want) in [
        ("--grammar", "root ::= (\"a\"", "expecting ')'"),
        ("--grammar", "start ::= \"a\"", "no 'root' rule"),
        ("-j", "{\"type\": \"hiccup\"}", "unrecognized type hiccup"),
        ("-j", "{not json", "not valid JSON"),
    ] {
        let (code, _, err) =
            common::wgllm(&["run", "-m", &model, "-p", "x", "-n", "4", flag, value]);
        assert_ne!(code, 0, "{flag} {value}");
        assert!(err.contains(want), "{flag} {value}: {err}");
    }
}
