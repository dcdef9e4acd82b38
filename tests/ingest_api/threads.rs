//! Threads: replies under a top-level message, with counts kept by counters the writers
//! move. Every member's `unreadCount` (top-level only), `unreadThreads` and
//! `mentionCount` in the inbox are checked after every step against the test's own model
//! of what it sent, edited, deleted, followed and read (each member's conversation
//! watermark read from PostgreSQL, where racing reads leave it); and against a full
//! scan of the rows.

use std::collections::{BTreeMap, BTreeSet};

use chatpipe_schemas::ChatEvent;
use chatpipe_tests::{spawn_app, TestApp};
use futures::future::join_all;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use uuid::Uuid;

/// A send the test plans: (sender, root, members named).
type Planned = (i64, Option<i64>, BTreeSet<i64>);

#[derive(Debug, Clone)]
struct Msg {
    sender: i64,
    root: Option<i64>,
    named: BTreeSet<i64>,
    deleted: bool,
}

/// What the test did: every message by seq, and every member's place in every thread
/// ((root, user) -> (position, following)).
#[derive(Default)]
struct Model {
    messages: BTreeMap<i64, Msg>,
    places: BTreeMap<(i64, i64), (i64, bool)>,
}

impl Model {
    fn replies(&self, root: i64) -> impl Iterator<Item = (&i64, &Msg)> {
        self.messages
            .iter()
            .filter(move |(_, m)| m.root == Some(root))
    }

    /// The newest reply of `root`, deleted or not (a thread read stops there).
    fn last_reply(&self, root: i64) -> i64 {
        self.replies(root).map(|(s, _)| *s).max().unwrap_or(0)
    }

    fn sent(&mut self, seq: i64, msg: Msg) {
        if let Some(root) = msg.root {
            let place = self.places.entry((root, msg.sender)).or_insert((0, true));
            *place = (place.0.max(seq), true);
            let author = self.messages[&root].sender;
            self.places.entry((root, author)).or_insert((0, true));
        }
        self.messages.insert(seq, msg);
    }

    /// A thread read (`seq`) or a follow change of `user` in `root`.
    fn place(&mut self, root: i64, user: i64, seq: Option<i64>, following: Option<bool>) {
        let last = self.last_reply(root);
        let place = self.places.entry((root, user)).or_insert((last, false));
        if let Some(seq) = seq {
            place.0 = place.0.max(seq.min(last));
        }
        if let Some(following) = following {
            place.1 = following;
        }
    }

    /// (unreadCount, unreadThreads, mentionCount) of `user` with watermark `read`.
    fn counts(&self, user: i64, read: i64) -> (i64, i64, i64) {
        let after = || self.messages.range(read + 1..).filter(|(_, m)| !m.deleted);
        let unread = after().filter(|(_, m)| m.root.is_none()).count() as i64;
        let mentions = after().filter(|(_, m)| m.named.contains(&user)).count() as i64;
        let threads = self
            .places
            .iter()
            .filter(|((root, u), (position, following))| {
                *u == user
                    && *following
                    && self
                        .replies(*root)
                        .any(|(s, m)| !m.deleted && *s > *position)
            })
            .count() as i64;
        (unread, threads, mentions)
    }
}

/// The same three counts by a full scan of PostgreSQL's rows.
const SCAN_SQL: &str = "SELECT m.user_id,
        (SELECT count(*) FROM message g
          WHERE g.conversation_id = $1 AND g.seq > m.last_read_seq
            AND g.thread_root_seq IS NULL AND g.deleted_at IS NULL),
        (SELECT count(*) FROM thread_follow f
          WHERE f.conversation_id = $1 AND f.user_id = m.user_id AND f.following
            AND EXISTS (SELECT 1 FROM message r
                         WHERE r.conversation_id = $1 AND r.thread_root_seq = f.root_seq
                           AND r.deleted_at IS NULL AND r.seq > f.last_read_seq)),
        (SELECT count(*) FROM message_mention n
           JOIN message g ON g.conversation_id = n.conversation_id AND g.seq = n.seq
          WHERE n.conversation_id = $1 AND n.user_id = m.user_id
            AND n.seq > m.last_read_seq AND g.deleted_at IS NULL)
   FROM conversation_member m WHERE m.conversation_id = $1 ORDER BY m.user_id";

