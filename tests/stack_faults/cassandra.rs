//! Cassandra stopped for 30 s while messages flow (and are deleted). The archiver holds
//! its position and retries: nothing is recorded as archived that Cassandra does not
//! hold, nothing is dead-lettered or skipped, and once Cassandra is back the archive
//! comes to equal PostgreSQL's history row by row.

use std::time::{Duration, Instant};

use chatpipe_tests::cold::{
    archived_seq, archiver_process, drop_keyspace, session, wait_until_archive_equals_postgres,
};
use chatpipe_tests::stream::spawn_pipeline;

use crate::{one_fault_at_a_time, stack, StartOnPanic};

const OUTAGE: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_cassandra_outage_holds_the_archiver_and_it_catches_up_skipping_nothing() {
    let _turn = one_fault_at_a_time().await;
    let p = spawn_pipeline().await;
    let cql = session().await;
    let conversation = p.app.user(1).create_group(&[2]).await;
    for i in 1..=10 {
        p.app
            .user(1)
            .send_message(conversation, &format!("before {i}"))
            .await;
    }
    let mut archiver = archiver_process(&p, &[("CHATPIPE_STORAGE__REQUEST_TIMEOUT_MS", "2000")]);
    wait_until_archive_equals_postgres(&p, &cql, &[conversation], Duration::from_secs(60)).await;

    let _restart = StartOnPanic::new("cassandra");
    stack(&["down", "cassandra"]).await;
    let outage = Instant::now();
    let mut sent = 10;
    while outage.elapsed() < OUTAGE {
        sent = p
            .app
            .user(1)
            .send_message(conversation, &format!("during {sent}"))
            .await;
        if sent % 5 == 0 {
            p.app
                .user(1)
                .delete(&format!(
                    "/conversations/{conversation}/messages/{}",
                    sent - 2
                ))
                .await
                .expect(204);
        }
        assert_eq!(
            archived_seq(&p.app.pool, conversation).await,
            10,
            "nothing is recorded as archived while Cassandra is down"
        );
        assert!(
            archiver.try_wait().unwrap().is_none(),
            "the archiver waits an outage out; it does not exit"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stack(&["start", "cassandra"]).await;
    let back = Instant::now();
    wait_until_archive_equals_postgres(&p, &cql, &[conversation], Duration::from_secs(120)).await;
    eprintln!(
        "{sent} messages; the archive equal to PostgreSQL {:.1} s after Cassandra returned",
        back.elapsed().as_secs_f64()
    );
    assert_eq!(
        crate::registry::records_in(&format!("{}.dlq", p.topic)),
        0,
        "nothing was dead-lettered"
    );
    archiver.kill().await.unwrap();
    drop_keyspace(&cql, &p.ns).await;
    p.cleanup().await;
}
