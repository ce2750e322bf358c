//! The fuzz targets' bodies: `fuzz/fuzz_targets/*.rs` hand each libFuzzer input to one of
//! these (`scripts/fuzz.sh`), and `tests/fuzz_corpus.rs` replays the checked-in seeds and
//! every past finding through them in the ordinary test run. Each takes any bytes and
//! must return without a panic, a hang or an allocation out of proportion to its input;
//! errors are the expected answer to most inputs and are dropped.
//!
//! Inputs that carry two parts (a grammar and a text to match, a template and its
//! messages) split at their first NUL byte; the tokenizer's input is a little-endian u32
//! length, that many bytes of GGUF, then the text to encode.

#[cfg(not(target_arch = "wasm32"))]
use crate::batch::Batch;
#[cfg(not(target_arch = "wasm32"))]
use crate::context::{Context, ContextParams};
use crate::gguf::GgufFile;
#[cfg(not(target_arch = "wasm32"))]
use crate::gpu::Gpu;
use crate::grammar::{json_schema, Grammar, GrammarState, TokenPieces};
use crate::model::Hparams;
#[cfg(not(target_arch = "wasm32"))]
use crate::model::Model;
use crate::tokenizer::{render_chat_template, ChatMessage, TemplateOptions, Tokenizer};
use std::sync::Arc;

/// `data` before and after its first NUL byte (all of it and nothing without one).
fn split(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}

/// An image file's decoder and the preprocessing after it: the header checked, the
/// pixels decoded (at most a megapixel here, so an input cannot ask for more than its
/// share of memory), letterboxed into a small square and normalised.
pub fn image(data: &[u8]) {
    use crate::vision::{decode_image_within, letterbox, normalize_planar};
    if let Ok(img) = decode_image_within(data, "fuzz input", 1 << 20) {
        let square = letterbox(&img, 28);
        let planes = normalize_planar(&square, [0.5; 3], [0.5; 3]);
        assert_eq!(planes.len(), 3 * 28 * 28);
    }
}

/// A GGUF file's reader, the hyperparameters and the tokenizer read from its metadata,
/// then the whole model loaded and stepped on a device with no GPU behind it
/// ([`host_model_step`]).
pub fn gguf(data: &[u8]) {
    let Ok(f) = GgufFile::from_bytes("fuzz.gguf", data.to_vec()) else {
        return;
    };
    let hp = Hparams::from_gguf(&f);
    let _ = Tokenizer::from_gguf(&f);
    #[cfg(target_arch = "wasm32")]
    let _ = hp;
    #[cfg(not(target_arch = "wasm32"))]
    if hp.is_ok() {
        let _ = host_model_step(&f);
    }
}

/// What a model file decides beyond its metadata, run on [`Gpu::host_only`] (buffers in
/// host memory, no kernel run): every weight's checks and upload, the memory's shape
/// for a small context, and one decode step of two tokens (the graph built from the
/// file's hyperparameters, its buffers planned, dispatched and read back). The
/// device is made once per process; what an input leaves queued is submitted before
/// the next.
#[cfg(not(target_arch = "wasm32"))]
pub fn host_model_step(f: &GgufFile) -> Result<(), Box<dyn std::error::Error>> {
    static GPU: std::sync::OnceLock<Result<Arc<Gpu>, String>> = std::sync::OnceLock::new();
    let gpu = GPU
        .get_or_init(|| Gpu::host_only().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| e.clone())?;
    let done = (|| -> Result<(), Box<dyn std::error::Error>> {
        let model = Arc::new(Model::load(gpu.clone(), f, &mut |_, _| {})?);
        let mut params = ContextParams::new(32, 8, 8);
        params.embeddings = !model.has_output_head();
        let mut ctx = Context::new(model, params)?;
        ctx.decode(&Batch::simple(&[0, 1], 0, false))?;
        Ok(())
    })();
    // Writes queued by a load that failed part way are dropped with their buffers
    // only once submitted; an error the device raised stays with this input.
    gpu.queue.submit([]);
    let _ = gpu.sync();
    done
}

