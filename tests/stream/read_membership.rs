//! Stream-mode reads and delivery acks make no database round trip: the API answers 202
//! to anyone and the receipts processor's flush decides. So membership is checked there,
//! against PostgreSQL's rows at flush time. Witnesses: PostgreSQL's rows and
//! `pg_stat_statements`, the events on chat.events, the receipts groups' committed
//! offsets.

use std::time::Duration;

use chatpipe_schemas::ChatEvent;
use chatpipe_tests::stream::{spawn_pipeline_with, wait_until_consumed, Pipeline, Record};
use ingest_api::configuration::ReadMode;
use serde_json::json;

const CONSUMED: Duration = Duration::from_secs(30);

/// A group of 10 (alice), 20 and 30 with `n` messages.
async fn group_with_messages(p: &Pipeline, n: usize) -> i64 {
    let conv = p.app.user(10).create_group(&[20, 30]).await;
    for i in 0..n {
        p.app.user(10).send_message(conv, &format!("m{i}")).await;
    }
    conv
}

/// The read.updated and delivery.updated events of `user` among `records`.
fn marks_of(records: &[Record], user: i64) -> Vec<(&'static str, i64)> {
    records
        .iter()
        .filter_map(|r| match &r.event {
            ChatEvent::ReadUpdated(e) if e.user_id.get() == user => {
                Some(("read", e.last_read_seq.get()))
            }
            ChatEvent::DeliveryUpdated(e) if e.user_id.get() == user => {
                Some(("delivered", e.last_delivered_seq.get()))
            }
            _ => None,
        })
        .collect()
}

/// Statements PostgreSQL ran in the test's database that name a conversation table (the
/// connector's heartbeat and the count itself do not).
async fn statements(p: &Pipeline) -> i64 {
    p.app.statement_calls("conversation").await
}

/// The events of chat.events up to a message alice sends now: once the receipts groups
/// have consumed their topics, every flush has committed, so its events come before it.
async fn events_until_a_marker(p: &Pipeline, conv: i64) -> Vec<Record> {
    let seq = p.app.user(10).send_message(conv, "marker").await;
    p.consume_until(CONSUMED, |rs| {
        rs.iter().any(|r| {
            matches!(&r.event, ChatEvent::MessageNew(m)
            if m.conversation_id.get() == conv && m.seq.get() == seq)
        })
    })
    .await
}

/// A stranger's read and ack, and a member's for a conversation that does not exist, are
/// answered exactly as a member's (a non-member learns nothing, not even that the
/// conversation exists), cost PostgreSQL no statement, and move nothing: no row, no
/// event. The member's read in the same windows lands, so the windows were flushed.
#[tokio::test]
async fn reads_of_a_non_member_or_an_unknown_conversation_answer_as_a_members_and_move_nothing() {
    let p = spawn_pipeline_with(ReadMode::Stream).await;
    let conv = group_with_messages(&p, 5).await;
    let (member, stranger) = (p.app.user(20), p.app.user(99));
    let unknown = conv + 1_000;

    let before = statements(&p).await;
    let mut answers = Vec::new();
    for (who, conversation, route) in [
        (&stranger, conv, "read"),
        (&stranger, conv, "delivered"),
        (&member, unknown, "read"),
        (&member, unknown, "delivered"),
        (&member, conv, "read"),
        (&member, conv, "delivered"),
    ] {
        let answer = who
            .post(
                &format!("/v1/conversations/{conversation}/{route}"),
                json!({"seq": 4}),
            )
            .await
            .expect(202);
        assert_eq!(
            answer,
            json!({"conversationId": conversation, "acceptedSeq": 4}),
            "{route} of conversation {conversation}"
        );
        answers.push(answer);
    }
    assert_eq!(
        statements(&p).await - before,
        0,
        "six stream-mode marks asked PostgreSQL nothing"
    );

    let settings = p.receipts_settings();
    let (reads, acks) = (
        settings.receipts.group.clone(),
        settings.receipts.acks_group.clone(),
    );
    let processor = p.start_receipts(settings);
    wait_until_consumed(&reads, &p.receipts_topic, CONSUMED).await;
    wait_until_consumed(&acks, &p.acks_topic, CONSUMED).await;
    let records = events_until_a_marker(&p, conv).await;
    assert_eq!(p.app.watermark(conv, 20).await, Some(4));
    let member = marks_of(&records, 20);
    assert!(
        member.contains(&("read", 4)) && member.iter().all(|&(_, seq)| seq == 4),
        "the member's read and ack landed: {member:?}"
    );
    assert_eq!(marks_of(&records, 99), vec![], "nothing for the stranger");
    let rows: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM conversation_member WHERE user_id = 99 OR conversation_id = $1",
    )
    .bind(unknown)
    .fetch_one(&p.app.pool)
    .await
    .unwrap();
    assert_eq!(
        rows, 0,
        "no row made for the stranger or the unknown conversation"
    );
    processor.stop().unwrap();
    p.cleanup().await;
}

