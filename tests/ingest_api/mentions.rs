//! Mentions: a message names members; each named member's `mentionCount` (inbox and
//! sync) counts the messages above their read watermark that name them and are not
//! deleted, kept by counters the writers move (never a COUNT at read time). Checked
//! against the test's own model of what it sent, edited and deleted, after every step,
//! with reads racing edits and deletes; and against the mention rows themselves.

use std::collections::{BTreeMap, BTreeSet};

use chatpipe_schemas::ChatEvent;
use chatpipe_tests::{spawn_app, spawn_app_with, TestApp};
use futures::future::join_all;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use uuid::Uuid;

/// What the test sent: seq -> (the members it names now, deleted).
type Model = BTreeMap<i64, (BTreeSet<i64>, bool)>;

async fn send(app: &TestApp, conv: i64, sender: i64, mentions: &[i64]) -> Value {
    app.user(sender)
        .post(
            &format!("/v1/conversations/{conv}/messages"),
            json!({"clientMsgId": Uuid::new_v4(), "body": "hey", "mentions": mentions}),
        )
        .await
        .expect(201)
}

async fn mention_count(app: &TestApp, user: i64, conv: i64) -> i64 {
    let inbox = app.user(user).get("/v1/inbox?limit=200").await.expect(200);
    inbox["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["conversationId"] == conv)
        .map(|c| c["mentionCount"].as_i64().unwrap())
        .unwrap_or_else(|| panic!("{conv} is in {user}'s inbox: {inbox}"))
}

/// Every member's mentionCount equals the model's count above their watermark (read
/// from PostgreSQL), and their counters equal their rows.
async fn check(app: &TestApp, conv: i64, members: &[i64], model: &Model, step: &str) {
    for &user in members {
        let (read, _) = app.watermarks(conv, user).await;
        let expected = model
            .range(read + 1..)
            .filter(|(_, (named, deleted))| !deleted && named.contains(&user))
            .count() as i64;
        assert_eq!(
            mention_count(app, user, conv).await,
            expected,
            "{step}: user {user}, watermark {read}"
        );
        let counters: (i64, i64, i64, i64) = sqlx::query_as(
            "SELECT m.mention_count, m.mention_read,
                    (SELECT count(*) FROM message_mention n
                      WHERE n.conversation_id = m.conversation_id AND n.user_id = m.user_id),
                    (SELECT count(*) FROM message_mention n
                      WHERE n.conversation_id = m.conversation_id AND n.user_id = m.user_id
                        AND n.seq <= m.last_read_seq)
               FROM conversation_member m WHERE m.conversation_id = $1 AND m.user_id = $2",
        )
        .bind(conv)
        .bind(user)
        .fetch_one(&app.pool)
        .await
        .unwrap();
        assert_eq!(
            (counters.0, counters.1),
            (counters.2, counters.3),
            "{step}: user {user}'s counters are their rows"
        );
    }
}

#[tokio::test]
async fn mention_counts_stay_exact_under_sends_edits_deletes_and_racing_reads() {
    let app = spawn_app().await;
    let alice = 10;
    let others: Vec<i64> = (20..26).collect();
    let members: Vec<i64> = std::iter::once(alice)
        .chain(others.iter().copied())
        .collect();
    let conv = app.user(alice).create_group(&others).await;
    let mut model = Model::new();
    // A new mix each run; the seed is in every failure's message.
    let seed: u64 = rand::random();
    let mut rng = StdRng::seed_from_u64(seed);

    for round in 0..8 {
        // Sends, a third of them naming one to three members (sometimes the sender).
        for _ in 0..12 {
            let sender = members[rng.random_range(0..members.len())];
            let named: BTreeSet<i64> = if rng.random_bool(0.35) {
                (0..rng.random_range(1..=3))
                    .map(|_| members[rng.random_range(0..members.len())])
                    .collect()
            } else {
                BTreeSet::new()
            };
            let list: Vec<i64> = named.iter().copied().collect();
            let seq = send(&app, conv, sender, &list).await["seq"]
                .as_i64()
                .unwrap();
            let named = named.into_iter().filter(|u| *u != sender).collect();
            model.insert(seq, (named, false));
            // The sender has read their own message, and what they passed.
        }
        check(
            &app,
            conv,
            &members,
            &model,
            &format!("seed {seed}, round {round}: sends"),
        )
        .await;

        // Edits that change who is named and deletes, racing reads from two devices.
        let live: Vec<i64> = model
            .iter()
            .filter(|(_, m)| !m.1)
            .map(|(s, _)| *s)
            .collect();
        let mut edits = Vec::new();
        // Four different messages: two edits of one message race each other, and which
        // commits last is not the test's to know. An edit may race the delete (below)
        // of its message: either order is checked.
        for &seq in live.choose_multiple(&mut rng, 4) {
            let named: BTreeSet<i64> = others
                .iter()
                .copied()
                .filter(|_| rng.random_bool(0.3))
                .collect();
            edits.push((seq, named));
        }
        let deleted = live[rng.random_range(0..live.len())];
        let top = *model.keys().last().unwrap();
        let readers: Vec<(i64, i64)> = others
            .iter()
            .map(|u| (*u, rng.random_range(0..=top)))
            .collect();
        let senders: BTreeMap<i64, i64> = sqlx::query_as::<_, (i64, i64)>(
            "SELECT seq, sender_id FROM message WHERE conversation_id = $1",
        )
        .bind(conv)
        .fetch_all(&app.pool)
        .await
        .unwrap()
        .into_iter()
        .collect();
        let edit_requests = edits.iter().map(|(seq, named)| {
            let app = &app;
            let sender = senders[seq];
            let list: Vec<i64> = named.iter().copied().collect();
            async move {
                let path = format!("/v1/conversations/{conv}/messages/{seq}");
                app.user(sender)
                    .patch(&path, json!({"body": "edited", "mentions": list}))
                    .await
            }
        });
        let delete = async {
            let path = format!("/v1/conversations/{conv}/messages/{deleted}");
            app.user(alice).delete(&path).await
        };
        let reads = readers.iter().flat_map(|(user, seq)| {
            let app = &app;
            [*seq, seq / 2].map(move |s| async move {
                if s > 0 {
                    app.user(*user).mark_read(conv, s).await;
                }
            })
        });
        let (edited, deleted_answer, _) =
            tokio::join!(join_all(edit_requests), delete, join_all(reads));
        assert_eq!(deleted_answer.status, 204);
        for ((seq, named), answer) in edits.into_iter().zip(edited) {
            let sender = senders[&seq];
            let entry = model.get_mut(&seq).unwrap();
            if answer.status == 409 {
                // Deleted first by the racing delete.
                assert_eq!(seq, deleted);
                continue;
            }
            let answer = answer.expect(200);
            let named: BTreeSet<i64> = named.into_iter().filter(|u| *u != sender).collect();
            let shown: BTreeSet<i64> = answer["mentions"]
                .as_array()
                .map(|a| a.iter().map(|v| v.as_i64().unwrap()).collect())
                .unwrap_or_default();
            assert_eq!(shown, named, "the edit answers who it names");
            entry.0 = named;
        }
        model.get_mut(&deleted).unwrap().1 = true;
        check(
            &app,
            conv,
            &members,
            &model,
            &format!("seed {seed}, round {round}: edits"),
        )
        .await;
    }

    // The events carry who each message names, as history does.
    let history = app
        .user(alice)
        .get(&format!(
            "/v1/conversations/{conv}/messages?afterSeq=0&limit=200"
        ))
        .await
        .expect(200);
    for m in history["messages"].as_array().unwrap() {
        let seq = m["seq"].as_i64().unwrap();
        let (named, deleted) = &model[&seq];
        let shown: BTreeSet<i64> = m["mentions"]
            .as_array()
            .map(|a| a.iter().map(|v| v.as_i64().unwrap()).collect())
            .unwrap_or_default();
        let expected = if *deleted {
            BTreeSet::new()
        } else {
            named.clone()
        };
        assert_eq!(shown, expected, "history of {seq}");
    }
    let mut last_named: BTreeMap<i64, BTreeSet<i64>> = BTreeMap::new();
    for event in app.outbox_events().await {
        match event {
            ChatEvent::MessageNew(m) if m.conversation_id.get() == conv => {
                last_named.insert(m.seq.get(), m.mentions.iter().map(|u| u.get()).collect());
            }
            ChatEvent::MessageEdited(m) if m.conversation_id.get() == conv => {
                last_named.insert(m.seq.get(), m.mentions.iter().map(|u| u.get()).collect());
            }
            _ => {}
        }
    }
    for (seq, (named, deleted)) in &model {
        if !deleted {
            assert_eq!(&last_named[seq], named, "the last event of {seq}");
        }
    }
}

#[tokio::test]
async fn bad_mentions_are_refused_everyone_is_for_admins_and_leaving_takes_the_mentions() {
    let app = spawn_app_with(|s| s.limits.max_mention_all_members = 3).await;
    let (alice, bob, carol, stranger) = (10, 20, 30, 99);
    let conv = app.user(alice).create_group(&[bob, carol]).await;
    let path = format!("/v1/conversations/{conv}/messages");
    let body =
        |mentions: Value| json!({"clientMsgId": Uuid::new_v4(), "body": "x", "mentions": mentions});
    for mentions in [
        json!([bob, stranger]),
        json!([0]),
        json!((1..=51).collect::<Vec<i64>>()),
        json!("bob"),
    ] {
        let problem = app
            .user(alice)
            .post(&path, body(mentions.clone()))
            .await
            .problem(422);
        let field = problem["field"].as_str().unwrap_or_default();
        assert!(field.starts_with("mentions"), "{mentions}: {problem}");
    }
    // A stranger learns nothing about who is a member: 404 as for anything else.
    app.user(stranger)
        .post(&path, body(json!([bob])))
        .await
        .problem(404);
    assert_eq!(app.count("SELECT count(*) FROM message").await, 0);

    // Naming oneself names nobody; a retry names nobody twice.
    let sent = body(json!([alice, bob]));
    let first = app.user(alice).post(&path, sent.clone()).await.expect(201)["seq"]
        .as_i64()
        .unwrap();
    app.user(alice).post(&path, sent).await.expect(200);
    assert_eq!(mention_count(&app, bob, conv).await, 1);
    assert_eq!(mention_count(&app, alice, conv).await, 0);
    let second = send(&app, conv, carol, &[bob]).await["seq"]
        .as_i64()
        .unwrap();
    assert_eq!(mention_count(&app, bob, conv).await, 2);

    // @all: for the group's admins (alice made it); a plain member may not. Bob's other
    // device hears of it in its next sync, once.
    let synced = app.user(bob).get("/v1/sync?limit=200").await.expect(200);
    let cursor = synced["nextCursor"].as_str().unwrap().to_owned();
    let everyone = |conv: i64, author: i64| {
        let app = &app;
        async move {
            app.user(author)
                .post(
                    &format!("/v1/conversations/{conv}/messages"),
                    json!({"clientMsgId": Uuid::new_v4(), "body": "@all", "mentionAll": true}),
                )
                .await
        }
    };
    everyone(conv, bob).await.problem(403);
    let all = everyone(conv, alice).await.expect(201)["seq"]
        .as_i64()
        .unwrap();
    assert_eq!(mention_count(&app, bob, conv).await, 3);
    assert_eq!(mention_count(&app, carol, conv).await, 1);
    let changed = app
        .user(bob)
        .get(&format!("/v1/sync?since={cursor}&limit=200"))
        .await
        .expect(200);
    let entry = &changed["conversations"][0];
    assert_eq!(entry["mentionCount"], 3, "{changed}");
    let newest = entry["messages"].as_array().unwrap().last().unwrap();
    assert_eq!(
        (newest["seq"].as_i64(), newest["mentions"].clone()),
        (Some(all), json!([bob, carol]))
    );
    let again = app
        .user(bob)
        .get(&format!(
            "/v1/sync?since={}&limit=200",
            changed["nextCursor"].as_str().unwrap()
        ))
        .await
        .expect(200);
    assert_eq!(again["conversations"], json!([]));
    // Not in a DIRECT conversation, nor in a group past the configured size.
    let direct = app.user(alice).open_direct(bob).await;
    assert_eq!(
        everyone(direct, alice).await.problem(422)["field"],
        "mentionAll"
    );
    let big = app.user(alice).create_group(&[bob, carol, 40]).await;
    assert_eq!(
        everyone(big, alice).await.problem(422)["field"],
        "mentionAll"
    );

    // GET /mentions: newest first, with unread; one page at a time.
    app.user(bob).mark_read(conv, all).await;
    assert_eq!(mention_count(&app, bob, conv).await, 0);
    let later = send(&app, conv, carol, &[bob]).await["seq"]
        .as_i64()
        .unwrap();
    let seqs = |page: &Value| -> Vec<(i64, bool)> {
        page["mentions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| (m["seq"].as_i64().unwrap(), m["unread"].as_bool().unwrap()))
            .collect()
    };
    let page = app.user(bob).get("/v1/mentions?limit=2").await.expect(200);
    assert_eq!(seqs(&page), vec![(later, true), (all, false)], "{page}");
    assert_eq!(page["mentions"][0]["senderId"], carol);
    let next = app
        .user(bob)
        .get(&format!(
            "/v1/mentions?limit=2&cursor={}",
            page["nextCursor"].as_str().unwrap()
        ))
        .await
        .expect(200);
    assert_eq!(seqs(&next), vec![(second, false), (first, false)], "{next}");
    if let Some(cursor) = next["nextCursor"].as_str() {
        let last = app
            .user(bob)
            .get(&format!("/v1/mentions?limit=2&cursor={cursor}"))
            .await
            .expect(200);
        assert_eq!(last["mentions"], json!([]), "{last}");
    }
    app.user(bob)
        .get("/v1/mentions?cursor=nope")
        .await
        .problem(400);
    assert_eq!(mention_count(&app, bob, conv).await, 1);

    // Leaving takes the mentions with the membership; coming back starts at none.
    app.user(bob)
        .delete(&format!("/v1/conversations/{conv}/members/{bob}"))
        .await
        .expect(204);
    let rows = app
        .count(&format!("SELECT count(*) FROM message_mention WHERE user_id = {bob} AND conversation_id = {conv}"))
        .await;
    assert_eq!(rows, 0);
    let mine = app.user(bob).get("/v1/mentions").await.expect(200);
    assert!(
        mine["mentions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["conversationId"] != conv),
        "{mine}"
    );
    app.user(alice)
        .post(
            &format!("/v1/conversations/{conv}/members"),
            json!({"userIds": [bob]}),
        )
        .await
        .expect(200);
    assert_eq!(mention_count(&app, bob, conv).await, 0);
}
