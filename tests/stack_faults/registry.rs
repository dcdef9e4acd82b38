//! The schema registry stopped for 30 s while messages, membership changes and receipts
//! flow. Readers that meet a schema id they have not fetched yet hold their position
//! and retry: nothing is dead-lettered, nothing lost, and the order is kept, so a member
//! removed during the outage never receives a later message body.

use chatpipe_core::kafka::CreateGuarded;
use std::time::{Duration, Instant};

use chatpipe_core::kafka::BaseConsumer;
use chatpipe_runtime::health::ReaderReport;
use chatpipe_tests::push::Collector;
use chatpipe_tests::stream::{brokers, spawn_pipeline_with, wait_until_consumed};
use ingest_api::configuration::ReadMode;
use rdkafka::consumer::Consumer;
use serde_json::{json, Value};

use crate::{one_fault_at_a_time, stack, three_messages, told_once, StartOnPanic};

const OUTAGE: Duration = Duration::from_secs(30);

fn is_message(conversation: i64, seq: i64) -> impl Fn(&Value) -> bool {
    move |f| f["type"] == "message.new" && f["conversationId"] == conversation && f["seq"] == seq
}

/// Records in `topic` (high watermark minus low, summed over partitions).
pub(crate) fn records_in(topic: &str) -> i64 {
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create_guarded()
        .unwrap();
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    metadata.topics()[0]
        .partitions()
        .iter()
        .map(|p| {
            let (low, high) = consumer
                .fetch_watermarks(topic, p.id(), Duration::from_secs(10))
                .unwrap();
            high - low
        })
        .sum()
}

