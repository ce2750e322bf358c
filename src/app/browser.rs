//! The page's browser I/O (wasm32): the document's elements, the drive's report, a
//! model file downloaded or picked and read into memory, the file picker.

use super::DriveReport;
use std::cell::RefCell;
use std::rc::Rc;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;

/// The largest model file a page takes. The file is held in one buffer, and on wasm32
/// no Rust allocation may exceed `isize::MAX` (2 GiB - 1 byte), whatever the 4 GiB the
/// page could address in all; 1 MiB is left for the allocator's own bookkeeping.
pub const MAX_MODEL_BYTES: u64 = (2 << 30) - (1 << 20);

/// Bytes read from a picked file at a time.
const FILE_CHUNK: f64 = (16 << 20) as f64;

pub(super) fn has_webgpu() -> bool {
    web_sys::window()
        .and_then(|w| js_sys::Reflect::get(&w.navigator(), &"gpu".into()).ok())
        .is_some_and(|g| !g.is_undefined() && !g.is_null())
}

pub(super) fn document() -> Result<web_sys::Document, String> {
    web_sys::window()
        .and_then(|w| w.document())
        .ok_or_else(|| "no document".to_string())
}

pub(super) fn set_text(id: &str, text: &str) {
    if let Some(el) = document().ok().and_then(|d| d.get_element_by_id(id)) {
        el.set_text_content(Some(text));
    }
}

/// A JS error as text.
pub(super) fn js_text(v: &JsValue) -> String {
    v.as_string()
        .or_else(|| {
            v.dyn_ref::<js_sys::Error>()
                .map(|e| String::from(e.message()))
        })
        .unwrap_or_else(|| format!("{v:?}"))
}

/// The drive's end on a page: the report (or the error) as JSON in `#wgllm-result`.
pub(super) fn publish(report: &DriveReport, error: Option<&str>) {
    let stores: Vec<serde_json::Value> = report
        .stores
        .iter()
        .map(|(name, used, size, moved)| {
            serde_json::json!({"name": name, "used": used, "cells": size, "moved": moved})
        })
        .collect();
    let json = serde_json::json!({
        "ok": error.is_none(),
        "error": error,
        "reply": report.reply,
        "prompt_tokens": report.prompt_tokens,
        "prompt_tps": report.prompt_tps,
        "eval_tokens": report.eval_tokens,
        "eval_tps": report.eval_tps,
        "stores": stores,
    });
    set_text("wgllm-result", &json.to_string());
}

/// A clear refusal for a model the page cannot hold.
fn check_fits(what: &str, bytes: u64) -> Result<(), String> {
    if bytes > MAX_MODEL_BYTES {
        return Err(format!(
            "{what} is {:.2} GiB: a page holds the file in one buffer of its 32-bit memory while uploading it, and such a buffer stops short of 2 GiB, so files over {} MiB cannot load in a browser; pick a smaller model or quantization, or run it with the native `wgllm`",
            bytes as f64 / (1u64 << 30) as f64,
            MAX_MODEL_BYTES >> 20
        ));
    }
    Ok(())
}

/// An empty buffer with room for `bytes`, or a clear error when the page gets no more
/// memory.
fn buffer_for(what: &str, bytes: u64) -> Result<Vec<u8>, String> {
    check_fits(what, bytes)?;
    let mut buf = Vec::new();
    buf.try_reserve_exact(bytes as usize).map_err(|_| {
        format!(
            "the page could not get {} MiB of memory for {what} (the browser refused it): close other tabs, or pick a smaller model",
            bytes >> 20
        )
    })?;
    Ok(buf)
}

