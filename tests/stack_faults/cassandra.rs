//! Cassandra stopped for 30 s while messages flow (and are deleted). The archiver holds
//! its position and retries: nothing is recorded as archived that Cassandra does not
//! hold, nothing is dead-lettered or skipped, and the retention step moves no row out of
//! PostgreSQL that Cassandra lacks. History pages that need archived messages answer
//! 503 with `Retry-After` meanwhile, pages of recent ones 200. Once Cassandra is back
//! the archive holds every message, equal to PostgreSQL's rows.

use std::time::{Duration, Instant};

use chatpipe_tests::cold::{
    archived_seq, archiver_process, drop_keyspace, session, wait_until_archive_equals_postgres,
};
use chatpipe_tests::stream::spawn_pipeline;
use serde_json::Value;

use crate::{one_fault_at_a_time, stack, StartOnPanic};

const OUTAGE: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_cassandra_outage_holds_the_archiver_moves_nothing_unarchived_and_503s_cold_pages() {
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
    let mut archiver = archiver_process(
        &p,
        &[
            ("CHATPIPE_STORAGE__REQUEST_TIMEOUT_MS", "2000"),
            ("CHATPIPE_STORAGE__HOT_RETENTION_S", "1"),
            ("CHATPIPE_ARCHIVE__RETENTION_INTERVAL_MS", "200"),
        ],
    );
    wait_until_archive_equals_postgres(&p, &cql, &[conversation], Duration::from_secs(60)).await;
    let cold_through = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT cold_through FROM message_archive WHERE conversation_id = $1",
        )
        .bind(conversation)
        .fetch_one(&p.app.pool)
        .await
        .unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while cold_through().await < 10 {
        assert!(Instant::now() < deadline, "the 10 messages never moved out");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let older = format!("/v1/conversations/{conversation}/messages?beforeSeq=6&limit=3");
    let page = p.app.user(2).get(&older).await.expect(200);
    assert_eq!(
        page["messages"][0]["body"], "before 3",
        "read from Cassandra"
    );

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
                    "/v1/conversations/{conversation}/messages/{}",
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
        let kept: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM message WHERE conversation_id = $1 AND seq > 10",
        )
        .bind(conversation)
        .fetch_one(&p.app.pool)
        .await
        .unwrap();
        assert_eq!(kept, sent - 10, "no unarchived row leaves PostgreSQL");
        assert!(
            archiver.try_wait().unwrap().is_none(),
            "the archiver waits an outage out; it does not exit"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // A page of archived messages: 503 with Retry-After, never a short page.
    let res = p
        .app
        .http
        .get(format!("{}{older}", p.app.base))
        .bearer_auth(p.app.token(2))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 503);
    assert!(res.headers().contains_key("retry-after"));
    let problem: Value = res.json().await.unwrap();
    assert_eq!(problem["type"], "/problems/unavailable", "{problem}");
    // A page of recent ones: served.
    let recent = p
        .app
        .user(2)
        .get(&format!(
            "/v1/conversations/{conversation}/messages?limit=5"
        ))
        .await
        .expect(200);
    assert_eq!(recent["messages"][4]["seq"], sent);

    stack(&["start", "cassandra"]).await;
    let back = Instant::now();
    wait_until_archive_equals_postgres(&p, &cql, &[conversation], Duration::from_secs(120)).await;
    eprintln!(
        "{sent} messages; the archive holds them all {:.1} s after Cassandra returned",
        back.elapsed().as_secs_f64()
    );
    // ingest-api's driver refills its connection pool with exponential backoff, at most
    // 10 s apart (the scylla crate's default): until then a cold page is still 503 with
    // Retry-After, as a client sees it, and then 200.
    let deadline = back + Duration::from_secs(60);
    let page = loop {
        let res = p.app.user(2).get(&older).await;
        if res.status == 200 {
            break res.expect(200);
        }
        assert_eq!(
            res.status, 503,
            "only 503 until the archive answers: {:?}",
            res.body
        );
        assert!(res.headers.contains_key("retry-after"));
        assert!(
            Instant::now() < deadline,
            "cold pages still 503 60 s after Cassandra returned"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    eprintln!(
        "cold pages 200 again {:.1} s after Cassandra returned",
        back.elapsed().as_secs_f64()
    );
    assert_eq!(page["messages"][0]["body"], "before 3");
    assert_eq!(
        crate::registry::records_in(&format!("{}.dlq", p.topic)),
        0,
        "nothing was dead-lettered"
    );
    archiver.kill().await.unwrap();
    drop_keyspace(&cql, &p.ns).await;
    p.cleanup().await;
}
