//! What every kernel family declares, and the key that names one variant of any family.
//!
//! Each op file (`ops/matmul.rs`, `ops/attention.rs`, ...) declares its kernels beside its
//! dispatch and CPU reference: a type implementing [`Family`] with its variants, WGSL,
//! uniform block, workgroup size and device features. [`KernelKey`] (declared by the
//! `families!` table in `ops/mod.rs`) is a thin enum over those types: it picks the
//! pipeline in [`crate::gpu::Gpu::pipeline`], and [`KernelKey::all`] gathers every
//! family's variants, which the offline test validates with naga and translates to MSL
//! and HLSL. `Gpu::pipeline` refuses any key outside that list, so a variant that was
//! never checked offline cannot reach a driver.

use super::KernelKey;
use crate::gpu::KernelShape;
use crate::kv::KvType;
use std::collections::HashSet;
use std::sync::OnceLock;

/// What an op file declares about its kernels. A family is a small `Copy` type whose
/// values are its variants (the constants baked into each variant's source); its
/// `Display` is the variant's name in pipelines, tuning caches and the kernel index.
pub trait Family: Copy + Eq + std::hash::Hash + std::fmt::Debug + std::fmt::Display {
    /// The WGSL files only this family embeds (see [`kernel_files!`]), hashed by the
    /// tuning fingerprint; shared fragments are in [`super::shaders::SOURCES`].
    const FILES: &'static [(&'static str, &'static str)];
    /// Every variant the op can ask for.
    fn variants() -> Vec<Self>;
    /// The kernel's WGSL after its uniform block (entry point `main`), or why there is
    /// none (a weight type without a GPU snippet).
    fn body(&self) -> Result<String, String>;
    /// The WGSL `struct Params` of the kernel's uniform block (a `uniform_struct!`'s
    /// `WGSL`).
    fn uniform_wgsl(&self) -> &'static str;
    /// Invocations per workgroup (x; y and z are 1).
    fn workgroup_size(&self) -> u32;
    /// The device features the shader needs (shader-f16, subgroups, cooperative matrices).
    fn features(&self) -> wgpu::Features {
        wgpu::Features::empty()
    }
    /// Whether only CPU-shaped adapters (lavapipe, llvmpipe, SwiftShader) select this
    /// variant: a GPU's model step never runs it (the op picks it only where
    /// `Gpu::kernels` is [`KernelShape::Cpu`]).
    fn cpu_shaped(&self) -> bool {
        false
    }
    /// For matmul kernels: (weight rows, tokens) one workgroup computes.
    fn matmul_block(&self) -> Option<(u32, u32)> {
        None
    }
    /// What the kernel's products should compile to where the device has them.
    fn products(&self) -> Products {
        Products::Plain
    }
    /// Whether the kernel writes all of its workgroup memory before its first barrier and
    /// reads it only after, so that the pipeline need not zero it (see
    /// [`crate::gpu::Kernel::reads_unwritten_workgroup_memory`]); a family says so only
    /// after reading its source that closely.
    fn writes_workgroup_memory_first(&self) -> bool {
        false
    }
}

