// How the GPU-shaped matmuls and get_rows read a weight snippet's words (see
// quant_common.wgsl): straight from the kernel's `w` binding. The CPU-shaped matmul
// defines its own, serving bodies from vec4 loads.
fn hw(i: u32) -> u32 {
    return w[i];
}

fn bw(b: u32, i: u32) -> u32 {
    return w[b + i];
}
