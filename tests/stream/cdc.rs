use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chatpipe_schemas::ChatEvent;
use chatpipe_tests::stream::{run_example, spawn_pipeline, Record};
use futures::future::join_all;
use serde_json::json;
use sqlx::Connection;
use uuid::Uuid;

fn message_seqs(records: &[Record]) -> BTreeMap<i64, Vec<i64>> {
    let mut seqs: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for r in records {
        if let ChatEvent::MessageNew(m) = &r.event {
            seqs.entry(m.conversation_id.get())
                .or_default()
                .push(m.seq.get());
        }
    }
    seqs
}

#[tokio::test]
async fn a_message_sent_through_the_api_arrives_on_chat_events_decoded_and_keyed() {
    let p = spawn_pipeline().await;
    let alice = p.app.user(10);
    let conv = alice.create_group(&[20]).await;
    let seq = alice.send_message(conv, "über Kafka").await;

    let records = p
        .consume_until(Duration::from_secs(30), |rs| {
            rs.iter()
                .any(|r| matches!(r.event, ChatEvent::MessageNew(_)))
        })
        .await;
    every_outbox_row_is_on_the_topic(&p, &records).await;
    let r = records
        .iter()
        .find(|r| matches!(r.event, ChatEvent::MessageNew(_)))
        .unwrap();
    assert_eq!(r.key, conv.to_string(), "key = conversation id");
    assert_eq!(
        r.headers.get("eventType").map(String::as_str),
        Some("message.new")
    );
    assert!(
        r.headers.contains_key("id"),
        "the outbox row id travels as a header"
    );
    let version = p.app.membership_version(conv).await;
    assert_eq!(
        r.headers.get("membershipVersion"),
        Some(&version.to_string()),
        "the conversation's membership version travels as a header"
    );
    assert_eq!(r.bytes[0], 0, "Confluent framing");
    let ChatEvent::MessageNew(m) = &r.event else {
        unreachable!()
    };
    assert_eq!(
        (
            m.conversation_id.get(),
            m.seq.get(),
            m.sender_id.get(),
            m.body.as_str()
        ),
        (conv, seq, 10, "über Kafka")
    );
    // The conversation's earlier events came first, on the same partition.
    let types: Vec<&str> = records.iter().map(|r| r.event.event_type()).collect();
    assert_eq!(
        types,
        [
            "conversation.created",
            "member.joined",
            "member.joined",
            "message.new"
        ]
    );
    assert!(records.iter().all(|x| x.partition == r.partition));

    // Cleanup leaves no replication slot (it would hold WAL forever), connector or topic.
    let (slot, connector, topic) = (p.slot.clone(), p.connector.clone(), p.topic.clone());
    p.cleanup().await;
    let mut admin = sqlx::PgConnection::connect(&chatpipe_tests::server_url())
        .await
        .unwrap();
    let slots: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1")
            .bind(&slot)
            .fetch_one(&mut admin)
            .await
            .unwrap();
    assert_eq!(slots, 0, "slot {slot} dropped");
    let status = chatpipe_tests::stream::connector_status(&connector).await;
    assert_eq!(
        status["error_code"], 404,
        "connector {connector} deleted: {status}"
    );
    assert!(
        !chatpipe_tests::stream::topic_exists(&topic).await,
        "topic {topic} deleted"
    );
}

/// Every outbox row is kept (no auditor confirms them here: `outbox.retain_until_confirmed`)
/// and is on the topic: the row's id is its record's `id` header.
async fn every_outbox_row_is_on_the_topic(
    p: &chatpipe_tests::stream::Pipeline,
    records: &[Record],
) {
    let rows: BTreeSet<String> = sqlx::query_scalar("SELECT id::text FROM outbox")
        .fetch_all(&p.app.pool)
        .await
        .expect("reading the outbox")
        .into_iter()
        .collect();
    let on_topic: BTreeSet<String> = records
        .iter()
        .filter_map(|r| r.headers.get("id").cloned())
        .collect();
    assert!(!rows.is_empty(), "rows are kept until they are confirmed");
    assert_eq!(
        rows, on_topic,
        "the outbox's rows and the topic's id headers"
    );
}

