//! HTTP handlers: parse and validate, call the store, shape the answer. [`router`] puts
//! them on their paths with the middleware every request passes.

use std::time::{Duration, Instant};

use axum::error_handling::HandleErrorLayer;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{BoxError, Router};
use chatpipe_core::problem::Problem;
use tower::ServiceBuilder;

use crate::error::ErrorCause;
use crate::state::AppState;

pub mod conversations;
pub mod health;
pub mod inbox;
pub mod messages;
pub mod reads;
pub mod sync;

/// Every route of the API, with the request deadline on the API routes, the body limit,
/// and per-route counting and logging on all of them.
pub fn router(state: AppState, request_timeout: Duration) -> Router {
    let max_request_bytes = state.max_request_bytes;
    let api = Router::new()
        .route("/conversations", post(conversations::create))
        .route("/direct", post(conversations::open_direct))
        .route(
            "/conversations/{id}/members",
            post(conversations::add_members).get(conversations::members),
        )
        .route(
            "/conversations/{id}/members/{userId}",
            delete(conversations::remove_member).patch(conversations::set_role),
        )
        .route(
            "/conversations/{id}/messages",
            post(messages::send).get(messages::history),
        )
        .route("/conversations/{id}/read", post(reads::mark_read))
        .route("/conversations/{id}/delivered", post(reads::mark_delivered))
        .route(
            "/conversations/{id}/messages/{seq}",
            axum::routing::patch(messages::edit).delete(messages::delete),
        )
        .route(
            "/conversations/{id}/messages/{seq}/receipts",
            get(reads::receipts),
        )
        .route("/inbox", get(inbox::inbox))
        .route("/sync", get(sync::sync))
        .layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(timed_out))
                .timeout(request_timeout),
        );
    Router::new()
        .merge(api)
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_request_bytes))
        .layer(middleware::from_fn(observe))
        .with_state(state)
}

/// The operators' routes, for the admin listener: `/metrics`, `/readyz` saying why it is
/// not ready, `/healthz`.
pub fn admin_router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz_detailed))
        .route("/metrics", get(health::metrics))
        .fallback(not_found)
        .with_state(state)
}

async fn timed_out(err: BoxError) -> Response {
    if err.is::<tower::timeout::error::Elapsed>() {
        metrics::counter!("http_request_timeouts_total").increment(1);
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "timeout",
            "Request timed out",
            "the request took longer than http.request_timeout_ms; retry with the same clientMsgId",
        )
        .into_response()
    } else {
        Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "Internal error",
            err.to_string(),
        )
        .into_response()
    }
}

async fn not_found() -> Response {
    Problem::new(
        StatusCode::NOT_FOUND,
        "not-found",
        "Not found",
        "no such route",
    )
    .into_response()
}

async fn method_not_allowed() -> Response {
    Problem::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method-not-allowed",
        "Method not allowed",
        "this route does not take that method",
    )
    .into_response()
}

/// Counts and times every request by route, and logs each failed one exactly once.
async fn observe(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let response = next.run(request).await;
    let elapsed = started.elapsed();
    let status = response.status();
    let labels = [
        ("method", method.to_string()),
        ("route", route.clone()),
        ("status", status.as_u16().to_string()),
    ];
    metrics::counter!("http_requests_total", &labels).increment(1);
    metrics::histogram!("http_request_duration_seconds", "method" => method.to_string(), "route" => route.clone())
        .record(elapsed.as_secs_f64());
    if status.is_client_error() || status.is_server_error() {
        let detail = response
            .extensions()
            .get::<Problem>()
            .map(|p| p.detail.clone())
            .unwrap_or_default();
        let cause = response
            .extensions()
            .get::<ErrorCause>()
            .map(|c| c.0.clone())
            .unwrap_or_default();
        let ms = elapsed.as_millis() as u64;
        if status.is_server_error() {
            tracing::error!(%method, %route, status = status.as_u16(), ms, %detail, %cause, "request failed");
        } else {
            tracing::info!(%method, %route, status = status.as_u16(), ms, %detail, "request refused");
        }
    }
    response
}
