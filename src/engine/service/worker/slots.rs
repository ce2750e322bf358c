//! Which slot a request gets (the longest shared prefix, else the one used least
//! recently), and the host prompt cache that slots are saved to and refilled from.

use super::{Active, Worker};
use crate::engine::host_cache::shared_prefix;
use crate::engine::service::{Queued, Request, RequestError, RequestEvent};
use crate::engine::StopStrings;

impl Worker {
    /// Gives queued requests idle slots, first come first served (a request for a
    /// particular slot waits for it without holding back the others).
    pub(super) fn assign(&mut self) {
        let mut i = 0;
        while i < self.queue.len() {
            let Some(slot) = self.pick_slot(&self.queue[i].req) else {
                if self.queue[i].req.slot.is_some() {
                    i += 1;
                    continue;
                }
                break;
            };
            let q = self.queue.remove(i).unwrap();
            self.start(slot, *q);
        }
    }

    pub(super) fn pick_slot(&self, req: &Request) -> Option<u32> {
        let idle = |i: usize| self.is_idle(i);
        if let Some(s) = req.slot {
            return (s as usize)
                .lt(&self.slots.len())
                .then_some(s)
                .filter(|&s| idle(s as usize));
        }
        let lcp = |i: usize| self.shared_prefix(i as u32, &req.prompt);
        (0..self.slots.len())
            .filter(|&i| idle(i))
            .max_by_key(|&i| {
                let shared = if req.cache_prompt { lcp(i) } else { 0 };
                // Longest shared prefix first, then least recently used.
                (shared, u64::MAX - self.slots[i].last_used)
            })
            .map(|i| i as u32)
    }

    pub(super) fn start(&mut self, slot: u32, q: Queued) {
        let Queued {
            key,
            mut req,
            mut sink,
        } = q;
        if req.slot.is_some_and(|s| s as usize >= self.slots.len()) {
            sink(RequestEvent::Failed(RequestError::Invalid(format!(
                "no slot {} (the server has {} slots)",
                req.slot.unwrap(),
                self.slots.len()
            ))));
            return;
        }
        let n_ctx = self.engine.n_ctx_seq() as usize;
        let n_prompt = req.prompt.len();
        // A model whose positions cannot move (M-RoPE) has no context shift, as
        // llama-server turns it off for such a model: the reply is capped below.
        if !self.engine.context().can_shift() {
            req.params.shift.context_shift = false;
        }
        let shift = req.params.shift;
        if n_prompt >= n_ctx && shift.ga_n == 1 {
            sink(RequestEvent::Failed(RequestError::ExceedsContext {
                n_prompt,
                n_ctx: n_ctx as u32,
            }));
            return;
        }
        // Without a context shift a reply ends where the slot's context does, as
        // llama-server ends it: one cell short of full.
        let mut limit_is_context = false;
        if !shift.context_shift && shift.ga_n == 1 {
            let room = (n_ctx - n_prompt) as i32;
            let n = req.params.n_predict;
            if n < 0 || n >= room {
                req.params.n_predict = room;
                limit_is_context = true;
            }
        }
        // A cached state keeps no record of the LoRA scales it was decoded with, so a
        // server with adapters only reuses what a slot itself holds (checked by scales).
        if req.cache_prompt && req.slot.is_none() && self.engine.lora_adapters().is_empty() {
            self.refill_from_cache(slot, &req.prompt);
        }
        let started = self.engine.start_request_media(
            slot,
            req.params,
            &req.prompt,
            &req.images,
            req.cache_prompt,
        );
        let n_cached = match started {
            Ok(n) => n,
            Err(e) => {
                sink(RequestEvent::Failed(RequestError::from_engine(&e)));
                return;
            }
        };
        self.uses += 1;
        let s = &mut self.slots[slot as usize];
        s.last_used = self.uses;
        s.last_key = Some(key);
        let dropped = !sink(RequestEvent::Started {
            slot,
            n_prompt,
            n_cached,
        });
        if dropped {
            let _ = self.engine.cancel(slot);
        }
        s.active = Some(Active {
            key,
            sink,
            stop: StopStrings::new(req.stop),
            indent: crate::engine::IndentLimit::new(req.n_indent as usize),
            n_prompt,
            n_cached,
            n_generated: 0,
            shifted: false,
            limit_is_context,
            dropped,
        });
        self.shared.stats.lock().unwrap().requests_total += 1;
        if self.opts.cache_idle_slots {
            self.save_idle_slots();
        }
    }