/// Downloads `url` into memory, chunk by chunk straight into one buffer.
pub(super) async fn fetch_bytes(
    url: &str,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Vec<u8>, String> {
    let window = web_sys::window().ok_or("no window")?;
    let fail = |e: JsValue| format!("downloading {url}: {}", js_text(&e));
    let resp: web_sys::Response = JsFuture::from(window.fetch_with_str(url))
        .await
        .map_err(fail)?
        .dyn_into()
        .map_err(fail)?;
    if !resp.ok() {
        return Err(format!(
            "downloading {url}: HTTP {} {}",
            resp.status(),
            resp.status_text()
        ));
    }
    let total: Option<u64> = resp
        .headers()
        .get("content-length")
        .ok()
        .flatten()
        .and_then(|v| v.parse().ok());
    let mut buf = buffer_for(url, total.unwrap_or(0))?;
    let body = resp
        .body()
        .ok_or_else(|| format!("downloading {url}: no body"))?;
    // A stream's default reader (no mode asked for) is a ReadableStreamDefaultReader.
    let reader: web_sys::ReadableStreamDefaultReader = body.get_reader().unchecked_into();
    loop {
        let next = JsFuture::from(reader.read()).await.map_err(fail)?;
        let done = js_sys::Reflect::get(&next, &"done".into())
            .map_err(fail)?
            .as_bool()
            .unwrap_or(true);
        if done {
            break;
        }
        let chunk: js_sys::Uint8Array = js_sys::Reflect::get(&next, &"value".into())
            .map_err(fail)?
            .dyn_into()
            .map_err(fail)?;
        let (old, n) = (buf.len(), chunk.length() as usize);
        check_fits(url, (old + n) as u64)?;
        if old + n > buf.capacity() {
            // Without a (right) length: double, but never past what one buffer may hold
            // (`try_reserve`'s own doubling would ask for 2 GiB once past 1 GiB).
            let want = (old + n)
                .max(buf.capacity() * 2)
                .min(MAX_MODEL_BYTES as usize);
            buf.try_reserve_exact(want - old)
                .map_err(|_| format!("the page ran out of memory at {} MiB of {url}", old >> 20))?;
        }
        buf.resize(old + n, 0);
        chunk.copy_to(&mut buf[old..]);
        // An unknown total is 0: the window shows the MiB read so far.
        progress(buf.len() as u64, total.unwrap_or(0));
    }
    Ok(buf)
}

/// Reads a picked file into memory, 16 MiB at a time straight into one buffer.
pub(super) async fn read_file(
    file: &web_sys::File,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Vec<u8>, String> {
    let name = file.name();
    let total = file.size() as u64;
    let mut buf = buffer_for(&name, total)?;
    buf.resize(total as usize, 0);
    let fail = |e: JsValue| format!("reading {name}: {}", js_text(&e));
    let mut at = 0f64;
    while (at as u64) < total {
        let end = (at + FILE_CHUNK).min(total as f64);
        let blob = file.slice_with_f64_and_f64(at, end).map_err(fail)?;
        let ab = JsFuture::from(blob.array_buffer()).await.map_err(fail)?;
        let chunk = js_sys::Uint8Array::new(&ab);
        chunk.copy_to(&mut buf[at as usize..end as usize]);
        at = end;
        progress(at as u64, total);
    }
    Ok(buf)
}

/// Opens the browser's file picker for `.gguf` files; the picked file is put in `into`.
/// (A picker needs a recent user gesture: call it from a button's click.)
pub(super) fn pick_file(into: Rc<RefCell<Option<web_sys::File>>>, wake: egui::Context) {
    let Ok(doc) = document() else {
        return;
    };
    let Some(input) = doc
        .create_element("input")
        .ok()
        .and_then(|e| e.dyn_into::<web_sys::HtmlInputElement>().ok())
    else {
        return;
    };
    input.set_type("file");
    input.set_accept(".gguf");
    let picked = input.clone();
    let on_change = wasm_bindgen::closure::Closure::once_into_js(move || {
        if let Some(f) = picked.files().and_then(|l| l.get(0)) {
            *into.borrow_mut() = Some(f);
            wake.request_repaint();
        }
    });
    input.set_onchange(Some(on_change.unchecked_ref()));
    input.click();
}
