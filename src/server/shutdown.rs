//! Stopping when told: the first SIGINT or SIGTERM starts an orderly shutdown (no new
//! connections or requests, in-flight ones given the grace period, then ended with an
//! error, the engine and its device dropped, exit 0); a second one exits at once; and a
//! watchdog exits the process if the orderly shutdown itself gets stuck (a handler
//! that does not yield, a device that does not answer).
//!
//! Signals are read on a thread of their own rather than by the async runtime, so they
//! are seen however busy the runtime's threads are.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How long past its grace period an orderly shutdown may take before the watchdog
/// exits the process: for the engine's current step and the last replies' bytes.
pub const WATCHDOG_MARGIN: Duration = Duration::from_secs(15);

/// The exit status when a second signal (or the watchdog) cuts the shutdown short.
pub const EXIT_CUT_SHORT: i32 = 130;

/// Signals received so far. Dropped (the server has returned), it stops listening and
/// disarms the watchdog, so a program that ran the server goes on as it was.
pub struct Signals {
    rx: watch::Receiver<u32>,
    done: Arc<AtomicBool>,
    #[cfg(unix)]
    handle: signal_hook::iterator::Handle,
}

impl Drop for Signals {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        #[cfg(unix)]
        self.handle.close();
    }
}

impl Signals {
    /// Starts listening. `grace` is the orderly shutdown's grace period (the watchdog
    /// fires [`WATCHDOG_MARGIN`] after it).
    pub fn listen(grace: Duration) -> std::io::Result<Signals> {
        let (tx, rx) = watch::channel(0u32);
        let done = Arc::new(AtomicBool::new(false));
        let listener = Listener {
            tx,
            grace,
            done: done.clone(),
        };
        #[cfg(unix)]
        let handle = start(listener)?;
        #[cfg(not(unix))]
        start(listener)?;
        Ok(Signals {
            rx,
            done,
            #[cfg(unix)]
            handle,
        })
    }

    /// Resolves once the first signal has come.
    pub async fn first(&mut self) {
        // The sender lives as long as the listening thread, which never ends.
        let _ = self.rx.wait_for(|&n| n > 0).await;
    }
}

/// What the listening thread holds.
struct Listener {
    tx: watch::Sender<u32>,
    grace: Duration,
    /// Set once the server has returned: nothing is done any more.
    done: Arc<AtomicBool>,
}

impl Listener {
    /// What the listener does with the `n`th signal (`n` from 1).
    fn on_signal(&self, n: u32) {
        if self.done.load(Ordering::Relaxed) {
            return;
        }
        if n > 1 {
            log::warn!("a second signal: exiting at once");
            std::process::exit(EXIT_CUT_SHORT);
        }
        let _ = self.tx.send(n);
        let limit = self.grace.saturating_add(WATCHDOG_MARGIN);
        let done = self.done.clone();
        let watchdog = std::thread::Builder::new()
            .name("wgllm-shutdown-watchdog".into())
            .spawn(move || {
                std::thread::sleep(limit);
                if done.load(Ordering::Relaxed) {
                    return;
                }
                log::warn!(
                    "the server did not stop within {} s of the signal; exiting now",
                    limit.as_secs()
                );
                std::process::exit(EXIT_CUT_SHORT);
            });
        if let Err(e) = watchdog {
            log::warn!("no shutdown watchdog (a stuck shutdown needs a second signal): {e}");
        }
    }
}

#[cfg(unix)]
fn start(l: Listener) -> std::io::Result<signal_hook::iterator::Handle> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])?;
    let handle = signals.handle();
    std::thread::Builder::new()
        .name("wgllm-signals".into())
        .spawn(move || {
            let mut n = 0;
            for _ in signals.forever() {
                n += 1;
                l.on_signal(n);
            }
        })?;
    Ok(handle)
}

/// Elsewhere only Ctrl-C is there to hear, through the runtime.
#[cfg(not(unix))]
fn start(l: Listener) -> std::io::Result<()> {
    tokio::spawn(async move {
        let mut n = 0;
        while tokio::signal::ctrl_c().await.is_ok() && !l.done.load(Ordering::Relaxed) {
            n += 1;
            l.on_signal(n);
        }
    });
    Ok(())
}
