// Q4_0, GPU layout of 5 words per 32 weights: [d (f16, low half)] [qs: 4 words];
// x = (q - 8) d, computed as q d - 8 d (both products exact in f32, so the same value).
const QK: u32 = 32u;
const WPB: u32 = 5u;
const Q4_QS: u32 = 1u;

fn q4_dm(base: u32) -> vec2<f32> {
    let d = unpack2x16float(w[base]).x;
    return vec2<f32>(d, -8.0 * d);
}
