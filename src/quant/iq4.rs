//! The non-linear 4-bit formats: each 4-bit code indexes [`LEVELS`], x = d level.
//! * IQ4_NL: 32 weights in 18 bytes, `d` (f16) then 16 bytes of codes (byte j: weight j in
//!   the low nibble, weight j + 16 in the high one, as Q4_0). GPU block, 5 words:
//!   [d (f16, low half)] [codes: 4 words].
//! * IQ4_XS: 256 weights in 136 bytes: `d` (f16), `scales_h` (u16: top 2 bits of sub-block
//!   s's 6-bit scale ls at bits 2s), `scales_l` (4 bytes: its low 4 bits in nibble s % 2 of
//!   byte s / 2), then 8 × 16 bytes of codes as IQ4_NL's; sub-block s has d_s = d (ls - 32).
//!   GPU: each sub-block in 5 words, [d_s (f32, exact)] [codes: 4 words].

use super::kquant::{fit_symmetric, QK_K};
use super::{
    dot_nibbles, f16_at, f16_bytes, signed_absmax, word_at, DotBlock, IntDot, QuantFormat,
    Quantizer,
};
use crate::gguf::GgmlType;

/// The 16 levels a code selects (ggml's `kvalues_iq4nl`).
pub const LEVELS: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The code of the level nearest `v` (in units of d).
fn nearest(v: f32) -> u8 {
    (0..16)
        .min_by(|&a, &b| {
            let da = (LEVELS[a as usize] as f32 - v).abs();
            let db = (LEVELS[b as usize] as f32 - v).abs();
            da.total_cmp(&db)
        })
        .unwrap()
}

/// 32 values from 16 code bytes scaled by `d`.
fn decode(d: f32, qs: &[u8], o: &mut [f32]) {
    for j in 0..16 {
        o[j] = d * LEVELS[(qs[j] & 0xF) as usize] as f32;
        o[j + 16] = d * LEVELS[(qs[j] >> 4) as usize] as f32;
    }
}

/// 16 code bytes for 32 codes.
fn pack(q: impl Fn(usize) -> u8) -> [u8; 16] {
    std::array::from_fn(|j| q(j) | q(j + 16) << 4)
}

#[allow(non_camel_case_types)]
pub struct IQ4_NL;

impl QuantFormat for IQ4_NL {
    fn ty(&self) -> GgmlType {
        GgmlType::Iq4Nl
    }
    fn file_block(&self) -> (usize, usize) {
        (32, 18)
    }
    fn gpu_block_words(&self) -> usize {
        5
    }
    fn gpu_head_words(&self) -> usize {
        1
    }
    fn repack(&self, row: &[u8], out: &mut Vec<u32>) {
        for blk in row.chunks_exact(18) {
            out.push(u16::from_le_bytes([blk[0], blk[1]]) as u32);
            out.extend((0..4).map(|i| word_at(blk, 2 + 4 * i)));
        }
    }
    fn dequantize(&self, src: &[u8], out: &mut [f32]) {
        for (blk, o) in src.chunks_exact(18).zip(out.chunks_exact_mut(32)) {
            decode(f16_at(blk, 0), &blk[2..], o);
        }
    }
    fn quantizer(&self) -> Option<Quantizer> {
        Some(quantize_nl)
    }
    fn wgsl(&self) -> &'static str {
        concat!(
            include_str!("../../shaders/weights/quant_iq4_nl.wgsl"),
            include_str!("../../shaders/weights/quant_iq4.wgsl")
        )
    }
    fn int_dot(&self) -> Option<IntDot> {
        Some(IntDot {
            wgsl: include_str!("../../shaders/weights/dot_iq4_nl.wgsl"),
            blocks: dot_blocks_nl,
        })
    }
}

/// The largest-magnitude weight maps to level -127; every weight to its nearest level.
fn quantize_nl(src: &[f32], out: &mut Vec<u8>) {
    for blk in src.chunks_exact(32) {
        let d = half::f16::from_f32(signed_absmax(blk) / -127.0).to_f32();
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend(f16_bytes(d));
        out.extend(pack(|j| nearest(blk[j] * id)));
    }
}

