//! Consent (issue 24): leaving a DIRECT conversation, blocking a user, and the bound on
//! how fast one user puts others into groups. Each outcome is read back from
//! PostgreSQL's rows, not from the answers alone.

use chatpipe_tests::{spawn_app, spawn_app_with, Resp, TestApp};
use ingest_api::configuration::Bucket;
use serde_json::{json, Value};

fn inbox_ids(inbox: &Value) -> Vec<i64> {
    inbox["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["conversationId"].as_i64().unwrap())
        .collect()
}

async fn members_of(app: &TestApp, conversation: i64) -> Vec<i64> {
    sqlx::query_scalar(
        "SELECT user_id FROM conversation_member WHERE conversation_id = $1 ORDER BY user_id",
    )
    .bind(conversation)
    .fetch_all(&app.pool)
    .await
    .unwrap()
}

async fn messages_in(app: &TestApp, conversation: i64) -> i64 {
    app.count(&format!(
        "SELECT count(*) FROM message WHERE conversation_id = {conversation}"
    ))
    .await
}

fn blocked(res: Resp) -> Value {
    let problem = res.problem(403);
    assert_eq!(problem["type"], "/problems/blocked", "{problem}");
    problem
}

fn send(body: &str) -> Value {
    json!({"clientMsgId": uuid::Uuid::new_v4(), "body": body})
}

#[tokio::test]
async fn leaving_a_direct_conversation_is_for_good_until_the_leaver_opens_it_again() {
    let app = spawn_app().await;
    let (alice, bob) = (app.user(10), app.user(20));
    let direct = alice.open_direct(20).await;
    bob.send_message(direct, "hi").await;
    let before = alice.get("/v1/sync?limit=200").await.expect(200);
    let cursor = before["nextCursor"].as_str().unwrap().to_owned();

    // The peer cannot take the leaver out; the leaver can.
    let fixed = bob
        .delete(&format!("/v1/conversations/{direct}/members/10"))
        .await;
    assert_eq!(
        fixed.problem(409)["type"],
        "/problems/direct-membership-fixed"
    );
    assert_eq!(members_of(&app, direct).await, vec![10, 20]);
    let left = alice
        .delete(&format!("/v1/conversations/{direct}/members/10"))
        .await;
    assert_eq!(left.status, 204, "{:?}", left.body);
    assert_eq!(members_of(&app, direct).await, vec![20]);
    let left_events = app
        .count("SELECT count(*) FROM outbox WHERE type = 'member.left'")
        .await;
    assert_eq!(left_events, 1);

    // Gone from the leaver's inbox, and their other devices hear it at the next sync.
    let inbox = alice.get("/v1/inbox").await.expect(200);
    assert!(!inbox_ids(&inbox).contains(&direct), "{inbox}");
    let synced = alice
        .get(&format!("/v1/sync?since={cursor}&limit=200"))
        .await
        .expect(200);
    assert!(
        synced["conversations"]
            .as_array()
            .unwrap()
            .contains(&json!({"conversationId": direct, "left": true})),
        "{synced}"
    );

    // The peer still writes into it, which brings nobody back: not a send, not the
    // peer opening it again.
    let seq = bob.send_message(direct, "are you there?").await;
    assert_eq!(seq, 2);
    let reopened = bob
        .post("/v1/direct", json!({"peerId": 10}))
        .await
        .expect(200);
    assert_eq!(reopened["conversationId"], direct);
    assert_eq!(reopened["memberCount"], 1);
    assert_eq!(members_of(&app, direct).await, vec![20]);
    let inbox = alice.get("/v1/inbox").await.expect(200);
    assert!(!inbox_ids(&inbox).contains(&direct));
    let refused = alice
        .post(&format!("/v1/conversations/{direct}/messages"), send("x"))
        .await;
    assert_eq!(refused.problem(404)["type"], "/problems/not-found");

    // The leaver opening it again rejoins, at its last seq: what came meanwhile is in
    // history, not unread.
    let back = alice
        .post("/v1/direct", json!({"peerId": 20}))
        .await
        .expect(200);
    assert_eq!(back["conversationId"], direct);
    assert_eq!(back["memberCount"], 2);
    assert_eq!(members_of(&app, direct).await, vec![10, 20]);
    assert_eq!(app.watermark(direct, 10).await, Some(2));
    let inbox = alice.get("/v1/inbox").await.expect(200);
    let row = inbox["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["conversationId"] == direct)
        .cloned()
        .expect("back in the inbox");
    assert_eq!(row["unreadCount"], 0, "{row}");
    let history = alice
        .get(&format!("/v1/conversations/{direct}/messages"))
        .await
        .expect(200);
    assert_eq!(
        history["messages"].as_array().unwrap().len(),
        2,
        "{history}"
    );
    alice.send_message(direct, "back").await;
}

#[tokio::test]
async fn a_block_stops_messages_both_ways_new_directs_and_invitations_until_lifted() {
    let app = spawn_app().await;
    let (alice, mallory) = (app.user(10), app.user(30));
    let direct = mallory.open_direct(10).await;
    let first = mallory.send_message(direct, "hello").await;
    let group = mallory.create_group(&[40]).await;

    assert_eq!(alice.post("/v1/blocks/30", json!({})).await.status, 204);
    assert_eq!(
        alice.post("/v1/blocks/30", json!({})).await.status,
        204,
        "again"
    );
    let list = alice.get("/v1/blocks").await.expect(200);
    assert_eq!(list["blocked"][0]["userId"], 30, "{list}");
    assert_eq!(list["blocked"].as_array().unwrap().len(), 1);
    let own = alice.post("/v1/blocks/10", json!({})).await.problem(400);
    assert_eq!(own["field"], "userId");

    // In their DIRECT nobody writes, either way; nothing reaches the database.
    let path = format!("/v1/conversations/{direct}/messages");
    let events = "SELECT count(*) FROM outbox WHERE type IN ('message.new', 'message.edited')";
    let events_before = app.count(events).await;
    let problem = blocked(mallory.post(&path, send("still me")).await);
    assert!(
        !problem["detail"].as_str().unwrap().contains("30"),
        "{problem}"
    );
    blocked(alice.post(&path, send("go away")).await);
    blocked(
        mallory
            .patch(&format!("{path}/{first}"), json!({"body": "edited"}))
            .await,
    );
    assert_eq!(messages_in(&app, direct).await, 1);
    assert_eq!(app.count(events).await, events_before);
    // Reading and deleting what one wrote stay possible.
    alice.get(&path).await.expect(200);
    assert_eq!(mallory.delete(&format!("{path}/{first}")).await.status, 204);

    // No new DIRECT from the blocked user; the blocker may open one, and still nobody
    // writes in it.
    app.user(50).post("/v1/blocks/30", json!({})).await;
    blocked(mallory.post("/v1/direct", json!({"peerId": 50})).await);
    let pairs = "SELECT count(*) FROM direct_pair WHERE 50 IN (user_low, user_high)";
    assert_eq!(app.count(pairs).await, 0);
    let opened = app.user(50).open_direct(30).await;
    blocked(
        mallory
            .post(&format!("/v1/conversations/{opened}/messages"), send("hi"))
            .await,
    );

    // No invitations from the blocked user: all or nothing, the refusing users named.
    let refused = blocked(
        mallory
            .post(
                "/v1/conversations",
                json!({"type": "GROUP", "memberIds": [10, 40]}),
            )
            .await,
    );
    assert!(
        refused["detail"].as_str().unwrap().contains("10"),
        "{refused}"
    );
    let created = "SELECT count(*) FROM conversation WHERE created_by = 30 AND type = 'GROUP'";
    assert_eq!(app.count(created).await, 1);
    blocked(
        mallory
            .post(
                &format!("/v1/conversations/{group}/members"),
                json!({"userIds": [10, 60]}),
            )
            .await,
    );
    assert_eq!(members_of(&app, group).await, vec![30, 40]);
    // Others are still added, by the blocked user too.
    mallory
        .post(
            &format!("/v1/conversations/{group}/members"),
            json!({"userIds": [60]}),
        )
        .await
        .expect(200);

    // Lifted: they write again.
    assert_eq!(alice.delete("/v1/blocks/30").await.status, 204);
    assert_eq!(alice.delete("/v1/blocks/30").await.status, 204, "again");
    assert_eq!(
        alice.get("/v1/blocks").await.expect(200)["blocked"],
        json!([])
    );
    mallory.send_message(direct, "sorry").await;
    assert_eq!(messages_in(&app, direct).await, 2);
}

#[tokio::test]
async fn one_user_adding_others_past_members_added_is_429_and_adds_nobody() {
    let app = spawn_app_with(|s| {
        s.rate_limits.members_added = Bucket {
            rate: 1,
            per_secs: 60,
            burst: 10,
        };
        s.rate_limits.creates = Bucket::OFF;
        s.rate_limits.member_changes = Bucket::OFF;
    })
    .await;
    let creator = app.user(10);
    // A group of six others and four more: ten tokens, the burst.
    let group = creator.create_group(&[21, 22, 23, 24, 25, 26]).await;
    let members = format!("/v1/conversations/{group}/members");
    creator
        .post(&members, json!({"userIds": [27, 28, 29, 30]}))
        .await
        .expect(200);

    let over = creator.post(&members, json!({"userIds": [31]})).await;
    let retry_after: u64 = over.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    assert_eq!(over.problem(429)["type"], "/problems/rate-limited");
    let again = creator
        .post(
            "/v1/conversations",
            json!({"type": "GROUP", "memberIds": [32]}),
        )
        .await;
    assert_eq!(again.problem(429)["type"], "/problems/rate-limited");
    // A group of the creator alone adds nobody and is still made.
    creator.create_group(&[]).await;
    assert_eq!(members_of(&app, group).await.len(), 11);
    let groups = "SELECT count(*) FROM conversation WHERE created_by = 10";
    assert_eq!(app.count(groups).await, 2);

    // Another user has their own bucket; more than its burst in one call can never
    // pass: 422, not a wait.
    let other = app.user(11).create_group(&[41, 42]).await;
    let eleven: Vec<i64> = (100..111).collect();
    let too_many = app
        .user(11)
        .post(
            &format!("/v1/conversations/{other}/members"),
            json!({"userIds": eleven}),
        )
        .await;
    assert_eq!(too_many.problem(422)["field"], "userIds");
    assert_eq!(members_of(&app, other).await, vec![11, 41, 42]);
}
