//! Q5_0: 32 weights in 22 bytes: `d` (f16), `qh` (4 bytes: bit j is the 5th bit of weight
//! j), `qs` (16 bytes: weight j < 16 in the low nibble of byte j, weight j + 16 in its high
//! nibble); x = (q - 16) d.
//! GPU block, 6 words: [d (f16 in the low half)] [qh] [qs: 4 words]. The file's `qh` and
//! `qs` start 2 bytes into a word; the padding after `d` aligns both.

use super::{
    dot_nibbles, f16_at, f16_bytes, signed_absmax, word_at, DotBlock, IntDot, QuantFormat,
    Quantizer,
};
use crate::gguf::GgmlType;

pub struct Q5_0;

impl QuantFormat for Q5_0 {
    fn ty(&self) -> GgmlType {
        GgmlType::Q5_0
    }
    fn file_block(&self) -> (usize, usize) {
        (32, 22)
    }
    fn gpu_block_words(&self) -> usize {
        6
    }
    fn gpu_head_words(&self) -> usize {
        2
    }
    fn repack(&self, row: &[u8], out: &mut Vec<u32>) {
        for blk in row.chunks_exact(22) {
            out.push(u16::from_le_bytes([blk[0], blk[1]]) as u32);
            out.extend((0..5).map(|i| word_at(blk, 2 + 4 * i)));
        }
    }
    fn dequantize(&self, src: &[u8], out: &mut [f32]) {
        for (blk, o) in src.chunks_exact(22).zip(out.chunks_exact_mut(32)) {
            let d = f16_at(blk, 0);
            let qh = word_at(blk, 2);
            for j in 0..16 {
                let q = blk[6 + j] as u32;
                let lo = (q & 0xF) | ((qh >> j) & 1) << 4;
                let hi = (q >> 4) | ((qh >> (j + 16)) & 1) << 4;
                o[j] = (lo as f32 - 16.0) * d;
                o[j + 16] = (hi as f32 - 16.0) * d;
            }
        }
    }
    fn quantizer(&self) -> Option<Quantizer> {
        Some(quantize)
    }
    fn wgsl(&self) -> &'static str {
        concat!(
            include_str!("../../shaders/weights/quant_q5_0.wgsl"),
            include_str!("../../shaders/weights/quant_q5.wgsl")
        )
    }
    fn int_dot(&self) -> Option<IntDot> {
        Some(IntDot {
            wgsl: include_str!("../../shaders/weights/dot_q5_0.wgsl"),
            blocks: dot_blocks,
        })
    }
}

/// ggml's reference rounding: the largest-magnitude value maps to -16 exactly.
fn quantize(src: &[f32], out: &mut Vec<u8>) {
    for blk in src.chunks_exact(32) {
        let d = signed_absmax(blk) / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q = |v: f32| ((v * id + 16.5) as i32).clamp(0, 31) as u32;
        let mut qh = 0u32;
        let mut qs = [0u8; 16];
        for j in 0..16 {
            let (a, b) = (q(blk[j]), q(blk[j + 16]));
            qs[j] = ((a & 0xF) | (b & 0xF) << 4) as u8;
            qh |= (a >> 4) << j | (b >> 4) << (j + 16);
        }
        out.extend(f16_bytes(d));
        out.extend(qh.to_le_bytes());
        out.extend(qs);
    }
}

/// The block as the integer-dot kernel multiplies it: codes 0..31, x = d q - 16 d.
fn dot_blocks(b: &[u8], out: &mut Vec<DotBlock>) {
    let d = f16_at(b, 0);
    out.push((dot_nibbles(&b[6..22], word_at(b, 2)), (d, -16.0 * d)));
}
