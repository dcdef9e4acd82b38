//! Reactions: idempotent PUT and DELETE, one key per emoji (its shortcode counts as it),
//! counts kept exact by the changing transaction and checked against the reaction rows,
//! history and sync showing them, a reaction.added or reaction.removed per change in
//! commit order, the per-message key limit under concurrent writers, and a delete that
//! clears a message's reactions.

use chatpipe_schemas::ChatEvent;
use chatpipe_tests::{spawn_app, spawn_app_with, TestApp};
use futures::future::join_all;
use serde_json::{json, Value};

/// The path of `key` (URL-encoded) on message `seq`.
fn path(conv: i64, seq: i64, key: &str) -> String {
    let key: String = url::form_urlencoded::byte_serialize(key.as_bytes()).collect();
    format!("/v1/conversations/{conv}/messages/{seq}/reactions/{key}")
}

/// One key of a message's reactions: `(key, count, me)`.
type Key = (String, i64, bool);

/// The keys of a reactions list.
fn keys(reactions: &Value) -> Vec<Key> {
    reactions
        .as_array()
        .map(|list| {
            list.iter()
                .map(|r| {
                    (
                        r["key"].as_str().unwrap().to_owned(),
                        r["count"].as_i64().unwrap(),
                        r["me"].as_bool().unwrap(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn k(key: &str, count: i64, me: bool) -> Key {
    (key.to_owned(), count, me)
}

/// Every count row equals the number of reaction rows it counts, and no key is without
/// its count row: `(seq, key, count)` from the rows themselves.
async fn counted_rows(app: &TestApp, conv: i64) -> Vec<(i64, String, i64)> {
    let counts: Vec<(i64, String, i64)> = sqlx::query_as(
        "SELECT seq, reaction, count FROM message_reaction_count
          WHERE conversation_id = $1 ORDER BY seq, reaction",
    )
    .bind(conv)
    .fetch_all(&app.pool)
    .await
    .unwrap();
    let rows: Vec<(i64, String, i64)> = sqlx::query_as(
        "SELECT seq, reaction, count(*) FROM message_reaction
          WHERE conversation_id = $1 GROUP BY seq, reaction ORDER BY seq, reaction",
    )
    .bind(conv)
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(counts, rows, "the counts are the rows' counts");
    counts
}

fn reaction_events(events: Vec<ChatEvent>) -> Vec<(&'static str, i64, i64, String, i64)> {
    events
        .into_iter()
        .filter_map(|e| match e {
            ChatEvent::ReactionAdded(r) => {
                Some(("added", r.seq.get(), r.user_id.get(), r.key, r.count))
            }
            ChatEvent::ReactionRemoved(r) => {
                Some(("removed", r.seq.get(), r.user_id.get(), r.key, r.count))
            }
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn reactions_are_idempotent_counted_exactly_and_shown_in_history_and_sync() {
    let app = spawn_app().await;
    let (alice, bob, carol, stranger) = (10, 20, 30, 99);
    let conv = app.user(alice).create_group(&[bob, carol]).await;
    let m1 = app.user(alice).send_message(conv, "lunch?").await;
    let m2 = app.user(bob).send_message(conv, "yes").await;
    let first = app.user(alice).get("/v1/sync?limit=200").await.expect(200);
    let cursor = first["nextCursor"].as_str().unwrap().to_owned();

    let put = app.user(bob).put(&path(conv, m1, "👍")).await.expect(200);
    assert_eq!(put["conversationId"], conv);
    assert_eq!(put["seq"], m1);
    assert_eq!(keys(&put["reactions"]), vec![k("👍", 1, true)]);
    // Again: nothing changes, no event.
    let again = app.user(bob).put(&path(conv, m1, "👍")).await.expect(200);
    assert_eq!(keys(&again["reactions"]), vec![k("👍", 1, true)]);
    // A shortcode is its emoji: carol's +1 counts under 👍.
    let plus = app.user(carol).put(&path(conv, m1, "+1")).await.expect(200);
    assert_eq!(keys(&plus["reactions"]), vec![k("👍", 2, true)]);
    let parrot = app
        .user(carol)
        .put(&path(conv, m1, "party_parrot"))
        .await
        .expect(200);
    assert_eq!(
        keys(&parrot["reactions"]),
        vec![k("👍", 2, true), k("party_parrot", 1, true)],
        "keys in the order they first appeared"
    );
    app.user(alice).put(&path(conv, m2, "❤")).await.expect(200);

    // Refused, and nothing written: a stranger, an unknown seq or conversation (404), a
    // key that is neither an emoji nor a short name (400 naming it).
    app.user(stranger)
        .put(&path(conv, m1, "👍"))
        .await
        .problem(404);
    app.user(stranger)
        .delete(&path(conv, m1, "👍"))
        .await
        .problem(404);
    app.user(bob).put(&path(conv, 99, "👍")).await.problem(404);
    app.user(bob)
        .put(&path(conv + 1000, m1, "👍"))
        .await
        .problem(404);
    for bad in ["👍👍", "Thumbs Up", "<b>", &"x".repeat(33)] {
        let problem = app.user(bob).put(&path(conv, m1, bad)).await.problem(400);
        assert_eq!(problem["field"], "key", "{bad:?}: {problem}");
    }

    // History, as alice sees it (she has not reacted to m1; her ❤ on m2 is hers).
    let history = app
        .user(alice)
        .get(&format!("/v1/conversations/{conv}/messages"))
        .await
        .expect(200);
    let messages = history["messages"].as_array().unwrap();
    assert_eq!(
        keys(&messages[0]["reactions"]),
        vec![k("👍", 2, false), k("party_parrot", 1, false)]
    );
    assert_eq!(keys(&messages[1]["reactions"]), vec![k("❤️", 1, true)]);

    // Taking back: once counts, twice changes nothing; the last one removes the key.
    let removed = app
        .user(bob)
        .delete(&path(conv, m1, "👍"))
        .await
        .expect(200);
    assert_eq!(
        keys(&removed["reactions"]),
        vec![k("👍", 1, false), k("party_parrot", 1, false)]
    );
    app.user(bob)
        .delete(&path(conv, m1, "👍"))
        .await
        .expect(200);
    let gone = app
        .user(carol)
        .delete(&path(conv, m1, "party_parrot"))
        .await
        .expect(200);
    assert_eq!(keys(&gone["reactions"]), vec![k("👍", 1, true)]);

    assert_eq!(
        counted_rows(&app, conv).await,
        vec![(m1, "👍".to_owned(), 1), (m2, "❤️".to_owned(), 1)]
    );
    let s = |k: &str| k.to_owned();
    assert_eq!(
        reaction_events(app.outbox_events().await),
        vec![
            ("added", m1, bob, s("👍"), 1),
            ("added", m1, carol, s("👍"), 2),
            ("added", m1, carol, s("party_parrot"), 1),
            ("added", m2, alice, s("❤️"), 1),
            ("removed", m1, bob, s("👍"), 1),
            ("removed", m1, carol, s("party_parrot"), 0),
        ],
        "one event per change, in commit order, with the count after it"
    );

    // Sync: both messages changed since alice's cursor, each once, with its reactions.
    let changed = app
        .user(alice)
        .get(&format!("/v1/sync?since={cursor}&limit=200"))
        .await
        .expect(200);
    let entry = &changed["conversations"][0];
    assert_eq!(entry["conversationId"], conv, "{changed}");
    let synced: Vec<(i64, Vec<Key>)> = entry["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["seq"].as_i64().unwrap(), keys(&m["reactions"])))
        .collect();
    assert_eq!(
        synced,
        vec![(m1, vec![k("👍", 1, false)]), (m2, vec![k("❤️", 1, true)])]
    );
    let next = changed["nextCursor"].as_str().unwrap();
    let quiet = app
        .user(alice)
        .get(&format!("/v1/sync?since={next}&limit=200"))
        .await
        .expect(200);
    assert_eq!(quiet["conversations"], json!([]), "each change once");
    // A reaction after that cursor is in the next sync.
    app.user(bob).put(&path(conv, m2, "🎉")).await.expect(200);
    let later = app
        .user(alice)
        .get(&format!("/v1/sync?since={next}&limit=200"))
        .await
        .expect(200);
    let messages = later["conversations"][0]["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 1, "{later}");
    assert_eq!(
        keys(&messages[0]["reactions"]),
        vec![k("❤️", 1, true), k("🎉", 1, false)]
    );
}

#[tokio::test]
async fn concurrent_new_keys_stop_at_the_limit_and_a_delete_clears_the_reactions() {
    let app = spawn_app_with(|s| s.limits.max_reaction_keys = 3).await;
    let members: Vec<i64> = (20..30).collect();
    let alice = 10;
    let conv = app.user(alice).create_group(&members).await;
    let seq = app.user(alice).send_message(conv, "vote").await;

    // Ten members add ten different keys at once: three get in, seven are told why.
    let keys_of: Vec<String> = (0..10).map(|i| format!("option-{i}")).collect();
    let answers = join_all(members.iter().zip(&keys_of).map(|(user, key)| {
        let app = &app;
        async move { app.user(*user).put(&path(conv, seq, key)).await }
    }))
    .await;
    let statuses: Vec<u16> = answers.iter().map(|a| a.status).collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        3,
        "{statuses:?}"
    );
    for refused in answers.into_iter().filter(|a| a.status != 200) {
        let problem = refused.problem(409);
        assert_eq!(problem["type"], "/problems/reaction-limit");
    }
    let counted = counted_rows(&app, conv).await;
    assert_eq!(counted.len(), 3, "{counted:?}");
    // An existing key still takes more members; a fourth key does not.
    let existing = counted[0].1.clone();
    app.user(alice)
        .put(&path(conv, seq, &existing))
        .await
        .expect(200);
    app.user(alice)
        .put(&path(conv, seq, "🙂"))
        .await
        .problem(409);
    assert_eq!(reaction_events(app.outbox_events().await).len(), 4);

    // The delete takes the reactions with the body; the message takes no more.
    app.user(alice)
        .delete(&format!("/v1/conversations/{conv}/messages/{seq}"))
        .await
        .expect(204);
    assert_eq!(counted_rows(&app, conv).await, vec![]);
    let problem = app
        .user(alice)
        .put(&path(conv, seq, "🙂"))
        .await
        .problem(409);
    assert_eq!(problem["type"], "/problems/message-deleted");
    let history = app
        .user(alice)
        .get(&format!("/v1/conversations/{conv}/messages"))
        .await
        .expect(200);
    assert!(
        history["messages"][0].get("reactions").is_none(),
        "{history}"
    );
}
