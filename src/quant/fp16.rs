//! F16 weights: the file's own layout, two values per word (low half first).

use super::{QuantFormat, Quantizer};
use crate::gguf::GgmlType;

pub struct F16;

impl QuantFormat for F16 {
    fn ty(&self) -> GgmlType {
        GgmlType::F16
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
            *o = super::f16_at(c, 0);
        }
    }
    fn quantizer(&self) -> Option<Quantizer> {
        Some(|src, out| src.iter().for_each(|v| out.extend(super::f16_bytes(*v))))
    }
    fn wgsl(&self) -> &'static str {
        include_str!("../../shaders/weights/quant_f16.wgsl")
    }
}
