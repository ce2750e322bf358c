// IQ4_XS, one 32-weight sub-block of a 256-weight file block: head [d (ls - 32) (f32,
// exact: computed by the repack from the f16 d and 6-bit ls)], body [qs: 4 words].
const QK: u32 = 32u;
const HW: u32 = 1u;
const BW: u32 = 4u;

// ggml's kvalues_iq4nl.
const NL_LEVELS = vec4<u32>(0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u);

fn iq4_d(h: u32) -> f32 {
    return bitcast<f32>(hw(h));
}