#[tokio::test]
async fn two_thousand_messages_over_twenty_conversations_all_arrive_in_seq_order() {
    let p = spawn_pipeline().await;
    let mut conversations = Vec::new();
    for i in 0..20 {
        conversations.push(p.app.user(100 + i).create_group(&[1]).await);
    }
    // Twenty senders at once, each a hundred messages into its conversation.
    join_all(conversations.iter().enumerate().map(|(i, &conv)| {
        let client = p.app.user(100 + i as i64);
        async move {
            for n in 0..100 {
                client.send_message(conv, &format!("m{n}")).await;
            }
        }
    }))
    .await;

    let expected: BTreeSet<(i64, i64)> = conversations
        .iter()
        .flat_map(|&c| (1..=100).map(move |s| (c, s)))
        .collect();
    let records = p
        .consume_until(Duration::from_secs(120), |rs| {
            let seen: BTreeSet<(i64, i64)> = rs
                .iter()
                .filter_map(|r| match &r.event {
                    ChatEvent::MessageNew(m) => Some((m.conversation_id.get(), m.seq.get())),
                    _ => None,
                })
                .collect();
            seen.is_superset(&expected)
        })
        .await;

    for (conv, seqs) in message_seqs(&records) {
        // Dedupe by (conversationId, seq) as a consumer would; what remains is 1..=100 in order.
        let mut first_seen = Vec::new();
        for s in seqs {
            if !first_seen.contains(&s) {
                first_seen.push(s);
            }
        }
        assert_eq!(
            first_seen,
            (1..=100).collect::<Vec<_>>(),
            "conversation {conv} out of order"
        );
    }
    let mut partition_of: BTreeMap<&str, i32> = BTreeMap::new();
    for r in &records {
        assert_eq!(
            *partition_of.entry(&r.key).or_insert(r.partition),
            r.partition,
            "one partition per key"
        );
    }
    every_outbox_row_is_on_the_topic(&p, &records).await;
    p.cleanup().await;
}

/// Sends at once into one conversation through two ingest-api processes: each batches
/// its own (group commit), and the conversation's row lock orders the two. On chat.events
/// the conversation's messages are seqs 1..=200, in order, on one partition, each with the
/// body its sender was answered that seq for.
#[tokio::test]
async fn two_hundred_sends_at_once_through_two_ingest_apis_reach_chat_events_in_seq_order() {
    let p = spawn_pipeline().await;
    let second = p.app_beside().await;
    let conv = p.app.user(10).create_group(&[20]).await;
    let path = format!("/v1/conversations/{conv}/messages");
    let (apps, path) = ([&p.app, &second], &path);
    let answers = join_all((0..200usize).map(|i| async move {
        // Even sends through the first process as user 10, odd through the second as 20.
        let body = format!("m{i}");
        let res = apps[i % 2]
            .user(10 + 10 * (i % 2) as i64)
            .post(path, json!({"clientMsgId": Uuid::new_v4(), "body": body}))
            .await;
        (res.expect(201)["seq"].as_i64().unwrap(), body)
    }))
    .await;
    let answered: BTreeMap<i64, String> = answers.into_iter().collect();
    assert_eq!(
        answered.keys().copied().collect::<Vec<_>>(),
        (1..=200).collect::<Vec<_>>(),
        "200 answers, seqs 1..=200, none twice"
    );

    let of_conv = |records: &[Record]| -> Vec<(i32, i64, String)> {
        records
            .iter()
            .filter_map(|r| match &r.event {
                ChatEvent::MessageNew(m) if m.conversation_id.get() == conv => {
                    Some((r.partition, m.seq.get(), m.body.clone()))
                }
                _ => None,
            })
            .collect()
    };
    let records = p
        .consume_until(Duration::from_secs(120), |rs| of_conv(rs).len() >= 200)
        .await;
    let on_topic = of_conv(&records);
    let partitions: BTreeSet<i32> = on_topic.iter().map(|(p, _, _)| *p).collect();
    assert_eq!(partitions.len(), 1, "one partition: {partitions:?}");
    let in_order: Vec<(i64, String)> = on_topic.into_iter().map(|(_, s, b)| (s, b)).collect();
    assert_eq!(
        in_order,
        answered.into_iter().collect::<Vec<_>>(),
        "chat.events in seq order, each body as answered"
    );
    p.cleanup().await;
}

