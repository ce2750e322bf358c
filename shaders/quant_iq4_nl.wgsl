// IQ4_NL, GPU layout of 5 words per 32 weights: [d (f16, low half)] [qs: 4 words].
const QK: u32 = 32u;
const WPB: u32 = 5u;

fn iq4_d(base: u32) -> f32 {
    return unpack2x16float(w[base]).x;
}