/// Embeds a family's own WGSL files (paths under `shaders/`): a constant for each, and
/// `FILES`, the list its [`Family::FILES`] names so the tuning fingerprint hashes them.
macro_rules! kernel_files {
    ($($(#[$doc:meta])* $name:ident = $file:literal;)*) => {
        $($(#[$doc])* const $name: &str = include_str!(concat!("../../shaders/", $file));)*
        /// This family's own WGSL files, by name (see `Family::FILES`).
        const FILES: &[(&str, &str)] = &[$(($file, $name)),*];
    };
}
pub(crate) use kernel_files;

/// The family of an op with one kernel: `Kernel`, a unit struct named `$name` whose
/// source is `$source` (one of its `kernel_files!`) after the uniform `$uniform`, with `$wg`
/// invocations per workgroup.
macro_rules! one_kernel {
    ($name:literal, $source:ident, $uniform:ty, $wg:literal) => {
        /// The op's one kernel.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub struct Kernel;

        impl $crate::ops::kernels::Family for Kernel {
            const FILES: &'static [(&'static str, &'static str)] = FILES;
            fn variants() -> Vec<Self> {
                vec![Kernel]
            }
            fn body(&self) -> Result<String, String> {
                Ok($source.to_string())
            }
            fn uniform_wgsl(&self) -> &'static str {
                <$uniform>::WGSL
            }
            fn workgroup_size(&self) -> u32 {
                $wg
            }
        }

        impl std::fmt::Display for Kernel {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str($name)
            }
        }
    };
}
pub(crate) use one_kernel;

/// Declares [`KernelKey`]: a variant per family, and its methods by dispatch to the
/// family's. Invoked once, by the table in `ops/mod.rs`.
macro_rules! families {
    ($($(#[$doc:meta])* $variant:ident($family:ty),)*) => {
        /// A kernel variant of any family: the shader and every constant baked into its
        /// source.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum KernelKey {
            $($(#[$doc])* $variant($family),)*
        }

        $(impl From<$family> for KernelKey {
            fn from(k: $family) -> KernelKey {
                KernelKey::$variant(k)
            }
        })*

        impl KernelKey {
            /// Every variant the ops can request, family by family: the offline check's
            /// list, and the set `Gpu::pipeline` accepts.
            pub fn all() -> Vec<KernelKey> {
                let mut v = Vec::new();
                $(v.extend(<$family as $crate::ops::kernels::Family>::variants()
                    .into_iter()
                    .map(KernelKey::$variant));)*
                v
            }

            /// Every family's own WGSL files (see `Family::FILES`).
            pub fn family_files() -> Vec<(&'static str, &'static str)> {
                let mut v = Vec::new();
                $(v.extend_from_slice(<$family as $crate::ops::kernels::Family>::FILES);)*
                v
            }

            /// The kernel's WGSL after its uniform block.
            fn body(&self) -> Result<String, String> {
                use $crate::ops::kernels::Family;
                match self { $(KernelKey::$variant(k) => k.body(),)* }
            }

            /// The WGSL `struct Params` of the kernel's uniform block.
            pub fn uniform_wgsl(&self) -> &'static str {
                use $crate::ops::kernels::Family;
                match self { $(KernelKey::$variant(k) => k.uniform_wgsl(),)* }
            }

            /// Invocations per workgroup (x; y and z are 1).
            pub fn workgroup_size(&self) -> u32 {
                use $crate::ops::kernels::Family;
                match self { $(KernelKey::$variant(k) => k.workgroup_size(),)* }
            }

            /// The device features the shader needs.
            pub fn features(&self) -> wgpu::Features {
                use $crate::ops::kernels::Family;
                match self { $(KernelKey::$variant(k) => k.features(),)* }
            }

            /// Whether only CPU-shaped adapters select this variant (see
            /// `Family::cpu_shaped`).
            pub fn cpu_shaped(&self) -> bool {
                use $crate::ops::kernels::Family;
                match self { $(KernelKey::$variant(k) => k.cpu_shaped(),)* }
            }

            /// For the matmul kernels: (weight rows, tokens) one workgroup computes, from
            /// which the dispatch size follows.
            pub fn matmul_block(&self) -> Option<(u32, u32)> {
                use $crate::ops::kernels::Family;
                match self { $(KernelKey::$variant(k) => k.matmul_block(),)* }
            }

            /// The instructions a GPU compiler must make of this kernel's products where
            /// the device has them (`scripts/kernel-stats.sh` checks them in the
            /// disassembly).
            pub fn product_instructions(&self) -> $crate::ops::kernels::Products {
                use $crate::ops::kernels::Family;
                match self { $(KernelKey::$variant(k) => k.products(),)* }
            }

            fn writes_workgroup_memory_first(&self) -> bool {
                use $crate::ops::kernels::Family;
                match self { $(KernelKey::$variant(k) => k.writes_workgroup_memory_first(),)* }
            }
        }

        impl std::fmt::Display for KernelKey {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                match self { $(KernelKey::$variant(k) => k.fmt(f),)* }
            }
        }
    };
}
pub(crate) use families;

/// What a kernel's products should compile to ([`KernelKey::product_instructions`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Products {
    /// Cooperative matrices: matrix instructions (`v_wmma_*` on RDNA3).
    Matrix,
    /// Packed 4 x 8-bit dot products (`v_dot4_*` on AMD).
    IntegerDot,
    /// Ordinary arithmetic.
    Plain,
}

impl Products {
    /// The name the kernel index uses.
    pub fn name(&self) -> &'static str {
        match self {
            Products::Matrix => "matrix",
            Products::IntegerDot => "intdot",
            Products::Plain => "plain",
        }
    }
}

/// Both kernel shapes, CPU first: the values of a family's `shape` field.
pub const SHAPES: [KernelShape; 2] = [KernelShape::Cpu, KernelShape::Gpu];

/// `cpu` for a CPU-shaped variant, else `gpu`: a family's source or size by its shape.
pub fn by_shape<T>(shape: KernelShape, cpu: T, gpu: T) -> T {
    if shape == KernelShape::Cpu {
        cpu
    } else {
        gpu
    }
}

/// The one spelling of a kernel's shape in its name and its file: `_rows` for a
/// CPU-shaped variant (an invocation per row, no barriers), `_wg` for a GPU-shaped one (a
/// workgroup per row): `rms_norm_rows`/`rms_norm_wg`, `hadamard_rows.wgsl`/`hadamard_wg.wgsl`.
pub fn shape_suffix(shape: KernelShape) -> &'static str {
    by_shape(shape, "_rows", "_wg")
}

