//! No fast kernel runs on a device before it matched the plain one there. The kernels the
//! tuner may choose (other tiles, the GPU-shaped kernels, the integer-dot matmuls) are
//! checked by the op tests on the software devices CI has, but a real GPU's compiler and
//! hardware paths (packed integer dot products, subgroups) are not those; drivers differ.
//! So every candidate the tuner times is first run on random inputs through the model's
//! own layer and compared with the portable kernels' output on the same device (the
//! CPU-shaped float matmuls, the ones the op tests pin most tightly); one that differs by
//! more than its family's bound is dropped, logged, and recorded in the tuning cache.

use serde::{Deserialize, Serialize};

/// Normalized squared error a float candidate may show against the portable kernels:
/// the same products summed in another order, or through f16 operands (the
/// cooperative-matrix kernel: ~1e-6 from rounding weights and activations to 11 bits),
/// differ by far less; a kernel that loses one row in 1000 differs by more.
pub const FLOAT_BOUND: f64 = 1e-4;

/// The same for the integer-dot kernels, whose activations are rounded to 8 bits: their
/// own error on a layer is about ten times below this (docs/cli.md has the figures), while a
/// kernel that misplaces blocks or leaves rows out is far above it.
pub const INT_DOT_BOUND: f64 = 1e-3;

/// One candidate's check on one device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelCheck {
    /// The candidate as the tuner names it (`decode rows 8`, `prompt int-dot`, ...), with
    /// its kernel shape (`gpu decode rows 8`).
    pub name: String,
    /// Largest normalized squared error over the layer's outputs (Q/K/V, output, FFN);
    /// infinite where an output was not a number (JSON writes it as null).
    #[serde(deserialize_with = "null_is_infinite")]
    pub nmse: f64,
    /// The bound of its family ([`FLOAT_BOUND`] or [`INT_DOT_BOUND`]).
    pub bound: f64,
}

impl KernelCheck {
    /// Candidate `name`'s check with error `nmse`, against its family's bound.
    pub fn new(name: String, nmse: f64) -> KernelCheck {
        let bound = if name.ends_with(INT_DOT) {
            INT_DOT_BOUND
        } else {
            FLOAT_BOUND
        };
        KernelCheck { name, nmse, bound }
    }

    /// Within its bound (an error that is not a number fails).
    pub fn passed(&self) -> bool {
        self.nmse <= self.bound
    }

    /// Whether the candidate is an integer-dot one.
    pub fn is_int_dot(&self) -> bool {
        self.name.ends_with(INT_DOT)
    }

    /// Whether the candidate is the cooperative-matrix one.
    pub fn is_coop(&self) -> bool {
        self.name.ends_with(COOP)
    }
}

/// An error written as null (infinite: JSON has no infinity) read back as infinite.
fn null_is_infinite<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::INFINITY))
}

/// What an integer-dot candidate's name ends with.
pub const INT_DOT: &str = "int-dot";

/// What a cooperative-matrix candidate's name ends with.
pub const COOP: &str = "coop-matrix";

/// The largest normalized squared error of `got` against `want`, output by output.
pub fn worst_nmse(want: &[Vec<f32>], got: &[Vec<f32>]) -> f64 {
    want.iter()
        .zip(got)
        .map(|(w, g)| {
            let e = crate::ops::nmse(w, g);
            if e.is_nan() {
                f64::INFINITY
            } else {
                e
            }
        })
        .fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_or_broken_output_fails() {
        let want = vec![vec![1.0f32, -2.0, 3.0], vec![0.5, 0.25]];
        let check = |got: &[Vec<f32>]| KernelCheck {
            name: "decode int-dot".into(),
            nmse: worst_nmse(&want, got),
            bound: INT_DOT_BOUND,
        };
        assert!(check(&want).passed());
        assert!(check(&want).is_int_dot());
        let close = vec![vec![1.0f32, -2.0, 3.001], vec![0.5, 0.25]];
        assert!(check(&close).passed());
        let wrong = vec![vec![1.0f32, -2.0, 3.0], vec![0.5, 0.0]];
        assert!(!check(&wrong).passed());
        let nan = vec![vec![1.0f32, f32::NAN, 3.0], vec![0.5, 0.25]];
        assert!(!check(&nan).passed());
        // Through the cache file and back, still failed.
        let json = serde_json::to_string(&check(&nan)).unwrap();
        let back: KernelCheck = serde_json::from_str(&json).unwrap();
        assert!(!back.passed() && back.nmse.is_infinite(), "{json}");
    }
}
