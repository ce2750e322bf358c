//! Starting the app again: on another adapter (a window's device cannot change), and
//! after the GPU was lost, with the model and each chat's conversation carried over.

use super::App;
#[cfg(not(target_arch = "wasm32"))]
use super::{Load, Role};
#[cfg(not(target_arch = "wasm32"))]
use crate::app::worker::Cmd;
#[cfg(not(target_arch = "wasm32"))]
use crate::gpu::{list_adapters, AdapterSummary, Backend};

impl App {
    /// Starts this app again on another adapter (a window's device cannot change) and
    /// closes this one.
    #[cfg(not(target_arch = "wasm32"))]
    pub(super) fn restart_on(&mut self, ctx: &egui::Context, a: &AdapterSummary) {
        let backend = a.backend.to_lowercase();
        let index = list_adapters(backend.parse().unwrap_or(Backend::Auto))
            .iter()
            .position(|b| b.name == a.name)
            .unwrap_or(0);
        let exe = match std::env::current_exe() {
            Ok(e) => e,
            Err(e) => {
                self.error = Some(format!("cannot restart: {e}"));
                return;
            }
        };
        let mut cmd = std::process::Command::new(exe);
        cmd.args(["app", "--backend", &backend, "--device", &index.to_string()]);
        cmd.args(["-c", &self.settings.n_ctx.to_string()]);
        cmd.args(["-np", &self.settings.n_parallel.to_string()]);
        if let Load::Loaded(m) = &self.load {
            cmd.arg("-m").arg(&m.path);
        }
        if let Some(mm) = &self.opts.mmproj {
            cmd.arg("--mmproj").arg(mm);
        }
        match cmd.spawn() {
            Ok(_) => ctx.send_viewport_cmd(egui::ViewportCommand::Close),
            Err(e) => self.error = Some(format!("cannot restart on {}: {e}", a.name)),
        }
    }

    /// The GPU was lost, and the window's device with it (a window's device cannot be
    /// replaced): this app starts again, on the same adapter, with the same flags, the
    /// model and each chat's conversation (`--restore-chats`), and closes. A drive's
    /// caller waits for the new app ([`crate::app::run`]).
    #[cfg(not(target_arch = "wasm32"))]
    pub(super) fn after_loss(
        &mut self,
        ctx: &egui::Context,
        reason: &str,
        chats: Vec<Vec<crate::tokenizer::ChatMessage>>,
    ) {
        log::warn!(
            "app: the GPU was lost ({reason}); starting the app again with the model and the chats"
        );
        let file = std::env::temp_dir().join(format!("wgllm-chats-{}.json", std::process::id()));
        let saved = crate::app::restore::save(&file, &chats)
            .map_err(|e| format!("saving the chats to {}: {e}", file.display()));
        let exe = std::env::current_exe().map_err(|e| e.to_string());
        let child = saved.and(exe).and_then(|exe| {
            let mut cmd = std::process::Command::new(exe);
            cmd.args(crate::app::restore::args_again(
                std::env::args_os().skip(1),
                &file,
            ));
            // The fault a test injected stays with the process it was injected into.
            cmd.env_remove("WGLLM_FAULT");
            cmd.spawn().map_err(|e| e.to_string())
        });
        match child {
            Ok(child) => {
                if self.drive.is_some() {
                    self.outcome.lock().unwrap().restarted = Some(child);
                    self.drive = None;
                }
                ctx.send_viewport_cmd(egui::ViewportCommand::Close);
            }
            Err(e) => {
                let msg = format!("the GPU was lost ({reason}), and the app could not start again: {e}; start it again by hand");
                self.error = Some(msg.clone());
                if self.drive.is_some() {
                    self.fail_drive(msg);
                }
            }
        }
    }

    /// A page cannot start itself again: it says to reload.
    #[cfg(target_arch = "wasm32")]
    pub(super) fn after_loss(
        &mut self,
        _ctx: &egui::Context,
        reason: &str,
        _chats: Vec<Vec<crate::tokenizer::ChatMessage>>,
    ) {
        let msg = format!("the GPU was lost ({reason}): reload the page");
        self.error = Some(msg.clone());
        if self.drive.is_some() {
            self.fail_drive(msg);
        }
    }

    /// The conversations an app that lost its GPU carried over (`--restore-chats`), into
    /// the chats just opened: shown, and sent to the worker, which decodes each again at
    /// its chat's next message. The file is removed once read.
    #[cfg(not(target_arch = "wasm32"))]
    pub(super) fn restore_chats(&mut self) {
        let Some(file) = self.opts.restore_chats.take() else {
            return;
        };
        let chats = match crate::app::restore::load(&file) {
            Ok(c) => c,
            Err(e) => {
                self.error = Some(format!(
                    "the chats of the app before could not be read from {}: {e}",
                    file.display()
                ));
                return;
            }
        };
        let _ = std::fs::remove_file(&file);
        for (c, messages) in self.chats.iter_mut().zip(&chats) {
            c.messages = messages
                .iter()
                .map(|m| {
                    let role = if m.role == "assistant" {
                        Role::Assistant
                    } else {
                        Role::User
                    };
                    (role, m.content.clone())
                })
                .collect();
        }
        self.tx.send(Cmd::Restore(chats));
    }
}
