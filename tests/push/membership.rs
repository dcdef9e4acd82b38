//! Where fanout's membership store comes from: the membership events of chat.events as
//! they arrive, its compacted changelog after a restart (not the events' history), and
//! PostgreSQL for conversations it does not hold.

use chatpipe_core::kafka::CreateGuarded;
use std::time::Duration;

use chatpipe_schemas::ChatEvent;
use chatpipe_tests::push::FANOUT_MEMBERS_LOAD;
use chatpipe_tests::stream::{brokers, set_topic_config, spawn_pipeline};
use rdkafka::admin::AdminOptions;
use rdkafka::consumer::Consumer;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

use crate::{frames_before_a_marker, is_message, PRESENCE_DEADLINE, PUSH_DEADLINE};

#[tokio::test]
async fn a_restarted_fanout_restores_membership_from_its_changelog() {
    let p = spawn_pipeline().await;
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let (alice, bob) = (1, 2);
    let conversation = p.app.user(alice).create_group(&[bob]).await;
    let mut ws = p.connect(&gw.url, bob).await;

    let first = p.start_fanout(p.fanout_settings());
    first.wait_online(&[bob], PRESENCE_DEADLINE).await;
    let seq = p.app.user(alice).send_message(conversation, "before").await;
    ws.until(PUSH_DEADLINE, is_message(conversation, seq)).await;
    first.stop().unwrap();

    // Same group: it resumes after `before` and must know the members from the changelog.
    let loads_before = p.app.statement_calls(FANOUT_MEMBERS_LOAD).await;
    let second = p.start_fanout(p.fanout_settings());
    second.wait_online(&[bob], PRESENCE_DEADLINE).await;
    let seq = p.app.user(alice).send_message(conversation, "after").await;
    let (frame, _) = ws.until(PUSH_DEADLINE, is_message(conversation, seq)).await;
    assert_eq!(frame["body"], "after");
    let restored = second.status.restored_records();
    assert!(
        (1..=3).contains(&restored),
        "the conversation's changelog entries (created, two joins; fewer once compacted) were read back, not the events: {restored}"
    );
    assert_eq!(
        p.app.statement_calls(FANOUT_MEMBERS_LOAD).await - loads_before,
        0,
        "no database lookup was needed (pg_stat_statements)"
    );
    gw.stop().await.unwrap();
    p.cleanup().await;
}

#[tokio::test]
async fn a_conversation_past_retention_is_loaded_from_postgres_once() {
    let p = spawn_pipeline().await;
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let (alice, bob) = (1, 2);
    let conversation = p.app.user(alice).create_group(&[bob]).await;
    // Its creation reaches the topic, then retention takes it (DeleteRecords).
    p.consume_until(Duration::from_secs(30), |rs| {
        rs.iter().any(|r| {
            matches!(&r.event, ChatEvent::MemberJoined(j)
                if j.conversation_id.get() == conversation && j.user_id.get() == bob)
        })
    })
    .await;
    let admin: chatpipe_core::kafka::AdminClient = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create_guarded()
        .unwrap();
    let mut all = TopicPartitionList::new();
    for partition in 0..6 {
        all.add_partition_offset(&p.topic, partition, Offset::End)
            .unwrap();
    }
    for result in admin
        .delete_records(&all, &AdminOptions::new())
        .await
        .unwrap()
        .elements()
    {
        result.error().expect("records deleted");
    }

    let loads_before = p.app.statement_calls(FANOUT_MEMBERS_LOAD).await;
    let fanout = p.start_fanout(p.fanout_settings());
    let mut ws = p.connect(&gw.url, bob).await;
    fanout.wait_online(&[bob], PRESENCE_DEADLINE).await;
    for body in ["one", "two"] {
        let seq = p.app.user(alice).send_message(conversation, body).await;
        let (frame, _) = ws.until(PUSH_DEADLINE, is_message(conversation, seq)).await;
        assert_eq!(frame["body"], body);
    }
    assert_eq!(
        p.app.statement_calls(FANOUT_MEMBERS_LOAD).await - loads_before,
        1,
        "loaded once, then kept from the events (pg_stat_statements)"
    );
    gw.stop().await.unwrap();
    p.cleanup().await;
}

