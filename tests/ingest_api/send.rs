use std::collections::BTreeSet;

use chatpipe_schemas::ChatEvent;
use chatpipe_tests::{spawn_app, spawn_app_with};
use futures::future::join_all;
use serde_json::json;
use uuid::Uuid;

/// The original design's first test, over HTTP.
#[tokio::test]
async fn resending_the_same_client_msg_id_creates_one_message_with_seq_1() {
    let app = spawn_app().await;
    let alice = app.user(10);
    let conv = alice.create_group(&[20]).await;
    let msg = json!({"clientMsgId": Uuid::new_v4(), "body": "Hallo Gruppe"});
    let path = format!("/v1/conversations/{conv}/messages");

    let first = alice.post(&path, msg.clone()).await.expect(201);
    let retry = alice.post(&path, msg).await.expect(200);

    assert_eq!(first["seq"], 1);
    assert_eq!(retry, first, "a replay answers with the original message");
    assert_eq!(app.count("SELECT count(*) FROM message").await, 1);
    assert_eq!(
        app.count("SELECT count(*) FROM outbox WHERE type = 'message.new'")
            .await,
        1
    );
}

#[tokio::test]
async fn the_same_client_msg_id_with_another_body_is_a_conflict_and_writes_nothing() {
    let app = spawn_app().await;
    let alice = app.user(10);
    let conv = alice.create_group(&[20]).await;
    let id = Uuid::new_v4();
    let path = format!("/v1/conversations/{conv}/messages");
    alice
        .post(&path, json!({"clientMsgId": id, "body": "one"}))
        .await
        .expect(201);

    let problem = alice
        .post(&path, json!({"clientMsgId": id, "body": "two"}))
        .await
        .problem(409);
    assert_eq!(problem["type"], "/problems/client-msg-id-reused");
    // Another member reusing the id is a conflict too, not a replay of someone else's message.
    app.user(20)
        .post(&path, json!({"clientMsgId": id, "body": "one"}))
        .await
        .problem(409);

    assert_eq!(app.count("SELECT count(*) FROM message").await, 1);
    assert_eq!(app.count("SELECT last_seq FROM conversation").await, 1);
    // No event either: the outbox holds only the first message's (this app keeps rows).
    let sent: Vec<(i64, i64)> = app
        .outbox_events()
        .await
        .iter()
        .filter_map(|e| match e {
            ChatEvent::MessageNew(m) => Some((m.conversation_id.get(), m.seq.get())),
            _ => None,
        })
        .collect();
    assert_eq!(sent, vec![(conv, 1)], "only the first send wrote an event");
}

#[tokio::test]
async fn sixty_four_concurrent_sends_to_one_conversation_get_seqs_1_to_64() {
    let app = spawn_app().await;
    let conv = app.user(1).create_group(&[2, 3, 4]).await;
    let sends = (0..64).map(|i| {
        let client = app.user(1 + i % 4);
        async move { client.send_message(conv, &format!("message {i}")).await }
    });
    let seqs: BTreeSet<i64> = join_all(sends).await.into_iter().collect();

    assert_eq!(
        seqs,
        (1..=64).collect::<BTreeSet<_>>(),
        "no gap, no duplicate"
    );
    let stored: Vec<i64> =
        sqlx::query_scalar("SELECT seq FROM message WHERE conversation_id = $1 ORDER BY seq")
            .bind(conv)
            .fetch_all(&app.pool)
            .await
            .unwrap();
    assert_eq!(stored, (1..=64).collect::<Vec<_>>());
    assert_eq!(app.count("SELECT last_seq FROM conversation").await, 64);
    // Each committed message wrote exactly one outbox event.
    assert_eq!(
        app.count("SELECT count(*) FROM outbox WHERE type = 'message.new'")
            .await,
        64
    );
}

#[tokio::test]
async fn thirty_two_concurrent_retries_of_one_client_msg_id_make_one_message() {
    let app = spawn_app().await;
    let alice = app.user(10);
    let conv = alice.create_group(&[20]).await;
    alice.send_message(conv, "before").await;
    let msg = json!({"clientMsgId": Uuid::new_v4(), "body": "flaky network"});
    let path = format!("/v1/conversations/{conv}/messages");

    let responses = join_all((0..32).map(|_| alice.post(&path, msg.clone()))).await;

    let created = responses.iter().filter(|r| r.status == 201).count();
    let replayed = responses.iter().filter(|r| r.status == 200).count();
    assert_eq!((created, replayed), (1, 31));
    assert!(
        responses.iter().all(|r| r.body["seq"] == 2),
        "every response names seq 2"
    );
    assert_eq!(app.count("SELECT count(*) FROM message").await, 2);
    assert_eq!(
        app.count("SELECT count(*) FROM outbox WHERE type = 'message.new'")
            .await,
        2
    );
}

