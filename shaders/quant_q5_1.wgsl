// Q5_1, the file's own 6-word block: [d, m (f16 pair)] [qh] [qs: 4 words]; x = q d + m.
const QK: u32 = 32u;
const WPB: u32 = 6u;
const Q5_H: u32 = 1u;

fn q5_dm(base: u32) -> vec2<f32> {
    return unpack2x16float(w[base]);
}