#[tokio::test]
async fn read_advances_reach_the_topic_and_non_advances_do_not() {
    let p = spawn_pipeline().await;
    let conv = p.app.user(10).create_group(&[20]).await;
    for _ in 0..3 {
        p.app.user(10).send_message(conv, "x").await;
    }
    let bob = p.app.user(20);
    bob.mark_read(conv, 2).await;
    bob.mark_read(conv, 1).await; // no advance, no event
    bob.mark_read(conv, 3).await;

    let reads = |rs: &[Record]| -> Vec<i64> {
        rs.iter()
            .filter_map(|r| match &r.event {
                ChatEvent::ReadUpdated(e) if e.user_id.get() == 20 => Some(e.last_read_seq.get()),
                _ => None,
            })
            .collect()
    };
    let records = p
        .consume_until(Duration::from_secs(30), |rs| reads(rs).contains(&3))
        .await;
    assert_eq!(reads(&records), vec![2, 3]);
    p.cleanup().await;
}

#[tokio::test]
async fn pipeline_tail_prints_decoded_events_of_one_conversation_as_json_lines() {
    let p = spawn_pipeline().await;
    let conv = p.app.user(10).create_group(&[20]).await;
    let other = p.app.user(30).create_group(&[40]).await;
    p.app.user(10).send_message(conv, "first").await;
    p.app.user(30).send_message(other, "not this one").await;
    p.app.user(10).send_message(conv, "second").await;

    let settings = pipeline::settings::Settings::load(None).unwrap();
    let args = pipeline::tail::TailArgs {
        topic: p.topic.clone(),
        from_beginning: true,
        key: Some(conv.to_string()),
        max: Some(5),
        idle_timeout: Some(30),
    };
    let mut out = Vec::new();
    pipeline::tail::run(&settings, args, &mut out)
        .await
        .unwrap();
    let lines: Vec<serde_json::Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();

    let types: Vec<&str> = lines
        .iter()
        .map(|l| l["value"]["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        [
            "conversation.created",
            "member.joined",
            "member.joined",
            "message.new",
            "message.new"
        ]
    );
    assert!(
        lines
            .iter()
            .all(|l| l["key"].as_str() == Some(conv.to_string().as_str())),
        "only the asked-for conversation"
    );
    assert_eq!(lines[3]["value"]["body"], "first");
    assert_eq!(lines[4]["value"]["seq"], 2);
    assert_eq!(lines[4]["headers"]["eventType"], "message.new");
    p.cleanup().await;
}

/// docs/examples/consume_chat_events.py: Confluent's own Avro deserializer (Python,
/// confluent-kafka) reads our records with nothing but the registry URL, and its copy
/// of the messages applies an edit and drops a deleted message's body.
#[tokio::test]
async fn a_standard_confluent_deserializer_in_python_reads_chat_events() {
    let python = std::env::var("CHATPIPE_PYTHON").unwrap_or_else(|_| {
        panic!("CHATPIPE_PYTHON is not set: run the suite with scripts/test, which installs confluent-kafka")
    });
    let p = spawn_pipeline().await;
    let (conv, secret) =
        a_group_with_an_edit_and_a_delete(&p, "hallo python", "my pin is 1234").await;

    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/examples/consume_chat_events.py"
    );
    // The script stops after 7 records or 30 idle seconds.
    let lines = run_example(
        "the Python consumer",
        &python,
        &[
            script,
            "--topic",
            &p.topic,
            "--from-beginning",
            "--max",
            "7",
            "--idle-timeout",
            "30",
            "--print-messages",
        ],
    )
    .await;
    let types: Vec<&str> = lines
        .iter()
        .filter_map(|l| l["event"]["type"].as_str())
        .collect();
    assert_eq!(
        types,
        [
            "conversation.created",
            "member.joined",
            "member.joined",
            "message.new",
            "message.new",
            "message.edited",
            "message.deleted"
        ]
    );
    let message = &lines[3]["event"];
    assert_eq!(message["conversationId"], conv);
    assert_eq!(message["payload"]["seq"], 1);
    assert_eq!(message["payload"]["body"], "hallo python");
    assert_eq!(lines[3]["key"], conv.to_string());
    assert!(lines[6]["event"]["payload"].get("body").is_none());
    // Its copy: the edit applied, the deleted body gone.
    let copy: Vec<&serde_json::Value> = lines.iter().filter_map(|l| l.get("message")).collect();
    assert_eq!(
        copy,
        [
            &serde_json::json!({"conversationId": conv, "seq": 1, "body": "hallo, python"}),
            &serde_json::json!({"conversationId": conv, "seq": secret, "deleted": true}),
        ]
    );
    p.cleanup().await;
}

