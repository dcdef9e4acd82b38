//! Deleting a message: who may, what is erased, and unread counts that stay exact (the
//! messages after the watermark that are not deleted) through deletes on either side
//! of the watermark, joins, sends and reads racing deletes.

use chatpipe_core::{ConversationId, Seq, UserId};
use chatpipe_schemas::ChatEvent;
use chatpipe_tests::{spawn_app, TestApp};
use futures::future::join_all;
use serde_json::json;

fn message_path(conv: i64, seq: i64) -> String {
    format!("/v1/conversations/{conv}/messages/{seq}")
}

/// The same counted the slow way: the messages after the watermark that are not deleted.
async fn counted(app: &TestApp, user: i64, conv: i64) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM message g JOIN conversation_member m
             ON m.conversation_id = g.conversation_id AND m.user_id = $2
          WHERE g.conversation_id = $1 AND g.seq > m.last_read_seq AND g.deleted_at IS NULL",
    )
    .bind(conv)
    .bind(user)
    .fetch_one(&app.pool)
    .await
    .unwrap()
}

/// Asserts the inbox's unread count equals the counted one for each user; returns them.
async fn exact(app: &TestApp, conv: i64, users: &[i64]) -> Vec<i64> {
    let mut out = Vec::new();
    for &user in users {
        let (fast, slow) = (
            app.user(user).unread_count(conv).await,
            counted(app, user, conv).await,
        );
        assert_eq!(
            fast, slow,
            "user {user}: inbox says {fast}, counting says {slow}"
        );
        out.push(fast);
    }
    out
}

