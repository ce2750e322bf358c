//! The settings panel: context size and sequences (applied when a model loads), the
//! context policy (context shift, `--keep`, Self-Extend; applied to a chat when it is
//! reset) and sampling (applied to the next reply).

use crate::engine::{EngineOptions, SamplingPath, SessionParams, ShiftPolicy};
use crate::gpu::GpuOptions;
use crate::sample::SamplerParams;
use crate::tune::TuneOptions;

/// What the settings panel edits; the flags of `wgllm app` give the first values.
#[derive(Clone, Debug)]
pub struct AppSettings {
    /// Cache cells (`-c`): small values make a context shift happen in a short chat.
    pub n_ctx: u32,
    /// Chats served at once, each a sequence of the one cache (`-np`).
    pub n_parallel: u32,
    pub n_batch: u32,
    pub n_ubatch: u32,
    pub swa_full: bool,
    pub shift: ShiftPolicy,
    pub sampling: SamplerParams,
    /// Where tokens are drawn (`--sampling`, `sampling=` on a page; applied when a
    /// model loads).
    pub sampling_path: SamplingPath,
    /// Most tokens per reply (-1: until end of generation).
    pub n_predict: i32,
}

impl Default for AppSettings {
    fn default() -> Self {
        AppSettings {
            n_ctx: 1024,
            n_parallel: 2,
            n_batch: 512,
            n_ubatch: 512,
            swa_full: false,
            shift: ShiftPolicy::default(),
            sampling: SamplerParams::default(),
            sampling_path: SamplingPath::Auto,
            n_predict: 256,
        }
    }
}

impl AppSettings {
    pub fn engine_options(&self, gpu: &GpuOptions, tune: &TuneOptions) -> EngineOptions {
        EngineOptions {
            n_ctx: self.n_ctx,
            n_batch: self.n_batch,
            n_ubatch: self.n_ubatch,
            n_seq_max: self.n_parallel,
            swa_full: self.swa_full,
            // The rolling buffer keeps what a context shift brings back into the window.
            swa_keep: if self.shift.context_shift {
                (self.shift.keep.max(0) as u32).saturating_add(1)
            } else {
                0
            },
            gpu: gpu.clone(),
            tune: tune.clone(),
            sampling: self.sampling_path,
            ..EngineOptions::default()
        }
    }

    pub fn session_params(&self) -> SessionParams {
        SessionParams {
            sampling: self.sampling.clone(),
            n_predict: self.n_predict,
            shift: self.shift,
            prompt_cache: None,
            ..Default::default()
        }
    }

    /// Context controls (take effect on the next load).
    pub fn context_ui(&mut self, ui: &mut egui::Ui) {
        egui::Grid::new("context").num_columns(2).show(ui, |ui| {
            ui.label("context (-c)")
                .on_hover_text("cache cells; small sizes make a context shift happen in a short chat");
            ui.horizontal(|ui| {
                ui.add(egui::DragValue::new(&mut self.n_ctx).range(32..=131072));
                for c in [128, 512, 4096] {
                    if ui.small_button(c.to_string()).clicked() {
                        self.n_ctx = c;
                    }
                }
            });
            ui.end_row();
            ui.label("chats (-np)")
                .on_hover_text("sequences of the one cache, one per chat tab");
            ui.add(egui::DragValue::new(&mut self.n_parallel).range(1..=8));
            ui.end_row();
            ui.label("batch (-b / -ub)");
            ui.horizontal(|ui| {
                ui.add(egui::DragValue::new(&mut self.n_batch).range(1..=4096));
                ui.add(egui::DragValue::new(&mut self.n_ubatch).range(1..=4096));
            });
            ui.end_row();
            ui.label("--swa-full")
                .on_hover_text("sliding-window layers keep a full-size cache instead of a rolling buffer of the window");
            ui.checkbox(&mut self.swa_full, "");
            ui.end_row();
        });
    }

    /// Context policy (takes effect when a chat is reset).
    pub fn policy_ui(&mut self, ui: &mut egui::Ui) {
        egui::Grid::new("policy").num_columns(2).show(ui, |ui| {
            ui.label("context shift");
            ui.checkbox(&mut self.shift.context_shift, "");
            ui.end_row();
            ui.label("--keep")
                .on_hover_text("tokens of the first prompt kept at a shift (-1: all of it)");
            ui.add(egui::DragValue::new(&mut self.shift.keep).range(-1..=4096));
            ui.end_row();
            ui.label("Self-Extend n / w")
                .on_hover_text("--grp-attn-n and --grp-attn-w (n = 1: off)");
            ui.horizontal(|ui| {
                ui.add(egui::DragValue::new(&mut self.shift.ga_n).range(1..=16));
                ui.add(egui::DragValue::new(&mut self.shift.ga_w).range(1..=65536));
            });
            ui.end_row();
        });
    }

    /// Sampling (takes effect on the next reply).
    pub fn sampling_ui(&mut self, ui: &mut egui::Ui) {
        let s = &mut self.sampling;
        egui::Grid::new("sampling").num_columns(2).show(ui, |ui| {
            ui.label("temperature");
            ui.add(egui::Slider::new(&mut s.temp, 0.0..=2.0));
            ui.end_row();
            ui.label("top-k");
            ui.add(egui::DragValue::new(&mut s.top_k).range(0..=1000));
            ui.end_row();
            ui.label("top-p");
            ui.add(egui::Slider::new(&mut s.top_p, 0.0..=1.0));
            ui.end_row();
            ui.label("min-p");
            ui.add(egui::Slider::new(&mut s.min_p, 0.0..=1.0));
            ui.end_row();
            ui.label("repeat penalty");
            ui.add(egui::Slider::new(&mut s.repeat_penalty, 1.0..=2.0));
            ui.end_row();
            ui.label("seed")
                .on_hover_text("random: the system draws the seed, as llama.cpp's -s -1 does");
            ui.horizontal(|ui| {
                // The unset seed is llama.cpp's LLAMA_DEFAULT_SEED (u32::MAX): shown as a
                // choice, not as the number.
                let mut random = s.seed == SamplerParams::RANDOM_SEED;
                if ui.checkbox(&mut random, "random").changed() {
                    s.seed = if random {
                        SamplerParams::RANDOM_SEED
                    } else {
                        0
                    };
                }
                if !random {
                    let fixed = 0..=SamplerParams::RANDOM_SEED - 1;
                    ui.add(egui::DragValue::new(&mut s.seed).range(fixed));
                }
            });
            ui.end_row();
            ui.label("max tokens (-n)");
            ui.add(egui::DragValue::new(&mut self.n_predict).range(-1..=65536));
            ui.end_row();
        });
    }
}
