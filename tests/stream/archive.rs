//! The archiver (`pipeline archive`): chat.events -> the cold tier in Cassandra, with
//! each conversation's archived seq in PostgreSQL. Every check compares Cassandra's rows,
//! read with CQL of the test's own, with PostgreSQL's, row by row.

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use chatpipe_schemas::ChatEvent;
use chatpipe_tests::audit::is_firing;
use chatpipe_tests::cold::{
    archive_group, archived_seq, archiver_process, cassandra_rows, drop_keyspace, session,
    wait_until_archive_equals_postgres, BUCKET_SIZE,
};
use chatpipe_tests::stream::{
    messages, produce_raw_to, spawn_pipeline, wait_until_consumed, Pipeline,
};
use serde_json::json;

/// Alice (1) and her groups with Bob (2) and Carol (3): `sizes[i]` messages in the i-th,
/// every 7th edited by its sender, every 5th deleted (by its sender, or by Alice, the
/// admin). Returns the conversations.
async fn conversations_with_history(p: &Pipeline, sizes: &[usize]) -> Vec<i64> {
    let mut conversations = Vec::new();
    for &n in sizes {
        let conv = p.app.user(1).create_group(&[2, 3]).await;
        for i in 1..=n {
            let sender = [1, 2, 3][i % 3];
            let seq = p
                .app
                .user(sender)
                .send_message(conv, &format!("m{i}"))
                .await;
            if i % 7 == 0 {
                p.app
                    .user(sender)
                    .patch(
                        &format!("/v1/conversations/{conv}/messages/{seq}"),
                        json!({"body": format!("m{i}, edited")}),
                    )
                    .await
                    .expect(200);
            }
            if i % 5 == 0 {
                let by = if i % 10 == 0 { 1 } else { sender };
                p.app
                    .user(by)
                    .delete(&format!("/v1/conversations/{conv}/messages/{seq}"))
                    .await
                    .expect(204);
            }
        }
        conversations.push(conv);
    }
    conversations
}

/// Messages, edits and deletes reach Cassandra as PostgreSQL holds them, across several
/// partitions per conversation; changes of messages archived long ago follow; and a
/// second archiver replaying the whole topic from its start (a new group) changes
/// nothing: a deleted body does not come back from its replayed `message.new`.
#[tokio::test]
async fn the_archive_equals_postgres_row_by_row_and_a_full_replay_changes_nothing() {
    let p = spawn_pipeline().await;
    let cql = session().await;
    let conversations = conversations_with_history(&p, &[40, 20, 3]).await;
    let mut archiver = archiver_process(&p, &[]);
    wait_until_archive_equals_postgres(&p, &cql, &conversations, Duration::from_secs(90)).await;

    // Changes of archived messages: an edit of the first and a delete of the second
    // message of the first conversation.
    let conv = conversations[0];
    p.app
        .user(2)
        .patch(
            &format!("/v1/conversations/{conv}/messages/1"),
            json!({"body": "m1, edited late"}),
        )
        .await
        .expect(200);
    p.app
        .user(3)
        .delete(&format!("/v1/conversations/{conv}/messages/2"))
        .await
        .expect(204);
    wait_until_archive_equals_postgres(&p, &cql, &conversations, Duration::from_secs(60)).await;
    let cold = cassandra_rows(&cql, &p.ns, BUCKET_SIZE, conv, 40)
        .await
        .unwrap();
    assert_eq!(cold[0].body.as_deref(), Some("m1, edited late"));
    assert_eq!(
        cold[1].body, None,
        "the deleted body is erased in Cassandra"
    );
    let deleted = cold.iter().filter(|r| r.deleted_at.is_some()).count();
    assert_eq!(deleted, 9, "8 deletes of the 40 and the late one");
    assert!(cold
        .iter()
        .all(|r| r.deleted_at.is_none() == r.body.is_some()));

    // At-least-once delivery: the message.new of the message deleted late arrives again,
    // after its delete. Its body stays erased.
    let records = p
        .consume_until(Duration::from_secs(30), |rs| {
            messages(rs).contains(&(conv, 2))
        })
        .await;
    let new_of_2 = records
        .iter()
        .find(|r| matches!(&r.event, ChatEvent::MessageNew(m) if m.conversation_id.get() == conv && m.seq.get() == 2))
        .expect("the message.new of seq 2");
    produce_raw_to(&p.topic, new_of_2.partition, &new_of_2.key, &new_of_2.bytes).await;
    wait_until_consumed(&archive_group(&p), &p.topic, Duration::from_secs(60)).await;
    let cold = cassandra_rows(&cql, &p.ns, BUCKET_SIZE, conv, 40)
        .await
        .unwrap();
    assert_eq!(
        cold[1].body, None,
        "a replayed message.new brings no body back"
    );
    wait_until_archive_equals_postgres(&p, &cql, &conversations, Duration::from_secs(5)).await;
    archiver.kill().await.unwrap();

    // The whole topic again, from its first record, by an archiver of another group.
    let replay_group = format!("{}-replay", archive_group(&p));
    let mut replay = archiver_process(&p, &[("CHATPIPE_ARCHIVE__GROUP", replay_group.as_str())]);
    wait_until_consumed(&replay_group, &p.topic, Duration::from_secs(90)).await;
    wait_until_archive_equals_postgres(&p, &cql, &conversations, Duration::from_secs(5)).await;
    replay.kill().await.unwrap();
    drop_keyspace(&cql, &p.ns).await;
    p.cleanup().await;
}

