//! WGSL sources, embedded at build time, and the tiny template step that specialises them.

use crate::gguf::GgmlType;

pub const GET_ROWS: &str = include_str!("../../shaders/get_rows.wgsl");
pub const MATMUL: &str = include_str!("../../shaders/matmul.wgsl");
pub const MATMUL_WG: &str = include_str!("../../shaders/matmul_wg.wgsl");
pub const MATMUL_TILE: &str = include_str!("../../shaders/matmul_tile.wgsl");
pub const RMS_NORM: &str = include_str!("../../shaders/rms_norm.wgsl");
pub const ADD_RMS_NORM: &str = include_str!("../../shaders/add_rms_norm.wgsl");
pub const BINARY: &str = include_str!("../../shaders/binary.wgsl");
pub const GLU: &str = include_str!("../../shaders/glu.wgsl");
pub const ROPE: &str = include_str!("../../shaders/rope.wgsl");
pub const SET_ROWS: &str = include_str!("../../shaders/set_rows.wgsl");
pub const SOFTMAX: &str = include_str!("../../shaders/softmax.wgsl");
pub const ATTN_KQ: &str = include_str!("../../shaders/attn_kq.wgsl");
pub const ATTN_KQV: &str = include_str!("../../shaders/attn_kqv.wgsl");
pub const ATTN_KQV_SPLIT: &str = include_str!("../../shaders/attn_kqv_split.wgsl");
pub const ATTN_KQV_SUM: &str = include_str!("../../shaders/attn_kqv_sum.wgsl");

/// The snippet defining QK, WPB, `load_block` and `deq_elem` for a weight type.
pub fn quant_snippet(ty: GgmlType) -> Option<&'static str> {
    // Each weight format owns its snippet (see `crate::gguf::quant` for the contract).
    crate::gguf::quant::format(ty).map(|f| f.wgsl())
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

/// The rows-per-workgroup matrix-vector matmul: `rows` rows per workgroup of 256, `tb`
/// tokens, reduced with subgroupAdd when `subgroups` (the caller checks that the adapter's
/// widest subgroup fits in 256 / rows invocations) or a workgroup-memory tree.
pub fn matmul_wg_source(ty: GgmlType, tb: u32, rows: u32, subgroups: bool) -> String {
    let reduce_tree = "\
    for (var t = 0u; t < TB; t++) { red[t * 256u + lid] = acc[t]; }
    workgroupBarrier();
    for (var s = TPR / 2u; s > 0u; s >>= 1u) {
        if (sl < s) {
            for (var t = 0u; t < TB; t++) { red[t * 256u + lid] += red[t * 256u + lid + s]; }
        }
        workgroupBarrier();
    }
    if (sl == 0u && out_ok) {
        for (var t = 0u; t < ntb; t++) { dst[(t0 + t) * p.out_stride + o] = red[t * 256u + lid]; }
    }";
    let reduce_sg = "\
    for (var t = 0u; t < TB; t++) {
        let s = subgroupAdd(acc[t]);
        if (sg_lane == 0u) { red[t * 256u + lid / sg_size] = s; }
    }
    workgroupBarrier();
    if (sl == 0u && out_ok) {
        let per_row = TPR / sg_size;
        let first = lid / sg_size;
        for (var t = 0u; t < ntb; t++) {
            var s = 0.0;
            for (var i = 0u; i < per_row; i++) { s += red[t * 256u + first + i]; }
            dst[(t0 + t) * p.out_stride + o] = s;
        }
    }";
    let (args, reduce) = if subgroups {
        (
            // naga 30 enables subgroup builtins with the device feature, not `enable`.
            "@builtin(subgroup_invocation_id) sg_lane: u32, @builtin(subgroup_size) sg_size: u32,",
            reduce_sg,
        )
    } else {
        ("", reduce_tree)
    };
    compose(
        &[quant_snippet(ty).unwrap(), MATMUL_WG],
        &[
            ("TB", tb.to_string()),
            ("ROWS", rows.to_string()),
            ("SG_ARGS", args.to_string()),
            ("REDUCE", reduce.to_string()),
        ],
    )
}

