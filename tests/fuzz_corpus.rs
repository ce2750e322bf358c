//! The fuzz targets' seeds and past findings, run through the targets' own functions
//! (`wgllm::fuzz`) in the ordinary test run: every finding stays fixed, and every seed
//! is a valid input of its kind, so the fuzzer starts where real inputs are (a seed that
//! stopped parsing would leave the fuzzer exploring error paths only).
//!
//! Seeds: fuzz/seeds/<target>/ (written by scripts/fuzz-seeds.py). Findings:
//! fuzz/regressions/<target>/, each the input that crashed, hung or exhausted a target,
//! checked in with its fix.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use wgllm::grammar::{accepts_text, json_schema, Grammar};

fn files(kind: &str, target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz")
        .join(kind)
        .join(target);
    let mut out: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).collect(),
        Err(_) => Vec::new(),
    };
    out.sort();
    out
}

fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let out: Vec<_> = (files("seeds", target).into_iter())
        .map(|p| (p.display().to_string(), std::fs::read(&p).unwrap()))
        .collect();
    assert!(
        !out.is_empty(),
        "no seeds for {target}: run scripts/fuzz-seeds.py"
    );
    out
}

fn split(data: &[u8]) -> (&str, &str) {
    let i = data.iter().position(|&b| b == 0).unwrap();
    (
        std::str::from_utf8(&data[..i]).unwrap(),
        std::str::from_utf8(&data[i + 1..]).unwrap(),
    )
}

/// Every checked-in input of every target, seeds and findings, through the target.
#[test]
fn every_seed_and_finding_runs_through_its_target() {
    let tok = smollm2_tokenizer();
    type Target<'a> = Box<dyn Fn(&[u8]) + 'a>;
    let targets: Vec<(&str, Target)> = vec![
        ("gguf", Box::new(wgllm::fuzz::gguf)),
        ("image", Box::new(wgllm::fuzz::image)),
        ("tokenizer", Box::new(wgllm::fuzz::tokenizer)),
        ("chat_template", Box::new(wgllm::fuzz::chat_template)),
        ("grammar", Box::new(wgllm::fuzz::grammar)),
        ("json_schema", Box::new(wgllm::fuzz::json_schema)),
        ("state_file", Box::new(wgllm::fuzz::state_file)),
        ("memory_state", Box::new(wgllm::fuzz::memory_state)),
        (
            "server_request",
            Box::new(|d: &[u8]| wgllm::fuzz::server_request(d, &tok)),
        ),
    ];
    for (name, run) in &targets {
        for p in files("seeds", name)
            .into_iter()
            .chain(files("regressions", name))
        {
            run(&std::fs::read(&p).unwrap());
        }
    }
}

#[test]
fn gguf_seeds_are_models_with_a_vocabulary() {
    for (path, data) in seeds("gguf") {
        let f = wgllm::gguf::GgufFile::from_bytes(&path, data).unwrap();
        if f.tensors.is_empty() {
            continue;
        }
        wgllm::model::Hparams::from_gguf(&f).unwrap_or_else(|e| panic!("{path}: {e}"));
        wgllm::tokenizer::Tokenizer::from_gguf(&f).unwrap_or_else(|e| panic!("{path}: {e}"));
        // The fuzzer reaches the loader, the memory and the graph only from seeds that
        // get through them.
        wgllm::fuzz::host_model_step(&f).unwrap_or_else(|e| panic!("{path}: {e}"));
    }
}

/// The model seeds cover every architecture `wgllm synth` writes, so the fuzzer mutates
/// each one's loading and graph.
#[test]
fn gguf_seeds_cover_every_synth_architecture() {
    let mut archs = std::collections::BTreeSet::new();
    for (path, data) in seeds("gguf") {
        let f = wgllm::gguf::GgufFile::from_bytes(&path, data).unwrap();
        if let Ok(a) = f.architecture() {
            archs.insert(a.to_string());
        }
    }
    use wgllm::model::synth::SynthArch;
    for name in SynthArch::NAMES.split(", ") {
        let want = SynthArch::by_name(name).unwrap().gguf_arch();
        assert!(
            archs.contains(want),
            "no seed of `{want}` in fuzz/seeds/gguf (scripts/fuzz-seeds.py writes them): {archs:?}"
        );
    }
}

#[test]
fn tokenizer_seeds_build_and_round_trip() {
    for (path, data) in seeds("tokenizer") {
        let n = u32::from_le_bytes(data[..4].try_into().unwrap()) as usize;
        let f = wgllm::gguf::GgufFile::from_bytes(&path, data[4..4 + n].to_vec()).unwrap();
        let tok =
            wgllm::tokenizer::Tokenizer::from_gguf(&f).unwrap_or_else(|e| panic!("{path}: {e}"));
        let ids = tok.encode("hello the world", false, false);
        assert!(!ids.is_empty(), "{path}");
    }
}