#[tokio::test]
async fn a_registry_outage_is_waited_out_nothing_dead_lettered_nothing_lost() {
    let _turn = one_fault_at_a_time().await;
    let p = spawn_pipeline_with(ReadMode::Stream).await;
    // Short stall threshold so that /readyz shows the outage within the test.
    let mut rs = p.receipts_settings();
    rs.readers.stall_after_ms = 5_000;
    let receipts = p.start_receipts(rs);
    let mut fs = p.fanout_settings();
    fs.readers.stall_after_ms = 5_000;
    let fanout = p.start_fanout(fs);
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let (alice, bob, carol, dave) = (1, 2, 3, 4);
    let mut bob_ws: Collector = p.connect(&gw.url, bob).await.collect();
    let mut carol_ws: Collector = p.connect(&gw.url, carol).await.collect();
    fanout
        .wait_online(&[bob, carol], Duration::from_secs(20))
        .await;

    // Nothing has been read from chat.events or chat.read-receipts yet: the processors
    // meet those topics' schema ids for the first time during the outage.
    let _restart = StartOnPanic::new("registry");
    stack(&["down", "registry"]).await;
    let outage = Instant::now();
    let conversation = p.app.user(alice).create_group(&[bob, carol, dave]).await;
    let mut seqs = Vec::new();
    for i in 1..=4 {
        seqs.push(
            p.app
                .user(alice)
                .send_message(conversation, &format!("m{i}"))
                .await,
        );
    }
    read(&p, dave, conversation, seqs[1]).await;
    p.app
        .user(alice)
        .delete(&format!("/v1/conversations/{conversation}/members/{carol}"))
        .await
        .expect(204);
    for i in 5..=8 {
        seqs.push(
            p.app
                .user(alice)
                .send_message(conversation, &format!("m{i}"))
                .await,
        );
    }
    read(&p, bob, conversation, seqs[3]).await;
    read(&p, bob, conversation, seqs[7]).await;

    // Held, and visible: the readers that need the registry report themselves stalled.
    until_stalled(
        || {
            let mut reports = receipts.readiness.report();
            reports.extend(fanout.readiness.report());
            reports
        },
        &["receipts-", "fanout-events"],
    )
    .await;
    let ready = reqwest::get(format!("{}/readyz", gw.admin)).await.unwrap();
    assert_eq!(
        ready.status(),
        200,
        "the gateway holds nothing: it is ready"
    );
    // Nothing applied yet: the receipts are held, not lost.
    assert_eq!(p.app.watermark(conversation, bob).await.unwrap(), 0);

    // The outage lasts 30 s; nothing to poll for.
    tokio::time::sleep(OUTAGE.saturating_sub(outage.elapsed())).await;
    stack(&["start", "registry"]).await;
    let back = Instant::now();

    // Every watermark final within 5 s of the registry's return.
    let deadline = back + Duration::from_secs(5);
    loop {
        let (b, d) = (
            p.app.watermark(conversation, bob).await.unwrap(),
            p.app.watermark(conversation, dave).await.unwrap(),
        );
        if b == seqs[7] && d == seqs[1] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "watermarks bob {b} dave {d}, want {} and {}, 5 s after the registry returned",
            seqs[7],
            seqs[1]
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let watermarks_final = back.elapsed();
    // Bob gets every message pushed, in order; carol only those before her removal.
    for &seq in &seqs {
        bob_ws
            .until(Duration::from_secs(20), is_message(conversation, seq))
            .await;
    }
    let pushes_done = back.elapsed();
    for &seq in &seqs[..4] {
        carol_ws
            .until(Duration::from_secs(5), is_message(conversation, seq))
            .await;
    }
    let leaked: Vec<&Value> = carol_ws
        .drain()
        .iter()
        .filter(|f| f["type"] == "message.new" && f["seq"].as_i64() > Some(seqs[3]))
        .collect();
    assert!(leaked.is_empty(), "carol, removed, received {leaked:?}");
    eprintln!(
        "after the registry returned: watermarks final {:.1} s, every push delivered {:.1} s",
        watermarks_final.as_secs_f64(),
        pushes_done.as_secs_f64()
    );

    // Nothing was dead-lettered.
    for dlq in [
        format!("{}.dlq", p.receipts_topic),
        format!("{}.dlq", p.topic),
        format!("{}.dlq", p.deliveries_topic()),
    ] {
        assert_eq!(records_in(&dlq), 0, "{dlq} is empty");
    }
    // And the readers are ready again.
    assert!(receipts.readiness.ready() && fanout.readiness.ready());
    assert!(receipts.is_running() && fanout.is_running());
    gw.stop().await.unwrap();
    p.cleanup().await;
}

/// POST /read in stream mode: accepted (202) onto chat.read-receipts.
async fn read(p: &chatpipe_tests::stream::Pipeline, user: i64, conversation: i64, seq: i64) {
    p.app
        .user(user)
        .post(
            &format!("/v1/conversations/{conversation}/read"),
            json!({"seq": seq}),
        )
        .await
        .expect(202);
}

/// The notifications processor through a registry outage: it meets chat.events' schema
/// id for the first time while the registry is down, holds its position and says so
/// (stalled), dead-letters nothing and writes nothing; once the registry is back the
/// offline member gets exactly one record for the messages sent during the outage.
#[tokio::test]
async fn a_registry_outage_holds_the_notifications_processor_and_loses_no_notification() {
    let _turn = one_fault_at_a_time().await;
    let p = chatpipe_tests::stream::spawn_pipeline().await;
    let mut settings = p.notification_settings();
    settings.readers.stall_after_ms = 5_000;
    let notifier = p.start_notifications(settings);
    // Running: its schema fetched, its presence table caught up, its partitions held.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !notifier
        .readiness
        .report()
        .iter()
        .any(|r| r.reader == "notifications" && !r.partitions.is_empty())
    {
        assert!(
            Instant::now() < deadline,
            "the notifications reader never held its partitions: {:?}",
            notifier.readiness.report()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let _restart = StartOnPanic::new("registry");
    stack(&["down", "registry"]).await;
    let outage = Instant::now();
    let (alice, erin) = (1, 2);
    let (_, last) = three_messages(&p, (alice, erin)).await;
    until_stalled(|| notifier.readiness.report(), &["notifications"]).await;
    assert_eq!(
        records_in(&p.notifications_topic()),
        0,
        "nothing is told while the events cannot be read"
    );
    // The outage lasts 30 s; nothing to poll for.
    tokio::time::sleep(OUTAGE.saturating_sub(outage.elapsed())).await;
    stack(&["start", "registry"]).await;
    let back = Instant::now();

    told_once(&p, (erin, 3, last)).await;
    eprintln!(
        "the record written {:.1} s after the registry was back",
        back.elapsed().as_secs_f64()
    );
    assert_eq!(
        records_in(&format!("{}.dlq", p.topic)),
        0,
        "nothing dead-lettered"
    );
    assert!(
        notifier.is_running(),
        "the notifications processor stayed up"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !notifier.readiness.ready() {
        assert!(
            Instant::now() < deadline,
            "still stalled 30 s after the registry returned: {:?}",
            notifier.readiness.report()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(notifier);
    p.cleanup().await;
}

/// Polls `reports` until, for each of `readers` (a reader's name, or the start of one
/// ending in '-'), a reader so named reports itself stalled; fails after [`OUTAGE`].
async fn until_stalled(reports: impl Fn() -> Vec<ReaderReport>, readers: &[&str]) {
    let named = |reader: &str, name: &str| {
        reader == name || (name.ends_with('-') && reader.starts_with(name))
    };
    let until = Instant::now() + OUTAGE;
    loop {
        let stalled: Vec<ReaderReport> = reports().into_iter().filter(|r| r.stalled).collect();
        if readers
            .iter()
            .all(|name| stalled.iter().any(|r| named(&r.reader, name)))
        {
            for r in &stalled {
                eprintln!("during the outage: {}: {:?}", r.reader, r.reason);
            }
            return;
        }
        assert!(
            Instant::now() < until,
            "{readers:?} never all reported a stall; stalled: {stalled:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// docs/examples/consume_chat_events.py through a registry outage: started while the
/// registry is down (a new process: no schema cached), it holds the first record and
/// retries, prints nothing and counts nothing undecodable; once the registry is back it
/// applies every record once. Run again in the same group it finds nothing left to read:
/// it committed the offsets of what it applied.
#[tokio::test]
async fn the_python_example_waits_out_a_registry_outage_and_applies_every_record_once() {
    use std::sync::{Arc, Mutex};
    use tokio::io::AsyncBufReadExt;

    let _turn = one_fault_at_a_time().await;
    let python = std::env::var("CHATPIPE_PYTHON").unwrap_or_else(|_| {
        panic!("CHATPIPE_PYTHON is not set: run the suite with scripts/test, which installs confluent-kafka")
    });
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/examples/consume_chat_events.py"
    );
    let p = chatpipe_tests::stream::spawn_pipeline().await;
    three_messages(&p, (1, 2)).await;
    // conversation.created, two member.joined, three message.new.
    let on_topic = p
        .consume_until(Duration::from_secs(60), |rs| crate::messages(rs).len() == 3)
        .await
        .len();
    assert_eq!(on_topic, 6);
    let group = format!("{}-python", p.ns);
    let args = [
        script,
        "--topic",
        &p.topic,
        "--group",
        &group,
        "--from-beginning",
    ];

    let _restart = StartOnPanic::new("registry");
    stack(&["down", "registry"]).await;
    let mut child = tokio::process::Command::new(&python)
        .args(args)
        .args(["--max", "6", "--idle-timeout", "120"])
        .env("KAFKA_BROKERS", brokers())
        .env("SCHEMA_REGISTRY_URL", chatpipe_tests::registry_url())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the Python example starts");
    let lines = |stream: Box<dyn tokio::io::AsyncRead + Unpin + Send>| {
        let seen = Arc::new(Mutex::new(Vec::<String>::new()));
        let into = seen.clone();
        tokio::spawn(async move {
            let mut reader = tokio::io::BufReader::new(stream).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                into.lock().unwrap().push(line);
            }
        });
        seen
    };
    let stdout = lines(Box::new(child.stdout.take().unwrap()));
    let stderr = lines(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !stderr
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.contains("registry unavailable"))
    {
        assert!(
            Instant::now() < deadline,
            "no retry reported in 60 s: {:?}",
            stderr.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        stdout.lock().unwrap().is_empty(),
        "nothing applied while the registry is down"
    );
    assert!(
        child.try_wait().unwrap().is_none(),
        "it waits, it does not give up"
    );

    stack(&["start", "registry"]).await;
    let status = tokio::time::timeout(Duration::from_secs(120), child.wait())
        .await
        .expect("the example finished within 120 s of the registry's return")
        .unwrap();
    assert!(status.success(), "{:?}", stderr.lock().unwrap());
    let printed: Vec<Value> = stdout
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut offsets: Vec<(i64, i64)> = printed
        .iter()
        .map(|l| {
            (
                l["partition"].as_i64().unwrap(),
                l["offset"].as_i64().unwrap(),
            )
        })
        .collect();
    offsets.sort_unstable();
    offsets.dedup();
    assert_eq!(offsets.len(), 6, "every record applied once: {printed:?}");
    assert!(
        !stderr
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("undecodable")),
        "{:?}",
        stderr.lock().unwrap()
    );

    // The same group again: its offsets were committed, nothing is read twice.
    let again = chatpipe_tests::stream::run_example(
        "the Python example, again",
        &python,
        &[&args[..], &["--idle-timeout", "5"]].concat(),
    )
    .await;
    assert!(again.is_empty(), "read again: {again:?}");
    p.cleanup().await;
}

/// The analytics processor through a registry outage: it meets chat.events' schema id for
/// the first time while the registry is down, holds its position and says so (stalled),
/// writes no row and dead-letters nothing; once the registry is back every row comes,
/// once.
#[tokio::test]
async fn a_registry_outage_holds_the_analytics_processor_and_loses_no_row() {
    let _turn = one_fault_at_a_time().await;
    let p = chatpipe_tests::stream::spawn_pipeline().await;
    let mut settings = p.analytics_settings().await;
    settings.readers.stall_after_ms = 5_000;
    let analytics = p.start_analytics(settings.clone());
    // Running: its own schemas registered, its partitions held.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !analytics
        .readiness
        .report()
        .iter()
        .any(|r| r.reader == "analytics" && !r.partitions.is_empty())
    {
        assert!(
            Instant::now() < deadline,
            "the analytics reader never held its partitions: {:?}",
            analytics.readiness.report()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let _restart = StartOnPanic::new("registry");
    stack(&["down", "registry"]).await;
    three_messages(&p, (1, 2)).await;
    until_stalled(|| analytics.readiness.report(), &["analytics"]).await;
    let a = &settings.analytics;
    assert_eq!(
        records_in(&a.messages_topic),
        0,
        "no row while the events cannot be read"
    );
    stack(&["start", "registry"]).await;
    let back = Instant::now();

    // Three messages, two joins: every row, once.
    let deadline = Instant::now() + Duration::from_secs(60);
    while (
        records_in(&a.messages_topic),
        records_in(&a.membership_topic),
    ) != (3, 2)
    {
        assert!(
            Instant::now() < deadline,
            "rows 60 s after the registry returned: {} messages, {} membership",
            records_in(&a.messages_topic),
            records_in(&a.membership_topic)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "every row written {:.1} s after the registry was back",
        back.elapsed().as_secs_f64()
    );
    wait_until_consumed(&a.group, &p.topic, Duration::from_secs(30)).await;
    assert_eq!(
        (
            records_in(&a.messages_topic),
            records_in(&a.membership_topic)
        ),
        (3, 2),
        "and no row twice"
    );
    assert_eq!(
        records_in(&format!("{}.dlq", p.topic)),
        0,
        "nothing dead-lettered"
    );
    assert!(analytics.is_running(), "the analytics processor stayed up");
    analytics.stop().unwrap();
    p.cleanup().await;
}
