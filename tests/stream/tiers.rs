//! History across the two tiers: messages moved out of PostgreSQL by the retention step
//! page exactly as before the move, in both directions and across the boundary, and
//! archived messages are edited and deleted with the answers hot ones get.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chatpipe_schemas::notification::REPLY;
use chatpipe_tests::cold::{
    archiver_process, cassandra_rows, drop_keyspace, session, Row, BUCKET_SIZE,
};
use chatpipe_tests::stream::{spawn_pipeline, Pipeline};
use chatpipe_tests::TestApp;
use futures::future::join_all;
use serde_json::{json, Value};

const CONVERSATIONS: usize = 20;
/// Messages per conversation archived and moved out, then sent after (hot only).
const MOVED: i64 = 60;
const HOT: i64 = 40;

/// The retention step at once: anything archived and a second old leaves.
const QUICK_RETENTION: [(&str, &str); 3] = [
    ("CHATPIPE_STORAGE__HOT_RETENTION_S", "1"),
    ("CHATPIPE_ARCHIVE__RETENTION_INTERVAL_MS", "200"),
    ("CHATPIPE_ARCHIVE__RETENTION_RETRY_MS", "500"),
];

/// Messages `seqs` of `conv` (Alice, Bob and Carol in turn), every 7th edited by its
/// sender, every 5th deleted (every 10th by Alice, the admin); a message with
/// `seq % 6 == 2` replies to the one before it, unless that one is deleted.
async fn fill(app: &TestApp, conv: i64, seqs: std::ops::RangeInclusive<i64>) {
    for i in seqs {
        let sender = [1, 2, 3][(i % 3) as usize];
        let mut message = json!({"clientMsgId": uuid::Uuid::new_v4(), "body": format!("m{i}")});
        if is_reply(i) {
            message["threadRootSeq"] = json!(i - 1);
        }
        let seq = app
            .user(sender)
            .post(&format!("/v1/conversations/{conv}/messages"), message)
            .await
            .expect(201)["seq"]
            .as_i64()
            .unwrap();
        assert_eq!(seq, i);
        let path = format!("/v1/conversations/{conv}/messages/{seq}");
        if i % 7 == 0 {
            let body = json!({"body": format!("m{i}, edited")});
            app.user(sender).patch(&path, body).await.expect(200);
        }
        if i % 5 == 0 {
            let by = if i % 10 == 0 { 1 } else { sender };
            app.user(by).delete(&path).await.expect(204);
        }
    }
}

fn is_reply(seq: i64) -> bool {
    seq % 6 == 2 && (seq - 1) % 5 != 0
}

/// Every message of `conv` by pages of `limit`, newest page first (`beforeSeq`), in
/// ascending seq.
async fn walk_down(app: &TestApp, conv: i64, limit: i64) -> Vec<Value> {
    let mut all = Vec::new();
    let mut path = format!("/v1/conversations/{conv}/messages?limit={limit}");
    loop {
        let page = app.user(1).get(&path).await.expect(200);
        let messages = page["messages"].as_array().unwrap().clone();
        let first = messages.first().map(|m| m["seq"].as_i64().unwrap());
        all.splice(0..0, messages);
        match (page["hasMore"].as_bool().unwrap(), first) {
            (true, Some(first)) => {
                path = format!("/v1/conversations/{conv}/messages?limit={limit}&beforeSeq={first}")
            }
            _ => return all,
        }
    }
}

/// The same oldest first (`afterSeq`), from `after`.
async fn walk_up(app: &TestApp, conv: i64, after: i64, limit: i64) -> Vec<Value> {
    let mut all = Vec::new();
    let mut after = after;
    loop {
        let page = app
            .user(1)
            .get(&format!(
                "/v1/conversations/{conv}/messages?limit={limit}&afterSeq={after}"
            ))
            .await
            .expect(200);
        let messages = page["messages"].as_array().unwrap().clone();
        if let Some(last) = messages.last() {
            after = last["seq"].as_i64().unwrap();
        }
        all.extend(messages);
        if !page["hasMore"].as_bool().unwrap() {
            return all;
        }
    }
}

