//! The WGSL that several kernel families share, embedded at build time, and the tiny
//! template step that specialises sources: the cache formats' load and store snippets and
//! the weight formats' snippets (both owned by `crate::quant`) composed into kernels, and
//! the matmul, flash and rope_store templates that more than one family composes. A family's own files are declared in its op file
//! ([`super::kernels::kernel_files!`]).

use crate::gguf::GgmlType;
use crate::kv::KvType;

/// Declares each shared source file once: its constant, embedded at build time, and its
/// row of [`SOURCES`], which the tuning fingerprint hashes — a source cannot be embedded
/// here without being hashed (and `every_shader_file_is_in_the_fingerprint` finds one
/// embedded anywhere else).
macro_rules! sources {
    ($($(#[$doc:meta])* $vis:vis $name:ident = $file:literal;)*) => {
        $($(#[$doc])* $vis const $name: &str = include_str!(concat!("../../shaders/", $file));)*
        /// Every shared source file embedded here, by file name.
        pub const SOURCES: &[(&str, &str)] = &[$(($file, $name)),*];
    };
}

sources! {
    pub MATMUL = "kernels/matmul.wgsl";
    pub MATMUL_WG = "kernels/matmul_wg.wgsl";
    pub MATMUL_TILE = "kernels/matmul_tile.wgsl";
    pub ATTN_FLASH_COOP = "kernels/attn_flash_coop.wgsl";
    pub MATMUL_COOP = "kernels/matmul_coop.wgsl";
    pub ACT = "common/act.wgsl";
    pub SET_ROWS = "kernels/set_rows.wgsl";
    pub ROPE_STORE = "common/rope_store.wgsl";
    pub ROPE_STORE_WG = "kernels/rope_store_wg.wgsl";
    pub ROPE_STORE_ROWS = "kernels/rope_store_rows.wgsl";
    pub SOFTMAX_COMMON = "common/softmax_common.wgsl";
    pub ATTN_FLASH = "kernels/attn_flash.wgsl";
    pub SET_ROWS_BLOCKS = "kernels/set_rows_blocks.wgsl";
    /// Helpers of the packed K/V cache types' snippets (`KvType::wgsl`).
    pub KV_COMMON = "cache/kv_common.wgsl";
    /// What every weight snippet shares: the row layout (`Blk`, `blk`: where a block's head
    /// and body are) and the `Quarter` that `load_quarter` returns.
    pub QUANT_COMMON = "weights/quant_common.wgsl";
    /// `hw`/`bw` reading weight words straight from the `w` binding: every kernel that
    /// includes a snippet but the CPU-shaped matmul.
    pub QUANT_READ = "weights/quant_read.wgsl";
}

/// The load or store part of a packed type's snippet for prefix `p` and binding `b`.
fn kv_part(ty: KvType, store: bool, p: &str, b: &str) -> String {
    let src = ty.wgsl().expect("packed cache type");
    let (load, st) = src
        .split_once("// @store\n")
        .expect("kv snippets have a `// @store` line");
    (if store { st } else { load })
        .replace("{{P}}", p)
        .replace("{{B}}", b)
}

/// (array element type, `{p}_load4(i) -> vec4<f32>`) for reading cache binding `p`
/// (`k` or `v`) of type `ty`: logical vec4 i of [head_dim, n_head_kv, cells].
fn kv_load(p: &str, ty: KvType) -> (String, String) {
    match ty {
        KvType::F32 => (
            "vec4<f32>".into(),
            format!("fn {p}_load4(i: u32) -> vec4<f32> {{\n    return {p}[i];\n}}"),
        ),
        KvType::F16 => (
            "vec4<f16>".into(),
            format!("fn {p}_load4(i: u32) -> vec4<f32> {{\n    return vec4<f32>({p}[i]);\n}}"),
        ),
        _ => ("u32".into(), kv_part(ty, false, p, p)),
    }
}

/// (array element type, functions) for writing cache binding `b` of type `ty` under
/// prefix `p`: `{p}_put(e0, i, x)` stores value i of the row starting at element e0
/// (plain types at once; packed types into the workgroup's `stage`), and
/// `{p}_flush(e0, n, lid)` writes the staged n values (packed types, a block per
/// invocation; nothing for plain ones). Callers put, barrier, then flush.
fn kv_store(p: &str, b: &str, ty: KvType) -> (String, String) {
    let plain = |t: &str| {
        (
            t.to_string(),
            format!(
                "fn {p}_put(e0: u32, i: u32, x: f32) {{\n    {b}[e0 + i] = {t}(x);\n}}
fn {p}_flush(e0: u32, n: u32, lid: u32) {{}}"
            ),
        )
    };
    match ty {
        KvType::F32 => plain("f32"),
        KvType::F16 => plain("f16"),
        _ => (
            "atomic<u32>".into(),
            format!(
                "{}
fn {p}_put(e0: u32, i: u32, x: f32) {{
    stage[i] = x;
}}
fn {p}_flush(e0: u32, n: u32, lid: u32) {{
    for (var b = lid; b < n / 32u; b += 64u) {{
        var x: array<f32, 32>;
        for (var j = 0u; j < 32u; j++) {{
            x[j] = stage[32u * b + j];
        }}
        {p}_store_block(e0 / 32u + b, x);
    }}
}}",
                kv_part(ty, true, p, b)
            ),
        ),
    }
}

/// The packed types' helpers, where any of `types` needs them.
fn kv_common(types: &[KvType]) -> &'static str {
    if types.iter().any(|t| t.is_packed()) {
        KV_COMMON
    } else {
        ""
    }
}

/// `src` with its cache reads filled in: `{{K_ELEM}}` / `{{K_LOAD}}` for a K cache of
/// type `k`, `{{V_ELEM}}` / `{{V_LOAD}}` for a V cache of type `v`, and `subs`.
pub fn kv_reading(
    src: &str,
    k: Option<KvType>,
    v: Option<KvType>,
    subs: &[(&str, String)],
) -> String {
    let mut all: Vec<(&str, String)> = subs.to_vec();
    for (p, ty, elem, load) in [("k", k, "K_ELEM", "K_LOAD"), ("v", v, "V_ELEM", "V_LOAD")] {
        if let Some(ty) = ty {
            let (e, l) = kv_load(p, ty);
            all.extend([(elem, e), (load, l)]);
        }
    }
    let types: Vec<KvType> = [k, v].into_iter().flatten().collect();
    compose(&[kv_common(&types), src], &all)
}

/// set_rows into a cache of type `ty`: a value per invocation for plain types, a block
/// per invocation (quantized on the way) for packed ones.
pub fn set_rows_source(ty: KvType) -> String {
    match ty {
        KvType::F32 | KvType::F16 => compose(&[SET_ROWS], &[("KV_T", ty.name().into())]),
        _ => compose(
            &[KV_COMMON, SET_ROWS_BLOCKS],
            &[("STORE", kv_part(ty, true, "dst", "dst"))],
        ),
    }
}

/// [`quant_snippet`], or why a kernel of weight type `ty` has no source.
pub fn quant_source(ty: GgmlType) -> Result<String, String> {
    quant_snippet(ty).ok_or_else(|| format!("no GPU kernels for weight type {ty}"))
}

/// The snippet defining QK, HW, BW, `load_block`, `load_quarter` and `deq_elem` for a weight
/// type, after the shared part.
pub fn quant_snippet(ty: GgmlType) -> Option<String> {
    // Each weight format owns its snippet (see `crate::quant` for the contract).
    crate::quant::format(ty).map(|f| format!("{QUANT_COMMON}\n{}", f.wgsl()))
}

/// Joins `parts` and replaces each `{{KEY}}` with its value.
pub fn compose(parts: &[&str], subs: &[(&str, String)]) -> String {
    let mut s = parts.join("\n");
    for (k, v) in subs {
        s = s.replace(&format!("{{{{{k}}}}}"), v);
    }
    s
}

/// Every weight type with a GPU snippet, i.e. every type [`quant_snippet`] knows: the
/// matmul and get_rows variants are enumerated over these.
pub fn weight_types() -> Vec<GgmlType> {
    (0..=u8::MAX as u32)
        .map(GgmlType::from_id)
        .filter(|ty| !matches!(ty, GgmlType::Other(_)) && quant_snippet(*ty).is_some())
        .collect()
}

/// Which tokens a workgroup of the matmul kernels (`matmul.wgsl`, `matmul_tile.wgsl`)
/// multiplies, and through which rows: the same kernels serve dense products and the
/// experts' products of mixture-of-experts prompts, so the experts get every speed-up of
/// the dense ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tokens {
    /// Consecutive tokens of x (workgroup z) through the whole matrix.
    Dense,
    /// A run of one expert's (token, expert) pairs in `moe_group`'s order (workgroup z
    /// along the run of expert e_begin + workgroup y) through that expert's rows, which
    /// follow each other in w; outputs go to each pair's row of dst.
    Grouped,
}

impl Tokens {
    /// The bindings after dst: the grouping's offsets and order.
    fn bindings(self) -> &'static str {
        match self {
            Tokens::Dense => "",
            Tokens::Grouped => {
                "@group(0) @binding(4) var<storage, read> offsets: array<u32>;
@group(0) @binding(5) var<storage, read> order: array<u32>;
// The x row of a pair: its own (the down products) or its token's (gate and up).
fn pair_x_row(pair: u32) -> u32 {
    return select(pair / p.n_used, pair, p.x_per_pair != 0u);
}"
            }
        }
    }

    /// The CPU-shaped kernel's prologue: row0, ntb, wrow and, for pairs, their x rows.
    fn rows_prologue(self) -> &'static str {
        match self {
            Tokens::Dense => {
                "    let row0 = ((wid.y * p.wg_x + wid.x) * 64u + lid) * R;
    let t0 = wid.z * TB;
    let ntb = min(TB, p.n_tok - t0);
    let wrow = 0u;"
            }
            // The workgroup's pairs are the same for all its invocations, so leaving
            // together keeps subgroups whole.
            Tokens::Grouped => {
                "    let row0 = (wid.x * 64u + lid) * R;
    let first = offsets[p.e_begin + wid.y] + wid.z * TB;
    let end = offsets[p.e_begin + wid.y + 1u];
    if (first >= end) {
        return;
    }
    let ntb = min(TB, end - first);
    let wrow = wid.y * p.n_rows;
    var xr: array<u32, TB>;
    for (var t = 0u; t < TB; t++) {
        xr[t] = pair_x_row(order[first + min(t, ntb - 1u)]);
    }"
            }
        }
    }

    /// The tiled kernel's prologue: row0, n_here and wrow; a tile past its expert's run
    /// leaves before the first barrier, all its invocations together.
    fn tile_prologue(self) -> &'static str {
        match self {
            Tokens::Dense => {
                "    let row0 = (wid.y * p.wg_x + wid.x) * BM;
    let t0 = wid.z * BN;
    let n_here = min(BN, p.n_tok - t0);
    let wrow = 0u;"
            }
            Tokens::Grouped => {
                "    let row0 = wid.x * BM;
    let first = offsets[p.e_begin + wid.y] + wid.z * BN;
    let end = offsets[p.e_begin + wid.y + 1u];
    if (lid == 0u) {
        run_here = select(0u, min(BN, end - first), first < end);
    }
    let n_here = workgroupUniformLoad(&run_here);
    if (n_here == 0u) {
        return;
    }
    let wrow = wid.y * p.n_rows;"
            }
        }
    }

    /// The CPU-shaped kernel's x row of its token t.
    fn rows_x_row(self) -> &'static str {
        match self {
            Tokens::Dense => "t0 + t",
            Tokens::Grouped => "xr[t]",
        }
    }

    /// The tiled kernel's x row of its token s.
    fn tile_x_row(self) -> &'static str {
        match self {
            Tokens::Dense => "t0 + s",
            Tokens::Grouped => "pair_x_row(order[first + s])",
        }
    }

    /// Where the output row of the workgroup's token `s` (a WGSL expression) starts in dst.
    fn dst_row(self, s: &str) -> String {
        match self {
            Tokens::Dense => format!("(t0 + {s}) * p.out_stride + p.out_row_offset"),
            Tokens::Grouped => format!("order[first + {s}] * p.n_rows"),
        }
    }
}

