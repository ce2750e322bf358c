//! ggml tensor element types and their block layouts, as GGUF stores them.

use std::fmt;

/// A ggml element type. Only the ids are fixed by the format; which ones wgllm can
/// compute with is the weight-format registry's business (`crate::quant::format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    Iq4Nl,
    Iq4Xs,
    Bf16,
    Mxfp4,
    /// A type id this build does not know; kept so errors can name it.
    Other(u32),
}

impl GgmlType {
    pub fn from_id(id: u32) -> Self {
        match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            9 => Self::Q8_1,
            10 => Self::Q2K,
            11 => Self::Q3K,
            12 => Self::Q4K,
            13 => Self::Q5K,
            14 => Self::Q6K,
            15 => Self::Q8K,
            20 => Self::Iq4Nl,
            23 => Self::Iq4Xs,
            30 => Self::Bf16,
            39 => Self::Mxfp4,
            other => Self::Other(other),
        }
    }

    /// (weights per block, bytes per block), or None for an unknown id.
    pub fn block_layout(self) -> Option<(usize, usize)> {
        Some(match self {
            Self::F32 => (1, 4),
            Self::F16 | Self::Bf16 => (1, 2),
            Self::Q4_0 => (32, 18),
            Self::Q4_1 => (32, 20),
            Self::Q5_0 => (32, 22),
            Self::Q5_1 => (32, 24),
            Self::Q8_0 => (32, 34),
            Self::Q8_1 => (32, 36),
            Self::Q2K => (256, 84),
            Self::Q3K => (256, 110),
            Self::Q4K => (256, 144),
            Self::Q5K => (256, 176),
            Self::Q6K => (256, 210),
            Self::Q8K => (256, 292),
            Self::Iq4Nl => (32, 18),
            Self::Iq4Xs => (256, 136),
            Self::Mxfp4 => (32, 17),
            Self::Other(_) => return None,
        })
    }

    pub fn block_size(self) -> usize {
        self.block_layout().map_or(1, |l| l.0)
    }

    /// Bytes of a row of `n` elements; None when `n` is not a whole number of blocks (or
    /// the count overflows, as a damaged file's may).
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let (bs, bb) = self.block_layout()?;
        if !n.is_multiple_of(bs as u64) {
            return None;
        }
        (n / bs as u64).checked_mul(bb as u64)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q8_1 => "Q8_1",
            Self::Q2K => "Q2_K",
            Self::Q3K => "Q3_K",
            Self::Q4K => "Q4_K",
            Self::Q5K => "Q5_K",
            Self::Q6K => "Q6_K",
            Self::Q8K => "Q8_K",
            Self::Iq4Nl => "IQ4_NL",
            Self::Iq4Xs => "IQ4_XS",
            Self::Bf16 => "BF16",
            Self::Mxfp4 => "MXFP4",
            Self::Other(id) => return write!(f, "type#{id}"),
        };
        f.write_str(s)
    }
}
