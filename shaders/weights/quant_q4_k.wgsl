// Q4_K, one 32-weight sub-block of a 256-weight file block: head [scale (f32)]
// [offset (f32)], body [qs: 4 words]; x = q scale + offset. The repack computed
// scale = d * sc and offset = -(dmin * m) from the file's f16 d, dmin and 6-bit sc, m:
// both products are exact in f32, so the values are the file's to the bit.
const QK: u32 = 32u;
const HW: u32 = 2u;
const BW: u32 = 4u;

fn q4_dm(h: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(hw(h)), bitcast<f32>(hw(h + 1u)));
}
