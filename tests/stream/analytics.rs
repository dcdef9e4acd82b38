//! `pipeline analytics` on the stack: a scripted mix goes through the real outbox,
//! Debezium and chat.events; the analytics topics, read with Confluent's own Avro
//! deserializer (docs/examples/read_analytics_topics.py), carry exactly the rows the
//! events on chat.events imply, with what only the first version of a message says taken
//! from PostgreSQL. And a delete's row erases the body from the compacted messages topic.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use chatpipe_core::kafka::CreateGuarded;
use chatpipe_schemas::ChatEvent;
use chatpipe_tests::stream::{
    brokers, run_example, set_topic_config, spawn_pipeline, wait_until_consumed, Pipeline,
    ReceiptsProcessor,
};
use rdkafka::consumer::Consumer;
use rdkafka::Message;
use serde_json::{json, Value};
use uuid::Uuid;

const DEADLINE: Duration = Duration::from_secs(60);

fn python() -> String {
    std::env::var("CHATPIPE_PYTHON").unwrap_or_else(|_| {
        panic!("CHATPIPE_PYTHON is not set: run the suite with scripts/test, which installs confluent-kafka")
    })
}

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../docs/examples/read_analytics_topics.py"
);

fn micros(t: &chrono::DateTime<chrono::Utc>) -> i64 {
    t.timestamp_micros()
}

/// The rows chat.events implies, by topic suffix, as (key, value) JSON: the mapping
/// docs/topics.md states, applied to the test's own decode of the events and to
/// PostgreSQL's rows.
async fn implied(p: &Pipeline, events: &[ChatEvent]) -> BTreeMap<&'static str, Vec<Value>> {
    let mut rows: BTreeMap<&'static str, Vec<Value>> = BTreeMap::new();
    let mut last: HashMap<(&str, i64, i64), i64> = HashMap::new();
    let first = |c: i64, s: i64| {
        sqlx::query_as::<
            _,
            (
                chrono::DateTime<chrono::Utc>,
                Option<i64>,
                Option<chrono::DateTime<chrono::Utc>>,
            ),
        >(
            "SELECT created_at, thread_root_seq, edited_at FROM message
              WHERE conversation_id = $1 AND seq = $2",
        )
        .bind(c)
        .bind(s)
        .fetch_one(&p.app.pool)
    };
    for event in events {
        let (topic, key, value) = match event {
            ChatEvent::MessageNew(m) => (
                "messages",
                format!("{}:{}", m.conversation_id, m.seq),
                json!({"conversationId": m.conversation_id.get(), "seq": m.seq.get(),
                       "change": "created", "changedAt": micros(&m.created_at),
                       "senderId": m.sender_id.get(), "createdAt": micros(&m.created_at),
                       "editedAt": null, "deletedAt": null,
                       "bodyLength": m.body.chars().count(), "body": m.body,
                       "threadRootSeq": m.thread_root_seq.map(|s| s.get()),
                       "mentions": m.mentions.iter().map(|u| u.get()).collect::<Vec<_>>()}),
            ),
            ChatEvent::MessageEdited(e) => {
                let (created, root, _) = first(e.conversation_id.get(), e.seq.get()).await.unwrap();
                (
                    "messages",
                    format!("{}:{}", e.conversation_id, e.seq),
                    json!({"conversationId": e.conversation_id.get(), "seq": e.seq.get(),
                           "change": "edited", "changedAt": micros(&e.edited_at),
                           "senderId": e.sender_id.get(), "createdAt": micros(&created),
                           "editedAt": micros(&e.edited_at), "deletedAt": null,
                           "bodyLength": e.body.chars().count(), "body": e.body,
                           "threadRootSeq": root,
                           "mentions": e.mentions.iter().map(|u| u.get()).collect::<Vec<_>>()}),
                )
            }
            ChatEvent::MessageDeleted(d) => {
                let (created, root, edited) =
                    first(d.conversation_id.get(), d.seq.get()).await.unwrap();
                (
                    "messages",
                    format!("{}:{}", d.conversation_id, d.seq),
                    json!({"conversationId": d.conversation_id.get(), "seq": d.seq.get(),
                           "change": "deleted", "changedAt": micros(&d.deleted_at),
                           "senderId": d.sender_id.get(), "createdAt": micros(&created),
                           "editedAt": edited.as_ref().map(micros),
                           "deletedAt": micros(&d.deleted_at),
                           "bodyLength": null, "body": null, "threadRootSeq": root,
                           "mentions": []}),
                )
            }
            ChatEvent::ReadUpdated(r) => {
                let (c, u, to) = (
                    r.conversation_id.get(),
                    r.user_id.get(),
                    r.last_read_seq.get(),
                );
                let from = last.insert(("reads", c, u), to);
                (
                    "reads",
                    format!("{c}:{u}"),
                    json!({"conversationId": c, "userId": u,
                    "fromSeq": from, "toSeq": to, "at": micros(&r.occurred_at)}),
                )
            }
            ChatEvent::DeliveryUpdated(d) => {
                let (c, u, to) = (
                    d.conversation_id.get(),
                    d.user_id.get(),
                    d.last_delivered_seq.get(),
                );
                let from = last.insert(("deliveries", c, u), to);
                (
                    "deliveries",
                    format!("{c}:{u}"),
                    json!({"conversationId": c, "userId": u,
                    "fromSeq": from, "toSeq": to, "at": micros(&d.occurred_at)}),
                )
            }
            ChatEvent::MemberJoined(j) => (
                "membership",
                format!("{}:{}", j.conversation_id, j.user_id),
                json!({"conversationId": j.conversation_id.get(), "userId": j.user_id.get(),
                       "change": "joined", "role": j.role.as_str(), "by": j.added_by.get(),
                       "at": micros(&j.occurred_at)}),
            ),
            ChatEvent::MemberLeft(l) => (
                "membership",
                format!("{}:{}", l.conversation_id, l.user_id),
                json!({"conversationId": l.conversation_id.get(), "userId": l.user_id.get(),
                       "change": "left", "role": null, "by": l.removed_by.get(),
                       "at": micros(&l.occurred_at)}),
            ),
            ChatEvent::MemberRoleChanged(c) => (
                "membership",
                format!("{}:{}", c.conversation_id, c.user_id),
                json!({"conversationId": c.conversation_id.get(), "userId": c.user_id.get(),
                       "change": "role_changed", "role": c.role.as_str(),
                       "by": c.changed_by.get(), "at": micros(&c.occurred_at)}),
            ),
            _ => continue,
        };
        rows.entry(topic)
            .or_default()
            .push(json!({"key": key, "value": value}));
    }
    rows
}

