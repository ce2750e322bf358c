//! The kernel choices a device runs with, as plain data: overrides of the ops' built-in
//! selection, from the `WGLLM_*` variables or the tuner. What each may be set to, and
//! how they are read from the environment, is the ops' business (`ops::tuning`), which
//! checks every value against the kernel variants that exist.

/// Overrides of the kernel choices; `None` (the default) keeps the built-in choice.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelTuning {
    /// `WGLLM_MATMUL_TILE=RxT`: (rows, tokens) per invocation of the CPU-shaped matmul.
    pub matmul_tile: Option<(u32, u32)>,
    /// `WGLLM_GPU_TILE=64x64|128x64|128x128`: (weight rows, tokens) per workgroup of the
    /// tiled prompt matmul. 128x64 and 128x128 fall back to the default choice where the
    /// adapter lacks the 24 or 32 KiB of workgroup memory they take.
    pub gpu_tile: Option<(u32, u32)>,
    /// `WGLLM_GPU_VEC`: weight rows per workgroup of the GPU matrix-vector matmul.
    pub gpu_vec_rows: Option<u32>,
    /// `WGLLM_TILE_MIN`: fewest tokens for which GPU-shaped kernels use the tiled matmul.
    pub tile_min: Option<u32>,
    /// `WGLLM_ATTN_TB`: tokens per invocation of the attention score and output kernels.
    pub attn_tb: Option<u32>,
    /// `WGLLM_ATTN_SPLIT`: most tokens for which GPU-shaped kernels split the attention
    /// output over cells.
    pub attn_split_max_tok: Option<u32>,
    /// `WGLLM_ATTN_TILE_MIN`: fewest tokens for which GPU-shaped kernels take the tiled
    /// prompt attention (`ops::attention`); a number above the ubatch turns it off.
    pub attn_tile_min: Option<u32>,
    /// `WGLLM_ATTN_CHUNK`: cells per workgroup (at least) of the GPU split attention
    /// output (`ops::attention`, 128 by default).
    pub attn_split_chunk: Option<u32>,
    /// `WGLLM_ATTN_FLASH=0|1`: GPU-shaped kernels take the flash attention kernel (for
    /// every batch, where the head fits it) or not (the default; see `ops::attention`).
    pub attn_flash: Option<bool>,
    /// `WGLLM_ATTN_KQ_LANES=0|1`: GPU-shaped kernels compute attention scores with 8
    /// invocations per cell (`attn_kq_lanes.wgsl`, the default) or one (`attn_kq.wgsl`).
    pub attn_kq_lanes: Option<bool>,
    /// `WGLLM_INT_DOT=0|1`: matmuls of the weight types that have one take the
    /// integer-dot kernel (`ops::matmul_q8`: activations quantized to 8-bit blocks once,
    /// products by packed 4x8-bit dot products) for every batch size, or never; unset,
    /// the tuner's choice below decides.
    pub int_dot: Option<bool>,
    /// Whether the tuner measured the integer-dot kernel faster (and checked it correct
    /// on this device) for decoding, up to [`INT_DOT_DECODE_TOKENS`] tokens, and for
    /// prompts beyond that.
    pub int_dot_decode: Option<bool>,
    pub int_dot_prompt: Option<bool>,
    /// `WGLLM_COOP_MATRIX=0|1`: GPU-shaped prompt matmuls take the cooperative-matrix
    /// kernel where the device has the matrices it needs (`Gpu::coop_size`), or not;
    /// unset, the tuner's choice (off until it measured the kernel faster and checked it
    /// correct on the device).
    pub coop_matrix: Option<bool>,
    /// `WGLLM_UNROLL=0|1`: kernels' short constant-bounded loops written out before
    /// compiling (`gpu::unroll`), or not; by default where the adapter's compiler keeps
    /// loops as written ([`crate::gpu::AdapterSummary::keeps_loops`]).
    pub unroll: Option<bool>,
    /// `WGLLM_PARAMS_STORAGE=0|1`: kernels read their parameters from a read-only storage
    /// buffer rather than a uniform one ([`super::params_in_storage`]); by default
    /// where the driver specializes kernels on uniform values
    /// ([`crate::gpu::AdapterSummary::specializes_on_uniforms`]).
    pub params_storage: Option<bool>,
    /// (rows, tokens) per invocation of the CPU-shaped matmul for one token and for 8+
    /// tokens: what the tuner (`crate::tune`) measured best on an adapter, below
    /// `matmul_tile`, which overrides every size.
    pub cpu_decode_tile: Option<(u32, u32)>,
    pub cpu_prompt_tile: Option<(u32, u32)>,
    /// Whether the tuner measured a token drawn on the GPU cheaper than one read back and
    /// sampled on the host: what `--sampling auto` takes (`crate::tune::measure_draws`).
    pub gpu_draws: Option<bool>,
    /// `WGLLM_PROFILE=1`: time every dispatch alone before each graph run and log the
    /// totals per op (slow; for finding hot spots, not for measuring speed).
    pub profile: bool,
}

/// Most tokens of a matmul that the tuner's decode choice of the integer-dot kernel
/// covers (the kernel's widest variant takes 8 tokens per workgroup, as llama.cpp's
/// `mul_mat_vecq` does); larger batches follow its prompt choice.
pub const INT_DOT_DECODE_TOKENS: u32 = 8;

impl KernelTuning {
    /// Whether a matmul of `n_tok` tokens takes the integer-dot kernel (where its weight
    /// type has one): `WGLLM_INT_DOT` where set, else the tuner's choice for that size.
    pub fn int_dot_for_tokens(&self, n_tok: u32) -> bool {
        let tuned = if n_tok <= INT_DOT_DECODE_TOKENS {
            self.int_dot_decode
        } else {
            self.int_dot_prompt
        };
        self.int_dot.or(tuned) == Some(true)
    }

    /// These overrides where set, the tuned `base` elsewhere: what the user asked for
    /// (environment) wins over what the tuner measured.
    pub fn over(&self, base: &KernelTuning) -> KernelTuning {
        KernelTuning {
            matmul_tile: self.matmul_tile.or(base.matmul_tile),
            gpu_tile: self.gpu_tile.or(base.gpu_tile),
            gpu_vec_rows: self.gpu_vec_rows.or(base.gpu_vec_rows),
            tile_min: self.tile_min.or(base.tile_min),
            attn_tb: self.attn_tb.or(base.attn_tb),
            attn_split_max_tok: self.attn_split_max_tok.or(base.attn_split_max_tok),
            attn_tile_min: self.attn_tile_min.or(base.attn_tile_min),
            attn_split_chunk: self.attn_split_chunk.or(base.attn_split_chunk),
            attn_flash: self.attn_flash.or(base.attn_flash),
            attn_kq_lanes: self.attn_kq_lanes.or(base.attn_kq_lanes),
            int_dot: self.int_dot.or(base.int_dot),
            int_dot_decode: self.int_dot_decode.or(base.int_dot_decode),
            int_dot_prompt: self.int_dot_prompt.or(base.int_dot_prompt),
            coop_matrix: self.coop_matrix.or(base.coop_matrix),
            unroll: self.unroll.or(base.unroll),
            params_storage: self.params_storage.or(base.params_storage),
            cpu_decode_tile: self.cpu_decode_tile.or(base.cpu_decode_tile),
            cpu_prompt_tile: self.cpu_prompt_tile.or(base.cpu_prompt_tile),
            gpu_draws: self.gpu_draws.or(base.gpu_draws),
            profile: self.profile || base.profile,
        }
    }
}
