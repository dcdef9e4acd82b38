//! Per-user rate limits ([rate_limits]): over its bucket a request answers 429 with
//! Retry-After and a problem body, is counted, and changes nothing; other users and other
//! kinds of request are not affected.

use std::time::{Duration, Instant};

use chatpipe_tests::{metric_sum, spawn_app_with, Resp};
use ingest_api::rate::Bucket;
use serde_json::json;

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
        .post("/direct", json!({"peerId": 30}))
        .await
        .expect(201);
    let wait = refused(
        alice
            .post(
                "/conversations",
                json!({"type": "GROUP", "memberIds": [40]}),
            )
            .await,
    );
    assert!((50..=60).contains(&wait), "one creation a minute: {wait}");
    refused(alice.post("/direct", json!({"peerId": 31})).await);
    assert_eq!(app.count("SELECT count(*) FROM conversation").await, 3);
    // Another user has a bucket of their own.
    app.user(11).create_group(&[]).await;

    // Member changes: 2, then 429; the refused one changed nothing.
    let members = format!("/conversations/{conv}/members");
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
    let messages = format!("/conversations/{conv}/messages");
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

    let metrics = app.metrics().await;
    for (kind, at_least) in [("create", 2.0), ("member_change", 1.0), ("send", 1.0)] {
        let counted = metric_sum(
            &metrics,
            "rate_limited_total",
            &[&format!("kind=\"{kind}\"")],
        )
        .unwrap_or(0.0);
        assert!(counted >= at_least, "{kind}: {counted}");
    }
}
