//! Stopping when told: the first SIGINT or SIGTERM starts an orderly shutdown (no new
//! connections or requests, in-flight ones given the grace period, then ended with an
//! error, the engine and its device dropped, exit 0); a second one exits at once; and a
//! watchdog exits the process if the orderly shutdown itself gets stuck (a handler
//! that does not yield, a device that does not answer).
//!
//! Signals are read on a thread of their own rather than by the async runtime, so they
//! are seen however busy the runtime's threads are.

use std::time::Duration;
use tokio::sync::watch;

/// How long past its grace period an orderly shutdown may take before the watchdog
/// exits the process: for the engine's current step and the last replies' bytes.
pub const WATCHDOG_MARGIN: Duration = Duration::from_secs(15);

/// The exit status when a second signal (or the watchdog) cuts the shutdown short.
pub const EXIT_CUT_SHORT: i32 = 130;

/// Signals received so far.
pub struct Signals {
    rx: watch::Receiver<u32>,
}

impl Signals {
    /// Starts listening. `grace` is the orderly shutdown's grace period (the watchdog
    /// fires [`WATCHDOG_MARGIN`] after it).
    pub fn listen(grace: Duration) -> std::io::Result<Signals> {
        let (tx, rx) = watch::channel(0u32);
        start(tx, grace)?;
        Ok(Signals { rx })
    }

    /// Resolves once the first signal has come.
    pub async fn first(&mut self) {
        // The sender lives as long as the listening thread, which never ends.
        let _ = self.rx.wait_for(|&n| n > 0).await;
    }
}

/// What the listener does with the `n`th signal (`n` from 1).
fn on_signal(n: u32, tx: &watch::Sender<u32>, grace: Duration) {
    if n == 1 {
        let _ = tx.send(n);
        let limit = grace + WATCHDOG_MARGIN;
        let watchdog = std::thread::Builder::new()
            .name("wgllm-shutdown-watchdog".into())
            .spawn(move || {
                std::thread::sleep(limit);
                log::warn!(
                    "the server did not stop within {} s of the signal; exiting now",
                    limit.as_secs()
                );
                std::process::exit(EXIT_CUT_SHORT);
            });
        if let Err(e) = watchdog {
            log::warn!("no shutdown watchdog (a stuck shutdown needs a second signal): {e}");
        }
    } else {
        log::warn!("a second signal: exiting at once");
        std::process::exit(EXIT_CUT_SHORT);
    }
}

#[cfg(unix)]
fn start(tx: watch::Sender<u32>, grace: Duration) -> std::io::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])?;
    std::thread::Builder::new()
        .name("wgllm-signals".into())
        .spawn(move || {
            let mut n = 0;
            for _ in signals.forever() {
                n += 1;
                on_signal(n, &tx, grace);
            }
        })?;
    Ok(())
}

/// Elsewhere only Ctrl-C is there to hear, through the runtime.
#[cfg(not(unix))]
fn start(tx: watch::Sender<u32>, grace: Duration) -> std::io::Result<()> {
    tokio::spawn(async move {
        let mut n = 0;
        while tokio::signal::ctrl_c().await.is_ok() {
            n += 1;
            on_signal(n, &tx, grace);
        }
    });
    Ok(())
}