/// Membership changed while everyone is online, end to end through fanout: a member
/// removed gets nothing after `member.left`, and one added gets what follows
/// `member.joined`, and nothing from before.
#[tokio::test]
async fn a_member_removed_while_online_stops_at_member_left_and_one_added_starts_at_member_joined()
{
    let p = spawn_pipeline().await;
    let fanout = p.start_fanout(p.fanout_settings());
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let (alice, bob, carol, dave) = (1, 2, 3, 4);
    let group = p.app.user(alice).create_group(&[bob, carol]).await;
    let mut bob_ws = p.connect(&gw.url, bob).await;
    let mut carol_ws = p.connect(&gw.url, carol).await;
    let mut dave_ws = p.connect(&gw.url, dave).await;
    fanout
        .wait_online(&[bob, carol, dave], PRESENCE_DEADLINE)
        .await;

    let first = p.app.user(alice).send_message(group, "all of us").await;
    bob_ws.until(PUSH_DEADLINE, is_message(group, first)).await;
    carol_ws
        .until(PUSH_DEADLINE, is_message(group, first))
        .await;

    p.app
        .user(alice)
        .delete(&format!("/v1/conversations/{group}/members/{bob}"))
        .await
        .expect(204);
    let without_bob = p.app.user(alice).send_message(group, "bob left").await;
    carol_ws
        .until(PUSH_DEADLINE, is_message(group, without_bob))
        .await;

    p.app
        .user(alice)
        .post(
            &format!("/v1/conversations/{group}/members"),
            serde_json::json!({"userIds": [dave]}),
        )
        .await
        .expect(200);
    let with_dave = p.app.user(alice).send_message(group, "dave joined").await;
    carol_ws
        .until(PUSH_DEADLINE, is_message(group, with_dave))
        .await;
    let (frame, before) = dave_ws
        .until(PUSH_DEADLINE, is_message(group, with_dave))
        .await;
    assert_eq!(frame["body"], "dave joined");
    assert!(
        before.iter().all(|f| f["conversationId"] != group),
        "dave got the group's pushes from before he joined: {before:?}"
    );

    let marker = p.app.user(alice).create_group(&[bob]).await;
    let since_left = frames_before_a_marker(&p, &mut bob_ws, alice, marker, group).await;
    assert!(
        since_left.is_empty(),
        "bob got the group's pushes after he left: {since_left:?}"
    );
    gw.stop().await.unwrap();
    p.cleanup().await;
}

