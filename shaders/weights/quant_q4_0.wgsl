// Q4_0: head [d (f16, low half)], body [qs: 4 words];
// x = (q - 8) d, computed as q d - 8 d (both products exact in f32, so the same value).
const QK: u32 = 32u;
const HW: u32 = 1u;
const BW: u32 = 4u;

fn q4_dm(h: u32) -> vec2<f32> {
    let d = unpack2x16float(hw(h)).x;
    return vec2<f32>(d, -8.0 * d);
}
