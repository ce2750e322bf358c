//! An image into the vision encoder's input, as llama.cpp's mtmd prepares it: resized by
//! Pillow's separable filters (bilinear, or Lanczos for SmolVLM's tiles) in 22-bit fixed
//! point with an 8-bit image between the horizontal and vertical passes (llama.cpp ports
//! Pillow's `Resample.c`; bit-exact pixels are what make the embeddings comparable),
//! fitted into the encoder's square (letterboxed, black) or cut into tiles, then scaled
//! to [0, 1], normalised by the file's mean and deviation per channel and laid out as
//! planes (R, G, B).

use super::image::RgbImage;

/// Fractional bits of the fixed-point filter weights (32 bits less 8 for a pixel and 2 of
/// headroom for the sums).
const PRECISION_BITS: u32 = 22;

/// A resampling filter, as Pillow defines it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filter {
    /// The triangle of radius 1.
    Bilinear,
    /// sinc(x) sinc(x / 3) on [-3, 3).
    Lanczos,
    /// Keys' cubic with a = -0.5 on [-2, 2] (Pillow's; PyTorch's is -0.75).
    Bicubic,
}

impl Filter {
    fn support(self) -> f64 {
        match self {
            Filter::Bilinear => 1.0,
            Filter::Lanczos => 3.0,
            Filter::Bicubic => 2.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        match self {
            Filter::Bilinear => {
                let x = x.abs();
                if x < 1.0 {
                    1.0 - x
                } else {
                    0.0
                }
            }
            Filter::Lanczos => {
                let sinc = |v: f64| {
                    if v == 0.0 {
                        1.0
                    } else {
                        let pv = v * std::f64::consts::PI;
                        pv.sin() / pv
                    }
                };
                if (-3.0..3.0).contains(&x) {
                    sinc(x) * sinc(x / 3.0)
                } else {
                    0.0
                }
            }
            Filter::Bicubic => {
                const A: f64 = -0.5;
                let x = x.abs();
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * A
                } else {
                    0.0
                }
            }
        }
    }
}

/// For each output pixel of a pass from `n_in` to `n_out` pixels: its first input pixel,
/// and the fixed-point weights of the input pixels from there.
fn pass_weights(n_in: u32, n_out: u32, filter: Filter) -> Vec<(usize, Vec<i32>)> {
    let scale = n_in as f64 / n_out as f64;
    // Downscaling widens the filter (antialiasing); upscaling keeps it at its radius.
    let filterscale = scale.max(1.0);
    let support = filter.support() * filterscale;
    // Pillow multiplies by the reciprocal; dividing may round the last bit otherwise.
    let ss = 1.0 / filterscale;
    (0..n_out)
        .map(|xx| {
            let center = (xx as f64 + 0.5) * scale;
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(n_in as i64) as usize;
            let w: Vec<f64> = (xmin..xmax.max(xmin))
                .map(|x| filter.weight((x as f64 - center + 0.5) * ss))
                .collect();
            let sum: f64 = w.iter().sum();
            let fixed = w
                .iter()
                .map(|&v| {
                    let v = if sum != 0.0 { v / sum } else { v };
                    let r = v * (1u64 << PRECISION_BITS) as f64 + if v < 0.0 { -0.5 } else { 0.5 };
                    r as i32
                })
                .collect();
            (xmin, fixed)
        })
        .collect()
}

fn clip8(v: i32) -> u8 {
    (v >> PRECISION_BITS).clamp(0, 255) as u8
}

/// `img` resized to `width` x `height` by the bilinear filter.
pub fn resize_bilinear(img: &RgbImage, width: u32, height: u32) -> RgbImage {
    resize(img, width, height, Filter::Bilinear)
}

