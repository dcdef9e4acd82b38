//! The gateway over a real socket, with a real WebSocket client.

use std::time::Duration;

use chatpipe_core::auth::TokenKeys;
use chatpipe_core::UserId;
use futures::StreamExt;
use gateway::{Gateway, Sessions};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

const SECRET: &str = "gateway-test-secret-gateway-test-secret";

async fn start() -> (String, Sessions, TokenKeys) {
    let keys = TokenKeys::new(&SECRET.to_owned().into(), Duration::ZERO).unwrap();
    let sessions = Sessions::new(16);
    let (_stop, shutdown) = tokio::sync::watch::channel(false);
    let gw = Gateway {
        keys: keys.clone(),
        sessions: sessions.clone(),
        readiness: Default::default(),
        heartbeat: Duration::from_secs(30),
        read_buffer_bytes: 4096,
        max_client_message_bytes: 16 * 1024,
        shutdown,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _keep = _stop;
        axum::serve(listener, gw.router()).await
    });
    (format!("ws://{addr}/ws"), sessions, keys)
}

fn token(keys: &TokenKeys, user: i64) -> String {
    keys.issue(UserId::new(user).unwrap(), Duration::from_secs(60))
}

/// Waits until `user` has a session (the upgrade completes just after the handshake).
async fn online(sessions: &Sessions, user: i64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !sessions.online().contains(&UserId::of(user)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "user {user} never came online"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_client_with_a_bearer_header_receives_what_is_pushed_to_its_user() {
    let (url, sessions, keys) = start().await;
    let mut request = url.into_client_request().unwrap();
    request.headers_mut().insert(
        "authorization",
        format!("Bearer {}", token(&keys, 10)).parse().unwrap(),
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(request)
        .await
        .expect("upgrade");
    online(&sessions, 10).await;

    assert_eq!(
        sessions.push(&[UserId::of(10)], r#"{"type":"message.new","seq":1}"#),
        1
    );
    let frame = tokio::time::timeout(Duration::from_secs(5), ws.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(frame, Message::text(r#"{"type":"message.new","seq":1}"#));
    ws.close(None).await.unwrap();
}

#[tokio::test]
async fn a_browser_authenticates_with_the_bearer_subprotocol() {
    let (url, sessions, keys) = start().await;
    let mut request = url.into_client_request().unwrap();
    let offer = format!("chatpipe, bearer.{}", token(&keys, 20));
    request
        .headers_mut()
        .insert("sec-websocket-protocol", offer.parse().unwrap());
    let (_ws, response) = tokio_tungstenite::connect_async(request)
        .await
        .expect("upgrade");
    assert_eq!(
        response.headers().get("sec-websocket-protocol").unwrap(),
        "chatpipe"
    );
    online(&sessions, 20).await;
}

#[tokio::test]
async fn missing_expired_and_forged_tokens_are_refused_before_the_upgrade() {
    let (url, sessions, keys) = start().await;
    let now = chatpipe_core::auth::unix_now();
    let expired = keys.sign(UserId::new(10).unwrap(), now - 7200, now - 3600);
    let forged = TokenKeys::new(
        &"another-secret-another-secret-another".to_owned().into(),
        Duration::ZERO,
    )
    .unwrap()
    .issue(UserId::new(10).unwrap(), Duration::from_secs(60));
    for auth in [
        None,
        Some(format!("Bearer {expired}")),
        Some(format!("Bearer {forged}")),
    ] {
        let mut request = url.clone().into_client_request().unwrap();
        if let Some(a) = &auth {
            request
                .headers_mut()
                .insert("authorization", a.parse().unwrap());
        }
        match tokio_tungstenite::connect_async(request).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                assert_eq!(response.status(), 401, "{auth:?}")
            }
            other => panic!("expected 401 for {auth:?}, got {other:?}"),
        }
    }
    assert!(sessions.online().is_empty());
}