/// The CPU-shaped matmul (`rows` rows and `tb` tokens per invocation), storing plainly or,
/// with `glu`, act(gate) * up of each interleaved (gate, up) row pair (`rows` even); with
/// `subgroups` (subgroups of at least 8 lanes, the caller checks) x's loads are shared.
pub fn matmul_source(
    quant: &str,
    rows: u32,
    tb: u32,
    glu: Option<&str>,
    subgroups: bool,
    tokens: Tokens,
) -> String {
    // Invocations past the last row stop at once, unless subgroups share x's loads: then
    // every lane takes part (re-reading the last row, whose results are not stored).
    let exit = if subgroups {
        ""
    } else {
        "    if (row0 >= p.n_rows) {\n        return;\n    }"
    };
    let (sg_args, x_elem, xload) = if subgroups {
        let mut load = "                let mine = x[xo + (sg_lane & 7u)];\n".to_string();
        for i in 0..8 {
            load += &format!("                xv[{i}] = subgroupBroadcast(mine, {i}u);\n");
        }
        // naga 30 enables subgroup builtins with the device feature, not `enable`.
        (
            ", @builtin(subgroup_invocation_id) sg_lane: u32",
            "vec4<f32>",
            load,
        )
    } else {
        let load = "                let xp = &x[xo >> 3u];\n                for (var i = 0u; i < 8u; i++) { xv[i] = (*xp).v[i]; }";
        ("", "XBlock", load.to_string())
    };
    // Over the constant TB (unrolled), so that `acc` is only ever indexed by constants
    // and stays in registers: with `t < ntb` as the bound, `acc` was indexed at run time
    // and every block's update went through memory (and, in a browser, a clamp).
    let store = match glu {
        None => format!(
            "\
    for (var t = 0u; t < TB; t++) {{
        for (var r = 0u; r < R; r++) {{
            if (t < ntb && row0 + r < p.n_rows) {{
                dst[{} + row0 + r] = acc[t * R + r];
            }}
        }}
    }}",
            tokens.dst_row("t")
        ),
        // Dense only: the experts' gate and up are separate tensors.
        Some(act) => format!(
            "\
    for (var t = 0u; t < TB; t++) {{
        for (var h = 0u; h < R / 2u; h++) {{
            let r = 2u * h;
            if (t < ntb && row0 + r + 1u < p.n_rows) {{
                let o = (t0 + t) * p.out_stride + (p.out_row_offset + row0 + r) / 2u;
                dst[o] = {act}(acc[t * R + r]) * acc[t * R + r + 1u];
            }}
        }}
    }}"
        ),
    };
    let parts: &[&str] = if glu.is_some() {
        &[quant, ACT, MATMUL]
    } else {
        &[quant, MATMUL]
    };
    let src = compose(
        parts,
        &[
            ("TB", tb.to_string()),
            ("R", rows.to_string()),
            ("SG_ARGS", sg_args.to_string()),
            ("TOKEN_BINDINGS", tokens.bindings().to_string()),
            (
                "HEAD_BINDING",
                match tokens {
                    Tokens::Dense => "4",
                    Tokens::Grouped => "6",
                }
                .to_string(),
            ),
            ("TOKENS", tokens.rows_prologue().to_string()),
            ("X_ROW", tokens.rows_x_row().to_string()),
            ("EXIT", exit.to_string()),
            ("X_ELEM", x_elem.to_string()),
            ("XLOAD", xload),
            ("STORE", store),
        ],
    );
    inline_body_reads(&src)
}

