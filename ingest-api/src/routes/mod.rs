//! HTTP handlers: parse and validate, call the store, shape the answer. [`router`] puts
//! them on their paths with the middleware every request passes.

use std::time::{Duration, Instant};

use axum::error_handling::HandleErrorLayer;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::http::{header, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{BoxError, Router};
use chatpipe_core::problem::{Problem, REQUEST_ID};
use tower::ServiceBuilder;
use tracing::Instrument;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::ErrorCause;
use crate::state::AppState;

pub mod blocks;
pub mod conversations;
pub mod demo;
pub mod health;
pub mod inbox;
pub mod mentions;
pub mod messages;
pub mod notifications;
pub mod reads;
pub mod sync;
pub mod threads;

/// The version of the API's paths: every API route is under it (`/v1/conversations`).
/// The operations routes (`/healthz`, `/readyz`, `/openapi.json`) and the demo's are not.
pub const VERSION_PREFIX: &str = "/v1";

/// Every route of the API, with the request deadline on the API routes, the body limit,
/// and per-route counting and logging on all of them, and `GET /openapi.json`. Each
/// route comes with its OpenAPI operation ([`documented`]). An API path without its
/// version answers 308 to the versioned one ([`Unversioned`]).
pub fn router(state: AppState, request_timeout: Duration) -> Router {
    let max_request_bytes = state.max_request_bytes;
    let (api, operations) = documented(state.demo.is_some());
    let unversioned = Unversioned::of(&api.get_openapi().paths.paths.keys().collect::<Vec<_>>());
    let api = api.layer(
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(timed_out))
            .timeout(request_timeout),
    );
    let (router, _) = api.merge(operations).split_for_parts();
    router
        .fallback(move |uri: Uri| std::future::ready(unversioned.answer(&uri)))
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_request_bytes))
        .layer(middleware::from_fn(observe))
        .with_state(state)
}

/// The served routes with their operations: the API's (under the request deadline) and
/// the operations ones (health, the document itself). The demo's only in demo mode.
/// `routes!` takes each handler's path and method from its `#[utoipa::path]`, so a
/// route cannot be served without being documented.
pub fn documented(demo: bool) -> (OpenApiRouter<AppState>, OpenApiRouter<AppState>) {
    let versioned = OpenApiRouter::new()
        .routes(routes!(conversations::create))
        .routes(routes!(conversations::open_direct))
        .routes(routes!(conversations::add_members, conversations::members))
        .routes(routes!(
            conversations::remove_member,
            conversations::set_role
        ))
        .routes(routes!(messages::send, messages::history))
        .routes(routes!(messages::edit, messages::delete))
        .routes(routes!(messages::react, messages::unreact))
        .routes(routes!(threads::follow, threads::unfollow))
        .routes(routes!(threads::read))
        .routes(routes!(reads::mark_read))
        .routes(routes!(reads::mark_delivered))
        .routes(routes!(reads::receipts))
        .routes(routes!(inbox::inbox))
        .routes(routes!(mentions::mentions))
        .routes(routes!(notifications::set))
        .routes(routes!(sync::sync))
        .routes(routes!(blocks::block, blocks::unblock))
        .routes(routes!(blocks::list));
    let mut api = OpenApiRouter::with_openapi(crate::openapi::ApiDoc::openapi())
        .nest(VERSION_PREFIX, versioned);
    if demo {
        api = api.merge(demo::routes());
    }
    let operations = OpenApiRouter::new()
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(health::document));
    (api, operations)
}

/// CORS for the browser origins of `http.cors_allowed_origins`: the API's methods, the
/// `Authorization` and `Content-Type` headers, and `Retry-After` readable by the page.
/// No origins: no CORS layer at all (a browser on another origin is refused).
pub fn cors(origins: &[String]) -> anyhow::Result<Option<tower_http::cors::CorsLayer>> {
    if origins.is_empty() {
        return Ok(None);
    }
    use axum::http::{header, HeaderValue, Method};
    use tower_http::cors::{AllowOrigin, CorsLayer};
    let origins = origins
        .iter()
        .map(|o| {
            HeaderValue::from_str(o)
                .map_err(|e| anyhow::anyhow!("http.cors_allowed_origins: {o:?}: {e}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Some(
        CorsLayer::new()
            .allow_origin(AllowOrigin::list(origins))
            .allow_methods([
                Method::GET,
                Method::POST,
                Method::PUT,
                Method::PATCH,
                Method::DELETE,
            ])
            .allow_headers([
                header::AUTHORIZATION,
                header::CONTENT_TYPE,
                header::HeaderName::from_static("idempotency-key"),
                header::HeaderName::from_static(X_REQUEST_ID),
            ])
            .expose_headers([
                header::RETRY_AFTER,
                header::LOCATION,
                header::HeaderName::from_static(X_REQUEST_ID),
                header::HeaderName::from_static("idempotent-replayed"),
            ])
            .max_age(std::time::Duration::from_secs(600)),
    ))
}

/// The operators' routes, for the admin listener: `/metrics`, `/readyz` saying why it is
/// not ready, `/healthz`.
pub fn admin_router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz_detailed))
        .route("/metrics", get(health::metrics))
        .fallback(|| async { not_found() })
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

