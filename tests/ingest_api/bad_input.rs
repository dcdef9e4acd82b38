//! Every kind of bad input gets a 4xx problem+json naming the field, and writes nothing.

use chatpipe_tests::{spawn_app, spawn_app_with, TestApp};
use serde_json::{json, Value};

async fn group_with_one_message(app: &TestApp) -> i64 {
    let conv = app.user(10).create_group(&[20]).await;
    app.user(10).send_message(conv, "hello").await;
    conv
}

async fn nothing_written(app: &TestApp) {
    assert_eq!(app.count("SELECT count(*) FROM message").await, 1);
    assert_eq!(app.count("SELECT last_seq FROM conversation").await, 1);
    assert_eq!(
        app.count("SELECT count(*) FROM outbox WHERE type IN ('message.new', 'read.updated')")
            .await,
        1
    );
}

#[tokio::test]
async fn bad_send_bodies_are_refused_with_the_field_named() {
    let app = spawn_app().await;
    let conv = group_with_one_message(&app).await;
    let alice = app.user(10);
    let path = format!("/v1/conversations/{conv}/messages");
    let id = uuid::Uuid::new_v4();
    let long = "ü".repeat(4001);

    let cases: Vec<(Value, u16, &str)> = vec![
        (json!({"clientMsgId": id}), 422, "body"),
        (json!({"body": "hi"}), 422, "clientMsgId"),
        (
            json!({"clientMsgId": "not-a-uuid", "body": "hi"}),
            422,
            "clientMsgId",
        ),
        (json!({"clientMsgId": 12, "body": "hi"}), 422, "clientMsgId"),
        (json!({"clientMsgId": id, "body": 42}), 422, "body"),
        (json!({"clientMsgId": id, "body": ""}), 422, "body"),
        (json!({"clientMsgId": id, "body": "   "}), 422, "body"),
        (json!({"clientMsgId": id, "body": long}), 422, "body"),
        // PostgreSQL text cannot store it; in a batch it would fail the others' sends.
        (json!({"clientMsgId": id, "body": "a\u{0}b"}), 422, "body"),
        (json!(["clientMsgId", "body"]), 422, "(body)"),
    ];
    for (body, status, field) in cases {
        let problem = alice.post(&path, body.clone()).await.problem(status);
        assert_eq!(problem["field"], field, "for {body}: {problem}");
    }
    // Exactly at the limit is fine.
    alice
        .post(
            &path,
            json!({"clientMsgId": uuid::Uuid::new_v4(), "body": "ü".repeat(4000)}),
        )
        .await
        .expect(201);
    // A field this server does not know (a newer client's, or a forged one) is ignored:
    // the sender is the token's user, never the body's.
    alice
        .post(
            &path,
            json!({"clientMsgId": uuid::Uuid::new_v4(), "body": "hi", "sender": 3}),
        )
        .await
        .expect(201);
    assert_eq!(app.count("SELECT count(*) FROM message").await, 3);
    assert_eq!(
        app.count("SELECT count(*) FROM message WHERE sender_id <> 10")
            .await,
        0
    );
}

#[tokio::test]
async fn malformed_empty_and_untyped_bodies_are_refused() {
    let app = spawn_app().await;
    let conv = group_with_one_message(&app).await;
    let alice = app.user(10);
    let path = format!("/v1/conversations/{conv}/messages");
    let json_ct = Some("application/json");

    let problem = alice
        .post_raw(&path, json_ct, b"{\"clientMsgId\": ".to_vec())
        .await
        .problem(400);
    assert_eq!(problem["type"], "/problems/malformed-json");
    alice
        .post_raw(&path, json_ct, b"{} trailing".to_vec())
        .await
        .problem(400);
    let problem = alice
        .post_raw(&path, json_ct, Vec::new())
        .await
        .problem(400);
    assert!(problem["detail"].as_str().unwrap().contains("empty"));
    let problem = alice
        .post_raw(&path, None, b"{}".to_vec())
        .await
        .problem(415);
    assert_eq!(problem["type"], "/problems/unsupported-media-type");
    alice
        .post_raw(&path, Some("text/plain"), b"{}".to_vec())
        .await
        .problem(415);
    nothing_written(&app).await;
}

