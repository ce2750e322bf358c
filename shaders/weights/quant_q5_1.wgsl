// Q5_1: head [d, m (f16 pair)] [qh], body [qs: 4 words]; x = q d + m.
const QK: u32 = 32u;
const HW: u32 = 2u;
const BW: u32 = 4u;
const Q5_H: u32 = 1u;

fn q5_dm(h: u32) -> vec2<f32> {
    return unpack2x16float(hw(h));
}
