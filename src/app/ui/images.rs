//! Images in the app's chats: attached by path (natively) or dropped on the window (a
//! page too, with `?mmproj=`), shown as thumbnails above the input and, once sent, in
//! the message they went with. The worker prepares them for the model's vision encoder.

use super::{App, Role};
use crate::vision::{decode_image, resize_bilinear, RgbImage};
use std::sync::Arc;

/// An image waiting for the chat's next message.
pub(super) struct Attached {
    pub name: String,
    pub image: Arc<RgbImage>,
    pub texture: egui::TextureHandle,
}

/// The longest side a thumbnail is drawn at, in points.
const THUMB: f32 = 160.0;

/// A texture of `img` no larger than twice a thumbnail (a photo of many megapixels is not
/// uploaded whole to be drawn small).
fn thumbnail(ctx: &egui::Context, name: &str, img: &RgbImage) -> egui::TextureHandle {
    let max = (2.0 * THUMB) as u32;
    let small;
    let img = if img.width.max(img.height) > max {
        let s = max as f32 / img.width.max(img.height) as f32;
        let w = ((img.width as f32 * s).round() as u32).max(1);
        let h = ((img.height as f32 * s).round() as u32).max(1);
        small = resize_bilinear(img, w, h);
        &small
    } else {
        img
    };
    let size = [img.width as usize, img.height as usize];
    let colour = egui::ColorImage::from_rgb(size, &img.pixels);
    ctx.load_texture(name, colour, egui::TextureOptions::LINEAR)
}

/// Thumbnails in a row, each scaled to fit [`THUMB`].
pub(super) fn show_thumbs(ui: &mut egui::Ui, textures: &[egui::TextureHandle]) {
    ui.horizontal_wrapped(|ui| {
        for t in textures {
            let size = t.size_vec2();
            let s = (THUMB / size.x.max(size.y)).min(1.0);
            ui.image((t.id(), size * s));
        }
    });
}

impl App {
    /// Whether the loaded model takes images (an mmproj was loaded with it).
    pub(super) fn takes_images(&self) -> bool {
        matches!(&self.load, super::Load::Loaded(info) if info.vision)
    }

    /// Decodes `bytes` and attaches the image to chat `i`'s next message; what is not an
    /// image becomes a note in the chat, with the reason.
    pub(super) fn attach(&mut self, i: usize, name: String, bytes: &[u8]) {
        let ctx = self.ctx.clone();
        let Some(c) = self.chats.get_mut(i) else {
            return;
        };
        match decode_image(bytes, &name) {
            Ok(img) => {
                let texture = thumbnail(&ctx, &name, &img);
                c.attached.push(Attached {
                    name,
                    image: Arc::new(img),
                    texture,
                });
            }
            Err(e) => c.messages.push((Role::Note, format!("error: {e}"))),
        }
    }

    /// Attaches the image file at `path` to chat `i` (natively).
    #[cfg(not(target_arch = "wasm32"))]
    pub(super) fn attach_path(&mut self, i: usize, path: &std::path::Path) {
        match std::fs::read(path) {
            Ok(bytes) => self.attach(i, path.display().to_string(), &bytes),
            Err(e) => {
                let note = format!("error: reading {}: {e}", path.display());
                if let Some(c) = self.chats.get_mut(i) {
                    c.messages.push((Role::Note, note));
                }
            }
        }
    }

    /// Files dropped on the window go to the active chat.
    pub(super) fn take_dropped(&mut self, ctx: &egui::Context) {
        let dropped = ctx.input(|inp| inp.raw.dropped_files.clone());
        if dropped.is_empty() || self.chats.is_empty() {
            return;
        }
        let i = self.active.min(self.chats.len() - 1);
        if !self.takes_images() {
            let note = "error: this model has no vision encoder: start the app with --mmproj FILE to chat about images";
            self.chats[i].messages.push((Role::Note, note.into()));
            return;
        }
        // A page reads a dropped file's bytes asynchronously: they are attached at a
        // later frame (see `take_read_drops`).
        #[cfg(target_arch = "wasm32")]
        for f in dropped {
            let (read, ctx) = (self.read_drops.clone(), ctx.clone());
            wasm_bindgen_futures::spawn_local(async move {
                let name = f.path().display().to_string();
                let bytes = f.bytes_async().await;
                read.borrow_mut().push((i, name, bytes));
                ctx.request_repaint();
            });
        }
        #[cfg(not(target_arch = "wasm32"))]
        for f in dropped {
            let name = f.path().display().to_string();
            match f.bytes() {
                Ok(bytes) => self.attach(i, name, &bytes),
                Err(e) => {
                    let note = format!("error: reading the dropped file {name}: {e}");
                    self.chats[i].messages.push((Role::Note, note));
                }
            }
        }
    }

    /// A page's dropped files whose bytes have been read: attached to their chats.
    #[cfg(target_arch = "wasm32")]
    pub(super) fn take_read_drops(&mut self) {
        let read = std::mem::take(&mut *self.read_drops.borrow_mut());
        for (i, name, bytes) in read {
            match bytes {
                Ok(bytes) => self.attach(i, name, &bytes),
                Err(e) => {
                    if let Some(c) = self.chats.get_mut(i) {
                        c.messages
                            .push((Role::Note, format!("error: reading {name}: {e}")));
                    }
                }
            }
        }
    }

    /// Above the input: the images waiting for the next message (each can be removed)
    /// and, natively, a path field to attach one (or drop files on the window).
    pub(super) fn attach_row(&mut self, ui: &mut egui::Ui, i: usize) {
        if !self.takes_images() {
            return;
        }
        let mut remove = None;
        ui.horizontal_wrapped(|ui| {
            for (k, a) in self.chats[i].attached.iter().enumerate() {
                let size = a.texture.size_vec2();
                let s = (THUMB / 2.0 / size.x.max(size.y)).min(1.0);
                ui.image((a.texture.id(), size * s)).on_hover_text(&a.name);
                if ui.small_button("✕").on_hover_text("remove").clicked() {
                    remove = Some(k);
                }
            }
        });
        if let Some(k) = remove {
            self.chats[i].attached.remove(k);
        }
        #[cfg(not(target_arch = "wasm32"))]
        ui.horizontal(|ui| {
            let c = &mut self.chats[i];
            ui.add(
                egui::TextEdit::singleline(&mut c.image_path)
                    .desired_width(260.0)
                    .hint_text("image path (or drop images on the window)"),
            );
            if ui.button("Attach image").clicked() && !c.image_path.trim().is_empty() {
                let path = std::path::PathBuf::from(std::mem::take(&mut c.image_path).trim());
                self.attach_path(i, &path);
            }
        });
    }
}
