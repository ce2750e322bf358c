//! Faults injected for testing what a server does when the GPU fails in the middle of
//! work (`WGLLM_FAULT`, read in release builds too, or [`GpuOptions::fault`]):
//! `oom@N` makes the Nth buffer allocation after the model is loaded fail as out of
//! memory; `device-lost@N` makes the Nth queue submission after it report the device
//! lost, as a driver reset (Vulkan's `VK_ERROR_DEVICE_LOST`, a Windows TDR) would. A fault
//! fires once per process, so a server that recovers is not failed again.
//! `wrong-int-dot` makes every integer-dot matmul compute a wrong product (its rows
//! taken as a block shorter than they are), from the start and for good: a driver's miscompiled kernel,
//! which the tuner's check on the device must catch before the kernel is used.
//! `wrong-row` makes every fast matmul (GPU-shaped, integer-dot, cooperative-matrix)
//! leave the last row of each weight chunk unwritten, and `wrong-tile-edge` makes the
//! tiled prompt matmuls leave the tokens of a partial last tile unwritten: the smallest
//! miscompiles, which the kernel audit at load (`crate::tune::audit`) must catch;
//! `wrong-head` makes the GPU flash attention kernels (f32 tiles and cooperative
//! matrices) leave the last head's output unwritten, which its attention check must.
//!
//! [`GpuOptions::fault`]: super::GpuOptions::fault

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Which fault, and at which allocation or submission (counted from 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    OutOfMemory(u64),
    DeviceLost(u64),
    WrongIntDot,
    WrongRow,
    WrongTileEdge,
    WrongHead,
}

impl Fault {
    /// `oom@N`, `device-lost@N`, `wrong-int-dot`, `wrong-row`, `wrong-tile-edge` or
    /// `wrong-head`.
    pub fn parse(s: &str) -> Result<Fault, String> {
        let bad = || {
            format!(
                "WGLLM_FAULT={s:?}: expected oom@N or device-lost@N (N counts from 1), or wrong-int-dot, wrong-row, wrong-tile-edge or wrong-head"
            )
        };
        match s.trim() {
            "wrong-int-dot" => return Ok(Fault::WrongIntDot),
            "wrong-row" => return Ok(Fault::WrongRow),
            "wrong-tile-edge" => return Ok(Fault::WrongTileEdge),
            "wrong-head" => return Ok(Fault::WrongHead),
            _ => {}
        }
        let (kind, n) = s.trim().split_once('@').ok_or_else(bad)?;
        let n: u64 = n.parse().map_err(|_| bad())?;
        if n == 0 {
            return Err(bad());
        }
        match kind {
            "oom" => Ok(Fault::OutOfMemory(n)),
            "device-lost" => Ok(Fault::DeviceLost(n)),
            _ => Err(bad()),
        }
    }

    /// The fault `WGLLM_FAULT` names, if it is set.
    pub fn from_env() -> Result<Option<Fault>, String> {
        match std::env::var("WGLLM_FAULT") {
            Ok(s) if !s.trim().is_empty() => Fault::parse(&s).map(Some),
            _ => Ok(None),
        }
    }
}

/// Whether a fault already fired in this process.
static FIRED: AtomicBool = AtomicBool::new(false);

/// A device's fault, counting allocations and submissions once armed.
#[derive(Debug, Default)]
pub(super) struct FaultSwitch {
    fault: Option<Fault>,
    armed: AtomicBool,
    allocations: AtomicU64,
    submissions: AtomicU64,
}

impl FaultSwitch {
    pub(super) fn new(fault: Option<Fault>) -> Self {
        FaultSwitch {
            fault,
            ..Default::default()
        }
    }

    /// Starts counting (the model is loaded).
    pub(super) fn arm(&self) {
        if self.fault.is_some() {
            self.armed.store(true, Ordering::Relaxed);
        }
    }

    fn fires(&self, n: u64, count: &AtomicU64) -> bool {
        if !self.armed.load(Ordering::Relaxed) {
            return false;
        }
        count.fetch_add(1, Ordering::Relaxed) + 1 == n && !FIRED.swap(true, Ordering::Relaxed)
    }

    /// Allocations counted since armed (only with an out-of-memory fault set).
    pub(super) fn allocations(&self) -> u64 {
        self.allocations.load(Ordering::Relaxed)
    }

    /// Whether this allocation is to fail.
    pub(super) fn allocation_fails(&self) -> bool {
        match self.fault {
            Some(Fault::OutOfMemory(n)) => self.fires(n, &self.allocations),
            _ => false,
        }
    }

    /// Whether integer-dot matmuls are to compute wrong products.
    pub(super) fn wrong_int_dot(&self) -> bool {
        self.fault == Some(Fault::WrongIntDot)
    }

    /// Whether fast matmuls are to leave a row unwritten.
    pub(super) fn wrong_row(&self) -> bool {
        self.fault == Some(Fault::WrongRow)
    }

    /// Whether tiled matmuls are to leave a partial tile's tokens unwritten.
    pub(super) fn wrong_tile_edge(&self) -> bool {
        self.fault == Some(Fault::WrongTileEdge)
    }

    /// Whether the GPU flash attention kernels are to leave a head unwritten.
    pub(super) fn wrong_head(&self) -> bool {
        self.fault == Some(Fault::WrongHead)
    }

    /// Whether this submission is to find the device lost.
    pub(super) fn submission_loses_device(&self) -> bool {
        match self.fault {
            Some(Fault::DeviceLost(n)) => self.fires(n, &self.submissions),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_refuses_with_the_form() {
        assert_eq!(Fault::parse("oom@3"), Ok(Fault::OutOfMemory(3)));
        assert_eq!(Fault::parse("device-lost@1"), Ok(Fault::DeviceLost(1)));
        assert_eq!(Fault::parse("wrong-int-dot"), Ok(Fault::WrongIntDot));
        assert_eq!(Fault::parse("wrong-row"), Ok(Fault::WrongRow));
        assert_eq!(Fault::parse("wrong-tile-edge"), Ok(Fault::WrongTileEdge));
        for bad in ["oom", "oom@0", "oom@x", "lost@2", "@2"] {
            let e = Fault::parse(bad).unwrap_err();
            assert!(e.contains("oom@N or device-lost@N"), "{e}");
        }
    }

    #[test]
    fn counts_only_once_armed() {
        let s = FaultSwitch::new(Some(Fault::DeviceLost(2)));
        assert!(!s.submission_loses_device());
        assert!(!s.submission_loses_device());
        s.arm();
        assert!(!s.allocation_fails());
        assert!(!s.submission_loses_device());
        // The second submission after arming (unless another test's switch fired the
        // process's one fault first).
        let fired = s.submission_loses_device();
        assert!(fired || FIRED.load(Ordering::Relaxed));
        assert!(!s.submission_loses_device());
    }
}
