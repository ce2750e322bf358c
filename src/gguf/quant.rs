//! Quantized block formats: CPU reference (de)quantization and the GPU block layout.
//!
//! On the GPU every block is stored as whole 32-bit words, with each field starting on a
//! word boundary (WGSL storage arrays hold 4-byte elements). For Q4_1 that is the file's
//! own layout; Q4_0 and Q8_0 get two bytes of padding after their f16 scale. Weights stay
//! quantized: this is a re-layout, never a dequantized copy.

use super::GgmlType;
use half::f16;

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Dequantizes `out.len()` elements of type `ty` from `src` (whole blocks).
/// Panics only if `src` is shorter than `out` needs — callers size them from the tensor table.
pub fn dequantize_row(ty: GgmlType, src: &[u8], out: &mut [f32]) {
    match ty {
        GgmlType::F32 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes(c.try_into().unwrap());
            }
        }
        GgmlType::F16 => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = f16_at(src, 2 * i);
            }
        }
        GgmlType::Bf16 => {
            for (i, o) in out.iter_mut().enumerate() {
                let bits = u16::from_le_bytes([src[2 * i], src[2 * i + 1]]);
                *o = f32::from_bits((bits as u32) << 16);
            }
        }
        GgmlType::Q4_0 => {
            for (blk, o) in src.chunks_exact(18).zip(out.chunks_exact_mut(32)) {
                let d = f16_at(blk, 0);
                for j in 0..16 {
                    let q = blk[2 + j];
                    o[j] = ((q & 0xF) as f32 - 8.0) * d;
                    o[j + 16] = ((q >> 4) as f32 - 8.0) * d;
                }
            }
        }
        GgmlType::Q4_1 => {
            for (blk, o) in src.chunks_exact(20).zip(out.chunks_exact_mut(32)) {
                let (d, m) = (f16_at(blk, 0), f16_at(blk, 2));
                for j in 0..16 {
                    let q = blk[4 + j];
                    o[j] = (q & 0xF) as f32 * d + m;
                    o[j + 16] = (q >> 4) as f32 * d + m;
                }
            }
        }
        GgmlType::Q8_0 => {
            for (blk, o) in src.chunks_exact(34).zip(out.chunks_exact_mut(32)) {
                let d = f16_at(blk, 0);
                for j in 0..32 {
                    o[j] = blk[2 + j] as i8 as f32 * d;
                }
            }
        }
        other => panic!("dequantize_row: no CPU reference for {other}"),
    }
}

/// Quantizes one row as ggml's reference quantizers do (used to make test weights).
pub fn quantize_row(ty: GgmlType, src: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    match ty {
        GgmlType::F32 => src.iter().for_each(|v| out.extend(v.to_le_bytes())),
        GgmlType::F16 => src
            .iter()
            .for_each(|v| out.extend(f16::from_f32(*v).to_le_bytes())),
        GgmlType::Q4_0 => {
            for blk in src.chunks_exact(32) {
                let max = blk
                    .iter()
                    .copied()
                    .fold(0f32, |m, v| if v.abs() > m.abs() { v } else { m });
                let d = max / -8.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend(f16::from_f32(d).to_le_bytes());
                for j in 0..16 {
                    let q0 = ((blk[j] * id + 8.5) as i32).min(15) as u8;
                    let q1 = ((blk[j + 16] * id + 8.5) as i32).min(15) as u8;
                    out.push(q0 | (q1 << 4));
                }
            }
        }
        GgmlType::Q4_1 => {
            for blk in src.chunks_exact(32) {
                let min = blk.iter().copied().fold(f32::INFINITY, f32::min);
                let max = blk.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let d = (max - min) / 15.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend(f16::from_f32(d).to_le_bytes());
                out.extend(f16::from_f32(min).to_le_bytes());
                for j in 0..16 {
                    let q0 = (((blk[j] - min) * id + 0.5) as i32).min(15) as u8;
                    let q1 = (((blk[j + 16] - min) * id + 0.5) as i32).min(15) as u8;
                    out.push(q0 | (q1 << 4));
                }
            }
        }
        GgmlType::Q8_0 => {
            for blk in src.chunks_exact(32) {
                let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend(f16::from_f32(d).to_le_bytes());
                out.extend(blk.iter().map(|v| (v * id).round() as i8 as u8));
            }
        }
        other => panic!("quantize_row: no reference quantizer for {other}"),
    }
    out
}

