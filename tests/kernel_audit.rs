//! The kernel audit at load (`wgllm::tune::audit`): every matmul kernel the model's
//! graph dispatches, the output head's included, is checked on the device against the
//! CPU on sampled rows and against the portable kernels on every row, at a bound one
//! wrong row fails. Kernels broken on purpose (`Fault`: one row left unwritten, a partial
//! tile's tokens left unwritten, integer-dot products misplaced) are dropped where the
//! tuner chose them and refused where the user asked for them. A mixture's expert
//! products, the attention's heads and each device of a split are checked the same way.

mod common;

use std::sync::Arc;
use wgllm::gguf::GgufFile;
use wgllm::gpu::{Backend, Fault, Gpu, GpuOptions, KernelShape, KernelTuning};
use wgllm::kv::{KvChoice, KvType};
use wgllm::model::Model;
use wgllm::tune::audit::{audit, audit_attention, audit_part, settle, settle_part, Part};

fn smollm2_on(
    kernels: KernelShape,
    tuning: KernelTuning,
    fault: Option<Fault>,
) -> (GgufFile, Model) {
    let gpu = Gpu::new(&GpuOptions {
        backend: Backend::Vulkan,
        kernels,
        tuning,
        fault,
        ..Default::default()
    })
    .expect("the Vulkan test device");
    let f = GgufFile::open(std::path::Path::new(&common::smollm2())).unwrap();
    let model = Model::load(gpu, &f, &mut |_, _| {}).unwrap();
    (f, model)
}

/// The error of a settle that must fail.
fn refusal(r: Result<Arc<Gpu>, wgllm::gpu::GpuError>) -> String {
    match r {
        Ok(_) => panic!("a broken kernel the user asked for was not refused"),
        Err(e) => e.to_string(),
    }
}

/// No attention in a settle (the matmul tests): `audit_attention` has its own.
fn no_kv(_: &Gpu) -> Option<KvChoice> {
    None
}

fn asked(kernels: KernelShape, tuning: KernelTuning) -> GpuOptions {
    GpuOptions {
        kernels,
        tuning,
        ..Default::default()
    }
}

/// `gpu`'s kernels broken on purpose: refused where `--kernels gpu` asked for them (the
/// refusal naming each of `says`), dropped for the portable kernels where nobody did;
/// the device as settled.
fn refused_then_dropped(
    gpu: &Arc<Gpu>,
    f: &GgufFile,
    m: &Model,
    kv: &dyn Fn(&Gpu) -> Option<KvChoice>,
    says: &[&str],
) -> Arc<Gpu> {
    let forced = asked(KernelShape::Gpu, KernelTuning::default());
    let e = refusal(settle(gpu.clone(), &forced, f, &m.hp, &m.weights, kv));
    for s in says.iter().chain(&["asked for (--kernels gpu)"]) {
        assert!(e.contains(s), "{s}: {e}");
    }
    let auto = asked(KernelShape::Auto, KernelTuning::default());
    let settled = settle(gpu.clone(), &auto, f, &m.hp, &m.weights, kv).unwrap();
    assert_eq!(settled.kernels, KernelShape::Cpu);
    settled
}

/// Every kernel of the GPU-shaped path passes, the output head's (SmolLM2's is Q8_0
/// while its layers are Q4_1) and the prompt tiles' among them, and the device comes back
/// as it was.
#[test]
fn correct_kernels_pass_and_the_head_is_among_them() {
    let (f, m) = smollm2_on(KernelShape::Gpu, KernelTuning::default(), None);
    let rows = audit(&m.gpu, &f, &m.hp, &m.weights).unwrap();
    let names: Vec<String> = rows.iter().map(|r| r.kernel.to_string()).collect();
    for want in [
        "matmul_wg_Q4_1_tb1",
        "matmul_wg_Q8_0_tb1",
        "matmul_tile_Q8_0",
        "matmul_tile_Q4_1",
        "_glu_silu",
    ] {
        assert!(names.iter().any(|n| n.contains(want)), "{want}: {names:?}");
    }
    for r in &rows {
        assert!(r.passed(), "{}", r.describe());
        assert!(
            r.vs_portable.is_some(),
            "{}: compared with the portable kernels",
            r.kernel
        );
        assert!(r.vs_cpu.0 < 1e-4, "{}", r.describe());
    }
    let asked = asked(KernelShape::Gpu, KernelTuning::default());
    let settled = settle(m.gpu.clone(), &asked, &f, &m.hp, &m.weights, &no_kv).unwrap();
    assert!(Arc::ptr_eq(&settled, &m.gpu));
}