/// The CPU-shaped matmul's source with every body read `bw(b, i)` of its weight snippet
/// written out as `bv[i]` (the block's body, loaded whole into the words `bv`). In the
/// unrolled `load_block` loops `i` is a constant, so a bounds-checked compiler (a
/// browser's Tint) sees constant indices and adds no clamp; through a function, the clamp
/// on its parameter kept `bv` in memory after SwiftShader's optimizer had inlined it
/// (every body word stored and loaded again, per block and row). Comments are left as
/// they are.
fn inline_body_reads(src: &str) -> String {
    src.split_inclusive('\n')
        .map(|line| match line.find("//") {
            Some(c) => inline_body_reads_in(&line[..c]) + &line[c..],
            None => inline_body_reads_in(line),
        })
        .collect()
}

fn inline_body_reads_in(src: &str) -> String {
    const CALL: &str = "bw(";
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(at) = rest.find(CALL) {
        let before = &rest[..at];
        let is_call = !before.ends_with(|c: char| c.is_alphanumeric() || c == '_')
            && !before.ends_with("fn ");
        let args_at = at + CALL.len();
        let close = is_call
            .then(|| crate::gpu::unroll::matching(rest, args_at - 1, ('(', ')')))
            .flatten();
        let Some(close) = close else {
            out.push_str(&rest[..args_at]);
            rest = &rest[args_at..];
            continue;
        };
        match top_level_split(&rest[args_at..close]).as_slice() {
            [_, i] => {
                out.push_str(before);
                out.push_str(&format!("bv[{}]", i.trim()));
            }
            _ => out.push_str(&rest[..=close]),
        }
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    out
}

/// `args` split at its commas outside parentheses and brackets.
fn top_level_split(args: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in args.char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&args[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&args[start..]);
    parts
}

/// Rows per invocation of the GPU matrix-vector matmul for `rows` rows per workgroup: up
/// to 8, so one invocation's quarter of x serves that many rows (workgroups of up to 8
/// rows are one segment of 256 invocations; 16 and 32 rows are 2 and 4 segments).
pub fn gpu_vec_rows_per_invocation(rows: u32) -> u32 {
    rows.min(8)
}

/// The rows-per-workgroup matrix-vector matmul: `rows` rows per workgroup of 256 (in
/// segments of [`gpu_vec_rows_per_invocation`] rows), `tb` tokens, reduced with
/// subgroupAdd when `subgroups` (the caller checks that the adapter's widest subgroup fits
/// in a segment's invocations) or a workgroup-memory tree.
/// With `glu` (an activation's WGSL name; `rows` even) act(gate) * up of each interleaved
/// (gate, up) row pair is written. `quant` is the weight type's [`quant_snippet`].
pub fn matmul_wg_source(
    quant: &str,
    tb: u32,
    rows: u32,
    subgroups: bool,
    glu: Option<&str>,
) -> String {
    let rpt = gpu_vec_rows_per_invocation(rows);
    // Every value (r, t) of a segment reduced into res[t * ROWS + seg * RPT + r].
    let reduce_tree = "\
    for (var r = 0u; r < RPT; r++) {
        for (var t = 0u; t < TB; t++) { red[t * 256u + lid] = acc[r * TB + t]; }
        workgroupBarrier();
        for (var s = TPR / 2u; s > 0u; s >>= 1u) {
            if (sl < s) {
                for (var t = 0u; t < TB; t++) { red[t * 256u + lid] += red[t * 256u + lid + s]; }
            }
            workgroupBarrier();
        }
        if (sl == 0u) {
            for (var t = 0u; t < TB; t++) { res[t * ROWS + seg * RPT + r] = red[t * 256u + lid]; }
        }
        workgroupBarrier();
    }";
    // Subgroup sums at red[(r * TB + t) * nsg + subgroup]: RPT * TB * nsg <= 256 * TB
    // since RPT <= 8 <= the subgroup size.
    let reduce_sg = "\
    let nsg = 256u / sg_size;
    let g = lid / sg_size;
    for (var i = 0u; i < RPT * TB; i++) {
        let s = subgroupAdd(acc[i]);
        if (sg_lane == 0u) { red[i * nsg + g] = s; }
    }
    workgroupBarrier();
    if (sl < RPT * TB) {
        let r = sl / TB;
        let t = sl % TB;
        let per_seg = TPR / sg_size;
        let first = seg * per_seg;
        var s = 0.0;
        for (var i = 0u; i < per_seg; i++) { s += red[(r * TB + t) * nsg + first + i]; }
        res[t * ROWS + seg * RPT + r] = s;
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
    let store = match glu {
        None => "\
    if (lid < ROWS * ntb) {
        let r = lid % ROWS;
        let t = lid / ROWS;
        if (row_wg + r < p.n_rows) {
            dst[(t0 + t) * p.out_stride + p.out_row_offset + row_wg + r] = res[t * ROWS + r];
        }
    }"
        .to_string(),
        Some(act) => format!(
            "\
    let half = ROWS / 2u;
    if (lid < half * ntb) {{
        let j = lid % half;
        let t = lid / half;
        if (row_wg + 2u * j + 1u < p.n_rows) {{
            let o = p.out_row_offset + row_wg + 2u * j;
            dst[(t0 + t) * p.out_stride + o / 2u] = {act}(res[t * ROWS + 2u * j]) * res[t * ROWS + 2u * j + 1u];
        }}
    }}"
        ),
    };
    let parts: &[&str] = if glu.is_some() {
        &[quant, QUANT_READ, ACT, MATMUL_WG]
    } else {
        &[quant, QUANT_READ, MATMUL_WG]
    };
    compose(
        parts,
        &[
            ("TB", tb.to_string()),
            ("ROWS", rows.to_string()),
            ("RPT", rpt.to_string()),
            ("SG_ARGS", args.to_string()),
            ("REDUCE", reduce.to_string()),
            ("STORE", store),
        ],
    )
}

