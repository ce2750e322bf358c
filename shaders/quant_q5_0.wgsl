// Q5_0, GPU layout of 6 words per 32 weights: [d (f16, low half)] [qh] [qs: 4 words];
// x = (q - 16) d, computed as q d - 16 d (both products exact in f32, so the same value).
const QK: u32 = 32u;
const WPB: u32 = 6u;
const Q5_H: u32 = 1u;

fn q5_dm(base: u32) -> vec2<f32> {
    let d = unpack2x16float(w[base]).x;
    return vec2<f32>(d, -16.0 * d);
}