/// "f16" or "f32": the type a kernel's f16 flag stands for.
pub fn float_name(f16: bool) -> &'static str {
    if f16 {
        "f16"
    } else {
        "f32"
    }
}

/// A fingerprint of every kernel source (FNV-1a over the shared fragments, each
/// family's own files and each weight type's snippet): the tuner's cache keys on it, so
/// changed kernels are measured again even within one version.
pub fn fingerprint() -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for src in fingerprinted() {
        for b in src.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x100000001b3);
        }
    }
    h
}

/// Every kernel source the fingerprint covers, in one fixed order.
fn fingerprinted() -> Vec<String> {
    let mut files: Vec<(&str, &str)> = super::shaders::SOURCES.to_vec();
    files.extend(KernelKey::family_files());
    files.sort_by_key(|(name, _)| *name);
    // Every weight format's readers, from the registry that the kernels take them from.
    let types = super::shaders::weight_types().into_iter();
    let snippets = types.filter_map(super::shaders::quant_snippet);
    let loaders = crate::quant::FORMATS.iter().filter_map(|f| f.int_dot());
    files
        .into_iter()
        .map(|(_, src)| src.to_string())
        .chain(snippets)
        .chain(loaders.map(|d| d.wgsl.to_string()))
        .chain(
            KvType::ALL
                .iter()
                .filter_map(|t| t.wgsl())
                .map(str::to_string),
        )
        .collect()
}

impl KernelKey {
    /// Whether [`Self::all`] lists this key (the set is built once).
    pub fn is_known(&self) -> bool {
        static ALL: OnceLock<HashSet<KernelKey>> = OnceLock::new();
        ALL.get_or_init(|| Self::all().into_iter().collect())
            .contains(self)
    }

    /// The naga capabilities matching [`Self::features`]. Every kernel may use
    /// `unpack2x16float` (f16 scales read from f32 words), which needs no device feature.
    pub fn naga_capabilities(&self) -> naga::valid::Capabilities {
        use naga::valid::Capabilities as C;
        let f = self.features();
        let mut caps = C::SHADER_FLOAT16_IN_FLOAT32;
        if f.contains(wgpu::Features::SHADER_F16) {
            caps |= C::SHADER_FLOAT16;
        }
        if f.contains(wgpu::Features::SUBGROUP) {
            caps |= C::SUBGROUP;
        }
        if f.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
            caps |= C::COOPERATIVE_MATRIX;
        }
        caps
    }

    /// The complete WGSL module (entry point `main`), or why there is none (a weight
    /// type without a GPU snippet).
    pub fn source(&self) -> Result<String, String> {
        let body = self.body()?;
        // `enable` directives must precede every declaration.
        let mut enable = String::new();
        if self.features().contains(wgpu::Features::SHADER_F16) {
            enable += "enable f16;\n";
        }
        if (self.features()).contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
            enable += "enable wgpu_cooperative_matrix;\n";
        }
        Ok(format!("{enable}{}\n{body}", self.uniform_wgsl()))
    }
}

