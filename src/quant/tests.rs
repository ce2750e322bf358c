use super::*;

fn lcg(seed: &mut u64) -> f32 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// Worst absolute error of quantize→dequantize on values in [-1, 1): half a quantization
/// step (the scale covers a range of 2 in 2^bits - 1 steps, or |max| in 2^(bits-1)), plus
/// the f16 rounding of the scale. A format with a quantizer must be listed here.
fn round_trip_tolerance(ty: GgmlType) -> f32 {
    match ty {
        GgmlType::F32 => 0.0,
        GgmlType::F16 => 1e-3,
        GgmlType::Q8_0 => 1.0 / 127.0,
        GgmlType::Q4_0 => 1.0 / 8.0,
        GgmlType::Q4_1 => 1.0 / 15.0,
        GgmlType::Q5_0 => 1.0 / 16.0,
        GgmlType::Q5_1 => 1.0 / 31.0,
        GgmlType::Bf16 => 1.0 / 256.0,
        // The k-quants' sub-block scales are 4-, 6- or 8-bit codes of the super-block's d:
        // half a step, plus what the scale's rounding (half a code of up to 1/smax relative
        // error, times the largest code) and, for the affine ones, the min's rounding add.
        GgmlType::Q2K => 1.0 / 3.0 + 3.0 * (2.0 / 3.0) / 30.0 + 1.0 / 30.0,
        GgmlType::Q3K => 1.0 / 4.0 + 4.0 * (1.0 / 4.0) / 62.0,
        GgmlType::Q4K => 1.0 / 15.0 + 15.0 * (2.0 / 15.0) / 126.0 + 1.0 / 126.0,
        GgmlType::Q5K => 1.0 / 31.0 + 31.0 * (2.0 / 31.0) / 126.0 + 1.0 / 126.0,
        GgmlType::Q6K => 1.0 / 32.0 + 32.0 * (1.0 / 32.0) / 254.0,
        // The widest gap between levels is 24 of 127 (and 113 to 127 at the top).
        GgmlType::Iq4Nl => 14.0 / 127.0,
        GgmlType::Iq4Xs => 14.0 / 127.0 + 127.0 * (1.0 / 127.0) / 62.0,
        // The scale is a power of two under the block's maximum: values between 1.5 and 2
        // times it saturate at 12 d (a quarter of the range at worst, here 1 - 0.75).
        GgmlType::Mxfp4 => 0.25,
        other => panic!("no round-trip tolerance for {other}: add one"),
    }
}

#[test]
fn quantize_then_dequantize_is_close() {
    let mut s = 7;
    let src: Vec<f32> = (0..256).map(|_| lcg(&mut s)).collect();
    for f in FORMATS.iter().filter(|f| f.quantizer().is_some()) {
        let ty = f.ty();
        let tol = round_trip_tolerance(ty);
        let q = quantize_row(ty, &src);
        assert_eq!(q.len() as u64, ty.row_bytes(256).unwrap(), "{ty}");
        let mut back = vec![0.0; 256];
        dequantize_row(ty, &q, &mut back);
        for (a, b) in src.iter().zip(&back) {
            assert!((a - b).abs() <= tol + 1e-6, "{ty}: {a} vs {b}");
        }
    }
}

#[test]
fn every_format_is_consistent_with_the_file_table_and_its_snippet() {
    let mut seen = Vec::new();
    for f in FORMATS {
        let ty = f.ty();
        assert!(!seen.contains(&ty), "{ty} registered twice");
        seen.push(ty);
        assert!(std::ptr::addr_eq(format(ty).unwrap(), *f));
        assert_eq!(Some(f.file_block()), ty.block_layout(), "{ty} file block");
        assert_eq!(
            format_by_name(&ty.to_string().to_lowercase()).unwrap().ty(),
            ty
        );
        // The snippet's constants are the layout the repack produces.
        let src = f.wgsl();
        assert!(src.contains("const QK: u32 = 32u;"), "{ty}: QK");
        let (wpb, hw) = (f.gpu_block_words(), f.gpu_head_words());
        let head = format!("const HW: u32 = {hw}u;");
        let body = format!("const BW: u32 = {}u;", wpb - hw);
        assert!(src.contains(&head), "{ty}: snippet lacks `{head}`");
        assert!(src.contains(&body), "{ty}: snippet lacks `{body}`");
        // Bodies are whole vec4s: the CPU-shaped matmul loads them as such.
        assert!(
            hw < wpb && (wpb - hw) % 4 == 0,
            "{ty}: body of {} words",
            wpb - hw
        );
        for sym in ["fn load_block(", "fn deq_elem(", "fn load_quarter("] {
            assert!(src.contains(sym), "{ty}: snippet lacks {sym}");
        }
    }
    assert!(format(GgmlType::Q8_1).is_none());
    assert!(format(GgmlType::Q8K).is_none());
    assert_eq!(
        supported_names(),
        "F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, BF16, IQ4_NL, IQ4_XS, MXFP4",
        "error messages list the registry"
    );
}

