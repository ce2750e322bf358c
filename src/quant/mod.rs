//! Weight formats: one [`QuantFormat`] implementation per type the kernels can read, all
//! listed in [`FORMATS`]. Everything type-specific lives in that one implementation (and
//! its WGSL snippet); the rest of the crate asks the registry.
//!
//! # The contract every format keeps
//!
//! * **File side.** A tensor row is a whole number of *file blocks* ([`QuantFormat::file_block`],
//!   the layout GGUF stores, see `GgmlType::block_layout`). [`QuantFormat::dequantize`] is the
//!   CPU reference the tests compare the GPU against; [`QuantFormat::quantizer`] exists where
//!   we can make test and synthetic weights of the type.
//! * **GPU side.** The GPU layout may differ from the file's: [`QuantFormat::repack`] re-lays a
//!   row out once at upload. It stays quantized (never a dequantized copy). Every kernel reads
//!   every type the same way: a row is *GPU blocks* of [`GPU_BLOCK`] = 32 elements, each
//!   [`QuantFormat::gpu_block_words`] 32-bit words, with every field starting on a word
//!   boundary (WGSL storage arrays hold 4-byte elements, and unaligned byte fields would cost
//!   two loads and shifts per field in the innermost loop). A block is a *head* of
//!   [`QuantFormat::gpu_head_words`] words (scales, offsets, high bits) and a *body* (the
//!   codes, a multiple of 4 words). [`QuantFormat::repack_rows`] stores each row as all its
//!   blocks' bodies, then all their heads, padded to whole 16-byte vec4s: every body is then
//!   whole vec4s, which the CPU-shaped matmul loads as such (lavapipe runs each storage load
//!   as a loop over its SIMD lanes, so fewer, wider loads are what speeds it up), and on GPUs
//!   consecutive invocations reading consecutive body words coalesce.
//! * **Bigger file blocks.** A format whose file block is larger than 32 elements (the
//!   k-quants and IQ4_XS: 256 elements with packed sub-block scales) repacks each file block
//!   into `elements / 32` GPU sub-blocks, each carrying its own scale (and min). Kernels then
//!   never see the 256-element block, so such a type needs only its own implementation and
//!   snippet, not kernel changes. The header keeps the file's values *exactly*: a sub-block
//!   scale is an f16 `d` times a small integer, which f32 holds without rounding, so either
//!   the repack stores the f32 products (Q4_K, Q5_K: scale and -min; IQ4_XS), or, where a
//!   32-element GPU block spans two of the file's 16-element sub-blocks (Q2_K, Q3_K, Q6_K),
//!   it stores the f16 `d` (and `dmin`) with the two integer codes in one or two words and
//!   the snippet multiplies. Either way the GPU computes the CPU reference's values to the
//!   bit (at most the one rounding an FMA saves), at the cost of a word or two per 32
//!   elements over the file's size (Q4_K: 6 words, Q5_K and Q6_K: 7, Q2_K and Q3_K: 4).
//! * **WGSL snippet.** [`QuantFormat::wgsl`] is prepended to the matmul and get_rows kernels
//!   (which declare `WB_SLOTS` and how words are read: `hw(i)`, head word `i` of the binding,
//!   and `bw(b, i)`, word `i` of the body starting at word `b`). It defines `QK` (= 32), `HW`
//!   and `BW` (head and body words per GPU block), and reads one GPU block, located by a
//!   `Blk` (its head and body words; `blk(row, nb, i)` in `shaders/weights/quant_common.wgsl`
//!   finds block `i` of a row); formats of one family share a body, `concat!`ed after a
//!   small header: `quant_q4.wgsl` for Q4_0/Q4_1/Q4_K, `quant_q5.wgsl` for Q5_0/Q5_1/Q5_K,
//!   `quant_iq4.wgsl` for IQ4_NL/IQ4_XS/MXFP4 (codes indexing a table of levels):
//!   - `load_block(k, slot) -> vec4<f32>`: the 32 values' codes into
//!     `wb[slot * 8 .. slot * 8 + 8]` (vec4s), returning (scale, offset) of the first 16
//!     and of the second 16 (value = code * scale + offset), which the CPU-shaped matmul
//!     applies once per half block instead of to every value;
//!   - `load_quarter(k, q) -> Quarter` (the struct is shared, `shaders/weights/quant_common.wgsl`): 8 of the values as two vec4s `a`, `b` plus the
//!     vec4 indices `ia`, `ib` (0..8) they have within the block; the four quarters cover
//!     the block once;
//!   - `deq_elem(row, nb, j)`: element `j` of the row of `nb` blocks whose first word is
//!     `row`.
//!
//! * **Integer dot products.** Where a format's GPU blocks are 32 codes of at most 8 bits
//!   with one (scale, offset), [`QuantFormat::int_dot`] gives its side of the integer-dot
//!   matmul (`ops::matmul_q8`): a WGSL `load_w` reading one block's codes as bytes
//!   (`shaders/weights/dot_<type>.wgsl`) and the CPU reference decoding the file's blocks
//!   into the blocks that kernel multiplies. Q2_K, Q3_K and Q6_K scale each half of a
//!   32-weight block on its own, which one integer sum per block does not allow; the float
//!   formats have no codes.
//!
//! Rows are padded with zero words to whole GPU blocks (only F32/F16 rows can be ragged) and
//! then to whole vec4s.