async fn inbox_counts(app: &TestApp, user: i64, conv: i64) -> (i64, i64, i64) {
    let entry = app.user(user).inbox_entry(conv).await;
    let n = |k: &str| {
        entry[k]
            .as_i64()
            .unwrap_or_else(|| panic!("{k} in {entry}"))
    };
    (n("unreadCount"), n("unreadThreads"), n("mentionCount"))
}

/// Checks every member's counts; answers how many members had each count above 0.
async fn check(app: &TestApp, conv: i64, members: &[i64], model: &Model, step: &str) -> [usize; 3] {
    let mut nonzero = [0; 3];
    let scanned: Vec<(i64, i64, i64, i64)> = sqlx::query_as(SCAN_SQL)
        .bind(conv)
        .fetch_all(&app.pool)
        .await
        .unwrap();
    let scanned: BTreeMap<i64, (i64, i64, i64)> = scanned
        .into_iter()
        .map(|(u, a, b, c)| (u, (a, b, c)))
        .collect();
    for &user in members {
        let (read, _) = app.watermarks(conv, user).await;
        let expected = model.counts(user, read);
        let shown = inbox_counts(app, user, conv).await;
        assert_eq!(
            shown, expected,
            "{step}: user {user} (watermark {read}): (unreadCount, unreadThreads, mentionCount)"
        );
        assert_eq!(
            scanned[&user], expected,
            "{step}: user {user}, the rows' scan"
        );
        for (n, count) in nonzero.iter_mut().zip([expected.0, expected.1, expected.2]) {
            *n += usize::from(count > 0);
        }
    }
    nonzero
}

async fn send(app: &TestApp, conv: i64, sender: i64, root: Option<i64>, named: &[i64]) -> i64 {
    let mut body = json!({"clientMsgId": Uuid::new_v4(), "body": "m", "mentions": named});
    if let Some(root) = root {
        body["threadRootSeq"] = json!(root);
    }
    let sent = app
        .user(sender)
        .post(&format!("/v1/conversations/{conv}/messages"), body)
        .await
        .expect(201);
    assert_eq!(sent["threadRootSeq"].as_i64(), root, "{sent}");
    sent["seq"].as_i64().unwrap()
}

