// Q5_1's integer-dot loader: codes 0..31 (5th bits in the second head word), head
// (d, m) (f16 pair); x = d q + m.
fn load_w(row: u32, nb: u32, b: u32) -> WBlock {
    var o = five_bit_block(row, nb, b);
    o.dm = unpack2x16float(w[row + nb * 4u + 2u * b]);
    return o;
}
