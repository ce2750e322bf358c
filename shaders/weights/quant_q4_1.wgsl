// Q4_1: head [d, m (f16 pair)], body [qs: 4 words]; x = q d + m.
const QK: u32 = 32u;
const HW: u32 = 1u;
const BW: u32 = 4u;

fn q4_dm(h: u32) -> vec2<f32> {
    return unpack2x16float(hw(h));
}