    /// Tokens slot `slot` already holds at the start of `prompt`.
    pub(super) fn shared_prefix(&self, slot: u32, prompt: &[u32]) -> usize {
        (self.engine.session(slot)).map_or(0, |s| shared_prefix(s.history(), prompt))
    }

    pub(super) fn is_idle(&self, i: usize) -> bool {
        self.slots[i].active.is_none() && !self.pending.iter().any(|p| p.0 as usize == i)
    }

    /// Saves slot `i`'s tokens and cells to the host cache unless it holds them already;
    /// true when they were added.
    #[cfg(not(target_arch = "wasm32"))]
    pub(super) fn save_to_cache(&mut self, i: u32) -> bool {
        let Some(cache) = self.cache.as_mut() else {
            return false;
        };
        let covered = (self.engine.session(i)).map_or(true, |s| {
            s.history().is_empty() || cache.covers(s.history())
        });
        if covered {
            return false;
        }
        match self.engine.snapshot_session(i) {
            Ok(Some(snap)) => cache.insert(snap),
            Ok(None) => false,
            Err(e) => {
                log::warn!("slot {i} was not saved to the prompt cache: {e}");
                false
            }
        }
    }

    /// A slot about to take `prompt` while sharing little of it (under a tenth, as
    /// llama-server's slot similarity) keeps its own prompt in the host cache and takes
    /// the cached prompt sharing the most, where one shares more than it does.
    #[cfg(not(target_arch = "wasm32"))]
    pub(super) fn refill_from_cache(&mut self, slot: u32, prompt: &[u32]) {
        if self.cache.is_none() {
            return;
        }
        let shared = self.shared_prefix(slot, prompt);
        if shared * 10 >= prompt.len() {
            return;
        }
        log::debug!(
            "updating prompt cache: slot {slot} shares {shared} of the prompt's {} tokens",
            prompt.len()
        );
        self.save_to_cache(slot);
        let cache = self.cache.as_mut().expect("checked above");
        let Some((snap, n)) = cache.best(prompt, shared) else {
            return;
        };
        match self.engine.restore_snapshot(slot, snap) {
            Ok(_) => log::debug!("slot {slot}: {n} prompt tokens restored from the prompt cache"),
            Err(e) => log::warn!("slot {slot}: the prompt cache's entry was not restored: {e}"),
        }
    }

    /// Saves every idle slot to the host cache; with a unified cache, clears it too.
    #[cfg(not(target_arch = "wasm32"))]
    pub(super) fn save_idle_slots(&mut self) {
        if self.cache.is_none() {
            return;
        }
        for i in 0..self.slots.len() {
            if !self.is_idle(i) {
                continue;
            }
            let id = i as u32;
            if self.save_to_cache(id) {
                log::debug!("slot {i}: saved to the prompt cache (__TEST_TAG_CACHE_IDLE_SLOT__)");
            }
            let holds = self
                .engine
                .session(id)
                .is_ok_and(|s| !s.history().is_empty());
            if self.opts.kv_unified && holds {
                if let Err(e) = self.engine.erase_session(id) {
                    log::warn!("slot {i} was not cleared: {e}");
                }
            }
        }
    }

    #[cfg(target_arch = "wasm32")]
    pub(super) fn refill_from_cache(&mut self, _slot: u32, _prompt: &[u32]) {}

    #[cfg(target_arch = "wasm32")]
    pub(super) fn save_idle_slots(&mut self) {}
}
