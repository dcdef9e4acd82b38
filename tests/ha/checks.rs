//! What must hold after the primary moved, each asked of an independent source: the new
//! primary's rows (asked directly), the test's chat.events, what the clients received.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use chatpipe_schemas::ChatEvent;
use chatpipe_tests::audit::is_firing;
use chatpipe_tests::stream::{Pipeline, Record};
use pipeline::audit::alarm;
use serde_json::Value;

use crate::load::{Load, Report};
use crate::nodes::Node;
use crate::{World, ALICE, BOB, CAROL, RECOVERY};

fn is_message(conversation: i64, seq: i64) -> impl Fn(&Value) -> bool {
    move |f| f["type"] == "message.new" && f["conversationId"] == conversation && f["seq"] == seq
}

/// A sync cursor of bob's, handed out now.
pub async fn sync_cursor(p: &Pipeline) -> String {
    p.app.user(BOB).get("/v1/sync").await.expect(200)["nextCursor"]
        .as_str()
        .expect("a sync cursor")
        .to_owned()
}

/// Carol's removal, committed just before the fault, holds: a message sent to the group
/// now reaches bob and not her (a marker in a group of her own, sent once bob has the
/// message, comes after anything fanout meant for her: one deliveries partition).
pub async fn member_left_holds(w: &mut World) {
    let app = &w.p.app;
    let after = app
        .user(ALICE)
        .send_message(w.left_group, "after carol left")
        .await;
    w.bob_ws
        .until(RECOVERY, is_message(w.left_group, after))
        .await;
    let marker = app.user(ALICE).send_message(w.carol_only, "marker").await;
    w.carol_ws
        .until(RECOVERY, is_message(w.carol_only, marker))
        .await;
    let leaked: Vec<Value> = w
        .carol_ws
        .drain()
        .iter()
        .filter(|f| f["type"] == "message.new" && f["conversationId"] == w.left_group)
        .cloned()
        .collect();
    assert!(
        leaked.is_empty(),
        "carol (user {CAROL}) got the group's messages after she left: {leaked:?}"
    );
}

