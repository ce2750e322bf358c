// IQ4_XS, one 32-weight sub-block of a 256-weight file block in 5 words:
// [d (ls - 32) (f32, exact: computed by the repack from the f16 d and 6-bit ls)] [qs: 4 words].
const QK: u32 = 32u;
const WPB: u32 = 5u;

fn iq4_d(base: u32) -> f32 {
    return bitcast<f32>(w[base]);
}
