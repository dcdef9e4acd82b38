//! `pipeline audit` on the real stack: it counts what a broken pipeline would lose, and
//! each of its alarms fires within a minute of the failure it watches for (with the
//! shipped thresholds) and clears when the failure ends.

use std::time::Duration;

use chatpipe_schemas::registry::Registry;
use chatpipe_schemas::{
    ChatEvent, ConversationId, MessageNew, ReadUpdated, Seq, UserId, Watermark,
};
use chatpipe_tests::audit::is_firing;
use chatpipe_tests::bench::{produce_events, SYNTHETIC_FIRST_ID};
use chatpipe_tests::registry_url;
use chatpipe_tests::stream::{
    brokers, connect_url, produce_raw, set_topic_config, spawn_pipeline, wait_until_streaming,
};
use pipeline::audit::alarm;

/// What the issue asks: an alarm within a minute of the failure.
const ALARM_DEADLINE: Duration = Duration::from_secs(60);

#[tokio::test]
async fn the_auditor_counts_gaps_duplicates_and_backward_reads_and_alarms_on_them() {
    let p = spawn_pipeline().await;
    let audit = p.start_audit(p.audit_settings()).await;
    // Real traffic: three messages through the API and CDC, in order.
    let conv = p.app.user(10).create_group(&[20]).await;
    for i in 0..3 {
        p.app.user(10).send_message(conv, &format!("m{i}")).await;
    }
    audit
        .until(Duration::from_secs(60), "the real messages audited", |r| {
            r["counts"]["messages"] == 3
        })
        .await;

    // A broken writer: seqs 1, 2, 3, 5 (4 missing), 3 again, and a watermark 5 then 3.
    let codec = Registry::new(&registry_url(), Duration::from_secs(5))
        .unwrap()
        .event_codec_for(&p.events_subject)
        .await
        .unwrap();
    let synthetic = SYNTHETIC_FIRST_ID;
    let message = |seq: i64| {
        ChatEvent::MessageNew(MessageNew {
            conversation_id: ConversationId::of(synthetic),
            seq: Seq::of(seq),
            sender_id: UserId::of(1),
            client_msg_id: uuid::Uuid::new_v4(),
            body: format!("s{seq}"),
            mentions: Vec::new(),
            thread_root_seq: None,
            created_at: chrono::Utc::now(),
        })
    };
    let read = |seq: i64| {
        ChatEvent::ReadUpdated(ReadUpdated {
            conversation_id: ConversationId::of(synthetic),
            user_id: UserId::of(2),
            last_read_seq: Watermark::of(seq),
            occurred_at: chrono::Utc::now(),
        })
    };
    let events = [
        message(1),
        message(2),
        message(3),
        message(5),
        message(3),
        read(5),
        read(3),
    ];
    let topic = p.topic.clone();
    tokio::task::spawn_blocking(move || {
        produce_events(
            &brokers(),
            &topic,
            events.iter().map(|e| (synthetic, codec.encode(e))),
        )
    })
    .await
    .unwrap();

    let report = audit
        .until(Duration::from_secs(30), "the broken stream audited", |r| {
            r["counts"]["messages"] == 8 && r["counts"]["regressions"] == 1
        })
        .await;
    let counts = &report["counts"];
    assert_eq!(counts["gaps"], 1, "{report:#}");
    assert_eq!(counts["missingSeqs"], 1, "seq 4");
    assert_eq!(counts["duplicates"], 1, "seq 3 twice");
    assert_eq!(
        counts["untrackedStarts"], 0,
        "both conversations started at seq 1"
    );
    let gap = &report["recentGaps"][0];
    assert_eq!(
        (&gap["conversationId"], &gap["expected"], &gap["found"]),
        (&synthetic.into(), &4.into(), &5.into())
    );
    let regression = &report["recentRegressions"][0];
    assert_eq!(
        (&regression["was"], &regression["now"]),
        (&5.into(), &3.into())
    );
    assert!(is_firing(&report, alarm::SEQ_GAP), "{report:#}");
    assert!(is_firing(&report, alarm::READ_REGRESSION), "{report:#}");
    assert_eq!(report["status"], "alarm");
    audit.stop().await.unwrap();
    p.cleanup().await;
}

