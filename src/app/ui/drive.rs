//! The headless drive (`wgllm app -p TEXT --screenshot FILE`, a page's `?prompt=`): the
//! message sent, the reply waited for, the window saved or the report published.

use super::{App, Drive, Role};
use crate::app::DriveReport;

impl App {
    /// The drive failed: the window is still saved (it shows the error), the exit is 1.
    pub(super) fn fail_drive(&mut self, msg: String) {
        if self.drive == Some(Drive::Shooting) {
            return;
        }
        self.outcome.lock().unwrap().error.get_or_insert(msg);
        self.drive = Some(Drive::Settle(0));
    }

    /// What the drive saw, for the caller to print.
    pub(super) fn report(&self) -> DriveReport {
        let reply = self
            .chats
            .first()
            .and_then(|c| c.messages.iter().rev().find(|m| m.0 == Role::Assistant))
            .map(|m| m.1.clone())
            .unwrap_or_default();
        let stores = self.cache.as_ref().map_or(Vec::new(), |m| {
            m.stores
                .iter()
                .map(|s| (s.name, s.used, s.cells.len(), s.moved()))
                .collect()
        });
        let devices = self.cache.as_ref().map_or(Vec::new(), |m| {
            (m.devices.iter().enumerate())
                .map(|(d, p)| (p.clone(), m.device_cache_bytes(d)))
                .collect()
        });
        let (prompt_tokens, prompt_tps, eval_tokens, eval_tps) = self.last_speed;
        DriveReport {
            reply,
            stores,
            devices,
            prompt_tokens,
            prompt_tps,
            eval_tokens,
            eval_tps,
        }
    }

    /// The headless drive: after the reply, a few frames for layout, then the shot.
    pub(super) fn drive(&mut self, ctx: &egui::Context) {
        let Some(d) = &self.drive else {
            return;
        };
        let waiting = matches!(d, Drive::WaitLoad | Drive::WaitReply);
        if waiting && self.started.elapsed() > self.opts.timeout {
            self.fail_drive(format!(
                "no reply within {} s; the window is saved as it is",
                self.opts.timeout.as_secs()
            ));
        }
        match self.drive {
            Some(Drive::Settle(n)) if n < 3 => {
                self.drive = Some(Drive::Settle(n + 1));
                ctx.request_repaint();
            }
            Some(Drive::Settle(_)) => {
                self.drive = Some(Drive::Shooting);
                self.finish_drive(ctx);
            }
            Some(Drive::WaitLoad) | Some(Drive::WaitReply) => {
                // Keep checking the timeout while the engine works.
                ctx.request_repaint_after(self.frames.poll());
            }
            _ => {}
        }
    }

    /// Natively: the screenshot, then the window closes. On a page: the report in
    /// `#wgllm-result` (the page stays; its driver takes the screenshot).
    #[cfg(not(target_arch = "wasm32"))]
    pub(super) fn finish_drive(&mut self, ctx: &egui::Context) {
        let Some(path) = self.opts.screenshot.clone() else {
            return;
        };
        let out = self.outcome.clone();
        out.lock().unwrap().report = Some(self.report());
        let c2 = ctx.clone();
        ctx.request_screenshot(move |image| {
            match crate::app::shot::save_png(&path, &image) {
                Ok(()) => log::info!("app: saved the window to {}", path.display()),
                Err(e) => {
                    out.lock().unwrap().error.get_or_insert(e);
                }
            }
            c2.send_viewport_cmd(egui::ViewportCommand::Close);
        });
    }

    #[cfg(target_arch = "wasm32")]
    pub(super) fn finish_drive(&mut self, _ctx: &egui::Context) {
        let report = self.report();
        let mut out = self.outcome.lock().unwrap();
        crate::app::browser::publish(&report, out.error.as_deref());
        out.report = Some(report);
    }
}