#[tokio::test]
async fn thread_mention_and_unread_counts_stay_exact_under_a_scripted_mix() {
    let app = spawn_app().await;
    let members: Vec<i64> = (1..=30).map(|i| i * 10).collect();
    let alice = members[0];
    let conv = app.user(alice).create_group(&members[1..]).await;
    let mut model = Model::default();
    let seed: u64 = rand::random();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut roots: Vec<i64> = Vec::new();
    let mut deleted_root = None;
    let rounds = 10;
    // How often a member had each count above 0: the mix must reach every count.
    let mut seen = [0; 3];

    for round in 0..rounds {
        let step = |what: &str| format!("seed {seed}, round {round}: {what}");
        // 200 sends, 25 at a time: 20% replies across 10 threads, 5% naming members.
        for _ in 0..8 {
            let mut planned: Vec<Planned> = Vec::new();
            for _ in 0..25 {
                let sender = *members.choose(&mut rng).unwrap();
                let live_roots: Vec<i64> = roots
                    .iter()
                    .copied()
                    .filter(|r| Some(*r) != deleted_root)
                    .collect();
                let root = (roots.len() == 10 && rng.random_bool(0.2))
                    .then(|| *live_roots.choose(&mut rng).unwrap());
                let named: BTreeSet<i64> = if rng.random_bool(0.05) {
                    members.choose_multiple(&mut rng, 2).copied().collect()
                } else {
                    BTreeSet::new()
                };
                planned.push((sender, root, named));
            }
            let sends = planned.iter().map(|(sender, root, named)| {
                let list: Vec<i64> = named.iter().copied().collect();
                let app = &app;
                async move { send(app, conv, *sender, *root, &list).await }
            });
            let seqs = join_all(sends).await;
            // In seq order, as the statement took them.
            let mut sent: Vec<(i64, Planned)> = seqs.into_iter().zip(planned).collect();
            sent.sort_by_key(|(seq, _)| *seq);
            for (seq, (sender, root, named)) in sent {
                let named = named.into_iter().filter(|u| *u != sender).collect();
                let msg = Msg {
                    sender,
                    root,
                    named,
                    deleted: false,
                };
                model.sent(seq, msg);
                if roots.len() < 10 && root.is_none() {
                    roots.push(seq);
                }
            }
        }
        let nonzero = check(&app, conv, &members, &model, &step("sends")).await;
        seen.iter_mut().zip(nonzero).for_each(|(s, n)| *s += n);

        // Edits that take mentions away, deletes of replies (and once of a root), and
        // reads of both watermarks from two devices each, follows and unfollows, all
        // racing.
        let live = |m: &Model, f: &dyn Fn(&Msg) -> bool| -> Vec<i64> {
            m.messages
                .iter()
                .filter(|(_, x)| !x.deleted && f(x))
                .map(|(s, _)| *s)
                .collect()
        };
        let mut deletes: Vec<i64> = live(&model, &|m| m.root.is_some())
            .choose_multiple(&mut rng, 3)
            .copied()
            .collect();
        if round == rounds / 2 {
            deleted_root = Some(roots[3]);
            deletes.push(roots[3]);
        }
        // An edit races no delete of its own message (either order is the mentions
        // test's).
        let unnamed: Vec<i64> = live(&model, &|m| !m.named.is_empty())
            .into_iter()
            .filter(|s| !deletes.contains(s))
            .collect::<Vec<i64>>()
            .choose_multiple(&mut rng, 3)
            .copied()
            .collect();
        let top = *model.messages.keys().last().unwrap();
        let readers: Vec<i64> = members.choose_multiple(&mut rng, 12).copied().collect();
        let mut thread_reads = Vec::new();
        let mut conversation_reads = Vec::new();
        let mut follows = Vec::new();
        for &user in &readers {
            let root = *roots.choose(&mut rng).unwrap();
            let s = rng.random_range(root..=top + 5);
            thread_reads.push((user, root, s));
            thread_reads.push((user, root, (s + root) / 2));
            let c = rng.random_range(1..=top);
            conversation_reads.extend([(user, c), (user, c / 2 + 1)]);
            if rng.random_bool(0.3) {
                let other = *roots.choose(&mut rng).unwrap();
                if other != root {
                    follows.push((user, other, rng.random_bool(0.5)));
                }
            }
        }
        let edit_requests = unnamed.iter().map(|seq| {
            let (app, sender) = (&app, model.messages[seq].sender);
            async move {
                let path = format!("/v1/conversations/{conv}/messages/{seq}");
                let edited = app
                    .user(sender)
                    .patch(&path, json!({"body": "no one", "mentions": []}))
                    .await
                    .expect(200);
                assert!(edited.get("mentions").is_none(), "{edited}");
            }
        });
        let delete_requests = deletes.iter().map(|seq| {
            let app = &app;
            async move {
                let path = format!("/v1/conversations/{conv}/messages/{seq}");
                app.user(alice).delete(&path).await.expect(204);
            }
        });
        let thread_read_requests = thread_reads.iter().map(|(user, root, s)| {
            let app = &app;
            async move {
                let path = format!("/v1/conversations/{conv}/threads/{root}/read");
                app.user(*user)
                    .post(&path, json!({"seq": s}))
                    .await
                    .expect(200);
            }
        });
        let read_requests = conversation_reads.iter().map(|(user, s)| {
            let app = &app;
            async move { app.user(*user).mark_read(conv, *s).await }
        });
        let follow_requests = follows.iter().map(|(user, root, on)| {
            let app = &app;
            async move {
                let path = format!("/v1/conversations/{conv}/threads/{root}/follow");
                let answer = if *on {
                    app.user(*user).put(&path).await
                } else {
                    app.user(*user).delete(&path).await
                };
                assert_eq!(answer.expect(200)["following"], *on);
            }
        });
        tokio::join!(
            join_all(edit_requests),
            join_all(delete_requests),
            join_all(thread_read_requests),
            join_all(read_requests),
            join_all(follow_requests),
        );
        for seq in &unnamed {
            model.messages.get_mut(seq).unwrap().named.clear();
        }
        for seq in &deletes {
            let m = model.messages.get_mut(seq).unwrap();
            m.deleted = true;
            m.named.clear();
        }
        for (user, root, s) in thread_reads {
            model.place(root, user, Some(s), None);
        }
        for (user, root, on) in follows {
            model.place(root, user, None, Some(on));
        }
        let nonzero = check(&app, conv, &members, &model, &step("edits, deletes, reads")).await;
        seen.iter_mut().zip(nonzero).for_each(|(s, n)| *s += n);
    }
    assert!(
        seen.iter().all(|n| *n > 20),
        "seed {seed}: counts above 0 {seen:?}"
    );

    // A reply to the deleted root is refused; its thread stays.
    let root = deleted_root.unwrap();
    let refused = app
        .user(alice)
        .post(
            &format!("/v1/conversations/{conv}/messages"),
            json!({"clientMsgId": Uuid::new_v4(), "body": "late", "threadRootSeq": root}),
        )
        .await
        .problem(422);
    assert_eq!(refused["field"], "threadRootSeq", "{refused}");

    // Each root shows its thread as the model has it; each thread pages as the model's.
    for &root in &roots {
        let page = app
            .user(alice)
            .get(&format!(
                "/v1/conversations/{conv}/messages?afterSeq={}&limit=1",
                root - 1
            ))
            .await
            .expect(200);
        let thread = &page["messages"][0]["thread"];
        let live: Vec<(i64, i64)> = model
            .replies(root)
            .filter(|(_, m)| !m.deleted)
            .map(|(s, m)| (*s, m.sender))
            .collect();
        let mut repliers: Vec<i64> = Vec::new();
        for (_, sender) in &live {
            if !repliers.contains(sender) && repliers.len() < 3 {
                repliers.push(*sender);
            }
        }
        assert_eq!(thread["replyCount"], live.len(), "root {root}: {thread}");
        assert_eq!(thread["lastReplySeq"], model.last_reply(root), "{thread}");
        assert_eq!(thread["repliers"], json!(repliers), "root {root}: {thread}");
        let mut paged = Vec::new();
        let mut after = 0;
        loop {
            let page = app
                .user(alice)
                .get(&format!(
                    "/v1/conversations/{conv}/messages?threadRootSeq={root}&afterSeq={after}&limit=50"
                ))
                .await
                .expect(200);
            for m in page["messages"].as_array().unwrap() {
                assert_eq!(m["threadRootSeq"], root, "{m}");
                paged.push((m["seq"].as_i64().unwrap(), m["deleted"] == true));
            }
            if page["hasMore"] != true {
                break;
            }
            after = paged.last().unwrap().0;
        }
        let expected: Vec<(i64, bool)> =
            model.replies(root).map(|(s, m)| (*s, m.deleted)).collect();
        assert_eq!(paged, expected, "thread {root} pages as sent");
    }

    // Every reply's message.new names its root.
    let mut named_roots = BTreeMap::new();
    for event in app.outbox_events().await {
        if let ChatEvent::MessageNew(m) = event {
            named_roots.insert(m.seq.get(), m.thread_root_seq.map(|r| r.get()));
        }
    }
    for (seq, m) in &model.messages {
        assert_eq!(named_roots[seq], m.root, "message.new of {seq}");
    }
}