/// Each integer-dot reference decodes the file's blocks to the format's own values: code *
/// scale + offset is what `dequantize` gives, to within the f32 rounding of the product
/// and sum (the kernel's arithmetic, where the CPU reference may fuse them).
#[test]
fn integer_dot_blocks_are_the_formats_values() {
    assert_eq!(
        names(int_dot_types().iter().map(|&t| format(t).unwrap())),
        "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, IQ4_NL, IQ4_XS",
        "the types whose blocks are 32 codes with one scale and offset"
    );
    let mut s = 23;
    for ty in int_dot_types() {
        let f = format(ty).unwrap();
        let dot = f.int_dot().unwrap();
        assert!(dot.wgsl.contains("fn load_w("), "{ty}: no load_w");
        let src: Vec<f32> = (0..512).map(|_| lcg(&mut s)).collect();
        let bytes = quantize_row(ty, &src);
        let mut want = vec![0.0; 512];
        dequantize_row(ty, &bytes, &mut want);
        let blocks = dot_blocks(ty, &bytes);
        assert_eq!(blocks.len(), 512 / 32, "{ty}");
        for (b, (codes, (scale, offset))) in blocks.iter().enumerate() {
            for (j, &c) in codes.iter().enumerate() {
                let (got, want) = (c as f32 * scale + offset, want[32 * b + j]);
                assert!(
                    (got - want).abs() <= 1e-6 * (1.0 + want.abs()),
                    "{ty} block {b} weight {j}: {got} vs {want}"
                );
            }
        }
    }
}

#[test]
fn repack_gives_whole_gpu_blocks_per_row() {
    let mut s = 11;
    for f in FORMATS {
        let Some(q) = f.quantizer() else { continue };
        let n = if f.file_block().0 > 96 { 512 } else { 96 };
        let rows = 3;
        let src: Vec<f32> = (0..n * rows).map(|_| lcg(&mut s)).collect();
        let mut bytes = Vec::new();
        q(&src, &mut bytes);
        let mut words = Vec::new();
        f.repack_rows(&bytes, n, &mut words);
        assert_eq!(words.len(), rows * f.gpu_row_words(n), "{}", f.ty());
        let words = n / GPU_BLOCK * f.gpu_block_words();
        assert_eq!(f.gpu_row_words(n), words.next_multiple_of(4));
    }
    // Ragged F16 rows are padded to a whole GPU block, each row on its own.
    let f = format(GgmlType::F16).unwrap();
    let bytes = quantize_row(GgmlType::F16, &[1.0; 2 * 33]);
    let mut words = Vec::new();
    f.repack_rows(&bytes, 33, &mut words);
    assert_eq!(words.len(), 2 * 32);
    assert_eq!(words[16], 0x3C00, "odd last value, zero high half");
    assert_eq!(words[17..32], [0; 15]);
    assert_eq!(words[32], 0x3C00_3C00);
}