/// A tokenizer built from GGUF metadata, then arbitrary text encoded (with and without
/// special tokens) and the tokens decoded again, and every id around the vocabulary's
/// end turned into its piece.
pub fn tokenizer(data: &[u8]) {
    let Some((len, rest)) = data.split_first_chunk::<4>() else {
        return;
    };
    let n = (u32::from_le_bytes(*len) as usize).min(rest.len());
    let (file, text) = rest.split_at(n);
    let Ok(f) = GgufFile::from_bytes("fuzz.gguf", file.to_vec()) else {
        return;
    };
    let Ok(tok) = Tokenizer::from_gguf(&f) else {
        return;
    };
    let text = String::from_utf8_lossy(text);
    for (add, parse) in [(true, true), (false, false)] {
        let ids = tok.encode(&text, add, parse);
        let _ = tok.detokenize(&ids, true, true);
        let _ = tok.decode(&ids);
    }
    let n = tok.n_vocab() as u32;
    for id in [0, n.saturating_sub(1), n, u32::MAX] {
        let _ = tok.token_to_piece(id, true);
        let _ = tok.token_text(id);
    }
}

/// A chat template rendered for messages: before the NUL the template, after it a JSON
/// array of messages (or, not being one, the text of one user message).
pub fn chat_template(data: &[u8]) {
    let (template, rest) = split(data);
    let template = String::from_utf8_lossy(template);
    let messages: Vec<ChatMessage> = match serde_json::from_slice::<serde_json::Value>(rest) {
        Ok(serde_json::Value::Array(items)) => items
            .iter()
            .map(|m| {
                let text = |k: &str| m.get(k).and_then(|v| v.as_str()).unwrap_or_default();
                let mut msg = ChatMessage::new(text("role"), text("content"));
                if let Some(o) = m.as_object() {
                    for (k, v) in o.iter().filter(|(k, _)| *k != "role" && *k != "content") {
                        msg.extra.insert(k.clone(), v.clone());
                    }
                }
                msg
            })
            .collect(),
        _ => vec![ChatMessage::new("user", String::from_utf8_lossy(rest))],
    };
    let tools = serde_json::json!([{"type": "function", "function": {"name": "f",
        "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}}]);
    for tools in [None, Some(&tools)] {
        let opts = TemplateOptions {
            add_generation_prompt: true,
            bos_token: "<s>",
            eos_token: "</s>",
            now: chrono::NaiveDate::from_ymd_opt(2026, 1, 2).and_then(|d| d.and_hms_opt(3, 4, 5)),
            tools,
            context: None,
        };
        let _ = render_chat_template(&template, &messages, &opts);
    }
}

/// A GBNF grammar (before the NUL) parsed, then the text after it matched byte by byte,
/// with the whole byte vocabulary checked at each of its first steps.
pub fn grammar(data: &[u8]) {
    let (src, text) = split(data);
    let Ok(g) = Grammar::parse(&String::from_utf8_lossy(src), None) else {
        return;
    };
    match_bytes(Arc::new(g), text);
}

/// A JSON schema (before the NUL) converted to a grammar, which must parse; then the
/// text after it matched.
pub fn json_schema(data: &[u8]) {
    let (schema, text) = split(data);
    let Ok(schema) = serde_json::from_slice::<serde_json::Value>(schema) else {
        return;
    };
    let Ok(gbnf) = json_schema::to_grammar(&schema) else {
        return;
    };
    // The converter's grammar must be one the parser takes, or be refused for a bound
    // the parser keeps (nesting, size) or, as llama.cpp refuses it, for left recursion
    // (a pattern's `(a?)*` is one).
    match Grammar::parse(&gbnf, None) {
        Ok(g) => match_bytes(Arc::new(g), text),
        Err(e) => {
            let e = e.to_string();
            assert!(
                e.contains("more than") || e.contains("simplify") || e.contains("left recursion"),
                "the converter wrote a grammar the parser refuses: {e}\n{gbnf}"
            );
        }
    }
}

fn match_bytes(g: Arc<Grammar>, text: &[u8]) {
    // Each step's work is bounded (`grammar::MAX_WORK`, tens of milliseconds); a text is
    // fed until 2 steps' worth is spent, so a grammar that keeps every step near the
    // bound is not mistaken for a hang.
    let cap = 2 * crate::grammar::MAX_WORK as u64;
    let pieces = Arc::new(TokenPieces::bytes());
    let mut s = GrammarState::new(g.clone(), pieces.clone());
    let all: Vec<u32> = (0..257).collect();
    let mut allowed = vec![true; all.len()];
    for (i, &b) in text.iter().enumerate().take(256) {
        if s.work_done() > cap {
            return;
        }
        if i < 8 {
            allowed.fill(true);
            s.check(&all, &mut allowed);
            // The mask and the matcher agree on the byte taken next.
            let ok = s.accept(b as u32).is_ok();
            assert!(!ok || allowed[b as usize], "accepted a masked byte {b}");
            if !ok {
                return;
            }
        } else if s.accept(b as u32).is_err() {
            return;
        }
    }
    // The text as a string, as `accepts_text` reads it.
    let mut s = GrammarState::new(g, pieces);
    for &b in String::from_utf8_lossy(text).as_bytes() {
        if s.work_done() > cap || !s.allows(b as u32) || s.accept(b as u32).is_err() {
            return;
        }
    }
    let _ = s.allows(256);
}

/// A state file (a slot's save, `--prompt-cache`) loaded into a small model's cache kept
/// in host memory: a sliding-window pair of stores (2 layers of K/V width 8, 16 and 8
/// cells) of 4 sequences, vocabulary 64. The first byte picks the cache types and
/// whether the file replaces the cache or one sequence.
pub fn state_file(data: &[u8]) {
    use crate::kv::KvType;
    use crate::memory::HostKvStore;
    let Some((&how, file)) = data.split_first() else {
        return;
    };
    let types = [KvType::F16, KvType::F32, KvType::Q8_0, KvType::Q4_0];
    let ty = types[(how & 3) as usize];
    let dst = (how & 4 != 0).then_some((how >> 3) as u32 % 4);
    let mut stores = [
        HostKvStore::new(16, ty, ty, 1, 32),
        HostKvStore::new(8, ty, ty, 1, 32),
    ];
    let before = stores.clone();
    match crate::context::state::state_into_host(file, [2, 32, 64], &mut stores, dst, 4) {
        Ok(saved) => {
            // Token ids of the vocabulary, or ids of positions input rows filled.
            let row = |t: u32| t & crate::batch::ROW_ID_BIT != 0;
            assert!(saved.tokens.iter().all(|&t| t < 64 || row(t)));
            for s in &stores {
                assert!(s.cells.used() <= s.cells.size());
            }
        }
        // A file that does not load leaves the cache as it was.
        Err(_) => {
            for (a, b) in stores.iter().zip(&before) {
                assert_eq!(
                    a.cells.cells(),
                    b.cells.cells(),
                    "a failed load changed the cells"
                );
            }
        }
    }
}

/// A request body at one of the generating endpoints (chosen by the first byte) read
/// into its requests with the model's tokenizer and template, grammars parsed.
#[cfg(all(feature = "server", not(target_arch = "wasm32")))]
pub fn server_request(data: &[u8], tok: &Tokenizer) {
    use crate::server::bodies::{default_settings, requests, Endpoint};
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    let endpoint = Endpoint::ALL[which as usize % Endpoint::ALL.len()];
    let _ = requests(endpoint, body, tok, &default_settings());
}

/// The micro models whose memories [`memory_state`] loads state into: a K/V cache, a
/// sliding-window pair, recurrent states and a hybrid (the checked-in GGUF seeds).
#[cfg(not(target_arch = "wasm32"))]
pub const MEMORY_STATE_MODELS: [&str; 4] = [
    "synth-llama-spm",
    "synth-gemma3-spm",
    "synth-mamba2-gpt2",
    "synth-lfm2-gpt2",
];

/// Sequences each [`memory_state`] context serves.
#[cfg(not(target_arch = "wasm32"))]
const MEMORY_STATE_SEQS: u32 = 2;

/// A context of each of [`MEMORY_STATE_MODELS`] on [`Gpu::host_only`], made once per
/// process (from `fuzz/seeds/gguf`).
#[cfg(not(target_arch = "wasm32"))]
fn memory_state_contexts() -> &'static std::sync::Mutex<Vec<Context>> {
    static CTXS: std::sync::OnceLock<std::sync::Mutex<Vec<Context>>> = std::sync::OnceLock::new();
    CTXS.get_or_init(|| {
        let gpu = Gpu::host_only().expect("the host-only device opens");
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/gguf");
        let ctxs = (MEMORY_STATE_MODELS.iter())
            .map(|name| {
                let f = GgufFile::open(dir.join(name)).expect("the micro model's seed reads");
                let model = Model::load(gpu.clone(), &f, &mut |_, _| {}).expect("it loads");
                let mut params = ContextParams::new(32, 8, 8);
                params.n_seq_max = MEMORY_STATE_SEQS;
                Context::new(Arc::new(model), params).expect("a context of it")
            })
            .collect();
        std::sync::Mutex::new(ctxs)
    })
}

/// A state file's tokens and memory part read through a real model's memory on
/// [`Gpu::host_only`]: the K/V cache, the sliding-window pair, recurrent states and the
/// hybrid of [`MEMORY_STATE_MODELS`] (the first byte's bits 0-1 pick one; bit 2 loads
/// one sequence, into sequence bit 3). The header (version 5, the model's shape and
/// fingerprint, no adapter) is written here, so the input is what follows it. A file
/// that loads is saved again and that loads too; one that does not leaves the memory as
/// it was (its saved bytes unchanged).
#[cfg(not(target_arch = "wasm32"))]
pub fn memory_state(data: &[u8]) {
    let _ = memory_state_load(data);
}

/// [`memory_state`]: the cells loaded, or why the file was refused.
#[cfg(not(target_arch = "wasm32"))]
pub fn memory_state_load(data: &[u8]) -> Result<usize, String> {
    let Some((&how, rest)) = data.split_first() else {
        return Err("empty".into());
    };
    let mut ctxs = memory_state_contexts()
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let ctx = &mut ctxs[(how & 3) as usize];
    let dst = (how & 4 != 0).then_some(((how >> 3) & 1) as u32);
    let mut file = memory_state_header(ctx);
    file.extend_from_slice(rest);
    let before = ctx.state_bytes(&[], None, &[]).expect("the memory saves");
    let loaded = match ctx.state_from_bytes(&file, "fuzz", dst) {
        Ok(saved) => {
            let (again, _) = ctx
                .state_bytes(&[], None, &[])
                .expect("a loaded memory saves");
            ctx.state_from_bytes(&again, "saved again", None)
                .expect("what was saved loads");
            Ok(saved.n_cells)
        }
        Err(e) => {
            let after = ctx.state_bytes(&[], None, &[]).expect("the memory saves");
            assert!(
                after == before,
                "a file that did not load changed the memory"
            );
            Err(e.to_string())
        }
    };
    let _ = ctx.seq_rm(None, -1, -1);
    let gpu = ctx.model.gpu.clone();
    gpu.queue.submit([]);
    let _ = gpu.sync();
    loaded
}

/// The state file header [`memory_state`] puts before its input for `ctx`'s model.
#[cfg(not(target_arch = "wasm32"))]
fn memory_state_header(ctx: &mut Context) -> Vec<u8> {
    let (bytes, _) = ctx.state_bytes(&[], None, &[]).expect("the memory saves");
    // Magic, version, shape (3), fingerprint, adapter count; the token count follows.
    bytes[..36].to_vec()
}

/// A seed for [`memory_state`] per model and per way of loading: a few tokens decoded
/// on both sequences (one shared prefix), saved, the header cut off.
#[cfg(not(target_arch = "wasm32"))]
pub fn memory_state_seeds() -> Vec<(String, Vec<u8>)> {
    let mut ctxs = memory_state_contexts()
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let mut out = Vec::new();
    for (i, ctx) in ctxs.iter_mut().enumerate() {
        let _ = ctx.seq_rm(None, -1, -1);
        // Sequence 0: four tokens; sequence 1: two (a recurrent memory keeps a state
        // per sequence, a K/V cache the cells).
        let batch = Batch {
            tokens: vec![3, 5, 7, 9, 3, 11],
            pos: vec![0, 1, 2, 3, 0, 1],
            seq: vec![1, 1, 1, 1, 2, 2],
            logits: vec![false, false, false, true, false, true],
            ..Default::default()
        };
        ctx.decode(&batch).expect("the seed's tokens decode");
        for (how, seq) in [(0u8, None), (4 | 8, Some(1))] {
            let (bytes, _) = ctx.state_bytes(&[3, 5, 7, 9], seq, &[]).expect("saves");
            let mut seed = vec![how | i as u8];
            seed.extend_from_slice(&bytes[36..]);
            let name = format!(
                "{}-{}",
                MEMORY_STATE_MODELS[i].trim_start_matches("synth-"),
                if seq.is_some() { "one-seq" } else { "whole" }
            );
            out.push((name, seed));
        }
        let _ = ctx.seq_rm(None, -1, -1);
    }
    out
}
