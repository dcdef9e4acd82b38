//! PostgreSQL as a primary and a synchronous standby behind one address (`scripts/stack
//! up --ha`: pg1 and pg2, HAProxy in front). A failover (the primary SIGKILLed, the
//! standby promoted, the old primary seeded anew as its standby) and a switchover, each
//! under a stream of sends into 50 conversations with WebSocket clients open: every
//! 201 is on the new primary and on chat.events, nothing on chat.events is missing from
//! the new primary or differs from it (no phantom), seqs stay gapless, the connector
//! streams on from its synchronized slot, pushes resume, the client's catch-up has every
//! message, a member removed just before the fault gets nothing after, the receipts
//! processor writes to the new primary, a sync cursor of the old timeline is refused
//! (409), and the auditor, asking both servers, reports the move (timeline_changed, the
//! new primary, a usable slot copy on the standby before it), reads chat.events on
//! without a gap and confirms every outbox row on the new primary.
//!
//! Needs the stack in HA mode and its variables (`scripts/stack up --ha`, `eval
//! "$(scripts/stack env)"`); `scripts/test` does both. Not run by a plain `cargo test`
//! (`test = false`): it fails, rather than skips, when there is no standby.

mod checks;
mod load;
mod nodes;

use std::time::{Duration, Instant};

use chatpipe_tests::audit::RunningAudit;
use chatpipe_tests::push::{Collector, FanoutProcessor, RunningGateway};
use chatpipe_tests::stack::{one_fault_at_a_time, run_stack as stack};
use chatpipe_tests::stream::{spawn_pipeline_with, Pipeline, ReceiptsProcessor};
use ingest_api::configuration::ReadMode;
use load::Load;
use nodes::{primary_and_standby, slots_synchronized};

/// What the issue allows for pushes to come back after the fault.
pub const RECOVERY: Duration = Duration::from_secs(30);
const CONVERSATIONS: i64 = 50;
const ALICE: i64 = 1;
const BOB: i64 = 2;
const CAROL: i64 = 3;

/// The pipeline and its clients: alice sends, bob receives in every conversation, carol
/// is in `left_group` until just before the fault and alone with alice in `carol_only`.
struct World {
    p: Pipeline,
    fanout: FanoutProcessor,
    receipts: ReceiptsProcessor,
    gw: RunningGateway,
    /// The auditor, with both servers in `audit.postgres_nodes`.
    audit: RunningAudit,
    conversations: Vec<i64>,
    left_group: i64,
    carol_only: i64,
    bob_ws: Collector,
    carol_ws: Collector,
}

impl World {
    async fn start() -> Self {
        let p = spawn_pipeline_with(ReadMode::Stream).await;
        let fanout = p.start_fanout(p.fanout_settings());
        let receipts = p.start_receipts(p.receipts_settings());
        let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
        let mut settings = p.audit_settings();
        settings.audit.postgres_nodes = nodes::nodes();
        let audit = p.start_audit(settings).await;
        let mut conversations = Vec::new();
        for _ in 0..CONVERSATIONS {
            conversations.push(p.app.user(ALICE).create_group(&[BOB]).await);
        }
        let left_group = p.app.user(ALICE).create_group(&[BOB, CAROL]).await;
        let carol_only = p.app.user(ALICE).create_group(&[CAROL]).await;
        let bob_ws = p.connect(&gw.url, BOB).await.collect();
        let carol_ws = p.connect(&gw.url, CAROL).await.collect();
        fanout
            .wait_online(&[BOB, CAROL], Duration::from_secs(20))
            .await;
        Self {
            p,
            fanout,
            receipts,
            gw,
            audit,
            conversations,
            left_group,
            carol_only,
            bob_ws,
            carol_ws,
        }
    }

    async fn stop(self) {
        self.gw.stop().await.unwrap();
        self.audit.stop().await.expect("the auditor stops cleanly");
        self.fanout.stop().unwrap();
        self.receipts.stop().unwrap();
        self.p.cleanup().await;
    }
}

/// The fault the test runs: a `scripts/stack` command that moves the primary.
async fn fault_under_sends_loses_nothing_and_invents_nothing(command: &'static str) {
    let _turn = one_fault_at_a_time().await;
    let mut w = World::start().await;
    let cursor = checks::sync_cursor(&w.p).await;
    let load = Load::start(&w.p, ALICE, &w.conversations, Duration::from_millis(1000));
    w.bob_ws
        .until(Duration::from_secs(30), |f| f["type"] == "message.new")
        .await;
    // The test's slot (Debezium made it with slot.failover) and every other one in use
    // must have a copy on the standby that a promotion keeps, or the fault would lose a
    // connector's position.
    let (old_primary, standby) = primary_and_standby(&w.p).await;
    slots_synchronized(&old_primary, &standby, &w.p.slot).await;
    let timeline = checks::auditor_sees_a_safe_standby(&w, &old_primary, &standby).await;
    // Carol's member.left is committed just before the fault: it must reach fanout from
    // whichever server streams it.
    w.p.app
        .user(ALICE)
        .delete(&format!(
            "/v1/conversations/{}/members/{CAROL}",
            w.left_group
        ))
        .await
        .expect(204);

    let faulted = Instant::now();
    eprintln!(
        "{command}: primary {}, standby {}, {} sends acknowledged so far",
        old_primary.addr,
        standby.addr,
        load.acked_count()
    );
    let moving = tokio::spawn(async move { stack(&[command]).await });
    // Pushes resume: a message acknowledged after the fault reaches bob's open socket.
    let pushed = w
        .bob_ws
        .try_until(RECOVERY * 2, |f| {
            f["type"] == "message.new"
                && load.acked_since(
                    faulted,
                    f["conversationId"].as_i64().unwrap_or(0),
                    f["seq"].as_i64().unwrap_or(0),
                )
        })
        .await;
    let push_back = faulted.elapsed();
    moving.await.expect("scripts/stack ran");
    let (new_primary, new_standby) = primary_and_standby(&w.p).await;
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

    checks::auditor_saw_the_move(&w, timeline, &new_primary).await;
    checks::member_left_holds(&mut w).await;
    checks::read_reaches(&w, &new_primary, &load).await;
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
    let (acked, on_topic) = checks::every_201_stored_and_streamed(&w, &new_primary, &report).await;
    eprintln!(
        "{command}: {on_topic} message.new records on the topic for the {acked} messages sent ({} duplicates), no phantom",
        on_topic - acked
    );
    checks::catch_up_complete(&w, &report).await;
    checks::old_cursor_stale(&w.p, &cursor).await;
    checks::auditor_confirmed_everything(&w, &new_primary).await;
    w.stop().await;
}

#[tokio::test]
async fn the_primary_killed_and_the_standby_promoted_loses_no_201_and_invents_no_event() {
    fault_under_sends_loses_nothing_and_invents_nothing("failover").await;
}

#[tokio::test]
async fn a_switchover_loses_no_201_and_invents_no_event() {
    fault_under_sends_loses_nothing_and_invents_nothing("switchover").await;
}
