// Shared by rms_norm and add_rms_norm, which declare `partial` (256 floats of workgroup
// memory): U values per invocation and loop step, STEP values per step of the workgroup.
const U: u32 = 16u;
const STEP: u32 = 256u * U;

// The sum over the workgroup of each invocation's `s`.
fn norm_sum(s: f32, lid: u32) -> f32 {
    partial[lid] = s;
    workgroupBarrier();
    for (var stride = 128u; stride > 0u; stride >>= 1u) {
        if (lid < stride) {
            partial[lid] += partial[lid + stride];
        }
        workgroupBarrier();
    }
    return partial[0];
}
