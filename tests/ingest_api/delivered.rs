//! Delivered ticks, direct mode: the delivery watermark moves forwards only, never past
//! the last seq, never below the read watermark, and "delivered to N" counts it.

use chatpipe_core::{ConversationId, Seq, UserId};
use chatpipe_schemas::ChatEvent;
use chatpipe_tests::{spawn_app, TestApp};
use serde_json::json;

async fn delivered(app: &TestApp, conv: i64, user: i64) -> (i64, i64) {
    app.watermarks(conv, user).await
}

#[tokio::test]
async fn delivery_moves_forward_is_clamped_and_never_falls_below_read() {
    let app = spawn_app().await;
    let (alice, bob, carol, stranger) = (10, 20, 30, 99);
    let conv = app.user(alice).create_group(&[bob, carol]).await;
    for i in 1..=5 {
        app.user(alice).send_message(conv, &format!("m{i}")).await;
    }
    let path = format!("/v1/conversations/{conv}/delivered");
    let ack = |user: i64, seq: i64| {
        let (app, path) = (&app, &path);
        async move { app.user(user).post(path, json!({"seq": seq})).await }
    };
    let r = ack(bob, 3).await.expect(200);
    assert_eq!(r, json!({"lastDeliveredSeq": 3, "advanced": true}));
    let r = ack(bob, 2).await.expect(200);
    assert_eq!(r, json!({"lastDeliveredSeq": 3, "advanced": false}));
    assert_eq!(delivered(&app, conv, bob).await, (0, 3));

    // Reading implies delivery: a read past it moves it; an ack below the read does not.
    app.user(bob).mark_read(conv, 4).await;
    assert_eq!(delivered(&app, conv, bob).await, (4, 4));
    let r = ack(bob, 4).await.expect(200);
    assert_eq!(r["advanced"], false);
    // Clamped to the last seq.
    let r = ack(bob, 99).await.expect(200);
    assert_eq!(r, json!({"lastDeliveredSeq": 5, "advanced": true}));
    // The database refuses a delivery watermark below the read one, whoever writes it.
    let refused = sqlx::query(
        "UPDATE conversation_member SET last_delivered_seq = 1
          WHERE conversation_id = $1 AND user_id = $2",
    )
    .bind(conv)
    .bind(bob)
    .execute(&app.pool)
    .await;
    assert!(refused.is_err(), "delivered below read was stored");

    // A stranger, a bad seq: refused, nothing moved.
    ack(stranger, 3).await.problem(404);
    ack(bob, 0).await.problem(422);
    app.user(bob)
        .post(&path, json!({"seq": "3"}))
        .await
        .problem(422);

    // "Delivered to N" and "read by N", the sender not counted.
    let receipts = |seq: i64| {
        let app = &app;
        async move {
            app.user(alice)
                .get(&format!("/v1/conversations/{conv}/messages/{seq}/receipts"))
                .await
                .expect(200)
        }
    };
    let r = receipts(5).await;
    assert_eq!(
        (r["readBy"].clone(), r["deliveredTo"].clone()),
        (json!(0), json!(1))
    );
    ack(carol, 5).await.expect(200);
    let r = receipts(5).await;
    assert_eq!(r["deliveredTo"], 2);
    let r = receipts(4).await;
    assert_eq!(
        (r["readBy"].clone(), r["deliveredTo"].clone()),
        (json!(1), json!(2))
    );

    // One delivery.updated per move: bob 3, bob 5, carol 5.
    let moves: Vec<(i64, i64)> = app
        .outbox_events()
        .await
        .into_iter()
        .filter_map(|e| match e {
            ChatEvent::DeliveryUpdated(d) => Some((d.user_id.get(), d.last_delivered_seq.get())),
            _ => None,
        })
        .collect();
    assert_eq!(moves, vec![(bob, 3), (bob, 5), (carol, 5)]);
}

#[tokio::test]
async fn a_direct_conversation_says_delivered_and_a_joiner_starts_delivered() {
    let app = spawn_app().await;
    let conv = app.user(10).open_direct(20).await;
    let seq = app.user(10).send_message(conv, "hi").await;
    let path = format!("/v1/conversations/{conv}/messages/{seq}/receipts");
    let r = app.user(10).get(&path).await.expect(200);
    assert_eq!(
        (r["read"].clone(), r["delivered"].clone()),
        (json!(false), json!(false))
    );
    app.user(20)
        .post(
            &format!("/v1/conversations/{conv}/delivered"),
            json!({"seq": seq}),
        )
        .await
        .expect(200);
    let r = app.user(10).get(&path).await.expect(200);
    assert_eq!(
        (r["read"].clone(), r["delivered"].clone()),
        (json!(false), json!(true))
    );

    // Someone added to a group starts with everything delivered (and read).
    let group = app.user(10).create_group(&[20]).await;
    app.user(10).send_message(group, "before").await;
    app.user(10)
        .post(
            &format!("/v1/conversations/{group}/members"),
            json!({"userIds": [30]}),
        )
        .await
        .expect(200);
    assert_eq!(delivered(&app, group, 30).await, (1, 1));
}

/// The flush's statement (the receipts processor's, for a window of acks) drops acks of
/// non-members and says how many.
#[tokio::test]
async fn a_batch_of_acks_drops_and_counts_those_of_non_members() {
    let app = spawn_app().await;
    let conv = app.user(10).create_group(&[20]).await;
    app.user(10).send_message(conv, "x").await;
    let mut tx = app.pool.begin().await.unwrap();
    let c = ConversationId::of(conv);
    let done = chatpipe_core::watermark::deliver(
        &mut tx,
        &[
            ((c, UserId::of(20)), Seq::of(1)),
            ((c, UserId::of(99)), Seq::of(1)),
        ],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(done.from_non_members, 1);
    assert_eq!(done.moved.len(), 1);
    assert_eq!(done.moved[0].user_id, UserId::of(20));
    assert_eq!(
        app.count("SELECT count(*) FROM conversation_member WHERE user_id = 99")
            .await,
        0
    );
}