/// Carol reads while a member; she is removed before the window is flushed (the
/// processor starts only after the removal). Nothing of hers lands after member.left:
/// no row, no read.updated. Bob's read of the same window lands.
#[tokio::test]
async fn a_removed_members_reads_in_the_window_do_not_land_after_member_left() {
    let p = spawn_pipeline_with(ReadMode::Stream).await;
    let conv = group_with_messages(&p, 5).await;
    let (bob, carol) = (20, 30);
    for (user, seq) in [(carol, 3), (bob, 2), (carol, 5)] {
        p.app
            .user(user)
            .post(
                &format!("/v1/conversations/{conv}/read"),
                json!({"seq": seq}),
            )
            .await
            .expect(202);
    }
    p.app
        .user(10)
        .delete(&format!("/v1/conversations/{conv}/members/{carol}"))
        .await
        .expect(204);

    let settings = p.receipts_settings();
    let group = settings.receipts.group.clone();
    let processor = p.start_receipts(settings);
    wait_until_consumed(&group, &p.receipts_topic, CONSUMED).await;
    let records = events_until_a_marker(&p, conv).await;
    assert_eq!(marks_of(&records, bob), vec![("read", 2)]);
    let left = records
        .iter()
        .position(|r| matches!(&r.event, ChatEvent::MemberLeft(l) if l.user_id.get() == carol))
        .expect("member.left on chat.events");
    assert!(
        records[left..]
            .iter()
            .all(|r| marks_of(std::slice::from_ref(r), carol).is_empty()),
        "carol's read landed after member.left"
    );
    assert_eq!(p.app.watermark(conv, carol).await, None, "no row for carol");
    processor.stop().unwrap();
    p.cleanup().await;
}

/// Dave's read before he is added moves nothing; once added (at the last seq, 5), his
/// first read of a later message lands. The flush asks PostgreSQL at flush time, so there
/// is no cached membership to invalidate.
#[tokio::test]
async fn a_member_added_has_their_first_read_land() {
    let p = spawn_pipeline_with(ReadMode::Stream).await;
    let settings = p.receipts_settings();
    let group = settings.receipts.group.clone();
    let processor = p.start_receipts(settings);
    let conv = group_with_messages(&p, 5).await;
    let (alice, dave) = (p.app.user(10), p.app.user(40));
    let read = format!("/v1/conversations/{conv}/read");
    dave.post(&read, json!({"seq": 2})).await.expect(202);
    wait_until_consumed(&group, &p.receipts_topic, CONSUMED).await;
    assert_eq!(p.app.watermark(conv, 40).await, None);

    alice
        .post(
            &format!("/v1/conversations/{conv}/members"),
            json!({"userIds": [40]}),
        )
        .await
        .expect(200);
    assert_eq!(p.app.watermark(conv, 40).await, Some(5));
    for body in ["six", "seven"] {
        alice.send_message(conv, body).await;
    }
    dave.post(&read, json!({"seq": 6})).await.expect(202);
    wait_until_consumed(&group, &p.receipts_topic, CONSUMED).await;
    let records = events_until_a_marker(&p, conv).await;
    assert_eq!(p.app.watermark(conv, 40).await, Some(6));
    assert_eq!(
        marks_of(&records, 40),
        vec![("read", 6)],
        "only the read made as a member moved his watermark"
    );
    processor.stop().unwrap();
    p.cleanup().await;
}
