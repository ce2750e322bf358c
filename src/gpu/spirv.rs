//! Kernels as the SPIR-V wgpu's Vulkan backend hands a driver, written without a device:
//! for Khronos' validator and for GPU compilers that run without their GPU (Mesa's RADV
//! on its null device), so that every kernel meets a vendor's compiler before any GPU
//! does.
//!
//! The options follow wgpu-hal 30's Vulkan device (`Adapter::open`, `compile_stage`): the
//! highest SPIR-V the device's Vulkan version allows, the capabilities its enabled
//! features and properties allow, and what [`super::Gpu::pipeline`] asks per pipeline:
//! runtime checks off (the kernels are created trusted), workgroup memory zeroed only for
//! a kernel that reads memory it did not write.

use super::pipeline::{prepare, Kernel, Rewrites};
use naga::back::spv;

/// The Vulkan device a kernel is written for: what wgpu would have enabled on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VulkanTarget {
    /// The device's Vulkan version (major, minor); it sets the SPIR-V version.
    pub vulkan: (u8, u8),
    /// The wgpu features the device was opened with (shader-f16, subgroups, cooperative
    /// matrices).
    pub features: wgpu::Features,
    /// `shaderIntegerDotProduct`: packed 4 x 8-bit dot products become dot instructions
    /// (else naga writes them out as shifts, multiplies and adds).
    pub integer_dot: bool,
    /// The source rewrites the device gets ([`super::Gpu::pipeline`]).
    pub rewrites: Rewrites,
}

impl VulkanTarget {
    /// A discrete GPU of today (Vulkan 1.3, as RADV, NVIDIA's and Intel's drivers report):
    /// every feature the kernels may use, integer dot products, no source rewrites.
    pub fn modern_gpu() -> Self {
        VulkanTarget {
            vulkan: (1, 3),
            features: wgpu::Features::SHADER_F16
                | wgpu::Features::SUBGROUP
                | wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX,
            integer_dot: true,
            rewrites: Rewrites::default(),
        }
    }

    /// The SPIR-V version wgpu writes for this Vulkan version (the highest it allows).
    pub fn spirv_version(&self) -> (u8, u8) {
        match self.vulkan {
            (1, 0) => (1, 0),
            (1, 1) => (1, 3),
            (1, 2) => (1, 5),
            _ => (1, 6),
        }
    }

    /// `spirv-val`'s name for the environment (`--target-env`).
    pub fn target_env(&self) -> String {
        format!("vulkan{}.{}", self.vulkan.0, self.vulkan.1)
    }

    /// The capabilities wgpu lets naga declare on such a device.
    fn capabilities(&self) -> naga::FastHashSet<spv::Capability> {
        use spv::Capability as C;
        let mut caps = vec![
            C::Shader,
            C::Matrix,
            C::Sampled1D,
            C::Image1D,
            C::ImageQuery,
            C::DerivativeControl,
            C::StorageImageExtendedFormats,
            C::SampledCubeArray,
            C::SampleRateShading,
            // wgpu asks every Vulkan device for shaderInt8 where it has it.
            C::Int8,
        ];
        let f = self.features;
        if f.contains(wgpu::Features::SUBGROUP) {
            caps.extend([
                C::GroupNonUniform,
                C::GroupNonUniformVote,
                C::GroupNonUniformArithmetic,
                C::GroupNonUniformBallot,
                C::GroupNonUniformShuffle,
                C::GroupNonUniformShuffleRelative,
                C::GroupNonUniformQuad,
            ]);
        }
        if f.contains(wgpu::Features::SHADER_F16) {
            caps.push(C::Float16);
        }
        if f.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
            caps.extend([C::CooperativeMatrixKHR, C::VulkanMemoryModel]);
        }
        if self.integer_dot {
            caps.extend([
                C::DotProductInputAll,
                C::DotProductInput4x8Bit,
                C::DotProductInput4x8BitPacked,
                C::DotProduct,
            ]);
        }
        caps.into_iter().collect()
    }
}

/// The SPIR-V words of `key` as wgpu would create its pipeline on `target`, or why there
/// are none (a feature the target lacks, a source naga refuses, a translation error).
pub fn kernel_spirv<K: Kernel>(key: &K, target: &VulkanTarget) -> Result<Vec<u32>, String> {
    let missing = key.features() - target.features;
    if !missing.is_empty() {
        return Err(format!("needs device features {missing:?}"));
    }
    let prepared = prepare(key, target.rewrites)?;
    let none = naga::proc::BoundsCheckPolicy::Unchecked;
    let options = spv::Options {
        lang_version: target.spirv_version(),
        // wgpu's flags for a device without debugging: point size is for vertex stages.
        flags: spv::WriterFlags::LABEL_VARYINGS | spv::WriterFlags::FORCE_POINT_SIZE,
        fake_missing_bindings: false,
        binding_map: binding_map(&prepared.module),
        capabilities: Some(target.capabilities()),
        // `create_shader_module_trusted` with unchecked runtime checks.
        bounds_check_policies: naga::proc::BoundsCheckPolicies {
            index: none,
            buffer: none,
            image_load: none,
            binding_array: none,
        },
        zero_initialize_workgroup_memory: if key.reads_unwritten_workgroup_memory() {
            spv::ZeroInitializeWorkgroupMemoryMode::Native
        } else {
            spv::ZeroInitializeWorkgroupMemoryMode::None
        },
        force_loop_bounding: false,
        ray_query_initialization_tracking: false,
        trace_ray_argument_validation: true,
        use_storage_input_output_16: target.features.contains(wgpu::Features::SHADER_F16),
        debug_info: None,
        task_dispatch_limits: None,
        mesh_shader_primitive_indices_clamp: true,
        emit_int_div_checks: false,
    };
    let pipeline = spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: "main".into(),
    };
    spv::write_vec(&prepared.module, &prepared.info, &options, Some(&pipeline))
        .map_err(|e| format!("SPIR-V: {e}"))
}

/// Each binding's place in its Vulkan descriptor set as wgpu lays it out: a layout's
/// entries (derived from the shader, in binding order) numbered from 0 in turn.
fn binding_map(module: &naga::Module) -> spv::BindingMap {
    let mut bindings: Vec<naga::ResourceBinding> = (module.global_variables.iter())
        .filter_map(|(_, var)| var.binding)
        .collect();
    bindings.sort_by_key(|b| (b.group, b.binding));
    let mut map = spv::BindingMap::default();
    let mut next = (u32::MAX, 0);
    for b in bindings {
        if next.0 != b.group {
            next = (b.group, 0);
        }
        let info = spv::BindingInfo {
            descriptor_set: b.group,
            binding: next.1,
            binding_array_size: None,
        };
        map.insert(b, info);
        next.1 += 1;
    }
    map
}

/// Whether a module declares a capability (`OpCapability`, opcode 17).
pub fn declares_capability(words: &[u32], cap: spv::Capability) -> bool {
    // The header is five words; instructions follow, the word count in the high half.
    let mut i = 5;
    while i < words.len() {
        let (count, op) = ((words[i] >> 16) as usize, words[i] & 0xffff);
        if count == 0 {
            return false;
        }
        if op == 17 && words.get(i + 1) == Some(&(cap as u32)) {
            return true;
        }
        i += count;
    }
    false
}