/// The tiled prompt matmul for BM weight rows x BN tokens per workgroup (multiples of 16),
/// with each invocation's (BM/16) x (BN/16) micro-tile unrolled into scalar accumulators.
/// `quant` is the weight type's [`quant_snippet`].
/// The cooperative-matrix prompt matmul for weights of snippet `quant`, on S x S f16
/// matrices accumulated in f32.
pub fn matmul_coop_source(quant: &str, s: u32) -> String {
    let mat = |ty: &str, role: &str| format!("coop_mat{s}x{s}<{ty}, {role}>");
    compose(
        &[quant, QUANT_READ, MATMUL_COOP],
        &[
            ("S", s.to_string()),
            ("A", mat("f16", "A")),
            ("B", mat("f16", "B")),
            ("C", mat("f32", "C")),
        ],
    )
}

pub fn matmul_tile_source(quant: &str, bm: u32, bn: u32, tokens: Tokens) -> String {
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
            "    let s{j} = ty + {}u;\n    if (s{j} < n_here) {{\n        let o = {};\n",
            16 * j,
            tokens.dst_row(&format!("s{j}"))
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
        &[quant, QUANT_READ, MATMUL_TILE],
        &[
            ("BM", bm.to_string()),
            ("BN", bn.to_string()),
            ("TOKEN_BINDINGS", tile_bindings(tokens)),
            ("TOKENS", tokens.tile_prologue().to_string()),
            ("X_ROW", tokens.tile_x_row().to_string()),
            ("DECL", decl),
            ("BODY", body),
            ("STORE", store),
        ],
    )
}

