//! The uniform parameter block of each kernel family, defined once: the macro emits the
//! `#[repr(C)]` Rust struct the dispatch code fills and the WGSL `struct Params` that the
//! shader source generator prepends, so the two layouts cannot drift apart.
//!
//! Fields are 4-byte scalars only (u32, f32, i32), so the Rust offsets equal the WGSL
//! uniform offsets; each struct is padded by hand to a multiple of 16 bytes (checked at
//! compile time), the size uniform buffers are rounded to on every backend.

macro_rules! uniform_struct {
    (
        $(#[$meta:meta])*
        $name:ident {
            $( $(#[$fmeta:meta])* $field:ident : $ty:ident ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
        pub struct $name {
            $( $(#[$fmeta])* pub $field: $ty, )*
        }

        impl $name {
            /// The same layout as WGSL, named `Params` (shaders bind it as `p`).
            pub const WGSL: &'static str = concat!(
                "struct Params {\n",
                $( "    ", stringify!($field), ": ", stringify!($ty), ",\n", )*
                "}\n"
            );
        }

        const _: () = assert!(
            std::mem::size_of::<$name>() % 16 == 0,
            concat!(stringify!($name), ": uniform size must be a multiple of 16 bytes")
        );
    };
}

uniform_struct! {
    /// rms_norm and add_rms_norm: rows of `n` values.
    NormUniform {
        n: u32,
        eps: f32,
        /// Rows of the weight, row r of x taking weight row r % w_rows (0 or 1: one row;
        /// Mamba-2's grouped norm has one per group).
        w_rows: u32,
        /// Rows of x (read by the one-invocation-per-row shape, norm_rows.wgsl).
        n_rows: u32,
    }
}

uniform_struct! {
    /// binary: `n` outputs; output i takes `b[(i / div) % nb]`.
    BinaryUniform {
        n: u32,
        nb: u32,
        div: u32,
        _pad0: u32,
    }
}

uniform_struct! {
    /// glu: `n` outputs; gate and up interleaved in one tensor when `pairs` is 1.
    GluUniform {
        n: u32,
        pairs: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

uniform_struct! {
    /// add_scaled: `n` values of `n_tok` rows added, times `scale`, at `offset + j * step`
    /// of destination rows `stride` long.
    AddScaledUniform {
        n: u32,
        n_tok: u32,
        stride: u32,
        offset: u32,
        step: u32,
        scale: f32,
        _pad0: u32,
        _pad1: u32,
    }
}

uniform_struct! {
    /// rope over [head_dim, n_head, n_tok].
    RopeUniform {
        head_dim: u32,
        n_head: u32,
        n_tok: u32,
        /// Rotated dimensions (<= head_dim); the rest pass through.
        n_dims: u32,
        /// 0: rotate pairs (2i, 2i+1); 1: pairs (i, i + n_dims/2).
        neox: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

uniform_struct! {
    /// rope_store: a Q/K/V projection row's heads to Q and the cache.
    RopeStoreUniform {
        head_dim: u32,
        n_head: u32,
        n_head_kv: u32,
        /// Rotated dimensions (<= head_dim); the rest pass through.
        n_dims: u32,
        /// 0: rotate pairs (2i, 2i+1); 1: pairs (i, i + n_dims/2).
        neox: u32,
        /// Epsilon of the per-head RMS norm (the norm variant only).
        eps: f32,
        /// Walsh-Hadamard rotation of Q and K heads (chunks of rot_k values) and of V heads
        /// (rot_v), llama.cpp's attention rotation of a quantized cache; 0: none.
        rot_k: u32,
        rot_v: u32,
    }
}

uniform_struct! {
    /// set_rows: `n_rows` rows of `row_len` values.
    SetRowsUniform {
        row_len: u32,
        n_rows: u32,
        _pad0: u32,
        _pad1: u32,
    }
}

uniform_struct! {
    /// softmax with scale, mask and ALiBi.
    SoftmaxUniform {
        n_cols: u32,
        rows_per_head: u32,
        has_mask: u32,
        n_head_log2: u32,
        scale: f32,
        max_bias: f32,
        m0: f32,
        m1: f32,
        /// Gemma 2's logit soft-capping: scaled scores become softcap tanh(s / softcap)
        /// before the mask; 0: none.
        softcap: f32,
        /// Whether `sinks` holds one logit per head that joins each row's softmax
        /// (gpt-oss): in the maximum and the sum, with no value.
        has_sinks: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

uniform_struct! {
    /// attn_kq and attn_kqv.
    AttnUniform {
        head_dim: u32,
        n_head: u32,
        n_head_kv: u32,
        n_tok: u32,
        n_kv: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

uniform_struct! {
    /// attn_kqv_split: the attention shape and the softmax's scale, mask and ALiBi.
    AttnSplitUniform {
        head_dim: u32,
        n_head: u32,
        n_head_kv: u32,
        n_tok: u32,
        n_kv: u32,
        /// Cells per chunk.
        chunk: u32,
        has_mask: u32,
        n_head_log2: u32,
        scale: f32,
        max_bias: f32,
        m0: f32,
        m1: f32,
        /// As [`SoftmaxUniform::softcap`].
        softcap: f32,
        /// As [`SoftmaxUniform::has_sinks`] (read by the flash kernels' whole-output store;
        /// split outputs take the sinks in the join).
        has_sinks: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

uniform_struct! {
    /// attn_kqv_sum: `n` vec4s (rows of `d4`) in each of `n_split` partial outputs.
    AttnSumUniform {
        n: u32,
        n_split: u32,
        d4: u32,
        n_head: u32,
        /// As [`SoftmaxUniform::has_sinks`] (attn_kqv_sum only).
        has_sinks: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

uniform_struct! {
    /// get_rows: gather rows of a (chunk of a) matrix.
    GetRowsUniform {
        /// Elements per row.
        n: u32,
        /// Words per row in the GPU layout.
        row_words: u32,
        row_begin: u32,
        row_count: u32,
        n_ids: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

uniform_struct! {
    /// The three matmul kernels (matmul, matmul_wg, matmul_tile).
    MatmulUniform {
        /// Row length (a multiple of the block size).
        k: u32,
        /// Rows in this chunk.
        n_rows: u32,
        n_tok: u32,
        row_words: u32,
        /// First row of this chunk in dst (in weight rows, even with the GLU epilogue).
        out_row_offset: u32,
        /// dst row length (all rows of the matrix, or of the tensor the rows go into;
        /// half the weight's rows with the GLU epilogue).
        out_stride: u32,
        /// Workgroups along x (rows are split over x and y).
        wg_x: u32,
        _pad0: u32,
    }
}

uniform_struct! {
    /// quantize_q8_1: `n_blocks` blocks of 32 values to 8-bit blocks, whose (d, d * sum)
    /// pairs start at word `ds_off` of the output.
    QuantizeQ8Uniform {
        n_blocks: u32,
        ds_off: u32,
        /// Workgroups along x (blocks are split over x and y).
        wg_x: u32,
        _pad0: u32,
    }
}

uniform_struct! {
    /// matmul_q8: [`MatmulUniform`]'s fields, and where x's (d, d * sum) pairs start in
    /// its quantized blocks (in words).
    MatmulQ8Uniform {
        k: u32,
        n_rows: u32,
        n_tok: u32,
        row_words: u32,
        out_row_offset: u32,
        out_stride: u32,
        wg_x: u32,
        ds_off: u32,
    }
}

uniform_struct! {
    /// moe_route: `n_tok` tokens' router logits over `n_expert` experts to `n_used` chosen
    /// ones and their weights; `gating` 0 softmax, 1 sigmoid, 2 softmax over the chosen
    /// logits; `norm` renormalises the weights, `scale` multiplies them (0 or 1: not).
    MoeRouteUniform {
        n_tok: u32,
        n_expert: u32,
        n_used: u32,
        gating: u32,
        norm: u32,
        scale: f32,
        wg_x: u32,
        _pad0: u32,
    }
}

uniform_struct! {
    /// matmul_id: experts of `n_rows` rows of `k` values (`row_words` words each), the
    /// dispatch's chunk holding experts `e_begin..e_end`; `n_used` experts per token, x
    /// rows per pair (`x_per_pair`) or per token.
    MatmulIdUniform {
        k: u32,
        n_rows: u32,
        row_words: u32,
        n_used: u32,
        e_begin: u32,
        e_end: u32,
        x_per_pair: u32,
        wg_x: u32,
    }
}

uniform_struct! {
    /// moe_group: `n_pairs` (token, expert) pairs over `n_expert` experts.
    MoeGroupUniform {
        n_pairs: u32,
        n_expert: u32,
        _pad0: u32,
        _pad1: u32,
    }
}

uniform_struct! {
    /// moe_add_id: `n` values, pairs of `rows`, each plus its expert's bias row.
    MoeAddIdUniform {
        n: u32,
        rows: u32,
        wg_x: u32,
        _pad0: u32,
    }
}

uniform_struct! {
    /// moe_sum: `n` = tokens x `n_out` outputs, each a weighted sum over `n_used` experts.
    MoeSumUniform {
        n: u32,
        n_out: u32,
        n_used: u32,
        wg_x: u32,
    }
}

uniform_struct! {
    /// ssm_conv: a causal depthwise convolution of width `k` over `ch` channels, for
    /// `n_s` sequences of `n_t` tokens each; x rows are `x_stride` values apart.
    SsmConvUniform {
        ch: u32,
        k: u32,
        n_t: u32,
        n_s: u32,
        x_stride: u32,
        /// 1: add the bias (binding 4) before the activation.
        bias: u32,
        /// 1: SiLU on the output.
        silu: u32,
        _pad0: u32,
    }
}

uniform_struct! {
    /// ssm_scan: the selective scan over `n_s` sequences of `n_t` tokens, `n_head` heads
    /// of `head_dim` channels, states of `d_state` values; B and C in `n_group` groups.
    /// Row strides and offsets (in f32) say where x, dt, B, C and z sit in their tensors;
    /// A (`a_per_state`: one per state value, Mamba; else one per head, Mamba-2), D and
    /// the dt bias sit in one constants buffer at `a_off`, `d_off`, `dtb_off`.
    SsmScanUniform {
        d_state: u32,
        head_dim: u32,
        n_head: u32,
        n_group: u32,
        n_t: u32,
        n_s: u32,
        x_stride: u32,
        dt_stride: u32,
        bc_stride: u32,
        b_off: u32,
        c_off: u32,
        z_stride: u32,
        a_per_state: u32,
        a_off: u32,
        d_off: u32,
        dtb_off: u32,
    }
}

uniform_struct! {
    /// sample_topk and sample_chain: rows of `n_vocab` logits, the first pass's segments
    /// and candidate slots, the stride of a slot's penalty ring.
    SampleUniform {
        n_vocab: u32,
        /// Logits per first-pass workgroup.
        seg_len: u32,
        n_seg: u32,
        /// Candidate slots per (row, segment): the largest k of the dispatch's rows.
        k_stride: u32,
        /// Entries per slot's ring (the ring buffer holds head, length, entries).
        ring_max: u32,
        /// (token, probability) places per row in the probabilities buffer.
        probs_stride: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

uniform_struct! {
    /// One row to sample (an element of a storage array, WGSL `SampleRow`): where its
    /// logits are, whose penalty state it uses, and the chain's settings.
    SampleRow {
        /// Logits row in the ubatch's output.
        row: u32,
        /// The session's slot (its cache sequence): counts, bias and ring rows.
        slot: u32,
        /// Candidates the chain starts from (top-k; 1 for greedy).
        k: u32,
        /// 1: add the slot's logit bias; 2: apply the penalties and record the token.
        flags: u32,
        top_p: f32,
        min_p: f32,
        temp: f32,
        min_keep: u32,
        repeat_penalty: f32,
        freq_penalty: f32,
        presence_penalty: f32,
        /// Tokens the penalties look back over (repeat_last_n).
        ring_cap: u32,
        /// The draw's uniform number in [0, 1) as a float pair (hi + lo).
        u_hi: f32,
        u_lo: f32,
        /// The chain's final candidates to write, best first, with their probabilities
        /// (llama-server's post-sampling `n_probs`); 0: only the token.
        n_probs: u32,
        _pad1: u32,
    }
}

impl SampleRow {
    /// The WGSL struct under its own name (it is a storage element, not the uniform).
    pub fn wgsl() -> String {
        Self::WGSL.replacen("struct Params", "struct SampleRow", 1)
    }
}

pub use crate::gpu::{params_in_storage, PARAMS_DECL};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wgsl_struct_matches_rust_fields() {
        assert_eq!(
            NormUniform::WGSL,
            "struct Params {\n    n: u32,\n    eps: f32,\n    w_rows: u32,\n    n_rows: u32,\n}\n"
        );
        assert_eq!(std::mem::size_of::<SoftmaxUniform>(), 48);
        assert_eq!(std::mem::size_of::<MatmulUniform>(), 32);
    }
}