/// Everything on the test's analytics topics, by topic suffix, in each key's order.
async fn read_back(
    p: &Pipeline,
    settings: &pipeline::settings::Settings,
) -> BTreeMap<String, Vec<Value>> {
    let a = &settings.analytics;
    let topics = [
        &a.messages_topic,
        &a.reads_topic,
        &a.deliveries_topic,
        &a.membership_topic,
    ]
    .map(|t| t.as_str())
    .join(",");
    let lines = run_example(
        "the analytics reader",
        &python(),
        &[SCRIPT, "--topics", &topics, "--idle-timeout", "5"],
    )
    .await;
    let mut rows: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut sorted = lines;
    sorted.sort_by_key(|l| (l["partition"].as_i64(), l["offset"].as_i64()));
    for line in sorted {
        let topic = line["topic"].as_str().unwrap();
        let suffix = topic.rsplit('.').next().unwrap().to_owned();
        assert!(topic.starts_with(&p.ns));
        rows.entry(suffix)
            .or_default()
            .push(json!({"key": line["key"], "value": line["value"]}));
    }
    rows
}

/// Rows as a multiset: keyed rows in their key's order (a partition's order), keys
/// sorted.
fn by_key(rows: &[Value]) -> BTreeMap<String, Vec<Value>> {
    let mut out: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for r in rows {
        out.entry(r["key"].as_str().unwrap().to_owned())
            .or_default()
            .push(r["value"].clone());
    }
    out
}