/// `img` resized to `width` x `height` by `filter` (a pass is skipped where its side does
/// not change; the horizontal pass runs first, into 8 bits).
pub fn resize(img: &RgbImage, width: u32, height: u32, filter: Filter) -> RgbImage {
    let mut cur = img.clone();
    if width != cur.width {
        let weights = pass_weights(cur.width, width, filter);
        let mut out = vec![0u8; width as usize * cur.height as usize * 3];
        for y in 0..cur.height as usize {
            let src = &cur.pixels[y * cur.width as usize * 3..][..cur.width as usize * 3];
            let dst = &mut out[y * width as usize * 3..][..width as usize * 3];
            for (xx, (xmin, k)) in weights.iter().enumerate() {
                let mut acc = [1i32 << (PRECISION_BITS - 1); 3];
                for (i, &w) in k.iter().enumerate() {
                    let p = &src[(xmin + i) * 3..][..3];
                    for c in 0..3 {
                        acc[c] += p[c] as i32 * w;
                    }
                }
                for c in 0..3 {
                    dst[xx * 3 + c] = clip8(acc[c]);
                }
            }
        }
        cur = RgbImage {
            width,
            height: cur.height,
            pixels: out,
        };
    }
    if height != cur.height {
        let weights = pass_weights(cur.height, height, filter);
        let row = cur.width as usize * 3;
        let mut out = vec![0u8; row * height as usize];
        let mut acc = vec![0i32; row];
        for (yy, (ymin, k)) in weights.iter().enumerate() {
            acc.iter_mut().for_each(|a| *a = 1 << (PRECISION_BITS - 1));
            for (i, &w) in k.iter().enumerate() {
                let src = &cur.pixels[(ymin + i) * row..][..row];
                for (a, &p) in acc.iter_mut().zip(src) {
                    *a += p as i32 * w;
                }
            }
            for (d, &a) in out[yy * row..][..row].iter_mut().zip(&acc) {
                *d = clip8(a);
            }
        }
        cur = RgbImage {
            width: cur.width,
            height,
            pixels: out,
        };
    }
    cur
}

/// `img` fitted into a `side` x `side` square by the bilinear filter (see
/// [`letterbox_to`]).
pub fn letterbox(img: &RgbImage, side: u32) -> RgbImage {
    letterbox_to(img, side, side, Filter::Bilinear)
}

/// `img` fitted into `width` x `height`: scaled by `filter` by the smaller of the two
/// ratios (each side rounded up, at most the target's), centred (offsets rounded down)
/// on black. An image already that size is returned as it is.
pub fn letterbox_to(img: &RgbImage, width: u32, height: u32, filter: Filter) -> RgbImage {
    if img.width == width && img.height == height {
        return img.clone();
    }
    // In f32, as llama.cpp computes them: the rounding decides a pixel's worth of size.
    let scale = (width as f32 / img.width as f32).min(height as f32 / img.height as f32);
    let new_w = ((img.width as f32 * scale).ceil() as u32).clamp(1, width);
    let new_h = ((img.height as f32 * scale).ceil() as u32).clamp(1, height);
    let small = resize(img, new_w, new_h, filter);
    let mut out = RgbImage::filled(width, height, [0, 0, 0]);
    let (ox, oy) = ((width - new_w) / 2, (height - new_h) / 2);
    let row = new_w as usize * 3;
    for y in 0..new_h as usize {
        let dst = ((oy as usize + y) * width as usize + ox as usize) * 3;
        out.pixels[dst..dst + row].copy_from_slice(&small.pixels[y * row..(y + 1) * row]);
    }
    out
}

