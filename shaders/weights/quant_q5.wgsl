// Body shared by the 5-bit formats (Q5_0, Q5_1, Q5_K), after a header that sets QK, HW,
// BW (4: the block's nibble words), Q5_H (the head word holding the 5th bits: bit j for
// weight j) and `q5_dm(h)`, the block's (scale, offset) from its head at word h:
// x = q scale + offset. Nibble byte j holds the low 4 bits of weight j (low nibble) and
// of weight j + 16 (high nibble).

// Dequantized weights, 8 vec4 per block slot; the including shader sets WB_SLOTS.
var<private> wb: array<vec4<f32>, 8u * WB_SLOTS>;

// The four 5-bit values of nibble word `q` at nibble `shift` (0 or 4), whose 5th bits are
// bits s..s+3 of `h`.
fn q5(q: u32, shift: u32, h: u32, s: u32) -> vec4<f32> {
    let lo = vec4<u32>(q >> shift, q >> (shift + 8u), q >> (shift + 16u), q >> (shift + 24u)) & vec4<u32>(15u);
    let hi = (vec4<u32>(h >> s, h >> (s + 1u), h >> (s + 2u), h >> (s + 3u)) & vec4<u32>(1u)) << vec4<u32>(4u);
    return vec4<f32>(lo | hi);
}

fn load_block(k: Blk, slot: u32) -> vec4<f32> {
    let o8 = slot * 8u;
    let h = hw(k.h + Q5_H);
    for (var i = 0u; i < 4u; i++) {
        let q = bw(k.b, i);
        wb[o8 + i] = q5(q, 0u, h, 4u * i);
        wb[o8 + i + 4u] = q5(q, 4u, h, 16u + 4u * i);
    }
    let dm = q5_dm(k.h);
    return vec4<f32>(dm, dm);
}

fn deq_elem(row: u32, nb: u32, j: u32) -> f32 {
    let k = blk(row, nb, j / 32u);
    let e = j % 32u;
    let byte = (bw(k.b, (e % 16u) / 4u) >> (8u * (e % 4u))) & 0xFFu;
    let q = select(byte & 15u, byte >> 4u, e >= 16u) | (((hw(k.h + Q5_H) >> e) & 1u) << 4u);
    let dm = q5_dm(k.h);
    return f32(q) * dm.x + dm.y;
}

// A quarter block (nibble word q): its 8 weights, which land in wb slots q (low nibbles)
// and q + 4 (high nibbles). Consecutive invocations reading consecutive quarters coalesce.
fn load_quarter(k: Blk, q: u32) -> Quarter {
    let dm = q5_dm(k.h);
    let h = hw(k.h + Q5_H);
    let v = bw(k.b, q);
    return Quarter(q5(v, 0u, h, 4u * q) * dm.x + dm.y, q5(v, 4u, h, 16u + 4u * q) * dm.x + dm.y, q, q + 4u);
}