/// The tiled kernel's bindings after dst, with the workgroup's count of pairs shared
/// for a uniform exit.
fn tile_bindings(tokens: Tokens) -> String {
    match tokens {
        Tokens::Dense => String::new(),
        Tokens::Grouped => format!("{}\nvar<workgroup> run_here: u32;", tokens.bindings()),
    }
}

/// The flash attention kernel for K and V caches of types `k` and `v`: over every cell into
/// the normalised output, or with `split` over one chunk of cells per workgroup z into
/// the split kernel's partials and (max, sum) stats.
pub fn attn_flash_source(k: KvType, v: KvType, split: bool) -> String {
    flash_source(ATTN_FLASH, &[], k, v, split)
}

/// The f16-tile flash kernel (`attn_flash_coop.wgsl`) reading K and V caches of types `k`
/// and `v`, over every cell or a chunk of them, its two products on 16 x 16 cooperative
/// matrices (`mma`) or as loops computing the same elements into the same places.
pub fn attn_flash_coop_source(k: KvType, v: KvType, split: bool, mma: bool) -> String {
    let (scores, pv) = if mma {
        let mat = |ty: &str, role: &str| format!("coop_mat16x16<{ty}, {role}>");
        let (a, b, c) = (mat("f16", "A"), mat("f16", "B"), mat("f32", "C"));
        (
            format!(
                "        var acc = coopLoad<{c}>(&zero[0], BQ);
        for (var dd = 0u; dd < 4u * dp4; dd += 16u) {{
            let a = coopLoadT<{a}>(&qs[dd], DP_MAX);
            let b = coopLoad<{b}>(&ks[dd], DP_MAX);
            acc = coopMultiplyAdd(a, b, acc);
        }}
        coopStore(acc, &sc[0], BQ);"
            ),
            format!(
                "        let pa = coopLoadT<{a}>(&ps[0], BK);
        for (var dd = 0u; dd < 4u * dp4; dd += 16u) {{
            var pacc = coopLoad<{c}>(&zero[0], BQ);
            let b = coopLoadT<{b}>(&vs[dd], DP_MAX);
            pacc = coopMultiplyAdd(pa, b, pacc);
            coopStore(pacc, &pv[dd * BQ], BQ);
        }}"
            ),
        )
    } else {
        (
            "        for (var e = lid; e < BQ * BK; e += 32u) {
            let t = e % BQ;
            let c = e / BQ;
            var acc = 0.0;
            for (var d = 0u; d < 4u * dp4; d++) {
                acc += f32(qs[t * DP_MAX + d]) * f32(ks[c * DP_MAX + d]);
            }
            sc[c * BQ + t] = acc;
        }"
            .to_string(),
            "        for (var e = lid; e < 4u * dp4 * BQ; e += 32u) {
            let t = e % BQ;
            let d = e / BQ;
            var acc = 0.0;
            for (var c = 0u; c < BK; c++) {
                acc += f32(ps[t * BK + c]) * f32(vs[c * DP_MAX + d]);
            }
            pv[d * BQ + t] = acc;
        }"
            .to_string(),
        )
    };
    flash_source(
        ATTN_FLASH_COOP,
        &[("SCORES", scores), ("PV", pv)],
        k,
        v,
        split,
    )
}

