//! Saving the window: egui hands the rendered frame over as an RGBA image; it is written
//! as an 8-bit RGBA PNG.

use std::path::Path;

pub fn save_png(path: &Path, image: &egui::ColorImage) -> Result<(), String> {
    let [w, h] = image.size;
    let file = std::fs::File::create(path)
        .map_err(|e| format!("cannot write the screenshot {}: {e}", path.display()))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), w as u32, h as u32);
    enc.set_color(png::ColorType::Rgba);
    enc.set_depth(png::BitDepth::Eight);
    let bytes: Vec<u8> = image
        .pixels
        .iter()
        .flat_map(|c| c.to_srgba_unmultiplied())
        .collect();
    enc.write_header()
        .and_then(|mut wr| wr.write_image_data(&bytes))
        .map_err(|e| format!("writing the screenshot {}: {e}", path.display()))
}