#[tokio::test]
async fn a_reply_to_a_reply_a_deleted_root_or_another_conversations_seq_is_refused() {
    let app = spawn_app().await;
    let (alice, bob, stranger) = (10, 20, 99);
    let conv = app.user(alice).create_group(&[bob]).await;
    let other = app.user(alice).create_group(&[bob]).await;
    let root = app.user(alice).send_message(conv, "root").await;
    let reply = send(&app, conv, bob, Some(root), &[]).await;
    let gone = app.user(bob).send_message(conv, "gone").await;
    app.user(bob)
        .delete(&format!("/v1/conversations/{conv}/messages/{gone}"))
        .await
        .expect(204);
    for _ in 0..5 {
        app.user(alice).send_message(other, "elsewhere").await;
    }
    let path = format!("/v1/conversations/{conv}/messages");
    let before = app.watermarks(conv, bob).await;
    for (root, says) in [
        (json!(reply), "is a reply"),
        (json!(gone), "is deleted"),
        // Seq 5 exists in the other conversation only.
        (json!(5), "no message 5"),
        (json!(0), "must be a positive"),
        (json!(-3), "must be a positive"),
    ] {
        let problem = app
            .user(bob)
            .post(
                &path,
                json!({"clientMsgId": Uuid::new_v4(), "body": "r", "threadRootSeq": root}),
            )
            .await
            .problem(422);
        assert_eq!(problem["field"], "threadRootSeq", "{problem}");
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains(says), "{root}: {detail}");
    }
    // Nothing of them was written.
    let last_seq: i64 = sqlx::query_scalar("SELECT last_seq FROM conversation WHERE id = $1")
        .bind(conv)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(last_seq, gone);
    assert_eq!(app.watermarks(conv, bob).await, before);
    // A stranger learns nothing: 404, as for any send.
    app.user(stranger)
        .post(
            &path,
            json!({"clientMsgId": Uuid::new_v4(), "body": "r", "threadRootSeq": root}),
        )
        .await
        .problem(404);
    // In one batch with good sends, a bad root refuses only its own message.
    let sends = (0..6).map(|i| {
        let app = &app;
        let root = if i % 2 == 0 { root } else { reply };
        async move {
            app.user(alice)
                .post(
                    &format!("/v1/conversations/{conv}/messages"),
                    json!({"clientMsgId": Uuid::new_v4(), "body": "b", "threadRootSeq": root}),
                )
                .await
        }
    });
    let answers = join_all(sends).await;
    for (i, answer) in answers.into_iter().enumerate() {
        assert_eq!(
            answer.status,
            if i % 2 == 0 { 201 } else { 422 },
            "{}",
            answer.body
        );
    }
    // A retry of a reply whose root was deleted since is a replay of what was written,
    // not a refusal: the root is checked for new messages only.
    let retried = json!({"clientMsgId": Uuid::new_v4(), "body": "kept", "threadRootSeq": root});
    let first = app.user(bob).post(&path, retried.clone()).await;
    assert_eq!(first.status, 201, "{}", first.body);
    app.user(alice)
        .delete(&format!("/v1/conversations/{conv}/messages/{root}"))
        .await
        .expect(204);
    let again = app.user(bob).post(&path, retried).await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.body["seq"], first.body["seq"]);
    assert_eq!(again.body["threadRootSeq"], json!(root));
    // A thread page names a root too: a reply, or a seq the conversation has not reached,
    // is 400 naming threadRootSeq; the thread of a deleted root still pages its replies.
    for bad in [reply, last_seq + 100] {
        let problem = app
            .user(bob)
            .get(&format!("{path}?threadRootSeq={bad}"))
            .await
            .problem(400);
        assert_eq!(problem["field"], "threadRootSeq", "{problem}");
    }
    let page = app
        .user(bob)
        .get(&format!("{path}?threadRootSeq={root}&afterSeq=0"))
        .await;
    assert_eq!(page.status, 200, "{}", page.body);
    let seqs: Vec<i64> = page.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["seq"].as_i64().unwrap())
        .collect();
    assert!(seqs.contains(&reply), "{seqs:?}");
    assert!(
        seqs.contains(&first.body["seq"].as_i64().unwrap()),
        "{seqs:?}"
    );
}