/// A flash kernel's module: its output bindings, range of cells and store for the whole
/// output or a chunk's partial one (each invocation holds output vec4s `sub + OSTEP i`).
fn flash_source(
    kernel: &str,
    subs: &[(&str, String)],
    k: KvType,
    v: KvType,
    split: bool,
) -> String {
    let (decl, range, store) = if split {
        (
            "@group(0) @binding(5) var<storage, read_write> part: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> stats: array<vec2<f32>>;",
            "    let c_begin = wid.z * p.chunk;
    let c_end = min(c_begin + p.chunk, p.n_kv);",
            "        let row = (wid.z * p.n_tok + tq) * p.n_head + h;
        for (var i = 0u; i < OI; i++) {
            let d = sub + OSTEP * i;
            if (d < d4) {
                part[row * d4 + d] = o[i];
            }
        }
        if (sub == 0u) {
            stats[row] = vec2<f32>(m, l);
        }",
        )
    } else {
        (
            "@group(0) @binding(5) var<storage, read_write> dst: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read> sinks: array<f32>;",
            "    let c_begin = 0u;
    let c_end = p.n_kv;",
            "        // A token that sees no cell gets 0, as the softmax gives it. A head's sink
        // logit (p.has_sinks) joins the maximum and the sum, with no value.
        var inv = select(0.0, 1.0 / l, l > 0.0);
        if (p.has_sinks != 0u) {
            let sk = sinks[h];
            let mm = max(m, sk);
            let f = exp(m - mm);
            inv = f / (l * f + exp(sk - mm));
        }
        for (var i = 0u; i < OI; i++) {
            let d = sub + OSTEP * i;
            if (d < d4) {
                dst[(tq * p.n_head + h) * d4 + d] = o[i] * inv;
            }
        }",
        )
    };
    let mut all = subs.to_vec();
    all.extend([
        ("OUT_DECL", decl.to_string()),
        ("RANGE", range.to_string()),
        ("STORE", store.to_string()),
    ]);
    kv_reading(
        &compose(&[SOFTMAX_COMMON, kernel], &[]),
        Some(k),
        Some(v),
        &all,
    )
}

