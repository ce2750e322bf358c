// Shared by the sampling kernels: order-preserving u32 keys for f32 values (0 is kept
// for "no candidate").

// Larger floats get larger keys; -inf is 0x007fffff, and only a NaN pattern maps to 0.
fn f32_key(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    if ((b & 0x80000000u) != 0u) {
        return ~b;
    }
    return b | 0x80000000u;
}

fn key_f32(k: u32) -> f32 {
    if ((k & 0x80000000u) != 0u) {
        return bitcast<f32>(k & 0x7fffffffu);
    }
    return bitcast<f32>(~k);
}
