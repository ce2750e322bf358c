//! Every op on the GPU against its CPU reference, on random shapes, on each test backend.
//! Errors are normalized MSE, as in llama.cpp's test-backend-ops.

mod common;

use common::{gpus, small_binding_gpu, small_binding_gpu_with, Rng};
use wgllm::gguf::GgmlType;
use wgllm::gpu::{Backend, Gpu, GpuError, GpuOptions, KernelShape, KernelTuning};
use wgllm::kv::KvType;
use wgllm::ops::add_rms_norm::{add_rms_norm, add_rms_norm_ref};
use wgllm::ops::add_scaled::{add_scaled, add_scaled_ref, ScaledRows};
use wgllm::ops::attention::{
    attention_sinks_ref, attention_with, AttnShape, AttnViews, FlashKernel,
};
use wgllm::ops::binary::{binary, binary_ref, binary_rows, binary_rows_ref, BinaryOp};
use wgllm::ops::get_rows::{get_rows, get_rows_ref};
use wgllm::ops::glu::{glu, glu_pairs, glu_ref, Activation};
use wgllm::ops::hadamard::{hadamard, hadamard_ref};
use wgllm::ops::layer_norm::{layer_norm, layer_norm_ref};
use wgllm::ops::matmul::Kernel as MatmulKernel;
use wgllm::ops::matmul::{matmul, matmul_at, matmul_glu, matmul_ref, MatmulOut};
use wgllm::ops::matmul_q8::{
    matmul_q8, matmul_q8_ref, matmul_q8_with, q8_bytes, quantize_q8, quantize_q8_ref, Q8Blocks,
};
use wgllm::ops::matmul_q8::{Kernel as Q8Kernel, Q8_MATMUL_ROWS, Q8_MATMUL_TOKENS, Q8_TILES};
use wgllm::ops::moe::{
    matmul_id, matmul_id_ref, moe_add_id, moe_add_id_ref, moe_group, moe_route, moe_route_ref,
    moe_sum, moe_sum_ref, Gating, MoeRouting, Pairs,
};
use wgllm::ops::patches::{patches, patches_ref, PatchGrid};
use wgllm::ops::pixel_shuffle::{pixel_shuffle, pixel_shuffle_ref, GridShuffle};
use wgllm::ops::pool::{pool_rows, pool_rows_ref};
use wgllm::ops::pool_grid::{pool_grid, pool_grid_ref, GridPool};
use wgllm::ops::rms_norm::{rms_norm, rms_norm_ref};
use wgllm::ops::rope::{rope, rope_ref, RopeParams};
use wgllm::ops::rope_store::{rope_store, rope_store_ref, RopeStoreShape, RopeStoreViews};
use wgllm::ops::set_rows::{set_rows, set_rows_ref};
use wgllm::ops::softmax::{softmax_sinks, softmax_sinks_ref, SoftmaxParams};
use wgllm::ops::{nmse, run_now, KernelKey, View, Weight};
use wgllm::quant;

const WEIGHT_TYPES: [GgmlType; 16] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Bf16,
    GgmlType::Iq4Nl,
    GgmlType::Iq4Xs,
    GgmlType::Mxfp4,
];

/// A random row length for `ty`: 1 to `max_blocks` blocks of 32, or 1 or 2 blocks of 256
/// for the 256-weight formats.
fn n_cols(ty: GgmlType, rng: &mut Rng, max_blocks: u32) -> usize {
    if ty.block_size() > 32 {
        ty.block_size() * (1 + rng.below(2) as usize)
    } else {
        32 * (1 + rng.below(max_blocks) as usize)
    }
}

fn up_f32(gpu: &Gpu, data: &[f32]) -> View {
    View::whole(&gpu.upload("test", bytemuck::cast_slice(data)).unwrap())
}
fn up_u32(gpu: &Gpu, data: &[u32]) -> View {
    View::whole(&gpu.upload("test", bytemuck::cast_slice(data)).unwrap())
}
fn out_f32(gpu: &Gpu, n: usize) -> View {
    View::whole(&gpu.storage("out", n as u64 * 4).unwrap())
}
fn read(gpu: &Gpu, v: &View, n: usize) -> Vec<f32> {
    gpu.read_f32(&v.buf, 0, n).unwrap()
}

fn quantized(ty: GgmlType, rng: &mut Rng, n_cols: usize, n_rows: usize) -> Vec<u8> {
    (0..n_rows)
        .flat_map(|_| quant::quantize_row(ty, &rng.vec(n_cols)))
        .collect()
}

fn check(what: &str, reference: &[f32], actual: &[f32], max_err: f64) {
    let e = nmse(reference, actual);
    assert!(e <= max_err, "{what}: nmse {e:e} > {max_err:e}");
}

#[test]
fn get_rows_matches_reference() {
    let mut rng = Rng(1);
    for (name, gpu, _serial) in gpus() {
        for ty in WEIGHT_TYPES {
            let (n_cols, n_rows) = (n_cols(ty, &mut rng, 6), 1 + rng.below(40) as usize);
            let data = quantized(ty, &mut rng, n_cols, n_rows);
            let ids: Vec<u32> = (0..1 + rng.below(9))
                .map(|_| rng.below(n_rows as u32))
                .collect();
            let w = Weight::upload(gpu, "w", ty, n_cols, n_rows, &data).unwrap();
            let dst = out_f32(gpu, ids.len() * n_cols);
            let d = get_rows(gpu, &w, &up_u32(gpu, &ids), ids.len() as u32, &dst).unwrap();
            run_now(gpu, &d).unwrap();
            let want = get_rows_ref(ty, &data, n_cols, &ids);
            check(
                &format!("{name} get_rows {ty}"),
                &want,
                &read(gpu, &dst, want.len()),
                1e-12,
            );
        }
    }
}

#[test]
fn matmul_matches_reference() {
    let mut rng = Rng(2);
    let mut shared_x_loads = false;
    for (name, gpu, _serial) in gpus() {
        for ty in WEIGHT_TYPES {
            for n_tok in [1usize, 3, 8, 13, 70] {
                let key = wgllm::ops::matmul::kernel(gpu, ty, 64, n_tok as u32, None);
                shared_x_loads |= matches!(
                    key,
                    KernelKey::Matmul(MatmulKernel::CpuRows {
                        subgroups: true,
                        ..
                    })
                );
                let k = n_cols(ty, &mut rng, 8);
                let n = 1 + rng.below(150) as usize;
                let data = quantized(ty, &mut rng, k, n);
                let x = rng.vec(k * n_tok);
                let w = Weight::upload(gpu, "w", ty, k, n, &data).unwrap();
                let dst = out_f32(gpu, n * n_tok);
                let d = matmul(gpu, &w, &up_f32(gpu, &x), n_tok as u32, &dst).unwrap();
                run_now(gpu, &d).unwrap();
                let want = matmul_ref(ty, &data, k, n, &x, n_tok);
                check(
                    &format!("{name} matmul {ty} {k}x{n} T={n_tok}"),
                    &want,
                    &read(gpu, &dst, want.len()),
                    1e-9,
                );
            }
        }
    }
    // lavapipe has subgroups of 8: the CPU-shaped kernel that shares x's loads over a
    // subgroup must have been among those checked wherever a test device offers it.
    let offered = gpus().any(|(_, g, _)| {
        g.kernels != KernelShape::Gpu && g.has_subgroups && g.info.subgroup_size.0 >= 8
    });
    assert_eq!(shared_x_loads, offered, "subgroup-shared x loads checked");
}

#[test]
fn tensors_larger_than_a_binding_are_split() {
    // 8 KiB bindings: a 96 x 300 Q8_0 matrix (9 words per 32 weights, 32 KiB) needs 4+ chunks.
    let gpu = small_binding_gpu(8192);
    let mut rng = Rng(3);
    let (k, n, n_tok) = (96usize, 300usize, 5usize);
    let data = quantized(GgmlType::Q8_0, &mut rng, k, n);
    let w = Weight::upload(&gpu, "big", GgmlType::Q8_0, k, n, &data).unwrap();
    assert!(
        w.chunks.len() >= 4,
        "expected a split, got {} chunk(s)",
        w.chunks.len()
    );
    assert!(w.chunks.iter().all(|c| c.buf.size() <= 8192));
    let x = rng.vec(k * n_tok);
    let dst = out_f32(&gpu, n * n_tok);
    run_now(
        &gpu,
        &matmul(&gpu, &w, &up_f32(&gpu, &x), n_tok as u32, &dst).unwrap(),
    )
    .unwrap();
    check(
        "split matmul",
        &matmul_ref(GgmlType::Q8_0, &data, k, n, &x, n_tok),
        &read(&gpu, &dst, n * n_tok),
        1e-9,
    );
    let ids = [0u32, 299, 150, 31, 32];
    let rows = out_f32(&gpu, ids.len() * k);
    run_now(
        &gpu,
        &get_rows(&gpu, &w, &up_u32(&gpu, &ids), 5, &rows).unwrap(),
    )
    .unwrap();
    check(
        "split get_rows",
        &get_rows_ref(GgmlType::Q8_0, &data, k, &ids),
        &read(&gpu, &rows, 5 * k),
        1e-12,
    );
}

/// The GPU-shaped kernels on odd shapes: the tiled prompt matmul (64x64 tiles, and
/// 128x64 for matrices of 2048+ rows) with rows and tokens not multiples of the tile, and
/// the matrix-vector kernel for 1..7 tokens, on each backend.
#[test]
fn gpu_shaped_matmul_odd_shapes() {
    let mut rng = Rng(21);
    for (name, gpu, _serial) in gpus() {
        if gpu.kernels != KernelShape::Gpu {
            continue;
        }
        for ty in WEIGHT_TYPES {
            for (n, n_tok) in [(1usize, 9usize), (65, 64), (130, 129), (2100, 67), (70, 5)] {
                // One type is enough for the 128x64 tile (the loaders are shared).
                if n > 2048 && ty != GgmlType::Q4_1 {
                    continue;
                }
                let k = n_cols(ty, &mut rng, 6);
                let data = quantized(ty, &mut rng, k, n);
                let x = rng.vec(k * n_tok);
                let w = Weight::upload(gpu, "w", ty, k, n, &data).unwrap();
                let dst = out_f32(gpu, n * n_tok);
                let d = matmul(gpu, &w, &up_f32(gpu, &x), n_tok as u32, &dst).unwrap();
                run_now(gpu, &d).unwrap();
                let want = matmul_ref(ty, &data, k, n, &x, n_tok);
                check(
                    &format!("{name} gpu matmul {ty} {k}x{n} T={n_tok}"),
                    &want,
                    &read(gpu, &dst, want.len()),
                    1e-9,
                );
            }
        }
    }
}

/// The prompt matmul on cooperative matrices (`WGLLM_COOP_MATRIX=1`), against the float
/// reference, on every device that has the matrices it needs (a GPU; CI's software
/// devices have none, and the kernels are validated and translated offline there). On
/// every device: asked for where the matrices are missing, the tiled float kernel runs.
#[test]
fn cooperative_matrix_matmul_matches_reference() {
    let mut rng = Rng(61);
    let coop = KernelTuning {
        coop_matrix: Some(true),
        ..Default::default()
    };
    let mut ran = Vec::new();
    for (name, gpu, _serial) in gpus() {
        let g = gpu.retuned(KernelShape::Gpu, coop.clone());
        let key = wgllm::ops::matmul::kernel(&g, GgmlType::Q4_0, 256, 64, None);
        let Some(s) = g.coop_size else {
            assert!(
                matches!(key, KernelKey::Matmul(MatmulKernel::GpuTile { .. })),
                "{name}: {key}"
            );
            continue;
        };
        assert_eq!(
            key,
            KernelKey::Matmul(MatmulKernel::GpuCoop {
                ty: GgmlType::Q4_0,
                s
            }),
            "{name}"
        );
        ran.push(name);
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q8_0,
            GgmlType::Q4K,
            GgmlType::Q6K,
            GgmlType::F16,
        ] {
            for (k, n, n_tok) in [(256usize, 37usize, 33usize), (4096, 64, 64), (512, 100, 5)] {
                let data = quantized(ty, &mut rng, k, n);
                let x = rng.vec(k * n_tok);
                let w = Weight::upload(&g, "w", ty, k, n, &data).unwrap();
                let dst = out_f32(&g, n * n_tok);
                let d = matmul(&g, &w, &up_f32(&g, &x), n_tok as u32, &dst).unwrap();
                run_now(&g, &d).unwrap();
                let want = matmul_ref(ty, &data, k, n, &x, n_tok);
                // Weights and activations rounded to f16 (11 bits) before the products.
                check(
                    &format!("{name} coop {s} {ty} {k}x{n} T={n_tok}"),
                    &want,
                    &read(&g, &dst, want.len()),
                    1e-5,
                );
            }
        }
    }
    eprintln!("cooperative-matrix matmul run on: {ran:?}");
}