mod bf16;
pub mod cache;
mod fp16;
mod fp32;
mod iq4;
mod kquant;
mod mxfp4;
mod q2_k;
mod q3_k;
mod q4_0;
mod q4_1;
mod q4_k;
mod q5_0;
mod q5_1;
mod q5_k;
mod q6_k;
mod q8_0;

#[cfg(test)]
mod tests;

use crate::gguf::GgmlType;

/// The 16 levels of IQ4_NL's codes (the K/V cache's iq4_nl quantizes to them too).
pub use iq4::LEVELS as IQ4_LEVELS;

/// Elements per GPU block: the unit every kernel dequantizes (see the module docs).
pub const GPU_BLOCK: usize = 32;

/// Quantizes whole file blocks of values (`src.len()` a multiple of the block size),
/// appending their bytes.
pub type Quantizer = fn(src: &[f32], out: &mut Vec<u8>);

/// One 32-weight block as the integer-dot kernel multiplies it: its codes (0..31 for the
/// 4- and 5-bit formats, signed bytes for Q8_0 and the IQ4 levels) and (scale, offset), a
/// weight being code * scale + offset.
pub type DotBlock = ([i32; 32], (f32, f32));

/// A format's side of the integer-dot matmul (see the module docs).
pub struct IntDot {
    /// WGSL defining `load_w(row, nb, b) -> WBlock` (after `weights/dot_common.wgsl`).
    pub wgsl: &'static str,
    /// CPU reference: appends the blocks of one file block, decoded from the file's layout
    /// (not the GPU's), as the kernel multiplies them.
    pub blocks: fn(file_block: &[u8], out: &mut Vec<DotBlock>),
}

/// One weight type: its file blocks, GPU layout, CPU reference and WGSL reader.
pub trait QuantFormat: Sync {
    /// The ggml type this implements.
    fn ty(&self) -> GgmlType;

    /// (elements, bytes) of one block as the file stores it.
    fn file_block(&self) -> (usize, usize);

    /// 32-bit words of one GPU block of [`GPU_BLOCK`] elements, as [`QuantFormat::repack`]
    /// writes it: the head first, then the body.
    fn gpu_block_words(&self) -> usize;

    /// Words at the start of each GPU block that are its head (scales, offsets, high
    /// bits); the rest is the body (the codes), a multiple of 4 words. A row on the GPU
    /// holds every block's body, then every block's head (see the module docs).
    fn gpu_head_words(&self) -> usize;

    /// Appends the GPU words of `row`, the file bytes of one row (whole file blocks):
    /// each GPU block's head, then its body. At most `gpu_block_words` words per GPU block
    /// of the row; [`QuantFormat::repack_rows`] pads and splits heads from bodies.
    fn repack(&self, row: &[u8], out: &mut Vec<u32>);

    /// CPU reference: dequantizes `out.len()` elements from `src` (whole file blocks).
    fn dequantize(&self, src: &[u8], out: &mut [f32]);

    /// The reference quantizer, where we have one (test weights, synthetic models).
    fn quantizer(&self) -> Option<Quantizer> {
        None
    }

    /// The WGSL snippet the kernels include to read this type (see the module docs).
    fn wgsl(&self) -> &'static str;

