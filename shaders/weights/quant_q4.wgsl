// Body shared by the 4-bit formats (Q4_0, Q4_1, Q4_K), after a header that sets QK, HW,
// BW (4: the block's nibble words) and `q4_dm(h)`, the block's (scale, offset) from its
// head at word h: x = q scale + offset. Nibble byte j holds weight j (low nibble) and
// weight j + 16 (high nibble).

// Dequantized weights, 8 vec4 per block slot; the including shader sets WB_SLOTS.
var<private> wb: array<vec4<f32>, 8u * WB_SLOTS>;

fn nibbles(q: u32, shift: u32) -> vec4<f32> {
    return vec4<f32>(vec4<u32>(q >> shift, q >> (shift + 8u), q >> (shift + 16u), q >> (shift + 24u)) & vec4<u32>(15u));
}

fn load_block(k: Blk, slot: u32) -> vec4<f32> {
    let o8 = slot * 8u;
    for (var i = 0u; i < 4u; i++) {
        let q = bw(k.b, i);
        wb[o8 + i] = nibbles(q, 0u);
        wb[o8 + i + 4u] = nibbles(q, 4u);
    }
    let dm = q4_dm(k.h);
    return vec4<f32>(dm, dm);
}

fn deq_elem(row: u32, nb: u32, j: u32) -> f32 {
    let k = blk(row, nb, j / 32u);
    let e = j % 32u;
    let byte = (bw(k.b, (e % 16u) / 4u) >> (8u * (e % 4u))) & 0xFFu;
    let q = select(byte & 15u, byte >> 4u, e >= 16u);
    let dm = q4_dm(k.h);
    return f32(q) * dm.x + dm.y;
}

// A quarter block (nibble word q): its 8 weights, which land in wb slots q (low nibbles)
// and q + 4 (high nibbles). Consecutive invocations reading consecutive quarters coalesce.
fn load_quarter(k: Blk, q: u32) -> Quarter {
    let dm = q4_dm(k.h);
    let v = bw(k.b, q);
    return Quarter(nibbles(v, 0u) * dm.x + dm.y, nibbles(v, 4u) * dm.x + dm.y, q, q + 4u);
}