/// The GPU matrix-vector matmul at every rows-per-workgroup value (rows per invocation
/// 1 to 8, segments 1 to 4), reduced by subgroups and by the workgroup tree, plain and
/// with the fused GLU epilogue, for one token and for a small batch.
#[test]
fn gpu_vec_rows_match_reference() {
    let mut rng = Rng(41);
    for &rows in wgllm::ops::matmul::GPU_VEC_ROWS {
        for no_subgroups in [false, true] {
            let gpu = Gpu::new(&GpuOptions {
                backend: Backend::Vulkan,
                kernels: KernelShape::Gpu,
                no_subgroups,
                tuning: KernelTuning {
                    gpu_vec_rows: Some(rows),
                    ..Default::default()
                },
                ..Default::default()
            })
            .unwrap();
            let ty = if rows % 4 == 0 {
                GgmlType::Q4_0
            } else {
                GgmlType::Q6K
            };
            let k = n_cols(ty, &mut rng, 12);
            let n = 2 * (1 + rng.below(45) as usize);
            for n_tok in [1usize, 3] {
                let name =
                    format!("rows {rows} no_subgroups {no_subgroups} {ty} {k}x{n} T={n_tok}");
                let key = wgllm::ops::matmul::kernel(&gpu, ty, n as u32, n_tok as u32, None);
                assert!(
                    matches!(key, KernelKey::Matmul(MatmulKernel::GpuVec { .. })),
                    "{name}: {key}"
                );
                let data = quantized(ty, &mut rng, k, n);
                let x = rng.vec(k * n_tok);
                let w = Weight::upload(&gpu, "w", ty, k, n, &data).unwrap();
                let dst = out_f32(&gpu, n * n_tok);
                let xv = up_f32(&gpu, &x);
                run_now(&gpu, &matmul(&gpu, &w, &xv, n_tok as u32, &dst).unwrap()).unwrap();
                let want = matmul_ref(ty, &data, k, n, &x, n_tok);
                check(&name, &want, &read(&gpu, &dst, want.len()), 1e-9);
                // The same rows as interleaved (gate, up) pairs through the GLU epilogue.
                let (gate, up) = (
                    quantized(ty, &mut rng, k, n / 2),
                    quantized(ty, &mut rng, k, n / 2),
                );
                let wf = Weight::upload_fused(&gpu, "gate_up", ty, k, &[&gate, &up], true).unwrap();
                let glu_dst = out_f32(&gpu, n / 2 * n_tok);
                let pairs = out_f32(&gpu, n * n_tok);
                let d = matmul_glu(
                    &gpu,
                    &wf,
                    &xv,
                    n_tok as u32,
                    Activation::Silu,
                    &glu_dst,
                    &pairs,
                );
                run_now(&gpu, &d.unwrap()).unwrap();
                let want = glu_ref(
                    Activation::Silu,
                    &matmul_ref(ty, &gate, k, n / 2, &x, n_tok),
                    &matmul_ref(ty, &up, k, n / 2, &x, n_tok),
                );
                check(
                    &format!("{name} glu"),
                    &want,
                    &read(&gpu, &glu_dst, want.len()),
                    1e-9,
                );
            }
        }
    }
}

/// Both GPU-shaped matmuls over a weight split into chunks by a small binding limit.
#[test]
fn gpu_shaped_matmul_split_weights() {
    // 12 KiB bindings: 300 rows of 108 bytes (Q8_0) or 60 (Q4_1) make 3 or 2 chunks, while
    // the activations and the output of 9 tokens still fit one binding each.
    let gpu = small_binding_gpu_with(12288, KernelShape::Gpu);
    let mut rng = Rng(22);
    for ty in [GgmlType::Q8_0, GgmlType::Q4_1] {
        let (k, n) = (96usize, 300usize);
        let data = quantized(ty, &mut rng, k, n);
        let w = Weight::upload(&gpu, "big", ty, k, n, &data).unwrap();
        assert!(w.chunks.len() >= 2, "expected a split");
        for n_tok in [1usize, 5, 9] {
            let x = rng.vec(k * n_tok);
            let dst = out_f32(&gpu, n * n_tok);
            run_now(
                &gpu,
                &matmul(&gpu, &w, &up_f32(&gpu, &x), n_tok as u32, &dst).unwrap(),
            )
            .unwrap();
            check(
                &format!("split gpu matmul {ty} T={n_tok}"),
                &matmul_ref(ty, &data, k, n, &x, n_tok),
                &read(&gpu, &dst, n * n_tok),
                1e-9,
            );
        }
    }
}

/// (n, rows) of a norm test case: rows of up to 700, and every fourth case rows longer
/// than the 4096 values the norm kernels hold in registers (the re-reading path).
fn norm_shape(rng: &mut Rng, i: usize) -> (usize, usize) {
    let rows = 1 + rng.below(20) as usize;
    if i % 4 == 3 {
        (4097 + rng.below(3000) as usize, rows)
    } else {
        (1 + rng.below(700) as usize, rows)
    }
}

/// CPU-shaped kernels with their loops written out, as SwiftShader gets them: the norms
/// take one invocation per row there.
fn unrolled_cpu_gpu() -> &'static std::sync::Arc<Gpu> {
    static GPU: std::sync::OnceLock<std::sync::Arc<Gpu>> = std::sync::OnceLock::new();
    GPU.get_or_init(|| {
        Gpu::new(&GpuOptions {
            backend: Backend::Vulkan,
            kernels: KernelShape::Cpu,
            tuning: KernelTuning {
                unroll: Some(true),
                ..Default::default()
            },
            ..Default::default()
        })
        .unwrap()
    })
}

#[test]
fn add_rms_norm_matches_reference() {
    let mut rng = Rng(23);
    let extra = [("vulkan-unrolled", unrolled_cpu_gpu(), None)];
    for (name, gpu, _serial) in gpus().chain(extra) {
        for i in 0..4 {
            let (n, rows) = norm_shape(&mut rng, i);
            let a = rng.vec(n * rows);
            let b = rng.vec(n * rows);
            let w = rng.vec(n);
            let sum = out_f32(gpu, n * rows);
            let dst = out_f32(gpu, n * rows);
            let d = add_rms_norm(
                gpu,
                &up_f32(gpu, &a),
                &up_f32(gpu, &b),
                &up_f32(gpu, &w),
                &sum,
                &dst,
                n as u32,
                rows as u32,
                1e-5,
            )
            .unwrap();
            run_now(gpu, &[d]).unwrap();
            let (want_sum, want) = add_rms_norm_ref(&a, &b, &w, n, 1e-5);
            check(
                &format!("{name} add_rms_norm sum {n}x{rows}"),
                &want_sum,
                &read(gpu, &sum, n * rows),
                1e-12,
            );
            check(
                &format!("{name} add_rms_norm {n}x{rows}"),
                &want,
                &read(gpu, &dst, n * rows),
                1e-10,
            );
        }
    }
}

#[test]
fn rms_norm_matches_reference() {
    let mut rng = Rng(4);
    let extra = [("vulkan-unrolled", unrolled_cpu_gpu(), None)];
    for (name, gpu, _serial) in gpus().chain(extra) {
        for i in 0..4 {
            let (n, rows) = norm_shape(&mut rng, i);
            let x = rng.vec(n * rows);
            let w = rng.vec(n);
            let dst = out_f32(gpu, n * rows);
            let d = rms_norm(
                gpu,
                &up_f32(gpu, &x),
                &up_f32(gpu, &w),
                &dst,
                n as u32,
                rows as u32,
                1e-5,
            )
            .unwrap();
            run_now(gpu, &[d]).unwrap();
            check(
                &format!("{name} rms_norm {n}x{rows}"),
                &rms_norm_ref(&x, &w, n, 1e-5),
                &read(gpu, &dst, n * rows),
                1e-10,
            );
        }
    }
}

#[test]
fn layer_norm_matches_reference() {
    let mut rng = Rng(14);
    for (name, gpu, _serial) in gpus() {
        for i in 0..4 {
            let (n, rows) = norm_shape(&mut rng, i);
            // An offset and a spread per row: the mean must come out, and the variance
            // must be the deviations' (not the raw values').
            let x: Vec<f32> = (rng.vec(n * rows).iter().enumerate())
                .map(|(j, v)| v * (1.0 + (j / n) as f32) + 3.0 - (j / n) as f32)
                .collect();
            let (w, b) = (rng.vec(n), rng.vec(n));
            let dst = out_f32(gpu, n * rows);
            let (xv, wv, bv) = (up_f32(gpu, &x), up_f32(gpu, &w), up_f32(gpu, &b));
            let d = layer_norm(gpu, [&xv, &wv, &bv], &dst, n as u32, rows as u32, 1e-12).unwrap();
            run_now(gpu, &[d]).unwrap();
            check(
                &format!("{name} layer_norm {n}x{rows}"),
                &layer_norm_ref(&x, &w, &b, n, 1e-12),
                &read(gpu, &dst, n * rows),
                1e-10,
            );
        }
    }
}

/// A LoRA correction added in place at stacked (step 1, at an offset) and interleaved
/// (step 2) rows of a wider output; the rows it does not reach stay as they were.
#[test]
fn add_scaled_matches_reference() {
    let mut rng = Rng(16);
    for (name, gpu, _serial) in gpus() {
        for i in 0..6 {
            let step = 1 + (i % 2) as u32;
            let n = 1 + rng.below(300);
            let n_tok = 1 + rng.below(9);
            let span = (n - 1) * step + 1;
            let offset = rng.below(40);
            let stride = offset + span + rng.below(20);
            let p = ScaledRows {
                n,
                n_tok,
                stride,
                offset,
                step,
                scale: rng.f32() * 3.0,
            };
            let src = rng.vec((n * n_tok) as usize);
            let before = rng.vec((stride * n_tok) as usize);
            let dst = up_f32(gpu, &before);
            let d = add_scaled(gpu, &up_f32(gpu, &src), &dst, p).unwrap();
            run_now(gpu, &[d]).unwrap();
            let want = add_scaled_ref(&src, &before, p);
            let got = read(gpu, &dst, before.len());
            check(&format!("{name} add_scaled {p:?}"), &want, &got, 1e-12);
            // Outside the placed rows, the destination is exactly as before.
            let placed: std::collections::HashSet<usize> = (0..n_tok as usize)
                .flat_map(|t| {
                    (0..n as usize)
                        .map(move |j| t * stride as usize + offset as usize + j * step as usize)
                })
                .collect();
            for (k, (&g, &b)) in got.iter().zip(&before).enumerate() {
                if !placed.contains(&k) {
                    assert_eq!(g, b, "{name} add_scaled {p:?}: output {k} changed");
                }
            }
        }
        // A placement past the end of a row is refused, not written into the next row.
        let p = ScaledRows {
            n: 10,
            n_tok: 2,
            stride: 18,
            offset: 0,
            step: 2,
            scale: 1.0,
        };
        let (src, dst) = (up_f32(gpu, &[0.0; 20]), up_f32(gpu, &[0.0; 36]));
        assert!(add_scaled(gpu, &src, &dst, p).is_err());
        let wider = up_f32(gpu, &[0.0; 38]);
        assert!(add_scaled(gpu, &src, &wider, ScaledRows { stride: 19, ..p }).is_ok());
    }
}

/// Token grids of several row lengths pooled by cells of 1 to 4 (Gemma 3's 4 x 4 among
/// them), square and not; a grid that is not whole cells is refused.
#[test]
fn pool_grid_matches_reference() {
    let mut rng = Rng(29);
    for (name, gpu, _serial) in gpus() {
        for (i, k) in [1u32, 2, 4, 3, 4].into_iter().enumerate() {
            let g = GridPool {
                n: [1, 7, 64, 33, 96][i],
                nx: k * (1 + rng.below(5)),
                ny: k * (1 + rng.below(5)),
                k,
            };
            let src = rng.vec((g.n * g.nx * g.ny) as usize);
            let n = (g.n * g.out_rows()) as usize;
            let dst = out_f32(gpu, n);
            let d = pool_grid(gpu, &up_f32(gpu, &src), &dst, g).unwrap();
            run_now(gpu, &[d]).unwrap();
            let (got, want) = (read(gpu, &dst, n), pool_grid_ref(&src, g));
            assert_eq!(want.len(), n);
            // Same sums in the same order: equal but for the division's rounding.
            let err = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(err <= 1e-6, "{name} pool_grid {g:?}: max error {err}");
        }
        let g = GridPool {
            n: 4,
            nx: 6,
            ny: 8,
            k: 4,
        };
        let (src, dst) = (up_f32(gpu, &[0.0; 4 * 48]), out_f32(gpu, 4 * 4));
        let err = pool_grid(gpu, &src, &dst, g)
            .err()
            .expect("6 is not whole cells of 4");
        assert!(err.to_string().contains("not whole cells"), "{err}");
    }
}

/// Token grids of several row lengths folded by cells of 1 to 4 (SmolVLM's 4 among
/// them), whole cells and not (the rest padded with zeros), square and not: every value
/// is copied, so the device's output equals the reference exactly.
#[test]
fn pixel_shuffle_matches_reference() {
    let mut rng = Rng(31);
    for (name, gpu, _serial) in gpus() {
        for (i, s) in [1u32, 2, 4, 3, 4, 2].into_iter().enumerate() {
            let whole = i < 3;
            let g = GridShuffle {
                n: [1, 7, 64, 33, 96, 5][i],
                nx: s * (1 + rng.below(4)) + if whole { 0 } else { rng.below(s) },
                ny: s * (1 + rng.below(4)) + if whole { 0 } else { 1 + rng.below(s - 1) },
                s,
            };
            let src = rng.vec((g.n * g.nx * g.ny) as usize);
            let n = (g.out_width() * g.out_rows()) as usize;
            let dst = out_f32(gpu, n);
            let d = pixel_shuffle(gpu, &up_f32(gpu, &src), &dst, g).unwrap();
            run_now(gpu, &[d]).unwrap();
            let (got, want) = (read(gpu, &dst, n), pixel_shuffle_ref(&src, g));
            assert_eq!(want.len(), n, "{g:?}");
            assert_eq!(got, want, "{name} pixel_shuffle {g:?}");
        }
    }
}

/// The reference folds as ggml's reshapes and permutes do: a 4 x 2 grid of one-value
/// rows by cells of 2 gives cell (0, 0) rows 0, 1, 4, 5 and cell (1, 0) rows 2, 3, 6, 7.
#[test]
fn pixel_shuffle_reference_orders_cells_as_ggml() {
    let g = GridShuffle {
        n: 1,
        nx: 4,
        ny: 2,
        s: 2,
    };
    let src: Vec<f32> = (0..8).map(|v| v as f32).collect();
    assert_eq!(
        pixel_shuffle_ref(&src, g),
        [0.0, 1.0, 4.0, 5.0, 2.0, 3.0, 6.0, 7.0]
    );
    // A 3 x 1 grid pads to 4 x 2: the missing rows are zeros.
    let g = GridShuffle {
        n: 1,
        nx: 3,
        ny: 1,
        s: 2,
    };
    assert_eq!(
        pixel_shuffle_ref(&[1.0, 2.0, 3.0], g),
        [1.0, 2.0, 0.0, 0.0, 3.0, 0.0, 0.0, 0.0]
    );
}

