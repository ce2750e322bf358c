//! The router's model store, as llama-server's: `POST /models {"model": "ORG/NAME:QUANT"}`
//! downloads a model from the Hugging Face Hub into the cache in the background (it takes
//! no `--models-max` place), `DELETE /models?model=NAME` removes a cached model (unloading
//! it first), and `GET /models/sse` streams what happens to the models as server-sent
//! events (`data: {"model", "event", "data"}`: `model_status`, `status_change`,
//! `download_progress`, `download_finished`, `download_failed`, `model_remove`,
//! `models_reload`).

use super::super::error::ApiError;
use super::{body_json, query_param, RouterState, Status};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;

impl RouterState {
    /// Tells every `/models/sse` listener.
    pub(super) fn notify(&self, event: &str, model: &str, data: Value) {
        let mut ev = json!({"model": model, "event": event});
        if !data.is_null() {
            ev["data"] = data;
        }
        let _ = self.events.send(ev);
    }
}

/// Download progress as events, at most one per percent.
struct Events {
    r: Arc<RouterState>,
    name: String,
    last: u64,
}

impl crate::hub::Progress for Events {
    fn download(&mut self, file: &str, done: u64, total: u64) {
        let pct = (done * 100).checked_div(total).unwrap_or(done >> 20);
        if pct != self.last || done == total {
            self.last = pct;
            self.r.notify(
                "download_progress",
                &self.name,
                json!({"file": file, "downloaded": done, "total": total}),
            );
        }
    }
    fn note(&mut self, line: &str) {
        log::info!("router: {line}");
    }
}

/// `POST /models`.
pub(super) async fn download(State(r): State<Arc<RouterState>>, body: Body) -> Response {
    let res = async {
        let (_, body) = body_json(body).await?;
        let name = body.get("model").and_then(Value::as_str).unwrap_or("");
        if name.is_empty() {
            return Err(ApiError::invalid("model must be a non-empty string"));
        }
        crate::hub::select::RepoSpec::parse(name).map_err(ApiError::invalid)?;
        let Some(hub) = r.opts.hub.clone() else {
            return Err(ApiError::not_supported(
                "this router has no model cache to download into (set HF_HOME, HF_HUB_CACHE or LLAMA_CACHE)",
            ));
        };
        if r.sched.lock().unwrap().resolve(name).is_some() {
            return Err(ApiError::invalid(format!("model '{name}' already exists")));
        }
        {
            let mut d = r.downloading.lock().unwrap();
            if !d.insert(name.to_string()) {
                return Err(ApiError::invalid(format!("model '{name}' is already downloading")));
            }
        }
        log::info!("router: downloading {name}");
        let name = name.to_string();
        let me = r.clone();
        tokio::task::spawn_blocking(move || {
            let mut ev = Events {
                r: me.clone(),
                name: name.clone(),
                last: u64::MAX,
            };
            let got = crate::hub::fetch_with_mmproj(&name, None, &hub, true, &mut ev);
            me.downloading.lock().unwrap().remove(&name);
            match got {
                Ok((path, _)) => {
                    log::info!("router: {name} downloaded to {}", path.display());
                    if let Err(e) = me.reload() {
                        log::error!("router: reading the model list again after a download: {}", e.message);
                    }
                    me.notify("download_finished", &name, Value::Null);
                }
                Err(e) => {
                    log::error!("router: downloading {name} failed: {e}");
                    me.notify("download_failed", &name, json!({"error": e.to_string()}));
                }
            }
        });
        Ok(())
    }
    .await;
    match res {
        Ok(()) => Json(json!({"success": true})).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `DELETE /models?model=NAME`: a cached model only.
pub(super) async fn remove(State(r): State<Arc<RouterState>>, req: Request) -> Response {
    let asked = query_param(req.uri().query(), "model").unwrap_or_default();
    drop(req);
    let res = async {
        if asked.is_empty() {
            return Err(ApiError::invalid("model must be a non-empty string"));
        }
        let (name, cached) = {
            let s = r.sched.lock().unwrap();
            let name = s.resolve(&asked).ok_or_else(|| ApiError::server(format!("model '{asked}' is not found")))?;
            let i = s.find(&name).unwrap();
            (name, s.models[i].entry.source == super::catalog::Source::Cache)
        };
        if !cached {
            return Err(ApiError::server(format!(
                "model '{name}' is not a cached download: only those can be removed (it comes from --models-dir or --models-preset)"
            )));
        }
        // Unloaded first, waiting for its requests in flight.
        r.stop(&mut r.sched.lock().unwrap(), &name);
        loop {
            let wait = r.changed.notified();
            let done = r.sched.lock().unwrap().model(&name).is_none_or(|m| m.status == Status::Unloaded);
            if done {
                break;
            }
            let _ = tokio::time::timeout(std::time::Duration::from_millis(200), wait).await;
        }
        let hub = r.opts.sources.hub_cache.clone().ok_or_else(|| ApiError::server("no model cache"))?;
        let (repo, tag) = match name.split_once(':') {
            Some((repo, tag)) => (repo.to_string(), Some(tag.to_string())),
            None => (name.clone(), None),
        };
        let removed = tokio::task::spawn_blocking(move || crate::hub::cache::remove(&hub, &repo, tag.as_deref()))
            .await
            .map_err(|e| ApiError::server(e.to_string()))?
            .map_err(|e| ApiError::server(format!("removing {name} from the cache: {e}")))?;
        log::info!("router: {name} removed from the cache ({} files)", removed.len());
        {
            let mut s = r.sched.lock().unwrap();
            if let Some(i) = s.find(&name) {
                s.models.remove(i);
            }
        }
        r.notify("model_remove", &name, Value::Null);
        Ok(())
    }
    .await;
    match res {
        Ok(()) => Json(json!({"success": true})).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `GET /models/sse`.
pub(super) async fn events(State(r): State<Arc<RouterState>>) -> Response {
    let rx = r.events.subscribe();
    let stream = tokio_stream::wrappers::BroadcastStream::new(rx);
    use tokio_stream::StreamExt;
    let stream = stream.filter_map(|ev| {
        ev.ok()
            .map(|v| Ok::<_, std::convert::Infallible>(format!("data: {v}\n\n")))
    });
    // A first comment line, so a client sees the stream open before any event.
    let open = tokio_stream::once(Ok(": models\n\n".to_string()));
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(open.chain(stream)),
    )
        .into_response()
}
