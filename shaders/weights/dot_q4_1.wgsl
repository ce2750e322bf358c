// Q4_1's integer-dot loader: codes 0..15, head (d, m) (f16 pair); x = d q + m.
fn load_w(row: u32, nb: u32, b: u32) -> WBlock {
    var o = nibble_block(row, b);
    o.dm = unpack2x16float(w[row + nb * 4u + b]);
    return o;
}