/// A membership change whose event never reached chat.events (lost with the WAL that
/// carried it: a slot dropped, a failover without failover slots) cannot keep a removed
/// member on fanout's list. Carol is removed in PostgreSQL with no event; the next
/// message carries the conversation's new membership version (the `membershipVersion`
/// header, from `conversation.membership_version`), fanout sees its list is behind and
/// loads it again: bob gets the message, carol does not, and the changelog entry a
/// restart would trust no longer lists her. Witnesses: what each WebSocket received, the
/// record's header against PostgreSQL's row, the changelog topic.
#[tokio::test]
async fn a_member_removed_without_an_event_is_dropped_at_the_next_event_of_a_newer_version() {
    let p = spawn_pipeline().await;
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let settings = p.fanout_settings();
    let changelog = settings.fanout.changelog_topic.clone();
    let fanout = p.start_fanout(settings);
    let (alice, bob, carol) = (1, 2, 3);
    let group = p.app.user(alice).create_group(&[bob, carol]).await;
    let mut bob_ws = p.connect(&gw.url, bob).await;
    let mut carol_ws = p.connect(&gw.url, carol).await;
    fanout.wait_online(&[bob, carol], PRESENCE_DEADLINE).await;
    let first = p.app.user(alice).send_message(group, "all three").await;
    bob_ws.until(PUSH_DEADLINE, is_message(group, first)).await;
    carol_ws
        .until(PUSH_DEADLINE, is_message(group, first))
        .await;

    // The lost event: the row is gone, no outbox row says so.
    let removed =
        sqlx::query("DELETE FROM conversation_member WHERE conversation_id = $1 AND user_id = $2")
            .bind(group)
            .bind(carol)
            .execute(&p.app.pool)
            .await
            .unwrap();
    assert_eq!(removed.rows_affected(), 1);
    let version = p.app.membership_version(group).await;

    let after = p.app.user(alice).send_message(group, "carol is gone").await;
    bob_ws.until(PUSH_DEADLINE, is_message(group, after)).await;
    let record = p
        .consume_until(Duration::from_secs(30), |rs| {
            rs.iter().any(|r| is_new(r, group, after))
        })
        .await
        .into_iter()
        .find(|r| is_new(r, group, after))
        .expect("the message on chat.events");
    assert_eq!(
        record.headers.get("membershipVersion"),
        Some(&version.to_string()),
        "the record carries the version PostgreSQL's row has"
    );

    let marker = p.app.user(alice).create_group(&[carol]).await;
    let since = frames_before_a_marker(&p, &mut carol_ws, alice, marker, group).await;
    assert!(
        since.is_empty(),
        "carol got the group's pushes after she was removed: {since:?}"
    );
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while changelog_members(&changelog, record.partition, group).await != Some(vec![alice, bob]) {
        assert!(
            std::time::Instant::now() < until,
            "the changelog entry still lists carol after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    fanout.stop().unwrap();
    gw.stop().await.unwrap();
    p.cleanup().await;
}

fn is_new(r: &chatpipe_tests::stream::Record, conversation: i64, seq: i64) -> bool {
    matches!(&r.event, ChatEvent::MessageNew(m)
        if m.conversation_id.get() == conversation && m.seq.get() == seq)
}

/// Membership changes of one conversation within one tick are one changelog write: a
/// group made with 150 members in one call is 151 membership events (its creation and
/// 150 joins), written as one entry, not 151 growing ones. Counted from the changelog
/// topic's own end offsets; the tick is 5 s here so that the 151 events, which arrive
/// together, fall in at most two ticks.
#[tokio::test]
async fn the_membership_changes_of_one_tick_are_one_changelog_write_per_conversation() {
    let p = spawn_pipeline().await;
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let mut settings = p.fanout_settings();
    settings.fanout.tick_ms = 5_000;
    let changelog = settings.fanout.changelog_topic.clone();
    let fanout = p.start_fanout(settings);
    let members: Vec<i64> = (2..=151).collect();
    let mut ws = p.connect(&gw.url, 2).await;
    fanout.wait_online(&[2], PRESENCE_DEADLINE).await;
    let conversation = p.app.user(1).create_group(&members).await;
    // Its message is on the same partition, after the joins: once it is pushed, fanout
    // has applied all 151 membership events.
    let seq = p.app.user(1).send_message(conversation, "hello").await;
    ws.until(PUSH_DEADLINE, is_message(conversation, seq)).await;
    // A stop writes what the last tick did not, and waits for the acks.
    fanout.stop().unwrap();
    let writes = chatpipe_tests::stream::end_offsets(&changelog).await;
    assert!(
        (1..=2).contains(&writes),
        "151 membership changes of one conversation: {writes} changelog writes"
    );
    gw.stop().await.unwrap();
    p.cleanup().await;
}

/// The committed offset of `group` on `partition` of `topic` (0: none).
async fn committed(group: &str, topic: &str, partition: i32) -> i64 {
    let (group, topic) = (group.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        chatpipe_tests::stream::committed(&group, &topic)[partition as usize]
    })
    .await
    .unwrap()
}

/// The last changelog entry of `conversation` on `partition`: its members (`None`: a
/// tombstone or no entry).
async fn changelog_members(topic: &str, partition: i32, conversation: i64) -> Option<Vec<i64>> {
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let consumer: chatpipe_core::kafka::BaseConsumer =
            chatpipe_core::kafka::consumer_config(&brokers(), &format!("{topic}-read"))
                .create_guarded()
                .expect("Kafka consumer");
        let (low, high) = consumer
            .fetch_watermarks(&topic, partition, Duration::from_secs(10))
            .expect("watermarks");
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&topic, partition, Offset::Offset(low))
            .unwrap();
        consumer.assign(&tpl).unwrap();
        let writer =
            apache_avro::Schema::parse_str(chatpipe_schemas::contract::FANOUT_MEMBERS.schema)
                .unwrap();
        let mut last = None;
        let mut next = low;
        while next < high {
            let Some(m) = consumer.poll(Duration::from_secs(10)) else {
                panic!("{topic}/{partition}: nothing at offset {next} of {high}");
            };
            let m = m.expect("a changelog record");
            next = m.offset() + 1;
            if m.key() != Some(conversation.to_string().as_bytes()) {
                continue;
            }
            last = m.payload().map(|bytes| {
                let entry = chatpipe_schemas::members::FanoutMembers::decode_with(&writer, bytes)
                    .expect("a changelog entry");
                let mut users: Vec<i64> = entry.user_ids.iter().map(|u| u.get()).collect();
                users.sort_unstable();
                users
            });
        }
        last
    })
    .await
    .unwrap()
}

