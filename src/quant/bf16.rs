//! BF16 weights: the file's own layout, two values per word (low half first); a bf16 is
//! the top half of an f32.

use super::{QuantFormat, Quantizer};
use crate::gguf::GgmlType;

pub struct BF16;

impl QuantFormat for BF16 {
    fn ty(&self) -> GgmlType {
        GgmlType::Bf16
    }
    fn file_block(&self) -> (usize, usize) {
        (1, 2)
    }
    fn gpu_block_words(&self) -> usize {
        16
    }
    fn gpu_head_words(&self) -> usize {
        0
    }
    fn repack(&self, row: &[u8], out: &mut Vec<u32>) {
        // A row of odd length ends in half a word; its high half stays zero.
        for pair in row.chunks(4) {
            let mut w = [0u8; 4];
            w[..pair.len()].copy_from_slice(pair);
            out.push(u32::from_le_bytes(w));
        }
    }
    fn dequantize(&self, src: &[u8], out: &mut [f32]) {
        for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
            *o = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
        }
    }
    fn quantizer(&self) -> Option<Quantizer> {
        Some(|src, out| {
            src.iter()
                .for_each(|v| out.extend(to_bf16(*v).to_le_bytes()))
        })
    }
    fn wgsl(&self) -> &'static str {
        include_str!("../../shaders/weights/quant_bf16.wgsl")
    }
}

/// Round to nearest even; NaN stays a (quiet) NaN.
fn to_bf16(v: f32) -> u16 {
    let b = v.to_bits();
    if v.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}
