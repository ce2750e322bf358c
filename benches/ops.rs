//! Kernel benchmarks on the default adapter: the matmul shapes of SmolLM2's decode and
//! prompt steps, for each weight type, with the adapter's kernel shape.
//! `cargo bench --bench ops` (WGPU_BACKEND, and the WGLLM_* tuning variables such as
//! WGLLM_MATMUL_TILE, to compare variants).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use wgllm::gguf::{quant, GgmlType};
use wgllm::gpu::{Gpu, GpuOptions, KernelTuning};
use wgllm::ops::matmul::matmul;
use wgllm::ops::{run_now, View, Weight};

fn bench_matmul(c: &mut Criterion) {
    let tuning = KernelTuning::from_env().expect("valid WGLLM_* tuning variables");
    let gpu = Gpu::new(&GpuOptions {
        tuning,
        ..Default::default()
    })
    .expect("a GPU adapter (software Vulkan will do)");
    let mut group = c.benchmark_group(format!("matmul/{}", gpu.info.name));
    group.sample_size(10);
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::F16] {
        for (k, n, n_tok) in [(576usize, 1536usize, 1u32), (576, 1536, 64)] {
            let row: Vec<f32> = (0..k)
                .map(|i| ((i * 7919) % 97) as f32 / 97.0 - 0.5)
                .collect();
            let data: Vec<u8> = (0..n).flat_map(|_| quant::quantize_row(ty, &row)).collect();
            let w = Weight::upload(&gpu, "w", ty, k, n, &data).unwrap();
            let x = View::whole(
                &gpu.upload("x", bytemuck::cast_slice(&vec![0.5f32; k * n_tok as usize]))
                    .unwrap(),
            );
            let dst = View::whole(&gpu.storage("dst", (n * n_tok as usize * 4) as u64).unwrap());
            let d = matmul(&gpu, &w, &x, n_tok, &dst).unwrap();
            group.throughput(Throughput::Elements((k * n) as u64 * n_tok as u64));
            group.bench_function(format!("{ty} {k}x{n} T={n_tok}"), |b| {
                b.iter(|| run_now(&gpu, &d).unwrap())
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench_matmul);
criterion_main!(benches);