#[tokio::test]
async fn thread_reads_are_monotone_and_clamped_follows_are_idempotent_and_members_only() {
    let app = spawn_app().await;
    let (alice, bob, carol, stranger) = (10, 20, 30, 99);
    let conv = app.user(alice).create_group(&[bob, carol]).await;
    let root = app.user(alice).send_message(conv, "root").await;
    let quiet = app.user(alice).send_message(conv, "nobody replies").await;
    let first = send(&app, conv, bob, Some(root), &[]).await;
    let second = send(&app, conv, bob, Some(root), &[]).await;
    let thread = |u: i64| {
        let app = &app;
        async move { inbox_counts(app, u, conv).await.1 }
    };
    // The root's author follows from the first reply; bob follows what he replied to.
    assert_eq!(thread(alice).await, 1);
    assert_eq!(thread(bob).await, 0);
    assert_eq!(thread(carol).await, 0);
    let read = |u: i64, s: i64| {
        let app = &app;
        async move {
            app.user(u)
                .post(
                    &format!("/v1/conversations/{conv}/threads/{root}/read"),
                    json!({"seq": s}),
                )
                .await
        }
    };
    let at = read(alice, first).await.expect(200);
    assert_eq!(
        at,
        json!({"lastReadSeq": first, "following": true, "unreadThreads": 1})
    );
    let back = read(alice, root).await.expect(200);
    assert_eq!(back["lastReadSeq"], first, "a read never moves back");
    let past = read(alice, second + 100).await.expect(200);
    assert_eq!(
        past,
        json!({"lastReadSeq": second, "following": true, "unreadThreads": 0})
    );
    // Carol follows: nothing before it is unread to her; the next reply is.
    let follow = format!("/v1/conversations/{conv}/threads/{root}/follow");
    for _ in 0..2 {
        let on = app.user(carol).put(&follow).await.expect(200);
        assert_eq!(
            on,
            json!({"lastReadSeq": second, "following": true, "unreadThreads": 0})
        );
    }
    send(&app, conv, bob, Some(root), &[]).await;
    assert_eq!(thread(carol).await, 1);
    assert_eq!(thread(alice).await, 1);
    let off = app.user(carol).delete(&follow).await.expect(200);
    assert_eq!(off["unreadThreads"], 0);
    assert_eq!(off["following"], false);
    // A message nobody replied to can be followed; then its first reply counts.
    app.user(carol)
        .put(&format!("/v1/conversations/{conv}/threads/{quiet}/follow"))
        .await
        .expect(200);
    send(&app, conv, bob, Some(quiet), &[]).await;
    assert_eq!(thread(carol).await, 1);
    // Each change of a place wrote one thread.read, with the place after it; a read that
    // changed nothing wrote none.
    let places: Vec<(i64, i64, i64, bool)> = app
        .outbox_events()
        .await
        .into_iter()
        .filter_map(|e| match e {
            ChatEvent::ThreadRead(t) => Some((
                t.user_id.get(),
                t.root_seq.get(),
                t.last_read_seq.get(),
                t.following,
            )),
            _ => None,
        })
        .collect();
    assert_eq!(
        places,
        vec![
            (alice, root, first, true),
            (alice, root, second, true),
            (carol, root, second, true),
            (carol, root, second, false),
            (carol, quiet, 0, true),
        ]
    );
    // Strangers and non-roots: 404, problem+json.
    app.user(stranger).put(&follow).await.problem(404);
    read(stranger, first).await.problem(404);
    app.user(carol)
        .put(&format!("/v1/conversations/{conv}/threads/{first}/follow"))
        .await
        .problem(404);
    app.user(carol)
        .put(&format!("/v1/conversations/{conv}/threads/999/follow"))
        .await
        .problem(404);
    read(alice, 0).await.problem(422);
}

