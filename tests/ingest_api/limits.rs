//! What a public listener must hold against: per-user rate limits ([rate_limits]) over
//! which a request answers 429 with Retry-After and changes nothing; sockets that never
//! finish their headers or sit idle (http.header_read_timeout_ms); and more connections
//! than http.max_connections, or than http.max_connections_per_ip from one address.

use std::time::{Duration, Instant};

use chatpipe_tests::{slow_header_sockets, spawn_app_with, until_closed, OwnMetrics, Resp};
use ingest_api::configuration::Bucket;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The Retry-After of a 429, in seconds, after checking the problem body.
#[track_caller]
fn refused(res: Resp) -> u64 {
    let retry_after = res
        .headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("a 429 carries Retry-After in whole seconds: {res:?}"));
    let problem = res.problem(429);
    assert_eq!(problem["type"], "/problems/rate-limited");
    assert!(
        problem["detail"].as_str().unwrap().contains("retry after"),
        "{problem}"
    );
    retry_after
}

#[tokio::test]
async fn creations_sends_and_member_changes_over_their_bucket_answer_429_with_retry_after() {
    let metrics = OwnMetrics::start();
    let app = spawn_app_with(|s| {
        s.rate_limits.creates = Bucket {
            rate: 1,
            per_secs: 60,
            burst: 3,
        };
        s.rate_limits.sends = Bucket {
            rate: 5,
            per_secs: 1,
            burst: 5,
        };
        s.rate_limits.member_changes = Bucket {
            rate: 1,
            per_secs: 60,
            burst: 2,
        };
    })
    .await;
    let alice = app.user(10);

    // Creations, /direct included, share one bucket of 3.
    let conv = alice.create_group(&[20]).await;
    alice.create_group(&[]).await;
    alice
        .post("/v1/direct", json!({"peerId": 30}))
        .await
        .expect(201);
    let wait = refused(
        alice
            .post(
                "/v1/conversations",
                json!({"type": "GROUP", "memberIds": [40]}),
            )
            .await,
    );
    assert!((50..=60).contains(&wait), "one creation a minute: {wait}");
    refused(alice.post("/v1/direct", json!({"peerId": 31})).await);
    assert_eq!(app.count("SELECT count(*) FROM conversation").await, 3);
    // Another user has a bucket of their own.
    app.user(11).create_group(&[]).await;

    // Member changes: 2, then 429; the refused one changed nothing.
    let members = format!("/v1/conversations/{conv}/members");
    alice
        .post(&members, json!({"userIds": [21]}))
        .await
        .expect(200);
    alice.delete(&format!("{members}/21")).await.expect(204);
    refused(alice.post(&members, json!({"userIds": [22]})).await);
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM conversation_member WHERE conversation_id = {conv}"
        ))
        .await,
        2
    );

    // Sends: a burst of 5, then 429 saying to wait a second; after it, sends go through.
    let messages = format!("/v1/conversations/{conv}/messages");
    let send = |id: uuid::Uuid| alice.post(&messages, json!({"clientMsgId": id, "body": "hi"}));
    for _ in 0..5 {
        send(uuid::Uuid::new_v4()).await.expect(201);
    }
    let late = uuid::Uuid::new_v4();
    assert_eq!(refused(send(late).await), 1);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let res = send(late).await;
        if res.status == 201 {
            break;
        }
        refused(res);
        assert!(Instant::now() < deadline, "the bucket never refilled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM message WHERE conversation_id = {conv}"
        ))
        .await,
        6,
        "refused sends wrote nothing"
    );

    // Each refusal counted once: two creations, one member change, and the sends refused
    // while the bucket refilled (one or more).
    let refused = |kind: &str| metrics.sum("rate_limited_total", &[&format!("kind=\"{kind}\"")]);
    assert_eq!(refused("create"), 2.0);
    assert_eq!(refused("member_change"), 1.0);
    assert!(refused("send") >= 1.0, "{}", refused("send"));
}

/// A client that opens a new connection for every request: the pool's idle connections
/// would otherwise meet the header-read timeout these tests set low.
fn unpooled() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