#[tokio::test]
async fn the_analytics_topics_carry_exactly_the_rows_chat_events_implies() {
    let p = spawn_pipeline().await;
    let settings = p.analytics_settings().await;
    let analytics = p.start_analytics(settings.clone());
    let (alice, bob, carol, dave) = (1, 2, 3, 4);
    let conv = p.app.user(alice).create_group(&[bob, carol]).await;
    let path = format!("/v1/conversations/{conv}");
    let send = |sender: i64, body: Value| {
        let (app, path) = (&p.app, &path);
        async move {
            app.user(sender)
                .post(&format!("{path}/messages"), body)
                .await
                .expect(201)["seq"]
                .as_i64()
                .unwrap()
        }
    };
    let first = send(
        alice,
        json!({"clientMsgId": Uuid::new_v4(), "body": "héllo, all"}),
    )
    .await;
    let named = send(
        alice,
        json!({"clientMsgId": Uuid::new_v4(), "body": "bob, a secret", "mentions": [bob]}),
    )
    .await;
    let reply = send(
        bob,
        json!({"clientMsgId": Uuid::new_v4(), "body": "a reply", "threadRootSeq": first}),
    )
    .await;
    p.app
        .user(alice)
        .patch(
            &format!("{path}/messages/{first}"),
            json!({"body": "hello, all"}),
        )
        .await
        .expect(200);
    p.app
        .user(alice)
        .delete(&format!("{path}/messages/{named}"))
        .await
        .expect(204);
    // Delivered before read (a read implies delivery and writes no delivery.updated), by
    // a member who did not send the message (a sender has read what they sent).
    p.app
        .user(carol)
        .post(&format!("{path}/delivered"), json!({"seq": reply}))
        .await
        .expect(200);
    p.app.user(bob).mark_read(conv, reply).await;
    p.app.user(carol).mark_read(conv, first).await;
    p.app.user(carol).mark_read(conv, reply).await;
    p.app
        .user(alice)
        .post(&format!("{path}/members"), json!({"userIds": [dave]}))
        .await
        .expect(200);
    p.app
        .user(alice)
        .patch(&format!("{path}/members/{bob}"), json!({"role": "ADMIN"}))
        .await
        .expect(200);
    p.app
        .user(carol)
        .delete(&format!("{path}/members/{carol}"))
        .await
        .expect(204);

    // chat.events to its end (the last event is carol's leave), and the processor past it.
    let records = p
        .consume_until(DEADLINE, |rs| {
            rs.iter()
                .any(|r| matches!(r.event, ChatEvent::MemberLeft(_)))
        })
        .await;
    wait_until_consumed(&settings.analytics.group, &p.topic, DEADLINE).await;
    let events: Vec<ChatEvent> = records.into_iter().map(|r| r.event).collect();
    let want = implied(&p, &events).await;
    let got = read_back(&p, &settings).await;
    for topic in ["messages", "reads", "deliveries", "membership"] {
        let (want, got) = (
            by_key(want.get(topic).map(Vec::as_slice).unwrap_or_default()),
            by_key(got.get(topic).map(Vec::as_slice).unwrap_or_default()),
        );
        assert!(!want.is_empty(), "the script makes {topic} rows");
        assert_eq!(got, want, "chat.analytics.{topic}");
    }
    // The mix covers what the rows must say: a reply's root on its edit, a watermark's
    // previous position, the bodies' length in characters.
    let messages = by_key(&want["messages"]);
    assert_eq!(messages[&format!("{conv}:{first}")][1]["bodyLength"], 10);
    assert_eq!(messages[&format!("{conv}:{named}")][1]["body"], Value::Null);
    assert_eq!(
        messages[&format!("{conv}:{reply}")][0]["threadRootSeq"],
        first
    );
    assert_eq!(
        by_key(&want["reads"])[&format!("{conv}:{carol}")][1]["fromSeq"],
        first
    );
    analytics.stop().unwrap();
    p.cleanup().await;
}