/// Images of 1-3 planes cut into patches of several sides (SigLIP's 14, Qwen2.5-VL's 14,
/// idefics3's 16, small odd ones), grids from one patch to 6 x 6, wider than tall and taller
/// than wide, rows padded or not; an image that is not whole patches is refused.
#[test]
fn patches_match_reference() {
    let mut rng = Rng(17);
    for (name, gpu, _serial) in gpus() {
        for (i, patch) in [1u32, 2, 3, 14, 16, 5].into_iter().enumerate() {
            let g = PatchGrid {
                channels: 1 + (i as u32 % 3),
                height: patch * (1 + rng.below(6)),
                width: patch * (1 + rng.below(6)),
                patch,
                // Every other grid pads its rows (to whole blocks of 32, as a weight's).
                stride: (1 + (i as u32 % 3)) * patch * patch + (i as u32 % 2) * 7,
            };
            let img = rng.vec((g.channels * g.height * g.width) as usize);
            let n = g.out_len() as usize;
            let dst = out_f32(gpu, n);
            let d = patches(gpu, &up_f32(gpu, &img), &dst, g).unwrap();
            run_now(gpu, &[d]).unwrap();
            let want = patches_ref(&img, g);
            assert_eq!(want.len(), n);
            // A copy: every value exactly where the reference puts it.
            assert_eq!(read(gpu, &dst, n), want, "{name} patches {g:?}");
        }
        let g = PatchGrid {
            channels: 3,
            height: 28,
            width: 30,
            patch: 14,
            stride: 588,
        };
        let (img, dst) = (up_f32(gpu, &[0.0; 3 * 28 * 30]), out_f32(gpu, 3 * 28 * 30));
        let err = patches(gpu, &img, &dst, g)
            .err()
            .expect("30 is not whole patches of 14");
        assert!(err.to_string().contains("multiple of 14"), "{err}");
    }
}

#[test]
fn pool_rows_matches_reference() {
    let mut rng = Rng(15);
    for (name, gpu, _serial) in gpus() {
        for _ in 0..4 {
            let row_len = 1 + rng.below(700) as usize;
            // Runs of 1 to 40 rows after an empty one.
            let mut starts = vec![0u32, 0];
            for _ in 0..1 + rng.below(6) {
                let last = *starts.last().unwrap();
                starts.push(last + 1 + rng.below(40));
            }
            let n_rows = *starts.last().unwrap() as usize;
            let src = rng.vec(n_rows.max(1) * row_len);
            let n_runs = starts.len() - 1;
            let dst = out_f32(gpu, n_runs * row_len);
            let st = wgllm::ops::View::whole(
                &gpu.upload("starts", bytemuck::cast_slice(&starts)).unwrap(),
            );
            let d = pool_rows(
                gpu,
                &up_f32(gpu, &src),
                &st,
                &dst,
                row_len as u32,
                n_runs as u32,
            )
            .unwrap();
            run_now(gpu, &[d]).unwrap();
            check(
                &format!("{name} pool_rows {row_len} x {starts:?}"),
                &pool_rows_ref(&src, &starts, row_len),
                &read(gpu, &dst, n_runs * row_len),
                1e-10,
            );
        }
    }
}

#[test]
fn binary_and_glu_match_reference() {
    let mut rng = Rng(5);
    for (name, gpu, _serial) in gpus() {
        let (nb, rows) = (1 + rng.below(300) as usize, 1 + rng.below(9) as usize);
        let a: Vec<f32> = rng.vec(nb * rows).iter().map(|v| v * 4.0).collect();
        let b = rng.vec(nb);
        // Soft caps are positive (a cap of 0.5 to 1.5 bends most of a).
        let caps: Vec<f32> = b.iter().map(|v| v.abs() + 0.5).collect();
        for &op in BinaryOp::ALL {
            let b = if op == BinaryOp::Softcap { &caps } else { &b };
            let dst = out_f32(gpu, a.len());
            let d = binary(
                gpu,
                op,
                &up_f32(gpu, &a),
                &up_f32(gpu, b),
                &dst,
                a.len() as u32,
                nb as u32,
            )
            .unwrap();
            run_now(gpu, &[d]).unwrap();
            check(
                &format!("{name} {op:?}"),
                &binary_ref(op, &a, b),
                &read(gpu, &dst, a.len()),
                1e-12,
            );
            // One value of b per row of a.
            let dst = out_f32(gpu, a.len());
            let per_row = &b[..rows.min(b.len())];
            let row = a.len().div_ceil(per_row.len());
            let d = binary_rows(
                gpu,
                op,
                &up_f32(gpu, &a),
                &up_f32(gpu, per_row),
                &dst,
                a.len() as u32,
                row as u32,
            )
            .unwrap();
            run_now(gpu, &[d]).unwrap();
            check(
                &format!("{name} {op:?} per row"),
                &binary_rows_ref(op, &a, per_row, row),
                &read(gpu, &dst, a.len()),
                1e-12,
            );
        }
        let g: Vec<f32> = rng.vec(a.len()).iter().map(|v| v * 8.0).collect();
        for &act in Activation::ALL {
            let dst = out_f32(gpu, a.len());
            let d = glu(
                gpu,
                act,
                &up_f32(gpu, &g),
                &up_f32(gpu, &a),
                &dst,
                a.len() as u32,
            )
            .unwrap();
            run_now(gpu, &[d]).unwrap();
            check(
                &format!("{name} {act:?}"),
                &glu_ref(act, &g, &a),
                &read(gpu, &dst, a.len()),
                1e-10,
            );
        }
    }
}

#[test]
fn rope_matches_reference() {
    let mut rng = Rng(6);
    for (name, gpu, _serial) in gpus() {
        for neox in [false, true] {
            let head_dim = 8 * (1 + rng.below(16));
            let n_dims = if rng.below(2) == 0 {
                head_dim
            } else {
                head_dim / 2
            };
            let freq_base = [10000.0, 1e6][rng.below(2) as usize];
            let freq_scale = [1.0, 0.25][rng.below(2) as usize];
            let rp = RopeParams::new(head_dim, n_dims, neox, freq_base, freq_scale);
            let (n_head, n_tok) = (1 + rng.below(5) as usize, 1 + rng.below(7) as usize);
            let positions: Vec<f64> = (0..n_tok).map(|_| rng.below(40000) as f64).collect();
            let x = rng.vec(head_dim as usize * n_head * n_tok);
            let xv = up_f32(gpu, &x);
            let table = up_f32(gpu, bytemuck::cast_slice(&rp.table(&positions)));
            run_now(
                gpu,
                &[rope(gpu, &rp, &table, &xv, n_head as u32, n_tok as u32, false).unwrap()],
            )
            .unwrap();
            check(
                &format!("{name} rope {rp:?}"),
                &rope_ref(&rp, &x, n_head, &positions),
                &read(gpu, &xv, x.len()),
                1e-10,
            );
        }
    }
}

/// The K-shift: keys roped at p, then rotated in place in the cache by d, equal keys roped
/// at p + d (f32 cache exactly, f16 cache within its rounding).
#[test]
fn k_shift_equals_rope_at_shifted_position() {
    let mut rng = Rng(10);
    for (name, gpu, _serial) in gpus() {
        for f16 in kv_types(gpu) {
            for neox in [false, true] {
                let rp = RopeParams::new(64, 64, neox, 10000.0, 1.0);
                let (n_head_kv, cells) = (3usize, 50usize);
                let pos: Vec<f64> = (0..cells).map(|_| rng.below(4000) as f64).collect();
                let delta: Vec<f64> = (0..cells)
                    .map(|_| rng.below(3000) as f64 - 1500.0)
                    .collect();
                let k = rng.vec(64 * n_head_kv * cells);
                let roped = rope_ref(&rp, &k, n_head_kv, &pos);
                let (cache, _) = up_kv(gpu, &roped, f16);
                let table = up_f32(gpu, bytemuck::cast_slice(&rp.table(&delta)));
                run_now(
                    gpu,
                    &[rope(
                        gpu,
                        &rp,
                        &table,
                        &cache,
                        n_head_kv as u32,
                        cells as u32,
                        f16,
                    )
                    .unwrap()],
                )
                .unwrap();
                let shifted: Vec<f64> = pos.iter().zip(&delta).map(|(p, d)| p + d).collect();
                let want = rope_ref(&rp, &k, n_head_kv, &shifted);
                let got = if f16 {
                    let bytes = gpu
                        .read_bytes(&cache.buf, 0, want.len() as u64 * 2)
                        .unwrap();
                    let h: Vec<half::f16> = bytemuck::pod_collect_to_vec(&bytes);
                    h.iter().map(|x| x.to_f32()).collect()
                } else {
                    read(gpu, &cache, want.len())
                };
                let tol = if f16 { 1e-6 } else { 1e-10 };
                check(
                    &format!("{name} k-shift f16={f16} neox={neox}"),
                    &want,
                    &got,
                    tol,
                );
            }
        }
    }
}

/// Values rounded through f16, and their bytes (the f16 KV cache holds these).
fn f16_round(v: &[f32]) -> (Vec<f32>, Vec<u8>) {
    let h: Vec<half::f16> = v.iter().map(|&x| half::f16::from_f32(x)).collect();
    (
        h.iter().map(|x| x.to_f32()).collect(),
        bytemuck::cast_slice(&h).to_vec(),
    )
}

/// The KV element types a device supports: f32 always, f16 with shader-f16.
/// The plain cache type: f16 or f32.
fn kv(f16: bool) -> KvType {
    if f16 {
        KvType::F16
    } else {
        KvType::F32
    }
}

fn kv_types(gpu: &Gpu) -> Vec<bool> {
    if gpu.has_f16 {
        vec![false, true]
    } else {
        vec![false]
    }
}

/// Uploads cache contents as f32, or as f16 (returning the values it then holds).
fn up_kv(gpu: &Gpu, v: &[f32], f16: bool) -> (View, Vec<f32>) {
    up_cache(gpu, v, kv(f16))
}

/// Uploads cache contents in type `ty` (the CPU reference's encoding), returning the
/// values it then holds.
fn up_cache(gpu: &Gpu, v: &[f32], ty: KvType) -> (View, Vec<f32>) {
    let words = ty.encode(v);
    let buf = gpu.upload("kv", bytemuck::cast_slice(&words)).unwrap();
    (View::whole(&buf), ty.decode(&words))
}

/// The words of the first `n` values of a cache of type `ty`.
fn read_cache_words(gpu: &Gpu, v: &View, n: usize, ty: KvType) -> Vec<u32> {
    let bytes = gpu.read_bytes(&v.buf, 0, ty.row_bytes(n as u64)).unwrap();
    bytemuck::pod_collect_to_vec(&bytes)
}

#[test]
fn set_rows_matches_reference() {
    let mut rng = Rng(7);
    for (name, gpu, _serial) in gpus() {
        for f16 in kv_types(gpu) {
            let (row_len, cells) = (2 * (1 + rng.below(100) as usize), 20usize);
            let idx = [3u32, 17, 0, 9];
            let src = rng.vec(row_len * idx.len());
            let (dst, mut want) = up_kv(gpu, &rng.vec(row_len * cells), f16);
            let d = set_rows(
                gpu,
                &up_f32(gpu, &src),
                &up_u32(gpu, &idx),
                &dst,
                row_len as u32,
                idx.len() as u32,
                kv(f16),
            )
            .unwrap();
            run_now(gpu, &[d]).unwrap();
            let src = if f16 { f16_round(&src).0 } else { src };
            set_rows_ref(&mut want, &src, &idx, row_len);
            let got = if f16 {
                let bytes = gpu.read_bytes(&dst.buf, 0, want.len() as u64 * 2).unwrap();
                let h: Vec<half::f16> = bytemuck::pod_collect_to_vec(&bytes);
                h.iter().map(|x| x.to_f32()).collect()
            } else {
                read(gpu, &dst, want.len())
            };
            check(&format!("{name} set_rows f16={f16}"), &want, &got, 0.0);
        }
    }
}

/// A causal mask over n_kv cells for n_tok tokens at the end, some cells hidden.
fn random_mask(rng: &mut Rng, n_kv: usize, n_tok: usize) -> Vec<f32> {
    let mut m = vec![0.0f32; n_kv * n_tok];
    for t in 0..n_tok {
        for c in 0..n_kv {
            if c > n_kv - n_tok + t || rng.below(5) == 0 && c != n_kv - n_tok + t {
                m[t * n_kv + c] = f32::NEG_INFINITY;
            }
        }
    }
    m
}

#[test]
fn softmax_matches_reference() {
    let mut rng = Rng(8);
    for (name, gpu, _serial) in gpus() {
        let cases = [
            (0.0f32, 0.0f32, false),
            (8.0, 0.0, false),
            (0.0, 2.0, false),
            (0.0, 0.0, true),
        ];
        for (max_bias, softcap, with_sinks) in cases {
            let (n_kv, n_tok, n_head) = (
                1 + rng.below(300) as usize,
                1 + rng.below(6) as usize,
                1 + rng.below(12),
            );
            let n_kv = n_kv.max(n_tok);
            let sp = SoftmaxParams {
                scale: 0.125,
                max_bias,
                n_head,
                softcap,
            };
            let x: Vec<f32> = rng
                .vec(n_kv * n_tok * n_head as usize)
                .iter()
                .map(|v| v * 20.0)
                .collect();
            let mask = random_mask(&mut rng, n_kv, n_tok);
            let sinks = with_sinks.then(|| rng.vec(n_head as usize));
            let sinks_gpu = sinks.as_deref().map(|v| up_f32(gpu, v));
            let xv = up_f32(gpu, &x);
            run_now(
                gpu,
                &[softmax_sinks(
                    gpu,
                    &sp,
                    Some(&up_f32(gpu, &mask)),
                    sinks_gpu.as_ref(),
                    &xv,
                    n_kv as u32,
                    n_tok as u32,
                )
                .unwrap()],
            )
            .unwrap();
            let want = softmax_sinks_ref(&sp, &x, Some(&mask), sinks.as_deref(), n_kv, n_tok);
            check(
                &format!("{name} softmax bias {max_bias} softcap {softcap} sinks {with_sinks}"),
                &want,
                &read(gpu, &xv, x.len()),
                1e-10,
            );
        }
    }
}

/// Runs attention of shape `s` on random queries, a random cache of `cells` cells (f16 or
/// f32 as `s` says) and a random causal mask; returns how many dispatches it took, the CPU
/// reference and the GPU result.
fn attention_case(
    gpu: &Gpu,
    rng: &mut Rng,
    s: &AttnShape,
    sp: &SoftmaxParams,
    cells: usize,
) -> (usize, Vec<f32>, Vec<f32>) {
    attention_case_with(gpu, rng, s, sp, cells, FlashKernel::for_gpu(gpu))
}

