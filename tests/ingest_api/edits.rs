//! Editing a message: only its sender, the seq and its place kept, the latest body in
//! history with editedAt, and a message.edited event in the same transaction.

use chatpipe_schemas::ChatEvent;
use chatpipe_tests::spawn_app;
use serde_json::json;

#[tokio::test]
async fn the_sender_edits_others_are_refused_and_history_shows_the_latest_body() {
    let app = spawn_app().await;
    let (alice, bob, stranger) = (10, 20, 99);
    let conv = app.user(alice).create_group(&[bob]).await;
    let first = app.user(alice).send_message(conv, "helo").await;
    let second = app.user(bob).send_message(conv, "hi").await;
    let path = |seq: i64| format!("/v1/conversations/{conv}/messages/{seq}");

    let edited = app
        .user(alice)
        .patch(&path(first), json!({"body": "hello"}))
        .await
        .expect(200);
    assert_eq!(edited["seq"], first);
    assert_eq!(edited["conversationId"], conv);
    assert_eq!(edited["body"], "hello");
    assert!(edited["editedAt"].is_string(), "{edited}");

    // Another member: 403. A stranger, an unknown conversation or seq: 404. A bad body:
    // 422 as for sends. None of them changes anything.
    app.user(bob)
        .patch(&path(first), json!({"body": "pwned"}))
        .await
        .problem(403);
    app.user(stranger)
        .patch(&path(first), json!({"body": "pwned"}))
        .await
        .problem(404);
    // Not even the group's admin (alice, its creator) edits someone else's words.
    app.user(alice)
        .patch(&path(second), json!({"body": "put in bob's mouth"}))
        .await
        .problem(403);
    app.user(alice)
        .patch(&path(99), json!({"body": "nothing there"}))
        .await
        .problem(404);
    app.user(alice)
        .patch(
            &format!("/v1/conversations/{}/messages/{first}", conv + 1000),
            json!({"body": "x"}),
        )
        .await
        .problem(404);
    for (body, field) in [
        (json!({"body": "   "}), "body"),
        (json!({"body": "a\u{0}b"}), "body"),
        (json!({"body": 5}), "body"),
        // An unknown field is ignored; the body is still missing.
        (json!({"text": "x"}), "body"),
    ] {
        let problem = app.user(alice).patch(&path(first), body).await.problem(422);
        assert_eq!(problem["field"], field);
    }
    app.user(alice)
        .patch("/v1/conversations/1/messages/0", json!({"body": "x"}))
        .await
        .problem(400);

    // History: the latest body in place, editedAt only on the edited one.
    let history = app
        .user(bob)
        .get(&format!("/v1/conversations/{conv}/messages"))
        .await
        .expect(200);
    let messages = history["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[0]["seq"], first);
    assert_eq!(messages[0]["body"], "hello");
    assert!(messages[0]["editedAt"].is_string());
    assert_eq!(messages[1]["seq"], second);
    assert!(messages[1].get("editedAt").is_none());
    assert_eq!(history["lastSeq"], second, "an edit takes no seq");

    // One event for the one edit that was allowed.
    let edits: Vec<_> = app
        .outbox_events()
        .await
        .into_iter()
        .filter_map(|e| match e {
            ChatEvent::MessageEdited(m) => Some((m.seq.get(), m.sender_id.get(), m.body)),
            _ => None,
        })
        .collect();
    assert_eq!(edits, vec![(first, alice, "hello".to_owned())]);
}