/// Invariant 2's other half: a send whose transaction rolls back writes no event. Here
/// the rollback comes at COMMIT, after the send statement wrote the message, its seq and
/// its outbox row (a deferred check refuses the body "doomed"): PostgreSQL counts the
/// send statement, the caller gets 503, yet nothing reaches chat.events, and the next
/// send takes the same seq.
#[tokio::test]
async fn a_send_rolled_back_at_commit_leaves_no_event_and_no_gap() {
    let p = spawn_pipeline().await;
    let conv = p.app.user(1).create_group(&[2]).await;
    for ddl in [
        "CREATE FUNCTION refuse_doomed() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN RAISE EXCEPTION 'refused at commit'; END $$",
        "CREATE CONSTRAINT TRIGGER refuse_doomed AFTER INSERT ON message
           DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
           WHEN (NEW.body = 'doomed') EXECUTE FUNCTION refuse_doomed()",
    ] {
        sqlx::query(ddl).execute(&p.app.pool).await.unwrap();
    }
    let send_statement = "FROM chat_send_many(";
    let sends_before = p.app.statement_calls(send_statement).await;
    let problem = p
        .app
        .user(1)
        .post(
            &format!("/v1/conversations/{conv}/messages"),
            serde_json::json!({"clientMsgId": uuid::Uuid::new_v4(), "body": "doomed"}),
        )
        .await
        .problem(503);
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("was not written"),
        "{problem}"
    );
    assert_eq!(
        p.app.statement_calls(send_statement).await - sends_before,
        1,
        "the message and its event were written before the COMMIT failed"
    );
    assert_eq!(p.app.count("SELECT count(*) FROM message").await, 0);
    assert_eq!(p.app.count("SELECT last_seq FROM conversation").await, 0);

    let seq = p.app.user(1).send_message(conv, "after").await;
    assert_eq!(seq, 1, "the rolled-back seq is taken again: no gap");
    let records = p
        .consume_until(Duration::from_secs(30), |rs| {
            message_seqs(rs).get(&conv).is_some_and(|s| s.contains(&1))
        })
        .await;
    let bodies: Vec<String> = records
        .iter()
        .filter_map(|r| match &r.event {
            ChatEvent::MessageNew(m) if m.conversation_id.get() == conv => Some(m.body.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(bodies, vec!["after"], "no event of the rolled-back send");
    p.cleanup().await;
}

#[tokio::test]
async fn an_edit_and_a_delete_reach_chat_events_after_their_message() {
    let p = spawn_pipeline().await;
    let conv = p.app.user(10).create_group(&[20]).await;
    let seq = p.app.user(10).send_message(conv, "first draft").await;
    p.app
        .user(10)
        .patch(
            &format!("/v1/conversations/{conv}/messages/{seq}"),
            serde_json::json!({"body": "final"}),
        )
        .await
        .expect(200);
    let deleted = p
        .app
        .user(10)
        .delete(&format!("/v1/conversations/{conv}/messages/{seq}"))
        .await;
    assert_eq!(deleted.status, 204);
    let key = conv.to_string();
    let records = p
        .consume_until(Duration::from_secs(60), |rs| {
            rs.iter()
                .any(|r| r.key == key && matches!(r.event, ChatEvent::MessageDeleted(_)))
        })
        .await;
    let mine: Vec<&ChatEvent> = records
        .iter()
        .filter(|r| r.key == key)
        .map(|r| &r.event)
        .collect();
    let new_at = mine
        .iter()
        .position(|e| matches!(e, ChatEvent::MessageNew(m) if m.seq.get() == seq))
        .expect("message.new");
    let edit_at = mine
        .iter()
        .position(|e| matches!(e, ChatEvent::MessageEdited(_)))
        .unwrap();
    assert!(new_at < edit_at, "the edit follows its message");
    match mine[edit_at] {
        ChatEvent::MessageEdited(e) => {
            assert_eq!((e.seq.get(), e.sender_id.get()), (seq, 10));
            assert_eq!(e.body, "final");
        }
        _ => unreachable!(),
    }
    let header = records
        .iter()
        .find(|r| r.key == key && matches!(r.event, ChatEvent::MessageEdited(_)))
        .and_then(|r| r.headers.get("eventType"))
        .cloned();
    assert_eq!(header.as_deref(), Some("message.edited"));
    // The delete after the edit, naming who deleted it and carrying no body.
    let delete_at = mine
        .iter()
        .position(|e| matches!(e, ChatEvent::MessageDeleted(_)))
        .unwrap();
    assert!(edit_at < delete_at, "the delete follows the edit");
    match mine[delete_at] {
        ChatEvent::MessageDeleted(d) => {
            assert_eq!(
                (d.seq.get(), d.sender_id.get(), d.deleted_by.get()),
                (seq, 10, 10)
            );
        }
        _ => unreachable!(),
    }
    p.cleanup().await;
}

/// docs/examples/jvm: a JVM consumer reading with a reader schema compiled into it, the
/// oldest published one (schemas/history/chat_event/v1.avsc, from before edits and
/// deletes). It reads every event type it knows, written with today's schema, and skips
/// message.edited and message.deleted, one line each, without stopping (docs/topics.md,
/// "Changing a schema").
#[tokio::test]
async fn a_jvm_consumer_with_the_oldest_compiled_schema_reads_what_it_knows_and_skips_new_types() {
    let jar = std::env::var("CHATPIPE_JVM_EXAMPLE_JAR").unwrap_or_else(|_| {
        panic!("CHATPIPE_JVM_EXAMPLE_JAR is not set: run the suite with scripts/test, which builds docs/examples/jvm with Maven")
    });
    let p = spawn_pipeline().await;
    let (conv, _) = a_group_with_an_edit_and_a_delete(&p, "hallo jvm", "second").await;

    let v1 = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../schemas/history/chat_event/v1.avsc"
    );
    let lines = run_example(
        "the JVM consumer",
        "java",
        &[
            "-jar",
            &jar,
            "--topic",
            &p.topic,
            "--from-beginning",
            "--max",
            "7",
            "--idle-timeout",
            "30",
            "--reader-schema",
            v1,
        ],
    )
    .await;
    let read: Vec<&str> = lines
        .iter()
        .filter_map(|l| l["event"]["type"].as_str())
        .collect();
    assert_eq!(
        read,
        [
            "conversation.created",
            "member.joined",
            "member.joined",
            "message.new",
            "message.new"
        ]
    );
    let first = lines
        .iter()
        .find(|l| l["event"]["type"] == "message.new")
        .unwrap();
    assert_eq!(first["event"]["payload"]["body"], "hallo jvm");
    assert_eq!(first["key"], conv.to_string());
    let skipped: Vec<&str> = lines
        .iter()
        .filter_map(|l| l["skipped"]["reason"].as_str())
        .collect();
    assert_eq!(skipped.len(), 2, "{lines:#?}");
    assert!(skipped[0].contains("MessageEdited"), "{skipped:?}");
    assert!(skipped[1].contains("MessageDeleted"), "{skipped:?}");
    p.cleanup().await;
}

/// A group of users 10 and 20 where 10 sends `first` and `second`, edits the first to
/// `first` with a comma after its first word, and deletes the second; returns once the
/// delete is on the topic, with the conversation and the deleted seq. Seven events:
/// created, two joins, two messages, the edit, the delete.
async fn a_group_with_an_edit_and_a_delete(
    p: &chatpipe_tests::stream::Pipeline,
    first: &str,
    second: &str,
) -> (i64, i64) {
    let conv = p.app.user(10).create_group(&[20]).await;
    p.app.user(10).send_message(conv, first).await;
    let deleted_seq = p.app.user(10).send_message(conv, second).await;
    let message = format!("/v1/conversations/{conv}/messages");
    let edited = first.replacen(' ', ", ", 1);
    p.app
        .user(10)
        .patch(&format!("{message}/1"), serde_json::json!({"body": edited}))
        .await
        .expect(200);
    let deleted = p
        .app
        .user(10)
        .delete(&format!("{message}/{deleted_seq}"))
        .await;
    assert_eq!(deleted.status, 204);
    p.consume_until(Duration::from_secs(30), |rs| {
        rs.iter()
            .any(|r| matches!(r.event, ChatEvent::MessageDeleted(_)))
    })
    .await;
    (conv, deleted_seq)
}
