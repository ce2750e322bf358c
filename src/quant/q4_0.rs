//! Q4_0: 32 weights in 18 bytes, `d` (f16) then 16 bytes of nibbles; x = (q - 8) d.
//! Weight j < 16 is the low nibble of byte j, weight j + 16 its high nibble.
//! GPU block, 5 words: [d (f16 in the low half)] [qs: 4 words]; the two padding bytes put
//! the nibbles on a word boundary.

use super::{
    dot_nibbles, f16_at, f16_bytes, signed_absmax, word_at, DotBlock, IntDot, QuantFormat,
    Quantizer,
};
use crate::gguf::GgmlType;

pub struct Q4_0;

impl QuantFormat for Q4_0 {
    fn ty(&self) -> GgmlType {
        GgmlType::Q4_0
    }
    fn file_block(&self) -> (usize, usize) {
        (32, 18)
    }
    fn gpu_block_words(&self) -> usize {
        5
    }
    fn gpu_head_words(&self) -> usize {
        1
    }
    fn repack(&self, row: &[u8], out: &mut Vec<u32>) {
        for blk in row.chunks_exact(18) {
            out.push(u16::from_le_bytes([blk[0], blk[1]]) as u32);
            out.extend((0..4).map(|i| word_at(blk, 2 + 4 * i)));
        }
    }
    fn dequantize(&self, src: &[u8], out: &mut [f32]) {
        for (blk, o) in src.chunks_exact(18).zip(out.chunks_exact_mut(32)) {
            let d = f16_at(blk, 0);
            for j in 0..16 {
                let q = blk[2 + j];
                o[j] = ((q & 0xF) as f32 - 8.0) * d;
                o[j + 16] = ((q >> 4) as f32 - 8.0) * d;
            }
        }
    }
    fn quantizer(&self) -> Option<Quantizer> {
        Some(quantize)
    }
    fn wgsl(&self) -> &'static str {
        concat!(
            include_str!("../../shaders/weights/quant_q4_0.wgsl"),
            include_str!("../../shaders/weights/quant_q4.wgsl")
        )
    }
    fn int_dot(&self) -> Option<IntDot> {
        Some(IntDot {
            wgsl: include_str!("../../shaders/weights/dot_q4_0.wgsl"),
            blocks: dot_blocks,
        })
    }
}

/// ggml's reference rounding: the largest-magnitude value maps to -8 exactly.
fn quantize(src: &[f32], out: &mut Vec<u8>) {
    for blk in src.chunks_exact(32) {
        let d = signed_absmax(blk) / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend(f16_bytes(d));
        for j in 0..16 {
            let q0 = ((blk[j] * id + 8.5) as i32).clamp(0, 15) as u8;
            let q1 = ((blk[j + 16] * id + 8.5) as i32).clamp(0, 15) as u8;
            out.push(q0 | (q1 << 4));
        }
    }
}

/// The block as the integer-dot kernel multiplies it: codes 0..15, x = d q - 8 d.
fn dot_blocks(b: &[u8], out: &mut Vec<DotBlock>) {
    let d = f16_at(b, 0);
    out.push((dot_nibbles(&b[2..18], 0), (d, -8.0 * d)));
}
