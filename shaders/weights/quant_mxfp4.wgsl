// MXFP4: head [2^(e - 128) (f32, exact: the repack computes it from the E8M0 byte)], body
// [qs: 4 words]; the codes index ggml's doubled E2M1 values (quant_iq4.wgsl's body).
const QK: u32 = 32u;
const HW: u32 = 1u;
const BW: u32 = 4u;

// 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12 as signed bytes, four to a word.
const NL_LEVELS = vec4<u32>(0x03020100u, 0x0C080604u, 0xFDFEFF00u, 0xF4F8FAFCu);

fn iq4_d(h: u32) -> f32 {
    return bitcast<f32>(hw(h));
}
