//! The notifications processor on the real stack: what each member of a group is told
//! on `chat.notifications` (read back with the registry's writer schemas), by their
//! level, presence and mute, for a burst, a mention, a message deleted at once, and a
//! reply in a thread a member started; and the Web Push example consumer
//! (docs/examples/notifications_to_webpush.py) against a push service of the test's.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chatpipe_schemas::notification::{Notification, MENTION, MESSAGE, REPLY};
use serde_json::json;

use crate::PRESENCE_DEADLINE;
use chatpipe_tests::stream::spawn_pipeline;

/// Long enough that each step's messages fall in one window.
const COLLAPSE_MS: u64 = 4_000;
const DEADLINE: Duration = Duration::from_secs(60);

/// (user, kind, count, lastSeq) of every record, by user.
fn told(records: &[(String, Notification)]) -> BTreeMap<i64, Vec<(String, i64, i64)>> {
    let mut by_user: BTreeMap<i64, Vec<(String, i64, i64)>> = BTreeMap::new();
    for (key, n) in records {
        assert_eq!(key, &n.user_id.to_string(), "keyed by user id");
        by_user.entry(n.user_id.get()).or_default().push((
            n.kind.clone(),
            n.count,
            n.last_seq.get(),
        ));
    }
    by_user
}

#[tokio::test]
async fn offline_members_are_told_by_their_level_once_per_window_and_never_of_a_deleted_message() {
    let p = spawn_pipeline().await;
    let mut settings = p.notification_settings();
    settings.notifications.collapse_ms = COLLAPSE_MS;
    settings.notifications.preview_chars = 8;
    let notifier = p.start_notifications(settings);
    let gw = p.start_gateway(p.gateway_settings("gw", 0)).await;
    // alice sends; bob hears mentions (and replies to him), carol nothing, dave is
    // online, erin hears everything, frank is muted.
    let (alice, bob, carol, dave, erin, frank) = (10, 11, 12, 13, 14, 15);
    let conv = p
        .app
        .user(alice)
        .create_group(&[bob, carol, dave, erin, frank])
        .await;
    let level = |user: i64, body: serde_json::Value| {
        let app = &p.app;
        async move {
            app.user(user)
                .put_json(&format!("/v1/conversations/{conv}/notifications"), body)
                .await
                .expect(200);
        }
    };
    level(bob, json!({"level": "mentions"})).await;
    level(carol, json!({"level": "none"})).await;
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    level(frank, json!({"level": "all", "mutedUntil": later})).await;
    let _dave_ws = p.connect(&gw.url, dave).await;
    notifier.wait_online(&[dave], PRESENCE_DEADLINE).await;
    let send = |user: i64, body: serde_json::Value| {
        let app = &p.app;
        async move {
            app.user(user)
                .post(&format!("/v1/conversations/{conv}/messages"), body)
                .await
                .expect(201)["seq"]
                .as_i64()
                .unwrap()
        }
    };
    let text = |body: &str| json!({"clientMsgId": uuid::Uuid::new_v4(), "body": body});

    // A burst of 50: erin gets one record for all of them.
    let mut last = 0;
    for i in 0..50 {
        last = send(alice, text(&format!("burst {i}"))).await;
    }
    let records = p
        .notifications_until(DEADLINE, |r| told(r).contains_key(&erin))
        .await;
    let burst = &records
        .iter()
        .find(|(_, n)| n.user_id.get() == erin)
        .unwrap()
        .1;
    assert_eq!((burst.count, burst.last_seq.get()), (50, last), "{burst:?}");
    assert_eq!((burst.first_seq.get(), burst.kind.as_str()), (1, MESSAGE));
    assert_eq!(burst.sender_id.get(), alice);
    assert_eq!(
        burst.preview.as_deref(),
        Some("burst 49"),
        "8 characters at most"
    );

    // A mention of bob, and a message deleted before its window closes.
    let mention = send(
        alice,
        json!({"clientMsgId": uuid::Uuid::new_v4(),
                                     "body": "@bob look", "mentions": [bob]}),
    )
    .await;
    let oops = send(alice, text("oops")).await;
    p.app
        .user(alice)
        .delete(&format!("/v1/conversations/{conv}/messages/{oops}"))
        .await
        .expect(204);
    p.notifications_until(DEADLINE, |r| {
        told(r).get(&bob).is_some_and(|b| !b.is_empty())
    })
    .await;

    // A reply in bob's thread: bob is told, as a reply.
    let root = send(bob, text("my question")).await;
    let reply = send(
        alice,
        json!({"clientMsgId": uuid::Uuid::new_v4(), "body": "an answer", "threadRootSeq": root}),
    )
    .await;
    p.notifications_until(DEADLINE, |r| {
        told(r).get(&bob).is_some_and(|b| b.len() == 2)
    })
    .await;
    // Every record up to the topic's end: exactly these.
    let all = told(&p.notifications_all(DEADLINE).await);
    let expected: BTreeMap<i64, Vec<(String, i64, i64)>> = BTreeMap::from([
        (
            erin,
            vec![
                (MESSAGE.into(), 50, last),
                (MESSAGE.into(), 1, mention),
                (MESSAGE.into(), 2, reply),
            ],
        ),
        (
            bob,
            vec![(MENTION.into(), 1, mention), (REPLY.into(), 1, reply)],
        ),
    ]);
    assert_eq!(
        all, expected,
        "who was told what (carol: none; dave: online; frank: muted)"
    );
    drop(notifier);
    gw.stop().await.unwrap();
    p.cleanup().await;
}