/// rope_store into K and V caches of types `k` and `v`, with the per-head norm weights
/// bound when `norm`.
pub fn rope_store_source(k: KvType, v: KvType, norm: bool, rows: bool) -> String {
    let bindings = if norm {
        "@group(0) @binding(7) var<storage, read> q_norm: array<f32>;
@group(0) @binding(8) var<storage, read> k_norm: array<f32>;
fn norm_weight(e: u32, is_q: bool) -> f32 { return select(k_norm[e], q_norm[e], is_q); }"
    } else {
        "fn norm_weight(e: u32, is_q: bool) -> f32 { return 1.0; }"
    };
    let (k_elem, k_fns) = kv_store("k", "k_cache", k);
    let (v_elem, v_fns) = kv_store("v", "v_cache", v);
    compose(
        &[
            kv_common(&[k, v]),
            ROPE_STORE,
            if rows { ROPE_STORE_ROWS } else { ROPE_STORE_WG },
        ],
        &[
            ("K_ELEM", k_elem),
            ("V_ELEM", v_elem),
            ("KV_STORE", format!("{k_fns}\n{v_fns}")),
            ("NORM", norm.to_string()),
            ("NORM_BINDINGS", bindings.to_string()),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::inline_body_reads;

    #[test]
    fn body_reads_are_written_out_outside_comments() {
        let src = "fn bw(b: u32, i: u32) -> u32 { return 0u; }
let q = bw(k.b, o + 1u) + hbw(k.b, 2u); // bw(b, i) stays
let r = bw(row, (e % 16u) / 4u) >> bw(k.b, min(i, 3u));
";
        let out = inline_body_reads(src);
        assert_eq!(
            out,
            "fn bw(b: u32, i: u32) -> u32 { return 0u; }
let q = bv[o + 1u] + hbw(k.b, 2u); // bw(b, i) stays
let r = bv[(e % 16u) / 4u] >> bv[min(i, 3u)];
"
        );
    }
}