/// The size a `w` x `h` image is resized to for an encoder that reads any size in
/// cells of `align` pixels (Qwen2.5-VL's 28: two patches of 14 merged), as llama.cpp's
/// mtmd computes it (transformers' `smart_resize`, in f32): each side rounded to whole
/// cells, then scaled down (sides rounded down) to at most `max_pixels`, or up (sides
/// rounded up) to at least `min_pixels`, keeping the aspect ratio.
pub fn fit_to_cells(w: u32, h: u32, align: u32, min_pixels: u32, max_pixels: u32) -> (u32, u32) {
    let f = align as f32;
    let (wf, hf) = (w as f32, h as f32);
    let round = |x: f32| (x / f).round() as u32 * align;
    let ceil = |x: f32| (x / f).ceil() as u32 * align;
    let floor = |x: f32| (x / f).floor() as u32 * align;
    let mut wb = align.max(round(wf));
    let mut hb = align.max(round(hf));
    if max_pixels > 0 && wb as u64 * hb as u64 > max_pixels as u64 {
        let beta = (hf * wf / max_pixels as f32).sqrt();
        hb = align.max(floor(hf / beta));
        wb = align.max(floor(wf / beta));
    } else if min_pixels > 0 && (wb as u64 * hb as u64) < min_pixels as u64 {
        let beta = (min_pixels as f32 / (hf * wf)).sqrt();
        hb = ceil(hf * beta);
        wb = ceil(wf * beta);
    }
    (wb, hb)
}

/// The `side` x `side` square of `img` whose top left pixel is (x, y) (inside `img`).
pub fn crop(img: &RgbImage, x: u32, y: u32, side: u32) -> RgbImage {
    let row = side as usize * 3;
    let mut pixels = Vec::with_capacity(row * side as usize);
    for yy in y..y + side {
        let start = (yy as usize * img.width as usize + x as usize) * 3;
        pixels.extend_from_slice(&img.pixels[start..start + row]);
    }
    RgbImage {
        width: side,
        height: side,
        pixels,
    }
}

/// An image cut into tiles of the encoder's square, as llama.cpp's mtmd cuts them for
/// SmolVLM (Idefics 3): resized (Lanczos) so that its longest side is `longest_edge` and
/// its other side even, resized again up to whole tiles, cut into `cols` x `rows` tiles
/// (row by row), and that tiled image resized to one more tile, the global view.
#[derive(Clone, Debug, PartialEq)]
pub struct Tiles {
    pub cols: u32,
    pub rows: u32,
    /// The tiles row by row, then the global view.
    pub tiles: Vec<RgbImage>,
}

/// The size a `w` x `h` image is resized to before tiling, and its tiles across and
/// down (see [`Tiles`]); refuses an image so long and thin that its short side would
/// round to no pixels.
pub fn tile_grid(w: u32, h: u32, side: u32, longest_edge: u32) -> Result<[u32; 4], String> {
    let aspect = w as f64 / h as f64;
    let (rw, rh) = if w >= h {
        let rh = (longest_edge as f64 / aspect) as u32;
        (longest_edge, rh + rh % 2)
    } else {
        let rw = (longest_edge as f64 * aspect) as u32;
        (rw + rw % 2, longest_edge)
    };
    if rw == 0 || rh == 0 {
        return Err(format!(
            "{w}x{h} is too long and thin: resized to {longest_edge} pixels on its long side, its short side has none"
        ));
    }
    Ok([rw, rh, rw.div_ceil(side), rh.div_ceil(side)])
}

/// [`Tiles`] of `img` for tiles of `side` pixels (see [`tile_grid`]).
pub fn tile_image(img: &RgbImage, side: u32, longest_edge: u32) -> Result<Tiles, String> {
    let [rw, rh, cols, rows] = tile_grid(img.width, img.height, side, longest_edge)?;
    let resized = resize(img, rw, rh, Filter::Lanczos);
    let refined = resize(&resized, cols * side, rows * side, Filter::Lanczos);
    let mut tiles = Vec::with_capacity((cols * rows + 1) as usize);
    for y in 0..rows {
        for x in 0..cols {
            tiles.push(crop(&refined, x * side, y * side, side));
        }
    }
    tiles.push(resize(&refined, side, side, Filter::Lanczos));
    Ok(Tiles { cols, rows, tiles })
}

