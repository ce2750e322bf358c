// Shared by every weight type's snippet (prepended before it).
//
// A row on the GPU holds the bodies of all its GPU blocks (the codes: BW words each, a
// multiple of 4, so each body is whole vec4s), then their heads (scales, offsets, high
// bits: HW words each). The snippet defines HW and BW; the including kernel defines how
// words are read: `hw(i)`, head word i of the weight binding, and `bw(b, i)`, word i of
// the body starting at word b (quant_read.wgsl reads the binding; the CPU-shaped matmul
// serves bodies from vec4 loads).

// Where GPU block `i` of a row starting at word `row` (nb blocks per row) has its head
// (`h`) and body (`b`).
struct Blk {
    h: u32,
    b: u32,
}

fn blk(row: u32, nb: u32, i: u32) -> Blk {
    return Blk(row + nb * BW + i * HW, row + i * BW);
}

// What `load_quarter` returns: 8 of a GPU block's 32 values as two vec4s `a`, `b`, and
// the vec4 slots `ia`, `ib` (0..8) they have within the block. Each snippet says which
// values a quarter holds.
struct Quarter {
    a: vec4<f32>,
    b: vec4<f32>,
    ia: u32,
    ib: u32,
}
