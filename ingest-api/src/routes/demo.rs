//! Demo mode (`demo.enabled`, off by default): the browser client under `/app`, and a
//! token for any user id at `POST /demo/token`, so a person can try two users side by
//! side without an identity provider. Never turn it on where real users are: anyone who
//! reaches the API can then act as anyone.

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Json;
use chatpipe_core::UserId;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::configuration::DemoSettings;
use crate::error::ApiError;
use crate::extract::Json as JsonBody;
use crate::state::AppState;

/// The longest a demo token lives.
pub const MAX_TOKEN_TTL_SECS: u64 = 3600;

/// Whether these demo settings may start on `addr`: refused past the token lifetime cap,
/// and on an address that is not loopback unless `allow_remote`. Says so in the log
/// either way: demo mode lets anyone who reaches the API act as anyone.
pub fn check(demo: &DemoSettings, addr: std::net::SocketAddr) -> anyhow::Result<()> {
    if !demo.enabled {
        return Ok(());
    }
    anyhow::ensure!(
        demo.token_ttl_secs <= MAX_TOKEN_TTL_SECS,
        "demo.token_ttl_secs = {} is over the cap of {MAX_TOKEN_TTL_SECS} s",
        demo.token_ttl_secs
    );
    let local = addr.ip().is_loopback();
    anyhow::ensure!(
        local || demo.allow_remote,
        "demo.enabled on http.addr {addr}, which is not loopback: anyone who reaches it can \
         act as any user. Listen on 127.0.0.1, or set demo.allow_remote = true where only the \
         people trying it can reach the API"
    );
    tracing::warn!(
        %addr,
        remote = !local,
        "DEMO MODE: POST /demo/token hands out a token for any user; never where real users are"
    );
    Ok(())
}

/// The browser client's files, compiled into the binary.
const FILES: &[(&str, &str, &str)] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_str!("../../app/index.html"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../../app/app.js"),
    ),
    (
        "api.js",
        "text/javascript; charset=utf-8",
        include_str!("../../app/api.js"),
    ),
    (
        "chatpipe-client.js",
        "text/javascript; charset=utf-8",
        include_str!("../../app/chatpipe-client.js"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("../../app/style.css"),
    ),
];

/// The demo routes (merged into the API's router only when `demo.enabled`).
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(app_root))
        .routes(routes!(app_index))
        .routes(routes!(app_file))
        .routes(routes!(token))
        .routes(routes!(config))
}

/// `GET /app`: to `/app/`, so the page's relative URLs resolve under it.
#[utoipa::path(get, path = "/app", tag = "demo", summary = "To the browser client", security(()),
    responses((status = 308, description = "Location: /app/")))]
async fn app_root() -> Redirect {
    Redirect::permanent("/app/")
}

/// `GET /app/`: the browser client's page.
#[utoipa::path(get, path = "/app/", tag = "demo", summary = "The browser client", security(()),
    responses((status = 200, description = "The page", content_type = "text/html")))]
async fn app_index(State(state): State<AppState>) -> Response {
    serve(&state, "index.html")
}

/// `GET /app/{file}`: the client's scripts and style.
#[utoipa::path(get, path = "/app/{file}", tag = "demo", summary = "A file of the browser client", security(()),
    params(("file" = String, Path, description = "app.js, api.js, chatpipe-client.js or style.css")),
    responses(
        (status = 200, description = "The file"),
        (status = 404, description = "`/problems/not-found`", body = crate::openapi::ProblemBody, content_type = "application/problem+json")
    ))]
async fn app_file(State(state): State<AppState>, Path(file): Path<String>) -> Response {
    serve(&state, &file)
}

/// One of [`FILES`]: from `demo.app_dir` when set, else the compiled copy.
fn serve(state: &AppState, name: &str) -> Response {
    let Some((name, content_type, compiled)) = FILES.iter().find(|(n, _, _)| *n == name) else {
        return ApiError::NotFound { what: "file" }.into_response();
    };
    let from_disk = state
        .demo
        .as_ref()
        .and_then(|d| d.app_dir.as_ref())
        .map(|dir| std::fs::read_to_string(dir.join(name)));
    let body = match from_disk {
        Some(Ok(text)) => text,
        Some(Err(e)) => {
            tracing::warn!(file = name, "demo.app_dir: {e}");
            return ApiError::NotFound { what: "file" }.into_response();
        }
        None => (*compiled).to_owned(),
    };
    (
        [
            (header::CONTENT_TYPE, *content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenRequest {
    pub user_id: i64,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenResponse {
    pub user_id: i64,
    pub token: String,
    pub expires_in_secs: u64,
}

/// `POST /demo/token {"userId": 10}`: a bearer token for that user.
#[utoipa::path(post, path = "/demo/token", tag = "demo", summary = "A token for any user (demo only)", security(()),
    request_body = TokenRequest,
    responses(
        (status = 200, description = "The token", body = TokenResponse),
        crate::openapi::WithBody
    ))]
async fn token(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<TokenRequest>,
) -> Result<Response, ApiError> {
    let demo = state
        .demo
        .as_ref()
        .expect("demo routes exist only in demo mode");
    let user =
        UserId::new(request.user_id).map_err(|e| ApiError::invalid("userId", e.to_string()))?;
    state.rate.check_demo_token()?;
    let token = state
        .keys
        .issue_demo(user, Duration::from_secs(demo.token_ttl_secs));
    Ok(Json(TokenResponse {
        user_id: request.user_id,
        token,
        expires_in_secs: demo.token_ttl_secs,
    })
    .into_response())
}

/// `GET /demo/config`: where the app finds the gateway.
#[utoipa::path(get, path = "/demo/config", tag = "demo", summary = "Where the browser finds the gateway", security(()),
    responses((status = 200, description = "`{gatewayUrl}`")))]
async fn config(State(state): State<AppState>) -> Json<serde_json::Value> {
    let demo = state
        .demo
        .as_ref()
        .expect("demo routes exist only in demo mode");
    Json(serde_json::json!({ "gatewayUrl": demo.gateway_url }))
}
