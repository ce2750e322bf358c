//! Kernel benchmarks on the default adapter, at SmolLM2's shapes, each reporting a
//! throughput: quantized matvec (decode, one token) per weight type in bytes of weights
//! read, the prompt matmul (64 tokens, the tiled path on GPUs) in multiply-adds,
//! attention at several cache sizes in bytes of K/V read, RoPE and softmax in elements.
//! `cargo bench --bench ops` (WGPU_BACKEND, and the WGLLM_* tuning variables such as
//! WGLLM_MATMUL_TILE, to compare variants). Sample counts are small: software adapters
//! (lavapipe) take tens of milliseconds a dispatch.

use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use std::sync::Arc;
use wgllm::gguf::GgmlType;
use wgllm::gpu::{Gpu, GpuOptions, KernelTuning};
use wgllm::kv::KvType;
use wgllm::ops::attention::{attention, AttnShape, AttnViews};
use wgllm::ops::matmul::matmul;
use wgllm::ops::rope::{rope, RopeParams};
use wgllm::ops::softmax::{softmax, SoftmaxParams};
use wgllm::ops::{run_now, Dispatch, View, Weight};
use wgllm::quant;

/// SmolLM2-135M: embedding 576, FFN 1536, 9 heads of 64 (3 K/V heads).
const N_EMBD: usize = 576;
const N_FF: usize = 1536;
const HEAD_DIM: u32 = 64;
const N_HEAD: u32 = 9;
const N_HEAD_KV: u32 = 3;

fn open_gpu() -> Arc<Gpu> {
    let tuning = KernelTuning::from_env().expect("valid WGLLM_* tuning variables");
    Gpu::new(&GpuOptions {
        tuning,
        ..Default::default()
    })
    .expect("a GPU adapter (software Vulkan will do)")
}

/// Deterministic values in [-0.5, 0.5).
fn values(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919) % 97) as f32 / 97.0 - 0.5)
        .collect()
}

fn f32_buf(gpu: &Gpu, data: &[f32]) -> View {
    View::whole(&gpu.upload("bench", bytemuck::cast_slice(data)).unwrap())
}

fn zeros(gpu: &Gpu, n: usize) -> View {
    View::whole(&gpu.storage("bench out", n as u64 * 4).unwrap())
}

fn time(
    group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    gpu: &Gpu,
    name: String,
    d: &[Dispatch],
) {
    group.bench_function(name, |b| b.iter(|| run_now(gpu, d).unwrap()));
}

fn weight(gpu: &Gpu, ty: GgmlType, k: usize, n: usize) -> Weight {
    let row = values(k);
    let data: Vec<u8> = (0..n).flat_map(|_| quant::quantize_row(ty, &row)).collect();
    Weight::upload(gpu, "w", ty, k, n, &data).unwrap()
}

/// One token through an FFN-sized matrix: bandwidth-bound, so bytes of weights.
fn bench_matvec(c: &mut Criterion) {
    let gpu = open_gpu();
    let mut group = c.benchmark_group(format!("matvec/{}", gpu.info.name));
    group.sample_size(10);
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q4K,
        GgmlType::Q6K,
        GgmlType::F16,
    ] {
        // K-quant blocks are 256 wide: the FFN width is a multiple.
        let (k, n) = (N_FF, N_EMBD);
        let w = weight(&gpu, ty, k, n);
        let x = f32_buf(&gpu, &values(k));
        let dst = zeros(&gpu, n);
        let d = matmul(&gpu, &w, &x, 1, &dst).unwrap();
        group.throughput(Throughput::Bytes(w.gpu_bytes()));
        time(&mut group, &gpu, format!("{ty} {k}x{n}"), &d);
    }
    group.finish();
}

/// A 64-token prompt through the same matrices: compute-bound, so multiply-adds.
fn bench_prompt_matmul(c: &mut Criterion) {
    let gpu = open_gpu();
    let mut group = c.benchmark_group(format!("matmul/{}", gpu.info.name));
    group.sample_size(10);
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4K, GgmlType::F16] {
        for n_tok in [16u32, 64] {
            // The FFN down projection: its width is a multiple of the K-quant block.
            let (k, n) = (N_FF, N_EMBD);
            let w = weight(&gpu, ty, k, n);
            let x = f32_buf(&gpu, &values(k * n_tok as usize));
            let dst = zeros(&gpu, n * n_tok as usize);
            let d = matmul(&gpu, &w, &x, n_tok, &dst).unwrap();
            group.throughput(Throughput::Elements((k * n) as u64 * n_tok as u64));
            time(&mut group, &gpu, format!("{ty} {k}x{n} T={n_tok}"), &d);
        }
    }
    group.finish();
}

