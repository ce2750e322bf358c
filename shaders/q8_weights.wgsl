// Weight blocks for matmul_q8.wgsl, one loader per type (`load_w_<type>`; the kernel's
// LOAD_W names the one it calls). A row starting at word `row` holds
// the bodies of its nb blocks (BW words each), then their heads (HW words each), as
// quant_common.wgsl describes. Nibble byte j holds weight j (low nibble) and weight
// j + 16 (high nibble); a 5-bit format's 5th bits are bit j of its second head word.

// The bytes' bit 4 from four bits of `h` (bits s..s+3: weights 4i..4i+3).
fn fifth_bits(h: u32, s: u32) -> u32 {
    let m = (h >> s) & 15u;
    return ((m & 1u) << 4u) | ((m & 2u) << 11u) | ((m & 4u) << 18u) | ((m & 8u) << 25u);
}

fn nibble_block(row: u32, b: u32) -> WBlock {
    var o: WBlock;
    for (var i = 0u; i < 4u; i++) {
        let v = w[row + b * 4u + i];
        o.q[i] = v & 0x0F0F0F0Fu;
        o.q[i + 4u] = (v >> 4u) & 0x0F0F0F0Fu;
    }
    return o;
}

fn load_w_q4_0(row: u32, nb: u32, b: u32) -> WBlock {
    var o = nibble_block(row, b);
    let d = unpack2x16float(w[row + nb * 4u + b]).x;
    o.dm = vec2<f32>(d, -8.0 * d);
    return o;
}

fn load_w_q4_1(row: u32, nb: u32, b: u32) -> WBlock {
    var o = nibble_block(row, b);
    o.dm = unpack2x16float(w[row + nb * 4u + b]);
    return o;
}

fn five_bit_block(row: u32, nb: u32, b: u32) -> WBlock {
    var o = nibble_block(row, b);
    let h = w[row + nb * 4u + 2u * b + 1u];
    for (var i = 0u; i < 4u; i++) {
        o.q[i] |= fifth_bits(h, 4u * i);
        o.q[i + 4u] |= fifth_bits(h, 16u + 4u * i);
    }
    return o;
}

fn load_w_q5_0(row: u32, nb: u32, b: u32) -> WBlock {
    var o = five_bit_block(row, nb, b);
    let d = unpack2x16float(w[row + nb * 4u + 2u * b]).x;
    o.dm = vec2<f32>(d, -16.0 * d);
    return o;
}

fn load_w_q5_1(row: u32, nb: u32, b: u32) -> WBlock {
    var o = five_bit_block(row, nb, b);
    o.dm = unpack2x16float(w[row + nb * 4u + 2u * b]);
    return o;
}

fn load_w_q8_0(row: u32, nb: u32, b: u32) -> WBlock {
    var o: WBlock;
    for (var i = 0u; i < 8u; i++) {
        o.q[i] = w[row + b * 8u + i];
    }
    o.dm = vec2<f32>(unpack2x16float(w[row + nb * 8u + b]).x, 0.0);
    return o;
}
