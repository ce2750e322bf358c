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

// The K-quants' 32-weight sub-blocks have f32 heads: Q4_K [d sc] [-(dmin m)], Q5_K the
// same and then its 5th bits (bit j: weight j); x = (d sc) q - dmin m, so dm is the head.
fn load_w_q4_k(row: u32, nb: u32, b: u32) -> WBlock {
    var o = nibble_block(row, b);
    let h = row + nb * 4u + 2u * b;
    o.dm = vec2<f32>(bitcast<f32>(w[h]), bitcast<f32>(w[h + 1u]));
    return o;
}

fn load_w_q5_k(row: u32, nb: u32, b: u32) -> WBlock {
    var o = nibble_block(row, b);
    let h = row + nb * 4u + 3u * b;
    let fifth = w[h + 2u];
    for (var i = 0u; i < 4u; i++) {
        o.q[i] |= fifth_bits(fifth, 4u * i);
        o.q[i + 4u] |= fifth_bits(fifth, 16u + 4u * i);
    }
    o.dm = vec2<f32>(bitcast<f32>(w[h]), bitcast<f32>(w[h + 1u]));
    return o;
}

// The non-linear 4-bit formats' 16 levels (ggml's kvalues_iq4nl) as signed bytes, level
// i in byte i % 4 of word i / 4.
const Q8_IQ4_LEVELS = array<u32, 4>(0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u);

// Four codes (one per byte) to their four levels (one signed byte each).
fn iq4_level_bytes(codes: u32) -> u32 {
    var r = 0u;
    for (var j = 0u; j < 4u; j++) {
        let c = (codes >> (8u * j)) & 15u;
        r |= ((Q8_IQ4_LEVELS[c >> 2u] >> (8u * (c & 3u))) & 0xFFu) << (8u * j);
    }
    return r;
}

fn iq4_block(row: u32, b: u32) -> WBlock {
    var o = nibble_block(row, b);
    for (var i = 0u; i < 8u; i++) {
        o.q[i] = iq4_level_bytes(o.q[i]);
    }
    return o;
}

// IQ4_NL's head is d (f16, low half); IQ4_XS's its sub-block's d (ls - 32) as f32.
fn load_w_iq4_nl(row: u32, nb: u32, b: u32) -> WBlock {
    var o = iq4_block(row, b);
    o.dm = vec2<f32>(unpack2x16float(w[row + nb * 4u + b]).x, 0.0);
    return o;
}

fn load_w_iq4_xs(row: u32, nb: u32, b: u32) -> WBlock {
    var o = iq4_block(row, b);
    o.dm = vec2<f32>(bitcast<f32>(w[row + nb * 4u + b]), 0.0);
    return o;
}