#[tokio::test]
async fn a_stopped_connector_fires_connector_slot_and_cdc_alarms_within_a_minute_then_clears() {
    let p = spawn_pipeline().await;
    let mut settings = p.audit_settings();
    // 1 GiB by default; the WAL written while the slot has no client passes 32 KiB.
    settings.audit.slot_retained_wal_alert_bytes = 32 * 1024;
    let audit = p.start_audit(settings).await;
    let conv = p.app.user(10).create_group(&[20]).await;
    p.app.user(10).send_message(conv, "before").await;
    audit
        .until(Duration::from_secs(60), "a healthy pipeline audited", |r| {
            r["counts"]["messages"] == 1
                && r["checks"]["connector"]["running"] == true
                && r["checks"]["slot"]["active"] == true
                && r["checks"]["cdc"]["caughtUp"] == true
                && r["firing"].as_array().is_some_and(|a| a.is_empty())
        })
        .await;

    // The connector stops (as it sat UNASSIGNED after a broker stall): the slot loses its
    // client and commits stop reaching chat.events.
    let http = reqwest::Client::new();
    let connector = format!("{}/connectors/{}", connect_url(), p.connector);
    let res = http.put(format!("{connector}/stop")).send().await.unwrap();
    assert!(
        res.status().is_success(),
        "stopping the connector: {}",
        res.status()
    );
    for i in 0..100 {
        p.app
            .user(10)
            .send_message(conv, &format!("during {i}"))
            .await;
    }
    let took = audit
        .firing(
            &[
                alarm::CONNECTOR_NOT_RUNNING,
                alarm::SLOT_INACTIVE,
                alarm::CDC_STALLED,
                alarm::SLOT_WAL_RETAINED,
            ],
            ALARM_DEADLINE,
        )
        .await;
    eprintln!(
        "connector stopped: its four alarms fired {:.1} s later",
        took.as_secs_f64()
    );
    let report = audit.report().await;
    assert!(
        report["checks"]["cdc"]["unstreamed"].as_u64() >= Some(1),
        "{report:#}"
    );

    let res = http
        .put(format!("{connector}/resume"))
        .send()
        .await
        .unwrap();
    assert!(
        res.status().is_success(),
        "resuming the connector: {}",
        res.status()
    );
    wait_until_streaming(&p.connector, &p.slot).await;
    // The retained WAL shrinks only when Debezium confirms its position, which may take
    // longer: every other alarm must clear.
    let report = audit
        .until(
            Duration::from_secs(90),
            "alarms cleared after the resume",
            |r| {
                r["counts"]["messages"] == 101
                    && r["firing"]
                        .as_array()
                        .is_some_and(|a| a.iter().all(|x| x["name"] == alarm::SLOT_WAL_RETAINED))
            },
        )
        .await;
    assert_eq!(report["counts"]["gaps"], 0, "nothing lost: {report:#}");
    audit.stop().await.unwrap();
    p.cleanup().await;
}