/// A read receipt through Kafka: the receipts processor writes it to the new primary.
pub async fn read_reaches(w: &World, new_primary: &Node, load: &Load) {
    let conversation = w.conversations[0];
    let to = load
        .last_acked(conversation)
        .expect("a send into the first conversation");
    w.p.app
        .user(BOB)
        .post(
            &format!("/v1/conversations/{conversation}/read"),
            serde_json::json!({"seq": to}),
        )
        .await
        .expect(202);
    let deadline = Instant::now() + RECOVERY;
    loop {
        let mark: Option<i64> = sqlx::query_scalar(
            "SELECT last_read_seq FROM conversation_member WHERE conversation_id = $1 AND user_id = $2",
        )
        .bind(conversation)
        .bind(BOB)
        .fetch_optional(&new_primary.pool)
        .await
        .unwrap();
        if mark == Some(to) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "bob's read to {to} not on the new primary within {RECOVERY:?}: {mark:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// (conversation, seq) -> body of every message.new on the test's chat.events.
fn new_messages(records: &[Record]) -> Vec<((i64, i64), String)> {
    records
        .iter()
        .filter_map(|r| match &r.event {
            ChatEvent::MessageNew(m) => {
                Some(((m.conversation_id.get(), m.seq.get()), m.body.clone()))
            }
            _ => None,
        })
        .collect()
}

/// Every 201 is on the new primary (asked directly) with its body, and nothing else;
/// seqs are gapless; every 201 reaches chat.events (the connector streamed on from its
/// synchronized slot), and every message.new there is a row of the new primary with the
/// same body: no phantom of a transaction the old primary alone had. Returns the number
/// of messages acknowledged and of their records on the topic.
pub async fn every_201_stored_and_streamed(
    w: &World,
    new_primary: &Node,
    report: &Report,
) -> (usize, usize) {
    let every: Vec<i64> = w
        .conversations
        .iter()
        .copied()
        .chain([w.left_group, w.carol_only])
        .collect();
    let rows: Vec<(i64, i64, String)> = sqlx::query_as(
        "SELECT conversation_id, seq, body FROM message WHERE conversation_id = ANY($1) ORDER BY 1, 2",
    )
    .bind(&every)
    .fetch_all(&new_primary.pool)
    .await
    .unwrap();
    let stored: BTreeMap<(i64, i64), String> =
        rows.into_iter().map(|(c, s, b)| ((c, s), b)).collect();
    let of_the_load: BTreeMap<(i64, i64), String> = stored
        .iter()
        .filter(|((c, _), _)| w.conversations.contains(c))
        .map(|(k, b)| (*k, b.clone()))
        .collect();
    let acked: BTreeMap<(i64, i64), String> = report.acked.iter().cloned().collect();
    assert_eq!(
        of_the_load, acked,
        "every 201 is on the new primary, body and all, and nothing else"
    );
    for c in &w.conversations {
        let seqs: Vec<i64> = acked
            .keys()
            .filter(|(cc, _)| cc == c)
            .map(|(_, s)| *s)
            .collect();
        assert_eq!(
            seqs,
            (1..=seqs.len() as i64).collect::<Vec<_>>(),
            "conversation {c} is gapless"
        );
    }

    let want: BTreeSet<(i64, i64)> = acked.keys().copied().collect();
    let records =
        w.p.consume_until(Duration::from_secs(120), |rs| {
            let seen: BTreeSet<(i64, i64)> = new_messages(rs).into_iter().map(|(k, _)| k).collect();
            seen.is_superset(&want)
        })
        .await;
    let on_topic = new_messages(&records);
    let phantoms: Vec<_> = on_topic
        .iter()
        .filter(|(k, body)| stored.get(k) != Some(body))
        .collect();
    assert!(
        phantoms.is_empty(),
        "events the new primary lacks: {phantoms:?}"
    );
    let streamed = on_topic.iter().filter(|(k, _)| want.contains(k)).count();
    (want.len(), streamed)
}

/// The client's catch-up over REST has every message.
pub async fn catch_up_complete(w: &World, report: &Report) {
    for c in &w.conversations {
        let page =
            w.p.app
                .user(BOB)
                .get(&format!(
                    "/v1/conversations/{c}/messages?afterSeq=0&limit=200"
                ))
                .await
                .expect(200);
        let got: BTreeSet<i64> = page["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["seq"].as_i64().unwrap())
            .collect();
        let want: BTreeSet<i64> = report
            .acked
            .iter()
            .filter(|((cc, _), _)| cc == c)
            .map(|((_, s), _)| *s)
            .collect();
        assert_eq!(got, want, "bob's catch-up of conversation {c}");
    }
}

/// A sync cursor handed out before the fault is of the old timeline: refused, and an
/// initial sync gives one that works.
pub async fn old_cursor_stale(p: &Pipeline, cursor: &str) {
    let problem = p
        .app
        .user(BOB)
        .get(&format!("/v1/sync?since={cursor}"))
        .await
        .problem(409);
    assert_eq!(problem["type"], "/problems/cursor-stale", "{problem}");
    let fresh = sync_cursor(p).await;
    p.app
        .user(BOB)
        .get(&format!("/v1/sync?since={fresh}"))
        .await
        .expect(200);
}

/// The role the auditor's report gives `node`.
fn role_of<'a>(report: &'a Value, node: &str) -> &'a str {
    report["checks"]["topology"]["nodes"]
        .as_array()
        .and_then(|ns| ns.iter().find(|n| n["node"] == node))
        .and_then(|n| n["role"].as_str())
        .unwrap_or("missing")
}

/// Before the fault the auditor, asking both servers, sees one primary and a standby
/// that holds a usable copy of the test's slot (what `slots_synchronized` read from the
/// servers themselves); returns the timeline it reports.
pub async fn auditor_sees_a_safe_standby(w: &World, primary: &Node, standby: &Node) -> i64 {
    let report = w
        .audit
        .until(
            Duration::from_secs(60),
            "the auditor: one primary, a standby with a usable slot copy",
            |r| {
                let standby_node = r["checks"]["topology"]["nodes"]
                    .as_array()
                    .and_then(|ns| ns.iter().find(|n| n["node"] == standby.addr.as_str()));
                role_of(r, &primary.addr) == "primary"
                    && standby_node
                        .is_some_and(|n| n["role"] == "standby" && n["slot"]["usable"] == true)
                    && !is_firing(r, alarm::SLOT_NOT_SYNCED)
                    && !is_firing(r, alarm::SPLIT_BRAIN)
            },
        )
        .await;
    report["checks"]["topology"]["timeline"]
        .as_i64()
        .expect("the primary's timeline")
}

/// After the fault the auditor reports the move: `timeline_changed` fires, the new
/// primary writes a later timeline, and the old one is its standby.
pub async fn auditor_saw_the_move(w: &World, timeline: i64, new_primary: &Node) {
    let report = w
        .audit
        .until(RECOVERY, "the auditor reports the new primary", |r| {
            is_firing(r, alarm::TIMELINE_CHANGED)
                && role_of(r, &new_primary.addr) == "primary"
                && r["checks"]["topology"]["timeline"]
                    .as_i64()
                    .is_some_and(|t| t > timeline)
        })
        .await;
    eprintln!(
        "the auditor: timeline {timeline} -> {}, primary {}",
        report["checks"]["topology"]["timeline"], new_primary.addr
    );
}

/// The auditor read chat.events through the fault without a gap, and deleted the
/// outbox row of every event it read: the new primary's outbox empties.
pub async fn auditor_confirmed_everything(w: &World, new_primary: &Node) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
            .fetch_one(&new_primary.pool)
            .await
            .expect("the new primary's outbox");
        if rows == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{rows} outbox rows on the new primary {} not confirmed by the auditor: {:#}",
            new_primary.addr,
            w.audit.report().await["checks"]["outbox"]
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let report = w.audit.report().await;
    assert_eq!(
        report["counts"]["gaps"], 0,
        "the auditor's gaps: {report:#}"
    );
}