#[tokio::test]
async fn sync_carries_replies_and_thread_changes_exactly_once() {
    let app = spawn_app().await;
    let (alice, bob) = (10, 20);
    let conv = app.user(alice).create_group(&[bob]).await;
    let root = app.user(alice).send_message(conv, "root").await;
    let sync = |cursor: &str| {
        let app = &app;
        let path = if cursor.is_empty() {
            "/v1/sync?limit=100".to_owned()
        } else {
            format!("/v1/sync?since={cursor}&limit=100")
        };
        async move { app.user(alice).get(&path).await.expect(200) }
    };
    let first = sync("").await;
    let cursor = first["nextCursor"].as_str().unwrap().to_owned();
    let reply = send(&app, conv, bob, Some(root), &[]).await;
    let delta = sync(&cursor).await;
    let entry = &delta["conversations"][0];
    assert_eq!(entry["unreadThreads"], 1, "{entry}");
    assert_eq!(
        entry["unreadCount"], 0,
        "a reply is not a top-level message: {entry}"
    );
    let reply_shown: Vec<&Value> = entry["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["seq"] == reply)
        .collect();
    assert_eq!(reply_shown[0]["threadRootSeq"], root, "{entry}");
    let threads = entry["threads"].as_array().unwrap();
    assert_eq!(threads.len(), 1, "{entry}");
    assert_eq!(threads[0]["rootSeq"], root);
    assert_eq!(threads[0]["replyCount"], 1);
    assert_eq!(threads[0]["unread"], true);
    assert_eq!(threads[0]["following"], true);
    let next = delta["nextCursor"].as_str().unwrap().to_owned();
    let quiet = sync(&next).await;
    assert_eq!(quiet["conversations"], json!([]), "nothing twice: {quiet}");
    // Read on another device: the next sync has the thread's new place.
    app.user(alice)
        .post(
            &format!("/v1/conversations/{conv}/threads/{root}/read"),
            json!({"seq": reply}),
        )
        .await
        .expect(200);
    let read = sync(&next).await;
    let entry = &read["conversations"][0];
    assert_eq!(entry["unreadThreads"], 0, "{entry}");
    assert_eq!(entry["threads"][0]["lastReadSeq"], reply, "{entry}");
    assert_eq!(entry["threads"][0]["unread"], false, "{entry}");
    let after = read["nextCursor"].as_str().unwrap();
    assert_eq!(sync(after).await["conversations"], json!([]));
}