/// Erasure: after a delete and a compaction of chat.analytics.messages, the deleted
/// body's bytes are in no record of the topic (read raw, not decoded), while the
/// message's row (without body) is.
#[tokio::test]
async fn a_deleted_body_is_gone_from_the_messages_topic_once_compacted() {
    let p = spawn_pipeline().await;
    let settings = p.analytics_settings().await;
    let topic = settings.analytics.messages_topic.clone();
    // Segments roll after a second, and a closed one is cleaned as soon as it can be.
    for (k, v) in [
        ("segment.ms", "1000"),
        ("min.cleanable.dirty.ratio", "0.01"),
        ("min.compaction.lag.ms", "0"),
    ] {
        set_topic_config(&topic, k, v).await;
    }
    let analytics = p.start_analytics(settings.clone());
    let (alice, bob) = (1, 2);
    let conv = p.app.user(alice).create_group(&[bob]).await;
    let secret = format!("the secret {}", Uuid::new_v4());
    let seq = p.app.user(alice).send_message(conv, &secret).await;
    p.app
        .user(alice)
        .patch(
            &format!("/v1/conversations/{conv}/messages/{seq}"),
            json!({"body": format!("{secret}, edited")}),
        )
        .await
        .expect(200);
    p.app
        .user(alice)
        .delete(&format!("/v1/conversations/{conv}/messages/{seq}"))
        .await
        .expect(204);

    // Every row written, the delete's included: the processor read chat.events to its end.
    p.consume_until(DEADLINE, |rs| {
        rs.iter()
            .any(|r| matches!(r.event, ChatEvent::MessageDeleted(_)))
    })
    .await;
    wait_until_consumed(&settings.analytics.group, &p.topic, DEADLINE).await;
    let consumer: chatpipe_core::kafka::BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", format!("{}-raw", p.ns))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create_guarded()
        .unwrap();
    let started = Instant::now();
    let mut filler = 0;
    loop {
        // Later rows roll the segment that holds the body, so the cleaner may take it.
        filler += 1;
        p.app
            .user(bob)
            .send_message(conv, &format!("filler {filler}"))
            .await;
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let records = read_all(&consumer, &topic);
        let holding = records
            .iter()
            .filter(|(_, v)| contains(v, secret.as_bytes()))
            .count();
        let key = format!("{conv}:{seq}");
        let rows_of_message = records.iter().filter(|(k, _)| *k == key).count();
        if holding == 0 {
            assert!(rows_of_message >= 1, "the deleted message's row stays");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{holding} records of {topic} still hold the deleted body after 120 s \
             ({rows_of_message} rows of the message)"
        );
    }
    analytics.stop().unwrap();
    p.cleanup().await;
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Every record of `topic` now, (key, value), read from the start of each partition.
fn read_all(consumer: &chatpipe_core::kafka::BaseConsumer, topic: &str) -> Vec<(String, Vec<u8>)> {
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    let mut assignment = rdkafka::TopicPartitionList::new();
    let mut ends = HashMap::new();
    for partition in metadata.topics()[0].partitions() {
        let (low, high) = consumer
            .fetch_watermarks(topic, partition.id(), Duration::from_secs(10))
            .unwrap();
        if high > low {
            ends.insert(partition.id(), high);
            assignment
                .add_partition_offset(topic, partition.id(), rdkafka::Offset::Beginning)
                .unwrap();
        }
    }
    consumer.assign(&assignment).unwrap();
    let mut records = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ends.is_empty() {
        assert!(
            Instant::now() < deadline,
            "reading {topic} back: {ends:?} left"
        );
        let Some(message) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let message = message.unwrap();
        let key = String::from_utf8_lossy(message.key().unwrap_or_default()).into_owned();
        records.push((key, message.payload().unwrap_or_default().to_vec()));
        if ends.get(&message.partition()) == Some(&(message.offset() + 1)) {
            ends.remove(&message.partition());
        }
    }
    records
}

/// Spark's `percentile`: linear between the ranks of the sorted values.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    let at = q * (sorted.len() - 1) as f64;
    let (low, high) = (at.floor() as usize, at.ceil() as usize);
    sorted[low] + (at - low as f64) * (sorted[high] - sorted[low])
}

