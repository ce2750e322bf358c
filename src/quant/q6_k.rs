//! Q6_K: 256 weights in 210 bytes: `ql` (128 bytes: low 4 bits), `qh` (64 bytes: high 2
//! bits), `scales` (16 × i8, one per 16 weights), `d` (f16); x = (d sc) (q - 32).
//! In each half (128 weights, n = 0, 1), weight 32k + l (k = 0..3) has its low bits in
//! nibble k / 2 of ql byte 64n + 32 (k % 2) + l and its high bits at bits 2k of qh byte
//! 32n + l.
//! GPU: each 32-weight sub-block in 7 words, a head of three, [d (f16, low half), sc0, sc1
//! (i8, bytes 2, 3)] [high 2 bits of weights 0..15] [of weights 16..31], and a body of the
//! low 4 bits in 4 nibble words.
//! d sc is exact in f32, so the GPU computes the file's values.

use super::kquant::{fit_symmetric, QK_K};
use super::{f16_at, f16_bytes, nibble_words, pair_word, QuantFormat, Quantizer};
use crate::gguf::GgmlType;

pub struct Q6K;

const BYTES: usize = 210;

/// Weight `e`'s 6-bit code (q, before subtracting 32).
fn code(blk: &[u8], e: usize) -> u8 {
    let (n, k, l) = (e / 128, e % 128 / 32, e % 32);
    let lo = (blk[64 * n + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0xF;
    let hi = (blk[128 + 32 * n + l] >> (2 * k)) & 3;
    lo | hi << 4
}

fn scale(blk: &[u8], i: usize) -> i8 {
    blk[192 + i] as i8
}

impl QuantFormat for Q6K {
    fn ty(&self) -> GgmlType {
        GgmlType::Q6K
    }
    fn file_block(&self) -> (usize, usize) {
        (QK_K, BYTES)
    }
    fn gpu_block_words(&self) -> usize {
        7
    }
    fn gpu_head_words(&self) -> usize {
        3
    }
    fn repack(&self, row: &[u8], out: &mut Vec<u32>) {
        for blk in row.chunks_exact(BYTES) {
            let d = u16::from_le_bytes([blk[208], blk[209]]) as u32;
            for s in 0..8 {
                let q = |j: usize| code(blk, 32 * s + j);
                let (s0, s1) = (scale(blk, 2 * s) as u8, scale(blk, 2 * s + 1) as u8);
                out.push(d | (s0 as u32) << 16 | (s1 as u32) << 24);
                out.extend([pair_word(0, |j| q(j) >> 4), pair_word(16, |j| q(j) >> 4)]);
                out.extend(nibble_words(q));
            }
        }
    }
    fn dequantize(&self, src: &[u8], out: &mut [f32]) {
        for (blk, o) in src.chunks_exact(BYTES).zip(out.chunks_exact_mut(QK_K)) {
            let d = f16_at(blk, 208);
            for (e, o) in o.iter_mut().enumerate() {
                let dl = d * scale(blk, e / 16) as f32;
                *o = dl * (code(blk, e) as i32 - 32) as f32;
            }
        }
    }
    fn quantizer(&self) -> Option<Quantizer> {
        Some(quantize)
    }
    fn wgsl(&self) -> &'static str {
        include_str!("../../shaders/weights/quant_q6_k.wgsl")
    }
}

fn quantize(src: &[f32], out: &mut Vec<u8>) {
    for blk in src.chunks_exact(QK_K) {
        let (d, sc, q) = fit_symmetric(blk, 16, 32.0, 127, |v| (v.round() as i32).clamp(-32, 31));
        let mut b = [0u8; BYTES];
        for (e, &q) in q.iter().enumerate() {
            let u = (q + 32) as u8;
            let (n, k, l) = (e / 128, e % 128 / 32, e % 32);
            b[64 * n + 32 * (k % 2) + l] |= (u & 0xF) << (4 * (k / 2));
            b[128 + 32 * n + l] |= (u >> 4) << (2 * k);
        }
        for (i, &s) in sc.iter().enumerate() {
            b[192 + i] = s as i8 as u8;
        }
        b[208..].copy_from_slice(&f16_bytes(d));
        out.extend(b);
    }
}
