//! An image's cost, as llama-mtmd-cli reports it: the vision encoder's time for one image
//! (llama.cpp's "image slice encoded in") and the language model's time to decode the
//! image's tokens (its "image decoded in"), each timed over repetitions after an untimed
//! warm-up.

use crate::engine::{Engine, EngineError, MediaPrompt, PreparedImage, SessionParams};
use crate::vision::RgbImage;
use web_time::Instant;

/// Times of one image through an engine with a vision encoder.
#[derive(Clone, Debug, Default)]
pub struct ImageBench {
    /// Tokens the image becomes.
    pub n_tokens: u32,
    /// Milliseconds of each repetition: the encoder, then the language model's decode.
    pub encode_ms: Vec<f64>,
    pub decode_ms: Vec<f64>,
}

impl ImageBench {
    /// Mean and sample standard deviation.
    pub fn stats(v: &[f64]) -> (f64, f64) {
        let n = v.len().max(1) as f64;
        let mean = v.iter().sum::<f64>() / n;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
        (mean, var.sqrt())
    }
}

/// Encodes `img` and decodes its tokens on a session of its own, `reps` times after a
/// warm-up; the engine must have a vision encoder and a free sequence.
#[cfg(not(target_arch = "wasm32"))]
pub fn bench_image(
    engine: &mut Engine,
    img: &RgbImage,
    reps: u32,
) -> Result<ImageBench, EngineError> {
    let enc = engine.vision().cloned().ok_or(EngineError::NoVision)?;
    let image = PreparedImage::new(&enc.prep, img)?;
    let mut prompt = MediaPrompt::default();
    for c in &image.chunks {
        prompt.tokens.extend(c.tokens());
        prompt.images.push(c.clone());
    }
    let mut out = ImageBench {
        n_tokens: image.n_tokens() as u32,
        ..Default::default()
    };
    let params = SessionParams {
        n_predict: 0,
        ..Default::default()
    };
    let id = engine.open_session(params.clone())?;
    for rep in 0..=reps {
        let t = Instant::now();
        for c in &image.chunks {
            pollster::block_on(enc.encode_pixels(&c.pixels))?;
        }
        let encode = t.elapsed().as_secs_f64() * 1e3;
        engine.start_request_media(id, params.clone(), &prompt.tokens, &prompt.images, false)?;
        while engine.session(id)?.is_busy() {
            for ev in engine.step()? {
                if let crate::engine::Event::Error { error, .. } = ev {
                    return Err(error);
                }
            }
        }
        let decode = engine.session(id)?.timings().prompt.as_secs_f64() * 1e3;
        if rep > 0 {
            out.encode_ms.push(encode);
            out.decode_ms.push(decode);
        }
    }
    engine.close_session(id)?;
    Ok(out)
}
