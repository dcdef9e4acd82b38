//! One-call sync: after an initial sync, each sync with the last cursor returns every
//! change since (new, edited and deleted messages, watermarks, membership) exactly once.

use std::collections::{BTreeMap, HashMap};

use chatpipe_tests::{spawn_app, spawn_app_with, TestApp};
use futures::{stream, StreamExt};
use ingest_api::configuration::Bucket;
use serde_json::{json, Value};

async fn sync(app: &TestApp, user: i64, since: Option<&str>) -> Value {
    let path = match since {
        Some(cursor) => format!("/v1/sync?since={cursor}&limit=200"),
        None => "/v1/sync?limit=200".to_owned(),
    };
    app.user(user).get(&path).await.expect(200)
}

fn cursor(page: &Value) -> String {
    page["nextCursor"].as_str().expect("nextCursor").to_owned()
}

/// A message as a client keeps it: its body, or `None` once deleted.
type Copy = BTreeMap<(i64, i64), Option<String>>;

/// Applies one sync page to a client's copy; returns the keys it carried.
fn apply(copy: &mut Copy, page: &Value) -> Vec<(i64, i64)> {
    let mut carried = Vec::new();
    for entry in page["conversations"].as_array().unwrap() {
        let conv = entry["conversationId"].as_i64().unwrap();
        assert_eq!(entry["hasMore"], false, "{entry}");
        let messages = entry["messages"].as_array().unwrap();
        let seqs: Vec<i64> = messages
            .iter()
            .map(|m| m["seq"].as_i64().unwrap())
            .collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "ascending: {seqs:?}");
        for m in messages {
            let key = (conv, m["seq"].as_i64().unwrap());
            let body = m["body"].as_str().map(str::to_owned);
            assert_eq!(body.is_none(), m["deleted"] == true, "{m}");
            copy.insert(key, body);
            carried.push(key);
        }
    }
    carried
}

/// What history says now, for every conversation in `convs`.
async fn history(app: &TestApp, user: i64, convs: &[i64]) -> Copy {
    let mut all = Copy::new();
    for &conv in convs {
        let page = app
            .user(user)
            .get(&format!(
                "/v1/conversations/{conv}/messages?afterSeq=0&limit=200"
            ))
            .await
            .expect(200);
        assert_eq!(page["hasMore"], false);
        for m in page["messages"].as_array().unwrap() {
            all.insert(
                (conv, m["seq"].as_i64().unwrap()),
                m["body"].as_str().map(str::to_owned),
            );
        }
    }
    all
}

#[tokio::test]
async fn an_initial_sync_is_the_inbox_and_its_cursor_then_returns_nothing() {
    let app = spawn_app().await;
    let busy = app.user(10).create_group(&[20]).await;
    app.user(10).send_message(busy, "hello").await;
    let empty = app.user(20).create_group(&[10]).await;

    let first = sync(&app, 20, None).await;
    let entries = first["conversations"].as_array().unwrap();
    assert_eq!(entries.len(), 2);
    let inbox = app.user(20).get("/v1/inbox").await.expect(200);
    for (entry, listed) in entries
        .iter()
        .zip(inbox["conversations"].as_array().unwrap())
    {
        for field in [
            "conversationId",
            "lastSeq",
            "lastReadSeq",
            "unreadCount",
            "type",
        ] {
            assert_eq!(entry[field], listed[field], "{field}: {entry} vs {listed}");
        }
        assert_eq!(entry["messages"], json!([]));
        // Initial: hasMore says there is history to page.
        assert_eq!(entry["hasMore"], entry["conversationId"] == busy, "{entry}");
    }
    assert!(entries.iter().any(|e| e["conversationId"] == empty));

    let again = sync(&app, 20, Some(&cursor(&first))).await;
    assert_eq!(again["conversations"], json!([]), "nothing changed");
    let still = sync(&app, 20, Some(&cursor(&again))).await;
    assert_eq!(still["conversations"], json!([]));
}