/// [`attention_case`] with flash kernel `fk` where a flash kernel takes the attention.
fn attention_case_with(
    gpu: &Gpu,
    rng: &mut Rng,
    s: &AttnShape,
    sp: &SoftmaxParams,
    cells: usize,
    fk: FlashKernel,
) -> (usize, Vec<f32>, Vec<f32>) {
    let q = rng.vec((s.head_dim * s.n_head * s.n_tok) as usize);
    let kv_len = (s.head_dim * s.n_head_kv) as usize * cells;
    let (k_gpu, k) = up_cache(gpu, &rng.vec(kv_len), s.k_type);
    let (v_gpu, v) = up_cache(gpu, &rng.vec(kv_len), s.v_type);
    let mask = random_mask(rng, s.n_kv as usize, s.n_tok as usize);
    // Attention sinks (gpt-oss) one time in three, around the scores' size and above.
    let sinks: Option<Vec<f32>> = (rng.below(3) == 0).then(|| {
        rng.vec(s.n_head as usize)
            .iter()
            .map(|v| 1.0 + 2.0 * v)
            .collect()
    });
    let sinks_gpu = sinks.as_deref().map(|v| up_f32(gpu, v));
    let dst = out_f32(gpu, q.len());
    let io = AttnViews {
        q: &up_f32(gpu, &q),
        k: &k_gpu,
        v: &v_gpu,
        mask: &up_f32(gpu, &mask),
        scores: &out_f32(gpu, s.scores_len(gpu).unwrap() as usize),
        partials: &out_f32(gpu, s.partials_len(gpu) as usize),
        dst: &dst,
        sinks: sinks_gpu.as_ref(),
    };
    let d = attention_with(gpu, s, sp, &io, fk).unwrap();
    run_now(gpu, &d).unwrap();
    let want = attention_sinks_ref(s, sp, &q, &k, &v, &mask, sinks.as_deref());
    (d.len(), want, read(gpu, &dst, q.len()))
}

/// An attention shape for `n_tok` tokens over up to 600 more cells, with a head of
/// (head_dim, n_head, n_head_kv), and softmax parameters with ALiBi slopes every other
/// time and soft-capping every third (the split and flash kernels apply them themselves).
fn random_attention(
    rng: &mut Rng,
    (head_dim, n_head, n_head_kv): (u32, u32, u32),
    kv_f16: bool,
    n_tok: u32,
) -> (AttnShape, SoftmaxParams) {
    let s = AttnShape {
        head_dim,
        n_head,
        n_head_kv,
        n_tok,
        n_kv: n_tok + rng.below(600),
        k_type: kv(kv_f16),
        v_type: kv(kv_f16),
        flash: false,
        rot_k: 0,
        rot_v: 0,
    };
    let sp = SoftmaxParams {
        scale: 1.0 / (head_dim as f32).sqrt(),
        max_bias: [0.0, 8.0][rng.below(2) as usize],
        n_head,
        softcap: [0.0, 0.0, 1.5][rng.below(3) as usize],
    };
    (s, sp)
}

#[test]
fn attention_matches_reference() {
    let mut rng = Rng(9);
    for (name, gpu, _serial) in gpus() {
        // Head sizes of 16, 8, 64 and 20 vec4s (the last not a power of two: two vec4s
        // per lane in the split output kernel).
        let shapes = [(64u32, 9u32, 3u32), (32, 4, 4), (256, 4, 1), (80, 4, 2)];
        let cases = shapes.into_iter().flat_map(|s| {
            kv_types(gpu)
                .into_iter()
                .flat_map(move |f| [1u32, 5, 0].map(|t| (s, f, t)))
        });
        for ((head_dim, n_head, n_head_kv), kv_f16, n_tok) in cases {
            // 1 and 5 tokens (on GPU-shaped kernels: the output split over chunks of
            // cells, up to 5 chunks here), then 1..=20: both the one-token kernels and the
            // 4-token ones with a partial last group.
            let n_tok = if n_tok == 0 { 1 + rng.below(20) } else { n_tok };
            let (s, sp) = random_attention(&mut rng, (head_dim, n_head, n_head_kv), kv_f16, n_tok);
            // The cache is larger than the part read.
            let (_, want, got) = attention_case(gpu, &mut rng, &s, &sp, s.n_kv as usize + 5);
            check(&format!("{name} attention {s:?}"), &want, &got, 1e-10);
        }
    }
}

/// GPU-shaped kernels take prompts of 32 tokens or more through the tiled kernels: scores
/// by tiles of 64 cells x 64 tokens (tiles the mask hides whole are skipped), the softmax,
/// and the output by tiles of tokens and chunks of up to 256 cells, added up where there
/// are several. Heads of 16, 8, 32 and 20 vec4s (GQA 3:1, 1:1, 4:1, 2:1; the last not a
/// multiple of the score kernel's slices nor of its output lanes), f32 and f16 caches,
/// with and without ALiBi, over random causal masks with holes.
#[test]
fn tiled_attention_matches_reference() {
    let gpu = small_binding_gpu_with(128 << 20, KernelShape::Gpu);
    let mut rng = Rng(44);
    for (head_dim, n_head, n_head_kv) in [(64u32, 9u32, 3u32), (32, 4, 4), (128, 4, 1), (80, 4, 2)]
    {
        for kv_f16 in kv_types(&gpu) {
            // One chunk (no join), then tokens past one and two tiles over several chunks.
            for (n_tok, extra) in [
                (32u32, rng.below(200)),
                (65 + rng.below(60), 300),
                (130, 500),
            ] {
                let (mut s, sp) =
                    random_attention(&mut rng, (head_dim, n_head, n_head_kv), kv_f16, n_tok);
                s.n_kv = n_tok + extra;
                let (n, want, got) = attention_case(&gpu, &mut rng, &s, &sp, s.n_kv as usize + 5);
                let want_n = if s.n_kv > 256 { 4 } else { 3 };
                assert_eq!(n, want_n, "tiled dispatches: {s:?}");
                check(&format!("tiled attention {s:?} {sp:?}"), &want, &got, 1e-10);
            }
        }
    }
}

/// Attention whose scores (heads × tokens × cells) exceed a storage binding runs in passes
/// of fewer tokens: 64 KiB bindings, 4 heads × 256 cells = 4 KiB of scores per token, so
/// 40 tokens take three passes. A shape where one token's scores do not fit is an error.
#[test]
fn attention_over_a_binding_runs_in_passes() {
    for kernels in [KernelShape::Cpu, KernelShape::Gpu] {
        let gpu = small_binding_gpu_with(65536, kernels);
        let mut rng = Rng(31);
        let s = AttnShape {
            head_dim: 32,
            n_head: 4,
            n_head_kv: 1,
            n_tok: 40,
            n_kv: 256,
            k_type: kv(false),
            v_type: kv(false),
            flash: false,
            rot_k: 0,
            rot_v: 0,
        };
        assert_eq!(
            s.tokens_per_pass(&gpu).unwrap(),
            16,
            "three passes of up to 16 tokens"
        );
        let sp = SoftmaxParams {
            scale: 1.0 / (s.head_dim as f32).sqrt(),
            max_bias: 0.0,
            n_head: s.n_head,
            softcap: 0.0,
        };
        let (n_dispatches, want, got) =
            attention_case(&gpu, &mut rng, &s, &sp, s.n_kv as usize + 5);
        // Per pass: scores, softmax, and the output in one dispatch (or, on GPU-shaped
        // kernels, the split kernel with the softmax inside and the sum of its two chunks
        // of 128 cells).
        let per_pass = 3;
        assert_eq!(n_dispatches, 3 * per_pass, "{kernels:?}: three passes");
        check(
            &format!("attention in passes, {kernels:?} kernels"),
            &want,
            &got,
            1e-10,
        );
        let too_wide = AttnShape { n_kv: 8192, ..s };
        let e = too_wide.tokens_per_pass(&gpu).unwrap_err().to_string();
        assert!(e.contains("smaller context"), "{e}");
    }
}

/// A GPU-shaped device that takes the flash attention kernel, with bindings of `binding`
/// bytes where given.
fn flash_gpu(binding: Option<u64>) -> std::sync::Arc<Gpu> {
    Gpu::new(&GpuOptions {
        backend: Backend::Vulkan,
        kernels: KernelShape::Gpu,
        max_binding_override: binding,
        tuning: KernelTuning {
            attn_flash: Some(true),
            ..Default::default()
        },
        ..Default::default()
    })
    .unwrap()
}

/// The flash kernel against the reference: heads of 16, 8 and 20 vec4s (GQA 3:1, 1:1,
/// 2:1), f32 and f16 caches, with and without ALiBi, 1 to 56 tokens (partial tiles of
/// 16 tokens and 16 cells), over all cells or split into chunks of 128, over random
/// causal masks with holes.
#[test]
fn flash_attention_matches_reference() {
    let gpu = flash_gpu(None);
    let mut rng = Rng(42);
    for (head_dim, n_head, n_head_kv) in [(64u32, 9u32, 3u32), (32, 4, 4), (80, 4, 2)] {
        for kv_f16 in kv_types(&gpu) {
            for n_tok in [1u32, 5, 16, 17 + rng.below(40)] {
                let head = (head_dim, n_head, n_head_kv);
                let (s, sp) = random_attention(&mut rng, head, kv_f16, n_tok);
                let (n, want, got) = attention_case(&gpu, &mut rng, &s, &sp, s.n_kv as usize + 5);
                // Over more than 128 cells the flash kernel splits them into chunks of 128
                // and joins them.
                let want_n = if s.n_kv > 128 { 2 } else { 1 };
                assert_eq!(n, want_n, "flash dispatches: {s:?}");
                check(&format!("flash attention {s:?} {sp:?}"), &want, &got, 1e-10);
            }
        }
    }
}

/// The f16-tile flash kernel (attn_flash_coop.wgsl) against the reference: with its
/// products as loops on every device with shader-f16, and on cooperative matrices where a
/// device has the 16 x 16 ones. Heads of 16, 8, 20 and 32 vec4s (the 20-value head of 5
/// vec4s padded to a 32-value matrix side), GQA 3:1, 1:1, 2:1 and 4:1, f32, f16 and Q8_0
/// caches, with and without ALiBi, 1 to 56 tokens, over all cells or chunks of 128.
#[test]
fn f16_tile_flash_attention_matches_reference() {
    let mut rng = Rng(62);
    let mut ran = Vec::new();
    for (name, gpu, _serial) in gpus() {
        if !gpu.has_f16 || name.starts_with("gl") {
            continue;
        }
        let g = gpu.retuned(
            KernelShape::Gpu,
            KernelTuning {
                attn_flash: Some(true),
                coop_matrix: Some(true),
                ..Default::default()
            },
        );
        let mut kernels = vec![FlashKernel::Coop { mma: false }];
        if g.coop_size == Some(16) {
            assert_eq!(FlashKernel::for_gpu(&g), FlashKernel::Coop { mma: true });
            kernels.push(FlashKernel::Coop { mma: true });
        } else {
            assert_eq!(FlashKernel::for_gpu(&g), FlashKernel::Plain, "{name}");
        }
        for fk in kernels {
            ran.push(format!("{name} {fk:?}"));
            let shapes = [
                (64u32, 9u32, 3u32),
                (32, 4, 4),
                (80, 4, 2),
                (20, 2, 2),
                (128, 8, 2),
            ];
            for (i, head) in shapes.into_iter().enumerate() {
                for n_tok in [1u32, 5, 16, 17 + rng.below(40)] {
                    let (mut s, sp) = random_attention(&mut rng, head, i % 2 == 1, n_tok);
                    if i == 2 {
                        (s.k_type, s.v_type) = (KvType::Q8_0, KvType::Q8_0);
                    }
                    let cells = s.n_kv as usize + 5;
                    let (n, want, got) = attention_case_with(&g, &mut rng, &s, &sp, cells, fk);
                    let want_n = if s.n_kv > 128 { 2 } else { 1 };
                    assert_eq!(n, want_n, "flash dispatches: {s:?}");
                    // Q, K, V and the softmax's weights rounded to f16 (11 bits).
                    let what = format!("{name} {fk:?} flash attention {s:?} {sp:?}");
                    check(&what, &want, &got, 1e-5);
                }
            }
        }
    }
    assert!(
        !ran.is_empty(),
        "no device with shader-f16 ran the f16-tile flash kernel"
    );
    eprintln!("f16-tile flash attention run on: {ran:?}");
}

/// Flash attention on CPU-shaped kernels (attn_flash_rows.wgsl, what `-fa on` takes on
/// lavapipe and llvmpipe) against the reference of the unfused path: heads of 64, 32,
/// 256, 80 and 128 values (GQA 3, 1, 4, 2 and 8), 1 to 64 tokens (one token per
/// invocation, groups of four with a partial last one), caches larger than the part
/// read, with and without ALiBi, random causal masks with holes, on Vulkan and GL, f32
/// and f16 caches; and prompts of 64 tokens over 4096 cells and of 256 tokens with heads
/// of 256 over 520 (chunked for lavapipe's loop limit). Always two dispatches:
/// the kernel over chunks of cells, and their join.
#[test]
fn cpu_flash_attention_matches_reference() {
    let mut rng = Rng(45);
    let heads = [
        (64u32, 9u32, 3u32),
        (32, 4, 4),
        (256, 4, 1),
        (80, 4, 2),
        (128, 8, 1),
    ];
    for (name, gpu, _serial) in gpus() {
        if gpu.kernels == KernelShape::Gpu {
            continue;
        }
        for head in heads {
            for kv_f16 in kv_types(gpu) {
                for n_tok in [1u32, 5, 17 + rng.below(48)] {
                    let (mut s, sp) = random_attention(&mut rng, head, kv_f16, n_tok);
                    s.flash = true;
                    let (n, want, got) =
                        attention_case(gpu, &mut rng, &s, &sp, s.n_kv as usize + 5);
                    assert_eq!(n, 2, "{name}: flash dispatches: {s:?}");
                    check(&format!("{name} flash {s:?} {sp:?}"), &want, &got, 1e-10);
                }
            }
        }
        if name == "vulkan" {
            // Deep, and more loop trips than lavapipe lets one invocation take (it stops
            // loops after 65535: heads of 256 went wrong past ~480 cells an invocation).
            for (head, n_tok, n_kv) in [((64, 8, 1), 64, 4096), ((256, 4, 1), 256, 520)] {
                let (mut s, sp) = random_attention(&mut rng, head, true, n_tok);
                (s.n_kv, s.flash) = (n_kv, true);
                let (_, want, got) = attention_case(gpu, &mut rng, &s, &sp, n_kv as usize);
                check(&format!("{name} deep flash {s:?}"), &want, &got, 1e-10);
            }
        }
    }
}

