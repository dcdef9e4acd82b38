//! `Idempotency-Key` on the creating routes: a retry gets the first answer and makes
//! nothing, as PostgreSQL's rows (conversations, outbox events, keys) show.

use chatpipe_tests::{spawn_app, TestApp};
use serde_json::{json, Value};

/// `POST path` as `user` with `key` as its `Idempotency-Key`: status, replay header, body.
async fn post_keyed(
    app: &TestApp,
    user: i64,
    path: &str,
    key: &str,
    body: &Value,
) -> (u16, bool, Value) {
    let res = app
        .http
        .post(format!("{}{path}", app.base))
        .bearer_auth(app.token(user))
        .header("idempotency-key", key)
        .json(body)
        .send()
        .await
        .expect("request reaches ingest-api");
    let status = res.status().as_u16();
    let replayed = res.headers().get("idempotent-replayed").is_some();
    (status, replayed, res.json().await.unwrap_or(Value::Null))
}

async fn groups(app: &TestApp) -> i64 {
    app.count("SELECT count(*) FROM conversation WHERE type = 'GROUP'")
        .await
}

async fn created_events(app: &TestApp) -> i64 {
    app.count("SELECT count(*) FROM outbox WHERE type = 'conversation.created'")
        .await
}

#[tokio::test]
async fn a_retried_create_gets_the_first_answer_and_makes_one_group() {
    let app = spawn_app().await;
    let body = json!({"type": "GROUP", "title": "Trip", "memberIds": [20, 30]});
    let key = uuid::Uuid::new_v4().to_string();
    let (status, replayed, first) = post_keyed(&app, 10, "/v1/conversations", &key, &body).await;
    assert_eq!((status, replayed), (201, false), "{first}");
    let (status, replayed, again) = post_keyed(&app, 10, "/v1/conversations", &key, &body).await;
    assert_eq!((status, replayed), (201, true), "{again}");
    assert_eq!(again, first, "the first answer, byte for byte");
    assert_eq!(groups(&app).await, 1);
    assert_eq!(created_events(&app).await, 1);

    // The same key with another request: refused, nothing made.
    let other = json!({"type": "GROUP", "title": "Other", "memberIds": [20]});
    let (status, _, problem) = post_keyed(&app, 10, "/v1/conversations", &key, &other).await;
    assert_eq!(status, 409, "{problem}");
    assert_eq!(problem["type"], "/problems/idempotency-key-reused");
    // Another user's key of the same text is theirs alone.
    let (status, replayed, theirs) = post_keyed(&app, 20, "/v1/conversations", &key, &body).await;
    assert_eq!((status, replayed), (201, false), "{theirs}");
    assert_ne!(theirs["conversationId"], first["conversationId"]);
    assert_eq!(groups(&app).await, 2);
    assert_eq!(created_events(&app).await, 2);

    // Without a key, a retry makes a second group: the header is what makes it safe.
    for _ in 0..2 {
        app.user(10)
            .post("/v1/conversations", body.clone())
            .await
            .expect(201);
    }
    assert_eq!(groups(&app).await, 4);
}

/// Retries racing the first request wait for it and get its answer.
#[tokio::test]
async fn concurrent_retries_wait_for_the_first_and_make_one_group() {
    let app = spawn_app().await;
    let body = json!({"type": "GROUP", "memberIds": [20]});
    let key = uuid::Uuid::new_v4().to_string();
    let answers = futures::future::join_all(
        (0..8).map(|_| post_keyed(&app, 10, "/v1/conversations", &key, &body)),
    )
    .await;
    let ids: std::collections::BTreeSet<String> = answers
        .iter()
        .map(|(status, _, body)| {
            assert_eq!(*status, 201, "{body}");
            body["conversationId"].to_string()
        })
        .collect();
    assert_eq!(ids.len(), 1, "one conversation for all: {answers:?}");
    assert_eq!(
        answers.iter().filter(|(_, replayed, _)| !replayed).count(),
        1
    );
    assert_eq!(groups(&app).await, 1);
    assert_eq!(created_events(&app).await, 1);
}

