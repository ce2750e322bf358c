// Shared by every weight type's snippet (prepended before it): what `load_quarter`
// returns — 8 of a GPU block's 32 values as two vec4s `a`, `b`, and the vec4 slots `ia`,
// `ib` (0..8) they have within the block. Each snippet says which values a quarter holds.
struct Quarter {
    a: vec4<f32>,
    b: vec4<f32>,
    ia: u32,
    ib: u32,
}
