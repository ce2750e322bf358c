//! What the 256-weight formats share: the 6-bit scale packing of Q4_K/Q5_K and simple
//! reference quantizers (one scale per sub-block, the sub-block scales themselves
//! quantized against the super-block's f16 `d`). These quantizers make valid blocks for
//! tests and synthetic models; they do not search scales as llama-quantize does.

use super::{min_max, signed_absmax};

/// Weights per file block of every k-quant.
pub const QK_K: usize = 256;

/// The 6-bit (scale, min) of sub-block `j` (0..8) from the 12 packed bytes of Q4_K/Q5_K:
/// sub-blocks 0..3 in the low 6 bits of bytes j and j + 4; sub-blocks 4..7 in the nibbles
/// of byte j + 4 with their top 2 bits in the top bits of bytes j - 4 and j.
pub fn k4_scale_min(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | (s[j - 4] >> 6) << 4,
            (s[j + 4] >> 4) | (s[j] >> 6) << 4,
        )
    }
}

/// The 12 bytes [`k4_scale_min`] reads back as `sc`, `m` (each below 64).
pub fn k4_pack(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = sc[j] | (sc[j + 4] >> 4) << 6;
        s[j + 4] = m[j] | (m[j + 4] >> 4) << 6;
        s[j + 8] = (sc[j + 4] & 0xF) | (m[j + 4] & 0xF) << 4;
    }
    s
}

fn f16_round(v: f32) -> f32 {
    half::f16::from_f32(v).to_f32()
}

/// An affine fit of one 256-weight block, see [`fit_affine`].
pub struct Affine {
    pub d: f32,
    pub dmin: f32,
    pub sc: Vec<u8>,
    pub m: Vec<u8>,
    pub q: Vec<u8>,
}

/// x ≈ (d sc) q - (dmin m) with q in 0..=qmax per sub-block of `sub` weights, sc and m in
/// 0..=smax: d, dmin (f16-exact), sc and m per sub-block, q per weight. A sub-block's min
/// is taken at most 0, as m is unsigned.
pub fn fit_affine(blk: &[f32], sub: usize, qmax: u8, smax: u8) -> Affine {
    let fits: Vec<(f32, f32)> = blk
        .chunks_exact(sub)
        .map(|c| {
            let (lo, hi) = min_max(c);
            let lo = lo.min(0.0);
            ((hi - lo) / qmax as f32, -lo)
        })
        .collect();
    let smax_f = smax as f32;
    let d = f16_round(fits.iter().map(|f| f.0).fold(0.0, f32::max) / smax_f);
    let dmin = f16_round(fits.iter().map(|f| f.1).fold(0.0, f32::max) / smax_f);
    let code = |v: f32, unit: f32| {
        if unit > 0.0 {
            (v / unit).round().clamp(0.0, smax_f) as u8
        } else {
            0
        }
    };
    let sc: Vec<u8> = fits.iter().map(|f| code(f.0, d)).collect();
    let m: Vec<u8> = fits.iter().map(|f| code(f.1, dmin)).collect();
    let q = blk
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            let (s, o) = (d * sc[i / sub] as f32, dmin * m[i / sub] as f32);
            if s > 0.0 {
                ((x + o) / s).round().clamp(0.0, qmax as f32) as u8
            } else {
                0
            }
        })
        .collect();
    Affine { d, dmin, sc, m, q }
}

/// x ≈ (d sc) q per sub-block of `sub` weights, with sc in -smax..=smax and q in
/// -qneg..qneg: the largest-magnitude weight of a sub-block maps to about -qneg.
/// `snap(v)` picks the code for v = x / (d sc) (rounding, or the nearest level).
/// Returns (d, sc per sub-block, code per weight), d f16-exact.
pub fn fit_symmetric(
    blk: &[f32],
    sub: usize,
    qneg: f32,
    smax: i32,
    snap: impl Fn(f32) -> i32,
) -> (f32, Vec<i32>, Vec<i32>) {
    let s: Vec<f32> = blk
        .chunks_exact(sub)
        .map(|c| signed_absmax(c) / -qneg)
        .collect();
    let big = s.iter().copied().fold(0f32, |m, v| m.max(v.abs()));
    let d = f16_round(big / smax as f32);
    let sc: Vec<i32> = s
        .iter()
        .map(|&v| {
            if d > 0.0 {
                ((v / d).round() as i32).clamp(-smax, smax)
            } else {
                0
            }
        })
        .collect();
    let q = blk
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            let step = d * sc[i / sub] as f32;
            if step != 0.0 {
                snap(x / step)
            } else {
                snap(0.0)
            }
        })
        .collect();
    (d, sc, q)
}
