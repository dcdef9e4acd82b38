//! Fanout's restore cost follows the live conversations, not the history: with a million
//! records of chat.events behind it, a restarted fanout reads its membership back from
//! the compacted changelog. Its own test binary: producing a million records would
//! starve the timing-sensitive push tests running beside it.

use std::time::{Duration, Instant};

use chatpipe_schemas::registry::Registry;
use chatpipe_tests::bench::{live_groups, old_messages, produce_events, start_group_at_end};
use chatpipe_tests::push::FANOUT_MEMBERS_LOAD;
use chatpipe_tests::registry_url;
use chatpipe_tests::stream::{brokers, spawn_pipeline};

const PUSH_DEADLINE: Duration = Duration::from_secs(20);
const PRESENCE_DEADLINE: Duration = Duration::from_secs(20);

fn is_message(conversation: i64, seq: i64) -> impl Fn(&serde_json::Value) -> bool {
    move |f| f["type"] == "message.new" && f["conversationId"] == conversation && f["seq"] == seq
}

const CONVERSATIONS: i64 = 10_000;
const HISTORY: i64 = 1_000_000;

#[tokio::test]
async fn a_fanout_restarted_after_a_million_records_restores_from_the_changelog() {
    let p = spawn_pipeline().await;
    let codec = Registry::new(&registry_url(), Duration::from_secs(5))
        .unwrap()
        .event_codec_for(&p.events_subject)
        .await
        .unwrap();
    let long_ago = chrono::Utc::now() - chrono::Duration::days(3);

    // History: a million messages the new fanout group will never need to read.
    let started = Instant::now();
    let topic = p.topic.clone();
    let history = {
        let codec = codec.clone();
        tokio::task::spawn_blocking(move || {
            produce_events(
                &brokers(),
                &topic,
                old_messages(&codec, HISTORY, CONVERSATIONS, long_ago),
            )
        })
        .await
        .unwrap()
    };
    eprintln!(
        "{history} records of history produced in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    // The fanout group starts after the history, as if it had processed it long ago.
    start_group_at_end(&brokers(), &p.fanout_settings().fanout.group, &p.topic, 6);

    // The live state: 10,000 conversations of two members each, and one real one.
    let topic = p.topic.clone();
    let membership = tokio::task::spawn_blocking(move || {
        produce_events(
            &brokers(),
            &topic,
            live_groups(&codec, CONVERSATIONS, long_ago),
        )
    })
    .await
    .unwrap();
    let (alice, bob) = (1, 2);
    let conversation = p.app.user(alice).create_group(&[bob]).await;

    // The first fanout applies the live state and writes its changelog.
    let first = p.start_fanout(p.fanout_settings());
    let until = Instant::now() + Duration::from_secs(120);
    // Created + two joins for the real conversation, through CDC.
    while first.status.events() < membership + 3 {
        assert!(
            Instant::now() < until,
            "the first fanout applied {} of {} membership events",
            first.status.events(),
            membership + 3
        );
        assert!(first.is_running(), "the first fanout stopped");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    first.stop().unwrap();

    // The restarted fanout knows every member without reading the history.
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let mut ws = p.connect(&gw.url, bob).await;
    let restarted = Instant::now();
    let loads_before = p.app.statement_calls(FANOUT_MEMBERS_LOAD).await;
    let second = p.start_fanout(p.fanout_settings());
    second.wait_online(&[bob], PRESENCE_DEADLINE).await;
    let seq = p.app.user(alice).send_message(conversation, "after").await;
    let (frame, _) = ws.until(PUSH_DEADLINE, is_message(conversation, seq)).await;
    assert_eq!(frame["body"], "after");
    let restored = second.status.restored_records();
    eprintln!(
        "restart after {} records of chat.events: {restored} changelog records restored, a push {:.1} s after the start",
        history + membership + 3,
        restarted.elapsed().as_secs_f64()
    );
    assert!(
        restored <= (CONVERSATIONS as u64 + 1) * 3,
        "at most one changelog record per membership change: {restored}"
    );
    assert!(
        restored >= 3,
        "the real conversation came from the changelog: {restored}"
    );
    assert_eq!(
        p.app.statement_calls(FANOUT_MEMBERS_LOAD).await - loads_before,
        0,
        "no conversation had to be loaded from PostgreSQL (pg_stat_statements)"
    );
    gw.stop().await.unwrap();
    p.cleanup().await;
}
