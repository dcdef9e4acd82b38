//! `/healthz` (the process answers), `/readyz` (every reader keeps up: 503 with the
//! stalled readers otherwise) and `/metrics` (Prometheus).

use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};

use crate::Readiness;

/// The routes, for a service that serves them on a listener of its own.
pub fn router(readiness: Readiness) -> Router {
    let metrics = chatpipe_core::telemetry::metrics_handle();
    let for_metrics = readiness.clone();
    Router::new()
        .route(
            "/healthz",
            get(|| async { Json(serde_json::json!({"status": "ok"})) }),
        )
        .route(
            "/readyz",
            get(move || std::future::ready(readyz(&readiness))),
        )
        .route(
            "/metrics",
            get(move || {
                // The stalled gauges are computed when asked for.
                for_metrics.report();
                std::future::ready(metrics.render())
            }),
        )
}

/// 200 `{"status":"ready","readers":[...]}`, or 503 with the stalled ones and why.
pub fn readyz(readiness: &Readiness) -> axum::response::Response {
    let readers = readiness.report();
    let stalled = readers.iter().any(|r| r.stalled);
    let status = if stalled {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    let body = serde_json::json!({
        "status": if stalled { "stalled" } else { "ready" },
        "readers": readers,
    });
    (status, Json(body)).into_response()
}

/// Serves [`router`] on `addr` in the background.
pub async fn serve(addr: &str, readiness: Readiness) -> anyhow::Result<()> {
    serve_with(addr, readiness, Router::new()).await
}

/// Serves [`router`] and the routes of `extra` (`/report` of the auditor) on `addr`.
pub async fn serve_with(addr: &str, readiness: Readiness, extra: Router) -> anyhow::Result<()> {
    use anyhow::Context;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    let app = router(readiness).merge(extra);
    // The same server loop as every listener of ours: header-read timeout, caps.
    tokio::spawn(chatpipe_core::http::serve(
        listener,
        app,
        chatpipe_core::http::ConnectionLimits::ADMIN,
        std::future::pending(),
    ));
    Ok(())
}
