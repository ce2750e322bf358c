// Q4_1, the file's own 5-word block: [d, m (f16 pair)] [qs: 4 words]; x = q d + m.
const QK: u32 = 32u;
const WPB: u32 = 5u;
const Q4_QS: u32 = 1u;

fn q4_dm(base: u32) -> vec2<f32> {
    return unpack2x16float(w[base]);
}