#[allow(non_camel_case_types)]
pub struct IQ4_XS;

/// Sub-block `s`'s scale d (ls - 32).
fn xs_scale(blk: &[u8], s: usize) -> f32 {
    let lo = (blk[4 + s / 2] >> (4 * (s % 2))) & 0xF;
    let hi = (u16::from_le_bytes([blk[2], blk[3]]) >> (2 * s)) & 3;
    f16_at(blk, 0) * ((lo as i32 | (hi as i32) << 4) - 32) as f32
}

impl QuantFormat for IQ4_XS {
    fn ty(&self) -> GgmlType {
        GgmlType::Iq4Xs
    }
    fn file_block(&self) -> (usize, usize) {
        (QK_K, 136)
    }
    fn gpu_block_words(&self) -> usize {
        5
    }
    fn gpu_head_words(&self) -> usize {
        1
    }
    fn repack(&self, row: &[u8], out: &mut Vec<u32>) {
        for blk in row.chunks_exact(136) {
            for s in 0..8 {
                out.push(xs_scale(blk, s).to_bits());
                out.extend((0..4).map(|i| word_at(blk, 8 + 16 * s + 4 * i)));
            }
        }
    }
    fn dequantize(&self, src: &[u8], out: &mut [f32]) {
        for (blk, o) in src.chunks_exact(136).zip(out.chunks_exact_mut(QK_K)) {
            for (s, o) in o.chunks_exact_mut(32).enumerate() {
                decode(xs_scale(blk, s), &blk[8 + 16 * s..], o);
            }
        }
    }
    fn quantizer(&self) -> Option<Quantizer> {
        Some(quantize_xs)
    }
    fn wgsl(&self) -> &'static str {
        concat!(
            include_str!("../../shaders/weights/quant_iq4_xs.wgsl"),
            include_str!("../../shaders/weights/quant_iq4.wgsl")
        )
    }
    fn int_dot(&self) -> Option<IntDot> {
        Some(IntDot {
            wgsl: include_str!("../../shaders/weights/dot_iq4_xs.wgsl"),
            blocks: dot_blocks_xs,
        })
    }
}

fn quantize_xs(src: &[f32], out: &mut Vec<u8>) {
    for blk in src.chunks_exact(QK_K) {
        let (d, ls, q) = fit_symmetric(blk, 32, 127.0, 31, |v| nearest(v) as i32);
        out.extend(f16_bytes(d));
        let hi = ls.iter().enumerate().fold(0u16, |acc, (s, &l)| {
            acc | (((l + 32) as u16 >> 4) << (2 * s))
        });
        out.extend(hi.to_le_bytes());
        out.extend(
            (0..4)
                .map(|i| ((ls[2 * i] + 32) as u8 & 0xF) | ((ls[2 * i + 1] + 32) as u8 & 0xF) << 4),
        );
        for s in 0..8 {
            out.extend(pack(|j| q[32 * s + j] as u8));
        }
    }
}

/// 32 codes from 16 code bytes as the signed levels the integer-dot kernel multiplies.
fn dot_levels(qs: &[u8]) -> [i32; 32] {
    dot_nibbles(qs, 0).map(|c| LEVELS[c as usize] as i32)
}

/// An IQ4_NL block as the integer-dot kernel multiplies it: x = d level.
fn dot_blocks_nl(b: &[u8], out: &mut Vec<DotBlock>) {
    out.push((dot_levels(&b[2..18]), (f16_at(b, 0), 0.0)));
}

/// IQ4_XS's eight sub-blocks as the integer-dot kernel multiplies them: x = d_s level.
fn dot_blocks_xs(b: &[u8], out: &mut Vec<DotBlock>) {
    out.extend((0..8).map(|s| (dot_levels(&b[8 + 16 * s..][..16]), (xs_scale(b, s), 0.0))));
}