    /// The type's integer-dot loader and its reference, where its blocks allow one.
    fn int_dot(&self) -> Option<IntDot> {
        None
    }

    /// Words of one row of `n` elements on the GPU: whole GPU blocks, padded to a whole
    /// number of 16-byte vec4s so that every row and every block body starts on one.
    fn gpu_row_words(&self, n: usize) -> usize {
        (n.div_ceil(GPU_BLOCK) * self.gpu_block_words()).next_multiple_of(4)
    }

    /// Re-lays out whole rows of `n_per_row` elements (file bytes) for the GPU, appending
    /// `gpu_row_words(n_per_row)` words per row: the blocks' bodies, then their heads.
    fn repack_rows(&self, src: &[u8], n_per_row: usize, out: &mut Vec<u32>) {
        let (be, bb) = self.file_block();
        let row_bytes = n_per_row / be * bb;
        let row_words = self.gpu_row_words(n_per_row);
        if row_bytes == 0 {
            return;
        }
        let (wpb, hw) = (self.gpu_block_words(), self.gpu_head_words());
        let nb = n_per_row.div_ceil(GPU_BLOCK);
        let mut blocks = Vec::with_capacity(nb * wpb);
        for row in src.chunks_exact(row_bytes) {
            blocks.clear();
            self.repack(row, &mut blocks);
            debug_assert!(blocks.len() <= nb * wpb, "{} repack overflow", self.ty());
            blocks.resize(nb * wpb, 0);
            let start = out.len();
            out.extend(blocks.chunks_exact(wpb).flat_map(|b| &b[hw..]));
            out.extend(blocks.chunks_exact(wpb).flat_map(|b| &b[..hw]));
            out.resize(start + row_words, 0);
        }
    }
}

/// Every weight type the kernels read, in the order the CLI and error messages list them.
/// Adding a type = one implementation file, its snippet, and one entry here.
pub static FORMATS: &[&dyn QuantFormat] = &[
    &fp32::F32,
    &fp16::F16,
    &q4_0::Q4_0,
    &q4_1::Q4_1,
    &q5_0::Q5_0,
    &q5_1::Q5_1,
    &q8_0::Q8_0,
    &q2_k::Q2K,
    &q3_k::Q3K,
    &q4_k::Q4K,
    &q5_k::Q5K,
    &q6_k::Q6K,
    &bf16::BF16,
    &iq4::IQ4_NL,
    &iq4::IQ4_XS,
    &mxfp4::MXFP4,
];

/// The format of `ty`, or None when no kernel reads it.
pub fn format(ty: GgmlType) -> Option<&'static dyn QuantFormat> {
    FORMATS.iter().copied().find(|f| f.ty() == ty)
}

/// The format named `name` as ggml spells it (`Q4_0`, `f16`; any case).
pub fn format_by_name(name: &str) -> Option<&'static dyn QuantFormat> {
    FORMATS
        .iter()
        .copied()
        .find(|f| f.ty().to_string().eq_ignore_ascii_case(name))
}

/// "F32, F16, Q4_0, …": the supported weight types, for error messages.
pub fn supported_names() -> String {
    names(FORMATS.iter().copied())
}

/// The types we can quantize to (synthetic models), as in [`supported_names`].
pub fn quantizable_names() -> String {
    names(FORMATS.iter().copied().filter(|f| f.quantizer().is_some()))
}