/// The first segments of the API's paths (`conversations`, `sync`, …): a request for
/// one of them without the version prefix is an old client's, answered 308 to the same
/// path under [`VERSION_PREFIX`] (method and body kept, `Deprecation` set), as the paths
/// were before they were versioned. Any other unknown path is 404. The redirects end in
/// the release after the one that versioned the paths (CHANGELOG.md).
#[derive(Clone)]
struct Unversioned {
    segments: std::collections::BTreeSet<String>,
}

impl Unversioned {
    fn of(paths: &[&String]) -> Self {
        let segments = paths
            .iter()
            .filter_map(|p| p.strip_prefix(VERSION_PREFIX)?.split('/').nth(1))
            .map(str::to_owned)
            .collect();
        Self { segments }
    }

    fn answer(&self, uri: &Uri) -> Response {
        let first = uri.path().split('/').nth(1).unwrap_or_default();
        if !self.segments.contains(first) {
            return not_found();
        }
        metrics::counter!("http_unversioned_redirects_total").increment(1);
        let location = format!(
            "{VERSION_PREFIX}{}",
            uri.path_and_query().map(|p| p.as_str()).unwrap_or("/")
        );
        let mut response = Problem::new(
            StatusCode::PERMANENT_REDIRECT,
            "moved",
            "Moved to a versioned path",
            format!("the API's paths are under {VERSION_PREFIX}: use {location}"),
        )
        .into_response();
        let headers = response.headers_mut();
        if let Ok(value) = header::HeaderValue::from_str(&location) {
            headers.insert(header::LOCATION, value);
        }
        headers.insert("deprecation", header::HeaderValue::from_static("true"));
        response
    }
}

fn not_found() -> Response {
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

/// The longest `x-request-id` a client may give; a longer or non-ASCII one is replaced.
const MAX_REQUEST_ID_CHARS: usize = 128;

/// The request's id: the client's `x-request-id` if it is 1 to
/// [`MAX_REQUEST_ID_CHARS`] visible ASCII characters, else a new UUID.
fn request_id(request: &Request) -> String {
    request
        .headers()
        .get(X_REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|id| crate::extract::is_token(id, MAX_REQUEST_ID_CHARS))
        .map(str::to_owned)
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string())
}

const X_REQUEST_ID: &str = "x-request-id";

/// Gives every request its id (`x-request-id` on the answer, `requestId` in a problem
/// body, `request_id` on the log lines of its task), counts and times it by route, and
/// logs each failed one exactly once.
async fn observe(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = request_id(&request);
    let method = request.method().clone();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    // As a trace's span (telemetry.otlp_endpoint): named "POST /v1/conversations/{id}/
    // messages", with OpenTelemetry's HTTP attributes.
    let span = tracing::info_span!(
        "request",
        request_id = %id,
        otel.name = %format_args!("{method} {route}"),
        otel.kind = "server",
        http.request.method = %method,
        http.route = %route,
        http.response.status_code = tracing::field::Empty,
    );
    let mut response = REQUEST_ID
        .scope(id.clone(), next.run(request))
        .instrument(span.clone())
        .await;
    if let Ok(value) = header::HeaderValue::from_str(&id) {
        response.headers_mut().insert(X_REQUEST_ID, value);
    }
    let elapsed = started.elapsed();
    let status = response.status();
    span.record("http.response.status_code", status.as_u16());
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
            tracing::error!(parent: &span, %method, %route, status = status.as_u16(), ms, %detail, %cause, "request failed");
        } else {
            tracing::info!(parent: &span, %method, %route, status = status.as_u16(), ms, %detail, "request refused");
        }
    }
    response
}
