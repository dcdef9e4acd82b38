//! `GET /sync` in bounded answers: a sync over more than `sync.max_conversations`
//! conversations or `sync.max_bytes` of bodies goes on through continuations, and the
//! chain of syncs still reports every change exactly once, also when messages commit
//! while a client pages.

use std::collections::BTreeSet;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chatpipe_tests::{spawn_app_with, TestApp};
use futures::{stream, StreamExt};
use ingest_api::configuration::Bucket;
use serde_json::{json, Value};

const MAX_CONVERSATIONS: usize = 40;
const MAX_BYTES: usize = 16_000;

async fn app() -> TestApp {
    spawn_app_with(|s| {
        s.sync.max_conversations = MAX_CONVERSATIONS;
        s.sync.max_bytes = MAX_BYTES;
        let plenty = Bucket::OFF;
        s.rate_limits.sends = plenty;
        s.rate_limits.creates = plenty;
        s.rate_limits.member_changes = plenty;
        s.rate_limits.members_added = plenty;
    })
    .await
}

/// One answer, checked against the bounds.
async fn answer(app: &TestApp, user: i64, since: Option<&str>) -> Value {
    let path = match since {
        Some(cursor) => format!("/v1/sync?since={cursor}&limit=200"),
        None => "/v1/sync?limit=200".to_owned(),
    };
    let page = app.user(user).get(&path).await.expect(200);
    let entries = page["conversations"].as_array().unwrap();
    assert!(
        entries.len() <= MAX_CONVERSATIONS,
        "{} entries",
        entries.len()
    );
    let bodies: Vec<usize> = entries
        .iter()
        .flat_map(|e| e["messages"].as_array().cloned().unwrap_or_default())
        .map(|m| m["body"].as_str().map_or(0, str::len))
        .collect();
    let bytes: usize = bodies.iter().sum();
    assert!(
        bytes <= MAX_BYTES || bodies.len() == 1,
        "{bytes} bytes of bodies in {} messages",
        bodies.len()
    );
    page
}

/// A sync followed to its end: its answers and the cursor its last one hands out.
async fn follow(app: &TestApp, user: i64, since: Option<&str>) -> (Vec<Value>, String) {
    let mut answers = vec![answer(app, user, since).await];
    while answers.last().unwrap()["hasMore"] == true {
        assert!(answers.len() < 100, "a sync that does not end");
        let next = answers.last().unwrap()["nextCursor"]
            .as_str()
            .unwrap()
            .to_owned();
        answers.push(answer(app, user, Some(&next)).await);
    }
    let cursor = answers.last().unwrap()["nextCursor"].as_str().unwrap();
    (answers.clone(), cursor.to_owned())
}

/// What the answers carried: (conversation, seq, body) of every message, the member
/// conversations and the departures, each as often as it came.
#[derive(Default)]
struct Carried {
    messages: Vec<(i64, i64, Option<String>)>,
    conversations: Vec<i64>,
    left: Vec<i64>,
}

fn carried(answers: &[Value]) -> Carried {
    let mut all = Carried::default();
    for entry in answers
        .iter()
        .flat_map(|a| a["conversations"].as_array().unwrap())
    {
        let conv = entry["conversationId"].as_i64().unwrap();
        if entry["left"] == true {
            all.left.push(conv);
            continue;
        }
        assert_eq!(entry["hasMore"], false, "{entry}");
        all.conversations.push(conv);
        for m in entry["messages"].as_array().unwrap() {
            let body = m["body"].as_str().map(str::to_owned);
            all.messages.push((conv, m["seq"].as_i64().unwrap(), body));
        }
    }
    all
}

/// `got` is `expected`; else says what is missing and what is extra, ten of each.
#[track_caller]
fn same<T: Ord + std::fmt::Debug>(got: &BTreeSet<T>, expected: &BTreeSet<T>, what: &str) {
    let missing: Vec<&T> = expected.difference(got).take(10).collect();
    let extra: Vec<&T> = got.difference(expected).take(10).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{what}: {} expected, {} got; missing {missing:?}, extra {extra:?}",
        expected.len(),
        got.len()
    );
}

fn once<T: Ord + Clone + std::fmt::Debug>(items: &[T], what: &str) -> BTreeSet<T> {
    let set: BTreeSet<T> = items.iter().cloned().collect();
    assert_eq!(set.len(), items.len(), "{what}: something came twice");
    set
}