#[test]
fn repacked_words_keep_every_field_word_aligned() {
    let mut s = 3;
    let src: Vec<f32> = (0..64).map(|_| lcg(&mut s)).collect();
    let q = quantize_row(GgmlType::Q8_0, &src);
    let mut words = Vec::new();
    format(GgmlType::Q8_0)
        .unwrap()
        .repack_rows(&q, 64, &mut words);
    // Two blocks of 9 words (18), padded to whole vec4s (20).
    assert_eq!(words.len(), gpu_row_words(GgmlType::Q8_0, 64).unwrap());
    assert_eq!(words.len(), 20);
    // Bodies first: the second block's first quant byte is the low byte of word 8; then
    // the heads: its scale in word 17; then the padding.
    assert_eq!(words[8] as u8, q[36]);
    assert_eq!(words[17] as u16, u16::from_le_bytes([q[34], q[35]]));
    assert_eq!(words[18..], [0, 0]);

    // Q5_0 (22-byte blocks): bodies (qs) in words 0..8, then each block's d and qh.
    let q = quantize_row(GgmlType::Q5_0, &src);
    let mut words = Vec::new();
    format(GgmlType::Q5_0)
        .unwrap()
        .repack_rows(&q, 64, &mut words);
    assert_eq!(words.len(), 12);
    assert_eq!(words[4..8], [28, 32, 36, 40].map(|i| word_at(&q, i)));
    assert_eq!(words[10], u16::from_le_bytes([q[22], q[23]]) as u32);
    assert_eq!(words[11], word_at(&q, 24));
}

/// Hand-made Q5 blocks where every 5th bit is set on its own: weight j's value must move by
/// exactly 16 steps when bit j of qh is set, and by nothing else.
#[test]
fn q5_fifth_bits_belong_to_their_weight() {
    for j in 0..32 {
        let qh = 1u32 << j;
        let mut q50 = vec![0u8; 22];
        q50[..2].copy_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
        q50[2..6].copy_from_slice(&qh.to_le_bytes());
        q50[6..].fill(0x21); // low nibbles 1, high nibbles 2
        let mut out = [0f32; 32];
        dequantize_row(GgmlType::Q5_0, &q50, &mut out);
        for (k, &v) in out.iter().enumerate() {
            let q = if k < 16 { 1 } else { 2 } + if k == j { 16 } else { 0 };
            assert_eq!(v, (q as f32 - 16.0) * 0.5, "Q5_0 bit {j} weight {k}");
        }
        let mut q51 = vec![0u8; 24];
        q51[..2].copy_from_slice(&half::f16::from_f32(0.25).to_le_bytes());
        q51[2..4].copy_from_slice(&half::f16::from_f32(-1.0).to_le_bytes());
        q51[4..8].copy_from_slice(&qh.to_le_bytes());
        q51[8..].fill(0x21);
        dequantize_row(GgmlType::Q5_1, &q51, &mut out);
        for (k, &v) in out.iter().enumerate() {
            let q = if k < 16 { 1 } else { 2 } + if k == j { 16 } else { 0 };
            assert_eq!(v, q as f32 * 0.25 - 1.0, "Q5_1 bit {j} weight {k}");
        }
    }
}

/// Every registered format is in the kernel variant space, so the offline check
/// (naga validation, MSL and HLSL translation of every `KernelKey`) covers its snippet in
/// get_rows and every matmul shape.
#[test]
fn every_format_is_in_the_validated_kernel_space() {
    use crate::ops::matmul::Kernel;
    use crate::ops::{get_rows, KernelKey};
    let all = KernelKey::all();
    for f in FORMATS {
        let ty = f.ty();
        let get_rows = KernelKey::GetRows(get_rows::Kernel { ty });
        assert!(all.contains(&get_rows), "{ty}: get_rows");
        for kind in ["matmul", "matmul_wg", "matmul_tile"] {
            assert!(
                all.iter().any(|k| match k {
                    KernelKey::Matmul(Kernel::CpuRows { ty: t, .. }) => {
                        kind == "matmul" && *t == ty
                    }
                    KernelKey::Matmul(Kernel::GpuVec { ty: t, .. }) => {
                        kind == "matmul_wg" && *t == ty
                    }
                    KernelKey::Matmul(Kernel::GpuTile { ty: t, .. }) => {
                        kind == "matmul_tile" && *t == ty
                    }
                    _ => false,
                }),
                "{ty}: {kind}"
            );
        }
    }
}

/// The 6-bit scale packing of Q4_K/Q5_K reads back what it packed, every bit of every
/// sub-block on its own.
#[test]
fn k4_scales_round_trip() {
    use super::kquant::{k4_pack, k4_scale_min};
    for j in 0..8 {
        for bit in 0..6 {
            let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
            sc[j] = 1 << bit;
            m[(j + 3) % 8] = 1 << bit;
            let packed = k4_pack(&sc, &m);
            for i in 0..8 {
                assert_eq!(
                    k4_scale_min(&packed, i),
                    (sc[i], m[i]),
                    "j {j} bit {bit} i {i}"
                );
            }
        }
    }
}
