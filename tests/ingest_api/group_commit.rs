//! Group commit (issue 12): sends into one conversation that arrive while its previous
//! batch is written go into one statement; each caller still gets its own answer.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use chatpipe_tests::{spawn_app, spawn_app_beside, spawn_app_with, Resp, TestApp};
use futures::future::join_all;
use futures::FutureExt;
use serde_json::json;
use uuid::Uuid;

use crate::bounds::{hold_conversation, release, until_a_send_waits, until_sends_wait};

const SEND: &str = "FROM chat_send_many(";

/// An app whose writer may wait for a lock the test holds on purpose while dozens of
/// sends queue behind it: on a loaded two-core CI machine queueing them took more than
/// the default 5 s statement timeout (CI of 8109360), which answered the blocked send
/// 503 before the test released it. The timeouts are the test's subject nowhere here.
async fn spawn_app_waiting_on_held_locks(
    configure: impl FnOnce(&mut ingest_api::configuration::Settings),
) -> TestApp {
    spawn_app_with(|s| {
        s.database.statement_timeout_ms = 60_000;
        s.http.request_timeout_ms = 60_000;
        configure(s);
    })
    .await
}

/// What the database holds for `conversation`: client id -> (seq, body).
async fn stored(app: &TestApp, conversation: i64) -> HashMap<Uuid, (i64, String)> {
    let rows: Vec<(Uuid, i64, String)> =
        sqlx::query_as("SELECT client_msg_id, seq, body FROM message WHERE conversation_id = $1")
            .bind(conversation)
            .fetch_all(&app.pool)
            .await
            .unwrap();
    rows.into_iter()
        .map(|(id, seq, body)| (id, (seq, body)))
        .collect()
}

#[tokio::test]
async fn sixty_four_sends_at_once_are_one_batch_gapless_with_replays_and_conflicts_answered() {
    let app = spawn_app_waiting_on_held_locks(|_| {}).await;
    let conversation = app.user(10).create_group(&[20]).await;
    let path = format!("/v1/conversations/{conversation}/messages");
    // 64 new messages, 8 repeats of some of them (same body) and 8 reuses of other ids
    // with another body, all at once, while the conversation's lock is held: the first
    // send waits for the lock and everything else queues behind it.
    let ids: Vec<Uuid> = (0..64).map(|_| Uuid::new_v4()).collect();
    let mut sends: Vec<(Uuid, String, i64)> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            (
                *id,
                format!("message {i}"),
                if i % 2 == 0 { 10 } else { 20 },
            )
        })
        .collect();
    for i in 0..8 {
        sends.push((
            ids[i],
            format!("message {i}"),
            if i % 2 == 0 { 10 } else { 20 },
        ));
        sends.push((
            ids[10 + i],
            format!("another body {i}"),
            if i % 2 == 0 { 10 } else { 20 },
        ));
    }
    let statements_before = app.statement_calls(SEND).await;
    let held = hold_conversation(&app, conversation).await;
    let answers = {
        let (app, path) = (&app, &path);
        let calls = join_all(sends.iter().map(|(id, body, user)| async move {
            app.user(*user)
                .post(path, json!({"clientMsgId": id, "body": body}))
                .await
        }));
        let release_when_queued = async {
            until_a_send_waits(app).await;
            release(held).await;
        };
        tokio::join!(calls, release_when_queued).0
    };
    let statements = app.statement_calls(SEND).await - statements_before;
    assert!(
        statements <= 10,
        "{} sends took {statements} send statements: they were not batched",
        sends.len()
    );

    // Per client id: exactly one 201 (whichever came first in the lane), a repeat with
    // the same body 200 with the same seq, another body 409 naming that seq.
    let mut created: HashMap<Uuid, (i64, String)> = HashMap::new();
    for ((id, body, _), res) in sends.iter().zip(&answers) {
        if res.status == 201 {
            let seq = res.body["seq"].as_i64().unwrap();
            assert!(
                created.insert(*id, (seq, body.clone())).is_none(),
                "two 201s for {id}"
            );
        }
    }
    assert_eq!(created.len(), 64, "one 201 per client id");
    for ((id, body, _), res) in sends.iter().zip(&answers) {
        let (seq, first_body) = &created[id];
        match res.status {
            201 => {}
            200 => {
                assert_eq!(body, first_body, "a 200 only for the same body");
                assert_eq!(res.body["seq"], *seq, "a replay answers the original seq");
            }
            409 => {
                assert_ne!(body, first_body, "a 409 only for another body");
                assert_eq!(res.body["type"], "/problems/client-msg-id-reused");
                assert!(res.body["detail"]
                    .as_str()
                    .unwrap()
                    .contains(&format!("message {seq}")));
            }
            other => panic!("unexpected {other}: {}", res.body),
        }
    }
    let seqs: BTreeSet<i64> = created.values().map(|(s, _)| *s).collect();
    assert_eq!(seqs, (1..=64).collect(), "gapless");
    assert_eq!(
        stored(&app, conversation).await,
        created,
        "each answer is what is stored"
    );
    let outbox = app
        .count("SELECT count(*) FROM outbox WHERE type = 'message.new'")
        .await;
    assert_eq!(outbox, 64, "one message.new per created message");
}