/// The key is written in the create's transaction: a refused create leaves none, and
/// its retry (the refusal gone) makes the group once.
#[tokio::test]
async fn a_refused_create_leaves_no_key_and_its_retry_makes_the_group() {
    let app = spawn_app().await;
    app.user(30).post("/v1/blocks/10", json!({})).await;
    let body = json!({"type": "GROUP", "memberIds": [30]});
    let key = "retry-after-unblock";
    let (status, _, problem) = post_keyed(&app, 10, "/v1/conversations", key, &body).await;
    assert_eq!(status, 403, "{problem}");
    assert_eq!(app.count("SELECT count(*) FROM idempotency_key").await, 0);
    app.user(30).delete("/v1/blocks/10").await;
    let (status, replayed, _) = post_keyed(&app, 10, "/v1/conversations", key, &body).await;
    assert_eq!((status, replayed), (201, false));
    let (status, replayed, _) = post_keyed(&app, 10, "/v1/conversations", key, &body).await;
    assert_eq!((status, replayed), (201, true));
    assert_eq!(groups(&app).await, 1);
}

/// Past `limits.idempotency_key_retention_s` a key is new again (the row is aged in
/// PostgreSQL, not waited for).
#[tokio::test]
async fn a_key_past_its_retention_is_new_again() {
    let app = spawn_app().await;
    let body = json!({"type": "GROUP", "memberIds": [20]});
    let (status, _, first) = post_keyed(&app, 10, "/v1/conversations", "k1", &body).await;
    assert_eq!(status, 201);
    sqlx::query("UPDATE idempotency_key SET created_at = created_at - interval '25 hours'")
        .execute(&app.pool)
        .await
        .unwrap();
    let (status, replayed, second) = post_keyed(&app, 10, "/v1/conversations", "k1", &body).await;
    assert_eq!((status, replayed), (201, false));
    assert_ne!(second["conversationId"], first["conversationId"]);
    assert_eq!(groups(&app).await, 2);
    assert_eq!(app.count("SELECT count(*) FROM idempotency_key").await, 1);
}

/// `POST /v1/direct` answers 201 once and 200 after; with the key of the call that
/// opened it, its retry gets that 201 again.
#[tokio::test]
async fn a_retried_direct_open_gets_its_201_again() {
    let app = spawn_app().await;
    let body = json!({"peerId": 20});
    let (status, replayed, first) = post_keyed(&app, 10, "/v1/direct", "d1", &body).await;
    assert_eq!((status, replayed), (201, false), "{first}");
    let (status, replayed, again) = post_keyed(&app, 10, "/v1/direct", "d1", &body).await;
    assert_eq!((status, replayed), (201, true), "{again}");
    assert_eq!(again, first);
    app.user(10)
        .post("/v1/direct", body.clone())
        .await
        .expect(200);
    let (status, _, problem) =
        post_keyed(&app, 10, "/v1/direct", "d1", &json!({"peerId": 30})).await;
    assert_eq!(status, 409, "{problem}");
    assert_eq!(
        app.count("SELECT count(*) FROM conversation WHERE type = 'DIRECT'")
            .await,
        1
    );
}

#[tokio::test]
async fn a_malformed_key_is_refused_with_the_header_named() {
    let app = spawn_app().await;
    let body = json!({"type": "GROUP", "memberIds": [20]});
    for key in ["", "\"\"", &"k".repeat(256), "with space"] {
        let (status, _, problem) = post_keyed(&app, 10, "/v1/conversations", key, &body).await;
        assert_eq!(status, 400, "{key:?}: {problem}");
        assert_eq!(problem["field"], "Idempotency-Key");
    }
    // Quoted, as the IETF draft writes it: the same key as bare.
    let (status, _, first) = post_keyed(&app, 10, "/v1/conversations", "\"q1\"", &body).await;
    assert_eq!(status, 201);
    let (status, replayed, again) = post_keyed(&app, 10, "/v1/conversations", "q1", &body).await;
    assert_eq!((status, replayed), (201, true));
    assert_eq!(again, first);
    assert_eq!(groups(&app).await, 1);
}