#[test]
fn template_seeds_render() {
    for (path, data) in seeds("chat_template") {
        let (template, messages) = split(&data);
        let m: serde_json::Value = serde_json::from_str(messages).unwrap();
        let msgs: Vec<_> = (m.as_array().unwrap().iter())
            .map(|m| {
                wgllm::tokenizer::ChatMessage::new(
                    m["role"].as_str().unwrap(),
                    m["content"].as_str().unwrap(),
                )
            })
            .collect();
        let out = wgllm::tokenizer::render_chat_template(template, &msgs, &Default::default())
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(!out.is_empty(), "{path}");
    }
}

#[test]
fn grammar_and_schema_seeds_accept_their_text() {
    for (path, data) in seeds("grammar") {
        let (g, text) = split(&data);
        let g = Grammar::parse(g, None).unwrap_or_else(|e| panic!("{path}: {e}"));
        // Token references (<[1]>) cannot be spelled as bytes.
        if !path.ends_with("tokens") {
            assert!(accepts_text(Arc::new(g), text), "{path}");
        }
    }
    for (path, data) in seeds("json_schema") {
        let (s, text) = split(&data);
        let gbnf = json_schema::to_grammar(&serde_json::from_str(s).unwrap()).unwrap();
        let g = Grammar::parse(&gbnf, None).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(accepts_text(Arc::new(g), text), "{path}: {text}\n{gbnf}");
    }
}

#[test]
fn request_seeds_are_accepted_at_their_endpoint() {
    use wgllm::server::bodies::{default_settings, requests, Endpoint};
    let tok = smollm2_tokenizer();
    for (path, data) in seeds("server_request") {
        let endpoint = Endpoint::ALL[data[0] as usize % Endpoint::ALL.len()];
        let reqs = match requests(endpoint, &data[1..], &tok, &default_settings()) {
            // SmolLM2 has no FIM tokens: an infill body is read whole, then refused.
            Err(e) if endpoint == Endpoint::Infill && e.contains("not supported by this model") => {
                continue
            }
            r => r.unwrap_or_else(|e| panic!("{path}: {e}")),
        };
        assert!(reqs.iter().all(|r| !r.prompt.is_empty()), "{path}");
    }
}

#[test]
fn state_seeds_load_into_the_host_cache() {
    use wgllm::kv::KvType;
    use wgllm::memory::HostKvStore;
    for (path, data) in seeds("state_file") {
        let dst = (data[0] & 4 != 0).then_some((data[0] >> 3) as u32 % 4);
        let mut stores = [
            HostKvStore::new(16, KvType::F16, KvType::F16, 1, 32),
            HostKvStore::new(8, KvType::F16, KvType::F16, 1, 32),
        ];
        let saved =
            wgllm::context::state::state_into_host(&data[1..], [2, 32, 64], &mut stores, dst, 4)
                .unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(!saved.tokens.is_empty(), "{path}");
        assert!(
            saved.n_cells > 0 && stores[0].cells.used() == saved.n_cells,
            "{path}"
        );
        // The rows landed: the first loaded cell's first K value is its position / 64.
        let first = (0..16)
            .find(|&i| !stores[0].cells.cells()[i].is_empty())
            .unwrap();
        let pos = stores[0].cells.cells()[first].pos;
        let k = half::f16::from_le_bytes([
            stores[0].rows[0][first * 64],
            stores[0].rows[0][first * 64 + 1],
        ]);
        assert_eq!(k.to_f32(), pos as f32 / 64.0, "{path}");
    }
}

fn smollm2_tokenizer() -> wgllm::tokenizer::Tokenizer {
    let f = wgllm::gguf::GgufFile::open(common::smollm2()).unwrap();
    wgllm::tokenizer::Tokenizer::from_gguf(&f).unwrap()
}

/// Each `memory_state` seed (a save of each micro model's memory: K/V, sliding-window
/// pair, recurrent, hybrid; whole and one sequence) loads through that memory, and
/// every model has both; a damaged one (cut short, a cell's sequence set emptied) is
/// refused with the memory left as it was (the target checks that byte for byte).
#[test]
fn memory_state_seeds_load_through_every_memory() {
    let seeds = seeds("memory_state");
    for (path, data) in &seeds {
        let n = wgllm::fuzz::memory_state_load(data).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(n > 0, "{path}: no cells");
        let cut = wgllm::fuzz::memory_state_load(&data[..data.len() - 5]);
        assert!(cut.is_err(), "{path}: a file cut short loaded");
    }
    for m in wgllm::fuzz::MEMORY_STATE_MODELS {
        let m = m.trim_start_matches("synth-");
        for how in ["whole", "one-seq"] {
            assert!(
                seeds
                    .iter()
                    .any(|(p, _)| p.ends_with(&format!("{m}-{how}"))),
                "no {how} seed for {m}: run scripts/fuzz-seeds.py"
            );
        }
    }
}

/// The image seeds are images: each decodes (PNG, BMP, PNM), so the fuzzer starts from
/// inputs the decoder takes.
#[test]
fn image_seeds_decode() {
    let seeds = files("seeds", "image");
    assert!(seeds.len() >= 5, "{seeds:?}");
    for p in seeds {
        let img =
            wgllm::vision::decode_image(&std::fs::read(&p).unwrap(), &p.display().to_string())
                .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            img.pixels.len(),
            3 * img.width as usize * img.height as usize
        );
    }
}
