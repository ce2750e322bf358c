//! The vision encoder against llama.cpp's (tests/data/reference/README.md, "vision"):
//! the synthetic Gemma 3 mmproj written again here (its sha256 checked: the file llama.cpp
//! ran), the three test images through wgllm's preprocessing and GPU graph on every test
//! device, and the embeddings compared with the ones llama-mtmd-cli dumped; the graph
//! also against the f64 CPU reference, which tells the two kinds of difference apart.

mod common;

use sha2::{Digest, Sha256};
use std::path::PathBuf;
use wgllm::gguf::{GgmlType, GgufFile, Value};
use wgllm::model::synth::{synth_mmproj_gemma3, MmprojShape};
use wgllm::vision::reference::{encode_reference, Gelu};
use wgllm::vision::{decode_image, ClipHparams, VisionEncoder};

/// The mmproj llama.cpp encoded the images with (for a 256-wide language model).
const MMPROJ_SHA256: &str = "2801e03b299b77f1c703673003eef946a85cdec28157e1e28d9980b9b68ee590";
const IMAGES: [&str; 3] = ["square-224", "wide-300x180", "tall-100x150"];

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(rel)
}

fn mmproj(dir: &std::path::Path) -> PathBuf {
    let path = dir.join("mmproj-gemma3-tiny.gguf");
    synth_mmproj_gemma3(MmprojShape::tiny(), 256, GgmlType::F32)
        .write(&path)
        .unwrap();
    let sha = format!("{:x}", Sha256::digest(std::fs::read(&path).unwrap()));
    assert_eq!(
        sha, MMPROJ_SHA256,
        "the synthetic mmproj is not the file llama.cpp ran"
    );
    path
}

/// llama.cpp's MTMD_DEBUG_EMBEDDINGS file: tokens, width, rows.
fn dumped(path: &std::path::Path) -> (usize, usize, Vec<f32>) {
    let b = std::fs::read(path).unwrap();
    let n = i32::from_le_bytes(b[0..4].try_into().unwrap()) as usize;
    let w = i32::from_le_bytes(b[4..8].try_into().unwrap()) as usize;
    (n, w, bytemuck::pod_collect_to_vec(&b[8..]))
}

/// Relative RMS difference (the square root of llama.cpp's NMSE).
fn rel_rms(got: &[f32], want: &[f32]) -> f64 {
    common::nmse(got, want).sqrt()
}

fn image(name: &str) -> wgllm::vision::RgbImage {
    let path = data(&format!("vision/{name}.png"));
    decode_image(&std::fs::read(&path).unwrap(), &path.display().to_string()).unwrap()
}

