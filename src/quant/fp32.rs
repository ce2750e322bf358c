//! F32 weights: the file's own layout, one word per value.

use super::{QuantFormat, Quantizer};
use crate::gguf::GgmlType;

pub struct F32;

impl QuantFormat for F32 {
    fn ty(&self) -> GgmlType {
        GgmlType::F32
    }
    fn file_block(&self) -> (usize, usize) {
        (1, 4)
    }
    fn gpu_block_words(&self) -> usize {
        32
    }
    fn gpu_head_words(&self) -> usize {
        0
    }
    fn repack(&self, row: &[u8], out: &mut Vec<u32>) {
        out.extend(row.chunks_exact(4).map(|c| super::word_at(c, 0)));
    }
    fn dequantize(&self, src: &[u8], out: &mut [f32]) {
        for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
            *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
    }
    fn quantizer(&self) -> Option<Quantizer> {
        Some(|src, out| src.iter().for_each(|v| out.extend(v.to_le_bytes())))
    }
    fn wgsl(&self) -> &'static str {
        include_str!("../../shaders/weights/quant_f32.wgsl")
    }
}
