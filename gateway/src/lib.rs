//! The WebSocket gateway. Clients connect to `GET /ws` with the same JWT as the REST
//! API; the gateway keeps a session per connection (several per user) and pushes frames
//! queued for them. Fanout (issue 5) will feed `Sessions::push` from chat.deliveries.

pub mod connection;
pub mod sessions;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use axum::extract::ws::WebSocketUpgrade;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use chatpipe_core::auth::{AuthError, AuthSettings, TokenKeys};
use chatpipe_core::problem::Problem;
use futures::StreamExt;
use serde::Deserialize;

pub use sessions::Sessions;

const DEFAULTS: &str = include_str!("../../config/gateway.toml");
const ALIASES: &[(&str, &str)] = &[
    ("GATEWAY_ADDR", "http.addr"),
    ("JWT_SECRET", "auth.jwt_secret"),
];

/// Browsers cannot set headers on a WebSocket: they offer the token as a subprotocol,
/// `Sec-WebSocket-Protocol: chatpipe, bearer.<JWT>`; the gateway answers `chatpipe`.
pub const SUBPROTOCOL: &str = "chatpipe";
const TOKEN_PROTOCOL_PREFIX: &str = "bearer.";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub http: HttpSettings,
    pub auth: AuthSettings,
    pub sessions: SessionSettings,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    pub addr: SocketAddr,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionSettings {
    pub queue_bound: usize,
    pub heartbeat_ms: u64,
}

impl Settings {
    pub fn load(file: Option<&Path>) -> Result<Self, Box<figment::Error>> {
        chatpipe_core::config::load(DEFAULTS, file, ALIASES)
    }
}

#[derive(Clone)]
pub struct Gateway {
    pub keys: TokenKeys,
    pub sessions: Sessions,
    pub heartbeat: Duration,
    pub shutdown: tokio::sync::watch::Receiver<bool>,
}

impl Gateway {
    pub fn router(self) -> Router {
        let metrics = chatpipe_core::telemetry::metrics_handle();
        Router::new()
            .route("/ws", get(ws))
            .route(
                "/healthz",
                get(|| async { axum::Json(serde_json::json!({"status": "ok"})) }),
            )
            .route(
                "/metrics",
                get(move || std::future::ready(metrics.render())),
            )
            .with_state(self)
    }
}

/// The user a connection request authenticates as: the `Authorization` header, or a
/// `bearer.<JWT>` subprotocol.
fn authenticate(keys: &TokenKeys, headers: &HeaderMap) -> Result<i64, AuthError> {
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        return keys.verify_header(value.to_str().ok()).map(|u| u.get());
    }
    let offered = headers
        .get(header::SEC_WEBSOCKET_PROTOCOL)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let token = offered
        .split(',')
        .map(str::trim)
        .find_map(|p| p.strip_prefix(TOKEN_PROTOCOL_PREFIX));
    match token {
        Some(token) => keys.verify(token).map(|u| u.get()),
        None => Err(AuthError::Missing),
    }
}

async fn ws(State(gw): State<Gateway>, headers: HeaderMap, upgrade: WebSocketUpgrade) -> Response {
    let user = match authenticate(&gw.keys, &headers) {
        Ok(user) => user,
        Err(err) => {
            let mut response = Problem::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "Unauthorized",
                err.to_string(),
            )
            .into_response();
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, "Bearer".parse().expect("static"));
            return response;
        }
    };
    upgrade
        .protocols([SUBPROTOCOL])
        .on_upgrade(move |socket| async move {
            let session = gw.sessions.join(user);
            let id = session.id;
            let (sink, stream) = socket.split();
            let mut stop = gw.shutdown.clone();
            let shutdown = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            let ended = connection::serve(sink, stream, session, gw.heartbeat, shutdown).await;
            gw.sessions.leave(user, id);
            tracing::debug!(user, session = id, ?ended, "connection ended");
        })
}
