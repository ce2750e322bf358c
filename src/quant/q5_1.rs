//! Q5_1: 32 weights in 24 bytes: `d`, `m` (f16), `qh` (4 bytes: bit j is the 5th bit of
//! weight j), `qs` (16 bytes: weight j < 16 in the low nibble of byte j, weight j + 16 in
//! its high nibble); x = q d + m.
//! GPU block: the file's own 6 words, [d, m (f16 pair)] [qh] [qs: 4 words].

use super::{
    dot_nibbles, f16_at, f16_bytes, min_max, word_at, DotBlock, IntDot, QuantFormat, Quantizer,
};
use crate::gguf::GgmlType;

pub struct Q5_1;

impl QuantFormat for Q5_1 {
    fn ty(&self) -> GgmlType {
        GgmlType::Q5_1
    }
    fn file_block(&self) -> (usize, usize) {
        (32, 24)
    }
    fn gpu_block_words(&self) -> usize {
        6
    }
    fn gpu_head_words(&self) -> usize {
        2
    }
    fn repack(&self, row: &[u8], out: &mut Vec<u32>) {
        out.extend(row.chunks_exact(4).map(|c| word_at(c, 0)));
    }
    fn dequantize(&self, src: &[u8], out: &mut [f32]) {
        for (blk, o) in src.chunks_exact(24).zip(out.chunks_exact_mut(32)) {
            let (d, m) = (f16_at(blk, 0), f16_at(blk, 2));
            let qh = word_at(blk, 4);
            for j in 0..16 {
                let q = blk[8 + j] as u32;
                let lo = (q & 0xF) | ((qh >> j) & 1) << 4;
                let hi = (q >> 4) | ((qh >> (j + 16)) & 1) << 4;
                o[j] = lo as f32 * d + m;
                o[j + 16] = hi as f32 * d + m;
            }
        }
    }
    fn quantizer(&self) -> Option<Quantizer> {
        Some(quantize)
    }
    fn wgsl(&self) -> &'static str {
        concat!(
            include_str!("../../shaders/weights/quant_q5_1.wgsl"),
            include_str!("../../shaders/weights/quant_q5.wgsl")
        )
    }
    fn int_dot(&self) -> Option<IntDot> {
        Some(IntDot {
            wgsl: include_str!("../../shaders/weights/dot_q5_1.wgsl"),
            blocks: dot_blocks,
        })
    }
}

fn quantize(src: &[f32], out: &mut Vec<u8>) {
    for blk in src.chunks_exact(32) {
        let (min, max) = min_max(blk);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q = |v: f32| (((v - min) * id + 0.5) as i32).clamp(0, 31) as u32;
        let mut qh = 0u32;
        let mut qs = [0u8; 16];
        for j in 0..16 {
            let (a, b) = (q(blk[j]), q(blk[j + 16]));
            qs[j] = ((a & 0xF) | (b & 0xF) << 4) as u8;
            qh |= (a >> 4) << j | (b >> 4) << (j + 16);
        }
        out.extend(f16_bytes(d));
        out.extend(f16_bytes(min));
        out.extend(qh.to_le_bytes());
        out.extend(qs);
    }
}

/// The block as the integer-dot kernel multiplies it: codes 0..31, x = d q + m.
fn dot_blocks(b: &[u8], out: &mut Vec<DotBlock>) {
    let qh = word_at(b, 4);
    out.push((dot_nibbles(&b[8..24], qh), (f16_at(b, 0), f16_at(b, 2))));
}
