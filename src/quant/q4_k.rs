//! Q4_K: 256 weights in 144 bytes: `d`, `dmin` (f16), `scales` (12 bytes: eight 6-bit
//! scales sc and mins m, see [`k4_scale_min`]), `qs` (128 bytes). Sub-block s (weights
//! 32s..32s+31) is made of the low nibbles (s even) or high nibbles (s odd) of qs bytes
//! 32(s/2)..; x = (d sc_s) q - (dmin m_s).
//! GPU: each sub-block in 6 words, [d sc (f32)] [-(dmin m) (f32)] [nibbles: 4 words].
//! Both products are exact in f32 (11 by 6 bits), so the GPU's values are the file's.

use super::kquant::{fit_affine, k4_pack, k4_scale_min, QK_K};
use super::{f16_at, f16_bytes, nibble_words, DotBlock, IntDot, QuantFormat, Quantizer};
use crate::gguf::GgmlType;

pub struct Q4K;

const BYTES: usize = 144;

/// Sub-block `s`'s (scale, offset) and its 32 quants.
fn sub_block(blk: &[u8], s: usize) -> (f32, f32, [u8; 32]) {
    let (sc, m) = k4_scale_min(&blk[4..16], s);
    let qs = &blk[16 + 32 * (s / 2)..][..32];
    let q = std::array::from_fn(|l| (qs[l] >> (4 * (s % 2))) & 0xF);
    (f16_at(blk, 0) * sc as f32, f16_at(blk, 2) * m as f32, q)
}

impl QuantFormat for Q4K {
    fn ty(&self) -> GgmlType {
        GgmlType::Q4K
    }
    fn file_block(&self) -> (usize, usize) {
        (QK_K, BYTES)
    }
    fn gpu_block_words(&self) -> usize {
        6
    }
    fn gpu_head_words(&self) -> usize {
        2
    }
    fn repack(&self, row: &[u8], out: &mut Vec<u32>) {
        for blk in row.chunks_exact(BYTES) {
            for s in 0..8 {
                let (d, m, q) = sub_block(blk, s);
                out.extend([d.to_bits(), (-m).to_bits()]);
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
            include_str!("../../shaders/weights/quant_q4_k.wgsl"),
            include_str!("../../shaders/weights/quant_q4.wgsl")
        )
    }
    fn int_dot(&self) -> Option<IntDot> {
        Some(IntDot {
            wgsl: include_str!("../../shaders/weights/dot_q4_k.wgsl"),
            blocks: dot_blocks,
        })
    }
}

fn quantize(src: &[f32], out: &mut Vec<u8>) {
    for blk in src.chunks_exact(QK_K) {
        let f = fit_affine(blk, 32, 15, 63);
        out.extend(f16_bytes(f.d));
        out.extend(f16_bytes(f.dmin));
        out.extend(k4_pack(
            &f.sc[..].try_into().unwrap(),
            &f.m[..].try_into().unwrap(),
        ));
        let mut qs = [0u8; 128];
        for (i, &q) in f.q.iter().enumerate() {
            let s = i / 32;
            qs[32 * (s / 2) + i % 32] |= q << (4 * (s % 2));
        }
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