fn names<'a>(it: impl Iterator<Item = &'a dyn QuantFormat>) -> String {
    it.map(|f| f.ty().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Dequantizes `out.len()` elements of type `ty` from `src` (whole blocks), for any
/// registered format. Panics if `ty` is none or `src` is short: callers check the type and
/// size `src` from the tensor table first.
pub fn dequantize_row(ty: GgmlType, src: &[u8], out: &mut [f32]) {
    match format(ty) {
        Some(f) => f.dequantize(src, out),
        None => panic!("dequantize_row: no CPU reference for {ty}"),
    }
}

/// Quantizes one row (a whole number of blocks) to `ty`, or None without a quantizer.
/// Panics if `src` is not a whole number of `ty`'s blocks.
pub fn try_quantize_row(ty: GgmlType, src: &[f32]) -> Option<Vec<u8>> {
    let f = format(ty)?;
    let q = f.quantizer()?;
    assert!(
        src.len().is_multiple_of(f.file_block().0),
        "quantize_row: {} values are not whole {ty} blocks",
        src.len()
    );
    let mut out = Vec::new();
    q(src, &mut out);
    Some(out)
}

/// [`try_quantize_row`] for tests and synthetic weights, whose types are fixed in code.
/// Panics if `ty` has no quantizer.
pub fn quantize_row(ty: GgmlType, src: &[f32]) -> Vec<u8> {
    try_quantize_row(ty, src)
        .unwrap_or_else(|| panic!("quantize_row: no reference quantizer for {ty}"))
}

/// The integer-dot side of `ty`, None where the integer-dot matmul does not take it.
pub fn int_dot(ty: GgmlType) -> Option<IntDot> {
    format(ty)?.int_dot()
}

/// The weight types the integer-dot matmul takes, in [`FORMATS`]' order.
pub fn int_dot_types() -> Vec<GgmlType> {
    FORMATS
        .iter()
        .filter(|f| f.int_dot().is_some())
        .map(|f| f.ty())
        .collect()
}

/// The 32-weight blocks of one row of `ty` (GGUF bytes, whole file blocks) as the
/// integer-dot kernel multiplies them. Panics if `ty` has no integer-dot side.
pub fn dot_blocks(ty: GgmlType, row: &[u8]) -> Vec<DotBlock> {
    let f = format(ty).expect("a registered weight type");
    let dot = f
        .int_dot()
        .unwrap_or_else(|| panic!("no integer-dot kernel for {ty}"));
    let mut out = Vec::new();
    for b in row.chunks_exact(f.file_block().1) {
        (dot.blocks)(b, &mut out);
    }
    out
}

/// 32-bit words one row of `n` elements takes in the GPU layout, None if no kernel reads `ty`.
pub fn gpu_row_words(ty: GgmlType, n: usize) -> Option<usize> {
    format(ty).map(|f| f.gpu_row_words(n))
}

// ---- small helpers shared by the implementations

pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

pub(crate) fn word_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// The f16 bits of `v`, as little-endian bytes.
pub(crate) fn f16_bytes(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_le_bytes()
}

/// The value of largest magnitude (sign kept), as ggml's symmetric quantizers scale by.
pub(crate) fn signed_absmax(blk: &[f32]) -> f32 {
    blk.iter()
        .copied()
        .fold(0f32, |m, v| if v.abs() > m.abs() { v } else { m })
}

/// Four words of nibbles in the GPU's 4-bit order: byte j holds weight j in its low nibble
/// and weight j + 16 in its high one (`q(i)` is weight i's value, below 16).
pub(crate) fn nibble_words(q: impl Fn(usize) -> u8) -> [u32; 4] {
    std::array::from_fn(|w| {
        (0..4).fold(0, |acc, b| {
            let j = 4 * w + b;
            acc | ((q(j) & 0xF) as u32 | ((q(j + 16) & 0xF) as u32) << 4) << (8 * b)
        })
    })
}

/// 32 codes from 16 nibble bytes (byte j: weight j low, weight j + 16 high) and, for the
/// 5-bit formats, their 5th bits (bit j of `qh`: weight j's).
pub(crate) fn dot_nibbles(qs: &[u8], qh: u32) -> [i32; 32] {
    let mut c = [0i32; 32];
    for j in 0..16 {
        c[j] = (qs[j] & 15) as i32 | (((qh >> j) & 1) << 4) as i32;
        c[j + 16] = (qs[j] >> 4) as i32 | (((qh >> (j + 16)) & 1) << 4) as i32;
    }
    c
}

/// One word of 2-bit fields: weight `first + i` at bits 2i, 2i+1 (16 weights).
pub(crate) fn pair_word(first: usize, q: impl Fn(usize) -> u8) -> u32 {
    (0..16).fold(0, |acc, i| acc | ((q(first + i) & 3) as u32) << (2 * i))
}

/// One word of bits: bit i is `q(i)`'s bit `bit` (32 weights).
pub(crate) fn bit_word(bit: u32, q: impl Fn(usize) -> u8) -> u32 {
    (0..32).fold(0, |acc, i| acc | ((q(i) as u32 >> bit) & 1) << i)
}

/// (min, max) of a block.
pub(crate) fn min_max(blk: &[f32]) -> (f32, f32) {
    blk.iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        })
}
