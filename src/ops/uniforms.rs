//! How a kernel family's uniform parameter block is defined once: [`uniform_struct!`]
//! emits the `#[repr(C)]` Rust struct the dispatch code fills and the WGSL `struct Params`
//! that the shader source generator prepends, so the two layouts cannot drift apart. Each
//! op file declares its own blocks; the ones here serve several families (the norms; the
//! row copies of set_rows, pooling and the Hadamard transform) or the host (`SampleRow`).
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
pub(crate) use uniform_struct;

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
    /// set_rows: `n_rows` rows of `row_len` values.
    SetRowsUniform {
        row_len: u32,
        n_rows: u32,
        _pad0: u32,
        _pad1: u32,
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
        assert_eq!(
            std::mem::size_of::<crate::ops::softmax::SoftmaxUniform>(),
            48
        );
        assert_eq!(std::mem::size_of::<crate::ops::matmul::MatmulUniform>(), 32);
    }
}
