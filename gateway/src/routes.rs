//! The public routes: the WebSocket handshake on `/ws` (authentication, the session
//! caps), `/healthz` and `/readyz`.

use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use chatpipe_core::auth::{unix_now, AuthError, TokenKeys, Verified};
use chatpipe_runtime::Readiness;
use futures::StreamExt;

use crate::sessions::Sessions;
use crate::{connection, signals};

/// The protocol of `docs/protocol.md`, version 1: a client offers it in
/// `Sec-WebSocket-Protocol` and the gateway answers it. Browsers cannot set headers on a
/// WebSocket, so they offer the token as a subprotocol beside it:
/// `Sec-WebSocket-Protocol: chatpipe.v1, bearer.<JWT>`.
pub const SUBPROTOCOL: &str = "chatpipe.v1";
/// The same protocol under its name before it was versioned: still answered, for one
/// release, to a client that offers only it (`gateway_deprecated_subprotocol_total`).
pub const DEPRECATED_SUBPROTOCOL: &str = "chatpipe";
const TOKEN_PROTOCOL_PREFIX: &str = "bearer.";

#[derive(Clone)]
pub struct Gateway {
    pub keys: TokenKeys,
    pub sessions: Sessions,
    /// The deliveries reader's state, for `/readyz`.
    pub readiness: Readiness,
    pub heartbeat: Duration,
    /// Per-connection read buffer: clients only send control frames, so a small one
    /// keeps an idle connection cheap.
    pub read_buffer_bytes: usize,
    /// The largest message a client may send; larger closes the connection.
    pub max_client_message_bytes: usize,
    pub shutdown: chatpipe_runtime::CancellationToken,
    /// Where clients' `ack` and `typing` frames go.
    pub signals: signals::Signals,
}

impl Gateway {
    /// The public routes: `/ws`, `/healthz`, and `/readyz` saying only ready (200) or
    /// stalled (503). Which reader stalled and the metrics are on the admin listener.
    pub fn router(self) -> Router {
        let readiness = self.readiness.clone();
        Router::new()
            .route("/ws", get(ws))
            .with_state(self)
            .route(
                "/healthz",
                get(|| async { axum::Json(serde_json::json!({"status": "ok"})) }),
            )
            .route(
                "/readyz",
                get(move || {
                    let stalled = readiness.report().iter().any(|r| r.stalled);
                    let (status, word) = if stalled {
                        (axum::http::StatusCode::SERVICE_UNAVAILABLE, "stalled")
                    } else {
                        (axum::http::StatusCode::OK, "ready")
                    };
                    std::future::ready((status, axum::Json(serde_json::json!({"status": word}))))
                }),
            )
    }
}

/// Whom a connection request authenticates as, and until when: the `Authorization`
/// header, or a `bearer.<JWT>` subprotocol.
async fn authenticate(keys: &TokenKeys, headers: &HeaderMap) -> Result<Verified, AuthError> {
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        return keys.verify_header_until_fresh(value.to_str().ok()).await;
    }
    let token = offered_protocols(headers).find_map(|p| p.strip_prefix(TOKEN_PROTOCOL_PREFIX));
    match token {
        Some(token) => keys.verify_until_fresh(token).await,
        None => Err(AuthError::Missing),
    }
}

/// The subprotocols a connection request offers (`Sec-WebSocket-Protocol`), in order.
fn offered_protocols(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get(header::SEC_WEBSOCKET_PROTOCOL)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
}

fn offers_only_the_deprecated_name(headers: &HeaderMap) -> bool {
    let offered: Vec<&str> = offered_protocols(headers).collect();
    offered.contains(&DEPRECATED_SUBPROTOCOL) && !offered.contains(&SUBPROTOCOL)
}

/// Closes a freshly upgraded socket with `code` and `reason` (cut to the 123 bytes a
/// close frame holds).
async fn close_at_once(mut socket: WebSocket, code: u16, reason: &str) {
    let mut end = reason.len().min(123);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let frame = CloseFrame {
        code,
        reason: reason[..end].into(),
    };
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        socket.send(Message::Close(Some(frame))),
    )
    .await;
}

/// `GET /ws`. A refused token still gets the upgrade, then a close with 4001 and the
/// reason: a browser sees nothing of a 401 before the upgrade (only 1006).
async fn ws(State(gw): State<Gateway>, headers: HeaderMap, upgrade: WebSocketUpgrade) -> Response {
    let upgrade = upgrade.protocols([SUBPROTOCOL, DEPRECATED_SUBPROTOCOL]);
    if offers_only_the_deprecated_name(&headers) {
        metrics::counter!("gateway_deprecated_subprotocol_total").increment(1);
    }
    let token = match authenticate(&gw.keys, &headers).await {
        Ok(token) => token,
        Err(err) => {
            metrics::counter!("gateway_auth_refusals_total").increment(1);
            let reason = err.to_string();
            return upgrade.on_upgrade(move |socket| async move {
                close_at_once(socket, connection::CLOSE_UNAUTHORIZED, &reason).await;
            });
        }
    };
    let user = token.user;
    let expires_in = Duration::from_secs(token.expires_at.saturating_sub(unix_now()));
    upgrade
        .read_buffer_size(gw.read_buffer_bytes)
        // Frames are written (and flushed) one by one as they leave the queue.
        .write_buffer_size(0)
        .max_message_size(gw.max_client_message_bytes)
        .max_frame_size(gw.max_client_message_bytes)
        .on_upgrade(move |socket| async move {
            let mut session = match gw.sessions.join(user) {
                Ok(session) => session,
                Err(full) => {
                    let reason = format!("{full}; retry");
                    close_at_once(socket, connection::CLOSE_TRY_AGAIN_LATER, &reason).await;
                    return;
                }
            };
            // An `exp` far ahead (allowed only without auth.max_lifetime_secs) is no
            // deadline at all, rather than an Instant that overflows.
            session.token_expires = tokio::time::Instant::now().checked_add(expires_in);
            let id = session.id;
            let (sink, stream) = socket.split();
            let shutdown = gw.shutdown.clone().cancelled_owned();
            let signals = gw.signals.connection(user);
            let ended =
                connection::serve_with(sink, stream, session, gw.heartbeat, shutdown, signals)
                    .await;
            gw.sessions.leave(user, id);
            tracing::debug!(%user, session = id, ?ended, "connection ended");
        })
}