/// The encoder's input: planes R, G, B of (v / 255 - mean) / std, in f32 as llama.cpp
/// computes them.
pub fn normalize_planar(img: &RgbImage, mean: [f32; 3], std: [f32; 3]) -> Vec<f32> {
    let n = img.width as usize * img.height as usize;
    let mut out = vec![0f32; 3 * n];
    for (i, px) in img.pixels.chunks_exact(3).enumerate() {
        for c in 0..3 {
            out[c * n + i] = (px[c] as f32 / 255.0 - mean[c]) / std[c];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gradient(w: u32, h: u32) -> RgbImage {
        let pixels = (0..h)
            .flat_map(|y| (0..w).flat_map(move |x| [(x * 7 + y) as u8, (y * 5) as u8, 200]))
            .collect();
        RgbImage {
            width: w,
            height: h,
            pixels,
        }
    }

    /// A flat colour stays that colour through any resize (the weights sum to one in
    /// fixed point, and the half added before the shift rounds it back).
    #[test]
    fn a_flat_image_keeps_its_colour() {
        let img = RgbImage::filled(37, 23, [12, 200, 255]);
        for (w, h) in [(10, 10), (64, 64), (37, 50), (5, 23)] {
            let r = resize_bilinear(&img, w, h);
            assert_eq!((r.width, r.height), (w, h));
            assert!(r.pixels.chunks(3).all(|p| p == [12, 200, 255]), "{w}x{h}");
        }
    }

    /// Halving a width averages pixel pairs with their neighbours by the widened
    /// triangle (weights 1/8, 3/8, 3/8, 1/8), as Pillow does.
    #[test]
    fn halving_uses_the_widened_triangle() {
        let img = RgbImage {
            width: 4,
            height: 1,
            pixels: [0u8, 80, 160, 240]
                .iter()
                .flat_map(|&v| [v, v, v])
                .collect(),
        };
        let r = resize_bilinear(&img, 2, 1);
        // Output pixel 0 is centred on input 1.0: inputs 0 and 1 (the triangle's other
        // taps fall off the edge and the rest is renormalised); pixel 1 on 3.0.
        let w = pass_weights(4, 2, Filter::Bilinear);
        assert_eq!(w[0].0, 0);
        assert_eq!(w[1].0, 1);
        let expect = |xmin: usize, k: &[i32]| {
            let acc: i64 = k
                .iter()
                .enumerate()
                .map(|(i, &kw)| [0i64, 80, 160, 240][xmin + i] * kw as i64)
                .sum::<i64>()
                + (1 << 21);
            (acc >> 22) as u8
        };
        assert_eq!(r.pixels[0], expect(w[0].0, &w[0].1));
        assert_eq!(r.pixels[3], expect(w[1].0, &w[1].1));
        assert!(r.pixels[0] < r.pixels[3]);
    }

    /// A wide image is scaled to the square's width and centred between black bands.
    #[test]
    fn letterbox_centres_a_wide_image() {
        let img = gradient(40, 20);
        let out = letterbox(&img, 16);
        assert_eq!((out.width, out.height), (16, 16));
        // 40x20 scaled by 0.4: 16x8, offset 4 rows down.
        let row = |y: usize| &out.pixels[y * 48..(y + 1) * 48];
        assert!(row(0).iter().all(|&v| v == 0) && row(3).iter().all(|&v| v == 0));
        assert!(row(12).iter().all(|&v| v == 0) && row(15).iter().all(|&v| v == 0));
        assert!(row(4).chunks(3).all(|p| p[2] == 200));
        assert_eq!(letterbox(&gradient(16, 16), 16), gradient(16, 16));
    }

    /// Lanczos weights overshoot (negative lobes) and still sum to one: a flat image
    /// stays flat, and a step edge rings by a little on both sides when enlarged.
    #[test]
    fn lanczos_keeps_flat_images_and_rings_at_edges() {
        let img = RgbImage::filled(29, 31, [7, 128, 250]);
        for (w, h) in [(64, 64), (10, 13), (29, 90)] {
            let r = resize(&img, w, h, Filter::Lanczos);
            assert!(r.pixels.chunks(3).all(|p| p == [7, 128, 250]), "{w}x{h}");
        }
        for (_, k) in pass_weights(9, 40, Filter::Lanczos) {
            let sum: i64 = k.iter().map(|&v| v as i64).sum();
            assert!((sum - (1 << 22)).abs() <= k.len() as i64, "{sum}");
        }
        let step = RgbImage {
            width: 8,
            height: 1,
            pixels: (0..8u8)
                .flat_map(|x| [if x < 4 { 50 } else { 200 }; 3])
                .collect(),
        };
        let r = resize(&step, 32, 1, Filter::Lanczos);
        let v: Vec<u8> = r.pixels.chunks(3).map(|p| p[0]).collect();
        assert!(
            v.iter().any(|&p| p < 50) && v.iter().any(|&p| p > 200),
            "{v:?}"
        );
        assert_eq!(crop(&r, 0, 0, 1).pixels, r.pixels[..3]);
    }

    /// Tiles as llama.cpp counts them: the long side to `longest_edge`, the short side
    /// scaled and made even, both rounded up to whole tiles; the global view last.
    #[test]
    fn tiles_cover_the_resized_image() {
        let t = tile_image(&gradient(300, 180), 96, 288).unwrap();
        // 288 x (288 / (300 / 180)) = 288 x 172.8 -> 172: 3 x 2 tiles.
        assert_eq!((t.cols, t.rows, t.tiles.len()), (3, 2, 7));
        assert!(t.tiles.iter().all(|x| (x.width, x.height) == (96, 96)));
        let t = tile_image(&gradient(100, 150), 96, 288).unwrap();
        // 192 x 288 (the width 192 is even already): 2 x 3 tiles.
        assert_eq!((t.cols, t.rows), (2, 3));
        let t = tile_image(&gradient(5, 5), 96, 288).unwrap();
        assert_eq!((t.cols, t.rows), (3, 3));
        let thin = RgbImage::filled(4000, 1, [9, 9, 9]);
        let err = tile_image(&thin, 96, 288).unwrap_err();
        assert!(err.contains("too long and thin"), "{err}");
    }

    /// Sides round to whole cells of 28; a small image grows to the fewest pixels and a
    /// large one shrinks to the most, both keeping their aspect ratio (sides rounded up,
    /// and down, as transformers' `smart_resize`).
    #[test]
    fn sizes_fit_whole_cells_within_the_bounds() {
        let (min, max) = (8 * 784, 4096 * 784);
        assert_eq!(fit_to_cells(300, 180, 28, min, max), (308, 168));
        assert_eq!(fit_to_cells(100, 150, 28, min, max), (112, 140));
        // 28 x 28 is below 6272: scaled up by sqrt(6272 / 400), each side rounded up.
        assert_eq!(fit_to_cells(20, 20, 28, min, max), (84, 84));
        // 4004 x 2996 is above the most: scaled by sqrt(12e6 / max), rounded down.
        let (w, h) = fit_to_cells(4000, 3000, 28, min, max);
        assert_eq!((w, h), (2044, 1540));
        assert!(w * h <= max);
    }

    /// Bicubic weights are Keys' cubic with a = -0.5: 1 at 0, 0 at the integers, the
    /// negative lobe between 1 and 2, nothing beyond.
    #[test]
    fn bicubic_is_keys_cubic() {
        let f = Filter::Bicubic;
        assert_eq!(
            (f.weight(0.0), f.weight(1.0), f.weight(2.0)),
            (1.0, 0.0, 0.0)
        );
        assert!((f.weight(0.5) - 0.5625).abs() < 1e-12);
        assert!((f.weight(-1.5) + 0.0625).abs() < 1e-12);
        assert_eq!(f.weight(2.5), 0.0);
    }

    #[test]
    fn planes_are_normalised_per_channel() {
        let img = RgbImage {
            width: 2,
            height: 1,
            pixels: vec![255, 0, 51, 0, 255, 102],
        };
        let v = normalize_planar(&img, [0.5; 3], [0.5; 3]);
        let f = |u: f32| (u / 255.0 - 0.5) / 0.5;
        assert_eq!(v, vec![1.0, -1.0, -1.0, 1.0, f(51.0), f(102.0)]);
    }
}
