use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use chatpipe_core::problem::Problem;

use crate::state::AppState;

/// `GET /healthz`: the process is up.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    summary = "The process is up",
    security(()),
    responses((status = 200, description = "Up", body = crate::openapi::Status))
)]
pub async fn healthz() -> impl IntoResponse {
    axum::Json(crate::openapi::Status { status: "ok" })
}

/// `GET /readyz` on the public listener: the database answered within a second, at most a
/// second ago ([`crate::state::ReadyCache`]). Why it does not is for operators (the admin listener's
/// `/readyz`), not for the internet.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    summary = "The database answers within a second",
    security(()),
    responses(
        (status = 200, description = "Ready", body = crate::openapi::Status),
        (status = 503, description = "`/problems/not-ready`", body = crate::openapi::ProblemBody, content_type = "application/problem+json")
    )
)]
pub async fn readyz(State(state): State<AppState>) -> axum::response::Response {
    if state.ready.get(async { probe(&state).await.is_ok() }).await {
        ready()
    } else {
        not_ready("the database is not answering".into())
    }
}

/// `GET /readyz` on the admin listener, with the cause.
pub async fn readyz_detailed(State(state): State<AppState>) -> axum::response::Response {
    match probe(&state).await {
        Ok(()) => ready(),
        Err(cause) => not_ready(cause),
    }
}

async fn probe(state: &AppState) -> Result<(), String> {
    let probe = sqlx::query_scalar::<_, i32>("SELECT 1 AS ready").fetch_one(&state.store.pool);
    match tokio::time::timeout(Duration::from_secs(1), probe).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(err)) => Err(format!("database: {err}")),
        Err(_) => Err("database did not answer within 1 s".into()),
    }
}

fn ready() -> axum::response::Response {
    axum::Json(crate::openapi::Status { status: "ready" }).into_response()
}

fn not_ready(detail: String) -> axum::response::Response {
    Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "not-ready",
        "Not ready",
        detail,
    )
    .into_response()
}

/// `GET /metrics`: Prometheus text format.
pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let pool = &state.store.pool;
    let idle = pool.num_idle() as f64;
    metrics::gauge!("db_pool_connections", "state" => "idle").set(idle);
    metrics::gauge!("db_pool_connections", "state" => "in_use").set(pool.size() as f64 - idle);
    metrics::gauge!("db_pool_max_connections").set(pool.options().get_max_connections() as f64);
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
}

/// The document of this server (the demo's routes only in demo mode), built once.
pub fn spec(demo: bool) -> &'static utoipa::openapi::OpenApi {
    static PLAIN: std::sync::OnceLock<utoipa::openapi::OpenApi> = std::sync::OnceLock::new();
    static DEMO: std::sync::OnceLock<utoipa::openapi::OpenApi> = std::sync::OnceLock::new();
    let build = || {
        let (api, operations) = super::documented(demo);
        api.merge(operations).split_for_parts().1
    };
    if demo {
        DEMO.get_or_init(build)
    } else {
        PLAIN.get_or_init(build)
    }
}

/// `GET /openapi.json`: this document.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "operations",
    summary = "This API's OpenAPI 3.1 document",
    security(()),
    responses((status = 200, description = "The document", content_type = "application/json"))
)]
pub async fn document(
    axum::extract::State(state): axum::extract::State<crate::state::AppState>,
) -> axum::Json<&'static utoipa::openapi::OpenApi> {
    axum::Json(spec(state.demo.is_some()))
}
