//! Q8_0: 32 weights in 34 bytes, `d` (f16) then 32 signed bytes; x = q d.
//! GPU block, 9 words: [d (f16 in the low half)] [qs: 8 words]; the two padding bytes put
//! the quants on a word boundary.

use super::{f16_at, f16_bytes, word_at, DotBlock, IntDot, QuantFormat, Quantizer};
use crate::gguf::GgmlType;

pub struct Q8_0;

impl QuantFormat for Q8_0 {
    fn ty(&self) -> GgmlType {
        GgmlType::Q8_0
    }
    fn file_block(&self) -> (usize, usize) {
        (32, 34)
    }
    fn gpu_block_words(&self) -> usize {
        9
    }
    fn gpu_head_words(&self) -> usize {
        1
    }
    fn repack(&self, row: &[u8], out: &mut Vec<u32>) {
        for blk in row.chunks_exact(34) {
            out.push(u16::from_le_bytes([blk[0], blk[1]]) as u32);
            out.extend((0..8).map(|i| word_at(blk, 2 + 4 * i)));
        }
    }
    fn dequantize(&self, src: &[u8], out: &mut [f32]) {
        for (blk, o) in src.chunks_exact(34).zip(out.chunks_exact_mut(32)) {
            let d = f16_at(blk, 0);
            for (o, &q) in o.iter_mut().zip(&blk[2..]) {
                *o = q as i8 as f32 * d;
            }
        }
    }
    fn quantizer(&self) -> Option<Quantizer> {
        Some(quantize)
    }
    fn wgsl(&self) -> &'static str {
        include_str!("../../shaders/weights/quant_q8_0.wgsl")
    }
    fn int_dot(&self) -> Option<IntDot> {
        Some(IntDot {
            wgsl: include_str!("../../shaders/weights/dot_q8_0.wgsl"),
            blocks: dot_blocks,
        })
    }
}

fn quantize(src: &[f32], out: &mut Vec<u8>) {
    for blk in src.chunks_exact(32) {
        let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend(f16_bytes(d));
        out.extend(blk.iter().map(|v| (v * id).round() as i8 as u8));
    }
}

/// The block as the integer-dot kernel multiplies it: the signed bytes, x = d q.
fn dot_blocks(b: &[u8], out: &mut Vec<DotBlock>) {
    let codes = std::array::from_fn(|j| b[2 + j] as i8 as i32);
    out.push((codes, (f16_at(b, 0), 0.0)));
}