/// One row of each product left unwritten: refused where `--kernels gpu` asked for the
/// GPU-shaped kernels, dropped for the portable ones where nobody did.
#[test]
fn one_wrong_row_is_refused_or_dropped() {
    let (f, m) = smollm2_on(
        KernelShape::Gpu,
        KernelTuning::default(),
        Some(Fault::WrongRow),
    );
    let settled = refused_then_dropped(&m.gpu, &f, &m, &no_kv, &["matmul_wg_Q4_1_"]);
    // The portable kernels it falls back on are the reference: they pass.
    let rows = audit(&settled, &f, &m.hp, &m.weights).unwrap();
    assert!(rows.iter().all(|r| r.passed()));
}

/// The last, partial tile of a prompt's tokens left unwritten by the tiled matmul (69
/// tokens: a tile of 64 and one of 5 where tiles are 64 tokens wide; a 128-wide tile has
/// no edge before its last): those tiles fail, every other kernel passes.
#[test]
fn one_wrong_tile_edge_is_refused() {
    let (f, m) = smollm2_on(
        KernelShape::Gpu,
        KernelTuning::default(),
        Some(Fault::WrongTileEdge),
    );
    let rows = audit(&m.gpu, &f, &m.hp, &m.weights).unwrap();
    let mut edges = 0;
    for r in &rows {
        let name = r.kernel.to_string();
        let edge = name.starts_with("matmul_tile_") && name.ends_with("x64");
        edges += edge as usize;
        assert_eq!(r.passed(), !edge, "{}", r.describe());
    }
    assert!(edges > 0, "no 64-token tile was checked");
    let forced = asked(KernelShape::Gpu, KernelTuning::default());
    let e = refusal(settle(
        m.gpu.clone(),
        &forced,
        &f,
        &m.hp,
        &m.weights,
        &no_kv,
    ));
    assert!(
        e.contains("matmul_tile_") && e.contains("at 69 tokens"),
        "{e}"
    );
}

/// Integer-dot products misplaced: refused where `WGLLM_INT_DOT=1` asked for them,
/// dropped for the float kernels where the tuner had chosen them.
#[test]
fn wrong_integer_dot_products_are_refused_or_dropped() {
    let on = KernelTuning {
        int_dot: Some(true),
        ..Default::default()
    };
    let (f, m) = smollm2_on(KernelShape::Auto, on.clone(), Some(Fault::WrongIntDot));
    let e = refusal(settle(
        m.gpu.clone(),
        &asked(KernelShape::Auto, on),
        &f,
        &m.hp,
        &m.weights,
        &no_kv,
    ));
    assert!(
        e.contains("matmul_q8_") && e.contains("WGLLM_INT_DOT=1"),
        "{e}"
    );
    let tuned = KernelTuning {
        int_dot_decode: Some(true),
        int_dot_prompt: Some(true),
        ..Default::default()
    };
    let gpu = m.gpu.retuned(KernelShape::Auto, tuned);
    let auto = asked(KernelShape::Auto, KernelTuning::default());
    let settled = settle(gpu, &auto, &f, &m.hp, &m.weights, &no_kv).unwrap();
    assert_eq!(settled.tuning.int_dot, Some(false));
}

/// The attention a context runs, for every cache the test device serves: f16 and f32
/// plain and flash, quantized K and V (rotated, flash), on the portable and the
/// GPU-shaped kernels, with sinks; the CPU's attention over the same cache values agrees
/// within the row bound, at each token count.
#[test]
fn attention_paths_match_the_cpu_for_each_cache() {
    let (_, m) = smollm2_on(KernelShape::Auto, KernelTuning::default(), None);
    let caches = [
        (KvType::F16, KvType::F16, false, 0, 0),
        (KvType::F16, KvType::F16, true, 0, 0),
        (KvType::F32, KvType::F32, false, 0, 0),
        (KvType::Q8_0, KvType::Q8_0, true, 64, 64),
        (KvType::Q4_0, KvType::Q8_0, true, 64, 64),
    ];
    for kernels in [KernelShape::Cpu, KernelShape::Gpu] {
        let gpu = m.gpu.retuned(kernels, KernelTuning::default());
        for (type_k, type_v, flash, rot_k, rot_v) in caches {
            let kv = KvChoice {
                type_k,
                type_v,
                flash,
                rot_k,
                rot_v,
            };
            for sinks in [false, true] {
                let rows = audit_attention(&gpu, &m.hp, kv, sinks).unwrap();
                assert_eq!(rows.len(), 3, "{kernels:?} {kv:?}");
                for r in &rows {
                    assert!(r.passed(), "{kernels:?} sinks {sinks}: {}", r.describe());
                }
            }
        }
    }
}

