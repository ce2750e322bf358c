//! How a context's K/V cache is configured: its element types (`-ctk`, `-ctv`, formats of
//! `crate::quant::cache`), flash attention (`-fa`) and the Hadamard rotation llama.cpp
//! applies to quantized caches.

use crate::quant::cache::KvType;

/// Flash attention, as llama.cpp's `-fa on|off|auto`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FlashAttn {
    On,
    Off,
    /// On where the cache needs it (a quantized V) or where this adapter's flash kernel
    /// is the faster path (CPU-shaped kernels: lavapipe, llvmpipe), else off (GPU-shaped
    /// kernels, whose flash kernel is still slower than the tiled and split paths;
    /// ARCHITECTURE.md).
    #[default]
    Auto,
}

impl FlashAttn {
    /// llama.cpp's values (`on`, `off`, `auto`) and the older spellings of each.
    pub fn parse(s: &str) -> Result<FlashAttn, String> {
        match s.to_ascii_lowercase().as_str() {
            "on" | "1" | "true" | "enabled" => Ok(FlashAttn::On),
            "off" | "0" | "false" | "disabled" => Ok(FlashAttn::Off),
            "auto" | "-1" => Ok(FlashAttn::Auto),
            _ => Err(format!("-fa '{s}': flash attention is on, off or auto")),
        }
    }
}

/// What a context's cache holds and how attention reads it: `-ctk`, `-ctv`, `-fa`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvConfig {
    /// None: f16 where the adapter has shader-f16, else f32.
    pub type_k: Option<KvType>,
    pub type_v: Option<KvType>,
    pub flash_attn: FlashAttn,
}

/// The cache a context gets: [`KvConfig`] decided for one model and adapter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvChoice {
    pub type_k: KvType,
    pub type_v: KvType,
    pub flash: bool,
    /// llama.cpp's attention rotation of a quantized cache: Q and K heads are multiplied by
    /// an orthonormal Walsh-Hadamard matrix of this size (in chunks) before K is stored,
    /// which spreads outliers over a block and so quantizes K better; 0 for none.
    pub rot_k: u32,
    /// The same for V heads (chunks of 64), the attention output rotated back.
    pub rot_v: u32,
}

impl KvConfig {
    /// The types and flash attention for heads of `head_dim` in K/V rows of `n_embd` on an
    /// adapter with (or without) shader-f16 and whose flash kernel is (or is not) faster
    /// than the unfused path, or why this configuration cannot be served.
    pub fn resolve(
        &self,
        has_f16: bool,
        head_dim: u32,
        n_embd: u32,
        flash_faster: bool,
    ) -> Result<KvChoice, String> {
        let default = if has_f16 { KvType::F16 } else { KvType::F32 };
        let type_k = self.type_k.unwrap_or(default);
        let type_v = self.type_v.unwrap_or(default);
        for (flag, ty) in [("-ctk", type_k), ("-ctv", type_v)] {
            if ty == KvType::F16 && !has_f16 {
                return Err(format!(
                    "{flag} f16: this adapter has no shader-f16 (or --no-f16 was given); use f32, bf16 or a quantized type"
                ));
            }
            ty.check_shape(head_dim, n_embd)
                .map_err(|e| format!("{flag} {ty}: {e}"))?;
        }
        let flash = match self.flash_attn {
            FlashAttn::On => true,
            FlashAttn::Off => false,
            FlashAttn::Auto => type_v.is_quantized() || flash_faster,
        };
        if type_v.is_quantized() && !flash {
            return Err(format!(
                "-ctv {type_v}: a quantized V cache needs flash attention, as in llama.cpp; use -fa on or -fa auto"
            ));
        }
        Ok(KvChoice {
            type_k,
            type_v,
            flash,
            rot_k: rotation(type_k, head_dim, true),
            rot_v: rotation(type_v, head_dim, false),
        })
    }
}

/// The Hadamard rotation llama.cpp applies to heads of `head_dim` stored as `ty`: only
/// quantized types and heads of a multiple of 64; K by the largest power of two (from 64)
/// dividing the head, V by 64.
fn rotation(ty: KvType, head_dim: u32, k: bool) -> u32 {
    if !ty.is_quantized() || !head_dim.is_multiple_of(64) {
        return 0;
    }
    let mut n = 64;
    while k && head_dim.is_multiple_of(2 * n) {
        n *= 2;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_and_refusals() {
        let auto = KvConfig::default();
        let c = auto.resolve(true, 64, 192, false).unwrap();
        assert_eq!(
            (c.type_k, c.type_v, c.flash),
            (KvType::F16, KvType::F16, false)
        );
        let c = auto.resolve(false, 64, 192, false).unwrap();
        assert_eq!((c.type_k, c.type_v), (KvType::F32, KvType::F32));
        // Auto takes flash attention where the adapter's flash kernel is the faster path.
        assert!(auto.resolve(true, 64, 192, true).unwrap().flash);
        let off = KvConfig {
            flash_attn: FlashAttn::Off,
            ..auto
        };
        assert!(!off.resolve(true, 64, 192, true).unwrap().flash);
        let q = |k, v, fa| KvConfig {
            type_k: Some(k),
            type_v: Some(v),
            flash_attn: fa,
        };
        // A quantized V turns auto on and is refused with -fa off.
        let c = q(KvType::Q8_0, KvType::Q4_0, FlashAttn::Auto).resolve(true, 64, 192, false);
        assert!(c.unwrap().flash);
        let e = q(KvType::F16, KvType::Q8_0, FlashAttn::Off).resolve(true, 64, 192, false);
        assert!(e.unwrap_err().contains("needs flash attention"));
        // A quantized K alone does not need it.
        let c = q(KvType::Q8_0, KvType::F16, FlashAttn::Off).resolve(true, 64, 192, false);
        let c = c.unwrap();
        assert!(!c.flash);
        // llama.cpp's rotation sizes: quantized types only, K by the head's largest
        // power-of-two multiple of 64, V by 64.
        assert_eq!((c.rot_k, c.rot_v), (64, 0));
        let c = q(KvType::Q4_0, KvType::Q4_0, FlashAttn::On)
            .resolve(true, 256, 256, false)
            .unwrap();
        assert_eq!((c.rot_k, c.rot_v), (256, 64));
        let c = q(KvType::Q4_0, KvType::Bf16, FlashAttn::On)
            .resolve(true, 96, 192, false)
            .unwrap();
        assert_eq!((c.rot_k, c.rot_v), (0, 0));
        let e = q(KvType::F16, KvType::F16, FlashAttn::Auto).resolve(false, 64, 192, false);
        assert!(e.unwrap_err().contains("shader-f16"));
        assert_eq!(FlashAttn::parse("ON"), Ok(FlashAttn::On));
        assert!(FlashAttn::parse("maybe").is_err());
    }
}
