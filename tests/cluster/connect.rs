//! The Connect worker that runs the connector's task lost (SIGKILL) while messages are
//! committed, then started again: the task moves to the other worker and every committed
//! message reaches chat.events.

use std::time::{Duration, Instant};

use chatpipe_tests::audit::is_firing;
use chatpipe_tests::cluster::{
    connector_status as status, running_on, worker_component as component_of, workers,
};
use chatpipe_tests::stream::spawn_pipeline;
use pipeline::audit::alarm;

use crate::{
    every_acknowledged_on_the_topic, kill, one_fault_at_a_time, require_cluster, stack, Sender,
    StartOnPanic, RECOVERY,
};

#[tokio::test]
async fn the_connect_worker_running_the_task_killed_the_task_moves_and_every_commit_streams() {
    require_cluster();
    assert!(workers().len() >= 2, "two Connect workers: {:?}", workers());
    let _turn = one_fault_at_a_time().await;
    let p = spawn_pipeline().await;
    let conversation = p.app.user(1).create_group(&[2]).await;
    let sender = Sender::start(&p, 1, conversation, Duration::from_millis(50));
    let deadline = Instant::now() + Duration::from_secs(30);
    let worker = loop {
        if let Some(w) = running_on(&status(&p.connector).await) {
            break w;
        }
        assert!(
            Instant::now() < deadline,
            "the connector's task runs: {}",
            status(&p.connector).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let victim = component_of(&worker);
    // The auditor asks the other worker, and calls one move too many (a test threshold).
    let mut settings = p.audit_settings();
    settings.audit.connect_url = workers()
        .into_iter()
        .find(|w| !w.ends_with(&worker))
        .expect("another worker");
    settings.audit.task_moves_alert = 0;
    let audit = p.start_audit(settings).await;
    audit
        .until(Duration::from_secs(30), "the auditor sees the task", |r| {
            r["checks"]["connector"]["worker"] == worker.as_str()
        })
        .await;
    let _again = StartOnPanic::new(victim.clone());
    let before = sender.seqs().len();
    let pid = kill(&victim);
    let killed = Instant::now();
    eprintln!("killed {victim} (pid {pid}), which ran the task, after {before} sends");

    // The task moves to the other worker.
    let moved_to = loop {
        if let Some(w) = running_on(&status(&p.connector).await).filter(|w| *w != worker) {
            break w;
        }
        assert!(
            killed.elapsed() < RECOVERY,
            "the task did not move off {worker} within {RECOVERY:?}: {}",
            status(&p.connector).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let moved = killed.elapsed();
    let report = audit
        .until(Duration::from_secs(30), "connector_task_moving", |r| {
            is_firing(r, alarm::CONNECTOR_TASK_MOVING)
        })
        .await;
    assert_eq!(
        report["checks"]["connector"]["taskMoves"], 1,
        "one move: {}",
        report["checks"]["connector"]
    );
    stack(&["start", &victim]).await;
    let acked = sender.stop().await;
    let duplicates =
        every_acknowledged_on_the_topic(&p, conversation, &acked, Duration::from_secs(90)).await;
    eprintln!(
        "{victim} killed: the task moved {worker} -> {moved_to} in {:.1} s; {} sends committed, every one on {} ({duplicates} duplicates)",
        moved.as_secs_f64(),
        acked.len(),
        p.topic
    );
    p.cleanup().await;
}