/// 30 conversations, 1,000 messages in two rounds with edits and deletes mixed in (also
/// of messages older than the first cursor), synced after each round: each sync carries
/// exactly the messages changed in its round, once, in their state at its time, and a
/// client that applies them holds what history holds.
#[tokio::test]
async fn sync_after_1000_messages_across_30_conversations_returns_every_change_once() {
    // One sender writes all 1,000 as fast as the test can: past the per-user limit.
    let app = spawn_app_with(|s| {
        s.rate_limits.sends = Bucket {
            rate: 100_000,
            per_secs: 1,
            burst: 100_000,
        }
    })
    .await;
    let (alice, bob) = (10, 20);
    let mut convs = Vec::new();
    for _ in 0..30 {
        convs.push(app.user(alice).create_group(&[bob]).await);
    }
    // Two messages each before bob's first sync; his copy starts from history.
    let mut older = Vec::new();
    for &conv in &convs {
        for body in ["old one", "old two"] {
            older.push((conv, app.user(alice).send_message(conv, body).await));
        }
    }
    let first = sync(&app, bob, None).await;
    let mut copy = history(&app, bob, &convs).await;
    let mut since = cursor(&first);

    let mut sent: Vec<(i64, i64)> = Vec::new();
    let mut deleted: std::collections::HashSet<(i64, i64)> = Default::default();
    for (round, count) in [(1, 600usize), (2, 400)] {
        let new: Vec<(i64, i64)> = stream::iter(0..count)
            .map(|i| {
                let (app, conv) = (&app, convs[i % convs.len()]);
                async move {
                    (
                        conv,
                        app.user(alice)
                            .send_message(conv, &format!("r{round} #{i}"))
                            .await,
                    )
                }
            })
            .buffer_unordered(16)
            .collect()
            .await;
        // Edits and deletes: of this round's messages, of the last round's and of the
        // ones older than the first cursor.
        let earlier = if round == 1 { &older } else { &sent };
        let mut changed: HashMap<(i64, i64), &str> = HashMap::new();
        for (i, &(conv, seq)) in new.iter().chain(earlier).enumerate().step_by(23) {
            let path = format!("/v1/conversations/{conv}/messages/{seq}");
            // (A deleted message cannot be edited: those get another delete, a no-op
            // that sync must not report.)
            if i % 2 == 0 && !deleted.contains(&(conv, seq)) {
                app.user(alice)
                    .patch(&path, json!({"body": format!("edited in round {round}")}))
                    .await
                    .expect(200);
                changed.insert((conv, seq), "edited");
            } else {
                assert_eq!(app.user(alice).delete(&path).await.status, 204);
                if deleted.insert((conv, seq)) {
                    changed.insert((conv, seq), "deleted");
                }
            }
        }
        // A message edited, then deleted, in one round: one entry, deleted.
        let (conv, seq) = new[1];
        let path = format!("/v1/conversations/{conv}/messages/{seq}");
        app.user(alice)
            .patch(&path, json!({"body": "briefly"}))
            .await
            .expect(200);
        assert_eq!(app.user(alice).delete(&path).await.status, 204);
        deleted.insert((conv, seq));

        let page = sync(&app, bob, Some(&since)).await;
        let carried = apply(&mut copy, &page);
        let mut expected: Vec<(i64, i64)> = new.to_vec();
        expected.extend(changed.keys().copied());
        expected.sort_unstable();
        expected.dedup();
        let mut got = carried.clone();
        got.sort_unstable();
        got.dedup();
        assert_eq!(
            got.len(),
            carried.len(),
            "round {round}: a message came twice"
        );
        assert_eq!(got, expected, "round {round}: exactly the changed messages");
        assert_eq!(copy, history(&app, bob, &convs).await, "round {round}");
        // Bob's unread counts: the messages past his watermark that are not deleted,
        // counted row by row in PostgreSQL (the API keeps them as arithmetic on counters).
        for entry in page["conversations"].as_array().unwrap() {
            let conv = entry["conversationId"].as_i64().unwrap();
            let unread = app
                .count(&format!(
                    "SELECT count(*) FROM message m JOIN conversation_member cm
                         ON cm.conversation_id = m.conversation_id AND cm.user_id = {bob}
                      WHERE m.conversation_id = {conv} AND m.seq > cm.last_read_seq
                        AND m.deleted_at IS NULL"
                ))
                .await;
            assert_eq!(
                entry["unreadCount"], unread,
                "round {round}, conversation {conv}"
            );
        }
        since = cursor(&page);
        sent = new;
    }
    assert_eq!(copy.len(), 60 + 1000);
    let last = sync(&app, bob, Some(&since)).await;
    assert_eq!(
        last["conversations"],
        json!([]),
        "every change was carried once"
    );
}