/// Attention of one decoded token and of a 16-token ubatch over growing caches, with the
/// adapter's plain cache and a q8_0 one: bytes of K and V read.
fn bench_attention(c: &mut Criterion) {
    let gpu = open_gpu();
    let mut group = c.benchmark_group(format!("attention/{}", gpu.info.name));
    group.sample_size(10);
    let plain = if gpu.has_f16 {
        KvType::F16
    } else {
        KvType::F32
    };
    for (ty, n_tok, n_kv) in [plain, KvType::Q8_0]
        .into_iter()
        .flat_map(|ty| [1u32, 16].map(move |t| (ty, t)))
        .flat_map(|(ty, t)| [256u32, 1024, 4096].map(move |n| (ty, t, n)))
    {
        {
            let s = AttnShape {
                head_dim: HEAD_DIM,
                n_head: N_HEAD,
                n_head_kv: N_HEAD_KV,
                n_tok,
                n_kv,
                k_type: ty,
                v_type: ty,
                flash: false,
                rot_k: 0,
                rot_v: 0,
            };
            let sp = SoftmaxParams {
                scale: 1.0 / (HEAD_DIM as f32).sqrt(),
                max_bias: 0.0,
                n_head: N_HEAD,
                softcap: 0.0,
            };
            let row = (HEAD_DIM * N_HEAD_KV) as usize;
            let kv_bytes = ty.row_bytes(row as u64) * n_kv as u64;
            let kv = View::whole(&gpu.storage("k", kv_bytes).unwrap());
            let vv = View::whole(&gpu.storage("v", kv_bytes).unwrap());
            let q = f32_buf(&gpu, &values((HEAD_DIM * N_HEAD * n_tok) as usize));
            let mask = zeros(&gpu, (n_kv * n_tok) as usize);
            let scores = zeros(&gpu, s.scores_len(&gpu).unwrap() as usize);
            let partials = zeros(&gpu, s.partials_len(&gpu).max(4) as usize);
            let dst = zeros(&gpu, (HEAD_DIM * N_HEAD * n_tok) as usize);
            let io = AttnViews {
                q: &q,
                k: &kv,
                v: &vv,
                mask: &mask,
                scores: &scores,
                partials: &partials,
                dst: &dst,
                sinks: None,
            };
            let d = attention(&gpu, &s, &sp, &io).unwrap();
            group.throughput(Throughput::Bytes(2 * kv_bytes));
            time(&mut group, &gpu, format!("{ty} T={n_tok} n_kv={n_kv}"), &d);
        }
    }
    group.finish();
}

/// RoPE on Q of a 64-token ubatch, and the masked softmax of its scores over 1024
/// cells: elements processed.
fn bench_rope_softmax(c: &mut Criterion) {
    let gpu = open_gpu();
    let mut group = c.benchmark_group(format!("elementwise/{}", gpu.info.name));
    group.sample_size(10);
    let n_tok = 64u32;
    let rp = RopeParams::new(HEAD_DIM, HEAD_DIM, false, 100_000.0, 1.0);
    let positions: Vec<f64> = (0..n_tok).map(f64::from).collect();
    let table: Vec<f32> = rp.table(&positions).into_iter().flatten().collect();
    let table = f32_buf(&gpu, &table);
    let n = (HEAD_DIM * N_HEAD * n_tok) as usize;
    let x = f32_buf(&gpu, &values(n));
    let d = [rope(&gpu, &rp, &table, &x, N_HEAD, n_tok, false).unwrap()];
    group.throughput(Throughput::Elements(n as u64));
    time(&mut group, &gpu, format!("rope T={n_tok}"), &d);

    let n_kv = 1024u32;
    let sp = SoftmaxParams {
        scale: 0.125,
        max_bias: 0.0,
        n_head: N_HEAD,
        softcap: 0.0,
    };
    let scores = f32_buf(&gpu, &values((N_HEAD * n_tok * n_kv) as usize));
    let mask = zeros(&gpu, (n_kv * n_tok) as usize);
    let d = [softmax(&gpu, &sp, Some(&mask), &scores, n_kv, n_tok).unwrap()];
    group.throughput(Throughput::Elements((N_HEAD * n_tok * n_kv) as u64));
    time(
        &mut group,
        &gpu,
        format!("softmax T={n_tok} n_kv={n_kv}"),
        &d,
    );
    group.finish();
}

criterion_group!(
    benches,
    bench_matvec,
    bench_prompt_matmul,
    bench_attention,
    bench_rope_softmax
);
criterion_main!(benches);
