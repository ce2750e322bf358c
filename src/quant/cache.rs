//! The K/V cache formats: the element types a K or V cache can hold (`-ctk`, `-ctv`), how
//! their rows are laid out in GPU memory, each packed type's WGSL load and store snippet
//! ([`KvType::wgsl`], `shaders/cache/kv_<type>.wgsl`), and the CPU reference of both
//! ([`KvType::encode`], [`KvType::decode`]) that the tests, state files and byte counts go
//! by. The cache's configuration (`-fa`, which types a context takes) is `crate::kv`'s.
//!
//! # Layout
//! f32, f16 and bf16 rows are plain arrays (bf16: two values per 32-bit word, low half
//! first). The block types keep ggml's 32-value blocks and their exact byte count, but
//! re-laid on 32-bit words in *groups* of two blocks (64 values), since WGSL reads storage
//! in words and ggml's 18-, 22- and 34-byte blocks do not start on word boundaries:
//! `[codes of block 0][codes of block 1][high bits 0][high bits 1][scales]`. The codes are
//! ggml's bytes as they are (q8_0: 8 words a block, the 4-bit types: 4); the high bits
//! (q5_0, q5_1) a word per block; the scales either two f16 `d` in one word (q8_0, q4_0,
//! iq4_nl: block 0 in the low half) or a word of f16 `d` and `m` per block (q4_1, q5_1). A
//! row of a block type is then a whole number of groups, so cache rows need 64 | n_embd_kv
//! (llama.cpp needs 32 |), and a cell's row has exactly the bytes llama.cpp's has.

use crate::gguf::GgmlType;
use crate::quant::{self, IQ4_LEVELS};
use std::fmt;

/// A K or V cache element type, as llama.cpp's `--cache-type-k/-v` name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvType {
    F32,
    F16,
    Bf16,
    Q8_0,
    Q4_0,
    Q4_1,
    Iq4Nl,
    Q5_0,
    Q5_1,
}

/// Values per group of a block type: two ggml blocks.
pub const GROUP: usize = 64;

/// Largest head a packed cache type is written for (the writer stages one head).
pub const MAX_PACKED_HEAD: u32 = 256;

/// How a block type's group is laid out (see the module docs).
struct Group {
    /// Code words per block.
    codes: usize,
    /// A word of high bits per block (the 5-bit types).
    high: bool,
    /// A word of (d, m) per block; else both blocks' d share one word.
    min: bool,
}

impl KvType {
    /// Every type, in llama.cpp's order of `--cache-type-k` values.
    pub const ALL: [KvType; 9] = [
        KvType::F32,
        KvType::F16,
        KvType::Bf16,
        KvType::Q8_0,
        KvType::Q4_0,
        KvType::Q4_1,
        KvType::Iq4Nl,
        KvType::Q5_0,
        KvType::Q5_1,
    ];

