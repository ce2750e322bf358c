//! Images in requests, as llama-server takes them: an `image_url` part's URL (a `data:`
//! URI, bare base64, or `file://` under `--media-path`) or a `/completion` prompt's
//! `multimodal_data` (base64), each placed where the prompt has the server's media
//! marker, then decoded and prepared for the engine's vision encoder. Remote URLs are not
//! fetched: a server that downloads whatever a request names is a way into the network
//! behind it, so the client sends the bytes.

use super::error::{ApiError, ApiResult};
use crate::engine::{MediaPrompt, PreparedImage};
use crate::tokenizer::Tokenizer;
use crate::vision::{decode_image, ImagePrep};
use base64::Engine as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// What preparing a request's images needs: the encoder's preprocessing (none without
/// `--mmproj`) and the directory `file://` URLs may read (`--media-path`).
#[derive(Clone, Debug, Default)]
pub struct ImageInput {
    pub prep: Option<Arc<ImagePrep>>,
    pub media_path: Option<PathBuf>,
    /// A slot's context: more images than their tokens fit are refused before any is
    /// decoded.
    pub n_ctx: u32,
}

/// The largest image file a `file://` URL may name (a request body holds no more).
const MAX_FILE_BYTES: u64 = 64 << 20;

/// llama-server's refusal of an image for a model without a vision encoder.
fn not_supported() -> ApiError {
    ApiError::server(
        "image input is not supported - hint: if this is unexpected, you may need to provide the mmproj",
    )
}

/// The text that stands for an image in a rendered prompt: `LLAMA_MEDIA_MARKER` where set
/// (as llama-server pins it), else one drawn when the server starts, which no client's
/// text holds by chance (`/props` tells it).
pub fn marker() -> &'static str {
    static MARKER: OnceLock<String> = OnceLock::new();
    MARKER.get_or_init(|| match std::env::var("LLAMA_MEDIA_MARKER") {
        Ok(m) if !m.is_empty() => m,
        _ => {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos()),
            );
            format!("<__media_{:016x}__>", h.finish())
        }
    })
}

/// The bytes an `image_url` part's URL names.
pub fn url_bytes(url: &str, media_path: Option<&Path>) -> ApiResult<Vec<u8>> {
    if url.starts_with("http://") || url.starts_with("https://") {
        return Err(ApiError::invalid(
            "remote image URLs are not fetched by wgllm serve: send the image itself as a data URI (data:image/png;base64,...)",
        ));
    }
    if let Some(path) = url.strip_prefix("file://") {
        let Some(dir) = media_path else {
            return Err(ApiError::invalid(
                "file:// URLs are not allowed unless --media-path is specified",
            ));
        };
        let p = Path::new(path);
        let plain = p
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        if path.is_empty() || !plain {
            return Err(ApiError::invalid(format!(
                "file path is not allowed: {path} (a relative path inside --media-path, without ..)"
            )));
        }
        // Resolved, links included, it must still lie inside the directory.
        let opened = |e: std::io::Error| {
            ApiError::invalid(format!(
                "file does not exist or cannot be opened: {path} ({e})"
            ))
        };
        let full = dir.join(p).canonicalize().map_err(opened)?;
        let root = dir.canonicalize().map_err(opened)?;
        if !full.starts_with(&root) {
            return Err(ApiError::invalid(format!(
                "file path is not allowed: {path} (it leads outside --media-path)"
            )));
        }
        let len = std::fs::metadata(&full).map_err(opened)?.len();
        if len > MAX_FILE_BYTES {
            return Err(ApiError::invalid(format!(
                "{path} is {len} bytes; an image file may be {} MiB at most",
                MAX_FILE_BYTES >> 20
            )));
        }
        return std::fs::read(&full).map_err(opened);
    }
    if let Some(rest) = url.strip_prefix("data:") {
        let Some((head, data)) = rest.split_once(',') else {
            return Err(ApiError::invalid("Invalid uri-encoded base64 value"));
        };
        if !head.starts_with("image/") {
            return Err(ApiError::invalid(format!(
                "Invalid uri format: data:{head} (images only: data:image/...;base64,...)"
            )));
        }
        if !head.ends_with("base64") {
            return Err(ApiError::invalid("uri must be base64 encoded"));
        }
        return base64_bytes(data);
    }
    base64_bytes(url)
}

