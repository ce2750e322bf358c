//! MXFP4 (OCP microscaling FP4, gpt-oss's expert weights): 32 weights in 17 bytes, an E8M0
//! exponent `e` (byte 0), then 16 bytes of 4-bit E2M1 codes (byte j: weight j in the low
//! nibble, weight j + 16 in the high one, as Q4_0). ggml stores the codes' values doubled
//! ([`LEVELS`]: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives, times 2) and halves the
//! scale instead: x = LEVELS[code] 2^(e - 128).
//!
//! GPU block, 5 words: [scale (f32, exact: a power of two)] [codes: 4 words]; the codes
//! index the levels as IQ4_NL's do (`quant_iq4.wgsl`).

use super::{word_at, QuantFormat, Quantizer};
use crate::gguf::GgmlType;

/// The doubled E2M1 values a code selects (ggml's `kvalues_mxfp4`).
pub const LEVELS: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Half the E8M0 scale `e` as f32: 2^(e - 128), a subnormal for e < 2 (e = 255 gives
/// 2^127, as ggml computes it).
pub fn half_scale(e: u8) -> f32 {
    if e < 2 {
        f32::from_bits(0x0020_0000 << e)
    } else {
        f32::from_bits(((e as u32) - 1) << 23)
    }
}

fn decode(d: f32, qs: &[u8], o: &mut [f32]) {
    for j in 0..16 {
        o[j] = LEVELS[(qs[j] & 0xF) as usize] as f32 * d;
        o[j + 16] = LEVELS[(qs[j] >> 4) as usize] as f32 * d;
    }
}

pub struct MXFP4;

impl QuantFormat for MXFP4 {
    fn ty(&self) -> GgmlType {
        GgmlType::Mxfp4
    }
    fn file_block(&self) -> (usize, usize) {
        (32, 17)
    }
    fn gpu_block_words(&self) -> usize {
        5
    }
    fn gpu_head_words(&self) -> usize {
        1
    }
    fn repack(&self, row: &[u8], out: &mut Vec<u32>) {
        for blk in row.chunks_exact(17) {
            out.push(half_scale(blk[0]).to_bits());
            out.extend((0..4).map(|i| word_at(blk, 1 + 4 * i)));
        }
    }
    fn dequantize(&self, src: &[u8], out: &mut [f32]) {
        for (blk, o) in src.chunks_exact(17).zip(out.chunks_exact_mut(32)) {
            decode(half_scale(blk[0]), &blk[1..], o);
        }
    }
    fn quantizer(&self) -> Option<Quantizer> {
        Some(quantize)
    }
    fn wgsl(&self) -> &'static str {
        concat!(
            include_str!("../../shaders/weights/quant_mxfp4.wgsl"),
            include_str!("../../shaders/weights/quant_iq4.wgsl")
        )
    }
}

/// The code whose level times `d` is nearest `x`, the first of equals (so 0 is code 0,
/// never the negative zero), as ggml chooses.
fn nearest(x: f32, d: f32) -> u8 {
    let mut best = 0;
    let mut best_err = (LEVELS[0] as f32 * d - x).abs();
    for (i, &l) in LEVELS.iter().enumerate().skip(1) {
        let err = (l as f32 * d - x).abs();
        if err < best_err {
            best = i as u8;
            best_err = err;
        }
    }
    best
}

/// ggml's reference quantizer: the exponent puts the block's largest magnitude in the top
/// level's binade (e = floor(log2 amax) - 2 + 127, so values up to 1.5 2^k keep their
/// level and larger ones saturate at 12 d), each weight to its nearest level. Blocks of
/// magnitude under 2^-125 (where ggml's conversion is undefined) get e = 0.
fn quantize(src: &[f32], out: &mut Vec<u8>) {
    for blk in src.chunks_exact(32) {
        let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
        let e = if amax > 0.0 {
            (amax.log2().floor() - 2.0 + 127.0).clamp(0.0, 254.0) as u8
        } else {
            0
        };
        let d = half_scale(e);
        out.push(e);
        out.extend((0..16).map(|j| nearest(blk[j], d) | nearest(blk[j + 16], d) << 4));
    }
}
