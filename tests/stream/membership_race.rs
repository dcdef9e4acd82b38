//! A member's sends and member-adds racing their own removal: each one commits before
//! the removal or is refused, never after it. chat.events (commit order per
//! conversation) is where a consumer would see it.

use std::time::Duration;

use chatpipe_schemas::ChatEvent;
use chatpipe_tests::stream::spawn_pipeline;
use chatpipe_tests::until_lock_waiters;
use futures::future::join_all;
use serde_json::json;

#[tokio::test]
async fn sends_and_adds_racing_the_senders_removal_commit_before_member_left_or_are_refused() {
    let p = spawn_pipeline().await;
    let (alice, bob) = (1, 2);
    let conv = p.app.user(alice).create_group(&[bob]).await;
    p.app.user(bob).send_message(conv, "before").await;
    // Bob is an admin too (adding members takes one), whom alice, an admin, removes.
    p.app
        .user(alice)
        .patch(
            &format!("/v1/conversations/{conv}/members/{bob}"),
            json!({"role": "ADMIN"}),
        )
        .await
        .expect(200);

    // The test holds the conversation's row lock, so that the removal and bob's writes
    // all queue for it: the removal first, bob's behind it.
    let mut holder = p.app.pool.acquire().await.unwrap();
    sqlx::query("BEGIN").execute(&mut *holder).await.unwrap();
    sqlx::query("SELECT 1 FROM conversation WHERE id = $1 FOR UPDATE")
        .bind(conv)
        .execute(&mut *holder)
        .await
        .unwrap();
    let members = format!("/v1/conversations/{conv}/members");
    let messages = format!("/v1/conversations/{conv}/messages");
    let remove = format!("{members}/{bob}");
    let (alice_client, bob_client) = (p.app.user(alice), p.app.user(bob));
    let removal = alice_client.delete(&remove);
    let racers = async {
        until_lock_waiters(&p.app, 1).await;
        let adds =
            join_all((0..5).map(|i| bob_client.post(&members, json!({"userIds": [100 + i]}))));
        let sends = join_all((0..50).map(|i| {
            bob_client.post(
                &messages,
                json!({"clientMsgId": uuid::Uuid::new_v4(), "body": format!("race {i}")}),
            )
        }));
        let released = async {
            // The adds each take a connection and wait; the sends' lane holds one batch.
            until_lock_waiters(&p.app, 3).await;
            sqlx::query("ROLLBACK").execute(&mut *holder).await.unwrap();
        };
        tokio::join!(adds, sends, released)
    };
    let (removal, (adds, sends, ())) = tokio::join!(removal, racers);
    assert_eq!(removal.status, 204);
    let mut committed_sends = 0;
    for res in &sends {
        assert!(matches!(res.status, 201 | 404), "{res:?}");
        committed_sends += usize::from(res.status == 201);
    }
    for res in &adds {
        assert!(matches!(res.status, 200 | 404), "{res:?}");
    }

    let added_ok = adds.iter().filter(|r| r.status == 200).count();
    // Everything of the conversation, in commit order, up to bob's removal and past
    // what was acknowledged.
    let key = conv.to_string();
    let records = p
        .consume_until(Duration::from_secs(60), |rs| {
            let mine = || rs.iter().filter(|r| r.key == key);
            let left = mine()
                .any(|r| matches!(&r.event, ChatEvent::MemberLeft(l) if l.user_id.get() == bob));
            let messages = mine()
                .filter(
                    |r| matches!(&r.event, ChatEvent::MessageNew(m) if m.sender_id.get() == bob),
                )
                .count();
            let joined = mine()
                .filter(
                    |r| matches!(&r.event, ChatEvent::MemberJoined(j) if j.added_by.get() == bob),
                )
                .count();
            left && messages > committed_sends && joined >= added_ok
        })
        .await;
    let events: Vec<&ChatEvent> = records
        .iter()
        .filter(|r| r.key == key)
        .map(|r| &r.event)
        .collect();
    // The promotion went through Debezium too, decoded as its own type.
    assert!(
        events.iter().any(|e| matches!(e, ChatEvent::MemberRoleChanged(r)
            if r.user_id.get() == bob && r.role == chatpipe_schemas::Role::Admin && r.changed_by.get() == alice)),
        "member.role_changed on chat.events"
    );
    let left_at = events
        .iter()
        .position(|e| matches!(e, ChatEvent::MemberLeft(l) if l.user_id.get() == bob))
        .unwrap();
    for late in &events[left_at + 1..] {
        let by_bob = match late {
            ChatEvent::MessageNew(m) => m.sender_id.get() == bob,
            ChatEvent::MemberJoined(j) => j.added_by.get() == bob,
            _ => false,
        };
        assert!(!by_bob, "committed after bob's member.left: {late:?}");
    }
    // And the database agrees: bob is out, and whom he added is in only if his add
    // came first.
    assert_eq!(
        p.app
            .count(&format!(
                "SELECT count(*) FROM conversation_member WHERE conversation_id = {conv} AND user_id = {bob}"
            ))
            .await,
        0
    );
    let joined_by_bob = events[..left_at]
        .iter()
        .filter(|e| matches!(e, ChatEvent::MemberJoined(j) if j.added_by.get() == bob))
        .count();
    assert_eq!(added_ok, joined_by_bob);
    p.cleanup().await;
}