/// Group commit across conversations: sends that arrive while every writer is busy go
/// into the next statement together, whichever conversations they are for; each
/// conversation's seqs stay gapless, and a send the statement refuses (a non-member's)
/// does not fail the others.
#[tokio::test]
async fn sends_into_many_conversations_that_wait_for_a_writer_share_one_statement() {
    let app = spawn_app_waiting_on_held_locks(|s| s.sends.max_writers = 1).await;
    let blocker = app.user(10).create_group(&[20]).await;
    let mut targets = Vec::new();
    for _ in 0..20 {
        targets.push(app.user(10).create_group(&[20]).await);
    }
    let foreign = app.user(30).create_group(&[40]).await;

    // The only writer waits for the blocker's lock; everything else waits for it.
    let held = hold_conversation(&app, blocker).await;
    let statements_before = app.statement_calls(SEND).await;
    let blocked = async { app.user(10).send_message(blocker, "first").await };
    let sends: Vec<(i64, i64, Uuid)> = targets
        .iter()
        .flat_map(|c| [(*c, 10, Uuid::new_v4()), (*c, 20, Uuid::new_v4())])
        .chain([(foreign, 10, Uuid::new_v4())])
        .collect();
    let app_ref = &app;
    // The others are sent once the blocker's batch holds the writer (were one of them
    // first, the writer would commit it before taking the blocker's).
    let the_others = async {
        until_a_send_waits(&app).await;
        let calls = join_all(sends.iter().map(|(c, user, id)| async move {
            app_ref
                .user(*user)
                .post(
                    &format!("/v1/conversations/{c}/messages"),
                    json!({"clientMsgId": id, "body": format!("from {user}")}),
                )
                .await
        }));
        let release_when_queued = async {
            // All but the non-member's: that one is refused before it queues
            // (store/members.rs).
            until_sends_wait(&app, sends.len() - 1).await;
            release(held).await;
        };
        tokio::join!(calls, release_when_queued).0
    };
    let (first, answers) = tokio::join!(blocked, the_others);
    assert_eq!(first, 1);
    assert_eq!(
        app.statement_calls(SEND).await - statements_before,
        2,
        "the blocker's statement, then one for all {} waiting sends",
        sends.len()
    );

    let mut answered: HashMap<i64, HashMap<Uuid, (i64, String)>> = HashMap::new();
    for ((c, user, id), res) in sends.iter().zip(answers) {
        if *c == foreign {
            let problem = res.problem(404);
            assert_eq!(problem["type"], "/problems/not-found", "{problem}");
            continue;
        }
        let body = res.expect(201);
        assert_eq!(body["conversationId"], *c);
        answered
            .entry(*c)
            .or_default()
            .insert(*id, (body["seq"].as_i64().unwrap(), format!("from {user}")));
    }
    for c in &targets {
        let seqs: BTreeSet<i64> = answered[c].values().map(|(s, _)| *s).collect();
        assert_eq!(seqs, BTreeSet::from([1, 2]), "conversation {c} gapless");
        assert_eq!(
            stored(&app, *c).await,
            answered[c],
            "conversation {c} as answered"
        );
    }
    assert_eq!(stored(&app, foreign).await, HashMap::new());
    let events = app
        .count("SELECT count(*) FROM outbox WHERE type = 'message.new'")
        .await;
    assert_eq!(events, 41, "one message.new per created message");
}

#[tokio::test]
async fn two_ingest_api_processes_sending_into_one_conversation_stay_gapless() {
    let first = spawn_app().await;
    let second = spawn_app_beside(&first).await;
    let conversation = first.user(10).create_group(&[20]).await;
    let path = format!("/v1/conversations/{conversation}/messages");
    let sends: Vec<(usize, Uuid)> = (0..100).map(|i| (i, Uuid::new_v4())).collect();
    let (apps, path) = ([&first, &second], &path);
    let answers: Vec<Resp> = join_all(sends.iter().map(|(i, id)| async move {
        // Even sends through the first process as user 10, odd through the second as 20.
        apps[i % 2]
            .user(10 + 10 * (i % 2) as i64)
            .post(path, json!({"clientMsgId": id, "body": format!("m{i}")}))
            .await
    }))
    .await;
    let mut answered = HashMap::new();
    for ((i, id), res) in sends.iter().zip(answers) {
        let body = res.expect(201);
        answered.insert(*id, (body["seq"].as_i64().unwrap(), format!("m{i}")));
    }
    let seqs: BTreeSet<i64> = answered.values().map(|(s, _)| *s).collect();
    assert_eq!(seqs, (1..=100).collect(), "gapless, no seq twice");
    assert_eq!(stored(&first, conversation).await, answered);
}