    /// The name llama.cpp's flags use (`q8_0`).
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Bf16 => "bf16",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
            KvType::Q4_1 => "q4_1",
            KvType::Iq4Nl => "iq4_nl",
            KvType::Q5_0 => "q5_0",
            KvType::Q5_1 => "q5_1",
        }
    }

    /// Parses a flag value (any case), or says which values there are.
    pub fn parse(s: &str) -> Result<KvType, String> {
        Self::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                format!(
                    "unknown cache type '{s}'; the cache types are {}",
                    Self::ALL.map(KvType::name).join(", ")
                )
            })
    }

    pub fn ggml(self) -> GgmlType {
        match self {
            KvType::F32 => GgmlType::F32,
            KvType::F16 => GgmlType::F16,
            KvType::Bf16 => GgmlType::Bf16,
            KvType::Q8_0 => GgmlType::Q8_0,
            KvType::Q4_0 => GgmlType::Q4_0,
            KvType::Q4_1 => GgmlType::Q4_1,
            KvType::Iq4Nl => GgmlType::Iq4Nl,
            KvType::Q5_0 => GgmlType::Q5_0,
            KvType::Q5_1 => GgmlType::Q5_1,
        }
    }

    /// The type with ggml type id `id` (state files record these).
    pub fn from_ggml_id(id: u32) -> Option<KvType> {
        let ty = GgmlType::from_id(id);
        Self::ALL.into_iter().find(|t| t.ggml() == ty)
    }

    /// ggml's type id.
    pub fn ggml_id(self) -> u32 {
        (0..64)
            .find(|&i| GgmlType::from_id(i) == self.ggml())
            .expect("every cache type has a ggml id")
    }

    /// The packed type's WGSL: a load part (`{P}_load4`), a `// @store` line, a store part
    /// (`{P}_store_block`), written over `shaders/cache/kv_common.wgsl`'s helpers; None for
    /// f32 and f16, which kernels read and write as plain arrays.
    pub fn wgsl(self) -> Option<&'static str> {
        Some(match self {
            KvType::F32 | KvType::F16 => return None,
            KvType::Bf16 => include_str!("../../shaders/cache/kv_bf16.wgsl"),
            KvType::Q8_0 => include_str!("../../shaders/cache/kv_q8_0.wgsl"),
            KvType::Q4_0 => include_str!("../../shaders/cache/kv_q4_0.wgsl"),
            KvType::Q4_1 => include_str!("../../shaders/cache/kv_q4_1.wgsl"),
            KvType::Iq4Nl => include_str!("../../shaders/cache/kv_iq4_nl.wgsl"),
            KvType::Q5_0 => include_str!("../../shaders/cache/kv_q5_0.wgsl"),
            KvType::Q5_1 => include_str!("../../shaders/cache/kv_q5_1.wgsl"),
        })
    }

    /// A block type: ggml's `ggml_is_quantized` (a quantized V needs flash attention).
    pub fn is_quantized(self) -> bool {
        self.group().is_some()
    }

    /// Stored as 32-bit words written a block of 32 values at a time (bf16 and the block
    /// types) rather than one value per element (f32, f16).
    pub fn is_packed(self) -> bool {
        !matches!(self, KvType::F32 | KvType::F16)
    }

    fn group(self) -> Option<Group> {
        let g = |codes, high, min| Some(Group { codes, high, min });
        match self {
            KvType::Q8_0 => g(8, false, false),
            KvType::Q4_0 | KvType::Iq4Nl => g(4, false, false),
            KvType::Q4_1 => g(4, false, true),
            KvType::Q5_0 => g(4, true, false),
            KvType::Q5_1 => g(4, true, true),
            _ => None,
        }
    }

    /// 32-bit words of a group of [`GROUP`] values (block types only).
    pub fn group_words(self) -> Option<usize> {
        self.group()
            .map(|g| 2 * g.codes + 2 * g.high as usize + if g.min { 2 } else { 1 })
    }

    /// Why a cache of this type cannot hold heads of `head_dim` values in rows of
    /// `n_embd` (all K or V heads of a cell), if it cannot. Packed types are written a
    /// 32-value block at a time by the workgroup that holds one head (of up to
    /// [`MAX_PACKED_HEAD`] values), and the block types' rows are whole groups.
    pub fn check_shape(self, head_dim: u32, n_embd: u32) -> Result<(), String> {
        let why = if self.is_packed() && !head_dim.is_multiple_of(32) {
            format!("heads of a multiple of 32 values, and this model's have {head_dim}")
        } else if self.is_packed() && head_dim > MAX_PACKED_HEAD {
            format!("heads of at most {MAX_PACKED_HEAD} values, and this model's have {head_dim}")
        } else if self.is_quantized() && !n_embd.is_multiple_of(GROUP as u32) {
            format!("rows in groups of {GROUP} values, and this model's K/V rows have {n_embd}")
        } else {
            return Ok(());
        };
        Err(format!(
            "a {} cache needs {why}; use f16 or f32",
            self.name()
        ))
    }

    /// Bytes of a row of `n` values (a multiple of 4 wherever [`Self::check_shape`] passes).
    pub fn row_bytes(self, n: u64) -> u64 {
        match self.group_words() {
            Some(w) => n / GROUP as u64 * w as u64 * 4,
            None if self == KvType::F32 => 4 * n,
            None => 2 * n,
        }
    }

    /// The cache words of ggml's row bytes `src` (whole blocks; packed types only, f16
    /// and f32 rows are their bytes).
    pub fn from_ggml(self, src: &[u8]) -> Vec<u32> {
        let words = |b: &[u8]| -> Vec<u32> {
            b.chunks_exact(4)
                .map(|w| u32::from_le_bytes(w.try_into().unwrap()))
                .collect()
        };
        let Some(g) = self.group() else {
            return words(src);
        };
        let (_, bb) = self.ggml().block_layout().unwrap();
        let head = if g.min { 4 } else { 2 };
        let mut out = Vec::with_capacity(src.len() / 4);
        for pair in src.chunks_exact(2 * bb) {
            let blocks = [&pair[..bb], &pair[bb..]];
            for b in blocks {
                let off = head + 4 * g.high as usize;
                out.extend(words(&b[off..]));
            }
            if g.high {
                for b in blocks {
                    out.extend(words(&b[head..head + 4]));
                }
            }
            if g.min {
                blocks.iter().for_each(|b| out.extend(words(&b[..4])));
            } else {
                out.push(u32::from_le_bytes([
                    blocks[0][0],
                    blocks[0][1],
                    blocks[1][0],
                    blocks[1][1],
                ]));
            }
        }
        out
    }

    /// ggml's row bytes of cache words (the inverse of [`Self::from_ggml`]).
    pub fn to_ggml(self, src: &[u32]) -> Vec<u8> {
        let bytes = |w: &[u32]| w.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>();
        let (Some(g), Some(gw)) = (self.group(), self.group_words()) else {
            return bytes(src);
        };
        let mut out = Vec::with_capacity(src.len() * 4);
        for grp in src.chunks_exact(gw) {
            let high = 2 * g.codes;
            let scales = high + 2 * g.high as usize;
            for s in 0..2 {
                if g.min {
                    out.extend(grp[scales + s].to_le_bytes());
                } else {
                    out.extend(&grp[scales].to_le_bytes()[2 * s..2 * s + 2]);
                }
                if g.high {
                    out.extend(grp[high + s].to_le_bytes());
                }
                out.extend(bytes(&grp[s * g.codes..(s + 1) * g.codes]));
            }
        }
        out
    }

    /// CPU reference of a cache write: `x` (a whole row) as this type's cache words. The
    /// block types quantize as llama.cpp's Vulkan backend does on a cache write (for all
    /// but iq4_nl, the same as ggml's reference quantizers).
    pub fn encode(self, x: &[f32]) -> Vec<u32> {
        let bytes: Vec<u8> = match self {
            KvType::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
            KvType::F16 => x
                .iter()
                .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                .collect(),
            KvType::Bf16 => x.iter().flat_map(|&v| bf16_bits(v).to_le_bytes()).collect(),
            KvType::Iq4Nl => x.chunks_exact(32).flat_map(iq4_nl_block).collect(),
            _ => quant::quantize_row(self.ggml(), x),
        };
        self.from_ggml(&bytes)
    }

    /// CPU reference of a cache read: the values of cache words `w` (whole rows).
    pub fn decode(self, w: &[u32]) -> Vec<f32> {
        let bytes = self.to_ggml(w);
        let (bs, bb) = self.ggml().block_layout().unwrap();
        let mut out = vec![0f32; bytes.len() / bb * bs];
        quant::dequantize_row(self.ggml(), &bytes, &mut out);
        out
    }
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// ggml's f32 -> bf16 rounding (nearest even; NaN stays NaN).
pub fn bf16_bits(v: f32) -> u16 {
    let u = v.to_bits();
    if v.is_nan() {
        return ((u >> 16) | 64) as u16;
    }
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

/// One iq4_nl block as llama.cpp's Vulkan cache write makes it: the largest-magnitude
/// value sets d = max / -127, each value takes its nearest level, then d is refitted by
/// least squares weighted by x².
fn iq4_nl_block(x: &[f32]) -> Vec<u8> {
    let vmax = quant::signed_absmax(x);
    let d = vmax / IQ4_LEVELS[0] as f32;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let codes: Vec<u8> = x.iter().map(|&v| iq4_nearest(v * id)).collect();
    let (mut sumqx, mut sumq2) = (0f32, 0f32);
    for (&v, &c) in x.iter().zip(&codes) {
        let l = IQ4_LEVELS[c as usize] as f32;
        let w = v * v;
        sumqx += w * l * v;
        sumq2 += w * l * l;
    }
    let d = if sumq2 > 0.0 { sumqx / sumq2 } else { d };
    let mut out = half::f16::from_f32(d).to_le_bytes().to_vec();
    out.extend((0..16).map(|j| codes[j] | codes[j + 16] << 4));
    out
}

/// The level nearest `x` (ties to the lower), by bisection as the Vulkan shader finds it.
fn iq4_nearest(x: f32) -> u8 {
    let l = |i: usize| IQ4_LEVELS[i] as f32;
    if x <= l(0) {
        return 0;
    }
    if x >= l(15) {
        return 15;
    }
    let (mut lo, mut hi) = (0, 15);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < l(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - l(hi - 1) < l(hi) - x {
        (hi - 1) as u8
    } else {
        hi as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32 - 0.5) * 4.0
            })
            .collect()
    }

    #[test]
    fn rows_keep_llama_cpps_byte_count() {
        for ty in KvType::ALL {
            let n = 192;
            let ggml = ty.ggml().row_bytes(n).unwrap();
            assert_eq!(ty.row_bytes(n), ggml, "{ty}");
            assert_eq!(
                ty.encode(&values(n as usize, 1)).len() as u64 * 4,
                ggml,
                "{ty}"
            );
        }
    }

    #[test]
    fn layout_round_trips_ggml_bytes() {
        for ty in KvType::ALL.into_iter().filter(|t| t.is_quantized()) {
            let x = values(128, 7);
            let bytes = quant::quantize_row(ty.ggml(), &x);
            assert_eq!(ty.to_ggml(&ty.from_ggml(&bytes)), bytes, "{ty}");
        }
    }

    #[test]
    fn encode_then_decode_is_close() {
        for ty in KvType::ALL {
            let x = values(256, 3);
            let y = ty.decode(&ty.encode(&x));
            let err: f32 = x.iter().zip(&y).map(|(a, b)| (a - b).powi(2)).sum();
            let norm: f32 = x.iter().map(|a| a * a).sum();
            let tol = match ty {
                KvType::F32 => 1e-6,
                KvType::F16 => 1e-3,
                KvType::Bf16 | KvType::Q8_0 => 1e-2,
                KvType::Q5_0 | KvType::Q5_1 => 0.05,
                _ => 0.1,
            };
            assert!((err / norm).sqrt() < tol, "{ty}: {}", (err / norm).sqrt());
        }
    }

    /// Exactly the packed types have a snippet, each with both parts.
    #[test]
    fn packed_types_have_their_snippet() {
        for ty in KvType::ALL {
            match ty.wgsl() {
                Some(src) => {
                    assert!(ty.is_packed(), "{ty}");
                    let (load, store) = src.split_once("// @store\n").expect("a @store line");
                    assert!(load.contains("fn {{P}}_load4("), "{ty}: load part");
                    assert!(store.contains("fn {{P}}_store_block("), "{ty}: store part");
                }
                None => assert!(!ty.is_packed(), "{ty}"),
            }
        }
    }

    #[test]
    fn parse_names_and_refusals() {
        for ty in KvType::ALL {
            assert_eq!(KvType::parse(&ty.name().to_uppercase()), Ok(ty));
            assert_eq!(KvType::from_ggml_id(ty.ggml_id()), Some(ty));
        }
        assert!(KvType::parse("q4_k").unwrap_err().contains("q8_0"));
        assert!(KvType::Q8_0.check_shape(64, 96).is_err());
        assert!(KvType::Q8_0.check_shape(64, 192).is_ok());
        assert!(KvType::Bf16.check_shape(80, 160).is_err());
        assert!(KvType::F16.check_shape(80, 160).is_ok());
    }
}