/// The flash kernel keeps each pass's mask within a binding: 64 KiB bindings and 1024
/// cells (4 KiB of mask per token) take 16 tokens a pass, so 40 tokens take three
/// passes, and the result is the reference's, on either cache type.
#[test]
fn flash_attention_runs_in_passes_when_the_mask_exceeds_a_binding() {
    let gpu = flash_gpu(Some(65536));
    let mut rng = Rng(43);
    for kv_f16 in kv_types(&gpu) {
        // The cache, 1024 cells of one 16-value head, fills one binding in f32.
        let s = AttnShape {
            head_dim: 16,
            n_head: 2,
            n_head_kv: 1,
            n_tok: 40,
            n_kv: 1024,
            k_type: kv(kv_f16),
            v_type: kv(kv_f16),
            flash: false,
            rot_k: 0,
            rot_v: 0,
        };
        let sp = SoftmaxParams {
            scale: 0.125,
            max_bias: 0.0,
            n_head: s.n_head,
            softcap: 0.0,
        };
        // The split path's scores (8 KiB a token) would take 8 tokens a pass.
        assert_eq!(s.tokens_per_pass(&gpu).unwrap(), 8);
        let (n_dispatches, want, got) = attention_case(&gpu, &mut rng, &s, &sp, 1024);
        // Three passes, each the flash kernel over chunks of cells and their join.
        assert_eq!(n_dispatches, 3 * 2, "flash in passes of 16 tokens");
        check(
            &format!("flash attention in passes f16={kv_f16}"),
            &want,
            &got,
            1e-10,
        );
    }
}

/// GPU-shaped kernels split the attention output over chunks of cells; where the partial
/// sums of every chunk would not fit (64 KiB bindings here: 20 tokens × 8 heads × 16 dims
/// and a (max, sum) pair per chunk allow 5 chunks, 1024 cells want 8), the chunks grow
/// instead (4 of 256 cells), and the result is the same.
#[test]
fn split_attention_chunks_grow_to_fit_the_partials() {
    let gpu = small_binding_gpu_with(65536, KernelShape::Gpu);
    let mut rng = Rng(41);
    let s = AttnShape {
        head_dim: 16,
        n_head: 8,
        n_head_kv: 1,
        n_tok: 20,
        n_kv: 1024,
        k_type: kv(false),
        v_type: kv(false),
        flash: false,
        rot_k: 0,
        rot_v: 0,
    };
    let sp = SoftmaxParams {
        scale: 0.25,
        max_bias: 0.0,
        n_head: s.n_head,
        softcap: 0.0,
    };
    // Partials and (max, sum) pairs of 4 chunks (not 8 of 128 cells, which would not fit
    // a binding).
    assert_eq!(s.partials_len(&gpu), 4 * 20 * 8 * (16 + 2));
    let (_, want, got) = attention_case(&gpu, &mut rng, &s, &sp, s.n_kv as usize);
    check("split attention with grown chunks", &want, &got, 1e-10);
}

/// A decoded token over a deep cache on GPU-shaped kernels: more chunks than the join
/// takes a step at a time (8) with a partial last one, and chunks of more cells than a
/// step of the split kernel covers; heads of 32 (two groups of lanes) and 20 vec4s (two
/// vec4s per lane), f16 and f32 caches, with and without ALiBi.
#[test]
fn split_attention_over_many_chunks() {
    let gpu = small_binding_gpu_with(128 << 20, KernelShape::Gpu);
    let mut rng = Rng(47);
    for (head_dim, n_head, n_head_kv) in [(128u32, 4u32, 2u32), (80, 2, 1)] {
        for kv_f16 in kv_types(&gpu) {
            for n_tok in [1u32, 3] {
                let (mut s, sp) =
                    random_attention(&mut rng, (head_dim, n_head, n_head_kv), kv_f16, n_tok);
                s.n_kv = 1100 + rng.below(1000);
                let (_, want, got) = attention_case(&gpu, &mut rng, &s, &sp, s.n_kv as usize);
                check(&format!("split attention {s:?}"), &want, &got, 1e-10);
            }
        }
    }
}

