//! WGSL sources, embedded at build time, and the tiny template step that specialises them.

use crate::gguf::GgmlType;

pub const GET_ROWS: &str = include_str!("../../shaders/get_rows.wgsl");
pub const MATMUL: &str = include_str!("../../shaders/matmul.wgsl");
pub const MATMUL_WG: &str = include_str!("../../shaders/matmul_wg.wgsl");
pub const RMS_NORM: &str = include_str!("../../shaders/rms_norm.wgsl");
pub const BINARY: &str = include_str!("../../shaders/binary.wgsl");
pub const GLU: &str = include_str!("../../shaders/glu.wgsl");
pub const ROPE: &str = include_str!("../../shaders/rope.wgsl");
pub const SET_ROWS: &str = include_str!("../../shaders/set_rows.wgsl");
pub const SOFTMAX: &str = include_str!("../../shaders/softmax.wgsl");
pub const ATTN_KQ: &str = include_str!("../../shaders/attn_kq.wgsl");
pub const ATTN_KQV: &str = include_str!("../../shaders/attn_kqv.wgsl");

/// The snippet defining QK, WPB, `load_block` and `deq_elem` for a weight type.
pub fn quant_snippet(ty: GgmlType) -> Option<&'static str> {
    Some(match ty {
        GgmlType::F32 => include_str!("../../shaders/quant_f32.wgsl"),
        GgmlType::F16 => include_str!("../../shaders/quant_f16.wgsl"),
        GgmlType::Q4_0 => include_str!("../../shaders/quant_q4_0.wgsl"),
        GgmlType::Q4_1 => include_str!("../../shaders/quant_q4_1.wgsl"),
        GgmlType::Q8_0 => include_str!("../../shaders/quant_q8_0.wgsl"),
        _ => return None,
    })
}

/// Joins `parts` and replaces each `{{KEY}}` with its value.
pub fn compose(parts: &[&str], subs: &[(&str, String)]) -> String {
    let mut s = parts.join("\n");
    for (k, v) in subs {
        s = s.replace(&format!("{{{{{k}}}}}"), v);
    }
    s
}

/// A shader touching the KV cache (set_rows, attn_kq, attn_kqv, rope for the K-shift),
/// for an f16 or f32 cache.
pub fn kv_source(src: &str, f16: bool) -> String {
    kv_source_tb(src, f16, 1)
}

/// `kv_source` for kernels that also take TB, the tokens per invocation.
pub fn kv_source_tb(src: &str, f16: bool, tb: u32) -> String {
    let body = compose(
        &[src],
        &[
            ("KV_T", if f16 { "f16" } else { "f32" }.to_string()),
            ("TB", tb.to_string()),
        ],
    );
    if f16 {
        format!("enable f16;\n{body}")
    } else {
        body
    }
}

/// The workgroup-per-row matmul, with subgroup or shared-memory reduction.
pub fn matmul_wg_source(ty: GgmlType, tb: u32, subgroups: bool) -> String {
    let reduce_tree = "\
    for (var t = 0u; t < TB; t++) { red[t * 64u + lid] = acc[t]; }
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (lid < s) {
            for (var t = 0u; t < TB; t++) { red[t * 64u + lid] += red[t * 64u + lid + s]; }
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        for (var t = 0u; t < ntb; t++) { dst[(t0 + t) * p.out_stride + p.out_row_offset + row] = red[t * 64u]; }
    }";
    let reduce_sg = "\
    for (var t = 0u; t < TB; t++) {
        let s = subgroupAdd(acc[t]);
        if (sg_lane == 0u) { red[t * 64u + lid / sg_size] = s; }
    }
    workgroupBarrier();
    if (lid == 0u) {
        let n_sg = (64u + sg_size - 1u) / sg_size;
        for (var t = 0u; t < ntb; t++) {
            var s = 0.0;
            for (var i = 0u; i < n_sg; i++) { s += red[t * 64u + i]; }
            dst[(t0 + t) * p.out_stride + p.out_row_offset + row] = s;
        }
    }";
    let (header, args, reduce) = if subgroups {
        (
            // naga 30 enables subgroup builtins with the device feature, not `enable`.
            "",
            "@builtin(subgroup_invocation_id) sg_lane: u32, @builtin(subgroup_size) sg_size: u32,",
            reduce_sg,
        )
    } else {
        ("", "", reduce_tree)
    };
    let body = compose(
        &[quant_snippet(ty).unwrap(), MATMUL_WG],
        &[
            ("TB", tb.to_string()),
            ("SG", (subgroups as u32).to_string()),
            ("SG_ARGS", args.to_string()),
            ("REDUCE", reduce.to_string()),
        ],
    );
    format!("{header}{body}")
}

/// Every shader variant the ops can build, for validation without a GPU.
pub fn all_variants() -> Vec<(String, String)> {
    let mut v = vec![
        ("rms_norm".into(), RMS_NORM.to_string()),
        (
            "binary_add".into(),
            compose(&[BINARY], &[("OP", "av + bv".into())]),
        ),
        (
            "glu_silu".into(),
            compose(&[GLU], &[("ACT", "silu".into())]),
        ),
        (
            "glu_gelu".into(),
            compose(&[GLU], &[("ACT", "gelu".into())]),
        ),
        ("rope".into(), kv_source(ROPE, false)),
        ("rope_f16".into(), kv_source(ROPE, true)),
        ("set_rows".into(), kv_source(SET_ROWS, false)),
        ("softmax".into(), SOFTMAX.to_string()),
        ("attn_kq".into(), kv_source(ATTN_KQ, false)),
        ("attn_kqv".into(), kv_source(ATTN_KQV, false)),
        ("set_rows_f16".into(), kv_source(SET_ROWS, true)),
        ("attn_kq_f16".into(), kv_source(ATTN_KQ, true)),
        ("attn_kqv_f16".into(), kv_source(ATTN_KQV, true)),
        ("attn_kq_f16_tb4".into(), kv_source_tb(ATTN_KQ, true, 4)),
        ("attn_kqv_f16_tb4".into(), kv_source_tb(ATTN_KQV, true, 4)),
    ];
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
    ] {
        let q = quant_snippet(ty).unwrap();
        v.push((format!("get_rows_{ty}"), compose(&[q, GET_ROWS], &[])));
        for (r, tb) in [(2, 1), (2, 4), (4, 8), (1, 1)] {
            let subs = [("TB", tb.to_string()), ("R", r.to_string())];
            v.push((
                format!("matmul_{ty}_{r}x{tb}"),
                compose(&[q, MATMUL], &subs),
            ));
        }
    }
    v
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_shader_variant_parses_and_validates() {
        use naga::valid::Capabilities as C;
        for (name, src) in super::all_variants() {
            let module = naga::front::wgsl::parse_str(&src)
                .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(&src)));
            // The portable shaders need only what every adapter has; f16 and subgroup
            // variants declare their extra capability in their name.
            let mut caps = C::SHADER_FLOAT16_IN_FLOAT32;
            if name.contains("f16") {
                caps |= C::SHADER_FLOAT16;
            }
            if name.contains("_sg") {
                caps |= C::SUBGROUP;
            }
            naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
                .validate(&module)
                .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(&src)));
        }
    }
}
