// What the integer-dot loaders (`dot_<type>.wgsl`, one per weight format that has one)
// share. Each defines `load_w(row, nb, b) -> WBlock` for matmul_q8.wgsl and
// matmul_q8_tile.wgsl: block b of the row starting at word `row`, which holds the bodies
// of its nb blocks (BW words each), then their heads (HW words each), as quant_common.wgsl
// describes; codes as bytes in `q`, (scale, offset) in `dm`. Nibble byte j holds weight j
// (low nibble) and weight j + 16 (high nibble); a 5-bit format's 5th bits are bit j of
// its second head word.

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

fn five_bit_block(row: u32, nb: u32, b: u32) -> WBlock {
    var o = nibble_block(row, b);
    let h = w[row + nb * 4u + 2u * b + 1u];
    for (var i = 0u; i < 4u; i++) {
        o.q[i] |= fifth_bits(h, 4u * i);
        o.q[i + 4u] |= fifth_bits(h, 16u + 4u * i);
    }
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