/// 32-bit words per block in the GPU layout, or None if no kernel reads this type.
pub fn gpu_words_per_block(ty: GgmlType) -> Option<usize> {
    Some(match ty {
        GgmlType::F32 => 1,
        GgmlType::F16 => return None, // handled as pairs, see `gpu_row_words`
        GgmlType::Q4_0 | GgmlType::Q4_1 => 5,
        GgmlType::Q8_0 => 9,
        _ => return None,
    })
}

/// 32-bit words one row of `n` elements takes in the GPU layout.
pub fn gpu_row_words(ty: GgmlType, n: usize) -> Option<usize> {
    match ty {
        GgmlType::F16 => Some(n.div_ceil(2)),
        _ => gpu_words_per_block(ty).map(|w| n / ty.block_size() * w),
    }
}

/// Re-lays out whole rows of `ty` (file bytes) into GPU words, appending to `out`.
pub fn repack_rows(ty: GgmlType, src: &[u8], n_per_row: usize, out: &mut Vec<u32>) {
    let word = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    match ty {
        GgmlType::F32 | GgmlType::Q4_1 => out.extend(src.chunks_exact(4).map(word)),
        GgmlType::F16 => {
            let row_bytes = n_per_row * 2;
            for row in src.chunks_exact(row_bytes) {
                for pair in row.chunks(4) {
                    let mut w = [0u8; 4];
                    w[..pair.len()].copy_from_slice(pair);
                    out.push(u32::from_le_bytes(w));
                }
            }
        }
        GgmlType::Q4_0 | GgmlType::Q8_0 => {
            let bb = ty.block_layout().unwrap().1;
            for blk in src.chunks_exact(bb) {
                out.push(u16::from_le_bytes([blk[0], blk[1]]) as u32);
                out.extend(blk[2..].chunks_exact(4).map(word));
            }
        }
        other => panic!("repack_rows: no GPU layout for {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    #[test]
    fn quantize_then_dequantize_is_close() {
        let mut s = 7;
        let src: Vec<f32> = (0..256).map(|_| lcg(&mut s)).collect();
        for (ty, tol) in [
            (GgmlType::F32, 0.0),
            (GgmlType::F16, 1e-3),
            (GgmlType::Q8_0, 1.0 / 127.0),
            (GgmlType::Q4_1, 2.0 / 15.0),
            (GgmlType::Q4_0, 2.0 / 8.0),
        ] {
            let q = quantize_row(ty, &src);
            assert_eq!(q.len() as u64, ty.row_bytes(256).unwrap());
            let mut back = vec![0.0; 256];
            dequantize_row(ty, &q, &mut back);
            for (a, b) in src.iter().zip(&back) {
                assert!((a - b).abs() <= tol + 1e-6, "{ty}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn repacked_words_keep_every_field_word_aligned() {
        let mut s = 3;
        let src: Vec<f32> = (0..64).map(|_| lcg(&mut s)).collect();
        let q = quantize_row(GgmlType::Q8_0, &src);
        let mut words = Vec::new();
        repack_rows(GgmlType::Q8_0, &q, 64, &mut words);
        assert_eq!(words.len(), gpu_row_words(GgmlType::Q8_0, 64).unwrap());
        // Second block: scale in word 9, first quant byte in the low byte of word 10.
        assert_eq!(words[9] as u16, u16::from_le_bytes([q[34], q[35]]));
        assert_eq!(words[10] as u8, q[36]);
    }
}