/// 500 conversations: the initial sync and a delta over all of them come in answers
/// within both bounds; a message sent to every conversation after the delta's first
/// answer, and an edit of a message the delta has not reached yet, come in the next
/// sync and not in this one; each message comes exactly once, as history holds it.
#[tokio::test]
async fn a_sync_over_500_conversations_pages_in_bounded_answers_each_change_once() {
    let app = app().await;
    let (alice, bob) = (10, 20);
    let mut convs: Vec<i64> = stream::iter(0..500)
        .map(|_| {
            let app = &app;
            async move { app.user(alice).create_group(&[bob]).await }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    convs.sort_unstable();

    let (initial, since) = follow(&app, bob, None).await;
    assert!(
        initial.len() >= 500 / MAX_CONVERSATIONS,
        "{} answers",
        initial.len()
    );
    let listed = once(&carried(&initial).conversations, "initial sync");
    same(&listed, &convs.iter().copied().collect(), "initial sync");

    // Two messages of 400 bytes to each: 400 kB of bodies, about 25 answers' worth.
    let body = "x".repeat(400);
    let round: Vec<(i64, i64)> = stream::iter(convs.iter().flat_map(|&c| [c, c]))
        .map(|conv| {
            let (app, body) = (&app, &body);
            async move { (conv, app.user(alice).send_message(conv, body).await) }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let gone = &convs[100..103];
    for &conv in gone {
        let path = format!("/v1/conversations/{conv}/members/{bob}");
        assert_eq!(app.user(alice).delete(&path).await.status, 204);
    }

    // The delta's first answer, then writes, then the rest of it.
    let first = answer(&app, bob, Some(&since)).await;
    assert_eq!(first["hasMore"], true, "the delta fits one answer");
    let meanwhile: Vec<(i64, i64)> = stream::iter(convs.clone())
        .map(|conv| {
            let app = &app;
            async move { (conv, app.user(alice).send_message(conv, "meanwhile").await) }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    // The lowest id comes last: the delta has not reached it.
    let edited = *round.iter().find(|(c, _)| *c == convs[0]).unwrap();
    app.user(alice)
        .patch(
            &format!("/v1/conversations/{}/messages/{}", edited.0, edited.1),
            json!({"body": "edited meanwhile"}),
        )
        .await
        .expect(200);
    let rest = first["nextCursor"].as_str().unwrap().to_owned();
    let (more, next) = follow(&app, bob, Some(&rest)).await;
    let delta: Vec<Value> = std::iter::once(first).chain(more).collect();
    assert!(delta.len() >= 10, "{} answers", delta.len());

    let this = carried(&delta);
    let members: BTreeSet<i64> = convs
        .iter()
        .filter(|c| !gone.contains(c))
        .copied()
        .collect();
    same(&once(&this.conversations, "delta"), &members, "delta");
    same(
        &once(&this.left, "departures"),
        &gone.iter().copied().collect(),
        "departures",
    );
    let keys: Vec<(i64, i64)> = this.messages.iter().map(|(c, s, _)| (*c, *s)).collect();
    let expected: BTreeSet<(i64, i64)> = round
        .iter()
        .filter(|(c, _)| !gone.contains(c))
        .filter(|&&m| m != edited)
        .copied()
        .collect();
    same(
        &once(&keys, "delta's messages"),
        &expected,
        "delta's messages",
    );

    // The next sync: what committed after the delta's first answer, and nothing else.
    let (after, _) = follow(&app, bob, Some(&next)).await;
    let that = carried(&after);
    let keys: Vec<(i64, i64)> = that.messages.iter().map(|(c, s, _)| (*c, *s)).collect();
    let mut expected: BTreeSet<(i64, i64)> = meanwhile
        .iter()
        .filter(|(c, _)| !gone.contains(c))
        .copied()
        .collect();
    expected.insert(edited);
    same(
        &once(&keys, "next sync's messages"),
        &expected,
        "next sync's messages",
    );
    assert!(that.left.is_empty(), "departures again: {:?}", that.left);
    let edit = that.messages.iter().find(|(c, s, _)| (*c, *s) == edited);
    assert_eq!(edit.unwrap().2.as_deref(), Some("edited meanwhile"));
}

/// A continuation is signed like a cursor: one changed on the way, or another user's,
/// is 400 with the field named.
#[tokio::test]
async fn a_forged_or_borrowed_continuation_is_400() {
    let app = app().await;
    let (alice, bob) = (10, 20);
    for _ in 0..MAX_CONVERSATIONS + 1 {
        app.user(alice).create_group(&[bob]).await;
    }
    let first = answer(&app, bob, None).await;
    assert_eq!(first["hasMore"], true);
    let rest = first["nextCursor"].as_str().unwrap();
    let (payload, signature) = rest.split_once('.').unwrap();
    let payload = String::from_utf8(URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap();
    let mut continuation: Value = serde_json::from_str(&payload).unwrap();
    continuation["before"] = json!(i64::MAX);
    let forged = format!(
        "{}.{signature}",
        URL_SAFE_NO_PAD.encode(continuation.to_string())
    );
    for (user, cursor) in [(bob, forged.as_str()), (alice, rest)] {
        let problem = app
            .user(user)
            .get(&format!("/v1/sync?since={cursor}"))
            .await
            .problem(400);
        assert_eq!(problem["field"], "since", "{cursor}");
    }
    // Unchanged, it goes on.
    let second = answer(&app, bob, Some(rest)).await;
    assert_eq!(second["hasMore"], false);
    assert_eq!(second["conversations"].as_array().unwrap().len(), 1);
}

/// One conversation whose changed bodies alone pass `max_bytes`: it comes with the newest
/// messages that fit and `hasMore`, and history below the first one holds the rest.
#[tokio::test]
async fn a_conversation_larger_than_the_byte_bound_comes_with_its_newest_and_has_more() {
    let app = app().await;
    let conv = app.user(10).create_group(&[20]).await;
    let (_, since) = follow(&app, 20, None).await;
    let body = "y".repeat(1_000);
    for _ in 0..(MAX_BYTES / body.len() + 5) {
        app.user(10).send_message(conv, &body).await;
    }
    let (answers, _) = follow(&app, 20, Some(&since)).await;
    let entry = &answers[0]["conversations"][0];
    assert_eq!(entry["hasMore"], true, "{entry}");
    let seqs: Vec<i64> = entry["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["seq"].as_i64().unwrap())
        .collect();
    let last = (MAX_BYTES / body.len() + 5) as i64;
    let fit = (MAX_BYTES / body.len()) as i64;
    assert_eq!(seqs, ((last - fit + 1)..=last).collect::<Vec<_>>());
    let later: usize = answers[1..]
        .iter()
        .map(|a| a["conversations"].as_array().unwrap().len())
        .sum();
    assert_eq!(later, 0, "the conversation came again");
}
