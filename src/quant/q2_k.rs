//! Q2_K: 256 weights in 84 bytes: `scales` (16 bytes, one per 16 weights: sc in the low
//! nibble, m in the high one), `qs` (64 bytes of 2-bit codes), `d`, `dmin` (f16);
//! x = (d sc) q - (dmin m). In each half (128 weights, n = 0, 1), weight 32j + l
//! (j = 0..3) is at bits 2j of qs byte 32n + l.
//! GPU: each 32-weight sub-block in 4 words, [d, dmin (f16 pair)] [its two scale bytes]
//! [codes of weights 0..15] [of weights 16..31]; the products are exact in f32.

use super::kquant::{fit_affine, QK_K};
use super::{f16_at, f16_bytes, pair_word, word_at, QuantFormat, Quantizer};
use crate::gguf::GgmlType;

pub struct Q2K;

const BYTES: usize = 84;

fn code(blk: &[u8], e: usize) -> u8 {
    let (n, j, l) = (e / 128, e % 128 / 32, e % 32);
    (blk[16 + 32 * n + l] >> (2 * j)) & 3
}

impl QuantFormat for Q2K {
    fn ty(&self) -> GgmlType {
        GgmlType::Q2K
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
            let dm = word_at(blk, 80);
            for s in 0..8 {
                let q = |j: usize| code(blk, 32 * s + j);
                let sc = u16::from_le_bytes([blk[2 * s], blk[2 * s + 1]]) as u32;
                out.extend([dm, sc, pair_word(0, q), pair_word(16, q)]);
            }
        }
    }
    fn dequantize(&self, src: &[u8], out: &mut [f32]) {
        for (blk, o) in src.chunks_exact(BYTES).zip(out.chunks_exact_mut(QK_K)) {
            let (d, dmin) = (f16_at(blk, 80), f16_at(blk, 82));
            for (e, o) in o.iter_mut().enumerate() {
                let sc = blk[e / 16];
                let (dl, ml) = (d * (sc & 0xF) as f32, dmin * (sc >> 4) as f32);
                *o = dl * code(blk, e) as f32 - ml;
            }
        }
    }
    fn quantizer(&self) -> Option<Quantizer> {
        Some(quantize)
    }
    fn wgsl(&self) -> &'static str {
        include_str!("../../shaders/weights/quant_q2_k.wgsl")
    }
}

fn quantize(src: &[f32], out: &mut Vec<u8>) {
    for blk in src.chunks_exact(QK_K) {
        let f = fit_affine(blk, 16, 3, 15);
        let mut b = [0u8; BYTES];
        for (b, (sc, m)) in b.iter_mut().zip(f.sc.iter().zip(&f.m)) {
            *b = sc | m << 4;
        }
        for (e, &q) in f.q.iter().enumerate() {
            let (n, j, l) = (e / 128, e % 128 / 32, e % 32);
            b[16 + 32 * n + l] |= q << (2 * j);
        }
        b[80..82].copy_from_slice(&f16_bytes(f.d));
        b[82..].copy_from_slice(&f16_bytes(f.dmin));
        out.extend(b);
    }
}
