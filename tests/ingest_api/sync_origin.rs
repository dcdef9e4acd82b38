//! Sync cursors know which history of the database they are of (issue 25): each carries
//! PostgreSQL's system identifier and WAL timeline, read here from PostgreSQL itself. A
//! cursor of another timeline (a promoted standby, a restore) or another cluster is
//! `409 /problems/cursor-stale`, signature and all; one of this history keeps working.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chatpipe_core::UserId;
use chatpipe_tests::{spawn_app, TestApp};
use ingest_api::store::sync::{Cursor, CursorKey};
use serde_json::Value;

/// This server's `<system identifier>/<timeline>`, as PostgreSQL states it: the control
/// file's identifier, and the timeline of the latest checkpoint (the same as the WAL's
/// on a server that was never promoted).
async fn origin_of(app: &TestApp) -> (String, i64) {
    let system: i64 = sqlx::query_scalar("SELECT system_identifier FROM pg_control_system()")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    let timeline: i32 = sqlx::query_scalar("SELECT timeline_id FROM pg_control_checkpoint()")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    (system.to_string(), i64::from(timeline))
}

/// The payload of a sealed cursor.
fn payload(cursor: &str) -> String {
    let (payload, _) = cursor.split_once('.').unwrap();
    String::from_utf8(URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap()
}

#[tokio::test]
async fn a_cursor_of_another_timeline_or_cluster_is_stale_and_one_of_this_history_works() {
    let app = spawn_app().await;
    let (alice, bob) = (10, 20);
    let conv = app.user(alice).create_group(&[bob]).await;
    app.user(alice)
        .send_message(conv, "before the cursor")
        .await;
    let first = app.user(bob).get("/v1/sync").await.expect(200);
    let cursor = first["nextCursor"].as_str().unwrap().to_owned();

    // The cursor names this server's identifier and timeline.
    let (system, timeline) = origin_of(&app).await;
    let sealed = payload(&cursor);
    let (origin, snapshot) = sealed.split_once('@').expect("<origin>@<snapshot>");
    assert_eq!(origin, format!("{system}/{timeline}"), "{sealed}");

    // The same snapshot, signed with the deployment's own key, but of the timeline a
    // promoted standby would start, of another cluster, or of no origin at all (a
    // cursor from before origins): each stale.
    let key = CursorKey::load(&app.pool).await.unwrap();
    let user = UserId::new(bob).unwrap();
    let old = Cursor::Snapshot(snapshot.to_owned());
    let promoted = key.seal(user, &format!("{system}/{}", timeline + 1), &old);
    let other_cluster = key.seal(user, &format!("1{system}/{timeline}"), &old);
    let without_origin = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(snapshot),
        cursor.split_once('.').unwrap().1
    );
    for stale in [&promoted, &other_cluster] {
        let problem = app
            .user(bob)
            .get(&format!("/v1/sync?since={stale}"))
            .await
            .problem(409);
        assert_eq!(problem["type"], "/problems/cursor-stale", "{problem}");
    }
    // A payload changed on the way (here: its origin cut off) is not a cursor at all.
    let problem = app
        .user(bob)
        .get(&format!("/v1/sync?since={without_origin}"))
        .await
        .problem(400);
    assert_eq!(problem["field"], "since", "{problem}");

    // The cursor of this history goes on: the message sent after it, and nothing else.
    let seq = app.user(alice).send_message(conv, "after the cursor").await;
    let next = app
        .user(bob)
        .get(&format!("/v1/sync?since={cursor}"))
        .await
        .expect(200);
    let entries = next["conversations"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{next}");
    let seqs: Vec<i64> = entries[0]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m: &Value| m["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, vec![seq], "{next}");
}
