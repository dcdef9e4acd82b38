//! The outbox kept until confirmed (issue 25, item 4). The auditor deletes each outbox
//! row once it has read the row's event on chat.events; when the WAL of some events is
//! lost (here: the replication slot dropped by hand), their rows are what is left, the
//! auditor says so (`outbox_unconfirmed`), and the documented recovery,
//! `scripts/stack republish-outbox`, publishes them again through a Debezium incremental
//! snapshot. Witnesses: PostgreSQL's outbox and conversation rows, and a test consumer
//! of the topic.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use chatpipe_tests::audit::is_firing;
use chatpipe_tests::stack::repo_root;
use chatpipe_tests::stream::{connect_url, messages, spawn_pipeline, Pipeline, Record};
use pipeline::audit::alarm;
use sqlx::PgPool;

async fn outbox_rows(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(pool)
        .await
        .expect("counting the outbox")
}

/// Polls until the outbox holds `want` rows; fails at the deadline with what it holds.
async fn until_outbox_holds(pool: &PgPool, want: i64, deadline: Duration) {
    let until = Instant::now() + deadline;
    loop {
        let rows = outbox_rows(pool).await;
        if rows == want {
            return;
        }
        assert!(
            Instant::now() < until,
            "the outbox holds {rows} rows, not {want}, after {deadline:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The connector stopped (Connect's REST API) and its slot dropped, as an operator might.
async fn drop_slot_by_hand(p: &Pipeline) {
    let http = reqwest::Client::new();
    let connector = format!("{}/connectors/{}", connect_url(), p.connector);
    let res = http.put(format!("{connector}/stop")).send().await.unwrap();
    assert!(res.status().is_success(), "stopping the connector: {res:?}");
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let dropped = sqlx::query("SELECT pg_drop_replication_slot($1)")
            .bind(&p.slot)
            .execute(&p.app.pool)
            .await;
        match dropped {
            Ok(_) => return,
            // "replication slot … is active for PID …": the task is still stopping.
            Err(e) => assert!(Instant::now() < until, "dropping {}: {e}", p.slot),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn a_dropped_slot_loses_nothing_the_outbox_kept_and_republish_outbox_sends_it_again() {
    let p = spawn_pipeline().await;
    let mut settings = p.audit_settings();
    // The shipped threshold is a minute; the test does not wait that long.
    settings.audit.outbox_unconfirmed_alert_ms = 3_000;
    let audit = p.start_audit(settings).await;
    let pool = p.app.pool.clone();
    let mut seen: Vec<Record> = Vec::new();

    // Before: three groups of five messages, streamed, read by the auditor, confirmed.
    let mut groups = Vec::new();
    for g in 0..3 {
        let conv = p.app.user(10 + g).create_group(&[30]).await;
        for i in 0..5 {
            p.app
                .user(10 + g)
                .send_message(conv, &format!("before {i}"))
                .await;
        }
        groups.push(conv);
    }
    seen.extend(
        p.consume_until(Duration::from_secs(60), |r| messages(r).len() >= 15)
            .await,
    );
    until_outbox_holds(&pool, 0, Duration::from_secs(30)).await;

    // The fault: the slot dropped, then five more messages to each group and a new group.
    drop_slot_by_hand(&p).await;
    for (g, conv) in groups.iter().enumerate() {
        for i in 0..5 {
            p.app
                .user(10 + g as i64)
                .send_message(*conv, &format!("lost {i}"))
                .await;
        }
    }
    let late = p.app.user(40).create_group(&[41]).await;
    for i in 0..5 {
        p.app
            .user(40)
            .send_message(late, &format!("late {i}"))
            .await;
    }
    groups.push(late);
    let kept = outbox_rows(&pool).await;
    assert!(
        kept >= 20,
        "the outbox keeps the unstreamed rows: 20 messages and the new group's events, found {kept}"
    );
    audit
        .firing(&[alarm::OUTBOX_UNCONFIRMED], Duration::from_secs(30))
        .await;

    // The recovery, as docs/operations.md gives it, for this namespace's connector.
    let started = Instant::now();
    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&pool)
        .await
        .unwrap();
    let status = tokio::process::Command::new(repo_root().join("scripts/stack"))
        .arg("republish-outbox")
        .env("CONNECTOR_NAME", &p.connector)
        .env("SLOT_NAME", &p.slot)
        .env("CHATPIPE_PG_DB", &db)
        .status()
        .await
        .expect("scripts/stack runs");
    assert!(status.success(), "scripts/stack republish-outbox failed");
    eprintln!(
        "republish-outbox: {kept} rows published again and confirmed in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    // It returns once the auditor has deleted every row: PostgreSQL says so too.
    assert_eq!(outbox_rows(&pool).await, 0, "rows left unconfirmed");

    // After: one more message each, streamed as usual from the new slot.
    for (g, conv) in groups.iter().enumerate() {
        let user = if *conv == late { 40 } else { 10 + g as i64 };
        p.app.user(user).send_message(*conv, "after").await;
    }
    let last_seqs: BTreeMap<i64, i64> =
        sqlx::query_as("SELECT id, last_seq FROM conversation WHERE id = ANY($1)")
            .bind(&groups)
            .fetch_all(&pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    let everything = |records: &[Record]| {
        let have: BTreeSet<(i64, i64)> = messages(records).into_iter().collect();
        last_seqs
            .iter()
            .all(|(c, last)| (1..=*last).all(|s| have.contains(&(*c, s))))
    };
    let rest = p
        .consume_until(Duration::from_secs(120), |r| {
            let mut all = seen.clone();
            all.extend_from_slice(r);
            everything(&all)
        })
        .await;
    seen.extend(rest);

    // Every committed message is on the topic, and each conversation's first arrivals
    // came in seq order (the snapshot read the rows by position).
    for (conv, last) in &last_seqs {
        let mut first_seen = Vec::new();
        for (c, s) in messages(&seen) {
            if c == *conv && !first_seen.contains(&s) {
                first_seen.push(s);
            }
        }
        assert_eq!(
            first_seen,
            (1..=*last).collect::<Vec<_>>(),
            "conversation {conv}: seqs in the order they first reached the topic"
        );
    }
    let report = audit
        .until(
            Duration::from_secs(30),
            "the auditor read everything",
            |r| {
                !is_firing(r, alarm::OUTBOX_UNCONFIRMED)
                    && r["counts"]["messages"].as_u64() >= Some(messages(&seen).len() as u64)
            },
        )
        .await;
    assert_eq!(report["counts"]["gaps"], 0, "gaps: {report:#}");
    assert_eq!(
        report["counts"]["missingSeqs"], 0,
        "missing seqs: {report:#}"
    );
    audit.stop().await.expect("the auditor stops cleanly");
    p.cleanup().await;
}
