//! Q5_K: 256 weights in 176 bytes: `d`, `dmin` (f16), `scales` (12 bytes, as Q4_K's),
//! `qh` (32 bytes: bit s of byte l is the 5th bit of weight l of sub-block s), `qs` (128
//! bytes: the low 4 bits, laid out as Q4_K's); x = (d sc_s) q - (dmin m_s).
//! GPU: each 32-weight sub-block in 7 words, [d sc (f32)] [-(dmin m) (f32)] [5th bits:
//! bit j for weight j] [nibbles: 4 words]; exact as Q4_K's.

use super::kquant::{fit_affine, k4_pack, k4_scale_min, QK_K};
use super::{bit_word, f16_at, f16_bytes, nibble_words, DotBlock, IntDot, QuantFormat, Quantizer};
use crate::gguf::GgmlType;

pub struct Q5K;

const BYTES: usize = 176;

fn sub_block(blk: &[u8], s: usize) -> (f32, f32, [u8; 32]) {
    let (sc, m) = k4_scale_min(&blk[4..16], s);
    let qh = &blk[16..48];
    let qs = &blk[48 + 32 * (s / 2)..][..32];
    let q = std::array::from_fn(|l| (qs[l] >> (4 * (s % 2))) & 0xF | ((qh[l] >> s) & 1) << 4);
    (f16_at(blk, 0) * sc as f32, f16_at(blk, 2) * m as f32, q)
}

impl QuantFormat for Q5K {
    fn ty(&self) -> GgmlType {
        GgmlType::Q5K
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
            for s in 0..8 {
                let (d, m, q) = sub_block(blk, s);
                out.extend([d.to_bits(), (-m).to_bits(), bit_word(4, |j| q[j])]);
                out.extend(nibble_words(|j| q[j]));
            }
        }
    }
    fn dequantize(&self, src: &[u8], out: &mut [f32]) {
        for (blk, o) in src.chunks_exact(BYTES).zip(out.chunks_exact_mut(QK_K)) {
            for (s, o) in o.chunks_exact_mut(32).enumerate() {
                let (d, m, q) = sub_block(blk, s);
                for (o, q) in o.iter_mut().zip(q) {
                    *o = d * q as f32 - m;
                }
            }
        }
    }
    fn quantizer(&self) -> Option<Quantizer> {
        Some(quantize)
    }
    fn wgsl(&self) -> &'static str {
        concat!(
            include_str!("../../shaders/weights/quant_q5_k.wgsl"),
            include_str!("../../shaders/weights/quant_q5.wgsl")
        )
    }
    fn int_dot(&self) -> Option<IntDot> {
        Some(IntDot {
            wgsl: include_str!("../../shaders/weights/dot_q5_k.wgsl"),
            blocks: dot_blocks,
        })
    }
}

fn quantize(src: &[f32], out: &mut Vec<u8>) {
    for blk in src.chunks_exact(QK_K) {
        let f = fit_affine(blk, 32, 31, 63);
        out.extend(f16_bytes(f.d));
        out.extend(f16_bytes(f.dmin));
        out.extend(k4_pack(
            &f.sc[..].try_into().unwrap(),
            &f.m[..].try_into().unwrap(),
        ));
        let (mut qh, mut qs) = ([0u8; 32], [0u8; 128]);
        for (i, &q) in f.q.iter().enumerate() {
            let (s, l) = (i / 32, i % 32);
            qs[32 * (s / 2) + l] |= (q & 0xF) << (4 * (s % 2));
            qh[l] |= (q >> 4) << s;
        }
        out.extend(qh);
        out.extend(qs);
    }
}

/// The eight sub-blocks as the integer-dot kernel multiplies them: x = (d sc) q - dmin m.
fn dot_blocks(b: &[u8], out: &mut Vec<DotBlock>) {
    out.extend((0..8).map(|s| {
        let (d, m, q) = sub_block(b, s);
        (q.map(i32::from), (d, -m))
    }));
}
