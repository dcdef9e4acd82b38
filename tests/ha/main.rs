//! PostgreSQL as a primary and a synchronous standby behind one address (`scripts/stack
//! up --ha`: pg1 and pg2, HAProxy in front). A failover (the primary SIGKILLed, the
//! standby promoted, the old primary seeded anew as its standby) and a switchover, each
//! under a stream of sends into 50 conversations with a WebSocket client open: every
//! 201 is on the new primary and on chat.events, nothing on chat.events is missing from
//! the new primary or differs from it (no phantom), seqs stay gapless, the connector
//! streams on from its synchronized slot, pushes resume, the client's catch-up has every
//! message, and a sync cursor of the old timeline is refused (409).
//!
//! Needs the stack in HA mode and its variables (`scripts/stack up --ha`, `eval
//! "$(scripts/stack env)"`); `scripts/test` does both. Not run by a plain `cargo test`
//! (`test = false`): it fails, rather than skips, when there is no standby.

mod load;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use chatpipe_schemas::ChatEvent;
use chatpipe_tests::stack::{one_fault_at_a_time, run_stack as stack};
use chatpipe_tests::stream::{spawn_pipeline_with, Pipeline, Record};
use ingest_api::configuration::ReadMode;
use load::Load;
use sqlx::PgPool;

/// What the issue allows for pushes to come back after the fault.
const RECOVERY: Duration = Duration::from_secs(30);
const CONVERSATIONS: i64 = 50;

/// The two servers (host:port), from `scripts/stack env` in HA mode.
fn nodes() -> Vec<String> {
    let v = std::env::var("CHATPIPE_PG_NODES").unwrap_or_default();
    let nodes: Vec<String> = v
        .split(',')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    assert_eq!(
        nodes.len(),
        2,
        "CHATPIPE_PG_NODES={v:?}: these tests need PostgreSQL with a standby. Run `scripts/stack up --ha` and `eval \"$(scripts/stack env)\"`"
    );
    nodes
}

/// `url` pointed at `node` (host:port) instead of the proxy.
fn at_node(url: &str, node: &str) -> String {
    let mut u = url::Url::parse(url).expect("a database URL");
    let (host, port) = node.split_once(':').expect("host:port");
    u.set_host(Some(host)).unwrap();
    u.set_port(Some(port.parse().expect("a port"))).unwrap();
    u.to_string()
}

/// One server, asked directly (not through the proxy).
struct Node {
    addr: String,
    pool: PgPool,
}

impl Node {
    async fn connect(database_url: &str, addr: &str) -> Self {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(5))
            .connect_lazy(&at_node(database_url, addr))
            .expect("a pool");
        Self {
            addr: addr.to_owned(),
            pool,
        }
    }

    /// `Some(true)` for a standby, `Some(false)` for a primary, `None` when it does not
    /// answer.
    async fn in_recovery(&self) -> Option<bool> {
        sqlx::query_scalar("SELECT pg_is_in_recovery()")
            .fetch_one(&self.pool)
            .await
            .ok()
    }

    /// Names of the slots a query on `pg_replication_slots` selects.
    async fn slots(&self, filter: &str) -> BTreeSet<String> {
        sqlx::query_scalar::<_, String>(&format!(
            "SELECT slot_name::text FROM pg_replication_slots WHERE slot_type = 'logical' AND {filter}"
        ))
        .fetch_all(&self.pool)
        .await
        .map(|v| v.into_iter().collect())
        .unwrap_or_default()
    }
}