/// A tiny Qwen3 mixture (16 experts of 64 rows, 4 a token) of Q8_0 weights, written to
/// a file (the audit reads the file's rows) and loaded on lavapipe.
fn tiny_moe_on(
    kernels: KernelShape,
    fault: Option<Fault>,
) -> (GgufFile, Model, std::path::PathBuf) {
    use wgllm::model::synth::{synth, SynthArch, WeightScale};
    let path = std::env::temp_dir().join(format!(
        "wgllm-audit-moe-{}-{:?}.gguf",
        std::process::id(),
        std::thread::current().id()
    ));
    let w = synth(
        SynthArch::Qwen3Moe,
        common::TINY,
        wgllm::gguf::GgmlType::Q8_0,
        common::tiny_vocab(),
        256,
        WeightScale::FanIn,
        false,
    );
    w.write(&path).unwrap();
    let gpu = Gpu::new(&GpuOptions {
        backend: Backend::Vulkan,
        kernels,
        fault,
        ..Default::default()
    })
    .expect("the Vulkan test device");
    let f = GgufFile::open(&path).unwrap();
    let model = Model::load(gpu, &f, &mut |_, _| {}).unwrap();
    (f, model, path)
}

/// The experts' products are checked as the graph runs them: each pair's rows on their
/// own at 1 and 5 tokens, grouped by expert into the prompt tiles at 69, on the
/// GPU-shaped and the portable kernels, against the CPU on every expert's sampled rows.
/// The grouped GPU tile broken on purpose (each chunk's last expert left unwritten) fails
/// while the other kernels pass, and is dropped for the portable kernels.
#[test]
fn expert_products_are_checked_and_a_wrong_expert_is_dropped() {
    for kernels in [KernelShape::Gpu, KernelShape::Cpu] {
        let (f, m, path) = tiny_moe_on(kernels, None);
        let rows = audit(&m.gpu, &f, &m.hp, &m.weights).unwrap();
        let names: Vec<&str> = rows.iter().map(|r| r.kernel.as_str()).collect();
        let grouped = match kernels {
            KernelShape::Gpu => "matmul_id_tile_Q8_0",
            _ => "matmul_id_rows_Q8_0",
        };
        for want in ["matmul_id_Q8_0", grouped] {
            assert!(
                names.iter().any(|n| n.starts_with(want)),
                "{want}: {names:?}"
            );
        }
        for r in rows.iter().filter(|r| r.kernel.starts_with("matmul_id")) {
            assert!(r.passed() && r.vs_cpu.0 < 1e-4, "{}", r.describe());
            assert!(r.weight.contains("exps"), "{}", r.weight);
        }
        drop(f);
        let _ = std::fs::remove_file(path);
    }
    let (f, m, path) = tiny_moe_on(KernelShape::Gpu, Some(Fault::WrongRow));
    let rows = audit(&m.gpu, &f, &m.hp, &m.weights).unwrap();
    let tile = (rows.iter())
        .find(|r| r.kernel.starts_with("matmul_id_tile_"))
        .expect("the grouped tile checked");
    assert!(!tile.passed() && tile.n_tok == 69, "{}", tile.describe());
    // A wrong expert fails against the CPU and against the portable kernels alike.
    assert!(
        tile.vs_cpu.0 > 0.1 && tile.vs_portable.unwrap().0 > 0.1,
        "{tile:?}"
    );
    let ids = (rows.iter())
        .find(|r| r.kernel == "matmul_id_Q8_0")
        .expect("the pairs' kernel checked");
    assert!(ids.passed(), "{}", ids.describe());
    let auto = asked(KernelShape::Auto, KernelTuning::default());
    let settled = settle(m.gpu.clone(), &auto, &f, &m.hp, &m.weights, &no_kv).unwrap();
    assert_eq!(settled.kernels, KernelShape::Cpu);
    drop(f);
    let _ = std::fs::remove_file(path);
}

