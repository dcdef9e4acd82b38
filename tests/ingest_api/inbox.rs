use std::collections::BTreeSet;

use chatpipe_tests::spawn_app;
use serde_json::json;

#[tokio::test]
async fn the_inbox_lists_newest_activity_first_with_unread_counts_and_previews() {
    let app = spawn_app().await;
    let me = app.user(10);
    let group = me.create_group(&[20, 30]).await;
    let direct = app
        .user(40)
        .post("/v1/direct", json!({"peerId": 10}))
        .await
        .expect(201)["conversationId"]
        .as_i64()
        .unwrap();
    let quiet = me.create_group(&[50]).await;

    app.user(20).send_message(group, "first").await;
    app.user(40).send_message(direct, &"x".repeat(500)).await;
    app.user(30).send_message(group, "latest news").await;

    let inbox = me.get("/v1/inbox").await.expect(200);
    let rows = inbox["conversations"].as_array().unwrap();
    let order: Vec<i64> = rows
        .iter()
        .map(|r| r["conversationId"].as_i64().unwrap())
        .collect();
    assert_eq!(order, vec![group, direct, quiet], "newest activity first");

    assert_eq!(rows[0]["unreadCount"], 2);
    assert_eq!(rows[0]["lastSeq"], 2);
    assert_eq!(rows[0]["lastReadSeq"], 0);
    assert_eq!(rows[0]["memberCount"], 3);
    assert_eq!(rows[0]["lastMessage"]["preview"], "latest news");
    assert_eq!(rows[0]["lastMessage"]["senderId"], 30);
    assert!(rows[0].get("peerId").is_none());

    assert_eq!(rows[1]["type"], "DIRECT");
    assert_eq!(rows[1]["peerId"], 40);
    assert_eq!(
        rows[1]["lastMessage"]["preview"]
            .as_str()
            .unwrap()
            .chars()
            .count(),
        120
    );

    assert_eq!(rows[2]["unreadCount"], 0);
    assert!(rows[2].get("lastMessage").is_none());
    assert!(inbox["nextCursor"].is_null());
}

#[tokio::test]
async fn the_inbox_pages_with_a_keyset_cursor_without_repeats_or_gaps() {
    let app = spawn_app().await;
    let me = app.user(10);
    let mut all = BTreeSet::new();
    for _ in 0..23 {
        all.insert(me.create_group(&[20]).await);
    }

    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/inbox?limit=5&cursor={c}"),
            None => "/v1/inbox?limit=5".to_owned(),
        };
        let page = me.get(&path).await.expect(200);
        let rows = page["conversations"].as_array().unwrap();
        assert!(rows.len() <= 5);
        seen.extend(rows.iter().map(|r| r["conversationId"].as_i64().unwrap()));
        match page["nextCursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen.len(), 23, "no repeats");
    assert_eq!(
        seen.iter().copied().collect::<BTreeSet<_>>(),
        all,
        "no gaps"
    );
    let mut sorted = seen.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    assert_eq!(
        seen, sorted,
        "same creation order as activity order here: newest first"
    );
}

#[tokio::test]
async fn the_inbox_shows_only_the_callers_conversations() {
    let app = spawn_app().await;
    app.user(10).create_group(&[20]).await;
    let inbox = app.user(30).get("/v1/inbox").await.expect(200);
    assert_eq!(inbox["conversations"], json!([]));
}
