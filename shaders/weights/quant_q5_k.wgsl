// Q5_K, one 32-weight sub-block of a 256-weight file block: head [scale (f32)]
// [offset (f32)] [qh], body [qs: 4 words]; x = q scale + offset, with scale = d * sc and
// offset = -(dmin * m) computed exactly by the repack (see Q4_K).
const QK: u32 = 32u;
const HW: u32 = 3u;
const BW: u32 = 4u;
const Q5_H: u32 = 2u;

fn q5_dm(h: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(hw(h)), bitcast<f32>(hw(h + 1u)));
}