/// The GPU flash attention with its last head left unwritten: its check fails at every
/// token count while the portable flash kernel passes; refused where `--kernels gpu`
/// asked for it, dropped for the portable kernels where nobody did.
#[test]
fn a_wrong_attention_head_is_refused_or_dropped() {
    let (f, m) = smollm2_on(
        KernelShape::Gpu,
        KernelTuning::default(),
        Some(Fault::WrongHead),
    );
    let kv = KvChoice {
        type_k: KvType::F16,
        type_v: KvType::F16,
        flash: true,
        rot_k: 0,
        rot_v: 0,
    };
    let rows = audit_attention(&m.gpu, &m.hp, kv, false).unwrap();
    assert_eq!(rows.len(), 3);
    for r in &rows {
        assert!(
            !r.passed() && r.kernel.starts_with("GPU flash"),
            "{}",
            r.describe()
        );
    }
    let portable = m.gpu.retuned(KernelShape::Cpu, KernelTuning::default());
    let rows = audit_attention(&portable, &m.hp, kv, false).unwrap();
    assert!(rows.iter().all(|r| r.passed()));
    let flash = |_: &Gpu| Some(kv);
    refused_then_dropped(&m.gpu, &f, &m, &flash, &["GPU flash attention"]);
}

/// A model split over two lavapipe devices, the second GPU-shaped with one row of each
/// fast kernel left unwritten: each device is checked on its own part (the output head,
/// Q8_0 in SmolLM2 where the layers are Q4_1, on the main device only), the broken one
/// fails and is settled on its own, the other passes as it is.
#[test]
fn each_device_of_a_split_is_checked_on_its_part() {
    let open = |kernels, fault| {
        Gpu::new(&GpuOptions {
            backend: Backend::Vulkan,
            kernels,
            fault,
            ..Default::default()
        })
        .expect("the Vulkan test device")
    };
    let main = open(KernelShape::Cpu, None);
    let broken = open(KernelShape::Gpu, Some(Fault::WrongRow));
    let f = GgufFile::open(std::path::Path::new(&common::smollm2())).unwrap();
    let n_layer = wgllm::model::Hparams::from_gguf(&f).unwrap().n_layer as usize;
    let p = wgllm::gpu::Placement::by_shares(vec![main, broken], 0, &[1.0, 1.0], n_layer).unwrap();
    let m = Model::load_placed(p, &f, &mut |_, _| {}).unwrap();
    let (main, broken) = (m.placement.gpus()[0].clone(), m.placement.gpus()[1].clone());
    let (on_main, on_broken) = (Part::of(&m.placement, 0), Part::of(&m.placement, 1));
    let rows = audit_part(&main, &f, &m.hp, &m.weights, &on_main).unwrap();
    assert!(
        rows.iter().any(|r| r.kernel.contains("Q8_0")),
        "the head on the main device"
    );
    assert!(rows.iter().all(|r| r.passed()));
    let rows = audit_part(&broken, &f, &m.hp, &m.weights, &on_broken).unwrap();
    assert!(!rows.is_empty() && rows.iter().all(|r| !r.kernel.contains("Q8_0")));
    assert!(rows.iter().any(|r| !r.passed()));
    let auto = asked(KernelShape::Auto, KernelTuning::default());
    let settled = settle_part(main.clone(), &auto, &f, &m.hp, &m.weights, &on_main, &no_kv);
    assert!(Arc::ptr_eq(&settled.unwrap(), &main));
    let settled = settle_part(
        broken.clone(),
        &auto,
        &f,
        &m.hp,
        &m.weights,
        &on_broken,
        &no_kv,
    )
    .unwrap();
    assert_eq!(settled.kernels, KernelShape::Cpu);
    let forced = asked(KernelShape::Gpu, KernelTuning::default());
    let e = refusal(settle_part(
        broken, &forced, &f, &m.hp, &m.weights, &on_broken, &no_kv,
    ));
    assert!(e.contains("asked for (--kernels gpu)"), "{e}");
}