#[tokio::test]
async fn reads_elsewhere_and_membership_changes_reach_the_next_sync() {
    let app = spawn_app().await;
    let (alice, bob) = (10, 20);
    let stays = app.user(alice).create_group(&[bob]).await;
    let removed = app.user(alice).create_group(&[bob]).await;
    for _ in 0..3 {
        app.user(alice).send_message(stays, "hi").await;
    }
    let since = cursor(&sync(&app, bob, None).await);

    // Bob reads on another device; alice removes him from one group and adds him to a
    // new one.
    app.user(bob).mark_read(stays, 2).await;
    app.user(alice)
        .delete(&format!("/v1/conversations/{removed}/members/{bob}"))
        .await;
    let added = app.user(alice).create_group(&[bob]).await;

    let page = sync(&app, bob, Some(&since)).await;
    let entries: HashMap<i64, &Value> = page["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["conversationId"].as_i64().unwrap(), e))
        .collect();
    assert_eq!(entries.len(), 3, "{page}");
    assert_eq!(entries[&stays]["lastReadSeq"], 2);
    assert_eq!(entries[&stays]["unreadCount"], 1);
    assert_eq!(entries[&stays]["messages"], json!([]), "no message changed");
    assert_eq!(
        *entries[&removed],
        json!({"conversationId": removed, "left": true})
    );
    assert_eq!(entries[&added]["lastSeq"], 0);
    // Alice's side: her removal of bob changed a conversation of hers.
    let next = sync(&app, bob, Some(&cursor(&page))).await;
    assert_eq!(next["conversations"], json!([]));
}

#[tokio::test]
async fn a_cursor_not_handed_to_the_caller_is_400() {
    let app = spawn_app().await;
    let conv = app.user(10).create_group(&[20]).await;
    app.user(10).send_message(conv, "x").await;
    let alices = cursor(&sync(&app, 10, None).await);
    let (snapshot, signature) = alices.split_once('.').unwrap();
    use base64::Engine;
    let forged = format!(
        "{}.{signature}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("1:2:")
    );
    for bad in [
        "garbage".to_owned(),
        format!("{snapshot}."),
        forged,
        format!("{snapshot}.{}", &signature[1..]),
    ] {
        let problem = app
            .user(10)
            .get(&format!("/v1/sync?since={bad}"))
            .await
            .problem(400);
        assert_eq!(problem["field"], "since", "{bad}");
    }
    // Another user's cursor is no cursor for bob.
    let problem = app
        .user(20)
        .get(&format!("/v1/sync?since={alices}"))
        .await
        .problem(400);
    assert_eq!(problem["field"], "since");
    for limit in ["0", "201", "x"] {
        app.user(10)
            .get(&format!("/v1/sync?limit={limit}"))
            .await
            .problem(400);
    }
    app.user(10).get("/v1/sync?sinse=x").await.problem(400);
}

/// More changes in a conversation than `limit`: the newest `limit` of them and `hasMore`;
/// history below the first one fills in the rest.
#[tokio::test]
async fn more_changes_than_the_limit_give_the_newest_and_has_more() {
    let app = spawn_app().await;
    let conv = app.user(10).create_group(&[20]).await;
    let since = cursor(&sync(&app, 20, None).await);
    for i in 1..=8 {
        app.user(10).send_message(conv, &format!("m{i}")).await;
    }
    let page = app
        .user(20)
        .get(&format!("/v1/sync?since={since}&limit=5"))
        .await
        .expect(200);
    let entry = &page["conversations"][0];
    let seqs: Vec<i64> = entry["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, vec![4, 5, 6, 7, 8]);
    assert_eq!(entry["hasMore"], true);
    let exactly = app
        .user(20)
        .get(&format!("/v1/sync?since={since}&limit=8"))
        .await
        .expect(200);
    assert_eq!(exactly["conversations"][0]["hasMore"], false);
}
