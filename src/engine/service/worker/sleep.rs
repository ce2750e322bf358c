//! The service asleep: after [`ServiceOptions::sleep_idle`] without use the worker drops
//! its engine (the device with the weights and KV cache) and its host prompt cache, and
//! waits for a command that needs the model; that command loads it again with
//! [`ServiceOptions::reload`], as at start, and is then served as if nothing happened.
//! What survives the sleep is what the model's load does not give: the LoRA scales as
//! last set, the watchers, the counters. Slots come back empty: a conversation that
//! continues after a sleep has its prompt decoded again.
//!
//! [`ServiceOptions::sleep_idle`]: super::ServiceOptions::sleep_idle
//! [`ServiceOptions::reload`]: super::ServiceOptions::reload

use super::{open_slots, Cmd, RequestError, Worker};
use crate::engine::{Engine, HostCache};
use std::sync::atomic::Ordering;
use tokio::sync::mpsc as amp;
use web_time::Instant;

impl Worker {
    /// Drops the engine and waits; returns the awake worker once a command needed the
    /// model, or `None` if told to stop (answered) or every handle is gone.
    pub(super) async fn sleep(self, rx: &mut amp::UnboundedReceiver<Cmd>) -> Option<Worker> {
        let Worker {
            engine,
            opts,
            shared,
            mut watchers,
            uses,
            ..
        } = self;
        let scales = engine.lora_scales().to_vec();
        let freed = engine.model.gpu.live_buffer_bytes();
        let idle = opts.sleep_idle.unwrap_or_default();
        drop(engine);
        super::super::release_freed_heap();
        shared.sleeping.store(true, Ordering::Relaxed);
        log::info!(
            "idle for {} s: sleeping; the model's {} MiB of GPU buffers and the prompt cache are freed until a request needs it",
            idle.as_secs_f64(),
            freed >> 20
        );
        loop {
            let c = rx.recv().await?;
            match c {
                Cmd::Shutdown(done) => {
                    log::info!("the engine has stopped (it was asleep)");
                    let _ = done.send(());
                    return None;
                }
                // Nothing runs, so there is nothing to cancel; the timer's ticks find us
                // asleep already.
                Cmd::Cancel(_) | Cmd::Sleep => {}
                // Watchers hear from the next step on.
                Cmd::Watch(w) => watchers.push(w),
                c => {
                    let t0 = Instant::now();
                    let loaded = (opts.reload.as_ref())
                        .ok_or_else(|| "no way to load the model again was given".to_string())
                        .and_then(|r| (r.0)())
                        .and_then(|mut e: Engine| {
                            open_slots(&mut e, shared.info.n_slots).map_err(|e| e.to_string())?;
                            e.set_lora_scales(&scales).map_err(|e| e.to_string())?;
                            Ok(e)
                        });
                    let engine = match loaded {
                        Ok(e) => e,
                        Err(e) => {
                            log::error!("waking up: loading the model again failed ({e}); the next request tries again");
                            Worker::refuse(
                                c,
                                &RequestError::Server(format!(
                                    "the server was asleep and loading the model again failed ({e}); retry the request"
                                )),
                            );
                            continue;
                        }
                    };
                    engine.model.gpu.arm_faults();
                    let mut w = Worker::new(engine, shared.clone());
                    w.cache = opts.cache_ram.map(HostCache::new);
                    w.opts = opts;
                    w.watchers = watchers;
                    w.uses = uses;
                    shared.sleeping.store(false, Ordering::Relaxed);
                    log::info!(
                        "awake: the model was loaded again in {:.0} ms",
                        t0.elapsed().as_secs_f64() * 1e3
                    );
                    w.handle(c);
                    return Some(w);
                }
            }
        }
    }
}
