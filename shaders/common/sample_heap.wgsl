// A binary heap over places 0..n of arrays the including kernel keeps, for the
// CPU-shaped sampling kernels. The kernel defines
//   fn heap_above(a: u32, b: u32) -> bool   (place a's entry belongs nearer the root)
//   fn heap_swap(a: u32, b: u32)

// Moves the entry at `at` up to where it belongs.
fn sift_up(at: u32) {
    var c = at;
    loop {
        if (c == 0u) {
            break;
        }
        let up = (c - 1u) / 2u;
        if (!heap_above(c, up)) {
            break;
        }
        heap_swap(c, up);
        c = up;
    }
}

// Moves the entry at `at` down to where it belongs among the first `n`.
fn sift_down(at: u32, n: u32) {
    var c = at;
    loop {
        let l = 2u * c + 1u;
        if (l >= n) {
            break;
        }
        var m = l;
        if (l + 1u < n && heap_above(l + 1u, l)) {
            m = l + 1u;
        }
        if (!heap_above(m, c)) {
            break;
        }
        heap_swap(c, m);
        c = m;
    }
}