#[tokio::test]
async fn a_request_body_over_the_size_limit_is_413() {
    let app = spawn_app_with(|s| s.http.max_request_bytes = 2048).await;
    let conv = group_with_one_message(&app).await;
    let body = json!({"clientMsgId": uuid::Uuid::new_v4(), "body": "a".repeat(3000)});
    let problem = app
        .user(10)
        .post(&format!("/v1/conversations/{conv}/messages"), body)
        .await
        .problem(413);
    assert_eq!(problem["type"], "/problems/body-too-large");
    nothing_written(&app).await;
}

#[tokio::test]
async fn bad_read_requests_are_refused() {
    let app = spawn_app().await;
    let conv = group_with_one_message(&app).await;
    let bob = app.user(20);
    let path = format!("/v1/conversations/{conv}/read");
    for (body, field) in [
        (json!({"seq": 0}), "seq"),
        (json!({"seq": -4}), "seq"),
        (json!({"seq": "5"}), "seq"),
        (json!({"seq": 1.5}), "seq"),
        (json!({}), "seq"),
    ] {
        let problem = bob.post(&path, body.clone()).await.problem(422);
        assert_eq!(problem["field"], field, "for {body}");
    }
    nothing_written(&app).await;
    assert_eq!(
        app.count("SELECT max(last_read_seq) FROM conversation_member WHERE user_id = 20")
            .await,
        0
    );
}

#[tokio::test]
async fn bad_path_and_query_values_are_400_naming_the_parameter() {
    let app = spawn_app().await;
    let conv = group_with_one_message(&app).await;
    let alice = app.user(10);
    let cases = [
        ("/v1/conversations/abc/messages".to_owned(), "id"),
        ("/v1/conversations/0/messages".to_owned(), "id"),
        ("/v1/conversations/-1/messages".to_owned(), "id"),
        (
            "/v1/conversations/99999999999999999999/messages".to_owned(),
            "id",
        ),
        (
            format!("/v1/conversations/{conv}/messages?limit=0"),
            "limit",
        ),
        (
            format!("/v1/conversations/{conv}/messages?limit=201"),
            "limit",
        ),
        (
            format!("/v1/conversations/{conv}/messages?limit=ten"),
            "limit",
        ),
        (
            format!("/v1/conversations/{conv}/messages?beforeSeq=0"),
            "beforeSeq",
        ),
        (
            format!("/v1/conversations/{conv}/messages?beforeSeq=x"),
            "beforeSeq",
        ),
        (
            format!("/v1/conversations/{conv}/messages?afterSeq=-1"),
            "afterSeq",
        ),
        (
            format!("/v1/conversations/{conv}/messages?beforeSeq=3&afterSeq=1"),
            "afterSeq",
        ),
        (
            format!("/v1/conversations/{conv}/messages/0/receipts"),
            "seq",
        ),
        (
            format!("/v1/conversations/{conv}/messages/x/receipts"),
            "seq",
        ),
        ("/v1/inbox?limit=1000".to_owned(), "limit"),
        ("/v1/inbox?cursor=garbage".to_owned(), "cursor"),
        // Well-formed, but out of range: a time PostgreSQL cannot hold, a time past any
        // this API hands out, a conversation id that cannot exist.
        (
            format!("/v1/inbox?cursor={}", cursor("-9223372036854775807:1")),
            "cursor",
        ),
        (
            format!("/v1/inbox?cursor={}", cursor("-210000000000000000:1")),
            "cursor",
        ),
        (
            format!("/v1/inbox?cursor={}", cursor("253402300800000000:1")),
            "cursor",
        ),
        (format!("/v1/inbox?cursor={}", cursor("1:0")), "cursor"),
        (
            format!("/v1/inbox?cursor={}", cursor("1:99999999999999999999")),
            "cursor",
        ),
    ];
    for (path, field) in cases {
        let problem = alice.get(&path).await.problem(400);
        assert_eq!(problem["field"], field, "for {path}: {problem}");
    }
    // A bad path id wins over a bad body.
    let problem = alice
        .post("/v1/conversations/abc/messages", json!({}))
        .await
        .problem(400);
    assert_eq!(problem["field"], "id");
    let problem = alice
        .delete(&format!("/v1/conversations/{conv}/members/zero"))
        .await
        .problem(400);
    assert_eq!(problem["field"], "userId");
}

