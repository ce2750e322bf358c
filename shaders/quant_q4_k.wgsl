// Q4_K, one 32-weight sub-block of a 256-weight file block in 6 words:
// [scale (f32)] [offset (f32)] [qs: 4 words]; x = q scale + offset. The repack computed
// scale = d * sc and offset = -(dmin * m) from the file's f16 d, dmin and 6-bit sc, m:
// both products are exact in f32, so the values are the file's to the bit.
const QK: u32 = 32u;
const WPB: u32 = 6u;
const Q4_QS: u32 = 2u;

fn q4_dm(base: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(w[base]), bitcast<f32>(w[base + 1u]));
}