/// The tiled prompt matmul for BM weight rows x BN tokens per workgroup (multiples of 16),
/// with each invocation's (BM/16) x (BN/16) micro-tile unrolled into scalar accumulators.
pub fn matmul_tile_source(ty: GgmlType, bm: u32, bn: u32) -> String {
    let (tm, tn) = (bm / 16, bn / 16);
    let mut decl = String::new();
    let mut body = String::new();
    let mut store = String::new();
    for i in 0..tm {
        for j in 0..tn {
            decl += &format!("    var c{i}_{j} = 0.0;\n");
        }
    }
    for i in 0..tm {
        body += &format!("            let a{i} = ws[wo + {}u];\n", 16 * i);
    }
    for j in 0..tn {
        body += &format!("            let b{j} = xs[xo + {}u];\n", 16 * j);
    }
    for i in 0..tm {
        for j in 0..tn {
            body += &format!("            c{i}_{j} += dot(a{i}, b{j});\n");
        }
    }
    for j in 0..tn {
        store += &format!(
            "    let tok{j} = t0 + ty + {}u;\n    if (tok{j} < p.n_tok) {{\n        let o = tok{j} * p.out_stride + p.out_row_offset;\n",
            16 * j
        );
        for i in 0..tm {
            store += &format!(
                "        if (row0 + tx + {r}u < p.n_rows) {{ dst[o + row0 + tx + {r}u] = c{i}_{j}; }}\n",
                r = 16 * i
            );
        }
        store += "    }\n";
    }
    compose(
        &[quant_snippet(ty).unwrap(), MATMUL_TILE],
        &[
            ("BM", bm.to_string()),
            ("BN", bn.to_string()),
            ("DECL", decl),
            ("BODY", body),
            ("STORE", store),
        ],
    )
}

/// The masked softmax with `wg` invocations per row.
pub fn softmax_source(wg: u32) -> String {
    compose(&[SOFTMAX], &[("WG", wg.to_string())])
}

/// The split attention output kernel: `lanes` invocations across a value row, `nv` vec4s each.
pub fn attn_kqv_split_source(f16: bool, lanes: u32, nv: u32) -> String {
    let src = compose(
        &[ATTN_KQV_SPLIT],
        &[("LANES", lanes.to_string()), ("NV", nv.to_string())],
    );
    kv_source(&src, f16)
}

/// Every shader variant the ops can build, for validation without a GPU.
pub fn all_variants() -> Vec<(String, String)> {
    let mut v = vec![
        ("rms_norm".into(), RMS_NORM.to_string()),
        ("add_rms_norm".into(), ADD_RMS_NORM.to_string()),
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
        ("softmax_64".into(), softmax_source(64)),
        ("softmax_256".into(), softmax_source(256)),
        ("attn_kqv_sum".into(), ATTN_KQV_SUM.to_string()),
        ("attn_kq".into(), kv_source(ATTN_KQ, false)),
        ("attn_kqv".into(), kv_source(ATTN_KQV, false)),
        ("set_rows_f16".into(), kv_source(SET_ROWS, true)),
        ("attn_kq_f16".into(), kv_source(ATTN_KQ, true)),
        ("attn_kqv_f16".into(), kv_source(ATTN_KQV, true)),
        ("attn_kq_f16_tb4".into(), kv_source_tb(ATTN_KQ, true, 4)),
        ("attn_kqv_f16_tb4".into(), kv_source_tb(ATTN_KQV, true, 4)),
    ];
    for f16 in [false, true] {
        for (lanes, nv) in [(16, 1), (32, 1), (64, 1), (16, 2)] {
            v.push((
                format!(
                    "attn_kqv_split_{}_{lanes}x{nv}",
                    if f16 { "f16" } else { "f32" }
                ),
                attn_kqv_split_source(f16, lanes, nv),
            ));
        }
    }
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
    ] {
        let q = quant_snippet(ty).unwrap();
        v.push((format!("get_rows_{ty}"), compose(&[q, GET_ROWS], &[])));
        for (tb, rows) in [(1, 8), (4, 8), (1, 4), (1, 16)] {
            for sg in [false, true] {
                v.push((
                    format!("matmul_wg_{ty}_{tb}x{rows}{}", if sg { "_sg" } else { "" }),
                    matmul_wg_source(ty, tb, rows, sg),
                ));
            }
        }
        for (bm, bn) in [(64, 64), (128, 64)] {
            v.push((
                format!("matmul_tile_{ty}_{bm}x{bn}"),
                matmul_tile_source(ty, bm, bn),
            ));
        }
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