/// The failover slots a connector streams from on `primary` (the test's own and the
/// stack's), each with a copy on `standby` that a promotion keeps: what must hold before
/// the primary may go, or a connector loses its position. Waits for it.
async fn slots_synchronized(primary: &Node, standby: &Node, must_include: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let streamed = primary.slots("failover AND active").await;
        let usable = standby.slots("synced AND NOT temporary").await;
        if streamed.contains(must_include) && streamed.is_subset(&usable) {
            eprintln!(
                "slots {streamed:?} synchronized to the standby {}",
                standby.addr
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "failover slots {streamed:?} on the primary {} (must include {must_include}); usable copies on the standby {}: {usable:?}",
            primary.addr,
            standby.addr
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The test's database on both servers, primary first.
async fn primary_and_standby(p: &Pipeline) -> (Node, Node) {
    let [a, b]: [String; 2] = nodes().try_into().unwrap();
    let (a, b) = (
        Node::connect(&p.database_url, &a).await,
        Node::connect(&p.database_url, &b).await,
    );
    match (a.in_recovery().await, b.in_recovery().await) {
        (Some(false), Some(true)) => (a, b),
        (Some(true), Some(false)) => (b, a),
        other => panic!(
            "one primary and one standby expected ({}, {}): {other:?}",
            a.addr, b.addr
        ),
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

/// The fault the test runs: a `scripts/stack` command that moves the primary.
async fn fault_under_sends_loses_nothing_and_invents_nothing(command: &'static str) {
    let _turn = one_fault_at_a_time().await;
    let p = spawn_pipeline_with(ReadMode::Direct).await;
    let fanout = p.start_fanout(p.fanout_settings());
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let (alice, bob) = (1, 2);
    let mut conversations = Vec::new();
    for _ in 0..CONVERSATIONS {
        conversations.push(p.app.user(alice).create_group(&[bob]).await);
    }
    let mut bob_ws = p.connect(&gw.url, bob).await.collect();
    fanout.wait_online(&[bob], Duration::from_secs(20)).await;
    let cursor = p.app.user(bob).get("/sync").await.expect(200)["nextCursor"]
        .as_str()
        .expect("a sync cursor")
        .to_owned();
    let load = Load::start(&p, alice, &conversations, Duration::from_millis(1000));
    bob_ws
        .until(Duration::from_secs(30), |f| f["type"] == "message.new")
        .await;

    // The test's slot (Debezium made it with slot.failover) and every other one in use
    // must have a copy on the standby that a promotion keeps, or the fault would lose a
    // connector's position.
    let (old_primary, standby) = primary_and_standby(&p).await;
    slots_synchronized(&old_primary, &standby, &p.slot).await;

    let faulted = Instant::now();
    eprintln!(
        "{command}: primary {}, standby {}, {} sends acknowledged so far",
        old_primary.addr,
        standby.addr,
        load.acked_count()
    );
    let moving = tokio::spawn(async move { stack(&[command]).await });
    // Pushes resume: a message acknowledged after the fault reaches bob's open socket.
    let acked_after = |f: &serde_json::Value| {
        f["type"] == "message.new"
            && load.acked_since(
                faulted,
                f["conversationId"].as_i64().unwrap_or(0),
                f["seq"].as_i64().unwrap_or(0),
            )
    };
    let pushed = bob_ws.try_until(RECOVERY * 2, acked_after).await;
    let push_back = faulted.elapsed();
    moving.await.expect("scripts/stack ran");
    let (new_primary, new_standby) = primary_and_standby(&p).await;
    assert_eq!(
        new_primary.addr, standby.addr,
        "the standby is the primary after the {command}"
    );
    assert_eq!(
        new_standby.addr, old_primary.addr,
        "the old primary follows it"
    );
    assert!(
        pushed.is_some(),
        "no message acknowledged after the {command} reached bob's socket within {:?}",
        RECOVERY * 2
    );

    // Sends go on against the new primary, then stop.
    load.until_acked(load.acked_count() + 2 * CONVERSATIONS as usize, RECOVERY)
        .await;
    let report = load.stop().await;
    eprintln!(
        "{command}: {} sends acknowledged, {} attempts failed and were retried; the first push of a message sent after the fault {:.1} s after it",
        report.acked.len(),
        report.failed_attempts,
        push_back.as_secs_f64()
    );
    assert!(
        push_back <= RECOVERY,
        "pushes back within {RECOVERY:?} of the {command} (took {push_back:?})"
    );

    // Every 201 is on the new primary, asked directly, and nothing else: gapless.
    let stored: Vec<(i64, i64, String)> = sqlx::query_as(
        "SELECT conversation_id, seq, body FROM message WHERE conversation_id = ANY($1) ORDER BY 1, 2",
    )
    .bind(&conversations)
    .fetch_all(&new_primary.pool)
    .await
    .unwrap();
    let stored: BTreeMap<(i64, i64), String> =
        stored.into_iter().map(|(c, s, b)| ((c, s), b)).collect();
    let acked: BTreeMap<(i64, i64), String> = report.acked.iter().cloned().collect();
    assert_eq!(
        stored.len(),
        acked.len(),
        "the new primary holds exactly the acknowledged messages"
    );
    assert_eq!(
        stored, acked,
        "every 201 is on the new primary, body and all"
    );
    for c in &conversations {
        let seqs: Vec<i64> = stored
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

    // Every 201 reaches chat.events (the connector streamed on from its synchronized
    // slot), and every message.new there is a row of the new primary with its body: no
    // phantom of a transaction the old primary alone had.
    let want: BTreeSet<(i64, i64)> = acked.keys().copied().collect();
    let records = p
        .consume_until(Duration::from_secs(120), |rs| {
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
    eprintln!(
        "{command}: {} message.new records on the topic for {} messages ({} duplicates), no phantom",
        on_topic.len(),
        want.len(),
        on_topic.len() - want.len()
    );

    // The client's catch-up over REST has every message.
    for c in &conversations {
        let page = p
            .app
            .user(bob)
            .get(&format!("/conversations/{c}/messages?afterSeq=0&limit=200"))
            .await
            .expect(200);
        let got: BTreeSet<i64> = page["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["seq"].as_i64().unwrap())
            .collect();
        let want: BTreeSet<i64> = want
            .iter()
            .filter(|(cc, _)| cc == c)
            .map(|(_, s)| *s)
            .collect();
        assert_eq!(got, want, "bob's catch-up of conversation {c}");
    }

    // A sync cursor handed out before the fault is of the old timeline: refused, and
    // an initial sync gives one that works.
    let problem = p
        .app
        .user(bob)
        .get(&format!("/sync?since={cursor}"))
        .await
        .problem(409);
    assert_eq!(problem["type"], "/problems/cursor-stale", "{problem}");
    let fresh = p.app.user(bob).get("/sync").await.expect(200)["nextCursor"]
        .as_str()
        .unwrap()
        .to_owned();
    p.app
        .user(bob)
        .get(&format!("/sync?since={fresh}"))
        .await
        .expect(200);

    gw.stop().await.unwrap();
    fanout.stop().unwrap();
    p.cleanup().await;
}

#[tokio::test]
async fn the_primary_killed_and_the_standby_promoted_loses_no_201_and_invents_no_event() {
    fault_under_sends_loses_nothing_and_invents_nothing("failover").await;
}

#[tokio::test]
async fn a_switchover_loses_no_201_and_invents_no_event() {
    fault_under_sends_loses_nothing_and_invents_nothing("switchover").await;
}