#[tokio::test]
async fn bad_conversation_requests_are_refused() {
    let app = spawn_app().await;
    let alice = app.user(10);
    for (body, field, status) in [
        (json!({"type": "DIRECT", "memberIds": [2]}), "type", 422),
        (json!({"type": "GROUP"}), "memberIds", 422),
        (
            json!({"type": "GROUP", "memberIds": [0]}),
            "memberIds[0]",
            422,
        ),
        (
            json!({"type": "GROUP", "memberIds": ["2"]}),
            "memberIds[0]",
            422,
        ),
        (
            json!({"type": "GROUP", "memberIds": [2], "title": "t".repeat(201)}),
            "title",
            422,
        ),
        // PostgreSQL text cannot store U+0000: 422 naming the field, not a 500.
        (
            json!({"type": "GROUP", "memberIds": [2], "title": "a\u{0}b"}),
            "title",
            422,
        ),
    ] {
        let problem = alice
            .post("/v1/conversations", body.clone())
            .await
            .problem(status);
        assert_eq!(problem["field"], field, "for {body}: {problem}");
    }
    for (body, field) in [
        (json!({"peerId": 0}), "peerId"),
        (json!({"peerId": "x"}), "peerId"),
        (json!({}), "peerId"),
    ] {
        let problem = alice.post("/v1/direct", body.clone()).await.problem(422);
        assert_eq!(problem["field"], field, "for {body}");
    }
    let conv = alice.create_group(&[20]).await;
    let problem = alice
        .post(
            &format!("/v1/conversations/{conv}/members"),
            json!({"userIds": []}),
        )
        .await
        .problem(422);
    assert_eq!(problem["field"], "userIds");
    let problem = alice
        .post(
            &format!("/v1/conversations/{conv}/members"),
            json!({"userIds": [5, -5]}),
        )
        .await
        .problem(422);
    assert_eq!(problem["field"], "userIds[1]");
    assert_eq!(app.count("SELECT count(*) FROM conversation").await, 1);
    assert_eq!(
        app.count("SELECT count(*) FROM conversation_member").await,
        2
    );
}

#[tokio::test]
async fn unknown_routes_and_methods_answer_problems() {
    let app = spawn_app().await;
    app.user(10).get("/nope").await.problem(404);
    let res = app.user(10).delete("/v1/inbox").await;
    assert_eq!(res.problem(405)["type"], "/problems/method-not-allowed");
}

/// An old client's unversioned path gets a 308 to the same path under /v1 (query kept,
/// `Deprecation` set, a problem body saying where), and a client that follows it gets
/// the real answer: its send committed once, as PostgreSQL's rows show. A path that is
/// not the API's stays 404.
#[tokio::test]
async fn unversioned_paths_redirect_to_v1_for_one_release() {
    let app = spawn_app().await;
    let conversation = app.user(10).create_group(&[11]).await;
    let old = format!("/conversations/{conversation}/messages");
    let res = app
        .user(10)
        .post(
            &old,
            json!({"clientMsgId": uuid::Uuid::new_v4(), "body": "hi"}),
        )
        .await;
    assert_eq!(res.headers["location"], format!("/v1{old}").as_str());
    assert_eq!(res.headers["deprecation"], "true");
    assert_eq!(res.problem(308)["type"], "/problems/moved");
    assert_eq!(app.count("SELECT count(*) FROM message").await, 0);

    let res = app.user(10).get("/inbox?limit=5").await;
    assert_eq!(res.headers["location"], "/v1/inbox?limit=5");

    // reqwest follows a 308 with the method and the body, as browsers do.
    let following = reqwest::Client::new();
    let res = following
        .post(format!("{}{old}", app.base))
        .bearer_auth(app.token(10))
        .json(&json!({"clientMsgId": uuid::Uuid::new_v4(), "body": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201, "{:?}", res.text().await);
    assert_eq!(app.count("SELECT count(*) FROM message").await, 1);

    app.user(10).get("/conversationsx").await.problem(404);
    app.user(10).get("/v2/inbox").await.problem(404);
}

/// A cursor in the inbox's encoding (base64url of `<micros>:<conversationId>`).
fn cursor(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
}