/// docs/examples/spark/analytics_job.py (PySpark, Spark's Kafka source and spark-avro,
/// Structured Streaming run to what is there) on a scripted mix: its messages per
/// conversation per hour and its read-latency percentiles equal what the events on
/// chat.events say, and its messages table kept no deleted body.
#[tokio::test]
async fn the_spark_job_computes_messages_per_hour_and_read_latency_exactly() {
    let p = spawn_pipeline().await;
    let settings = p.analytics_settings().await;
    let analytics = p.start_analytics(settings.clone());
    let (alice, bob, carol) = (1, 2, 3);
    let group = p.app.user(alice).create_group(&[bob, carol]).await;
    let quiet = p.app.user(bob).create_group(&[alice]).await;
    let mut seqs = Vec::new();
    for i in 0..3 {
        seqs.push(
            p.app
                .user(alice)
                .send_message(group, &format!("m{i}"))
                .await,
        );
    }
    p.app.user(bob).mark_read(group, seqs[1]).await;
    p.app.user(carol).mark_read(group, seqs[2]).await;
    let reply = p.app.user(bob).send_message(group, "bob's").await;
    p.app.user(alice).mark_read(group, reply).await;
    p.app.user(bob).mark_read(group, reply).await;
    let gone = p.app.user(bob).send_message(quiet, "a secret").await;
    p.app
        .user(bob)
        .delete(&format!("/v1/conversations/{quiet}/messages/{gone}"))
        .await
        .expect(204);
    p.app.user(bob).send_message(quiet, "unread").await;
    // Last in each conversation's partition: everything before it is on chat.events then.
    p.app.user(carol).send_message(group, "the end").await;

    let records = p
        .consume_until(DEADLINE, |rs| {
            ["unread", "the end"].iter().all(|body| {
                rs.iter()
                    .any(|r| matches!(&r.event, ChatEvent::MessageNew(m) if m.body == *body))
            })
        })
        .await;
    wait_until_consumed(&settings.analytics.group, &p.topic, DEADLINE).await;

    // What the events say: messages per conversation per hour, and for each message and
    // member other than its sender, the seconds to the first read move covering it.
    let hour = 3_600_000_000_i64;
    let mut per_hour: BTreeMap<(i64, i64), i64> = BTreeMap::new();
    let mut sent = Vec::new();
    let mut reads = Vec::new();
    for r in &records {
        match &r.event {
            ChatEvent::MessageNew(m) => {
                let at = m.created_at.timestamp_micros();
                *per_hour
                    .entry((m.conversation_id.get(), at - at.rem_euclid(hour)))
                    .or_default() += 1;
                sent.push((m.conversation_id.get(), m.seq.get(), m.sender_id.get(), at));
            }
            ChatEvent::ReadUpdated(u) => reads.push((
                u.conversation_id.get(),
                u.user_id.get(),
                u.last_read_seq.get(),
                u.occurred_at.timestamp_micros(),
            )),
            _ => {}
        }
    }
    let mut latencies: BTreeMap<i64, Vec<f64>> = BTreeMap::new();
    for &(conv, seq, sender, created) in &sent {
        let mut first: BTreeMap<i64, i64> = BTreeMap::new();
        for &(c, user, to, at) in &reads {
            if c == conv && to >= seq && user != sender {
                let e = first.entry(user).or_insert(at);
                *e = (*e).min(at);
            }
        }
        for at in first.values() {
            latencies
                .entry(conv)
                .or_default()
                .push((at - created) as f64 / 1e6);
        }
    }
    // m0 and m1 read by bob and carol, m2 by carol (bob passed it by sending, which writes
    // no read.updated), bob's by alice.
    assert_eq!(latencies[&group].len(), 2 + 2 + 1 + 1, "the script's reads");

    let lake = std::env::temp_dir().join(format!("{}-lake", p.ns));
    let a = &settings.analytics;
    let started = Instant::now();
    let lines = run_example(
        "the Spark job",
        &python(),
        &[
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../docs/examples/spark/analytics_job.py"
            ),
            "--messages-topic",
            &a.messages_topic,
            "--reads-topic",
            &a.reads_topic,
            "--lake",
            lake.to_str().unwrap(),
            "--print-messages",
        ],
    )
    .await;
    eprintln!("the Spark job ran {:.1} s", started.elapsed().as_secs_f64());
    let _ = std::fs::remove_dir_all(&lake);
    let result = |kind: &'static str| lines.iter().filter(move |l| l["result"] == kind);

    let got: BTreeMap<(i64, i64), i64> = result("messages_per_hour")
        .map(|l| {
            (
                (
                    l["conversationId"].as_i64().unwrap(),
                    l["hour"].as_i64().unwrap(),
                ),
                l["messages"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(got, per_hour, "messages per conversation per hour");

    let got: Vec<&Value> = result("read_latency").collect();
    assert_eq!(got.len(), latencies.len(), "{got:?}");
    for l in got {
        let conv = l["conversationId"].as_i64().unwrap();
        let mut want = latencies[&conv].clone();
        want.sort_by(f64::total_cmp);
        assert_eq!(l["reads"].as_u64().unwrap() as usize, want.len());
        for (field, q) in [("p50", 0.5), ("p99", 0.99)] {
            let (got, want) = (l[field].as_f64().unwrap(), percentile(&want, q));
            assert!(
                (got - want).abs() < 1e-6,
                "conversation {conv} {field}: {got}, want {want}"
            );
        }
    }

    // The lake's messages table: the delete applied, its body nowhere.
    let deleted: Vec<&Value> = result("message").filter(|l| l["deleted"] == true).collect();
    assert_eq!(
        deleted,
        [
            &json!({"result": "message", "conversationId": quiet, "seq": gone, "body": null, "deleted": true})
        ]
    );
    assert_eq!(result("message").count(), 7);
    analytics.stop().unwrap();
    p.cleanup().await;
}

/// Two analytics members in one group, through two rebalances (the second joins, then
/// the first leaves): every row chat.events implies is on the topics (at least once, as
/// documented; `fromSeq` may be null after a partition moved, so it is left out here).
#[tokio::test]
async fn two_analytics_members_share_chat_events_and_lose_no_row_through_rebalances() {
    let p = spawn_pipeline().await;
    let settings = p.analytics_settings().await;
    let first = p.start_analytics(settings.clone());
    let (alice, bob) = (1, 2);
    let mut conversations = Vec::new();
    for _ in 0..6 {
        conversations.push(p.app.user(alice).create_group(&[bob]).await);
    }
    let round = |tag: &'static str| {
        let (p, conversations) = (&p, &conversations);
        async move {
            for &c in conversations {
                let seq = p.app.user(alice).send_message(c, tag).await;
                p.app.user(bob).mark_read(c, seq).await;
            }
        }
    };
    round("one member").await;
    let second = p.start_analytics(settings.clone());
    let holds = |r: &ReceiptsProcessor| {
        r.readiness
            .report()
            .iter()
            .any(|r| r.reader == "analytics" && !r.partitions.is_empty())
    };
    let deadline = Instant::now() + DEADLINE;
    while !(holds(&first) && holds(&second)) {
        assert!(
            Instant::now() < deadline,
            "the two members never shared the partitions"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    round("two members").await;
    first.stop().unwrap();
    round("the second alone").await;

    let records = p
        .consume_until(DEADLINE, |rs| {
            let count = |f: fn(&ChatEvent) -> bool| rs.iter().filter(|r| f(&r.event)).count();
            // Three rounds of six conversations: a message and bob's read of it each.
            count(|e| matches!(e, ChatEvent::MessageNew(_))) == 18
                && count(|e| matches!(e, ChatEvent::ReadUpdated(_))) == 18
        })
        .await;
    wait_until_consumed(&settings.analytics.group, &p.topic, DEADLINE).await;
    let events: Vec<ChatEvent> = records.into_iter().map(|r| r.event).collect();
    let without_from = |mut row: Value| {
        if let Some(v) = row["value"].as_object_mut() {
            v.remove("fromSeq");
        }
        row.to_string()
    };
    let want = implied(&p, &events).await;
    let got = read_back(&p, &settings).await;
    for topic in ["messages", "reads", "membership"] {
        let set = |rows: Option<&Vec<Value>>| -> std::collections::BTreeSet<String> {
            rows.into_iter()
                .flatten()
                .cloned()
                .map(without_from)
                .collect()
        };
        let (want, got) = (set(want.get(topic)), set(got.get(topic)));
        assert!(!want.is_empty());
        assert_eq!(got, want, "chat.analytics.{topic}: every row, none other");
    }
    second.stop().unwrap();
    p.cleanup().await;
}