/// Two archivers in one group; one killed with SIGKILL while messages flow (and are
/// deleted), then started again from the group's committed offsets: the archive ends
/// equal to PostgreSQL's history in every conversation, row by row.
#[tokio::test]
async fn an_archiver_killed_with_sigkill_mid_stream_ends_equal_to_postgres() {
    let p = spawn_pipeline().await;
    let cql = session().await;
    let mut conversations = Vec::new();
    for _ in 0..4 {
        conversations.push(p.app.user(1).create_group(&[2]).await);
    }
    // Small batches and rare commits: the kill falls between the writes of many batches
    // and the commit of their offsets.
    let small = [
        ("CHATPIPE_ARCHIVE__MAX_BATCH", "8"),
        ("CHATPIPE_READERS__COMMIT_INTERVAL_MS", "3000"),
    ];
    // Two-wide, as it runs: one of the two is killed and started again.
    let mut doomed = archiver_process(&p, &small);
    let mut other = archiver_process(&p, &small);
    let sender = {
        let (base, http) = (p.app.base.clone(), p.app.http.clone());
        let token = p.app.token(1);
        let conversations = conversations.clone();
        tokio::spawn(async move {
            for i in 1..=60 {
                for conv in &conversations {
                    let res = http
                        .post(format!("{base}/v1/conversations/{conv}/messages"))
                        .bearer_auth(&token)
                        .json(
                            &json!({"clientMsgId": uuid::Uuid::new_v4(), "body": format!("m{i}")}),
                        )
                        .send()
                        .await
                        .expect("send");
                    assert_eq!(res.status(), 201);
                    if i % 6 == 0 {
                        let res = http
                            .delete(format!("{base}/v1/conversations/{conv}/messages/{}", i - 3))
                            .bearer_auth(&token)
                            .send()
                            .await
                            .expect("delete");
                        assert_eq!(res.status(), 204);
                    }
                }
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
        })
    };
    // Kill it once it has archived part of the stream.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while archived_seq(&p.app.pool, conversations[0]).await < 20 {
        assert!(
            std::time::Instant::now() < deadline,
            "the archiver recorded no progress within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    doomed.start_kill().unwrap();
    let status = doomed.wait().await.unwrap();
    assert_eq!(status.signal(), Some(9), "killed by SIGKILL: {status:?}");
    let at_kill = archived_seq(&p.app.pool, conversations[0]).await;

    let mut restarted = archiver_process(&p, &small);
    sender.await.expect("the sends");
    wait_until_archive_equals_postgres(&p, &cql, &conversations, Duration::from_secs(90)).await;
    assert!(
        at_kill < 60,
        "the kill fell mid-stream (at seq {at_kill} of 60)"
    );
    restarted.kill().await.unwrap();
    other.kill().await.unwrap();
    drop_keyspace(&cql, &p.ns).await;
    p.cleanup().await;
}

/// The auditor watches the archiver from outside: with no archiver running, every record
/// of the topic is behind (counted against the topic's own end offsets) and the
/// conversation lacks every message in `message_archive`; `archive_lagging` fires past
/// its alert time. Once an archiver runs, the lag goes to 0 and the alarm clears.
#[tokio::test]
async fn the_auditor_reports_the_archive_lag_per_partition_and_alarms_until_it_is_gone() {
    let p = spawn_pipeline().await;
    let cql = session().await;
    let mut settings = p.audit_settings();
    settings.audit.archive_group = archive_group(&p);
    settings.audit.archive_lag_alert_ms = 3000;
    let audit = p.start_audit(settings).await;
    let conv = p.app.user(1).create_group(&[2]).await;
    for i in 1..=5 {
        p.app.user(1).send_message(conv, &format!("m{i}")).await;
    }
    // Everything on the topic (the auditor read the 5 messages), counted by the broker.
    audit
        .until(Duration::from_secs(60), "the 5 messages streamed", |r| {
            r["counts"]["messages"] == 5
        })
        .await;
    let total = chatpipe_tests::stream::end_offsets(&p.topic).await;
    let report = audit
        .until(Duration::from_secs(60), "archive_lagging fires", |r| {
            is_firing(r, "archive_lagging")
                && behind(r) == total
                && r["checks"]["archive"]["maxSeqBehind"] == 5
        })
        .await;
    let partitions = report["checks"]["archive"]["partitions"]
        .as_array()
        .unwrap();
    assert_eq!(partitions.len(), 6, "one entry per chat.events partition");
    // The conversation's records are on one partition (the broker's word): the 5 messages
    // it lacks are reported there, and nothing anywhere else.
    let records = p
        .consume_until(Duration::from_secs(30), |rs| messages(rs).len() == 5)
        .await;
    let on = i64::from(records[0].partition);
    for lag in partitions {
        let partition = lag["partition"].as_i64().unwrap();
        let want = if partition == on { 5 } else { 0 };
        assert_eq!(lag["seqBehind"].as_i64(), Some(want), "{lag}");
        if partition == on {
            assert!(lag["records"].as_i64() > Some(0) && lag["oldestMs"].as_u64() >= Some(3000));
        }
    }

    let mut archiver = archiver_process(&p, &[]);
    audit
        .until(
            Duration::from_secs(60),
            "the lag gone, the alarm cleared",
            |r| {
                !is_firing(r, "archive_lagging")
                    && behind(r) == 0
                    && r["checks"]["archive"]["maxSeqBehind"] == 0
            },
        )
        .await;
    archiver.kill().await.unwrap();
    audit.stop().await.unwrap();
    drop_keyspace(&cql, &p.ns).await;
    p.cleanup().await;
}

/// Records behind over every partition, as the auditor reports them.
fn behind(report: &serde_json::Value) -> i64 {
    report["checks"]["archive"]["partitions"]
        .as_array()
        .map_or(-1, |ps| {
            ps.iter().map(|p| p["records"].as_i64().unwrap()).sum()
        })
}
