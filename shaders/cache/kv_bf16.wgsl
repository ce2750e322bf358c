// bf16 cache: two values per word, low half first (a bf16 is the high half of an f32).
fn {{P}}_load4(i: u32) -> vec4<f32> {
    let a = {{B}}[2u * i];
    let b = {{B}}[2u * i + 1u];
    return vec4<f32>(bitcast<f32>(a << 16u), bitcast<f32>(a & 0xFFFF0000u), bitcast<f32>(b << 16u), bitcast<f32>(b & 0xFFFF0000u));
}
// @store
fn {{P}}_store_block(b: u32, x: array<f32, 32>) {
    var xs = x;
    for (var w = 0u; w < 16u; w++) {
        atomicStore(&{{B}}[16u * b + w], kv_bf16(xs[2u * w]) | (kv_bf16(xs[2u * w + 1u]) << 16u));
    }
}