#[tokio::test]
async fn sockets_that_never_finish_their_headers_or_sit_idle_are_closed_while_others_are_served() {
    let metrics = OwnMetrics::start();
    let app = spawn_app_with(|s| s.http.header_read_timeout_ms = 1_000).await;
    let addr = app.base.trim_start_matches("http://").to_owned();
    let slow = slow_header_sockets(&addr, 200).await;
    // Meanwhile, a normal client is served.
    let http = unpooled();
    for _ in 0..20 {
        let res = http
            .get(format!("{}/v1/inbox", app.base))
            .bearer_auth(app.token(10))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
    }
    until_closed(slow, Duration::from_secs(10)).await;

    // A keep-alive connection that answered a request and then sat idle is closed too.
    let mut idle = tokio::net::TcpStream::connect(&addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 256];
    let n = idle.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
    until_closed(vec![idle], Duration::from_secs(10)).await;

    let timeouts = metrics.sum("http_connection_timeouts_total", &[]);
    assert!(timeouts >= 201.0, "counted {timeouts} timeouts");
}

#[tokio::test]
async fn a_connection_over_the_cap_is_answered_503_with_retry_after_and_closed() {
    let metrics = OwnMetrics::start();
    let app = spawn_app_with(|s| {
        s.http.max_connections = 3;
        s.http.header_read_timeout_ms = 2_000;
    })
    .await;
    let addr = app.base.trim_start_matches("http://").to_owned();
    let holders = slow_header_sockets(&addr, 3).await;
    // The accept loop takes them in order: once they are in, the fourth is refused.
    let http = unpooled();
    let inbox_until = |status: u16| {
        let (http, app) = (&http, &app);
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let res = http
                    .get(format!("{}/v1/inbox", app.base))
                    .bearer_auth(app.token(10))
                    .send()
                    .await
                    .unwrap();
                if res.status() == status {
                    return res;
                }
                assert!(
                    Instant::now() < deadline,
                    "still {} instead of {status}",
                    res.status()
                );
            }
        }
    };
    let refused = inbox_until(503).await;
    assert_eq!(refused.headers()["retry-after"], "1");
    assert_eq!(
        refused.headers()["content-type"],
        "application/problem+json"
    );
    let problem: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(problem["type"], "/problems/unavailable");
    // When the slow sockets have been closed, there is room again.
    until_closed(holders, Duration::from_secs(10)).await;
    inbox_until(200).await;
    let refusals = metrics.sum("http_connections_refused_total", &[]);
    assert!(refusals >= 1.0, "{refusals}");
}

/// One client address holding `http.max_connections_per_ip` idle connections: its next
/// connection is refused 503, while a client from another address (127.0.0.2, also this
/// machine) is served.
#[tokio::test]
async fn a_client_over_its_share_of_connections_is_refused_and_another_is_served() {
    let metrics = OwnMetrics::start();
    let app = spawn_app_with(|s| {
        s.http.max_connections_per_ip = 3;
        s.http.header_read_timeout_ms = 5_000;
    })
    .await;
    let addr = app.base.trim_start_matches("http://").to_owned();
    let holders = slow_header_sockets(&addr, 3).await;
    let from = |ip: [u8; 4]| {
        reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .local_address(std::net::IpAddr::from(ip))
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap()
    };
    let (flooder, other) = (from([127, 0, 0, 1]), from([127, 0, 0, 2]));
    // The accept loop takes the holders in order: once they are in, the fourth is refused.
    let deadline = Instant::now() + Duration::from_secs(10);
    let refused = loop {
        let res = flooder
            .get(format!("{}/healthz", app.base))
            .send()
            .await
            .unwrap();
        if res.status() == 503 {
            break res;
        }
        assert!(Instant::now() < deadline, "still {}", res.status());
    };
    assert_eq!(refused.headers()["retry-after"], "1");
    let res = other
        .get(format!("{}/v1/inbox", app.base))
        .bearer_auth(app.token(10))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200, "another address is served");
    let per_ip = metrics.sum("http_connections_refused_total", &["reason=\"per_ip\""]);
    assert!(per_ip >= 1.0, "{per_ip}");
    drop(holders);
}