#[tokio::test]
async fn a_failed_connector_task_is_restarted_with_backoff_until_it_streams_again_losing_nothing() {
    let p = spawn_pipeline().await;
    let mut settings = p.audit_settings();
    // 10 s and 5 min by default: short here, so that the test sees several restarts.
    settings.audit.connector_restart_backoff_ms = 2_000;
    settings.audit.connector_restart_max_backoff_ms = 4_000;
    let audit = p.start_audit(settings).await;
    let conv = p.app.user(10).create_group(&[20]).await;
    p.app.user(10).send_message(conv, "before").await;
    audit
        .until(Duration::from_secs(60), "a healthy pipeline audited", |r| {
            r["counts"]["messages"] == 1 && r["checks"]["connector"]["running"] == true
        })
        .await;

    // The topic now refuses records over 2 KiB, and a message of 3,000 characters is
    // sent: the broker answers RecordTooLargeException, which the Java producer does not
    // retry, and Connect fails the task. Restarting cannot cure that, so the restarts
    // keep coming at the capped backoff, and the connector is reported not running.
    set_topic_config(&p.topic, "max.message.bytes", "2048").await;
    p.app.user(10).send_message(conv, &"x".repeat(3000)).await;
    let report = audit
        .until(
            Duration::from_secs(90),
            "the keeper restarting the failed task, again and again",
            |r| {
                r["checks"]["connector"]["keeper"]["restarts"].as_u64() >= Some(3)
                    && is_firing(r, alarm::CONNECTOR_RESTARTED)
            },
        )
        .await;
    let keeper = &report["checks"]["connector"]["keeper"];
    assert_eq!(keeper["last"]["outcome"], "accepted", "{report:#}");
    assert_eq!(keeper["backoffMs"], 4_000, "{report:#}");
    let detail = report["firing"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == alarm::CONNECTOR_RESTARTED)
        .map(|a| a["detail"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_default();
    assert!(
        detail.contains("FAILED")
            && detail.contains(&p.connector)
            && detail.contains("RecordTooLargeException"),
        "the alarm names the connector, its failed state and the root cause: {detail}"
    );
    eprintln!("connector_restarted: {detail}");

    // The operator raises the limit: the next restart cures it, and both messages
    // arrive, in order, after the one before.
    set_topic_config(&p.topic, "max.message.bytes", "1048588").await;
    let cured = std::time::Instant::now();
    p.app.user(10).send_message(conv, "after").await;
    let report = audit
        .until(
            Duration::from_secs(90),
            "streaming again after a restart",
            |r| r["counts"]["messages"] == 3 && r["checks"]["connector"]["running"] == true,
        )
        .await;
    assert_eq!(report["counts"]["gaps"], 0, "nothing lost: {report:#}");
    assert_eq!(report["counts"]["duplicates"], 0, "{report:#}");
    eprintln!(
        "streaming {:.1} s after the limit was raised; {} restarts in all",
        cured.elapsed().as_secs_f64(),
        report["checks"]["connector"]["keeper"]["restarts"]
    );
    audit.stop().await.unwrap();
    p.cleanup().await;
}

#[tokio::test]
async fn a_stalled_service_an_unreachable_database_and_a_new_dead_letter_fire_their_alarms() {
    let p = spawn_pipeline().await;
    // A receipts processor that cannot reach its database never starts reading: its
    // /readyz answers 503 once its reader has not polled for stall_after_ms.
    let port = free_port();
    let bin = std::env::var("CHATPIPE_PIPELINE_BIN").unwrap_or_else(|_| {
        panic!("CHATPIPE_PIPELINE_BIN is not set: run the suite with scripts/test, which builds `pipeline`")
    });
    let s = p.receipts_settings();
    let _stalled = tokio::process::Command::new(bin)
        .arg("receipts")
        .env("KAFKA_BROKERS", &s.kafka.brokers)
        .env("SCHEMA_REGISTRY_URL", &s.registry.url)
        .env(
            "DATABASE_URL",
            "postgres://postgres:postgres@127.0.0.1:1/nowhere",
        )
        .env("CHATPIPE_RECEIPTS__TOPIC", &s.receipts.topic)
        .env("CHATPIPE_RECEIPTS__GROUP", &s.receipts.group)
        .env("CHATPIPE_READERS__STALL_AFTER_MS", "2000")
        .env("CHATPIPE_HTTP__METRICS_ADDR", format!("127.0.0.1:{port}"))
        .env("RUST_LOG", "error")
        .kill_on_drop(true)
        .spawn()
        .expect("pipeline receipts starts");
    let mut settings = p.audit_settings();
    let probe = format!("http://127.0.0.1:{port}/readyz");
    settings.audit.probes = vec![probe.clone()];
    // The auditor's own view of PostgreSQL: nothing listens there.
    settings.database.url = "postgres://postgres:postgres@127.0.0.1:1/nowhere".into();
    let audit = p.start_audit(settings).await;
    let started = std::time::Instant::now();
    audit
        .until(
            Duration::from_secs(30),
            "the dead-letter topics measured",
            |r| {
                r["checks"]["deadLetters"]
                    .as_object()
                    .is_some_and(|d| d.len() == 2)
            },
        )
        .await;

    produce_raw(
        &format!("{}.dlq", p.receipts_topic),
        "7",
        b"a record nobody could read",
    )
    .await;
    let took = audit.firing(&[alarm::DEAD_LETTERS], ALARM_DEADLINE).await;
    eprintln!(
        "dead_letters fired {:.1} s after the record",
        took.as_secs_f64()
    );

    audit
        .firing(
            &[alarm::PROBE_FAILING, alarm::POSTGRES_UNREACHABLE],
            ALARM_DEADLINE,
        )
        .await;
    let report = audit.report().await;
    let detail = report["firing"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == alarm::PROBE_FAILING)
        .unwrap()["detail"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        detail.contains(&probe) && detail.contains("503"),
        "{detail}"
    );
    eprintln!(
        "probe_failing and postgres_unreachable fired {:.1} s after the auditor started",
        started.elapsed().as_secs_f64()
    );
    audit.stop().await.unwrap();
    p.cleanup().await;
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
