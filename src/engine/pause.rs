//! A pause that lets a browser page run (draw, take input) before the engine goes on:
//! a timer on the page's event loop. Nothing in a page may block.

use wasm_bindgen_futures::JsFuture;

/// Resolves after `ms` milliseconds (0: at the page's next turn).
pub async fn pause_ms(ms: i32) {
    let promise = js_sys::Promise::new(&mut |resolve, _| {
        if let Some(w) = web_sys::window() {
            let _ = w.set_timeout_with_callback_and_timeout_and_arguments_0(&resolve, ms);
        }
    });
    let _ = JsFuture::from(promise).await;
}
