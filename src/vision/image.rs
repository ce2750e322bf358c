//! Image files to 8-bit RGB pixels, as llama.cpp's mtmd helper reads them (every format
//! to three 8-bit channels: alpha dropped, grey repeated, 16-bit reduced), with the
//! header's size checked before a pixel is decoded.

use super::VisionError;

/// The longest side accepted (llama.cpp's resize refuses targets past 65536; no encoder
/// takes more than a few thousand pixels a side, and a larger header is a decompression
/// bomb more often than a photo).
pub const MAX_IMAGE_SIDE: u32 = 16384;
/// Pixels accepted in all (a 64-megapixel photo; 192 MiB decoded).
pub const MAX_IMAGE_PIXELS: u64 = 64 << 20;

/// An image as interleaved 8-bit R, G, B, rows top to bottom.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RgbImage {
    pub width: u32,
    pub height: u32,
    pub pixels: Vec<u8>,
}

impl RgbImage {
    /// An image of `width` x `height` filled with `rgb`.
    pub fn filled(width: u32, height: u32, rgb: [u8; 3]) -> Self {
        let n = width as usize * height as usize;
        RgbImage {
            width,
            height,
            pixels: rgb.repeat(n),
        }
    }
}

/// Decodes `bytes` (PNG, JPEG, WebP, BMP, PNM; `what` names them in errors: a path or "in
/// the request"), refusing a header larger than [`MAX_IMAGE_SIDE`] or
/// [`MAX_IMAGE_PIXELS`] before decoding.
pub fn decode_image(bytes: &[u8], what: &str) -> Result<RgbImage, VisionError> {
    decode_image_within(bytes, what, MAX_IMAGE_PIXELS)
}

/// [`decode_image`] accepting at most `max_pixels` (the fuzz target's smaller bound).
pub fn decode_image_within(
    bytes: &[u8],
    what: &str,
    max_pixels: u64,
) -> Result<RgbImage, VisionError> {
    let err = |msg: String| VisionError::Image {
        what: what.to_string(),
        msg,
    };
    let reader = ::image::ImageReader::new(std::io::Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| err(format!("cannot be read: {e}")))?;
    if reader.format().is_none() {
        return Err(err(
            "is not an image wgllm decodes (PNG, JPEG, WebP, BMP or PNM)".into(),
        ));
    }
    let (w, h) = reader
        .into_dimensions()
        .map_err(|e| err(format!("has a corrupt header: {e}")))?;
    check_size(w, h, max_pixels.min(MAX_IMAGE_PIXELS)).map_err(err)?;
    let mut reader = ::image::ImageReader::new(std::io::Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| err(format!("cannot be read: {e}")))?;
    let mut limits = ::image::Limits::default();
    limits.max_image_width = Some(MAX_IMAGE_SIDE);
    limits.max_image_height = Some(MAX_IMAGE_SIDE);
    // The decoded image in its own format (up to 16-bit RGBA) and its RGB copy.
    limits.max_alloc = Some(max_pixels * 8 + max_pixels * 3);
    reader.limits(limits);
    let img = reader
        .decode()
        .map_err(|e| err(format!("cannot be decoded: {e}")))?;
    let rgb = img.to_rgb8();
    Ok(RgbImage {
        width: rgb.width(),
        height: rgb.height(),
        pixels: rgb.into_raw(),
    })
}

/// Refuses an empty image or one past the limits, with its size.
fn check_size(w: u32, h: u32, max_pixels: u64) -> Result<(), String> {
    if w == 0 || h == 0 {
        return Err(format!("is empty ({w}x{h} pixels)"));
    }
    if w > MAX_IMAGE_SIDE || h > MAX_IMAGE_SIDE || w as u64 * h as u64 > max_pixels {
        return Err(format!(
            "is {w}x{h} pixels: more than wgllm accepts ({MAX_IMAGE_SIDE} a side, {:.1} megapixels); scale it down first",
            max_pixels as f64 / (1 << 20) as f64
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(w: u32, h: u32) -> Vec<u8> {
        let img = ::image::RgbImage::from_fn(w, h, |x, y| ::image::Rgb([x as u8, y as u8, 7]));
        let mut out = Vec::new();
        img.write_to(
            &mut std::io::Cursor::new(&mut out),
            ::image::ImageFormat::Png,
        )
        .unwrap();
        out
    }

    #[test]
    fn a_png_decodes_to_its_pixels() {
        let img = decode_image(&png(5, 3), "test.png").unwrap();
        assert_eq!((img.width, img.height), (5, 3));
        assert_eq!(&img.pixels[..6], &[0, 0, 7, 1, 0, 7]);
        assert_eq!(&img.pixels[3 * 5 * 2..3 * 5 * 2 + 3], &[0, 2, 7]);
    }

    /// A PNG whose header claims 100000 x 100000 pixels is refused from the header,
    /// before any pixel buffer exists; a truncated or foreign file gets its own sentence.
    #[test]
    fn bombs_truncations_and_strangers_are_refused() {
        let mut bomb = png(4, 4);
        // IHDR's width and height (big-endian, after the 8-byte signature, length, type).
        bomb[16..20].copy_from_slice(&100_000u32.to_be_bytes());
        bomb[20..24].copy_from_slice(&100_000u32.to_be_bytes());
        let e = decode_image(&bomb, "bomb.png").unwrap_err().to_string();
        assert!(e.contains("100000x100000") || e.contains("header"), "{e}");
        let whole = png(64, 64);
        let e = decode_image(&whole[..whole.len() / 2], "cut.png")
            .unwrap_err()
            .to_string();
        assert!(e.contains("cut.png"), "{e}");
        let e = decode_image(b"not an image at all", "notes.txt")
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not an image"), "{e}");
        assert!(check_size(MAX_IMAGE_SIDE + 1, 1, MAX_IMAGE_PIXELS).is_err());
        assert!(check_size(0, 5, MAX_IMAGE_PIXELS).is_err());
        assert!(check_size(2000, 2000, 1 << 20).is_err());
    }
}
