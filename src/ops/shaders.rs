//! WGSL sources, embedded at build time, and the tiny template step that specialises them.

use crate::gguf::GgmlType;

pub const GET_ROWS: &str = include_str!("../../shaders/get_rows.wgsl");
pub const MATMUL: &str = include_str!("../../shaders/matmul.wgsl");
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
        ("rope".into(), ROPE.to_string()),
        ("set_rows".into(), SET_ROWS.to_string()),
        ("softmax".into(), SOFTMAX.to_string()),
        ("attn_kq".into(), ATTN_KQ.to_string()),
        ("attn_kqv".into(), ATTN_KQV.to_string()),
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
        for (r, tb) in [(2, 1), (2, 4), (1, 1)] {
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
        for (name, src) in super::all_variants() {
            let module = naga::front::wgsl::parse_str(&src)
                .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(&src)));
            naga::valid::Validator::new(
                naga::valid::ValidationFlags::all(),
                naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32,
            )
            .validate(&module)
            .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(&src)));
        }
    }
}
