//! Q4_1: 32 weights in 20 bytes, `d`, `m` (f16) then 16 bytes of nibbles; x = q d + m.
//! Weight j < 16 is the low nibble of byte j, weight j + 16 its high nibble.
//! GPU block: the file's own 5 words, [d, m (f16 pair)] [qs: 4 words].

use super::{
    dot_nibbles, f16_at, f16_bytes, min_max, word_at, DotBlock, IntDot, QuantFormat, Quantizer,
};
use crate::gguf::GgmlType;

pub struct Q4_1;

impl QuantFormat for Q4_1 {
    fn ty(&self) -> GgmlType {
        GgmlType::Q4_1
    }
    fn file_block(&self) -> (usize, usize) {
        (32, 20)
    }
    fn gpu_block_words(&self) -> usize {
        5
    }
    fn gpu_head_words(&self) -> usize {
        1
    }
    fn repack(&self, row: &[u8], out: &mut Vec<u32>) {
        out.extend(row.chunks_exact(4).map(|c| word_at(c, 0)));
    }
    fn dequantize(&self, src: &[u8], out: &mut [f32]) {
        for (blk, o) in src.chunks_exact(20).zip(out.chunks_exact_mut(32)) {
            let (d, m) = (f16_at(blk, 0), f16_at(blk, 2));
            for j in 0..16 {
                let q = blk[4 + j];
                o[j] = (q & 0xF) as f32 * d + m;
                o[j + 16] = (q >> 4) as f32 * d + m;
            }
        }
    }
    fn quantizer(&self) -> Option<Quantizer> {
        Some(quantize)
    }
    fn wgsl(&self) -> &'static str {
        concat!(
            include_str!("../../shaders/weights/quant_q4_1.wgsl"),
            include_str!("../../shaders/weights/quant_q4.wgsl")
        )
    }
    fn int_dot(&self) -> Option<IntDot> {
        Some(IntDot {
            wgsl: include_str!("../../shaders/weights/dot_q4_1.wgsl"),
            blocks: dot_blocks,
        })
    }
}

fn quantize(src: &[f32], out: &mut Vec<u8>) {
    for blk in src.chunks_exact(32) {
        let (min, max) = min_max(blk);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend(f16_bytes(d));
        out.extend(f16_bytes(min));
        for j in 0..16 {
            let q0 = (((blk[j] - min) * id + 0.5) as i32).clamp(0, 15) as u8;
            let q1 = (((blk[j + 16] - min) * id + 0.5) as i32).clamp(0, 15) as u8;
            out.push(q0 | (q1 << 4));
        }
    }
}

/// The block as the integer-dot kernel multiplies it: codes 0..15, x = d q + m.
fn dot_blocks(b: &[u8], out: &mut Vec<DotBlock>) {
    out.push((dot_nibbles(&b[4..20], 0), (f16_at(b, 0), f16_at(b, 2))));
}
