// Q5_0: head [d (f16, low half)] [qh], body [qs: 4 words];
// x = (q - 16) d, computed as q d - 16 d (both products exact in f32, so the same value).
const QK: u32 = 32u;
const HW: u32 = 2u;
const BW: u32 = 4u;
const Q5_H: u32 = 1u;

fn q5_dm(h: u32) -> vec2<f32> {
    let d = unpack2x16float(hw(h)).x;
    return vec2<f32>(d, -16.0 * d);
}
