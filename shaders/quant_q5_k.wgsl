// Q5_K, one 32-weight sub-block of a 256-weight file block in 7 words:
// [scale (f32)] [offset (f32)] [qh] [qs: 4 words]; x = q scale + offset, with
// scale = d * sc and offset = -(dmin * m) computed exactly by the repack (see Q4_K).
const QK: u32 = 32u;
const WPB: u32 = 7u;
const Q5_H: u32 = 2u;

fn q5_dm(base: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(w[base]), bitcast<f32>(w[base + 1u]));
}