/// What the test's push service received: (path, headers, body).
type Received = Arc<Mutex<Vec<(String, HashMap<String, String>, Vec<u8>)>>>;

/// A push service on a free port: `/push/...` takes a push (201), `/gone/...` says the
/// subscription is gone (410); both record the request.
async fn push_service() -> (String, Received) {
    use axum::extract::{Path, State};
    use axum::http::{HeaderMap, StatusCode};
    let received: Received = Arc::default();
    async fn take(
        State(r): State<Received>,
        Path((kind, id)): Path<(String, String)>,
        headers: HeaderMap,
        body: axum::body::Bytes,
    ) -> StatusCode {
        let headers = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned()))
            .collect();
        r.lock()
            .unwrap()
            .push((format!("/{kind}/{id}"), headers, body.to_vec()));
        if kind == "gone" {
            StatusCode::GONE
        } else {
            StatusCode::CREATED
        }
    }
    let app = axum::Router::new()
        .route("/{kind}/{id}", axum::routing::post(take))
        .with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, received)
}

fn python() -> String {
    std::env::var("CHATPIPE_PYTHON").unwrap_or_else(|_| {
        panic!(
            "CHATPIPE_PYTHON is not set: run the suite with scripts/test, which installs pywebpush"
        )
    })
}

/// `tests/push/webpush_subscriber.py` with `args`: its stdout.
fn subscriber(args: &[&str]) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/push/webpush_subscriber.py");
    let out = std::process::Command::new(python())
        .arg(script)
        .args(args)
        .output()
        .expect("running webpush_subscriber.py");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// docs/examples/notifications_to_webpush.py against a push service of the test's: a
/// record becomes one encrypted push per subscription of its user, which the browser's
/// keys decrypt to the record's fields; a subscription the service says is gone gets
/// one request and no retry; the offset is committed after the pushes.
#[tokio::test]
async fn the_web_push_example_turns_each_record_into_a_push_the_browser_decrypts() {
    let p = spawn_pipeline().await;
    let mut settings = p.notification_settings();
    settings.notifications.collapse_ms = 500;
    let _notifier = p.start_notifications(settings);
    let (alice, erin) = (10, 14);
    let conv = p.app.user(alice).create_group(&[erin]).await;
    let (service, received) = push_service().await;
    let dir = std::env::temp_dir().join(format!("{}-webpush", p.ns));
    std::fs::create_dir_all(&dir).unwrap();
    let folder = dir.to_str().unwrap();
    let keys: serde_json::Value = serde_json::from_str(&subscriber(&["keys", folder])).unwrap();
    let subscriptions = json!({
        erin.to_string(): [
            {"endpoint": format!("{service}/push/erin-phone"), "keys": keys},
            {"endpoint": format!("{service}/gone/erin-old-laptop"), "keys": keys},
        ]
    });
    let subs_file = dir.join("subscriptions.json");
    std::fs::write(&subs_file, subscriptions.to_string()).unwrap();
    let group = format!("{}-webpush", p.ns);
    let sender = tokio::process::Command::new(python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/examples/notifications_to_webpush.py"
        ))
        .args(["--brokers", &chatpipe_tests::stream::brokers()])
        .args(["--registry", &chatpipe_tests::registry_url()])
        .args(["--topic", &p.notifications_topic(), "--group", &group])
        .args(["--subscriptions", subs_file.to_str().unwrap()])
        .args(["--vapid-key", dir.join("vapid.pem").to_str().unwrap()])
        .args(["--max", "1", "--idle-timeout", "120"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starting the example");

    let seq = p
        .app
        .user(alice)
        .post(
            &format!("/v1/conversations/{conv}/messages"),
            json!({"clientMsgId": uuid::Uuid::new_v4(), "body": "dinner at 8?"}),
        )
        .await
        .expect(201)["seq"]
        .as_i64()
        .unwrap();
    let out = tokio::time::timeout(DEADLINE, sender.wait_with_output())
        .await
        .expect("the example handles one record within the deadline")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(
        line,
        json!({"userId": erin, "conversationId": conv, "lastSeq": seq, "pushed": 1, "gone": 1})
    );

    let received = received.lock().unwrap().clone();
    let paths: Vec<&str> = received.iter().map(|(p, _, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        vec!["/push/erin-phone", "/gone/erin-old-laptop"],
        "one request each"
    );
    let (_, headers, body) = &received[0];
    assert_eq!(headers["content-encoding"], "aes128gcm");
    assert!(
        headers["authorization"].starts_with("vapid t="),
        "{headers:?}"
    );
    assert!(headers.contains_key("ttl"), "{headers:?}");
    assert_eq!(headers["topic"], format!("c{conv}"));
    let body_file = dir.join("body");
    std::fs::write(&body_file, body).unwrap();
    let plain = subscriber(&["decrypt", folder, body_file.to_str().unwrap()]);
    let payload: serde_json::Value = serde_json::from_str(plain.trim()).unwrap();
    assert_eq!(
        payload,
        json!({"conversationId": conv, "kind": "message", "count": 1, "lastSeq": seq,
               "senderId": alice, "preview": "dinner at 8?", "threadRootSeq": null})
    );
    // Committed after the pushes: the next sender of the group starts after the record.
    let committed: i64 = chatpipe_tests::stream::committed(&group, &p.notifications_topic())
        .iter()
        .sum();
    assert_eq!(committed, 1);
    std::fs::remove_dir_all(&dir).ok();
    p.cleanup().await;
}
