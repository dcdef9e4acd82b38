use chatpipe_tests::spawn_app;
use futures::future::join_all;
use serde_json::json;

/// The original design's second test, over HTTP.
#[tokio::test]
async fn the_watermark_never_moves_backwards_clamps_to_last_seq_and_the_sender_has_read() {
    let app = spawn_app().await;
    let sender = app.user(10);
    let reader = app.user(20);
    let conv = sender.create_group(&[20]).await;
    for i in 0..5 {
        sender.send_message(conv, &format!("Nachricht {i}")).await;
    }

    assert_eq!(
        reader.mark_read(conv, 4).await,
        json!({"lastReadSeq": 4, "advanced": true})
    );
    assert_eq!(
        reader.mark_read(conv, 2).await,
        json!({"lastReadSeq": 4, "advanced": false}),
        "a late request"
    );
    assert_eq!(
        reader.mark_read(conv, 99).await,
        json!({"lastReadSeq": 5, "advanced": true}),
        "clamped"
    );

    let app = &app;
    let unread = |user: i64| async move {
        let inbox = app.user(user).get("/v1/inbox").await.expect(200);
        inbox["conversations"][0]["unreadCount"].as_i64().unwrap()
    };
    assert_eq!(unread(20).await, 0);
    assert_eq!(unread(10).await, 0, "the sender has read its own message");
    assert_eq!(
        app.count("SELECT max(last_read_seq) FROM conversation_member")
            .await,
        5
    );
}

#[tokio::test]
async fn a_read_of_50_from_a_phone_then_45_from_a_laptop_keeps_50() {
    let app = spawn_app().await;
    let conv = app.user(10).create_group(&[20]).await;
    for i in 0..60 {
        app.user(10).send_message(conv, &format!("m{i}")).await;
    }
    let phone = app.user(20);
    let laptop = app.user(20);
    phone.mark_read(conv, 50).await;
    let late = laptop.mark_read(conv, 45).await;
    assert_eq!(late, json!({"lastReadSeq": 50, "advanced": false}));

    let inbox = app.user(20).get("/v1/inbox").await.expect(200);
    assert_eq!(inbox["conversations"][0]["lastReadSeq"], 50);
    assert_eq!(inbox["conversations"][0]["unreadCount"], 10);
}

#[tokio::test]
async fn read_updated_is_written_only_when_the_watermark_advances() {
    let app = spawn_app().await;
    let conv = app.user(10).create_group(&[20]).await;
    for _ in 0..3 {
        app.user(10).send_message(conv, "x").await;
    }
    let reader = app.user(20);
    let (calls, begins) = (
        app.statement_calls("chat_mark_read(").await,
        app.statement_calls("BEGIN").await,
    );
    reader.mark_read(conv, 2).await;
    reader.mark_read(conv, 2).await;
    reader.mark_read(conv, 1).await;
    reader.mark_read(conv, 3).await;
    reader.mark_read(conv, 300).await;
    assert_eq!(
        app.statement_calls("chat_mark_read(").await - calls,
        5,
        "one statement per read"
    );
    assert_eq!(
        app.statement_calls("BEGIN").await - begins,
        0,
        "and no transaction around it"
    );

    // The events decode to where each watermark landed (spliced in by the statement).
    let seqs: Vec<i64> = app
        .outbox_events()
        .await
        .into_iter()
        .filter_map(|e| match e {
            chatpipe_schemas::ChatEvent::ReadUpdated(e) => Some(e.last_read_seq.get()),
            _ => None,
        })
        .collect();
    assert_eq!(seqs, vec![2, 3]);
}

#[tokio::test]
async fn concurrent_reads_of_one_member_end_at_the_highest() {
    let app = spawn_app().await;
    let conv = app.user(10).create_group(&[20]).await;
    for _ in 0..40 {
        app.user(10).send_message(conv, "x").await;
    }
    let reader = app.user(20);
    let path = format!("/v1/conversations/{conv}/read");
    let responses = join_all(
        (1..=40)
            .rev()
            .map(|seq| reader.post(&path, json!({"seq": seq}))),
    )
    .await;
    assert!(responses.iter().all(|r| r.status == 200));
    let watermark: i64 = sqlx::query_scalar(
        "SELECT last_read_seq FROM conversation_member WHERE conversation_id = $1 AND user_id = 20",
    )
    .bind(conv)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(watermark, 40);
    // Each advance wrote one event, each higher than the one before.
    let advanced = responses
        .iter()
        .filter(|r| r.body["advanced"] == true)
        .count() as i64;
    assert_eq!(
        app.count("SELECT count(*) FROM outbox WHERE type = 'read.updated'")
            .await,
        advanced
    );
}

#[tokio::test]
async fn read_by_counts_members_at_or_past_a_seq_in_a_thousand_member_group() {
    let app = spawn_app().await;
    let app = &app;
    let owner = app.user(1);
    let members: Vec<i64> = (2..=1000).collect();
    let conv = owner.create_group(&members).await;
    for i in 1..=10 {
        owner.send_message(conv, &format!("announcement {i}")).await;
    }
    // Member k reads up to seq (k % 11): a spread over 0..=10.
    let readers: Vec<i64> = (2..=1000i64).filter(|k| k % 11 != 0).collect();
    for chunk in readers.chunks(100) {
        join_all(
            chunk
                .iter()
                .map(|&k| async move { app.user(k).mark_read(conv, k % 11).await }),
        )
        .await;
    }

    for seq in 1..=10i64 {
        let expected = (2..=1000i64).filter(|k| k % 11 >= seq).count() as i64;
        let receipts = app
            .user(500)
            .get(&format!("/v1/conversations/{conv}/messages/{seq}/receipts"))
            .await
            .expect(200);
        assert_eq!(receipts["readBy"], expected, "seq {seq}");
        assert_eq!(receipts["memberCount"], 1000);
    }
    assert_eq!(
        app.count(
            "SELECT count(*) FROM information_schema.tables WHERE table_name LIKE '%receipt%'"
        )
        .await,
        0
    );
}

#[tokio::test]
async fn a_direct_chat_shows_read_once_the_peer_has_read() {
    let app = spawn_app().await;
    let alice = app.user(10);
    let bob = app.user(20);
    let conv = alice
        .post("/v1/direct", json!({"peerId": 20}))
        .await
        .expect(201)["conversationId"]
        .as_i64()
        .unwrap();
    let seq = alice.send_message(conv, "are you there?").await;
    let path = format!("/v1/conversations/{conv}/messages/{seq}/receipts");

    assert_eq!(
        alice.get(&path).await.expect(200)["read"],
        false,
        "the sender's own read does not count"
    );
    bob.mark_read(conv, seq).await;
    assert_eq!(
        alice.get(&path).await.expect(200),
        json!({"conversationId": conv, "seq": seq, "read": true, "delivered": true}),
        "reading implies delivery"
    );
    // A seq past the end names no message.
    alice
        .get(&format!(
            "/v1/conversations/{conv}/messages/{}/receipts",
            seq + 1
        ))
        .await
        .problem(404);
}