#[tokio::test]
async fn sends_to_a_hundred_conversations_in_parallel_all_succeed() {
    // 300 sends at once are 300 connections from one address: past the share of one
    // client (http.max_connections_per_ip, 256), which tests/ingest_api/limits.rs tests.
    let app = spawn_app_with(|s| s.http.max_connections_per_ip = 1024).await;
    let alice = app.user(10);
    let mut conversations = Vec::new();
    for peer in 100..200 {
        let body = alice
            .post("/v1/direct", json!({"peerId": peer}))
            .await
            .expect(201);
        conversations.push(body["conversationId"].as_i64().unwrap());
    }

    let sends = conversations.iter().flat_map(|&c| {
        let alice = alice.clone();
        (0..3).map(move |i| {
            let alice = alice.clone();
            async move { (c, alice.send_message(c, &format!("hi {i}")).await) }
        })
    });
    let results = join_all(sends).await;

    assert_eq!(results.len(), 300);
    for &c in &conversations {
        let seqs: BTreeSet<i64> = results
            .iter()
            .filter(|(conv, _)| *conv == c)
            .map(|(_, s)| *s)
            .collect();
        assert_eq!(seqs, BTreeSet::from([1, 2, 3]), "conversation {c}");
    }
    assert_eq!(app.count("SELECT count(*) FROM message").await, 300);
}

#[tokio::test]
async fn a_sent_message_answers_with_its_seq_and_is_in_the_history() {
    let app = spawn_app().await;
    let alice = app.user(10);
    let conv = alice.create_group(&[20]).await;
    let id = Uuid::new_v4();
    let sent = alice
        .post(
            &format!("/v1/conversations/{conv}/messages"),
            json!({"clientMsgId": id, "body": "grüß dich 👋"}),
        )
        .await
        .expect(201);
    assert_eq!(sent["conversationId"], conv);
    assert_eq!(sent["seq"], 1);
    assert_eq!(sent["clientMsgId"], id.to_string());
    assert_eq!(sent["senderId"], 10);

    let history = app
        .user(20)
        .get(&format!("/v1/conversations/{conv}/messages"))
        .await
        .expect(200);
    let m = &history["messages"][0];
    assert_eq!(m["body"], "grüß dich 👋");
    assert_eq!(m["createdAt"], sent["createdAt"]);
    assert_eq!(history["hasMore"], false);
}

#[tokio::test]
async fn history_pages_backwards_and_fills_gaps_forwards() {
    let app = spawn_app().await;
    let alice = app.user(10);
    let conv = alice.create_group(&[]).await;
    for i in 1..=12 {
        alice.send_message(conv, &format!("m{i}")).await;
    }
    let seqs = |v: &serde_json::Value| -> Vec<i64> {
        v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["seq"].as_i64().unwrap())
            .collect()
    };
    let base = format!("/v1/conversations/{conv}/messages");

    let newest = alice.get(&format!("{base}?limit=5")).await.expect(200);
    assert_eq!(seqs(&newest), vec![8, 9, 10, 11, 12]);
    assert_eq!(newest["hasMore"], true);
    assert_eq!(newest["lastSeq"], 12);

    let older = alice
        .get(&format!("{base}?beforeSeq=8&limit=5"))
        .await
        .expect(200);
    assert_eq!(seqs(&older), vec![3, 4, 5, 6, 7]);
    assert_eq!(older["hasMore"], true);
    let oldest = alice
        .get(&format!("{base}?beforeSeq=3&limit=5"))
        .await
        .expect(200);
    assert_eq!(seqs(&oldest), vec![1, 2]);
    assert_eq!(oldest["hasMore"], false);

    let gap = alice
        .get(&format!("{base}?afterSeq=9&limit=2"))
        .await
        .expect(200);
    assert_eq!(seqs(&gap), vec![10, 11]);
    assert_eq!(gap["hasMore"], true);
    let rest = alice.get(&format!("{base}?afterSeq=11")).await.expect(200);
    assert_eq!(seqs(&rest), vec![12]);
    assert_eq!(rest["hasMore"], false);
    let all = alice
        .get(&format!("{base}?afterSeq=0&limit=200"))
        .await
        .expect(200);
    assert_eq!(seqs(&all), (1..=12).collect::<Vec<_>>());
}

#[tokio::test]
async fn the_outbox_event_of_a_send_is_committed_with_the_message() {
    let app = spawn_app().await;
    let alice = app.user(10);
    let conv = alice.create_group(&[20]).await;
    let seq = alice.send_message(conv, "hello").await;

    let (aggregate_id, payload): (String, Vec<u8>) =
        sqlx::query_as("SELECT aggregateid, payload FROM outbox WHERE type = 'message.new'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(aggregate_id, conv.to_string(), "keyed by conversation");
    assert_eq!(payload[0], 0, "Confluent magic byte");
    let schema_id = u32::from_be_bytes(payload[1..5].try_into().unwrap());
    assert_eq!(schema_id, app.codec.schema_id());
    let ChatEvent::MessageNew(event) = app.codec.decode(&payload).expect("outbox payload decodes")
    else {
        panic!("expected message.new");
    };
    assert_eq!(
        (
            event.conversation_id.get(),
            event.seq.get(),
            event.sender_id.get()
        ),
        (conv, seq, 10)
    );
    assert_eq!(event.body, "hello");
}
