//! Membership before locks: a non-member's send, edit, delete or membership change is
//! refused (404) before it queues, takes the conversation's row lock or its delete lock,
//! as PostgreSQL's own statement counts show; the members' sends go on meanwhile.

use chatpipe_tests::{spawn_app_with, TestApp};
use futures::{stream, StreamExt};
use ingest_api::configuration::Bucket;
use serde_json::json;

/// The statements only a member's write runs: the send statement, the conversation's
/// row lock (edits, deletes, membership changes) and the delete lock.
const LOCKING: [&str; 3] = [
    "chat_send_many",
    "FROM conversation c WHERE c.id = $1 FOR UPDATE",
    "pg_advisory_xact_lock",
];

async fn locking_calls(app: &TestApp) -> Vec<i64> {
    let mut calls = Vec::new();
    for fragment in LOCKING {
        calls.push(app.statement_calls(fragment).await);
    }
    calls
}

/// Three accounts, 100 requests each of every kind, at a conversation they are not in.
async fn flood(app: &TestApp, conv: i64) -> Vec<u16> {
    let base = format!("/v1/conversations/{conv}");
    stream::iter((0..300).map(|i| (30 + i % 3, i)))
        .map(|(user, i)| {
            let base = &base;
            async move {
                let who = app.user(user);
                match i % 5 {
                    0 | 1 => {
                        who.post(
                            &format!("{base}/messages"),
                            json!({"clientMsgId": uuid::Uuid::new_v4(), "body": "let me in"}),
                        )
                        .await
                    }
                    2 => {
                        who.patch(&format!("{base}/messages/1"), json!({"body": "mine now"}))
                            .await
                    }
                    3 => who.delete(&format!("{base}/messages/1")).await,
                    _ => {
                        who.post(&format!("{base}/members"), json!({"userIds": [user]}))
                            .await
                    }
                }
                .status
            }
        })
        .buffer_unordered(32)
        .collect()
        .await
}

#[tokio::test]
async fn a_non_member_flood_takes_no_lock_and_members_keep_sending() {
    let app = spawn_app_with(|s| {
        let plenty = Bucket::OFF;
        s.rate_limits.sends = plenty;
        s.rate_limits.member_changes = plenty;
    })
    .await;
    let (alice, bob) = (10, 20);
    let conv = app.user(alice).create_group(&[bob]).await;
    app.user(alice).send_message(conv, "first").await;

    // The flood alone: every request 404, and not one locking statement ran.
    let before = locking_calls(&app).await;
    let answers = flood(&app, conv).await;
    assert!(answers.iter().all(|&s| s == 404), "{answers:?}");
    assert_eq!(
        locking_calls(&app).await,
        before,
        "statements {LOCKING:?} ran for non-members"
    );

    // Again, with the members sending meanwhile: each of theirs is 201, in order.
    let members = async {
        let mut seqs = Vec::new();
        for i in 0..20 {
            let who = if i % 2 == 0 { alice } else { bob };
            seqs.push(app.user(who).send_message(conv, "still here").await);
        }
        seqs
    };
    let (answers, seqs) = tokio::join!(flood(&app, conv), members);
    assert!(answers.iter().all(|&s| s == 404), "{answers:?}");
    assert_eq!(seqs, (2..=21).collect::<Vec<i64>>());
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM message WHERE conversation_id = {conv} AND body = 'let me in'"
        ))
        .await,
        0
    );
}

/// A member removed is refused at once by the process that removed them (the gate
/// forgets them), and their send writes nothing.
#[tokio::test]
async fn a_removed_member_is_refused_at_once() {
    let app = spawn_app_with(|_| {}).await;
    let (alice, bob) = (10, 20);
    let conv = app.user(alice).create_group(&[bob]).await;
    app.user(bob).send_message(conv, "hi").await;
    assert_eq!(
        app.user(bob)
            .delete(&format!("/v1/conversations/{conv}/members/{bob}"))
            .await
            .status,
        204
    );
    let res = app
        .user(bob)
        .post(
            &format!("/v1/conversations/{conv}/messages"),
            json!({"clientMsgId": uuid::Uuid::new_v4(), "body": "after leaving"}),
        )
        .await;
    res.problem(404);
}