/// The partition of `conversation`'s events (and so of its changelog entry).
async fn changelog_partition(p: &chatpipe_tests::stream::Pipeline, conversation: i64) -> i32 {
    p.consume_until(Duration::from_secs(30), |rs| {
        rs.iter().any(|r| r.key == conversation.to_string())
    })
    .await
    .into_iter()
    .find(|r| r.key == conversation.to_string())
    .expect("a record of the conversation")
    .partition
}

/// A changelog entry the broker refuses is written again, never dropped: while it is
/// refused (the changelog topic's `max.message.bytes` set below any record) the offsets
/// after it are not committed, and once the broker takes records again the changelog
/// holds the entry without the removed member. A dropped write would leave her in the
/// compacted changelog, which a restarted fanout trusts: she would get the group's
/// messages again. Witnesses: the topic's records and the group's committed offsets.
#[tokio::test]
async fn a_changelog_entry_the_broker_refuses_is_written_again_and_holds_the_offsets() {
    let p = spawn_pipeline().await;
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    let settings = p.fanout_settings();
    let (changelog, group) = (
        settings.fanout.changelog_topic.clone(),
        settings.fanout.group.clone(),
    );
    let fanout = p.start_fanout(settings);
    let (alice, bob, carol) = (1, 2, 3);
    let conversation = p.app.user(alice).create_group(&[bob, carol]).await;
    let mut bob_ws = p.connect(&gw.url, bob).await;
    fanout.wait_online(&[bob], PRESENCE_DEADLINE).await;
    let first = p
        .app
        .user(alice)
        .send_message(conversation, "all three")
        .await;
    bob_ws
        .until(PUSH_DEADLINE, is_message(conversation, first))
        .await;
    // The group's entry is written on a tick after its events: wait for it first.
    let written = std::time::Instant::now() + Duration::from_secs(30);
    let partition = changelog_partition(&p, conversation).await;
    while changelog_members(&changelog, partition, conversation).await
        != Some(vec![alice, bob, carol])
    {
        assert!(
            std::time::Instant::now() < written,
            "the group's changelog entry was not written within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    set_topic_config(&changelog, "max.message.bytes", "1").await;
    p.app
        .user(alice)
        .delete(&format!("/v1/conversations/{conversation}/members/{carol}"))
        .await
        .expect(204);
    let after = p
        .app
        .user(alice)
        .send_message(conversation, "carol left")
        .await;
    bob_ws
        .until(PUSH_DEADLINE, is_message(conversation, after))
        .await;
    let left = p
        .consume_until(Duration::from_secs(30), |rs| {
            rs.iter()
                .any(|r| matches!(&r.event, ChatEvent::MemberLeft(l) if l.user_id.get() == carol))
        })
        .await
        .into_iter()
        .find(|r| matches!(&r.event, ChatEvent::MemberLeft(l) if l.user_id.get() == carol))
        .expect("member.left on the topic");
    // Fanout has pushed the later message: it read past member.left. For five seconds
    // (fanout commits every poll), no offset past member.left is committed.
    let watched = std::time::Instant::now();
    while watched.elapsed() < Duration::from_secs(5) {
        let at = committed(&group, &p.topic, left.partition).await;
        assert!(
            at <= left.offset,
            "offset {at} committed past member.left at {} while its changelog entry is refused",
            left.offset
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        changelog_members(&changelog, left.partition, conversation).await,
        Some(vec![alice, bob, carol]),
        "the refused entry is not on the changelog yet"
    );

    // The broker takes records again: the entry is written, then the offsets move on.
    set_topic_config(&changelog, "max.message.bytes", "1048588").await;
    let until = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let members = changelog_members(&changelog, left.partition, conversation).await;
        let at = committed(&group, &p.topic, left.partition).await;
        if members == Some(vec![alice, bob]) && at > left.offset {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "within 60 s: changelog entry {members:?}, committed offset {at} (member.left at {})",
            left.offset
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    fanout.stop().unwrap();
    gw.stop().await.unwrap();
    p.cleanup().await;
}
