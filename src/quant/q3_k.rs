//! Q3_K: 256 weights in 110 bytes: `hmask` (32 bytes: 3rd bits), `qs` (64 bytes: low 2
//! bits), `scales` (12 bytes: sixteen 6-bit scales, one per 16 weights, see [`scale`]),
//! `d` (f16); x = (d (sc - 32)) (q - 4), q the 3-bit code. In each half (128 weights,
//! n = 0, 1), weight 32j + l (j = 0..3) has its low bits at bits 2j of qs byte 32n + l and
//! its 3rd bit at bit 4n + j of hmask byte l.
//! GPU: each 32-weight sub-block in 4 words, [d (f16, low half), sc0, sc1 (6 bits at 16
//! and 24)] [low bits of weights 0..15] [of weights 16..31] [3rd bits: bit j for weight j].

use super::kquant::{fit_symmetric, QK_K};
use super::{bit_word, f16_at, f16_bytes, pair_word, QuantFormat, Quantizer};
use crate::gguf::GgmlType;

pub struct Q3K;

const BYTES: usize = 110;

/// Weight `e`'s 3-bit code (q, before subtracting 4).
fn code(blk: &[u8], e: usize) -> u8 {
    let (n, j, l) = (e / 128, e % 128 / 32, e % 32);
    let lo = (blk[32 + 32 * n + l] >> (2 * j)) & 3;
    let hi = (blk[l] >> (4 * n + j)) & 1;
    lo | hi << 2
}

/// The 6-bit scale `i` (0..16), before subtracting 32: low 4 bits in the low (i < 8) or
/// high nibble of byte i % 8, top 2 bits at bits 2 (i / 4) of byte 8 + i % 4.
fn scale(blk: &[u8], i: usize) -> u8 {
    let s = &blk[96..108];
    let lo = if i < 8 { s[i] & 0xF } else { s[i - 8] >> 4 };
    lo | ((s[8 + i % 4] >> (2 * (i / 4))) & 3) << 4
}

impl QuantFormat for Q3K {
    fn ty(&self) -> GgmlType {
        GgmlType::Q3K
    }
    fn file_block(&self) -> (usize, usize) {
        (QK_K, BYTES)
    }
    fn gpu_block_words(&self) -> usize {
        4
    }
    fn gpu_head_words(&self) -> usize {
        0
    }
    fn repack(&self, row: &[u8], out: &mut Vec<u32>) {
        for blk in row.chunks_exact(BYTES) {
            let d = u16::from_le_bytes([blk[108], blk[109]]) as u32;
            for s in 0..8 {
                let q = |j: usize| code(blk, 32 * s + j);
                let (s0, s1) = (scale(blk, 2 * s) as u32, scale(blk, 2 * s + 1) as u32);
                out.extend([
                    d | s0 << 16 | s1 << 24,
                    pair_word(0, q),
                    pair_word(16, q),
                    bit_word(2, q),
                ]);
            }
        }
    }
    fn dequantize(&self, src: &[u8], out: &mut [f32]) {
        for (blk, o) in src.chunks_exact(BYTES).zip(out.chunks_exact_mut(QK_K)) {
            let d = f16_at(blk, 108);
            for (e, o) in o.iter_mut().enumerate() {
                let dl = d * (scale(blk, e / 16) as i32 - 32) as f32;
                *o = dl * (code(blk, e) as i32 - 4) as f32;
            }
        }
    }
    fn quantizer(&self) -> Option<Quantizer> {
        Some(quantize)
    }
    fn wgsl(&self) -> &'static str {
        include_str!("../../shaders/weights/quant_q3_k.wgsl")
    }
}

fn quantize(src: &[f32], out: &mut Vec<u8>) {
    for blk in src.chunks_exact(QK_K) {
        let (d, sc, q) = fit_symmetric(blk, 16, 4.0, 31, |v| (v.round() as i32).clamp(-4, 3));
        let mut b = [0u8; BYTES];
        for (e, &q) in q.iter().enumerate() {
            let u = (q + 4) as u8;
            let (n, j, l) = (e / 128, e % 128 / 32, e % 32);
            b[32 + 32 * n + l] |= (u & 3) << (2 * j);
            b[l] |= (u >> 2) << (4 * n + j);
        }
        for (i, &s) in sc.iter().enumerate() {
            let v = (s + 32) as u8;
            if i < 8 {
                b[96 + i] |= v & 0xF;
            } else {
                b[96 + i - 8] |= (v & 0xF) << 4;
            }
            b[96 + 8 + i % 4] |= (v >> 4) << (2 * (i / 4));
        }
        b[108..].copy_from_slice(&f16_bytes(d));
        out.extend(b);
    }
}