/// Decodes base64 (standard alphabet, padding optional, whitespace ignored).
pub fn base64_bytes(s: &str) -> ApiResult<Vec<u8>> {
    let clean: String = s.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    match engine.decode(clean.as_bytes()) {
        Ok(b) if !b.is_empty() => Ok(b),
        _ => Err(ApiError::invalid("Invalid base64 value")),
    }
}

impl ImageInput {
    /// `text` (the rendered prompt, one [`marker`] per image) with `files` decoded,
    /// prepared and in place; plain tokens where there are no images.
    pub fn prompt(
        &self,
        tok: &Tokenizer,
        text: &str,
        files: &[Vec<u8>],
        add_special: bool,
    ) -> ApiResult<MediaPrompt> {
        if files.is_empty() {
            let tokens = super::budget::encode(tok, text, add_special, true)?;
            return Ok(MediaPrompt::text(tokens));
        }
        let prep = self.prep.as_ref().ok_or_else(not_supported)?;
        super::budget::check_text(text)?;
        // Refused before anything is decoded where even the smallest images overflow the
        // context, then image by image before it is prepared (a tiled image's count
        // depends on its size).
        let too_many = |n_tokens: usize| {
            ApiError::exceeds_context(
                format!(
                    "{} images of {n_tokens} tokens in all (at least) do not fit the context of {} tokens",
                    files.len(),
                    self.n_ctx
                ),
                n_tokens,
                self.n_ctx,
            )
        };
        let least = files.len() * prep.min_tokens() as usize;
        if least >= self.n_ctx as usize {
            return Err(too_many(least));
        }
        let (mut n_tokens, mut input_bytes) = (0, 0u64);
        let mut images = Vec::with_capacity(files.len());
        for (i, bytes) in files.iter().enumerate() {
            let img = decode_image(bytes, &format!("{} of the request", i + 1))
                .map_err(|e| ApiError::invalid(e.to_string()))?;
            let (tokens, values) = (prep.tokens_and_values_for(img.width, img.height))
                .map_err(|e| ApiError::invalid(e.to_string()))?;
            n_tokens += tokens as usize;
            if n_tokens >= self.n_ctx as usize {
                return Err(too_many(n_tokens));
            }
            // The prepared inputs: each chunk's planes of f32.
            input_bytes += values * 4;
            super::budget::check(
                "the request's images",
                input_bytes,
                "send fewer or smaller images",
            )?;
            images.push(
                PreparedImage::new(prep, &img).map_err(|e| ApiError::invalid(e.to_string()))?,
            );
        }
        MediaPrompt::build(tok, prep, text, marker(), &images, add_special)
            .map_err(|e| ApiError::invalid(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_read_as_llama_server_reads_them() {
        let png = [0x89u8, b'P', b'N', b'G'];
        let b64 = base64::engine::general_purpose::STANDARD.encode(png);
        assert_eq!(
            url_bytes(&format!("data:image/png;base64,{b64}"), None).unwrap(),
            png
        );
        assert_eq!(url_bytes(&b64, None).unwrap(), png);
        for bad in [
            "data:text/html;base64,aGVsbG8=",
            "data:image/png,abc",
            "data:image/png;base64",
            "malformed!",
            "",
            "https://example.com/cat.png",
            "file://cat.png",
        ] {
            assert!(url_bytes(bad, None).is_err(), "{bad}");
        }
        let dir = std::env::temp_dir().join(format!("wgllm-media-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a.png"), png).unwrap();
        assert_eq!(url_bytes("file://a.png", Some(&dir)).unwrap(), png);
        for bad in [
            "file://../a.png",
            "file:///etc/passwd",
            "file://",
            "file://b.png",
        ] {
            assert!(url_bytes(bad, Some(&dir)).is_err(), "{bad}");
        }
        let _ = std::fs::remove_dir_all(&dir);
        assert!(marker().starts_with("<__media"));
    }
}
