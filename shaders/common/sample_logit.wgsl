// Shared by both shapes of sampling's first pass (they bind logits, bias and counts and
// set `row`).

// The logit as the chain sees it after logit bias and penalties (llama.cpp's order).
fn logit_key(i: u32) -> u32 {
    var l = logits[row.row * p.n_vocab + i];
    let at = row.slot * p.n_vocab + i;
    if ((row.flags & 1u) != 0u) {
        l = l + bias[at];
    }
    if ((row.flags & 2u) != 0u) {
        let c = counts[at];
        if (c > 0u) {
            if (l <= 0.0) {
                l = l * row.repeat_penalty;
            } else {
                l = l / row.repeat_penalty;
            }
            l = l - (f32(c) * row.freq_penalty + row.presence_penalty);
        }
    }
    return f32_key(l);
}