#[tokio::test]
async fn a_failed_batch_writes_nothing_answers_503_to_each_caller_and_the_retries_commit() {
    let app = spawn_app().await;
    let conversation = app.user(10).create_group(&[20]).await;
    let path = format!("/v1/conversations/{conversation}/messages");
    let sends: Vec<(Uuid, String)> = (0..11).map(|i| (Uuid::new_v4(), format!("m{i}"))).collect();
    let (app_ref, path) = (&app, &path);
    let post = |id: Uuid, body: String| async move {
        app_ref
            .user(10)
            .post(path, json!({"clientMsgId": id, "body": body}))
            .await
    };

    // With the lock held, every batch waits for it; the test ends the session of each
    // batch that waits until every caller has its answer.
    let held = hold_conversation(&app, conversation).await;
    let answered = AtomicUsize::new(0);
    let (answers, killed) = {
        let calls = join_all(sends.iter().map(|(id, body)| {
            post(*id, body.clone()).inspect(|_| {
                answered.fetch_add(1, Ordering::Relaxed);
            })
        }));
        let end_batches = async {
            until_a_send_waits(&app).await;
            let mut killed = 0;
            let deadline = Instant::now() + Duration::from_secs(30);
            while answered.load(Ordering::Relaxed) < sends.len() {
                killed += sqlx::query_scalar::<_, i64>(
                    // MATERIALIZED: the filter runs before any session is ended.
                    "WITH waiting AS MATERIALIZED (
                         SELECT pid FROM pg_stat_activity
                          WHERE datname = current_database() AND application_name = 'ingest-api'
                            AND wait_event_type = 'Lock' AND query LIKE '%chat_send_many(%')
                     SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM waiting",
                )
                .fetch_one(&app.pool)
                .await
                .unwrap();
                assert!(Instant::now() < deadline, "sends unanswered after 30 s");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            killed
        };
        tokio::join!(calls, end_batches)
    };
    release(held).await;
    for res in &answers {
        assert_eq!(res.status, 503, "{}", res.body);
        assert_eq!(res.body["type"], "/problems/unavailable");
    }
    assert!(
        killed < 11,
        "11 callers in {killed} batches: nothing was batched"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM message").await,
        0,
        "nothing written"
    );
    let events = "SELECT count(*) FROM outbox WHERE type = 'message.new'";
    assert_eq!(app.count(events).await, 0, "no event written");

    // The retries, with the same ids: gapless from 1.
    let retries = join_all(sends.iter().map(|(id, body)| post(*id, body.clone()))).await;
    let seqs: BTreeSet<i64> = retries
        .into_iter()
        .map(|r| r.expect(201)["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, (1..=11).collect());
}

/// The send statement writes `message.new` by splicing the seq it takes into bytes the
/// application encoded around it (`chat_avro_long`): for any seq, the result is the
/// application's own encoding, byte for byte.
#[tokio::test]
async fn the_seq_spliced_by_postgresql_gives_the_bytes_the_codec_writes() {
    let app = spawn_app().await;
    let message = chatpipe_schemas::MessageNew {
        conversation_id: chatpipe_core::ConversationId::of(7),
        seq: chatpipe_schemas::Seq::of(1),
        sender_id: chatpipe_core::UserId::of(10),
        client_msg_id: Uuid::new_v4(),
        body: "Grüße 👋".into(),
        mentions: Vec::new(),
        thread_root_seq: None,
        created_at: chatpipe_core::outbox::now(),
    };
    let splice = app.codec.message_new_around_seq(message.clone());
    for seq in [1, 2, 63, 64, 8191, 8192, 1 << 35, i64::MAX] {
        let spliced: Vec<u8> = sqlx::query_scalar("SELECT $1 || chat_avro_long($2) || $3")
            .bind(&splice.head)
            .bind(seq)
            .bind(&splice.tail)
            .fetch_one(&app.pool)
            .await
            .unwrap();
        let mut expected = message.clone();
        expected.seq = chatpipe_schemas::Seq::of(seq);
        assert_eq!(
            spliced,
            app.codec
                .encode(&chatpipe_schemas::ChatEvent::MessageNew(expected)),
            "seq {seq}"
        );
    }
}
