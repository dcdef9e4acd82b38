//! The gateway over a real socket, with a real WebSocket client.

use chatpipe_core::kafka::CreateGuarded;
use std::time::Duration;

use chatpipe_core::auth::TokenKeys;
use chatpipe_core::UserId;
use futures::{SinkExt, StreamExt};
use gateway::{Gateway, Sessions};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

const SECRET: &str = "gateway-test-secret-gateway-test-secret";

async fn start() -> (String, Sessions, TokenKeys) {
    start_with(Sessions::new(16)).await
}

/// A gateway router served as the binary serves it, without Kafka: sessions are pushed
/// to directly.
async fn start_with(sessions: Sessions) -> (String, Sessions, TokenKeys) {
    let keys = TokenKeys::new(&SECRET.to_owned().into(), Duration::ZERO).unwrap();
    let gw = Gateway {
        keys: keys.clone(),
        sessions: sessions.clone(),
        readiness: Default::default(),
        heartbeat: Duration::from_secs(30),
        // As configured (config/gateway.toml).
        read_buffer_bytes: configured().sessions.read_buffer_bytes,
        max_client_message_bytes: configured().sessions.max_client_message_bytes,
        shutdown: Default::default(),
        // No broker here: an ack a test sent would be queued and never delivered.
        signals: gateway::signals::Signals {
            producer: rdkafka::ClientConfig::new()
                .set("bootstrap.servers", "127.0.0.1:1")
                .create_guarded()
                .unwrap(),
            acks_codec: chatpipe_schemas::receipt::ReceiptCodec::new(1),
            acks_topic: "no-broker".into(),
            ephemeral_codec: chatpipe_schemas::ephemeral::EphemeralCodec::new(1),
            ephemeral_topic: "no-broker".into(),
            typing_interval: Duration::from_secs(1),
            frames: gateway::signals::FrameBucket {
                rate: 60,
                per_secs: 1,
                burst: 120,
            },
            ack_interval: Duration::from_millis(500),
        },
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let limits = chatpipe_core::http::ConnectionLimits {
        header_read_timeout_ms: 10_000,
        max_connections: 1_000,
        max_connections_per_ip: 1_000,
        refusing_at_once: 16,
    };
    tokio::spawn(chatpipe_core::http::serve(
        listener,
        gw.router(),
        limits,
        std::future::pending(),
    ));
    (format!("ws://{addr}/ws"), sessions, keys)
}

fn configured() -> gateway::Settings {
    gateway::Settings::load(None).expect("config/gateway.toml")
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

/// The read buffer is small (an idle connection's largest cost); a client frame bigger
/// than it but within `max_client_message_bytes` is still read whole, and the session
/// goes on. One past the bound ends the connection.
#[tokio::test]
async fn a_frame_larger_than_the_read_buffer_is_read_and_one_past_the_bound_ends_the_connection() {
    let sessions = configured().sessions;
    assert!(sessions.read_buffer_bytes < 12_000 && 12_000 < sessions.max_client_message_bytes);
    let (url, online_now, keys) = start().await;
    let mut ws = connect(&url, None, Some(format!("Bearer {}", token(&keys, 30)))).await;
    online(&online_now, 30).await;
    let big = format!(r#"{{"type":"ping","pad":"{}"}}"#, "x".repeat(12_000));
    ws.send(Message::text(big)).await.unwrap();
    assert_eq!(
        online_now.push(&[UserId::of(30)], r#"{"type":"message.new","seq":1}"#),
        1
    );
    let frame = loop {
        match tokio::time::timeout(Duration::from_secs(5), ws.next()).await {
            Ok(Some(Ok(Message::Ping(_)))) => continue,
            other => break other,
        }
    };
    assert_eq!(
        frame.unwrap().unwrap().unwrap(),
        Message::text(r#"{"type":"message.new","seq":1}"#),
        "the session went on after the big frame"
    );

    let too_big = "x".repeat(sessions.max_client_message_bytes + 1);
    let _ = ws.send(Message::text(too_big)).await;
    // Ended: a close, an error or the end of the stream, and nothing served after it.
    loop {
        match tokio::time::timeout(Duration::from_secs(5), ws.next()).await {
            Ok(Some(Ok(Message::Ping(_)))) => continue,
            Ok(Some(Ok(Message::Text(t)))) => panic!("still served after the oversized frame: {t}"),
            Ok(_) => break,
            Err(_) => panic!("the connection stayed open after the oversized frame"),
        }
    }
}

/// Connects offering `offer` as `Sec-WebSocket-Protocol`: the socket and the
/// subprotocol the gateway answered.
async fn offering(url: &str, offer: String) -> (Ws, String) {
    let mut request = url.into_client_request().unwrap();
    request
        .headers_mut()
        .insert("sec-websocket-protocol", offer.parse().unwrap());
    let (ws, response) = tokio_tungstenite::connect_async(request)
        .await
        .expect("upgrade");
    let answered = response.headers()["sec-websocket-protocol"]
        .to_str()
        .unwrap()
        .to_owned();
    (ws, answered)
}

#[tokio::test]
async fn a_browser_authenticates_with_the_bearer_subprotocol() {
    let (url, sessions, keys) = start().await;
    let offer = format!("chatpipe.v1, bearer.{}", token(&keys, 20));
    let (_ws, answered) = offering(&url, offer).await;
    assert_eq!(answered, "chatpipe.v1");
    online(&sessions, 20).await;
}

/// A client of the release before the protocol was versioned offers `chatpipe`: it is
/// still answered with that name for one release, and counted.
#[tokio::test]
async fn the_unversioned_subprotocol_is_still_answered_and_counted() {
    let (url, sessions, keys) = start().await;
    let before = deprecated_offers();
    let offer = format!("chatpipe, bearer.{}", token(&keys, 21));
    let (_ws, answered) = offering(&url, offer).await;
    assert_eq!(answered, "chatpipe");
    online(&sessions, 21).await;
    assert!(deprecated_offers() > before, "the old name was counted");
}

/// `gateway_deprecated_subprotocol_total` as this process's recorder renders it.
fn deprecated_offers() -> f64 {
    chatpipe_core::telemetry::metrics_handle()
        .render()
        .lines()
        .find_map(|l| l.strip_prefix("gateway_deprecated_subprotocol_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The close a client got: its code and reason, or a panic saying what came instead.
async fn closed_with(ws: &mut Ws) -> (u16, String) {
    loop {
        match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
            Ok(Some(Ok(Message::Close(Some(frame))))) => {
                return (frame.code.into(), frame.reason.to_string())
            }
            Ok(Some(Ok(Message::Ping(_)))) => continue,
            other => panic!("expected a close frame, got {other:?}"),
        }
    }
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn connect(url: &str, offer: Option<String>, auth: Option<String>) -> Ws {
    let mut request = url.into_client_request().unwrap();
    if let Some(a) = auth {
        request
            .headers_mut()
            .insert("authorization", a.parse().unwrap());
    }
    if let Some(o) = offer {
        request
            .headers_mut()
            .insert("sec-websocket-protocol", o.parse().unwrap());
    }
    tokio_tungstenite::connect_async(request)
        .await
        .expect("upgrade")
        .0
}

/// A browser sees nothing of a 401 before the upgrade (only 1006): a refused token gets
/// the upgrade and a close with 4001 and the reason in the same words as the REST API.
#[tokio::test]
async fn missing_expired_and_forged_tokens_are_closed_with_4001_and_the_reason() {
    let (url, sessions, keys) = start().await;
    let now = chatpipe_core::auth::unix_now();
    let expired = keys.sign(UserId::new(10).unwrap(), now - 7200, now - 3600);
    let forged = TokenKeys::new(
        &"another-secret-another-secret-another".to_owned().into(),
        Duration::ZERO,
    )
    .unwrap()
    .issue(UserId::new(10).unwrap(), Duration::from_secs(60));
    let cases = [
        (None, None, "missing Authorization header"),
        (
            None,
            Some(format!("Bearer {expired}")),
            "the token has expired",
        ),
        (
            None,
            Some(format!("Bearer {forged}")),
            "the token's signature does not match",
        ),
        (
            Some(format!("chatpipe.v1, bearer.{forged}")),
            None,
            "the token's signature does not match",
        ),
    ];
    for (offer, auth, reason) in cases {
        let mut ws = connect(&url, offer, auth).await;
        assert_eq!(
            closed_with(&mut ws).await,
            (4001, reason.to_owned()),
            "for {reason}"
        );
    }
    assert!(sessions.online().is_empty());
}

#[tokio::test]
async fn a_session_is_closed_with_4002_when_its_token_expires_and_a_new_token_reconnects() {
    let (url, sessions, keys) = start().await;
    let now = chatpipe_core::auth::unix_now();
    let user = UserId::new(30).unwrap();
    let short = keys.sign(user, now, now + 2);
    let mut ws = connect(&url, None, Some(format!("Bearer {short}"))).await;
    online(&sessions, 30).await;
    let started = std::time::Instant::now();
    let (code, reason) = closed_with(&mut ws).await;
    assert_eq!(code, 4002, "{reason}");
    assert!(
        started.elapsed() <= Duration::from_secs(4),
        "closed {:?} after connecting with 2 s left",
        started.elapsed()
    );
    let mut again = connect(&url, None, Some(format!("Bearer {}", token(&keys, 30)))).await;
    online(&sessions, 30).await;
    assert_eq!(sessions.push(&[user], r#"{"type":"x"}"#), 1);
    let frame = tokio::time::timeout(Duration::from_secs(5), again.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(frame, Message::text(r#"{"type":"x"}"#));
}

/// Without a lifetime cap, an `exp` at the end of time is a session without a deadline,
/// not a timer that overflows: the socket is served.
#[tokio::test]
async fn a_token_that_expires_at_the_end_of_time_is_served_without_a_panic() {
    let (url, sessions, keys) = start().await;
    let now = chatpipe_core::auth::unix_now();
    let user = UserId::new(31).unwrap();
    let endless = keys.sign(user, now, u64::MAX);
    let mut ws = connect(&url, None, Some(format!("Bearer {endless}"))).await;
    online(&sessions, 31).await;
    assert_eq!(sessions.push(&[user], r#"{"type":"x"}"#), 1);
    let frame = tokio::time::timeout(Duration::from_secs(5), ws.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(frame, Message::text(r#"{"type":"x"}"#));
}

#[tokio::test]
async fn past_the_per_user_cap_the_oldest_session_closes_with_4008_and_past_the_total_the_newest_gets_1013(
) {
    let (url, sessions, keys) = start_with(Sessions::new(16).with_caps(3, 2)).await;
    let bearer = |user| Some(format!("Bearer {}", token(&keys, user)));
    let mut oldest = connect(&url, None, bearer(1)).await;
    online(&sessions, 1).await;
    let _second = connect(&url, None, bearer(1)).await;
    let count = |user: i64| {
        sessions
            .counts()
            .into_iter()
            .find(|(u, _)| *u == UserId::of(user))
            .map_or(0, |(_, n)| n)
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while count(1) < 2 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _third = connect(&url, None, bearer(1)).await;
    assert_eq!(closed_with(&mut oldest).await.0, 4008);
    assert_eq!(count(1), 2);

    let _other = connect(&url, None, bearer(2)).await;
    online(&sessions, 2).await;
    let mut refused = connect(&url, None, bearer(3)).await;
    let (code, reason) = closed_with(&mut refused).await;
    assert_eq!(code, 1013, "{reason}");
    assert!(!sessions.online().contains(&UserId::of(3)));
}
