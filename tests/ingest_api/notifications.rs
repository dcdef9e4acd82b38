//! Notification levels: each member's own setting per conversation, `all` by default,
//! shown in the inbox, carried to the member's other devices by sync once, and refused
//! with the field named when it is not one.

use chatpipe_tests::spawn_app;
use serde_json::{json, Value};

fn entry(page: &Value, conv: i64) -> &Value {
    page["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["conversationId"] == conv)
        .unwrap_or_else(|| panic!("{conv} in {page}"))
}

#[tokio::test]
async fn a_member_sets_their_own_level_and_their_other_devices_sync_it() {
    let app = spawn_app().await;
    let (alice, bob, stranger) = (10, 20, 99);
    let conv = app.user(alice).create_group(&[bob]).await;
    let path = format!("/v1/conversations/{conv}/notifications");
    let inbox = app.user(bob).get("/v1/inbox").await.expect(200);
    assert_eq!(entry(&inbox, conv)["notificationLevel"], "all");
    assert!(entry(&inbox, conv).get("mutedUntil").is_none());
    let synced = app.user(bob).get("/v1/sync").await.expect(200);
    let cursor = synced["nextCursor"].as_str().unwrap().to_owned();

    let set = app
        .user(bob)
        .put_json(
            &path,
            json!({"level": "mentions", "mutedUntil": "2030-01-01T08:00:00Z"}),
        )
        .await
        .expect(200);
    assert_eq!(
        set,
        json!({"conversationId": conv, "level": "mentions", "mutedUntil": "2030-01-01T08:00:00Z"})
    );
    // Bob's, not alice's.
    let inbox = app.user(bob).get("/v1/inbox").await.expect(200);
    assert_eq!(entry(&inbox, conv)["notificationLevel"], "mentions");
    assert_eq!(entry(&inbox, conv)["mutedUntil"], "2030-01-01T08:00:00Z");
    let theirs = app.user(alice).get("/v1/inbox").await.expect(200);
    assert_eq!(entry(&theirs, conv)["notificationLevel"], "all");
    // Bob's other device: in the next sync, once.
    let changed = app
        .user(bob)
        .get(&format!("/v1/sync?since={cursor}"))
        .await
        .expect(200);
    assert_eq!(
        entry(&changed, conv)["notificationLevel"],
        "mentions",
        "{changed}"
    );
    let next = changed["nextCursor"].as_str().unwrap();
    let quiet = app
        .user(bob)
        .get(&format!("/v1/sync?since={next}"))
        .await
        .expect(200);
    assert_eq!(quiet["conversations"], json!([]));
    // Unmuting: null (or leaving it out) clears it.
    let set = app
        .user(bob)
        .put_json(&path, json!({"level": "none", "mutedUntil": null}))
        .await
        .expect(200);
    assert_eq!(set, json!({"conversationId": conv, "level": "none"}));

    // Refused, and nothing changes: a non-member (404, as an unknown conversation), a
    // level or time that is not one (422 naming it).
    app.user(stranger)
        .put_json(&path, json!({"level": "all"}))
        .await
        .problem(404);
    for (body, field) in [
        (json!({"level": "loud"}), "level"),
        (json!({}), "level"),
        (
            json!({"level": "all", "mutedUntil": "tomorrow"}),
            "mutedUntil",
        ),
    ] {
        let problem = app
            .user(bob)
            .put_json(&path, body.clone())
            .await
            .problem(422);
        assert_eq!(problem["field"], field, "{body}: {problem}");
    }
    let inbox = app.user(bob).get("/v1/inbox").await.expect(200);
    assert_eq!(entry(&inbox, conv)["notificationLevel"], "none");
}