/// The tuning overrides reach the kernels, and the variants they pick (other matmul tiles
/// and row counts, other attention tokens per invocation, no split) match the reference.
#[test]
fn tuned_kernels_match_reference() {
    let mut rng = Rng(31);
    let cases = [
        (
            KernelShape::Cpu,
            KernelTuning {
                matmul_tile: Some((8, 16)),
                attn_tb: Some(8),
                ..Default::default()
            },
        ),
        (
            KernelShape::Cpu,
            KernelTuning {
                matmul_tile: Some((1, 2)),
                attn_tb: Some(2),
                ..Default::default()
            },
        ),
        // Loops written out, as on SwiftShader (lavapipe unrolls by itself otherwise),
        // with the tiles that go with them.
        (
            KernelShape::Cpu,
            KernelTuning {
                unroll: Some(true),
                ..Default::default()
            },
        ),
        (
            KernelShape::Gpu,
            KernelTuning {
                gpu_vec_rows: Some(32),
                tile_min: Some(16),
                gpu_tile: Some((64, 64)),
                attn_split_max_tok: Some(1),
                attn_split_chunk: Some(48),
                ..Default::default()
            },
        ),
        // One invocation per cell for the scores (attn_kq.wgsl, not the lanes kernel).
        (
            KernelShape::Gpu,
            KernelTuning {
                gpu_vec_rows: Some(1),
                attn_tb: Some(1),
                attn_kq_lanes: Some(false),
                ..Default::default()
            },
        ),
        // 8x8 accumulators per invocation, over partial rows and tokens.
        (
            KernelShape::Gpu,
            KernelTuning {
                tile_min: Some(16),
                gpu_tile: Some((128, 128)),
                ..Default::default()
            },
        ),
    ];
    for (kernels, tuning) in cases {
        let gpu = Gpu::new(&GpuOptions {
            backend: Backend::Vulkan,
            kernels,
            tuning: tuning.clone(),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(gpu.tuning, tuning);
        assert_eq!(
            gpu.unroll,
            tuning.unroll.unwrap_or(false),
            "lavapipe keeps no loops"
        );
        let name = format!("{kernels:?} {tuning:?}");
        for n_tok in [1usize, 5, 12, 20] {
            let ty = GgmlType::Q4_1;
            let (k, n) = (96, 70);
            let data = quantized(ty, &mut rng, k, n);
            let x = rng.vec(k * n_tok);
            let w = Weight::upload(&gpu, "w", ty, k, n, &data).unwrap();
            let dst = out_f32(&gpu, n * n_tok);
            let d = matmul(&gpu, &w, &up_f32(&gpu, &x), n_tok as u32, &dst).unwrap();
            run_now(&gpu, &d).unwrap();
            let want = matmul_ref(ty, &data, k, n, &x, n_tok);
            check(
                &format!("{name} matmul T={n_tok}"),
                &want,
                &read(&gpu, &dst, want.len()),
                1e-9,
            );
        }
        // The CPU-shaped flash kernel too where the loops are written out.
        let flash = [false, gpu.unroll];
        for (n_tok, flash) in [1u32, 6].into_iter().flat_map(|t| flash.map(|f| (t, f))) {
            let s = AttnShape {
                head_dim: 64,
                n_head: 4,
                n_head_kv: 2,
                n_tok,
                n_kv: n_tok + 300,
                k_type: kv(gpu.has_f16),
                v_type: kv(gpu.has_f16),
                flash,
                rot_k: 0,
                rot_v: 0,
            };
            let sp = SoftmaxParams {
                scale: 0.125,
                max_bias: 0.0,
                n_head: 4,
                softcap: 0.0,
            };
            let (_, want, got) = attention_case(&gpu, &mut rng, &s, &sp, s.n_kv as usize);
            check(&format!("{name} attention {s:?}"), &want, &got, 1e-10);
        }
    }
}

/// A kernel variant outside `KernelKey::all()` and a tuning value outside the variant
/// space are clear errors, not panics or driver failures.
#[test]
fn unknown_variants_are_refused() {
    let (_, gpu, _serial) = gpus().next().expect("a test GPU");
    for key in [
        // A shape the ops never ask for.
        KernelKey::Softmax(wgllm::ops::softmax::Kernel {
            shape: KernelShape::Auto,
        }),
        KernelKey::GetRows(wgllm::ops::get_rows::Kernel { ty: GgmlType::Q8K }),
        KernelKey::Matmul(MatmulKernel::GpuVec {
            ty: GgmlType::Q4_0,
            tb: 2,
            rows: 4,
            subgroups: false,
            glu: None,
        }),
        // The fused GLU epilogue pairs rows inside a workgroup: odd rows have no variant.
        KernelKey::Matmul(MatmulKernel::GpuVec {
            ty: GgmlType::Q4_0,
            tb: 1,
            rows: 1,
            subgroups: false,
            glu: Some(wgllm::ops::glu::Activation::Silu),
        }),
    ] {
        match gpu.pipeline(key) {
            Err(GpuError::Shader { name, msg }) => {
                assert_eq!(name, key.to_string());
                assert!(msg.contains("KernelKey::all()"), "{msg}");
            }
            other => panic!("{key}: expected a refusal, got {:?}", other.map(|_| ())),
        }
    }
    let bad = GpuOptions {
        backend: Backend::Vulkan,
        tuning: KernelTuning {
            gpu_vec_rows: Some(3),
            ..Default::default()
        },
        ..Default::default()
    };
    let e = Gpu::new(&bad).err().expect("tuning with 3 rows refused");
    assert!(e.to_string().contains("WGLLM_GPU_VEC"), "{e}");
}

/// Heads larger than any split output kernel variant fall back to the one-pass kernel.
#[test]
fn attention_with_heads_beyond_the_split_variants() {
    let mut rng = Rng(33);
    for (name, gpu, _serial) in gpus() {
        if gpu.kernels != KernelShape::Gpu {
            continue;
        }
        let s = AttnShape {
            head_dim: wgllm::ops::attention::MAX_SPLIT_HEAD_DIM + 4,
            n_head: 1,
            n_head_kv: 1,
            n_tok: 1,
            n_kv: 300,
            k_type: kv(false),
            v_type: kv(false),
            flash: false,
            rot_k: 0,
            rot_v: 0,
        };
        let sp = SoftmaxParams {
            scale: 0.02,
            max_bias: 0.0,
            n_head: 1,
            softcap: 0.0,
        };
        let (n, want, got) = attention_case(gpu, &mut rng, &s, &sp, 300);
        assert_eq!(n, 3, "{name}: scores, softmax and the one-pass output");
        check(&format!("{name} attention {s:?}"), &want, &got, 1e-10);
    }
}

/// Reads an f16 or f32 cache back as f32.
fn read_kv(gpu: &Gpu, v: &View, n: usize, f16: bool) -> Vec<f32> {
    kv(f16).decode(&read_cache_words(gpu, v, n, kv(f16)))
}

/// The fused rope_store (per-head norms, RoPE of Q and K, K and V rows into their cells)
/// against the unfused CPU references: rms_norm, rope and set_rows one after another.
#[test]
fn rope_store_matches_unfused_reference() {
    let mut rng = Rng(21);
    for (name, gpu, _serial) in gpus() {
        for f16 in kv_types(gpu) {
            for (neox, norm) in [(false, false), (true, true), (true, false), (false, true)] {
                let head_dim = 8 * (1 + rng.below(20));
                let n_dims = if rng.below(2) == 0 {
                    head_dim
                } else {
                    head_dim / 2
                };
                let rp = RopeParams::new(head_dim, n_dims, neox, 10000.0, 1.0);
                let n_head_kv = 1 + rng.below(3);
                let n_head = n_head_kv * (1 + rng.below(3));
                let n_tok = [1u32, 3, 9][rng.below(3) as usize];
                let shape = RopeStoreShape {
                    n_head,
                    n_head_kv,
                    n_tok,
                    k_type: kv(f16),
                    v_type: kv(f16),
                    rot_k: 0,
                    rot_v: 0,
                };
                let cells = 12usize;
                let kv_row = (n_head_kv * head_dim) as usize;
                let slots: Vec<u32> = [7u32, 2, 11, 0, 5, 9, 1, 3, 10][..n_tok as usize].to_vec();
                let positions: Vec<f64> = (0..n_tok).map(|_| rng.below(30000) as f64).collect();
                let qkv = rng.vec(shape.row_len(head_dim) as usize * n_tok as usize);
                let (qn, kn) = (rng.vec(head_dim as usize), rng.vec(head_dim as usize));
                let (kc, k_init) = up_kv(gpu, &rng.vec(kv_row * cells), f16);
                let (vc, v_init) = up_kv(gpu, &rng.vec(kv_row * cells), f16);
                let q = out_f32(gpu, (n_head * head_dim * n_tok) as usize);
                let table = up_f32(gpu, bytemuck::cast_slice(&rp.table(&positions)));
                let (qn_v, kn_v) = (up_f32(gpu, &qn), up_f32(gpu, &kn));
                let io = RopeStoreViews {
                    table: &table,
                    qkv: &up_f32(gpu, &qkv),
                    slots: &up_u32(gpu, &slots),
                    q: &q,
                    k_cache: &kc,
                    v_cache: &vc,
                    norm: norm.then_some((&qn_v, &kn_v, 1e-6)),
                };
                run_now(gpu, &[rope_store(gpu, &rp, &shape, &io).unwrap()]).unwrap();
                let (mut k_want, mut v_want) = (k_init, v_init);
                let q_want = rope_store_ref(
                    &rp,
                    &shape,
                    &qkv,
                    &positions,
                    &slots,
                    norm.then_some((&qn[..], &kn[..], 1e-6)),
                    &mut k_want,
                    &mut v_want,
                );
                let what = format!("{name} rope_store f16={f16} norm={norm} {rp:?} {shape:?}");
                check(&what, &q_want, &read(gpu, &q, q_want.len()), 1e-10);
                let (tol, round) = if f16 {
                    (1e-6, f16_round(&k_want).0)
                } else {
                    (1e-10, k_want)
                };
                check(&what, &round, &read_kv(gpu, &kc, round.len(), f16), tol);
                let v_round = if f16 { f16_round(&v_want).0 } else { v_want };
                check(&what, &v_round, &read_kv(gpu, &vc, v_round.len(), f16), 0.0);
            }
        }
    }
}

/// Per token, the rows of each part's output one after another (Q, K, V side by side).
fn stack_rows(parts: &[Vec<f32>], rows: &[usize], n_tok: usize) -> Vec<f32> {
    let mut out = Vec::new();
    for t in 0..n_tok {
        for (p, &r) in parts.iter().zip(rows) {
            out.extend_from_slice(&p[t * r..(t + 1) * r]);
        }
    }
    out
}

/// The fused projections against separate matmuls on the CPU: Q, K and V stacked in one
/// weight; parts of different types written side by side (`matmul_at`); gate and up
/// interleaved with the GLU in the matmul's epilogue (decode, small batches) or after the
/// tiled prompt matmul.
#[test]
fn fused_projections_match_separate_matmuls() {
    let mut rng = Rng(22);
    for (name, gpu, _serial) in gpus() {
        fused_projections_case(name, gpu, &mut rng);
    }
}

/// A fused gate/up weight split over bindings keeps whole (gate, up) pairs in each chunk.
#[test]
fn fused_gate_up_split_over_bindings() {
    let gpu = small_binding_gpu(4096);
    let mut rng = Rng(23);
    // Q8_0 rows of 64 are 72 bytes: 200 interleaved rows take four 4 KiB chunks.
    let (ty, k, ff) = (GgmlType::Q8_0, 64usize, 100usize);
    let gate = quantized(ty, &mut rng, k, ff);
    let up = quantized(ty, &mut rng, k, ff);
    let w = Weight::upload_fused(&gpu, "gate_up", ty, k, &[&gate, &up], true).unwrap();
    assert!(w.chunks.len() >= 4, "{} chunks", w.chunks.len());
    assert!(w
        .chunks
        .iter()
        .all(|c| c.row_begin % 2 == 0 && c.n_rows % 2 == 0));
    for n_tok in [1usize, 3] {
        let x = rng.vec(k * n_tok);
        let dst = out_f32(&gpu, ff * n_tok);
        let pairs = out_f32(&gpu, 2 * ff * n_tok);
        let xv = up_f32(&gpu, &x);
        let d = matmul_glu(&gpu, &w, &xv, n_tok as u32, Activation::Silu, &dst, &pairs).unwrap();
        run_now(&gpu, &d).unwrap();
        let want = glu_ref(
            Activation::Silu,
            &matmul_ref(ty, &gate, k, ff, &x, n_tok),
            &matmul_ref(ty, &up, k, ff, &x, n_tok),
        );
        check(
            &format!("gate/up over chunks T={n_tok}"),
            &want,
            &read(&gpu, &dst, want.len()),
            1e-9,
        );
    }
}

fn fused_projections_case(name: &str, gpu: &Gpu, rng: &mut Rng) {
    for (i, n_tok) in [1usize, 4, 13, 70].into_iter().enumerate() {
        let ty = [GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4K, GgmlType::F16][i];
        let k = n_cols(ty, rng, 6);
        let x = rng.vec(k * n_tok);
        let xv = up_f32(gpu, &x);
        let rows = [
            2 * (1 + rng.below(40) as usize),
            2 * (1 + rng.below(20) as usize),
            2 * (1 + rng.below(20) as usize),
        ];
        let data: Vec<Vec<u8>> = rows.iter().map(|&r| quantized(ty, rng, k, r)).collect();
        let mut refs: Vec<Vec<f32>> = data
            .iter()
            .zip(rows)
            .map(|(d, r)| matmul_ref(ty, d, k, r, &x, n_tok))
            .collect();
        let total: usize = rows.iter().sum();
        let what = format!("{name} {ty} {k}x{rows:?} T={n_tok}");
        // One stacked weight.
        let parts: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
        let w = Weight::upload_fused(gpu, "qkv", ty, k, &parts, false).unwrap();
        let dst = out_f32(gpu, total * n_tok);
        run_now(gpu, &matmul(gpu, &w, &xv, n_tok as u32, &dst).unwrap()).unwrap();
        let want = stack_rows(&refs, &rows, n_tok);
        check(
            &format!("{what} stacked"),
            &want,
            &read(gpu, &dst, want.len()),
            1e-9,
        );
        // Separate weights, the last of another type, into one tensor at row offsets.
        let (v_ty, v_data) = (GgmlType::Q8_0, quantized(GgmlType::Q8_0, rng, k, rows[2]));
        refs[2] = matmul_ref(v_ty, &v_data, k, rows[2], &x, n_tok);
        let want = stack_rows(&refs, &rows, n_tok);
        let dst = out_f32(gpu, total * n_tok);
        let mut d = Vec::new();
        let mut at = 0;
        for (j, &r) in rows.iter().enumerate() {
            let (t, bytes) = if j == 2 {
                (v_ty, &v_data)
            } else {
                (ty, &data[j])
            };
            let w = Weight::upload(gpu, "part", t, k, r, bytes).unwrap();
            let out = MatmulOut {
                row_offset: at,
                stride: total as u32,
            };
            d.extend(matmul_at(gpu, &w, &xv, n_tok as u32, &dst, out).unwrap());
            at += r as u32;
        }
        run_now(gpu, &d).unwrap();
        check(
            &format!("{what} split"),
            &want,
            &read(gpu, &dst, want.len()),
            1e-9,
        );
        // Gate and up interleaved, the GLU fused.
        let ff = rows[0];
        let up_data = quantized(ty, rng, k, ff);
        let up_ref = matmul_ref(ty, &up_data, k, ff, &x, n_tok);
        let w = Weight::upload_fused(gpu, "gate_up", ty, k, &[&data[0], &up_data], true).unwrap();
        for act in [Activation::Silu, Activation::Gelu] {
            let dst = out_f32(gpu, ff * n_tok);
            let pairs = out_f32(gpu, 2 * ff * n_tok);
            let d = matmul_glu(gpu, &w, &xv, n_tok as u32, act, &dst, &pairs).unwrap();
            run_now(gpu, &d).unwrap();
            let want = glu_ref(act, &refs[0], &up_ref);
            let what = format!("{what} gate/up {act:?} ({} chunks)", w.chunks.len());
            check(&what, &want, &read(gpu, &dst, want.len()), 1e-9);
        }
    }
}

/// The packed cache types: bf16 and the block types (`-ctk`/`-ctv`).
fn packed() -> impl Iterator<Item = KvType> {
    KvType::ALL.into_iter().filter(|t| t.is_packed())
}

/// Cache words written on the GPU against the CPU encoder's words for the same values:
/// for packed types nearly all equal (an f32 rounding tie may move a code), and the
/// values they hold close.
fn check_cache_words(what: &str, ty: KvType, want: &[u32], got: &[u32]) {
    assert_eq!(want.len(), got.len(), "{what}");
    if !ty.is_packed() {
        check(what, &ty.decode(want), &ty.decode(got), 1e-10);
        return;
    }
    let same = want.iter().zip(got).filter(|(a, b)| a == b).count();
    assert!(
        same * 100 >= want.len() * 95,
        "{what}: {same} of {} words as the CPU encoder's",
        want.len()
    );
    check(what, &ty.decode(want), &ty.decode(got), 1e-4);
}

/// set_rows into a packed cache quantizes each written row as the CPU reference encoder
/// (`KvType::encode`: the registry's quantizers re-laid out, llama.cpp's Vulkan
/// quantizer for iq4_nl) and leaves every other cell's words as they were.
#[test]
fn set_rows_quantizes_as_the_cpu_reference() {
    let mut rng = Rng(51);
    for (name, gpu, _serial) in gpus() {
        for ty in packed() {
            let (row_len, cells) = (64 * (1 + rng.below(4) as usize), 10usize);
            let idx = [3u32, 7, 0, 9];
            let src = rng.vec(row_len * idx.len());
            let init = rng.vec(row_len * cells);
            let (dst, _) = up_cache(gpu, &init, ty);
            let (sv, iv) = (up_f32(gpu, &src), up_u32(gpu, &idx));
            let n_rows = idx.len() as u32;
            let d = set_rows(gpu, &sv, &iv, &dst, row_len as u32, n_rows, ty).unwrap();
            run_now(gpu, &[d]).unwrap();
            let got = read_cache_words(gpu, &dst, row_len * cells, ty);
            let init_words = ty.encode(&init);
            let w = ty.row_bytes(row_len as u64) as usize / 4;
            for c in 0..cells {
                let (g, was) = (&got[c * w..(c + 1) * w], &init_words[c * w..(c + 1) * w]);
                match idx.iter().position(|&i| i as usize == c) {
                    None => assert_eq!(g, was, "{name} {ty}: cell {c} was not written"),
                    Some(r) => {
                        let want = ty.encode(&src[r * row_len..(r + 1) * row_len]);
                        check_cache_words(&format!("{name} set_rows {ty} cell {c}"), ty, &want, g);
                    }
                }
            }
        }
    }
}

/// rope_store writes rotated K heads and V heads into packed caches (K and V of different
/// types, heads of 32 to 128 values, two blocks' shared scale word written by two heads'
/// workgroups where a head is one block) as the CPU encoder would encode the unfused
/// reference's rows.
#[test]
fn rope_store_writes_packed_caches() {
    use KvType::*;
    let mut rng = Rng(52);
    for (name, gpu, _serial) in gpus() {
        let plain = kv(gpu.has_f16);
        for (k_ty, v_ty) in [
            (Q8_0, Q4_0),
            (Q4_1, Q5_0),
            (Q5_1, Iq4Nl),
            (Bf16, Q8_0),
            (plain, Q4_1),
        ] {
            let head_dim = 32 * (1 + rng.below(4));
            let rp = RopeParams::new(head_dim, head_dim, rng.below(2) == 0, 10000.0, 1.0);
            let (n_head_kv, n_tok) = (2u32, 3u32);
            let shape = RopeStoreShape {
                n_head: 4,
                n_head_kv,
                n_tok,
                k_type: k_ty,
                v_type: v_ty,
                // llama.cpp's Hadamard rotation where a quantized head allows it.
                rot_k: if k_ty.is_quantized() && head_dim.is_multiple_of(64) {
                    head_dim.min(128)
                } else {
                    0
                },
                rot_v: if v_ty.is_quantized() && head_dim.is_multiple_of(64) {
                    64
                } else {
                    0
                },
            };
            let cells = 6usize;
            let kv_row = (n_head_kv * head_dim) as usize;
            let slots = [4u32, 1, 5];
            let positions: Vec<f64> = (0..n_tok).map(|_| rng.below(3000) as f64).collect();
            let qkv = rng.vec(shape.row_len(head_dim) as usize * n_tok as usize);
            let (kc, _) = up_cache(gpu, &rng.vec(kv_row * cells), k_ty);
            let (vc, _) = up_cache(gpu, &rng.vec(kv_row * cells), v_ty);
            let q = out_f32(gpu, (4 * head_dim * n_tok) as usize);
            let table = up_f32(gpu, bytemuck::cast_slice(&rp.table(&positions)));
            let io = RopeStoreViews {
                table: &table,
                qkv: &up_f32(gpu, &qkv),
                slots: &up_u32(gpu, &slots),
                q: &q,
                k_cache: &kc,
                v_cache: &vc,
                norm: None,
            };
            run_now(gpu, &[rope_store(gpu, &rp, &shape, &io).unwrap()]).unwrap();
            let (mut k_want, mut v_want) = (vec![0f32; kv_row * cells], vec![0f32; kv_row * cells]);
            let q_want = rope_store_ref(
                &rp,
                &shape,
                &qkv,
                &positions,
                &slots,
                None,
                &mut k_want,
                &mut v_want,
            );
            let what = format!("{name} rope_store K {k_ty} V {v_ty} head {head_dim}");
            check(&what, &q_want, &read(gpu, &q, q_want.len()), 1e-10);
            for (ty, cache, want) in [(k_ty, &kc, &k_want), (v_ty, &vc, &v_want)] {
                let got = read_cache_words(gpu, cache, kv_row * cells, ty);
                let w = ty.row_bytes(kv_row as u64) as usize / 4;
                for &c in &slots {
                    let c = c as usize;
                    let row = ty.encode(&want[c * kv_row..(c + 1) * kv_row]);
                    check_cache_words(
                        &format!("{what} {ty} cell {c}"),
                        ty,
                        &row,
                        &got[c * w..(c + 1) * w],
                    );
                }
            }
        }
    }
}

/// Every attention path reads packed caches: the one-pass kernels (CPU-shaped), the
/// split output (one token on GPU-shaped kernels), the tiled prompt kernels (40 tokens)
/// and flash attention, each against the reference over the values the cache holds.
#[test]
fn attention_reads_packed_caches() {
    use KvType::*;
    let mut rng = Rng(53);
    let gpu_shaped = small_binding_gpu_with(128 << 20, KernelShape::Gpu);
    let pairs = [
        (Q8_0, Q8_0),
        (Q4_0, Q4_1),
        (Iq4Nl, Q5_0),
        (Q5_1, Bf16),
        (Bf16, Q4_0),
    ];
    for (k_type, v_type) in pairs {
        let mut run = |gpu: &Gpu, n_tok: u32, flash: bool| {
            let s = AttnShape {
                head_dim: 64,
                n_head: 4,
                n_head_kv: 2,
                n_tok,
                n_kv: n_tok + 100 + rng.below(200),
                k_type,
                v_type,
                flash,
                rot_k: 0,
                // llama.cpp's rotation of a quantized V, undone on the output.
                rot_v: if v_type.is_quantized() { 64 } else { 0 },
            };
            let sp = SoftmaxParams {
                scale: 0.125,
                max_bias: 0.0,
                n_head: 4,
                softcap: 0.0,
            };
            let (_, want, got) = attention_case(gpu, &mut rng, &s, &sp, s.n_kv as usize + 3);
            check(&format!("attention {s:?}"), &want, &got, 1e-9);
        };
        for (_, gpu, _) in gpus() {
            run(gpu, 3, false);
            // CPU-shaped flash attention: a prompt, and a decoded token.
            if gpu.kernels != KernelShape::Gpu {
                run(gpu, 6, true);
                run(gpu, 1, true);
            }
        }
        run(&gpu_shaped, 1, false);
        run(&gpu_shaped, 40, false);
        run(&gpu_shaped, 20, true);
    }
}

/// The Walsh-Hadamard rotation against the matrix written out, for chunks of 2 to 256,
/// and applied twice it is the identity (the matrix is its own inverse).
#[test]
fn hadamard_matches_the_matrix_and_undoes_itself() {
    let mut rng = Rng(54);
    for (name, gpu, _serial) in gpus() {
        for n in [2u32, 64, 128, 256] {
            let count = 1 + rng.below(5);
            let x = rng.vec((n * count) as usize);
            let xv = up_f32(gpu, &x);
            run_now(gpu, &[hadamard(gpu, &xv, n, count).unwrap()]).unwrap();
            let mut want = x.clone();
            hadamard_ref(&mut want, n as usize);
            check(
                &format!("{name} hadamard {n}"),
                &want,
                &read(gpu, &xv, x.len()),
                1e-10,
            );
            run_now(gpu, &[hadamard(gpu, &xv, n, count).unwrap()]).unwrap();
            check(
                &format!("{name} hadamard twice {n}"),
                &x,
                &read(gpu, &xv, x.len()),
                1e-10,
            );
        }
        assert!(hadamard(gpu, &up_f32(gpu, &[0.0; 96]), 96, 1).is_err());
    }
}

/// The recurrent layers' convolution against its reference: several sequences in one
/// ubatch, x a slice of a wider projection, with and without bias and SiLU, then a
/// second ubatch carrying on from the first's states.
#[test]
fn ssm_conv_matches_reference() {
    use wgllm::ops::ssm::{ssm_conv, ssm_conv_ref, ConvShape};
    let mut rng = Rng(31);
    for (name, gpu, _serial) in gpus() {
        for (i, &(ch, k, n_t, n_s)) in [(48, 4, 5, 3), (130, 3, 1, 4), (64, 4, 17, 1)]
            .iter()
            .enumerate()
        {
            let s = ConvShape {
                ch,
                k,
                n_t,
                n_s,
                x_stride: ch + 7 * (i as u32 % 2),
                silu: i != 1,
            };
            let w = rng.vec((k * ch) as usize);
            let b = rng.vec(ch as usize);
            let bias = (i != 1).then_some(b.as_slice());
            let mut state = rng.vec((s.state_len() * n_s) as usize);
            for step in 0..2 {
                let x = rng.vec((s.x_stride * n_t * n_s) as usize);
                let (want_y, want_state) = ssm_conv_ref(&s, &state, &x, &w, bias);
                let y = out_f32(gpu, want_y.len());
                let new_state = out_f32(gpu, want_state.len());
                let b_view = up_f32(gpu, &b);
                let d = ssm_conv(
                    gpu,
                    &s,
                    &up_f32(gpu, &state),
                    &up_f32(gpu, &x),
                    &up_f32(gpu, &w),
                    bias.map(|_| &b_view),
                    &y,
                    &new_state,
                )
                .unwrap();
                run_now(gpu, &[d]).unwrap();
                let what = format!("{name} ssm_conv {s:?} ubatch {step}");
                check(&what, &want_y, &read(gpu, &y, want_y.len()), 1e-12);
                let got_state = read(gpu, &new_state, want_state.len());
                assert_eq!(got_state, want_state, "{what}: states");
                state = got_state;
            }
        }
    }
}

/// Both shapes of the selective scan against the reference: Mamba's (a channel per head,
/// A per state value, B and C in the dt projection's output) and Mamba-2's (heads of 16
/// channels, A per head, B and C in groups inside the convolution's output), states
/// carried over two ubatches, several sequences, state sizes between the variants.
#[test]
fn ssm_scan_matches_reference() {
    use wgllm::ops::ssm::{ssm_scan, ssm_scan_ref, ScanShape, ScanViews};
    let mut rng = Rng(32);
    for (name, gpu, _serial) in gpus() {
        for case in 0..4 {
            let mamba2 = case % 2 == 1;
            let (d_state, head_dim, n_head, n_group) = match case {
                0 => (16, 1, 40, 1),
                1 => (64, 16, 6, 2),
                2 => (24, 1, 72, 1),
                _ => (128, 8, 4, 4),
            };
            let (n_t, n_s) = [(6, 2), (1, 4), (9, 1), (3, 3)][case];
            let d_inner = head_dim * n_head;
            let bc_len = 2 * n_group * d_state;
            // Mamba: x alone, B and C after a dt_rank of 5 in their own tensor; Mamba-2:
            // x, B, C one row of the convolution's output.
            let (x_stride, bc_stride, b_off) = if mamba2 {
                (d_inner + bc_len, d_inner + bc_len, d_inner)
            } else {
                (d_inner, 5 + bc_len, 5)
            };
            let a_len = if mamba2 { n_head } else { n_head * d_state };
            let s = ScanShape {
                d_state,
                head_dim,
                n_head,
                n_group,
                n_t,
                n_s,
                x_stride,
                dt_stride: n_head,
                bc_stride,
                b_off,
                c_off: b_off + n_group * d_state,
                z_stride: d_inner + 3,
                a_per_state: !mamba2,
                a_off: 0,
                d_off: a_len,
                dtb_off: a_len + n_head,
            };
            // A negative (a decay), dt around the softplus knee, some above 20.
            let mut consts: Vec<f32> = (0..a_len).map(|_| -0.2 - rng.f32().abs() * 2.0).collect();
            consts.extend(rng.vec(n_head as usize));
            consts.extend(rng.vec(n_head as usize));
            let mut state = rng.vec((s.state_len() * n_s) as usize);
            for step in 0..2 {
                let nt = (n_t * n_s) as usize;
                let x = if mamba2 {
                    rng.vec(x_stride as usize * nt)
                } else {
                    rng.vec(d_inner as usize * nt)
                };
                let mut dt: Vec<f32> = rng
                    .vec(n_head as usize * nt)
                    .iter()
                    .map(|v| v * 4.0)
                    .collect();
                dt[0] = 25.0;
                let bc = if mamba2 {
                    x.clone()
                } else {
                    rng.vec(bc_stride as usize * nt)
                };
                let z = rng.vec(s.z_stride as usize * nt);
                let (want_y, want_state) = ssm_scan_ref(&s, &state, &x, &dt, &consts, &bc, &z);
                let st = up_f32(gpu, &state);
                let y = out_f32(gpu, want_y.len());
                let xv = up_f32(gpu, &x);
                let bcv = if mamba2 { xv.clone() } else { up_f32(gpu, &bc) };
                let views = ScanViews {
                    state: &st,
                    x: &xv,
                    dt: &up_f32(gpu, &dt),
                    consts: &up_f32(gpu, &consts),
                    bc: &bcv,
                    z: &up_f32(gpu, &z),
                    y: &y,
                };
                run_now(gpu, &[ssm_scan(gpu, &s, &views).unwrap()]).unwrap();
                let what = format!("{name} ssm_scan case {case} ubatch {step}");
                check(&what, &want_y, &read(gpu, &y, want_y.len()), 1e-10);
                let got = read(gpu, &st, want_state.len());
                check(&format!("{what} states"), &want_state, &got, 1e-10);
                state = got;
            }
        }
    }
}

/// The activations' 8-bit blocks (`quantize_q8`) on every test backend: the scales the
/// CPU reference computes, and its codes (one may be off by one where x / d falls on a
/// half and the device's division rounds differently from the CPU's).
#[test]
fn quantize_q8_matches_reference() {
    let mut rng = Rng(51);
    for (name, gpu, _serial) in gpus() {
        for (k, n_tok) in [(32usize, 1usize), (4096, 3), (14336, 1), (96, 64)] {
            let mut x = rng.vec(k * n_tok);
            // An all-zero block (d = 0, codes 0) and one of a single sign.
            x[..32].fill(0.0);
            let len = x.len();
            for v in &mut x[len - 32..] {
                *v = v.abs();
            }
            let n_blocks = k * n_tok / 32;
            let xq = View::whole(&gpu.storage("xq", q8_bytes(k as u32, n_tok as u32)).unwrap());
            let d = quantize_q8(gpu, &up_f32(gpu, &x), k as u32, n_tok as u32, &xq).unwrap();
            run_now(gpu, &[d]).unwrap();
            let bytes = gpu
                .read_bytes(&xq.buf, 0, q8_bytes(k as u32, n_tok as u32))
                .unwrap();
            let got = Q8Blocks::from_words(&bytemuck::pod_collect_to_vec(&bytes), n_blocks);
            let want = quantize_q8_ref(&x);
            let what = format!("{name} quantize_q8 {k}x{n_tok}");
            for (b, (&dg, &dw)) in got.d.iter().zip(&want.d).enumerate() {
                assert!(
                    (dg - dw).abs() <= dw * 1e-6,
                    "{what}: block {b} d {dg} != {dw}"
                );
            }
            assert!(
                got.codes[..32].iter().all(|&c| c == 0),
                "{what}: zero block"
            );
            let off: Vec<usize> = (0..want.codes.len())
                .filter(|&i| got.codes[i] != want.codes[i])
                .collect();
            assert!(
                off.iter()
                    .all(|&i| (got.codes[i] as i32 - want.codes[i] as i32).abs() == 1),
                "{what}: a code off by more than one"
            );
            assert!(
                off.len() * 1000 <= want.codes.len(),
                "{what}: {} codes differ",
                off.len()
            );
            // Each block's d * sum(codes) from the codes the device wrote.
            for b in 0..n_blocks {
                let sum: i32 = got.codes[b * 32..b * 32 + 32]
                    .iter()
                    .map(|&c| c as i32)
                    .sum();
                let s = got.d[b] * sum as f32;
                assert!(
                    (got.s[b] - s).abs() <= 1e-5 * (1.0 + s.abs()),
                    "{what}: block {b} sum"
                );
            }
        }
    }
}

/// The integer-dot matmul for every weight type that has one, every variant (rows and
/// tokens per workgroup), on every test backend: against the CPU reference doing the same
/// integer arithmetic, and within the activations' rounding of the float reference.
/// Shapes: 1 to 64 tokens, rows not a multiple of the workgroup's, K up to 14336.
#[test]
fn integer_dot_matmul_matches_reference() {
    let mut rng = Rng(52);
    for (name, gpu, _serial) in gpus() {
        for ty in quant::int_dot_types() {
            for (k, n, n_tok) in [
                (32usize, 3usize, 1usize),
                (256, 37, 2),
                (14336, 5, 1),
                (4096, 19, 8),
                (96, 7, 64),
                (256, 130, 100),
            ] {
                // Whole blocks (the K-quants' and IQ4_XS's are 256 weights).
                let k = k.next_multiple_of(ty.block_size());
                let data = quantized(ty, &mut rng, k, n);
                let x = rng.vec(k * n_tok);
                let w = Weight::upload(gpu, "w", ty, k, n, &data).unwrap();
                let xq = View::whole(&gpu.storage("xq", q8_bytes(k as u32, n_tok as u32)).unwrap());
                let q = quantize_q8(gpu, &up_f32(gpu, &x), k as u32, n_tok as u32, &xq).unwrap();
                run_now(gpu, &[q]).unwrap();
                let want = matmul_q8_ref(ty, &data, k, n, &x, n_tok);
                let float = matmul_ref(ty, &data, k, n, &x, n_tok);
                // Every variant on the small shapes; the large ones through the variant the
                // op picks (software devices take seconds per pass there). On GL, whose
                // compiles take ~3 s a variant here, every variant of one type only (the
                // variants share the kernel; the types differ in their block loaders).
                let every = !name.starts_with("gl") || ty == GgmlType::Q4_0;
                // Both reductions where the device has subgroups (the subgroupAdd one on
                // every variant of Q4_0 and through the op's pick for the others).
                let picked = wgllm::ops::matmul_q8::kernel(gpu, ty, n as u32, n_tok as u32);
                let sg: &[bool] = match (gpu.has_subgroups, ty == GgmlType::Q4_0) {
                    (true, true) => &[false, true],
                    _ => &[false],
                };
                let mut keys: Vec<KernelKey> = if every && k * n * n_tok <= 32768 {
                    Q8_MATMUL_ROWS
                        .iter()
                        .flat_map(|&rows| {
                            sg.iter().flat_map(move |&subgroups| {
                                Q8_MATMUL_TOKENS.iter().map(move |&tb| {
                                    KernelKey::MatmulQ8(Q8Kernel::Vec {
                                        ty,
                                        rows,
                                        tb,
                                        subgroups,
                                    })
                                })
                            })
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                // The tiles on every batch (their edges: 130 rows, 100 tokens).
                if every && n_tok > 1 {
                    keys.extend(
                        Q8_TILES
                            .iter()
                            .map(|&(bm, bn)| KernelKey::MatmulQ8(Q8Kernel::Tile { ty, bm, bn })),
                    );
                }
                if !keys.contains(&picked) {
                    keys.push(picked);
                }
                for key in keys {
                    let dst = out_f32(gpu, n * n_tok);
                    run_now(
                        gpu,
                        &matmul_q8_with(gpu, key, &w, &xq, n_tok as u32, &dst).unwrap(),
                    )
                    .unwrap();
                    let got = read(gpu, &dst, want.len());
                    let what = format!("{name} {key} {k}x{n} T={n_tok}");
                    check(&what, &want, &got, 1e-9);
                    // Against the float product, x's rounding to 8 bits: ~2e-5 on average,
                    // up to a few 1e-4 on shapes of few rows (5 outputs of 14336-term sums).
                    check(&format!("{what} (float)"), &float, &got, 1e-3);
                }
            }
        }
    }
}

/// The integer-dot matmul over a weight split into chunks by a small binding limit: the
/// matrix-vector kernel (3 tokens, CPU shape) and the tile (GPU shape, 10 tokens).
#[test]
fn integer_dot_matmul_split_weights() {
    let mut rng = Rng(53);
    for (ty, n_tok, kernels) in [
        (GgmlType::Q8_0, 3usize, KernelShape::Cpu),
        (GgmlType::Q4_1, 3, KernelShape::Cpu),
        (GgmlType::Q5K, 3, KernelShape::Cpu),
        (GgmlType::Q4_0, 10, KernelShape::Gpu),
        (GgmlType::Q4K, 10, KernelShape::Gpu),
    ] {
        let gpu = small_binding_gpu_with(12288, kernels);
        let (k, n) = (96usize.next_multiple_of(ty.block_size()), 300usize);
        let picked = wgllm::ops::matmul_q8::kernel(&gpu, ty, n as u32, n_tok as u32);
        let tiled = matches!(picked, KernelKey::MatmulQ8(Q8Kernel::Tile { .. }));
        assert_eq!(tiled, kernels == KernelShape::Gpu, "{ty}: {picked}");
        let data = quantized(ty, &mut rng, k, n);
        let x = rng.vec(k * n_tok);
        let w = Weight::upload(&gpu, "w", ty, k, n, &data).unwrap();
        assert!(w.chunks.len() >= 2, "{ty}: {} chunks", w.chunks.len());
        let xq = View::whole(&gpu.storage("xq", q8_bytes(k as u32, n_tok as u32)).unwrap());
        let mut d =
            vec![quantize_q8(&gpu, &up_f32(&gpu, &x), k as u32, n_tok as u32, &xq).unwrap()];
        let dst = out_f32(&gpu, n * n_tok);
        d.extend(matmul_q8(&gpu, &w, &xq, n_tok as u32, &dst).unwrap());
        run_now(&gpu, &d).unwrap();
        let want = matmul_q8_ref(ty, &data, k, n, &x, n_tok);
        check(
            &format!("split {ty}"),
            &want,
            &read(&gpu, &dst, want.len()),
            1e-9,
        );
    }
}

/// A weight type without an integer-dot kernel is refused with the types that have one.
#[test]
fn integer_dot_matmul_refuses_other_types() {
    let (_, gpu, _serial) = gpus().next().unwrap();
    let mut rng = Rng(54);
    let data = quantized(GgmlType::Q6K, &mut rng, 256, 2);
    let w = Weight::upload(gpu, "w", GgmlType::Q6K, 256, 2, &data).unwrap();
    let xq = View::whole(&gpu.storage("xq", q8_bytes(256, 1)).unwrap());
    let e = matmul_q8(gpu, &w, &xq, 1, &out_f32(gpu, 2))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("q6_k") || e.contains("Q6_K"), "{e}");
    assert!(e.contains("q4_0") || e.contains("Q4_0"), "{e}");
}

/// wgpu's barrier rule as `ops::barriers` counts it: none between dispatches that only read
/// what they share, one before a dispatch that reads what another wrote or writes what
/// another read or wrote (whatever the ranges).
#[test]
fn barriers_follow_wgpus_rule() {
    let (_, gpu, _serial) = gpus().next().unwrap();
    let (a, b, c) = (out_f32(gpu, 64), out_f32(gpu, 64), out_f32(gpu, 64));
    let glu = |x: &View, y: &View| glu_pairs(gpu, Activation::Silu, x, y, 16).unwrap();
    // glu_pairs reads its first view and writes its second.
    let d = [glu(&a, &b), glu(&a, &c)];
    assert_eq!(
        wgllm::ops::barriers(&d),
        0,
        "two readers of a, separate outputs"
    );
    let d = [glu(&a, &b), glu(&b, &c)];
    assert_eq!(wgllm::ops::barriers(&d), 1, "b written, then read");
    let d = [glu(&a, &b), glu(&c, &b)];
    assert_eq!(wgllm::ops::barriers(&d), 1, "b written twice");
    let d = [glu(&a, &b), glu(&c, &a)];
    assert_eq!(wgllm::ops::barriers(&d), 1, "a read, then written");
    let d = [glu(&a, &b), glu(&a, &c), glu(&b, &c)];
    assert_eq!(wgllm::ops::barriers(&d), 1);
}

/// Expert routing against its reference: 4 to 128 experts, 1 to 8 used, every gating,
/// with and without renormalisation and a scale, on random logits (so experts are chosen
/// unevenly, some by no token): the same experts in the same order, weights within f32
/// rounding.
#[test]
fn moe_routing_matches_reference() {
    let mut rng = Rng(63);
    for (name, gpu, _serial) in gpus() {
        for (n_expert, n_used, n_tok) in
            [(4u32, 1u32, 3usize), (8, 2, 17), (60, 4, 5), (128, 8, 70)]
        {
            for gating in [Gating::Softmax, Gating::Sigmoid, Gating::SoftmaxWeight] {
                let r = MoeRouting {
                    n_expert,
                    n_used,
                    gating,
                    norm: gating != Gating::Sigmoid,
                    scale: if n_expert == 60 { 2.5 } else { 0.0 },
                };
                let logits: Vec<f32> = rng
                    .vec(n_expert as usize * n_tok)
                    .iter()
                    .map(|v| 3.0 * v)
                    .collect();
                let n_out = n_used as usize * n_tok;
                let ids = View::whole(&gpu.storage("ids", n_out as u64 * 4).unwrap());
                let weights = out_f32(gpu, n_out);
                let d = moe_route(gpu, &r, &up_f32(gpu, &logits), n_tok as u32, &ids, &weights);
                run_now(gpu, &[d.unwrap()]).unwrap();
                let (want_ids, want_w) = moe_route_ref(&r, &logits, n_tok);
                let got_ids: Vec<u32> = bytemuck::pod_collect_to_vec(
                    &gpu.read_bytes(&ids.buf, 0, n_out as u64 * 4).unwrap(),
                );
                let what = format!("{name} moe_route {r:?} T={n_tok}");
                assert_eq!(got_ids, want_ids, "{what}: experts");
                check(&what, &want_w, &read(gpu, &weights, n_out), 1e-10);
                if r.norm {
                    for w in read(gpu, &weights, n_out).chunks(n_used as usize) {
                        let s: f32 = w.iter().sum();
                        let want = if r.scale == 0.0 { 1.0 } else { r.scale };
                        assert!((s - want).abs() < 1e-5, "{what}: weights sum to {s}");
                    }
                }
            }
        }
    }
}

/// Each pair's output plus its expert's bias (gpt-oss): experts chosen unevenly (some by
/// no pair), rows not a multiple of the workgroup.
#[test]
fn expert_biases_match_reference() {
    let mut rng = Rng(65);
    for (name, gpu, _serial) in gpus() {
        for (n_expert, n_pairs, rows) in [(4usize, 3usize, 5usize), (32, 40, 97), (128, 8, 64)] {
            let a = rng.vec(rows * n_pairs);
            let bias = rng.vec(rows * n_expert);
            // The first half of the experts only, some twice.
            let ids: Vec<u32> = (0..n_pairs)
                .map(|_| rng.below((n_expert / 2) as u32))
                .collect();
            let ids_gpu = View::whole(&gpu.upload("ids", bytemuck::cast_slice(&ids)).unwrap());
            let dst = out_f32(gpu, a.len());
            let d = moe_add_id(
                gpu,
                &up_f32(gpu, &a),
                &up_f32(gpu, &bias),
                &ids_gpu,
                rows as u32,
                n_pairs as u32,
                &dst,
            )
            .unwrap();
            run_now(gpu, &[d]).unwrap();
            check(
                &format!("{name} moe_add_id E={n_expert} P={n_pairs} rows={rows}"),
                &moe_add_id_ref(&a, &bias, &ids, rows),
                &read(gpu, &dst, a.len()),
                1e-12,
            );
        }
    }
}

/// The experts' products and their weighted sum for every weight type: 4 to 128 experts,
/// 1 to 8 used per token, 2 to 512 tokens routed by random logits, x per token (gate/up) and
/// per pair (down), each pair's rows on their own and grouped by expert, against the plain
/// matmul reference per pair. On GL, whose compiles take seconds a variant here, two types
/// only (the kernels share everything but the weight snippet, which the matmul tests cover).
#[test]
fn expert_matmul_matches_reference() {
    let mut rng = Rng(64);
    for (name, gpu, _serial) in gpus() {
        for (i, ty) in WEIGHT_TYPES.into_iter().enumerate() {
            if name.starts_with("gl") && !matches!(ty, GgmlType::Q4_0 | GgmlType::Q4K) {
                continue;
            }
            let (n_expert, n_used, n_tok) = [
                (4u32, 2u32, 3usize),
                (16, 4, 9),
                (128, 8, 2),
                (8, 1, 40),
                (32, 4, 512),
            ][i % 5];
            let k = n_cols(ty, &mut rng, 4);
            // Most experts narrower than one workgroup's rows; the long prompt's wider
            // than the GPU tiles' 128 and the CPU kernel's 64 x R, so several row tiles
            // of an expert share its run of pairs.
            let rows = if n_tok >= 512 {
                130 + rng.below(64) as usize
            } else {
                1 + rng.below(40) as usize
            };
            let data = quantized(ty, &mut rng, k, rows * n_expert as usize);
            let w =
                Weight::upload_experts(gpu, "exps", ty, k, rows, n_expert as usize, &data).unwrap();
            let r = MoeRouting {
                n_expert,
                n_used,
                gating: Gating::Softmax,
                norm: true,
                scale: 0.0,
            };
            let (ids, weights) = moe_route_ref(&r, &rng.vec(n_expert as usize * n_tok), n_tok);
            let n_pairs = ids.len();
            let ids_v = up_u32(gpu, &ids);
            let (offsets, order) = grouped_pairs(gpu, &ids, n_expert);
            for (x_per_pair, grouped) in
                [(false, false), (true, false), (false, true), (true, true)]
            {
                let x = rng.vec(k * if x_per_pair { n_pairs } else { n_tok });
                let dst = out_f32(gpu, rows * n_pairs);
                let pairs = match grouped {
                    true => Pairs::Grouped {
                        offsets: &offsets,
                        order: &order,
                    },
                    false => Pairs::Ids(&ids_v),
                };
                let mut d = matmul_id(
                    gpu,
                    &w,
                    n_expert,
                    &up_f32(gpu, &x),
                    x_per_pair,
                    pairs,
                    n_used,
                    n_tok as u32,
                    &dst,
                )
                .unwrap();
                let sum = out_f32(gpu, rows * n_tok);
                let wv = up_f32(gpu, &weights);
                d.push(moe_sum(gpu, &dst, &wv, rows as u32, n_used, n_tok as u32, &sum).unwrap());
                run_now(gpu, &d).unwrap();
                let want = matmul_id_ref(ty, &data, k, rows, &x, x_per_pair, &ids, n_used as usize);
                let what = format!("{name} matmul_id {ty} {n_expert}x{rows}x{k} used {n_used} T={n_tok} per_pair={x_per_pair} grouped={grouped}");
                check(&what, &want, &read(gpu, &dst, want.len()), 1e-10);
                let want_sum = moe_sum_ref(&want, &weights, rows, n_used as usize);
                check(
                    &format!("{what} sum"),
                    &want_sum,
                    &read(gpu, &sum, want_sum.len()),
                    1e-10,
                );
            }
        }
    }
}

/// The pairs of `ids` grouped by expert on `gpu` (moe_group), checked: offsets ascending
/// over all pairs, `order` a permutation with each pair in its expert's run.
fn grouped_pairs(gpu: &Gpu, ids: &[u32], n_expert: u32) -> (View, View) {
    let n = ids.len();
    let offsets = View::whole(&gpu.storage("offsets", (n_expert as u64 + 1) * 4).unwrap());
    let order = View::whole(&gpu.storage("order", n as u64 * 4).unwrap());
    let d = moe_group(gpu, &up_u32(gpu, ids), n as u32, n_expert, &offsets, &order).unwrap();
    run_now(gpu, &[d]).unwrap();
    let words = |v: &View, n: usize| -> Vec<u32> {
        bytemuck::pod_collect_to_vec(&gpu.read_bytes(&v.buf, 0, n as u64 * 4).unwrap())
    };
    let (off, ord) = (words(&offsets, n_expert as usize + 1), words(&order, n));
    assert_eq!((off[0], off[n_expert as usize]), (0, n as u32), "{off:?}");
    let mut seen = vec![false; n];
    for e in 0..n_expert as usize {
        assert!(off[e] <= off[e + 1], "{off:?}");
        for &p in &ord[off[e] as usize..off[e + 1] as usize] {
            assert_eq!(ids[p as usize], e as u32, "pair {p} in expert {e}'s run");
            assert!(
                !std::mem::replace(&mut seen[p as usize], true),
                "pair {p} twice"
            );
        }
    }
    (offsets, order)
}

/// Experts over a small binding limit: chunks of whole experts, each pair computed by the
/// chunk holding its expert. An expert larger than a binding is refused at upload's use.
#[test]
fn expert_matmul_split_weights() {
    let gpu = small_binding_gpu(8192);
    let mut rng = Rng(65);
    let (ty, k, rows, n_expert, n_used, n_tok) =
        (GgmlType::Q8_0, 64usize, 24usize, 16u32, 3u32, 5usize);
    let data = quantized(ty, &mut rng, k, rows * n_expert as usize);
    let w = Weight::upload_experts(&gpu, "exps", ty, k, rows, n_expert as usize, &data).unwrap();
    assert!(w.chunks.len() >= 2, "{} chunks", w.chunks.len());
    assert!(
        w.chunks
            .iter()
            .all(|c| (c.n_rows as usize).is_multiple_of(rows)),
        "chunks of whole experts"
    );
    let r = MoeRouting {
        n_expert,
        n_used,
        gating: Gating::Softmax,
        norm: false,
        scale: 0.0,
    };
    let (ids, _) = moe_route_ref(&r, &rng.vec(n_expert as usize * n_tok), n_tok);
    let x = rng.vec(k * n_tok);
    let want = matmul_id_ref(ty, &data, k, rows, &x, false, &ids, n_used as usize);
    let ids_v = up_u32(&gpu, &ids);
    let (offsets, order) = grouped_pairs(&gpu, &ids, n_expert);
    let grouped = Pairs::Grouped {
        offsets: &offsets,
        order: &order,
    };
    for pairs in [Pairs::Ids(&ids_v), grouped] {
        let dst = out_f32(&gpu, rows * ids.len());
        let x = up_f32(&gpu, &x);
        let d = matmul_id(
            &gpu,
            &w,
            n_expert,
            &x,
            false,
            pairs,
            n_used,
            n_tok as u32,
            &dst,
        )
        .unwrap();
        assert_eq!(d.len(), w.chunks.len());
        run_now(&gpu, &d).unwrap();
        check("split experts", &want, &read(&gpu, &dst, want.len()), 1e-10);
    }
}