fn seqs(messages: &[Value]) -> Vec<i64> {
    messages
        .iter()
        .map(|m| m["seq"].as_i64().unwrap())
        .collect()
}

/// (cold_through, rows in PostgreSQL at or below it) per conversation, in one statement.
async fn moved(p: &Pipeline, conversations: &[i64]) -> HashMap<i64, (i64, i64)> {
    let rows: Vec<(i64, i64, i64)> = sqlx::query_as(
        "SELECT a.conversation_id, a.cold_through,
                (SELECT count(*) FROM message m
                  WHERE m.conversation_id = a.conversation_id AND m.seq <= a.cold_through)
           FROM message_archive a WHERE a.conversation_id = ANY($1)",
    )
    .bind(conversations)
    .fetch_all(&p.app.pool)
    .await
    .unwrap();
    rows.into_iter().map(|(c, t, n)| (c, (t, n))).collect()
}

async fn wait_until(what: &str, deadline: Duration, mut done: impl AsyncFnMut() -> bool) {
    let until = Instant::now() + deadline;
    while !done().await {
        assert!(Instant::now() < until, "{what}: not within {deadline:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// 2,000 messages over 20 conversations: the first 60 of each archived and moved out of
/// PostgreSQL, the last 40 hot. Walked by pages both ways (30 newest first, 40 oldest
/// first: pages straddle seq 60), history equals what it was before the move, message
/// for message. PostgreSQL holds none of the moved rows; Cassandra holds each as it was.
#[tokio::test]
async fn history_pages_the_same_across_the_tiers_and_archived_messages_change_as_hot_ones() {
    let p = spawn_pipeline().await;
    let cql = session().await;
    let mut conversations = Vec::new();
    for _ in 0..CONVERSATIONS {
        conversations.push(p.app.user(1).create_group(&[2, 3]).await);
    }
    // Dave (4) and Erin (5) read nothing of this one while its first 60 are sent and
    // moved out.
    let lagging = p.app.user(1).create_group(&[2, 3, 4, 5]).await;
    // Bob syncs before anything is sent, and again after the move (below).
    let bobs_cursor = p.app.user(2).get("/v1/sync?limit=200").await.expect(200)["nextCursor"]
        .as_str()
        .unwrap()
        .to_owned();
    join_all(conversations.iter().map(|&c| fill(&p.app, c, 1..=MOVED))).await;
    fill(&p.app, lagging, 1..=MOVED).await;
    let mut before: HashMap<i64, Vec<Value>> = HashMap::new();
    for &c in &conversations {
        before.insert(c, walk_down(&p.app, c, 200).await);
    }

    let mut archiver = archiver_process(&p, &QUICK_RETENTION);
    wait_until(
        "the first 60 of every conversation moved out",
        Duration::from_secs(90),
        async || {
            let m = moved(&p, &conversations).await;
            let l = moved(&p, &[lagging]).await;
            conversations.iter().all(|c| m.get(c) == Some(&(MOVED, 0)))
                && l.get(&lagging) == Some(&(MOVED, 0))
        },
    )
    .await;
    // Nothing more moves: the archiver is gone, so nothing newer is archived.
    archiver.kill().await.unwrap();
    a_send_passes_archived_deletes_and_replies(&p, lagging).await;
    a_read_passes_archived_deletes_and_replies(&p, lagging).await;
    join_all(
        conversations
            .iter()
            .map(|&c| fill(&p.app, c, MOVED + 1..=MOVED + HOT)),
    )
    .await;
    for &c in &conversations {
        let hot = walk_up(&p.app, c, MOVED, 200).await;
        before.get_mut(&c).unwrap().extend(hot);
    }

    for &c in &conversations {
        let expected = &before[&c];
        assert_eq!(seqs(expected), (1..=MOVED + HOT).collect::<Vec<_>>());
        assert_eq!(
            &walk_down(&p.app, c, 30).await,
            expected,
            "conversation {c}, newest first"
        );
        assert_eq!(
            &walk_up(&p.app, c, 0, 40).await,
            expected,
            "conversation {c}, oldest first"
        );
        let cold = cassandra_rows(&cql, &p.ns, BUCKET_SIZE, c, MOVED)
            .await
            .unwrap();
        assert_eq!(
            cold.len() as i64,
            MOVED,
            "Cassandra holds every moved message"
        );
        for (row, message) in cold.iter().zip(expected) {
            assert_eq!(row.seq, message["seq"].as_i64().unwrap());
            assert_eq!(row.body.as_deref(), message["body"].as_str());
            assert_eq!(row.thread_root, message["threadRootSeq"].as_i64());
            assert_eq!(row.thread_root.is_some(), is_reply(row.seq));
        }
    }
    let m = moved(&p, &conversations).await;
    assert!(conversations.iter().all(|c| m[c] == (MOVED, 0)), "{m:?}");
    // Threads page the same across the tiers: roots with an archived reply (1, 7), a
    // deleted root without one (55), roots with a hot reply (61, 91).
    for &c in &conversations[..3] {
        for root in [1, 7, 55, 61, 91] {
            let replies: Vec<&Value> = before[&c]
                .iter()
                .filter(|m| m["threadRootSeq"] == root)
                .collect();
            let path =
                format!("/v1/conversations/{c}/messages?threadRootSeq={root}&afterSeq=0&limit=50");
            let page = p.app.user(1).get(&path).await.expect(200);
            let shown: Vec<&Value> = page["messages"].as_array().unwrap().iter().collect();
            assert_eq!(shown, replies, "thread {root} of conversation {c}");
        }
    }

    // Bob synced before any of it was sent, longer ago than the hot window: changes he
    // has not seen are archived, so his cursor is stale. From the start, he gets every
    // conversation with `hasMore`, and history by pages completes his copy.
    let stale = p
        .app
        .user(2)
        .get(&format!("/v1/sync?since={bobs_cursor}&limit=200"))
        .await
        .problem(409);
    assert_eq!(stale["type"], "/problems/cursor-stale", "{stale}");
    let fresh = p.app.user(2).get("/v1/sync?limit=200").await.expect(200);
    for entry in fresh["conversations"].as_array().unwrap() {
        assert_eq!(entry["hasMore"], true, "{entry}");
    }
    for &c in &conversations {
        assert_eq!(
            &walk_down(&p.app, c, 25).await,
            &before[&c],
            "conversation {c}"
        );
    }
    // A cursor from after the move is not stale: a sync with it reports nothing new.
    let after = fresh["nextCursor"].as_str().unwrap();
    let again = p
        .app
        .user(2)
        .get(&format!("/v1/sync?since={after}&limit=200"))
        .await
        .expect(200);
    assert_eq!(again["conversations"], json!([]), "{again}");

    // A reply to an archived root (checked in Cassandra): its thread pages the archived
    // reply and the new one; a reply to an archived reply is refused as a hot one is.
    let c = conversations[0];
    let reply = |root: i64| {
        let app = &p.app;
        async move {
            app.user(2)
                .post(
                    &format!("/v1/conversations/{c}/messages"),
                    json!({"clientMsgId": uuid::Uuid::new_v4(), "body": "late", "threadRootSeq": root}),
                )
                .await
        }
    };
    let late = reply(7).await.expect(201)["seq"].as_i64().unwrap();
    let thread = |query: &'static str| {
        let app = &p.app;
        async move {
            let path = format!("/v1/conversations/{c}/messages?threadRootSeq=7&{query}");
            let page = app.user(1).get(&path).await.expect(200);
            (
                seqs(page["messages"].as_array().unwrap()),
                page["hasMore"] == true,
            )
        }
    };
    assert_eq!(thread("limit=1").await, (vec![late], true));
    assert_eq!(thread("beforeSeq=100&limit=5").await, (vec![8], false));
    assert_eq!(thread("afterSeq=0&limit=50").await, (vec![8, late], false));
    let refused = reply(8).await.problem(422);
    assert_eq!(refused["field"], "threadRootSeq", "{refused}");
    a_reply_to_an_archived_root_reaches_its_author(&p, c).await;

    archived_messages_change_as_hot_ones(&p, conversations[0], &before[&conversations[0]]).await;
    drop_keyspace(&cql, &p.ns).await;
    p.cleanup().await;
}

/// Dave, a member of `conv` who has read nothing, sends once all its messages have moved
/// out of PostgreSQL: he has passed every deleted message and every reply, although
/// `message` holds none of them, so he has nothing unread (the inbox), and his counts
/// of the deleted and replies passed are those `fill` made.
async fn a_send_passes_archived_deletes_and_replies(p: &Pipeline, conv: i64) {
    let sent = p
        .app
        .user(4)
        .post(
            &format!("/v1/conversations/{conv}/messages"),
            json!({"clientMsgId": uuid::Uuid::new_v4(), "body": "back"}),
        )
        .await
        .expect(201)["seq"]
        .as_i64()
        .unwrap();
    assert_eq!(sent, MOVED + 1);
    assert_eq!(p.app.user(4).unread_count(conv).await, 0);
    assert_eq!(passed(p, 4, conv).await, archived_passed());
}

/// Erin, who has read nothing of `conv` either, reads its first 60 (all archived): as
/// Dave's send, her read passes every deleted message and reply among them, and Dave's
/// message is all she has unread.
async fn a_read_passes_archived_deletes_and_replies(p: &Pipeline, conv: i64) {
    p.app.user(5).mark_read(conv, MOVED).await;
    assert_eq!(p.app.user(5).unread_count(conv).await, 1);
    assert_eq!(passed(p, 5, conv).await, archived_passed());
}

/// How many deleted messages and replies `user` has passed in `conv` (PostgreSQL's row).
async fn passed(p: &Pipeline, user: i64, conv: i64) -> (i64, i64) {
    sqlx::query_as(
        "SELECT deleted_read, reply_read FROM conversation_member
          WHERE conversation_id = $1 AND user_id = $2",
    )
    .bind(conv)
    .bind(user)
    .fetch_one(&p.app.pool)
    .await
    .unwrap()
}

/// The deleted top-level messages and the replies `fill` made among the archived ones.
fn archived_passed() -> (i64, i64) {
    let deleted = (1..=MOVED).filter(|&i| i % 5 == 0 && !is_reply(i)).count();
    let replies = (1..=MOVED).filter(|&i| is_reply(i)).count();
    (deleted as i64, replies as i64)
}

/// Carol replies to seq 3 of `conv`, Alice's, archived, nobody's root before: as after
/// a reply to a hot root, the thread knows its author (PostgreSQL's rows), Alice follows
/// it, and at level `mentions`, offline, she is told of it as a reply (what
/// `chat.notifications` carries).
async fn a_reply_to_an_archived_root_reaches_its_author(p: &Pipeline, conv: i64) {
    let (alice, carol, root) = (1, 3, 3);
    p.app
        .user(alice)
        .put_json(
            &format!("/v1/conversations/{conv}/notifications"),
            json!({"level": "mentions"}),
        )
        .await
        .expect(200);
    let notifier = p.start_notifications(p.notification_settings());
    let answer = p
        .app
        .user(carol)
        .post(
            &format!("/v1/conversations/{conv}/messages"),
            json!({"clientMsgId": uuid::Uuid::new_v4(), "body": "to alice", "threadRootSeq": root}),
        )
        .await
        .expect(201)["seq"]
        .as_i64()
        .unwrap();
    let (author, following): (Option<i64>, bool) = sqlx::query_as(
        "SELECT t.root_sender_id, f.following
           FROM message_thread t
           JOIN thread_follow f USING (conversation_id, root_seq)
          WHERE t.conversation_id = $1 AND t.root_seq = $2 AND f.user_id = $3",
    )
    .bind(conv)
    .bind(root)
    .bind(alice)
    .fetch_one(&p.app.pool)
    .await
    .expect("alice's position in the thread of an archived root");
    assert_eq!((author, following), (Some(alice), true));
    p.notifications_until(Duration::from_secs(60), |records| {
        records.iter().any(|(_, n)| {
            (n.user_id.get(), n.conversation_id.get(), n.kind.as_str()) == (alice, conv, REPLY)
                && (n.first_seq.get()..=n.last_seq.get()).contains(&answer)
        })
    })
    .await;
    drop(notifier);
}

/// Edits and deletes of moved messages (seq <= 60) answer as those of hot ones (seq >
/// 60), with the same refusals; then both tiers hold the change, and the moved rows
/// leave PostgreSQL again.
async fn archived_messages_change_as_hot_ones(p: &Pipeline, conv: i64, before: &[Value]) {
    let path = |seq: i64| format!("/v1/conversations/{conv}/messages/{seq}");
    // Seq 1 and 61 are Bob's (seq % 3 == 1), neither edited nor deleted before.
    let cold = p
        .app
        .user(2)
        .patch(&path(1), json!({"body": "late edit"}))
        .await
        .expect(200);
    let hot = p
        .app
        .user(2)
        .patch(&path(61), json!({"body": "late edit"}))
        .await
        .expect(200);
    let keys = |v: &Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(keys(&cold), keys(&hot), "the same answer: {cold} and {hot}");
    assert_eq!(cold["body"], "late edit");
    assert_eq!(cold["createdAt"], before[0]["createdAt"]);
    assert!(cold["editedAt"].as_str() > cold["createdAt"].as_str());
    // The same refusals: another member's message, a deleted one (seq 5 and 65, Carol's).
    for seq in [1, 61] {
        p.app
            .user(3)
            .patch(&path(seq), json!({"body": "x"}))
            .await
            .problem(403);
    }
    for seq in [5, 65] {
        p.app
            .user(3)
            .patch(&path(seq), json!({"body": "x"}))
            .await
            .problem(409);
    }
    // Seq 2 is Carol's: deleted, and deleting again changes nothing.
    for _ in 0..2 {
        p.app.user(3).delete(&path(2)).await.expect(204);
    }
    let page = p
        .app
        .user(1)
        .get(&format!(
            "/v1/conversations/{conv}/messages?afterSeq=0&limit=3"
        ))
        .await
        .expect(200);
    assert_eq!(page["messages"][0]["body"], "late edit");
    assert_eq!(page["messages"][1]["deleted"], true);
    assert!(page["messages"][1].get("body").is_none());
    // Seq 8 is Carol's reply to 7, archived: deleting it takes it from its thread and
    // from no other count (the reply came back from Cassandra with its root).
    let counts = || async {
        sqlx::query_as::<_, (i64, i64, i64)>(
            "SELECT c.deleted_count, c.reply_count, t.reply_count
               FROM conversation c JOIN message_thread t ON t.conversation_id = c.id
              WHERE c.id = $1 AND t.root_seq = 7",
        )
        .bind(conv)
        .fetch_one(&p.app.pool)
        .await
        .unwrap()
    };
    let (deleted, replies, in_thread) = counts().await;
    p.app.user(3).delete(&path(8)).await.expect(204);
    assert_eq!(counts().await, (deleted, replies, in_thread - 1));

    // The archiver again: both changes reach Cassandra, and the rows leave PostgreSQL.
    let cql = session().await;
    let mut archiver = archiver_process(p, &QUICK_RETENTION);
    wait_until(
        "the changed rows archived and moved out again",
        Duration::from_secs(60),
        async || {
            let rows: Vec<Row> = cassandra_rows(&cql, &p.ns, BUCKET_SIZE, conv, 2)
                .await
                .unwrap_or_default();
            let in_postgres: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM message WHERE conversation_id = $1 AND seq <= 2",
            )
            .bind(conv)
            .fetch_one(&p.app.pool)
            .await
            .unwrap();
            in_postgres == 0
                && rows.len() == 2
                && rows[0].body.as_deref() == Some("late edit")
                && rows[1].body.is_none()
                && rows[1].deleted_at.is_some()
        },
    )
    .await;
    archiver.kill().await.unwrap();
    assert_eq!(
        walk_down(&p.app, conv, 7).await,
        walk_up(&p.app, conv, 0, 9).await
    );
}
