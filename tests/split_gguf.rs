//! Split GGUFs (llama-gguf-split's `NAME-0000K-of-0000N.gguf`) load as one model: the
//! first file brings in the others, and the model answers as the whole file does.

mod common;

use wgllm::gguf::{write_split, GgufFile};

#[test]
fn a_split_model_answers_like_the_whole_file() {
    let model = common::smollm2();
    let whole = GgufFile::open(&model).unwrap();
    let dir = common::scratch_dir("smol");
    let parts = write_split(&whole, &dir.join("smol"), 3).unwrap();
    assert_eq!(parts.len(), 3);
    assert!(parts[0].ends_with("smol-00001-of-00003.gguf"));
    let joined = GgufFile::open(&parts[0]).unwrap();
    assert_eq!(joined.tensors.len(), whole.tensors.len());
    for t in &whole.tensors {
        let j = joined.tensor(&t.name).unwrap();
        assert_eq!(joined.tensor_data(j), whole.tensor_data(t), "{}", t.name);
    }
    assert!(joined.tensors.iter().any(|t| t.part == 2));

    let run = |m: &str| {
        let (code, out, err) = common::wgllm(&[
            "run",
            "-m",
            m,
            "-p",
            "The capital of France is",
            "-n",
            "8",
            "--temp",
            "0",
        ]);
        assert_eq!(code, 0, "{err}");
        out
    };
    assert_eq!(run(parts[0].to_str().unwrap()), run(&model));

    // The second part alone, or a missing third: refused with what to do.
    let (code, _, err) = common::wgllm(&["run", "-m", parts[1].to_str().unwrap(), "-p", "x"]);
    assert_ne!(code, 0);
    assert!(err.contains("open the first part"), "{err}");
    std::fs::remove_file(&parts[2]).unwrap();
    let (code, _, err) = common::wgllm(&["run", "-m", parts[0].to_str().unwrap(), "-p", "x"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("part 3 of this split model is missing"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