/// Every device's embeddings of the three images equal llama.cpp's to a relative RMS of
/// 2e-4, and the f64 reference's to 1e-5; the reference with ggml's f16 GELU table
/// equals llama.cpp's to 3e-5: the difference from llama.cpp is that table, nothing of
/// the preprocessing or the graph.
#[test]
fn gemma3_embeddings_match_llamacpp() {
    let dir = common::scratch_dir("vision-gemma3");
    let path = mmproj(&dir);
    let f = GgufFile::open(&path).unwrap();
    let hp = ClipHparams::read(&f).unwrap();
    // The f64 references once per image (the input is the same on every device).
    let mut refs = std::collections::HashMap::new();
    for (name, gpu, _serial) in common::gpus() {
        let enc = VisionEncoder::load(gpu.clone(), path.to_str().unwrap()).unwrap();
        assert_eq!((enc.n_tokens(), enc.n_embd_out()), (16, 256));
        for img_name in IMAGES {
            let pixels = enc.preprocess(&image(img_name));
            let got = enc.encode_pixels(&pixels).unwrap();
            let (n, w, want) = dumped(&data(&format!("reference/vision/gemma3-{img_name}.bin")));
            assert_eq!((n, w), (16, 256), "{img_name}: the recording's shape");
            let exact = refs.entry(img_name).or_insert_with(|| {
                let table = encode_reference(&f, &hp, &pixels, Gelu::GgmlTable);
                let e_tab = rel_rms(&table, &want);
                assert!(
                    e_tab <= 3e-5,
                    "{img_name}: ggml's GELU table leaves {e_tab:e}"
                );
                encode_reference(&f, &hp, &pixels, Gelu::Exact)
            });
            let e_ref = rel_rms(&got, exact);
            assert!(
                e_ref <= 1e-5,
                "{name} {img_name}: {e_ref:e} from the CPU reference"
            );
            let e_cpp = rel_rms(&got, &want);
            assert!(e_cpp <= 2e-4, "{name} {img_name}: {e_cpp:e} from llama.cpp");
            eprintln!(
                "{name} {img_name}: {e_cpp:.2e} from llama.cpp, {e_ref:.2e} from the reference"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `wgllm image-embed` writes llama.cpp's dump layout, with the same embeddings; it
/// refuses a file that is not an image with the file's name and a non-zero exit.
#[test]
fn image_embed_writes_llamacpps_dump() {
    let dir = common::scratch_dir("vision-cli");
    let path = mmproj(&dir);
    let out = dir.join("wide.bin");
    let img = data("vision/wide-300x180.png");
    let (code, stdout, err) = common::wgllm(&[
        "image-embed",
        "--mmproj",
        path.to_str().unwrap(),
        "--image",
        img.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("16 tokens of 256"), "{stdout}");
    let (n, w, got) = dumped(&out);
    let (_, _, want) = dumped(&data("reference/vision/gemma3-wide-300x180.bin"));
    assert_eq!((n, w), (16, 256));
    assert!(rel_rms(&got, &want) <= 2e-4);
    let (code, _, err) = common::wgllm(&[
        "image-embed",
        "--mmproj",
        path.to_str().unwrap(),
        "--image",
        path.to_str().unwrap(),
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("is not an image"), "{err}");
    // The image flags stay refused, with the reason, where no image can go yet.
    let (code, _, err) = common::wgllm(&["run", "-m", "x.gguf", "--mmproj", "p.gguf"]);
    assert_ne!(code, 0);
    assert!(err.contains("image-embed"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Files that are not an mmproj wgllm runs are refused at load, each with its reason.
#[test]
fn unrunnable_mmproj_files_are_refused() {
    let dir = common::scratch_dir("vision-refusals");
    let gpu = common::gpus().next().unwrap().1.clone();
    let cases: [(&str, &str, Value, &str); 4] = [
        (
            "projector",
            "clip.projector_type",
            Value::String("idefics3".into()),
            "projector `idefics3` is not one wgllm runs yet",
        ),
        (
            "gelu",
            "clip.use_gelu",
            Value::Bool(false),
            "clip.use_gelu is not set",
        ),
        (
            "vision",
            "clip.has_vision_encoder",
            Value::Bool(false),
            "has no vision encoder",
        ),
        (
            "pool",
            "clip.vision.projector.scale_factor",
            Value::U32(3),
            "do not pool by 3",
        ),
    ];
    for (tag, key, value, want) in cases {
        let mut w = synth_mmproj_gemma3(MmprojShape::tiny(), 256, GgmlType::F32);
        w.set_meta(key, value);
        let path = dir.join(format!("{tag}.gguf"));
        w.write(&path).unwrap();
        let err = VisionEncoder::load(gpu.clone(), path.to_str().unwrap())
            .err()
            .unwrap_or_else(|| panic!("{tag}: loaded"))
            .to_string();
        assert!(
            err.contains(want) && err.contains(&format!("{tag}.gguf")),
            "{tag}: {err}"
        );
    }
    let mut w = synth_mmproj_gemma3(MmprojShape::tiny(), 256, GgmlType::F32);
    w.remove_tensor("v.blk.1.ffn_down.weight");
    let path = dir.join("missing.gguf");
    w.write(&path).unwrap();
    let err = VisionEncoder::load(gpu, path.to_str().unwrap())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("v.blk.1.ffn_down.weight is missing"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