#[tokio::test]
async fn the_sender_or_a_group_admin_deletes_others_are_refused_and_the_body_is_erased() {
    let app = spawn_app().await;
    let (alice, bob, carol, stranger) = (10, 20, 30, 99);
    let conv = app.user(alice).create_group(&[bob, carol]).await;
    let by_alice = app.user(alice).send_message(conv, "alice's words").await;
    let client_msg_id = uuid::Uuid::new_v4();
    let by_bob = app
        .user(bob)
        .post(
            &format!("/v1/conversations/{conv}/messages"),
            json!({"clientMsgId": client_msg_id, "body": "bob's secret"}),
        )
        .await
        .expect(201)["seq"]
        .as_i64()
        .unwrap();
    let by_carol = app.user(carol).send_message(conv, "carol's words").await;

    // Another (non-admin) member: 403. A stranger, an unknown seq or conversation: 404.
    app.user(bob)
        .delete(&message_path(conv, by_alice))
        .await
        .problem(403);
    app.user(stranger)
        .delete(&message_path(conv, by_bob))
        .await
        .problem(404);
    app.user(bob)
        .delete(&message_path(conv, 99))
        .await
        .problem(404);
    app.user(bob)
        .delete(&message_path(conv + 1000, by_bob))
        .await
        .problem(404);
    app.user(bob)
        .delete(&format!("/v1/conversations/{conv}/messages/0"))
        .await
        .problem(400);

    // The sender: 204, and 204 again. The group's admin deletes someone else's.
    for _ in 0..2 {
        let r = app.user(bob).delete(&message_path(conv, by_bob)).await;
        assert_eq!(r.status, 204, "{}", r.body);
    }
    let r = app.user(alice).delete(&message_path(conv, by_carol)).await;
    assert_eq!(r.status, 204, "{}", r.body);

    // A deleted message cannot be edited; a retry of its send is still a replay.
    let problem = app
        .user(bob)
        .patch(&message_path(conv, by_bob), json!({"body": "back"}))
        .await
        .problem(409);
    assert!(problem["type"]
        .as_str()
        .unwrap()
        .ends_with("message-deleted"));
    let replay = app
        .user(bob)
        .post(
            &format!("/v1/conversations/{conv}/messages"),
            json!({"clientMsgId": client_msg_id, "body": "bob's secret"}),
        )
        .await
        .expect(200);
    assert_eq!(replay["seq"], by_bob);

    // History: the deleted ones in place, without a body.
    let history = app
        .user(carol)
        .get(&format!("/v1/conversations/{conv}/messages"))
        .await
        .expect(200);
    let messages = history["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3);
    assert_eq!(messages[0]["body"], "alice's words");
    assert!(messages[0].get("deleted").is_none());
    for m in &messages[1..] {
        assert_eq!(m["deleted"], true, "{m}");
        assert!(m.get("body").is_none(), "{m}");
        assert!(m["deletedAt"].is_string(), "{m}");
        assert!(
            m["senderId"].is_i64() && m["clientMsgId"].is_string(),
            "{m}"
        );
    }
    assert_eq!(history["lastSeq"], by_carol, "a delete frees no seq");

    // Erased in the table, not hidden.
    assert_eq!(
        app.count("SELECT count(*) FROM message WHERE body LIKE '%secret%' OR body LIKE 'carol%'")
            .await,
        0
    );
    assert_eq!(
        app.count("SELECT count(*) FROM message WHERE body IS NULL AND deleted_at IS NOT NULL")
            .await,
        2
    );

    // The inbox's last message says it is deleted and previews nothing.
    let inbox = app.user(alice).get("/v1/inbox").await.expect(200);
    let last = &inbox["conversations"][0]["lastMessage"];
    assert_eq!(last["seq"], by_carol);
    assert_eq!(last["deleted"], true);
    assert!(last.get("preview").is_none(), "{last}");

    // One event per delete that happened, with no body; the repeat wrote none.
    let deletes: Vec<_> = app
        .outbox_events()
        .await
        .into_iter()
        .filter_map(|e| match e {
            ChatEvent::MessageDeleted(d) => {
                Some((d.seq.get(), d.sender_id.get(), d.deleted_by.get()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(deletes, vec![(by_bob, bob, bob), (by_carol, carol, alice)]);
}

#[tokio::test]
async fn in_a_direct_conversation_only_the_sender_deletes() {
    let app = spawn_app().await;
    let conv = app.user(10).open_direct(20).await;
    let seq = app.user(10).send_message(conv, "mine").await;
    app.user(20)
        .delete(&message_path(conv, seq))
        .await
        .problem(403);
    assert_eq!(
        app.user(10).delete(&message_path(conv, seq)).await.status,
        204
    );
}

#[tokio::test]
async fn unread_counts_skip_deleted_messages_before_and_after_the_watermark() {
    let app = spawn_app().await;
    let (alice, bob, carol) = (10, 20, 30);
    let conv = app.user(alice).create_group(&[bob]).await;
    for i in 1..=10 {
        app.user(alice).send_message(conv, &format!("m{i}")).await;
    }
    let delete = |seq: i64| {
        let app = &app;
        async move {
            let r = app.user(alice).delete(&message_path(conv, seq)).await;
            assert_eq!(r.status, 204, "{}", r.body);
        }
    };
    assert_eq!(exact(&app, conv, &[alice, bob]).await, vec![0, 10]);
    app.user(bob).mark_read(conv, 4).await;
    assert_eq!(exact(&app, conv, &[bob]).await, vec![6]);

    // Before bob's watermark: his count does not move. After it: one less each.
    delete(2).await;
    assert_eq!(exact(&app, conv, &[bob]).await, vec![6]);
    delete(7).await;
    delete(9).await;
    assert_eq!(exact(&app, conv, &[alice, bob]).await, vec![0, 4]);

    // Reading across deleted seqs; reading up to one of them.
    app.user(bob).mark_read(conv, 8).await;
    assert_eq!(exact(&app, conv, &[bob]).await, vec![1]);
    app.user(bob).mark_read(conv, 9).await;
    assert_eq!(exact(&app, conv, &[bob]).await, vec![1]);

    // A joiner starts past every deleted seq; a new message counts for the others.
    app.user(alice)
        .post(
            &format!("/v1/conversations/{conv}/members"),
            json!({"userIds": [carol]}),
        )
        .await
        .expect(200);
    let eleven = app.user(alice).send_message(conv, "m11").await;
    assert_eq!(exact(&app, conv, &[alice, bob, carol]).await, vec![0, 2, 1]);
    delete(eleven).await;
    assert_eq!(exact(&app, conv, &[alice, bob, carol]).await, vec![0, 1, 0]);

    // A send moves the sender's watermark over the deleted seqs too.
    delete(10).await;
    app.user(bob).send_message(conv, "m12").await;
    assert_eq!(exact(&app, conv, &[alice, bob, carol]).await, vec![1, 0, 1]);
    let (deleted_count,): (i64,) =
        sqlx::query_as("SELECT deleted_count FROM conversation WHERE id = $1")
            .bind(conv)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(deleted_count, 5);
}

/// Deletes race watermark moves on both read paths: ingest-api's direct mode (one
/// `chat_mark_read` per request) and the receipts processor's flush
/// (`watermark::advance` over a batch, here in transactions of its own). However they
/// interleave, every member's count is exact afterwards.
#[tokio::test]
async fn deletes_racing_reads_leave_every_count_exact() {
    let app = spawn_app().await;
    let (alice, bob, carol) = (10, 20, 30);
    let conv = app.user(alice).create_group(&[bob, carol]).await;
    let total = 120;
    let bodies: Vec<String> = (1..=total).map(|i| format!("m{i}")).collect();
    for body in &bodies {
        app.user(alice).send_message(conv, body).await;
    }

    let deletes = (1..=total).filter(|s| s % 3 == 1).map(|seq| {
        let app = &app;
        async move {
            let r = app.user(alice).delete(&message_path(conv, seq)).await;
            assert_eq!(r.status, 204, "{}", r.body);
        }
    });
    let direct_reads = (1..=total).step_by(2).map(|seq| {
        let app = &app;
        async move {
            app.user(bob).mark_read(conv, seq).await;
        }
    });
    let flushes = (1..=total).step_by(3).map(|seq| {
        let app = &app;
        async move {
            let mut tx = app.pool.begin().await.unwrap();
            let marks = [((ConversationId::of(conv), UserId::of(carol)), Seq::of(seq))];
            chatpipe_core::watermark::advance(&mut tx, &marks)
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
    });
    tokio::join!(join_all(deletes), join_all(direct_reads), join_all(flushes));
    let counts = exact(&app, conv, &[alice, bob, carol]).await;
    assert_eq!(counts[0], 0);
    // Bob read to 119 and carol to 118 (the last of each series); the rest depends on
    // the interleaving only through what `exact` compared.
    assert_eq!(counts[1], 1);
    assert_eq!(counts[2], 2, "carol: 119 and 120 left, neither deleted");
}

/// The race made certain: a delete is held just before its commit (the test locks the
/// outbox against its insert) while a direct-mode read and a flush move watermarks over
/// its seq. They must wait for it and count it; without the delete lock they would
/// count the deleted seqs as they were before it, and the member's unread count would
/// stay one too low for good (it read -1 here before the lock existed).
#[tokio::test]
async fn a_read_waits_for_a_delete_in_flight_and_counts_it() {
    let app = spawn_app().await;
    let (alice, bob, carol) = (10, 20, 30);
    let conv = app.user(alice).create_group(&[bob, carol]).await;
    for i in 1..=10 {
        app.user(alice).send_message(conv, &format!("m{i}")).await;
    }
    app.user(bob).mark_read(conv, 3).await;

    let mut holder = app.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE outbox IN SHARE MODE")
        .execute(&mut *holder)
        .await
        .unwrap();
    let delete = async {
        let r = app.user(alice).delete(&message_path(conv, 5)).await;
        assert_eq!(r.status, 204, "{}", r.body);
    };
    let reads = async {
        until_sessions_wait(&app, 1).await;
        let flushed = std::sync::atomic::AtomicBool::new(false);
        let direct = async { app.user(bob).mark_read(conv, 10).await };
        let flush = async {
            let mut tx = app.pool.begin().await.unwrap();
            let marks = [((ConversationId::of(conv), UserId::of(carol)), Seq::of(10))];
            chatpipe_core::watermark::advance(&mut tx, &marks)
                .await
                .unwrap();
            tx.commit().await.unwrap();
            flushed.store(true, std::sync::atomic::Ordering::SeqCst);
        };
        let release = async {
            // Both reads wait (for the delete lock) before the delete may finish; a
            // flush that did not wait has already miscounted.
            tokio::select! {
                _ = until_sessions_wait(&app, 3) => {}
                _ = async {
                    while !flushed.load(std::sync::atomic::Ordering::SeqCst) {
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    }
                } => {}
            }
            holder.commit().await.unwrap();
        };
        tokio::join!(direct, flush, release);
    };
    tokio::join!(delete, reads);
    assert_eq!(exact(&app, conv, &[alice, bob, carol]).await, vec![0, 0, 0]);
}

/// Waits until `n` sessions of the test's database wait for a lock; fails at 20 s.
async fn until_sessions_wait(app: &TestApp, n: i64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(&app.pool)
        .await
        .unwrap();
        if waiting >= n {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{waiting} of {n} sessions wait for a lock"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