impl crate::gpu::Kernel for KernelKey {
    fn source(&self) -> Result<String, String> {
        KernelKey::source(self)
    }
    fn features(&self) -> wgpu::Features {
        KernelKey::features(self)
    }
    fn naga_capabilities(&self) -> naga::valid::Capabilities {
        KernelKey::naga_capabilities(self)
    }
    fn is_known(&self) -> bool {
        KernelKey::is_known(self)
    }
    fn reads_unwritten_workgroup_memory(&self) -> bool {
        !self.writes_workgroup_memory_first()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgmlType;
    use crate::kv::KvType;
    use crate::ops::attention::{self, *};
    use crate::ops::binary::BinaryOp;
    use crate::ops::glu::Activation;
    use crate::ops::matmul::{self, *};
    use crate::ops::matmul_q8::{Q8_MATMUL_ROWS, Q8_MATMUL_TOKENS, Q8_TILES};
    use crate::ops::shaders::{self, SOURCES};
    use crate::ops::ssm::SSM_DS;
    /// The files under `shaders/` whose text no fingerprinted source holds.
    fn unhashed(sources: &[String]) -> Vec<String> {
        let mut out = Vec::new();
        let mut dirs = vec![std::path::PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/shaders"
        ))];
        while let Some(dir) = dirs.pop() {
            for e in std::fs::read_dir(&dir).unwrap() {
                let path = e.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|x| x == "wgsl") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    if !sources.iter().any(|s| s.contains(&text)) {
                        out.push(path.display().to_string());
                    }
                }
            }
        }
        out
    }

    /// A changed kernel source must change the tuning fingerprint, or a stale kernel
    /// choice stays in the cache: every `.wgsl` file is hashed, and a file left out of
    /// the table is found.
    #[test]
    fn every_shader_file_is_in_the_fingerprint() {
        let all = fingerprinted();
        let files: Vec<(&str, &str)> = [SOURCES, &KernelKey::family_files()].concat();
        assert!(files.len() > 60);
        assert_eq!(unhashed(&all), Vec::<String>::new());
        // The formats' snippets come from their registries: leave those out, and every
        // one of their files is missed.
        let formats: Vec<String> = crate::quant::FORMATS
            .iter()
            .filter_map(|f| f.int_dot())
            .map(|d| d.wgsl.to_string())
            .chain(
                KvType::ALL
                    .iter()
                    .filter_map(|t| t.wgsl())
                    .map(str::to_string),
            )
            .collect();
        let less: Vec<String> = all
            .iter()
            .filter(|s| !formats.contains(s))
            .cloned()
            .collect();
        let missed = unhashed(&less);
        assert_eq!(missed.len(), formats.len(), "{missed:?}");
        assert!(missed
            .iter()
            .all(|f| f.contains("/weights/dot_") || f.contains("/cache/kv_")));
        for name in [
            "kernels/get_rows.wgsl",
            "kernels/layer_norm.wgsl",
            "kernels/ssm_scan_wg.wgsl",
        ] {
            let (file, src) = *files.iter().find(|(f, _)| *f == name).unwrap();
            let less: Vec<String> = all.iter().filter(|s| s.as_str() != src).cloned().collect();
            let missed = unhashed(&less);
            assert!(
                missed.len() == 1 && missed[0].ends_with(file),
                "{file}: {missed:?}"
            );
        }
    }

    use crate::gpu::unroll::{unroll, MAX_TRIPS};
    use naga::back::{hlsl, msl};

    /// `src` (a key's WGSL) parsed and validated with only the capabilities `key` declares.
    fn validated(
        key: KernelKey,
        src: &str,
    ) -> Result<(naga::Module, naga::valid::ModuleInfo), String> {
        let module = naga::front::wgsl::parse_str(src)
            .map_err(|e| format!("parse: {}", e.emit_to_string(src)))?;
        let info = naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            key.naga_capabilities(),
        )
        .validate(&module)
        .map_err(|e| format!("validate: {}", e.emit_to_string(src)))?;
        Ok((module, info))
    }

    /// Parses and validates a key's WGSL with only the capabilities it declares, checks
    /// its workgroup size, and translates it the way wgpu's Metal and DX12 backends would.
    fn check(key: KernelKey) -> Result<(), String> {
        let (module, info) = validated(key, &key.source()?)?;
        let ep = module
            .entry_points
            .iter()
            .find(|ep| ep.name == "main")
            .ok_or("no entry point `main`")?;
        if ep.workgroup_size != [key.workgroup_size(), 1, 1] {
            return Err(format!(
                "workgroup size {:?}, the key says {}",
                ep.workgroup_size,
                key.workgroup_size()
            ));
        }
        let subgroups = key.features().contains(wgpu::Features::SUBGROUP);
        let f16 = key.features().contains(wgpu::Features::SHADER_F16);
        if let KernelKey::Matmul(matmul::Kernel::GpuCoop { s, .. }) = key {
            return check_coop(&module, &info, s);
        }
        if let KernelKey::Attention(attention::Kernel::FlashCoop { mma: true, .. }) = key {
            return check_coop(&module, &info, 16);
        }
        // Metal: MSL 2.0 is what wgpu's oldest supported macOS offers; simdgroup
        // reductions need 2.1. Bounds checks as wgpu enables them by default.
        let checks = naga::proc::BoundsCheckPolicies {
            index: naga::proc::BoundsCheckPolicy::ReadZeroSkipWrite,
            buffer: naga::proc::BoundsCheckPolicy::ReadZeroSkipWrite,
            ..Default::default()
        };
        let msl_opts = msl::Options {
            lang_version: if subgroups { (2, 1) } else { (2, 0) },
            bounds_check_policies: checks,
            ..Default::default()
        };
        let msl_pipe = msl::PipelineOptions {
            entry_point: Some((naga::ShaderStage::Compute, "main".into())),
            ..Default::default()
        };
        msl::write_string(&module, &info, &msl_opts, &msl_pipe)
            .map_err(|e| format!("MSL: {e:?}"))?;
        // DX12: shader model 5.1 (FXC) for the plain kernels, 6.0 for wave intrinsics,
        // 6.2 for native f16 (both through DXC).
        let hlsl_opts = hlsl::Options {
            shader_model: if f16 {
                hlsl::ShaderModel::V6_2
            } else if subgroups {
                hlsl::ShaderModel::V6_0
            } else {
                hlsl::ShaderModel::V5_1
            },
            ..Default::default()
        };
        let hlsl_pipe = hlsl::PipelineOptions {
            entry_point: Some((naga::ShaderStage::Compute, "main".into())),
        };
        let mut out = String::new();
        hlsl::Writer::new(&mut out, &hlsl_opts, &hlsl_pipe)
            .write(&module, &info, None)
            .map_err(|e| format!("HLSL: {e:?}"))?;
        Ok(())
    }

    /// A cooperative-matrix kernel as wgpu's backends that have them would take it: SPIR-V
    /// with the cooperative-matrix capability (Vulkan), and for the 8 x 8 size Apple's
    /// simdgroup matrices (MSL 2.3). DX12 has none through wgpu.
    fn check_coop(
        module: &naga::Module,
        info: &naga::valid::ModuleInfo,
        s: u32,
    ) -> Result<(), String> {
        let spv_opts = naga::back::spv::Options {
            lang_version: (1, 3),
            ..Default::default()
        };
        let spv_pipe = naga::back::spv::PipelineOptions {
            shader_stage: naga::ShaderStage::Compute,
            entry_point: "main".into(),
        };
        let words = naga::back::spv::write_vec(module, info, &spv_opts, Some(&spv_pipe))
            .map_err(|e| format!("SPIR-V: {e:?}"))?;
        // OpCapability CooperativeMatrixKHR (6022) is declared.
        if !words
            .windows(2)
            .any(|w| w[0] == (2 << 16 | 17) && w[1] == 6022)
        {
            return Err("SPIR-V without the CooperativeMatrixKHR capability".into());
        }
        if s == 8 {
            let msl_opts = msl::Options {
                lang_version: (2, 3),
                ..Default::default()
            };
            let msl_pipe = msl::PipelineOptions {
                entry_point: Some((naga::ShaderStage::Compute, "main".into())),
                ..Default::default()
            };
            let out = msl::write_string(module, info, &msl_opts, &msl_pipe)
                .map_err(|e| format!("MSL: {e:?}"))?;
            if !out.0.contains("simdgroup_multiply_accumulate") {
                return Err("MSL without simdgroup_multiply_accumulate".into());
            }
        }
        Ok(())
    }

    #[test]
    fn every_kernel_variant_validates_and_translates_to_msl_and_hlsl() {
        let failures: Vec<String> = KernelKey::all()
            .into_iter()
            .filter_map(|k| check(k).err().map(|e| format!("{k}: {e}")))
            .collect();
        assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    }

    /// What `Gpu::pipeline` compiles where the adapter keeps loops (SwiftShader): each
    /// variant with its short loops written out still parses and validates, and every
    /// loop the unroller may take is gone.
    #[test]
    fn every_kernel_variant_validates_unrolled() {
        let failures: Vec<String> = KernelKey::all()
            .into_iter()
            .filter_map(|k| {
                let src = k.source().map(|s| unroll(&s, MAX_TRIPS));
                let err = src.and_then(|src| validated(k, &src).map(drop)).err()?;
                Some(format!("{k}: {err}"))
            })
            .collect();
        assert!(failures.is_empty(), "{}", failures.join("\n\n"));
        let matmul = KernelKey::Matmul(matmul::Kernel::CpuRows {
            ty: crate::gguf::GgmlType::Q4_1,
            rows: 2,
            tb: 1,
            subgroups: false,
            glu: None,
        });
        let src = matmul.source().unwrap();
        let unrolled = unroll(&src, MAX_TRIPS);
        // Only the loop over blocks (`nb`) is left.
        assert_eq!(unrolled.matches("for (").count(), 1, "{unrolled}");
        assert!(src.matches("for (").count() > 8);
    }

    /// What `Gpu::pipeline` compiles where the driver specializes on uniforms (lavapipe):
    /// every variant declares its parameters the one way the rewrite expects, and still
    /// validates reading them from storage.
    #[test]
    fn every_kernel_variant_validates_with_params_in_storage() {
        use crate::ops::uniforms::params_in_storage;
        let failures: Vec<String> = KernelKey::all()
            .into_iter()
            .filter_map(|k| {
                let src = k.source().and_then(|s| {
                    params_in_storage(&s).ok_or_else(|| "no parameter declaration".to_string())
                });
                let err = match src {
                    Ok(src) if src.contains("var<uniform>") => "a uniform is left".to_string(),
                    Ok(src) => validated(k, &src).err()?,
                    Err(e) => e,
                };
                Some(format!("{k}: {err}"))
            })
            .collect();
        assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    }

    #[test]
    fn all_covers_every_choice_the_ops_make() {
        let all = KernelKey::all();
        let set: HashSet<_> = all.iter().copied().collect();
        assert_eq!(set.len(), all.len(), "duplicate keys");
        let types = shaders::weight_types();
        assert!(types.len() >= 5, "{types:?}");
        let splits = split_shapes().len();
        // Lanes 1 to 32 with 1 or 2 vec4s each (1 lane only ever has 1), 64 lanes with 1 to 8.
        assert_eq!(splits, 19);
        let even = |rows: &[u32]| rows.iter().filter(|&&r| r % 2 == 0).count();
        // Plain matmuls, the experts' products, and the fused GLU epilogue (even rows only)
        // per activation.
        // CPU-shaped batches with and without subgroups, decode without.
        let cpu_tokens = 2 * CPU_MATMUL_TOKENS.len() - 1;
        // The experts' products: per pair, and over grouped pairs in the CPU-shaped
        // kernel's batch tiles (with and without subgroups) and the GPU tiles.
        let experts = 1 + CPU_MATMUL_ROWS.len() * (cpu_tokens - 1) + GPU_TILES.len();
        let per_type = 1
            + CPU_MATMUL_ROWS.len() * cpu_tokens
            + GPU_VEC_TOKENS.len() * GPU_VEC_ROWS.len() * 2
            + GPU_TILES.len()
            + COOP_SIZES.len()
            + experts
            + Activation::FUSED.len()
                * (even(CPU_MATMUL_ROWS) * cpu_tokens
                    + GPU_VEC_TOKENS.len() * even(GPU_VEC_ROWS) * 2);
        assert_eq!(experts, 36);
        assert_eq!(per_type, 68 + 34 + 2 * (27 + 20));
        // Each family with a space of choices has exactly the variants counted here (the
        // families of one variant, or one per op or shape, list themselves).
        let count = |family: fn(&KernelKey) -> bool| all.iter().filter(|k| family(k)).count();
        let n_types = types.len();
        // get_rows, then the matmuls: per type all but the experts' products.
        assert_eq!(count(|k| matches!(k, KernelKey::GetRows(_))), n_types);
        assert_eq!(
            count(|k| matches!(k, KernelKey::Matmul(_))),
            n_types * (per_type - 1 - experts)
        );
        // Expert routing, grouping, biases and weighted sum, then the products per type.
        assert_eq!(
            count(|k| matches!(k, KernelKey::Moe(_))),
            4 + n_types * experts
        );
        // Per cache type the score and output kernels, the split and tiled ones, and per
        // (K, V) pair two GPU flash kernels, four of f16 tiles (matrices or loops) and the
        // CPU ones (head buckets x tokens); the split and tiled joins once.
        let tiles = ATTN_TILE_DK.len() + ATTN_TILE_NI.len();
        let n_kv = KvType::ALL.len();
        let per_pair = 6 + FLASH_ROWS_D4.len() * FLASH_ROWS_TB.len();
        let attn = (2 + KQ_LANES_NK.len()) * ATTN_TB.len() + splits + tiles + per_pair * n_kv;
        assert_eq!(
            count(|k| matches!(k, KernelKey::Attention(_))),
            2 + n_kv * attn
        );
        // Per (K, V) pair with and without the Q/K norms; plain pairs also have the
        // one-invocation-per-head shape.
        let plain = KvType::ALL.iter().filter(|t| !t.is_packed()).count();
        assert_eq!(
            count(|k| matches!(k, KernelKey::RopeStore(_))),
            2 * n_kv * n_kv + 2 * plain * plain
        );
        assert_eq!(count(|k| matches!(k, KernelKey::SetRows(_))), 2 * n_kv);
        // The activation quantizer, and per type every rows x tokens x reduction and the
        // tiles.
        let q8 = 1 + crate::quant::int_dot_types().len()
            * (Q8_MATMUL_ROWS.len() * Q8_MATMUL_TOKENS.len() * 2 + Q8_TILES.len());
        assert_eq!(count(|k| matches!(k, KernelKey::MatmulQ8(_))), q8);
        assert_eq!(
            count(|k| matches!(k, KernelKey::Ssm(_))),
            1 + 2 * SSM_DS.len()
        );
        assert_eq!(
            count(|k| matches!(k, KernelKey::Binary(_))),
            BinaryOp::ALL.len()
        );
        assert_eq!(
            count(|k| matches!(k, KernelKey::Glu(_))),
            Activation::ALL.len()
        );
        // The default GPU path for 2-7 tokens, and the f32-cache attention for 4+ tokens,
        // which the hand-kept list used to miss.
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::F16,
        ] {
            for subgroups in [false, true] {
                for glu in glu_epilogues() {
                    assert!(set.contains(&KernelKey::Matmul(matmul::Kernel::GpuVec {
                        ty,
                        tb: 4,
                        rows: 4,
                        subgroups,
                        glu
                    })));
                }
            }
        }
        for ty in KvType::ALL {
            let attn = |k: attention::Kernel| set.contains(&KernelKey::Attention(k));
            assert!(attn(attention::Kernel::Kq { k: ty, tb: 4 }));
            assert!(attn(attention::Kernel::Kqv { v: ty, tb: 4 }));
            assert!(attn(attention::Kernel::Flash {
                k: ty,
                v: KvType::Q4_0,
                split: true
            }));
        }
        // Every split shape attention can pick for head sizes up to the limit.
        for head_dim in (4..=MAX_SPLIT_HEAD_DIM).step_by(4) {
            let (lanes, nv) = split_shape(head_dim / 4);
            assert!(
                set.contains(&KernelKey::Attention(attention::Kernel::KqvSplit {
                    v: KvType::F16,
                    lanes,
                    nv
                }))
            );
        }
        let auto = crate::gpu::KernelShape::Auto;
        assert!(!KernelKey::Softmax(crate::ops::softmax::Kernel { shape: auto }).is_known());
        let q8k = crate::ops::get_rows::Kernel { ty: GgmlType::Q8K };
        assert!(!KernelKey::GetRows(q8k).is_known());
    }
}
